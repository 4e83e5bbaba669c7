"""Calibrate, measure, fit and validate the topology model on an emulated cluster (root).

    PLEXUS_TUNE_NETNS_PREFIX=mn python runners/campaigns/emulated_validation.py --nodes 2 --ranks-per-node 4 \\
        --inter-gbps 0.05 --out-dir measurements/emulated-2x4-DATE

Steps (plexus-tune commands, each logged in ``campaign.json`` with its duration and the
load average before and after; every command also lands in ``commands.txt``):

1. ``calibrate collectives --cluster SPEC``: every (op, group size, stride) of G =
   nodes x ranks per node, with all groups at once and one group alone;
2. ``calibrate spmm --graph`` for both graphs (real shards and GEMMs of every grid, one
   process: compute does not depend on the cluster);
3. ``measure --cluster SPEC`` every grid of G on both graphs (interleaved trials);
4. ``fit`` twice, with the runs: the forms scored with and without NIC sharing (the
   chosen one is the profile ``models/<name>.json``) and with sharing switched off
   (``models/<name>-nosharing.json``); ``--host-cores 0``: the emulated nodes share this
   host's cores, so a link-bound collective is not stretched by time-sharing;
5. ``validate`` (leave-one-(graph, G)-out) of both profiles;
6. ``summary.json``: the fitted inter-node bandwidth against the tc rate, the sharing
   factor of each inter-node shape (time with all groups / time alone, largest message)
   against the model's min(n, p), the leave-message-sizes-out MAPE of every form, and
   Spearman, regret and the chosen grid (with the axes that cross nodes) per profile.

Steps whose output exists are resumed (logs are append-only; ``measure`` skips logged
runs); ``--skip`` leaves steps out.
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

from plexus_tune.cluster.spec import parse_cluster
from plexus_tune.fit.profile import write_profile
from plexus_tune.fit.collectives import fit_collectives
from plexus_tune.fit.profile import load_tables
from plexus_tune.measure.store import read_records
from plexus_tune.model.collectives import placement
from plexus_tune.model.grid import axis_stride, parse_grid
from plexus_tune.model.machine import load_machine
from plexus_tune.model.shapes import csr_index_dtype
from plexus_tune.model.spmm import spmm_traffic_bytes

GRAPHS = (
    "rmat:nodes=8192,edges=65536,features=64,classes=8,seed=1",  # average degree ~8
    "rmat:nodes=2048,edges=131072,features=64,classes=8,seed=2",  # average degree ~64
)


def load() -> float:
    return os.getloadavg()[0]


def step(log: list, commands: Path, name: str, args: list[str]) -> None:
    before = load()
    start = time.time()
    line = "python -m plexus_tune " + shlex.join(args)
    print(f"\n== {name} (load {before:.2f}): {line}", flush=True)
    with commands.open("a") as fh:
        fh.write(line + "\n")
    rc = subprocess.run([sys.executable, "-W", "ignore", "-m", "plexus_tune", *args], cwd=ROOT).returncode
    log.append({"step": name, "command": line, "rc": rc, "seconds": round(time.time() - start, 1),
                "load_before": round(before, 2), "load_after": round(load(), 2),
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))})
    if rc != 0:
        raise SystemExit(f"step {name} failed with exit code {rc}")


def set_memory_bandwidth(profile_path: Path, spmm_log: Path) -> float:
    """Give a fitted profile its ``memory_bandwidth_gbps`` (the SpMM floor, docs/model.md): the
    highest rate of bytes moved per time over the SpMM timings of its fit, rounded up, so the
    floor lies below every timing. Returns the rate."""
    records, _ = read_records(spmm_log)
    spmm = [r for r in records if r.get("schema", "").startswith("plexus-tune/spmm")]
    rates = []
    for r in spmm:
        index = np.dtype(csr_index_dtype(r["nnz"], r["rows"], r["common"])).itemsize
        moved = spmm_traffic_bytes(r["nnz"], r["rows"], r["common"], r["dense_cols"], 4, index)
        rates.append(float(moved) / (r["time_ms"] * 1e-3) / 1e9)
    rate = float(np.ceil(max(rates)))
    profile = json.loads(profile_path.read_text())
    profile["memory_bandwidth_gbps"] = rate
    profile.setdefault("provenance", {})["memory_bandwidth_gbps"] = (
        f"highest rate of the {len(rates)} SpMM timings in {spmm_log} (the logs of this fit): {max(rates):.1f} GB/s of bytes "
        "moved (docs/model.md, SpMM floor) per time, partly from cache, rounded up, so the floor lies below every timing")
    write_profile(profile, str(profile_path))
    load_machine(str(profile_path))  # still a valid profile
    return rate


def sharing_factors(coll_log: Path, gpus_per_node: int) -> list[dict]:
    """Per inter-node (op, group, stride) timed both ways: time with all groups / time alone at the
    largest message (``measured_factor``) and the ratio of the slopes of time against message
    size over the link-bound sizes (``fitted_factor``), against the model's s = min(n, p)."""


    records, _ = read_records(coll_log)
    keyed: dict = {}
    for r in records:
        if r.get("alone") is None or r["nodes_spanned"] < 2:
            continue
        keyed.setdefault((r["op"], r["group_size"], r["stride"]), {}).setdefault(r["alone"], []).append(r)
    out = []
    for (op, g, p), by_mode in sorted(keyed.items()):
        if True not in by_mode or False not in by_mode:
            continue
        largest = max(r["message_bytes"] for r in by_mode[True])
        alone = next(r for r in by_mode[True] if r["message_bytes"] == largest)
        together = next(r for r in by_mode[False] if r["message_bytes"] == largest)
        slopes = {}
        for mode, rows in by_mode.items():  # time = a + b M over the link-bound sizes (>= 256 KiB)
            pts = sorted((r["message_bytes"], r["time_ms"]) for r in rows if r["message_bytes"] >= 256 * 1024)
            slopes[mode] = float(np.polyfit([m for m, _ in pts], [t for _, t in pts], 1)[0]) if len(pts) >= 2 else float("nan")
        out.append({"op": op, "group": g, "stride": p, "nodes_spanned": together["nodes_spanned"],
                    "message_bytes": largest, "time_alone_ms": alone["time_ms"], "time_together_ms": together["time_ms"],
                    "measured_factor": together["time_ms"] / alone["time_ms"],
                    "fitted_factor": slopes[False] / slopes[True], "logged_concurrent": together["concurrent"],
                    "model_min_n_p": int(placement(g, p, gpus_per_node).concurrent)})
    return out


def sizes_out_by_subset(coll_log: Path, gpus_per_node: int, splits: int) -> dict:
    """Leave-message-sizes-out MAPE (and the fitted inter-node alpha, beta) of every form with and
    without sharing, on all timings, on those with all groups at once (what training runs),
    and on the inter-node ones."""


    df = load_tables(str(coll_log), "collective")
    alone = df["alone"].fillna(False).astype(bool) if "alone" in df else np.zeros(len(df), dtype=bool)
    inter = df["nodes_spanned"] > 1
    subsets = {"all": df, "together": df[~alone], "inter-node": df[inter],
               "inter-node >= 512 KiB": df[inter & (df["message_bytes"] >= 512 * 1024)]}
    out = {}
    for label, rows in subsets.items():
        model = fit_collectives(rows.reset_index(drop=True), gpus_per_node=gpus_per_node, n_splits=splits)
        out[label] = {"rows": len(rows), "chosen": model.name,
                      "beta_inter_gbps": model.network.beta_inter_gbps, "alpha_inter_us": model.network.alpha_inter_us,
                      "sizes_out_mape": {k: v.get("sizes_out_mape") for k, v in model.all_scores.items()},
                      "chosen_by_size": model.scores.get("sizes_out_by_size")}
    return out


def crossing_axes(grid: str, gpus_per_node: int) -> list[str]:

    dims = tuple(int(v) for v in parse_grid(grid))
    return [name for axis, name in enumerate("XYZ")
            if dims[axis] > 1 and placement(dims[axis], axis_stride(axis, dims), gpus_per_node).nodes > 1]


def summarize(out: Path, models: dict, spec: dict, splits: int) -> dict:
    n = spec["ranks_per_node"]
    summary: dict = {"cluster": spec, "tc_rate_gbps": spec["inter_gbps"], "profiles": {}}
    summary["sharing_factors"] = sharing_factors(out / "collectives.jsonl", n)
    summary["sizes_out"] = sizes_out_by_subset(out / "collectives.jsonl", n, splits)
    for label, path in models.items():
        profile = json.loads(Path(path).read_text())
        fit = profile["fit"]["collectives"]
        validation = json.loads((out / f"validation{'' if label == 'sharing' else '-' + label}.json").read_text())
        inter = fit["tiers"].get("inter", {})
        groups = []
        for g in validation["groups"]:
            groups.append({"graph": g["graph"], "gpus": g["gpus"], "spearman": g["spearman"], "regret": g["regret"],
                           "mape": g["mape"], "predicted_best": g["predicted_best"], "observed_best": g["observed_best"],
                           "predicted_best_crossing_axes": crossing_axes(g["predicted_best"], n),
                           "observed_best_crossing_axes": crossing_axes(g["observed_best"], n)})
        summary["profiles"][label] = {
            "profile": str(path),
            "chosen_form": fit["chosen"],
            "beta_inter_gbps_collective_fit": inter.get("beta_gbps"),
            "beta_inter_vs_tc": inter.get("beta_gbps", float("nan")) / spec["inter_gbps"],
            "alpha_inter_us_collective_fit": inter.get("alpha_us"),
            "beta_intra_gbps_collective_fit": fit["tiers"].get("intra", {}).get("beta_gbps"),
            "beta_inter_gbps_after_run_fit": profile["collectives"]["beta_inter_gbps"],
            "run_fit_scales": profile["fit"].get("epoch", {}).get("scales"),
            "sizes_out_mape_by_form": {k: v.get("sizes_out_mape") for k, v in fit["scores"].items()},
            "random_split_mape_by_form": {k: v.get("test_mape") for k, v in fit["scores"].items()},
            "validation_mean": validation["mean"],
            "groups": groups,
        }
    return summary


def _fmt(value, digits=3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def write_readme(out: Path, summary: dict, campaign: list, argv: list[str]) -> None:
    """README.md of the measurement directory: how it was made, the load, the results."""
    spec = summary["cluster"]
    argv = [a for i, a in enumerate(argv) if a != "--skip" and (i == 0 or argv[i - 1] != "--skip") and not a.startswith("--skip=")]
    lines = [f"# Emulated cluster {spec['nodes']} nodes x {spec['ranks_per_node']} ranks, "
             f"{spec['inter_gbps']} GB/s per node link", "",
             "Calibration, trainer runs, fits and validation of the topology model on an emulated cluster",
             "(network namespaces, tbf-shaped veth links, one torchrun agent per node, gloo) on a 2-core host.",
             "Re-run end to end (root):", "",
             "```", "PLEXUS_TUNE_NETNS_PREFIX=mn python " + shlex.join(["runners/campaigns/emulated_validation.py", *argv]), "```", "",
             "The steps it ran (also in `commands.txt`), each with the 1-minute load average before and after",
             "(this host has 2 cores; the campaign's own ranks raise it during a step, and a load above about 2",
             "before a step means other jobs were running):", "", "| step | seconds | load before | load after | command |", "|---|---|---|---|---|"]
    for e in campaign:
        lines.append(f"| {e['step']} | {e['seconds']} | {e['load_before']} | {e['load_after']} | `{e['command']}` |")
    lines += ["", "Files: `collectives.jsonl` (calibrate collectives), `spmm-shards.jsonl` (SpMM and GEMM of the",
              "real shards), `runs.jsonl` (measure), `validation.json`, `validation-nosharing.json` (validate),",
              "`summary.json` (the figures below), `campaign.json` (steps, durations, load).", "", "## Results", ""]
    lines += ["| profile | chosen form | beta_inter (collective fit) GB/s | / tc rate | mean Spearman | mean regret | worst regret | MAPE % |",
              "|---|---|---|---|---|---|---|---|"]
    for label, prof in summary["profiles"].items():
        m = prof["validation_mean"]
        lines.append(f"| `{Path(prof['profile']).stem}` ({label}) | {prof['chosen_form']} | {_fmt(prof['beta_inter_gbps_collective_fit'], 4)} | "
                     f"{_fmt(prof['beta_inter_vs_tc'])} | {_fmt(m['spearman'])} | {_fmt(m['regret'])} | {_fmt(m['max_regret'])} | {_fmt(m['mape'], 1)} |")
    lines += ["", "Per (graph, G) group, leave-one-group-out (the run fit refitted on the other graph):", "",
              "| profile | graph | Spearman | regret | predicted best (axes across nodes) | observed best (axes across nodes) |",
              "|---|---|---|---|---|---|"]
    for label, prof in summary["profiles"].items():
        for g in prof["groups"]:
            lines.append(f"| {label} | `{g['graph']}` | {_fmt(g['spearman'])} | {_fmt(g['regret'])} | "
                         f"{g['predicted_best']} ({','.join(g['predicted_best_crossing_axes']) or 'none'}) | "
                         f"{g['observed_best']} ({','.join(g['observed_best_crossing_axes']) or 'none'}) |")
    lines += ["", "NIC sharing of each inter-node shape: time with all its groups / time of one group alone at the",
              "largest message (measured), and the ratio of the slopes of time against size over 256 KiB - 4 MiB",
              "(fitted), against the model's s = min(n, p):", "",
              "| op | group | stride | nodes | measured | fitted | min(n, p) |", "|---|---|---|---|---|---|---|"]
    for r in summary["sharing_factors"]:
        lines.append(f"| {r['op']} | {r['group']} | {r['stride']} | {r['nodes_spanned']} | {r['measured_factor']:.2f} | "
                     f"{r['fitted_factor']:.2f} | {r['model_min_n_p']} |")
    lines += ["", "Leave-message-sizes-out MAPE (%) of every collective form, by subset of the timings:", ""]
    forms = sorted({f for sub in summary["sizes_out"].values() for f in sub["sizes_out_mape"]})
    lines += ["| subset | rows | chosen | beta_inter GB/s | " + " | ".join(forms) + " |", "|---" * (4 + len(forms)) + "|"]
    for label, sub in summary["sizes_out"].items():
        lines.append(f"| {label} | {sub['rows']} | {sub['chosen']} | {_fmt(sub['beta_inter_gbps'], 4)} | "
                     + " | ".join(_fmt(sub["sizes_out_mape"].get(f), 1) for f in forms) + " |")
    readme = out / "README.md"
    kept = ""  # a hand-written "## Discussion" section survives a re-run
    if readme.exists() and "\n## Discussion" in readme.read_text():
        kept = "\n## Discussion" + readme.read_text().split("\n## Discussion", 1)[1]
    readme.write_text("\n".join(lines) + "\n" + kept)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--ranks-per-node", type=int, required=True)
    parser.add_argument("--inter-gbps", type=float, default=0.05)
    parser.add_argument("--inter-latency-us", type=float, default=0.0)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--name", default=None, help="profile name (default emulated-<nodes>x<ranks>-fitted)")
    parser.add_argument("--models-dir", default="models")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--sizes", default="64K:4M")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--splits", type=int, default=200)
    parser.add_argument("--skip", default="", help="comma-separated step names to leave out")
    args = parser.parse_args()
    os.chdir(ROOT)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    Path(args.models_dir).mkdir(parents=True, exist_ok=True)
    gpus = args.nodes * args.ranks_per_node
    cluster = (f"emulated:nodes={args.nodes},ranks_per_node={args.ranks_per_node},inter_gbps={args.inter_gbps:g},"
               f"inter_latency_us={args.inter_latency_us:g}")
    name = args.name or f"emulated-{args.nodes}x{args.ranks_per_node}-fitted"
    coll, spmm, runs = out / "collectives.jsonl", out / "spmm-shards.jsonl", out / "runs.jsonl"
    models = {"sharing": Path(args.models_dir) / f"{name}.json", "nosharing": Path(args.models_dir) / f"{name}-nosharing.json"}
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    plan = [("collectives", ["calibrate", "collectives", "--cluster", cluster, "--sizes", args.sizes, "--warmup", "1",
                             "--repeats", str(args.repeats), "--out", str(coll)])]
    for k, graph in enumerate(GRAPHS):
        plan.append((f"spmm-{k}", ["calibrate", "spmm", "--graph", graph, "--gpus", str(gpus), "--hidden", str(args.hidden),
                                   "--repeats", "5", "--out", str(spmm)]))
    for k, graph in enumerate(GRAPHS):
        plan.append((f"measure-{k}", ["measure", "--graph", graph, "--gpus", str(gpus), "--trials", str(args.trials),
                                      "--epochs", str(args.epochs), "--warmup", "2", "--hidden", str(args.hidden),
                                      "--batch", "10", "--timeout", "600", "--cluster", cluster, "--log", str(runs)]))
    common = ["fit", "--spmm", str(spmm), "--collectives", str(coll), "--runs", str(runs), "--host-cores", "0",
              "--gpus-per-node", str(args.ranks_per_node), "--splits", str(args.splits), "--jobs", "1",
              "--force"]  # the campaign refits the shipped profiles
    plan.append(("fit", [*common, "--machine-name", name, "--out", str(models["sharing"]),
                         "--description", f"emulated cluster {cluster} on a 2-core host, fitted by runners/campaigns/emulated_validation.py"]))
    plan.append(("fit-nosharing", [*common, "--collective-sharing", "off", "--machine-name", f"{name}-nosharing",
                                   "--out", str(models["nosharing"]),
                                   "--description", f"as {name}, NIC sharing switched off"]))
    plan.append(("validate", ["validate", "--machine", str(models["sharing"]), "--runs", str(runs), "--json", str(out / "validation.json")]))
    plan.append(("validate-nosharing", ["validate", "--machine", str(models["nosharing"]), "--runs", str(runs),
                                        "--json", str(out / "validation-nosharing.json")]))
    log: list = []
    try:
        for step_name, cmd in plan:
            if step_name not in skip:
                step(log, out / "commands.txt", step_name, cmd)
                if step_name.startswith("fit"):
                    label = "sharing" if step_name == "fit" else "nosharing"
                    print(f"memory_bandwidth_gbps {set_memory_bandwidth(models[label], spmm)} -> {models[label]}")
    finally:
        campaign = out / "campaign.json"
        previous = json.loads(campaign.read_text()) if campaign.exists() else []
        campaign.write_text(json.dumps(previous + log, indent=2) + "\n")

    summary = summarize(out, models, parse_cluster(cluster).to_dict(), args.splits)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_readme(out, summary, json.loads((out / "campaign.json").read_text()), sys.argv[1:])
    print(json.dumps({k: v for k, v in summary.items() if k not in ("profiles", "sharing_factors")}, indent=1))
    for row in summary["sharing_factors"]:
        print(f"sharing {row['op']} g={row['group']} p={row['stride']}: measured {row['measured_factor']:.2f}, "
              f"fitted {row['fitted_factor']:.2f}, min(n, p) {row['model_min_n_p']}")
    for label, prof in summary["profiles"].items():
        print(label, prof["chosen_form"], "beta_inter", prof["beta_inter_gbps_collective_fit"], "x tc", prof["beta_inter_vs_tc"],
              "mean", prof["validation_mean"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
