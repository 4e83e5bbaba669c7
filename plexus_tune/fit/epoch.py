"""Fit epoch-level scale factors and overhead from trainer runs."""

from __future__ import annotations
from collections.abc import Mapping
from dataclasses import dataclass, field
import numpy as np
from plexus_tune.errors import UserError
from plexus_tune.model.breakdown import EPOCH_PARTS
from plexus_tune.fit.scoring import DEFAULT_SPLITS, min_rows, repeated_split_scores
from plexus_tune.fit.solvers import nnls_relative
from plexus_tune.fit.tables import check_frame, pd_numeric


# --------------------------------------------------------------------------- epoch level

#: The model's exclusive parts of an epoch, each with its own scale (the overhead is fitted apart).
EPOCH_COMPONENTS = EPOCH_PARTS


@dataclass
class EpochModel:
    """epoch_ms = sum_c scale[c] * predicted[c] + overhead_ms (all coefficients >= 0).

    ``predict`` reads the predicted component c from column ``predicted_prefix + c``
    (the runs table's ``pred_spmm_ms``...; docs/records.md).
    """

    scales: dict
    overhead_ms: float
    scores: dict = field(default_factory=dict)
    method: str = "total"
    predicted_prefix: str = "pred_"

    def predict(self, df) -> np.ndarray:
        out = np.full(len(df), self.overhead_ms, dtype=np.float64)
        for comp, s in self.scales.items():
            out = out + s * np.asarray(df[f"{self.predicted_prefix}{comp}"], dtype=np.float64)
        return out

    def to_dict(self) -> dict:
        return {"scales": dict(self.scales), "overhead_ms": self.overhead_ms, "method": self.method}


def epoch_parameters(df, components=EPOCH_COMPONENTS, predicted_prefix: str = "pred_") -> int:
    """Coefficients :func:`fit_epoch` estimates from ``df``: one per component predicted nonzero somewhere, and the overhead."""
    cols = [f"{predicted_prefix}{c}" for c in components if f"{predicted_prefix}{c}" in df.columns]
    return 1 + sum(bool((pd_numeric(df[c], 0.0) != 0).any()) for c in cols)


def fit_epoch(
    df,
    *,
    observed: str = "obs_epoch_ms",
    components=EPOCH_COMPONENTS,
    predicted_prefix: str = "pred_",
    breakdown_prefix: str = "obs_",
    n_splits: int = DEFAULT_SPLITS,
    seed: int = 0,
) -> EpochModel:
    """Fit non-negative scale factors of predicted components and an epoch overhead.

    df holds one row per run (the runs table, docs/records.md): the model's predicted
    components (``pred_spmm_ms``..., ms) and the observed epoch time (``obs_epoch_ms``).
    Components that are zero everywhere keep scale 1. Two methods:

    - ``breakdown``, when df also holds the observed components (``obs_spmm_ms``...,
      the trainer's breakdown): each component's own scale b_c from observed_c = b_c
      predicted_c (relative least squares), then an overlap factor a and the overhead
      from the epoch time: epoch = a sum_c b_c predicted_c + overhead. Scales are
      a b_c. Every coefficient is pinned by its own data, so the scales say how far
      each part of the model is off.
    - ``total`` otherwise: epoch = sum_c s_c predicted_c + overhead by non-negative
      relative least squares on epoch times alone (parts that vary together across
      configurations can trade their scales).
    """
    comps = [c for c in components if f"{predicted_prefix}{c}" in df.columns]
    if not comps:
        raise UserError(f"trainer runs: missing column {predicted_prefix + components[0]!r} (predicted breakdown)")
    pcols = tuple(f"{predicted_prefix}{c}" for c in comps)
    check_frame(df, pcols + (observed,), positive=(observed,), min_count=min_rows(epoch_parameters(df, comps, predicted_prefix)),
                what="trainer runs")
    y = np.asarray(df[observed], dtype=np.float64)
    P = np.stack([np.asarray(df[c], dtype=np.float64) for c in pcols], axis=1)
    active = np.any(P != 0, axis=0)
    breakdown_cols = [f"{breakdown_prefix}{c}" for c in comps]
    method = "breakdown" if all(c in df.columns for c in breakdown_cols) else "total"
    if method == "breakdown":
        O = np.stack([pd_numeric(df[c], np.nan) for c in breakdown_cols], axis=1)
        predicted = P[:, active] > 0
        if not np.all(np.isfinite(O[:, active])) or np.any(O[:, active] < 0) or np.any(predicted & (O[:, active] <= 0)):
            method = "total"  # a breakdown is missing where the model predicts the part

    def solve(idx):
        scales = {c: 1.0 for c in comps}
        if method == "breakdown":
            b = np.ones(len(comps))
            for j in np.flatnonzero(active):
                seen = idx[(O[idx, j] > 0) & (P[idx, j] > 0)]  # runs where the part happened and is predicted
                b[j] = nnls_relative(P[seen, j : j + 1], O[seen, j])[0] if len(seen) else 1.0
            a, overhead = nnls_relative(np.stack([P[idx] @ b, np.ones(len(idx))], axis=1), y[idx])
            for j, c in enumerate(comps):
                if active[j]:
                    scales[c] = float(a * b[j])
            return EpochModel(scales=scales, overhead_ms=float(overhead), method=method, predicted_prefix=predicted_prefix)
        X = np.concatenate([P[idx][:, active], np.ones((len(idx), 1))], axis=1)
        w = nnls_relative(X, y[idx])
        for c, v in zip(np.array(comps)[active], w[:-1]):
            scales[str(c)] = float(v)
        return EpochModel(scales=scales, overhead_ms=float(w[-1]), method=method, predicted_prefix=predicted_prefix)

    model = solve(np.arange(len(y)))
    if n_splits > 0:

        def fit_rows(idx):
            sub = solve(idx)
            return lambda rows: sub.predict(df.iloc[rows])

        model.scores = repeated_split_scores(fit_rows, y, n_splits=n_splits, seed=seed)
    return model


def scores_table_rows(all_scores: Mapping) -> list[dict]:
    """Flat rows (kind, train/test R^2, RMSE, MAPE) for printing or saving."""
    rows = []
    for kind, s in all_scores.items():
        rows.append({"kind": kind, **{k: s.get(k) for k in ("train_r2", "test_r2", "train_rmse_ms", "test_rmse_ms", "train_mape", "test_mape")}})
    return rows
