"""The algorithm families the trainer runs, their process grids and options (docs/algorithms.md).

``plexus-3d`` (the Gx x Gy x Gz grid), ``cagnet-1d`` and ``cagnet-1.5d`` (block rows
replicated c times: grid (G/c, c, 1)), ``cagnet-2d`` (SUMMA on a Pr x Pc grid:
(Pr, Pc, 1)), ``cagnet-3d`` (split-3D SUMMA on Pr x Pc x Pl, Pl >= 2) and ``supergcn``
(a partition into G parts with pre, post or hybrid aggregation of the cut edges: grid
(G, 1, 1)). A run's ``grid`` is its process grid, so launchers, records and run
identities treat every family alike. Each family is one :class:`TrainedFamily` of
:data:`TRAINED_FAMILIES`; nothing here compares a family's name.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, replace
from typing import Callable

from plexus_tune.errors import UserError
from plexus_tune.graph.partition import AGGREGATION_MODES, check_aggregation
from plexus_tune.model.prediction import DEFAULT_ALGORITHM
from plexus_tune.model.volumes import check_replication

DEFAULT_AGGREGATION = "hybrid"
#: Options of one family only, with their names in messages: a family accepts those in its ``options``.
FAMILY_OPTIONS = {"replication": "the replication factor", "aggregation": "the aggregation mode",
                  "block_rows": "row blocks", "overlap": "overlap", "layer_norm": "layer norm",
                  "permute": "a permutation", "shards": "2D shard files",
                  "dp": "data-parallel groups", "batch_size": "the batch size"}


def _text(grid) -> str:
    return "x".join(map(str, grid))


def _as_given(name, grid, gpus, replication):
    """The grid as given (plexus-3d)."""
    if grid is None:
        raise UserError(f"{name} needs a grid Gx x Gy x Gz (--grid GXxGYxGZ)", parameter="grid")
    return grid


def _summa_grid(layers: str):
    """A Pr x Pc x 1 grid (2D) or Pr x Pc x Pl with Pl >= 2 (split 3D)."""
    def grid_of(name, grid, gpus, replication):
        flat = layers == "one"
        if grid is None or (grid[2] != 1 if flat else grid[2] < 2):
            want = "its Pr x Pc process grid, given as PrxPcx1 (e.g. 2x4x1)" if flat else \
                "its Pr x Pc x Pl process grid with Pl >= 2 mesh layers (e.g. 2x1x2; Pl = 1 is cagnet-2d)"
            raise UserError(f"{name} needs {want}", parameter="grid")
        return grid
    return grid_of


def _block_rows_grid(name, grid, gpus, replication):
    """(G/c, c, 1) for cagnet-1.5d, from the GPU count and c or from a grid of that form."""
    c = replication if replication is not None else (grid[1] if grid is not None else None)
    if c is None:
        raise UserError(f"{name} needs the replication factor c", parameter="replication")
    c = check_replication(gpus, int(c))
    return (gpus // c, c, 1)


def _one_row_grid(name, grid, gpus, replication):
    """(G, 1, 1): cagnet-1d and supergcn."""
    return (gpus, 1, 1)


@dataclass(frozen=True)
class TrainedFamily:
    """What the trainer needs of a family: its trainer class (``module:class``), how its process
    grid follows from the settings (``grid_of(name, grid, gpus, replication)``; ``fixed_grid``:
    the grid is given as it is, not derived from the GPU count), the options of
    :data:`FAMILY_OPTIONS` it accepts, and the defaults it fills in."""

    name: str
    entry: str
    grid_of: Callable
    fixed_grid: bool = False
    options: frozenset = frozenset()

    def normalize(self, config, grid):
        changes = {"algorithm": self.name, "grid": grid}
        if "permute" not in self.options:
            changes["permute"] = "none"  # the graph's own node order
        if "aggregation" in self.options:
            changes["aggregation"] = check_aggregation(config.aggregation or DEFAULT_AGGREGATION)
        if "replication" in self.options:
            changes["replication"] = grid[1]
        return replace(config, **changes)


#: The families with a trainer, in the planner's names.
TRAINED_FAMILIES = {f.name: f for f in (
    TrainedFamily("plexus-3d", "plexus_tune.trainer.plexus3d:Plexus3dTrainer", _as_given, True,
                  frozenset({"block_rows", "overlap", "layer_norm", "permute", "shards"})),
    TrainedFamily("cagnet-1d", "plexus_tune.trainer.cagnet:Cagnet15dTrainer", _one_row_grid),
    TrainedFamily("cagnet-1.5d", "plexus_tune.trainer.cagnet:Cagnet15dTrainer", _block_rows_grid,
                  options=frozenset({"replication"})),
    TrainedFamily("cagnet-2d", "plexus_tune.trainer.cagnet:Cagnet2dTrainer", _summa_grid("one"), True),
    TrainedFamily("cagnet-3d", "plexus_tune.trainer.cagnet3d:Cagnet3dTrainer", _summa_grid("several"), True),
    TrainedFamily("supergcn", "plexus_tune.trainer.partitioned:PartitionedTrainer", _one_row_grid,
                  options=frozenset({"aggregation"})),
    TrainedFamily("scalegnn-4d", "plexus_tune.trainer.scalegnn:ScaleGnnTrainer", _as_given, True,
                  frozenset({"dp", "batch_size"})),
)}
TRAINED_ALGORITHMS = tuple(TRAINED_FAMILIES)


def family_of(name) -> TrainedFamily:
    """The trained family of a name (default plexus-3d), else UserError."""
    text = str(name if name is not None else DEFAULT_ALGORITHM).strip().lower()
    if text not in TRAINED_FAMILIES:
        raise UserError(f"unknown algorithm {str(name).strip()!r}; the trainer runs {', '.join(TRAINED_ALGORITHMS)}")
    return TRAINED_FAMILIES[text]


def check_algorithm(name) -> str:
    """The canonical name of a trained algorithm family, else UserError."""
    return family_of(name).name


def process_grid(algorithm: str, *, grid=None, gpus: int | None = None, replication: int | None = None) -> tuple:
    """The (Gx, Gy, Gz) process grid of a family's configuration, checked; UserError says what to change.

    ``cagnet-1d``: (G, 1, 1); ``cagnet-1.5d``: (G/c, c, 1) from ``gpus`` and
    ``replication`` c (c | G, c c <= G) or from a grid of that form; ``cagnet-2d``: the
    grid (Pr, Pc, 1); ``cagnet-3d``: the grid (Pr, Pc, Pl), Pl >= 2; ``supergcn``:
    (G, 1, 1); ``plexus-3d``: the grid as given.
    """
    family = family_of(algorithm)
    name = family.name
    if grid is not None:
        grid = tuple(int(g) for g in grid)
        if len(grid) != 3 or any(g < 1 for g in grid):
            raise UserError(f"grid must be three positive sizes Gx x Gy x Gz, got {grid}")
        total = grid[0] * grid[1] * grid[2]
        if gpus is not None and int(gpus) != total and "dp" not in family.options:  # dp groups: checked by the run
            raise UserError(f"grid {_text(grid)} has {total} ranks but the GPU count is {gpus}; "
                            "make the product of the grid equal the GPU count", parameter="gpus")
        gpus = total
    if replication is not None and "replication" not in family.options and replication != 1:
        raise UserError(f"the replication factor is an option of cagnet-1.5d, not of {name}", parameter="replication")
    if family.fixed_grid:
        return family.grid_of(name, grid, gpus, replication)
    if gpus is None:
        raise UserError(f"{name} needs the GPU count (or its process grid)", parameter="gpus")
    gpus = int(gpus)
    if gpus < 1:
        raise UserError(f"the GPU count must be at least 1, got {gpus}", parameter="gpus")
    want = family.grid_of(name, grid, gpus, replication)
    if grid is not None and grid != want:
        raise UserError(f"{name} on {gpus} ranks runs on the grid {_text(want)}, not {_text(grid)}", parameter="grid")
    return want


def check_family_options(config) -> None:
    """UserError if ``config`` sets an option its algorithm family does not have."""
    family = family_of(config.algorithm)
    if config.aggregation is not None:
        if "aggregation" not in family.options:
            raise UserError(f"the aggregation mode is an option of supergcn, not of {family.name}",
                            parameter="aggregation")
        check_aggregation(config.aggregation)
    if config.replication is not None and "replication" not in family.options:
        raise UserError(f"the replication factor is an option of cagnet-1.5d, not of {family.name}",
                        parameter="replication")
    if "batch_size" in family.options and config.batch_size is None:
        raise UserError(f"{family.name} samples B vertices per step: give the batch size", parameter="batch_size")
    if int(config.dp or 1) < 1:
        raise UserError(f"the data-parallel degree must be at least 1, got {config.dp}", parameter="dp")
    for key, on in (("dp", int(config.dp or 1) != 1), ("batch_size", config.batch_size is not None)):
        if on and key not in family.options:
            owners = ", ".join(f.name for f in TRAINED_FAMILIES.values() if key in f.options)
            raise UserError(f"{FAMILY_OPTIONS[key]} is an option of {owners}, not of {family.name}"
                            + (" (which trains on the whole graph)" if key == "batch_size" else ""), parameter=key)
    given = {"block_rows": config.block_rows is not None, "overlap": bool(config.overlap),
             "layer_norm": bool(config.layer_norm)}
    unsupported = [FAMILY_OPTIONS[key] for key, on in given.items() if on and key not in family.options]
    if unsupported:
        raise UserError(f"{', '.join(unsupported)}: options of the plexus-3d trainer, not of {family.name}")
    if "permute" not in family.options and config.permute not in ("none", "double"):
        raise UserError(f"{family.name} trains the graph in its own node order; leave the permutation out "
                        "(or give none)", parameter="permute")


def check_shard_input(algorithm, path) -> None:
    """UserError if the family of ``algorithm`` cannot read 2D shard files (``path``)."""
    family = family_of(algorithm)
    if "shards" not in family.options:
        raise UserError(f"{path}: {family.name} reads the whole graph, not 2D shard files; give the graph file")


def normalize_config(config):
    """``config`` with its family's settings filled in: the process grid checked, no permutation
    for the families that keep the graph's order, supergcn's aggregation mode (default
    hybrid) and cagnet-1.5d's replication factor (the grid's Gy)."""
    family = family_of(config.algorithm)
    check_family_options(config)
    given = tuple(int(g) for g in config.grid) if config.grid is not None else None
    if not family.fixed_grid and given == (1, 1, 1) and config.gpus not in (None, 1):
        given = None  # the dataclass default: the family's grid follows from the GPU count
    grid = process_grid(family.name, grid=given, gpus=config.gpus, replication=config.replication)
    return family.normalize(config, grid)


def trainer_class(algorithm: str):
    """The rank trainer class of a family (its ``entry``, imported here: the trainers load
    torch, the checks above do not)."""
    module, _, name = family_of(algorithm).entry.partition(":")
    return getattr(importlib.import_module(module), name)


__all__ = ["AGGREGATION_MODES", "DEFAULT_AGGREGATION", "DEFAULT_ALGORITHM", "TRAINED_ALGORITHMS", "TRAINED_FAMILIES",
           "TrainedFamily", "check_algorithm", "check_family_options", "check_shard_input", "family_of",
           "normalize_config", "process_grid", "trainer_class"]
