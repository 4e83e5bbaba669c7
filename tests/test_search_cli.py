"""``plexus-tune search`` end to end: errors, the final table, kill and resume."""

import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from plexus_tune.cli import main

CMD = [sys.executable, "-m", "plexus_tune", "search"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--gpus", "64..8"], "empty GPU range"),
        (["--gpus", "8", "--objective", "speed"], "unknown objective"),
        (["--gpus", "8", "--exact-budget", "0", "--storage", "postgresql://nobody@127.0.0.1:1/none"], "cannot open storage"),
        (["--gpus", "8", "--exact-budget", "0", "--storage", "sqlite:////etc/hostname/s.db"], "/etc/hostname is a file, not a directory"),
        (["--gpus", "8", "--exact-budget", "0", "--storage", "nosuchdialect://h/db"], "cannot open storage"),
        (["--gpus", "8", "--exact-budget", "-1"], "--exact-budget: must be a finite number >= 0"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, extra, message):
    proc = subprocess.run(CMD + ["--dataset", "ogbn-products"] + extra, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr


def test_search_prints_table_and_resumes_in_process(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PLEXUS_TUNE_DATA", str(tmp_path / "measurements"))  # the default log and studies
    args = ["search", "--dataset", "ogbn-products", "--machine", "perlmutter", "--gpus", "64", "--exact-budget", "0", "--trials", "12", "--study", "s"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "measurements" / "studies.db").exists()
    assert "12 trials (12 run now, 0 before)" in out
    assert "best configurations (epoch, ms)" in out
    # same command with more trials: only the missing ones run
    assert main(args[:-4] + ["--trials", "15", "--study", "s"]) == 0
    assert "15 trials (3 run now, 12 before)" in capsys.readouterr().out
    # the model's best grid of 64 GPUs heads the table (brute force over all grids of 64)
    import numpy as np

    from plexus_tune.model.costs import predict_grids
    from plexus_tune.model.grid import enumerate_grids
    from plexus_tune.model.machine import load_machine
    from plexus_tune.model.workload import workload_from_dataset

    grids = enumerate_grids(64)
    pred = predict_grids(workload_from_dataset("ogbn-products"), load_machine("perlmutter"), grids)
    ok = np.flatnonzero(pred["feasible"])
    best = grids[ok[np.argmin(pred["total_ms"][ok])]]
    assert main(["search", "--dataset", "ogbn-products", "--gpus", "64", "--exact-budget", "0", "--trials", "15", "--study", "s",
                 "--top", "1"]) == 0
    table = capsys.readouterr().out
    assert "x".join(map(str, best)) in table.split("trial")[-1]


def _complete(db):
    con = sqlite3.connect(db)
    try:
        return con.execute(
            "select t.number, v.value from trials t join trial_values v on v.trial_id = t.trial_id where t.state = 'COMPLETE'"
        ).fetchall()
    except sqlite3.Error:
        return []
    finally:
        con.close()


def test_killed_search_resumes_without_losing_trials(tmp_path):
    db = tmp_path / "s.db"
    cmd = CMD + ["--dataset", "ogbn-products", "--gpus", "8..512", "--exact-budget", "0", "--snap", "8", "--trials", "30",
                 "--storage", f"sqlite:///{db}", "--study", "kill-me", "--seed", "1"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    done = []
    while time.time() < deadline:
        done = _complete(db) if db.exists() else []
        if len(done) >= 8 or proc.poll() is not None:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "the search finished before it could be killed"
    before = dict(_complete(db))
    assert 8 <= len(before) < 30
    rerun = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    after = dict(_complete(db))
    assert len(after) == 30
    assert {n: after[n] for n in before} == before
    assert f"({30 - len(before)} run now, {len(before)} before)" in rerun.stdout.replace("\n", " ")
