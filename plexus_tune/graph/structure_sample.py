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
the sampled rows' entries are read (:func:`gather`); indptr is streamed a chunk at a time
(:func:`pointer_chunks`), and beside the sample memory holds one chunk and the trainer's
inverse permutations, or nothing of them where they are stored memory-mapped
(:func:`plexus_tune.graph.permute.stored_inverse_permutations`; docs/model.md, "Sampled structure").

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
import mmap

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.graph.kernels import compiled
from plexus_tune.graph.permute import invert_permutation
from plexus_tune.graph.structure import SHARE_POINTS, split_block_counts

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


#: Rows of indptr a streaming pass reads at a time.
SAMPLE_CHUNK_ROWS = 1 << 18
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def row_uniforms(rows, seed: int = 0) -> np.ndarray:
    """A uniform number in [0, 1) for each row id: splitmix64 of ``(row + 1) * golden + key(seed)``,
    its top 53 bits. A row's draw depends on its id and the seed alone, so a row sample is
    decided chunk by chunk without an N-array of random numbers."""
    key = np.uint64((int(seed) * 0x2545F4914F6CDD1D + 0x5A17) % 2**64)
    z = (np.asarray(rows, dtype=np.int64).astype(np.uint64) + np.uint64(1)) * _GOLDEN + key
    z ^= z >> np.uint64(30)
    z *= _MIX1
    z ^= z >> np.uint64(27)
    z *= _MIX2
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def _mapped_file(array):
    """(file name, byte offset) of a whole memory-mapped array (np.load's mmap_mode), else None."""
    base = array
    while base is not None and not isinstance(base, np.memmap):
        base = getattr(base, "base", None)
    if base is None or not getattr(base, "filename", None) or not array.flags.c_contiguous:
        return None
    if base.shape != array.shape or base.dtype != array.dtype or base.ctypes.data != array.ctypes.data:
        return None
    return base.filename, int(base.offset)


def gather(array, positions) -> np.ndarray:
    """``array[positions]`` (a copy). A memory-mapped array is read through a mapping of its own
    advised for random access (``MADV_RANDOM``), so that each position faults in its own page
    rather than the kernel's read-around window (megabytes): a sample keeps O(sample) pages."""
    positions = np.asarray(positions)
    source = _mapped_file(array)
    if source is None or not hasattr(mmap, "MADV_RANDOM") or positions.size == 0:
        return np.asarray(array[positions])
    with open(source[0], "rb") as file:
        mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        mapping.madvise(mmap.MADV_RANDOM)
        view = np.frombuffer(mapping, dtype=array.dtype, count=array.size, offset=source[1])
        out = view[positions]
        del view
    finally:
        try:
            mapping.close()
        except BufferError:  # a view still open: the mapping closes with it
            pass
    return out


def read_range(array, a: int, b: int) -> np.ndarray:
    """``array[a:b]`` (a copy); a memory-mapped array read from its file, its pages not kept resident."""
    source = _mapped_file(array)
    if source is None:
        return np.array(array[a:b])
    return np.fromfile(source[0], dtype=array.dtype, count=b - a, offset=source[1] + a * array.dtype.itemsize)


def pointer_chunks(indptr, chunk_rows: int = SAMPLE_CHUNK_ROWS):
    """``(a, b, indptr[a:b + 1] as int64)`` for consecutive row ranges of ``chunk_rows`` rows. A
    memory-mapped indptr is read from its file chunk by chunk, so its pages do not stay resident:
    the pass holds one chunk whatever N is."""
    n = int(indptr.shape[0]) - 1
    for a in range(0, n, int(chunk_rows)):
        b = min(a + int(chunk_rows), n)
        yield a, b, read_range(indptr, a, b + 1).astype(np.int64)


def _kappa(indptr, fraction: float, chunk_rows: int) -> tuple[float | None, int]:
    """(kappa, empty rows): kappa of the design ``p_m = min(1, sqrt(d_m) / kappa)`` reading ``fraction``
    of the entries, by bisection over the histogram of the row lengths (one pass over indptr, which
    checks that it never decreases); None: read every row."""
    hist = np.zeros(1, dtype=np.int64)
    for a, _, ptr in pointer_chunks(indptr, chunk_rows):
        lengths = np.diff(ptr)
        if lengths.size and lengths.min() < 0:
            row = a + int(np.argmax(lengths < 0))
            raise UserError(f"indptr decreases at row {row}; the graph is corrupt: convert it again")
        counts = np.bincount(lengths)
        if counts.size > hist.size:
            counts[:hist.size] += hist
            hist = counts
        else:
            hist[:counts.size] += counts
    empty = int(hist[0])
    values = np.flatnonzero(hist).astype(np.float64)  # the lengths that occur, and how often
    hist = hist[hist > 0]
    total = float(hist @ values)
    budget = fraction * total
    if budget >= total or total == 0:
        return None, empty
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
    return hi, empty


def sample_rows(indptr, fraction: float, seed: int = 0, *,
                chunk_rows: int = SAMPLE_CHUNK_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """(sorted sampled rows, their inclusion probabilities) reading about ``fraction`` of the entries.

    Row m of length d_m is drawn with probability ``p_m = min(1, sqrt(d_m) / kappa)``: the
    design of least variance of an estimated total at a cost of d_m entries per drawn row
    (minimizing sum d_m^2 (1 - p_m) / p_m at fixed sum p_m d_m), kappa found by bisection;
    drawn when :func:`row_uniforms` gives it less than p_m. Two passes over indptr, one chunk
    of rows at a time: memory holds the sample and one chunk."""
    return _sample_rows(indptr, fraction, seed, chunk_rows)[:2]


def _sample_rows(indptr, fraction: float, seed: int, chunk_rows: int):
    """:func:`sample_rows` and the count of empty rows."""
    kappa, empty = _kappa(indptr, fraction, chunk_rows)
    rows, probabilities = [], []
    for a, b, ptr in pointer_chunks(indptr, chunk_rows):
        ids = np.arange(a, b, dtype=np.int64)
        if kappa is None:
            rows.append(ids)
            probabilities.append(np.ones(ids.size))
            continue
        p = np.minimum(1.0, np.sqrt(np.diff(ptr).astype(np.float64)) / kappa)
        take = row_uniforms(ids, seed) < p
        rows.append(ids[take])
        probabilities.append(p[take])
    if not rows:
        return np.zeros(0, dtype=np.int64), np.zeros(0), empty
    return np.concatenate(rows), np.concatenate(probabilities), empty


def _rake(cells: np.ndarray, row_totals: np.ndarray, col_totals: np.ndarray, rounds: int = 50) -> np.ndarray:
    """Iterative proportional fitting: ``cells`` scaled until its row and column sums are the given totals."""
    out = np.array(cells, dtype=np.float64)
    for _ in range(rounds):
        sums = out.sum(axis=1)
        out *= np.divide(row_totals, sums, out=np.ones_like(sums), where=sums > 0)[:, None]
        sums = out.sum(axis=0)
        out *= np.divide(col_totals, sums, out=np.ones_like(sums), where=sums > 0)[None, :]
    return out


def _cuts(n: int, bounds) -> np.ndarray:
    """The ids cut at each of ``bounds`` (clipped to [0, n]), with 0 and n."""
    return np.unique(np.clip(np.asarray(sorted(set(bounds) | {0, n}), dtype=np.int64), 0, n))


#: Buckets of the id range that :func:`_segment` looks segments up in.
SEGMENT_BUCKETS = 4096


def _segment(cuts: np.ndarray, ids) -> np.ndarray:
    """The segment between ``cuts`` (sorted, from 0 to n) of each id in [0, n): the largest s with
    cuts[s] <= id. Looked up by bucket of the id range (the segment at the bucket's start); only
    the ids of the few buckets that a cut falls inside are searched."""
    ids = np.asarray(ids)
    n = int(cuts[-1])
    if ids.size < 4 * SEGMENT_BUCKETS or n <= 0:
        return np.searchsorted(cuts, ids, side="right") - 1
    width = -(-n // SEGMENT_BUCKETS)
    first = np.searchsorted(cuts, np.arange(0, n + width, width, dtype=np.int64), side="right")
    bucket = ids // width
    seg = (first - 1)[bucket]
    split = np.flatnonzero((np.diff(first) > 0)[bucket])  # ids whose bucket holds a cut past its start
    seg[split] = np.searchsorted(cuts, ids[split], side="right") - 1
    return seg


def _compiled_block_values(sub_indptr, sub_cols, rows, loops, inv_row, inv_col, n, blocks, members):
    """For each block (r0, r1, c0, c1): (x, y) of the sampled rows ``members[i]`` = (rows whose new
    row is in [r0, r1), rows whose new column is in [c0, c1)), by the compiled second scan over the
    sampled rows alone (:func:`plexus_tune.graph.kernels._symmetric_blocks`, the ranges of the sampled
    entries' columns and of the sampled rows given as their own arrays); None without numba."""
    kernels = compiled()
    ccuts = _cuts(n, [b[2] for b in blocks] + [b[3] for b in blocks])
    rcuts = _cuts(n, [b[0] for b in blocks] + [b[1] for b in blocks])
    kc, kr = ccuts.size - 1, rcuts.size - 1
    if kernels is None or max(kc, kr) > 2**15:
        return None
    shift = 8 if max(kc, kr) <= 2**7 else 16

    def packed(ids):
        out = ((_segment(rcuts, gather(inv_row, ids)).astype(np.int32) << shift)
               | _segment(ccuts, gather(inv_col, ids)).astype(np.int32))
        return out.astype(np.uint16 if shift == 8 else np.int32)

    ranges = packed(sub_cols)  # entry p's column k: the ranges of k's new row and new column
    own = packed(rows)
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
    kernels.symmetric_blocks(sub_indptr, np.arange(sub_cols.size, dtype=np.int64), loops, ranges, own, shift, kc, kr,
                             spans, row_ptr, row_targets, col_ptr, col_targets, row_offsets[:-1].copy(),
                             col_offsets[:-1].copy(), row_out, col_out)
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


#: The last sample read: (weak reference to its indptr, its key, what was read). The normalized
#: nonzeros and each permutation's statistics read the same sample once.
_LAST_SAMPLE: list = [None, None, None]


def _read_sample(adjacency, fraction: float, seed: int, self_loops: bool):
    """The sampled rows and what is read of them: ``(rows, p, lengths, cols, local, loops, added, empty)``,
    ``cols`` the stored entries' columns of the rows in order, ``local`` the sampled row of each,
    ``loops`` whether a sampled row gains a self-loop, ``added`` the self-loops an unread row gains
    (1 for an empty row, else the weighted share of the sampled nonempty rows that lack a stored
    diagonal), ``empty`` the count of empty rows. The last sample is kept for the next call on the
    same arrays."""
    import weakref

    indptr = adjacency.indptr
    n = int(adjacency.shape[0])
    key = (id(adjacency.indices), n, int(adjacency.indptr[-1]), float(fraction), int(seed), bool(self_loops))
    ref, known_key, known = _LAST_SAMPLE
    if ref is not None and ref() is indptr and known_key == key:
        return known
    rows, p, empty = _sample_rows(indptr, fraction, seed, SAMPLE_CHUNK_ROWS)
    starts = gather(indptr, rows).astype(np.int64)
    lengths = gather(indptr, rows + 1).astype(np.int64) - starts
    offsets = np.zeros(rows.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    positions = np.repeat(starts - offsets[:-1], lengths) + np.arange(int(offsets[-1]), dtype=np.int64)
    cols = gather(adjacency.indices, positions).astype(np.int32 if n < 2**31 else np.int64)
    del positions
    if cols.size and (cols.min() < 0 or cols.max() >= n):
        raise UserError(f"the graph's column indices run outside 0..{n - 1}; the graph is corrupt: convert it again")
    local = np.repeat(np.arange(rows.size, dtype=np.int32 if rows.size < 2**31 else np.int64), lengths)
    has = np.zeros(rows.size, dtype=bool)
    has[local[cols == rows[local]]] = True
    loops = ~has if self_loops else np.zeros(rows.size, dtype=bool)
    w = 1.0 / p
    nonempty = lengths > 0
    added = float(w[loops & nonempty].sum() / w[nonempty].sum()) if self_loops and nonempty.any() else 0.0
    result = (rows, p, lengths, cols, local, loops, added, empty)
    try:
        _LAST_SAMPLE[:] = [weakref.ref(indptr), key, result]
    except TypeError:  # an indptr without weak references: not kept
        _LAST_SAMPLE[:] = [None, None, None]
    return result


def _unread_loops(lengths: np.ndarray, added: float) -> np.ndarray:
    """The self-loops assumed of rows of these lengths when unread: 1 for an empty row, else ``added``."""
    return np.where(lengths == 0, 1.0, added)


def sampled_split_statistics(adjacency, splits, row_perm, col_perm, fraction: float, *, self_loops: bool = True,
                             seed: int = 0, inverse: bool = False) -> tuple[dict, dict]:
    """(statistics, sample) of every (R, C) split of a symmetric pattern, estimated from a row sample.

    ``statistics`` is shaped as :func:`plexus_tune.graph.structure.split_statistics`'s,
    each entry with ``nnz_max_rse`` (the relative standard error of its largest block's
    nonzeros); ``sample`` says what was read: ``{"fraction", "rows", "entries",
    "normalized_nnz"}``. ``inverse``: ``row_perm`` and ``col_perm`` are already the inverse
    permutations (new id of each old id, :func:`plexus_tune.graph.permute.inverse_permutations_for`),
    read only at the sampled ids and a chunk at a time where memory-mapped
    (:func:`plexus_tune.graph.permute.stored_inverse_permutations`). Memory: the sample and one chunk.
    """
    n = int(adjacency.shape[0])
    splits = sorted({(int(r), int(c)) for r, c in splits})
    rows, p, lengths, cols, local, loops, added, _ = _read_sample(adjacency, fraction, seed, self_loops)
    w = 1.0 / p
    stored_cols = cols
    local = np.concatenate([local, np.flatnonzero(loops).astype(local.dtype)])
    cols = np.concatenate([cols, rows[loops].astype(cols.dtype)])
    row_len_hat = lengths + loops  # normalized row lengths of the sampled rows

    if inverse:
        inv_row, inv_col = row_perm, col_perm
    else:
        inv_row = invert_permutation(np.asarray(row_perm, dtype=np.int64))
        inv_col = inv_row if col_perm is row_perm else invert_permutation(np.asarray(col_perm, dtype=np.int64))
    new_row_of_row = gather(inv_row, rows).astype(np.int64)  # row m of A is row inv_row[m] of B ...
    new_col_of_row = gather(inv_col, rows).astype(np.int64)  # ... and column inv_col[m] of B (A symmetric)
    entry_new_col = gather(inv_col, cols)  # entry (m, k): column inv_col[k] of B's row inv_row[m]

    # scan 1 on the sample: weighted cells of the union of all splits' cuts
    rcuts = _cuts(n, [min(k * -(-n // r), n) for r in {r for r, _ in splits} for k in range(r + 1)])
    ccuts = _cuts(n, [min(k * -(-n // c), n) for c in {c for _, c in splits} for k in range(c + 1)])
    nrs, ncs = rcuts.size - 1, ccuts.size - 1
    cell_dtype = np.int32 if nrs * ncs < 2**31 else np.int64
    cell = (_segment(rcuts, new_row_of_row[local]).astype(cell_dtype) * cell_dtype(ncs)
            + _segment(ccuts, entry_new_col).astype(cell_dtype))
    # every row's and column's normalized length from indptr, one chunk at a time (a row not read:
    # the self-loops of _unread_loops; a sampled row: its own)
    row_totals = np.zeros(nrs)
    col_totals = np.zeros(ncs)
    for a, b, ptr in pointer_chunks(adjacency.indptr):
        degree = np.diff(ptr)
        degree = degree + (_unread_loops(degree, added) if self_loops else 0.0)
        row_totals += np.bincount(_segment(rcuts, read_range(inv_row, a, b)), weights=degree, minlength=nrs)
        col_totals += np.bincount(_segment(ccuts, read_range(inv_col, a, b)), weights=degree, minlength=ncs)
    correction = row_len_hat - lengths - (_unread_loops(lengths, added) if self_loops else 0.0)
    row_totals += np.bincount(_segment(rcuts, new_row_of_row), weights=correction, minlength=nrs)
    col_totals += np.bincount(_segment(ccuts, new_col_of_row), weights=correction, minlength=ncs)
    # entries touching a row read with certainty (p = 1) are known exactly, both ways (A symmetric):
    # row m's entries (m, k), and their mirrors (k, m) for k not read with certainty
    certain = p >= 1
    sure = certain[local]
    known = np.bincount(cell[sure], minlength=nrs * ncs).astype(np.float64)
    mirror = sure & ~np.isin(cols, rows[certain])
    mirror_cell = (_segment(rcuts, gather(inv_row, cols[mirror])) * ncs
                   + _segment(ccuts, gather(inv_col, rows[local[mirror]])))
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
            entry_new_row = gather(inv_row, cols)  # entry (m, k): row inv_row[k] of B's column inv_col[m]
            hit = in_cols[local] & (entry_new_row >= r0) & (entry_new_row < r1)
            y = np.bincount(local[hit], minlength=rows.size)[in_cols]
        forward = _weighted_structure(x, w[in_rows], r1 - r0, br, y, w[in_cols], c1 - c0, bc)
        transpose = _weighted_structure(y, w[in_cols], c1 - c0, bc, x, w[in_rows], r1 - r0, br)
        out[(R, C)] = {"nnz_max": int(round(block_nnz)), "nnz_mean": total / (R * C), "block": (r, c),
                       "forward": forward, "transpose": transpose,
                       "nnz_max_rse": error}
    sample = {"fraction": float(fraction), "rows": int(rows.size), "entries": int(stored_cols.size),
              "normalized_nnz": int(round(float(row_totals.sum())))}
    return out, sample


def sampled_normalized_nnz(adjacency, fraction: float, seed: int = 0) -> tuple[int, float]:
    """(normalized nonzeros, its relative standard error): the stored ones plus the self-loops
    of rows without a stored diagonal: every empty row's, and those of the nonempty rows
    counted in a row sample (:func:`sample_rows`), weighted."""
    n = int(adjacency.shape[0])
    rows, p, lengths, _, _, loops, added, empty = _read_sample(adjacency, fraction, seed, True)
    stored = int(adjacency.indptr[-1])
    total = stored + empty + added * (n - empty)
    nonempty = lengths > 0
    spread = float(np.sqrt(((1 - p[nonempty]) / p[nonempty] ** 2) @ loops[nonempty].astype(np.float64))) if rows.size else 0.0
    return int(round(total)), spread / total if total > 0 else 0.0
