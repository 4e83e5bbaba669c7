"""Tensors every trainer builds: the initial weights, CSR shards, padded blocks.

Blocks follow :class:`plexus_tune.trainer.layout.Block` (a start, a real and a padded
size); sizes are those of :mod:`plexus_tune.model.shapes`.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import scipy.sparse as sp
import torch

from plexus_tune.model.shapes import csr_index_dtype
from plexus_tune.trainer.layout import Block


def glorot_weights(widths, seed: int) -> list[np.ndarray]:
    """Initial W_i (D_i x D_{i+1}), Glorot-uniform: U(-a, a), a = sqrt(6 / (D_i + D_{i+1})).

    Drawn with a torch generator seeded ``seed``, identically on every rank and in the
    serial reference, so sharded and serial models start equal.
    """
    gen = torch.Generator().manual_seed(int(seed))
    out = []
    for d_in, d_out in zip(widths[:-1], widths[1:]):
        bound = math.sqrt(6.0 / (d_in + d_out))
        w = (torch.rand((d_in, d_out), generator=gen, dtype=torch.float64) * 2.0 - 1.0) * bound
        out.append(w.to(torch.float32).numpy())
    return out


def torch_csr(matrix: sp.csr_matrix, dtype: torch.dtype, device) -> torch.Tensor:
    """A scipy CSR matrix as a torch sparse CSR tensor (int32 indices when they fit)."""
    matrix = sp.csr_matrix(matrix)
    matrix.sort_indices()
    index_dtype = csr_index_dtype(matrix.nnz, *matrix.shape)
    crow = torch.from_numpy(matrix.indptr.astype(index_dtype))
    col = torch.from_numpy(matrix.indices.astype(index_dtype))
    val = torch.from_numpy(matrix.data.astype(np.float64)).to(dtype)
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, col, val, size=matrix.shape, device=device,
                                       check_invariants=False)


def csr_bytes(t: torch.Tensor) -> int:
    return sum(x.numel() * x.element_size() for x in (t.crow_indices(), t.col_indices(), t.values()))


def take_block(matrix: sp.csr_matrix, rows: Block, cols: Block) -> sp.csr_matrix:
    """The rows x cols block of ``matrix``, rows.size x cols.size, zero past its real entries."""
    n_rows, n_cols = matrix.shape
    r0, r1 = min(rows.start, n_rows), min(rows.stop, n_rows)
    c0, c1 = min(cols.start, n_cols), min(cols.stop, n_cols)
    part = sp.csr_matrix(matrix[r0:r1, c0:c1])
    pad_rows = rows.size - (r1 - r0)
    indptr = np.concatenate([part.indptr, np.full(pad_rows, part.indptr[-1], dtype=part.indptr.dtype)])
    return sp.csr_matrix((part.data, part.indices, indptr), shape=(rows.size, cols.size))


def take_dense(array: np.ndarray, rows: Block, cols: Block) -> np.ndarray:
    """The rows x cols block of a dense array, rows.size x cols.size, zero past its real entries."""
    out = np.zeros((rows.size, cols.size), dtype=array.dtype)
    out[: rows.real, : cols.real] = array[rows.start:rows.stop, cols.start:cols.stop]
    return out


def pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """``tensor`` with zero rows appended up to ``rows`` rows."""
    extra = int(rows) - tensor.shape[0]
    return torch.nn.functional.pad(tensor, (0, 0, 0, extra)) if extra > 0 else tensor

