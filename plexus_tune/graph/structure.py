"""Sparsity structure of SpMM operands and of a graph's shards (docs/model.md, "Sparsity structure").

The structure of a sparse ``rows x common`` operand is summarized from its row lengths
and column counts alone (:func:`operand_structure`)::

    row_length_cv             std / mean of the row lengths
    top1pct_column_share      share of the nonzeros in the max(1, common // 100) most
                              popular columns
    touched_column_fraction   share of the columns holding at least one nonzero
    column_share              share of the nonzeros in the 2^j most popular columns,
                              j = 0 .. SHARE_POINTS - 1 (1 once 2^j >= common)

The transpose swaps the two count vectors. :class:`PermutedPattern` holds a graph's
normalized adjacency pattern after a permutation and :func:`split_structure` finds the
largest block of a block split and the structure of it and its transpose.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import numpy as np

from plexus_tune.graph.kernels import compiled
from plexus_tune.graph.shards import check_shard_files, load_shard_range

#: Points of the column popularity curve: share of nonzeros in the 2^j most popular columns.
SHARE_POINTS = 32
#: Keys of a structure record (the ``structure`` field of an SpMM record), in order.
STRUCTURE_KEYS = ("row_length_cv", "top1pct_column_share", "touched_column_fraction", "column_share")


def _top_sums(counts: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Sum of the m largest of ``counts`` (whole numbers >= 0) for every m (<= counts.size), from
    their histogram: with A(v) values >= v holding H(v) in total, and t the largest v with
    A(v) >= m, the top m hold H(t + 1) + (m - A(t + 1)) t."""
    hist = np.bincount(counts)
    values = np.arange(hist.size, dtype=np.int64)
    at_least = np.cumsum(hist[::-1])[::-1]  # A(v)
    held = np.cumsum((hist * values)[::-1])[::-1]  # H(v)
    at_least = np.append(at_least, 0)
    held = np.append(held, 0)
    # t: the largest v with A(v) >= m (A falls as v grows)
    t = np.searchsorted(-at_least, -np.asarray(m, dtype=np.int64), side="right") - 1
    return held[t + 1] + (m - at_least[t + 1]) * t


def column_share_curve(col_counts: np.ndarray, nnz: float | None = None) -> np.ndarray:
    """Share of the nonzeros in the 2^j most popular columns, j = 0 .. SHARE_POINTS - 1."""
    counts = np.asarray(col_counts, dtype=np.int64)
    total = float(counts.sum() if nnz is None else nnz)
    out = np.ones(SHARE_POINTS, dtype=np.float64)
    if total <= 0:
        return out
    points = 2 ** np.arange(SHARE_POINTS, dtype=np.int64)
    inside = points < counts.size
    if np.any(inside):
        out[inside] = _top_sums(counts, points[inside]).astype(np.float64) / total
    return np.minimum(out, 1.0)


def operand_structure(row_counts, col_counts) -> dict:
    """The structure record of one sparse operand from its row lengths and column counts."""
    rows = np.asarray(row_counts)
    cols = np.asarray(col_counts, dtype=np.int64)
    hist = np.bincount(np.asarray(rows, dtype=np.int64)) if rows.size else np.zeros(1, dtype=np.int64)
    values = np.arange(hist.size, dtype=np.float64)
    nnz = float(hist @ values)
    mean = nnz / max(rows.size, 1)
    cv = float(np.sqrt(hist @ (values - mean) ** 2 / max(rows.size, 1)) / mean) if mean > 0 else 0.0
    top = max(1, cols.size // 100)
    if nnz > 0 and cols.size:
        top_share = float(_top_sums(cols, np.array([min(top, cols.size)]))[0] / nnz)
    else:
        top_share = 0.0
    return {
        "row_length_cv": cv,
        "top1pct_column_share": top_share,
        "touched_column_fraction": float(np.count_nonzero(cols) / max(cols.size, 1)),
        "column_share": [round(float(v), 6) for v in column_share_curve(cols, nnz)],
    }


# --------------------------------------------------------------------------- graph shards


class PermutedPattern:
    """The pattern of a graph's normalized adjacency (self-loops added) after a permutation.

    ``B = A_hat[row_perm][:, col_perm]``: the stored entries as CSR rows in the new order
    with new column ids (unsorted within a row: counting never needs the order), and the
    self-loops that GCN normalization adds (one per row without a stored diagonal) kept
    apart as (new row, new column) pairs.
    """

    def __init__(self, adjacency, row_perm: np.ndarray | None = None, col_perm: np.ndarray | None = None, *,
                 self_loops: bool = True):
        import scipy.sparse as sp
        csr = sp.csr_matrix(adjacency)
        if row_perm is None:
            row_perm = np.arange(csr.shape[0], dtype=np.int64)
        if col_perm is None:
            col_perm = row_perm
        n = csr.shape[0]
        index_dtype = np.int32 if n < 2**31 else np.int64
        row_perm = np.asarray(row_perm, dtype=np.int64)
        inv_row = np.empty(n, dtype=index_dtype)
        inv_row[row_perm] = np.arange(n, dtype=index_dtype)
        inv_col = np.empty(n, dtype=index_dtype)
        inv_col[np.asarray(col_perm, dtype=np.int64)] = np.arange(n, dtype=index_dtype)
        # rows that store their diagonal keep it; every other row gains a self-loop
        lengths = np.diff(csr.indptr)
        has_diag = np.zeros(n, dtype=bool)
        row_of = np.repeat(np.arange(n, dtype=index_dtype), lengths)
        has_diag[row_of[csr.indices == row_of]] = True
        del row_of
        lacking = np.flatnonzero(~has_diag) if self_loops else np.zeros(0, dtype=np.int64)
        self.loop_rows = inv_row[lacking]
        self.loop_cols = inv_col[lacking]
        permuted = csr[row_perm] if not np.array_equal(row_perm, np.arange(n)) else csr
        self.indptr = np.asarray(permuted.indptr, dtype=np.int64)
        self.indices = inv_col[permuted.indices]
        self.nodes = n
        self._column_blocks: dict = {}

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1]) + int(self.loop_rows.size)

    def _blocks_of_columns(self, col_blocks: int) -> np.ndarray:
        """Column block of every stored entry for a split into col_blocks (cached: splits share it)."""
        if col_blocks not in self._column_blocks:
            bc = -(-self.nodes // col_blocks)
            dtype = np.int16 if col_blocks < 2**15 else np.int32
            self._column_blocks = {col_blocks: (self.indices // bc).astype(dtype, copy=False)}
        return self._column_blocks[col_blocks]

    def block_counts(self, row_blocks: int, col_blocks: int) -> np.ndarray:
        """Nonzeros of every block of a row_blocks x col_blocks split, blocks of ceil(N / g) rows/columns."""
        n = self.nodes
        br, bc = -(-n // row_blocks), -(-n // col_blocks)
        cb = self._blocks_of_columns(col_blocks)
        counts = np.zeros((row_blocks, col_blocks), dtype=np.int64)
        for r in range(row_blocks):
            lo, hi = self.indptr[min(r * br, n)], self.indptr[min((r + 1) * br, n)]
            if hi > lo:
                counts[r] = np.bincount(cb[lo:hi], minlength=col_blocks)[:col_blocks]
        loops = (self.loop_rows // br).astype(np.int64) * col_blocks + self.loop_cols // bc
        counts += np.bincount(loops, minlength=row_blocks * col_blocks).reshape(row_blocks, col_blocks)
        return counts

    def block_counts_many(self, row_block_counts, col_blocks: int) -> dict:
        """:meth:`block_counts` for several row splits of one column split, in one pass over the entries.

        The rows are cut at every boundary ``r ceil(N / R)`` of every R; each segment's
        column-block counts are summed once, and each split's blocks are differences of
        their running sums.
        """
        n = self.nodes
        bc = -(-n // col_blocks)
        cb = self._blocks_of_columns(col_blocks)
        splits = sorted({int(R) for R in row_block_counts})
        cuts = sorted({min(r * -(-n // R), n) for R in splits for r in range(R + 1)} | {0, n})
        position = {cut: i for i, cut in enumerate(cuts)}
        running = np.zeros((len(cuts), col_blocks), dtype=np.int64)
        for i in range(len(cuts) - 1):
            lo, hi = self.indptr[cuts[i]], self.indptr[cuts[i + 1]]
            segment = np.bincount(cb[lo:hi], minlength=col_blocks)[:col_blocks] if hi > lo else 0
            running[i + 1] = running[i] + segment
        loops_rows = np.searchsorted(np.asarray(cuts), self.loop_rows, side="right") - 1
        loop_counts = np.zeros((len(cuts), col_blocks), dtype=np.int64)
        np.add.at(loop_counts, (loops_rows + 1, self.loop_cols // bc), 1)
        running += np.cumsum(loop_counts, axis=0)
        out = {}
        for R in splits:
            br = -(-n // R)
            starts = [position[min(r * br, n)] for r in range(R)]
            stops = [position[min((r + 1) * br, n)] for r in range(R)]
            out[R] = running[stops] - running[starts]
        return out

    def block_vectors(self, row_blocks: int, col_blocks: int, r: int, c: int) -> tuple[np.ndarray, np.ndarray]:
        """(row lengths, column counts) of block (r, c), with its padded sizes ceil(N / g)."""
        n = self.nodes
        br, bc = -(-n // row_blocks), -(-n // col_blocks)
        r0, r1 = min(r * br, n), min((r + 1) * br, n)
        lo, hi = self.indptr[r0], self.indptr[r1]
        cols = self.indices[lo:hi]
        keep = (cols >= c * bc) & (cols < (c + 1) * bc)
        row_ids = np.repeat(np.arange(r1 - r0), np.diff(self.indptr[r0:r1 + 1]))[keep]
        col_ids = cols[keep] - c * bc
        loops = (self.loop_rows >= r0) & (self.loop_rows < r1) & (self.loop_cols >= c * bc) & (self.loop_cols < (c + 1) * bc)
        row_ids = np.concatenate([row_ids, self.loop_rows[loops] - r0])
        col_ids = np.concatenate([col_ids, self.loop_cols[loops] - c * bc])
        return np.bincount(row_ids, minlength=br)[:br], np.bincount(col_ids, minlength=bc)[:bc]


def split_structure(pattern: PermutedPattern, row_blocks: int, col_blocks: int, counts=None) -> dict:
    """The largest block of a row_blocks x col_blocks split of ``pattern``.

    ``{"nnz_max", "nnz_mean", "block": (r, c), "forward": structure, "transpose":
    structure}``: ``forward`` describes the block as a ``ceil(N/R) x ceil(N/C)``
    operand, ``transpose`` its transpose (:func:`operand_structure`). ``counts``: the
    split's block counts when already known.
    """
    counts = pattern.block_counts(row_blocks, col_blocks) if counts is None else counts
    r, c = np.unravel_index(int(np.argmax(counts)), counts.shape)
    row_counts, col_counts = pattern.block_vectors(row_blocks, col_blocks, int(r), int(c))
    return {"nnz_max": int(counts.max()), "nnz_mean": float(counts.sum() / counts.size), "block": (int(r), int(c)),
            "forward": operand_structure(row_counts, col_counts), "transpose": operand_structure(col_counts, row_counts)}


def grid_shard_structure(pattern: PermutedPattern, splits: Iterable[tuple[int, int]], *, progress=None) -> dict:
    """:func:`split_structure` of every (row blocks, column blocks) split, ``{(R, C): entry}``."""
    out = {}
    for R, C in sorted(set(splits), key=lambda rc: (rc[1], rc[0])):  # splits of one C share its column blocks
        t0 = time.perf_counter()
        out[(R, C)] = split_structure(pattern, R, C)
        if progress is not None:
            progress(R, C, time.perf_counter() - t0)
    return out


def pattern_symmetric(adjacency) -> bool:
    """Whether the adjacency's pattern equals its transpose's (checked row length first)."""
    import scipy.sparse as sp
    csr = sp.csr_matrix(adjacency)
    rows_len = np.diff(csr.indptr)
    cols_len = np.bincount(csr.indices, minlength=csr.shape[1])
    if not np.array_equal(rows_len, cols_len):
        return False
    t = csr.T.tocsr()
    a = csr.copy()
    a.sort_indices()
    t.sort_indices()
    return bool(np.array_equal(a.indices, t.indices))


def normalized_nnz(adjacency) -> int:
    """Nonzeros of the GCN-normalized adjacency: the stored ones plus a self-loop for each
    row without a stored diagonal (:func:`plexus_tune.graph.core.gcn_normalize`), counted
    without building it."""
    import scipy.sparse as sp
    csr = sp.csr_matrix(adjacency)
    n = csr.shape[0]
    row_of = np.repeat(np.arange(n, dtype=csr.indices.dtype), np.diff(csr.indptr))
    with_diagonal = np.unique(row_of[csr.indices == row_of]).size
    return int(csr.nnz + n - with_diagonal)


def shard_directory_matrix(shard_dir) -> tuple[sp.csr_matrix, dict]:
    """(B, manifest) of a shard directory: the whole stored permuted normalized adjacency
    (its first num_nodes rows and columns) and the directory's manifest."""
    manifest = check_shard_files(shard_dir)
    n = int(manifest["num_nodes"])
    matrix = load_shard_range(shard_dir, (0, n), (0, n), manifest=manifest)
    return matrix, manifest


# --------------------------------------------------------------------------- one scan for every split

#: Stored entries a scan handles at once: its temporary arrays are a few times this many words.
SCAN_CHUNK_ENTRIES = 1 << 22
#: Most cells of the histogram one scan keeps (row segments x column segments); more splits
#: are scanned in groups of column counts.
SCAN_MAX_CELLS = 1 << 22


def _csr_parts(adjacency) -> tuple[np.ndarray, np.ndarray, int]:
    """(indptr, indices, N) of a square CSR matrix without copying memory-mapped arrays."""
    import scipy.sparse as sp
    if getattr(adjacency, "format", None) != "csr":
        import scipy.sparse as sp

        adjacency = sp.csr_matrix(adjacency)
    return np.asarray(adjacency.indptr), adjacency.indices, int(adjacency.shape[0])


def _row_chunks(indptr: np.ndarray, chunk_entries: int, max_rows: int | None = None):
    """Consecutive row ranges [a, b) of about ``chunk_entries`` stored entries (and at most
    ``max_rows`` rows) each."""
    n = indptr.size - 1
    a = 0
    while a < n:
        b = int(np.searchsorted(indptr, int(indptr[a]) + chunk_entries, side="right")) - 1
        b = min(max(b, a + 1), n, a + max_rows if max_rows else n)
        yield a, b
        a = b


def diagonal_rows(adjacency, chunk_entries: int = SCAN_CHUNK_ENTRIES) -> np.ndarray:
    """Whether each row stores its diagonal entry (bool, N), read in chunks of rows."""
    indptr, indices, n = _csr_parts(adjacency)
    has = np.zeros(n, dtype=bool)
    kernels = compiled()
    if kernels is not None:
        kernels.diagonal_rows(np.asarray(indptr), np.asarray(indices), has)
        return has
    for a, b in _row_chunks(indptr, chunk_entries):
        lo, hi = int(indptr[a]), int(indptr[b])
        if hi > lo:
            row_of = np.repeat(np.arange(a, b, dtype=np.int64), np.diff(indptr[a:b + 1]))
            has[row_of[np.asarray(indices[lo:hi]) == row_of]] = True
    return has


def _segments(n: int, counts) -> tuple[np.ndarray, np.ndarray]:
    """(cuts, segment of every id): the union of the split points min(k ceil(n/g), n) of every g."""
    cuts = {0, n}
    for g in counts:
        step = -(-n // int(g))
        cuts.update(min(k * step, n) for k in range(int(g) + 1))
    cuts = np.array(sorted(cuts), dtype=np.int64)
    dtype = np.int16 if cuts.size < 2**15 else np.int32
    return cuts, np.repeat(np.arange(cuts.size - 1, dtype=dtype), np.diff(cuts))


def split_block_counts(table: np.ndarray, rcuts: np.ndarray, ccuts: np.ndarray, n: int, R: int, C: int):
    """(counts, ri, ci): the entries of each block of the R x C split of an n x n matrix, read from
    ``table``, the 2D prefix sums of its cells between the row cuts ``rcuts`` and column cuts
    ``ccuts`` (every block edge, ceil(n / R) rows apart, is a cut); ``ri``/``ci`` index the block
    edges in the cuts."""
    br, bc = -(-n // R), -(-n // C)
    ri = np.searchsorted(rcuts, np.minimum(np.arange(R + 1) * br, n))
    ci = np.searchsorted(ccuts, np.minimum(np.arange(C + 1) * bc, n))
    corner = table[np.ix_(ri, ci)]
    return corner[1:, 1:] - corner[:-1, 1:] - corner[1:, :-1] + corner[:-1, :-1], ri, ci


def split_statistics(adjacency, splits, row_perm=None, col_perm=None, *, self_loops: bool = True,
                     has_diagonal: np.ndarray | None = None, chunk_entries: int = SCAN_CHUNK_ENTRIES,
                     symmetric_pattern: bool = False, progress=None) -> dict:
    """:func:`split_structure` of every (R, C) split of ``B = A_hat[row_perm][:, col_perm]``, in two scans.

    Equal to ``split_structure(PermutedPattern(adjacency, row_perm, col_perm, self_loops=...), R, C)``
    for each split, without the permuted copy. The first scan counts the entries of every
    cell of the union of all splits' row and column cuts (each split's blocks are sums of
    cells); the second reads the rows of each split's largest block, in the new row order,
    for its row lengths and column counts. Both read ``chunk_entries`` entries at a time, so
    beside the graph's arrays memory holds the permutations, the cells and one chunk.
    ``has_diagonal``: :func:`diagonal_rows` when already known. ``symmetric_pattern``: the
    adjacency's pattern equals its transpose's, which lets the second scan read the rows in
    their stored order (:func:`_block_vectors_symmetric`). ``progress(stage, seconds)`` is
    called after each scan.
    """
    indptr, indices, n = _csr_parts(adjacency)
    splits = sorted({(int(r), int(c)) for r, c in splits})
    if not splits:
        return {}
    row_counts = sorted({r for r, _ in splits})
    col_counts = sorted({c for _, c in splits})
    rcuts, rseg = _segments(n, row_counts)
    if (rcuts.size - 1) * (_segments(n, col_counts)[0].size - 1) > SCAN_MAX_CELLS and len(col_counts) > 1:
        half = col_counts[: len(col_counts) // 2]
        first = [s for s in splits if s[1] in half]
        rest = [s for s in splits if s[1] not in half]
        kwargs = dict(self_loops=self_loops, chunk_entries=chunk_entries, progress=progress,
                      symmetric_pattern=symmetric_pattern,
                      has_diagonal=has_diagonal if has_diagonal is not None or not self_loops else diagonal_rows(adjacency, chunk_entries))
        return {**split_statistics(adjacency, first, row_perm, col_perm, **kwargs),
                **split_statistics(adjacency, rest, row_perm, col_perm, **kwargs)}
    ccuts, cseg = _segments(n, col_counts)
    nrs, ncs = rcuts.size - 1, ccuts.size - 1
    row_perm = np.arange(n, dtype=np.int64) if row_perm is None else np.asarray(row_perm, dtype=np.int64)
    col_perm = row_perm if col_perm is None else np.asarray(col_perm, dtype=np.int64)
    index_dtype = np.int32 if n < 2**31 else np.int64
    inv_row = np.empty(n, dtype=index_dtype)
    inv_row[row_perm] = np.arange(n, dtype=index_dtype)
    inv_col = np.empty(n, dtype=index_dtype)
    inv_col[col_perm] = np.arange(n, dtype=index_dtype)
    if (symmetric_pattern and compiled() is not None and
            sum(R + C for R, C in splits) <= ONE_SCAN_MAX_BLOCKS):
        return _every_block_statistics(indptr, indices, n, splits, inv_row, inv_col, self_loops, has_diagonal, adjacency,
                                       progress)

    # scan 1: entries per cell, in the stored row order
    t0 = time.perf_counter()
    row_cell = rseg[inv_row].astype(np.int64) * ncs  # first cell of each old row's new row segment
    col_cell = cseg[inv_col]  # column segment of each old column's new column
    cells = np.zeros(nrs * ncs, dtype=np.int64)
    find_diagonal = self_loops and has_diagonal is None
    has = np.zeros(n, dtype=bool) if find_diagonal else None
    kernels = compiled()
    if kernels is not None:
        if find_diagonal:
            has, find_diagonal, has_diagonal = None, False, diagonal_rows(adjacency)
        kernels.cell_counts(np.asarray(indptr), np.asarray(indices), row_cell, col_cell, cells)
    for a, b in ([] if kernels is not None else _row_chunks(indptr, chunk_entries)):
        lo, hi = int(indptr[a]), int(indptr[b])
        if hi == lo:
            continue
        lengths = np.diff(indptr[a:b + 1])
        cols = np.asarray(indices[lo:hi])
        cells += np.bincount(np.repeat(row_cell[a:b], lengths) + col_cell[cols], minlength=nrs * ncs)
        if find_diagonal:
            row_of = np.repeat(np.arange(a, b, dtype=np.int64), lengths)
            has[row_of[cols == row_of]] = True
    del row_cell, col_cell
    if self_loops:
        lacking = np.flatnonzero(~(has if find_diagonal else np.asarray(has_diagonal, dtype=bool)))
    else:
        lacking = np.zeros(0, dtype=np.int64)
    loop_rows, loop_cols = inv_row[lacking], inv_col[lacking]
    if loop_rows.size:
        cells += np.bincount(rseg[loop_rows].astype(np.int64) * ncs + cseg[loop_cols], minlength=nrs * ncs)
    table = np.zeros((nrs + 1, ncs + 1), dtype=np.int64)
    table[1:, 1:] = np.cumsum(np.cumsum(cells.reshape(nrs, ncs), axis=0), axis=1)
    del cells
    if progress is not None:
        progress("cells", time.perf_counter() - t0)

    # each split's block counts and largest block
    targets = {}
    out = {}
    for R, C in splits:
        br, bc = -(-n // R), -(-n // C)
        counts, ri, ci = split_block_counts(table, rcuts, ccuts, n, R, C)
        r, c = (int(v) for v in np.unravel_index(int(np.argmax(counts)), counts.shape))
        out[(R, C)] = {"nnz_max": int(counts.max()), "nnz_mean": float(counts.sum() / counts.size), "block": (r, c)}
        targets[(R, C)] = (min(r * br, n), min((r + 1) * br, n), c * bc, (c + 1) * bc, br, bc)

    # scan 2: the row lengths and column counts of every largest block
    t0 = time.perf_counter()
    if symmetric_pattern:
        vectors = _block_vectors_symmetric(indptr, indices, n, inv_row, inv_col, targets, chunk_entries, lacking)
    else:
        vectors = _block_vectors_gathered(indptr, indices, n, row_perm, inv_col, cseg, ccuts, targets, chunk_entries)
        for key, (r0, r1, c0, c1, br, bc) in targets.items():
            inside = (loop_rows >= r0) & (loop_rows < r1) & (loop_cols >= c0) & (loop_cols < c1)
            rows_out, cols_out = vectors[key]
            if np.any(inside):
                rows_out += np.bincount(loop_rows[inside] - r0, minlength=br)[:br]
                cols_out += np.bincount(loop_cols[inside] - c0, minlength=bc)[:bc]
    del lacking
    for key in targets:
        rows_out, cols_out = vectors[key]
        out[key]["forward"] = operand_structure(rows_out, cols_out)
        out[key]["transpose"] = operand_structure(cols_out, rows_out)
    if progress is not None:
        progress("blocks", time.perf_counter() - t0)
    return out


def _block_vectors_gathered(indptr, indices, n, row_perm, inv_col, cseg, ccuts, targets, chunk_entries) -> dict:
    """Scan 2 of any pattern: ``{key: (row lengths, column counts)}`` of each target block
    ``(r0, r1, c0, c1, br, bc)``, its stored entries only, reading the rows of every
    target in the new row order (each chunk's entries sorted by column segment)."""
    ncs = ccuts.size - 1
    index_dtype = np.int32 if n < 2**31 else np.int64
    vectors = {key: (np.zeros(t[4], dtype=np.int64), np.zeros(t[5], dtype=np.int64)) for key, t in targets.items()}
    row_starts = np.asarray(indptr[:-1])
    row_lengths = np.diff(indptr)
    # the column segments each largest block covers
    column_segments = {key: (int(np.searchsorted(ccuts, min(t[2], n))), int(np.searchsorted(ccuts, min(t[3], n))))
                       for key, t in targets.items()}
    wanted = np.zeros(n, dtype=bool)
    for r0, r1, *_ in targets.values():
        wanted[r0:r1] = True
    k = 0
    while k < n:
        if not wanted[k]:
            k += 1 + int(np.argmax(wanted[k + 1:])) if np.any(wanted[k + 1:]) else n
            continue
        old = row_perm[k:]
        # about chunk_entries entries of new rows k, k + 1, ...
        stop = k + 1
        total = int(row_lengths[old[0]])
        step = 1024
        while stop < n and total < chunk_entries:
            more = row_lengths[row_perm[stop:stop + step]]
            cum = np.cumsum(more)
            take = int(np.searchsorted(cum, chunk_entries - total, side="right")) + 1
            take = min(take, more.size)
            total += int(cum[take - 1])
            stop += take
            step *= 2
        old = row_perm[k:stop]
        lengths = row_lengths[old]
        offsets = np.zeros(lengths.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        positions = np.repeat(row_starts[old] - offsets[:-1], lengths) + np.arange(int(offsets[-1]), dtype=np.int64)
        cols = inv_col[indices[positions]]
        del positions
        # the chunk's entries by column segment, then new row (a stable radix sort of the segments):
        # a block's entries in one column segment are then one run, found by binary search
        segment = cseg[cols]
        order = np.argsort(segment, kind="stable")
        bucket = np.zeros(ncs + 1, dtype=np.int64)
        np.cumsum(np.bincount(segment, minlength=ncs), out=bucket[1:])
        del segment
        sorted_cols = cols[order]
        sorted_rows = np.repeat(np.arange(k, stop, dtype=index_dtype), lengths)[order]
        del order
        for key, (r0, r1, c0, c1, br, bc) in targets.items():
            a, b = max(r0, k), min(r1, stop)
            if a >= b:
                continue
            rows_out, cols_out = vectors[key]
            first, last = column_segments[key]
            if first == 0 and last == ncs:  # every column: the rows' whole entries
                lo, hi = int(offsets[a - k]), int(offsets[b - k])
                rows_out[a - r0:b - r0] += lengths[a - k:b - k]
                if hi > lo:
                    cols_out += np.bincount(cols[lo:hi] - c0, minlength=bc)[:bc]
                continue
            if a == k and b == stop:  # every row of the chunk: one run of the sorted entries
                lo, hi = int(bucket[first]), int(bucket[last])
                if hi > lo:
                    rows_out[a - r0:b - r0] += np.bincount(sorted_rows[lo:hi] - a, minlength=b - a)[:b - a]
                    cols_out += np.bincount(sorted_cols[lo:hi] - c0, minlength=bc)[:bc]
                continue
            # some rows of the chunk: within each column segment the rows ascend
            starts, stops = [], []
            for j in range(first, last):
                lo, hi = int(bucket[j]), int(bucket[j + 1])
                if hi > lo:
                    run = sorted_rows[lo:hi]
                    starts.append(lo + int(np.searchsorted(run, a)))
                    stops.append(lo + int(np.searchsorted(run, b)))
            sizes = np.asarray(stops, dtype=np.int64) - np.asarray(starts, dtype=np.int64)
            total = int(sizes.sum()) if sizes.size else 0
            if total == 0:
                continue
            before = np.zeros(sizes.size, dtype=np.int64)
            np.cumsum(sizes[:-1], out=before[1:])
            picked = np.repeat(np.asarray(starts, dtype=np.int64) - before, sizes) + np.arange(total, dtype=np.int64)
            rows_out[a - r0:b - r0] += np.bincount(sorted_rows[picked] - a, minlength=b - a)[:b - a]
            cols_out += np.bincount(sorted_cols[picked] - c0, minlength=bc)[:bc]
        k = stop
    return vectors


#: A symmetric pattern's few splits (their R + C summed up to this) are read in one scan that
#: keeps every block's row lengths and column counts (that many N-vectors) instead of two.
ONE_SCAN_MAX_BLOCKS = 40


def _every_block_statistics(indptr, indices, n, splits, inv_row, inv_col, self_loops, has_diagonal, adjacency,
                            progress) -> dict:
    """:func:`split_statistics` of a few splits of a symmetric pattern in one scan: the row
    lengths and column counts of every block (:func:`_block_vectors_symmetric`), each
    block's nonzeros their sum."""
    t0 = time.perf_counter()
    if self_loops:
        diagonal = diagonal_rows(adjacency) if has_diagonal is None else np.asarray(has_diagonal, dtype=bool)
        lacking = np.flatnonzero(~diagonal)
    else:
        lacking = np.zeros(0, dtype=np.int64)
    targets = {}
    for R, C in splits:
        br, bc = -(-n // R), -(-n // C)
        for r in range(R):
            for c in range(C):
                targets[(R, C, r, c)] = (min(r * br, n), min((r + 1) * br, n), c * bc, (c + 1) * bc, br, bc)
    vectors = _block_vectors_symmetric(indptr, indices, n, inv_row, inv_col, targets, SCAN_CHUNK_ENTRIES, lacking)
    out = {}
    for R, C in splits:
        counts = np.array([[int(vectors[(R, C, r, c)][0].sum(dtype=np.int64)) for c in range(C)] for r in range(R)],
                          dtype=np.int64)
        r, c = (int(v) for v in np.unravel_index(int(np.argmax(counts)), counts.shape))
        rows_out, cols_out = vectors[(R, C, r, c)]
        out[(R, C)] = {"nnz_max": int(counts.max()), "nnz_mean": float(counts.sum() / counts.size), "block": (r, c),
                       "forward": operand_structure(rows_out, cols_out), "transpose": operand_structure(cols_out, rows_out)}
    if progress is not None:
        progress("blocks", time.perf_counter() - t0)
    return out


#: Most (rows x ranges) counts one chunk of the symmetric second scan holds.
SCAN_MAX_ROW_CELLS = 1 << 22


def _range_cuts(n: int, bounds) -> tuple[np.ndarray, np.ndarray]:
    """(cuts, range of every id): ids cut at each of ``bounds`` (clipped to [0, n])."""
    cuts = np.unique(np.clip(np.asarray(sorted(set(bounds) | {0, n}), dtype=np.int64), 0, n))
    dtype = np.int8 if cuts.size <= 128 else np.int16 if cuts.size <= 2**15 else np.int32
    return cuts, np.repeat(np.arange(cuts.size - 1, dtype=dtype), np.diff(cuts))


def _block_vectors_symmetric(indptr, indices, n, inv_row, inv_col, targets, chunk_entries, loops) -> dict:
    """Scan 2 of a symmetric pattern A, in the stored row order: ``{key: (row lengths,
    column counts)}`` of each target block ``(r0, r1, c0, c1, br, bc)`` of
    ``B = A_hat[row_perm][:, col_perm]`` (``loops``: the old ids whose self-loop A_hat adds),
    each vector in no particular order (the statistics read them as multisets), zeros
    padding it to br and bc.

    Row m of A is row ``inv_row[m]`` of B and, A being symmetric, column ``inv_col[m]``
    of B. The new columns are cut into ranges at every target's c0 and c1, the new rows
    at every r0 and r1; each chunk counts every row's entries per column range and per row
    range (two bincounts), and a target's row lengths are differences of the first's
    running sums at c0 and c1 over the rows m with ``inv_row[m]`` in [r0, r1), its column
    counts those of the second at r0 and r1 over the rows m with ``inv_col[m]`` in
    [c0, c1). No entry is gathered or sorted; each target costs its rows and columns.
    """
    ccuts, cseg = _range_cuts(n, [t[2] for t in targets.values()] + [t[3] for t in targets.values()])
    rcuts, rseg = _range_cuts(n, [t[0] for t in targets.values()] + [t[1] for t in targets.values()])
    kc, kr = ccuts.size - 1, rcuts.size - 1
    col_range = cseg[inv_col]  # column range of each old id's new column
    row_range = rseg[inv_row]  # row range of each old id's new row
    del cseg, rseg
    spans = {key: (int(np.searchsorted(rcuts, min(r0, n))), int(np.searchsorted(rcuts, min(r1, n))),
                   int(np.searchsorted(ccuts, min(c0, n))), int(np.searchsorted(ccuts, min(c1, n))))
             for key, (r0, r1, c0, c1, _, _) in targets.items()}
    loops = np.asarray(loops, dtype=np.int64)
    kernels = compiled()
    if kernels is not None and max(kc, kr) <= 2**15:
        keys = list(targets)
        span_array = np.array([spans[key] for key in keys], dtype=np.int64).reshape(-1, 4)
        shift = 8 if max(kc, kr) <= 2**7 else 16
        ranges = (row_range.astype(np.int32) << shift) | col_range.astype(np.int32)
        ranges = ranges.astype(np.uint16 if shift == 8 else np.int32)
        del col_range, row_range

        def targets_of(first: int, last: int, count: int) -> tuple[np.ndarray, np.ndarray]:
            # for every range g, the targets whose span [first, last) holds it (CSR)
            members = [[t for t in range(len(keys)) if span_array[t, first] <= g < span_array[t, last]] for g in range(count)]
            ptr = np.zeros(count + 1, dtype=np.int64)
            np.cumsum([len(m) for m in members], out=ptr[1:])
            flat = np.array([t for m in members for t in m], dtype=np.int64)
            return ptr, flat

        row_ptr, row_targets = targets_of(0, 1, kr)
        col_ptr, col_targets = targets_of(2, 3, kc)
        row_sizes = [targets[key][1] - targets[key][0] for key in keys]
        col_sizes = [min(targets[key][3], n) - min(targets[key][2], n) for key in keys]
        row_offsets = np.concatenate([[0], np.cumsum(row_sizes)]).astype(np.int64)
        col_offsets = np.concatenate([[0], np.cumsum(col_sizes)]).astype(np.int64)
        row_out = np.zeros(int(row_offsets[-1]), dtype=np.int32)
        col_out = np.zeros(int(col_offsets[-1]), dtype=np.int32)
        loop_mask = np.zeros(n, dtype=bool)
        loop_mask[loops] = True
        kernels.symmetric_blocks(np.asarray(indptr), np.asarray(indices), loop_mask, ranges, ranges, shift, kc, kr, span_array,
                                 row_ptr, row_targets, col_ptr, col_targets, row_offsets[:-1].copy(),
                                 col_offsets[:-1].copy(), row_out, col_out)
        vectors = {}
        for i, key in enumerate(keys):
            br, bc = targets[key][4], targets[key][5]
            rows_out = np.zeros(br, dtype=np.int32)
            rows_out[:row_sizes[i]] = row_out[row_offsets[i]:row_offsets[i + 1]]
            cols_out = np.zeros(bc, dtype=np.int32)
            cols_out[:col_sizes[i]] = col_out[col_offsets[i]:col_offsets[i + 1]]
            vectors[key] = (rows_out, cols_out)
        return vectors
    pieces = {key: ([], []) for key in targets}
    max_rows = max(1, SCAN_MAX_ROW_CELLS // max(kc, kr))
    for a, b in _row_chunks(indptr, chunk_entries, max_rows):
        lo, hi = int(indptr[a]), int(indptr[b])
        rows = b - a
        lengths = np.diff(np.asarray(indptr[a:b + 1]))
        idx = np.asarray(indices[lo:hi])
        local = np.repeat(np.arange(rows, dtype=np.int64), lengths)
        own = loops[np.searchsorted(loops, a):np.searchsorted(loops, b)]  # self-loops (m, m) of the chunk's rows
        # running sums of every row's entries over the column ranges and over the row ranges
        by_col = np.zeros((rows, kc + 1), dtype=np.int32)
        np.cumsum((np.bincount(local * kc + col_range[idx], minlength=rows * kc)
                   + np.bincount((own - a) * kc + col_range[own], minlength=rows * kc)).reshape(rows, kc),
                  axis=1, out=by_col[:, 1:])
        by_row = np.zeros((rows, kr + 1), dtype=np.int32)
        np.cumsum((np.bincount(local * kr + row_range[idx], minlength=rows * kr)
                   + np.bincount((own - a) * kr + row_range[own], minlength=rows * kr)).reshape(rows, kr),
                  axis=1, out=by_row[:, 1:])
        del local, idx
        # the chunk's rows grouped by their new row's range and by their new column's range
        groups_r, groups_c = row_range[a:b], col_range[a:b]
        order_r = np.argsort(groups_r, kind="stable")
        order_c = np.argsort(groups_c, kind="stable")
        start_r = np.zeros(kr + 1, dtype=np.int64)
        np.cumsum(np.bincount(groups_r, minlength=kr), out=start_r[1:])
        start_c = np.zeros(kc + 1, dtype=np.int64)
        np.cumsum(np.bincount(groups_c, minlength=kc), out=start_c[1:])
        for key, (f0, f1, e0, e1) in spans.items():
            row_pieces, col_pieces = pieces[key]
            sel = order_r[start_r[f0]:start_r[f1]]
            if sel.size:
                row_pieces.append(by_col[sel, e1] - by_col[sel, e0])
            sel = order_c[start_c[e0]:start_c[e1]]
            if sel.size:
                col_pieces.append(by_row[sel, f1] - by_row[sel, f0])
    vectors = {}
    for key, (r0, r1, c0, c1, br, bc) in targets.items():
        row_pieces, col_pieces = pieces.pop(key)
        rows_out = np.concatenate(row_pieces + [np.zeros(br - (r1 - r0), dtype=np.int32)])
        cols_out = np.concatenate(col_pieces + [np.zeros(bc - (min(c1, n) - min(c0, n)), dtype=np.int32)])
        vectors[key] = (rows_out, cols_out)
    return vectors
