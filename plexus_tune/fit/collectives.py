"""Fit the collective-communication model from timings.

The fit estimates the parameters of the network models that ``predict`` evaluates
(:mod:`plexus_tune.model.collectives`): every form is linear in (alpha_intra, alpha_inter,
1 / beta_intra, 1 / beta_inter) given its ring terms, so its parameters come from
non-negative least squares on relative error, and predictions (here and in a profile)
call the same ``Network`` (docs/model.md, "Collectives").

Each candidate form is scored on held-out data two ways: repeated random 70/30 splits of
the rows, and leave-whole-message-sizes-out (for each distinct message size, fit on the
other sizes and predict it; MAPE over all rows). ``form="auto"`` keeps the candidate
with the lowest leave-sizes-out MAPE (random-split MAPE when fewer than 3 sizes were
measured); a more complex candidate must beat a simpler one by more than 1e-6 points.

Broadcast and point-to-point timings (ops of ``EXCHANGE_OPS``) are fitted apart, per op:
the four tier parameters by the same relative NNLS on their per-rank terms
(:func:`~plexus_tune.model.collectives.exchange_terms`, sharing as the network's), kept
in the network's ``op_tiers`` (:func:`fit_op_tiers`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.fit.scoring import (
    DEFAULT_SPLITS,
    regression_scores,
    repeated_split_scores,
    single_threaded_blas,
)
from plexus_tune.fit.solvers import nnls_relative
from plexus_tune.fit.tables import COLLECTIVE_COLUMNS, check_frame, pd_numeric
from plexus_tune.model.collectives import (  # noqa: F401  (ring_terms, bus_bandwidth_gbps: re-exported)
    BROADCAST_FORMS,
    COLLECTIVE_OPS,
    EXCHANGE_OPS,
    exchange_terms,
    FORMS,
    HierarchicalNetwork,
    Network,
    PerSpanNetwork,
    Placement,
    REDUCE_SCATTER_FORMS,
    TwoTierNetwork,
    bus_bandwidth_gbps,
    hierarchical_terms,
    op_array,
    placement,
    ring_terms,
    two_tier_terms,
)
from plexus_tune.model.machine import time_sharing_factor

#: bandwidth reported when the bandwidth term fits to zero (latency-bound data only)
MAX_BETA_GBPS = 1e4
#: message sizes within this ratio of the smallest of a run are one size (buffers are rounded
#: to whole elements per rank, so the sizes of one nominal size differ slightly by op and group)
SIZE_RATIO = 1.05
#: a more complex candidate must lower the deciding held-out MAPE by more than this (points)
MIN_GAIN = 1e-6
COLLECTIVE_FORMS = ("auto", *FORMS)
NO_INTER_NOTE = "no inter-node measurements: inter-node values copy the intra-node fit"


# --------------------------------------------------------------------------- inputs


def nodes_column(df) -> np.ndarray:
    """Nodes each measured group spans: column ``nodes_spanned`` where logged, else ``nodes``."""
    return np.asarray(df["nodes_spanned"] if "nodes_spanned" in df else df["nodes"], dtype=np.float64)


def _stride_column(df) -> np.ndarray | None:
    if "stride" not in df:
        return None
    stride = pd_numeric(df["stride"], np.nan)
    return stride.astype(np.int64) if np.all(np.isfinite(stride) & (stride >= 1)) else None


def frame_placement(df, gpus_per_node: int | None) -> tuple[Placement, int]:
    """:class:`Placement` of every row, and how many rows' logged nodes disagree with it.

    With a ``stride`` column and ``gpus_per_node``: placed as ``predict`` places that shape
    (:func:`~plexus_tune.model.collectives.placement`), except that a logged ``concurrent``
    (the groups that really shared a node's NICs: 1 for a group timed alone) replaces
    s = min(n, p). Otherwise: k = the nodes column, r = column ``ranks_per_node`` or
    ceil(g / k), s = column ``concurrent`` or, across nodes, n // r (1 when n is unknown).
    """
    g = np.asarray(df["group_size"], dtype=np.float64).astype(np.int64)
    nodes = nodes_column(df).astype(np.int64)
    stride = _stride_column(df)
    if stride is not None and gpus_per_node is not None:
        place = placement(g, stride, gpus_per_node)
        if "concurrent" in df:
            logged = pd_numeric(df["concurrent"], np.nan)
            place = Placement(place.nodes, place.ranks_per_node,
                              np.where(np.isfinite(logged), logged, place.concurrent).astype(np.int64), place.stride)
        return place, int(np.sum((place.nodes != nodes) & (g > 1)))
    k = np.maximum(nodes, 1)
    r = pd_numeric(df["ranks_per_node"], np.nan) if "ranks_per_node" in df else np.full(len(g), np.nan)
    r = np.where(np.isfinite(r), r, -(-g // k)).astype(np.int64)
    c = pd_numeric(df["concurrent"], np.nan) if "concurrent" in df else np.full(len(g), np.nan)
    guess = np.maximum(1, int(gpus_per_node) // r) if gpus_per_node is not None else np.ones(len(g), dtype=np.int64)
    c = np.where(np.isfinite(c), c, np.where(k > 1, guess, 1)).astype(np.int64)
    return Placement(nodes=k, ranks_per_node=r, concurrent=c, stride=stride), 0


def size_groups(message_bytes) -> np.ndarray:
    """Index of each row's message size, sizes within :data:`SIZE_RATIO` of a group's smallest joined."""
    m = np.asarray(message_bytes, dtype=np.float64)
    values = np.unique(m)
    ids = np.zeros(len(values), dtype=np.int64)
    start = values[0] if len(values) else 0.0
    for i, v in enumerate(values[1:], 1):
        if v > start * SIZE_RATIO:
            start = v
            ids[i] = ids[i - 1] + 1
        else:
            ids[i] = ids[i - 1]
    return ids[np.searchsorted(values, m)]


@dataclass
class _Rows:
    op: np.ndarray
    g: np.ndarray
    place: Placement
    m_bytes: np.ndarray
    messages: np.ndarray
    y: np.ndarray
    size: np.ndarray
    gpus_per_node: int | None
    #: how the backend runs a reduce-scatter (op already mapped to all_reduce where it is one)
    reduce_scatter_form: str = "ring"

    def predict(self, network: Network, idx) -> np.ndarray:
        return network.placed_time_ms(self.op[idx], self.g[idx], self.place[idx], self.m_bytes[idx], self.messages[idx])


# --------------------------------------------------------------------------- candidates


@dataclass(frozen=True)
class _Candidate:
    name: str
    form: str
    sharing: bool
    table: bool = False
    by_stride: bool = False


def _terms_matrix(rows: _Rows, form: str, sharing: bool) -> np.ndarray:
    """Columns for (alpha_intra_us, alpha_inter_us, 1/beta_intra_gbps, 1/beta_inter_gbps) in ms."""
    fn = hierarchical_terms if form == "hierarchical" else two_tier_terms
    t = fn(rows.op, rows.g, rows.place, rows.m_bytes, rows.messages, sharing)
    return np.stack([1e-3 * t.lat_intra, 1e-3 * t.lat_inter, 1e-6 * t.bytes_intra, 1e-6 * t.bytes_inter], axis=1)


def _inverse_beta(w: float) -> float:
    return 1.0 / max(float(w), 1.0 / MAX_BETA_GBPS)


def _fit_tiers(X: np.ndarray, y: np.ndarray) -> tuple[dict, dict]:
    """Tier parameters by NNLS on relative error, and rows per tier; a tier without rows copies the other."""
    w = nnls_relative(X, y)
    samples = {"intra": int(np.sum(np.any(X[:, [0, 2]] != 0, axis=1))), "inter": int(np.sum(np.any(X[:, [1, 3]] != 0, axis=1)))}
    intra = (float(w[0]), _inverse_beta(w[2]))
    inter = (float(w[1]), _inverse_beta(w[3]))
    if not samples["inter"]:
        inter = intra
    if not samples["intra"]:
        intra = inter
    tiers = {"alpha_intra_us": intra[0], "beta_intra_gbps": intra[1], "alpha_inter_us": inter[0], "beta_inter_gbps": inter[1]}
    return tiers, samples


def _op_codes(op: np.ndarray) -> np.ndarray:
    """Index of each op in COLLECTIVE_OPS."""
    codes = np.zeros(op.shape, dtype=np.int64)
    for i, name in enumerate(COLLECTIVE_OPS):
        codes[op == name] = i
    return codes


def _group_sums(codes: np.ndarray, n_keys: int, *columns) -> list[np.ndarray]:
    return [np.bincount(codes, weights=c, minlength=n_keys) for c in columns]


def _fit_table(rows: _Rows, idx: np.ndarray, alpha_intra_us: float) -> tuple:
    """One bus bandwidth per intra-node (op, stride, group size) with >= 2 rows, alpha kept:
    least relative error of t - steps alpha = factor M / beta."""
    sel = idx[rows.place.nodes[idx] <= 1]
    if rows.place.stride is None or not len(sel):
        return ()
    op, g, p = rows.op[sel], rows.g[sel], rows.place.stride[sel]
    steps, factor = ring_terms(op, g)
    y = rows.y[sel]
    a = factor * rows.m_bytes[sel] * 1e-6 / y
    b = 1.0 - steps * rows.messages[sel] * alpha_intra_us * 1e-3 / y
    keys, codes = np.unique(np.stack([_op_codes(op), p, g], axis=1), axis=0, return_inverse=True)
    codes = codes.ravel()
    ab, aa, count = _group_sums(codes, len(keys), a * b, a * a, np.ones(len(a)))
    entries = []
    for (o, ps, gs), num, den, c in zip(keys, ab, aa, count):
        if c >= 2:
            inv = max(num / den, 1.0 / MAX_BETA_GBPS)
            entries.append({"stride": (int(ps), int(ps)), "group": (int(gs), int(gs)), "beta_gbps": float(1.0 / inv),
                            "ops": (COLLECTIVE_OPS[o],)})
    return tuple(entries)


def _nnls2(suu, suv, svv, su, sv, n):
    """Per key, non-negative (a, b) minimising sum (a u + b v - 1)^2 from the sums (vectorized)."""
    det = suu * svv - suv**2
    with np.errstate(divide="ignore", invalid="ignore"):
        a = (su * svv - sv * suv) / det
        b = (sv * suu - su * suv) / det
        ok = (det > 1e-12 * suu * svv) & (a >= 0) & (b >= 0)
        a0, b0 = np.zeros_like(su), np.where(svv > 0, np.maximum(sv / svv, 0.0), 0.0)   # a = 0
        a1, b1 = np.where(suu > 0, np.maximum(su / suu, 0.0), 0.0), np.zeros_like(sv)   # b = 0

    def sse(x, z):
        return x * x * suu + 2 * x * z * suv + z * z * svv - 2 * x * su - 2 * z * sv + n

    first = sse(a0, b0) <= sse(a1, b1)
    a = np.where(ok, a, np.where(first, a0, a1))
    b = np.where(ok, b, np.where(first, b0, b1))
    return a, b


def _fit_per_span(rows: _Rows, idx: np.ndarray, tiers: dict, sharing: bool, by_stride: bool) -> tuple:
    """alpha and 1/beta per (op, group size, nodes spanned[, stride]) by NNLS on relative error.

    Both are kept where the key's timings straddle the size at which the fitted latency and
    bandwidth terms are equal; a key timed only below it keeps its tier's beta and fits alpha,
    one timed only above it keeps its tier's alpha and fits beta (an unconstrained parameter
    would be extrapolated from noise).
    """
    op, g, place = rows.op[idx], rows.g[idx], rows.place[idx]
    y, msgs, m_bytes = rows.y[idx], rows.messages[idx], rows.m_bytes[idx]
    steps, factor = ring_terms(op, g)
    s = np.where(place.nodes > 1, place.concurrent if sharing else 1, 1).astype(np.float64)
    u = 1e-3 * steps * msgs / y
    v = 1e-6 * factor * m_bytes * s / y
    cols = [_op_codes(op), g, place.nodes] + ([place.stride] if by_stride else [])
    keys, codes = np.unique(np.stack(cols, axis=1), axis=0, return_inverse=True)
    codes = codes.ravel()
    n_keys = len(keys)
    suu, suv, svv, su, sv, n = _group_sums(codes, n_keys, u * u, u * v, v * v, u, v, np.ones(len(u)))
    a, b = _nnls2(suu, suv, svv, su, sv, n)
    # where each row's latency term (a u) is at least its bandwidth term (b v), per the key's own fit
    latency_bound = a[codes] * u >= b[codes] * v
    n_lat = np.bincount(codes, weights=latency_bound.astype(np.float64), minlength=n_keys)
    key_inter = keys[:, 2] > 1
    ka = np.where(key_inter, tiers["alpha_inter_us"], tiers["alpha_intra_us"])
    kb = 1.0 / np.where(key_inter, tiers["beta_inter_gbps"], tiers["beta_intra_gbps"])
    with np.errstate(divide="ignore", invalid="ignore"):
        a_only = np.maximum((su - kb * suv) / suu, 0.0)  # beta kept from the tier
        b_only = np.maximum((sv - ka * suv) / svv, 0.0)  # alpha kept from the tier
    both = (n_lat > 0) & (n_lat < n)
    latency_only = ~both & (n_lat > 0)
    a = np.where(both, a, np.where(latency_only, a_only, ka))
    b = np.where(both, b, np.where(latency_only, kb, b_only))
    entries = []
    for key, alpha, inv in zip(keys, a, b):
        entries.append({"op": COLLECTIVE_OPS[int(key[0])], "group": int(key[1]), "nodes": int(key[2]),
                        "stride": int(key[3]) if by_stride else None, "alpha_us": float(alpha), "beta_gbps": _inverse_beta(inv)})
    return tuple(entries)


class _Fitter:
    """Fits a candidate on a subset of rows; term matrices are computed once."""

    def __init__(self, rows: _Rows):
        self.rows = rows
        self._X: dict = {}

    def X(self, form: str, sharing: bool) -> np.ndarray:
        key = ("hierarchical" if form == "hierarchical" else "two-tier", sharing)
        if key not in self._X:
            self._X[key] = _terms_matrix(self.rows, *key)
        return self._X[key]

    def fit(self, cand: _Candidate, idx: np.ndarray) -> tuple[Network, dict]:
        rows = self.rows
        tiers, samples = _fit_tiers(self.X(cand.form, cand.sharing)[idx], rows.y[idx])
        common = dict(gpus_per_node=rows.gpus_per_node, sharing=cand.sharing,
                      reduce_scatter_form=rows.reduce_scatter_form, **tiers)
        if cand.form == "hierarchical":
            return HierarchicalNetwork(**common), samples
        table = _fit_table(rows, idx, tiers["alpha_intra_us"]) if cand.table else ()
        if cand.form == "per-span":
            entries = _fit_per_span(rows, idx, tiers, cand.sharing, cand.by_stride)
            return PerSpanNetwork(**common, bandwidth_table=table, entries=entries), samples
        return TwoTierNetwork(**common, bandwidth_table=table), samples


def reduce_scatter_form(rows: _Rows, sharing: bool | None) -> tuple[str, dict]:
    """How the timed backend runs a reduce-scatter, from the timings: the two-tier tiers fitted
    on every row with the reduce-scatters timed as rings, and again as all-reduces of their
    whole buffer (gloo's reduce_scatter_tensor); the form of the lower in-sample MAPE (%) wins.
    Returns (form, {"rows": reduce-scatter rows, "mape": {form: MAPE}}); ring without such rows."""
    mine = rows.op == "reduce_scatter"
    if not np.any(mine):
        return "ring", {}
    mape = {}
    for form in REDUCE_SCATTER_FORMS:
        op = np.where(mine, "all_reduce", rows.op) if form == "all_reduce" else rows.op
        X = _terms_matrix(replace(rows, op=op), "two-tier", True if sharing is None else bool(sharing))
        tiers, _ = _fit_tiers(X, rows.y)
        w = np.array([tiers["alpha_intra_us"], tiers["alpha_inter_us"], 1 / tiers["beta_intra_gbps"],
                      1 / tiers["beta_inter_gbps"]])
        mape[form] = float(np.mean(np.abs(X @ w - rows.y) / rows.y) * 100)
    chosen = "all_reduce" if mape["all_reduce"] < mape["ring"] - MIN_GAIN else "ring"
    return chosen, {"form": chosen, "rows": int(mine.sum()), "mape": mape}


def _candidates(rows: _Rows, form: str, table: bool, sharing: bool | None) -> tuple[list[_Candidate], dict]:
    """Candidates in order of complexity, and the variants left out because they predict the same."""
    place = rows.place
    crossing = place.nodes > 1
    shared = bool(np.any(crossing & (place.concurrent > 1)))
    same_as = {}
    if sharing is None:
        variants = [True, False] if shared else [True]
        if not shared:
            same_as.update({f"{f}/no-sharing": f for f in FORMS})
    else:
        variants = [bool(sharing)]

    def name(f, s):
        return f if s else f"{f}/no-sharing"

    out = []
    forms = FORMS if form == "auto" else (form,)
    for f in forms:
        for s in variants:
            out.append(_Candidate(name(f, s), f, s))
            if f == "two-tier" and table:
                out.append(_Candidate(name(f, s) + "+table", f, s, table=True))
    if "per-span" in forms and place.stride is not None:
        keys = np.unique(np.stack([_op_codes(rows.op), rows.g, place.nodes, place.stride], axis=1), axis=0)
        if len(np.unique(keys[:, :3], axis=0)) < len(keys):  # some (op, g, k) measured at several strides
            out.append(_Candidate(name("per-span", variants[0]) + "+stride", "per-span", variants[0], by_stride=True))
    return out, same_as


def no_worse(scores: dict, baseline: dict) -> bool:
    """Held-out R^2 no lower and held-out MAPE no higher than the baseline's."""
    inf = float("inf")
    return scores.get("test_r2", -inf) >= baseline.get("test_r2", -inf) - 1e-6 and scores.get("test_mape", inf) <= baseline.get("test_mape", inf) + 1e-6


def _sizes_out(fitter: _Fitter, cand: _Candidate) -> dict:
    """Leave-whole-message-sizes-out: per size, fit on the others and predict it."""
    rows = fitter.rows
    sizes = np.unique(rows.size)
    if len(sizes) < 2:
        return {}
    pred = np.full(len(rows.y), np.nan)
    by_size = {}
    for s in sizes:
        test = np.flatnonzero(rows.size == s)
        train = np.flatnonzero(rows.size != s)
        if len(train) < 2:
            continue
        network, _ = fitter.fit(cand, train)
        pred[test] = rows.predict(network, test)
        size_bytes = round(float(np.median(rows.m_bytes[test])))
        by_size[str(size_bytes)] = regression_scores(rows.y[test], pred[test])["mape"]
    done = np.isfinite(pred)
    scores = regression_scores(rows.y[done], pred[done])
    return {"sizes_out_mape": scores["mape"], "sizes_out_r2": scores["r2"], "sizes_out_worst_mape": max(by_size.values()),
            "sizes_out_by_size": by_size, "sizes_out_sizes": len(by_size)}


# --------------------------------------------------------------------------- result


@dataclass
class CollectiveModel:
    """A fitted collective model: ``network`` is what a profile's ``collectives`` object builds.

    ``name`` is the chosen candidate (form, "/no-sharing", "+table", "+stride"), ``scores``
    its held-out scores and ``all_scores`` every candidate's; ``same_as`` names candidates
    not scored because they predict exactly what another does on these rows.
    ``candidates`` holds every usable candidate's network fitted on all rows, so that a
    caller can choose among them on other evidence (:meth:`choose`); ``epoch_scores``
    holds that evidence when it was used (the epoch fit's held-out scores per candidate).
    """

    network: Network
    name: str = "two-tier"
    scores: dict = field(default_factory=dict)
    all_scores: dict = field(default_factory=dict)
    n_samples: int = 0
    tier_samples: dict = field(default_factory=dict)
    placement_mismatches: int = 0
    selected_by: str = ""
    same_as: dict = field(default_factory=dict)
    candidates: dict = field(default_factory=dict)
    epoch_scores: dict = field(default_factory=dict)
    #: per op of EXCHANGE_OPS fitted: rows per tier and the in-sample MAPE (%)
    op_fit: dict = field(default_factory=dict)
    #: the reduce-scatter form chosen (:func:`reduce_scatter_form`): form, rows, MAPE (%) per form
    reduce_scatter_fit: dict = field(default_factory=dict)

    def choose(self, name: str, selected_by: str) -> "CollectiveModel":
        """The same fit with candidate ``name`` as the chosen network."""
        return replace(self, network=self.candidates[name], name=name, scores=self.all_scores[name], selected_by=selected_by)

    @property
    def form(self) -> str:
        return self.network.form

    @property
    def tiers(self) -> dict:
        """{'intra': {alpha_us, beta_gbps, samples}, 'inter': ...}: the tiers that had rows."""
        net = self.network
        out = {}
        for tier in ("intra", "inter"):
            if self.tier_samples.get(tier):
                out[tier] = {"alpha_us": getattr(net, f"alpha_{tier}_us"), "beta_gbps": getattr(net, f"beta_{tier}_gbps"),
                             "samples": self.tier_samples[tier]}
        return out

    @property
    def table(self) -> list[dict]:
        """The fitted bandwidth table: op, stride, group, beta_gbps per entry (empty if none)."""
        return [{"op": e["ops"][0], "stride": e["stride"][0], "group": e["group"][0], "beta_gbps": e["beta_gbps"]}
                for e in getattr(self.network, "bandwidth_table", ())]

    def predict(self, df) -> np.ndarray:
        """time_ms of every row (columns op, group_size, nodes, message_bytes; stride, messages
        optional), placed as in the fit and timed by the profile's network model."""
        place, _ = frame_placement(df, self.network.gpus_per_node)
        msgs = np.asarray(df["messages"], dtype=np.float64) if "messages" in df else 1.0
        return self.network.placed_time_ms(np.asarray(df["op"]).astype(str), np.asarray(df["group_size"]).astype(np.int64),
                                           place, np.asarray(df["message_bytes"], dtype=np.float64), msgs)

    def to_dict(self) -> dict:
        """The machine profile's ``collectives`` object."""
        out = self.network.to_dict()
        if not self.tier_samples.get("inter"):
            out["note"] = NO_INTER_NOTE
        return out


# --------------------------------------------------------------------------- fit


def collective_time_sharing(df, host_cores: int | None) -> np.ndarray:
    """Per row, the :func:`~plexus_tune.model.machine.time_sharing_factor` the measurement ran under.

    A CPU calibration of ``world_size`` ranks on ``machine_info.cpu_count`` cores (else
    ``host_cores``) with ``threads_per_rank`` threads (default max(1, cores // world))
    took ``factor`` times as long as one rank alone would; dividing by it gives the
    per-rank time the cost model's collectives describe. 1 where ``host_cores`` is
    None or the world size is unknown.
    """
    n = len(df)
    if host_cores is None or "world_size" not in df:
        return np.ones(n)
    world = pd_numeric(df["world_size"], np.nan)
    cores = pd_numeric(df["machine_info.cpu_count"], host_cores) if "machine_info.cpu_count" in df else np.full(n, float(host_cores))
    default_threads = np.maximum(1, np.floor(cores / np.maximum(world, 1)))
    threads = pd_numeric(df["threads_per_rank"], np.nan) if "threads_per_rank" in df else np.full(n, np.nan)
    threads = np.where(np.isfinite(threads), threads, default_threads)
    factor = time_sharing_factor(np.where(np.isfinite(world), world, 1), threads, cores)
    return np.where(np.isfinite(world), factor, 1.0)


def _gpus_per_node(df, gpus_per_node) -> int | None:
    if gpus_per_node is not None:
        if isinstance(gpus_per_node, bool) or int(gpus_per_node) != gpus_per_node or gpus_per_node < 1:
            raise UserError(f"gpus_per_node must be a positive integer, got {gpus_per_node!r}")
        return int(gpus_per_node)
    if "gpus_per_node" in df:
        values = pd_numeric(df["gpus_per_node"], np.nan)
        if np.any(np.isfinite(values)):
            return int(np.nanmax(values))
    return None


def fit_op_tiers(df, gpus_per_node: int | None, sharing: bool) -> tuple[tuple, dict]:
    """Tier parameters of each op of :data:`EXCHANGE_OPS` in ``df`` (the columns of
    :func:`fit_collectives`): relative NNLS of time_ms on the op's
    :func:`~plexus_tune.model.collectives.exchange_terms`; a tier without rows copies the
    other. A broadcast is fitted in each of :data:`BROADCAST_FORMS` and keeps the form of
    the lower MAPE. Returns (``op_tiers`` as a Network holds them, {op: {"rows", "intra",
    "inter" (rows with terms on each tier), "mape" (%, in sample), "form" (broadcast)}})."""
    place, _ = frame_placement(df, gpus_per_node)
    op = np.asarray(df["op"]).astype(str)
    g = np.asarray(df["group_size"], dtype=np.float64).astype(np.int64)
    m = np.asarray(df["message_bytes"], dtype=np.float64)
    msgs = np.asarray(df["messages"], dtype=np.float64) if "messages" in df else np.ones(len(df))
    y = np.asarray(df["time_ms"], dtype=np.float64)
    tiers, report = [], {}
    for name in EXCHANGE_OPS:
        rows = op == name
        if not np.any(rows):
            continue
        if int(rows.sum()) < 2:
            raise UserError(f"collective measurements: one {name} timing; time it at two or more message sizes")
        best = None
        for form in (BROADCAST_FORMS if name == "broadcast" else ("ring",)):
            t = exchange_terms(op[rows], g[rows], place[rows], m[rows], msgs[rows], sharing, form)
            X = np.stack([1e-3 * t.lat_intra, 1e-3 * t.lat_inter, 1e-6 * t.bytes_intra, 1e-6 * t.bytes_inter], axis=1)
            fitted, samples = _fit_tiers(X, y[rows])
            w = np.array([fitted["alpha_intra_us"], fitted["alpha_inter_us"], 1 / fitted["beta_intra_gbps"],
                          1 / fitted["beta_inter_gbps"]])
            mape = float(np.mean(np.abs(X @ w - y[rows]) / y[rows]) * 100)
            if best is None or mape < best[2]["mape"] - MIN_GAIN:
                extra = {"form": form} if name == "broadcast" else {}
                best = ({**fitted, **extra}, samples, {**samples, "rows": int(rows.sum()), "mape": mape, **extra})
        tiers.append((name, best[0]))
        report[name] = best[2]
    return tuple(tiers), report


def as_trained(df):
    """The timings taken as training runs its collectives: where the logs time groups both
    alone (``alone`` true) and all groups of a shape at once, only the latter. Every family
    runs all process rows or columns of its grid at once, and on ranks that share a host's
    cores a latency-bound collective takes 2-5x its time alone, which no term of the
    network model tells apart within a node (docs/model.md, "Fitting protocol")."""
    if "alone" not in df:
        return df
    alone = df["alone"].fillna(False).astype(bool).to_numpy()
    if alone.all() or not alone.any():
        return df
    return df[~alone].reset_index(drop=True)


def fit_collectives(df, *, n_splits: int = DEFAULT_SPLITS, seed: int = 0, form: str = "auto", table: bool = False,
                    gpus_per_node: int | None = None, sharing: bool | None = None) -> CollectiveModel:
    """Fit the collective network model to timings and score every candidate form on held-out data.

    df columns: op, group_size, nodes (nodes the group spans; ``nodes_spanned`` also read),
    message_bytes (full buffer), time_ms; optional stride, messages, ranks_per_node,
    concurrent, gpus_per_node, alone (:func:`as_trained` keeps the timings of all groups at
    once where both kinds are logged, for every op). Rows are placed by :func:`frame_placement` with
    ``gpus_per_node`` (default: the largest in the column of that name). Rows with a
    group of one rank carry no ring term and are ignored.

    ``form``: two-tier, per-span, hierarchical, or auto (every form, each with and without
    sharing where some measured group shares a node with others, scored; the lowest
    leave-sizes-out MAPE wins). ``sharing``: None tries both, else fixed. ``table`` also
    fits a bus bandwidth per intra-node (op, stride, group size) (the profile's
    ``bandwidth_table``, alpha kept from the tier), kept only when its random-split
    held-out R^2 and MAPE are no worse than the plain formula's (:func:`no_worse`).
    """
    if form not in COLLECTIVE_FORMS:
        raise UserError(f"unknown collective model form {form!r}; choose one of {', '.join(COLLECTIVE_FORMS)}")
    if "nodes" not in df and "nodes_spanned" in df:
        df = df.assign(nodes=df["nodes_spanned"])
    check_frame(df, COLLECTIVE_COLUMNS, positive=("group_size", "nodes", "message_bytes", "time_ms"), min_count=2, what="collective measurements")
    op_array(np.asarray(df["op"]))
    df = df[np.asarray(df["group_size"], dtype=np.float64) > 1].reset_index(drop=True)
    exchange = np.isin(np.asarray(df["op"]).astype(str), EXCHANGE_OPS)
    exchange_df, df = as_trained(df[exchange].reset_index(drop=True)), as_trained(df[~exchange].reset_index(drop=True))
    if len(df) < 2:
        raise UserError("collective measurements: fewer than 2 all-reduce, all-gather or reduce-scatter rows with group_size > 1; "
                        "measure these collectives on groups of 2 or more ranks")
    if table and _stride_column(df) is None:
        raise UserError("collective measurements: missing column 'stride' (needed for a bandwidth table)")
    n = _gpus_per_node(df, gpus_per_node)
    place, mismatches = frame_placement(df, n)
    m_bytes = np.asarray(df["message_bytes"], dtype=np.float64)
    rows = _Rows(op=np.asarray(df["op"]).astype(str), g=np.asarray(df["group_size"], dtype=np.float64).astype(np.int64), place=place,
                 m_bytes=m_bytes, messages=np.asarray(df["messages"], dtype=np.float64) if "messages" in df else np.ones(len(df)),
                 y=np.asarray(df["time_ms"], dtype=np.float64), size=size_groups(m_bytes), gpus_per_node=n)
    rs_form, rs_fit = reduce_scatter_form(rows, sharing)
    if rs_form == "all_reduce":
        rows = replace(rows, op=np.where(rows.op == "reduce_scatter", "all_reduce", rows.op), reduce_scatter_form=rs_form)
    fitter = _Fitter(rows)
    candidates, same_as = _candidates(rows, form, table, sharing)
    all_scores: dict = {}
    with single_threaded_blas():
        for cand in candidates:
            scores: dict = {}
            if n_splits > 0 and len(rows.y) >= 5:

                def fit_rows(idx, cand=cand):
                    network, _ = fitter.fit(cand, idx)
                    return lambda test: rows.predict(network, test)

                scores = repeated_split_scores(fit_rows, rows.y, n_splits=n_splits, seed=seed)
            scores.update(_sizes_out(fitter, cand))
            all_scores[cand.name] = scores
    # the table replaces the plain formula only where no held-out score is worse
    usable = [c for c in candidates if not c.table]
    for c in candidates:
        if c.table:
            plain = c.name.removesuffix("+table")
            if no_worse(all_scores[c.name], all_scores[plain]):
                usable[usable.index(next(u for u in usable if u.name == plain))] = c
    decide = "sizes_out_mape" if len(np.unique(rows.size)) >= 3 else "test_mape"
    chosen = usable[0]
    for c in usable[1:]:
        if all_scores[c.name].get(decide, math.inf) < all_scores[chosen.name].get(decide, math.inf) - MIN_GAIN:
            chosen = c
    everything = np.arange(len(rows.y))
    networks = {c.name: fitter.fit(c, everything) for c in usable}
    op_fit: dict = {}
    if len(exchange_df):
        own = {flag: fit_op_tiers(exchange_df, n, flag) for flag in {net.sharing for net, _ in networks.values()}}
        networks = {name: (replace(net, op_tiers=own[net.sharing][0]), samples) for name, (net, samples) in networks.items()}
        op_fit = own[networks[chosen.name][0].sharing][1]
    network, samples = networks[chosen.name]
    return CollectiveModel(network=network, name=chosen.name, scores=all_scores[chosen.name], all_scores=all_scores,
                           n_samples=len(rows.y), tier_samples=samples, placement_mismatches=mismatches,
                           selected_by=decide if len(usable) > 1 else "", same_as=same_as,
                           candidates={name: net for name, (net, _) in networks.items()}, op_fit=op_fit,
                           reduce_scatter_fit=rs_fit)
