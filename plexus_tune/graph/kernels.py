"""Compiled loops of the shard scans (docs/model.md, "Sparsity structure": the two scans).

Each loop reads a CSR pattern once, row by row in the stored order, with no temporary
array per entry. They are compiled by numba on first use (cached on disk beside this
module) and imported lazily, so that commands which never scan a graph do not load
numba; :func:`compiled` is None where numba cannot be imported, and the callers in
:mod:`plexus_tune.graph.structure` then run their vectorized numpy forms, which give the
same figures.
"""

from __future__ import annotations

import functools
import os

import numpy as np

#: Set to "0" to run the numpy forms instead (the tests compare both with brute force).
ENV_SWITCH = "PLEXUS_TUNE_NUMBA"


def _diagonal_rows(indptr, indices, out):
    """out[m] = row m stores its diagonal entry."""
    for m in range(indptr.size - 1):
        for p in range(indptr[m], indptr[m + 1]):
            if indices[p] == m:
                out[m] = True
                break


def _cell_counts(indptr, indices, row_cell, col_cell, cells):
    """cells[row_cell[m] + col_cell[k]] += 1 for every stored entry (m, k)."""
    for m in range(indptr.size - 1):
        base = row_cell[m]
        for p in range(indptr[m], indptr[m + 1]):
            cells[base + col_cell[indices[p]]] += 1


def _symmetric_blocks(indptr, indices, loops, col_range, row_range, kc, kr, spans, row_offsets, col_offsets,
                      row_out, col_out):
    """Row lengths and column counts of target blocks of a symmetric pattern (see
    :func:`plexus_tune.graph.structure._block_vectors_symmetric`): for every row m, its
    entries per column range and per row range as running sums; target t with spans
    (f0, f1, e0, e1) takes, for each m whose row range is in [f0, f1), the entries
    between column ranges e0 and e1, and for each m whose column range is in [e0, e1),
    those between row ranges f0 and f1 (kc, kr: the numbers of column and row ranges);
    ``loops[m]`` adds the self-loop (m, m)."""
    by_col = np.zeros(kc + 1, dtype=np.int64)
    by_row = np.zeros(kr + 1, dtype=np.int64)
    row_fill = row_offsets[:-1].copy()
    col_fill = col_offsets[:-1].copy()
    targets = spans.shape[0]
    for m in range(indptr.size - 1):
        by_col[:] = 0
        by_row[:] = 0
        for p in range(indptr[m], indptr[m + 1]):
            k = indices[p]
            by_col[col_range[k] + 1] += 1
            by_row[row_range[k] + 1] += 1
        if loops[m]:
            by_col[col_range[m] + 1] += 1
            by_row[row_range[m] + 1] += 1
        for j in range(kc):
            by_col[j + 1] += by_col[j]
        for j in range(kr):
            by_row[j + 1] += by_row[j]
        rg = row_range[m]
        cg = col_range[m]
        for t in range(targets):
            f0, f1, e0, e1 = spans[t, 0], spans[t, 1], spans[t, 2], spans[t, 3]
            if f0 <= rg and rg < f1:
                row_out[row_fill[t]] = by_col[e1] - by_col[e0]
                row_fill[t] += 1
            if e0 <= cg and cg < e1:
                col_out[col_fill[t]] = by_row[f1] - by_row[f0]
                col_fill[t] += 1


@functools.cache
def compiled():
    """The compiled loops (a namespace with ``diagonal_rows``, ``cell_counts``,
    ``symmetric_blocks``), or None without numba (or with PLEXUS_TUNE_NUMBA=0)."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return None
    try:
        import numba
    except ImportError:
        return None
    from types import SimpleNamespace

    jit = numba.njit(cache=True, nogil=True)
    return SimpleNamespace(diagonal_rows=jit(_diagonal_rows), cell_counts=jit(_cell_counts),
                           symmetric_blocks=jit(_symmetric_blocks))
