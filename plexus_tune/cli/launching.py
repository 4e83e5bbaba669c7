"""The options that say where a command's ranks run (``--launcher``, ``--cluster``...)."""

from __future__ import annotations

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
    group.add_argument("--ranks-per-node", type=int, default=None, help="ranks per node for torchrun or slurm")


def launcher_from_args(args, world_sizes=()):
    """The launcher the options ask for, checked against every world size it will run."""
    if args.ranks_per_node is not None and args.ranks_per_node < 1:
        raise UserError(f"--ranks-per-node must be at least 1, got {args.ranks_per_node}")
    try:
        launcher = make_launcher(args.launcher, cluster=args.cluster, hosts=args.hosts,
                                 ranks_per_node=args.ranks_per_node)
        for world in world_sizes:
            launcher.check(int(world))
    except UserError as exc:
        raise UserError(f"--launcher/--cluster: {exc}") from None
    return launcher
