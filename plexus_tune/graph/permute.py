"""Random permutations of the adjacency and the 2D load-balance report.

Convention: a permutation ``perm`` lists old ids in their new order, so the permuted
matrix is ``B = A[row_perm][:, col_perm]``, i.e. ``B[i, j] = A[row_perm[i], col_perm[j]]``
(``B = P_r A P_c^T`` with ``(P x)[i] = x[perm[i]]``). Features then travel with the
columns: ``B @ X[col_perm] = (A @ X)[row_perm]``, and ``unpermute_rows`` undoes the row
permutation of a result.

Modes: ``none`` (identity), ``single`` (the same permutation on rows and columns, seed
``seed``), ``double`` (rows with seed ``seed``, columns with seed ``seed + 1``) and
``local``: the double permutation applied to blocks of b consecutive node ids instead of
single nodes, then every segment between the split points of a grid (``k ceil(n/g)``
for each part count g) sorted back into ascending node id. A block of any split holds
whole id blocks in their original order, which keeps the locality of the gathers; b is
chosen from the grid so that each 2D block of the finest split still receives
:data:`LOCAL_BLOCKS_PER_SHARD` id blocks, which keeps the balance of the double
permutation (docs/model.md, Permutations). With a single part (a 1x1x1 grid) nothing
needs balancing and ``local`` is the identity.
"""

from __future__ import annotations

import math

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.graph.cache import StructureCache, permutation_file, read_permutation, store_permutation

PERMUTE_MODES = ("none", "single", "double", "local")
#: Modes whose row and column permutations differ (the alternate layout of a layer is
#: ``A[col_perm][:, row_perm]``, the transpose of the stored one only for symmetric A).
TWO_SIDED_MODES = ("double", "local")
#: Id blocks each 2D block of the finest split receives under the ``local`` permutation:
#: their count per block varies by about 1/sqrt(2048) = 2 % (1.008 with single ids, 1.02-1.03
#: with blocks of 8 on the 8x8 split of a 1M-node lattice, docs/model.md).
LOCAL_BLOCKS_PER_SHARD = 2048


def make_permutation(n: int, seed: int) -> np.ndarray:
    """Uniformly random permutation of ``range(n)`` (int64), reproducible from ``seed``."""
    return np.random.default_rng(int(seed)).permutation(int(n)).astype(np.int64, copy=False)


def invert_permutation(perm: np.ndarray) -> np.ndarray:
    """``inv`` with ``inv[perm[i]] = i``."""
    perm = np.asarray(perm)
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.shape[0], dtype=perm.dtype)
    return inv


def grid_parts(grid) -> tuple[int, ...]:
    """The part counts a grid splits the node ids into: its dimensions, ascending
    (``(1, 1, 1)`` for a 1x1x1 grid; an R x C block grid is ``(R, C)``)."""
    parts = sorted(int(g) for g in grid)
    if not parts or parts[0] < 1:
        raise ValueError(f"bad grid {tuple(grid)}: every dimension must be >= 1")
    return tuple(parts)


def segment_bounds(n: int, parts) -> np.ndarray:
    """Sorted split points in ``[0, n]`` of every part count g in ``parts``: the union of
    ``min(k ceil(n/g), n)`` for k = 0..g (the trainer's blocks, docs/model.md)."""
    n = int(n)
    cuts = {0, n}
    for g in parts:
        g = int(g)
        if g < 1:
            raise ValueError(f"bad part count {g}: must be >= 1")
        step = max(1, -(-n // g))
        cuts.update(min(k * step, n) for k in range(g + 1))
    return np.array(sorted(cuts), dtype=np.int64)


def local_block_size(n: int, parts) -> int:
    """b = max(1, floor(n / (LOCAL_BLOCKS_PER_SHARD S))), S the blocks of the finest 2D
    split: the product of the two largest part counts (one part count: itself)."""
    top = sorted((int(g) for g in parts), reverse=True)[:2]
    shards = max(1, int(np.prod(top)))
    return max(1, int(n) // (LOCAL_BLOCKS_PER_SHARD * shards))


def local_permutation(n: int, seed: int, parts, block: int | None = None) -> np.ndarray:
    """Blocks of ``block`` consecutive ids (default :func:`local_block_size`) in the random
    order of ``seed``, then each segment of :func:`segment_bounds` sorted ascending.
    With ``block`` 1 the segments hold the node sets of :func:`make_permutation`."""
    n = int(n)
    b = local_block_size(n, parts) if block is None else int(block)
    if b < 1:
        raise ValueError(f"bad block size {b}: must be >= 1")
    order = np.random.default_rng(int(seed)).permutation(-(-n // b)).astype(np.int64)
    perm = (order[:, None] * b + np.arange(b, dtype=np.int64)[None, :]).ravel()
    if perm.size > n:
        perm = perm[perm < n]
    bounds = segment_bounds(n, parts)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        perm[lo:hi].sort()
    return perm


def permutations_for(mode: str, n: int, seed: int = 0, *, parts=None) -> tuple[np.ndarray, np.ndarray]:
    """``(row_perm, col_perm)`` for a mode in ``none | single | double | local``.

    ``parts`` (``local`` only): the part counts whose blocks must keep the double
    permutation's balance, :func:`grid_parts` of the grid or ``(R, C)`` of a block grid.
    """
    if mode not in PERMUTE_MODES:
        raise UserError(f"unknown permutation mode {mode!r}; use one of {', '.join(PERMUTE_MODES)}")
    if mode == "none":
        ident = np.arange(n, dtype=np.int64)
        return ident, ident
    if mode == "local":
        if parts is None:
            raise ValueError("the local permutation needs the part counts of the grid (parts=grid_parts(grid))")
        return local_permutation(n, seed, parts), local_permutation(n, seed + 1, parts)
    row = make_permutation(n, seed)
    if mode == "single":
        return row, row
    return row, make_permutation(n, seed + 1)


def inverse_permutations_for(mode: str, n: int, seed: int = 0, *, parts=None) -> tuple[np.ndarray, np.ndarray]:
    """``(inv_row, inv_col)``: the new id of every old id under :func:`permutations_for`'s
    permutations (int32 below 2^31 ids), built one at a time so that memory holds one
    permutation and the inverses (the same array twice where the mode permutes rows and
    columns alike)."""
    dtype = np.int32 if int(n) < 2**31 else np.int64

    def inverse(perm) -> np.ndarray:
        inv = np.empty(int(n), dtype=dtype)
        inv[perm] = np.arange(int(n), dtype=dtype)
        return inv

    if mode not in PERMUTE_MODES:
        raise UserError(f"unknown permutation mode {mode!r}; use one of {', '.join(PERMUTE_MODES)}")
    if mode == "none":
        ident = np.arange(int(n), dtype=dtype)
        return ident, ident
    if mode == "local":
        if parts is None:
            raise ValueError("the local permutation needs the part counts of the grid (parts=grid_parts(grid))")
        return inverse(local_permutation(n, seed, parts)), inverse(local_permutation(n, seed + 1, parts))
    row = inverse(make_permutation(n, seed))
    return (row, row) if mode == "single" else (row, inverse(make_permutation(n, seed + 1)))


def stored_inverse_permutations(mode: str, n: int, seed: int = 0, *, parts=None, root=None):
    """:func:`inverse_permutations_for`, kept memory-mapped in the structure cache's directory
    (:func:`plexus_tune.graph.cache.permutation_file`): made and written once for an N, mode, seed
    (and parts), then read where needed, so that a caller that reads a sample of the ids holds no
    N-array. A read-only data directory gives the arrays in memory."""
    name = StructureCache.entry_name(mode, seed, parts if mode == "local" else None)
    paths = [permutation_file(name, n, side, root) for side in ("rows", "cols")]
    found = [read_permutation(path, n) for path in paths]
    if all(v is not None for v in found):
        return found[0], found[1]
    inv_row, inv_col = inverse_permutations_for(mode, n, seed, parts=parts)
    if not all(store_permutation(path, inv) for path, inv in zip(paths, (inv_row, inv_col))):
        return inv_row, inv_col
    del inv_row, inv_col
    found = [read_permutation(path, n) for path in paths]
    return found[0], found[1]


def permute_matrix(adj, row_perm: np.ndarray, col_perm: np.ndarray | None = None) -> sp.csr_matrix:
    """``B = A[row_perm][:, col_perm]`` as canonical CSR without densifying.

    Rows are gathered by CSR row indexing; columns are relabelled through the inverse
    column permutation (old column c becomes ``inv_col[c]``) and re-sorted per row.
    """
    import scipy.sparse as sp
    csr = sp.csr_matrix(adj)
    n_rows, n_cols = csr.shape
    if col_perm is None:
        col_perm = row_perm
    row_perm = np.asarray(row_perm)
    col_perm = np.asarray(col_perm)
    if row_perm.shape != (n_rows,) or col_perm.shape != (n_cols,):
        raise ValueError("permutation length does not match the matrix")
    rows = csr[row_perm]
    inv_col = invert_permutation(col_perm).astype(rows.indices.dtype, copy=False)
    out = sp.csr_matrix((rows.data, inv_col[rows.indices], rows.indptr), shape=(n_rows, n_cols))
    out.has_sorted_indices = False
    out.sort_indices()
    return out


def double_permute(adj, seed: int = 0, mode: str = "double", *, parts=None):
    """Permute ``adj`` for load balance: ``(B, row_perm, col_perm)`` with
    ``B = A[row_perm][:, col_perm]`` (see :func:`permutations_for` for the seeds and ``parts``).

    For a normalized adjacency ``A_hat``, a layer computes ``B @ X[col_perm]`` which equals
    ``(A_hat @ X)[row_perm]``; the next layer uses ``A_hat[col_perm][:, row_perm]``.
    """
    import scipy.sparse as sp
    n = adj.shape[0]
    row_perm, col_perm = permutations_for(mode, n, seed, parts=parts)
    if mode == "none":
        return sp.csr_matrix(adj), row_perm, col_perm
    return permute_matrix(adj, row_perm, col_perm), row_perm, col_perm


def permute_rows(x: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """``x[perm]``: bring node-indexed rows into permuted order."""
    return np.asarray(x)[np.asarray(perm)]


def unpermute_rows(x: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """Inverse of :func:`permute_rows`: ``y`` with ``y[perm] = x``."""
    x = np.asarray(x)
    y = np.empty_like(x)
    y[np.asarray(perm)] = x
    return y


def parse_blocks(text: str) -> tuple[int, int]:
    """``"8x4"`` -> ``(8, 4)``: R row blocks by C column blocks, both given."""
    t = str(text).strip().lower()
    parts = t.split("x")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise UserError(f"bad block grid {text!r}; expected RxC such as 8x8") from None
    if len(values) == 1:
        raise UserError(f"bad block grid {text!r}; give both sizes as RxC, e.g. {values[0]}x{values[0]}")
    if len(values) != 2 or min(values) < 1:
        raise UserError(f"bad block grid {text!r}; expected RxC with R, C >= 1, such as 8x8")
    return values[0], values[1]


def block_nnz(adj, row_blocks: int, col_blocks: int) -> np.ndarray:
    """Nonzeros per block of an R x C grid, blocks of ``ceil(N/R)`` rows and ``ceil(M/C)``
    columns (the last ones may be smaller). Works one row block at a time, never dense."""
    import scipy.sparse as sp
    csr = sp.csr_matrix(adj)
    n_rows, n_cols = csr.shape
    br = max(1, math.ceil(n_rows / row_blocks))
    bc = max(1, math.ceil(n_cols / col_blocks))
    counts = np.zeros((row_blocks, col_blocks), dtype=np.int64)
    indptr = csr.indptr
    for r in range(row_blocks):
        lo = min(r * br, n_rows)
        hi = min(lo + br, n_rows)
        cols = csr.indices[indptr[lo]:indptr[hi]]
        if cols.size:
            counts[r] = np.bincount(cols // bc, minlength=col_blocks)[:col_blocks]
    return counts


def with_self_loops_pattern(adj) -> sp.csr_matrix:
    """Sparsity pattern of ``A + I`` (unit values), the pattern GCN normalization produces."""
    import scipy.sparse as sp
    csr = sp.csr_matrix(adj)
    pattern = sp.csr_matrix((np.ones(csr.nnz, dtype=np.float32), csr.indices, csr.indptr), shape=csr.shape)
    pattern = (pattern + sp.eye(csr.shape[0], dtype=np.float32, format="csr")).tocsr()
    pattern.sum_duplicates()
    return pattern


def balance_report(adj, blocks=(8, 8), mode: str = "double", seed: int = 0, *, self_loops: bool = True) -> dict:
    """Load balance of a 2D block split: ``max/mean`` nonzeros over an R x C grid.

    The counted matrix is the pattern of ``A + I`` (``self_loops=True``, what GCN
    normalization shards) permuted by ``mode``; ``mean = nnz / (R C)``. The ``local``
    mode keeps the balance of the R x C split (``parts = (R, C)``).
    """
    import scipy.sparse as sp
    rb, cb = blocks
    if max(rb, cb) > adj.shape[0]:
        raise UserError(f"a {rb}x{cb} block grid has more blocks per side than the {adj.shape[0]} nodes; "
                        f"use at most {adj.shape[0]} per side")
    pattern = with_self_loops_pattern(adj) if self_loops else sp.csr_matrix(adj)
    permuted, _, _ = double_permute(pattern, seed=seed, mode=mode, parts=(rb, cb))
    counts = block_nnz(permuted, rb, cb)
    total = int(counts.sum())
    mean = total / (rb * cb)
    return {
        "mode": mode,
        "blocks": [rb, cb],
        "nnz": total,
        "max_nnz": int(counts.max()),
        "min_nnz": int(counts.min()),
        "mean_nnz": mean,
        "max_over_mean": float(counts.max() / mean) if mean > 0 else float("nan"),
        "block_nnz": counts.tolist(),
    }
