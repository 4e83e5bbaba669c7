"""Sparsity structure of an SpMM operand: the statistics the graph-aware SpMM model reads.

One SpMM multiplies a sparse ``rows x common`` operand by a dense ``common x k`` one.
Its structure is summarized from the operand's row lengths (nonzeros per row) and
column counts (nonzeros per column) alone (docs/model.md, "Sparsity structure")::

    row_length_cv             std / mean of the row lengths
    top1pct_column_share      share of the nonzeros in the max(1, common // 100) most
                              popular columns
    touched_column_fraction   share of the columns holding at least one nonzero
    column_share              share of the nonzeros in the 2^j most popular columns,
                              j = 0 .. SHARE_POINTS - 1 (1 once 2^j >= common)

The statistics themselves are computed by :mod:`plexus_tune.graph.structure`. An
operand known only by its size has the structure of uniformly random nonzeros
(:func:`uniform_structure`); :class:`GraphSparsity` holds a graph's shards for the cost
model and :func:`graph_sparsity` computes it.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Mapping

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.graph.permute import (TWO_SIDED_MODES, grid_parts, inverse_permutations_for, permutations_for,
                                      stored_inverse_permutations)
from plexus_tune.graph.structure import (  # noqa: F401
    SHARE_POINTS,
    STRUCTURE_KEYS,
    PermutedPattern,
    column_share_curve,
    diagonal_rows,
    operand_structure,
    pattern_symmetric,
    split_statistics,
    split_structure,
)
from plexus_tune.graph.structure_sample import sampled_split_statistics
from plexus_tune.model.grid import layer_roles


#: log(x!) for x = 0, 1, ... (math.lgamma, as the scalar formula), extended as needed.
_LOG_FACTORIAL = np.zeros(0, dtype=np.float64)


def _log_factorial(count: int) -> np.ndarray:
    """log(x!) for x < count, each ``math.lgamma(x + 1)`` (computed once per process)."""
    global _LOG_FACTORIAL
    if _LOG_FACTORIAL.size < count:
        _LOG_FACTORIAL = np.array([math.lgamma(v + 1.0) for v in range(max(count, 2 * _LOG_FACTORIAL.size))],
                                  dtype=np.float64)
    return _LOG_FACTORIAL[:count]


def _poisson_top_shares(lam: float, common: float, m: np.ndarray, nnz: float) -> np.ndarray:
    """Expected share of ``nnz`` held by the m largest of ``common`` iid Poisson(lam) counts, for every m.

    Below lam = 200 the exact tail sums: with p(x) the Poisson pmf, A(x) = common sum_{y>=x} p(y)
    columns hold at least x nonzeros and H(x) = common sum_{y>=x} y p(y) nonzeros; for t the
    largest x with A(x) >= m the top m hold H(t + 1) + (m - A(t + 1)) t. Above it the normal
    limit: the top q = m / common hold lam + sqrt(lam) pdf(z_q) / q each.
    """
    m = np.asarray(m, dtype=np.float64)
    out = np.ones(m.shape, dtype=np.float64)
    below = m < common
    if not np.any(below):
        return out
    if lam > 200:
        from statistics import NormalDist

        normal = NormalDist()
        for i in np.flatnonzero(below):
            q = m[i] / common
            z = normal.inv_cdf(1.0 - q)
            held = m[i] * (lam + math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi) / q * math.sqrt(lam))
            out[i] = min(1.0, held / nnz)
        return out
    size = int(lam + 12 * math.sqrt(lam) + 30)
    x = np.arange(size, dtype=np.float64)
    pmf = np.exp(x * math.log(lam) - lam - _log_factorial(size))
    # columns of count >= x, and the nonzeros they hold, counted from the top
    at_least = np.cumsum(pmf[::-1])[::-1] * common
    held_at_least = np.cumsum((x * pmf)[::-1])[::-1] * common
    at_least_next = np.append(at_least[1:], 0.0)
    held_next = np.append(held_at_least[1:], 0.0)
    mb = m[below]
    t = np.maximum(np.searchsorted(-at_least, -mb, side="right") - 1, 0)  # largest x with at_least[x] >= m
    held = held_next[t] + (mb - at_least_next[t]) * x[t]
    out[below] = np.minimum(1.0, held / nnz)
    return out


def _poisson_top_share(lam: float, common: float, m: float, nnz: float) -> float:
    """Expected share of ``nnz`` held by the m largest of ``common`` iid Poisson(lam) counts."""
    return float(_poisson_top_shares(lam, common, np.array([float(m)]), nnz)[0])


#: m of the popularity curve's points, 2^j.
_SHARE_COLUMNS = 2.0 ** np.arange(SHARE_POINTS)


@functools.lru_cache(maxsize=65536)
def _uniform_structure(nnz: float, rows: float, common: float) -> tuple:
    lam = nnz / common
    touched = common * -math.expm1(nnz * math.log1p(-1.0 / common)) if common > 1 else 1.0
    m = np.append(max(1.0, math.floor(common / 100)), _SHARE_COLUMNS)
    shares = _poisson_top_shares(lam, common, m, nnz)
    return (math.sqrt(max(1.0 - 1.0 / rows, 0.0) * rows / nnz), float(shares[0]), touched / common,
            tuple(round(float(v), 6) for v in shares[1:]))


def uniform_structure(nnz: float, rows: float, common: float) -> dict:
    """Expected structure of ``nnz`` nonzeros placed uniformly at random (with repeats).

    Row lengths and column counts are then multinomial, close to iid Poisson of mean
    lambda = nnz / common per column: CV sqrt((1 - 1/rows) rows / nnz), touched fraction
    1 - (1 - 1/common)^nnz, and the m most popular columns hold the top m of common
    Poisson(lambda) counts (exact tail sums; the normal limit past lambda = 200). The
    default structure of a graph given only by its size (docs/model.md, "Sparsity
    structure"). Computed once per distinct shape.
    """
    nnz, rows, common = float(nnz), max(float(rows), 1.0), max(float(common), 1.0)
    if nnz <= 0:
        return {"row_length_cv": 0.0, "top1pct_column_share": 0.0, "touched_column_fraction": 0.0,
                "column_share": [1.0] * SHARE_POINTS}
    cv, top, touched, curve = _uniform_structure(nnz, rows, common)
    return {"row_length_cv": cv, "top1pct_column_share": top, "touched_column_fraction": touched,
            "column_share": list(curve)}


@functools.lru_cache(maxsize=4096)
def _column_tails(degree: tuple, share: tuple, q_col: float) -> tuple[np.ndarray, np.ndarray]:
    """(A(x), H(x)) per column of a degree mixture thinned by Binomial(d, q_col): the share of
    columns holding at least x nonzeros and their nonzeros (:func:`degree_structure`)."""
    from scipy.special import ndtr
    from scipy.stats import binom

    def tail(at: np.ndarray, trials: int) -> np.ndarray:
        """P(Binomial(trials, q_col) >= at); the normal limit (continuity-corrected) past variance 50."""
        var = trials * q_col * (1 - q_col)
        if q_col >= 1:
            return (at <= trials).astype(np.float64)
        if var > 50:
            return ndtr((trials * q_col - at + 0.5) / math.sqrt(var))
        return binom.sf(at - 1, trials, q_col)

    # past the largest class's dq + 12 sigma every tail is 0: the arrays end there
    size = max(min(d + 2, int(d * q_col + 12 * math.sqrt(d * q_col * (1 - q_col)) + 2) + 2) for d in degree) + 1
    x = np.arange(size)
    at_least = np.zeros(x.size)
    held = np.zeros(x.size)  # E[Y 1{Y >= x}] = d q P(Binomial(d - 1, q) >= x - 1)
    for d, c in zip(degree, share):
        # each class's tails: 1 below dq - 12 sigma, 0 above dq + 12 sigma (and past d), evaluated between
        spread = 12 * math.sqrt(d * q_col * (1 - q_col)) + 2
        lo = max(0, int(d * q_col - spread))
        hi = min(d + 2, int(d * q_col + spread) + 2)
        at_least[:lo] += c
        held[:lo] += c * d * q_col
        between = x[lo:hi]
        at_least[lo:hi] += c * tail(between, d)
        held[lo:hi] += c * d * q_col * tail(between - 1, max(d - 1, 0))
    return at_least, held


def degree_structure(degree_shape, mean_degree: float, nodes: int, row_blocks: int, col_blocks: int) -> dict:
    """Expected structure of a block of an R x C split of a symmetric graph, randomly permuted,
    from its degree distribution alone (a catalog dataset's descriptor, docs/model.md
    "Structure descriptors").

    ``degree_shape``: [degree / mean degree, share of the nodes] per degree class. Under
    a random permutation a row of degree d keeps Binomial(d, 1/C) of its entries in a
    block's columns and a column of degree d Binomial(d, 1/R) in its rows: the row-length
    CV is that of the mixture, the touched share sum_k w_k (1 - (1 - 1/R)^d_k), and the m
    most popular of the block's ceil(N/C) columns hold H(t + 1) + (m - A(t + 1)) t, with
    A(x) the columns holding at least x and H(x) their nonzeros (the mixture's tails).
    """
    shape = np.asarray(degree_shape, dtype=np.float64).reshape(-1, 2)
    share = shape[:, 1] / shape[:, 1].sum()
    degree = np.maximum(np.rint(shape[:, 0] * float(mean_degree)), 1).astype(np.int64)
    q_row, q_col = 1.0 / max(int(col_blocks), 1), 1.0 / max(int(row_blocks), 1)
    mean = float(share @ (degree * q_row))
    second = float(share @ (degree * q_row * (1 - q_row) + (degree * q_row) ** 2))
    cv = math.sqrt(max(second - mean * mean, 0.0)) / mean if mean > 0 else 0.0
    common = -(-int(nodes) // int(col_blocks))
    unit_at_least, unit_held = _column_tails(tuple(degree.tolist()), tuple(share.tolist()), q_col)
    at_least, held = unit_at_least * common, unit_held * common  # A(x), H(x) of the block's columns
    x = np.arange(at_least.size)
    total = float(held[0])

    def top(m: float) -> float:
        if m >= common or total <= 0:
            return total
        t = int(np.searchsorted(-at_least, -m, side="right")) - 1  # A falls as x grows: the last x with A(x) >= m
        return float(held[t + 1] + (m - at_least[t + 1]) * t) if t + 1 < x.size else total

    curve = [min(1.0, top(2 ** j) / total) if 2 ** j < common and total > 0 else 1.0 for j in range(SHARE_POINTS)]
    return {"row_length_cv": cv,
            "top1pct_column_share": min(1.0, top(max(1, common // 100)) / total) if total > 0 else 0.0,
            "touched_column_fraction": float(share @ (1 - (1 - q_col) ** degree)),
            "column_share": [round(float(v), 6) for v in curve]}


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


def share_at(column_share: np.ndarray, columns) -> np.ndarray:
    """Share of the nonzeros in the ``columns`` most popular columns, per operand.

    ``column_share`` is (n, SHARE_POINTS) (the curves of n operands); the curve is
    interpolated linearly in log2(columns) between its points 2^j (1 below one column).
    """
    curves = np.asarray(column_share, dtype=np.float64).reshape(-1, SHARE_POINTS)
    position = np.log2(np.maximum(np.asarray(columns, dtype=np.float64), 1.0))
    position = np.broadcast_to(position, (curves.shape[0],)) if position.ndim == 0 else position.reshape(-1)
    j = np.clip(np.floor(position).astype(np.int64), 0, SHARE_POINTS - 2)
    frac = np.clip(position - j, 0.0, 1.0)
    rows = np.arange(curves.shape[0])
    lo, hi = curves[rows, j], curves[rows, j + 1]
    return lo + (hi - lo) * frac


def structure_arrays(structures, nnz, rows, common) -> dict:
    """Column arrays of a list of structure records (None: :func:`uniform_structure` of the shape)."""
    nnz, rows, common = (np.broadcast_to(np.asarray(a, dtype=np.float64), np.shape(nnz)).reshape(-1) for a in (nnz, rows, common))
    out = {"row_length_cv": [], "top1pct_column_share": [], "touched_column_fraction": [], "column_share": []}
    cache: dict = {}
    for i, s in enumerate(structures):
        if s is None:
            key = (nnz[i], rows[i], common[i])
            if key not in cache:
                cache[key] = uniform_structure(*key)
            s = cache[key]
        for key in out:
            out[key].append(s[key])
    return {key: np.asarray(v, dtype=np.float64) for key, v in out.items()}


def graph_summary(graph, cache=None) -> dict:
    """``{"name", "nodes", "nnz", "normalized_nnz", "diagonal_rows", "symmetric_pattern"}`` of a graph (read from
    ``cache`` when it holds them, else counted in one scan and stored there).
    ``symmetric_pattern`` is True when the graph's metadata says its values are symmetric,
    else None until :func:`graph_pattern_symmetric` checks it."""
    if cache is not None:
        known = cache.summary()
        if known is not None:
            return known
    adjacency = getattr(graph, "adjacency", graph)
    with_diagonal = int(diagonal_rows(adjacency).sum())
    summary = {"name": getattr(graph, "name", "graph"), "nodes": int(adjacency.shape[0]), "nnz": int(adjacency.nnz),
               "normalized_nnz": int(adjacency.nnz + adjacency.shape[0] - with_diagonal), "diagonal_rows": with_diagonal,
               "symmetric_pattern": True if getattr(graph, "meta", {}).get("symmetric") else None}
    if cache is not None:
        cache.store_summary(summary)
    return summary


def _diagonal(graph, cache) -> np.ndarray:
    """Whether each row stores its diagonal; without a scan when the cache knows none or all do."""
    adjacency = getattr(graph, "adjacency", graph)
    n = adjacency.shape[0]
    if cache is not None:
        count = graph_summary(graph, cache).get("diagonal_rows")
        if count in (0, n):
            return np.full(n, count == n, dtype=bool)
    return diagonal_rows(adjacency)


def graph_pattern_symmetric(graph, cache=None) -> bool:
    """Whether a graph's pattern equals its transpose's: True when its metadata says its values
    are symmetric, else checked (:func:`plexus_tune.graph.structure.pattern_symmetric`) once and cached."""
    if getattr(graph, "meta", {}).get("symmetric"):
        return True
    summary = graph_summary(graph, cache) if cache is not None else None
    if summary is not None and summary["symmetric_pattern"] is not None:
        return bool(summary["symmetric_pattern"])
    symmetric = pattern_symmetric(getattr(graph, "adjacency", graph))
    if cache is not None:
        cache.store_summary({**summary, "symmetric_pattern": bool(symmetric)})
    return symmetric


class GraphSparsity:
    """The shards of one graph after the trainer's permutation: for each layer parity and
    (g_d, g_o), the nonzeros of the largest shard and the structure of the SpMM operands
    it gives (docs/model.md, "Sparsity structure").

    ``entries`` maps ``(parity, g_d, g_o)`` to ``{"nnz_max", "nnz_mean", "forward",
    "backward"}``: ``forward`` is the structure of the layer's ``ceil(N/g_d) x
    ceil(N/g_o)`` shard, ``backward`` that of its transpose (what A^T dH multiplies).
    ``permute`` names the permutation the shards were cut after.
    """

    def __init__(self, entries: Mapping, *, permute: str, name: str = "graph"):
        self.entries = {tuple(int(v) for v in key): value for key, value in entries.items()}
        self.permute = permute
        self.name = name
        #: None, or what a sampled estimate read (graph_sparsity's ``sample``)
        self.sample = None

    def layer(self, layer: int, g_d, g_o) -> tuple[np.ndarray, dict, dict]:
        """(largest-shard nonzeros, forward structure arrays, backward structure arrays) of layer ``layer`` on every grid."""
        g_d = np.atleast_1d(np.asarray(g_d, dtype=np.int64))
        g_o = np.atleast_1d(np.asarray(g_o, dtype=np.int64))
        parity = int(layer) % 2
        picked = []
        for d, o in zip(g_d.tolist(), g_o.tolist()):
            entry = self.entries.get((parity, d, o))
            if entry is None:
                raise UserError(f"the sparsity of {self.name} lacks the {d} x {o} shards of layer parity {parity}; "
                                "compute it for these grids")
            picked.append(entry)
        nnz = np.array([e["nnz_max"] for e in picked], dtype=np.float64)

        def arrays(direction: str) -> dict:
            return {"row_length_cv": np.array([e[direction]["row_length_cv"] for e in picked], dtype=np.float64),
                    "top1pct_column_share": np.array([e[direction]["top1pct_column_share"] for e in picked], dtype=np.float64),
                    "touched_column_fraction": np.array([e[direction]["touched_column_fraction"] for e in picked], dtype=np.float64),
                    "column_share": np.array([e[direction]["column_share"] for e in picked], dtype=np.float64).reshape(-1, SHARE_POINTS)}

        return nnz, arrays("forward"), arrays("backward")


def graph_sparsity(graph, grids, layers: int, *, permute: str = "double", seed: int = 0, progress=None,
                   stored: bool = False, cache=None, sample: float | None = None,
                   store_permutations: bool = False) -> GraphSparsity:
    """The :class:`GraphSparsity` of a graph on the given grids.

    For layer i with roles (o, n, d) of :func:`plexus_tune.model.grid.layer_roles`, a
    rank multiplies a block of a g_d x g_o split of ``B = A_hat[row_perm][:, col_perm]``
    (even layers) or of the alternate layout ``A_hat[col_perm][:, row_perm]`` (odd
    layers under the two-sided modes ``double`` and ``local``; the transpose of B when
    A is symmetric); the largest block is the slowest rank's. Permutations as the
    trainer's (:func:`plexus_tune.graph.permute.permutations_for`, ``local`` with each
    grid's parts). ``sample``: a fraction of the entries below 1 estimates the statistics
    from a sample of rows (:mod:`plexus_tune.graph.structure_sample`; a symmetric pattern,
    no cache); the result's ``sample`` then says what was read and the largest relative
    standard error of a largest shard's nonzeros; ``store_permutations``: the sample reads the
    permutations kept memory-mapped in the data directory (made once,
    :func:`plexus_tune.graph.permute.stored_inverse_permutations`) instead of holding them. ``stored``: ``graph`` is already B (a shard directory's matrix,
    self-loops included) and ``permute`` the mode it was cut with; odd layers of
    two-sided modes multiply B^T, as the trainer reading the directory does. Every
    distinct split is counted once.
    """
    adjacency = getattr(graph, "adjacency", graph)
    n = adjacency.shape[0]
    grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
    two_sided = permute in TWO_SIDED_MODES
    # a graph whose values are symmetric (its metadata says so) has a symmetric pattern
    symmetric = True if stored or not two_sided else graph_pattern_symmetric(graph, cache)
    # the adjacency's own pattern symmetric: the second scan reads rows in their stored order
    pattern_symmetric_ = False if stored else (symmetric if two_sided else graph_pattern_symmetric(graph, cache))
    # the permutations: one pair for every mode but local, one per grid's parts for local
    wanted: dict = {}
    for grid in grids.tolist():
        perm_key = grid_parts(grid) if (permute == "local" and not stored) else None
        for i in range(int(layers)):
            o, _, d = layer_roles(i)
            wanted.setdefault(perm_key, set()).add((i % 2, grid[d], grid[o]))
    entries = {}
    has_diagonal = None
    sampled = sample is not None and sample < 1 and not stored
    if sampled and not graph_pattern_symmetric(graph, None):
        raise UserError(f"{getattr(graph, 'name', 'the graph')}'s pattern is not symmetric, and the sampled structure "
                        "estimate needs an undirected graph; sample fraction 1 scans it all", parameter="graph_sample")
    read = {"fraction": sample, "rows": 0, "entries": 0, "nnz_max_rse": 0.0} if sampled else None
    for perm_key, keys in wanted.items():
        splits: dict = {}
        for parity, g_d, g_o in keys:
            if parity == 0 or not two_sided:
                splits[(parity, g_d, g_o)] = ("pattern", g_d, g_o, False)
            elif not symmetric:
                splits[(parity, g_d, g_o)] = ("alternate", g_d, g_o, False)
            else:  # the alternate layout is B^T: its g_d x g_o blocks are B's g_o x g_d ones, transposed
                splits[(parity, g_d, g_o)] = ("pattern", g_o, g_d, True)
        if sampled:
            make = stored_inverse_permutations if store_permutations else inverse_permutations_for
            inv_row, inv_col = make(permute, n, seed, parts=perm_key if permute == "local" else None)
            found, info = sampled_split_statistics(adjacency, {(R, C) for _, R, C, _ in splits.values()}, inv_row,
                                                   inv_col, sample, seed=seed, inverse=True)
            del inv_row, inv_col
            read["rows"] += info["rows"]
            read["entries"] += info["entries"]
            read["nnz_max_rse"] = max([read["nnz_max_rse"]] + [e["nnz_max_rse"] for e in found.values()])
            for key, (which, R, C, transposed) in splits.items():
                e = found[(R, C)]
                entries[key] = {"nnz_max": e["nnz_max"], "nnz_mean": e["nnz_mean"],
                                "forward": e["transpose"] if transposed else e["forward"],
                                "backward": e["forward"] if transposed else e["transpose"]}
            continue
        name = cache.entry_name(permute, seed, perm_key, stored) if cache is not None else None
        done: dict = cache.splits(name) if cache is not None else {}
        missing = {(w, R, C) for w, R, C, _ in splits.values()} - set(done)
        if missing:
            if stored:
                row_perm = col_perm = None
            else:
                row_perm, col_perm = (permutations_for(permute, n, seed, parts=perm_key) if permute == "local"
                                      else permutations_for(permute, n, seed))
                if has_diagonal is None:
                    has_diagonal = _diagonal(graph, cache)
            computed = {}
            for which in ("pattern", "alternate"):
                wanted_splits = {(R, C) for w, R, C in missing if w == which}
                if not wanted_splits:
                    continue
                rows, cols = (row_perm, col_perm) if which == "pattern" else (col_perm, row_perm)
                report = None if progress is None else (lambda stage, seconds: progress(sorted(wanted_splits), stage, seconds))
                found = split_statistics(adjacency, wanted_splits, rows, cols, self_loops=not stored,
                                         has_diagonal=has_diagonal, symmetric_pattern=pattern_symmetric_,
                                         progress=report)
                computed.update({(which, R, C): e for (R, C), e in found.items()})
            done.update(computed)
            if cache is not None:
                cache.store_splits(name, done)
        for key, (which, R, C, transposed) in splits.items():
            e = done[(which, R, C)]
            entries[key] = {"nnz_max": e["nnz_max"], "nnz_mean": e["nnz_mean"],
                            "forward": e["transpose"] if transposed else e["forward"],
                            "backward": e["forward"] if transposed else e["transpose"]}
    result = GraphSparsity(entries, permute=permute, name=getattr(graph, "name", "graph"))
    result.sample = read
    return result


class DescriptorSparsity(GraphSparsity):
    """The shards of a catalog dataset known by its structure descriptor: every grid's largest
    shard holds the mean NNZ / (g_d g_o), its structure that of :func:`degree_structure`."""

    def __init__(self, descriptor: Mapping, nodes: int, nnz: int, *, name: str):
        super().__init__({}, permute="double", name=name)
        self.descriptor = dict(descriptor)
        self.nodes, self.nnz = int(nodes), int(nnz)
        self._shapes: dict = {}

    def _structure(self, rows: int, cols: int) -> dict:
        if (rows, cols) not in self._shapes:
            self._shapes[(rows, cols)] = degree_structure(self.descriptor["degree_shape"], self.nnz / self.nodes,
                                                          self.nodes, rows, cols)
        return self._shapes[(rows, cols)]

    def layer(self, layer: int, g_d, g_o) -> tuple[np.ndarray, dict, dict]:
        g_d = np.atleast_1d(np.asarray(g_d, dtype=np.int64))
        g_o = np.atleast_1d(np.asarray(g_o, dtype=np.int64))
        nnz = np.array([-(-self.nnz // int(d * o)) for d, o in zip(g_d.tolist(), g_o.tolist())], dtype=np.float64)

        def arrays(transposed: bool) -> dict:
            picked = [self._structure(o, d) if transposed else self._structure(d, o)
                      for d, o in zip(g_d.tolist(), g_o.tolist())]
            return {key: np.array([p[key] for p in picked], dtype=np.float64).reshape(len(picked), -1).squeeze(-1)
                    if key != "column_share" else np.array([p[key] for p in picked], dtype=np.float64)
                    for key in STRUCTURE_KEYS}

        return nnz, arrays(False), arrays(True)


#: Most distinct shard shapes a descriptor's structure is evaluated for (past them: the uniform one).
DESCRIPTOR_MAX_SHAPES = 256


def descriptor_sparsity(info, workload, grids) -> DescriptorSparsity | None:
    """The :class:`DescriptorSparsity` of catalog entry ``info`` on these grids, or None when it has
    no structure descriptor or the grids hold more than DESCRIPTOR_MAX_SHAPES shard shapes."""
    descriptor = info.descriptor() if hasattr(info, "descriptor") else getattr(info, "structure", None)
    if descriptor is None:
        return None
    shapes = {(int(g[d]), int(g[o])) for g in grids for d, o in ((2, 0), (0, 2), (1, 0), (0, 1), (2, 1), (1, 2))}
    if len(shapes) > DESCRIPTOR_MAX_SHAPES:
        return None
    return DescriptorSparsity(descriptor, workload.nodes, workload.nnz, name=info.name)
