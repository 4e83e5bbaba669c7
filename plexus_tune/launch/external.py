"""Process sets started by external agents (torchrun per node, srun): jobs and results.

A job is a directory: the launcher writes ``job.pkl`` (function, arguments, process-group
settings), starts one agent command per node, each agent starts its ranks running
:mod:`plexus_tune.launch.worker`, and :func:`run_agents` collects every rank's result
file. The first agent that fails stops the others (after a short grace period, so that the
report names the root cause rather than a peer's broken connection); a job that outlives
its timeout is stopped the same way. Agents run in their own process groups, so stopping
one stops its ranks. :func:`plexus_tune.launch.emulated.run_torchrun` starts, waits for
and stops its agents with the same functions.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Sequence

from plexus_tune.launch.local import FAILURE_GRACE_S, KILL_GRACE_S, RankFailure, secondary_failure

#: Lines of an agent's output kept for the failure report.
TAIL_LINES = 20
#: The module every rank of a job runs: it loads ``job.pkl`` and writes the rank's result.
WORKER_MODULE = "plexus_tune.launch.worker"


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


def torchrun_argv(*, nnodes: int, nproc_per_node: int, node_rank: int, endpoint: str, run_id: str,
                  job_dir: str | None = None, module_argv: Sequence[str] | None = None,
                  local_addr: str | None = None, rdzv: str = "c10d", join_timeout_s: float | None = None,
                  monitor_interval_s: float = 0.5, python: str = sys.executable, log_dir: str | None = None) -> list[str]:
    """One torchrun agent's command; each of its ranks runs ``python -m module_argv...``.

    ``module_argv`` defaults to the worker on ``job_dir``. ``rdzv="c10d"``: rendezvous at
    ``endpoint`` (host:port), hosted by node 0, waiting ``join_timeout_s`` (torch's default
    when None) for the other nodes; ``rdzv="static"``: ``endpoint`` is the master and
    ``node_rank`` fixes the node's ranks. ``local_addr`` is the address the agent
    advertises; c10d orders nodes by it.
    """
    if module_argv is None:
        module_argv = [WORKER_MODULE, str(job_dir)]
    argv = [python, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}",
            f"--node-rank={node_rank}", "--max-restarts=0", f"--monitor-interval={monitor_interval_s:g}"]
    if rdzv == "static":
        host, port = endpoint.rsplit(":", 1)
        argv += ["--rdzv-backend=static", f"--master-addr={host}", f"--master-port={port}"]
    else:
        conf = f"is_host={int(node_rank == 0)}"
        if join_timeout_s is not None:
            conf += f",join_timeout={int(join_timeout_s)}"
        argv += ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}", f"--rdzv-conf={conf}"]
    if local_addr:
        argv.append(f"--local-addr={local_addr}")
    if log_dir is None and job_dir is not None:
        log_dir = str(Path(job_dir) / "torchrun-logs")
    if log_dir is not None:  # torchrun's own files, else a torchelastic_* directory is left in /tmp
        argv.append(f"--log-dir={Path(log_dir) / f'node{node_rank}'}")
    return argv + ["-m", *module_argv]


def start_agent(argv: list[str], env: dict, log: IO[bytes]) -> subprocess.Popen:
    """Start one agent writing its output to ``log``, in a session of its own (see :func:`stop_agents`)."""
    return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def wait_agents(procs: Sequence[subprocess.Popen], timeout_s: float, *, failure_grace_s: float = FAILURE_GRACE_S,
                poll_s: float = 0.05) -> tuple[list[int | None], bool]:
    """Wait until every agent has exited, ``failure_grace_s`` after the first one failed, or ``timeout_s``.

    Returns the agents' exit codes at that moment (None: still running) and whether time ran out.
    """
    deadline = time.monotonic() + timeout_s
    grace_until = None
    while True:
        codes = [proc.poll() for proc in procs]
        now = time.monotonic()
        if all(code is not None for code in codes):
            return codes, False
        if now >= deadline:
            return codes, True
        if grace_until is None and any(code not in (None, 0) for code in codes):
            grace_until = now + failure_grace_s
        if grace_until is not None and now >= grace_until:
            return codes, False
        time.sleep(poll_s)


def stop_agents(procs: Sequence[subprocess.Popen], grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM the process group of every agent still running, SIGKILL those left after ``grace_s``."""
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
            with open(job_dir / f"agent-{k}.log", "wb") as log:
                procs.append(start_agent(argv, env, log))
        _codes, timed_out = wait_agents(procs, timeout_s)
    finally:
        stop_agents(procs)
    try:
        return collect(job_dir, world_size, [p.returncode for p in procs], timeout_s if timed_out else None)
    finally:
        if not keep:
            shutil.rmtree(job_dir, ignore_errors=True)
