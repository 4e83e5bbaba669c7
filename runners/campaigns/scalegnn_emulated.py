"""ScaleGNN's 4D configurations of G = 8 on an emulated cluster, against the planner (root).

Measure (every Gd in {1, 2, 4} with every 3D grid of 8 / Gd; a profile logs its prediction
beside each run), then score:

    for dp in 1 2 4; do PLEXUS_TUNE_NETNS_PREFIX=sg plexus-tune measure --graph GRAPH \\
        --algorithm scalegnn-4d --dp $dp --batch-size 2048 --gpus 8 --grids all --trials 1 --epochs 3 \\
        --warmup 1 --hidden 64 --machine models/emulated-2x4-fitted.json \\
        --cluster emulated:nodes=2,ranks_per_node=4,inter_gbps=0.05,inter_latency_us=0 --log runs.jsonl; done
    python runners/campaigns/scalegnn_emulated.py --log runs.jsonl

For each graph of the log: Spearman of the predicted and observed epoch times over the
(Gd, grid) configurations, and the regret (observed time of the predicted best over the
observed best); the profile's own prediction as logged with each run.
"""

from __future__ import annotations

import argparse

from plexus_tune.measure.store import read_runs
from plexus_tune.measure.table import runs_table
from plexus_tune.report.metrics import regret, spearman


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", required=True, help="run log of the measure commands above")
    args = parser.parse_args()
    table = runs_table(read_runs(args.log, warn=False))
    table = table[(table["algorithm"] == "scalegnn-4d") & (table["trials"] > 0)]
    for graph, rows in table.groupby("graph"):
        rows = rows.sort_values("obs_epoch_ms")
        print(f"{graph}: {len(rows)} configurations")
        for _, row in rows.iterrows():
            print(f"  Gd {int(row['dp'])} x {row['grid']:>7}: observed {row['obs_epoch_ms']:9.1f} ms, "
                  f"predicted {row['pred_total_ms']:9.1f} ms")
        print(f"  Spearman {spearman(rows['pred_total_ms'], rows['obs_epoch_ms']):.3f}, "
              f"regret {regret(rows['pred_total_ms'].to_numpy(), rows['obs_epoch_ms'].to_numpy()):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
