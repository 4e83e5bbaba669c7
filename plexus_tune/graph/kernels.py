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


def _symmetric_blocks(indptr, indices, loops, ranges, own_ranges, shift, kc, kr, spans, row_targets_ptr, row_targets,
                      col_targets_ptr, col_targets, row_fill, col_fill, row_out, col_out):
    """Row lengths and column counts of target blocks of a symmetric pattern (see
    :func:`plexus_tune.graph.structure._block_vectors_symmetric`).

    ``ranges[k]`` packs the column range of old id k's new column (low ``shift`` bits) and
    the row range of its new row (above them); kc, kr: the numbers of column and row
    ranges. For every row m, its entries per column range and per row range, as running
    sums; target t with spans (f0, f1, e0, e1) takes, for each m whose row range is in
    [f0, f1) (the targets ``row_targets[row_targets_ptr[g]:row_targets_ptr[g + 1]]`` of
    range g), the entries between column ranges e0 and e1, written at ``row_fill[t]``, and
    for each m whose column range is in [e0, e1), those between row ranges f0 and f1,
    written at ``col_fill[t]``; ``loops[m]`` adds the self-loop (m, m). ``own_ranges[m]``:
    the ranges of row m's own id (``ranges`` itself, or its rows' entries where the CSR
    holds some rows of the graph only)."""
    mask = (1 << shift) - 1
    counts = np.zeros(kc + kr, dtype=np.int64)
    by_col = np.zeros(kc + 1, dtype=np.int64)
    by_row = np.zeros(kr + 1, dtype=np.int64)
    for m in range(indptr.size - 1):
        for p in range(indptr[m], indptr[m + 1]):
            v = ranges[indices[p]]
            counts[v & mask] += 1
            counts[kc + (v >> shift)] += 1
        own = own_ranges[m]
        if loops[m]:
            counts[own & mask] += 1
            counts[kc + (own >> shift)] += 1
        total = 0
        for j in range(kc):  # running sums, and the counts cleared for the next row
            by_col[j] = total
            total += counts[j]
            counts[j] = 0
        by_col[kc] = total
        total = 0
        for j in range(kr):
            by_row[j] = total
            total += counts[kc + j]
            counts[kc + j] = 0
        by_row[kr] = total
        g = own >> shift
        for q in range(row_targets_ptr[g], row_targets_ptr[g + 1]):
            t = row_targets[q]
            row_out[row_fill[t]] = by_col[spans[t, 3]] - by_col[spans[t, 2]]
            row_fill[t] += 1
        g = own & mask
        for q in range(col_targets_ptr[g], col_targets_ptr[g + 1]):
            t = col_targets[q]
            col_out[col_fill[t]] = by_row[spans[t, 1]] - by_row[spans[t, 0]]
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
