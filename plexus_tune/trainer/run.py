"""Start the trainer's ranks for one configuration and return their raw results.

:func:`validate` checks a configuration at the edge; :func:`train` starts ``prod(grid)``
ranks with a launcher (local processes, an emulated cluster, torchrun, Slurm; see
:mod:`plexus_tune.launch.launchers`) or joins the process set torchrun or srun started,
and returns every rank's timers, losses and memory as the ranks report them
(:class:`TrainResult`). Turning them into a run record is the measurement stage's
(:mod:`plexus_tune.measure.training`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.graph.generators import parse_spec
from plexus_tune.graph.permute import TWO_SIDED_MODES
from plexus_tune.graph.shards import check_shard_files
from plexus_tune.launch import detect_environment, run_in_environment
from plexus_tune.launch.launchers import Launcher
from plexus_tune.launch.worker import rank_placement
from plexus_tune.model.comm_precision import CommPrecision, check_backend, parse_comm_precision
from plexus_tune.model.memory import check_training_memory as check_memory_floor
from plexus_tune.trainer.algorithms import check_shard_input
from plexus_tune.trainer.config import BACKEND_CHOICES, DTYPE_CHOICES, PERMUTE_CHOICES, TrainConfig


@dataclass
class TrainResult:
    """What the ranks of one run returned, before any record is made.

    ``config``: the configuration as run (its launcher, cluster and machine filled in);
    ``results``: rank 0's result per configuration (per-rank timers, losses, memory, as
    :func:`~plexus_tune.trainer.rank.rank_main` returns them); ``placement``: each rank's
    placement report; ``ranks_per_node``: what the placement is checked against;
    ``launcher``: who started the ranks; ``wall_s``: the whole run; ``device``: cpu or the
    CUDA device name; ``source``: the graph source the ranks loaded.
    """

    config: TrainConfig
    results: list
    placement: list = field(default_factory=list)
    ranks_per_node: int | None = None
    launcher: str | None = None
    wall_s: float = 0.0
    device: str = "cpu"
    source: object = None


def graph_source(config: TrainConfig):
    if (config.graph is None) == (config.synthetic is None):
        raise UserError("give exactly one of a graph and a synthetic spec", parameter=("graph", "synthetic"))
    if config.synthetic is not None:
        parse_spec(config.synthetic)  # a malformed spec fails once here, not in every rank
        return ("synthetic", config.synthetic)
    if isinstance(config.graph, (str, os.PathLike)):
        path = Path(config.graph)
        if not path.exists():
            raise UserError(f"graph file {path} does not exist; check the path or make one with 'plexus-tune graph'")
        from plexus_tune.trainer.data import is_shard_directory

        if is_shard_directory(path):
            check_shard_input(config.algorithm, path)
            _check_shards(path, config)
        return str(path)
    return config.graph


def _check_shards(path: Path, config: TrainConfig) -> None:
    """A shard directory must carry node data and (double or local permutation) a symmetric graph; no --check."""
    manifest = check_shard_files(path)
    if not manifest.get("node_data"):
        raise UserError(f"{path}: the shards were written without features and labels; re-shard with node data")
    if manifest["permutation"]["mode"] in TWO_SIDED_MODES and not manifest.get("symmetric"):
        raise UserError(f"{path}: {manifest['permutation']['mode']}-permuted shards of a directed graph lack the alternate layout; "
                        "re-shard it with a single permutation or none")
    if config.check:
        raise UserError("the check against the serial reference needs the whole graph; give the graph file, not its shards",
                        parameter="check")


def validate(config: TrainConfig, world_size: int | None = None) -> None:
    """Check a configuration at the edge; raises UserError with what to change."""
    grid = tuple(config.grid)
    if len(grid) != 3 or any(int(g) < 1 for g in grid):
        raise UserError(f"grid must be three positive sizes Gx x Gy x Gz, got {grid}")
    total = config.world_size
    if config.gpus is not None and int(config.gpus) != total:
        raise UserError(f"grid {'x'.join(map(str, grid))} has {total} ranks but the GPU count is {config.gpus}; "
                        "make the product of the grid equal the GPU count", parameter="gpus")
    if world_size is not None and world_size != total:
        raise UserError(f"grid {'x'.join(map(str, grid))} has {total} ranks but the launcher started "
                        f"{world_size}; launch as many processes as the grid has ranks")
    if config.layers < 1 or config.hidden < 1:
        raise UserError("the number of layers and the hidden width must be positive", parameter=("layers", "hidden"))
    if config.epochs < 1 or not (0 <= config.warmup < config.epochs):
        raise UserError(f"need epochs >= 1 and 0 <= warmup < epochs, got epochs={config.epochs} warmup={config.warmup}")
    if config.permute not in PERMUTE_CHOICES:
        raise UserError(f"the permutation must be one of {', '.join(PERMUTE_CHOICES)}", parameter="permute")
    if config.dtype not in DTYPE_CHOICES:
        raise UserError(f"the dtype must be one of {', '.join(DTYPE_CHOICES)}", parameter="dtype")
    if config.backend not in BACKEND_CHOICES:
        raise UserError(f"the backend must be one of {', '.join(BACKEND_CHOICES)}", parameter="backend")
    if config.block_rows is not None and int(config.block_rows) < 1:
        raise UserError("the row block must be a positive number of rows", parameter="block_rows")
    if config.overlap and not config.block_rows:
        raise UserError("overlap needs row blocks (it overlaps the all-reduce of one row block with the next SpMM)",
                        parameter="block_rows")
    choice = config.comm_precision if isinstance(config.comm_precision, CommPrecision) else parse_comm_precision(config.comm_precision)
    check_backend(config.backend, choice)
    if config.backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            raise UserError("the nccl backend needs CUDA GPUs, and none is visible; use the gloo backend on CPU", parameter="backend")
        if world_size is None and torch.cuda.device_count() < total:
            raise UserError(f"grid needs {total} GPUs but only {torch.cuda.device_count()} are visible")


def shared_node_count(placement: list[dict]) -> int:
    """Ranks on rank 0's node (same host and node index): the ranks per node the model's
    placement is checked against when an external launcher chose the layout."""
    first = placement[0]
    return sum((p.get("host"), p.get("node")) == (first.get("host"), first.get("node")) for p in placement)


def _rank_main_placed(rank: int, world_size: int, env, *args) -> tuple:
    """The trainer's rank body, then every rank's placement report gathered on all ranks
    (a rank of the process set that torchrun or srun started, ``env`` its place in it)."""
    import torch.distributed as dist

    from plexus_tune.trainer.rank import rank_main

    value = rank_main(rank, world_size, *args)
    placement: list = [None] * world_size
    dist.all_gather_object(placement, rank_placement(env))
    return value, placement


def prepare(config: TrainConfig, launcher=None, env=None) -> tuple[TrainConfig, object]:
    """The configuration as it will run (launcher, cluster and machine filled in when this process
    starts the ranks) and the launcher that starts them (None under torchrun or srun). ``config``
    comes with its family's settings (:meth:`plexus_tune.measure.identity.RunSpec.train_config`,
    :func:`plexus_tune.trainer.algorithms.normalize_config`). Raises UserError for a configuration
    :func:`validate` rejects or ranks this host cannot hold (:func:`check_training_memory`)."""
    if env is None:
        launcher = launcher or Launcher()
        launcher.check(config.world_size)
        check_training_memory(config, launcher)
        config = replace(config, launcher=launcher.name, cluster=launcher.cluster(),
                         machine=config.machine or launcher.machine_name())
    validate(config, env.world_size if env else None)
    return config, launcher


def check_training_memory(config: TrainConfig, launcher=None) -> None:
    """UserError if the ranks that ``launcher`` starts on this host cannot hold the weights and
    activations (:func:`plexus_tune.model.memory.check_training_memory`; N of a synthetic spec, else 0)."""
    nodes = int(parse_spec(config.synthetic)[1].get("nodes", 0)) if config.synthetic else 0
    check_memory_floor(config.layers, config.hidden, nodes, launcher)


def train(config: TrainConfig, *, launcher=None, env=None) -> TrainResult | None:
    """Train one configuration (with its family's settings; :func:`prepare` checks it and fills in its
    launcher) and return the ranks' raw results (``config``: the configuration as run).

    Started by hand, ``launcher`` starts ``prod(grid)`` ranks; under torchrun or srun
    (``env``, :func:`plexus_tune.launch.detect_environment`) this process is one rank and
    only rank 0 gets the result (others None). A failing rank raises
    :class:`plexus_tune.launch.RankFailure`.
    """
    from plexus_tune.trainer.rank import rank_main

    config, launcher = prepare(config, launcher, env)
    source = graph_source(config)
    device_kind = "cuda" if config.backend == "nccl" else "cpu"
    world = config.world_size
    start = time.perf_counter()
    if env is not None:
        results, placement = run_in_environment(_rank_main_placed, env, args=(env, source, [config], device_kind),
                                                backend=config.backend, timeout_s=config.timeout_s,
                                                threads_per_rank=config.threads_per_rank)
        if env.rank != 0:
            return None
        per_node, who = shared_node_count(placement), env.source
    else:
        launched = launcher.run(rank_main, world, (source, [config], device_kind), backend=config.backend,
                                timeout_s=config.timeout_s, threads_per_rank=config.threads_per_rank,
                                preload=("torch._dynamo", "plexus_tune.trainer.rank"))
        results, placement, per_node, who = launched.values[0], launched.placement, launcher.ranks_per_node, None
    device = "cpu"
    if device_kind == "cuda":
        import torch

        device = torch.cuda.get_device_name(0)
    return TrainResult(config=config, results=results, placement=placement, ranks_per_node=per_node, launcher=who,
                       wall_s=time.perf_counter() - start, device=device, source=source)
