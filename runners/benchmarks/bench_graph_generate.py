"""Benchmark: R-MAT generation time and the 2D load-balance report on a locality graph.

    python runners/benchmarks/bench_graph_generate.py [--rmat-nodes 1M --rmat-edges 16M]
        [--grid-nodes 1M] [--blocks 8x8]

Prints the wall time of generating the R-MAT adjacency (and of the full synthetic graph
with features and labels), then max/mean nonzeros of A+I per block of the road-like
grid2d graph in its natural order, with one random permutation, and with two.
"""

from __future__ import annotations

import argparse
import os
import resource
import time

from plexus_tune.graph import balance_report, generate, parse_blocks, rmat_adjacency
from plexus_tune.numbers import parse_count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rmat-nodes", default="1M")
    parser.add_argument("--rmat-edges", default="16M")
    parser.add_argument("--rmat-features", type=int, default=128)
    parser.add_argument("--grid-nodes", default="1M")
    parser.add_argument("--blocks", default="8x8")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    n, e = parse_count(args.rmat_nodes, "nodes"), parse_count(args.rmat_edges, "edges")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus")

    start = time.perf_counter()
    adj = rmat_adjacency(n, e, seed=args.seed)
    adj_s = time.perf_counter() - start
    print(f"rmat adjacency: {n} nodes, {e} undirected edges, {adj.nnz} nonzeros: {adj_s:.1f} s")
    del adj
    start = time.perf_counter()
    graph = generate("rmat", nodes=n, edges=e, features=args.rmat_features, classes=32, seed=args.seed)
    full_s = time.perf_counter() - start
    print(f"rmat graph with {args.rmat_features} features and 32 degree classes: {full_s:.1f} s")
    del graph

    gn = parse_count(args.grid_nodes, "nodes")
    blocks = parse_blocks(args.blocks)
    start = time.perf_counter()
    grid = generate("grid2d", nodes=gn, features=1, classes=2, seed=args.seed)
    print(f"grid2d graph: {gn} nodes, {grid.nnz} nonzeros, {grid.nnz + gn} with self-loops: "
          f"{time.perf_counter() - start:.1f} s")
    print(f"{'permutation':>12} {'max/mean':>9} {'max':>10} {'mean':>11} {'min':>10}")
    for mode in ("none", "single", "double"):
        rep = balance_report(grid.adjacency, blocks, mode, args.seed)
        print(f"{mode:>12} {rep['max_over_mean']:9.3f} {rep['max_nnz']:10d} {rep['mean_nnz']:11.1f} {rep['min_nnz']:10d}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"peak resident memory {peak:.2f} GiB")


if __name__ == "__main__":
    main()
