"""Model-driven evaluation of configurations and exhaustive optima."""

from __future__ import annotations
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
import numpy as np
from plexus_tune.errors import UserError
from plexus_tune.model.costs import predict_grids
from plexus_tune.model.grid import enumerate_grids
from plexus_tune.search.space import Config, SearchSpace, objective_value


# --------------------------------------------------------------------------------------
# Evaluators: the model, or measurements


@dataclass
class Evaluation:
    """What one configuration costs: predicted (and, when measured, observed) epoch time."""

    predicted_ms: float
    memory_gib: float
    memory_excess_gib: float
    observed_ms: float | None = None
    failure: str | None = None
    breakdown: dict = field(default_factory=dict)
    run_id: str | None = None

    @property
    def feasible(self) -> bool:
        return self.memory_excess_gib <= 0

    @property
    def epoch_ms(self) -> float | None:
        """The time the search optimizes: observed if measured, else predicted."""
        return self.observed_ms if self.observed_ms is not None else self.predicted_ms


class ModelEvaluator:
    """Predict configurations with the cost model (``plexus_tune.model.costs.predict_grids``).

    ``predict`` defaults to ``predict_grids``; pass another function with its signature to
    search a different model.
    """

    measured = False

    def __init__(self, workload, machine, predict: Callable | None = None):
        if predict is None:
            predict = predict_grids
        self.workload = workload
        self.machine = machine
        self._predict = predict
        usable = getattr(machine, "usable_memory_bytes", None) or machine.device_memory_bytes
        self.device_memory_gib = float(usable) / 2**30

    def predict_many(self, configs: Sequence[Config]) -> dict[str, np.ndarray]:
        """Vectorized predictions for configurations that share a block size, keys as ``predict_grids``."""
        blocks = {c.block_rows for c in configs}
        if len(blocks) != 1:
            raise ValueError("predict_many needs configurations with one block size")
        grids = np.array([c.grid for c in configs], dtype=np.int64).reshape(-1, 3)
        (block,) = blocks
        kwargs = {"block_rows": block} if block is not None else {}
        return self._predict(self.workload, self.machine, grids, **kwargs)

    def evaluate(self, config: Config) -> Evaluation:
        pred = self.predict_many([config])
        mem_gib = float(np.asarray(pred["memory_bytes"])[0]) / 2**30
        breakdown = {k: float(np.asarray(v)[0]) for k, v in pred.items() if k.endswith("_ms")}
        return Evaluation(
            predicted_ms=float(np.asarray(pred["total_ms"])[0]),
            memory_gib=mem_gib,
            memory_excess_gib=mem_gib - self.device_memory_gib,
            breakdown=breakdown,
        )

    def top_k(self, space: SearchSpace, k: int, objective: str = "epoch") -> list[Config]:
        """The model's k best feasible configurations of ``space`` (for warm starts)."""
        frame = exhaustive_frame(space, self, objective)
        frame = frame[frame["feasible"]].sort_values(["value", "gpus", "gx", "gy"], kind="stable")
        return [Config(int(r.gx), int(r.gy), int(r.gz), None if r.block_rows <= 0 else int(r.block_rows)) for r in frame.head(k).itertuples()]


def exhaustive_frame(space: SearchSpace, evaluator: ModelEvaluator, objective: str = "epoch", *, block_sizes=None):
    """Predict every configuration of ``space`` (one vectorized call per G and block size).

    Returns a DataFrame with gpus, gx, gy, gz, block_rows (0 = unblocked), grid,
    predicted_ms, the breakdown columns, memory_gib, feasible and value (the objective).
    """
    import pandas as pd

    blocks: list[int | None] = [None]
    if space.block_rows_range is not None:
        lo, hi = space.block_rows_range
        if block_sizes is None:
            block_sizes = [2**k for k in range(math.ceil(math.log2(lo)), math.floor(math.log2(hi)) + 1)]
        blocks += list(block_sizes)
    # one vectorized call per block size over the grids of every G (rows are independent)
    grids = np.concatenate([np.asarray(enumerate_grids(g), dtype=np.int64).reshape(-1, 3) for g in space.gpus])
    parts = []
    for b in blocks:
        configs = [Config(int(x), int(y), int(z), b) for x, y, z in grids.tolist()]
        pred = evaluator.predict_many(configs)
        part = {k: np.asarray(v) for k, v in pred.items() if np.ndim(v) == 1 and len(v) == len(configs)}
        part["gx"], part["gy"], part["gz"] = grids[:, 0], grids[:, 1], grids[:, 2]
        part["gpus"] = grids.prod(axis=1)
        part["block_rows"] = np.full(len(configs), b or 0, dtype=np.int64)
        parts.append(pd.DataFrame(part))
    frame = pd.concat(parts, ignore_index=True)
    frame["grid"] = frame["gx"].astype(str) + "x" + frame["gy"].astype(str) + "x" + frame["gz"].astype(str)
    frame["predicted_ms"] = frame["total_ms"].astype(float)
    frame["memory_gib"] = frame["memory_bytes"].astype(float) / 2**30
    frame["feasible"] = frame["memory_gib"] <= evaluator.device_memory_gib
    frame["value"] = objective_value(frame["predicted_ms"].to_numpy(), frame["gpus"].to_numpy(), objective)
    return frame


def exhaustive_optimum(space: SearchSpace, evaluator: ModelEvaluator, objective: str = "epoch") -> tuple[Config, float]:
    """The best feasible configuration of ``space`` under the model, and its objective value."""
    frame = exhaustive_frame(space, evaluator, objective)
    feasible = frame[frame["feasible"]]
    if feasible.empty:
        raise UserError("no configuration fits in device memory; allow more GPUs")
    row = feasible.loc[feasible["value"].idxmin()]
    cfg = Config(int(row.gx), int(row.gy), int(row.gz), None if int(row.block_rows) == 0 else int(row.block_rows))
    return cfg, float(row["value"])
