"""measure/run/search through a real Slurm (.ci/slurm/local-cluster.sh): inside salloc (srun
steps) and outside (a submitted batch job), resume, scancel, failed steps; and the pure parts.

The Slurm tests skip without a running Slurm, except under PLEXUS_TUNE_CI=1 where they fail
(the fixture of test_slurm_local first tries to start the local cluster).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import pytest

from plexus_tune.cli.launching import command_argv
from plexus_tune.errors import UserError
from plexus_tune.launch import dispatch
from plexus_tune.launch import slurm as ls

from test_slurm_local import REPO, slurm  # noqa: F401 - the fixture

GRAPH = "rmat:nodes=128,edges=1024,features=8,classes=4"
TINY = ["--graph", GRAPH, "--gpus", "2", "--epochs", "2", "--warmup", "1", "--hidden", "4", "--layers", "2"]


# ----------------------------------------------------------------------------- pure parts

def test_step_outcome_from_srun_output():
    failed = ls.step_outcome("srun: error: vm: task 0: Exited with exit code 1\n"
                             "slurmstepd: error: *** STEP 7.0 ON vm CANCELLED AT 2026-01-01T00:00:00 ***\n")
    assert failed == {"state": "FAILED", "exit_code": 1, "reason": "vm: task 0: Exited with exit code 1"}
    cancelled = ls.step_outcome("slurmstepd: error: *** STEP 7.1 ON vm CANCELLED AT 2026-01-01T00:00:00 ***\n")
    assert cancelled["state"] == "CANCELLED" and cancelled["exit_code"] is None
    assert ls.step_outcome("slurmstepd: error: *** STEP 7.2 ON vm CANCELLED AT x DUE TO TIME LIMIT ***")["state"] \
        == "TIMEOUT"
    both = ls.step_outcome("srun: error: vm: tasks 0-1: Exited with exit code 1\n")  # srun folds ranks together
    assert (both["state"], both["exit_code"]) == ("FAILED", 1)


def test_batch_command_drops_the_submission_options():
    args = Namespace(argv=["measure", "--graph", "g", "--partition", "multi", "--sbatch-arg=--qos=x", "--resume",
                           "12", "--no-wait", "--time", "1:00", "--timeout", "30", "--acc", "a", "--log", "L"])
    assert command_argv(args) == ["measure", "--graph", "g", "--timeout", "30", "--log", "L"]


def test_log_tail_returns_whole_new_run_lines(tmp_path):
    log = tmp_path / "l.jsonl"
    log.write_text(json.dumps({"schema": "plexus-tune/run-v2", "grid": "1x1x1"}) + "\n")
    tail = dispatch.LogTail(log)
    with open(log, "a") as handle:
        handle.write(json.dumps({"schema": "plexus-tune/run-v2", "grid": "2x1x1"}) + "\n")
        handle.write('{"schema": "plexus-tune/run-v2", "grid": "1x2')  # still being written
    assert [r["grid"] for r in tail.new_records()] == ["2x1x1"]
    with open(log, "a") as handle:
        handle.write('x1"}\n')
    assert [r["grid"] for r in tail.new_records()] == ["1x2x1"]


def test_scancel_on_sigterm_while_waiting(monkeypatch, tmp_path):
    """wait() cancels the jobs it waits for when a signal arrives (Slurm calls replaced)."""
    cancelled = []
    monkeypatch.setattr(ls, "cancel", lambda ids: cancelled.extend(ids))
    rounds = {"n": 0}

    def states(ids):
        rounds["n"] += 1
        if rounds["n"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        state = "CANCELLED" if cancelled else "RUNNING"
        return [ls.JobState("5", None, state, "None", None)]

    final, signum = dispatch.wait(["5"], tmp_path / "l.jsonl", dispatch.Reporter(), poll_s=0.01, states=states)
    assert signum == signal.SIGTERM and cancelled == ["5"] and final[0].state == "CANCELLED"


class _FakeLauncher:
    submit_options = {"partition": "debug"}

    def layout(self, world_size):
        return (1, world_size)


def test_dispatch_submits_waits_collects_and_then_submits_nothing(monkeypatch, tmp_path):
    """dispatch(): one job submitted, its logged run and the run it left unfinished collected,
    the failed job reported; a second call finds nothing to submit, a third waits for a live
    job of the log without submitting (Slurm calls replaced)."""
    log = tmp_path / "runs.jsonl"
    submitted, polls = [], {"n": 0}
    monkeypatch.setattr(dispatch, "POLL_S", 0.01)

    def submit(script, options):
        submitted.append(options)
        return "41"

    def states(ids):
        polls["n"] += 1
        if polls["n"] == 2:  # the job logs one run, then fails during the next
            with open(log, "a") as handle:
                handle.write(json.dumps({"schema": "plexus-tune/run-v2", "grid": "2x1x1", "trial": 0, "status": "ok",
                                         "epoch_ms": 5.0, "slurm": {"job_id": "41"}}) + "\n")
        state = "FAILED" if polls["n"] >= 3 else "RUNNING"
        return [ls.JobState(str(i), None, state, "NonZeroExitCode" if state == "FAILED" else "None",
                            1 if state == "FAILED" else None) for i in ids]

    monkeypatch.setattr(ls, "submit", submit)
    monkeypatch.setattr(ls, "job_states", states)
    lines, collected = [], []
    reporter = dispatch.Reporter()
    monkeypatch.setattr(reporter, "line", lines.append)

    def collect(job_states):
        failed = [s for s in job_states if s.state != "COMPLETED"]
        collected.extend(failed)
        return [{"grid": "1x2x1", "trial": 0, "status": "failed", "reason": "Slurm job 41 FAILED"} for _ in failed]

    job = dispatch.BatchJob(["measure", "--log", str(log)], str(log), _FakeLauncher(), [2, 1, 2], "plexus-tune-test")
    assert job.world_sizes == (1, 2)
    outcome = dispatch.dispatch(job, reporter, describe=lambda j, left: f"job {j}: {left} run(s)", pending=lambda: 2,
                                collect=collect)
    assert outcome.submitted == "41" and submitted[0].nodes == 1 and submitted[0].ntasks_per_node == 2
    assert submitted[0].partition == "debug" and submitted[0].job_name == "plexus-tune-test"
    assert [r["grid"] for r in outcome.records] == ["2x1x1", "1x2x1"] and [s.job_id for s in collected] == ["41"]
    assert "Submitted batch job 41" in lines and "job 41: 2 run(s)" in lines
    assert any(line.startswith("job 41 ended FAILED (reason NonZeroExitCode, exit code 1)") for line in lines)
    assert outcome.exit_code() == 1 and dispatch.uncollected(log) == []

    lines.clear()
    again = dispatch.dispatch(job, reporter, describe=lambda j, left: "", pending=lambda: 0)
    assert again.submitted is None and lines == ["nothing to submit"] and again.exit_code() == 0

    dispatch.write_jobs(log, [*dispatch.read_jobs(log), {"job_id": "42", "collected": False}])
    polls["n"] = -10  # job 42 is running for a while, then fails
    lines.clear()
    live = dispatch.dispatch(dataclasses.replace(job, wait=False), reporter, describe=lambda j, left: "",
                             pending=lambda: 2)
    assert live.submitted is None and live.detached and "nothing is submitted" in lines[0]
    assert len(submitted) == 1


def test_batch_job_checks_its_request():
    with pytest.raises(UserError, match="at least one world size"):
        dispatch.BatchJob(["run"], "l.jsonl", _FakeLauncher(), [], "x")
    with pytest.raises(UserError, match="at least 1 task"):
        dispatch.BatchJob(["run"], "l.jsonl", _FakeLauncher(), [2], "x", array=0)


# ----------------------------------------------------------------------------- a running Slurm

def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def _cli(argv, cwd, timeout=400, **kwargs):
    return subprocess.run([sys.executable, "-m", "plexus_tune", *argv], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=timeout, **kwargs)


def _runs(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []


def _submitted(text: str) -> list[str]:
    return [line.split()[-1] for line in text.splitlines() if line.startswith("Submitted batch job ")]


def _in_squeue(job: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%i"], capture_output=True, text=True, timeout=30)
    return bool(out.stdout.strip())


@pytest.mark.slow
def test_measure_inside_salloc_runs_one_step_per_run(slurm, tmp_path):  # noqa: F811
    log = tmp_path / "runs.jsonl"
    result = subprocess.run(["salloc", "-n", "2", "-J", "pt-dp-salloc", sys.executable, "-m", "plexus_tune", "measure",
                             "--launcher", "slurm", *TINY, "--grids", "2x1x1,1x2x1", "--trials", "1", "--log", str(log)],
                            cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-2000:]
    runs = _runs(log)
    assert sorted(r["grid"] for r in runs) == ["1x2x1", "2x1x1"] and all(r["status"] == "ok" for r in runs)
    jobs = {r["slurm"]["job_id"] for r in runs}
    assert len(jobs) == 1 and sorted(r["slurm"]["step_id"] for r in runs) == ["0", "1"]
    (state,) = ls.job_states(jobs)
    assert state.state == "COMPLETED"
    assert all(r["launcher"] == "slurm" and r["placement_ok"] and r["machine"].startswith("slurm:") for r in runs)
    assert _submitted(result.stdout + result.stderr) == []  # inside an allocation nothing is submitted


def test_calibrate_outside_an_allocation_is_one_line_before_any_work(tmp_path):
    out = tmp_path / "coll.jsonl"
    env = {k: v for k, v in _env().items() if not k.startswith("SLURM_")}
    result = subprocess.run([sys.executable, "-m", "plexus_tune", "calibrate", "collectives", "--launcher", "slurm", "--gpus", "4",
                             "--sizes", "64K", "--out", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == "" and not out.exists()
    assert result.stderr.count("\n") == 1 and "inside a Slurm allocation: run it under salloc or sbatch" in result.stderr


@pytest.mark.slow
def test_calibrate_collectives_inside_salloc_places_groups_on_the_allocated_nodes(slurm, tmp_path):  # noqa: F811
    out = tmp_path / "coll.jsonl"
    result = subprocess.run(["salloc", "-p", "multi", "-N", "2", "--ntasks-per-node=2", "-J", "pt-dp-calib", sys.executable, "-m",
                             "plexus_tune", "calibrate", "collectives", "--launcher", "slurm", "--gpus", "4", "--sizes", "64K",
                             "--repeats", "2", "--out", str(out)],
                            cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-2000:]
    records = _runs(out)
    # the model's placement on 2 nodes of 2 ranks (rank // 2): groups of stride 1 stay in a node,
    # groups of stride 2 span both nodes with one rank on each and two groups sharing each node's link
    assert records and all(r["launcher"] == "slurm" and r["rank_nodes"] == [0, 0, 1, 1] and r["gpus_per_node"] == 2
                           for r in records)
    shape = {(r["group_size"], r["stride"], r["alone"]): (r["nodes_spanned"], r["ranks_per_node"], r["concurrent"]) for r in records}
    assert shape[(2, 1, False)] == (1, 2, 1)
    assert shape[(2, 2, False)] == (2, 1, 2) and shape[(2, 2, True)] == (2, 1, 1)  # one group alone: no sharing
    assert shape[(4, 1, False)] == (2, 2, 1)


@pytest.mark.slow
def test_measure_outside_submits_waits_logs_and_does_not_resubmit(slurm, tmp_path):  # noqa: F811
    log = tmp_path / "runs.jsonl"
    argv = ["measure", "--launcher", "slurm", *TINY, "--grids", "2x1x1,1x1x2", "--trials", "1", "--log", str(log)]
    t0 = time.monotonic()
    first = _cli(argv, tmp_path)
    elapsed = time.monotonic() - t0
    assert first.returncode == 0, first.stderr[-2000:]
    (job,) = _submitted(first.stderr)
    runs = _runs(log)
    assert len(runs) == 2 and {r["slurm"]["job_id"] for r in runs} == {job}
    assert f"job {job}: COMPLETED" in first.stderr and "observed" in first.stderr
    assert ls.job_states([job])[0].state == "COMPLETED" and not _in_squeue(job)
    print(f"submit to both runs collected: {elapsed:.1f} s")
    again = _cli(argv, tmp_path)
    assert again.returncode == 0 and _submitted(again.stderr) == [] and "nothing to submit" in again.stderr
    assert len(_runs(log)) == 2
    assert [j["job_id"] for j in dispatch.read_jobs(log)] == [job]


@pytest.mark.slow
def test_failing_step_is_logged_with_its_slurm_state(slurm, tmp_path):  # noqa: F811
    # a bad graph is refused before anything is submitted; a step fails where only the
    # compute node can tell: nccl on nodes without GPUs (a login node has none either)
    log = tmp_path / "runs.jsonl"
    argv = ["measure", "--launcher", "slurm", *TINY, "--backend", "nccl", "--grids", "2x1x1", "--trials", "1",
            "--log", str(log)]
    result = _cli(argv, tmp_path)
    (job,) = _submitted(result.stderr)
    (record,) = _runs(log)
    assert record["status"] == "failed" and record["reason"].startswith(f"Slurm job {job} FAILED")
    assert "nccl backend needs CUDA" in (tmp_path / "runs.jsonl.slurm" / f"slurm-{job}.out").read_text()  # the job's output
    assert record["slurm"]["job_id"] == job and record["slurm"]["state"] == "FAILED" and record["slurm"]["exit_code"] == 2
    assert "1 failed" in result.stderr


@pytest.mark.slow
def test_sigterm_cancels_the_job_and_a_rerun_resumes(slurm, tmp_path):  # noqa: F811
    log = tmp_path / "runs.jsonl"
    argv = ["measure", "--launcher", "slurm", *TINY, "--grids", "2x1x1,1x2x1", "--trials", "2", "--log", str(log)]
    cmd = [sys.executable, "-m", "plexus_tune", *argv]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:  # until the first run is logged
        lines.append(line)
        if "trial 0: observed" in line:
            break
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=120)
    text = "".join(lines) + rest
    assert proc.returncode == 128 + signal.SIGTERM, text
    (job,) = _submitted(text)
    assert not _in_squeue(job), "the cancelled job is still in squeue"
    assert ls.job_states([job])[0].state == "CANCELLED"
    runs = _runs(log)
    assert sum(r["status"] == "ok" for r in runs) >= 1
    cancelled = [r for r in runs if r["status"] == "cancelled"]
    assert all(r["slurm"]["state"] == "CANCELLED" for r in cancelled)

    # re-run, kill the command itself (not the job): the next run waits for that job, submits nothing
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if line.startswith("Submitted batch job "):
            second = line.split()[-1]
            break
    proc.kill()
    proc.wait(30)
    assert _in_squeue(second) or ls.job_states([second])[0].state == "COMPLETED"
    final = _cli(argv, tmp_path)
    assert final.returncode == 0, final.stderr[-2000:]
    assert _submitted(final.stderr) == [] and "nothing is submitted" in final.stderr
    ok = [(r["grid"], r["trial"]) for r in _runs(log) if r["status"] == "ok"]
    assert sorted(ok) == sorted({(g, t) for g in ("2x1x1", "1x2x1") for t in (0, 1)})  # each once


@pytest.mark.slow
def test_bad_partition_is_one_line_and_nothing_is_logged(slurm, tmp_path):  # noqa: F811
    log = tmp_path / "runs.jsonl"
    result = _cli(["measure", "--launcher", "slurm", *TINY, "--partition", "no-such-partition", "--log", str(log)],
                  tmp_path, timeout=120)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "Invalid partition name" in result.stderr
    assert not log.exists() and dispatch.read_jobs(log) == []


@pytest.mark.slow
def test_too_many_ranks_for_the_partition_is_rejected(slurm, tmp_path):  # noqa: F811
    result = _cli(["measure", "--launcher", "slurm", *TINY[:2], "--gpus", "64", "--grids", "4x4x4",
                   "--log", str(tmp_path / "l.jsonl")], tmp_path, timeout=120)
    assert result.returncode == 2 and "sbatch rejected the job" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
