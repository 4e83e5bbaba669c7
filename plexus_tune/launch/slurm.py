"""Slurm primitives: where we run, the srun of one job step, sbatch, job states.

Where we run (all from the environment, no Slurm command needed):

* :func:`in_allocation` is true in the shell or script of an allocation that has not
  started its job steps yet: ``salloc``'s command or shell, an ``sbatch`` script, or
  the interactive step of ``salloc`` on sites with ``LaunchParameters=use_interactive_step``.
  The rule: ``SLURM_JOB_ID`` is set and ``SLURM_STEP_ID`` is either unset (the batch
  script and salloc's own command have none) or one of Slurm's special step ids
  (``batch``, ``interactive``, ``extern``). Inside a task of an ``srun`` step
  ``SLURM_STEP_ID`` is 0, 1, ...; such a process is one rank of a step, not a place
  to start steps from, and :func:`in_allocation` is false there. (The batch script
  also has ``SLURM_PROCID=0`` and ``SLURM_NTASKS``; only ``SLURM_STEP_ID`` tells the
  two apart.)
* :func:`allocation_size` reads the nodes and tasks of that allocation.

Commands (each needs the Slurm clients on the PATH, else a one-line UserError):

* :func:`srun_step_argv` builds the srun command line of one job step.
* :func:`sbatch_argv`, :func:`submit` submit a batch job or job array and return its id.
* :func:`job_states`, :func:`wait_for`, :func:`cancel` follow and end jobs.

Where the states of jobs come from: ``scontrol show job -o ID`` while slurmctld
remembers the job (pending, running, and finished for ``MinJobAge`` seconds, 300 by
default); after that ``sacct`` when the cluster has accounting storage
(``AccountingStorageType`` is not ``accounting_storage/none``), otherwise the
job-completion log when ``JobCompType=jobcomp/filetxt`` and its file can be read.
``scontrol`` gives state, reason and exit code; the derived exit code (the highest
exit code of the job's steps) comes only from sacct or the job-completion log.

The parse functions (``parse_*``) are pure: they take the text a command printed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from plexus_tune.errors import UserError

#: job states after which a job does not change any more
TERMINAL_STATES = frozenset({
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
    "OUT_OF_MEMORY", "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT",
})
#: reasons for which a pending job can never start without someone changing it
HOPELESS_REASONS = {
    "PartitionConfig": "the request exceeds what the partition's nodes or limits allow",
    "PartitionNodeLimit": "more or fewer nodes than the partition allows",
    "PartitionTimeLimit": "a time limit above the partition's",
    "BadConstraints": "the constraints can never be satisfied",
    "InvalidAccount": "the account is not valid",
    "InvalidQOS": "the QOS is not valid",
    "DependencyNeverSatisfied": "a dependency failed",
}
#: special step ids of Slurm 20.11 and later: extern, batch, interactive
_SPECIAL_STEP_IDS = {"4294967292", "4294967291", "4294967290", "extern", "batch", "interactive"}
_NO_SLURM_HINT = ("run this on a Slurm login node or inside an allocation, or start a local "
                  "test cluster with .ci/slurm/local-cluster.sh start")
_COMMAND_TIMEOUT_S = 60.0


# ----------------------------------------------------------------------------- where we run

@dataclass(frozen=True)
class Allocation:
    """Nodes and tasks of the current allocation."""

    job_id: str
    nodes: int
    tasks: int  # SLURM_NTASKS when the allocation asked for tasks, else its CPUs
    cpus_per_node: tuple[int, ...]  # one entry per node

    @property
    def tasks_per_node(self) -> int:
        """Tasks each node can take when they are spread evenly."""
        return self.tasks // self.nodes if self.nodes else 0

    def cpus_per_task(self, tasks_per_node: int, nodes: int | None = None) -> int:
        """CPUs each of ``tasks_per_node`` tasks gets on the ``nodes`` largest nodes (at least 1)."""
        used = sorted(self.cpus_per_node, reverse=True)[:nodes or self.nodes]
        return max(1, min(used, default=1) // max(1, tasks_per_node))


def in_allocation(environ: Mapping[str, str] | None = None) -> bool:
    """True in an allocation's own shell or batch script, where job steps can be started.

    See the module's documentation for the rule; false outside Slurm and inside the
    tasks of an srun step.
    """
    env = os.environ if environ is None else environ
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job_id:
        return False
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID"))
    return step is None or step.strip() in _SPECIAL_STEP_IDS


def parse_count_list(text: str) -> tuple[int, ...]:
    """Expand Slurm's per-node counts such as ``16(x2),8`` into ``(16, 16, 8)``."""
    counts: list[int] = []
    for part in text.strip().split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            raise ValueError(f"not a Slurm count list: {text!r}")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return tuple(counts)


def allocation_size(environ: Mapping[str, str] | None = None) -> Allocation:
    """Nodes and tasks of the allocation this process runs in.

    nodes: ``SLURM_JOB_NUM_NODES`` (or ``SLURM_NNODES``); tasks: ``SLURM_NTASKS`` when the
    allocation was made with a task count (``-n``, ``--ntasks-per-node``), otherwise the
    sum of ``SLURM_JOB_CPUS_PER_NODE`` (one task per allocated CPU). Raises UserError
    outside an allocation.
    """
    env = os.environ if environ is None else environ
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job_id:
        raise UserError("not inside a Slurm allocation (SLURM_JOB_ID is not set): run under "
                        "salloc or sbatch, e.g. salloc -N NODES --ntasks-per-node=TASKS ...")
    try:
        cpus = parse_count_list(env.get("SLURM_JOB_CPUS_PER_NODE", "") or "0")
        nodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or len(cpus))
        tasks_text = env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS")
        tasks = int(tasks_text) if tasks_text else sum(cpus)
    except ValueError as exc:
        raise UserError(f"cannot read the size of Slurm allocation {job_id}: {exc}") from None
    if len(cpus) != nodes:  # one value per node, else spread the first evenly
        cpus = (cpus[0] if cpus else 0,) * nodes
    return Allocation(job_id=job_id, nodes=nodes, tasks=tasks, cpus_per_node=cpus)


def check_allocation(allocation: Allocation, nodes: int, tasks_per_node: int) -> None:
    """Raise UserError when ``allocation`` cannot hold ``nodes`` x ``tasks_per_node`` tasks."""
    needed = nodes * tasks_per_node
    if nodes > allocation.nodes or needed > allocation.tasks \
            or any(c < tasks_per_node for c in sorted(allocation.cpus_per_node, reverse=True)[:nodes]):
        raise UserError(
            f"Slurm allocation {allocation.job_id} has {allocation.tasks} tasks on "
            f"{allocation.nodes} node(s) (CPUs per node {','.join(map(str, allocation.cpus_per_node))}) but "
            f"{needed} tasks ({nodes} node(s) x {tasks_per_node}) are needed: allocate at least that many, e.g. salloc -N {nodes} "
            f"--ntasks-per-node={tasks_per_node}, or choose a smaller grid")


# ----------------------------------------------------------------------------- command lines

def srun_step_argv(nodes: int, tasks_per_node: int, argv: Sequence[str], *,
                   gpus_per_task: int | None = None, cpus_per_task: int | None = None,
                   job_name: str | None = None, overlap: bool = False,
                   extra: Sequence[str] = ()) -> list[str]:
    """The srun command that runs ``argv`` as one job step of ``nodes`` x ``tasks_per_node`` tasks.

    * ``--nodes``, ``--ntasks-per-node`` and ``--ntasks`` fix the task layout exactly.
    * ``--kill-on-bad-exit=1``: a task that exits non-zero ends the whole step, so a
      crashed rank does not leave the others waiting in a collective.
    * CPUs: with ``cpus_per_task`` (see :meth:`Allocation.cpus_per_task`) the step gets
      ``--exclusive --cpus-per-task=C --cpu-bind=cores``: exactly those CPUs, its own
      (``--exclusive`` implies ``--exact``), so steps started side by side in one
      allocation do not share CPUs, and each task is pinned to its C cores where the
      site's TaskPlugin binds. Without it the step takes every CPU of the job on its
      nodes (Slurm's default for a step; ``--exclusive`` alone would give each task a
      single CPU) and tasks are not pinned (``--cpu-bind=none``), so threaded ranks can
      use them all. Slurm 22.05 no longer hands the allocation's ``--cpus-per-task`` to
      srun, hence the explicit value.
    * ``overlap=True`` adds ``--overlap`` (instead of ``--exclusive``): the step shares
      CPUs with running steps, which is needed to start a step from inside another one
      (e.g. an ``srun --pty bash`` session).
    * GPUs only when ``gpus_per_task`` is given: ``--gpus-per-task=N --gpu-bind=closest``.
    * ``extra`` goes after these options, before the program.
    """
    if nodes < 1 or tasks_per_node < 1:
        raise UserError(f"a job step needs at least one node and one task per node, "
                        f"got {nodes} node(s) x {tasks_per_node}")
    if not argv:
        raise ValueError("srun_step_argv: empty command")
    cmd = ["srun", f"--nodes={nodes}", f"--ntasks-per-node={tasks_per_node}",
           f"--ntasks={nodes * tasks_per_node}", "--kill-on-bad-exit=1"]
    if job_name:
        cmd.append(f"--job-name={job_name}")
    if overlap:
        cmd.append("--overlap")
    elif cpus_per_task:
        cmd.append("--exclusive")
    if cpus_per_task:
        cmd += [f"--cpus-per-task={cpus_per_task}", "--cpu-bind=cores"]
    else:
        cmd.append("--cpu-bind=none")
    if gpus_per_task:
        cmd += [f"--gpus-per-task={gpus_per_task}", "--gpu-bind=closest"]
    cmd += list(extra)
    cmd += list(argv)
    return cmd


@dataclass(frozen=True)
class SbatchOptions:
    """What a batch job asks sbatch for (one ``--flag=value`` each, None leaves it out).

    ``array``: ``K`` for tasks ``0-(K-1)``, or a Slurm range such as ``"0-7%2"``.
    ``output`` may use ``%j``, ``%A`` (array job), ``%a`` (array task). ``extra``: further
    sbatch arguments, passed as written.
    """

    job_name: str | None = None
    output: str | None = None
    array: str | int | None = None
    nodes: int | None = None
    ntasks: int | None = None
    ntasks_per_node: int | None = None
    cpus_per_task: int | None = None
    gpus_per_node: int | None = None
    time_limit: str | None = None
    partition: str | None = None
    account: str | None = None
    extra: tuple[str, ...] = ()

    def __post_init__(self):
        if isinstance(self.array, int) and self.array < 1:
            raise UserError(f"a job array needs at least one task, got {self.array}")
        for name in ("nodes", "ntasks", "ntasks_per_node", "cpus_per_task"):
            value = getattr(self, name)
            if value is not None and int(value) < 1:
                raise UserError(f"sbatch {name} must be at least 1, got {value}")
        if self.gpus_per_node is not None and int(self.gpus_per_node) < 0:
            raise UserError(f"sbatch gpus_per_node must be at least 0, got {self.gpus_per_node}")
        object.__setattr__(self, "extra", tuple(str(a) for a in self.extra or ()))

    def flags(self) -> list[str]:
        """The sbatch flags, in a fixed order."""
        out = [f"--job-name={self.job_name}"] if self.job_name else []
        if self.output:
            out.append(f"--output={self.output}")
        if self.array is not None:
            out.append(f"--array={f'0-{self.array - 1}' if isinstance(self.array, int) else self.array}")
        for flag, value in (("--nodes", self.nodes), ("--ntasks", self.ntasks),
                            ("--ntasks-per-node", self.ntasks_per_node),
                            ("--cpus-per-task", self.cpus_per_task), ("--gpus-per-node", self.gpus_per_node),
                            ("--time", self.time_limit), ("--partition", self.partition),
                            ("--account", self.account)):
            if value is not None:
                out.append(f"{flag}={value}")
        return out + list(self.extra)


def sbatch_argv(options: SbatchOptions = SbatchOptions(), script: str | os.PathLike | None = None,
                script_args: Sequence[str] = (), *, wrap: Sequence[str] | None = None) -> list[str]:
    """The ``sbatch --parsable`` command line with ``options``.

    ``script``: a batch script file (followed by ``script_args``); or None, with
    ``wrap`` a command that sbatch wraps in a script (``--wrap``), or with neither, the
    script text then goes to sbatch's standard input.
    """
    cmd = ["sbatch", "--parsable", *options.flags()]
    if wrap is not None:
        if script is not None:
            raise ValueError("sbatch_argv: give a script or wrap, not both")
        cmd.append("--wrap=" + shlex.join(list(wrap)))
    elif script is not None:
        cmd.append(os.fspath(script))
        cmd += list(script_args)
    return cmd


# ----------------------------------------------------------------------------- running commands

def _require(command: str) -> str:
    path = shutil.which(command)
    if path is None:
        raise UserError(f"{command!r} is not on the PATH (no Slurm here): {_NO_SLURM_HINT}")
    return path


def _run(argv: Sequence[str], *, stdin: str | None = None, env: Mapping[str, str] | None = None,
         cwd: str | os.PathLike | None = None,
         timeout: float = _COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess:
    _require(argv[0])
    try:
        return subprocess.run(list(argv), check=False, input=stdin, capture_output=True, text=True,
                              env=None if env is None else dict(env), cwd=cwd, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise UserError(f"{argv[0]} did not answer within {timeout:.0f} s: is slurmctld up? "
                        f"(scontrol ping)") from None


def _last_error_line(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    line = (errors or lines or ["(no message)"])[-1]
    line = re.sub(r"^(sbatch|srun|salloc|scontrol|scancel|squeue|sacct):\s*", "", line)
    line = re.sub(r"^error:\s*", "", line)
    return re.sub(r"^Batch job submission failed:\s*", "", line)


_SBATCH_HINTS = (
    ("More processors requested than permitted",
     ("ask for fewer tasks or CPUs per task per node, or more nodes; sinfo -o '%P %D %c' "
      "lists each partition's nodes and CPUs")),
    ("Requested node configuration is not available",
     ("no node has the CPUs, memory, GPUs or features asked for; sinfo -o '%P %D %c %m %G %f' "
      "lists what the nodes have")),
    ("Node count specification invalid",
     "ask for no more nodes than the partition has (sinfo -o '%P %D')"),
    ("Invalid generic resource (gres) specification",
     ("the partition has no such GPUs or generic resources: drop --gpus*/--gres, or choose a "
      "partition that has them (sinfo -o '%P %G')")),
    ("Invalid partition name specified",
     "choose a partition that exists (sinfo -s lists them)"),
    ("Invalid account or account/partition combination specified",
     "pass an account you may use with --account (sacctmgr show assoc user=$USER)"),
    ("Requested time limit is invalid",
     "ask for a shorter --time, within the partition's limit (sinfo -o '%P %l')"),
    ("Job violates accounting/QOS policy",
     "the request exceeds your account's or QOS's limits (sacctmgr show qos); ask for less"),
    ("Unable to contact slurm controller",
     "slurmctld cannot be reached: check that Slurm runs (scontrol ping)"),
    ("Invalid job array specification",
     "write --array as a range such as 0-7 or 0-7%2, within MaxArraySize"),
)


def sbatch_error(stderr: str, argv: Sequence[str] = ()) -> UserError:
    """The one-line UserError for an sbatch that rejected its job, from sbatch's stderr."""
    message = _last_error_line(stderr)
    hint = next((h for key, h in _SBATCH_HINTS if key.lower() in message.lower()),
                "fix the request and submit again")
    asked = " ".join(a for a in argv[1:] if a.startswith("--") and not a.startswith(
        ("--parsable", "--wrap", "--output", "--job-name")))
    where = f" ({asked})" if asked else ""
    return UserError(f"sbatch rejected the job{where}: {message}; {hint}")


def parse_sbatch_parsable(stdout: str) -> str:
    """Job id from ``sbatch --parsable`` output (``1234`` or ``1234;cluster``)."""
    for line in stdout.splitlines():
        line = line.strip()
        if line:
            job_id = line.split(";")[0].strip()
            if re.fullmatch(r"\d+", job_id):
                return job_id
    raise ValueError(f"no job id in sbatch output: {stdout!r}")


def submit(script: str | os.PathLike | Sequence[str], options: SbatchOptions = SbatchOptions(),
           script_args: Sequence[str] = (), *, env: Mapping[str, str] | None = None,
           cwd: str | os.PathLike | None = None) -> str:
    """Submit a batch job; returns its job id (the array job id for job arrays).

    ``script``: the text of a batch script (a ``str`` starting with ``#!``), the path of
    a script file (``os.PathLike``, with ``script_args``), or a command (a list of
    arguments, run through ``--wrap``). ``options``: :class:`SbatchOptions`.
    Raises UserError when sbatch is missing or rejects the job.
    """
    stdin = None
    if isinstance(script, str):
        if not script.startswith("#!"):
            raise ValueError("submit: script text must start with '#!' "
                             "(pass a Path for a script file or a list for a command)")
        argv = sbatch_argv(options)
        stdin = script
    elif isinstance(script, os.PathLike):
        argv = sbatch_argv(options, script, script_args)
    else:
        argv = sbatch_argv(options, wrap=list(script))
    result = _run(argv, stdin=stdin, env=env, cwd=cwd)
    if result.returncode != 0:
        raise sbatch_error(result.stderr, argv)
    return parse_sbatch_parsable(result.stdout)


# ----------------------------------------------------------------------------- job states

@dataclass(frozen=True)
class JobState:
    """State of one job, or of one task of a job array."""

    job_id: str  # the id sbatch returned (the array job id for array tasks)
    array_task: int | None
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ... or UNKNOWN
    reason: str  # Slurm's reason ("None", "Resources", "NonZeroExitCode", ...); "" if unknown
    exit_code: int | None  # exit status of the batch script; None until known
    signal: int = 0  # signal that ended it, 0 if none
    derived_exit_code: int | None = None  # highest exit code of the job's steps, if known

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def key(self) -> str:
        return self.job_id if self.array_task is None else f"{self.job_id}_{self.array_task}"


_KEY = re.compile(r"(?:^|\s)([A-Za-z][\w/:.]*)=")


def parse_key_values(line: str) -> dict[str, str]:
    """``Key=Value Key2=Value with spaces ...`` (scontrol -o, jobcomp/filetxt) as a dict."""
    matches = list(_KEY.finditer(line))
    fields: dict[str, str] = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        fields[match.group(1)] = line[match.end():end].strip()
    return fields


def _exit_pair(text: str | None) -> tuple[int | None, int]:
    if not text:
        return None, 0
    match = re.fullmatch(r"\s*(\d+)(?::(\d+))?\s*", text)
    if not match:
        return None, 0
    return int(match.group(1)), int(match.group(2) or 0)


def _expand_tasks(text: str) -> list[int | None]:
    """Array task ids from ``3``, ``0-2``, ``1,4-5%2``; [None] for a job that is no array."""
    text = (text or "").split("%")[0].strip().strip("[]")
    if not text or text in {"N/A", "(null)"}:
        return [None]
    tasks: list[int | None] = []
    for part in text.split(","):
        part = part.split(":")[0]  # step syntax 0-10:2 keeps its range
        if "-" in part:
            lo, hi = part.split("-", 1)
            tasks.extend(range(int(lo), int(hi) + 1))
        elif part:
            tasks.append(int(part))
    return tasks or [None]


def _state_word(text: str) -> str:
    # sacct writes "CANCELLED by 0"; some versions add '+' to truncated names
    return (text or "UNKNOWN").split()[0].rstrip("+").upper()


def _record_state(fields: Mapping[str, str], reason_key: str | None = "Reason") -> list[JobState]:
    array_job = fields.get("ArrayJobId")
    job_id = array_job if array_job and array_job not in {"N/A", "0"} else fields.get("JobId", "")
    tasks = _expand_tasks(fields.get("ArrayTaskId", "")) if job_id == array_job else [None]
    exit_code, sig = _exit_pair(fields.get("ExitCode"))
    derived, _ = _exit_pair(fields.get("DerivedExitCode"))
    state = _state_word(fields.get("JobState", ""))
    if state == "PENDING":
        exit_code = None
    reason = fields.get(reason_key, "") if reason_key else ""
    return [JobState(job_id=job_id, array_task=task, state=state, reason=reason,
                     exit_code=exit_code, signal=sig, derived_exit_code=derived)
            for task in tasks]


def parse_scontrol_jobs(text: str) -> list[JobState]:
    """States from ``scontrol show job -o`` (one job record per line)."""
    states: list[JobState] = []
    for line in text.splitlines():
        if line.strip().startswith("JobId="):
            states.extend(_record_state(parse_key_values(line)))
    return states


def parse_jobcomp(text: str, job_ids: Iterable[str] | None = None) -> list[JobState]:
    """States from a ``jobcomp/filetxt`` log, for ``job_ids`` (job or array job ids) or all.

    That log has no reason; a job listed twice (requeued) keeps its last line.
    """
    wanted = None if job_ids is None else {str(j) for j in job_ids}
    latest: dict[tuple[str, int | None], JobState] = {}
    for line in text.splitlines():
        if not line.startswith("JobId="):
            continue
        fields = parse_key_values(line)
        if wanted is not None and fields.get("JobId") not in wanted \
                and fields.get("ArrayJobId") not in wanted:
            continue
        for state in _record_state(fields, reason_key=None):
            if wanted is not None and state.job_id not in wanted:
                # a plain job queried by the id of one array task
                state = JobState(fields.get("JobId", ""), None, state.state, state.reason,
                                 state.exit_code, state.signal, state.derived_exit_code)
            latest[(state.job_id, state.array_task)] = state
    return list(latest.values())


SACCT_FIELDS = "JobID,JobIDRaw,State,Reason,ExitCode,DerivedExitCode"


def parse_sacct(text: str) -> list[JobState]:
    """States from ``sacct -X -n -P -o JobID,JobIDRaw,State,Reason,ExitCode,DerivedExitCode``."""
    states: list[JobState] = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 6 or not parts[0]:
            continue
        job, _raw, state, reason, exit_text, derived_text = parts[:6]
        if "." in job:  # a step line (when -X was not given)
            continue
        exit_code, sig = _exit_pair(exit_text)
        derived, _ = _exit_pair(derived_text)
        if "_" in job:
            job_id, task_text = job.split("_", 1)
            tasks = _expand_tasks(task_text)
        else:
            job_id, tasks = job, [None]
        word = _state_word(state)
        for task in tasks:
            states.append(JobState(job_id, task, word, reason,
                                   None if word == "PENDING" else exit_code, sig, derived))
    return states


def parse_scontrol_config(text: str) -> dict[str, str]:
    """``scontrol show config`` as a dict (``Key = Value`` lines)."""
    config: dict[str, str] = {}
    for line in text.splitlines():
        if " = " in line:
            key, value = line.split(" = ", 1)
            config[key.strip()] = value.strip()
    return config


def _finished_elsewhere(job_ids: list[str]) -> list[JobState]:
    """States of jobs that slurmctld forgot: sacct, else the jobcomp/filetxt log."""
    config = parse_scontrol_config(_run(["scontrol", "show", "config"]).stdout)
    if config.get("AccountingStorageType", "accounting_storage/none") != "accounting_storage/none" \
            and shutil.which("sacct"):
        result = _run(["sacct", "-X", "-n", "-P", "-j", ",".join(job_ids), "-o", SACCT_FIELDS])
        if result.returncode == 0:
            return parse_sacct(result.stdout)
    if config.get("JobCompType") == "jobcomp/filetxt":
        try:
            text = Path(config.get("JobCompLoc", "")).read_text(errors="replace")
        except OSError:
            return []
        return parse_jobcomp(text, job_ids)
    return []


def job_states(job_ids: Iterable[str]) -> list[JobState]:
    """Current states of ``job_ids`` (array jobs give one entry per task).

    A job that no source knows any more comes back as ``UNKNOWN``.
    """
    ids = [str(j).strip() for j in job_ids]
    states: list[JobState] = []
    missing: list[str] = []
    for job_id in ids:
        result = _run(["scontrol", "show", "job", "-o", job_id])
        found = parse_scontrol_jobs(result.stdout) if result.returncode == 0 else []
        if found:
            states.extend(found)
        elif result.returncode == 0 or "invalid job id" in result.stderr.lower():
            missing.append(job_id)
        else:
            raise UserError(f"scontrol show job {job_id} failed: {_last_error_line(result.stderr)}"
                            f"; check that Slurm runs (scontrol ping)")
    if missing:
        found = _finished_elsewhere(missing)
        states.extend(found)
        known = {s.job_id for s in found}
        states.extend(JobState(j, None, "UNKNOWN", "no longer known to slurmctld, no accounting",
                               None) for j in missing if j not in known)
    return states


def cluster_name() -> str:
    """``ClusterName`` of ``scontrol show config`` ("" when not set)."""
    result = _run(["scontrol", "show", "config"])
    if result.returncode != 0:
        raise UserError(f"scontrol show config failed: {_last_error_line(result.stderr)}; check that Slurm runs "
                        f"(scontrol ping)")
    return parse_scontrol_config(result.stdout).get("ClusterName", "")


_SRUN_EXIT = re.compile(r"tasks? [\d,\-]+: Exited with exit code (\d+)")
_SRUN_SIGNAL = re.compile(r"tasks? [\d,\-]+: (Killed|Terminated|Segmentation fault|Aborted)")


def step_outcome(srun_output: str) -> dict:
    """State, exit code and reason of a job step that failed, from what srun printed.

    Slurm keeps the final state of a step only in accounting (sacct); srun's own lines
    (``srun: error: NODE: task 1: Exited with exit code 1``, ``...: Killed``,
    ``STEP ... CANCELLED``) say the same where there is none.
    """
    lines = [ln.strip() for ln in srun_output.splitlines() if ln.strip().startswith(("srun:", "slurmstepd"))]
    text = "\n".join(lines)
    codes = [int(c) for c in _SRUN_EXIT.findall(text)]
    # --kill-on-bad-exit cancels the step's other tasks when one fails: a task's own exit
    # code makes the step FAILED, as sacct reports it
    state, exit_code = "FAILED", None
    if "DUE TO TIME LIMIT" in text:
        state = "TIMEOUT"
    elif "oom-kill" in text.lower() or "out of memory" in text.lower():
        state = "OUT_OF_MEMORY"
    elif "CANCELLED" in text and not any(codes):
        state = "CANCELLED"
    if codes:
        exit_code = max(codes)
    elif _SRUN_SIGNAL.search(text):
        exit_code = 128 + 9
    errors = [ln for ln in lines if "error" in ln.lower()]
    reason = re.sub(r"^srun:\s*(error:\s*)?", "", errors[0]) if errors else ("NonZeroExitCode" if codes else "")
    return {"state": state, "exit_code": exit_code, "reason": reason}


def failed_step(job_dir: Path, job_id: str | None) -> dict:
    """The ``slurm`` record field of a step that failed: ids from the ranks' placement files,
    state from sacct when the cluster keeps accounting, else from srun's output."""
    ids: dict = {"job_id": job_id, "step_id": None}
    for place in sorted(Path(job_dir).glob("placement-*.json")):
        try:
            info = json.loads(place.read_text())
        except (OSError, ValueError):
            continue
        ids = {"job_id": info.get("slurm_job_id") or job_id, "step_id": info.get("slurm_step_id")}
        break
    output = ""
    for log in sorted(Path(job_dir).glob("agent-*.log")):
        try:
            output += log.read_text(errors="replace")
        except OSError:
            pass
    outcome = step_outcome(output)
    if ids["job_id"] and ids["step_id"] is not None and shutil.which("sacct"):
        result = subprocess.run(["sacct", "-n", "-P", "-j", f"{ids['job_id']}.{ids['step_id']}", "-o",
                                 "State,ExitCode"], check=False, capture_output=True, text=True,
                                timeout=_COMMAND_TIMEOUT_S)
        first = result.stdout.strip().splitlines()[:1] if result.returncode == 0 else []
        if first and "|" in first[0]:
            state, exit_text = first[0].split("|")[:2]
            code, _ = _exit_pair(exit_text)
            outcome.update(state=_state_word(state), exit_code=code if code is not None else outcome["exit_code"])
    return {**ids, **outcome}


def cancel(job_ids: Iterable[str]) -> None:
    """``scancel`` the jobs; jobs that already ended are no error."""
    ids = [str(j) for j in job_ids]
    if not ids:
        return
    result = _run(["scancel", *ids])
    if result.returncode != 0:
        errors = [ln for ln in result.stderr.splitlines()
                  if ln.strip() and "already completing or completed" not in ln]
        if errors:
            raise UserError(f"scancel {' '.join(ids)} failed: {_last_error_line(chr(10).join(errors))}")


def hopeless(state: JobState) -> str | None:
    """Why a pending job can never start, or None."""
    if state.state != "PENDING":
        return None
    return HOPELESS_REASONS.get(state.reason)


def wait_for(job_ids: Iterable[str], poll_s: float = 2.0,
             on_update: Callable[[list[JobState]], None] | None = None, *,
             timeout_s: float | None = None,
             states: Callable[[list[str]], list[JobState]] | None = None) -> list[JobState]:
    """Poll until every job (every array task) has ended; returns their final states.

    ``on_update(states)`` is called with all states whenever one of them changes. A
    job pending for a reason that can never resolve (see ``HOPELESS_REASONS``) raises
    UserError; ``timeout_s`` passing raises TimeoutError (the jobs are left as they are).
    ``states`` replaces :func:`job_states` (for tests).
    """
    ids = [str(j) for j in job_ids]
    read = states or job_states
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    last: tuple | None = None
    while True:
        current = read(ids)
        signature = tuple((s.key, s.state, s.reason) for s in current)
        if signature != last:
            last = signature
            if on_update is not None:
                on_update(current)
        for s in current:
            why = hopeless(s)
            if why:
                raise UserError(f"Slurm job {s.key} can never start ({s.reason}: {why}): cancel it "
                                f"(scancel {s.job_id}) and submit a smaller request")
        if current and all(s.done or s.state == "UNKNOWN" for s in current):
            return current
        if deadline is not None and time.monotonic() > deadline:
            pending = ", ".join(f"{s.key} {s.state}" for s in current if not s.done)
            raise TimeoutError(f"Slurm jobs still not finished after {timeout_s:.0f} s ({pending})")
        time.sleep(poll_s)
