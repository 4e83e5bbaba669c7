"""Communication precision: grids of G at fp32, bf16, int8, int2, observed against predicted.

    PYTHONPATH=. python runners/campaigns/comm_precision.py measure --out measurements/comm-precision-DATE
    PYTHONPATH=. python runners/campaigns/comm_precision.py report  --out measurements/comm-precision-DATE

On an emulated cluster (root), the best grid of G = 8 behind a slow link, 3 trials:

    PYTHONPATH=. python runners/campaigns/comm_precision.py measure --out OUT --cluster emulated:nodes=2,ranks_per_node=4,inter_gbps=0.05 \
        --gpus 8 --grids 2x2x2 --graphs large --trials 3 --quant-from measurements/comm-precision-2026-11-24/quant.jsonl
    PYTHONPATH=. python runners/campaigns/comm_precision.py report --out OUT --profile models/emulated-2x4-fitted.json

``measure`` writes two small graphs into ``OUT/graphs`` (an R-MAT graph trained with
the seeded random split, and a second R-MAT graph written as an OGB node-property
directory with its own ``split/random`` files), trains every grid of G = 4 at each
precision for ``--epochs`` epochs (``--trials`` interleaved trials, one thread per
rank; on ``--cluster`` through the emulated launcher), appending to ``OUT/runs.jsonl``;
times the precisions' collectives beside FP32 on the same ranks into
``OUT/collectives.jsonl`` (as ``plexus-tune calibrate collectives --comm-precision``)
unless that log exists or ``--no-collectives``; then times quantize and dequantize (as
``plexus-tune calibrate quant``) into ``OUT/quant.jsonl`` unless ``--quant-from`` names
such a log of this host. Trials already in the log are skipped, so an interrupted
campaign resumes. ``report`` predicts every run with ``--profile`` plus the ``quant``
entry fitted from those logs (codec rates, and the per-call time of each scheme unless
``--codec-only``; written to ``OUT/profile.json``), prints and writes ``OUT/results.md``
(medians over trials of observed against predicted epoch and communication time, final
test accuracy against FP32, and the gain fp32 / precision observed against predicted)
and draws ``OUT/precision.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: graph pairs (R-MAT with a seeded random split; R-MAT written as an OGB directory) and the
#: hidden width they train with: ``small`` for one host, ``large`` for messages that keep a
#: slow emulated link busy (about 1 MiB per rank and collective at 2x2x2)
GRAPH_SETS = {
    "small": ({"rmat-random-split": "rmat:nodes=2048,edges=16384,features=32,classes=8,seed=3",
               "rmat-ogb-dir": "rmat:nodes=3072,edges=24576,features=32,classes=6,seed=7"}, 32),
    "large": ({"rmat-random-split": "rmat:nodes=8192,edges=65536,features=64,classes=8,seed=3",
               "rmat-ogb-dir": "rmat:nodes=8192,edges=65536,features=64,classes=6,seed=7"}, 64),
}
PRECISIONS = ("fp32", "bf16", "int8", "int2")
BASE_PROFILE = "measurements/cpu-gloo-2026-11-23/profiles/cpu-gloo-2core-fitted-2026-11-23.json"


def graph_sources(out: Path, graph_set: str = "small") -> dict[str, str]:
    """Name -> trainer source; writes the OGB-layout directory once."""
    from plexus_tune.graph import synthetic
    from plexus_tune.graph.splits import random_split, write_ogb_dataset

    graphs = GRAPH_SETS[graph_set][0]
    ogb = out / "graphs" / "rmat-ogb-dir"
    if not (ogb / "split").is_dir():
        graph = synthetic(graphs["rmat-ogb-dir"])
        # an OGB-like split: few training nodes, as ogbn-products has
        write_ogb_dataset(graph, ogb, random_split(graph.num_nodes, seed=11, train=0.3, valid=0.2))
    return {"rmat-random-split": "synthetic:" + graphs["rmat-random-split"], "rmat-ogb-dir": str(ogb)}


def measure(args) -> int:
    import contextlib
    import shutil
    from collections import Counter

    import numpy as np

    from plexus_tune.launch.launchers import make_launcher
    from plexus_tune.measure.campaign import config_identity, launcher_options
    from plexus_tune.measure.identity import run_identity
    from plexus_tune.measure.store import read_records
    from plexus_tune.model.grid import enumerate_grids, parse_grid
    from plexus_tune.trainer import TrainConfig
    from plexus_tune.measure.training import run_training

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "runs.jsonl"
    done = Counter()
    if log.exists():
        done.update(run_identity(r) for r in read_records(log, schema="run")[0] if r.get("status") == "ok")
    grids = [parse_grid(g) for g in args.grids.split(",")] if args.grids else [tuple(int(g) for g in grid) for grid in enumerate_grids(args.gpus)]
    launcher = make_launcher(cluster=args.cluster) if args.cluster else None
    # the launcher's name and cluster belong to the identity of the runs it logs
    where = launcher_options({"machine": args.machine}, launcher)
    sources = graph_sources(out, args.graphs)
    with launcher if launcher is not None else contextlib.nullcontext():
        for trial in range(1, args.trials + 1):
            for name, source in sources.items():
                spec = source[len("synthetic:"):] if source.startswith("synthetic:") else None
                for grid in grids:
                    for precision in args.precisions.split(","):
                        config = TrainConfig(grid=grid, graph=None if spec else source, synthetic=spec,
                                             layers=3, hidden=GRAPH_SETS[args.graphs][1], epochs=args.epochs, warmup=10, seed=0,
                                             comm_precision=precision, threads_per_rank=1, log=str(log),
                                             layer_norm=args.layer_norm, **where)
                        identity = config_identity(config)
                        if done[identity] >= trial:
                            continue
                        rec = run_training(config, raise_on_failure=False, launcher=launcher)
                        done[identity] += rec.get("status") == "ok"
                        acc = (rec.get("final_accuracy") or {}).get("test", float("nan"))
                        print(f"trial {trial} {name} {rec['grid']} {precision}: {rec.get('status')} "
                              f"epoch {rec.get('epoch_ms', float('nan')):.1f} ms, comm {rec.get('comm_ms', float('nan')):.1f} ms, "
                              f"quant {rec.get('quant_ms', float('nan')):.1f} ms, test accuracy {acc:.3f}", flush=True)
        if not args.no_collectives and not (out / "collectives.jsonl").exists():
            # the schemes beside FP32 on the same ranks: the per-call time of each precision
            from plexus_tune.measure.collectives import calibrate_collectives, parse_sizes
            from plexus_tune.measure.store import append_records

            world = int(np.prod(grids[0]))  # every grid has G ranks
            append_records(out / "collectives.jsonl", calibrate_collectives(
                world, sizes=parse_sizes("16K:4M"), repeats=7, launcher=launcher, modes=("concurrent",),
                precisions=tuple(args.precisions.split(",")), cols=GRAPH_SETS[args.graphs][1]))
    if args.quant_from and not (out / "quant.jsonl").exists():
        shutil.copyfile(args.quant_from, out / "quant.jsonl")
    if not (out / "quant.jsonl").exists():
        from plexus_tune.measure.codec import run_quant_benchmark

        run_quant_benchmark(out / "quant.jsonl", rows=(4096, 16384), cols=(32, 128), repeats=5)
    return 0


def report(args) -> int:
    import numpy as np
    import pandas as pd

    from plexus_tune.fit.profile import load_tables
    from plexus_tune.fit.quant import CALL_TIERS, fit_call_ms, fit_quant_rates
    from plexus_tune.measure.store import read_records
    from plexus_tune.measure.identity import predict_record
    from plexus_tune.model.machine import load_machine

    out = Path(args.out)
    profile = json.loads(Path(args.profile).read_text())
    quant = fit_quant_rates(read_records(out / "quant.jsonl", schema="quant")[0])
    provenance = f"codec rates fitted from {out / 'quant.jsonl'}"
    collectives = out / "collectives.jsonl"
    if collectives.exists() and not args.codec_only:
        # the per-call cost of each scheme, from its collectives timed beside FP32 ones on the same ranks
        quant, calls = fit_call_ms(load_tables(str(collectives), "collective"), load_machine(profile), quant)
        provenance += f"; call_ms from {collectives} (fit_call_ms, median per call and quartiles: " + "; ".join(
            f"{p} {where} {c[key]:.2f} ms ({c[tier + '_q1_ms']:.2f}..{c[tier + '_q3_ms']:.2f}, {c[tier + '_pairs']} pairs)"
            for p, c in calls.items()
            for tier, key, where in CALL_TIERS
            if key in c) + ")"
        print(provenance)
    quant["provenance"] = provenance + " by runners/campaigns/comm_precision.py"
    profile["quant"] = quant
    profile["name"] = profile["name"] + "-quant"
    (out / "profile.json").write_text(json.dumps(profile, indent=2) + "\n")
    machine = load_machine(str(out / "profile.json"))
    runs = [r for r in read_records(out / "runs.jsonl", schema="run")[0] if r.get("status") == "ok"]
    rows = []
    for r in runs:
        pred = predict_record(r, machine)  # at every setting of the run: precision, block rows, dtype
        rows.append({
            "graph": "rmat-ogb-dir" if str(r.get("split", "")).startswith("ogb") else "rmat-random-split",
            "grid": r["grid"], "precision": r["comm_precision"],
            "obs_epoch_ms": r["epoch_ms"], "pred_total_ms": pred["total_ms"],
            "obs_comm_ms": r["comm_ms"], "pred_comm_ms": pred["comm_ms"],
            "obs_quant_ms": r.get("quant_ms") or 0.0, "pred_quant_ms": pred["quant_ms"],
            "obs_comm_quant_ms": r["comm_ms"] + (r.get("quant_ms") or 0.0),
            "pred_comm_quant_ms": pred["comm_ms"] + pred["quant_ms"],
            "bytes_per_epoch": sum((r.get("comm_bytes") or {}).values()),
            "test_acc": r["final_accuracy"]["test"], "epochs": r["epochs"],
        })
    keys = ["graph", "grid", "precision"]
    trials = pd.DataFrame(rows)
    table = trials.groupby(keys).median(numeric_only=True).reset_index()
    table["trials"] = trials.groupby(keys).size().to_numpy()
    table = table.sort_values(keys)
    fp32 = table[table.precision == "fp32"].set_index(["graph", "grid"])
    table["bytes_vs_fp32"] = [row.bytes_per_epoch / fp32.loc[(row.graph, row.grid), "bytes_per_epoch"] for row in table.itertuples()]
    table["test_acc_vs_fp32"] = [row.test_acc - fp32.loc[(row.graph, row.grid), "test_acc"] for row in table.itertuples()]
    # gain = fp32 epoch / this precision's epoch (medians over trials), observed and predicted
    table["obs_gain"] = [fp32.loc[(row.graph, row.grid), "obs_epoch_ms"] / row.obs_epoch_ms for row in table.itertuples()]
    table["pred_gain"] = [fp32.loc[(row.graph, row.grid), "pred_total_ms"] / row.pred_total_ms for row in table.itertuples()]
    table["gain_error"] = table.pred_gain / table.obs_gain - 1.0
    table.to_csv(out / "results.csv", index=False, float_format="%.4g")
    lines = ["| graph | grid | precision | trials | epoch obs ms | epoch pred ms | comm obs ms | comm pred ms | quant obs ms | "
             "quant pred ms | comm+quant obs ms | comm+quant pred ms | bytes vs fp32 | gain obs | gain pred | gain error | "
             "test acc | vs fp32 |", "|" + "---|" * 18]
    for row in table.itertuples():
        lines.append(f"| {row.graph} | {row.grid} | {row.precision} | {row.trials} | {row.obs_epoch_ms:.1f} | {row.pred_total_ms:.1f} | "
                     f"{row.obs_comm_ms:.1f} | {row.pred_comm_ms:.1f} | {row.obs_quant_ms:.1f} | {row.pred_quant_ms:.1f} | "
                     f"{row.obs_comm_quant_ms:.1f} | {row.pred_comm_quant_ms:.1f} | "
                     f"{row.bytes_vs_fp32:.3f} | {row.obs_gain:.2f} | {row.pred_gain:.2f} | {100 * row.gain_error:+.0f} % | "
                     f"{row.test_acc:.3f} | {row.test_acc_vs_fp32:+.3f} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    summary = table.groupby(["graph", "precision"]).agg(
        obs_epoch_ms=("obs_epoch_ms", "median"), pred_total_ms=("pred_total_ms", "median"),
        obs_comm_ms=("obs_comm_ms", "median"), pred_comm_ms=("pred_comm_ms", "median"),
        test_acc=("test_acc", "mean"), test_acc_vs_fp32=("test_acc_vs_fp32", "mean")).reset_index()
    print(summary.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    _plot(table, out / "precision.png")
    return 0


def _plot(table, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    x = {p: i for i, p in enumerate(PRECISIONS)}
    for (graph, grid), part in table.groupby(["graph", "grid"]):
        part = part.sort_values("precision", key=lambda s: s.map(x))
        xs = [x[p] for p in part.precision]
        style = "-" if graph == "rmat-random-split" else "--"
        axes[0].plot(xs, part.obs_epoch_ms, style, marker="o", alpha=0.7, label=f"{graph} {grid}")
        axes[1].plot(xs, part.test_acc, style, marker="o", alpha=0.7)
    for ax, label in zip(axes, ("epoch time, observed (ms)", "test accuracy after the last epoch")):
        ax.set_xticks(range(len(PRECISIONS)), PRECISIONS)
        ax.set_xlabel("communication precision")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("measure", "report"))
    parser.add_argument("--out", required=True, help="output directory (measurements/comm-precision-DATE)")
    parser.add_argument("--epochs", type=int, default=110, help="epochs per run, 10 of them warm-up (default 110)")
    parser.add_argument("--machine", default="cpu-gloo-2core", help="machine name for the log")
    parser.add_argument("--graphs", choices=tuple(GRAPH_SETS), default="small",
                        help="graph pair: small (this host, hidden 32) or large (a slow emulated link, hidden 64)")
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help=f"comma-separated (default {','.join(PRECISIONS)})")
    parser.add_argument("--layer-norm", action="store_true", help="LayerNorm before each layer (as SuperGCN does for int2)")
    parser.add_argument("--cluster", help="emulated-cluster spec to run the ranks on (root; default: local processes)")
    parser.add_argument("--gpus", type=int, default=4, help="G: every grid of G unless --grids (default 4)")
    parser.add_argument("--grids", help="comma-separated grids instead of every grid of G")
    parser.add_argument("--trials", type=int, default=1, help="interleaved trials per configuration (default 1)")
    parser.add_argument("--quant-from", help="a quantize log of this host to copy instead of timing quantize again")
    parser.add_argument("--no-collectives", action="store_true",
                        help="measure: do not time the precisions' collectives into OUT/collectives.jsonl")
    parser.add_argument("--codec-only", action="store_true",
                        help="report: leave out the per-call cost fitted from OUT/collectives.jsonl (the codec rates alone)")
    parser.add_argument("--profile", default=BASE_PROFILE, help=f"machine profile the report predicts with (default {BASE_PROFILE})")
    args = parser.parse_args(argv)
    return measure(args) if args.step == "measure" else report(args)


if __name__ == "__main__":
    sys.exit(main())
