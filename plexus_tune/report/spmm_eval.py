"""How well an SpMM model kind predicts measured timings it was not fitted on
(docs/model.md, "Structure-boosted SpMM model"): extrapolation MAPE, the V/U shape
ratio and per-grid SpMM-per-epoch errors. ``runners/campaigns/spmm_model_eval.py`` prints them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from plexus_tune.fit.scoring import mape_percent
from plexus_tune.fit.spmm import fit_kind, spmm_shapes, spmm_structure
from plexus_tune.fit.tables import load_table
from plexus_tune.model.spmm import SPMM_MODELS
from plexus_tune.report.metrics import spearman

#: The measured V/U time ratio on the products-size Graph500 R-MAT (measurements/h100-2026-11-25).
MEASURED_V_OVER_U = 7.3


class SpmmData:
    """The SpMM timing tables of a measured directory (the uniform sweep, and under
    ``structure/`` the structured sweep and the R-MAT shards with their operands' structure)."""

    def __init__(self, root: Path):
        root = Path(root)
        self.sweep = load_table(root / "spmm-sweep.jsonl", schema="spmm")
        self.structured = load_table(root / "structure" / "spmm-structured-sweep.jsonl", schema="spmm")
        self.rmat = load_table(root / "structure" / "rmat-spmm-shards.jsonl", schema="spmm")
        self.skewed = load_table(root / "structure" / "rmat-skewed-spmm-shards.jsonl", schema="spmm")
        self.uniform = load_table(root / "structure" / "rmat-uniform-spmm-shards.jsonl", schema="spmm")


def concat_tables(*frames):
    """The rows of several timing tables as one."""
    import pandas as pd

    return pd.concat(frames, ignore_index=True)


def fitted_kind(kind: str, df, *, blind: bool = False):
    """The kind fitted on df; ``blind``: every operand taken as uniformly random (the structure ablated)."""
    cls = SPMM_MODELS[kind]
    structure = spmm_structure(df) if cls.uses_structure and not blind else None
    model = fit_kind(cls, spmm_shapes(df), np.asarray(df["time_ms"], float), structure)
    model.blind = blind
    return model


def spmm_time_ms(model, df) -> np.ndarray:
    """The model's SpMM time (ms) of every row of df."""
    if model.uses_structure:
        return model.predict(*spmm_shapes(df), None if getattr(model, "blind", False) else spmm_structure(df))
    return model.predict(*spmm_shapes(df))


def extrapolation_mape(kind: str, df, column: str) -> float:
    """MAPE (%) on the largest 30 % of df by ``column`` of the kind fitted on the smallest 70 %."""
    ordered = df.sort_values(column, kind="stable").reset_index(drop=True)
    cut = int(0.7 * len(ordered))
    train, test = ordered.iloc[:cut], ordered.iloc[cut:]
    return mape_percent(spmm_time_ms(fitted_kind(kind, train), test), test["time_ms"])


def grid_epoch_errors(df, predicted) -> dict:
    """Per G: the number of grids, the largest and median |error| % of each grid's summed
    SpMM time, and the Spearman correlation of the grids' observed and predicted sums."""
    out = {}
    frame = df.assign(predicted_time_ms=np.asarray(predicted, float))
    for gpus, part in frame.groupby("gpus"):
        sums = part.groupby("grid")[["time_ms", "predicted_time_ms"]].sum()
        err = (sums["predicted_time_ms"] / sums["time_ms"] - 1) * 100
        out[int(gpus)] = {"grids": len(sums), "max_abs_error_pct": float(err.abs().max()),
                          "median_abs_error_pct": float(err.abs().median()),
                          "spearman": spearman(sums["time_ms"], sums["predicted_time_ms"])}
    return out


def v_over_u(model, shards) -> tuple[float, float]:
    """(predicted, measured) V/U on the Graph500 shards: U rows N, common ceil(N/64), k 100; V rows = common = N, k 2."""
    n = int(shards["graph_nodes"].iloc[0])
    u = shards[(shards["rows"] == n) & (shards["common"] == -(-n // 64)) & (shards["dense_cols"] == 100)].iloc[:1]
    v = shards[(shards["rows"] == n) & (shards["common"] == n) & (shards["dense_cols"] == 2)].iloc[:1]
    pu, pv = spmm_time_ms(model, u)[0], spmm_time_ms(model, v)[0]
    return float(pv / pu), float(v["time_ms"].iloc[0] / u["time_ms"].iloc[0])
