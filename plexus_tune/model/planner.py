"""One ranking over algorithm families, their configurations and communication precisions
(docs/model.md, "Planner").

The configurations of G GPUs per family:

    plexus-3d     every grid Gx x Gy x Gz = G
    cagnet-1d     G x 1 x 1
    cagnet-1.5d   (G/c) x c x 1 for c | G, 2 <= c, c c <= G
    cagnet-2d     Pr x Pc x 1 for every Pr Pc = G
    cagnet-3d     Pr x Pc x Pl for every Pr Pc Pl = G with Pl >= 2
    supergcn      G parts x (pre, post, hybrid)

each at every communication precision given. :func:`joint_ranking` evaluates them all
(exactly: the space is small, see :func:`joint_space_size`) and ranks the configurations
that fit in memory by predicted epoch time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from plexus_tune.graph.partition import PiecePattern, check_aggregation, partition_exchange
from plexus_tune.model.comm_precision import parse_comm_precision
from plexus_tune.errors import UserError
from plexus_tune.model.breakdown import COMM_OP_KEYS, TOTAL_PARTS
from plexus_tune.model.families import FAMILIES
from plexus_tune.model.grid import check_gpus, divisors, enumerate_grids, format_grid
from plexus_tune.model.machine import Machine, load_machine
from plexus_tune.model.prediction import predict_run_grids
from plexus_tune.model.volumes import check_replication

#: Every family the planner knows, in report order.
ALGORITHM_NAMES = ("plexus-3d", *FAMILIES)
#: The name that selects every family.
ALL = "all"
#: Aggregation modes of the partitioned family (hybrid first: it wins ties, as its volume never exceeds the others).
SUPERGCN_MODES = ("hybrid", "pre", "post")
#: Keys of a ranked record's time breakdown (ms per epoch): total_ms and its parts.
RECORD_TIME_KEYS = ("total_ms", *TOTAL_PARTS)


def parse_algorithms(text: str | None) -> tuple[str, ...]:
    """Families named by ``text`` (one name or ``all``); UserError lists the choices."""
    name = (text or "plexus-3d").strip().lower()
    if name == ALL:
        return ALGORITHM_NAMES
    if name not in ALGORITHM_NAMES:
        raise UserError(f"unknown algorithm {text!r}; choose one of {', '.join(ALGORITHM_NAMES)} or {ALL}")
    return (name,)


def family_grids(family: str, gpus: int) -> np.ndarray:
    """(K, 3) configurations of ``family`` on ``gpus`` GPUs (module docstring)."""
    gpus = check_gpus(gpus)
    if family == "plexus-3d":
        return enumerate_grids(gpus)
    if family == "cagnet-1d":
        return np.asarray([(gpus, 1, 1)], dtype=np.int64)
    if family == "cagnet-1.5d":
        rows = [(gpus // c, c, 1) for c in divisors(gpus).tolist() if c >= 2 and c * c <= gpus]
        return np.asarray(rows, dtype=np.int64).reshape(-1, 3)
    if family == "cagnet-2d":
        return np.asarray([(p, gpus // p, 1) for p in divisors(gpus).tolist()], dtype=np.int64).reshape(-1, 3)
    if family == "cagnet-3d":
        grids = enumerate_grids(gpus)
        return grids[grids[:, 2] >= 2]
    if family == "supergcn":
        return np.asarray([(gpus, 1, 1)], dtype=np.int64)
    raise UserError(f"unknown algorithm {family!r}; choose one of {', '.join(ALGORITHM_NAMES)}")


def joint_space_size(gpus: int, precisions: int = 1, families=ALGORITHM_NAMES) -> dict[str, int]:
    """Configurations per family (x ``precisions``) and their sum under ``total``."""
    out = {}
    for family in families:
        k = len(family_grids(family, gpus))
        out[family] = k * (len(SUPERGCN_MODES) if family == "supergcn" else 1) * precisions
    out["total"] = sum(out.values())
    return out


def config_label(family: str, grid, mode: str | None = None) -> str:
    """How a configuration is printed: the grid, c for 1.5D, the mode for supergcn."""
    gx, gy, gz = (int(g) for g in grid)
    if family == "cagnet-1d":
        return f"{gx} block rows"
    if family == "cagnet-1.5d":
        return f"{gx}x{gy} (c={gy})"
    if family == "cagnet-2d":
        return f"{gx}x{gy}"
    if family == "supergcn":
        return f"{gx} parts, {mode}"
    return format_grid((gx, gy, gz))


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


def _records(family, pred, precision, mode=None) -> list[dict]:
    out = []
    for k in range(len(pred["total_ms"])):
        grid = (int(pred["gx"][k]), int(pred["gy"][k]), int(pred["gz"][k]))
        rec = {"algorithm": family, "gpus": int(np.prod(grid)), "config": config_label(family, grid, mode),
               "grid": format_grid(grid),
               "gx": grid[0], "gy": grid[1], "gz": grid[2],
               "aggregation": mode, "replication": int(grid[1]) if family == "cagnet-1.5d" else None,
               "comm_precision": precision}
        for key in RECORD_TIME_KEYS:
            rec[key] = float(pred[key][k])
        for key in COMM_OP_KEYS:
            rec[key] = float(pred[key][k])
        rec["memory_bytes"] = int(round(float(pred["memory_bytes"][k])))
        rec["memory_gib"] = float(pred["memory_gib"][k])
        rec["feasible"] = bool(pred["feasible"][k])
        rec["estimated"] = bool(pred["estimated"][k]) if "estimated" in pred else False  # plexus-3d: no partition
        out.append(rec)
    return out


def joint_ranking(workload, machine, gpus: int, *, algorithms=ALGORITHM_NAMES, precisions=("fp32",),
                  graph=None, seed: int = 0, replication: int | None = None, aggregation: str | None = None,
                  optimizer: str | None = None, plexus_options=None) -> Ranking:
    """Every configuration of every family in ``algorithms`` at every precision, ranked.

    ``graph`` (a :class:`plexus_tune.graph.core.Graph` or its adjacency) supplies the
    partition-dependent figures: SuperGCN's boundary rows from its METIS partition into G
    parts (``seed``) and the 2D/3D sparse pieces; without it those families use the
    documented estimates and their records say ``estimated``. ``replication`` keeps the
    1.5D configurations of that c (it must divide G, c c <= G), ``aggregation`` the
    supergcn mode; ``optimizer`` the optimizer step of ``other_ms`` (default the machine's);
    ``plexus_options`` the options of the plexus-3d model for the grids of
    :func:`family_grids` (e.g. the graph's sparsity).
    """
    machine = machine if isinstance(machine, Machine) else load_machine(machine)
    gpus = check_gpus(gpus)
    algorithms = tuple(algorithms)
    if replication is not None:
        if "cagnet-1.5d" not in algorithms:
            raise UserError("a replication factor applies to cagnet-1.5d only")
        check_replication(gpus, replication)
    modes = SUPERGCN_MODES
    if aggregation is not None:
        if "supergcn" not in algorithms:
            raise UserError("an aggregation mode applies to supergcn only")
        modes = (check_aggregation(aggregation),)
    precisions = tuple(str(parse_comm_precision(p)) for p in precisions)
    if not precisions:
        raise UserError("give at least one communication precision")
    start = time.perf_counter()
    plan = pattern = None
    if graph is not None:
        adjacency = getattr(graph, "adjacency", graph)
        if adjacency.shape[0] != workload.nodes:
            raise UserError(f"the graph has {adjacency.shape[0]} nodes but the workload {workload.nodes}; "
                            "describe the workload by the graph")
        if "supergcn" in algorithms:
            plan = partition_exchange(adjacency, gpus, seed=seed)
        if "cagnet-2d" in algorithms or "cagnet-3d" in algorithms:
            pattern = PiecePattern(adjacency)
    records: list[dict] = []
    estimated = set()
    for family in algorithms:
        grids = family_grids(family, gpus)
        if family == "cagnet-1.5d" and replication is not None:
            grids = grids[grids[:, 1] == int(replication)] if replication > 1 else grids[:0]
        if len(grids) == 0:
            continue
        for precision in precisions:
            if family == "supergcn":
                for mode in modes:
                    options = {"aggregation": mode} if plan is None else {"aggregation": mode, "plan": plan}
                    pred = predict_run_grids(workload, machine, grids, comm_precision=precision, algorithm=family,
                                             optimizer=optimizer, options=options)
                    records += _records(family, pred, precision, mode)
            else:
                options = {"graph": pattern} if pattern is not None and family in ("cagnet-2d", "cagnet-3d") else None
                if family == "plexus-3d":
                    options = plexus_options
                pred = predict_run_grids(workload, machine, grids, comm_precision=precision, algorithm=family,
                                         optimizer=optimizer, options=options)
                records += _records(family, pred, precision)
    for rec in records:
        if rec["estimated"]:
            estimated.add(rec["algorithm"])
    order = sorted(range(len(records)), key=lambda i: (not records[i]["feasible"], records[i]["total_ms"]))
    ranked = [records[i] for i in order]
    for rank, rec in enumerate(ranked, start=1):
        rec["rank"] = rank
    return Ranking(ranked, gpus, precisions, tuple(algorithms), time.perf_counter() - start,
                   tuple(f for f in algorithms if f in estimated))

