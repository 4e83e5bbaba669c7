"""Calibrate this machine end to end: microbenchmarks, a first profile, trainer runs, refit, validation.

    python runners/campaigns/cpu_calibration.py --out-dir measurements/cpu-gloo --name cpu-gloo-2core-fitted

Steps (each logged with its duration and the load average before and after; the fits call
:func:`plexus_tune.fit.profile.fit_profile`, the others are plexus-tune commands):
1. ``calibrate collectives`` on every G of ``--gpus`` (default 4, 6, 8: every group shape
   of their grids, 1 KiB..64 MiB);
2. ``calibrate spmm --sweep`` (random shard shapes, 24 interleaved passes, median; the
   SpMM input of the fits) and ``calibrate spmm --graph`` (real shards and GEMMs of every
   grid of each G for both graphs; the GEMM input);
3. ``fit`` without runs: the microbenchmark-only profile ``<name>-micro``;
4. ``measure`` every grid of each G on two synthetic graphs of different density,
   with the micro profile's predictions logged beside the observations;
5. ``fit`` with the runs: the final profile ``models/<name>.json``;
6. ``validate`` (leave-one-(graph, G)-out) of the final profile, written as JSON.

``--quick`` shrinks everything to check the pipeline in a couple of minutes. Steps whose
output exists are resumed (the logs are append-only; ``measure`` skips logged runs), so
rerun with ``--skip`` to leave out finished steps.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from plexus_tune.cli.output import ProgressReporter
from plexus_tune.errors import UserError
from plexus_tune.fit.profile import FitOptions, fit_profile, write_profile
GRAPHS = (
    "rmat:nodes=16384,edges=262144,features=64,classes=8,seed=0",  # average degree ~32, skewed
    "grid2d:nodes=16384,features=64,classes=8,seed=0",  # road-like lattice, degree ~4
)
QUICK_GRAPHS = (
    "rmat:nodes=1024,edges=8192,features=16,classes=4,seed=0",
    "grid2d:nodes=1024,features=16,classes=4,seed=0",
)


def load() -> float:
    return os.getloadavg()[0]


def step(log: list, name: str, args) -> None:
    """Run one step: a plexus-tune command (a list of arguments) or a fit (a dict of fit_profile arguments and ``out``)."""
    before = load()
    start = time.time()
    if isinstance(args, dict):
        print(f"\n== {name} (load {before:.2f}): fit_profile -> {args['out']}", flush=True)
        rc = fit(args)
    else:
        print(f"\n== {name} (load {before:.2f}): {' '.join(args)}", flush=True)
        rc = subprocess.run([sys.executable, "-W", "ignore", "-m", "plexus_tune", *args], cwd=ROOT).returncode
    entry = {"step": name, "args": args, "rc": rc, "seconds": round(time.time() - start, 1),
             "load_before": round(before, 2), "load_after": round(load(), 2),
             "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))}
    log.append(entry)
    if rc != 0:
        raise SystemExit(f"step {name} failed with exit code {rc}")


def fit(args: dict) -> int:
    """Fit a profile with the library and write it; 0, or 2 after printing a bad-input error."""
    kwargs = {k: v for k, v in args.items() if k != "out"}
    progress = ProgressReporter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fitted = fit_profile(FitOptions(**kwargs, source=args["out"]), progress=progress)
    except UserError as exc:
        print(f"fit: error: {exc}", file=sys.stderr)
        return 2
    finally:
        progress.close()
    write_profile(fitted.profile, args["out"])
    for row in fitted.report["spmm"]["rows"]:
        print(f"  SpMM {row['kind']}: test R^2 {row['test_r2']:.4f}, test MAPE {row['test_mape']:.1f} %")
    print(f"  chosen {fitted.report['spmm']['chosen']}; wrote {args['out']}", flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default="measurements/cpu-gloo")
    parser.add_argument("--name", default="cpu-gloo-2core-fitted")
    parser.add_argument("--models-dir", default="models")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--skip", default="", help="comma-separated step names to leave out")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--gpus", default="4,6,8", help="comma-separated rank counts to calibrate and measure (default 4,6,8)")
    args = parser.parse_args()
    os.chdir(ROOT)  # every path is relative to the checkout, for the commands and the fits alike
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    Path(args.models_dir).mkdir(parents=True, exist_ok=True)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    try:
        gpus = sorted({int(g) for g in args.gpus.split(",") if g.strip()})
    except ValueError:
        parser.error(f"--gpus takes comma-separated integers, not {args.gpus!r}")
    if not gpus or min(gpus) < 1:
        parser.error("--gpus needs at least one rank count >= 1")
    graphs = QUICK_GRAPHS if args.quick else GRAPHS
    sizes = "1K:64K" if args.quick else "1K:64M"
    repeats = "2" if args.quick else "5"
    count = "40" if args.quick else "600"
    trials = "1" if args.quick else str(args.trials)
    epochs = "3" if args.quick else str(args.epochs)
    hidden = "16" if args.quick else str(args.hidden)
    coll, sweep, spmm, runs = out / "collectives.jsonl", out / "spmm-sweep.jsonl", out / "spmm-shards.jsonl", out / "runs.jsonl"
    passes = "3" if args.quick else "24"
    micro = Path(args.models_dir) / f"{args.name}-micro.json"
    final = Path(args.models_dir) / f"{args.name}.json"
    splits = 100 if args.quick else 1000
    log: list = []
    plan = []
    for g in reversed(gpus):
        plan.append((f"collectives-{g}", ["calibrate", "collectives", "--gpus", str(g), "--sizes", sizes, "--repeats", repeats, "--out", str(coll)]))
    plan.append(("spmm-sweep", ["calibrate", "spmm", "--sweep", "--count", count, "--max-nnz", "1000000", "--repeats", "2",
                                "--passes", passes, "--statistic", "median", "--out", str(sweep)]))
    for graph in graphs:
        for g in gpus:
            plan.append((f"spmm-graph-{graph.split(':')[0]}-{g}", ["calibrate", "spmm", "--graph", graph, "--gpus", str(g), "--hidden", hidden, "--repeats", "7" if not args.quick else repeats, "--out", str(spmm)]))
    fit_inputs = {"spmm": [str(sweep)], "gemm": [str(spmm)], "collectives": [str(coll)], "n_splits": splits}
    plan.append(("fit-micro", {**fit_inputs, "name": f"{args.name}-micro", "out": str(micro)}))
    for graph in graphs:
        for g in gpus:
            plan.append((f"measure-{graph.split(':')[0]}-{g}", ["measure", "--graph", graph, "--gpus", str(g), "--trials", trials, "--epochs", epochs, "--hidden", hidden, "--machine", str(micro), "--batch", "100", "--log", str(runs)]))
    plan.append(("fit", {**fit_inputs, "runs": [str(runs)], "name": args.name, "out": str(final)}))
    plan.append(("validate", ["validate", "--machine", str(final), "--runs", str(runs), "--json", str(out / "validation.json")]))
    plan.append(("validate-as-is", ["validate", "--machine", str(final), "--runs", str(runs), "--no-refit", "--json", str(out / "validation-as-is.json")]))
    plan.append(("validate-micro", ["validate", "--machine", str(micro), "--runs", str(runs), "--no-refit", "--json", str(out / "validation-micro.json")]))
    try:
        for name, cmd in plan:
            if name not in skip:
                step(log, name, cmd)
    finally:
        campaign = out / "campaign.json"
        previous = json.loads(campaign.read_text()) if campaign.exists() else []
        campaign.write_text(json.dumps(previous + log, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
