"""The algorithm families the trainer runs: their process grids, options and trainer classes
(docs/algorithms.md).

Every family is a :class:`plexus_tune.model.family.Family` of the registry: its
configurations of G give the process grid of a run (``grid`` in the record, so
launchers, records and run identities treat every family alike), its ``choices`` and
``trainer_options`` the options a run may set, and its ``trainer_entry``
(``module:Class``) the rank trainer, imported here. Nothing here compares a family's name.
"""

from __future__ import annotations

import importlib
from dataclasses import replace

from plexus_tune.errors import UserError
from plexus_tune.graph.partition import AGGREGATION_MODES, check_aggregation
from plexus_tune.model.family import DEFAULT_FAMILY, FAMILIES, Family, trained_families
from plexus_tune.model.family import family_of as registered_family
from plexus_tune.model.grid import format_grid

DEFAULT_ALGORITHM = DEFAULT_FAMILY
#: Families with a trainer, in the registry's order.
TRAINED_ALGORITHMS = trained_families(None)
#: Run options (TrainConfig fields) some family's trainer has, with their names in messages.
TRAINER_OPTIONS = {"block_rows": "row blocks", "overlap": "overlap", "layer_norm": "layer norm",
                   "dp": "data-parallel groups", "batch_size": "the batch size"}


def _owners(option: str, attribute: str = "choices") -> str:
    return " and ".join(n for n, f in FAMILIES.items() if f.trainer_entry and option in getattr(f, attribute))


def family_of(name) -> Family:
    """The registered family of a name (default plexus-3d) that has a trainer, else UserError."""
    family = registered_family(name)
    if not family.trainer_entry:
        raise UserError(f"{family.name} has a cost model (the planner predicts it) but no trainer; "
                        f"the trainer runs {', '.join(TRAINED_ALGORITHMS)}")
    return family


def check_algorithm(name) -> str:
    """The canonical name of a trained algorithm family, else UserError."""
    return family_of(name).name


def process_grid(algorithm: str, *, grid=None, gpus: int | None = None, replication: int | None = None) -> tuple:
    """The (Gx, Gy, Gz) process grid of a family's configuration, checked; UserError says what to change.

    A family that names its grid (``takes_grid``: plexus-3d, cagnet-2d, cagnet-3d) runs
    on ``grid`` if it is one of its configurations of prod(grid) GPUs; the others run on
    their one configuration of ``gpus`` GPUs with the chosen ``replication``
    (cagnet-1d: (G, 1, 1); cagnet-1.5d: (G/c, c, 1); supergcn: (G, 1, 1)), which a
    given ``grid`` must equal.
    """
    family = family_of(algorithm)
    name = family.name
    if grid is not None:
        grid = tuple(int(g) for g in grid)
        if len(grid) != 3 or any(g < 1 for g in grid):
            raise UserError(f"grid must be three positive sizes Gx x Gy x Gz, got {grid}")
        total = grid[0] * grid[1] * grid[2]
        if gpus is not None and int(gpus) != total and "dp" not in family.choices:  # dp groups: checked by the run
            raise UserError(f"grid {format_grid(grid)} has {total} ranks but the GPU count is {gpus}; "
                            "make the product of the grid equal the GPU count", parameter="gpus")
        gpus = total
    if replication is not None and "replication" not in family.choices and int(replication) != 1:
        raise UserError(f"the replication factor is an option of {_owners('replication')}, not of {name}",
                        parameter="replication")
    if family.takes_grid:
        if grid is None:
            raise UserError(f"{name} needs its process grid (GxxGyxGz)", parameter="grid")
        allowed = [tuple(int(g) for g in row) for row in family.configurations(gpus)]
        if grid not in allowed:
            raise UserError(f"{name} on {gpus} ranks runs on {', '.join(map(format_grid, allowed)) or 'no grid'}, "
                            f"not {format_grid(grid)} ({family.summary})", parameter="grid")
        return grid
    if gpus is None:
        raise UserError(f"{name} needs the GPU count (or its process grid)", parameter="gpus")
    gpus = int(gpus)
    if gpus < 1:
        raise UserError(f"the GPU count must be at least 1, got {gpus}", parameter="gpus")
    fixed = {}
    if "replication" in family.choices:
        c = replication if replication is not None else (grid[1] if grid is not None else None)
        if c is None:
            raise UserError(f"{name} needs the replication factor c", parameter="replication")
        fixed["replication"] = family.check_choice("replication", int(c), gpus)
    rows = [tuple(int(g) for g in row) for row in family.configurations(gpus, **fixed)]
    if len(rows) != 1:
        raise UserError(f"{name} on {gpus} ranks has {len(rows)} process grids; choose one", parameter="grid")
    if grid is not None and grid != rows[0]:
        raise UserError(f"{name} on {gpus} ranks runs on the grid {format_grid(rows[0])}, not {format_grid(grid)}",
                        parameter="grid")
    return rows[0]


def some_grid(algorithm: str, gpus: int) -> tuple:
    """One process grid the family runs on ``gpus`` ranks (its first configuration; (G, 1, 1)
    where it has none), for settings that do not depend on the grid."""
    rows = family_of(algorithm).configurations(gpus)
    return tuple(int(g) for g in rows[0]) if len(rows) else (int(gpus), 1, 1)


def check_family_options(config) -> None:
    """UserError if ``config`` sets an option its algorithm family does not have."""
    family = family_of(config.algorithm)
    if config.aggregation is not None:
        if "aggregation" not in family.choices:
            raise UserError(f"the aggregation mode is an option of {_owners('aggregation')}, not of {family.name}",
                            parameter="aggregation")
        check_aggregation(config.aggregation)
    if config.replication is not None and "replication" not in family.choices:
        raise UserError(f"the replication factor is an option of {_owners('replication')}, not of {family.name}",
                        parameter="replication")
    if "batch_size" in family.choices and config.batch_size is None:
        raise UserError(f"{family.name} samples B vertices per step: give the batch size", parameter="batch_size")
    if int(config.dp or 1) < 1:
        raise UserError(f"the data-parallel degree must be at least 1, got {config.dp}", parameter="dp")
    for key, on in (("dp", int(config.dp or 1) != 1), ("batch_size", config.batch_size is not None)):
        if on and key not in family.trainer_options:
            raise UserError(f"{TRAINER_OPTIONS[key]} is an option of {_owners(key, 'trainer_options')}, not of "
                            f"{family.name}" + (" (which trains on the whole graph)" if key == "batch_size" else ""),
                            parameter=key)
    given = {"block_rows": config.block_rows is not None, "overlap": bool(config.overlap),
             "layer_norm": bool(config.layer_norm)}
    unsupported = [key for key, on in given.items() if on and key not in family.trainer_options]
    if unsupported:
        owners = _owners(unsupported[0], "trainer_options")
        raise UserError(f"{', '.join(TRAINER_OPTIONS[k] for k in unsupported)}: options of the {owners} trainer, "
                        f"not of {family.name}")
    if "permute" not in family.trainer_options and config.permute not in ("none", "double"):
        raise UserError(f"{family.name} trains the graph in its own node order; leave the permutation out "
                        "(or give none)", parameter="permute")


def check_shard_input(algorithm, path) -> None:
    """UserError if the trainer of ``algorithm``'s family cannot read 2D shard files (``path``)."""
    family = family_of(algorithm)
    if not family.reads_shards:
        raise UserError(f"{path}: {family.name} reads the whole graph, not 2D shard files; give the graph file")


def normalize_config(config):
    """``config`` with its family's settings filled in: the process grid checked, no permutation
    for the families that keep the graph's order, the aggregation mode (default the
    family's) and the replication factor (the grid's Gy) where the family chooses them."""
    family = family_of(config.algorithm)
    check_family_options(config)
    given = tuple(int(g) for g in config.grid) if config.grid is not None else None
    if not family.takes_grid and given == (1, 1, 1) and config.gpus not in (None, 1):
        given = None  # the dataclass default: the family's grid follows from the GPU count
    grid = process_grid(family.name, grid=given, gpus=config.gpus, replication=config.replication)
    changes = {"algorithm": family.name, "grid": grid}
    if "permute" not in family.trainer_options:
        changes["permute"] = "none"  # the graph's own node order
    if "aggregation" in family.choices:
        changes["aggregation"] = check_aggregation(config.aggregation or family.default_aggregation)
    if "replication" in family.choices:
        changes["replication"] = family.record_fields(grid)["replication"]  # c is the grid's Gy
    return replace(config, **changes)


def trainer_class(algorithm: str):
    """The rank trainer class of a family (its ``trainer_entry``, imported here: the trainers
    load torch, the checks above do not)."""
    module, _, name = family_of(algorithm).trainer_entry.partition(":")
    return getattr(importlib.import_module(module), name)


__all__ = ["AGGREGATION_MODES", "DEFAULT_ALGORITHM", "TRAINED_ALGORITHMS", "check_algorithm", "check_family_options",
           "check_shard_input", "family_of", "normalize_config", "process_grid", "some_grid", "trainer_class"]
