"""The algorithm families the trainer runs, their process grids and options (docs/algorithms.md).

``plexus-3d`` (the Gx x Gy x Gz grid), ``cagnet-1d`` and ``cagnet-1.5d`` (block rows
replicated c times: grid (G/c, c, 1)), ``cagnet-2d`` (SUMMA on a Pr x Pc grid:
(Pr, Pc, 1)) and ``supergcn`` (a partition into G parts with pre, post or hybrid
aggregation of the cut edges: grid (G, 1, 1)). A run's ``grid`` is its process grid, so
launchers, records and run identities treat every family alike.
"""

from __future__ import annotations

import importlib
from dataclasses import replace

from plexus_tune.errors import UserError
from plexus_tune.graph.partition import AGGREGATION_MODES, check_aggregation
from plexus_tune.model.prediction import DEFAULT_ALGORITHM
from plexus_tune.model.volumes import check_replication

#: Families with a trainer, in the planner's names.
TRAINED_ALGORITHMS = ("plexus-3d", "cagnet-1d", "cagnet-1.5d", "cagnet-2d", "supergcn", "scalegnn-4d")
#: Families whose runs are data-parallel groups of a 3D grid trained on samples (``dp``, ``batch_size``).
MINIBATCH_ALGORITHMS = ("scalegnn-4d",)
DEFAULT_AGGREGATION = "hybrid"


def check_algorithm(name) -> str:
    """The canonical name of a trained algorithm family, else UserError."""
    text = str(name if name is not None else DEFAULT_ALGORITHM).strip().lower()
    if text == "cagnet-3d":
        raise UserError("cagnet-3d has a cost model (the planner predicts it) but no trainer; "
                        f"the trainer runs {', '.join(TRAINED_ALGORITHMS)}")
    if text not in TRAINED_ALGORITHMS:
        raise UserError(f"unknown algorithm {str(name).strip()!r}; the trainer runs {', '.join(TRAINED_ALGORITHMS)}")
    return text


def process_grid(algorithm: str, *, grid=None, gpus: int | None = None, replication: int | None = None) -> tuple:
    """The (Gx, Gy, Gz) process grid of a family's configuration, checked; UserError says what to change.

    ``cagnet-1d``: (G, 1, 1); ``cagnet-1.5d``: (G/c, c, 1) from ``gpus`` and
    ``replication`` c (c | G, c c <= G) or from a grid of that form; ``cagnet-2d``: the
    grid (Pr, Pc, 1); ``supergcn``: (G, 1, 1); ``plexus-3d``: the grid as given.
    """
    algorithm = check_algorithm(algorithm)
    if grid is not None:
        grid = tuple(int(g) for g in grid)
        if len(grid) != 3 or any(g < 1 for g in grid):
            raise UserError(f"grid must be three positive sizes Gx x Gy x Gz, got {grid}")
    if algorithm in ("plexus-3d", *MINIBATCH_ALGORITHMS):
        if grid is None:
            raise UserError(f"{algorithm} needs a grid Gx x Gy x Gz", parameter="grid")
        return grid
    if grid is not None:
        total = grid[0] * grid[1] * grid[2]
        if gpus is not None and int(gpus) != total:
            raise UserError(f"grid {'x'.join(map(str, grid))} has {total} ranks but the GPU count is {gpus}; "
                            "make the product of the grid equal the GPU count", parameter="gpus")
        gpus = total
    if gpus is None:
        raise UserError(f"{algorithm} needs the GPU count (or its process grid)", parameter="gpus")
    gpus = int(gpus)
    if gpus < 1:
        raise UserError(f"the GPU count must be at least 1, got {gpus}", parameter="gpus")
    if algorithm == "cagnet-2d":
        if grid is None or grid[2] != 1:
            raise UserError("cagnet-2d needs its Pr x Pc process grid, given as PrxPcx1 (e.g. 2x4x1)",
                            parameter="grid")
        return grid
    if algorithm == "cagnet-1.5d":
        c = replication if replication is not None else (grid[1] if grid is not None else None)
        if c is None:
            raise UserError("cagnet-1.5d needs the replication factor c", parameter="replication")
        c = check_replication(gpus, int(c))
        want = (gpus // c, c, 1)
    else:
        if replication not in (None, 1):
            raise UserError(f"the replication factor is an option of cagnet-1.5d, not of {algorithm}",
                            parameter="replication")
        want = (gpus, 1, 1)
    if grid is not None and grid != want:
        raise UserError(f"{algorithm} on {gpus} ranks runs on the grid {'x'.join(map(str, want))}, "
                        f"not {'x'.join(map(str, grid))}", parameter="grid")
    return want


def check_family_options(config) -> None:
    """UserError if ``config`` sets an option its algorithm family does not have."""
    algorithm = check_algorithm(config.algorithm)
    if algorithm in MINIBATCH_ALGORITHMS:
        if config.batch_size is None:
            raise UserError(f"{algorithm} samples B vertices per step: give the batch size", parameter="batch_size")
        if int(config.dp or 0) < 1:
            raise UserError(f"the data-parallel degree must be at least 1, got {config.dp}", parameter="dp")
    else:
        if int(config.dp or 1) != 1:
            raise UserError(f"data-parallel groups are an option of {', '.join(MINIBATCH_ALGORITHMS)}, not of {algorithm}",
                            parameter="dp")
        if config.batch_size is not None:
            raise UserError(f"the batch size is an option of {', '.join(MINIBATCH_ALGORITHMS)}, not of {algorithm} "
                            "(which trains on the whole graph)", parameter="batch_size")
    if config.aggregation is not None:
        if algorithm != "supergcn":
            raise UserError(f"the aggregation mode is an option of supergcn, not of {algorithm}",
                            parameter="aggregation")
        check_aggregation(config.aggregation)
    if algorithm == "plexus-3d":
        if config.replication is not None:
            raise UserError("the replication factor is an option of cagnet-1.5d, not of plexus-3d",
                            parameter="replication")
        return
    unsupported = [name for name, on in (("row blocks", config.block_rows is not None), ("overlap", config.overlap),
                                         ("layer norm", config.layer_norm)) if on]
    if unsupported:
        raise UserError(f"{', '.join(unsupported)}: options of the plexus-3d trainer, not of {algorithm}")
    if config.permute not in ("none", "double"):
        raise UserError(f"{algorithm} trains the graph in its own node order; leave the permutation out "
                        "(or give none)", parameter="permute")


def normalize_config(config):
    """``config`` with its family's settings filled in: the process grid checked, no permutation
    for the other families (they keep the graph's order), supergcn's aggregation mode
    (default hybrid) and cagnet-1.5d's replication factor (the grid's Gy)."""
    algorithm = check_algorithm(config.algorithm)
    check_family_options(config)
    given = tuple(int(g) for g in config.grid) if config.grid is not None else None
    if algorithm not in ("plexus-3d", *MINIBATCH_ALGORITHMS) and given == (1, 1, 1) and config.gpus not in (None, 1):
        given = None  # the dataclass default: the family's grid follows from the GPU count
    grid = process_grid(algorithm, grid=given, gpus=config.gpus, replication=config.replication)
    changes = {"algorithm": algorithm, "grid": grid}
    if algorithm != "plexus-3d":
        changes["permute"] = "none"
    if algorithm == "supergcn":
        changes["aggregation"] = check_aggregation(config.aggregation or DEFAULT_AGGREGATION)
    if algorithm == "cagnet-1.5d":
        changes["replication"] = grid[1]
    return replace(config, **changes)


#: The rank trainer class of each family, as "module:class" (imported when a rank starts).
TRAINER_ENTRY = {
    "plexus-3d": "plexus_tune.trainer.plexus3d:Plexus3dTrainer",
    "cagnet-1d": "plexus_tune.trainer.cagnet:Cagnet15dTrainer",
    "cagnet-1.5d": "plexus_tune.trainer.cagnet:Cagnet15dTrainer",
    "cagnet-2d": "plexus_tune.trainer.cagnet:Cagnet2dTrainer",
    "supergcn": "plexus_tune.trainer.partitioned:PartitionedTrainer",
    "scalegnn-4d": "plexus_tune.trainer.scalegnn:ScaleGnnTrainer",
}


def trainer_class(algorithm: str):
    """The rank trainer class of a family (:data:`TRAINER_ENTRY`, imported here: the trainers
    load torch, the checks above do not)."""
    module, _, name = TRAINER_ENTRY[check_algorithm(algorithm)].partition(":")
    return getattr(importlib.import_module(module), name)


__all__ = ["MINIBATCH_ALGORITHMS", "AGGREGATION_MODES", "DEFAULT_AGGREGATION", "DEFAULT_ALGORITHM", "TRAINED_ALGORITHMS", "check_algorithm",
           "check_family_options", "normalize_config", "process_grid", "TRAINER_ENTRY", "trainer_class"]
