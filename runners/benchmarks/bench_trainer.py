"""Trainer benchmark: the epoch against its floor, the fair PyG baseline, the lattice permutations, every grid.

    python runners/benchmarks/bench_trainer.py floor   [--nodes 262144 --edges 2100000 --hidden 64 --grid 1x1x1 --device cpu]
    python runners/benchmarks/bench_trainer.py pyg     [--nodes ... --hidden ...]          trainer 1x1x1 against fair PyG
    python runners/benchmarks/bench_trainer.py lattice [--nodes 1000000 --hidden 64]       SpMM phase per permutation
    python runners/benchmarks/bench_trainer.py grids   [--gpus 4 ...]                      every grid, memory against the model

``floor`` prints each part of the 1x1x1 (or ``--grid``) epoch on CPU or CUDA (SpMM,
GEMM, communication, loss, optimizer, elementwise, synchronisation and the rest) beside
its floor: compulsory bytes over the measured copy rate, or flops over the measured GEMM
rate (:mod:`plexus_tune.measure.floor`), and the ratio. ``pyg`` compares the trainer with
PyG's GCNConv (normalize=False) on a CSR ``adj_t`` with trainable input features, the
fair comparison (the trainer trains its input features too). ``lattice`` runs the
trainer on a road-like lattice at 1x1x1 with no, double and local permutation (local as
1x1x1 uses it, the identity, and as a grid splitting the ids 8 ways would) and prints
each SpMM phase against natural order. ``grids`` runs every grid of ``--gpus`` ranks
and sets each rank's peak memory beside the model's.

The functions (``floor_report``, ``pyg_fair_epoch``, ``trainer_vs_pyg``,
``other_share``, ``lattice_permutations``) live in :mod:`plexus_tune.measure.efficiency`.
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


from plexus_tune.measure.efficiency import (floor_report, lattice_permutations, other_share,
                                            trainer_vs_pyg)


def print_floor(report: dict) -> None:
    c = report["ceilings"]
    print(f"ceilings on {report['device']}: copy {c['copy_gbps']:.1f} GB/s (read + write; median "
          f"{c['copy_gbps_median']:.1f}), FP32 GEMM {c['gemm_gflops']:.1f} GFLOP/s ({c['gemm_size']}^3; median "
          f"{c['gemm_gflops_median']:.1f})")
    grid = "x".join(map(str, report["grid"]))
    print(f"grid {grid}, critical rank {report['rank']}, epoch {report['parts']['epoch']:.1f} ms, optimizer "
          f"{report['result'].get('optimizer')}")
    print(f"{'part':>12} {'ms':>9} {'floor ms':>9} {'ratio':>7} {'share':>6}  floor from")
    epoch = report["parts"]["epoch"]
    for row in report["rows"]:
        ratio = f"{row['ratio']:7.2f}" if row["ratio"] == row["ratio"] else f"{'-':>7}"
        basis = {"bytes": f"{row['bytes'] / 1e6:.1f} MB", "flops": f"{row['flops'] / 1e9:.2f} GFLOP", "-": "none"}
        print(f"{row['part']:>12} {row['ms']:9.2f} {row['floor_ms']:9.2f} {ratio} {row['ms'] / epoch:6.1%}  "
              f"{basis[row['basis']]}")
    total = sum(r["ms"] for r in report["rows"])
    print(f"{'sum':>12} {total:9.2f} {sum(r['floor_ms'] for r in report['rows']):9.2f}  (epoch {epoch:.2f} ms)")
    spmm = next(r for r in report["rows"] if r["part"] == "spmm")
    gather_ms = report["spmm_gather_bytes"] / c["gather_gbps"] / 1e6 + spmm["bytes"] / c["copy_gbps"] / 1e6
    print(f"SpMM if every nonzero's dense row missed the cache: {gather_ms:.2f} ms (a row per nonzero at the random-"
          f"gather rate {c['gather_gbps']:.1f} GB/s of {c['gather_cols']}-float rows, the rest at the copy rate); "
          f"measured / that: {spmm['ms'] / gather_ms:.2f}")
    m = report["memory"]
    print(f"memory: peak {m['measured_bytes'] / 2**20:.1f} MiB ({m['measured']}) against the model's "
          f"{m['model_bytes'] / 2**20:.1f} MiB: {m['ratio']:.2f}")


def _graph_from_args(args):
    from plexus_tune.graph import synthetic

    if args.mode == "lattice":
        spec = f"grid2d:nodes={args.nodes},features={args.features},classes={args.classes},seed=0"
    else:
        spec = (f"rmat:nodes={args.nodes},edges={args.edges},features={args.features},"
                f"classes={args.classes},seed=0")
    t0 = time.perf_counter()
    graph = synthetic(spec)
    print(f"graph {spec}: {graph.num_nodes:,} nodes, {graph.nnz:,} nonzeros (generated in "
          f"{time.perf_counter() - t0:.1f} s)", flush=True)
    return graph


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("floor", "pyg", "lattice"):
        return main_reports(argv)
    if argv and argv[0] == "grids":
        argv = argv[1:]
    return main_grids(argv)


def main_reports(argv) -> int:
    from plexus_tune.model.grid import parse_grid

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("floor", "pyg", "lattice"))
    parser.add_argument("--nodes", type=int)
    parser.add_argument("--edges", type=int, default=2_100_000)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--classes", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--grid", default="1x1x1")
    parser.add_argument("--permute", default="double")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--fused-pyg", action="store_true", help="PyG with fused AdamW too")
    parser.add_argument("--rounds", type=int, default=2, help="lattice: rounds, alternating the order (default 2)")
    args = parser.parse_args(argv)
    if args.nodes is None:
        args.nodes = 1_000_000 if args.mode == "lattice" else 262_144
    print(f"load average {load_average()}", flush=True)
    graph = _graph_from_args(args)
    common = dict(hidden=args.hidden, layers=args.layers, epochs=args.epochs, warmup=args.warmup, device=args.device)
    if args.mode == "floor":
        report = floor_report(graph, tuple(parse_grid(args.grid)), permute=args.permute, **common)
        print_floor(report)
        print(f"other (loss + optimizer + elementwise + rest) {other_share(report):.1%} of the epoch")
    elif args.mode == "pyg":
        out = trainer_vs_pyg(graph, fused_pyg=args.fused_pyg, **common)
        print(f"trainer 1x1x1 {out['trainer_ms']:.1f} ms/epoch, fair PyG ({'fused' if out['pyg_fused'] else 'default'} "
              f"AdamW, trainable features) {out['pyg_ms']:.1f} ms/epoch: ratio {out['ratio']:.2f}")
    else:
        out = lattice_permutations(graph, rounds=args.rounds, **common)
        for name, row in out.items():
            print(f"{name:>12}: SpMM phase {row['spmm_ms']:9.1f} ms ({row['spmm_vs_none']:.2f}x natural), "
                  f"epoch {row['epoch_ms']:9.1f} ms")
    print(f"load average {load_average()}")
    return 0


def main_grids(argv=None) -> int:
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
    from plexus_tune.trainer import TrainConfig
    from plexus_tune.measure.training import run_training
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
