"""Where ranks run: cluster specs, and an emulated multi-node cluster on one machine.

``spec`` is pure Python; ``emulated`` and ``launcher`` need root, ``ip`` and ``tc``
only when a cluster is started.  Nothing here imports torch.
"""

from .emulated import EmulatedCluster, cleanup_leftovers, list_clusters
from .launcher import TorchrunResult, run_torchrun
from .spec import ClusterSpec, check_world, parse_cluster

__all__ = [
    "ClusterSpec",
    "EmulatedCluster",
    "TorchrunResult",
    "check_world",
    "cleanup_leftovers",
    "list_clusters",
    "parse_cluster",
    "run_torchrun",
]
