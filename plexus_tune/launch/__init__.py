"""Start ``torch.distributed`` process sets: on this host, on an emulated cluster, under
torchrun or Slurm (see docs/architecture.md, "Launchers").

Every command that starts ranks takes a :class:`~plexus_tune.launch.launchers.Launcher`;
ranks started by an external agent run :mod:`plexus_tune.launch.worker`.
"""

from __future__ import annotations

from plexus_tune.launch.local import (  # noqa: F401
    DEFAULT_TIMEOUT_S,
    DistEnv,
    RankFailure,
    default_threads_per_rank,
    detect_environment,
    free_port,
    launch_local,
    run_in_environment,
)
