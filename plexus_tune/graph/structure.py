"""Sparsity structure of SpMM operands: the statistics the graph-aware SpMM model reads.

One SpMM multiplies a sparse ``rows x common`` operand by a dense ``common x k`` one.
Its structure is summarized from the operand's row lengths (nonzeros per row) and
column counts (nonzeros per column) alone (docs/model.md, "Sparsity structure"):

    row_length_cv             std / mean of the row lengths
    top1pct_column_share      share of the nonzeros in the max(1, common // 100) most
                              popular columns
    touched_column_fraction   share of the columns holding at least one nonzero
    column_share              share of the nonzeros in the 2^j most popular columns,
                              j = 0 .. SHARE_POINTS - 1 (1 from 2^j >= common on)

The transpose A^T of an operand swaps the two count vectors.

:func:`grid_shard_structure` finds, for every (row blocks, column blocks) split of a
graph's normalized adjacency after the trainer's permutation, the nonzeros of every
block and the counts of the largest one: the shard a grid's slowest rank multiplies.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping

import numpy as np
import scipy.sparse as sp

from plexus_tune.errors import UserError

#: Points of the column popularity curve: share of nonzeros in the 2^j most popular columns.
SHARE_POINTS = 32
#: Keys of a structure record (the ``structure`` field of an SpMM record), in order.
STRUCTURE_KEYS = ("row_length_cv", "top1pct_column_share", "touched_column_fraction", "column_share")


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
        top = int(points[inside].max())
        # the top-m values, sorted descending, without sorting the whole vector
        if top < counts.size // 4:
            part = np.partition(counts, counts.size - top)[counts.size - top:]
        else:
            part = counts
        ordered = np.sort(part)[::-1]
        cum = np.cumsum(ordered, dtype=np.float64)
        out[inside] = cum[points[inside] - 1] / total
    return np.minimum(out, 1.0)


def operand_structure(row_counts, col_counts) -> dict:
    """The structure record of one sparse operand from its row lengths and column counts."""
    rows = np.asarray(row_counts, dtype=np.float64)
    cols = np.asarray(col_counts)
    nnz = float(rows.sum())
    mean = nnz / max(rows.size, 1)
    cv = float(rows.std() / mean) if mean > 0 else 0.0
    top = max(1, cols.size // 100)
    if nnz > 0 and cols.size:
        head = np.partition(cols, cols.size - top)[cols.size - top:] if top < cols.size else cols
        top_share = float(head.sum() / nnz)
    else:
        top_share = 0.0
    return {
        "row_length_cv": cv,
        "top1pct_column_share": top_share,
        "touched_column_fraction": float(np.count_nonzero(cols) / max(cols.size, 1)),
        "column_share": [round(float(v), 6) for v in column_share_curve(cols, nnz)],
    }


def _poisson_top_share(lam: float, common: float, m: float, nnz: float) -> float:
    """Expected share of ``nnz`` held by the m largest of ``common`` iid Poisson(lam) counts."""
    if m >= common:
        return 1.0
    if lam > 200:  # normal limit: the top q = m / common hold lam + sqrt(lam) pdf(z_q) / q each
        from statistics import NormalDist

        q = m / common
        z = NormalDist().inv_cdf(1.0 - q)
        held = m * (lam + math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi) / q * math.sqrt(lam))
        return min(1.0, held / nnz)
    x = np.arange(int(lam + 12 * math.sqrt(lam) + 30), dtype=np.float64)
    log_pmf = x * math.log(lam) - lam - np.array([math.lgamma(v + 1) for v in x])
    pmf = np.exp(log_pmf)
    # columns of count >= x, and the nonzeros they hold, counted from the top
    at_least = np.cumsum(pmf[::-1])[::-1] * common
    held_at_least = np.cumsum((x * pmf)[::-1])[::-1] * common
    t = int(np.searchsorted(-at_least, -m, side="right")) - 1  # largest x with at_least[x] >= m
    t = max(t, 0)
    above = at_least[t + 1] if t + 1 < len(x) else 0.0
    held = (held_at_least[t + 1] if t + 1 < len(x) else 0.0) + (m - above) * x[t]
    return min(1.0, held / nnz)


def uniform_structure(nnz: float, rows: float, common: float) -> dict:
    """Expected structure of ``nnz`` nonzeros placed uniformly at random (with repeats).

    Row lengths and column counts are then multinomial, close to iid Poisson of mean
    lambda = nnz / common per column: CV sqrt((1 - 1/rows) rows / nnz), touched fraction
    1 - (1 - 1/common)^nnz, and the m most popular columns hold the top m of common
    Poisson(lambda) counts (exact tail sums; the normal limit past lambda = 200). The
    default structure of a graph given only by its size (docs/model.md, "Sparsity
    structure").
    """
    nnz, rows, common = float(nnz), max(float(rows), 1.0), max(float(common), 1.0)
    if nnz <= 0:
        return {"row_length_cv": 0.0, "top1pct_column_share": 0.0, "touched_column_fraction": 0.0,
                "column_share": [1.0] * SHARE_POINTS}
    lam = nnz / common
    touched = common * -math.expm1(nnz * math.log1p(-1.0 / common)) if common > 1 else 1.0
    return {
        "row_length_cv": math.sqrt(max(1.0 - 1.0 / rows, 0.0) * rows / nnz),
        "top1pct_column_share": float(_poisson_top_share(lam, common, max(1.0, math.floor(common / 100)), nnz)),
        "touched_column_fraction": touched / common,
        "column_share": [round(float(_poisson_top_share(lam, common, float(2**j), nnz)), 6) for j in range(SHARE_POINTS)],
    }


def check_structure(structure: Mapping, where: str = "structure") -> dict:
    """A structure record with every key of :data:`STRUCTURE_KEYS`, finite and in range, or UserError."""
    if not isinstance(structure, Mapping):
        raise UserError(f"{where}: a structure must be an object with {', '.join(STRUCTURE_KEYS)}")
    missing = [k for k in STRUCTURE_KEYS if k not in structure]
    if missing:
        raise UserError(f"{where}: structure lacks {', '.join(missing)}; record it with 'plexus-tune calibrate spmm'")
    out = {}
    for key in STRUCTURE_KEYS[:3]:
        value = structure[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise UserError(f"{where}: structure {key!r} must be a finite number >= 0, got {value!r}")
        out[key] = float(value)
    curve = structure["column_share"]
    try:
        values = np.asarray(curve, dtype=np.float64)
    except (TypeError, ValueError):
        values = np.array([np.nan])
    if values.shape != (SHARE_POINTS,) or not np.all(np.isfinite(values)) or values.min() < 0 or values.max() > 1 + 1e-9:
        raise UserError(f"{where}: structure 'column_share' must be {SHARE_POINTS} shares between 0 and 1")
    out["column_share"] = values.tolist()
    return out


# --------------------------------------------------------------------------- graph shards


class PermutedPattern:
    """The pattern of a graph's normalized adjacency (self-loops added) after a permutation.

    Holds the permuted matrix ``B = A_hat[row_perm][:, col_perm]`` as CSR without
    sorted column indices (the counts never need them). ``B`` is what layer 0
    multiplies; odd layers multiply ``B^T`` (docs/model.md, "Sparsity structure").
    """

    def __init__(self, adjacency, row_perm: np.ndarray, col_perm: np.ndarray):
        csr = sp.csr_matrix(adjacency)
        n = csr.shape[0]
        indptr = csr.indptr.astype(np.int64)
        lengths = np.diff(indptr)
        # self-loops of GCN normalization: every row without a stored diagonal gains one
        row_of = np.repeat(np.arange(n, dtype=csr.indices.dtype), lengths)
        has_diag = np.zeros(n, dtype=bool)
        has_diag[row_of[csr.indices == row_of]] = True
        del row_of
        lengths = lengths + ~has_diag
        row_perm = np.asarray(row_perm, dtype=np.int64)
        inv_col = np.empty(n, dtype=np.int32 if n < 2**31 else np.int64)
        inv_col[np.asarray(col_perm, dtype=np.int64)] = np.arange(n, dtype=inv_col.dtype)
        new_lengths = lengths[row_perm]
        self.indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(new_lengths, out=self.indptr[1:])
        self.indices = np.empty(int(self.indptr[-1]), dtype=inv_col.dtype)
        # gather old rows in the new order: one slice copy per row is too slow in Python;
        # build the source positions of every entry with a repeat/arange trick instead
        starts = indptr[:-1][row_perm]
        stored = np.diff(indptr)[row_perm]
        dest_start = self.indptr[:-1]
        offsets = np.arange(int(stored.sum()), dtype=np.int64) - np.repeat(np.cumsum(stored) - stored, stored)
        src = np.repeat(starts, stored) + offsets
        dst = np.repeat(dest_start, stored) + offsets
        del offsets
        self.indices[dst] = inv_col[csr.indices[src]]
        del src, dst
        lacking = np.flatnonzero(~has_diag[row_perm])
        self.indices[self.indptr[lacking + 1] - 1] = inv_col[row_perm[lacking]]
        self.nodes = n

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1])

    def block_counts(self, row_blocks: int, col_blocks: int) -> np.ndarray:
        """Nonzeros of every block of a row_blocks x col_blocks split, blocks of ceil(N / g) rows/columns."""
        n = self.nodes
        br, bc = -(-n // row_blocks), -(-n // col_blocks)
        counts = np.zeros((row_blocks, col_blocks), dtype=np.int64)
        for r in range(row_blocks):
            lo, hi = self.indptr[min(r * br, n)], self.indptr[min((r + 1) * br, n)]
            cols = self.indices[lo:hi]
            if cols.size:
                counts[r] = np.bincount(cols // bc, minlength=col_blocks)[:col_blocks]
        return counts

    def block_vectors(self, row_blocks: int, col_blocks: int, r: int, c: int) -> tuple[np.ndarray, np.ndarray]:
        """(row lengths, column counts) of block (r, c), with its padded sizes ceil(N / g)."""
        n = self.nodes
        br, bc = -(-n // row_blocks), -(-n // col_blocks)
        r0, r1 = min(r * br, n), min((r + 1) * br, n)
        lo, hi = self.indptr[r0], self.indptr[r1]
        cols = self.indices[lo:hi]
        keep = (cols >= c * bc) & (cols < (c + 1) * bc)
        row_ids = np.repeat(np.arange(r1 - r0), np.diff(self.indptr[r0:r1 + 1]))
        row_counts = np.bincount(row_ids[keep], minlength=br)[:br]
        col_counts = np.bincount(cols[keep] - c * bc, minlength=bc)[:bc]
        return row_counts, col_counts


def grid_shard_structure(pattern: PermutedPattern, splits: Iterable[tuple[int, int]], *, progress=None) -> dict:
    """The largest block of each (row blocks, column blocks) split of ``pattern``.

    Returns ``{(R, C): {"nnz_max", "nnz_mean", "block": (r, c), "forward": structure,
    "transpose": structure}}`` where ``forward`` describes the block as a ``ceil(N/R) x
    ceil(N/C)`` operand and ``transpose`` its transpose (:func:`operand_structure`).
    """
    out = {}
    for R, C in splits:
        t0 = time.perf_counter()
        counts = pattern.block_counts(R, C)
        r, c = np.unravel_index(int(np.argmax(counts)), counts.shape)
        row_counts, col_counts = pattern.block_vectors(R, C, int(r), int(c))
        out[(R, C)] = {
            "nnz_max": int(counts.max()),
            "nnz_mean": float(counts.sum() / counts.size),
            "block": (int(r), int(c)),
            "forward": operand_structure(row_counts, col_counts),
            "transpose": operand_structure(col_counts, row_counts),
        }
        if progress is not None:
            progress(R, C, time.perf_counter() - t0)
    return out
