"""Commands submitted to Slurm from outside an allocation: submit, wait, resume, cancel.

With ``--launcher slurm`` outside an allocation, ``measure``, ``run`` and ``search
--measured`` do not start ranks themselves. They submit **one batch job** (``search
--workers K``: a job array of K tasks, one search worker each) whose script runs the
same command line again inside the allocation, where each configuration is one ``srun``
job step and each run is appended to the command's log as it finishes. One job for the
whole campaign rather than one per configuration: the graph and the Python start-up are
paid once per job, runs do not compete for the nodes of one allocation (they are timed
one after another, as the model's epoch times assume), and one job id stands for the
command (``scancel ID`` stops it all).

Meanwhile the command prints the job id (``Submitted batch job N``, as sbatch does), then
the job's state changes and every run the job logs, and returns when the job has ended.

State beside the log, in the directory ``LOG.slurm/``:

* ``jobs.json``: the jobs submitted for this log (id, command line, submission time,
  whether the command has collected it);
* ``slurm-<job>.out``: the output of each job;
* ``running-<job>.json``: the run a job has in flight (grid, trial), written before each run.

Resuming: run the same command again. A job of ``jobs.json`` that is still pending or
running is waited for again (nothing is submitted); a job that has ended is collected;
then, if the log still lacks runs, one new job is submitted for those only (the job's
command skips what the log holds). ``--resume JOBIDS`` waits for given jobs instead.

Ending: Ctrl-C or SIGTERM cancels (``scancel``) the jobs the command waits for. A job
that ended other than COMPLETED (cancelled, failed, out of time) leaves its in-flight run
logged as a failed run with the job's Slurm state, reason and exit code (status
``cancelled`` for a cancelled job: such a run is measured again on resume).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from plexus_tune.errors import UserError
from plexus_tune.launch import slurm
from plexus_tune.model.grid import format_grid

#: Environment variable naming the state directory, set by the batch script for the command it runs.
DISPATCH_DIR_VARIABLE = "PLEXUS_TUNE_DISPATCH_DIR"
POLL_S = 2.0


def state_dir(log: str | os.PathLike) -> Path:
    return Path(os.path.abspath(os.fspath(log)) + ".slurm")


def read_jobs(log) -> list[dict]:
    path = state_dir(log) / "jobs.json"
    if not path.exists():
        return []
    try:
        return list(json.loads(path.read_text()).get("jobs", []))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read the job-state file {path}: {exc}; remove it to start afresh") from None


def write_jobs(log, jobs: Sequence[dict]) -> None:
    directory = state_dir(log)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / "jobs.json.tmp"
    tmp.write_text(json.dumps({"jobs": list(jobs)}, indent=1) + "\n")
    os.replace(tmp, directory / "jobs.json")


def mark_running(grid, trial: int, environ=None) -> None:
    """In a job's command: note the run about to start (``running-<job>.json``), if dispatched."""
    env = os.environ if environ is None else environ
    directory, job = env.get(DISPATCH_DIR_VARIABLE), env.get("SLURM_JOB_ID")
    if not directory or not job:
        return
    text = json.dumps({"grid": format_grid(grid), "trial": int(trial), "started": time.time()})
    path = Path(directory) / f"running-{job}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def in_flight(log, job_id: str) -> dict | None:
    path = state_dir(log) / f"running-{job_id}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def batch_script(argv: Sequence[str], *, directory: Path, cwd: str, python: str = sys.executable) -> str:
    """The batch script: the same command again, inside the allocation."""
    return (
        "#!/bin/sh\n"
        "# submitted by plexus-tune: the command below runs inside this allocation, one srun step per run\n"
        f"export {DISPATCH_DIR_VARIABLE}={shlex.quote(str(directory))}\n"
        f"cd {shlex.quote(cwd)} || exit 1\n"
        f"exec {shlex.quote(python)} -m plexus_tune {shlex.join(list(argv))}\n"
    )


def batch_resources(launcher, world_sizes: Iterable[int], **options) -> slurm.SbatchOptions:
    """``sbatch`` options of a job that can run every world size as one step (``options``:
    further fields of :class:`~plexus_tune.launch.slurm.SbatchOptions`)."""
    layouts = [launcher.layout(int(w)) for w in world_sizes]
    given = {key: launcher.submit_options[key] for key in ("partition", "account", "time_limit")
             if launcher.submit_options.get(key)}
    return slurm.SbatchOptions(nodes=max(n for n, _ in layouts), ntasks_per_node=max(p for _, p in layouts),
                               extra=tuple(launcher.submit_options.get("extra") or ()), **given, **options)


def parse_job_ids(text: str) -> list[str]:
    ids = [t.strip() for t in (text or "").split(",") if t.strip()]
    bad = [t for t in ids if not t.isdigit()]
    if not ids or bad:
        raise UserError(f"cannot read job ids {text!r}; write them as sbatch printed them, e.g. 1234 or 1234,1240")
    return ids


class Reporter:
    """Lines about the jobs and the runs they log, printed as they happen."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr

    def line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def states(self, states: Sequence[slurm.JobState]) -> None:
        for s in states:
            reason = f" ({s.reason})" if s.reason and s.reason != "None" else ""
            self.line(f"job {s.key}: {s.state}{reason}")


def describe_run(record: dict) -> str:
    where = record.get("slurm") or {}
    step = f" step {where['step_id']}" if where.get("step_id") is not None else ""
    ids = f" [job {where.get('job_id')}{step}]" if where.get("job_id") else ""
    name = record.get("grid") or "?"
    trial = record.get("trial")
    if record.get("status", "ok") == "ok" and record.get("epoch_ms") is not None:
        pred = (record.get("predicted") or {}).get("total_ms")
        extra = f", predicted {pred:.2f} ms" if pred is not None else ""
        return f"{name:>9} trial {trial}: observed {record['epoch_ms']:.2f} ms{extra}{ids}"
    return f"{name:>9} trial {trial}: {record.get('status')} - {record.get('reason')}{ids}"


class LogTail:
    """New run records of a log, from the size it had when the tail started."""

    def __init__(self, log):
        self.path = Path(log)
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def new_records(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        end = data.rfind(b"\n") + 1  # whole lines only: a line being written waits for the next poll
        self.offset += end
        out = []
        for line in data[:end].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and str(record.get("schema", "")).startswith("plexus-tune/run"):
                out.append(record)
        return out


class _Stop(Exception):
    def __init__(self, signum: int):
        self.signum = signum


def wait(job_ids: Sequence[str], log, reporter: Reporter, *, poll_s: float | None = None,
         on_record: Callable[[dict], None] | None = None,
         states: Callable[[list[str]], list[slurm.JobState]] | None = None) -> tuple[list[slurm.JobState], int | None]:
    """Wait until every job has ended, reporting state changes and the runs they log.

    Returns (final states, signal number or None). On SIGINT or SIGTERM the jobs are
    cancelled (``scancel``) and their final states awaited (a few seconds).
    """
    read = states or slurm.job_states
    poll_s = POLL_S if poll_s is None else poll_s
    ids = [str(j) for j in job_ids]
    tail = LogTail(log)
    last = None
    stop: dict = {}

    def handler(signum, _frame):
        raise _Stop(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    current: list[slurm.JobState] = []
    try:
        while True:
            try:
                current = read(ids)
                signature = tuple((s.key, s.state, s.reason) for s in current)
                if signature != last:
                    last = signature
                    reporter.states(current)
                for record in tail.new_records():
                    job = str((record.get("slurm") or {}).get("job_id", "")).split("_")[0]
                    if job in ids or not record.get("slurm"):
                        reporter.line(describe_run(record))
                        if on_record is not None:
                            on_record(record)
                for s in current:
                    why = slurm.hopeless(s)
                    if why:
                        slurm.cancel([s.job_id])
                        raise UserError(f"Slurm job {s.key} can never start ({s.reason}: {why}); cancelled it: "
                                        f"submit a smaller request")
                if current and all(s.done or s.state == "UNKNOWN" for s in current):
                    return current, None
                time.sleep(poll_s)
            except _Stop as exc:
                stop["signum"] = exc.signum
                break
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    # interrupted: cancel, then give Slurm a moment to end the jobs
    signal_name = signal.Signals(stop["signum"]).name
    reporter.line(f"{signal_name}: cancelling Slurm job(s) {', '.join(ids)} (scancel)")
    slurm.cancel(ids)
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        current = read(ids)
        if current and all(s.done or s.state == "UNKNOWN" for s in current):
            break
        time.sleep(min(poll_s, 0.5))
    reporter.states(current)
    return current, stop["signum"]


def submit(argv: Sequence[str], log, launcher, world_sizes: Iterable[int], *, job_name: str,
           array: int | None = None, reporter: Reporter) -> str:
    """Submit the command as a batch job (array of ``array`` tasks); record it beside the log."""
    directory = state_dir(log)
    directory.mkdir(parents=True, exist_ok=True)
    output = str(directory / ("slurm-%A_%a.out" if array else "slurm-%j.out"))
    options = batch_resources(launcher, world_sizes, job_name=job_name, output=output, array=array)
    job_id = slurm.submit(batch_script(argv, directory=directory, cwd=os.getcwd()), options)
    jobs = read_jobs(log)
    jobs.append({"job_id": job_id, "argv": list(argv), "array": array, "submitted": time.time(),
                 "collected": False})
    write_jobs(log, jobs)
    reporter.line(f"Submitted batch job {job_id}")
    return job_id


def job_output_tail(log, state: slurm.JobState, lines: int = 8) -> str:
    name = f"slurm-{state.job_id}_{state.array_task}.out" if state.array_task is not None else f"slurm-{state.job_id}.out"
    try:
        text = (state_dir(log) / name).read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def uncollected(log) -> list[str]:
    """Ids of the jobs of the state file that the command has not collected yet."""
    return [str(j["job_id"]) for j in read_jobs(log) if not j.get("collected")]


def mark_collected(log, job_ids: Iterable[str]) -> None:
    ids = {str(j) for j in job_ids}
    jobs = read_jobs(log)
    for job in jobs:
        if str(job["job_id"]) in ids:
            job["collected"] = True
    write_jobs(log, jobs)


def failure_status(state: str) -> str:
    """Run-record status of a run a job left unfinished in ``state``."""
    if state == "CANCELLED":
        return "cancelled"
    if state in ("TIMEOUT", "DEADLINE"):
        return "timeout"
    if state == "OUT_OF_MEMORY":
        return "oom"
    return "failed"


def state_fields(state: slurm.JobState, step: str | None = None) -> dict:
    """The ``slurm`` record field of a run its job left unfinished."""
    exit_code = state.exit_code
    return {"job_id": state.job_id if state.array_task is None else state.key, "step_id": step,
            "state": state.state, "reason": state.reason, "exit_code": exit_code,
            **({"signal": state.signal} if state.signal else {})}


def ended(state: slurm.JobState) -> bool:
    """Whether a job has ended (or no source knows it any more)."""
    return state.done or state.state == "UNKNOWN"


@dataclass(frozen=True)
class BatchJob:
    """A command to run as one batch job beside its log (:func:`dispatch`).

    ``world_sizes``: the rank counts of its runs (the job holds the largest);
    ``array``: K tasks of a job array (``search --workers K``); ``resume``: job ids to wait
    for instead of the log's uncollected ones; ``wait``: False returns after submitting;
    ``nothing_to_do``: the line printed when no run is left to submit.
    """

    argv: tuple[str, ...]
    log: str
    launcher: object
    world_sizes: tuple[int, ...]
    job_name: str
    array: int | None = None
    resume: str | None = None
    wait: bool = True
    nothing_to_do: str = "nothing to submit"

    def __post_init__(self):
        object.__setattr__(self, "argv", tuple(str(a) for a in self.argv))
        object.__setattr__(self, "world_sizes", tuple(sorted({int(w) for w in self.world_sizes})))
        if not self.world_sizes:
            raise UserError("a batch job needs at least one world size")
        if self.array is not None and int(self.array) < 1:
            raise UserError(f"a job array has at least 1 task, not {self.array}")


@dataclass
class Outcome:
    """What :func:`dispatch` saw: the final states of the jobs waited for, the signal that
    stopped the wait, the runs logged meanwhile (collected failures included) and the jobs
    of the log that had ended before (``collected``)."""

    states: list = field(default_factory=list)
    signum: int | None = None
    records: list = field(default_factory=list)
    collected: list = field(default_factory=list)
    submitted: str | None = None
    detached: bool = False  # returned without waiting (``wait`` False)

    @property
    def failed_jobs(self) -> list:
        """Jobs waited for that ended other than COMPLETED."""
        return [s for s in self.states if s.state != "COMPLETED"]

    def exit_code(self, *, ok: bool = True) -> int:
        """128 + signal if interrupted, else 1 if a job ended badly or not ``ok``, else 0."""
        if self.signum is not None:
            return 128 + self.signum
        return 0 if ok and not self.failed_jobs else 1


def dispatch(job: BatchJob, reporter: Reporter, *, describe: Callable[[str, int | None], str],
             pending: Callable[[], int] | None = None,
             collect: Callable[[Sequence[slurm.JobState]], list[dict]] | None = None) -> Outcome:
    """Submit, wait, collect and report, as ``measure``, ``run`` and ``search --measured`` do
    outside an allocation (the module docstring).

    The log's jobs (``job.resume``, else the uncollected ones) still queued or running are
    waited for and nothing is submitted; otherwise the ended ones are collected and, unless
    ``pending()`` says no run is left, one job is submitted and ``describe(job_id,
    pending)`` printed. ``collect(states)`` logs the runs jobs left unfinished and returns
    their records; every job that ended badly is reported with the tail of its output.
    """
    ids = parse_job_ids(job.resume) if job.resume else uncollected(job.log)
    states = slurm.job_states(ids) if ids else []
    live = sorted({s.job_id for s in states if not ended(s)})
    outcome = Outcome(collected=[s for s in states if s.job_id not in live])
    if outcome.collected and collect is not None:
        outcome.records += _report(reporter, collect(outcome.collected))
        mark_collected(job.log, [i for i in ids if i not in live])
    if live:
        reporter.line(f"job(s) {', '.join(live)} of this log are still queued or running: waiting for them "
                      f"(nothing is submitted)")
    else:
        left = pending() if pending is not None else None
        if left == 0:
            reporter.line(job.nothing_to_do)
            return outcome
        outcome.submitted = submit(job.argv, job.log, job.launcher, job.world_sizes, job_name=job.job_name,
                                   array=job.array, reporter=reporter)
        reporter.line(describe(outcome.submitted, left))
        live = [outcome.submitted]
    if not job.wait:
        outcome.detached = True
        return outcome
    outcome.states, outcome.signum = wait(live, job.log, reporter, on_record=outcome.records.append)
    if collect is not None:
        outcome.records += _report(reporter, collect(outcome.states))
    mark_collected(job.log, live)
    for state in outcome.failed_jobs:
        tail = job_output_tail(job.log, state)
        reporter.line(f"job {state.key} ended {state.state} (reason {state.reason}, exit code {state.exit_code})"
                      + (f":\n{tail}" if tail else ""))
    return outcome


def _report(reporter: Reporter, records: list[dict]) -> list[dict]:
    for record in records:
        reporter.line(describe_run(record))
    return records
