"""The 3D trainer's ``--overlap`` against no overlap on an emulated cluster, back to back (root).

    PLEXUS_TUNE_NETNS_PREFIX=ov python runners/campaigns/overlap_emulated.py --out-dir measurements/overlap-emulated-DATE

Runs ``plexus-tune train --cluster SPEC --grid G --block-rows B`` without and with
``--overlap`` alternately (no overlap first), ``--repeats`` times, each logged to
``runs.jsonl`` with the 1-minute load average before and after in ``campaign.json``.
``summary.json``: per setting the epochs (max over ranks, mean of the timed epochs) of
every run, their median, the observed gain (1 - overlap / none, of the medians and of
each back-to-back pair) and the forward SpMM time of the runs without overlap (summed over
layers), which bounds what overlapping the row blocks' all-reduces with it can hide.
``--summarize-only`` rewrites ``summary.json`` from the logged runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--cluster", default="emulated:nodes=2,ranks_per_node=4,inter_gbps=0.5")
    parser.add_argument("--graph", default="rmat:nodes=8192,edges=524288,features=64,classes=8,seed=3")
    parser.add_argument("--grid", default="2x2x2")
    parser.add_argument("--block-rows", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--summarize-only", action="store_true")
    args = parser.parse_args()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "runs.jsonl"
    if args.summarize_only:
        summarize(args, log, json.loads((out / "campaign.json").read_text()), out)
        return
    steps = []
    for repeat in range(args.repeats):
        for overlap in (False, True):
            cmd = ["train", "--cluster", args.cluster, "--grid", args.grid, "--synthetic", args.graph,
                   "--layers", "3", "--hidden", str(args.hidden), "--epochs", str(args.epochs),
                   "--warmup", str(args.warmup), "--block-rows", str(args.block_rows), "--log", str(log)]
            cmd += ["--overlap"] if overlap else []
            before, start = os.getloadavg()[0], time.time()
            print(f"== repeat {repeat} overlap {overlap} (load {before:.2f}): plexus-tune {shlex.join(cmd)}", flush=True)
            rc = subprocess.run([sys.executable, "-W", "ignore", "-m", "plexus_tune", *cmd], cwd=ROOT).returncode
            steps.append({"repeat": repeat, "overlap": overlap, "rc": rc, "seconds": round(time.time() - start, 1),
                          "load_before": round(before, 2), "load_after": round(os.getloadavg()[0], 2)})
            (out / "campaign.json").write_text(json.dumps(steps, indent=1) + "\n")
            if rc != 0:
                raise SystemExit(f"run failed with exit code {rc}")
    summarize(args, log, steps, out)


def summarize(args, log: Path, steps: list, out: Path) -> None:
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    summary = {"cluster": args.cluster, "graph": args.graph, "grid": args.grid, "block_rows": args.block_rows}
    for overlap in (False, True):
        runs = [r for r in records if bool(r["options"]["overlap"]) == overlap]
        summary["overlap" if overlap else "none"] = {
            "epoch_ms": [round(r["epoch_ms"], 2) for r in runs],
            "median_epoch_ms": round(float(np.median([r["epoch_ms"] for r in runs])), 2),
            "spmm_forward_ms": [round(sum(r["spmm_layer_ms"]["fwd"]), 2) for r in runs],
            "comm_ms": [round(r["comm_ms"], 2) for r in runs]}
    none, over = summary["none"]["median_epoch_ms"], summary["overlap"]["median_epoch_ms"]
    summary["observed_gain_of_medians"] = round(1.0 - over / none, 4)
    summary["observed_gain_per_pair"] = [round(1.0 - b / a, 4) for a, b in zip(summary["none"]["epoch_ms"],
                                                                                summary["overlap"]["epoch_ms"])]
    summary["hideable_bound_ms"] = summary["none"]["spmm_forward_ms"]
    summary["hideable_bound_fraction"] = [round(s / e, 4) for s, e in zip(summary["none"]["spmm_forward_ms"],
                                                                           summary["none"]["epoch_ms"])]
    summary["load_average_before"] = [s["load_before"] for s in steps]
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
