"""Fit the collective-communication model from timings."""

from __future__ import annotations
from dataclasses import dataclass, field
import numpy as np
from plexus_tune.errors import UserError
from plexus_tune.fit.scoring import DEFAULT_SPLITS, repeated_split_scores
from plexus_tune.fit.solvers import nnls_relative
from plexus_tune.fit.tables import check_frame, pd_numeric


COLLECTIVE_COLUMNS = ("op", "group_size", "nodes", "message_bytes", "time_ms")
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter")
# --------------------------------------------------------------------------- collectives


def ring_terms(op, group_size) -> tuple[np.ndarray, np.ndarray]:
    """(steps, factor) of the ring formula per row: all-reduce 2(g-1), 2(g-1)/g; others g-1, (g-1)/g."""
    op = np.asarray(op)
    g = np.asarray(group_size, dtype=np.float64)
    bad = ~np.isin(op, COLLECTIVE_OPS)
    if np.any(bad):
        raise UserError(f"unknown collective op {str(op[bad][0])!r}; expected one of {', '.join(COLLECTIVE_OPS)}")
    mult = np.where(op == "all_reduce", 2.0, 1.0)
    return mult * (g - 1.0), mult * (g - 1.0) / g


def bus_bandwidth_gbps(op, group_size, message_bytes, time_ms) -> tuple[np.ndarray, np.ndarray]:
    """(algbw, busbw) in GB/s with nccl-tests conventions: algbw = M / t, busbw = algbw * factor."""
    _, factor = ring_terms(op, group_size)
    algbw = np.asarray(message_bytes, dtype=np.float64) / (np.asarray(time_ms, dtype=np.float64) * 1e-3) / 1e9
    return algbw, algbw * factor


@dataclass
class CollectiveModel:
    """alpha (us per ring step) and beta (bus bandwidth, GB/s) per tier (intra, inter).

    With a ``table`` (entries op, stride, group, beta_gbps), a row whose (op, stride,
    group size) is listed uses that bus bandwidth instead of its tier's beta.
    """

    tiers: dict
    table: list = field(default_factory=list)
    scores: dict = field(default_factory=dict)
    n_samples: int = 0

    def predict(self, df) -> np.ndarray:
        """time_ms = steps alpha + factor M / beta, with the tier chosen by nodes (1: intra)."""
        op = np.asarray(df["op"]).astype(str)
        g = np.asarray(df["group_size"])
        steps, factor = ring_terms(op, g)
        inter = np.asarray(df["nodes"], dtype=np.float64) > 1
        alpha_us = np.where(inter, self._get("inter", "alpha_us"), self._get("intra", "alpha_us"))
        beta = np.where(inter, self._get("inter", "beta_gbps"), self._get("intra", "beta_gbps")).astype(np.float64)
        if self.table and "stride" in df:
            stride = np.asarray(df["stride"])
            for e in self.table:
                hit = (op == e["op"]) & (stride == e["stride"]) & (g == e["group"])
                beta = np.where(hit, e["beta_gbps"], beta)
        m = np.asarray(df["message_bytes"], dtype=np.float64)
        return steps * alpha_us * 1e-3 + factor * m / (beta * 1e9) * 1e3

    def _get(self, tier: str, key: str) -> float:
        t = self.tiers.get(tier) or self.tiers.get("intra") or self.tiers.get("inter")
        return float(t[key])

    def to_dict(self) -> dict:
        """The machine profile's ``collectives`` entry (inter copies intra if not measured)."""
        intra = self.tiers.get("intra") or self.tiers["inter"]
        inter = self.tiers.get("inter") or intra
        out = {
            "alpha_intra_us": intra["alpha_us"],
            "beta_intra_gbps": intra["beta_gbps"],
            "alpha_inter_us": inter["alpha_us"],
            "beta_inter_gbps": inter["beta_gbps"],
        }
        if self.table:
            out["bandwidth_table"] = [
                {"stride": [e["stride"], e["stride"]], "group": [e["group"], e["group"]], "beta_gbps": e["beta_gbps"], "ops": [e["op"]]}
                for e in self.table
            ]
        if "inter" not in self.tiers:
            out["note"] = "no inter-node measurements: inter-node values copy the intra-node fit"
        return out


#: bandwidth reported when the bandwidth term fits to zero (latency-bound data only)
MAX_BETA_GBPS = 1e4


def _fit_alpha_beta(steps, factor, m, y) -> tuple[float, float]:
    X = np.stack([steps * 1e-3, factor * m * 1e-6], axis=1)  # alpha in us, 1/beta in 1/(GB/s)
    alpha_us, inv_beta = nnls_relative(X, y)
    return float(alpha_us), float(1.0 / max(inv_beta, 1.0 / MAX_BETA_GBPS))


def _fit_beta_given_alpha(steps, factor, m, y, alpha_us) -> float:
    """Least relative error 1/beta >= 0 with alpha fixed: t - steps alpha = factor M / beta."""
    a = factor * m * 1e-6 / y
    b = 1.0 - steps * alpha_us * 1e-3 / y
    inv = max(float(a @ b) / float(a @ a), 1.0 / MAX_BETA_GBPS)
    return 1.0 / inv


def _fit_collective_rows(idx, op, steps, factor, m, y, inter, stride, g, table: bool):
    tiers = {}
    for tier, mask in (("intra", ~inter), ("inter", inter)):
        sel = idx[mask[idx]]
        if len(sel) >= 2:
            alpha, beta = _fit_alpha_beta(steps[sel], factor[sel], m[sel], y[sel])
            tiers[tier] = {"alpha_us": alpha, "beta_gbps": beta, "samples": int(len(sel))}
    entries = []
    if table and stride is not None and tiers:
        keys = sorted({(op[i], int(stride[i]), int(g[i])) for i in idx})
        for o, p, gs in keys:
            sel = idx[(op[idx] == o) & (stride[idx] == p) & (g[idx] == gs) & ~inter[idx]]
            if len(sel) >= 2:
                alpha = tiers.get("intra", tiers.get("inter"))["alpha_us"]
                beta = _fit_beta_given_alpha(steps[sel], factor[sel], m[sel], y[sel], alpha)
                entries.append({"op": o, "stride": p, "group": gs, "beta_gbps": float(beta)})
    return tiers, entries


def collective_time_sharing(df, host_cores: int | None) -> np.ndarray:
    """Per row, the :func:`~plexus_tune.model.machine.time_sharing_factor` the measurement ran under.

    A CPU calibration of ``world_size`` ranks on ``machine_info.cpu_count`` cores (else
    ``host_cores``) with ``threads_per_rank`` threads (default max(1, cores // world))
    took ``factor`` times as long as one rank alone would; dividing by it gives the
    per-rank time the cost model's collectives describe. 1 where ``host_cores`` is
    None or the world size is unknown.
    """
    from plexus_tune.model.machine import time_sharing_factor

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



def fit_collectives(df, *, n_splits: int = DEFAULT_SPLITS, seed: int = 0, table: bool = False) -> CollectiveModel:
    """Fit alpha and beta per tier (intra: nodes == 1, inter: nodes > 1) to ring formulas.

    df columns: op, group_size, nodes, message_bytes (full buffer), time_ms (and stride,
    for ``table``). Rows with a group of one rank carry no ring term and are ignored.
    Least squares on relative error with alpha, 1/beta >= 0. With ``table``, every
    intra-node (op, stride, group size) also gets its own bus bandwidth (alpha kept
    from the tier fit): the profile's ``bandwidth_table``.
    """
    check_frame(df, COLLECTIVE_COLUMNS, positive=("group_size", "nodes", "message_bytes", "time_ms"), min_count=2, what="collective measurements")
    df = df[np.asarray(df["group_size"], dtype=np.float64) > 1].reset_index(drop=True)
    if len(df) < 2:
        raise UserError("collective measurements: fewer than 2 rows with group_size > 1; measure groups of 2 or more ranks")
    op = np.asarray(df["op"]).astype(str)
    g = np.asarray(df["group_size"]).astype(np.int64)
    steps, factor = ring_terms(op, g)
    m = np.asarray(df["message_bytes"], dtype=np.float64)
    y = np.asarray(df["time_ms"], dtype=np.float64)
    inter = np.asarray(df["nodes"], dtype=np.float64) > 1
    if table and "stride" not in df:
        raise UserError("collective measurements: missing column 'stride' (needed for a bandwidth table)")
    stride = np.asarray(df["stride"]).astype(np.int64) if "stride" in df else None
    args = (op, steps, factor, m, y, inter, stride, g, table)
    tiers, entries = _fit_collective_rows(np.arange(len(y)), *args)
    model = CollectiveModel(tiers=tiers, table=entries, n_samples=len(y))
    if n_splits > 0 and len(y) >= 5:

        def fit_rows(idx):
            t, e = _fit_collective_rows(idx, *args)
            sub = CollectiveModel(tiers=t or tiers, table=e)
            return lambda rows: sub.predict(df.iloc[rows])

        model.scores = repeated_split_scores(fit_rows, y, n_splits=n_splits, seed=seed)
    return model
