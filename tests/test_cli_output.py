"""What commands print while they work and where their data goes: progress, warnings, wrapping,
default paths, the profile used."""

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from plexus_tune.cli.output import make_console
from plexus_tune.errors import UserError
from plexus_tune.measure.store import append_records, check_log
from plexus_tune.paths import data_dir

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "measurements" / "cpu-gloo-2026-11-23"
SPEC = "rmat:nodes=256,edges=1024,features=4,classes=4,seed=0"


@pytest.fixture
def data(tmp_path, monkeypatch):
    """An empty working directory and data directory ($PLEXUS_TUNE_DATA)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("PLEXUS_TUNE_DATA", str(tmp_path / "data"))
    return work, tmp_path / "data"


def test_data_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PLEXUS_TUNE_DATA", str(tmp_path / "mine"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert data_dir() == tmp_path / "mine"
    monkeypatch.delenv("PLEXUS_TUNE_DATA")
    assert data_dir() == tmp_path / "xdg" / "plexus-tune"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert data_dir() == tmp_path / "home" / ".local" / "share" / "plexus-tune"


def test_search_stores_its_study_in_the_data_directory_and_names_profile_and_storage(run_cli, data):
    work, store = data
    code, out, err = run_cli(["search", "--dataset", "reddit", "--gpus", "8..16", "--trials", "2", "--exact-budget", "0"])
    assert code == 0, err
    assert (store / "studies.db").is_file() and not list(work.iterdir())  # nothing in the working directory
    first = out.splitlines()[0]  # one line, however long the path: no wrapping off a terminal
    assert first == (f"machine profile perlmutter ({REPO / 'models' / 'perlmutter.json'}); "
                     f"study storage sqlite:///{store / 'studies.db'}")
    code, out, err = run_cli(["search", "--dataset", "reddit", "--gpus", "8..16"])  # exact: no study
    assert code == 0, err
    assert out.splitlines()[0] == f"machine profile perlmutter ({REPO / 'models' / 'perlmutter.json'})"


def test_run_logs_to_the_data_directory_and_says_where(run_cli, data):
    work, store = data
    code, out, err = run_cli(["run", "--graph", SPEC, "--gpus", "2", "--machine", "cpu-gloo-2core-fitted",
                              "--epochs", "3", "--warmup", "1"])
    assert code == 0, err
    log = store / "runs.jsonl"
    assert log.is_file() and not list(work.iterdir())
    lines = out.splitlines()
    assert lines[0] == f"machine profile cpu-gloo-2core-fitted ({REPO / 'models' / 'cpu-gloo-2core-fitted.json'})"
    assert any(line.startswith("epoch ") and line.endswith(f"logged to {log} (trial 0)") for line in lines), out


def test_consoles_wrap_only_on_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    text = "x/" * 150
    piped = io.StringIO()
    make_console(file=piped).print(text)
    assert piped.getvalue() == text + "\n"
    terminal = Terminal()
    console = make_console(file=terminal)
    console.width = 80
    console.print(text)
    assert len(terminal.getvalue().splitlines()) > 1


def test_calibrate_collectives_table_names_its_sizes_and_keeps_op_names(run_cli, tmp_path):
    log = tmp_path / "coll.jsonl"
    code, out, err = run_cli(["calibrate", "collectives", "--gpus", "2", "--sizes", "1K,64K", "--repeats", "1",
                              "--warmup", "0", "--out", str(log)])
    assert code == 0, err
    assert "median time and busbw at the smallest (1K) and largest (64K) message" in out
    header = next(line for line in out.splitlines() if "op" in line and "stride" in line)
    assert "ms at 1K" in header and "ms at 64K" in header and "busbw GB/s at 64K" in header
    assert any("reduce_scatter " in line for line in out.splitlines())
    ops = {"all_gather", "reduce_scatter", "all_reduce", "broadcast", "point_to_point"}
    assert err.splitlines()[-1] == f"appended {len(ops) * 2} records to {log}"  # every op at both sizes


def test_spmm_sweep_prints_progress_lines_off_a_terminal(run_cli, tmp_path):
    code, _, err = run_cli(["calibrate", "spmm", "--sweep", "--count", "4", "--max-rows", "512", "--max-cols", "4",
                              "--max-nnz", "2000", "--repeats", "1", "--out", str(tmp_path / "s.jsonl")])
    assert code == 0, err
    assert "calibrate spmm: SpMM sweep of 4 shapes: 4/4 done" in err


@pytest.mark.slow
def test_train_prints_a_line_per_epoch_on_stderr(tmp_path):
    # a process of its own: the ranks' stderr is that of the process that starts them
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "plexus_tune", "train", "--synthetic", SPEC, "--grid", "2x1x1",
                           "--epochs", "3", "--warmup", "1", "--hidden", "8"], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300, check=False)
    code, out, err = proc.returncode, proc.stdout, proc.stderr
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.startswith("train: epoch")]
    assert [line.split(":")[1].strip() for line in lines] == ["epoch 1/3", "epoch 2/3", "epoch 3/3"]  # rank 0 only
    assert "(warm-up)" in lines[0] and "(warm-up)" not in lines[1] and "loss" in lines[2]
    assert "train: epoch" not in out


def _malformed(path: Path, source: Path, lines: int | None = None) -> Path:
    good = source.read_text().splitlines(True)[:lines]
    path.write_text("".join(good[:3]) + '{"broken\nnot json\n' + "".join(good[3:]))
    return path


def test_skipped_lines_are_one_plain_line_per_file(run_cli, tmp_path):
    runs = _malformed(tmp_path / "runs.jsonl", RUNS / "runs.jsonl")
    spmm = _malformed(tmp_path / "spmm.jsonl", RUNS / "spmm-sweep.jsonl", 80)
    coll = _malformed(tmp_path / "coll.jsonl", RUNS / "collectives.jsonl")
    expected = "skipped 2 bad line(s): line 4: malformed JSON"
    for argv, logs in (
        (["validate", "--machine", "cpu-gloo-2core-fitted", "--runs", str(runs)], [runs]),
        (["plot", "pred-vs-obs", "--log", str(runs), "--gpus", "4", "--graph", "rmat-n16384-e262144-s0",
          "--out", str(tmp_path / "plots")], [runs]),
        (["fit", "--spmm", str(spmm), "--collectives", str(coll), "--machine-name", "x", "--kind", "roofline",
          "--splits", "10", "--jobs", "1", "--gemm-tflops", "0.1", "--out", str(tmp_path / "p.json")], [spmm, coll]),
    ):
        code, _, err = run_cli(argv)
        assert code == 0, err
        warned = [line for line in err.splitlines() if "skipped" in line]
        assert warned == [f"plexus-tune: warning: {log}: {expected}" + warned[i].split(expected)[1]
                          for i, log in enumerate(logs)], err
        assert "Warning" not in err and "warnings.warn" not in err


def test_fit_on_garbage_says_to_calibrate(run_cli, tmp_path):
    garbage = tmp_path / "timings.jsonl"
    garbage.write_text("time 1 2 3\n")
    code, _, err = run_cli(["fit", "--spmm", str(garbage), "--collectives", str(garbage), "--machine-name", "x",
                            "--out", str(tmp_path / "p.json")])
    assert code == 2 and len(err.splitlines()) == 1
    assert f"{garbage} is not a plexus-tune measurement log" in err and "plexus-tune calibrate" in err


def test_a_log_is_checked_by_its_first_line(tmp_path):
    log = tmp_path / "runs.jsonl"
    shutil.copy(RUNS / "runs.jsonl", log)
    with open(log, "ab") as fh:
        fh.write(b'{"schema": "plexus-tune/run-v2", "cut sh')  # a writer killed mid-line: still a log
    assert check_log(log) == log
    append_records(log, [{"schema": "plexus-tune/gemm-v1", "rows": 1, "inner": 1, "cols": 1, "time_ms": 1.0}])
    other = tmp_path / "notes.txt"
    other.write_text("\n\nmy notes\n")
    with pytest.raises(UserError, match="notes.txt is not a plexus-tune measurement log .line 3"):
        check_log(other)
    with pytest.raises(UserError, match="is a directory"):
        check_log(tmp_path)
    in_the_way = tmp_path / "file"
    in_the_way.write_text("")
    with pytest.raises(UserError, match="is a file, not a directory"):
        check_log(in_the_way / "sub" / "runs.jsonl")
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(UserError, match="not writable"):
            check_log(locked / "runs.jsonl")
