"""How well an SpMM model kind predicts the H100 measurements it was not fitted on.

Prints, for the kind (default structure-boosted) beside learned-boosted (shape only):

1. extrapolation: fit on the smallest 70 % of a sweep by nnz, then by dense columns,
   MAPE on the rest; the uniform sweep alone and both sweeps (uniform + structured);
2. the V/U shape ratio on the products-size R-MAT: config U (Gz = 64, A is N x N/64,
   100 dense columns) against config V (Gx = 64, the whole A times 2 columns), measured
   7.3x; the model fitted as the shipped profile is (sweeps + Graph500 R-MAT shards);
3. held-out structures: fitted on the sweeps and the Graph500 R-MAT shards, each grid's
   SpMM per epoch (forward + backward of every layer of its largest shard) of the
   skewed and the uniform R-MAT (never fitted on): per G the largest error and the
   Spearman rank correlation of the grids.

  python runners/campaigns/spmm_model_eval.py [--data measurements/h100-2026-11-25] [--kind structure-boosted]

The shard and structured-sweep files are read from DATA/structure/ (records with the
column popularity curve, runners/campaigns/spmm_structure_annotate.py), the uniform sweep from DATA.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from plexus_tune.model.spmm import SPMM_MODELS
from plexus_tune.fit.scoring import mape_percent as mape
from plexus_tune.report.spmm_eval import (SpmmData, concat_tables, extrapolation_mape, fitted_kind,
                                          grid_epoch_errors, spmm_time_ms, v_over_u)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "measurements" / "h100-2026-11-25")
    ap.add_argument("--kind", default="structure-boosted", choices=sorted(k for k, c in SPMM_MODELS.items() if c.fittable))
    ap.add_argument("--baseline", default="learned-boosted", help="the kind compared beside it (default learned-boosted)")
    ap.add_argument("--ablate", action="store_true", help="also score the kind with every operand taken as uniformly "
                    "random (its structure inputs ablated)")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    data = SpmmData(args.data)
    both = concat_tables(data.sweep, data.structured)
    kinds = [args.kind] + ([args.baseline] if args.baseline and args.baseline != args.kind else [])
    print("1. extrapolation MAPE (fit on the smallest 70 %, test on the rest; goal 10 %)")
    for kind in kinds:
        row = [extrapolation_mape(kind, data.sweep, "nnz"), extrapolation_mape(kind, data.sweep, "dense_cols"),
               extrapolation_mape(kind, both, "nnz"), extrapolation_mape(kind, both, "dense_cols")]
        print(f"   {kind:18s} uniform sweep: by nnz {row[0]:5.1f} %, by dense columns {row[1]:5.1f} %;  "
              f"both sweeps: by nnz {row[2]:5.1f} %, by dense columns {row[3]:5.1f} %", flush=True)
    profile_fit = concat_tables(data.sweep, data.structured, data.rmat)
    held_out = {"skewed R-MAT (a=.65 b=c=.15)": data.skewed, "uniform R-MAT (a=b=c=d=.25)": data.uniform}
    variants = [(kind, False) for kind in kinds] + ([(args.kind, True)] if args.ablate and SPMM_MODELS[args.kind].uses_structure else [])
    for kind, blind in variants:
        model = fitted_kind(kind, profile_fit, blind=blind)
        kind = kind + (" (structure ablated)" if blind else "")
        ratio, measured = v_over_u(model, data.rmat)
        print(f"2. {kind}: V/U predicted {ratio:.2f}x, measured {measured:.2f}x ({(ratio / measured - 1) * 100:+.1f} %; "
              f"within 25 %: {'yes' if abs(ratio / measured - 1) <= 0.25 else 'NO'})")
        sweeps_only = fitted_kind(model.name, both, blind=blind)
        ratio_s, _ = v_over_u(sweeps_only, data.rmat)
        print(f"   fitted on the sweeps alone: V/U {ratio_s:.2f}x")
        print(f"3. {kind}, fitted on the sweeps and the Graph500 R-MAT shards; held out:")
        for name, df in held_out.items():
            pred = spmm_time_ms(model, df)
            print(f"   {name}: per-SpMM MAPE {mape(pred, df['time_ms']):.1f} % over {len(df)} timings")
            for gpus, e in grid_epoch_errors(df, pred).items():
                ok = e["max_abs_error_pct"] <= 15 and e["spearman"] >= 0.95
                print(f"     G={gpus:4d}: {e['grids']} grids, SpMM per epoch max |error| {e['max_abs_error_pct']:.1f} % "
                      f"(median {e['median_abs_error_pct']:.1f} %), Spearman {e['spearman']:.3f}  "
                      f"[{'meets' if ok else 'misses'} 15 % / 0.95]", flush=True)
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
