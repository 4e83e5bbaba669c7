"""The kinds of failure a tool that keeps measurement logs must not have, one table each.

Beside tests/test_cli_bad_inputs.py (every command against malformed input), this table is
organised by what goes wrong, and each kind is fixed by one mechanism of the library:

- ``DESTROYS``: a command writing over its inputs or into a file of another kind, or into a
  directory it cannot create
  (:func:`plexus_tune.paths.check_output_file`, :func:`plexus_tune.measure.store.check_log`);
- ``TOO_BIG``: work that the host cannot hold, refused with the figures before it starts
  (:mod:`plexus_tune.resources`, the generators' and shards' own bounds);
- ``TOO_LATE``: values that used to be checked after ranks started, or never
  (:mod:`plexus_tune.cli.options`, the graph readers, the workload);
- ``MISLEADS``: outputs that must say what they mean (a verdict, the parts of a total,
  no footnote without a mark, one reading of ``1e3``).

Refusals: exit code 2, one line on stderr naming the bad value, no traceback, nothing on
stdout, and no file created, changed or removed (inputs, the working directory and the data
directory). The refusals that could start processes run as separate processes in their
own session, and no process of that session may outlive the command; so must Ctrl-C,
SIGTERM and SIGKILL of a running ``train``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from plexus_tune.cli import main

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "measurements" / "cpu-gloo-2026-11-23"
SPEC = "rmat:nodes=256,edges=1024,features=4,classes=4,seed=0"
G = ["--graph", "{d}/g.npz"]
FIT = ["fit", "--spmm", "{d}/spmm.jsonl", "--collectives", "{d}/coll.jsonl", "--machine-name", "x"]
VALIDATE = ["validate", "--machine", "perlmutter", "--runs", "{d}/runs.jsonl"]
TRAIN = ["train", "--synthetic", SPEC, "--grid", "2x1x1", "--epochs", "3", "--warmup", "1"]

# (command line, a substring of the one-line error)
DESTROYS = [
    ([*VALIDATE, "--json", "{d}/runs.jsonl"], "is an input of this command"),
    ([*VALIDATE, "--json", "{d}/runs.jsonl", "--force"], "is an input of this command"),
    ([*VALIDATE, "--json", "{d}/g.npz"], "is not a validation JSON"),
    ([*VALIDATE, "--json", "{d}/g.npz/v.json"], "g.npz is a file, not a directory"),
    ([*FIT, "--out", "{d}/spmm.jsonl"], "is an input of this command"),
    ([*FIT, "--out", "{d}/coll.jsonl", "--force"], "is an input of this command"),
    ([*FIT, "--out", "{d}/profile.json"], "already exists"),
    ([*FIT, "--out", "{d}/g.npz"], "already exists"),
    ([*FIT, "--out", "{d}/g.npz/p.json"], "g.npz is a file, not a directory"),
    (["graph", "shard", "{d}/g.npz", "--blocks", "2x2", "--out", "{d}/g.npz", "--force"], "is an input of this command"),
    (["graph", "shard", "{d}/g.npz", "--blocks", "2x2", "--out", "{d}", "--force"], "holds an input of this command"),
    (["graph", "convert", "{d}/g.npz", "{d}/g.npz/x.npz"], "g.npz is a file, not a directory"),
    (["calibrate", "quant", "--out", "{d}/g.npz"], "not a plexus-tune measurement log"),
    (["calibrate", "quant", "--out", "{d}/binary.bin"], "not a plexus-tune measurement log"),
    (["calibrate", "quant", "--out", "{d}/runs.jsonl"], "is a log of run records"),
    (["calibrate", "collectives", "--gpus", "2", "--out", "{d}/runs.jsonl"], "is a log of run records"),
    (["calibrate", "spmm", "--sweep", "--out", "{d}/coll.jsonl"], "is a log of collective records"),
    (["measure", *G, "--gpus", "2", "--log", "{d}/spmm.jsonl"], "is a log of spmm records"),
    (["run", *G, "--gpus", "2", "--log", "{d}/spmm.jsonl"], "is a log of spmm records"),
    ([*TRAIN, "--log", "{d}/coll.jsonl"], "is a log of collective records"),
    (["search", *G, "--gpus", "2", "--measured", "--log", "{d}/spmm.jsonl"], "is a log of spmm records"),
    (["measure", *G, "--gpus", "2", "--log", "{d}/g.npz"], "is an input of this command"),
    (["measure", *G, "--gpus", "2", "--log", "{d}/g.npz/r.jsonl"], "g.npz is a file, not a directory"),
    (["plot", "history", "--study", "nosuchstudy"], "does not exist"),
    (["plot", "pred-vs-obs", "--log", "{d}/runs.jsonl", "--gpus", "4", "--out", "{d}/g.npz/plots"], "is a file, not a directory"),
    (["search", "--dataset", "reddit", "--gpus", "8", "--trials", "2", "--storage", "sqlite:///{d}/g.npz/s.db"],
     "is a file, not a directory"),
]
TOO_BIG = [
    (["train", "--synthetic", SPEC, "--grid", "1000x1000x1000"], "1,000,000,000 ranks on this host"),
    (["run", *G, "--gpus", "1000000000000"], "ranks on this host"),
    (["calibrate", "collectives", "--gpus", "1000000000000", "--out", "{d}/new.jsonl"], "ranks on this host"),
    (["calibrate", "collectives", "--gpus", "1e6", "--out", "{d}/new.jsonl"], "1,000,000 ranks on this host"),
    (["measure", *G, "--gpus", "4096", "--grids", "64x64x1", "--log", "{d}/new.jsonl"], "4,096 ranks on this host"),
    (["search", *G, "--gpus", "1e6", "--measured", "--log", "{d}/new.jsonl"], "ranks on this host"),
    (["graph", "generate", "rmat", "--nodes", "1e12", "--out", "{d}/big.npz"], "GiB of memory"),
    (["graph", "stats", "rmat:nodes=1e12"], "GiB of memory"),
    (["train", "--synthetic", "rmat:nodes=1e12", "--grid", "2x1x1", "--log", "{d}/new.jsonl"], "GiB of memory"),
    (["calibrate", "spmm", "--graph", "{d}/g.npz", "--gpus", "1000000000000", "--out", "{d}/new.jsonl"],
     "shards would be empty"),
    (["graph", "shard", "{d}/g.npz", "--blocks", "512x512", "--out", "{d}/shards"], "at most 256 blocks per side"),
    (["graph", "stats", "{d}/g.npz", "--blocks", "512x512"], "at most 256 per side"),
    (["plot", "scaling", "--datasets", "reddit", "--machine", "perlmutter", "--gpus", "1..1e12", "--out", "{d}/pl"],
     "1,000,000,000,000 counts is more than the 4,096"),
]
TOO_LATE = [
    ([*TRAIN, "--lr", "nan", "--log", "{d}/new.jsonl"], "--lr: must be a finite number > 0, got 'nan'"),
    ([*TRAIN, "--lr", "-1", "--log", "{d}/new.jsonl"], "got '-1'"),
    ([*TRAIN, "--weight-decay", "-1", "--log", "{d}/new.jsonl"], "--weight-decay: must be a finite number >= 0"),
    ([*TRAIN, "--timeout", "nan", "--log", "{d}/new.jsonl"], "--timeout: must be a finite number > 0, got 'nan'"),
    (["run", *G, "--gpus", "2", "--timeout", "inf"], "got 'inf'"),
    ([*FIT, "--machine-name", "", "--out", "{d}/p.json"], "--machine-name must name the profile"),
    ([*FIT, "--splits", "0", "--out", "{d}/p.json"], "--splits: must be a whole number >= 1, got '0'"),
    (["plot", "breakdown", "--dataset", "reddit", "--gpus", "8", "--machine", "perlmutter", "--top", "-1"], "got '-1'"),
    (["measure", *G, "--gpus", "2", "--batch", "0", "--log", "{d}/new.jsonl"], "--batch: must be a whole number >= 1"),
    (["measure", *G, "--gpus", "2", "--redo", "--retry-failed", "--log", "{d}/new.jsonl"], "not allowed with"),
    (["search", "--dataset", "reddit", "--gpus", "8,,16"], "empty item"),
    (["search", "--dataset", "reddit", "--gpus", "8", "--top", "-1"], "--top: must be a whole number >= 1, got '-1'"),
    (["predict", "--nodes", "1000", "--nnz", "10", "--features", "4", "--classes", "2", "--gpus", "8", "--machine",
      "perlmutter"], "10 nonzeros for 1,000 nodes"),
    (["graph", "convert", "{d}/edges.txt", "{d}/x.npz", "--make-features", "0"], "--make-features: must be a whole number"),
    ([*TRAIN[:1], "--graph", "{d}/nan.npz", *TRAIN[3:]], "NaN or infinite"),
    ([*TRAIN[:1], "--graph", "{d}/nofeat.npz", *TRAIN[3:]], "has no 'features' array"),
    ([*TRAIN[:1], "--synthetic", "rmat:nodes=16,edges=40,classes=64", *TRAIN[3:]], "classes 64 exceeds the 16 nodes"),
    (["predict", "--dataset", "reddit", "--gpus", "8", "--machine", "/dev/zero"], "not a regular file"),
    (["predict", "--dataset", "reddit", "--gpus", "8", "--machine", "{d}/fifo.json"], "not a regular file"),
    ([*VALIDATE[:-1], "{d}/fifo.json"], "not a regular file"),
    ([*TRAIN, "--log", "{d}/fifo.json"], "not a regular file"),
    (["train", "--synthetic", SPEC, "--grid", "2x1x1", "--gpus", "1e3"], "has 2 ranks"),
]
CASES = [("destroys", *c) for c in DESTROYS] + [("too-big", *c) for c in TOO_BIG] + [("too-late", *c) for c in TOO_LATE]

#: refusals run as a separate process in a session of their own: no process may outlive them
IN_A_SESSION = [c for c in CASES if c[1][0] in ("train", "run", "measure", "calibrate")]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("kinds")
    assert main(["graph", "generate", "grid2d", "--nodes", "256", "--features", "4", "--classes", "4",
                 "--out", str(d / "g.npz")]) == 0
    arrays = dict(np.load(d / "g.npz"))
    features = arrays["features"].copy()
    features[3, 1] = np.nan
    np.savez(d / "nan.npz", **{**arrays, "features": features})
    np.savez(d / "nofeat.npz", **{k: v for k, v in arrays.items() if k != "features"})
    shutil.copy(RUNS / "runs.jsonl", d / "runs.jsonl")
    (d / "spmm.jsonl").write_text("".join((RUNS / "spmm-sweep.jsonl").read_text().splitlines(True)[:60]))
    (d / "coll.jsonl").write_text("".join((RUNS / "collectives.jsonl").read_text().splitlines(True)[:60]))
    shutil.copy(REPO / "models" / "perlmutter.json", d / "profile.json")
    (d / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (d / "edges.txt").write_text("0 1\n1 2\n2 3\n")
    os.mkfifo(d / "fifo.json")
    return d


def _snapshot(*roots) -> dict:
    out = {}
    for root in roots:
        for path in sorted(Path(root).rglob("*")):
            if path.is_fifo():
                out[str(path)] = "fifo"
            else:
                out[str(path)] = None if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture
def sandbox(inputs, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("PLEXUS_TUNE_DATA", str(tmp_path / "data"))
    return inputs, work, tmp_path


def _argv(argv, d):
    return [a.replace("{d}", str(d)) for a in argv]


def _refused(code, out, err, expected, before, after):
    lines = err.strip().splitlines()
    assert code == 2, (code, out, err)
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert expected in lines[0], lines[0]
    assert out == "", f"printed before the error: {out!r}"
    assert before == after, "files changed"


def test_every_kind_is_covered():
    kinds = {kind for kind, _, _ in CASES}
    assert kinds == {"destroys", "too-big", "too-late"}
    assert len(CASES) >= 55 and len(IN_A_SESSION) >= 20
    assert len(MISLEADS) >= 6


@pytest.mark.parametrize("kind, argv, expected", CASES, ids=[f"{k}: {' '.join(a[:3])} #{i}" for i, (k, a, _) in enumerate(CASES)])
def test_refused_before_any_work(sandbox, capsys, kind, argv, expected):
    d, _, root = sandbox
    before = _snapshot(root, d)
    try:
        code = main(_argv(argv, d))
    except SystemExit as exc:  # argparse usage errors
        code = exc.code
    out, err = capsys.readouterr()
    _refused(code, out, err, expected.replace("{d}", str(d)), before, _snapshot(root, d))


def _session(sid: int) -> list[int]:
    """Live processes of session ``sid`` (zombies excluded)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found.append(int(entry))
    return found


def _env(root):
    return {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "PLEXUS_TUNE_DATA": str(root / "data")}


def _no_survivors(sid: int, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while _session(sid) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _session(sid)
    for pid in left:  # do not leave them to the next test
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes outlived the command: {left}"


def _session_params():
    """One case per command runs in every test run; the rest (a fresh Python with torch each) are slow."""
    seen, params = set(), []
    for i, (kind, argv, expected) in enumerate(IN_A_SESSION):
        marks = () if argv[0] not in seen else (pytest.mark.slow,)
        seen.add(argv[0])
        params.append(pytest.param(kind, argv, expected, marks=marks, id=f"{kind}: {' '.join(argv[:3])} #{i}"))
    return params


@pytest.mark.parametrize("kind, argv, expected", _session_params())
def test_refused_in_a_fresh_process_and_nothing_outlives_it(sandbox, kind, argv, expected):
    d, work, root = sandbox
    before = _snapshot(root, d)
    proc = subprocess.Popen([sys.executable, "-m", "plexus_tune", *_argv(argv, d)], cwd=work, env=_env(root),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    out, err = proc.communicate(timeout=180)
    _no_survivors(proc.pid)
    _refused(proc.returncode, out, err, expected.replace("{d}", str(d)), before, _snapshot(root, d))


@pytest.mark.parametrize("signum, code", [pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow),
                                         (signal.SIGTERM, 143),
                                         pytest.param(signal.SIGKILL, -9, marks=pytest.mark.slow)])
@pytest.mark.slow
def test_a_stopped_train_leaves_no_process(sandbox, signum, code):
    """Ctrl-C, SIGTERM and SIGKILL in the middle of training: the ranks and the fork server end too."""
    d, work, root = sandbox
    proc = subprocess.Popen([sys.executable, "-m", "plexus_tune", "train", "--synthetic", SPEC, "--grid", "2x1x1",
                             "--epochs", "100000", "--warmup", "1"], cwd=work, env=_env(root),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for line in proc.stderr:  # the ranks are training
            if "epoch 3/" in line:
                break
        assert len(_session(proc.pid)) >= 3  # the command, the fork server, the ranks
        os.kill(proc.pid, signum)
        assert proc.wait(60) == code
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    _no_survivors(proc.pid)


# --- outputs that must say what they mean: (command line, must be in stdout+stderr, must not be)
MISLEADS = [
    (["predict", "--dataset", "reddit", "--gpus", "8", "--machine", "perlmutter"], ["quant", "overhead"],
     ["0 of ", "*: SpMM floored"]),
    (["predict", "--dataset", "reddit", "--gpus", "1e3", "--machine", "perlmutter", "--top", "1"],
     ["1000 GPUs on perlmutter"], []),
    (["search", "--dataset", "reddit", "--gpus", "1e3", "--top", "1"], ["G in 1000..1000"], []),
    (["search", "--dataset", "reddit", "--gpus", "8..64", "--trials", "12", "--top", "1"],
     ["TPE", "12 trials", "search: TPE trials: 12/12 done"], ["exhaustive"]),
    (["search", "--dataset", "reddit", "--gpus", "1..1e12", "--trials", "3", "--top", "1"],
     ["study Reddit-perlmutter-G1-1000000000000n1000000000000", "3 trials"], []),
    ([*TRAIN, "--check"], ["check against serial PyG (float32 on cpu)", "tolerance 1e-04", "PASSED",
                           "accuracy against serial PyG"], ["FP32 run"]),
    (["run", *G, "--gpus", "2", "--epochs", "2", "--warmup", "1", "--machine", "cpu-gloo-2core-fitted",
      "--log", "{d}/r.jsonl"], ["quant", "other", "overhead", "total = spmm + gemm + comm + quant + other + overhead"], []),
]


@pytest.mark.parametrize("argv, wanted, unwanted", MISLEADS, ids=[" ".join(a[:4]) for a, _, _ in MISLEADS])
def test_outputs_say_what_they_mean(sandbox, capsys, argv, wanted, unwanted):
    d, _, _ = sandbox
    code = main(_argv(argv, d))
    out, err = capsys.readouterr()
    assert code == 0, (out, err)
    for text in wanted:
        assert text in out + err, (text, out, err)
    for text in unwanted:
        assert text not in out + err, (text, out, err)


def test_predicted_parts_of_run_add_up(sandbox, capsys):
    d, _, _ = sandbox
    assert main(_argv(["run", *G, "--gpus", "2", "--epochs", "2", "--warmup", "1", "--machine", "cpu-gloo-2core-fitted",
                       "--log", "{d}/r.jsonl", "--top", "3"], d)) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("│") and "x" in line.split("│")[2]]
    assert rows
    for row in rows:
        cells = [c.strip() for c in row.strip("│").split("│")]
        total, parts = float(cells[2]), [float(c) for c in cells[3:9]]
        assert abs(sum(parts) - total) <= 0.01 * len(parts), row


def test_measure_says_when_a_logged_run_counts_as_a_trial(sandbox, capsys):
    d, _, _ = sandbox
    log = str(d / "m.jsonl")
    assert main(["train", "--graph", str(d / "g.npz"), "--grid", "2x1x1", "--epochs", "2", "--warmup", "1",
                 "--log", log]) == 0
    capsys.readouterr()
    assert main(["measure", "--graph", str(d / "g.npz"), "--gpus", "2", "--grids", "2x1x1", "--trials", "1",
                 "--epochs", "2", "--warmup", "1", "--log", log]) == 0
    out, err = capsys.readouterr()
    assert "already in" in out + err and "counts as this trial" in out + err
    assert len(Path(log).read_text().splitlines()) == 1  # nothing ran again
    Path(log).unlink()


def test_a_missing_output_directory_is_created_by_every_writer(sandbox, capsys):
    """The one rule for missing directories: created with their parents, as mkdir -p would."""
    d, work, _ = sandbox
    new = work / "a" / "b"
    for argv in (
        [*VALIDATE, "--json", str(new / "v.json")],
        ["graph", "generate", "grid2d", "--nodes", "64", "--features", "2", "--classes", "2", "--out", str(new / "g.npz")],
        ["graph", "shard", str(d / "g.npz"), "--blocks", "2x2", "--out", str(new / "shards")],
        ["calibrate", "quant", "--precisions", "bf16", "--rows", "64", "--cols", "8", "--repeats", "1",
         "--out", str(new / "c" / "quant.jsonl")],
        ["plot", "breakdown", "--dataset", "reddit", "--gpus", "8", "--machine", "perlmutter", "--out", str(new / "plots")],
    ):
        assert main(_argv(argv, d)) == 0, capsys.readouterr()
    capsys.readouterr()
    assert {p.name for p in new.iterdir()} == {"v.json", "g.npz", "shards", "c", "plots"}
