"""Slurm primitives (plexus_tune.launch.slurm): parsing on recorded outputs, and the real
thing against a running Slurm (.ci/slurm/local-cluster.sh).

Without a running Slurm the tests that need one skip, except under PLEXUS_TUNE_CI=1,
where they fail (and the fixture first tries to start the local cluster itself).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plexus_tune.launch import slurm as ls
from plexus_tune.errors import UserError

pytestmark = pytest.mark.slow  # a local Slurm cluster

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SCRIPT = REPO / ".ci" / "slurm" / "local-cluster.sh"
IN_CI = os.environ.get("PLEXUS_TUNE_CI") == "1"
POLL_S = 0.25

# ----------------------------------------------------------------------------- recorded outputs
# `scontrol show job -o ID` and the jobcomp/filetxt log of Slurm 22.05.8 (Debian 12),
# recorded on the local cluster of .ci/slurm/local-cluster.sh.

SCONTROL_FAILED = (
    "JobId=1 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 "
    "Account=(null) QOS=(null) JobState=FAILED Reason=NonZeroExitCode Dependency=(null) Requeue=1 "
    "Restarts=0 BatchFlag=1 Reboot=0 ExitCode=3:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A "
    "SubmitTime=2026-11-23T23:15:51 EligibleTime=2026-11-23T23:15:51 AccrueTime=2026-11-23T23:15:51 "
    "StartTime=2026-11-23T23:15:53 EndTime=2026-11-23T23:15:53 Deadline=N/A SuspendTime=None "
    "SecsPreSuspend=0 LastSchedEval=2026-11-23T23:15:53 Scheduler=Main Partition=local "
    "AllocNode:Sid=localhost:2465 ReqNodeList=(null) ExcNodeList=(null) NodeList=vm BatchHost=vm "
    "NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 "
    "Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 "
    "Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) "
    "Command=(null) WorkDir=/tmp/sl StdErr=/tmp/sl/e3.out StdIn=/dev/null StdOut=/tmp/sl/e3.out Power= \n"
)
SCONTROL_RUNNING = (
    "JobId=12 JobName=hog UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901750 Nice=0 "
    "Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 "
    "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:03 TimeLimit=UNLIMITED TimeMin=N/A "
    "SubmitTime=2026-11-23T23:19:04 EligibleTime=2026-11-23T23:19:04 AccrueTime=2026-11-23T23:19:04 "
    "StartTime=2026-11-23T23:19:05 EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 "
    "LastSchedEval=2026-11-23T23:19:05 Scheduler=Main Partition=local AllocNode:Sid=localhost:2465 "
    "ReqNodeList=(null) ExcNodeList=(null) NodeList=vm BatchHost=vm NumNodes=1 NumCPUs=16 NumTasks=16 "
    "CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=16,node=1,billing=16 Socks/Node=* "
    "NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 "
    "Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) "
    "Command=(null) WorkDir=/tmp/sl StdErr=/tmp/sl/slurm-12.out StdIn=/dev/null "
    "StdOut=/tmp/sl/slurm-12.out Power= \n"
)
SCONTROL_CANCELLED = SCONTROL_RUNNING.replace("JobState=RUNNING", "JobState=CANCELLED").replace(
    "ExitCode=0:0", "ExitCode=0:15")
SCONTROL_PENDING_ARRAY = (
    "JobId=13 ArrayJobId=13 ArrayTaskId=0-2%2 ArrayTaskThrottle=2 JobName=arr UserId=root(0) "
    "GroupId=root(0) MCS_label=N/A Priority=4294901749 Nice=0 Account=(null) QOS=(null) "
    "JobState=PENDING Reason=Resources Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 "
    "ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-23T23:19:04 "
    "EligibleTime=2026-11-23T23:19:05 AccrueTime=2026-11-23T23:19:05 StartTime=2027-11-23T23:19:05 "
    "EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-23T23:19:07 "
    "Scheduler=Main Partition=local AllocNode:Sid=localhost:2465 ReqNodeList=(null) "
    "ExcNodeList=(null) NodeList= NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=1,mem=24105M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* "
    "MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/sl "
    "StdErr=/tmp/sl/slurm-13_4294967294.out StdIn=/dev/null StdOut=/tmp/sl/slurm-13_4294967294.out "
    "Power= \n"
)
_ARRAY_TASK = (
    "JobId={jid} ArrayJobId=13 ArrayTaskId={task} ArrayTaskThrottle=2 JobName=arr UserId=root(0) "
    "GroupId=root(0) MCS_label=N/A Priority=4294901749 Nice=0 Account=(null) QOS=(null) "
    "JobState=COMPLETED Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 "
    "ExitCode=0:0 RunTime=00:00:01 TimeLimit=UNLIMITED TimeMin=N/A NodeList=vm BatchHost=vm "
    "NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 TRES=cpu=1,node=1,billing=1 WorkDir=/tmp/sl "
    "StdErr=/tmp/sl/slurm-13_{task}.out StdIn=/dev/null StdOut=/tmp/sl/slurm-13_{task}.out Power= \n"
)
SCONTROL_ARRAY_DONE = "".join(_ARRAY_TASK.format(jid=j, task=t) for j, t in ((13, 2), (15, 1), (14, 0)))
JOBCOMP_LOG = (
    "JobId=9 UserId=root(0) GroupId=root(0) Name=wrap JobState=COMPLETED Partition=local "
    "TimeLimit=UNLIMITED StartTime=2026-11-23T23:16:25 EndTime=2026-11-23T23:16:25 NodeList=vm "
    "NodeCnt=1 ProcCnt=2 WorkDir=/tmp/sl ReservationName= Tres=cpu=2,mem=24105M,node=1,billing=2 "
    "Account= QOS= WcKey= Cluster=unknown SubmitTime=2026-11-23T23:16:19 "
    "EligibleTime=2026-11-23T23:16:19 DerivedExitCode=7:0 ExitCode=0:0 \n"
    "JobId=12 UserId=root(0) GroupId=root(0) Name=hog JobState=CANCELLED Partition=local "
    "TimeLimit=UNLIMITED StartTime=2026-11-23T23:19:05 EndTime=2026-11-23T23:19:08 NodeList=vm "
    "NodeCnt=1 ProcCnt=16 WorkDir=/tmp/sl ReservationName= Tres=cpu=16,mem=24105M,node=1,billing=16 "
    "Account= QOS= WcKey= Cluster=unknown SubmitTime=2026-11-23T23:19:04 "
    "EligibleTime=2026-11-23T23:19:04 DerivedExitCode=0:0 ExitCode=0:0 \n"
    "JobId=15 UserId=root(0) GroupId=root(0) Name=arr JobState=COMPLETED Partition=local "
    "TimeLimit=UNLIMITED StartTime=2026-11-23T23:19:08 EndTime=2026-11-23T23:19:09 NodeList=vm "
    "NodeCnt=1 ProcCnt=1 WorkDir=/tmp/sl ReservationName= Tres=cpu=1,mem=24105M,node=1,billing=1 "
    "Account= QOS= WcKey= Cluster=unknown SubmitTime=2026-11-23T23:19:04 "
    "EligibleTime=2026-11-23T23:19:05 ArrayJobId=13 ArrayTaskId=1 DerivedExitCode=0:0 ExitCode=0:0 \n"
    "JobId=14 UserId=root(0) GroupId=root(0) Name=arr JobState=FAILED Partition=local "
    "TimeLimit=UNLIMITED StartTime=2026-11-23T23:19:08 EndTime=2026-11-23T23:19:09 NodeList=vm "
    "NodeCnt=1 ProcCnt=1 WorkDir=/tmp/sl ReservationName= Tres=cpu=1,mem=24105M,node=1,billing=1 "
    "Account= QOS= WcKey= Cluster=unknown SubmitTime=2026-11-23T23:19:04 "
    "EligibleTime=2026-11-23T23:19:05 ArrayJobId=13 ArrayTaskId=0 DerivedExitCode=0:0 ExitCode=2:0 \n"
)
# sacct -X -n -P -o JobID,JobIDRaw,State,Reason,ExitCode,DerivedExitCode, in sacct's
# --parsable2 layout (written by hand: the local cluster has no slurmdbd)
SACCT_OUTPUT = (
    "40|40|COMPLETED|None|0:0|0:0\n"
    "41|41|FAILED|NonZeroExitCode|3:0|3:0\n"
    "42|42|CANCELLED by 0|None|0:15|0:0\n"
    "43_0|44|COMPLETED|None|0:0|0:0\n"
    "43_[1-2]|43|PENDING|Resources|0:0|0:0\n"
)
SBATCH_TOO_BIG = "sbatch: error: Batch job submission failed: More processors requested than permitted\n"
SBATCH_GRES = "sbatch: error: Invalid generic resource (gres) specification\n"

# environments recorded in an sbatch script, in one of its srun tasks, and in salloc
ENV_BATCH = {"SLURM_JOB_ID": "2", "SLURM_JOBID": "2", "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1",
             "SLURM_NTASKS": "4", "SLURM_JOB_CPUS_PER_NODE": "4", "SLURM_TASKS_PER_NODE": "4",
             "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
ENV_STEP = dict(ENV_BATCH, SLURM_STEP_ID="0", SLURM_STEPID="0", SLURM_PROCID="3")
ENV_SALLOC_CPUS = {"SLURM_JOB_ID": "10", "SLURM_JOB_NUM_NODES": "3", "SLURM_NNODES": "3",
                   "SLURM_JOB_CPUS_PER_NODE": "16(x2),8"}


# ----------------------------------------------------------------------------- pure functions

def test_parse_scontrol_failed_running_cancelled():
    (failed,) = ls.parse_scontrol_jobs(SCONTROL_FAILED)
    assert (failed.job_id, failed.array_task, failed.state, failed.reason, failed.exit_code) == \
        ("1", None, "FAILED", "NonZeroExitCode", 3)
    assert failed.done and failed.derived_exit_code is None
    (running,) = ls.parse_scontrol_jobs(SCONTROL_RUNNING)
    assert (running.job_id, running.state, running.reason, running.done) == ("12", "RUNNING", "None", False)
    (cancelled,) = ls.parse_scontrol_jobs(SCONTROL_CANCELLED)
    assert (cancelled.state, cancelled.exit_code, cancelled.signal) == ("CANCELLED", 0, 15)


def test_parse_scontrol_arrays():
    pending = ls.parse_scontrol_jobs(SCONTROL_PENDING_ARRAY)
    assert [(s.job_id, s.array_task, s.state, s.reason, s.exit_code) for s in pending] == \
        [("13", t, "PENDING", "Resources", None) for t in (0, 1, 2)]
    done = ls.parse_scontrol_jobs(SCONTROL_ARRAY_DONE)
    assert sorted((s.key, s.state, s.exit_code) for s in done) == \
        [("13_0", "COMPLETED", 0), ("13_1", "COMPLETED", 0), ("13_2", "COMPLETED", 0)]


def test_parse_key_values_keeps_spaces_and_odd_keys():
    fields = ls.parse_key_values("JobId=5 JobName=my job CPUs/Task=2 TRES=cpu=2,node=1 Power= ")
    assert fields == {"JobId": "5", "JobName": "my job", "CPUs/Task": "2",
                      "TRES": "cpu=2,node=1", "Power": ""}


def test_parse_jobcomp():
    states = {s.key: s for s in ls.parse_jobcomp(JOBCOMP_LOG)}
    assert states["9"].derived_exit_code == 7 and states["9"].exit_code == 0
    assert states["12"].state == "CANCELLED"
    assert (states["13_0"].state, states["13_0"].exit_code) == ("FAILED", 2)
    only = ls.parse_jobcomp(JOBCOMP_LOG, ["13"])
    assert sorted(s.key for s in only) == ["13_0", "13_1"]
    assert [s.key for s in ls.parse_jobcomp(JOBCOMP_LOG, ["14"])] == ["14"]


def test_parse_sacct():
    states = {s.key: s for s in ls.parse_sacct(SACCT_OUTPUT)}
    assert states["41"].exit_code == 3 and states["41"].reason == "NonZeroExitCode"
    assert states["42"].state == "CANCELLED" and states["42"].signal == 15
    assert states["43_0"].state == "COMPLETED"
    assert states["43_2"].state == "PENDING" and states["43_2"].exit_code is None


def test_parse_small_outputs():
    assert ls.parse_sbatch_parsable("1234\n") == "1234"
    assert ls.parse_sbatch_parsable("77;cluster\n") == "77"
    assert ls.parse_count_list("16(x2),8") == (16, 16, 8)
    assert ls.parse_scontrol_config("MinJobAge               = 3600 sec\nJobCompType = jobcomp/filetxt\n") \
        == {"MinJobAge": "3600 sec", "JobCompType": "jobcomp/filetxt"}
    with pytest.raises(ValueError):
        ls.parse_sbatch_parsable("sbatch: error: nope")


def test_allocation_rules():
    assert ls.in_allocation(ENV_BATCH)
    assert not ls.in_allocation(ENV_STEP)
    assert not ls.in_allocation({})
    assert ls.in_allocation(dict(ENV_BATCH, SLURM_STEP_ID="4294967290"))  # interactive step
    alloc = ls.allocation_size(ENV_BATCH)
    assert (alloc.nodes, alloc.tasks, alloc.cpus_per_node) == (1, 4, (4,))
    alloc = ls.allocation_size(ENV_SALLOC_CPUS)
    assert (alloc.nodes, alloc.tasks, alloc.cpus_per_node) == (3, 40, (16, 16, 8))
    assert alloc.cpus_per_task(4, nodes=2) == 4 and alloc.cpus_per_task(4) == 2
    ls.check_allocation(alloc, 3, 8)
    with pytest.raises(UserError, match=r"has 4 tasks on 1 node\(s\) \(CPUs per node [0-9,]+\) but 8 tasks"):
        ls.check_allocation(ls.allocation_size(ENV_BATCH), 1, 8)
    with pytest.raises(UserError, match="not inside a Slurm allocation"):
        ls.allocation_size({})


def test_command_lines():
    argv = ls.srun_step_argv(2, 4, ["python", "-m", "x"], job_name="t")
    assert argv[:5] == ["srun", "--nodes=2", "--ntasks-per-node=4", "--ntasks=8",
                        "--kill-on-bad-exit=1"]
    assert "--exclusive" not in argv and "--cpu-bind=none" in argv  # the job's CPUs, unpinned
    assert argv[-3:] == ["python", "-m", "x"] and not any("gpu" in a for a in argv)
    own = ls.srun_step_argv(1, 2, ["a"], cpus_per_task=4)
    assert {"--exclusive", "--cpus-per-task=4", "--cpu-bind=cores"} <= set(own)
    gpu = ls.srun_step_argv(1, 4, ["a"], gpus_per_task=1, cpus_per_task=8, overlap=True)
    assert {"--gpus-per-task=1", "--gpu-bind=closest", "--cpus-per-task=8", "--cpu-bind=cores",
            "--overlap"} <= set(gpu) and "--exclusive" not in gpu
    sb = ls.sbatch_argv(ls.SbatchOptions(job_name="j", output="o-%A_%a.out", array=3, ntasks=2), wrap=["echo", "a b"])
    assert sb == ["sbatch", "--parsable", "--job-name=j", "--output=o-%A_%a.out", "--array=0-2",
                  "--ntasks=2", "--wrap=echo 'a b'"]
    assert ls.sbatch_argv(ls.SbatchOptions(nodes=1), Path("s.sbatch"), ["2x1x1"])[-2:] == ["s.sbatch", "2x1x1"]
    assert ls.SbatchOptions(array="0-7%2", time_limit="1:00", extra=["--qos=x"]).flags() == [
        "--array=0-7%2", "--time=1:00", "--qos=x"]
    with pytest.raises(UserError, match="at least one task"):
        ls.SbatchOptions(array=0)
    with pytest.raises(UserError, match="nodes must be at least 1"):
        ls.SbatchOptions(nodes=0)


def test_sbatch_errors_are_one_line():
    err = ls.sbatch_error(SBATCH_TOO_BIG, ["sbatch", "--parsable", "--ntasks=64", "--wrap=true"])
    text = str(err)
    assert "\n" not in text and "(--ntasks=64)" in text
    assert "More processors requested than permitted" in text and "sinfo" in text
    assert "drop --gpus" in str(ls.sbatch_error(SBATCH_GRES))


def test_no_slurm_on_path(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError, match="'sbatch' is not on the PATH"):
        ls.submit(["true"])


def test_wait_for_updates_and_hopeless_reasons():
    rounds = [[ls.JobState("5", None, "PENDING", "Priority", None)],
              [ls.JobState("5", None, "RUNNING", "None", None)],
              [ls.JobState("5", None, "RUNNING", "None", None)],
              [ls.JobState("5", None, "COMPLETED", "None", 0)]]
    seen = []
    final = ls.wait_for(["5"], 0, seen.append, states=lambda ids: rounds.pop(0))
    assert [s[0].state for s in seen] == ["PENDING", "RUNNING", "COMPLETED"]
    assert final[0].state == "COMPLETED"
    stuck = [ls.JobState("6", None, "PENDING", "PartitionConfig", None)]
    with pytest.raises(UserError, match="can never start"):
        ls.wait_for(["6"], 0, states=lambda ids: stuck)
    with pytest.raises(TimeoutError):
        ls.wait_for(["7"], 0.01, timeout_s=0.05,
                    states=lambda ids: [ls.JobState("7", None, "RUNNING", "None", None)])


# ----------------------------------------------------------------------------- a running Slurm

def _slurm_down_reason() -> str | None:
    """None when sinfo answers with a usable node, else why not."""
    if shutil.which("sinfo") is None:
        return "sinfo is not on the PATH"
    try:
        result = subprocess.run(["sinfo", "-h", "-o", "%T"], check=False, capture_output=True, text=True,
                                timeout=5)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer in 5 s"
    states = result.stdout.split()
    if result.returncode != 0:
        return result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "sinfo failed"
    if not any(s.rstrip("*~#") in {"idle", "mixed", "allocated", "completing"} for s in states):
        return f"no usable node (sinfo: {' '.join(states) or 'none'})"
    return None


@pytest.fixture(scope="module")
def slurm():
    """A running Slurm; started here (and stopped after) only under PLEXUS_TUNE_CI=1."""
    reason = _slurm_down_reason()
    started = False
    if reason and IN_CI:
        started = subprocess.run([str(CLUSTER_SCRIPT), "start"], check=False).returncode == 0
        reason = _slurm_down_reason()
    if reason:
        message = f"slurm not running: start it with .ci/slurm/local-cluster.sh start ({reason})"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    yield
    if started:
        subprocess.run([str(CLUSTER_SCRIPT), "stop"], check=False)


def _wait(job_id: str, timeout_s: float = 60.0) -> list[ls.JobState]:
    return ls.wait_for([job_id], POLL_S, timeout_s=timeout_s)


def test_batch_job_completes(slurm, tmp_path):
    job = ls.submit("#!/bin/sh\necho hello from $SLURM_JOB_ID\n",
                    ls.SbatchOptions(job_name="pt-ok", output=str(tmp_path / "%j.out")))
    (state,) = _wait(job)
    assert (state.job_id, state.state, state.exit_code) == (job, "COMPLETED", 0)
    assert (tmp_path / f"{job}.out").read_text().strip() == f"hello from {job}"


def test_batch_job_exit_3_is_failed(slurm, tmp_path):
    job = ls.submit(["sh", "-c", "exit 3"], ls.SbatchOptions(job_name="pt-exit3", output=str(tmp_path / "%j.out")))
    (state,) = _wait(job)
    assert (state.state, state.reason, state.exit_code) == ("FAILED", "NonZeroExitCode", 3)


def test_scancel_gives_cancelled(slurm, tmp_path):
    job = ls.submit(["sleep", "60"], ls.SbatchOptions(job_name="pt-cancel", output=str(tmp_path / "%j.out")))
    deadline = time.monotonic() + 30
    while ls.job_states([job])[0].state != "RUNNING":
        assert time.monotonic() < deadline, "the sleep job did not start"
        time.sleep(POLL_S)
    ls.cancel([job])
    (state,) = _wait(job, 30)
    assert state.state == "CANCELLED"
    ls.cancel([job])  # cancelling an ended job is no error


def test_job_array_completes(slurm, tmp_path):
    job = ls.submit(["sh", "-c", "echo task $SLURM_ARRAY_TASK_ID"],
                    ls.SbatchOptions(job_name="pt-array", array=3, output=str(tmp_path / "%A_%a.out")))
    states = _wait(job)
    assert sorted((s.job_id, s.array_task, s.state) for s in states) == \
        [(job, t, "COMPLETED") for t in range(3)]
    for t in range(3):
        assert (tmp_path / f"{job}_{t}.out").read_text().strip() == f"task {t}"


def test_too_large_request_is_rejected(slurm):
    with pytest.raises(UserError) as info:
        ls.submit(["true"], ls.SbatchOptions(ntasks=64, job_name="pt-too-big"))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("sbatch rejected the job (--ntasks=64)")


_STEP_SNIPPET = """
import json, os, subprocess, sys
from plexus_tune.launch import slurm as ls
from plexus_tune.errors import UserError
alloc = ls.allocation_size()
out = {"in_allocation": ls.in_allocation(), "nodes": alloc.nodes, "tasks": alloc.tasks}
try:
    ls.check_allocation(alloc, 1, 8)
except UserError as exc:
    out["too_small"] = str(exc)
argv = ls.srun_step_argv(1, 4, cpus_per_task=alloc.cpus_per_task(4), argv=[sys.executable, "-c",
    "import os, json; print(json.dumps([os.environ['SLURM_PROCID'], os.environ['SLURM_STEP_ID'], "
    "os.environ['SLURM_NTASKS']]))"], job_name="pt-step")
out["argv"] = argv
run = subprocess.run(argv, capture_output=True, text=True, timeout=60)
out["ranks"] = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("[")]
out["rc"] = run.returncode
print("RESULT " + json.dumps(out))
"""


def test_srun_step_in_allocation_starts_four_ranks(slurm):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    result = subprocess.run(["salloc", "-n", "4", "-J", "pt-salloc", sys.executable, "-c", _STEP_SNIPPET],
                            check=False, capture_output=True, text=True, timeout=60, env=env)
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stdout + result.stderr
    out = json.loads(lines[0][len("RESULT "):])
    assert out["in_allocation"] and (out["nodes"], out["tasks"]) == (1, 4)
    assert "but 8 tasks" in out["too_small"]
    assert out["rc"] == 0 and "--exclusive" in out["argv"] and "--cpus-per-task=1" in out["argv"]
    assert sorted(int(r[0]) for r in out["ranks"]) == [0, 1, 2, 3]
    assert {(r[1], r[2]) for r in out["ranks"]} == {("0", "4")}


def test_slurm_train_sbatch_runs_the_trainer(slurm, tmp_path):
    log = tmp_path / "runs.jsonl"
    env = dict(os.environ, BACKEND="gloo", PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    job = ls.submit(
        REPO / "runners" / "examples" / "slurm_train.sbatch",
        ls.SbatchOptions(nodes=1, ntasks_per_node=2, gpus_per_node=0, output=str(tmp_path / "train-%j.out")),
        ["2x1x1", "--synthetic", "rmat:nodes=512,edges=4096,features=16,classes=4,seed=0",
         "--epochs", "3", "--hidden", "16", "--log", str(log)],
        env=env, cwd=REPO)
    (state,) = _wait(job, 180)
    output = (tmp_path / f"train-{job}.out").read_text()
    assert state.state == "COMPLETED", output
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert len(records) == 1, output
    assert records[0]["status"] == "ok" and records[0]["grid"] == "2x1x1" and records[0]["gpus"] == 2


def _partition_nodes(name: str) -> int:
    result = subprocess.run(["sinfo", "-h", "-p", name, "-o", "%D"], check=False, capture_output=True,
                            text=True, timeout=10)
    return sum(int(x) for x in result.stdout.split() if x.isdigit())


_TWO_NODE_SNIPPET = """
import json, os, subprocess, sys
from plexus_tune.launch import slurm as ls
alloc = ls.allocation_size()
argv = ls.srun_step_argv(2, 2, [sys.executable, "-c",
    "import os, json; print(json.dumps([os.environ[k] for k in "
    "('SLURM_PROCID', 'SLURMD_NODENAME', 'SLURM_NODEID', 'SLURM_NTASKS')]))"],
    cpus_per_task=alloc.cpus_per_task(2), job_name="pt-two-nodes")
run = subprocess.run(argv, capture_output=True, text=True, timeout=60)
ranks = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("[")]
print("RESULT " + json.dumps({"nodes": alloc.nodes, "tasks": alloc.tasks, "rc": run.returncode,
                              "ranks": ranks, "err": run.stderr[-500:]}))
"""


def test_srun_step_across_two_nodes(slurm):
    if _partition_nodes("multi") < 2:
        pytest.skip("no partition 'multi' with 2 nodes (.ci/slurm/local-cluster.sh makes one)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    result = subprocess.run(["salloc", "-p", "multi", "-N", "2", "--ntasks-per-node=2", "-J", "pt-salloc2",
                             sys.executable, "-c", _TWO_NODE_SNIPPET],
                            check=False, capture_output=True, text=True, timeout=60, env=env)
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stdout + result.stderr
    out = json.loads(lines[0][len("RESULT "):])
    assert (out["nodes"], out["tasks"], out["rc"]) == (2, 4, 0), out["err"]
    assert sorted(int(r[0]) for r in out["ranks"]) == [0, 1, 2, 3]
    by_node: dict[str, list[int]] = {}
    for procid, node, node_id, ntasks in out["ranks"]:
        assert ntasks == "4"
        by_node.setdefault(f"{node}/{node_id}", []).append(int(procid))
    assert len(by_node) == 2 and all(len(v) == 2 for v in by_node.values())  # block layout: 0,1 | 2,3
    assert sorted(sorted(v) for v in by_node.values()) == [[0, 1], [2, 3]]
