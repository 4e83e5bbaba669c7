"""SuperGCN's pre / post / hybrid aggregation volumes on METIS partitions (its Table 5, in kind).

    python runners/campaigns/supergcn_volumes.py [--graphs rmat:nodes=65536,edges=1M grid2d:nodes=65536]
        [--parts 16,64,256] [--width 128] [--seed 0]

For every graph and part count: partition with METIS (pymetis), build the boundary
exchange (plexus_tune.graph.partition.exchange_plan) and print the rows every part sends
per forward aggregation under pre, post and hybrid aggregation (a minimum vertex cover of
each pair's cut graph), the GB of one aggregation of --width FP32 columns, and the ratios
pre/hybrid and post/hybrid beside the published ones (ogb-lsc-mag240M on 2048 processes:
1934.86 GB pre and post, 1269.58 GB hybrid, 1.52x). Runs on CPU; --tiny for a seconds-long
check.
"""

from __future__ import annotations

import argparse
import sys
import time

from plexus_tune.errors import UserError
from plexus_tune.graph import synthetic
from plexus_tune.graph.partition import PUBLISHED_TABLE5_GB, exchange_summary, partition_exchange


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", nargs="+", default=["rmat:nodes=65536,edges=1M", "grid2d:nodes=65536"])
    parser.add_argument("--parts", default="16,64,256")
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="small graphs and part counts (a CI check)")
    args = parser.parse_args(argv)
    if args.tiny:
        args.graphs, args.parts = ["rmat:nodes=2048,edges=16384", "grid2d:nodes=2048"], "4,16"
    try:
        parts = [int(p) for p in args.parts.split(",")]
    except ValueError:
        print(f"supergcn_volumes: --parts must be a list of integers such as 16,64, got {args.parts!r}", file=sys.stderr)
        return 2
    published = PUBLISHED_TABLE5_GB["pre"] / PUBLISHED_TABLE5_GB["hybrid"]
    header = (f"{'graph':<34} {'parts':>5} {'cut edges':>10} {'pre rows':>9} {'post rows':>9} {'hybrid rows':>11} "
              f"{'pre GB':>8} {'hybrid GB':>9} {'pre/hyb':>7} {'post/hyb':>8} {'s':>5}")
    print(header)
    try:
        for spec in args.graphs:
            graph = synthetic(spec)
            for p in parts:
                start = time.perf_counter()
                row = exchange_summary(partition_exchange(graph.adjacency, p, seed=args.seed), args.width)
                took = time.perf_counter() - start
                print(f"{spec:<34} {p:>5} {row['cut_edges']:>10,} {row['pre_rows']:>9,} {row['post_rows']:>9,} "
                      f"{row['hybrid_rows']:>11,} {row['pre_bytes'] / 1e9:>8.4f} {row['hybrid_bytes'] / 1e9:>9.4f} "
                      f"{row['pre_over_hybrid']:>7.3f} {row['post_over_hybrid']:>8.3f} {took:>5.1f}")
    except UserError as exc:
        print(f"supergcn_volumes: {exc}", file=sys.stderr)
        return 2
    print(f"published (ogb-lsc-mag240M, 2048 processes, one layer): pre {PUBLISHED_TABLE5_GB['pre']} GB, post "
          f"{PUBLISHED_TABLE5_GB['post']} GB, hybrid {PUBLISHED_TABLE5_GB['hybrid']} GB: pre/hybrid {published:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
