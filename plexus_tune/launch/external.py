"""Process sets started by external agents (torchrun per node, srun): jobs and results.

A job is a directory: the launcher writes ``job.pkl`` (function, arguments, process-group
settings), starts one agent command per node, each agent starts its ranks running
:mod:`plexus_tune.launch.worker`, and :func:`run_agents` collects every rank's result
file. The first agent that fails stops the others (after a short grace period, so that the
report names the root cause rather than a peer's broken connection); a job that outlives
its timeout is stopped the same way. Agents run in their own process groups, so stopping
one stops its ranks.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from plexus_tune.launch.local import FAILURE_GRACE_S, KILL_GRACE_S, RankFailure, secondary_failure

#: Lines of an agent's output kept for the failure report.
TAIL_LINES = 20


@dataclass
class Launched:
    """What a launch returns: per-rank values (rank order) and where each rank ran."""

    values: list
    placement: list = field(default_factory=list)  # dicts: rank, host, node, local_rank


def write_job(fn: Callable[..., Any], args: Sequence[Any], *, backend: str, timeout_s: float,
              threads_per_rank: int | None, directory: str | None = None) -> Path:
    """A fresh job directory holding ``job.pkl`` (``fn`` must be importable by name)."""
    job_dir = Path(tempfile.mkdtemp(prefix="plexus-job-", dir=directory))
    job = {"fn": fn, "args": tuple(args), "backend": backend, "timeout_s": float(timeout_s),
           "threads_per_rank": threads_per_rank}
    (job_dir / "job.pkl").write_bytes(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))
    return job_dir


def _stop(procs: Sequence[subprocess.Popen], grace_s: float = KILL_GRACE_S) -> None:
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-TAIL_LINES:])


def collect(job_dir: Path, world_size: int, agent_codes: Sequence[int | None], timed_out_s: float | None) -> Launched:
    """Per-rank results from ``job_dir``; :class:`RankFailure` for the likely root cause.

    A rank's own error comes first (a root cause before a peer's broken connection), then
    a timeout, then ranks that left no file at all (killed, or their agent never started).
    """
    values, placement, errors, missing = [None] * world_size, [], [], []
    for rank in range(world_size):
        place = job_dir / f"placement-{rank}.json"
        if place.exists():
            placement.append(json.loads(place.read_text()))
        result, error = job_dir / f"result-{rank}.pkl", job_dir / f"error-{rank}.json"
        if result.exists():
            values[rank] = pickle.loads(result.read_bytes())
        elif error.exists():
            info = json.loads(error.read_text())
            errors.append(RankFailure(rank, info["reason"], info.get("traceback", "")))
        else:
            missing.append(rank)
    if errors:
        raise min(errors, key=lambda f: (secondary_failure(f), f.rank))
    if timed_out_s is not None:
        raise RankFailure(None, f"timed out after {timed_out_s:g} s; stopped all {world_size} ranks")
    if missing:
        codes = ", ".join(str(c) for c in agent_codes)
        tails = "\n".join(_tail(p) for p in sorted(job_dir.glob("agent-*.log")))
        raise RankFailure(missing[0], f"no result from rank(s) {missing[:8]} (agent exit codes {codes})", tails)
    return Launched(values, sorted(placement, key=lambda p: p["rank"]))


def run_agents(agents: Sequence[tuple[list[str], dict]], job_dir: Path, world_size: int, *,
               timeout_s: float, keep: bool = False) -> Launched:
    """Start one agent per (argv, environment), wait, collect; stop all on failure or timeout."""
    procs = []
    try:
        for k, (argv, env) in enumerate(agents):
            log = open(job_dir / f"agent-{k}.log", "wb")
            procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
            log.close()
        deadline = time.monotonic() + timeout_s
        timed_out, grace_until = None, None
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if now >= deadline:
                timed_out = timeout_s
                break
            if grace_until is None and any(p.poll() not in (None, 0) for p in procs):
                grace_until = now + FAILURE_GRACE_S
            if grace_until is not None and now >= grace_until:
                break
            time.sleep(0.05)
    finally:
        _stop(procs)
    try:
        return collect(job_dir, world_size, [p.returncode for p in procs], timed_out)
    finally:
        if not keep:
            shutil.rmtree(job_dir, ignore_errors=True)
