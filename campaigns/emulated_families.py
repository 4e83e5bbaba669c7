"""Every algorithm family's configurations of G = 8 on an emulated 2 x 4 cluster, against the planner (root).

    PLEXUS_TUNE_NETNS_PREFIX=af python campaigns/emulated_families.py \\
        --machine models/emulated-2x4-fitted.json --out-dir measurements/emulated-2x4-families-DATE

Steps:

1. ``measure`` (library: :func:`plexus_tune.measure.campaign.run_campaign`) on the emulated
   cluster ``--cluster`` (default 2 nodes x 4 ranks, 0.05 GB/s between nodes) for each
   graph (an R-MAT and the road-like lattice) and each family: plexus-3d (every grid of
   8), cagnet-1d, cagnet-1.5d (c = 2), cagnet-2d (every Pr x Pc = 8) and supergcn (pre,
   post, hybrid); ``--trials`` interleaved trials of each, all logged in ``runs.jsonl``
   (resumable: logged runs are skipped);
2. the planner's prediction of every configuration with the profile ``--machine``
   (:func:`plexus_tune.model.prediction.predict_run_grids`, the graph given so that the
   partition and the SUMMA pieces are the graph's own);
3. per (graph, G): Spearman of predicted against observed (median over trials) epoch
   time over all configurations of all families, regret (observed time of the predicted
   best over the observed best), each family's best predicted and observed, in
   ``summary.json``. The profile is never fitted on these runs (nor on these graphs), so
   every (graph, G) group is held out.

``--tiny``: one trial of two epochs on 1024-node graphs with hidden width 16.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from plexus_tune.errors import UserError
from plexus_tune.report.metrics import regret, spearman
from plexus_tune.graph import synthetic
from plexus_tune.launch.launchers import make_launcher
from plexus_tune.measure.campaign import load_stats, run_campaign, workload_of
from plexus_tune.measure.store import read_records
from plexus_tune.model.machine import load_machine
from plexus_tune.model.family import family_of
from plexus_tune.model.prediction import predict_run_grids

GRAPHS = ("rmat:nodes=8192,edges=65536,features=64,classes=8,seed=3",
          "grid2d:nodes=8192,features=64,classes=8,seed=3")
TINY_GRAPHS = ("rmat:nodes=1024,edges=8192,features=16,classes=4,seed=3",
               "grid2d:nodes=1024,features=16,classes=4,seed=3")
CLUSTER = "emulated:nodes=2,ranks_per_node=4,inter_gbps=0.05,inter_latency_us=0"
#: (family, supergcn aggregation) of the campaign, in report order.
CONFIGURATIONS = (("plexus-3d", None), ("cagnet-1d", None), ("cagnet-1.5d", None), ("cagnet-2d", None),
                  ("supergcn", "pre"), ("supergcn", "post"), ("supergcn", "hybrid"))


def label(family: str, grid, aggregation) -> str:
    text = f"{family} {'x'.join(map(str, grid))}"
    return text + (f" {aggregation}" if aggregation else "")


def observed_table(log: Path, graph: str) -> dict:
    """(family, grid, aggregation) -> median epoch ms over the successful trials of ``graph``."""
    records, _ = read_records(log, schema="run")
    times: dict = {}
    for r in records:
        if r.get("status") != "ok" or r.get("graph_source") != f"synthetic:{graph}":
            continue
        key = (r.get("algorithm", "plexus-3d"), tuple(int(v) for v in r["grid"].split("x")),
               (r.get("options") or {}).get("aggregation"))
        times.setdefault(key, []).append(float(r["epoch_ms"]))
    return {k: float(np.median(v)) for k, v in times.items()}


def predicted(machine, workload, graph_obj, family: str, grid, aggregation) -> float:
    options = {} if family == "plexus-3d" else {"graph": graph_obj}
    if aggregation:
        options["aggregation"] = aggregation
    pred = predict_run_grids(workload, machine, np.asarray([grid]), algorithm=family, options=options)
    return float(pred["total_ms"][0])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--machine", default=str(ROOT / "models" / "emulated-2x4-fitted.json"))
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--cluster", default=CLUSTER)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4, help="runs per process set")
    parser.add_argument("--skip-measure", action="store_true", help="only predict and score the logged runs")
    parser.add_argument("--tiny", action="store_true", help="one trial of 2 epochs on 1024-node graphs")
    args = parser.parse_args(argv)
    graphs = TINY_GRAPHS if args.tiny else GRAPHS
    if args.tiny:
        args.trials, args.epochs, args.warmup, args.hidden = 1, 2, 1, 16
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "runs.jsonl"
    try:
        machine = load_machine(args.machine)
        started = time.time()
        if not args.skip_measure:
            launcher = make_launcher(cluster=args.cluster)
            with launcher:
                for graph in graphs:
                    for family, aggregation in CONFIGURATIONS:
                        grids = [tuple(int(v) for v in g) for g in family_of(family).configurations(args.gpus)]
                        print(f"== {graph}: {family} {aggregation or ''} ({len(grids)} configurations)", flush=True)
                        run_campaign(graph, args.gpus, grids, log=str(log), trials=args.trials, epochs=args.epochs,
                                     warmup=args.warmup, layers=args.layers, hidden=args.hidden, batch=args.batch,
                                     train_options={"algorithm": family, "aggregation": aggregation,
                                                    "timeout_s": 900.0},
                                     launcher=launcher,
                                     on_result=lambda r, g: print(f"   {label(r.get('algorithm'), g, (r.get('options') or {}).get('aggregation'))}"
                                                                  f" trial {r.get('trial')}: {r.get('status')} "
                                                                  f"{r.get('epoch_ms', float('nan')):.1f} ms", flush=True))
        summary = {"cluster": args.cluster, "machine": machine.name, "gpus": args.gpus, "trials": args.trials,
                   "epochs": args.epochs, "warmup": args.warmup, "layers": args.layers, "hidden": args.hidden,
                   "measure_seconds": round(time.time() - started, 1), "graphs": []}
        for graph in graphs:
            graph_obj = synthetic(graph)
            workload = workload_of(load_stats(graph), args.layers, args.hidden)
            obs = observed_table(log, graph)
            rows = []
            for (family, grid, aggregation), ms in sorted(obs.items(), key=lambda kv: kv[1]):
                rows.append({"family": family, "grid": "x".join(map(str, grid)), "aggregation": aggregation,
                             "observed_ms": ms,
                             "predicted_ms": predicted(machine, workload, graph_obj, family, grid, aggregation)})
            p = np.array([r["predicted_ms"] for r in rows])
            o = np.array([r["observed_ms"] for r in rows])
            best_pred, best_obs = rows[int(np.argmin(p))], rows[int(np.argmin(o))]
            families = {}
            for r in rows:
                f = families.setdefault(r["family"], {"observed_best": None, "predicted_best": None})
                if f["observed_best"] is None or r["observed_ms"] < f["observed_best"][1]:
                    f["observed_best"] = (label(r["family"], r["grid"].split("x"), r["aggregation"]), r["observed_ms"])
                if f["predicted_best"] is None or r["predicted_ms"] < f["predicted_best"][1]:
                    f["predicted_best"] = (label(r["family"], r["grid"].split("x"), r["aggregation"]), r["predicted_ms"])
            entry = {"graph": graph, "configurations": len(rows), "spearman": spearman(p, o), "regret": regret(p, o),
                     "predicted_best": label(best_pred["family"], best_pred["grid"].split("x"), best_pred["aggregation"]),
                     "observed_best": label(best_obs["family"], best_obs["grid"].split("x"), best_obs["aggregation"]),
                     "families": families, "rows": rows}
            summary["graphs"].append(entry)
            print(f"\n{graph}: {len(rows)} configurations, Spearman {entry['spearman']:.3f}, regret {entry['regret']:.3f}; "
                  f"predicted best {entry['predicted_best']}, observed best {entry['observed_best']}")
            print(f"{'configuration':<32} {'observed ms':>12} {'predicted ms':>13}")
            for r in rows:
                print(f"{label(r['family'], r['grid'].split('x'), r['aggregation']):<32} {r['observed_ms']:>12.1f} "
                      f"{r['predicted_ms']:>13.1f}")
        scores = summary["graphs"]
        summary["mean_spearman"] = float(np.mean([g["spearman"] for g in scores])) if scores else float("nan")
        summary["mean_regret"] = float(np.mean([g["regret"] for g in scores])) if scores else float("nan")
        (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        print(f"\nmean Spearman {summary['mean_spearman']:.3f}, mean regret {summary['mean_regret']:.3f}; "
              f"summary in {out / 'summary.json'}")
    except UserError as exc:
        print(f"emulated_families: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
