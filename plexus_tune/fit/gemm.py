"""Fit the dense GEMM rate from timings."""

from __future__ import annotations
from dataclasses import dataclass, field
import numpy as np
from plexus_tune.fit.scoring import DEFAULT_SPLITS, min_rows, repeated_split_scores
from plexus_tune.fit.solvers import nnls_relative
from plexus_tune.fit.tables import check_frame


GEMM_COLUMNS = ("rows", "inner", "cols", "time_ms")
# --------------------------------------------------------------------------- GEMM


@dataclass
class GemmModel:
    """t = overhead_ms + 2 m n k / (tflops 1e12) * 1e3."""

    tflops: float
    overhead_ms: float
    scores: dict = field(default_factory=dict)

    def predict(self, df) -> np.ndarray:
        flops = 2.0 * np.asarray(df["rows"], float) * np.asarray(df["inner"], float) * np.asarray(df["cols"], float)
        return self.overhead_ms + flops / (self.tflops * 1e12) * 1e3

    def to_dict(self) -> dict:
        return {"gemm_tflops": self.tflops, "gemm_overhead_ms": self.overhead_ms}


def fit_gemm(df, *, n_splits: int = DEFAULT_SPLITS, seed: int = 0, progress=None) -> GemmModel:
    """Fit GEMM throughput and a fixed overhead (non-negative, relative least squares).

    When the fit puts all time in the overhead (tiny GEMMs), the rate is bounded by the
    fastest measurement instead: tflops = max(flops / time). Scored on ``n_splits``
    random 70/30 splits; ``progress(done, total)`` reports them.
    """
    check_frame(df, GEMM_COLUMNS, positive=GEMM_COLUMNS, min_count=min_rows(2), what="GEMM measurements")
    flops = 2.0 * np.prod([np.asarray(df[c], float) for c in ("rows", "inner", "cols")], axis=0)
    y = np.asarray(df["time_ms"], float)
    X = np.stack([np.ones_like(y), flops * 1e-9], axis=1)  # ms, ms per GFLOP

    def solve(idx):
        over, per_gflop = nnls_relative(X[idx], y[idx])
        if per_gflop <= 0:  # every GEMM overhead-bound: bound the rate by the fastest one observed
            per_gflop = float(np.min(y[idx] / X[idx, 1]))
        return GemmModel(tflops=1.0 / per_gflop, overhead_ms=float(over))

    model = solve(np.arange(len(y)))
    if n_splits > 0:

        def fit_rows(idx):
            sub = solve(idx)
            return lambda rows: sub.overhead_ms + flops[rows] / (sub.tflops * 1e12) * 1e3  # as GemmModel.predict

        model.scores = repeated_split_scores(fit_rows, y, n_splits=n_splits, seed=seed, progress=progress)
    return model
