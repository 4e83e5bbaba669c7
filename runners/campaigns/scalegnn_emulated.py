"""ScaleGNN's 4D configurations of G = 8 on an emulated cluster, against the planner (root).

Measure (every Gd in {1, 2, 4} with every 3D grid of 8 / Gd; a profile logs its prediction
beside each run; one graph per locked command keeps each under 25 minutes, and a command
run again adds only what its log lacks, so a campaign cut short resumes), then score:

    PLEXUS_TUNE_NETNS_PREFIX=sg plexus-tune measure --graph GRAPH --algorithm scalegnn-4d \
        --dp GD --fixed-features --batch-size 2048 --gpus 8 --grids all --trials 5 --epochs 4 --warmup 1 \
        --hidden 64 --batch 10 --machine models/emulated-2x4-fitted.json \
        --cluster emulated:nodes=2,ranks_per_node=4,inter_gbps=0.05,inter_latency_us=0 --log runs.jsonl
    python runners/campaigns/scalegnn_emulated.py --log runs.jsonl --machine models/emulated-2x4-fitted.json

For each graph of the log: per (Gd, grid) the median observed epoch over the trials (and
its range), the prediction, and the observed parts (the epoch partitioned: the critical
rank's SpMM, GEMM and other, the least communication, the wait) beside the predicted ones
(other includes the profile's fixed overhead); the data-parallel all-reduce (``comm_dp_ms``,
the slowest rank's) and the sampling (the work, and the part exposed) observed beside the
predicted; then Spearman of the predicted and observed epoch times, the regret (observed
time of the predicted best over the observed best) and the trials' spread (coefficient of
variation of one configuration's trials, median over the configurations). ``--machine``
scores the current model of that profile (:meth:`plexus_tune.measure.identity.RunSpec.predict`)
instead of the logged prediction.
"""

from __future__ import annotations

import argparse

import numpy as np

from plexus_tune.measure.identity import RunSpec
from plexus_tune.measure.store import read_runs
from plexus_tune.measure.table import runs_table
from plexus_tune.model.machine import load_machine
from plexus_tune.model.scalegnn import predict_configs
from plexus_tune.report.metrics import regret, spearman


def _per_identity(records, keys) -> dict:
    """Median over the trials of each identity of each of ``keys`` (the mini-batch timers)."""
    from collections import defaultdict

    import numpy as np

    values: dict = defaultdict(lambda: defaultdict(list))
    for rec in records:
        if rec.get("status") == "ok":
            ident = RunSpec.from_record(rec).identity()
            for key in keys:
                values[ident][key].append(float(rec.get(key) or 0.0))
    return {ident: {k: float(np.median(v)) for k, v in per.items()} for ident, per in values.items()}


def _minibatch_prediction(row, machine) -> dict:
    """The family model's own keys (comm_dp_ms, sampling_ms, other_sampling_ms) at the run's settings."""
    spec = RunSpec.from_row(row)
    options = spec.prediction_settings().get("options", {})
    pred = predict_configs(spec.workload(), machine, [(spec.dp, *spec.grid)], batch_size=int(spec.batch_size),
                           comm_precision=spec.comm_precision,
                           options={"prefetch": bool(options.get("prefetch", True)),
                                    "fixed_features": bool(spec.fixed_features)})
    return {key: float(pred[key][0]) for key in ("comm_dp_ms", "sampling_ms", "other_sampling_ms", "steps")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", required=True, nargs="+", help="run logs of the measure commands above (pooled)")
    parser.add_argument("--machine", help="predict with this profile's current model instead of the logged prediction")
    parser.add_argument("--replace", action="store_true",
                        help="a later log's runs replace an earlier log's runs of the same configuration (a re-measurement)")
    args = parser.parse_args()
    records = []
    for path in args.log:
        later = read_runs(path, warn=False)
        if args.replace:
            again = {RunSpec.from_record(r).identity() for r in later}
            records = [r for r in records if RunSpec.from_record(r).identity() not in again]
        records += later
    table = runs_table(records)
    table = table[(table["algorithm"] == "scalegnn-4d") & (table["trials"] > 0)].copy()
    if args.machine:
        for key in ("total_ms", "spmm_ms", "gemm_ms", "comm_ms", "other_ms", "overhead_ms"):
            table[f"pred_{key}"] = [RunSpec.from_row(row).predict(args.machine)[key] for _, row in table.iterrows()]
    timers = _per_identity(records, ("comm_dp_ms", "sample_ms", "sample_work_ms"))
    machine = load_machine(args.machine or "emulated-2x4-fitted")
    source = f"the current model of {args.machine}" if args.machine else "the logged prediction"
    print(f"predicted: {source}; observed: median over the trials (ms per epoch)")
    for graph, rows in table.groupby("graph"):
        rows = rows.sort_values("obs_epoch_ms")
        print(f"{graph}: {len(rows)} configurations, {int(rows['trials'].min())} to {int(rows['trials'].max())} trials")
        print(f"  {'Gd x grid':>11} {'observed':>9} {'(range)':>15} {'predicted':>9} | observed parts: "
              f"{'spmm':>5} {'gemm':>5} {'comm':>6} {'other':>5} {'wait':>5} | predicted: "
              f"{'spmm':>5} {'gemm':>5} {'comm':>6} {'other':>5} | DP all-reduce obs/pred | sampling work obs/pred, exposed obs/pred")
        for _, r in rows.iterrows():
            t = timers.get(r["identity"], {})
            m = _minibatch_prediction(r, machine)
            print(f"  {int(r['dp'])} x {r['grid']:>7} {r['obs_epoch_ms']:9.1f} "
                  f"({r['obs_epoch_ms_min']:6.0f}-{r['obs_epoch_ms_max']:6.0f}) {r['pred_total_ms']:9.1f} | "
                  f"{'':15} {r['obs_part_spmm_ms']:5.0f} {r['obs_part_gemm_ms']:5.0f} {r['obs_part_comm_ms']:6.0f} "
                  f"{r['obs_part_other_ms']:5.0f} {r['obs_part_wait_ms']:5.0f} | {'':10} {r['pred_spmm_ms']:5.0f} "
                  f"{r['pred_gemm_ms']:5.0f} {r['pred_comm_ms']:6.0f} {r['pred_other_ms'] + r['pred_overhead_ms']:5.0f} | "
                  f"{t.get('comm_dp_ms', 0.0):6.0f} / {m['comm_dp_ms']:4.0f} {'':9} | "
                  f"{t.get('sample_work_ms', 0.0):5.0f} / {m['sampling_ms']:5.0f}, {t.get('sample_ms', 0.0):5.1f} / "
                  f"{m['other_sampling_ms']:5.1f}")
        spread = (rows["obs_epoch_ms_std"] / rows["obs_epoch_ms"]).median()
        pred, obs = rows["pred_total_ms"].to_numpy(), rows["obs_epoch_ms"].to_numpy()
        tied = np.isclose(pred, pred.min(), rtol=1e-9, atol=0.0)
        worst = float(obs[tied].max() / obs.min())
        ties = (f" ({int(tied.sum())} tied at the predicted best: regret {worst:.3f} if the tie falls on the worst)"
                if tied.sum() > 1 else "")
        print(f"  Spearman {spearman(pred, obs):.3f}, regret {regret(pred, obs):.3f}"
              f"{ties}; trials' coefficient of variation {spread:.3f} (median over the configurations)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
