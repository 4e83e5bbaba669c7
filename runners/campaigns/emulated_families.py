"""Every algorithm family's configurations of G = 8 on an emulated cluster, against the planner (root).

    PLEXUS_TUNE_NETNS_PREFIX=af python runners/campaigns/emulated_families.py --cluster 2x4 \\
        --graph rmat:nodes=8192,edges=65536,features=64,classes=8,seed=3 --graph grid2d:nodes=8192,... \\
        --machine models/emulated-2x4-fitted.json --out-dir measurements/emulated-2x4-families-DATE

Steps (the library does the work, this script parses and prints):

1. measure (:func:`plexus_tune.measure.families.run_family_campaign`) on the emulated
   cluster ``--cluster`` (``2x4``, ``4x2`` or a full ``emulated:...`` spec) every trained
   family's configurations (plexus-3d every grid, cagnet-1d, 1.5d, 2d, 3d, supergcn
   pre/post/hybrid) at each ``--comm-precision``, on each ``--graph`` (a file or a
   synthetic spec; repeatable); ``--trials`` interleaved trials, all in ``runs.jsonl``
   (resumable);
2. predict every configuration with the profile ``--machine``, the graph given
   (:func:`plexus_tune.report.families.predict_rows`);
3. per graph: Spearman and regret over all configurations and precisions, each family's
   best predicted and observed (:func:`plexus_tune.report.families.score_rows`), in
   ``summary.json``; the last line is ``mean Spearman S, mean regret R``.

``--tiny``: one trial of two epochs on a 1024-node R-MAT (unless ``--graph``) with hidden
width 16, 20 runs per process set (CI).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.launch.launchers import make_launcher
from plexus_tune.measure.campaign import graph_source_text, load_graph_source, load_stats, workload_of
from plexus_tune.measure.families import cluster_spec, configuration_label, run_family_campaign, untrained_families
from plexus_tune.model.comm_precision import parse_precision
from plexus_tune.model.machine import load_machine
from plexus_tune.report.families import observed_rows, predict_rows, score_rows

ROOT = Path(__file__).resolve().parents[2]

GRAPHS = ("rmat:nodes=8192,edges=65536,features=64,classes=8,seed=3",
          "grid2d:nodes=8192,features=64,classes=8,seed=3",
          "rmat:nodes=8192,edges=65536,a=0.25,b=0.25,c=0.25,d=0.25,features=64,classes=8,seed=3")
TINY_GRAPHS = ("rmat:nodes=1024,edges=8192,features=16,classes=4,seed=3",)


def load_avg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", action="append", help="graph file or synthetic spec (repeatable; default: "
                        "an R-MAT, the lattice and a uniform random graph of 8192 nodes)")
    parser.add_argument("--cluster", default="2x4", help="2x4, 4x2 (nodes x ranks) or an emulated:... spec")
    parser.add_argument("--machine", default=None, help="profile (default models/emulated-NxR-fitted.json)")
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--comm-precision", default="fp32,bf16", help="comma-separated precisions to measure")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4, help="runs per process set")
    parser.add_argument("--skip-measure", action="store_true", help="only predict and score the logged runs")
    parser.add_argument("--tiny", action="store_true", help="one trial of 2 epochs on a 1024-node graph")
    args = parser.parse_args(argv)
    if args.tiny:
        args.trials, args.epochs, args.warmup, args.hidden, args.batch = 1, 2, 1, 16, 20
    graphs = args.graph or list(TINY_GRAPHS if args.tiny else GRAPHS)
    out = Path(args.out_dir)
    log = out / "runs.jsonl"
    try:
        spec = cluster_spec(args.cluster)
        precisions = [parse_precision(p) for p in args.comm_precision.split(",") if p.strip()]
        if not precisions:
            raise UserError("--comm-precision names no precision; give e.g. fp32,bf16")
        machine_path = args.machine
        if machine_path is None:
            nodes_ranks = args.cluster if "x" in args.cluster and ":" not in args.cluster else "2x4"
            machine_path = str(ROOT / "models" / f"emulated-{nodes_ranks}-fitted.json")
        machine = load_machine(machine_path)
        for graph in graphs:
            graph_source_text(graph)  # a bad spec or missing file fails before any run
        out.mkdir(parents=True, exist_ok=True)
        missing = untrained_families()
        if missing:
            print(f"left out (no trainer): {', '.join(missing)}", flush=True)
        started = time.time()
        loads = [load_avg()]
        if not args.skip_measure:
            with make_launcher(cluster=spec) as launcher:
                for graph in graphs:
                    run_family_campaign(
                        graph, args.gpus, log=str(log), precisions=precisions, trials=args.trials, epochs=args.epochs,
                        warmup=args.warmup, layers=args.layers, hidden=args.hidden, batch=args.batch, launcher=launcher,
                        on_start=lambda done, total, graph=graph: (
                            loads.append(load_avg()),
                            print(f"== {graph}: runs {done + 1}.. of {total}, load {loads[-1]}, "
                                  f"{time.time() - started:.0f} s", flush=True)),
                        on_result=lambda r, g: print(
                            f"   {configuration_label(r.get('algorithm'), g, r.get('options'), r.get('comm_precision'))}"
                            f" trial {r.get('trial')}: {r.get('status')} {r.get('epoch_ms', float('nan')):.1f} ms",
                            flush=True))
        loads.append(load_avg())
        if not args.skip_measure:
            print(f"measured in {time.time() - started:.0f} s, load {loads[-1]}", flush=True)
        summary = {"cluster": spec, "machine": machine.name, "gpus": args.gpus, "precisions": precisions,
                   "trials": args.trials, "epochs": args.epochs, "warmup": args.warmup, "layers": args.layers,
                   "hidden": args.hidden, "measure_seconds": round(time.time() - started, 1),
                   "load_average": loads, "left_out": missing, "graphs": []}
        for graph in graphs:
            source, _, _ = graph_source_text(graph)
            workload = workload_of(load_stats(graph), args.layers, args.hidden)
            rows = predict_rows(observed_rows(log, source, gpus=args.gpus), workload, machine, load_graph_source(graph))
            rows.sort(key=lambda r: r["epoch_ms"])
            entry = {"graph": graph, **score_rows(rows), "rows": rows}
            summary["graphs"].append(entry)
            print(f"\n{graph}: {entry['configurations']} configurations, Spearman {entry['spearman']:.3f}, "
                  f"regret {entry['regret']:.3f}; predicted best {entry.get('predicted_best')}, "
                  f"observed best {entry.get('observed_best')}")
            print(f"{'family':<12} {'observed best':<28} {'ms':>8} {'predicted best':<28} {'ms':>8}")
            for family, f in entry["families"].items():
                print(f"{family:<12} {f['observed_best']:<28} {f['epoch_ms']:>8.1f} {f['predicted_best']:<28} "
                      f"{f['total_ms']:>8.1f}")
            print(f"{'configuration':<34} {'observed ms':>12} {'predicted ms':>13}")
            for r in rows:
                print(f"{r['label']:<34} {r['epoch_ms']:>12.1f} {r['total_ms']:>13.1f}")
        scores = [g for g in summary["graphs"] if g["configurations"]]
        summary["mean_spearman"] = float(np.mean([g["spearman"] for g in scores])) if scores else float("nan")
        summary["mean_regret"] = float(np.mean([g["regret"] for g in scores])) if scores else float("nan")
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float) + "\n")
        print(f"\nsummary in {out / 'summary.json'}; load average {loads[0]} .. {loads[-1]}")
        print(f"mean Spearman {summary['mean_spearman']:.3f}, mean regret {summary['mean_regret']:.3f}")
    except UserError as exc:
        print(f"emulated_families: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
