"""Trainer benchmark: 1x1x1 against serial PyG, every grid of G, memory against the model.

    .venv/bin/python runners/bench_trainer.py [--nodes 262144 --edges 2100000 --gpus 4 ...]

On an R-MAT graph (default 262,144 nodes, 2.1M undirected edges = 4.46M nonzeros with
self-loops) it prints
1. the epoch time of the 3D trainer on a 1x1x1 grid against the serial PyTorch
   Geometric GCN (same graph, model, optimizer and CPU threads);
2. the epoch time and breakdown (max over ranks, mean of the epochs after warm-up) of
   every grid of ``--gpus`` ranks;
3. the measured peak memory per rank (tensor bytes the trainer tracks, and RSS growth
   during training + persistent state) against ``plexus_tune.model.memory`` (the cost model's
   memory term) for the same workload and grid.
Timings on a shared machine are noisy: the load average is printed beside them.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=262144)
    parser.add_argument("--edges", type=int, default=2_100_000, help="undirected edges (nonzeros = 2 edges + nodes)")
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--classes", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--gpus", type=int, default=4, help="ranks of the grid sweep")
    parser.add_argument("--grids", help="comma-separated grids instead of every grid of --gpus")
    parser.add_argument("--block-rows", type=int, help="also run every grid with blocked aggregation")
    parser.add_argument("--skip-pyg", action="store_true")
    parser.add_argument("--workdir", help="where the generated graph is stored (default: a temp dir)")
    parser.add_argument("--log", help="append every run record to this JSON Lines log")
    args = parser.parse_args(argv)

    import numpy as np

    from plexus_tune.graph import save_graph, synthetic
    from plexus_tune.model.grid import enumerate_grids, parse_grid
    from plexus_tune.launch import default_threads_per_rank
    from plexus_tune.model.memory import memory_breakdown
    from plexus_tune.trainer import TrainConfig, run_training
    from plexus_tune.allocator import configure_compute_process
    from plexus_tune.trainer.reference import reference_train
    from plexus_tune.model.workload import Workload

    cores = default_threads_per_rank(1)
    spec = (f"rmat:nodes={args.nodes},edges={args.edges},features={args.features},"
            f"classes={args.classes},seed=0")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="plexus-bench-"))
    path = workdir / f"rmat-{args.nodes}-{args.edges}"
    t0 = time.perf_counter()
    graph = synthetic(spec)
    if not path.exists():
        save_graph(graph, path)
    nnz = graph.nnz + graph.num_nodes - int(np.count_nonzero(graph.adjacency.diagonal()))
    print(f"graph {spec}: {graph.num_nodes:,} nodes, {nnz:,} nonzeros with self-loops "
          f"(generated and saved in {time.perf_counter() - t0:.1f} s to {path})")
    print(f"model: {args.layers} layers, hidden {args.hidden}; {args.epochs} epochs, mean of the last "
          f"{args.epochs - args.warmup}; {cores} CPU cores; load average {load_average()}")
    common = dict(graph=str(path), layers=args.layers, hidden=args.hidden, epochs=args.epochs,
                  warmup=args.warmup, log=args.log, machine=None)

    print("\n== 1x1x1 against serial PyG (same threads) ==")
    rec1 = run_training(TrainConfig(grid=(1, 1, 1), threads_per_rank=cores, **common))
    print(f"3D trainer 1x1x1: {rec1['epoch_ms']:.1f} ms/epoch (+- {rec1['epoch_ms_std']:.1f}); spmm "
          f"{rec1['spmm_ms']:.1f}, gemm {rec1['gemm_ms']:.1f}, other {rec1['other_ms']:.1f}  [load {load_average()}]")
    if not args.skip_pyg:
        configure_compute_process(cores)  # as the ranks run
        ref = reference_train(graph, layers=args.layers, hidden=args.hidden, epochs=args.epochs, lr=0.01,
                              weight_decay=0.01, seed=0)
        pyg_ms = float(np.mean(ref["epoch_ms"][args.warmup:]))
        pyg_std = float(np.std(ref["epoch_ms"][args.warmup:]))
        print(f"serial PyG GCN:   {pyg_ms:.1f} ms/epoch (+- {pyg_std:.1f})  [load {load_average()}]")
        print(f"speed-up of the 1x1x1 trainer over PyG: {pyg_ms / rec1['epoch_ms']:.2f}x; "
              f"final losses {rec1['final_loss']:.6f} vs {ref['losses'][-1]:.6f}")

    grids = ([parse_grid(g) for g in args.grids.split(",")] if args.grids
             else [tuple(int(x) for x in g) for g in enumerate_grids(args.gpus)])
    variants = [None] + ([args.block_rows] if args.block_rows else [])
    widths = [args.features] + [args.hidden] * (args.layers - 1) + [args.classes]
    work = Workload(name="bench", nodes=graph.num_nodes, nnz=nnz, widths=tuple(widths))
    rows = []
    print(f"\n== every grid of {args.gpus} ranks ({default_threads_per_rank(args.gpus)} threads per rank) ==")
    head = ("grid", "blocks", "epoch", "+-", "spmm", "gemm", "comm", "x", "y", "z", "other", "imb",
            "tracked MiB", "rss+state MiB", "model MiB", "model/tracked")
    print(("{:>7} {:>6} " + "{:>8} " * 9 + "{:>5} {:>11} {:>13} {:>9} {:>13}").format(*head))
    for grid in grids:
        for block_rows in variants:
            rec = run_training(TrainConfig(grid=grid, block_rows=block_rows, **common))
            model = memory_breakdown(work, [grid], index_bytes=4)["total"][0]
            tracked = rec["peak_memory_bytes"]
            rss = max(a + b for a, b in zip(rec["rss_growth_bytes_per_rank"], rec["persistent_bytes_per_rank"]))
            rows.append((grid, block_rows, rec, model))
            print(("{:>7} {:>6} " + "{:8.1f} " * 9 + "{:5.2f} {:11.1f} {:13.1f} {:9.1f} {:13.2f}").format(
                rec["grid"], str(block_rows or "-"), rec["epoch_ms"], rec["epoch_ms_std"], rec["spmm_ms"],
                rec["gemm_ms"], rec["comm_ms"], rec["comm_x_ms"], rec["comm_y_ms"], rec["comm_z_ms"],
                rec["other_ms"], rec["imbalance"]["epoch_ms"], tracked / 2**20, rss / 2**20, model / 2**20,
                model / tracked), flush=True)
    best = min(rows, key=lambda r: r[2]["epoch_ms"])
    print(f"\nfastest grid: {best[2]['grid']} ({best[2]['epoch_ms']:.1f} ms/epoch); load average {load_average()}")
    print("memory: 'tracked' = adjacency shards (A, A^T, row blocks) + parameters x4 (value, gradient, 2 AdamW "
          "moments) + labels + saved H and Q and their gradients + the largest gathered buffer; 'rss+state' = "
          "RSS growth during training + persistent state; 'model' = plexus_tune.model.memory with 4-byte indices")
    return 0


if __name__ == "__main__":
    sys.exit(main())
