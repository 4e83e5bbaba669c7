"""Time ``fit`` on a shipped calibration and compare its scores with the shipped profile's.

    python runners/benchmarks/bench_fit.py                       # measurements/cpu-gloo-2026-11-23
    python runners/benchmarks/bench_fit.py --jobs 1 --r2-sem 0   # every split, one process
    python runners/benchmarks/bench_fit.py --h100                # also: auto against one learned-boosted fit, H100 sweep

Prints progress as the fit goes (stage, splits scored), the wall time of each stage and
in all, the load average before and after, and per SpMM kind the splits scored (``beaten``:
stopped once it trailed the best kind on the same splits), the held-out R^2 and MAPE beside the shipped
profile's (and the largest R^2 difference), then the collective form written and the
epoch-fit scores. ``--h100`` times ``fit_spmm(kind="auto")`` on the H100 SpMM sweeps of
measurements/h100-2026-11-25 beside one learned-boosted fit of the same rows (the goal:
auto at most 10 times that fit).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from plexus_tune.fit.profile import FitOptions, fit_profile


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", default=str(ROOT / "measurements" / "cpu-gloo-2026-11-23"))
    parser.add_argument("--profile", default=str(ROOT / "measurements" / "cpu-gloo-2026-11-23" / "profiles" / "cpu-gloo-2core-fitted-2026-11-23.json"))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--splits", type=int, default=1000)
    parser.add_argument("--r2-sem", type=float, default=0.0025, help="0: score every split")
    parser.add_argument("--h100", action="store_true", help="also time fit_spmm auto against one learned-boosted fit on the H100 sweeps")
    args = parser.parse_args()
    shown: dict = {}

    def progress(stage, done, total):
        step = max(1, total // 10)
        if stage not in shown or done >= total or done - shown[stage] >= step:
            shown[stage] = done
            print(f"  [{time.perf_counter() - started:6.1f} s] {stage}: {done}/{total}", file=sys.stderr, flush=True)

    logs = Path(args.logs)
    shipped = json.loads(Path(args.profile).read_text())
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    fitted = fit_profile(FitOptions(spmm=logs / "spmm-sweep.jsonl", gemm=logs / "spmm-shards.jsonl", collectives=logs / "collectives.jsonl",
                         runs=logs / "runs.jsonl", name="bench", n_splits=args.splits, r2_sem=args.r2_sem or None, n_jobs=args.jobs), progress=progress)
    total_s = time.perf_counter() - started
    print(f"fit on {logs.name}: {total_s:.1f} s with {args.jobs} worker(s) (load average {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after)")
    print("stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in fitted.report["seconds"].items()))
    old = shipped["fit"]["spmm"]["scores"]
    new = fitted.profile["fit"]["spmm"]["scores"]
    print(f"{'SpMM kind':<18} {'splits':>6} {'test R^2':>9} {'shipped':>9} {'diff':>8} {'test MAPE %':>12} {'shipped':>8}")
    worst = 0.0
    for kind, sc in new.items():
        ref = old.get(kind) or old.get({"paper-spmm": "paper", "learned-roofline": "learned", "learned-boosted": "boosted"}.get(kind, kind), {})
        diff = sc["test_r2"] - ref.get("test_r2", float("nan"))
        worst = max(worst, abs(diff)) if ref else worst
        splits = f"{sc.get('splits', args.splits)}{'b' if sc.get('beaten') else ''}"
        print(f"{kind:<18} {splits:>6} {sc['test_r2']:>9.4f} {ref.get('test_r2', float('nan')):>9.4f} {diff:>+8.4f} "
              f"{sc['test_mape']:>12.2f} {ref.get('test_mape', float('nan')):>8.2f}")
    print(f"largest |test R^2 difference| against the shipped profile: {worst:.4f}; chosen {fitted.spmm.kind} "
          f"(shipped {shipped['spmm'].get('kind')})")
    coll = fitted.report["collectives"]
    epoch = fitted.report["epoch"]
    print(f"collectives: {coll['chosen']} ({coll['selected_by']}); epoch fit: test R^2 {epoch['scores']['test_r2']:.3f}, "
          f"test MAPE {epoch['scores']['test_mape']:.1f} % (shipped {shipped['fit']['epoch']['scores']['test_mape']:.1f} %)")
    print("(splits marked b: scoring stopped once the kind's MAPE trailed the best kind's on the same splits by 4 standard "
          "errors of the paired difference; the others stop at the R^2 standard error, or at 50 splits, past which the "
          "splits hold under 5 % of the score's variance: plexus_tune.fit.scoring.split_cap)")
    if args.h100:
        h100_auto_against_one_fit(args)
    return 0


def h100_auto_against_one_fit(args) -> None:
    """fit_spmm(kind="auto") on the H100 SpMM sweeps against one learned-boosted fit of the same rows."""
    from plexus_tune.fit.profile import load_tables
    from plexus_tune.fit.spmm import fit_spmm

    data = ROOT / "measurements" / "h100-2026-11-25"
    df = load_tables([data / "spmm-sweep.jsonl", data / "structure" / "spmm-structured-sweep.jsonl",
                      data / "structure" / "rmat-spmm-shards.jsonl"], "spmm")
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    fit_spmm(df, "learned-boosted", n_splits=0)
    one_s = time.perf_counter() - started
    started = time.perf_counter()
    auto = fit_spmm(df, "auto", n_splits=args.splits, r2_sem=args.r2_sem or None, n_jobs=args.jobs,
                    progress=lambda k, d, t: print(f"  [{time.perf_counter() - started:6.1f} s] {k}: {d}/{t}",
                                                   file=sys.stderr, flush=True) if d == t or d % 100 < 10 else None)
    auto_s = time.perf_counter() - started
    print(f"H100 SpMM rows {len(df)}: one learned-boosted fit {one_s:.2f} s; fit_spmm auto {auto_s:.1f} s = "
          f"{auto_s / one_s:.1f} x (goal <= 10 x); chose {auto.kind} (load average {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after)")
    for kind, sc in auto.all_scores.items():
        print(f"  {kind:<18} splits {sc.get('splits')}{' (beaten)' if sc.get('beaten') else ''}: "
              f"test MAPE {sc['test_mape']:.2f} %, test R^2 {sc['test_r2']:.4f}")


if __name__ == "__main__":
    raise SystemExit(main())
