"""CAGNET's claim that 1.5D communicates less than 1D as c grows, with the trainer's logged bytes.

    python runners/campaigns/cagnet_replication.py [--gpus 8,16] [--synthetic SPEC] [--layers 3] [--hidden 64]

For every G and every replication factor c (c | G, c c <= G; c = 1 is cagnet-1d) the
1.5D trainer trains the graph for two epochs (local processes, gloo) and logs the bytes
each rank sends per class in an epoch. The table gives, per configuration, the
aggregation bytes (broadcasts of H and dT blocks plus the replica all-reduces of their
partial sums) summed over ranks and the most any rank sends, the weight-gradient bytes, their ratio to c = 1, and whether every rank's bytes equal
the volume model (plexus_tune.model.volumes) exactly. --tiny: G = 8 on a small graph (a
CI check).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.graph import synthetic
from plexus_tune.launch import launch_local
from plexus_tune.model.volumes import cagnet_15d_schedule, rank_volumes
from plexus_tune.model.workload import model_widths
from plexus_tune.trainer import TrainConfig
from plexus_tune.trainer.algorithms import normalize_config
from plexus_tune.trainer.rank import rank_main

DEFAULT_GRAPH = "rmat:nodes=4096,edges=32768,features=64,classes=8,seed=0"


def replication_factors(gpus: int) -> list[int]:
    """c = 1 and every c > 1 with c | G and c c <= G."""
    return [c for c in range(1, math.isqrt(gpus) + 1) if gpus % c == 0]


def measure(graph, gpus: int, *, layers: int, hidden: int, epochs: int) -> list[dict]:
    configs = [normalize_config(TrainConfig(algorithm="cagnet-1d" if c == 1 else "cagnet-1.5d", gpus=gpus,
                                            replication=None if c == 1 else c, layers=layers, hidden=hidden,
                                            epochs=epochs, warmup=1, seed=0))
               for c in replication_factors(gpus)]
    results = launch_local(rank_main, gpus, args=(graph, configs, "cpu"), timeout_s=1800, threads_per_rank=1,
                           preload=("torch._dynamo", "plexus_tune.trainer.rank"))[0]
    widths = model_widths(graph.features.shape[1], graph.num_classes, layers, hidden)
    nodes = graph.adjacency.shape[0]
    rows = []
    for config, result in zip(configs, results):
        last = [epochs_[-1] for epochs_ in result["comm_bytes"]]
        logged = {k: np.array([r.get(k, 0) for r in last], dtype=np.float64) for k in ("aggregation", "gather")}
        model = rank_volumes(cagnet_15d_schedule(nodes, widths, gpus, config.grid[1]), gpus)
        rows.append({"gpus": gpus, "c": config.grid[1], "aggregation_total": logged["aggregation"].sum(),
                     "aggregation_max_sent": logged["aggregation"].max(),
                     "gather_total": logged["gather"].sum(),
                     "equals_model": all(np.array_equal(logged[k], model[k]) for k in logged)})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="8,16", help="world sizes, comma separated (default 8,16)")
    parser.add_argument("--synthetic", default=DEFAULT_GRAPH, metavar="SPEC", help=f"graph (default {DEFAULT_GRAPH})")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="G = 8 on a 256-node graph (a CI check)")
    args = parser.parse_args(argv)
    if args.tiny:
        args.gpus, args.synthetic, args.hidden = "8", "rmat:nodes=256,edges=2048,features=16,classes=4,seed=0", 16
    try:
        sizes = [int(g) for g in args.gpus.split(",")]
        if any(g < 1 for g in sizes) or args.layers < 1 or args.hidden < 1 or args.epochs < 2:
            raise ValueError
    except ValueError:
        print("cagnet_replication: --gpus must list positive integers (e.g. 8,16); --layers, --hidden >= 1, "
              "--epochs >= 2", file=sys.stderr)
        return 2
    try:
        graph = synthetic(args.synthetic)
    except UserError as exc:
        print(f"cagnet_replication: {exc}", file=sys.stderr)
        return 2
    print(f"graph {args.synthetic}: {graph.adjacency.shape[0]} nodes, layers {args.layers}, hidden {args.hidden}; "
          "bytes per epoch (forward + backward), logged by the trainer")
    print(f"{'G':>3} {'c':>3} {'aggregation B':>14} {'vs c=1':>7} {'max rank B':>12} "
          f"{'dW,db B':>10} {'= model':>8} {'s':>5}")
    for gpus in sizes:
        start = time.perf_counter()
        rows = measure(graph, gpus, layers=args.layers, hidden=args.hidden, epochs=args.epochs)
        took = time.perf_counter() - start
        base = rows[0]["aggregation_total"]
        for row in rows:
            print(f"{gpus:>3} {row['c']:>3} {int(row['aggregation_total']):>14} {row['aggregation_total'] / base:>7.3f} "
                  f"{int(row['aggregation_max_sent']):>12} "
                  f"{int(row['gather_total']):>10} {str(row['equals_model']):>8} {took / len(rows):>5.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
