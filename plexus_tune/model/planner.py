"""One ranking over algorithm families, their configurations and communication precisions
(docs/model.md, "Planner").

Every family of the registry (:mod:`plexus_tune.model.family`) gives its configurations
of G GPUs and the option settings ranked at each (supergcn's aggregation modes), each at
every communication precision given. :func:`joint_ranking` evaluates them all (exactly:
the space is small, see :func:`joint_space_size`) and ranks the configurations that fit
in memory by predicted epoch time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.model.breakdown import COMM_OP_KEYS, TOTAL_PARTS
from plexus_tune.model.comm_precision import parse_comm_precision
from plexus_tune.model.family import GraphContext, families_choosing, family_names, family_of, record_field_names
from plexus_tune.model.grid import check_gpus, format_grid
from plexus_tune.model.costs import prediction_records, rank_order
from plexus_tune.model.machine import GIB, Machine, load_machine
from plexus_tune.model.precision_choice import best_feasible_ms, pick_precision
from plexus_tune.model.prediction import predict_run_grids

__all__ = ["RECORD_TIME_KEYS", "Ranking", "check_choices", "joint_ranking", "joint_space_size"]

#: Keys of a ranked record's time breakdown (ms per epoch): total_ms and its parts.
RECORD_TIME_KEYS = ("total_ms", *TOTAL_PARTS)


def joint_space_size(gpus: int, precisions: int = 1, families=None, **fixed) -> dict[str, int]:
    """Configurations per family (grids x option settings x ``precisions``) and their sum under ``total``."""
    out = {}
    for name in families or family_names():
        fam = family_of(name)
        mine = {k: v for k, v in fixed.items() if k in fam.choices}
        out[name] = len(fam.configurations(gpus, **mine)) * len(fam.variants(**mine)) * precisions
    out["total"] = sum(out.values())
    return out


def check_choices(gpus: int, families, choices: dict) -> dict:
    """``choices`` (option -> value, None left out) checked: each must be a choice of a family in
    ``families`` and valid on ``gpus`` GPUs; returns the checked values."""
    out = {}
    for option, value in choices.items():
        if value is None:
            continue
        takers = [f for f in families if option in family_of(f).choices]
        if not takers:
            raise UserError(f"the {option} option applies to {', '.join(families_choosing(option)) or 'no family'} only")
        out[option] = family_of(takers[0]).check_choice(option, value, gpus)
    return out


@dataclass
class Ranking:
    """The planner's answer: every evaluated configuration, ranked (feasible first, by time)."""

    records: list[dict]
    gpus: int
    precisions: tuple[str, ...]
    algorithms: tuple[str, ...]
    seconds: float
    estimated_families: tuple[str, ...] = field(default_factory=tuple)

    @property
    def feasible(self) -> list[dict]:
        return [r for r in self.records if r["feasible"]]

    def best_per_family(self) -> dict[str, dict | None]:
        """The first feasible record of each family (None where none fits)."""
        out: dict[str, dict | None] = dict.fromkeys(self.algorithms)
        for rec in self.records:
            if rec["feasible"] and out.get(rec["algorithm"]) is None:
                out[rec["algorithm"]] = rec
        return out


def _records(family, pred, precision, options) -> list[dict]:
    fields = dict.fromkeys(record_field_names())
    out = []
    for k in range(len(pred["total_ms"])):
        grid = (int(pred["gx"][k]), int(pred["gy"][k]), int(pred["gz"][k]))
        rec = {"algorithm": family.name, "gpus": int(np.prod(grid)), "config": family.label(grid, options),
               "grid": format_grid(grid), "gx": grid[0], "gy": grid[1], "gz": grid[2],
               **fields, **family.record_fields(grid, options), "comm_precision": precision}
        for key in RECORD_TIME_KEYS:
            rec[key] = float(pred[key][k])
        for key in COMM_OP_KEYS:
            rec[key] = float(pred[key][k])
        rec["memory_bytes"] = int(round(float(pred["memory_bytes"][k])))
        rec["memory_gib"] = float(pred["memory_gib"][k])
        rec["feasible"] = bool(pred["feasible"][k])
        rec["estimated"] = bool(pred["estimated"][k]) if "estimated" in pred else False
        rec["quant_estimated"] = bool(pred["quant_estimated"][k]) if "quant_estimated" in pred else False
        out.append(rec)
    return out


def joint_ranking(workload, machine, gpus: int, *, algorithms=None, precisions=("fp32",),
                  graph=None, seed: int = 0, replication: int | None = None, aggregation: str | None = None,
                  schedule: str | None = None, fixed_features: bool = False,
                  optimizer: str | None = None, plexus_options=None, family_options=None) -> Ranking:
    """Every configuration of every family in ``algorithms`` (default all) at every precision, ranked.

    ``graph`` (a :class:`plexus_tune.graph.core.Graph` or its adjacency) supplies the
    partition-dependent figures (:meth:`plexus_tune.model.family.Family.graph_options`:
    SuperGCN's boundary rows from its METIS partition into G parts (``seed``), the 2D/3D
    sparse pieces); without it those families use the documented estimates and their
    records say ``estimated``. ``replication``, ``aggregation`` and ``schedule`` fix a family's
    choice (cagnet-1.5d's c, supergcn's mode, the CAGNET SUMMA schedule; :func:`check_choices`); ``optimizer`` the optimizer
    step of ``other_ms`` (default the machine's); ``family_options`` maps a family name to
    further options of its model (``plexus_options``: those of the default family, e.g.
    the graph's sparsity); ``fixed_features``: the input features are not trained.
    """
    machine = machine if isinstance(machine, Machine) else load_machine(machine)
    gpus = check_gpus(gpus)
    algorithms = tuple(algorithms or family_names())
    fixed = check_choices(gpus, algorithms, {"replication": replication, "aggregation": aggregation,
                                             "schedule": schedule})
    precisions = tuple(str(parse_comm_precision(p)) for p in precisions)
    if not precisions:
        raise UserError("give at least one communication precision")
    extra = dict(family_options or {})
    if plexus_options:
        extra.setdefault(family_of(None).name, dict(plexus_options))
    start = time.perf_counter()
    context = None
    if graph is not None:
        context = GraphContext(graph, seed=seed)
        if context.adjacency.shape[0] != workload.nodes:
            raise UserError(f"the graph has {context.adjacency.shape[0]} nodes but the workload {workload.nodes}; "
                            "describe the workload by the graph")
    records: list[dict] = []
    for name in algorithms:
        fam = family_of(name)
        mine = {k: v for k, v in fixed.items() if k in fam.choices}
        grids = fam.configurations(gpus, **mine)
        if len(grids) == 0:
            continue
        base = dict(fam.graph_options(context, gpus)) if context is not None else {}
        base.update(extra.get(name) or {})
        for precision in precisions:
            for variant in fam.variants(**mine):
                pred = predict_run_grids(workload, machine, grids, comm_precision=precision, algorithm=name,
                                         optimizer=optimizer, options={**variant, **base},
                                         fixed_features=fixed_features)
                records += _records(fam, pred, precision, variant)
    estimated = {rec["algorithm"] for rec in records if rec["estimated"]}
    order = sorted(range(len(records)), key=lambda i: (not records[i]["feasible"], records[i]["total_ms"]))
    ranked = [records[i] for i in order]
    for rank, rec in enumerate(ranked, start=1):
        rec["rank"] = rank
    return Ranking(ranked, gpus, precisions, algorithms, time.perf_counter() - start,
                   tuple(f for f in algorithms if f in estimated))


@dataclass
class GridRanking:
    """Every grid of G predicted at each precision asked for, and the precision kept: the one
    whose fastest feasible grid is fastest (:func:`~plexus_tune.model.precision_choice.pick_precision`).
    ``pred`` and ``order``: that precision's predictions and their ranking (feasible first,
    fastest first)."""

    grids: np.ndarray
    pred: dict
    order: np.ndarray
    precision: str
    best_of: dict

    @classmethod
    def of(cls, pred: dict, grids, precision: str | None = None) -> "GridRanking":
        """The ranking of one precision's predictions of ``grids``."""
        return cls(np.asarray(grids), pred, rank_order(pred), precision or "fp32", {})

    def index(self, grid) -> int:
        """The row of ``grid``; UserError if it is not one of the grids."""
        rows = np.flatnonzero((self.grids == np.asarray(grid)).all(axis=1))
        if not rows.size:
            raise UserError(f"grid {format_grid(grid)} is not one of the {len(self.grids)} grids ranked")
        return int(rows[0])

    def best_feasible(self) -> int | None:
        """The row of the fastest grid that fits, or None."""
        first = int(self.order[0])
        return first if bool(self.pred["feasible"][first]) else None

    @property
    def n_feasible(self) -> int:
        return int(np.asarray(self.pred["feasible"]).sum())

    def records(self, top: int | None = None) -> list[dict]:
        """The first ``top`` grids (all with None) as plain records, in rank order."""
        return prediction_records(self.pred, self.order, top=top)

    def spmm_note(self, machine: Machine) -> str | None:
        """What the SpMM floor or the clipping did to the grids, or None."""
        n_clipped = int(self.pred["spmm_clipped"].sum())
        n_floored = int(self.pred["spmm_floored"].sum())
        n = len(self.grids)
        if machine.memory_bandwidth_gbps and n_floored:
            return (f"{n_floored} of {n} grids floored: SpMM at its memory-traffic bound "
                    f"({machine.memory_bandwidth_gbps:g} GB/s) where {machine.name}'s SpMM model predicts less"
                    + (f" ({n_clipped} of them negative)" if n_clipped else ""))
        if n_clipped:
            return (f"note: the SpMM model of {machine.name} predicts negative times for {n_clipped} of {n} grids "
                    "(outside its fitted range); they are counted as 0 ms (the profile has no memory_bandwidth_gbps "
                    "to floor them)")
        return None

    def check_fits(self, gpus: int, machine: Machine) -> None:
        """UserError naming the smallest memory estimate when no grid fits."""
        if self.n_feasible:
            return
        pred = self.pred
        smallest = int(pred["memory_bytes"].argmin())
        grid = format_grid((pred["gx"][smallest], pred["gy"][smallest], pred["gz"][smallest]))
        raise UserError(
            f"no grid of {gpus} GPUs fits: the smallest estimate is {pred['memory_gib'][smallest]:.1f} GiB per GPU "
            f"(grid {grid}) but {machine.name} offers {machine.usable_memory_bytes / GIB:.1f} GiB; use more GPUs "
            "or a machine with more device memory")


def rank_grids(workload, machine: Machine, grids, precisions, **settings) -> GridRanking:
    """Every grid predicted at each of ``precisions`` (:func:`~plexus_tune.model.prediction.predict_run_grids`
    with ``settings``), ranked at the precision whose best feasible grid is fastest (the first
    where none fits, to report why)."""
    by_precision = {p: predict_run_grids(workload, machine, grids, comm_precision=p, **settings) for p in precisions}
    best_of = best_feasible_ms(by_precision)
    precision = pick_precision(best_of)[0] or precisions[0]
    pred = by_precision[precision]
    return GridRanking(np.asarray(grids), pred, rank_order(pred), precision, best_of)
