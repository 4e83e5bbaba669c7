"""Every command against bad input: one line on stderr, exit code 2, no traceback, nothing printed
on stdout before the error, and no file created, changed or removed.

The cases are a table of (command line, a substring the error must contain). ``{d}`` in an
argument is the directory of the input files made once for the module (see ``inputs``).
They run in process through ``plexus_tune.cli.main``; a few also run as a separate
``python -m plexus_tune`` process, so that the promise holds end to end.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from plexus_tune.cli import main

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "measurements" / "cpu-gloo-2026-11-23"
SPEC = "rmat:nodes=256,edges=1024,features=4,classes=4,seed=0"

G = ["--graph", "{d}/g.npz"]
SHORT = ["--epochs", "3", "--warmup", "1"]

CASES = [
    # predict: counts, names, profiles
    (["predict", "--dataset", "reddit", "--gpus", "0", "--machine", "perlmutter"], "at least 1, got 0"),
    (["predict", "--dataset", "reddit", "--gpus", "-4", "--machine", "perlmutter"], "-4"),
    (["predict", "--dataset", "reddit", "--gpus", "abc", "--machine", "perlmutter"], "abc"),
    (["predict", "--dataset", "nosuch", "--gpus", "8", "--machine", "perlmutter"], "nosuch"),
    (["predict", "--dataset", "reddit", "--gpus", "8", "--machine", "nosuch"], "nosuch"),
    (["predict", "--dataset", "reddit", "--gpus", "8", "--machine", "{d}/profiles"], "is a directory"),
    (["predict", "--dataset", "reddit", "--gpus", "8", "--machine", "{d}/garbage.json"], "garbage.json"),
    (["predict", "--dataset", "reddit", "--gpus", "8", "--machine", "{d}/empty.json"], "empty.json"),
    (["predict", "--dataset", "reddit", "--gpus", "8", "--machine", "{d}/trunc.json"], "trunc.json"),
    (["predict", "--dataset", "reddit", "--gpus", "8", "--machine", "perlmutter", "--top", "-1"], "--top"),
    (["predict", "--nodes", "100", "--gpus", "8", "--machine", "perlmutter"], "--nnz"),
    (["predict", "--dataset", "reddit", "--gpus", "8", "--machine", "perlmutter", "--format", "xml"], "xml"),
    (["predict", "--dataset", "reddit", "--gpus", "8", "--machine", "perlmutter", "--block-rows", "0"], "--block-rows"),
    (["predict", "--dataset", "reddit", "--gpus", "8", "--machine", "perlmutter", "--max-x", "0"], "--max-x"),
    (["predict", "--dataset", "reddit", "--gpus", "8", "--machine", "perlmutter", "--layers", "0"], "--layers"),
    (["predict", "--dataset", "reddit", "--gpus", "8", "--machine", "perlmutter", "--hidden", "-5"], "--hidden"),
    (["predict", "--dataset", "reddit", "--gpus", "8", "--machine", "perlmutter", "--bytes-per-element", "0"],
     "--bytes-per-element"),
    (["datasets", "--format", "xml"], "xml"),
    (["machines", "nosuch"], "nosuch"),
    # search
    (["search", "--dataset", "reddit", "--gpus", "0"], "0"),
    (["search", "--dataset", "reddit", "--gpus", "8", "--objective", "speed"], "speed"),
    (["search", "--dataset", "reddit", "--gpus", "8", "--trials", "0"], "--trials"),
    (["search", "--gpus", "8"], "--dataset"),
    (["search", "--dataset", "reddit", "--gpus", "8", "--machine", "nosuch"], "nosuch"),
    (["search", "--dataset", "nosuch", "--gpus", "8"], "nosuch"),
    (["search", "--dataset", "reddit", "--gpus", "8", "--exact-budget", "0", "--storage", "sqlite:///{d}/g.npz/s.db"], "is a file, not a directory"),
    (["search", "--dataset", "reddit", "--gpus", "8", "--exact-budget", "0", "--storage", "sqlite:///{d}/adir"], "is a directory"),
    (["search", "--dataset", "reddit", "--gpus", "8", "--exact-budget", "0", "--storage", "bogus://x"], "cannot open storage"),
    (["search", "--dataset", "reddit", "--gpus", "8", "--measured"], "--graph"),
    (["search", "--graph", "{d}/trunc.npz", "--gpus", "2"], "truncated"),
    (["search", "--graph", "{d}/nosuch.npz", "--gpus", "2"], "nosuch.npz"),
    (["search", *G, "--gpus", "2", "--measured", "--log", "{d}/adir"], "--log {d}/adir is a directory"),
    (["search", *G, "--gpus", "2", "--measured", "--log", "{d}/nonjson.jsonl"], "not a plexus-tune measurement log"),
    (["search", "--dataset", "reddit", "--gpus", "8", "--block-rows", "abc"], "abc"),
    # run
    (["run", *G, "--grid", "2x2x2", "--gpus", "4"], "has 8 ranks"),
    (["run", *G, "--gpus", "0"], "--gpus"),
    (["run", *G, "--gpus", "-1"], "--gpus"),
    (["run", "--graph", "{d}/trunc.npz", "--gpus", "2"], "truncated"),
    (["run", "--graph", "{d}/corrupt.npz", "--gpus", "2"], "truncated or corrupt"),
    (["run", "--graph", "{d}/empty.npz", "--gpus", "2"], "empty.npz"),
    (["run", "--graph", "{d}/garbage.npz", "--gpus", "2"], "garbage.npz"),
    (["run", "--graph", "{d}/nosuch.npz", "--gpus", "2"], "nosuch.npz"),
    (["run", *G, "--gpus", "2", "--machine", "nosuch"], "nosuch"),
    (["run", *G, "--gpus", "2", "--log", "{d}/adir"], "--log {d}/adir is a directory"),
    (["run", *G, "--gpus", "2", "--log", "{d}/nonjson.jsonl"], "not a plexus-tune measurement log"),
    (["run", *G, "--gpus", "2", "--log", "{d}/g.npz/runs.jsonl"], "is a file"),
    (["run", *G, "--gpus", "2", "--epochs", "0"], "epochs"),
    (["run", *G, "--gpus", "2", "--epochs", "3", "--warmup", "5"], "warmup"),
    (["run", *G, "--gpus", "2", "--grid", "2x2"], "2x2"),
    (["run", "--graph", "rmat:nodes=abc", "--gpus", "2"], "abc"),
    (["run", *G, "--gpus", "2", "--launcher", "bogus"], "bogus"),
    (["run", *G, "--gpus", "2", "--ranks-per-node", "0"], "--ranks-per-node"),
    # graph
    (["graph", "generate", "rmat", "--nodes", "0", "--out", "{d}/new.npz"], "nodes"),
    (["graph", "generate", "rmat", "--nodes", "-5", "--out", "{d}/new.npz"], "-5"),
    (["graph", "generate", "rmat", "--nodes", "256", "--out", "{d}/g.npz"], "already exists"),
    (["graph", "generate", "rmat", "--nodes", "256", "--out", "{d}/g.npz/new.npz"], "is a file, not a directory"),
    (["graph", "generate", "rmat", "--nodes", "256", "--out", "{d}/new.xyz"], "new.xyz"),
    (["graph", "generate", "grid2d", "--nodes", "256", "--edges", "10", "--out", "{d}/new.npz"], "--edges"),
    (["graph", "generate", "rmat", "--nodes", "256", "--param", "foo", "--out", "{d}/new.npz"], "foo"),
    (["graph", "generate", "bogus", "--nodes", "256", "--out", "{d}/new.npz"], "bogus"),
    (["graph", "convert", "{d}/trunc.npz", "{d}/new.npz"], "truncated"),
    (["graph", "convert", "{d}/nosuch.npz", "{d}/new.npz"], "nosuch.npz"),
    (["graph", "convert", "{d}/g.npz", "{d}/g.npz", "--force"], "same path"),
    (["graph", "convert", "{d}/g.npz", "{d}/adir"], "already exists"),
    (["graph", "stats", "{d}/trunc.npz"], "truncated"),
    (["graph", "stats", "{d}/garbage.npz"], "garbage.npz"),
    (["graph", "stats", "{d}/empty.npz"], "empty.npz"),
    (["graph", "stats", "{d}/g.npz", "--blocks", "3"], "RxC"),
    (["graph", "stats", "{d}/g.npz", "--blocks", "0x2"], "0x2"),
    (["graph", "shard", "{d}/g.npz", "--blocks", "3", "--out", "{d}/new-shards"], "RxC"),
    (["graph", "shard", "{d}/g.npz", "--out", "{d}/existing.png"], "already exists"),
    (["graph", "shard", "{d}/trunc.npz", "--out", "{d}/new-shards"], "truncated"),
    # train
    (["train", "--graph", "{d}/trunc.npz", "--grid", "2x1x1", *SHORT], "truncated"),
    (["train", "--graph", "{d}/corrupt.npz", "--grid", "2x1x1", *SHORT], "truncated or corrupt"),
    (["train", "--graph", "{d}/empty.npz", "--grid", "2x1x1", *SHORT], "empty.npz"),
    (["train", "--graph", "{d}/shards-cut", "--grid", "2x1x1", *SHORT], "truncated or corrupt"),
    (["train", "--synthetic", SPEC, "--grid", "2x1x1", *SHORT, "--log", "{d}/adir"], "--log {d}/adir is a directory"),
    (["train", "--synthetic", SPEC, "--grid", "2x1x1", *SHORT, "--log", "{d}/nonjson.jsonl"], "not a plexus-tune measurement log"),
    (["train", "--synthetic", SPEC, "--grid", "2x1x1", *SHORT, "--log", "{d}/garbage.txt"], "not a plexus-tune measurement log"),
    (["train", "--synthetic", SPEC, "--grid", "2x2x2", "--gpus", "4", *SHORT], "has 8 ranks"),
    (["train", "--synthetic", SPEC, "--grid", "0x1x1", *SHORT], "0x1x1"),
    (["train", "--synthetic", SPEC, "--grid", "2x1x1", "--epochs", "0"], "--epochs"),
    (["train", "--synthetic", SPEC, "--grid", "2x1x1", "--dtype", "float16"], "float16"),
    (["train", "--graph", "{d}/nosuch.npz", "--grid", "2x1x1", *SHORT], "nosuch.npz"),
    (["train", "--synthetic", SPEC, "--grid", "2x1x1", *SHORT, "--threads", "0"], "--threads"),
    (["train", "--synthetic", SPEC, "--grid", "2x1x1", *SHORT, "--timeout", "0"], "--timeout"),
    (["train", "--synthetic", "rmat:nodes=-3", "--grid", "2x1x1", *SHORT], "nodes"),
    # measure
    (["measure", "--graph", "{d}/trunc.npz", "--gpus", "2", "--log", "{d}/new.jsonl", *SHORT], "truncated"),
    (["measure", "--graph", "{d}/garbage.npz", "--gpus", "2", "--log", "{d}/new.jsonl", *SHORT], "garbage.npz"),
    (["measure", *G, "--gpus", "2", "--log", "{d}/adir", *SHORT], "--log {d}/adir is a directory"),
    (["measure", *G, "--gpus", "2", "--log", "{d}/nonjson.jsonl", *SHORT], "not a plexus-tune measurement log"),
    (["measure", *G, "--gpus", "0", "--log", "{d}/new.jsonl"], "--gpus"),
    (["measure", *G, "--gpus", "2", "--grids", "2x2x2", "--log", "{d}/new.jsonl"], "has 8 ranks"),
    (["measure", *G, "--gpus", "2", "--grids", "top:0", "--log", "{d}/new.jsonl"], "top:0"),
    (["measure", *G, "--gpus", "2", "--grids", "top:2", "--log", "{d}/new.jsonl"], "--machine"),
    (["measure", *G, "--gpus", "2", "--machine", "nosuch", "--log", "{d}/new.jsonl"], "nosuch"),
    (["measure", *G, "--gpus", "2", "--trials", "0", "--log", "{d}/new.jsonl"], "--trials"),
    (["measure", *G, "--gpus", "2", "--epochs", "3", "--warmup", "9", "--log", "{d}/new.jsonl"], "--warmup"),
    # calibrate
    (["calibrate", "collectives", "--gpus", "1", "--out", "{d}/new.jsonl"], "at least 2"),
    (["calibrate", "collectives", "--gpus", "0", "--out", "{d}/new.jsonl"], "--gpus"),
    (["calibrate", "collectives", "--gpus", "2", "--ops", "allreduce", "--out", "{d}/new.jsonl"], "allreduce"),
    (["calibrate", "collectives", "--gpus", "2", "--sizes", "abc", "--out", "{d}/new.jsonl"], "bad message size"),
    (["calibrate", "collectives", "--gpus", "2", "--out", "{d}/adir"], "--out {d}/adir is a directory"),
    (["calibrate", "collectives", "--gpus", "2", "--out", "{d}/nonjson.jsonl"], "not a plexus-tune measurement log"),
    (["calibrate", "collectives", "--gpus", "2", "--repeats", "0", "--out", "{d}/new.jsonl"], "--repeats"),
    (["calibrate", "collectives", "--gpus", "2", "--warmup", "-1", "--out", "{d}/new.jsonl"], "--warmup"),
    (["calibrate", "collectives", "--gpus", "2", "--comm-precision", "fp32,int3", "--out", "{d}/new.jsonl"], "--comm-precision"),
    (["calibrate", "collectives", "--gpus", "2", "--cols", "0", "--out", "{d}/new.jsonl"], "--cols"),
    (["calibrate", "collectives", "--gpus", "2", "--gpus-per-node", "0", "--out", "{d}/new.jsonl"], "--gpus-per-node"),
    (["calibrate", "spmm", "--sweep", "--count", "0", "--out", "{d}/new.jsonl"], "--count"),
    (["calibrate", "spmm", "--sweep", "--threads", "0", "--out", "{d}/new.jsonl"], "--threads"),
    (["calibrate", "spmm", "--sweep", "--out", "{d}/adir"], "--out {d}/adir is a directory"),
    (["calibrate", "spmm", "--sweep", "--out", "{d}/nonjson.jsonl"], "not a plexus-tune measurement log"),
    (["calibrate", "spmm", "--graph", "{d}/trunc.npz", "--gpus", "2", "--out", "{d}/new.jsonl"], "truncated"),
    (["calibrate", "spmm", "--graph", "{d}/g.npz", "--out", "{d}/new.jsonl"], "--gpus"),
    (["calibrate", "spmm", "--graph", "{d}/g.npz", "--gpus", "-2", "--out", "{d}/new.jsonl"], "--gpus"),
    (["calibrate", "bogus"], "bogus"),
    # fit
    (["fit", "--spmm", "{d}/garbage.txt", "--collectives", "{d}/garbage.txt", "--machine-name", "x", "--out", "{d}/p.json"],
     "plexus-tune calibrate"),
    (["fit", "--spmm", "{d}/empty.jsonl", "--collectives", "{d}/coll.jsonl", "--machine-name", "x", "--out", "{d}/p.json"],
     "plexus-tune calibrate spmm"),
    (["fit", "--spmm", "{d}/spmm.jsonl", "--collectives", "{d}/empty.jsonl", "--machine-name", "x", "--out", "{d}/p.json"],
     "plexus-tune calibrate collectives"),
    (["fit", "--spmm", "{d}/nosuch.jsonl", "--collectives", "{d}/coll.jsonl", "--machine-name", "x", "--out", "{d}/p.json"],
     "does not exist"),
    (["fit", "--spmm", "{d}/adir", "--collectives", "{d}/coll.jsonl", "--machine-name", "x", "--out", "{d}/p.json"], "adir"),
    (["fit", "--spmm", "{d}/spmm.jsonl", "--collectives", "{d}/coll.jsonl", "--machine-name", "x", "--out", "{d}/adir"],
     "--out {d}/adir is a directory"),
    (["fit", "--spmm", "{d}/spmm.jsonl", "--collectives", "{d}/coll.jsonl", "--machine-name", "x", "--out", "{d}/p.json",
      "--kind", "bogus"], "bogus"),
    (["fit", "--spmm", "{d}/spmm.jsonl", "--collectives", "{d}/coll.jsonl", "--machine-name", "x", "--out", "{d}/p.json",
      "--splits", "-1"], "--splits"),
    (["fit", "--spmm", "{d}/spmm.jsonl", "--collectives", "{d}/coll.jsonl", "--machine-name", "x", "--out", "{d}/p.json",
      "--jobs", "-1"], "--jobs"),
    (["fit", "--spmm", "{d}/spmm.jsonl", "--collectives", "{d}/nonjson.jsonl", "--machine-name", "x", "--out", "{d}/p.json"],
     "plexus-tune calibrate"),
    # validate
    (["validate", "--machine", "nosuch", "--runs", "{d}/runs.jsonl"], "nosuch"),
    (["validate", "--machine", "perlmutter", "--runs", "{d}/nosuch.jsonl"], "does not exist"),
    (["validate", "--machine", "perlmutter", "--runs", "{d}/garbage.txt"], "not a plexus-tune measurement log"),
    (["validate", "--machine", "perlmutter", "--runs", "{d}/runs.jsonl", "--json", "{d}/adir"], "--json {d}/adir is a directory"),
    (["validate", "--machine", "{d}/profiles", "--runs", "{d}/runs.jsonl"], "is a directory"),
    # plot
    (["plot", "pred-vs-obs", "--log", "{d}/runs.jsonl", "--gpus", "4", "--out", "{d}/existing.png"], "is a file"),
    (["plot", "breakdown", "--dataset", "reddit", "--gpus", "0", "--machine", "perlmutter", "--out", "{d}/plots"],
     "--gpus: must be a whole number >= 1, got '0'"),
    (["plot", "breakdown", "--dataset", "nosuch", "--gpus", "8", "--machine", "perlmutter", "--out", "{d}/plots"], "nosuch"),
    (["plot", "pred-vs-obs", "--log", "{d}/garbage.txt", "--out", "{d}/plots"], "not a plexus-tune measurement log"),
    (["plot", "pred-vs-obs", "--log", "{d}/nosuch.jsonl", "--out", "{d}/plots"], "does not exist"),
    (["plot", "pred-vs-obs", "--out", "{d}/plots"], "--log"),
    (["plot", "pred-vs-obs", "--log", "{d}/runs.jsonl", "--gpus", "4", "--machine", "nosuch", "--out", "{d}/plots"], "nosuch"),
    (["plot", "scaling", "--datasets", "nosuch", "--machine", "perlmutter", "--out", "{d}/plots"], "nosuch"),
    (["plot", "breakdown", "--dataset", "reddit", "--gpus", "8", "--machine", "perlmutter", "--format", "gif",
      "--out", "{d}/plots"], "gif"),
    (["plot", "history", "--study", "nosuch", "--storage", "sqlite:///{d}/nodir/s.db", "--out", "{d}/plots"], "does not exist"),
]

#: cases also run as a separate process (python -m plexus_tune)
SUBPROCESS = [
    ["train", "--graph", "{d}/trunc.npz", "--grid", "2x1x1", *SHORT],
    ["measure", *G, "--gpus", "2", "--log", "{d}/adir", *SHORT],
    ["run", *G, "--grid", "2x2x2", "--gpus", "4"],
    ["calibrate", "collectives", "--gpus", "2", "--ops", "allreduce", "--out", "{d}/new.jsonl"],
    ["predict", "--dataset", "reddit", "--gpus", "8", "--machine", "{d}/profiles"],
    ["graph", "shard", "{d}/g.npz", "--blocks", "3", "--out", "{d}/new-shards"],
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """The input files of the cases: good ones to pair with the bad, and the bad ones."""
    d = tmp_path_factory.mktemp("inputs")
    assert main(["graph", "generate", "grid2d", "--nodes", "256", "--features", "4", "--classes", "4",
                 "--out", str(d / "g.npz")]) == 0
    data = (d / "g.npz").read_bytes()
    (d / "trunc.npz").write_bytes(data[: len(data) // 3])
    with zipfile.ZipFile(d / "g.npz") as src, zipfile.ZipFile(d / "corrupt.npz", "w") as dst:
        for name in src.namelist():  # a readable archive whose arrays are cut short
            member = src.read(name)
            dst.writestr(name, member[: len(member) // 2] if name == "indices.npy" else member)
    (d / "empty.npz").write_bytes(b"")
    (d / "garbage.npz").write_text("this is not a graph\n")
    assert main(["graph", "shard", str(d / "g.npz"), "--blocks", "2x2", "--out", str(d / "shards-cut")]) == 0
    block = d / "shards-cut" / json.loads((d / "shards-cut" / "manifest.json").read_text())["files"][0]["file"]
    block.write_bytes(block.read_bytes()[:-10])
    (d / "adir").mkdir()
    (d / "garbage.txt").write_text("hello world\n")
    (d / "nonjson.jsonl").write_text("not json\nnor this\n")
    (d / "empty.jsonl").write_text("")
    (d / "existing.png").write_bytes(b"\x89PNG not really")
    (d / "profiles").mkdir()
    shutil.copy(REPO / "models" / "perlmutter.json", d / "profiles" / "mine.json")
    (d / "garbage.json").write_text("{ not json")
    (d / "empty.json").write_text("")
    (d / "trunc.json").write_text((REPO / "models" / "perlmutter.json").read_text()[:200])
    shutil.copy(RUNS / "runs.jsonl", d / "runs.jsonl")
    (d / "spmm.jsonl").write_text("".join((RUNS / "spmm-sweep.jsonl").read_text().splitlines(True)[:60]))
    (d / "coll.jsonl").write_text("".join((RUNS / "collectives.jsonl").read_text().splitlines(True)[:60]))
    return d


def _snapshot(*roots) -> dict:
    """path -> content hash (directories: None) of everything under ``roots``."""
    out = {}
    for root in roots:
        for path in sorted(Path(root).rglob("*")):
            out[str(path)] = None if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture
def sandbox(inputs, tmp_path, monkeypatch):
    """Run in an empty working directory with an empty data directory; returns the roots to watch."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("PLEXUS_TUNE_DATA", str(tmp_path / "data"))
    return inputs, work, tmp_path


def _argv(argv, d):
    return [a.replace("{d}", str(d)) for a in argv]


def _check(code, out, err, expected, before, after):
    lines = err.strip().splitlines()
    assert code == 2, (code, out, err)
    assert len(lines) == 1, err
    assert "Traceback" not in err and "Warning" not in err
    assert expected in lines[0], lines[0]
    assert out == "", f"printed before the error: {out!r}"
    assert before == after, "files changed"


def test_the_table_covers_every_command_and_enough_kinds():
    commands = {argv[0] for argv, _ in CASES}
    assert commands == {"predict", "datasets", "machines", "search", "run", "graph", "train", "measure",
                        "calibrate", "fit", "validate", "plot"}
    assert len(CASES) >= 78


@pytest.mark.parametrize("argv, expected", CASES, ids=[" ".join(a[:2]) + f" #{i}" for i, (a, _) in enumerate(CASES)])
def test_bad_input_is_one_line_and_changes_nothing(sandbox, capsys, argv, expected):
    d, _, root = sandbox
    argv = _argv(argv, d)
    before = _snapshot(root, d)
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse usage errors
        code = exc.code
    out, err = capsys.readouterr()
    _check(code, out, err, expected.replace("{d}", str(d)), before, _snapshot(root, d))


@pytest.mark.parametrize("argv", SUBPROCESS, ids=[" ".join(a[:2]) for a in SUBPROCESS])
def test_bad_input_in_a_fresh_process(sandbox, argv):
    d, work, root = sandbox
    expected = {tuple(a): e for a, e in CASES}[tuple(argv)]
    argv = _argv(argv, d)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "PLEXUS_TUNE_DATA": str(root / "data")}
    before = _snapshot(root, d)
    proc = subprocess.run([sys.executable, "-m", "plexus_tune", *argv], capture_output=True, text=True, cwd=work,
                          env=env, timeout=120, check=False)
    _check(proc.returncode, proc.stdout, proc.stderr, expected.replace("{d}", str(d)), before, _snapshot(root, d))
