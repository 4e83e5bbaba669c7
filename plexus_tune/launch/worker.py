"""One rank of a process set started by an external agent (torchrun, srun).

``python -m plexus_tune.launch.worker JOB_DIR`` reads ``JOB_DIR/job.pkl`` (the function,
its arguments and the process-group settings), joins the process set described by the
environment (:func:`plexus_tune.launch.local.detect_environment`), runs
``fn(rank, world_size, *args)`` and leaves in ``JOB_DIR``:

- ``placement-<rank>.json``: host, node index and local rank of this rank (and, in an
  srun step, the Slurm job and step ids);
- ``result-<rank>.pkl`` (the return value) or ``error-<rank>.json`` (reason, traceback).

The launcher that started the agents collects these files (:mod:`plexus_tune.launch.external`).
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import sys
import traceback
from pathlib import Path

from plexus_tune.launch.local import detect_environment, run_in_environment

#: Environment variables naming the node of a rank, in order of preference: the emulated
#: cluster's own, torchrun's node rank, Slurm's node index.
NODE_VARIABLES = ("PLEXUS_TUNE_NODE", "GROUP_RANK", "SLURM_NODEID")


def node_index(environ=None) -> int:
    """Index of the node this process runs on, from :data:`NODE_VARIABLES` (0 if none is set)."""
    env = os.environ if environ is None else environ
    for name in NODE_VARIABLES:
        if env.get(name, "").strip().isdigit():
            return int(env[name])
    return 0


def rank_placement(env) -> dict:
    """Where this rank runs: rank, host, node index, local rank, launcher, and the Slurm job and step."""
    placement = {"rank": env.rank, "host": socket.gethostname(), "node": node_index(),
                 "local_rank": env.local_rank, "source": env.source}
    if env.source == "slurm":
        array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
        # an array task by the name squeue and scancel give it: ARRAYJOB_TASK
        placement["slurm_job_id"] = f"{array_job}_{task}" if array_job and task else os.environ.get("SLURM_JOB_ID")
        placement["slurm_step_id"] = os.environ.get("SLURM_STEP_ID", os.environ.get("SLURM_STEPID"))
    return placement


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _write_error(job_dir: Path, rank: int, reason: str, details: str = "") -> None:
    """The rank's failure for the launcher to collect: ``error-<rank>.json``."""
    _write_atomic(job_dir / f"error-{rank}.json", json.dumps({"reason": reason, "traceback": details}).encode())


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m plexus_tune.launch.worker JOB_DIR", file=sys.stderr)
        return 2
    job_dir = Path(argv[0])
    env = detect_environment()
    if env is None:
        print("plexus_tune.launch.worker: not started by torchrun or srun (no RANK/WORLD_SIZE)", file=sys.stderr)
        return 2
    _write_atomic(job_dir / f"placement-{env.rank}.json", json.dumps(rank_placement(env)).encode())
    try:
        with open(job_dir / "job.pkl", "rb") as handle:
            job = pickle.load(handle)
        value = run_in_environment(job["fn"], env, job["args"], backend=job["backend"], timeout_s=job["timeout_s"],
                                   threads_per_rank=job["threads_per_rank"],
                                   on_timeout=lambda reason: _write_error(job_dir, env.rank, reason))
        _write_atomic(job_dir / f"result-{env.rank}.pkl", pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the launcher
        reason = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        _write_error(job_dir, env.rank, reason, traceback.format_exc())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
