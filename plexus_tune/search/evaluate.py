"""Model-driven evaluation of configurations, exhaustive optima and the exact search.

A model-driven search enumerates its space exactly when that is cheap
(:func:`plan_search`): it counts the configurations, times the model on a probe of
them, and enumerates when the estimated time stays within a budget
(:data:`EXACT_BUDGET_S`); only larger spaces go to Optuna's TPE sampler.
"""

from __future__ import annotations
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
import numpy as np
from plexus_tune.errors import UserError
from plexus_tune.model.breakdown import BREAKDOWN_KEYS
from plexus_tune.model.prediction import predict_run_grids
from plexus_tune.model.grid import enumerate_grids, format_grid
from plexus_tune.search.space import Config, SearchSpace, divisors, objective_value


# --------------------------------------------------------------------------------------
# Evaluators: the model, or measurements


@dataclass
class Evaluation:
    """What one configuration costs: the predicted total (``total_ms``) and, when measured, the observed epoch (``epoch_ms``)."""

    total_ms: float
    memory_gib: float
    memory_excess_gib: float
    epoch_ms: float | None = None
    failure: str | None = None
    breakdown: dict = field(default_factory=dict)
    run_id: str | None = None

    @property
    def feasible(self) -> bool:
        return self.memory_excess_gib <= 0

    @property
    def time_ms(self) -> float | None:
        """The time the search optimizes: the observed epoch if measured, else the predicted total."""
        return self.epoch_ms if self.epoch_ms is not None else self.total_ms


class ModelEvaluator:
    """Predict configurations with the cost model (:func:`plexus_tune.model.prediction.predict_run_grids`).

    ``predict`` defaults to ``predict_run_grids`` (FP32, the Plexus 3D grid); pass another function with its signature to
    search a different model.
    """

    measured = False

    def __init__(self, workload, machine, predict: Callable | None = None):
        if predict is None:
            predict = predict_run_grids
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
        return self.predict_grids(grids, block)

    def predict_grids(self, grids: np.ndarray, block_rows: int | None = None) -> dict[str, np.ndarray]:
        """Vectorized predictions of a (K, 3) array of grids with one block size (None: unblocked)."""
        kwargs = {"block_rows": block_rows} if block_rows is not None else {}
        return self._predict(self.workload, self.machine, grids, **kwargs)

    def evaluate(self, config: Config) -> Evaluation:
        pred = self.predict_many([config])
        mem_gib = float(np.asarray(pred["memory_bytes"])[0]) / 2**30
        breakdown = {k: float(np.asarray(pred[k])[0]) for k in (*BREAKDOWN_KEYS, "overhead_ms") if k in pred}
        return Evaluation(
            total_ms=float(np.asarray(pred["total_ms"])[0]),
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
    total_ms, the breakdown columns, memory_gib, feasible and value (the objective).
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
        pred = evaluator.predict_grids(grids, b)
        part = {k: np.asarray(v) for k, v in pred.items() if np.ndim(v) == 1 and len(v) == len(grids)}
        part["gx"], part["gy"], part["gz"] = grids[:, 0], grids[:, 1], grids[:, 2]
        part["gpus"] = grids.prod(axis=1)
        part["block_rows"] = np.full(len(grids), b or 0, dtype=np.int64)
        parts.append(pd.DataFrame(part))
    frame = pd.concat(parts, ignore_index=True)
    frame["grid"] = [format_grid(g) for g in frame[["gx", "gy", "gz"]].to_numpy()]
    frame["total_ms"] = frame["total_ms"].astype(float)
    frame["feasible"] = frame["feasible"].astype(bool)  # the model's (memory within the usable bytes)
    frame["value"] = objective_value(frame["total_ms"].to_numpy(), frame["gpus"].to_numpy(), objective)
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


# --------------------------------------------------------------------------------------
# Exact search: enumerate the space when it is cheap

#: Seconds a model-driven search may spend enumerating its space exactly (the default
#: of ``plexus-tune search --exact-budget``); a larger space is searched with TPE.
EXACT_BUDGET_S = 5.0
#: Configurations timed to estimate the cost of enumerating a space (at least).
PROBE_CONFIGURATIONS = 4096


def grid_count(gpus: int) -> int:
    """Ordered grids Gx x Gy x Gz of G: sum over divisors d of G of the divisor count of G / d."""
    return sum(len(divisors(gpus // d)) for d in divisors(int(gpus)))


def block_choices(space: SearchSpace) -> int:
    """Block sizes of the space: unblocked plus every power of two in the block size range."""
    if space.block_rows_range is None:
        return 1
    lo, hi = space.block_rows_range
    return 1 + max(0, math.floor(math.log2(hi)) - math.ceil(math.log2(lo)) + 1)


#: GPU counts summed exactly by :func:`count_configurations`; beyond, the count is estimated
COUNTED_GPU_COUNTS = 100_000


def count_configurations(space: SearchSpace) -> int:
    """Configurations of ``space``: the grids of every G times the block choices. For more than
    :data:`COUNTED_GPU_COUNTS` counts an estimate: the count times the mean number of ordered
    3-factorizations of an integer up to G_max, ln^2(G)/2 + (3 gamma - 1) ln G + 1."""
    n = len(space.gpus)
    if n <= COUNTED_GPU_COUNTS:
        return sum(grid_count(g) for g in space.gpus) * block_choices(space)
    log_g = math.log(float(space.gpus[-1]))
    mean = log_g**2 / 2 + (3 * 0.5772156649 - 1) * log_g + 1
    return int(mean * n) * block_choices(space)


@dataclass(frozen=True)
class SearchPlan:
    """How a model-driven search runs: ``method`` is ``"exhaustive"`` or ``"tpe"``.

    ``estimated_s`` = ``configurations`` x the seconds per configuration measured on a
    probe of ``probe_configurations`` of them (the probe's own time when it is the whole
    space); ``budget_s`` the limit it was compared with.
    """

    method: str
    configurations: int
    estimated_s: float
    budget_s: float
    probe_configurations: int

    def describe(self) -> str:
        if self.method == "exhaustive":
            return (f"exhaustive: every one of {self.configurations:,} configurations predicted "
                    f"(estimated {self.estimated_s:.2f} s, within the {self.budget_s:g} s budget); the optimum is exact")
        why = ("exact enumeration disabled" if self.budget_s <= 0 else
               "far too many GPU counts to enumerate" if not math.isfinite(self.estimated_s) else
               f"enumerating would take about {self.estimated_s:.1f} s, over the {self.budget_s:g} s budget")
        return f"TPE: {self.configurations:,} configurations, {why}"


def plan_search(space: SearchSpace, evaluator: ModelEvaluator, budget_s: float = EXACT_BUDGET_S, *,
                probe: int = PROBE_CONFIGURATIONS) -> SearchPlan:
    """Enumerate (``"exhaustive"``) when predicting all of ``space`` is estimated to fit ``budget_s``.

    The estimate times :func:`exhaustive_frame` on GPU counts spread over the space
    until they hold at least ``probe`` configurations (all of them if fewer) and
    scales the time per configuration to the whole space. ``budget_s`` <= 0 always
    gives TPE.
    """
    total = count_configurations(space)
    if budget_s <= 0:
        return SearchPlan("tpe", total, math.nan, float(budget_s), 0)
    if len(space.gpus) > COUNTED_GPU_COUNTS:  # far beyond any budget: no probe over a huge range
        return SearchPlan("tpe", total, math.inf, float(budget_s), 0)
    counts = {g: grid_count(g) * block_choices(space) for g in space.gpus}
    chosen: list[int] = []
    held = 0
    order = np.random.default_rng(0).permutation(len(space.gpus))  # spread over the range
    for g in (space.gpus[i] for i in order):
        if held >= min(probe, total):
            break
        chosen.append(g)
        held += counts[g]
    sub = SearchSpace(tuple(sorted(chosen)), space.block_rows_range, space.encoding)
    exhaustive_frame(SearchSpace((min(chosen),), None, space.encoding), evaluator)  # warm-up: imports, caches
    start = time.perf_counter()
    exhaustive_frame(sub, evaluator)
    elapsed = time.perf_counter() - start
    estimated = elapsed * total / max(held, 1)
    method = "exhaustive" if estimated <= budget_s else "tpe"
    return SearchPlan(method, total, float(estimated), float(budget_s), held)


def exhaustive_search(space: SearchSpace, evaluator: ModelEvaluator, objective: str = "epoch"):
    """Every configuration of ``space`` ranked: feasible first, then by the objective ``value``
    (ties: fewer GPUs, then smaller gx, gy). Columns of :func:`exhaustive_frame` plus
    ``config`` (the configuration's label) and ``rank`` (1 = best)."""
    frame = exhaustive_frame(space, evaluator, objective)
    frame["config"] = frame["grid"].where(frame["block_rows"] <= 0, frame["grid"] + "/b" + frame["block_rows"].astype(str))  # Config.label
    frame = frame.sort_values(["feasible", "value", "gpus", "gx", "gy", "block_rows"],
                              ascending=[False, True, True, True, True, True], kind="stable").reset_index(drop=True)
    frame["rank"] = np.arange(1, len(frame) + 1)
    return frame
