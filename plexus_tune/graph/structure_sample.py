"""Shard statistics estimated from a sample of rows (docs/model.md, "Sampled structure").

A graph too large to scan (billions of nonzeros) is summarized from a sample of its rows
that reads about ``fraction`` of the stored entries: row m of length d_m is drawn with
probability ``p_m = min(1, sqrt(d_m) / kappa)`` (:func:`sample_rows`) and weighs
``1 / p_m`` (Horvitz-Thompson). The longest rows, the most popular columns of a
symmetric pattern, which decide the popularity curve's head, are read every time. The
block counts that choose each split's largest block: entries touching a row read with
certainty are counted exactly, both ways (A symmetric: row m's entries and their
mirrors); the rest is spread over the cells as a random permutation does in
expectation (rows and columns independent), raked (iterative proportional fitting) to
the row and column totals of every segment that the row lengths (indptr) leave. Only
the sampled rows' entries are read; beside them memory holds the row lengths and the
permutations (N entries each).

For the symmetric pattern of an undirected graph, row m of A is row ``inv_row[m]`` and
column ``inv_col[m]`` of ``B = A_hat[row_perm][:, col_perm]``, so a block's row lengths
and its column counts are both per-row quantities of A (see
:func:`plexus_tune.graph.structure._block_vectors_symmetric`) and a sample of rows is a
sample of both multisets. Estimates:

    block nonzeros        the cells' sum: exact entries plus the expected rest
    its standard error    sqrt(rest) / nonzeros: a random permutation's count of the
                          block's X entries not known exactly spreads about sqrt(X)
    a multiset's shape    the weighted sample, weights scaled to the known count of
                          rows (columns) of the block, zeros for the padding

and the shape statistics (mean, spread, touched share, sums of the largest) are those of
:func:`plexus_tune.graph.structure.operand_structure` on the weighted multiset.
"""

from __future__ import annotations

import math

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.graph.kernels import compiled
from plexus_tune.graph.structure import SHARE_POINTS, _range_cuts, _segments, split_block_counts

#: Stored nonzeros above which ``--graph-sample auto`` samples.
AUTO_SAMPLE_ABOVE_NNZ = 400_000_000
#: Entries an automatic sample reads.
AUTO_SAMPLE_ENTRIES = 20_000_000


def auto_fraction(nnz: int) -> float | None:
    """The fraction ``auto`` samples at for a graph of ``nnz`` stored nonzeros (None: scan it all)."""
    return None if nnz <= AUTO_SAMPLE_ABOVE_NNZ else AUTO_SAMPLE_ENTRIES / nnz


def parse_sample(text) -> float | str | None:
    """``--graph-sample``: a fraction in (0, 1] (1: every row, no sampling), or ``auto``."""
    if text is None:
        return None
    if str(text).strip().lower() == "auto":
        return "auto"
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 < value <= 1):
        raise UserError(f"graph sample {text}: give a fraction of the entries in (0, 1], e.g. 0.01, or auto",
                        parameter="graph_sample")
    return value


def sample_rows(indptr, fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(sorted sampled rows, their inclusion probabilities) reading about ``fraction`` of the entries.

    Row m of length d_m is drawn with probability ``p_m = min(1, sqrt(d_m) / kappa)``: the
    design of least variance of an estimated total at a cost of d_m entries per drawn row
    (minimizing sum d_m^2 (1 - p_m) / p_m at fixed sum p_m d_m), kappa found by bisection."""
    lengths = np.diff(np.asarray(indptr)).astype(np.int64)
    total = float(lengths.sum())
    budget = fraction * total
    if budget >= total:
        return np.arange(lengths.size), np.ones(lengths.size)
    hist = np.bincount(lengths)
    values = np.flatnonzero(hist).astype(np.float64)  # the lengths that occur, and how often
    hist = hist[hist > 0]
    root = np.sqrt(values)

    def read(kappa: float) -> float:
        return float(hist @ (np.minimum(1.0, root / kappa) * values))

    lo, hi = 1e-9, float(root[-1]) * total  # read(lo) = total >= budget > read(hi)
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        if read(mid) > budget:
            lo = mid
        else:
            hi = mid
    p = np.minimum(1.0, np.sqrt(lengths) / hi)
    u = np.random.default_rng([seed, 0x5A17]).random(lengths.size)
    rows = np.flatnonzero(u < p)
    return rows, p[rows]


def _rake(cells: np.ndarray, row_totals: np.ndarray, col_totals: np.ndarray, rounds: int = 50) -> np.ndarray:
    """Iterative proportional fitting: ``cells`` scaled until its row and column sums are the given totals."""
    out = np.array(cells, dtype=np.float64)
    for _ in range(rounds):
        sums = out.sum(axis=1)
        out *= np.divide(row_totals, sums, out=np.ones_like(sums), where=sums > 0)[:, None]
        sums = out.sum(axis=0)
        out *= np.divide(col_totals, sums, out=np.ones_like(sums), where=sums > 0)[None, :]
    return out


def _compiled_block_values(sub_indptr, sub_cols, rows, loops, inv_row, inv_col, n, blocks, members):
    """For each block (r0, r1, c0, c1): (x, y) of the sampled rows ``members[i]`` = (rows whose new
    row is in [r0, r1), rows whose new column is in [c0, c1)), by the compiled second scan over the
    sampled rows alone (:func:`plexus_tune.graph.kernels._symmetric_blocks`); None without numba."""
    kernels = compiled()
    ccuts, cseg = _range_cuts(n, [b[2] for b in blocks] + [b[3] for b in blocks])
    rcuts, rseg = _range_cuts(n, [b[0] for b in blocks] + [b[1] for b in blocks])
    kc, kr = ccuts.size - 1, rcuts.size - 1
    if kernels is None or max(kc, kr) > 2**15:
        return None
    shift = 8 if max(kc, kr) <= 2**7 else 16
    ranges = ((rseg[inv_row].astype(np.int32) << shift) | cseg[inv_col].astype(np.int32))
    ranges = ranges.astype(np.uint16 if shift == 8 else np.int32)
    spans = np.array([[np.searchsorted(rcuts, b[0]), np.searchsorted(rcuts, b[1]), np.searchsorted(ccuts, b[2]),
                       np.searchsorted(ccuts, b[3])] for b in blocks], dtype=np.int64).reshape(-1, 4)

    def targets_of(first, last, count):
        lists = [[t for t in range(len(blocks)) if spans[t, first] <= g < spans[t, last]] for g in range(count)]
        ptr = np.zeros(count + 1, dtype=np.int64)
        np.cumsum([len(v) for v in lists], out=ptr[1:])
        return ptr, np.array([t for v in lists for t in v], dtype=np.int64)

    row_ptr, row_targets = targets_of(0, 1, kr)
    col_ptr, col_targets = targets_of(2, 3, kc)
    row_sizes = np.array([int(m[0].sum()) for m in members], dtype=np.int64)
    col_sizes = np.array([int(m[1].sum()) for m in members], dtype=np.int64)
    row_offsets = np.concatenate([[0], np.cumsum(row_sizes)]).astype(np.int64)
    col_offsets = np.concatenate([[0], np.cumsum(col_sizes)]).astype(np.int64)
    row_out = np.zeros(int(row_offsets[-1]), dtype=np.int32)
    col_out = np.zeros(int(col_offsets[-1]), dtype=np.int32)
    kernels.symmetric_blocks(sub_indptr, sub_cols, loops, ranges, ranges[rows], shift, kc, kr, spans, row_ptr,
                             row_targets, col_ptr, col_targets, row_offsets[:-1].copy(), col_offsets[:-1].copy(),
                             row_out, col_out)
    return [(row_out[row_offsets[i]:row_offsets[i + 1]], col_out[col_offsets[i]:col_offsets[i + 1]])
            for i in range(len(blocks))]


def _weighted_structure(values: np.ndarray, weights: np.ndarray, count: int, padded: int,
                        col_values: np.ndarray, col_weights: np.ndarray, col_count: int, col_padded: int) -> dict:
    """:func:`operand_structure` of a weighted multiset of row lengths and one of column counts."""
    def scaled(v, w, k, size):
        w = w * (k / w.sum()) if w.size and w.sum() > 0 else w
        if size > k:
            v = np.append(v, 0)
            w = np.append(w, size - k)
        return v.astype(np.float64), w

    rv, rw = scaled(values, weights, count, padded)
    cv_, cw = scaled(col_values, col_weights, col_count, col_padded)
    nnz = float(rw @ rv)
    mean = nnz / max(padded, 1)
    cv = float(math.sqrt(float(rw @ (rv - mean) ** 2) / max(padded, 1)) / mean) if mean > 0 else 0.0
    order = np.argsort(-cv_, kind="stable")
    top_v, top_w = cv_[order], cw[order]
    cum_w = np.cumsum(top_w)
    cum_s = np.cumsum(top_w * top_v)
    col_total = float(cum_s[-1]) if cum_s.size else 0.0

    def top_sum(m: float) -> float:
        if cum_w.size == 0:
            return 0.0
        i = int(np.searchsorted(cum_w, m, side="left"))
        if i >= cum_w.size:
            return col_total
        before_w = float(cum_w[i - 1]) if i else 0.0
        before_s = float(cum_s[i - 1]) if i else 0.0
        return before_s + (m - before_w) * float(top_v[i])

    share = np.ones(SHARE_POINTS, dtype=np.float64)
    if col_total > 0:
        for j in range(SHARE_POINTS):
            m = 2 ** j
            if m < col_padded:
                share[j] = min(1.0, top_sum(m) / col_total)
    top = max(1, col_padded // 100)
    return {
        "row_length_cv": cv,
        "top1pct_column_share": float(min(1.0, top_sum(min(top, col_padded)) / col_total)) if col_total > 0 else 0.0,
        "touched_column_fraction": float(cw[cv_ > 0].sum() / max(col_padded, 1)),
        "column_share": [round(float(v), 6) for v in share],
    }


def sampled_split_statistics(adjacency, splits, row_perm, col_perm, fraction: float, *, self_loops: bool = True,
                             seed: int = 0) -> tuple[dict, dict]:
    """(statistics, sample) of every (R, C) split of a symmetric pattern, estimated from a row sample.

    ``statistics`` is shaped as :func:`plexus_tune.graph.structure.split_statistics`'s,
    each entry with ``nnz_max_rse`` (the relative standard error of its largest block's
    nonzeros); ``sample`` says what was read: ``{"fraction", "rows", "entries",
    "normalized_nnz", "normalized_nnz_rse"}``.
    """
    indptr = np.asarray(adjacency.indptr)
    indices = adjacency.indices
    n = int(adjacency.shape[0])
    splits = sorted({(int(r), int(c)) for r, c in splits})
    rows, p = sample_rows(indptr, fraction, seed)
    w = 1.0 / p
    starts = indptr[rows].astype(np.int64)
    lengths = (indptr[rows + 1] - indptr[rows]).astype(np.int64)
    offsets = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    positions = np.repeat(starts - offsets[:-1], lengths) + np.arange(int(offsets[-1]), dtype=np.int64)
    cols = np.asarray(indices[positions]).astype(np.int64)
    del positions
    if cols.size and (cols.min() < 0 or cols.max() >= n):
        raise UserError(f"the graph's column indices run outside 0..{n - 1}; the graph is corrupt: convert it again")
    local = np.repeat(np.arange(rows.size, dtype=np.int64), lengths)
    # self-loops of the sampled rows that store no diagonal
    has = np.zeros(rows.size, dtype=bool)
    has[local[cols == rows[local]]] = True
    loops = ~has if self_loops else np.zeros(rows.size, dtype=bool)
    stored_cols = cols
    local = np.concatenate([local, np.flatnonzero(loops)])
    cols = np.concatenate([cols, rows[loops]])
    row_len_hat = lengths + loops  # normalized row lengths of the sampled rows

    row_perm = np.asarray(row_perm, dtype=np.int64)
    col_perm = np.asarray(col_perm, dtype=np.int64)
    inv_row = np.empty(n, dtype=np.int64)
    inv_row[row_perm] = np.arange(n, dtype=np.int64)
    inv_col = np.empty(n, dtype=np.int64)
    inv_col[col_perm] = np.arange(n, dtype=np.int64)
    new_row_of_row = inv_row[rows]  # row m of A is row inv_row[m] of B ...
    new_col_of_row = inv_col[rows]  # ... and column inv_col[m] of B (A symmetric)
    entry_new_col = inv_col[cols]  # entry (m, k): column inv_col[k] of B's row inv_row[m]

    # scan 1 on the sample: weighted cells of the union of all splits' cuts
    rcuts, rseg = _segments(n, sorted({r for r, _ in splits}))
    ccuts, cseg = _segments(n, sorted({c for _, c in splits}))
    nrs, ncs = rcuts.size - 1, ccuts.size - 1
    cell = rseg[new_row_of_row[local]].astype(np.int64) * ncs + cseg[entry_new_col]
    # every row's and column's normalized length is known from indptr (rows not read: a self-loop
    # in the share of the sample's rows that lack a stored diagonal)
    degree = np.diff(indptr).astype(np.float64)
    lacking_share = float(w[loops].sum() / w.sum()) if self_loops and w.size else 0.0
    degree += lacking_share if self_loops else 0.0
    degree[rows] = row_len_hat
    row_totals = np.bincount(rseg[inv_row], weights=degree, minlength=nrs)
    col_totals = np.bincount(cseg[inv_col], weights=degree, minlength=ncs)
    # entries touching a row read with certainty (p = 1) are known exactly, both ways (A symmetric):
    # row m's entries (m, k), and their mirrors (k, m) for k not read with certainty
    certain = p >= 1
    sure = certain[local]
    known = np.bincount(cell[sure], minlength=nrs * ncs).astype(np.float64)
    mirror = sure & ~np.isin(cols, rows[certain])
    mirror_cell = rseg[inv_row[cols[mirror]]].astype(np.int64) * ncs + cseg[inv_col[rows[local[mirror]]]]
    known = (known + np.bincount(mirror_cell, minlength=nrs * ncs)).reshape(nrs, ncs)
    del cell, mirror_cell, sure, mirror
    # the rest spread over the cells as a random permutation does in expectation: independent rows and
    # columns, raked to what the totals leave
    rest_r = np.maximum(row_totals - known.sum(axis=1), 0.0)
    rest_c = np.maximum(col_totals - known.sum(axis=0), 0.0)
    rest = _rake(np.outer(rest_r, rest_c) / max(float(rest_r.sum()), 1e-300), rest_r, rest_c, rounds=20)
    table = np.zeros((nrs + 1, ncs + 1))
    table[1:, 1:] = np.cumsum(np.cumsum(known + rest, axis=0), axis=1)
    rest_table = np.zeros((nrs + 1, ncs + 1))
    rest_table[1:, 1:] = np.cumsum(np.cumsum(rest, axis=0), axis=1)

    chosen = {}
    for R, C in splits:
        br, bc = -(-n // R), -(-n // C)
        counts, ri, ci = split_block_counts(table, rcuts, ccuts, n, R, C)
        r, c = (int(v) for v in np.unravel_index(int(np.argmax(counts)), counts.shape))
        t = rest_table[ri[r]:ri[r + 1] + 1:ri[r + 1] - ri[r], ci[c]:ci[c + 1] + 1:ci[c + 1] - ci[c]]
        spread = float(t[1, 1] - t[0, 1] - t[1, 0] + t[0, 0])  # the block's entries not known exactly
        error = math.sqrt(max(spread, 0.0)) / counts[r, c] if counts[r, c] > 0 else 0.0
        chosen[(R, C)] = (r, c, float(counts[r, c]), float(counts.sum()), br, bc, error)
    blocks = [(min(r * br, n), min((r + 1) * br, n), min(c * bc, n), min((c + 1) * bc, n))
              for r, c, _, _, br, bc, _ in chosen.values()]
    members = [((new_row_of_row >= r0) & (new_row_of_row < r1), (new_col_of_row >= c0) & (new_col_of_row < c1))
               for r0, r1, c0, c1 in blocks]
    sub_indptr = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=sub_indptr[1:])
    values = _compiled_block_values(sub_indptr, stored_cols, rows, loops, inv_row, inv_col, n, blocks, members)
    out = {}
    for i, ((R, C), (r, c, block_nnz, total, br, bc, error)) in enumerate(chosen.items()):
        r0, r1, c0, c1 = blocks[i]
        in_rows, in_cols = members[i]
        if values is not None:
            x, y = (v.astype(np.int64) for v in values[i])
        else:
            # row side: sampled rows whose new row is in [r0, r1), their entries with new column in [c0, c1)
            hit = in_rows[local] & (entry_new_col >= c0) & (entry_new_col < c1)
            x = np.bincount(local[hit], minlength=rows.size)[in_rows]
            # column side: sampled rows whose new column is in [c0, c1), their entries with new row in [r0, r1)
            entry_new_row = inv_row[cols]  # entry (m, k): row inv_row[k] of B's column inv_col[m]
            hit = in_cols[local] & (entry_new_row >= r0) & (entry_new_row < r1)
            y = np.bincount(local[hit], minlength=rows.size)[in_cols]
        forward = _weighted_structure(x, w[in_rows], r1 - r0, br, y, w[in_cols], c1 - c0, bc)
        transpose = _weighted_structure(y, w[in_cols], c1 - c0, bc, x, w[in_rows], r1 - r0, br)
        out[(R, C)] = {"nnz_max": int(round(block_nnz)), "nnz_mean": total / (R * C), "block": (r, c),
                       "forward": forward, "transpose": transpose,
                       "nnz_max_rse": error}
    sample = {"fraction": float(fraction), "rows": int(rows.size), "entries": int(offsets[-1]),
              "normalized_nnz": int(round(float(degree.sum())))}
    return out, sample


def sampled_normalized_nnz(adjacency, fraction: float, seed: int = 0) -> tuple[int, float]:
    """(normalized nonzeros, its relative standard error): the stored ones plus the self-loops
    of rows without a stored diagonal, those counted in a row sample (:func:`sample_rows`)."""
    indptr = np.asarray(adjacency.indptr)
    n = int(adjacency.shape[0])
    rows, p = sample_rows(indptr, fraction, seed)
    starts = indptr[rows].astype(np.int64)
    lengths = (indptr[rows + 1] - indptr[rows]).astype(np.int64)
    offsets = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    positions = np.repeat(starts - offsets[:-1], lengths) + np.arange(int(offsets[-1]), dtype=np.int64)
    local = np.repeat(np.arange(rows.size, dtype=np.int64), lengths)
    has = np.zeros(rows.size, dtype=bool)
    has[local[np.asarray(adjacency.indices[positions]) == rows[local]]] = True
    w = 1.0 / p
    # rows unread (p < 1) stand for the sampled rows of their kind: the lacking share, weighted
    lacking = float(w[~has].sum() / w.sum()) * n if w.size else float(n)
    stored = int(indptr[-1])
    spread = float(np.sqrt(((1 - p) / p ** 2) @ (~has).astype(np.float64))) if w.size else 0.0
    total = stored + lacking
    return int(round(total)), spread / total if total > 0 else 0.0
