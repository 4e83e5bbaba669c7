"""Search over grids (and GPU counts) with Optuna.

The search space is encoded with static distributions only, so that every trial of a
study samples the same parameters whatever the number of GPUs.

Encoding ``"sizes"`` (default): ``log2_gx``, ``log2_gy``, ``log2_gz`` (floats in
[0, log2 max G]) are the log sizes of the three axes; the trial's grid is an allowed
grid (its product one of the searched GPU counts) near that point, found with a k-d
tree over the log2 sizes of every allowed grid. The cost is smooth in the log sizes
(message sizes and shard shapes are ratios of N and D to the axis sizes), so
neighbouring points are neighbouring grids, and the GPU count is implied (product of
the sizes) instead of being a rugged axis of its own (a prime G has only 1D grids).
With ``snap_neighbours = k > 1`` the rounding is model-ranked: the k nearest allowed
grids are predicted (one vectorized call) and the best feasible one is the trial's
configuration. TPE then only has to find the right region of the continuous
relaxation; the model settles the integer details. Measured searches use k = 1 (the
nearest grid), so the measurement decides.

Encoding ``"uv"``: ``gpus_log2`` (float, only when several GPU counts are searched),
snapped to the allowed count nearest in log scale, and ``u``, ``v`` in [0, 1]: ``gx``
is the divisor of G nearest ``G**u`` in log scale, ``gy`` the divisor of ``G/gx``
nearest ``(G/gx)**v``, ``gz = G / (gx gy)`` (``u = 1/3, v = 1/2`` is the near-cubic
grid). Kept for comparison: across many G the divisor structure makes it rugged.

Blocked aggregation, when searched: ``blocked`` (bool) and ``block_rows_log2``
(float); ``2**round(block_rows_log2)`` rows per block, ignored when not blocked.

Several encodings map to one configuration; the objective caches results by
configuration (:class:`Config`), so a configuration is evaluated (or measured) once.

Objectives (minimized):

``epoch``
    epoch time in ms.
``gpu-hours``
    GPU-hours per 100 epochs: ``epoch_ms * G * 100 / 3.6e6``.

Memory feasibility is an Optuna constraint, ``memory_excess_gib`` = predicted bytes
per GPU minus the device memory, in GiB (feasible when <= 0): infeasible trials keep
their real objective value and are marked, TPE samples away from them, and
``study.best_trial`` ignores them.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from plexus_tune.errors import UserError

OBJECTIVES = ("epoch", "gpu-hours")
#: Epochs that the ``gpu-hours`` objective counts.
GPU_HOURS_EPOCHS = 100
MS_PER_HOUR = 3.6e6
DEFAULT_STORAGE_PATH = os.path.join("measurements", "studies.db")
CONSTRAINT_KEY = "memory_excess_gib"


# --------------------------------------------------------------------------------------
# Objectives and GPU counts


def check_objective(objective: str) -> str:
    """Return ``objective`` if known, else raise UserError listing the known ones."""
    if objective not in OBJECTIVES:
        raise UserError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    return objective


def objective_value(epoch_ms, gpus, objective: str):
    """The value minimized: ``epoch_ms`` or GPU-hours per 100 epochs (``epoch_ms G 100 / 3.6e6``)."""
    check_objective(objective)
    epoch_ms = np.asarray(epoch_ms, dtype=np.float64)
    if objective == "epoch":
        out = epoch_ms
    else:
        out = epoch_ms * np.asarray(gpus, dtype=np.float64) * GPU_HOURS_EPOCHS / MS_PER_HOUR
    return float(out) if out.ndim == 0 else out


def objective_unit(objective: str) -> str:
    check_objective(objective)
    return "ms" if objective == "epoch" else f"GPU-h/{GPU_HOURS_EPOCHS} epochs"


_RANGE_RE = re.compile(r"^\s*(\d+)\s*(?:\.\.|-|:)\s*(\d+)\s*(?::\s*(pow2|2\^k))?\s*$")


def parse_gpus(text: str | int | Sequence[int]) -> tuple[int, ...]:
    """Parse a GPU count, a range ``A..B`` (every integer), ``A..B:pow2`` or a list ``8,16,64``.

    Returns the sorted, distinct counts; UserError if the result is empty or invalid.
    """
    if isinstance(text, (int, np.integer)):
        values = [int(text)]
    elif isinstance(text, str):
        s = text.strip()
        m = _RANGE_RE.match(s)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if hi < lo:
                raise UserError(f"empty GPU range {text!r}: the upper end is below the lower end; write e.g. 8..4096")
            values = list(range(lo, hi + 1))
            if m.group(3):
                values = [g for g in values if g & (g - 1) == 0]
        else:
            try:
                values = [int(part) for part in s.split(",") if part.strip()]
            except ValueError:
                raise UserError(
                    f"cannot read GPU counts {text!r}; write a count (8), a range (8..4096, 8..4096:pow2) or a list (8,16,64)"
                ) from None
    else:
        values = [int(v) for v in text]
    values = sorted(set(values))
    if not values:
        raise UserError(f"no GPU count in {text!r}; write a count (8), a range (8..4096) or a list (8,16,64)")
    if values[0] < 1:
        raise UserError(f"GPU counts must be positive, got {values[0]} in {text!r}")
    return tuple(values)


# --------------------------------------------------------------------------------------
# Factorization encoding


@lru_cache(maxsize=8192)
def divisors(n: int) -> tuple[int, ...]:
    """All divisors of ``n`` in increasing order."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return tuple(small + large[::-1])


def nearest_divisor(n: int, target: float) -> int:
    """The divisor d of ``n`` minimizing |log d - log target| (the smaller on ties)."""
    divs = np.asarray(divisors(n), dtype=np.float64)
    dist = np.abs(np.log(divs) - math.log(max(target, 1e-300)))
    return int(divs[int(np.argmin(dist))])


def decode_grid(gpus: int, u: float, v: float) -> tuple[int, int, int]:
    """Map (u, v) in [0, 1]^2 to a grid of ``gpus``: gx ~ G**u, gy ~ (G/gx)**v, gz = rest."""
    gx = nearest_divisor(gpus, gpus ** float(u))
    rest = gpus // gx
    gy = nearest_divisor(rest, rest ** float(v))
    return gx, gy, rest // gy


def encode_grid(grid: Sequence[int]) -> tuple[float, float]:
    """A (u, v) that :func:`decode_grid` maps back to ``grid`` (used to enqueue trials)."""
    gx, gy, gz = (int(a) for a in grid)
    g = gx * gy * gz
    u = math.log(gx) / math.log(g) if g > 1 else 0.0
    rest = gy * gz
    v = math.log(gy) / math.log(rest) if rest > 1 else 0.0
    return min(max(u, 0.0), 1.0), min(max(v, 0.0), 1.0)


def snap_gpus(allowed: Sequence[int], log2_value: float) -> int:
    """The allowed GPU count nearest ``2**log2_value`` in log scale."""
    arr = np.asarray(allowed, dtype=np.float64)
    return int(arr[int(np.argmin(np.abs(np.log2(arr) - float(log2_value))))])


# --------------------------------------------------------------------------------------
# Configurations and the search space

SIZE_PARAMS = ("log2_gx", "log2_gy", "log2_gz")
_GRID_TABLES: dict = {}


@dataclass(frozen=True, order=True)
class Config:
    """One point of the search space: a grid (its product is G) and the block size (None = unblocked)."""

    gx: int
    gy: int
    gz: int
    block_rows: int | None = None

    @property
    def gpus(self) -> int:
        return self.gx * self.gy * self.gz

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.gx, self.gy, self.gz)

    @property
    def grid_label(self) -> str:
        return f"{self.gx}x{self.gy}x{self.gz}"

    @property
    def label(self) -> str:
        return self.grid_label + (f"/b{self.block_rows}" if self.block_rows else "")

    def as_dict(self) -> dict:
        return {"gpus": self.gpus, "gx": self.gx, "gy": self.gy, "gz": self.gz, "block_rows": self.block_rows}


ENCODINGS = ("sizes", "uv")


@dataclass(frozen=True)
class SearchSpace:
    """GPU counts to search, and the block sizes (``block_rows_range`` = (min, max), None = never blocked).

    ``encoding`` chooses how trial parameters map to grids (see the module docstring):
    ``"sizes"`` (default) samples log2 of each axis size and projects onto the nearest
    allowed grid; ``"uv"`` samples G and the split exponents (u, v).
    """

    gpus: tuple[int, ...]
    block_rows_range: tuple[int, int] | None = None
    encoding: str = "sizes"

    def __post_init__(self):
        if not self.gpus:
            raise UserError("the search space has no GPU count")
        if self.encoding not in ENCODINGS:
            raise UserError(f"unknown encoding {self.encoding!r}; choose one of {', '.join(ENCODINGS)}")
        if self.block_rows_range is not None:
            lo, hi = self.block_rows_range
            if lo < 1 or hi < lo:
                raise UserError(f"bad block size range {lo}..{hi}; write e.g. 1024..65536")

    # -- the allowed grids, for the "sizes" encoding
    def grid_table(self) -> np.ndarray:
        """Every allowed grid of every G, (K, 3) int64."""
        cached = _GRID_TABLES.get(self.gpus)
        if cached is None:
            from plexus_tune.grid import enumerate_grids

            grids = np.concatenate([np.asarray(enumerate_grids(g), dtype=np.int64).reshape(-1, 3) for g in self.gpus])
            from scipy.spatial import cKDTree

            cached = (grids, cKDTree(np.log2(grids.astype(np.float64))))
            _GRID_TABLES[self.gpus] = cached
        return cached[0]

    def nearest_grid(self, log2_sizes: Sequence[float]) -> tuple[int, int, int]:
        """The allowed grid nearest (Euclidean in log2 sizes) to ``log2_sizes`` (ties: lexicographically first)."""
        self.grid_table()
        grids, tree = _GRID_TABLES[self.gpus]
        _, idx = tree.query(np.asarray(log2_sizes, dtype=np.float64))
        return tuple(int(a) for a in grids[int(idx)])

    def nearest_grids(self, log2_sizes: Sequence[float], k: int) -> np.ndarray:
        """The ``k`` allowed grids nearest to ``log2_sizes`` (nearest first), (k, 3) int64."""
        grids = self.grid_table()
        tree = _GRID_TABLES[self.gpus][1]
        k = max(1, min(int(k), len(grids)))
        _, idx = tree.query(np.asarray(log2_sizes, dtype=np.float64), k=k)
        return grids[np.atleast_1d(idx)]

    @property
    def max_log2_size(self) -> float:
        return math.log2(self.gpus[-1])

    def suggest(self, trial) -> Config:
        """Sample a configuration with static distributions (see the module docstring)."""
        params = {}
        if self.encoding == "sizes":
            hi = max(self.max_log2_size, 1e-9)
            for name in SIZE_PARAMS:
                params[name] = trial.suggest_float(name, 0.0, hi)
        else:
            if len(self.gpus) > 1:
                params["gpus_log2"] = trial.suggest_float("gpus_log2", math.log2(self.gpus[0]), math.log2(self.gpus[-1]))
            params["u"] = trial.suggest_float("u", 0.0, 1.0)
            params["v"] = trial.suggest_float("v", 0.0, 1.0)
        if self.block_rows_range is not None:
            lo, hi = self.block_rows_range
            params["blocked"] = trial.suggest_categorical("blocked", [False, True])
            params["block_rows_log2"] = trial.suggest_float("block_rows_log2", math.log2(lo), math.log2(hi))
        return self.config_of_params(params)

    def params_of(self, config: Config) -> dict:
        """Trial parameters that :meth:`suggest` decodes to ``config`` (for ``enqueue_trial``)."""
        if self.encoding == "sizes":
            params = {name: math.log2(size) for name, size in zip(SIZE_PARAMS, config.grid)}
        else:
            u, v = encode_grid(config.grid)
            params = {"u": u, "v": v}
            if len(self.gpus) > 1:
                params["gpus_log2"] = math.log2(config.gpus)
        if self.block_rows_range is not None:
            params["blocked"] = config.block_rows is not None
            lo, hi = self.block_rows_range
            b = config.block_rows if config.block_rows is not None else lo
            params["block_rows_log2"] = min(max(math.log2(b), math.log2(lo)), math.log2(hi))
        return params

    def config_of_params(self, params: dict) -> Config | None:
        """The configuration that :meth:`suggest` decodes from ``params`` (None if incomplete)."""
        try:
            if self.encoding == "sizes":
                gx, gy, gz = self.nearest_grid([params[name] for name in SIZE_PARAMS])
            else:
                g = snap_gpus(self.gpus, params["gpus_log2"]) if len(self.gpus) > 1 else self.gpus[0]
                gx, gy, gz = decode_grid(g, params["u"], params["v"])
            block = None
            if self.block_rows_range is not None and params.get("blocked"):
                lo, hi = self.block_rows_range
                block = int(min(max(2 ** round(params["block_rows_log2"]), lo), hi))
        except (KeyError, TypeError, ValueError):
            return None
        return Config(gx, gy, gz, block)

    def configs(self, enumerate_grids: Callable[[int], np.ndarray] | None = None, block_sizes: Iterable[int] | None = None):
        """Every configuration (block sizes: powers of two in the range, plus unblocked)."""
        if enumerate_grids is None:
            from plexus_tune.grid import enumerate_grids
        blocks: list[int | None] = [None]
        if self.block_rows_range is not None:
            if block_sizes is None:
                lo, hi = self.block_rows_range
                block_sizes = [2**k for k in range(math.ceil(math.log2(lo)), math.floor(math.log2(hi)) + 1)]
            blocks += list(block_sizes)
        for g in self.gpus:
            for gx, gy, gz in np.asarray(enumerate_grids(g)).tolist():
                for b in blocks:
                    yield Config(int(gx), int(gy), int(gz), b)


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
    """Predict configurations with the cost model (``plexus_tune.costs.predict_grids``).

    ``predict`` defaults to ``predict_grids``; pass another function with its signature to
    search a different model.
    """

    measured = False

    def __init__(self, workload, machine, predict: Callable | None = None):
        if predict is None:
            from plexus_tune.costs import predict_grids as predict
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

    from plexus_tune.grid import enumerate_grids

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


# --------------------------------------------------------------------------------------
# Studies


def default_storage_url(directory: str = "measurements") -> str:
    """SQLite file ``<directory>/studies.db`` (the directory is created)."""
    os.makedirs(directory, exist_ok=True)
    return "sqlite:///" + os.path.abspath(os.path.join(directory, "studies.db"))


def open_storage(url: str | None = None, *, heartbeat_interval: int | None = 60, grace_period: int | None = 180):
    """An Optuna RDB storage for ``url`` (default: :func:`default_storage_url`).

    A heartbeat marks trials of killed processes as failed after ``grace_period`` s,
    so a resumed study does not wait on them. Any failure to reach the database is a
    UserError.
    """
    import optuna

    url = url or default_storage_url()
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        directory = os.path.dirname(path) or "."
        if path and not path.startswith(":memory:") and not os.path.isdir(directory):
            raise UserError(f"cannot open storage {url!r}: directory {directory!r} does not exist")
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            storage = optuna.storages.RDBStorage(
                url,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace_period,
                engine_kwargs={"pool_pre_ping": True},
            )
        if url.startswith("sqlite"):
            _sqlite_write_ahead_log(storage.engine)
        return storage
    except Exception as exc:  # noqa: BLE001 - driver errors vary; all mean "unreachable"
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"cannot open storage {url!r}: {reason}; check the URL (e.g. sqlite:///measurements/studies.db or postgresql://user@host/db)") from None


def _sqlite_write_ahead_log(engine) -> None:
    """SQLite in WAL mode with synchronous=NORMAL: a commit no longer waits for an fsync (an
    Optuna trial commits a dozen times), readers do not block the writer, and a killed
    process loses nothing it committed."""
    from sqlalchemy import event

    def pragmas(dbapi_connection, _record):
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    event.listen(engine, "connect", pragmas)
    engine.dispose()  # connections opened before the listener reconnect with it


def make_sampler(seed: int | None = None, n_startup_trials: int = 10):
    """Multivariate TPE (the axis sizes interact strongly: their product is G)."""
    import optuna

    return optuna.samplers.TPESampler(
        seed=seed,
        n_startup_trials=n_startup_trials,
        multivariate=True,
    )


def open_study(name: str, storage, *, objective: str, seed: int | None = None, attrs: dict | None = None, n_startup_trials: int = 10):
    """Create or resume (``load_if_exists``) a minimizing study; check a resumed study's objective."""
    import optuna

    check_objective(objective)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=name,
        storage=storage,
        sampler=make_sampler(seed, n_startup_trials),
        direction="minimize",
        load_if_exists=True,
    )
    old = study.user_attrs.get("objective")
    if old is not None and old != objective:
        raise UserError(f"study {name!r} optimizes {old!r}, not {objective!r}; use another --study name")
    study.set_user_attr("objective", objective)
    for key, value in (attrs or {}).items():
        study.set_user_attr(key, value)
    return study


def finished_trials(study):
    """Trials that count toward ``--trials``: complete ones and evaluated failures (a run that
    failed is a result); a trial failed because its process died (heartbeat) does not count."""
    import optuna

    state = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False, states=(state.COMPLETE, state.FAIL, state.PRUNED))
    return [t for t in trials if t.state != state.FAIL or "failure" in t.user_attrs]


def _config_of_attrs(attrs: dict) -> Config | None:
    try:
        b = attrs.get("block_rows")
        return Config(int(attrs["gx"]), int(attrs["gy"]), int(attrs["gz"]), int(b) if b else None)
    except (KeyError, TypeError, ValueError):
        return None


def _evaluation_of_attrs(attrs: dict) -> Evaluation | None:
    if "predicted_ms" not in attrs:
        return None
    return Evaluation(
        predicted_ms=float(attrs["predicted_ms"]),
        memory_gib=float(attrs.get("memory_gib", 0.0)),
        memory_excess_gib=float(attrs.get(CONSTRAINT_KEY, 0.0)),
        observed_ms=attrs.get("observed_ms"),
        failure=attrs.get("failure"),
        run_id=attrs.get("run_id"),
    )


class Objective:
    """The Optuna objective: decode, look up the cache, evaluate once per configuration.

    ``evaluator.evaluate(config) -> Evaluation``; with ``evaluator.measured`` the value is
    the observed time. The cache is seeded from the study's finished trials (so a
    resumed study measures nothing twice) and from ``known`` (e.g. logged runs).
    """

    def __init__(self, space: SearchSpace, evaluator, objective: str, *, study=None, known: dict | None = None,
                 snap_neighbours: int = 1, model: "ModelEvaluator | None" = None):
        self.space = space
        self.evaluator = evaluator
        self.objective = check_objective(objective)
        self.snap_neighbours = int(snap_neighbours)
        self.model = model if model is not None else (evaluator if isinstance(evaluator, ModelEvaluator) else None)
        self.model_evaluations = 0
        self.cache: dict[Config, tuple[Evaluation, int | None]] = {}
        self.evaluations = 0
        for cfg, ev in (known or {}).items():
            self.cache[cfg] = (ev, None)
        if study is not None:
            import optuna

            for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)):
                cfg, ev = _config_of_attrs(t.user_attrs), _evaluation_of_attrs(t.user_attrs)
                if cfg is not None and ev is not None and cfg not in self.cache:
                    self.cache[cfg] = (ev, t.number)

    def snap(self, trial, config: Config) -> Config:
        """Model-ranked rounding: the best predicted feasible grid among the ``snap_neighbours``
        allowed grids nearest to the sampled log2 sizes (the nearest grid when 1)."""
        if self.snap_neighbours <= 1 or self.model is None or self.space.encoding != "sizes":
            return config
        point = [trial.params[name] for name in SIZE_PARAMS]
        grids = self.space.nearest_grids(point, self.snap_neighbours)
        cands = [Config(int(x), int(y), int(z), config.block_rows) for x, y, z in grids.tolist()]
        pred = self.model.predict_many(cands)
        self.model_evaluations += len(cands)
        value = np.asarray(objective_value(np.asarray(pred["total_ms"], dtype=np.float64), grids.prod(axis=1), self.objective))
        mem_gib = np.asarray(pred["memory_bytes"], dtype=np.float64) / 2**30
        feasible = mem_gib <= self.model.device_memory_gib
        # feasible first, then by value; an all-infeasible neighbourhood gives its least excess
        order = np.lexsort((value, mem_gib, ~feasible)) if not feasible.any() else np.lexsort((value, ~feasible))
        return cands[int(order[0])]

    def __call__(self, trial) -> float:
        config = self.snap(trial, self.space.suggest(trial))
        for key, value in config.as_dict().items():
            trial.set_user_attr(key, value)
        trial.set_user_attr("config", config.label)
        if config in self.cache:
            ev, first = self.cache[config]
            trial.set_user_attr("duplicate_of", first if first is not None else "log")
        else:
            ev = self.evaluator.evaluate(config)
            self.evaluations += 1
            self.cache[config] = (ev, trial.number)
        trial.set_user_attr("predicted_ms", ev.predicted_ms)
        trial.set_user_attr("memory_gib", ev.memory_gib)
        trial.set_user_attr(CONSTRAINT_KEY, ev.memory_excess_gib)
        if ev.observed_ms is not None:
            trial.set_user_attr("observed_ms", ev.observed_ms)
        if ev.run_id is not None:
            trial.set_user_attr("run_id", ev.run_id)
        _set_constraint(trial, ev.memory_excess_gib)
        if ev.failure is not None or ev.epoch_ms is None:
            trial.set_user_attr("failure", ev.failure or "no time")
            return float("nan")  # Optuna marks the trial FAIL: failed runs are kept, not given fake values
        return objective_value(ev.epoch_ms, config.gpus, self.objective)


def _set_constraint(trial, value: float) -> None:
    if hasattr(trial, "set_constraint"):
        trial.set_constraint(CONSTRAINT_KEY, float(value))
    else:  # Optuna < 5: read back by constraints_of()
        trial.set_user_attr("_constraint", float(value))


def warm_start(study, space: SearchSpace, configs: Iterable[Config]) -> int:
    """Enqueue ``configs`` (skipping any already in the study); returns how many were new."""
    seen = set()
    for t in study.get_trials(deepcopy=False):
        cfg = _config_of_attrs(t.user_attrs)
        fixed = t.system_attrs.get("fixed_params") if cfg is None else None
        if fixed:  # queued but not run yet
            cfg = space.config_of_params(fixed)
        seen.add(cfg)
    n = 0
    for cfg in configs:
        if cfg in seen:
            continue
        study.enqueue_trial(space.params_of(cfg), skip_if_exists=True)
        seen.add(cfg)
        n += 1
    return n


def spread_starts(space: SearchSpace, n: int) -> list[Config]:
    """Model-free starting points: the most cubic grid of ``n`` GPU counts spread evenly in log scale.

    Enqueued first, they show TPE both ends of the G range (e.g. a feasible corner next
    to an infeasible one) before its random start-up trials.
    """
    if n <= 0:
        return []
    from plexus_tune.grid import enumerate_grids

    gpus = np.asarray(space.gpus, dtype=np.float64)
    targets = np.geomspace(gpus[0], gpus[-1], n) if n > 1 else np.array([math.sqrt(gpus[0] * gpus[-1])])
    out: list[Config] = []
    for t in targets:
        g = int(gpus[int(np.argmin(np.abs(np.log(gpus) - math.log(t))))])
        logs = np.log2(np.asarray(enumerate_grids(g), dtype=np.float64))
        spread = ((logs - logs.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)
        gx, gy, gz = (int(2 ** a + 0.5) for a in logs[int(np.argmin(spread))])
        cfg = Config(gx, gy, gz)
        if cfg not in out:
            out.append(cfg)
    return out


def run_search(study, objective: Objective, n_trials_total: int, *, callbacks=None, show_progress: bool = False) -> int:
    """Run trials until the study holds ``n_trials_total`` finished ones; returns how many ran now."""
    import optuna

    remaining = max(0, int(n_trials_total) - len(finished_trials(study)))
    if remaining:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study.optimize(objective, n_trials=remaining, callbacks=callbacks, show_progress_bar=show_progress, catch=())
    return remaining


def trials_frame(study):
    """One row per trial: number, state, config columns, value, predicted/observed ms, feasible, duplicate_of."""
    import pandas as pd

    rows = []
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        excess = a.get(CONSTRAINT_KEY)
        rows.append(
            {
                "number": t.number,
                "state": t.state.name,
                "config": a.get("config"),
                "gpus": a.get("gpus"),
                "gx": a.get("gx"),
                "gy": a.get("gy"),
                "gz": a.get("gz"),
                "block_rows": a.get("block_rows"),
                "value": t.value,
                "predicted_ms": a.get("predicted_ms"),
                "observed_ms": a.get("observed_ms"),
                "memory_gib": a.get("memory_gib"),
                "feasible": None if excess is None else bool(excess <= 0),
                "duplicate_of": a.get("duplicate_of"),
                "run_id": a.get("run_id"),
            }
        )
    return pd.DataFrame(rows)


def best_configs(study, k: int = 5):
    """The k best distinct feasible configurations of a study (DataFrame, best first)."""
    frame = trials_frame(study)
    if frame.empty:
        return frame
    ok = frame[(frame["state"] == "COMPLETE") & (frame["feasible"].fillna(True).astype(bool))]
    ok = ok.sort_values(["value", "number"]).drop_duplicates("config")
    return ok.head(k).reset_index(drop=True)


def trials_to_reach(values: Sequence[float], target: float, rel_tol: float = 0.01, feasible: Sequence[bool] | None = None) -> int | None:
    """1-based index of the first trial whose value is within ``rel_tol`` of ``target`` (None if never)."""
    for i, val in enumerate(values):
        if val is None or not np.isfinite(val):
            continue
        if feasible is not None and not feasible[i]:
            continue
        if val <= target * (1.0 + rel_tol):
            return i + 1
    return None


def default_study_name(dataset: str, machine: str, gpus: Sequence[int], objective: str, measured: bool, block_rows_range=None) -> str:
    g = f"G{gpus[0]}" if len(gpus) == 1 else f"G{gpus[0]}-{gpus[-1]}n{len(gpus)}"
    b = f"-b{block_rows_range[0]}-{block_rows_range[1]}" if block_rows_range else ""
    return f"{dataset}-{machine}-{g}{b}-{objective}-{'measured' if measured else 'model'}"


# --------------------------------------------------------------------------------------
# Measured search: the bundled trainer evaluates, the run log remembers


def graph_workload(graph: str, *, layers: int = 3, hidden: int = 128):
    """(stats, workload) of a graph file or synthetic spec, as the measurement campaigns see it."""
    from plexus_tune.measure import load_stats, workload_of

    stats = load_stats(graph)
    return stats, workload_of(stats, layers, hidden)


def _same_run(record: dict, source: str, layers: int, hidden: int, epochs: int, warmup: int, block_rows) -> bool:
    opts = record.get("options") or {}
    return (
        record.get("graph_source") == source
        and int(record.get("layers", -1)) == layers
        and int(record.get("hidden", -1)) == hidden
        and int(record.get("epochs", -1)) == epochs
        and int(record.get("warmup", -1)) == warmup
        and (opts.get("block_rows") or None) == (block_rows or None)
        and not opts.get("overlap")
    )


def known_runs(log_path, graph: str, model: ModelEvaluator, *, layers: int, hidden: int, epochs: int = 10, warmup: int = 2) -> dict:
    """Logged runs of ``graph`` with these settings, by configuration (mean epoch over trials).

    A configuration whose logged runs all failed maps to a failed Evaluation, so a
    search does not train it again.
    """
    from plexus_tune.measure import graph_source_text
    from plexus_tune.store import read_records

    if not log_path or not os.path.exists(log_path):
        return {}
    source = graph_source_text(graph)[0]
    records, _ = read_records(log_path, schema="plexus-tune/run-v1")
    groups: dict[Config, list[dict]] = {}
    for r in records:
        try:
            cfg = Config(int(r["gx"]), int(r["gy"]), int(r["gz"]), (r.get("options") or {}).get("block_rows") or None)
        except (KeyError, TypeError, ValueError):
            continue
        if _same_run(r, source, layers, hidden, epochs, warmup, cfg.block_rows):
            groups.setdefault(cfg, []).append(r)
    out = {}
    for cfg, recs in groups.items():
        base = model.evaluate(cfg)
        ok = [r for r in recs if r.get("status", "ok") == "ok" and r.get("epoch_ms") is not None]
        if ok:
            base.observed_ms = float(np.median([r["epoch_ms"] for r in ok]))  # median over trials
            base.run_id = str(ok[-1].get("timestamp"))
        else:
            base.failure = f"{recs[-1].get('status')}: {recs[-1].get('reason', '')}"[:200]
        out[cfg] = base
    return out


class MeasuredEvaluator:
    """Train a configuration with the bundled trainer (one logged run), predicted by ``model`` too.

    Configurations the model predicts do not fit in memory are not trained: they are
    marked infeasible with their predicted time. Runs go through
    :func:`plexus_tune.measure.run_campaign`, so they are logged with the prediction.
    """

    measured = True

    def __init__(self, model: ModelEvaluator, graph: str, *, stats=None, layers: int = 3, hidden: int = 128,
                 epochs: int = 10, warmup: int = 2, backend: str = "gloo", timeout_s: float = 600.0,
                 log_path: str = os.path.join("measurements", "runs.jsonl"), train_options: dict | None = None):
        self.model = model
        self.graph = graph
        self.stats = stats
        self.layers, self.hidden, self.epochs, self.warmup = layers, hidden, epochs, warmup
        self.log_path = log_path
        self.options = {"backend": backend, "timeout_s": float(timeout_s), **(train_options or {})}
        self.runs = 0

    def evaluate(self, config: Config) -> Evaluation:
        from plexus_tune.measure import run_campaign

        ev = self.model.evaluate(config)
        if not ev.feasible:
            return ev
        directory = os.path.dirname(self.log_path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        options = dict(self.options)
        if config.block_rows:
            options["block_rows"] = int(config.block_rows)
        new = run_campaign(self.graph, config.gpus, [config.grid], log=self.log_path, trials=1, epochs=self.epochs,
                           warmup=self.warmup, layers=self.layers, hidden=self.hidden, machine=self.model.machine,
                           stats=self.stats, train_options=options)
        self.runs += len(new)
        if not new:  # logged meanwhile (another worker): read it back
            known = known_runs(self.log_path, self.graph, self.model, layers=self.layers, hidden=self.hidden,
                               epochs=self.epochs, warmup=self.warmup)
            return known.get(config, Evaluation(ev.predicted_ms, ev.memory_gib, ev.memory_excess_gib, failure="no run logged"))
        record = new[-1]
        ev.run_id = str(record.get("timestamp"))
        if record.get("status", "ok") == "ok" and record.get("epoch_ms") is not None:
            ev.observed_ms = float(record["epoch_ms"])
            ev.breakdown = {k: float(v) for k, v in record.items() if k.endswith("_ms") and isinstance(v, (int, float))}
        else:
            ev.failure = f"{record.get('status')}: {record.get('reason', '')}"[:200]
        return ev
