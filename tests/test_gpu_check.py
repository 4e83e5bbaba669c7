"""runners/gpu_check.py: bad devices refused, the H100 profile against the shipped H100 data, the tiny CPU run."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "runners" / "gpu_check.py"
H100 = REPO / "measurements" / "h100-2026-11-25"


def _run(*args, timeout=900):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=REPO, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_cuda_without_a_gpu_is_one_line_and_exit_2(tmp_path):
    import torch

    if torch.cuda.is_available():  # on a GPU host the device is there: a bad index is the error instead
        proc = _run("--device", "cuda:99", "--out", str(tmp_path / "out"))
    else:
        proc = _run("--device", "cuda", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr and "CUDA device" in proc.stderr
    assert not (tmp_path / "out").exists()  # refused before any work
    proc = _run("--from-data", str(tmp_path))
    assert proc.returncode == 2 and "holds no trainer-runs.jsonl" in proc.stderr


def test_the_h100_profile_against_the_h100_data():
    proc = _run("--from-data", str(H100), timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = {line[:52].strip(): line for line in proc.stdout.splitlines()[2:]}
    epochs = {k: v for k, v in rows.items() if k.startswith("epoch ")}
    # the three 1x1x1 epochs of the brief and the lattice in natural order, predicted without the graphs'
    # structure (uniformly random shards: conservative, never below the measured epoch by more than 15 %)
    assert len(epochs) == 4
    measured = sorted(float(v[52:].split()[0]) for v in epochs.values())
    assert measured == pytest.approx(sorted([11.44, 135.2, 81.78, 95.87]), abs=0.01)  # printed to 4 digits
    for line in epochs.values():
        assert float(re.search(r"([+-][0-9.]+)%\s*$", line).group(1)) > -15.0, line
    memory = [v for k, v in rows.items() if k.startswith("memory ")]
    assert memory and all(" yes " in line for line in memory)
    (vu,) = [v for k, v in rows.items() if k.startswith("V/U")]
    assert " yes " in vu and "7.30" in vu
    held_out = [v for k, v in rows.items() if "(held out)" in k]
    assert len(held_out) == 4 and all(" yes " in line for line in held_out)


def test_predict_with_the_graph_matches_the_measured_262k_epoch(run_cli):
    # the 262K-node R-MAT of trainer-runs.jsonl: 11.44 ms measured (the runs stepped the foreach AdamW)
    code, out, err = run_cli(["predict", "--gpus", "1", "--graph", "rmat:nodes=262144,edges=2097152,features=128,classes=16",
                              "--hidden", "128", "--machine", str(REPO / "models" / "h100-80gb-fitted.json"),
                              "--optimizer", "adamw-foreach", "--format", "json"])
    assert code == 0, err
    (rec,) = json.loads(out)
    assert rec["total_ms"] == pytest.approx(11.44, rel=0.15)


@pytest.mark.slow
def test_tiny_cpu_run_writes_every_log_and_the_table(tmp_path):
    out = tmp_path / "check"
    proc = _run("--device", "cpu", "--tiny", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = proc.stdout
    for check in ("trainer / fair PyG epoch", "trainer equals serial PyG", "other / epoch", "memory peak / model",
                  "predicted epoch", "graph shards timed (G = 8)", "lattice SpMM, local permutation / natural order"):
        assert check in table, check
    assert " NO " not in table  # tiny targets are not judged ("n/a"); the equality and the shards are
    for name in ("bandwidth.jsonl", "spmm-sweep.jsonl", "spmm-shards.jsonl", "runs.jsonl", "lattice.json", "commands.log"):
        assert (out / name).stat().st_size > 0, name
    shards = [json.loads(line) for line in (out / "spmm-shards.jsonl").read_text().splitlines()]
    spmm = [r for r in shards if r["schema"].startswith("plexus-tune/spmm-")]
    assert {r["gpus"] for r in spmm} == {8} and all(r["time_ms"] > 0 for r in spmm)
    lattice = json.loads((out / "lattice.json").read_text())
    assert lattice["none"]["spmm_vs_none"] == 1.0 and any(k.startswith("local@") for k in lattice)
