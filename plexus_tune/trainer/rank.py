"""The rank entry point: load the graph once, then train each configuration with its family's trainer.

:func:`rank_main` runs on every rank (local processes, torchrun or srun;
:func:`plexus_tune.trainer.run.train` starts them) and returns, on rank 0, the raw
results that :func:`plexus_tune.measure.training.run_training` turns into a record.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from plexus_tune.graph.io import resolve_graph
from plexus_tune.graph.splits import node_split, split_sizes
from plexus_tune.trainer.algorithms import trainer_class
from plexus_tune.trainer.data import MemoryData, ShardData, is_shard_directory, prepare_graph


def assemble_outputs(blocks, n: int, classes: int, out_perm) -> np.ndarray:
    """Full (N, C) logits in the original node order from the ranks' output blocks."""
    permuted = None
    for item in blocks:
        if item is None:
            continue
        rows, cols, block_ = item
        if permuted is None:
            permuted = np.zeros((n, classes), dtype=block_.dtype)
        permuted[rows.start:rows.stop, cols.start:cols.stop] = block_[: rows.real, : cols.real]
    out = np.empty_like(permuted)
    out[np.asarray(out_perm)] = permuted
    return out


def rank_main(rank: int, world_size: int, graph_source, configs, device_kind: str = "cpu"):
    """Train every configuration in ``configs`` (in order) on this rank.

    Returns, on rank 0, one result per configuration (losses, per-rank per-epoch
    timers, memory, shard nonzeros, and the assembled outputs when asked); other
    ranks return None. ``graph_source`` is a Graph, a path, or ("synthetic", spec).
    """
    import torch.distributed as dist

    device = "cpu"
    if device_kind == "cuda":
        device = f"cuda:{torch.cuda.current_device()}"
    t_load = time.perf_counter()
    shards = ShardData(graph_source) if is_shard_directory(graph_source) else None
    pg = None if shards is not None else prepare_graph(resolve_graph(graph_source))
    load_s = time.perf_counter() - t_load
    results = []
    for config in configs:
        t_setup = time.perf_counter()
        data = shards if shards is not None else MemoryData(pg, config.permute, config.seed,
                                                                      config.extra.get("permute_grid", config.grid))
        split, split_text = node_split(graph_source if isinstance(graph_source, (str, os.PathLike)) else None,
                                       data.nodes, config.seed)
        trainer = trainer_class(config.algorithm)(data, config, rank, world_size, device=device, split=split)
        setup_s = time.perf_counter() - t_setup
        try:
            losses = trainer.train(int(config.epochs))
            want_outputs = bool(config.collect_outputs or config.check)
            payload = {
                "timers": trainer.timer.epochs,
                "memory": trainer.memory(),
                "shard_nnz": trainer.shard_nnz,
                "comm_bytes": trainer.comm_epochs,
                "setup_s": setup_s,
                "load_s": load_s,
                "output": trainer.output_block() if want_outputs else None,
                "check_blocks": getattr(trainer, "check_payload", None),  # a family's own one-step check
            }
            gathered = [None] * world_size if rank == 0 else None
            dist.gather_object(payload, gathered, dst=0)
        finally:
            trainer.close()
        if rank == 0:
            result = {
                "losses": losses,
                "timers": [g["timers"] for g in gathered],
                "memory": [g["memory"] for g in gathered],
                "shard_nnz": [g["shard_nnz"] for g in gathered],
                "comm_bytes": [g["comm_bytes"] for g in gathered],
                "accuracy": trainer.accuracy,
                "optimizer": trainer.optimizer_name,
                "split": split_text,
                "split_sizes": split_sizes(split),
                "split_codes": split if (config.check or config.collect_outputs) else None,
                "setup_s": max(g["setup_s"] for g in gathered),
                "load_s": max(g["load_s"] for g in gathered),
                "nodes": data.nodes,
                "nnz": data.nnz,
                "raw_nnz": data.raw_nnz,
                "features": data.num_features,
                "classes": data.num_classes,
                "graph_name": data.name,
                "permute": data.permute,
                "widths": trainer.widths,
                **trainer.record_shapes(),
                "outputs": None,
            }
            if any(g["check_blocks"] is not None for g in gathered):
                result["check_step"] = trainer.assemble_check([g["check_blocks"] for g in gathered])
            if config.collect_outputs or config.check:
                result["outputs"] = assemble_outputs(
                    [g["output"] for g in gathered], data.nodes, data.num_classes, trainer.out_perm)
            results.append(result)
    return results if rank == 0 else None
