"""The options that say where a command's ranks run (``--launcher``, ``--cluster``...)."""

from __future__ import annotations

import shlex
import sys

from plexus_tune.cli.options import count
from plexus_tune.errors import UserError
from plexus_tune.launch.launchers import LAUNCHERS, make_launcher


def add_launcher_arguments(parser) -> None:
    group = parser.add_argument_group("where the ranks run")
    group.add_argument("--launcher", choices=LAUNCHERS, default=None,
                       help="local processes (default), slurm (default inside an allocation: one srun step per "
                            "run), torchrun (one agent per --hosts host) or emulated (an emulated cluster, --cluster)")
    group.add_argument("--cluster", metavar="SPEC",
                       help="emulated cluster, e.g. emulated:nodes=2,ranks_per_node=4,inter_gbps=0.5,"
                            "inter_latency_us=200 (GB/s and µs per node link; needs root); implies --launcher emulated")
    group.add_argument("--hosts", help="comma-separated node hosts for --launcher torchrun (the first hosts the rendezvous)")
    group.add_argument("--ranks-per-node", type=count(1), default=None, help="ranks per node for torchrun or slurm")
    group.add_argument("--oversubscribe", action="store_true",
                       help="start ranks on this host beyond its cores x 8 or its available memory (refused otherwise)")
    batch = parser.add_argument_group(
        "slurm outside an allocation",
        "with --launcher slurm on a login node the command submits one batch job that runs it inside the "
        "allocation (one srun step per run), prints the job id, waits and reports each run as it is logged; "
        "re-running it resumes (docs/architecture.md, Slurm dispatch)")
    batch.add_argument("--partition", help="sbatch --partition")
    batch.add_argument("--account", help="sbatch --account")
    batch.add_argument("--time", dest="time_limit", metavar="TIME", help="sbatch --time, e.g. 00:30:00")
    batch.add_argument("--sbatch-arg", action="append", default=[], metavar="ARG",
                       help="further sbatch option, passed as written (repeatable), e.g. --sbatch-arg=--qos=debug")
    batch.add_argument("--resume", metavar="JOBIDS",
                       help="wait for and collect these submitted jobs (comma-separated) instead of those in LOG.slurm/jobs.json")
    batch.add_argument("--no-wait", action="store_true", help="submit and return; re-run the command later to collect")


def launcher_from_args(args, world_sizes=()):
    """The launcher the options ask for, checked against every world size it will run."""
    if args.ranks_per_node is not None and args.ranks_per_node < 1:
        raise UserError(f"--ranks-per-node must be at least 1, got {args.ranks_per_node}")
    asked = [flag for flag, value in (("--partition", getattr(args, "partition", None)),
                                      ("--account", getattr(args, "account", None)),
                                      ("--time", getattr(args, "time_limit", None)),
                                      ("--sbatch-arg", getattr(args, "sbatch_arg", None)),
                                      ("--resume", getattr(args, "resume", None)),
                                      ("--no-wait", getattr(args, "no_wait", None))) if value]
    try:
        submit_options = {"partition": getattr(args, "partition", None), "account": getattr(args, "account", None),
                          "time_limit": getattr(args, "time_limit", None),
                          "extra": [a for arg in getattr(args, "sbatch_arg", None) or [] for a in shlex.split(arg)]}
        launcher = make_launcher(args.launcher, cluster=args.cluster, hosts=args.hosts,
                                 ranks_per_node=args.ranks_per_node, submit_options=submit_options)
        launcher.oversubscribe = bool(getattr(args, "oversubscribe", False))
        worlds = world_sizes if isinstance(world_sizes, range) else sorted(set(world_sizes))
        if len(worlds):
            launcher.check(int(worlds[-1]))  # the largest first: a size the host cannot hold is refused at once
        for world in worlds:
            launcher.check(int(world))
        if asked and not submits(launcher):
            raise UserError(f"{', '.join(asked)}: only for --launcher slurm outside an allocation (the batch job it submits); "
                            f"here the ranks start as {launcher.name!r}" + (" inside the allocation (use salloc/sbatch options)" if launcher.name == "slurm" else ""))
    except UserError as exc:
        if exc.parameter == "oversubscribe":  # the host's limits, not the launcher options
            raise
        raise UserError(f"--launcher/--cluster: {exc}") from None
    return launcher


def submits(launcher) -> bool:
    """Whether the command submits itself as a Slurm batch job instead of starting ranks."""
    return getattr(launcher, "name", None) == "slurm" and not launcher.inside


#: options of the outside only: the batch job's command runs without them
SUBMIT_OPTIONS = ("--partition", "--account", "--time", "--sbatch-arg", "--resume", "--workers")
SUBMIT_FLAGS = ("--no-wait",)


def command_argv(args) -> list[str]:
    """The command line (after ``plexus-tune``) for the batch job: as given, less the options that
    shape the submission (abbreviations too)."""
    argv = list(getattr(args, "argv", None) or sys.argv[1:])

    def match(arg: str, names) -> str | None:
        flag = arg.split("=", 1)[0]
        hits = [n for n in names if len(flag) > 3 and n.startswith(flag)]
        return hits[0] if len(hits) == 1 else (flag if flag in names else None)

    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--":
            out.append(arg)
            continue
        if arg.startswith("--") and match(arg, SUBMIT_FLAGS):
            continue
        if arg.startswith("--") and match(arg, SUBMIT_OPTIONS):
            skip = "=" not in arg
            continue
        out.append(arg)
    return out
