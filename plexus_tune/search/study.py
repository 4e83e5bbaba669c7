"""Optuna studies: storage, samplers, objectives, warm starts and trial tables."""

from __future__ import annotations
import math
import os
import time
from pathlib import Path
from collections.abc import Iterable, Sequence
import numpy as np
from plexus_tune.errors import UserError, signals_deferred
from plexus_tune.model.grid import enumerate_grids
from plexus_tune.measure.records import upgrade_trial_attrs
from plexus_tune.paths import check_creatable, default_studies_path
from plexus_tune.search.evaluate import Evaluation, ModelEvaluator
from plexus_tune.search.space import CONSTRAINT_KEY, SIZE_PARAMS, Config, SearchSpace, check_objective, objective_value, snap_gpus


# --------------------------------------------------------------------------------------
# Studies


def default_storage_url(directory: str | None = None) -> str:
    """SQLite file ``<directory>/studies.db``, by default in the per-user data directory
    (:func:`plexus_tune.paths.data_dir`); the directory is created by :func:`open_storage`, when a
    study is written (an exhaustive search, which writes none, leaves no directory)."""
    path = default_studies_path() if directory is None else os.path.join(directory, "studies.db")
    return "sqlite:///" + os.path.abspath(path)


def open_storage(url: str | None = None, *, heartbeat_interval: int | None = 60, grace_period: int | None = 180,
                 create: bool = True):
    """An Optuna RDB storage for ``url`` (default: :func:`default_storage_url`).

    ``create=False`` (a reader such as ``plot history``): a SQLite file that does not exist
    is a UserError, not a new empty database.

    A heartbeat marks trials of killed processes as failed after ``grace_period`` s,
    so a resumed study does not wait on them. Any failure to reach the database is a
    UserError.
    """
    import optuna

    if not url and not create:  # a reader: no data directory made
        url = "sqlite:///" + os.path.abspath(default_studies_path())
    url = url or default_storage_url()
    if url in ("sqlite://", "sqlite:///:memory:"):  # SQLite in memory: one connection per thread would see
        return optuna.storages.InMemoryStorage()  # a database of its own; Optuna's own in-memory storage
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        directory = os.path.dirname(path) or "."
        if not create and path and not path.startswith(":memory:") and not os.path.exists(path):
            raise UserError(f"study storage {path} does not exist: no search saved a study there; give the storage a search used")
        if path and not path.startswith(":memory:") and not os.path.isdir(directory):
            check_creatable(Path(path))  # a missing directory is created, as for every output
            os.makedirs(directory, exist_ok=True)
        if os.path.isdir(path):
            raise UserError(f"cannot open storage {url!r}: {path} is a directory; name a database file in it")
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


def load_study(name: str, url: str | None = None):
    """An existing study to read (``plot history``, ``plot importances``): no database is
    created and no heartbeat started; UserError naming the studies the storage holds."""
    import optuna

    storage = open_storage(url, heartbeat_interval=None, grace_period=None, create=False)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        raise UserError(f"no study {name!r} in the storage; it holds {', '.join(names) or 'none'}") from None


def open_study(name: str, storage, *, objective: str, seed: int | None = None, attrs: dict | None = None, n_startup_trials: int = 10):
    """Create or resume (``load_if_exists``) a minimizing study; check a resumed study's objective."""
    import optuna

    check_objective(objective)
    study = optuna.create_study(
        study_name=name,
        storage=storage,
        sampler=make_sampler(seed, n_startup_trials),
        direction="minimize",
        load_if_exists=True,
    )
    old = study.user_attrs.get("objective")
    if old is not None and old != objective:
        raise UserError(f"study {name!r} optimizes {old!r}, not {objective!r}; use another study name", parameter="study")
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
    attrs = upgrade_trial_attrs(attrs)
    if "total_ms" not in attrs:
        return None
    return Evaluation(
        total_ms=float(attrs["total_ms"]),
        memory_gib=float(attrs.get("memory_gib", 0.0)),
        memory_excess_gib=float(attrs.get(CONSTRAINT_KEY, 0.0)),
        epoch_ms=attrs.get("epoch_ms"),
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
        self.study = study
        self.claim_poll_s = 2.0
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
        if config not in self.cache and self.study is not None and getattr(self.evaluator, "measured", False):
            found = self._from_other_workers(trial, config)
            if found is not None:
                self.cache[config] = found
        if config in self.cache:
            ev, first = self.cache[config]
            trial.set_user_attr("duplicate_of", first if first is not None else "log")
        else:
            ev = self.evaluator.evaluate(config)
            self.evaluations += 1
            self.cache[config] = (ev, trial.number)
        trial.set_user_attr("total_ms", ev.total_ms)
        trial.set_user_attr("memory_gib", ev.memory_gib)
        trial.set_user_attr(CONSTRAINT_KEY, ev.memory_excess_gib)
        if ev.epoch_ms is not None:
            trial.set_user_attr("epoch_ms", ev.epoch_ms)
        if ev.run_id is not None:
            trial.set_user_attr("run_id", ev.run_id)
        _set_constraint(trial, ev.memory_excess_gib)
        if ev.failure is not None or ev.time_ms is None:
            trial.set_user_attr("failure", ev.failure or "no time")
            return float("nan")  # Optuna marks the trial FAIL: failed runs are kept, not given fake values
        return objective_value(ev.time_ms, config.gpus, self.objective)


    def _from_other_workers(self, trial, config: Config):
        """(evaluation, trial number) of ``config`` from another worker of a shared study, or None.

        A trial names its configuration (user attribute ``config``) before it measures it,
        so workers sharing the study see who measures what: a finished trial's evaluation is
        reused; a configuration an older trial is measuring now is waited for (the older one
        measures, so two workers that picked it at once do not both wait), and so is an older
        running trial that has not named its configuration yet. A worker that died
        leaves its trial RUNNING until the heartbeat marks it failed; then this one measures.
        """
        import optuna

        state = optuna.trial.TrialState
        while True:
            waiting = False
            for t in self.study.get_trials(deepcopy=False):
                if t.number == trial.number:
                    continue
                label = t.user_attrs.get("config")
                if label is None and t.state == state.RUNNING and t.number < trial.number:
                    waiting = True  # an older trial not named yet may be about to measure this configuration
                if label != config.label:
                    continue
                ev = _evaluation_of_attrs(t.user_attrs)
                if t.state in (state.COMPLETE, state.FAIL) and ev is not None:
                    return ev, t.number
                if t.state == state.RUNNING and t.number < trial.number and ev is None:
                    waiting = True
            if not waiting:
                return None
            time.sleep(self.claim_poll_s)


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

    first, last = float(space.gpus[0]), float(space.gpus[-1])
    targets = np.geomspace(first, last, n) if n > 1 else np.array([math.sqrt(first * last)])
    out: list[Config] = []
    for t in targets:
        g = snap_gpus(space.gpus, math.log2(t))  # a range of counts is not materialised
        logs = np.log2(np.asarray(enumerate_grids(g), dtype=np.float64))
        spread = ((logs - logs.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)
        gx, gy, gz = (int(2 ** a + 0.5) for a in logs[int(np.argmin(spread))])
        cfg = Config(gx, gy, gz)
        if cfg not in out:
            out.append(cfg)
    return out


def _no_interrupt_traceback(record) -> bool:
    """A logging filter: drop Optuna's report of a trial that Ctrl-C or SIGTERM stopped (a
    traceback, then "failed with value None"); the command says it was interrupted."""
    text = record.getMessage()
    return not ((record.exc_info and not isinstance(record.exc_info[1], Exception))
                or "KeyboardInterrupt" in text or "Terminated" in text
                or (text.endswith("failed with value None.") and record.levelname == "WARNING"))


def run_search(study, objective: Objective, n_trials_total: int, *, callbacks=None, show_progress: bool = False) -> int:
    """Run trials until the study holds ``n_trials_total`` finished ones; returns how many ran now.

    Workers sharing the study stop together: each stops once the study holds the total
    (a trial still running elsewhere then finishes beyond it).
    """
    import optuna

    remaining = max(0, int(n_trials_total) - len(finished_trials(study)))
    if remaining:
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        for handler in optuna.logging.get_logger("optuna").handlers:  # records of its child loggers pass here
            handler.addFilter(_no_interrupt_traceback)
        states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED)
        stop = optuna.study.MaxTrialsCallback(int(n_trials_total), states=states)
        before = {t.number for t in study.get_trials(deepcopy=False, states=states)}
        # Ctrl-C reaches a trial's objective only: Optuna's bookkeeping between trials (a heartbeat
        # thread started, a trial told) is not cut in half, which could leave its thread running
        with signals_deferred() as held:
            study.optimize(held.releasing(objective), n_trials=remaining, callbacks=[*(callbacks or []), stop],
                           show_progress_bar=show_progress, catch=())
        remaining = sum(1 for t in study.get_trials(deepcopy=False) if t.number not in before
                        and t.state in states)
    return remaining


def trials_frame(study):
    """One row per trial: number, state, config columns, value, predicted/observed ms, feasible, duplicate_of."""
    import pandas as pd

    rows = []
    for t in study.get_trials(deepcopy=False):
        a = upgrade_trial_attrs(t.user_attrs)
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
                "total_ms": a.get("total_ms"),
                "epoch_ms": a.get("epoch_ms"),
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
