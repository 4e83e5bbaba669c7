"""Benchmark: size of the planner's joint space and the time to evaluate it exactly.

    python runners/benchmarks/bench_planner.py [--dataset ogbn-products] [--machine perlmutter]
        [--gpus 64,1024,4096] [--precisions fp32,bf16,fp16,int8,int4,int2]

For every G: the configurations per family (every grid of Plexus 3D, CAGNET 1D, 1.5D
replication factors, 2D grids, 3D meshes, SuperGCN modes) times the precisions, and the
wall time of one exact joint ranking (model/planner.joint_ranking), best of --repeat.
"""

from __future__ import annotations

import argparse
import sys
import time

from plexus_tune.model.precision_choice import parse_allowed
from plexus_tune.errors import UserError
from plexus_tune.model.machine import load_machine
from plexus_tune.model.planner import joint_ranking, joint_space_size
from plexus_tune.model.workload import workload_from_dataset


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="ogbn-products")
    parser.add_argument("--machine", default="perlmutter")
    parser.add_argument("--gpus", default="64,1024,4096")
    parser.add_argument("--precisions", default="fp32,bf16,fp16,int8,int4,int2")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        workload = workload_from_dataset(args.dataset)
        machine = load_machine(args.machine)
        precisions = parse_allowed(args.precisions)
        gpus = [int(g) for g in args.gpus.split(",")]
    except (UserError, ValueError) as exc:
        print(f"bench_planner: {exc}", file=sys.stderr)
        return 2
    print(f"{'G':>6} {'configurations':>14}  per family (x {len(precisions)} precisions)  {'seconds':>8}  best")
    for g in gpus:
        size = joint_space_size(g, len(precisions))
        best = float("inf")
        for _ in range(max(1, args.repeat)):
            start = time.perf_counter()
            ranking = joint_ranking(workload, machine, g, precisions=precisions)
            best = min(best, time.perf_counter() - start)
        first = ranking.feasible[0] if ranking.feasible else None
        families = " ".join(f"{k}={v}" for k, v in size.items() if k != "total")
        print(f"{g:>6} {size['total']:>14}  {families}  {best:>8.2f}  "
              + (f"{first['algorithm']} {first['config']} {first['comm_precision']} {first['total_ms']:.1f} ms" if first else "none fits"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
