"""Inputs read and checked before any work, sizes compared with the host before allocating, and
Ctrl-C that says what it kept: one table per mechanism (docs/cli.md).

- ``FIT``: ``fit`` reads and checks every input (SpMM, collective and GEMM tables, run,
  optimizer-run and bandwidth logs) before it fits anything
  (:func:`plexus_tune.fit.profile.fit_profile`, :func:`plexus_tune.fit.tables.check_frame`);
- ``SIZES``: every command that allocates compares its peak with the memory first
  (:mod:`plexus_tune.resources`: calibrate bandwidth, spmm --sweep, spmm --graph, quant, train),
  and G is factorized in bounded time (:func:`plexus_tune.model.grid.prime_factors`);
- ``PROFILES``: a profile's numbers within range and its SpMM model finite on load
  (:func:`plexus_tune.model.machine.read_machine_file`);
- ``ENVIRONMENT``: a data directory that is a file (:func:`plexus_tune.paths.data_dir`).

Refusals: exit code 2, one line on stderr naming the bad value, no traceback, nothing on
stdout, no file created, changed or removed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from plexus_tune.cli import main
from plexus_tune.model.grid import divisors, enumerate_grids, grid_count, prime_factors

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "measurements" / "cpu-gloo-2026-11-23"
MERSENNE = 2**61 - 1


def _edit_line(src: Path, dst: Path, index: int, **fields) -> None:
    lines = src.read_text().splitlines()
    record = json.loads(lines[index])
    record.update(fields)
    lines[index] = json.dumps(record)
    dst.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("first")
    assert main(["graph", "generate", "grid2d", "--nodes", "64", "--features", "4", "--classes", "4",
                 "--out", str(d / "g.npz")]) == 0
    (d / "spmm.jsonl").write_text("".join((RUNS / "spmm-sweep.jsonl").read_text().splitlines(True)[:60]))
    (d / "coll.jsonl").write_text("".join((RUNS / "collectives.jsonl").read_text().splitlines(True)[:60]))
    shutil.copy(RUNS / "runs.jsonl", d / "runs.jsonl")
    _edit_line(d / "spmm.jsonl", d / "spmm_huge.jsonl", 3, time_ms=1e308)
    _edit_line(d / "spmm.jsonl", d / "spmm_negnnz.jsonl", 4, nnz=-5)
    _edit_line(d / "coll.jsonl", d / "coll_neg.jsonl", 5, time_ms=-1.0)
    _edit_line(d / "coll.jsonl", d / "coll_g0.jsonl", 6, group_size=0)
    _edit_line(d / "runs.jsonl", d / "runs_nan.jsonl", 2, epoch_ms=float("nan"))
    _edit_line(d / "runs.jsonl", d / "runs_huge.jsonl", 2, epoch_ms=1e308)
    (d / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (d / "adir").mkdir()
    profile = json.loads((REPO / "models" / "perlmutter.json").read_text())
    (d / "mem.json").write_text(json.dumps({**profile, "device_memory_gib": 1e308}))
    (d / "coef.json").write_text(json.dumps({**profile, "spmm": {**profile["spmm"], "c1": 1e300}}))
    boosted = json.loads((REPO / "models" / "cpu-gloo-2core-fitted.json").read_text())
    boosted["spmm"]["init"] = 1e6  # exp(1e6) ms
    (d / "overflow.json").write_text(json.dumps(boosted))
    return d


FIT = ["fit", "--spmm", "{d}/spmm.jsonl", "--collectives", "{d}/coll.jsonl", "--machine-name", "x", "--gemm-tflops", "1",
       "--splits", "2", "--out", "{d}/new.json"]


def _fit(**swap):
    argv = list(FIT)
    for flag, value in swap.items():
        flag = "--" + flag.replace("_", "-")
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    return argv


# (command line, a substring of the one-line error)
FIT_CASES = [
    (_fit(runs="{d}/nosuch.jsonl"), "runs log {d}/nosuch.jsonl does not exist"),
    (_fit(runs="{d}/adir"), "runs log {d}/adir is a directory"),
    (_fit(runs="{d}/spmm.jsonl"), "no successful trainer runs in {d}/spmm.jsonl"),
    (_fit(runs="{d}/binary.bin"), "is not a plexus-tune measurement log"),
    (_fit(runs="{d}/runs_nan.jsonl"), "epoch_ms = nan is not a finite time"),
    (_fit(optimizer_runs="{d}/nosuch.jsonl"), "optimizer runs log {d}/nosuch.jsonl does not exist"),
    (_fit(bandwidth="{d}/nosuch.jsonl"), "bandwidth log {d}/nosuch.jsonl does not exist"),
    (_fit(bandwidth="{d}/runs.jsonl"), "no bandwidth records in {d}/runs.jsonl"),
    (_fit(collectives="{d}/coll_neg.jsonl"), "coll_neg.jsonl line 6: time_ms = -1 must be > 0"),
    (_fit(collectives="{d}/coll_g0.jsonl"), "coll_g0.jsonl line 7: group_size = 0 must be > 0"),
    (_fit(spmm="{d}/spmm_huge.jsonl"), "spmm_huge.jsonl line 4: time_ms = 1e+308 is beyond any measurement"),
    (_fit(spmm="{d}/spmm_negnnz.jsonl"), "spmm_negnnz.jsonl line 5: nnz = -5 must be >= 0"),
]
SIZES = [
    (["calibrate", "bandwidth", "--sizes", "1e13", "--out", "{d}/new.jsonl"], "10,000,000,000,000 elements per array"),
    (["calibrate", "spmm", "--sweep", "--count", "3", "--max-rows", "1e9", "--max-cols", "1e9", "--max-nnz", "1e9",
      "--out", "{d}/new.jsonl"], "GiB of memory"),
    (["calibrate", "spmm", "--graph", "{d}/g.npz", "--gpus", "2", "--hidden", "1e9", "--out", "{d}/new.jsonl"],
     "widths up to 1,000,000,000"),
    (["calibrate", "quant", "--rows", "1e12", "--out", "{d}/new.jsonl"], "encoding 1,000,000,000,000 x"),
    (["train", "--graph", "{d}/g.npz", "--grid", "2x1x1", "--hidden", "1e9"], "layers of width 1,000,000,000"),
    (["train", "--graph", "{d}/g.npz", "--grid", "2x1x1", "--layers", "1e7"], "training 10,000,000 layers"),
    (["measure", "--graph", "{d}/g.npz", "--gpus", "2", "--hidden", "1e9", "--log", "{d}/new.jsonl"], "GiB of memory"),
    (["predict", "--dataset", "reddit", "--gpus", "963761198400", "--machine", "perlmutter"], "1,837,080 grids"),
    (["predict", "--dataset", "reddit", "--gpus", "8", "--layers", "1e7", "--machine", "perlmutter"],
     "10,000,000 GCN layers is outside 1..1,000"),
    (["calibrate", "spmm", "--graph", "{d}/g.npz", "--gpus", "2", "--layers", "1e7", "--out", "{d}/new.jsonl"],
     "10,000,000 GCN layers is outside 1..1,000"),
    (["search", "--dataset", "reddit", "--gpus", "8", "--layers", "1001", "--machine", "perlmutter"],
     "1,001 GCN layers is outside 1..1,000"),
]
PROFILES = [
    (["predict", "--dataset", "reddit", "--gpus", "8", "--machine", "{d}/mem.json"],
     "'device_memory_gib' is 1e+308, beyond any machine"),
    (["predict", "--dataset", "reddit", "--gpus", "8", "--machine", "{d}/coef.json"], "'spmm.c1' is 1e+300"),
    (["predict", "--dataset", "reddit", "--gpus", "8", "--machine", "{d}/overflow.json"], "coefficients that overflow"),
    (["search", "--dataset", "reddit", "--gpus", "8", "--machine", "{d}/mem.json"], "beyond any machine"),
    (["machines", "{d}/overflow.json"], "coefficients that overflow"),
]
SMALL = [
    (["search", "--dataset", "reddit", "--gpus", "8", "--study", ""], "the study name is empty"),
    (["measure", "--graph", "{d}/g.npz", "--gpus", "2", "--grids", "", "--log", "{d}/new.jsonl"], "no grids given"),
    (["predict", "--nodes", "1000", "--nnz", "1e20", "--features", "4", "--classes", "2", "--gpus", "8", "--machine",
      "perlmutter"], "--nnz '1e20' is too large (at most 2^63 - 1 = 9,223,372,036,854,775,807)"),
    (["predict", "--nodes", "1000", "--nnz", "2000000", "--features", "4", "--classes", "2", "--gpus", "8", "--machine",
      "perlmutter"], "an N x N adjacency holds at most N^2 = 1,000,000"),
    (["calibrate", "collectives", "--backend", "nccl", "--gpus", "2", "--out", "{d}/new.jsonl"],
     "the nccl backend needs CUDA GPUs"),
    (["validate", "--machine", "perlmutter", "--runs", "{d}/runs_huge.jsonl"], "epoch_ms = 1e+308 is not a finite time"),
]
ENVIRONMENT = [  # (environment, command line, error)
    ({"PLEXUS_TUNE_DATA": "{d}/g.npz"}, ["search", "--dataset", "reddit", "--gpus", "8", "--trials", "3"],
     "PLEXUS_TUNE_DATA={d}/g.npz: {d}/g.npz is a file, not a directory"),
    ({"PLEXUS_TUNE_DATA": None, "XDG_DATA_HOME": "{d}/g.npz"}, ["run", "--graph", "{d}/g.npz", "--gpus", "2"],
     "XDG_DATA_HOME={d}/g.npz: {d}/g.npz is a file"),
    ({"PLEXUS_TUNE_DATA": "{d}/g.npz/data"}, ["run", "--graph", "{d}/g.npz", "--gpus", "2"], "is a file, not a directory"),
]
CASES = ([("fit", {}, *c) for c in FIT_CASES] + [("sizes", {}, *c) for c in SIZES]
         + [("profiles", {}, *c) for c in PROFILES] + [("small", {}, *c) for c in SMALL]
         + [("environment", *c) for c in ENVIRONMENT])


def _snapshot(*roots) -> dict:
    return {str(p): None if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for root in roots for p in sorted(Path(root).rglob("*"))}


def _fill(text, d):
    return None if text is None else text.replace("{d}", str(d))


def test_every_mechanism_has_cases():
    assert {kind for kind, *_ in CASES} == {"fit", "sizes", "profiles", "small", "environment"}
    commands = {argv[0] + (" " + argv[1] if argv[0] == "calibrate" else "") for _, _, argv, _ in CASES}
    assert {"calibrate bandwidth", "calibrate spmm", "calibrate quant", "train", "measure", "predict", "fit"} <= commands


@pytest.mark.parametrize("kind, env, argv, expected", CASES,
                         ids=[f"{k}: {' '.join(a[:3])} #{i}" for i, (k, _, a, _) in enumerate(CASES)])
def test_refused_before_any_work(inputs, tmp_path, monkeypatch, capsys, kind, env, argv, expected):
    d = inputs
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PLEXUS_TUNE_DATA", str(tmp_path / "data"))
    for key, value in env.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, _fill(value, d))
    before = _snapshot(d, tmp_path)
    code = main([_fill(a, d) for a in argv])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, (out, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert _fill(expected, d) in lines[0], lines[0]
    assert out == ""
    assert _snapshot(d, tmp_path) == before, "files changed"


def test_in_memory_storage_and_an_exact_search_leave_no_data_directory(tmp_path, monkeypatch, capsys):
    """sqlite:// keeps the study in memory; an exact search saves no study, so no data directory appears."""
    monkeypatch.setenv("PLEXUS_TUNE_DATA", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    assert main(["search", "--dataset", "reddit", "--gpus", "8", "--trials", "3", "--exact-budget", "0",
                 "--storage", "sqlite://", "--top", "1"]) == 0
    assert main(["search", "--dataset", "reddit", "--gpus", "8", "--top", "1"]) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "exhaustive" in out + err
    assert list(tmp_path.iterdir()) == []


# --- G factorized in bounded time: the grids are those of brute force, for every G

def test_grids_are_those_of_brute_force():
    for g in range(1, 200):
        brute = sorted((a, b, g // (a * b)) for a in range(1, g + 1) for b in range(1, g + 1) if g % (a * b) == 0)
        assert [tuple(r) for r in enumerate_grids(g).tolist()] == brute, g
        assert grid_count(g) == len(brute)


def test_large_and_prime_gpu_counts_factorize_at_once():
    started = time.perf_counter()
    assert prime_factors(MERSENNE) == {MERSENNE: 1}
    assert prime_factors(10**18) == {2: 18, 5: 18}
    assert prime_factors(1_000_000_007 * 998_244_353) == {998_244_353: 1, 1_000_000_007: 1}
    assert divisors(MERSENNE).tolist() == [1, MERSENNE]
    assert len(divisors(10**18)) == 19 * 19 and grid_count(10**18) == (20 * 19 // 2) ** 2
    assert time.perf_counter() - started < 30  # a bound on hanging, not a speed target


def _recommended_grid(out: str) -> tuple[int, int, int]:
    match = re.search(r"Recommended grid: (\d+)x(\d+)x(\d+)", out)
    assert match, out
    return tuple(int(v) for v in match.groups())


def test_predict_answers_for_a_mersenne_prime_and_1e18(capsys):
    # a prime G has only the three grids with G on one axis
    assert main(["predict", "--dataset", "reddit", "--gpus", str(MERSENNE), "--machine", "perlmutter", "--top", "1"]) == 0
    assert _recommended_grid(capsys.readouterr().out) == (1, MERSENNE, 1)
    # at 1e18 every collective is latency-bound, its latency growing with its axis's ranks: the best grid is
    # near-cubic, each axis within a factor 10 of 1e6, and it multiplies back to G
    assert main(["predict", "--dataset", "reddit", "--gpus", "1e18", "--machine", "perlmutter", "--top", "1"]) == 0
    grid = _recommended_grid(capsys.readouterr().out)
    assert grid[0] * grid[1] * grid[2] == 10**18
    assert all(10**5 <= axis <= 10**7 for axis in grid), grid


# --- Ctrl-C: exit 130, one line saying what was kept, no traceback, no half-written output

def _interrupt(argv, cwd, env, ready, timeout_s: float = 300):
    """Run ``argv``, send SIGINT to its group once ``ready(stderr so far)`` holds; (exit code, stderr)."""
    err_path = Path(cwd) / ".." / f"{Path(cwd).name}.err"
    with open(err_path, "w") as err_file:
        proc = subprocess.Popen([sys.executable, "-m", "plexus_tune", *argv], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                                stderr=err_file, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None and not ready(err_path.read_text()) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert proc.poll() is None, err_path.read_text()
            before = err_path.read_text()
            os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C: the whole foreground group
            proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
    return proc.returncode, err_path.read_text()[len(before):]


def _env(root):
    return {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "PLEXUS_TUNE_DATA": str(root / "data")}


@pytest.mark.slow
def test_ctrl_c_in_fit_writes_nothing(tmp_path):
    argv = ["fit", "--spmm", str(RUNS / "spmm-sweep.jsonl"), str(RUNS / "spmm-shards.jsonl"), "--collectives",
            str(RUNS / "collectives.jsonl"), "--runs", str(RUNS / "runs.jsonl"), "--machine-name", "x", "--jobs", "2",
            "--out", str(tmp_path / "p.json")]
    code, err = _interrupt(argv, tmp_path, _env(tmp_path), lambda text: "fit: spmm roofline" in text)
    assert code == 130, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == f"plexus-tune: interrupted; no profile written ({tmp_path / 'p.json'} unchanged)"
    assert [p.name for p in tmp_path.iterdir()] == []  # neither the profile nor a temporary file


@pytest.mark.slow
def test_ctrl_c_in_a_measured_search_keeps_the_finished_trials(inputs, tmp_path):
    log = tmp_path / "runs.jsonl"
    argv = ["search", "--graph", str(inputs / "g.npz"), "--gpus", "2", "--measured", "--trials", "4", "--epochs", "60",
            "--log", str(log)]
    code, err = _interrupt(argv, tmp_path, _env(tmp_path), lambda text: log.exists() and log.read_text().count("\n") >= 1)
    assert code == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("plexus-tune: interrupted; study ") and f"the finished runs are in {log}" in last, err
    for line in log.read_text().splitlines() if log.exists() else ():
        json.loads(line)  # every logged line whole


@pytest.mark.slow
def test_no_process_outlives_train_at_its_exit(inputs, tmp_path):
    """The fork server and the resource tracker are stopped as the command exits, not seconds later."""
    proc = subprocess.Popen([sys.executable, "-m", "plexus_tune", "train", "--graph", str(inputs / "g.npz"), "--grid",
                             "2x1x1", "--epochs", "2", "--warmup", "1"], cwd=tmp_path, env=_env(tmp_path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    left = []
    for entry in os.listdir("/proc"):  # the session's processes (the command's pid is its id), zombies excluded
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == proc.pid and fields[0] != "Z":
                left.append(int(entry))
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes outlived train: {left}"
