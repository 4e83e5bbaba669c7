"""The GPU checks in one command: calibration, the trainer against PyG, memory, the profile's predictions.

    python runners/gpu_check.py --device cuda --out gpu-check            # one GPU, at most ~8 minutes on an H100
    python runners/gpu_check.py --device cpu --tiny --out /tmp/check     # the same steps at a tiny size (CI)
    python runners/gpu_check.py --from-data measurements/h100-2026-11-25 # the profile against a measured set

On a device it runs, each step's log written under ``--out``:

1. ``calibrate bandwidth`` (elementwise passes, the AdamW forms, a synchronisation) and
   ``calibrate spmm --sweep`` with ``--device``;
2. a products-size R-MAT (2,449,029 nodes, 61,859,012 edges, 100 features, 47 classes;
   ``--tiny``: 4096 nodes) and ``calibrate spmm --graph`` on the shards of every grid
   of G = 64 (``--tiny``: 8);
3. the trainer at 1x1x1 on that graph (``train``, run log with the CUDA allocator's
   peak) against PyG GCNConv with trainable input features (the fair baseline of
   ``plexus_tune/measure/efficiency.py``), the memory model against the peak, the share of
   ``other`` in the epoch, and the profile's prediction of that epoch; ``train --check``
   (equal to serial PyG) on a 262K-node R-MAT (``--tiny``: on the tiny graph);
4. the lattice (4M nodes; ``--tiny``: 4096) at 1x1x1: the trainer's SpMM phase with
   the locality-keeping permutation (``local``, as a grid splitting the ids 8 ways
   applies it) against natural order.

It ends with one table: each check, its figure, the target, and whether it passes.
``--from-data DIR`` runs nothing: it sets the profile's predictions beside the runs and
shards of a measured directory (the 1x1x1 trainer epochs with their own optimizer, the
V/U shape ratio, the memory model against the allocator's peak).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

DEFAULT_PROFILE = "h100-80gb-fitted"

#: Sizes of a full check and of --tiny.
SIZES = {
    "full": {"rmat": dict(nodes=2_449_029, edges=61_859_012, features=100, classes=47), "shard_gpus": 64,
             "lattice": dict(nodes=4_000_000, features=128, classes=16), "hidden": 128, "epochs": 12, "warmup": 2,
             "sweep": ["--count", "120", "--max-rows", "4000000", "--max-nnz", "64000000", "--max-cols", "256"],
             "bandwidth": "1M,64M"},
    "tiny": {"rmat": dict(nodes=4096, edges=32768, features=16, classes=4), "shard_gpus": 8,
             "lattice": dict(nodes=4096, features=16, classes=4), "hidden": 16, "epochs": 4, "warmup": 1,
             "sweep": ["--count", "8", "--max-rows", "2048", "--max-nnz", "20000", "--max-cols", "32"],
             "bandwidth": "64K"},
}
#: Targets: (check, comparison, value).
TARGETS = {"trainer_vs_pyg": 0.45, "other_share": 0.10, "lattice_local_vs_none": 1.2, "memory_low": 0.85,
           "prediction_error": 0.15, "vu_error": 0.25}


def _cli(args: list[str], log: Path) -> float:
    """Run ``python -m plexus_tune ARGS`` (its output to ``log``); seconds it took. Exits 2 with its error line on failure."""
    started = time.perf_counter()
    with open(log, "a") as fh:
        fh.write("$ plexus-tune " + " ".join(args) + "\n")
        fh.flush()
        proc = subprocess.run([sys.executable, "-m", "plexus_tune", *args], stdout=fh, stderr=subprocess.PIPE, text=True,
                              cwd=REPO, env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
        fh.write(proc.stderr)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        print(f"gpu_check: 'plexus-tune {args[0]} {args[1] if len(args) > 1 else ''}' failed: {last}", file=sys.stderr)
        raise SystemExit(2)
    return time.perf_counter() - started


def _records(path: Path, schema: str | None = None) -> list[dict]:
    out = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in out if schema is None or r.get("schema", "").startswith(f"plexus-tune/{schema}-")]


def _row(rows: list, check: str, figure: float | None, target: str, ok: bool | None, note: str = "") -> None:
    rows.append({"check": check, "figure": figure, "target": target, "pass": ok, "note": note})


def _predict_run(run: dict, machine, optimizer: str | None = None) -> dict:
    """The profile's prediction of a 1x1x1 run record (its graph, widths, dtype; ``optimizer``: the run's)."""
    from plexus_tune.fit.bandwidth import run_optimizer
    from plexus_tune.model.costs import predict_grids
    from plexus_tune.model.workload import Workload

    w = Workload(name=str(run["graph"]), nodes=int(run["graph_nodes"]), nnz=int(run["nnz"]), widths=tuple(run["widths"]))
    grid = [[int(run["gx"]), int(run["gy"]), int(run["gz"])]]
    pred = predict_grids(w, machine, grid, optimizer=optimizer or run_optimizer(run))
    return {k: float(v[0]) for k, v in pred.items() if hasattr(v, "__len__") and len(v) == 1 and k != "feasible"}


def from_data(directory: Path, profile: str) -> list[dict]:
    """The profile against a measured directory's 1x1x1 runs and shards."""
    from plexus_tune.model.machine import load_machine

    machine = load_machine(profile)
    rows: list[dict] = []
    runs = [r for r in _records(directory / "trainer-runs.jsonl", "run") if r.get("status") == "ok"]
    gpu_runs = [r for r in runs if r.get("backend") == "nccl" and not (r.get("options") or {}).get("block_rows")
                and int(r.get("hidden", 0)) <= 256]
    for run in gpu_runs:
        pred = _predict_run(run, machine)
        err = pred["total_ms"] / run["epoch_ms"] - 1
        name = f"epoch {run['graph']} permute {run['options']['permute']}"
        _row(rows, name, run["epoch_ms"], f"predicted {pred['total_ms']:.2f} ms within 15 %",
             abs(err) <= TARGETS["prediction_error"], f"{err:+.1%}")
    for run in gpu_runs:
        pred = _predict_run(run, machine)
        ratio = run["peak_memory_bytes"] / pred["memory_bytes"]
        _row(rows, f"memory {run['graph']}", ratio, "peak / predicted in [0.85, 1]", TARGETS["memory_low"] <= ratio <= 1.0)
    shard_path = _with_structure(directory / "rmat-spmm-shards.jsonl")
    if shard_path.exists():
        frame, spmm_predicted_ms = _shard_predictions(shard_path, machine)
        on_64 = frame["grid"] == "1x1x64"
        u = frame.index[on_64 & (frame["layer"] == 0) & (frame["direction"] == "backward")]
        v = frame.index[on_64 & (frame["dense_cols"] == 2) & (frame["direction"] == "forward")]
        if len(u) and len(v):
            measured = frame.loc[v[0], "time_ms"] / frame.loc[u[0], "time_ms"]
            predicted = spmm_predicted_ms[v[0]] / spmm_predicted_ms[u[0]]
            _row(rows, "V/U SpMM shape ratio", predicted, f"within 25 % of the measured {measured:.2f}",
                 abs(predicted / measured - 1) <= TARGETS["vu_error"], f"{predicted / measured - 1:+.1%}")
    fitted_on = {Path(i.get("path", "")).name for i in (machine.raw.get("fit") or {}).get("inputs", {}).get("spmm", [])}
    for path in sorted(directory.glob("rmat-*spmm-shards.jsonl")):
        if path.name in fitted_on:
            continue
        _shard_rows(rows, _with_structure(path), machine)
    return rows


def _with_structure(path: Path) -> Path:
    """The copy of a shard log whose records carry their operands' structure (``structure/``), if there is one."""
    annotated = path.parent / "structure" / path.name
    return annotated if annotated.exists() else path


def _shard_predictions(path: Path, machine):
    """(the SpMM records of a log as a table, the profile's time of each), each with its operand's structure."""
    import numpy as np

    from plexus_tune.fit.spmm import spmm_structure
    from plexus_tune.fit.tables import load_table
    from plexus_tune.model.spmm import predict_spmm_ms

    frame = load_table(path, schema="spmm").reset_index(drop=True)
    shapes = [np.asarray(frame[c], dtype=np.float64) for c in ("nnz", "rows", "common", "dense_cols")]
    return frame, np.asarray(predict_spmm_ms(machine.spmm, *shapes, spmm_structure(frame)), dtype=np.float64)


def _shard_rows(rows: list, path: Path, machine) -> None:
    """Per G: the MAPE and Spearman of each grid's epoch SpMM (sum over its shards) against the measured one."""
    import numpy as np

    from plexus_tune.report.metrics import spearman

    frame, spmm_predicted_ms = _shard_predictions(path, machine)
    grids: dict = {}
    for i in range(len(frame)):
        entry = grids.setdefault((int(frame["gpus"].iloc[i]), str(frame["grid"].iloc[i])), [0.0, 0.0])
        entry[0] += float(frame["time_ms"].iloc[i])
        entry[1] += float(spmm_predicted_ms[i])
    for gpus in sorted({g for g, _ in grids}):
        obs = np.array([v[0] for (g, _), v in grids.items() if g == gpus])
        pred = np.array([v[1] for (g, _), v in grids.items() if g == gpus])
        mape = float(np.mean(np.abs(pred - obs) / obs))
        rho = spearman(pred, obs)
        name = path.name.replace("-spmm-shards.jsonl", "")
        _row(rows, f"{name} G={gpus}: grid SpMM MAPE (held out)", mape, "<= 15 %", mape <= 0.15,
             f"{len(obs)} grids, Spearman {rho:.3f} (>= 0.95: {'yes' if rho >= 0.95 else 'NO'})")


def on_device(args) -> list[dict]:
    """Run every step on ``args.device``; the rows of the table."""
    import numpy as np

    from plexus_tune.measure.efficiency import lattice_permutations, pyg_fair_epoch
    from plexus_tune.graph.io import load_graph
    from plexus_tune.model.machine import load_machine
    from plexus_tune.model.memory import memory_breakdown
    from plexus_tune.model.workload import Workload

    size = SIZES["tiny" if args.tiny else "full"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "commands.log"
    dev = ["--device", args.device]
    seconds = {}
    rows: list[dict] = []

    seconds["bandwidth"] = _cli(["calibrate", "bandwidth", *dev, "--sizes", size["bandwidth"], "--out", str(out / "bandwidth.jsonl")], log)
    seconds["spmm sweep"] = _cli(["calibrate", "spmm", "--sweep", *dev, *size["sweep"], "--out", str(out / "spmm-sweep.jsonl")], log)
    rmat = size["rmat"]
    graph_dir = out / "rmat"
    seconds["graph"] = _cli(["graph", "generate", "rmat", "--nodes", str(rmat["nodes"]), "--edges", str(rmat["edges"]),
                             "--features", str(rmat["features"]), "--classes", str(rmat["classes"]), "--out", str(graph_dir),
                             "--force"], log)
    seconds["spmm shards"] = _cli(["calibrate", "spmm", "--graph", str(graph_dir), "--gpus", str(size["shard_gpus"]), *dev,
                                   "--hidden", str(size["hidden"]), "--out", str(out / "spmm-shards.jsonl")], log)
    backend = "nccl" if args.device.startswith("cuda") else "gloo"
    seconds["trainer"] = _cli(["train", "--graph", str(graph_dir), "--grid", "1x1x1", "--backend", backend, "--hidden",
                               str(size["hidden"]), "--epochs", str(size["epochs"]), "--warmup", str(size["warmup"]),
                               "--log", str(out / "runs.jsonl")] + (["--check"] if args.tiny else []), log)
    run = [r for r in _records(out / "runs.jsonl", "run") if r.get("status") == "ok"][-1]
    graph = load_graph(str(graph_dir))
    started = time.perf_counter()
    pyg = pyg_fair_epoch(graph, hidden=size["hidden"], epochs=size["epochs"], warmup=size["warmup"],
                         device="cuda" if backend == "nccl" else "cpu")
    seconds["pyg"] = time.perf_counter() - started
    ratio = run["epoch_ms"] / pyg["mean_ms"]
    _row(rows, "trainer / fair PyG epoch", ratio, f"<= {TARGETS['trainer_vs_pyg']} (GPU, products size)",
         ratio <= TARGETS["trainer_vs_pyg"] if not args.tiny else None, f"{run['epoch_ms']:.2f} / {pyg['mean_ms']:.2f} ms")
    checked = run
    if not args.tiny:  # the equality check on the 262K-node R-MAT (serial PyG holds the whole graph)
        small = out / "rmat-262k"
        seconds["check graph"] = _cli(["graph", "generate", "rmat", "--nodes", "262144", "--edges", "2097152", "--features", "128",
                                       "--classes", "16", "--out", str(small), "--force"], log)
        seconds["check"] = _cli(["train", "--graph", str(small), "--grid", "1x1x1", "--backend", backend, "--hidden", "128",
                                 "--epochs", "10", "--check", "--log", str(out / "runs.jsonl")], log)
        checked = [r for r in _records(out / "runs.jsonl", "run") if r.get("status") == "ok"][-1]
    if checked.get("check_loss_rel_diff") is not None:
        _row(rows, "trainer equals serial PyG (loss rel. diff.)", checked["check_loss_rel_diff"], "<= 1e-4",
             checked["check_loss_rel_diff"] <= 1e-4, f"outputs {checked.get('check_output_rel_diff', float('nan')):.2g}")
    share = run["other_ms"] / run["epoch_ms"]
    _row(rows, "other / epoch", share, f"<= {TARGETS['other_share']:.0%}", share <= TARGETS["other_share"] if not args.tiny else None,
         f"{run['other_ms']:.2f} of {run['epoch_ms']:.2f} ms")
    w = Workload(name=run["graph"], nodes=run["graph_nodes"], nnz=run["nnz"], widths=tuple(run["widths"]))
    predicted_memory = float(memory_breakdown(w, np.array([[1, 1, 1]]))["total"][0])
    mem = run["peak_memory_bytes"] / predicted_memory
    _row(rows, f"memory peak / model ({run.get('memory_source')})", mem, "in [0.85, 1]",
         TARGETS["memory_low"] <= mem <= 1.0 if run.get("memory_source") == "cuda_allocator" else None)
    if args.profile:
        machine = load_machine(args.profile)
        pred = _predict_run(run, machine)
        err = pred["total_ms"] / run["epoch_ms"] - 1
        _row(rows, f"predicted epoch ({machine.name})", pred["total_ms"], "within 15 % of the trainer's",
             abs(err) <= TARGETS["prediction_error"] if not args.tiny else None, f"{err:+.1%} (other {pred['other_ms']:.2f} ms)")
    shard_recs = _records(out / "spmm-shards.jsonl", "spmm")
    _row(rows, f"graph shards timed (G = {size['shard_gpus']})", len(shard_recs), "forward + backward per grid and layer",
         len(shard_recs) > 0, f"{seconds['spmm shards']:.0f} s")
    lat = size["lattice"]
    lattice_dir = out / "lattice"
    seconds["lattice graph"] = _cli(["graph", "generate", "grid2d", "--nodes", str(lat["nodes"]), "--features", str(lat["features"]),
                                     "--classes", str(lat["classes"]), "--out", str(lattice_dir), "--force"], log)
    started = time.perf_counter()
    perms = lattice_permutations(load_graph(str(lattice_dir)), hidden=size["hidden"], device="cuda" if backend == "nccl" else "cpu")
    seconds["lattice"] = time.perf_counter() - started
    (out / "lattice.json").write_text(json.dumps(perms, indent=1))
    local = next(v for k, v in perms.items() if k.startswith("local@"))
    _row(rows, "lattice SpMM, local permutation / natural order", local["spmm_vs_none"], f"<= {TARGETS['lattice_local_vs_none']}",
         local["spmm_vs_none"] <= TARGETS["lattice_local_vs_none"] if not args.tiny else None,
         f"double {perms['double']['spmm_vs_none']:.2f}x")
    (out / "seconds.json").write_text(json.dumps(seconds, indent=1))
    return rows


def print_table(rows: list[dict], title: str) -> None:
    print(title)
    print(f"{'check':<52} {'figure':>12}  {'target':<42} {'pass':<5} note")
    for r in rows:
        fig = "-" if r["figure"] is None else (f"{r['figure']:.4g}" if isinstance(r["figure"], float) else str(r["figure"]))
        ok = {True: "yes", False: "NO", None: "n/a"}[r["pass"]]
        print(f"{r['check']:<52} {fig:>12}  {r['target']:<42} {ok:<5} {r['note']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes (CI on a CPU); targets are not judged")
    parser.add_argument("--out", help="directory for the logs (required unless --from-data)")
    parser.add_argument("--profile", default=str(REPO / "models" / f"{DEFAULT_PROFILE}.json"),
                        help=f"profile whose predictions are checked (default models/{DEFAULT_PROFILE}.json)")
    parser.add_argument("--from-data", metavar="DIR", help="no measuring: the profile against a measured directory")
    args = parser.parse_args(argv)
    from plexus_tune.errors import UserError

    try:
        from plexus_tune.model.machine import load_machine

        load_machine(args.profile)
        if args.from_data:
            directory = Path(args.from_data)
            if not (directory / "trainer-runs.jsonl").is_file():
                raise UserError(f"--from-data: {directory} holds no trainer-runs.jsonl")
            print_table(from_data(directory, args.profile), f"{load_machine(args.profile).name} against {directory}")
            return 0
        if not args.out:
            raise UserError("--out: give a directory for the logs")
        if Path(args.out).exists() and not Path(args.out).is_dir():
            raise UserError(f"--out: {args.out} is a file; give a directory")
        from plexus_tune.measure.device import resolve_device

        resolve_device(args.device)
    except UserError as exc:
        print(f"gpu_check: error: {exc}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    rows = on_device(args)
    print_table(rows, f"GPU check on {args.device}{' (tiny)' if args.tiny else ''}: logs in {args.out}, "
                      f"{time.perf_counter() - started:.0f} s")
    out = Path(args.out)
    print(f"a profile of this device from these logs (collectives copied, not measured):\n"
          f"  plexus-tune fit --machine-name NAME --out NAME.json --spmm {out}/spmm-sweep.jsonl {out}/spmm-shards.jsonl "
          f"--bandwidth {out}/bandwidth.jsonl --optimizer-runs {out}/runs.jsonl --collectives-from perlmutter")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
