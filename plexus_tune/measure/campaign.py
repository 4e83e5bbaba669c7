"""Measurement campaigns: run the bundled trainer on a list of grids and log every run.

A campaign trains one graph on G ranks for each chosen grid, ``trials`` times, and
appends one run record per trial (:class:`plexus_tune.measure.records.RunRecord`) to a
log, successes and failures alike. Each record carries the cost model's prediction for
its grid (``predicted``: the breakdown and ``total_ms``) when a machine profile is
given, and ``trial``.

Trials are interleaved: every grid's trial 0 runs (in a random order) before any
grid's trial 1, each trial in a fresh order, so that a slow spell of the host lands on
one trial of several grids rather than on every trial of one grid (compare the median
over trials; :func:`plexus_tune.measure.table.runs_table`).

Campaigns are resumable: a (run identity, trial) already in the log is skipped (failed
runs too, unless ``retry_failed``; everything with ``redo``). The identity is
:func:`plexus_tune.measure.identity.run_identity` (docs/records.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from plexus_tune import graph as graph_pkg
from plexus_tune.errors import UserError
from plexus_tune.graph.generators import parse_spec
from plexus_tune.graph.shards import check_shard_files
from plexus_tune.launch import RankFailure, dispatch
from plexus_tune.launch.launchers import Launcher
from plexus_tune.measure.placement import placement_fields
from plexus_tune.measure.identity import RunIdentity, RunSpec, run_identity, run_setting, training_fields
from plexus_tune.measure.store import RUN_LOG, append_records, check_log, read_records, read_runs
from plexus_tune.measure.table import runs_table
from plexus_tune.model.costs import rank_order
from plexus_tune.model.grid import format_grid, parse_grid
from plexus_tune.model.machine import load_machine
from plexus_tune.model.family import DEFAULT_FAMILY, GraphContext, families_choosing, family_of
from plexus_tune.model.prediction import predict_run_grids
from plexus_tune.model.workload import Workload
from plexus_tune.trainer import TrainConfig
from plexus_tune.trainer.algorithms import normalize_config, process_grid
from plexus_tune.trainer.run import graph_source, validate
from plexus_tune.measure.training import base_record, build_record, config_fields, run_training


@dataclass(frozen=True)
class GraphStats:
    """What the cost model needs of a graph: N, NNZ (normalized, with self-loops), F, classes, and ``context``
    (a :class:`~plexus_tune.model.family.GraphContext` of its pattern, for the families whose model reads the
    graph: :meth:`plexus_tune.measure.identity.RunSpec.predict`'s ``graph``; None where not loaded)."""

    name: str
    source: str
    nodes: int
    nnz: int
    features: int
    classes: int
    context: GraphContext | None = field(default=None, compare=False, repr=False)


def graph_source_text(graph: str) -> tuple[str, str | None, str | None]:
    """(source description as the trainer logs it, graph path or None, synthetic spec or None)."""
    if os.path.exists(graph):
        return str(graph), str(graph), None
    if ":" not in graph:
        raise UserError(f"graph {graph!r} is neither an existing file nor a synthetic spec like rmat:nodes=4096,edges=65536")

    parse_spec(graph)  # a malformed spec fails here, not once in every rank of every run
    return f"synthetic:{graph}", None, graph


def load_graph_source(graph: str, *, pattern_only: bool | str = False):
    """The Graph of a graph file or a synthetic spec, loaded (or generated) in this process.

    This is the check that a graph file is readable before any rank starts: a truncated or
    corrupt file raises UserError here, once, instead of failing in every rank.
    ``pattern_only``: the caller reads the adjacency's pattern alone (``predict``), so a
    plexus graph's values, features and labels are not checked entry by entry.
    """
    _, path, spec = graph_source_text(graph)
    return graph_pkg.resolve_graph(path if spec is None else ("synthetic", spec), pattern_only=pattern_only)


def check_graph(graph: str) -> None:
    """Check a graph file, shard directory or spec before any rank starts (UserError if unusable).

    A file is read once (:func:`load_graph_source`); a shard directory's manifest is read and
    every block file checked for presence and size (ranks verify the checksums); a spec is
    parsed.
    """
    _, path, _ = graph_source_text(graph)
    if path is None:
        return
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "manifest.json")):
        check_shard_files(path)
        return
    load_graph_source(graph)


def load_stats(graph: str) -> GraphStats:
    """Load (or generate) the graph once to learn its statistics; its pattern (not its features) is kept as the
    statistics' ``context``, so the runs' predictions read the graph as ``predict --graph`` does without loading
    it again."""
    source, _, _ = graph_source_text(graph)
    g = load_graph_source(graph)
    nnz = int(graph_pkg.gcn_normalize(g.adjacency).nnz)
    pattern = replace(g, features=np.zeros((g.num_nodes, 0), dtype=np.float32))  # the features are not read
    return GraphStats(name=g.name, source=source, nodes=g.num_nodes, nnz=nnz, features=g.num_features,
                      classes=int(g.num_classes), context=GraphContext(pattern))


def workload_of(stats: GraphStats, layers: int, hidden: int):
    return Workload.from_graph_stats(stats.name, stats.nodes, stats.nnz, stats.features, stats.classes, layers, hidden)


def choose_grids(gpus: int, spec: str, *, workload=None, machine=None, settings: dict | None = None,
                 replication: int | None = None) -> list[tuple[int, int, int]]:
    """Grids of a campaign: ``all``, ``top:K`` (best K predicted by ``machine`` at ``settings``, the
    runs' :meth:`~plexus_tune.measure.identity.RunSpec.ranking_settings`) or a list ``2x2x2,1x4x2``.

    The grids are the process grids of ``settings["algorithm"]`` (default plexus-3d):
    every configuration of the family on ``gpus`` ranks (:meth:`plexus_tune.model.family.Family.configurations`);
    ``replication`` keeps the grid of that replication factor (cagnet-1.5d's c).
    """
    if spec is not None and not str(spec).strip():
        raise UserError("no grids given (an empty list); write all, top:K or a list such as 2x2x2,1x4x2", parameter="grids")
    spec = (spec or "all").strip()
    algorithm = (settings or {}).get("algorithm") or DEFAULT_FAMILY
    family = family_of(algorithm)
    fixed = {k: v for k, v in ((settings or {}).get("options") or {}).items() if k in family.choices}
    grids = [tuple(int(v) for v in g) for g in family.configurations(gpus, **fixed)]
    ranks = gpus // int(fixed.get("dp") or 1)  # a grid's ranks: one data-parallel group's
    if replication is not None:
        if "replication" not in family.choices:
            raise UserError(f"the replication factor is an option of {', '.join(families_choosing('replication'))}, "
                            f"not of {algorithm}", parameter="replication")
        grids = [process_grid(algorithm, gpus=gpus, replication=replication)]
    if spec == "all":
        return grids
    if spec.startswith("top:"):
        try:
            k = int(spec[4:])
        except ValueError:
            raise UserError(f"bad grids {spec!r}; write top:K with K a positive integer", parameter="grids") from None
        if k < 1:
            raise UserError(f"bad grids {spec!r}; K must be at least 1", parameter="grids")
        if machine is None or workload is None:
            raise UserError("grids top:K need a machine profile to rank the grids", parameter="machine")

        pred = predict_run_grids(workload, machine, np.array(grids), **dict(settings or {}))
        return [grids[i] for i in rank_order(pred)[:k]]
    out = []
    for text in spec.split(","):
        grid = tuple(int(v) for v in parse_grid(text.strip()))
        if int(np.prod(grid)) != ranks:
            raise UserError(f"grid {text.strip()} has {int(np.prod(grid))} ranks, not "
                            + (f"the GPU count {gpus}" if ranks == gpus
                               else f"{ranks} (the GPU count {gpus} over {gpus // ranks} data-parallel groups)"),
                            parameter="grids")
        if grid not in grids:
            raise UserError(f"grid {text.strip()} is not a configuration of {algorithm} on {gpus} GPUs; "
                            f"choose from {', '.join('x'.join(map(str, g)) for g in grids)}", parameter="grids")
        out.append(grid)
    return out


def campaign_config(graph: str, grid, *, layers: int, hidden: int, epochs: int, warmup: int,
                    options: dict | None = None):
    """The trainer configuration a campaign runs for one grid (``options``: further TrainConfig fields).

    The record names the machine it ran on by the host name unless ``options`` has
    ``machine``; the profile that predicts the runs is not the machine they run on (it
    is logged as ``predicted.machine``).
    """
    _, path, spec = graph_source_text(graph)
    return TrainConfig(grid=tuple(int(g) for g in grid), graph=path, synthetic=spec, layers=layers, hidden=hidden,
                       epochs=epochs, warmup=warmup, **dict(options or {}))


def config_identity(config) -> RunIdentity:
    """The run identity a configuration's record will have (its launcher and cluster included)."""
    return RunSpec.from_config(config).identity()


def config_settings(config) -> dict:
    """The prediction settings of a configuration's runs (:meth:`~plexus_tune.measure.identity.RunSpec.prediction_settings`)."""
    return RunSpec.from_config(config).prediction_settings()


def logged_trials(log) -> dict[tuple[RunIdentity, int], str]:
    """(identity, trial) -> status of the runs in a log (the last record of each wins)."""
    done: dict[tuple[RunIdentity, int], str] = {}
    if log is not None and os.path.exists(log):
        records, _ = read_records(log, schema="run")
        for r in records:
            done[(run_identity(r), int(r.get("trial") or 0))] = r.get("status", "ok")
    return done


def next_trial(log, identity: RunIdentity) -> int:
    """The first trial index of ``identity`` not yet in ``log``: a new run continues the logged ones."""
    logged = {t for (ident, t) in logged_trials(log) if ident == identity}
    trial = 0
    while trial in logged:
        trial += 1
    return trial


def launcher_options(train_options: dict | None, launcher) -> dict:
    """``train_options`` with the launcher's name, cluster and machine (when it names one)."""
    options = dict(train_options or {})
    if launcher is not None:
        options.update(launcher=launcher.name, cluster=launcher.cluster())
        if not options.get("machine") and launcher.machine_name():
            options["machine"] = launcher.machine_name()
    return options


@dataclass(frozen=True)
class Campaign:
    """What a campaign trains: ``graph`` on ``gpus`` ranks, each of ``grids`` ``trials`` times,
    logged to ``log`` (``train_options``: further :class:`~plexus_tune.trainer.TrainConfig`
    fields). Logged runs are skipped, failed ones too unless ``retry_failed``; ``redo``
    trains everything again. ``batch`` > 1 trains that many runs in one process set.
    ``spec``: the runs' :class:`~plexus_tune.measure.identity.RunSpec` (on any of the grids) where the
    caller built it (the command line, from the same settings); else :meth:`run_spec` makes it once
    from the fields above. Each grid's run is that spec :meth:`~RunSpec.with_grid` and
    :meth:`~RunSpec.with_launcher`."""

    graph: str
    gpus: int
    grids: tuple[tuple[int, int, int], ...]
    log: str | None = None
    trials: int = 3
    epochs: int = 10
    warmup: int = 2
    layers: int = 3
    hidden: int = 128
    train_options: Mapping = field(default_factory=dict)
    redo: bool = False
    retry_failed: bool = False
    batch: int = 1
    spec: RunSpec | None = None

    def __post_init__(self):
        grids = tuple(tuple(int(v) for v in g) for g in self.grids)
        if not grids:
            raise UserError("a campaign needs at least one grid", parameter="grids")
        for name in ("gpus", "trials", "epochs", "layers", "hidden", "batch"):
            if int(getattr(self, name)) < 1:
                raise UserError(f"{name} must be at least 1, not {getattr(self, name)}", parameter=name)
        if not 0 <= self.warmup < self.epochs:
            raise UserError(f"need 0 <= warmup < epochs, got warmup {self.warmup}, epochs {self.epochs}",
                            parameter=("warmup", "epochs"))
        if self.redo and self.retry_failed:
            raise UserError("redo already trains the failed runs again; give redo or retry_failed, not both",
                            parameter=("redo", "retry_failed"))
        object.__setattr__(self, "grids", grids)
        object.__setattr__(self, "train_options", dict(self.train_options or {}))
        object.__setattr__(self, "log", None if self.log is None else os.fspath(self.log))

    def run_spec(self, grid=None, launcher=None) -> RunSpec:
        """The spec of one grid's runs (default the first), with the launcher's name, cluster and machine:
        :attr:`spec`, else the spec of :func:`campaign_config` (its family's settings filled in once)."""
        grid = self.grids[0] if grid is None else tuple(int(g) for g in grid)
        if self.spec is not None:
            return self.spec.with_grid(grid).with_launcher(launcher)
        return RunSpec.from_config(campaign_config(self.graph, grid, layers=self.layers, hidden=self.hidden,
                                                   epochs=self.epochs, warmup=self.warmup,
                                                   options=launcher_options(self.train_options, launcher)))

    def training(self) -> dict:
        """The trainer settings of :attr:`train_options` that are no part of a run's spec (timeout, seed, ...:
        :data:`~plexus_tune.measure.identity.TRAINING_FIELDS`)."""
        return training_fields(self.train_options)

    def config(self, grid, launcher=None):
        """The trainer configuration of one grid's runs: :meth:`~plexus_tune.measure.identity.RunSpec.train_config`
        of :meth:`run_spec` with :meth:`training`."""
        return self.run_spec(grid, launcher).train_config(**self.training())

    def runs(self) -> int:
        return len(self.grids) * self.trials


def pending_runs(campaign: Campaign, *, on_skip: Callable[[tuple, int], None] | None = None,
                 launcher=None) -> list[tuple[tuple, int, object, RunSpec]]:
    """(grid, trial, config, spec) of every run a campaign still has to make, trials interleaved.

    A (identity, trial) in the log is done, a failure too (unless ``retry_failed``), except
    a cancelled run (stopped from outside: it measured nothing); ``redo`` makes them all
    again. ``launcher`` (checked against every grid) adds its name, cluster and machine to
    the identity. ``spec`` is the run's :class:`~plexus_tune.measure.identity.RunSpec`, made once per grid.
    """
    grids = campaign.grids
    if launcher is not None:
        for grid in grids:
            launcher.check(int(np.prod(grid)) * int(campaign.train_options.get("dp") or 1))  # dp groups of the grid
    done = logged_trials(campaign.log)
    first = campaign.run_spec(grids[0], launcher)  # made once; the other grids' are it on their grid
    specs = {grid: first.with_grid(grid) for grid in grids}
    configs = {grid: spec.train_config(**campaign.training()) for grid, spec in specs.items()}
    pending = []
    for trial in range(campaign.trials):
        for g in np.random.default_rng([trial, len(grids)]).permutation(len(grids)):
            grid = grids[int(g)]
            status = done.get((specs[grid].identity(), trial))
            if status is not None and status != "cancelled" and not campaign.redo \
                    and not (campaign.retry_failed and status != "ok"):
                if on_skip is not None:
                    on_skip(tuple(grid), trial)
                continue
            pending.append((tuple(grid), trial, configs[grid], specs[grid]))
    return pending


def run_campaign(campaign: Campaign, *, machine=None, stats: GraphStats | None = None, launcher=None,
                 on_result: Callable[[dict, tuple], None] | None = None,
                 on_skip: Callable[[tuple, int], None] | None = None,
                 on_start: Callable[[tuple, int], None] | None = None) -> list[dict]:
    """Train every (grid, trial) of ``campaign`` not yet logged, trials interleaved; returns the
    new records (also appended).

    ``launcher`` (default: local processes) starts the ranks; its name and cluster are part
    of every run's identity, so a campaign on another cluster does not count as done.
    ``machine`` (a profile) predicts each run, logged beside it. ``on_start(grid, trial)``
    is called before each run (each batch's first) starts.
    """
    graph = campaign.graph
    if machine is not None:
        machine = load_machine(machine)
    if stats is None:  # a missing, truncated or corrupt file or a bad spec fails before any run
        if machine is not None:
            stats = load_stats(graph)
        else:
            check_graph(graph)
    if campaign.log is not None:
        check_log(campaign.log, kinds=RUN_LOG, inputs=[graph])
    workload = workload_of(stats, campaign.layers, campaign.hidden) if stats is not None and machine is not None else None
    pending = pending_runs(campaign, on_skip=on_skip, launcher=launcher)

    new = []

    def finish(grid, trial, spec, record):
        log_campaign_run(campaign.log, record, trial=trial, gpus=campaign.gpus, trials=campaign.trials,
                         grids=campaign.grids, machine=machine, workload=workload, spec=spec,
                         graph=stats.context if stats is not None else None)
        new.append(record)
        if on_result is not None:
            on_result(record, grid)

    batch = campaign.batch
    for start in range(0, len(pending), batch):
        chunk = pending[start : start + batch]
        if on_start is not None:
            on_start(chunk[0][0], chunk[0][1])
        records = _run_batch([c for _, _, c, _ in chunk], launcher, [s for *_, s in chunk]) if len(chunk) > 1 else None
        if records is None:  # one at a time (or the batch failed: redo its runs one by one)
            for k, (grid, trial, config, spec) in enumerate(chunk):
                if k and on_start is not None:
                    on_start(grid, trial)
                finish(grid, trial, spec, run_training(config, raise_on_failure=False, launcher=launcher, spec=spec))
        else:
            for (grid, trial, _, spec), record in zip(chunk, records):
                finish(grid, trial, spec, record)
    return new


def run_batch(configs, launcher=None, specs=None) -> list[dict]:
    """The records of ``configs`` (one world size) trained in one process set, or one by one
    where there is one or the set failed (so that the failing run is logged as such);
    ``specs``: their :class:`~plexus_tune.measure.identity.RunSpec` where the caller has them."""
    specs = list(specs) if specs is not None else [None] * len(configs)
    records = _run_batch(list(configs), launcher, specs) if len(configs) > 1 else None
    if records is None:
        records = [run_training(config, raise_on_failure=False, launcher=launcher, spec=spec)
                   for config, spec in zip(configs, specs)]
    return records


def log_campaign_run(log, record: dict, *, trial: int, gpus: int, trials: int, grids, machine=None, workload=None,
                     spec: RunSpec | None = None, graph=None) -> dict:
    """Append a campaign's run record to ``log`` with its trial, the campaign and (with a
    machine profile) the prediction at the run's settings (:meth:`RunSpec.predict` of ``spec``,
    else of the record, on ``graph``: the run's graph, :attr:`GraphStats.context`); returns the record."""
    record["trial"] = int(trial)
    record["campaign"] = {"gpus": gpus, "trials": trials, "grids": [format_grid(g) for g in grids]}
    if workload is not None and machine is not None:
        spec = spec if spec is not None else RunSpec.from_record(record)
        record["predicted"] = spec.predict(machine, workload=workload, graph=graph)
    append_records(log, [record])
    return record


def log_run(log, record: dict, *, machine, workload, spec: RunSpec | None = None, graph=None) -> dict:
    """Append one run's record to ``log`` with the prediction at its settings (``predicted``: :meth:`RunSpec.predict`
    of ``spec``, the run's, else of the record, on ``graph``: the run's graph, :attr:`GraphStats.context`) and the
    next trial number of its identity (:func:`next_trial`); returns the record."""
    spec = spec if spec is not None else RunSpec.from_record(record)
    record["predicted"] = spec.predict(machine, workload=workload, graph=graph)
    record["trial"] = next_trial(log, run_identity(record))  # as logged (shard files fix their own permutation)
    append_records(log, [record])
    return record


def job_failure_record(config, state, *, launcher: str, spec: RunSpec | None = None) -> dict:
    """The record of a run whose Slurm job ended before the run was logged: the job's state,
    reason and exit code or signal (``state``: :class:`plexus_tune.launch.slurm` job state;
    ``spec``: the configuration's, where the caller has it)."""
    code = f", signal {state.signal}" if state.signal else (
        f", exit code {state.exit_code}" if state.exit_code is not None else "")
    record = base_record(config, spec=spec, launcher=launcher, slurm=dispatch.state_fields(state))
    record.update(status=dispatch.failure_status(state.state),
                  reason=f"Slurm job {state.key} {state.state} (reason {state.reason or 'unknown'}{code})")
    return record


def campaign_rows(campaign: Campaign, launcher=None):
    """The runs table's rows of the campaign's log at its setting (any grid) on its GPU count,
    fastest first, failures included (:func:`plexus_tune.measure.table.runs_table`)."""
    setting = campaign.run_spec(launcher=launcher).setting()
    table = runs_table(read_runs(campaign.log, warn=False), include_failed=True)
    mine = table[[run_setting(i) == setting for i in table["identity"]]]
    return setting, mine[mine["gpus"] == campaign.gpus].sort_values("obs_epoch_ms", na_position="last")


def log_unfinished(campaign: Campaign, states, *, launcher, machine=None, workload=None, graph=None) -> list[dict]:
    """Log the run each Slurm job of ``states`` that ended other than COMPLETED had in flight
    (:func:`job_failure_record`), unless the run was logged before the job ended; returns the
    records (:func:`plexus_tune.launch.dispatch.dispatch`'s ``collect``)."""
    out = []
    for state in states:
        running = dispatch.in_flight(campaign.log, state.key) if state.state != "COMPLETED" else None
        if running is None:
            continue
        spec = campaign.run_spec(parse_grid(running["grid"]), launcher)
        trial = int(running["trial"])
        if logged_trials(campaign.log).get((spec.identity(), trial)) not in (None, "cancelled"):
            continue  # the run was logged before the job ended
        record = job_failure_record(spec.train_config(**campaign.training()), state, launcher=launcher.name, spec=spec)
        out.append(log_campaign_run(campaign.log, record, trial=trial, gpus=campaign.gpus, trials=campaign.trials,
                                    grids=campaign.grids, machine=machine, workload=workload, spec=spec, graph=graph))
    return out


def _run_batch(configs, launcher=None, specs=None) -> list[dict] | None:
    """Train several configurations of one graph and world size in one process set.

    Saves the process start and graph load per run; the records say ``batched``. Returns
    None if the set fails, so that the caller can run the configurations one by one
    (and log which one fails).
    """
    import time

    from plexus_tune.trainer.rank import rank_main

    specs = list(specs) if specs is not None else [None] * len(configs)
    configs = [spec.train_config(c) if spec is not None else normalize_config(c) for c, spec in zip(configs, specs)]
    first = configs[0]
    world = first.world_size
    for config in configs:
        validate(config)
        if config.world_size != world:
            raise UserError("a batch of runs must share the world size")
    device_kind = "cuda" if first.backend == "nccl" else "cpu"
    start = time.perf_counter()
    try:
        launcher = launcher or Launcher()
        launched = launcher.run(rank_main, world, (graph_source(first), list(configs), device_kind),
                                backend=first.backend, timeout_s=first.timeout_s * len(configs),
                                threads_per_rank=first.threads_per_rank)
        results = launched.values[0]
    except RankFailure:
        return None
    wall_s = (time.perf_counter() - start) / len(configs)
    device = "cpu"
    if device_kind == "cuda":
        import torch

        device = torch.cuda.get_device_name(0)
    out = []
    for config, spec, result in zip(configs, specs, results):
        record = build_record(config, result, wall_s, device, spec=spec,
                              **placement_fields(launched.placement, launcher.ranks_per_node))
        record["batched"] = len(configs)
        out.append(record)
    return out
