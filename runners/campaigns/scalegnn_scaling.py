"""The paper's strong scaling of ScaleGNN on Perlmutter, predicted in kind by the planner.

For ogbn-papers100M (64 -> 2048 GPUs), Products-14M (32 -> 1024) and ogbn-products (8 -> 128):
the fastest near-cubic 3D grid of the first GPU count, kept while the data-parallel degree Gd
doubles, with the ``perlmutter`` profile, 3 GCN layers of width 128 and bf16 on the 3D
collectives (the paper's optimizations; RMSNorm, loss and gradient all-reduces stay FP32). It
prints each step of the series and the predicted speedup beside the paper's, for the assumed
batch size B = 131,072 and, to show how much the figure depends on it, two others
(docs/model.md, "ScaleGNN", Paper scaling).

    python runners/campaigns/scalegnn_scaling.py [--machine perlmutter] [--batch-size 131072]
"""

from __future__ import annotations

import argparse

from plexus_tune.model.scalegnn import PAPER_SCALING, scaling_series
from plexus_tune.model.workload import workload_from_dataset

#: The batch size assumed (docs/model.md): ogbn-papers100M labels 1.2 M of its 111 M vertices for
#: training, so a uniform sample of B = 131,072 carries about 1,400 training vertices into the
#: loss, the order of the usual mini-batch of 1,024 targets; the same B serves the other graphs.
ASSUMED_BATCH = 131_072
OTHER_BATCHES = (32_768, 524_288)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machine", default="perlmutter")
    parser.add_argument("--batch-size", type=int, default=ASSUMED_BATCH)
    args = parser.parse_args()
    for name, first, last, paper in PAPER_SCALING:
        workload = workload_from_dataset(name, layers=3, hidden=128)
        series = scaling_series(workload, args.machine, first, last, args.batch_size)
        grid = "x".join(map(str, series["grid"]))
        print(f"{name}: {first} -> {last} GPUs, grid {grid} per group, B = {args.batch_size:,} on {args.machine}")
        print(f"  {'GPUs':>5} {'Gd':>3} {'steps':>6} {'epoch ms':>10} {'step ms':>8} {'DP ms':>8} {'speedup':>8}")
        for row in series["rows"]:
            print(f"  {row['gpus']:>5} {row['gd']:>3} {row['steps']:>6} {row['total_ms']:>10.1f} {row['step_ms']:>8.2f} "
                  f"{row['comm_dp_ms']:>8.1f} {row['speedup']:>7.1f}x")
        others = ", ".join(f"B = {b:,}: {scaling_series(workload, args.machine, first, last, b)['rows'][-1]['speedup']:.1f}x"
                           for b in OTHER_BATCHES if b != args.batch_size)
        print(f"  predicted {series['rows'][-1]['speedup']:.1f}x, paper {paper}x ({others})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
