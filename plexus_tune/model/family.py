"""The algorithm-family contract and its registry (docs/architecture.md, "Algorithm families").

A family is a subclass of :class:`Family` with one instance in :data:`FAMILIES`, as an
SpMM kind is a :class:`plexus_tune.model.spmm.SpmmKind`. It owns its name, its options,
its configurations of G GPUs, its vectorized prediction (time parts, volumes, memory),
how a configuration is labelled and recorded, and the dotted name of its trainer. Every
stage asks the registry (:func:`family_of`) and never compares a family name.

The configurations of G GPUs per family:

    plexus-3d     every grid Gx x Gy x Gz = G
    cagnet-1d     G x 1 x 1
    cagnet-1.5d   (G/c) x c x 1 for c | G, 2 <= c, c c <= G
    cagnet-2d     Pr x Pc x 1 for every Pr Pc = G
    cagnet-3d     Pr x Pc x Pl for every Pr Pc Pl = G with Pl >= 2
    supergcn      G parts x (pre, post, hybrid)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.graph.partition import AGGREGATION_MODES, PiecePattern, check_aggregation, partition_exchange
from plexus_tune.model.comm_precision import CommPrecision, parse_comm_precision
from plexus_tune.model.costs import predict_grids
from plexus_tune.model.family_costs import cagnet_15d_config, cagnet_summa_config, supergcn_config
from plexus_tune.model.grid import check_gpus, divisors, enumerate_grids, format_grid
from plexus_tune.model.machine import Machine, load_machine
from plexus_tune.model.scalegnn import config_label as minibatch_label
from plexus_tune.model.scalegnn import predict_configs as predict_minibatch
from plexus_tune.model.volumes import check_replication, check_schedule

#: Options every family's model takes (docs/model.md, "Algorithm families"): ``fixed_features``
#: (the input features are not trained: no layer-0 feature gradient, its backward SpMM and
#: collectives, nor the features' optimizer state).
COMMON_OPTIONS: tuple[str, ...] = ("fixed_features",)


def _grids(grids) -> np.ndarray:
    arr = np.asarray(grids, dtype=np.int64)
    if arr.ndim == 1 and arr.size == 3:
        arr = arr.reshape(1, 3)
    if arr.ndim != 2 or arr.shape[1] != 3 or (arr.size and arr.min() < 1):
        raise UserError("configurations must be rows of three positive axis sizes (Gx, Gy, Gz)")
    return arr


def _stack(records: list[dict]) -> dict[str, np.ndarray]:
    if not records:
        return {}
    return {key: np.asarray([rec[key] for rec in records]) for key in records[0]}


def _rows(rows) -> np.ndarray:
    return np.asarray(rows, dtype=np.int64).reshape(-1, 3)


class GraphContext:
    """A graph's partition-dependent inputs, built once and shared by the families that use them."""

    def __init__(self, graph, *, seed: int = 0):
        self.adjacency = getattr(graph, "adjacency", graph)
        self.seed = int(seed)
        self._pattern = None
        self._plans: dict[int, object] = {}

    @property
    def pattern(self) -> PiecePattern:
        """The sparsity pattern whose SUMMA pieces the 2D and 3D families count."""
        if self._pattern is None:
            self._pattern = PiecePattern(self.adjacency)
        return self._pattern

    def partition(self, gpus: int):
        """The graph's partition into ``gpus`` parts and its boundary exchange (``seed``)."""
        if gpus not in self._plans:
            self._plans[gpus] = partition_exchange(self.adjacency, int(gpus), seed=self.seed)
        return self._plans[gpus]


class Family:
    """One algorithm family (module docstring). Subclasses set the class attributes and
    override :meth:`configurations` and :meth:`evaluate`; the rest has defaults.

    Attributes:
        name: the family's name (``--algorithm``, records, the registry key).
        summary: one line for help texts.
        options: the option names its model takes (``predict_run(options=...)``).
        choices: the options a user may fix in the planner (``--replication``), each
            also a record field of every ranked configuration.
        identity_options: run-identity fields passed to the model as options.
        trainer_entry: ``"module:Class"`` of its rank trainer (resolved by the trainer
            stage; the model never imports it), None where the family has no trainer.
        takes_grid: a run names its process grid (else it follows from G and the options).
        takes_block_rows: its model and trainer take blocked aggregation (``block_rows``).
        trainer_options: options of a run (TrainConfig fields) only this family's trainer has.
        reads_shards: its trainer reads 2D shard files (``plexus-tune graph shard``), not
            only a whole graph.
        epoch: ``full-graph`` (an epoch trains on the whole graph once) or ``mini-batch``
            (N / (B Gd) steps on samples): epochs of the two kinds are not compared, so
            ``all`` (:func:`family_names`) ranks the full-graph families only.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    options: ClassVar[tuple[str, ...]] = ()
    choices: ClassVar[tuple[str, ...]] = ()
    identity_options: ClassVar[tuple[str, ...]] = ()
    trainer_entry: ClassVar[str | None] = None
    takes_grid: ClassVar[bool] = True
    takes_block_rows: ClassVar[bool] = False
    trainer_options: ClassVar[tuple[str, ...]] = ()
    reads_shards: ClassVar[bool] = False
    epoch: ClassVar[str] = "full-graph"

    # ------------------------------------------------------------------ configurations

    def configurations(self, gpus: int, **fixed) -> np.ndarray:
        """(K, 3) process grids of the family on ``gpus`` GPUs; ``fixed`` holds chosen
        :attr:`choices` (checked by :meth:`check_choice`)."""
        raise NotImplementedError

    def variants(self, **fixed) -> list[dict]:
        """Option settings ranked separately at every grid (default: one, no options)."""
        return [{}]

    def check_choice(self, option: str, value, gpus: int):
        """``value`` of one of :attr:`choices`, checked for ``gpus`` GPUs; UserError otherwise."""
        raise UserError(f"{self.name} has no option {option}")

    def graph_options(self, context: GraphContext, gpus: int) -> dict:
        """Model options computed from a graph (its partition or pieces); none by default."""
        return {}

    @property
    def reads_graph(self) -> bool:
        """Its model reads a run's graph (it overrides :meth:`graph_options`): a logged run of it is predicted
        from the graph's pieces or partition, as ``predict --graph`` ranks it."""
        return type(self).graph_options is not Family.graph_options

    def run_graph_options(self, context: GraphContext, grid) -> dict:
        """Model options of one run on ``grid`` computed from its graph: :meth:`graph_options` of its ranks.
        (Plexus 3D has none here: its logged prediction prices the shards from N and NNZ, as ``validate`` and
        ``plot`` re-predict a logged run; ``predict --graph`` reads the graph's largest shard.)"""
        return self.graph_options(context, int(np.prod(grid)))

    # ------------------------------------------------------------------ prediction

    def predict(self, workload, machine, grids, *, block_rows=None, comm_precision=None, optimizer=None,
                options: Mapping | None = None) -> dict[str, np.ndarray]:
        """Vectorized prediction of ``grids`` (rows Gx, Gy, Gz): arrays with the keys of
        :data:`plexus_tune.model.costs.PREDICTION_KEYS` (docs/model.md)."""
        machine = machine if isinstance(machine, Machine) else load_machine(machine)
        if block_rows and not self.takes_block_rows:
            raise UserError(f"{self.name} has no blocked aggregation; leave out the block rows")
        choice = comm_precision if isinstance(comm_precision, CommPrecision) else parse_comm_precision(
            comm_precision or "fp32")
        options = dict(options or {})
        unknown = sorted(set(options) - set(self.options) - set(COMMON_OPTIONS))
        if unknown:
            allowed = (*self.options, *COMMON_OPTIONS)
            raise UserError(f"{self.name} takes no option {', '.join(unknown)}"
                            + (f"; its options: {', '.join(allowed)}" if allowed else ""))
        return self.evaluate(workload, machine, _grids(grids), block_rows=block_rows or None, choice=choice,
                             optimizer=optimizer, options=options)

    def evaluate(self, workload, machine: Machine, grids: np.ndarray, *, block_rows, choice: CommPrecision,
                 optimizer, options: dict) -> dict[str, np.ndarray]:
        """:meth:`predict` once its arguments are checked."""
        raise NotImplementedError

    # ------------------------------------------------------------------ records

    def label(self, grid, options: Mapping | None = None) -> str:
        """How a configuration is printed (default the grid GxxGyxGz)."""
        return format_grid(tuple(int(g) for g in grid))

    def record_fields(self, grid, options: Mapping | None = None) -> dict:
        """Values of the family's :attr:`choices` in a ranked record (None: not set)."""
        return {}

    def __repr__(self) -> str:
        return f"<family {self.name}>"


# ----------------------------------------------------------------------------- the families


class Plexus3d(Family):
    name = "plexus-3d"
    summary = "the Plexus 3D grid Gx x Gy x Gz"
    options = ("sparsity", "overlap")  # the graph's shards (model.sparsity.GraphSparsity); overlapped blocks
    trainer_entry = "plexus_tune.trainer.plexus3d:Plexus3dTrainer"
    takes_block_rows = True
    trainer_options = ("block_rows", "overlap", "layer_norm", "permute")
    reads_shards = True

    def configurations(self, gpus, **fixed):
        return enumerate_grids(check_gpus(gpus))

    def evaluate(self, workload, machine, grids, *, block_rows, choice, optimizer, options):
        return predict_grids(workload, machine, grids, block_rows=block_rows, comm_precision=choice,
                             optimizer=optimizer, sparsity=options.get("sparsity"),
                             fixed_features=bool(options.get("fixed_features")), overlap=bool(options.get("overlap")))


class Cagnet1d(Family):
    name = "cagnet-1d"
    summary = "CAGNET 1D: block rows, a broadcast per stage"
    options = ("graph", "replication")
    trainer_entry = "plexus_tune.trainer.cagnet:Cagnet15dTrainer"
    takes_grid = False

    def graph_options(self, context, gpus):
        return {"graph": context.pattern}  # the block rows' stage chunks

    def configurations(self, gpus, **fixed):
        return _rows([(check_gpus(gpus), 1, 1)])

    def label(self, grid, options=None):
        return f"{int(grid[0])} block rows"

    def evaluate(self, workload, machine, grids, *, block_rows, choice, optimizer, options):
        out = []
        for gx, gy, gz in grids:
            if gy != 1 or gz != 1 or int(options.get("replication", 1)) != 1:
                raise UserError(f"cagnet-1d runs on G x 1 x 1 with replication 1, not {format_grid((gx, gy, gz))}")
            out.append(cagnet_15d_config(workload, machine, int(gx), 1, choice, optimizer,
                                         _block_pieces(options, int(gx)), bool(options.get("fixed_features"))))
        return _stack(out)


class Cagnet15d(Family):
    name = "cagnet-1.5d"
    summary = "CAGNET 1.5D: block rows replicated c times"
    options = ("graph", "replication")
    choices = ("replication",)
    trainer_entry = "plexus_tune.trainer.cagnet:Cagnet15dTrainer"
    takes_grid = False

    def graph_options(self, context, gpus):
        return {"graph": context.pattern}  # the block rows' stage chunks

    def configurations(self, gpus, **fixed):
        gpus = check_gpus(gpus)
        rows = [(gpus // c, c, 1) for c in divisors(gpus).tolist() if c >= 2 and c * c <= gpus]
        c = fixed.get("replication")
        if c is not None:
            rows = [r for r in rows if r[1] == int(c)]
        return _rows(rows)

    def check_choice(self, option, value, gpus):
        if option != "replication":
            return super().check_choice(option, value, gpus)
        return check_replication(gpus, value)

    def label(self, grid, options=None):
        return f"{int(grid[0])}x{int(grid[1])} (c={int(grid[1])})"

    def record_fields(self, grid, options=None):
        return {"replication": int(grid[1])}

    def evaluate(self, workload, machine, grids, *, block_rows, choice, optimizer, options):
        out = []
        for gx, gy, gz in grids:
            if gz != 1 or ("replication" in options and int(options["replication"]) != gy):
                raise UserError(f"cagnet-1.5d runs on (G/c) x c x 1 (c = replication), not {format_grid((gx, gy, gz))}"
                                + (f" with replication {options['replication']}" if "replication" in options else ""))
            out.append(cagnet_15d_config(workload, machine, int(gx * gy), int(gy), choice, optimizer,
                                         _block_pieces(options, int(gx)), bool(options.get("fixed_features"))))
        return _stack(out)


def _block_pieces(options, r):
    """(A, A^T) nonzeros of the r x r blocks of the graph in ``options`` (None without one)."""
    graph = options.get("graph")
    if graph is None:
        return None
    pattern = graph if isinstance(graph, PiecePattern) else PiecePattern(getattr(graph, "adjacency", graph))
    return pattern.pieces(r, r)[0], pattern.pieces(r, r, transpose=True)[0]


def _summa_pieces(options, pr, pc, pl):
    graph = options.get("graph")
    if graph is None:
        return None
    pattern = graph if isinstance(graph, PiecePattern) else PiecePattern(getattr(graph, "adjacency", graph))
    return pattern.pieces(pr, pc, pl), pattern.pieces(pr, pc, pl, transpose=True)


class _Summa(Family):
    """CAGNET's SUMMA families: ``options["graph"]`` (a graph, its adjacency or a
    :class:`plexus_tune.graph.partition.PiecePattern`) gives the A pieces; ``schedule``
    is the bundled trainers' (default) or CAGNET's own as its paper counts it
    (docs/model.md, "CAGNET schedules")."""

    options = ("graph", "schedule")
    choices = ("schedule",)
    identity_options = ("schedule",)
    default_schedule = "bundled"

    def graph_options(self, context, gpus):
        return {"graph": context.pattern}

    def variants(self, **fixed):
        return [{"schedule": check_schedule(fixed.get("schedule") or self.default_schedule)}]

    def check_choice(self, option, value, gpus):
        if option != "schedule":
            return super().check_choice(option, value, gpus)
        return check_schedule(value)

    def record_fields(self, grid, options=None):
        return {"schedule": check_schedule((options or {}).get("schedule") or self.default_schedule)}

    def label(self, grid, options=None):
        text = format_grid(tuple(int(g) for g in grid)) if grid[2] > 1 else f"{int(grid[0])}x{int(grid[1])}"
        paper = check_schedule((options or {}).get("schedule") or self.default_schedule) == "paper"
        return text + (", paper schedule" if paper else "")

    def check_grid(self, gx, gy, gz) -> None:
        raise NotImplementedError

    def evaluate(self, workload, machine, grids, *, block_rows, choice, optimizer, options):
        out = []
        for gx, gy, gz in grids:
            self.check_grid(gx, gy, gz)
            out.append(cagnet_summa_config(workload, machine, int(gx), int(gy), int(gz), choice,
                                           _summa_pieces(options, int(gx), int(gy), int(gz)), optimizer,
                                           check_schedule(options.get("schedule") or self.default_schedule),
                                           bool(options.get("fixed_features"))))
        return _stack(out)


class Cagnet2d(_Summa):
    name = "cagnet-2d"
    summary = "CAGNET 2D: SUMMA on a Pr x Pc grid"
    trainer_entry = "plexus_tune.trainer.cagnet:Cagnet2dTrainer"

    def configurations(self, gpus, **fixed):
        gpus = check_gpus(gpus)
        return _rows([(p, gpus // p, 1) for p in divisors(gpus).tolist()])

    def check_grid(self, gx, gy, gz):
        if gz != 1:
            raise UserError(f"cagnet-2d runs on Pr x Pc x 1, not {format_grid((gx, gy, gz))}")


class Cagnet3d(_Summa):
    name = "cagnet-3d"
    summary = "CAGNET split-3D: SUMMA on Pl layers of a Pr x Pc mesh"
    trainer_entry = "plexus_tune.trainer.cagnet3d:Cagnet3dTrainer"

    def configurations(self, gpus, **fixed):
        grids = enumerate_grids(check_gpus(gpus))
        return grids[grids[:, 2] >= 2]

    def check_grid(self, gx, gy, gz):
        if gz < 2:
            raise UserError(f"cagnet-3d needs Pl >= 2 mesh layers (Pr x Pc x Pl), not {format_grid((gx, gy, gz))}; use cagnet-2d")


class SuperGcn(Family):
    name = "supergcn"
    summary = "a partition into G parts with pre, post or hybrid aggregation of the cut edges"
    options = ("aggregation", "plan", "graph", "seed")
    choices = ("aggregation",)
    identity_options = ("aggregation",)
    trainer_entry = "plexus_tune.trainer.partitioned:PartitionedTrainer"
    takes_grid = False
    #: Aggregation modes in ranking order (hybrid first: it wins ties, as its volume never exceeds the others).
    modes = ("hybrid", "pre", "post")
    default_aggregation = "hybrid"

    def configurations(self, gpus, **fixed):
        return _rows([(check_gpus(gpus), 1, 1)])

    def variants(self, **fixed):
        mode = fixed.get("aggregation")
        return [{"aggregation": m} for m in ((check_aggregation(mode),) if mode is not None else self.modes)]

    def check_choice(self, option, value, gpus):
        if option != "aggregation":
            return super().check_choice(option, value, gpus)
        return check_aggregation(value)

    def graph_options(self, context, gpus):
        return {"plan": context.partition(gpus)}

    def label(self, grid, options=None):
        return f"{int(grid[0])} parts, {(options or {}).get('aggregation', self.default_aggregation)}"

    def record_fields(self, grid, options=None):
        return {"aggregation": (options or {}).get("aggregation", self.default_aggregation)}

    def evaluate(self, workload, machine, grids, *, block_rows, choice, optimizer, options):
        mode = check_aggregation(options.get("aggregation", self.default_aggregation))
        out = []
        for gx, gy, gz in grids:
            if gy != 1 or gz != 1:
                raise UserError(f"supergcn runs on G x 1 x 1 (one part per GPU), not {format_grid((gx, gy, gz))}")
            plan = options.get("plan")
            if plan is None and options.get("graph") is not None:
                graph = options["graph"]
                plan = partition_exchange(getattr(graph, "adjacency", graph), int(gx), seed=int(options.get("seed", 0)))
            out.append(supergcn_config(workload, machine, int(gx), mode, choice, plan, optimizer,
                                       bool(options.get("fixed_features"))))
        return _stack(out)


class ScaleGnn4d(Family):
    """ScaleGNN's 4D mini-batch training (docs/model.md, "ScaleGNN"): a configuration is the
    3D grid of each of ``dp`` data-parallel groups; ``batch_size`` B (required) and ``dp``
    are options, as are the switchable components and ``prefetch``
    (:func:`plexus_tune.model.scalegnn.predict_configs`). Its epoch is a mini-batch epoch."""

    name = "scalegnn-4d"
    summary = "ScaleGNN: Gd data-parallel groups of a 3D grid, each training on B sampled vertices per step"
    options = ("dp", "batch_size", "rmsnorm", "residual", "dropout", "prefetch", "sampled_nnz")
    choices = ("dp", "batch_size")
    identity_options = ("dp", "batch_size", "prefetch")
    trainer_entry = "plexus_tune.trainer.scalegnn:ScaleGnnTrainer"
    trainer_options = ("dp", "batch_size")
    epoch = "mini-batch"

    def configurations(self, gpus, **fixed):
        gpus = check_gpus(gpus)
        dp = self.check_choice("dp", fixed.get("dp") or 1, gpus)
        return enumerate_grids(gpus // dp)

    def check_choice(self, option, value, gpus):
        if option == "dp":
            dp = int(value)
            if dp < 1 or gpus % dp:
                raise UserError(f"the data-parallel degree {value} does not divide {gpus} GPUs; choose a divisor",
                                parameter="dp")
            return dp
        if option == "batch_size":
            if int(value) < 2:
                raise UserError(f"the batch size must be at least 2 vertices, got {value}", parameter="batch_size")
            return int(value)
        return super().check_choice(option, value, gpus)

    def label(self, grid, options=None):
        return minibatch_label((options or {}).get("dp") or 1, grid)

    def record_fields(self, grid, options=None):
        options = options or {}
        return {"dp": int(options.get("dp") or 1), "batch_size": options.get("batch_size")}

    def evaluate(self, workload, machine, grids, *, block_rows, choice, optimizer, options):
        options = dict(options)
        batch = options.pop("batch_size", None)
        if batch is None:
            raise UserError(f"{self.name} needs the batch size B", parameter="batch_size")
        dp = int(options.pop("dp", None) or 1)
        configs = np.column_stack([np.full(len(grids), dp, dtype=np.int64), grids])
        return predict_minibatch(workload, machine, configs, batch_size=int(batch), comm_precision=choice,
                                 optimizer=optimizer, options=options)


# ----------------------------------------------------------------------------- the registry

#: Family name -> its instance, in report order.
FAMILIES: dict[str, Family] = {}
#: The family of a run that names none.
DEFAULT_FAMILY = "plexus-3d"
#: The name that selects every family.
ALL = "all"


def register(family: Family) -> Family:
    """Add ``family`` to :data:`FAMILIES` (its name must be new); returns it."""
    if not family.name or family.name in FAMILIES or family.name == ALL:
        raise ValueError(f"a family needs a new name, not {family.name!r}")
    FAMILIES[family.name] = family
    return family


for _cls in (Plexus3d, Cagnet1d, Cagnet15d, Cagnet2d, Cagnet3d, SuperGcn, ScaleGnn4d):
    register(_cls())


def family_names(epoch: str | None = "full-graph") -> tuple[str, ...]:
    """The registered families whose epoch is ``epoch`` (None: every one), in report order.

    ``all`` means the full-graph families: a mini-batch epoch is not a full-graph epoch
    (:attr:`Family.epoch`)."""
    return tuple(n for n, f in FAMILIES.items() if epoch is None or f.epoch == epoch)


def family_of(name: str | None) -> Family:
    """The family named ``name`` (default :data:`DEFAULT_FAMILY`); UserError lists the choices."""
    text = str(name if name is not None else DEFAULT_FAMILY).strip().lower() or DEFAULT_FAMILY
    try:
        return FAMILIES[text]
    except KeyError:
        raise UserError(f"unknown algorithm {str(name).strip()!r}; choose one of {', '.join(FAMILIES)}") from None


def parse_families(text: str | None) -> tuple[str, ...]:
    """Families named by ``text`` (one name or ``all``); UserError lists the choices."""
    name = (text or DEFAULT_FAMILY).strip().lower()
    if name == ALL:
        return family_names()
    if name not in FAMILIES:
        raise UserError(f"unknown algorithm {text!r}; choose one of {', '.join(FAMILIES)} or {ALL}")
    return (name,)


def families_with(attribute: str, value=True) -> tuple[str, ...]:
    """Families whose ``attribute`` equals ``value`` (e.g. ``takes_block_rows``)."""
    return tuple(n for n, f in FAMILIES.items() if getattr(f, attribute) == value)


def families_choosing(option: str) -> tuple[str, ...]:
    """Families that have ``option`` among their :attr:`Family.choices`."""
    return tuple(n for n, f in FAMILIES.items() if option in f.choices)


def trained_families(epoch: str | None = "full-graph") -> tuple[str, ...]:
    """Families with a trainer whose epoch is ``epoch`` (None: every one; as :func:`family_names`,
    campaigns across families compare full-graph epochs)."""
    return tuple(n for n, f in FAMILIES.items() if f.trainer_entry and (epoch is None or f.epoch == epoch))


def record_field_names() -> tuple[str, ...]:
    """Every family's record fields (its :attr:`Family.choices`), in registry order; None where unset."""
    out: list[str] = []
    for fam in FAMILIES.values():
        out += [c for c in fam.choices if c not in out]
    return tuple(out)


__all__ = ["ALL", "AGGREGATION_MODES", "DEFAULT_FAMILY", "FAMILIES", "Family", "GraphContext", "families_choosing",
           "families_with", "family_names", "family_of", "parse_families", "record_field_names", "register",
           "trained_families"]
