"""``plexus-tune run``: the recommended grid is trained, logged and compared with its prediction."""

import json
import platform
import subprocess
import sys

import numpy as np
import pytest

from plexus_tune.cli import main

GRAPH = "rmat:nodes=128,edges=512,features=8,classes=4,seed=1"
TINY = ["--graph", GRAPH, "--machine", "cpu-gloo-2core", "--gpus", "2", "--epochs", "2", "--warmup", "1", "--hidden", "4", "--layers", "2"]


def test_run_trains_the_recommended_grid_and_logs_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PLEXUS_TUNE_DATA", str(tmp_path / "measurements"))  # the default log and studies
    from plexus_tune.model.costs import predict_grids
    from plexus_tune.model.machine import load_machine
    from plexus_tune.search import graph_workload

    _, workload = graph_workload(GRAPH, layers=2, hidden=4)
    grids = [(1, 1, 2), (1, 2, 1), (2, 1, 1)]
    pred = predict_grids(workload, load_machine("cpu-gloo-2core"), np.array(grids))
    best = min((t, g) for t, g, f in zip(pred["total_ms"], grids, pred["feasible"]) if f)[1]
    assert main(["run"] + TINY) == 0
    out = capsys.readouterr().out
    assert "predicted vs observed" in out and "epoch" in out
    lines = (tmp_path / "measurements" / "runs.jsonl").read_text().splitlines()
    rec = json.loads(lines[-1])
    assert rec["grid"] == "x".join(map(str, best)) and rec["status"] == "ok" and rec["trial"] == 0
    assert rec["predicted"]["total_ms"] == pytest.approx(min(t for t, f in zip(pred["total_ms"], pred["feasible"]) if f))
    # the record names the machine it ran on (this host); the profile is the prediction's
    assert rec["epoch_ms"] > 0 and rec["machine"] == platform.node() and rec["predicted"]["machine"] == "cpu-gloo-2core"
    assert rec["schema"] == "plexus-tune/run-v2" and rec["graph_nodes"] == 128 and "nodes" not in rec
    assert rec["launcher"] == "local" and rec["rank_nodes"] == [0, 0] and rec["hosts"] == [platform.node()]
    assert rec["comm_precision"] == "fp32" and "cluster" not in rec  # None is not written: absent means the default
    # the same grid again (given explicitly): a second trial of it, not a duplicate key
    assert main(["run"] + TINY + ["--grid", rec["grid"]]) == 0
    out = capsys.readouterr().out
    rec2 = json.loads((tmp_path / "measurements" / "runs.jsonl").read_text().splitlines()[-1])
    assert rec2["grid"] == rec["grid"] and rec2["trial"] == 1
    median = float(np.median([rec["epoch_ms"], rec2["epoch_ms"]]))
    assert f"median over the 2 successful trials of this run in the log: {median:.2f} ms" in " ".join(out.split())


@pytest.mark.parametrize("extra, message", [(["--grid", "2x2x1"], "has 4 ranks"), (["--epochs", "1"], "warmup < epochs")])
def test_run_bad_input(tmp_path, extra, message):
    proc = subprocess.run([sys.executable, "-m", "plexus_tune", "run"] + TINY + extra, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    assert not (tmp_path / "measurements" / "runs.jsonl").exists()
