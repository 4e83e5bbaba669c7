"""One run, typed: :class:`RunSpec`, its identity and its prediction (docs/records.md, "Run identity").

A :class:`RunSpec` is built once (from command-line arguments, a record of any version,
a runs-table row or a trainer configuration) and passed on as the object: its
:meth:`~RunSpec.identity` (the :data:`IDENTITY_FIELDS`: what changes a run's measured
time; trials of one identity are repeated measurements of one thing), its
:meth:`~RunSpec.prediction_settings` and its :meth:`~RunSpec.predict`ion
(:func:`plexus_tune.model.prediction.predict_run` at every setting of the identity).
"""

from __future__ import annotations

import json
import os
import platform
from collections import namedtuple
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.graph.generators import parse_spec
from plexus_tune.measure.records import DTYPE_BYTES, upgrade
from plexus_tune.model.family import DEFAULT_FAMILY, FAMILIES, GraphContext, family_of, record_field_names
from plexus_tune.model.comm_precision import CommPrecision, parse_comm_precision
from plexus_tune.model.grid import format_grid, parse_grid
from plexus_tune.model.memory import check_training_memory
from plexus_tune.model.prediction import predict_run
from plexus_tune.model.workload import Workload, model_widths
from plexus_tune.trainer.algorithms import normalize_config, some_grid
from plexus_tune.trainer.config import TrainConfig


@dataclass(frozen=True)
class IdentityField:
    """One part of a run's identity: its name, where it sits in a record, its default."""

    name: str
    path: tuple[str, ...]
    default: Any
    kind: type


#: What makes two runs the same measurement (trial aside): every option that changes
#: the measured time. A missing field takes its default (the meaning it had before the
#: field existed); a new option joins the identity by a new entry here.
IDENTITY_FIELDS: tuple[IdentityField, ...] = (
    IdentityField("graph", ("graph_source",), "", str),
    IdentityField("gx", ("gx",), 0, int),
    IdentityField("gy", ("gy",), 0, int),
    IdentityField("gz", ("gz",), 0, int),
    IdentityField("layers", ("layers",), 0, int),
    IdentityField("hidden", ("hidden",), 0, int),
    IdentityField("permute", ("options", "permute"), "double", str),
    IdentityField("block_rows", ("options", "block_rows"), 0, int),
    IdentityField("overlap", ("options", "overlap"), False, bool),
    IdentityField("dtype", ("options", "dtype"), "float32", str),
    IdentityField("threads_per_rank", ("options", "threads_per_rank"), 0, int),
    IdentityField("backend", ("backend",), "gloo", str),
    IdentityField("epochs", ("epochs",), 0, int),
    IdentityField("warmup", ("warmup",), 0, int),
    IdentityField("launcher", ("launcher",), "local", str),
    IdentityField("cluster", ("cluster",), "", str),
    IdentityField("machine", ("machine",), "", str),
    IdentityField("comm_precision", ("comm_precision",), "fp32", str),
    IdentityField("layer_norm", ("options", "layer_norm"), False, bool),
    IdentityField("fixed_features", ("options", "fixed_features"), False, bool),
    IdentityField("algorithm", ("algorithm",), DEFAULT_FAMILY, str),
    IdentityField("replication", ("options", "replication"), 0, int),
    IdentityField("aggregation", ("options", "aggregation"), "", str),
    IdentityField("schedule", ("options", "schedule"), "", str),
    IdentityField("dp", ("options", "dp"), 1, int),
    IdentityField("batch_size", ("options", "batch_size"), 0, int),
    IdentityField("prefetch", ("options", "prefetch"), True, bool),
)
IDENTITY_NAMES = tuple(f.name for f in IDENTITY_FIELDS)
GRID_FIELDS = ("gx", "gy", "gz")
#: The identity without the configuration: the settings a choice of algorithm and grid is made under.
#: The configuration chosen among the ways to run a setting: the algorithm family, its
#: process grid and its own options (cagnet-1.5d's c, supergcn's aggregation).
CONFIGURATION_FIELDS = tuple(dict.fromkeys(("algorithm", *GRID_FIELDS, *record_field_names(), "dp", "batch_size")))
SETTING_NAMES = tuple(n for n in IDENTITY_NAMES if n not in CONFIGURATION_FIELDS)
RunIdentity = namedtuple("RunIdentity", IDENTITY_NAMES)


def _lookup(record: Mapping, path: tuple[str, ...]):
    value = record
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _identity_value(spec: IdentityField, value):
    if value is None:
        return spec.default
    if spec.name == "cluster":
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))
    if spec.kind is bool:
        return bool(value)
    if spec.kind is int:
        return int(value)
    return str(value)


def run_identity(record: Mapping) -> RunIdentity:
    """The identity of a run record (any version, or the fields of a run not yet made):
    :meth:`RunSpec.identity` of :meth:`RunSpec.from_record`."""
    return RunSpec.from_record(record).identity()


def _record_identity(rec: Mapping) -> RunIdentity:
    """The identity values of an upgraded run record.

    ``graph`` is the graph's source (file path or synthetic spec; the name when the
    source is missing); the widths are fixed by the graph (features, classes) and
    ``layers``, ``hidden`` (``model.workload.model_widths``); ``block_rows`` and
    ``threads_per_rank`` are 0 for None; ``cluster`` is its canonical JSON text ("" for
    one host). The grid comes from ``gx, gy, gz`` or else from ``grid`` ("2x1x2").
    """
    values = [_identity_value(spec, _lookup(rec, spec.path)) for spec in IDENTITY_FIELDS]
    ident = RunIdentity(*values)
    if not ident.graph and rec.get("graph"):
        ident = ident._replace(graph=str(rec["graph"]))
    if ident.gx == 0 and isinstance(rec.get("grid"), str) and rec["grid"].count("x") == 2:
        try:
            gx, gy, gz = (int(v) for v in rec["grid"].split("x"))
        except ValueError:
            pass
        else:
            ident = ident._replace(gx=gx, gy=gy, gz=gz)
    return ident


#: TrainConfig field -> command-line argument (``args`` attribute) that :meth:`RunSpec.from_args` reads.
ARG_FIELDS = {"graph": "graph", "gpus": "gpus", "layers": "layers", "hidden": "hidden", "epochs": "epochs",
              "warmup": "warmup", "backend": "backend", "permute": "permute", "block_rows": "block_rows",
              "overlap": "overlap", "dtype": "dtype", "comm_precision": "comm_precision", "layer_norm": "layer_norm",
              "fixed_features": "fixed_features", "threads_per_rank": "threads", "algorithm": "algorithm",
              "replication": "replication", "aggregation": "aggregation", "dp": "dp", "batch_size": "batch_size",
              "prefetch": "prefetch"}
#: TrainConfig fields a :class:`RunSpec` does not hold: how the trainer trains, not which run it is
#: (:meth:`RunSpec.train_config` takes them from a configuration or as keywords).
TRAINING_FIELDS = ("lr", "weight_decay", "seed", "check", "collect_outputs", "log", "timeout_s", "extra")
SYNTHETIC_PREFIX = "synthetic:"


def training_fields(options: Mapping) -> dict:
    """The :data:`TRAINING_FIELDS` of TrainConfig ``options`` (the rest are a :class:`RunSpec`'s)."""
    return {k: v for k, v in options.items() if k in TRAINING_FIELDS}
#: Identity fields whose identity default (0 or "") means "not set" (None in a :class:`RunSpec`).
UNSET_AS_DEFAULT = ("block_rows", "threads_per_rank", "replication", "aggregation", "schedule", "batch_size")


def _count(value) -> int | None:
    """An int of a logged count; None for a missing one (None or NaN, as in runs-table rows of failed runs)."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    return int(value)


def graph_source_of(config) -> str:
    """The graph source a trainer configuration names: its file path, ``synthetic:<spec>`` or ``in-memory``."""
    if config.synthetic is not None:
        return f"{SYNTHETIC_PREFIX}{config.synthetic}"
    if isinstance(config.graph, (str, os.PathLike)):
        return str(config.graph)
    return "in-memory"


def _cluster_text(cluster) -> str:
    """A cluster description as its canonical JSON text ("" for one host)."""
    if cluster is None:
        return ""
    return cluster if isinstance(cluster, str) else json.dumps(cluster, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class RunSpec:
    """One trainer run, typed: what it trains, where, in which configuration and at which settings.

    Workload: ``graph`` (the graph's source: file path or ``synthetic:<spec>``), ``layers``,
    ``hidden`` and, once the graph is known, ``graph_name``, ``nodes`` (N), ``nnz`` and
    ``widths`` (D_0..D_L). Machine: ``machine`` (where it runs), ``backend``, ``launcher``,
    ``cluster`` (canonical JSON text, "" for one host), ``threads_per_rank``. Configuration:
    ``algorithm`` (a family of :data:`plexus_tune.model.family.FAMILIES`), ``grid``
    (Gx, Gy, Gz; its process grid) and the family's options ``replication``, ``aggregation``,
    ``schedule``, ``dp``, ``batch_size`` (None or 1 where the family has none), ``prefetch``
    (scalegnn-4d's sampling overlapped with the previous step; True elsewhere). Settings:
    ``comm_precision`` (a :class:`~plexus_tune.model.comm_precision.CommPrecision`, parsed
    once here from text), ``dtype``, ``block_rows`` (None: one block), ``overlap``,
    ``fixed_features``, ``layer_norm``, ``permute``, ``epochs``, ``warmup``.

    Built once by :meth:`from_args` (the command line), :meth:`from_record` (a run record of
    any version, or the fields of a run not yet made), :meth:`from_row` (a runs-table row),
    :meth:`from_identity` or :meth:`from_config` (a trainer configuration), and passed on as
    the object: a campaign's grids are :meth:`with_grid`, its launcher :meth:`with_launcher`,
    the trainer's configuration :meth:`train_config`; its identity is :meth:`identity`, its
    prediction :meth:`predict` (docs/records.md, "Run identity").
    """

    graph: str = ""
    layers: int = 0
    hidden: int = 0
    algorithm: str = DEFAULT_FAMILY
    grid: tuple[int, int, int] = (0, 0, 0)
    replication: int | None = None
    aggregation: str | None = None
    schedule: str | None = None
    dp: int = 1
    batch_size: int | None = None
    prefetch: bool = True
    comm_precision: CommPrecision = field(default_factory=CommPrecision)
    dtype: str = "float32"
    block_rows: int | None = None
    overlap: bool = False
    fixed_features: bool = False
    layer_norm: bool = False
    permute: str = "double"
    threads_per_rank: int | None = None
    machine: str = ""
    backend: str = "gloo"
    launcher: str = "local"
    cluster: str = ""
    epochs: int = 0
    warmup: int = 0
    graph_name: str | None = None
    nodes: int | None = None
    nnz: int | None = None
    widths: tuple[int, ...] | None = None

    def __post_init__(self):
        if not isinstance(self.comm_precision, CommPrecision):  # the one place a run's precision text is parsed
            object.__setattr__(self, "comm_precision", parse_comm_precision(self.comm_precision or "fp32"))
        object.__setattr__(self, "grid", tuple(int(g) for g in self.grid))
        object.__setattr__(self, "cluster", _cluster_text(self.cluster))
        if self.widths is not None:
            object.__setattr__(self, "widths", tuple(int(w) for w in self.widths))

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_identity(cls, identity: RunIdentity, **workload) -> RunSpec:
        """The spec of a run identity (``workload``: ``graph_name``, ``nodes``, ``nnz``, ``widths`` as measured)."""
        values = identity._asdict()
        grid = tuple(values.pop(name) for name in GRID_FIELDS)
        for name in UNSET_AS_DEFAULT:
            values[name] = values[name] or None
        return cls(grid=grid, **values, **workload)

    @classmethod
    def from_record(cls, record: Mapping) -> RunSpec:
        """The spec of a run record of any version (:func:`plexus_tune.measure.records.upgrade`), or of the
        fields of a run not yet made; the workload as logged where the record has it."""
        rec = upgrade(record, kind="run")
        name = rec.get("graph_name") or rec.get("graph")
        return cls.from_identity(_record_identity(rec), graph_name=str(name) if name else None,
                                 nodes=_count(rec.get("graph_nodes")), nnz=_count(rec.get("nnz")), widths=run_widths(rec))

    @classmethod
    def from_row(cls, row) -> RunSpec:
        """The spec of a runs-table row (:func:`plexus_tune.measure.table.runs_table`: its ``identity`` and graph columns)."""
        widths = row.get("widths")
        name = row.get("graph_name")
        return cls.from_identity(row["identity"], graph_name=str(name) if isinstance(name, str) and name else None,
                                 nodes=_count(row.get("graph_nodes")), nnz=_count(row.get("nnz")),
                                 widths=tuple(widths) if isinstance(widths, (tuple, list)) else None)

    @classmethod
    def from_config(cls, config, *, normalized: bool = False, launcher=None) -> RunSpec:
        """The spec of a trainer configuration (:class:`plexus_tune.trainer.config.TrainConfig`) with its family's
        settings filled in (:func:`plexus_tune.trainer.algorithms.normalize_config`, unless ``normalized`` says
        the configuration has them); ``launcher`` (a :class:`plexus_tune.launch.launchers.Launcher` that will
        start the ranks) gives its name, cluster and, where the configuration names none, machine; ``machine``
        is the host's name where neither names one. Its identity is the one the run's record will have."""
        if not normalized:
            config = normalize_config(config)
        if launcher is not None:
            config = replace(config, launcher=launcher.name, cluster=launcher.cluster(),
                             machine=config.machine or launcher.machine_name())
        return cls(graph=graph_source_of(config), layers=int(config.layers), hidden=int(config.hidden),
                   algorithm=config.algorithm, grid=config.grid, replication=config.replication,
                   aggregation=config.aggregation, dp=int(config.dp or 1), batch_size=config.batch_size,
                   prefetch=bool(config.prefetch),
                   comm_precision=config.comm_precision or "fp32", dtype=config.dtype, block_rows=config.block_rows,
                   overlap=bool(config.overlap), fixed_features=bool(config.fixed_features),
                   layer_norm=bool(config.layer_norm), permute=config.permute, threads_per_rank=config.threads_per_rank,
                   machine=config.machine or platform.node(), backend=config.backend, launcher=config.launcher,
                   cluster=config.cluster, epochs=int(config.epochs), warmup=int(config.warmup))

    @classmethod
    def from_args(cls, args, **fields) -> RunSpec:
        """The spec of parsed command-line arguments (``train``, ``measure``, ``run``): ``--graph`` (a file or a
        synthetic spec) or ``--synthetic``, ``--grid`` (else the family's first configuration of ``--gpus``),
        ``--algorithm`` and its options, the model's and the run's flags that the command has. ``fields``
        (:class:`~plexus_tune.trainer.config.TrainConfig` fields, checked values) override them. ``--machine``
        is not read: ``measure`` and ``run`` name the predicting profile with it, not where the run happens."""
        given = {name: getattr(args, flag) for name, flag in ARG_FIELDS.items() if getattr(args, flag, None) is not None}
        graph = getattr(args, "graph", None)
        if getattr(args, "synthetic", None) is not None or (graph is not None and not os.path.exists(graph) and ":" in graph):
            given.update(graph=None, synthetic=getattr(args, "synthetic", None) or graph)
        grid = getattr(args, "grid", None)
        if grid:
            given["grid"] = tuple(parse_grid(grid))
        given.update(fields)
        algorithm = given.get("algorithm") or DEFAULT_FAMILY
        family = family_of(algorithm)
        unsized = family.takes_grid or ("replication" in family.choices and given.get("replication") is None)
        if "grid" not in given and given.get("gpus") and unsized:
            given["grid"] = some_grid(algorithm, int(given["gpus"]) // int(given.get("dp") or 1))
            given["gpus"] = None  # the grid stands for the run's ranks (its data-parallel groups aside)
        return cls.from_config(TrainConfig(**given))

    # ------------------------------------------------------------------ what it is

    def identity(self) -> RunIdentity:
        """What makes two runs the same measurement (:data:`IDENTITY_FIELDS`; unset values take their defaults)."""
        values = dict(zip(GRID_FIELDS, self.grid))
        for spec in IDENTITY_FIELDS:
            if spec.name not in values:
                value = str(self.comm_precision) if spec.name == "comm_precision" else getattr(self, spec.name)
                values[spec.name] = _identity_value(spec, value)
        return RunIdentity(**values)

    def setting(self) -> tuple:
        """The identity without the configuration (:func:`run_setting`)."""
        return run_setting(self.identity())

    @property
    def synthetic(self) -> str | None:
        """The generator spec of a synthetic graph (None for a file or an in-memory graph)."""
        return self.graph[len(SYNTHETIC_PREFIX):] if self.graph.startswith(SYNTHETIC_PREFIX) else None

    def with_grid(self, grid) -> RunSpec:
        """The same run on another process grid of its family (one of its configurations; where the family
        chooses the replication c, it is the grid's: :meth:`plexus_tune.model.family.Family.record_fields`)."""
        grid = tuple(int(g) for g in grid)
        family = FAMILIES.get(self.algorithm)
        changes = {"grid": grid}
        if family is not None and "replication" in family.choices:
            changes["replication"] = family.record_fields(grid)["replication"]
        return replace(self, **changes)

    def with_launcher(self, launcher) -> RunSpec:
        """The same run started by ``launcher`` (None: as it is): the launcher's name and cluster, and the
        machine the launcher names (a Slurm cluster's), else this spec's."""
        if launcher is None:
            return self
        return replace(self, launcher=launcher.name, cluster=launcher.cluster(),
                       machine=launcher.machine_name() or self.machine)

    def train_config(self, config: TrainConfig | None = None, **training) -> TrainConfig:
        """The trainer's configuration of this run: every run field from this spec (its single source, with
        the family's settings filled in), the :data:`TRAINING_FIELDS` (learning rate, seed, check, log,
        timeout, ...) and an in-memory graph from ``config`` where given, ``training`` over them. The cluster
        is ``config``'s as described where it is this spec's."""
        kept = {name: getattr(config, name) for name in TRAINING_FIELDS} if config is not None else {}
        kept.update(training)
        if self.synthetic is not None:
            graph, synthetic = None, self.synthetic
        elif config is not None and graph_source_of(config) == self.graph:
            graph, synthetic = config.graph, None  # a path as given, or the Graph object of an in-memory run
        else:
            graph, synthetic = self.graph, None
        described = getattr(config, "cluster", None)
        cluster = described if _cluster_text(described) == self.cluster else (json.loads(self.cluster) if self.cluster else None)
        return TrainConfig(grid=self.grid, graph=graph, synthetic=synthetic, layers=self.layers, hidden=self.hidden,
                           epochs=self.epochs, warmup=self.warmup, permute=self.permute, block_rows=self.block_rows,
                           overlap=self.overlap, backend=self.backend, dtype=self.dtype,
                           comm_precision=self.comm_precision, layer_norm=self.layer_norm,
                           fixed_features=self.fixed_features, machine=self.machine,
                           threads_per_rank=self.threads_per_rank, launcher=self.launcher, cluster=cluster,
                           algorithm=self.algorithm, replication=self.replication, aggregation=self.aggregation,
                           dp=self.dp, batch_size=self.batch_size, prefetch=self.prefetch, **kept)

    def check_memory(self, launcher=None) -> None:
        """UserError if ``launcher``'s ranks on this host cannot hold the run's weights and activations
        (:func:`plexus_tune.model.memory.check_training_memory`; N of a synthetic graph, else 0), before any
        rank starts."""
        nodes = int(parse_spec(self.synthetic)[1].get("nodes", 0)) if self.synthetic is not None else 0
        check_training_memory(self.layers, self.hidden, nodes, launcher)

    def prediction_settings(self) -> dict:
        """:func:`plexus_tune.model.prediction.predict_run`'s keyword arguments at this run's settings: ``block_rows``,
        ``overlap``, ``fixed_features``, ``comm_precision`` (typed), ``algorithm``, and ``options`` (the identity
        fields its family passes to its model, :attr:`plexus_tune.model.family.Family.identity_options`)."""
        settings = {"block_rows": self.block_rows or None, "overlap": bool(self.overlap),
                    "fixed_features": bool(self.fixed_features), "comm_precision": self.comm_precision,
                    "algorithm": self.algorithm or DEFAULT_FAMILY}
        family = FAMILIES.get(settings["algorithm"])  # an unknown family is refused when it is predicted
        ident = self.identity()
        options = {name: getattr(ident, name) for name in getattr(family, "identity_options", ())
                   if getattr(ident, name) or isinstance(getattr(ident, name), bool)}  # a switch passes off, too
        if options:
            settings["options"] = options
        return settings

    def ranking_settings(self, graph=None) -> dict:
        """:meth:`prediction_settings` for ranking this run's grids (its G ranks) on ``graph`` (a
        :class:`~plexus_tune.model.family.GraphContext` or a loaded graph; None: none): the family's options from
        the graph added (:meth:`plexus_tune.model.family.Family.graph_options`), as ``predict --graph`` ranks them,
        so that each grid's figure is :meth:`predict` of the run on that grid."""
        settings = self.prediction_settings()
        if graph is not None:
            context = graph if isinstance(graph, GraphContext) else GraphContext(graph)
            extra = family_of(settings["algorithm"]).graph_options(context, int(np.prod(self.grid)))
            if extra:
                settings["options"] = {**settings.get("options", {}), **extra}
        return settings

    def workload(self, base: Workload | None = None) -> Workload:
        """The workload this run trains with the element size of its dtype: ``base``, else its graph as
        measured (N, NNZ, widths; UserError if the spec lacks them)."""
        elem = DTYPE_BYTES.get(self.dtype, 4)
        if base is not None:
            return replace(base, bytes_per_element=elem)
        missing = [k for k, v in (("graph_nodes", self.nodes), ("nnz", self.nnz), ("widths", self.widths)) if v is None]
        if missing:
            raise UserError(f"run record lacks {missing[0]!r}; is this a trainer run log (plexus-tune measure, run or train)?")
        return Workload(name=self.graph_name or self.graph or "graph", nodes=self.nodes, nnz=self.nnz,
                        widths=self.widths, bytes_per_element=elem)

    def predict(self, machine, *, workload: Workload | None = None, graph=None) -> dict:
        """The prediction of this run at every setting of its identity: :func:`plexus_tune.model.prediction.predict_run`
        of :meth:`workload`, ``grid`` and :meth:`prediction_settings`, so a logged prediction is what
        ``plexus-tune predict`` gives for the same settings. ``graph`` (the run's graph: a
        :class:`~plexus_tune.model.family.GraphContext`, reused across runs, or the loaded graph) gives the
        family's model what ``predict --graph`` reads of it (:meth:`plexus_tune.model.family.Family.run_graph_options`:
        the SUMMA pieces, the partition)."""
        settings = self.prediction_settings()
        if graph is not None:
            context = graph if isinstance(graph, GraphContext) else GraphContext(graph)
            extra = family_of(settings["algorithm"]).run_graph_options(context, self.grid)
            if extra:
                settings["options"] = {**settings.get("options", {}), **extra}
        return predict_run(self.workload(workload), machine, self.grid, **settings)


def prediction_settings(spec: RunSpec) -> dict:
    """:meth:`RunSpec.prediction_settings` of ``spec``."""
    return spec.prediction_settings()


def predict_record(record: Mapping, machine, *, workload: Workload | None = None) -> dict:
    """The prediction of a logged run (a record of any version, or the fields of a run not yet made):
    :meth:`RunSpec.predict` of :meth:`RunSpec.from_record`."""
    return RunSpec.from_record(record).predict(machine, workload=workload)


def run_setting(identity: RunIdentity) -> tuple:
    """The identity without the configuration (:data:`SETTING_NAMES`)."""
    return tuple(getattr(identity, n) for n in SETTING_NAMES)


def grid_label(identity) -> str:
    return format_grid((identity.gx, identity.gy, identity.gz))


def setting_labels(frame, columns=SETTING_NAMES, skip=("graph",)) -> list[str]:
    """Per row, ``name=value`` of the setting columns whose values differ between rows ("" if none do)."""
    varying = [c for c in columns if c in frame and c not in skip and frame[c].astype(str).nunique() > 1]
    return [", ".join(f"{c}={row[c]}" for c in varying) for _, row in frame[varying].iterrows()] if varying else [""] * len(frame)


def run_widths(rec: Mapping):
    """The layer widths D_0..D_L of a run (logged, else from its features, classes, layers and hidden; None if unknown)."""
    if rec.get("widths") is not None:
        return tuple(int(w) for w in rec["widths"])
    needed = (rec.get("features"), rec.get("classes"), rec.get("layers"), rec.get("hidden"))
    if any(v is None for v in needed):
        return None

    return tuple(model_widths(*needed))
