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

  python runners/spmm_model_eval.py [--data measurements/h100-2026-11-25] [--kind structure-boosted]

The shard and structured-sweep files are read from DATA/structure/ (records with the
column popularity curve, runners/spmm_structure_annotate.py), the uniform sweep from DATA.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from plexus_tune.fit.spmm import _spmm_shapes, fit_kind, spmm_structure
from plexus_tune.fit.tables import load_table
from plexus_tune.model.spmm import SPMM_MODELS

MEASURED_V_OVER_U = 7.3


def mape(pred, observed) -> float:
    pred, observed = np.asarray(pred, float), np.asarray(observed, float)
    return float(np.mean(np.abs(pred - observed) / observed) * 100)


def spearman(a, b) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    def ranks(x):
        x = np.asarray(x, float)
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x))
        for value in np.unique(x):  # ties share their mean rank
            tied = x == value
            r[tied] = r[tied].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra @ rb) / np.sqrt((ra @ ra) * (rb @ rb)))


def grid_epoch_errors(df, predicted) -> dict:
    """Per G: {grid: (observed, predicted)} SpMM ms per epoch, the largest |error| % and the Spearman of the grids."""
    out = {}
    frame = df.assign(predicted_ms=np.asarray(predicted, float))
    for gpus, part in frame.groupby("gpus"):
        sums = part.groupby("grid")[["time_ms", "predicted_ms"]].sum()
        err = (sums["predicted_ms"] / sums["time_ms"] - 1) * 100
        out[int(gpus)] = {"grids": len(sums), "max_abs_error_pct": float(err.abs().max()),
                          "median_abs_error_pct": float(err.abs().median()),
                          "spearman": spearman(sums["time_ms"], sums["predicted_ms"])}
    return out


class Data:
    def __init__(self, root: Path):
        self.sweep = load_table(root / "spmm-sweep.jsonl", schema="spmm")
        self.structured = load_table(root / "structure" / "spmm-structured-sweep.jsonl", schema="spmm")
        self.rmat = load_table(root / "structure" / "rmat-spmm-shards.jsonl", schema="spmm")
        self.skewed = load_table(root / "structure" / "rmat-skewed-spmm-shards.jsonl", schema="spmm")
        self.uniform = load_table(root / "structure" / "rmat-uniform-spmm-shards.jsonl", schema="spmm")


def _concat(*frames):
    import pandas as pd

    return pd.concat(frames, ignore_index=True)


def fitted(kind: str, df, *, blind: bool = False):
    """The kind fitted on df; ``blind``: every operand taken as uniformly random (the structure ablated)."""
    cls = SPMM_MODELS[kind]
    structure = spmm_structure(df) if cls.uses_structure and not blind else None
    model = fit_kind(cls, _spmm_shapes(df), np.asarray(df["time_ms"], float), structure)
    model.blind = blind
    return model


def predicted(model, df):
    if model.uses_structure:
        return model.predict(*_spmm_shapes(df), None if getattr(model, "blind", False) else spmm_structure(df))
    return model.predict(*_spmm_shapes(df))


def extrapolation(kind: str, df, column: str) -> float:
    ordered = df.sort_values(column, kind="stable").reset_index(drop=True)
    cut = int(0.7 * len(ordered))
    train, test = ordered.iloc[:cut], ordered.iloc[cut:]
    return mape(predicted(fitted(kind, train), test), test["time_ms"])


def v_over_u(model, shards) -> tuple[float, float]:
    """(predicted, measured) V/U on the Graph500 shards: U rows N, common ceil(N/64), k 100; V rows = common = N, k 2."""
    n = int(shards["graph_nodes"].iloc[0])
    u = shards[(shards["rows"] == n) & (shards["common"] == -(-n // 64)) & (shards["dense_cols"] == 100)].iloc[:1]
    v = shards[(shards["rows"] == n) & (shards["common"] == n) & (shards["dense_cols"] == 2)].iloc[:1]
    pu, pv = predicted(model, u)[0], predicted(model, v)[0]
    return float(pv / pu), float(v["time_ms"].iloc[0] / u["time_ms"].iloc[0])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parent.parent / "measurements" / "h100-2026-11-25")
    ap.add_argument("--kind", default="structure-boosted", choices=sorted(k for k, c in SPMM_MODELS.items() if c.fittable))
    ap.add_argument("--baseline", default="learned-boosted", help="the kind compared beside it (default learned-boosted)")
    ap.add_argument("--ablate", action="store_true", help="also score the kind with every operand taken as uniformly "
                    "random (its structure inputs ablated)")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    data = Data(args.data)
    both = _concat(data.sweep, data.structured)
    kinds = [args.kind] + ([args.baseline] if args.baseline and args.baseline != args.kind else [])
    print("1. extrapolation MAPE (fit on the smallest 70 %, test on the rest; goal 10 %)")
    for kind in kinds:
        row = [extrapolation(kind, data.sweep, "nnz"), extrapolation(kind, data.sweep, "dense_cols"),
               extrapolation(kind, both, "nnz"), extrapolation(kind, both, "dense_cols")]
        print(f"   {kind:18s} uniform sweep: by nnz {row[0]:5.1f} %, by dense columns {row[1]:5.1f} %;  "
              f"both sweeps: by nnz {row[2]:5.1f} %, by dense columns {row[3]:5.1f} %", flush=True)
    profile_fit = _concat(data.sweep, data.structured, data.rmat)
    held_out = {"skewed R-MAT (a=.65 b=c=.15)": data.skewed, "uniform R-MAT (a=b=c=d=.25)": data.uniform}
    variants = [(kind, False) for kind in kinds] + ([(args.kind, True)] if args.ablate and SPMM_MODELS[args.kind].uses_structure else [])
    for kind, blind in variants:
        model = fitted(kind, profile_fit, blind=blind)
        kind = kind + (" (structure ablated)" if blind else "")
        ratio, measured = v_over_u(model, data.rmat)
        print(f"2. {kind}: V/U predicted {ratio:.2f}x, measured {measured:.2f}x ({(ratio / measured - 1) * 100:+.1f} %; "
              f"within 25 %: {'yes' if abs(ratio / measured - 1) <= 0.25 else 'NO'})")
        sweeps_only = fitted(model.name, both, blind=blind)
        ratio_s, _ = v_over_u(sweeps_only, data.rmat)
        print(f"   fitted on the sweeps alone: V/U {ratio_s:.2f}x")
        print(f"3. {kind}, fitted on the sweeps and the Graph500 R-MAT shards; held out:")
        for name, df in held_out.items():
            pred = predicted(model, df)
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
