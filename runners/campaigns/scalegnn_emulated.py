"""ScaleGNN's 4D configurations of G = 8 on an emulated cluster, against the planner (root).

Measure (every Gd in {1, 2, 4} with every 3D grid of 8 / Gd; a profile logs its prediction
beside each run; one graph and Gd set per locked command keeps each under 25 minutes),
then score:

    for dp in 1 2 4; do PLEXUS_TUNE_NETNS_PREFIX=sg plexus-tune measure --graph GRAPH \\
        --algorithm scalegnn-4d --dp $dp --fixed-features --batch-size 2048 --gpus 8 --grids all \\
        --trials 3 --epochs 4 --warmup 1 --hidden 64 --machine models/emulated-2x4-fitted.json \\
        --cluster emulated:nodes=2,ranks_per_node=4,inter_gbps=0.05,inter_latency_us=0 --log runs.jsonl; done
    python runners/campaigns/scalegnn_emulated.py --log runs.jsonl

For each graph of the log: per (Gd, grid) the median observed epoch over the trials (and
its range), the prediction logged with the runs, and the observed parts (the epoch
partitioned: the critical rank's SpMM, GEMM and other, the least communication, the wait)
beside the predicted ones (other includes the profile's fixed overhead); then Spearman of
the predicted and observed epoch times and the regret (observed time of the predicted
best over the observed best). ``--machine`` scores the current model of that profile
instead of the logged prediction (:func:`plexus_tune.measure.identity.predict_record`).
"""

from __future__ import annotations

import argparse

from plexus_tune.measure.identity import predict_record
from plexus_tune.measure.store import read_runs
from plexus_tune.measure.table import runs_table
from plexus_tune.report.metrics import regret, spearman


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", required=True, help="run log of the measure commands above")
    parser.add_argument("--machine", help="predict with this profile's current model instead of the logged prediction")
    args = parser.parse_args()
    table = runs_table(read_runs(args.log, warn=False))
    table = table[(table["algorithm"] == "scalegnn-4d") & (table["trials"] > 0)].copy()
    if args.machine:
        for key in ("total_ms", "spmm_ms", "gemm_ms", "comm_ms", "other_ms", "overhead_ms"):
            table[f"pred_{key}"] = [predict_record(row.to_dict(), args.machine)[key] for _, row in table.iterrows()]
    source = f"the current model of {args.machine}" if args.machine else "the logged prediction"
    print(f"predicted: {source}; observed: median over the trials (ms per epoch)")
    for graph, rows in table.groupby("graph"):
        rows = rows.sort_values("obs_epoch_ms")
        print(f"{graph}: {len(rows)} configurations, {int(rows['trials'].min())} to {int(rows['trials'].max())} trials")
        print(f"  {'Gd x grid':>11} {'observed':>9} {'(range)':>15} {'predicted':>9} | observed parts: "
              f"{'spmm':>5} {'gemm':>5} {'comm':>6} {'other':>5} {'wait':>5} | predicted: "
              f"{'spmm':>5} {'gemm':>5} {'comm':>6} {'other':>5}")
        for _, r in rows.iterrows():
            print(f"  {int(r['dp'])} x {r['grid']:>7} {r['obs_epoch_ms']:9.1f} "
                  f"({r['obs_epoch_ms_min']:6.0f}-{r['obs_epoch_ms_max']:6.0f}) {r['pred_total_ms']:9.1f} | "
                  f"{'':15} {r['obs_part_spmm_ms']:5.0f} {r['obs_part_gemm_ms']:5.0f} {r['obs_part_comm_ms']:6.0f} "
                  f"{r['obs_part_other_ms']:5.0f} {r['obs_part_wait_ms']:5.0f} | {'':10} {r['pred_spmm_ms']:5.0f} "
                  f"{r['pred_gemm_ms']:5.0f} {r['pred_comm_ms']:6.0f} {r['pred_other_ms'] + r['pred_overhead_ms']:5.0f}")
        print(f"  Spearman {spearman(rows['pred_total_ms'], rows['obs_epoch_ms']):.3f}, "
              f"regret {regret(rows['pred_total_ms'].to_numpy(), rows['obs_epoch_ms'].to_numpy()):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
