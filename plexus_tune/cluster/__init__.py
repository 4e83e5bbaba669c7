"""Where ranks run: cluster specs, and an emulated multi-node cluster on one machine.

``spec`` is pure Python; ``emulated`` needs root, ``ip`` and ``tc`` only when a cluster
is started (its torchrun agents start from :mod:`plexus_tune.launch.emulated`).  Nothing
here imports torch.
"""

from .emulated import EmulatedCluster, cleanup_leftovers, list_clusters
from .spec import ClusterSpec, check_world, parse_cluster

__all__ = [
    "ClusterSpec",
    "EmulatedCluster",
    "check_world",
    "cleanup_leftovers",
    "list_clusters",
    "parse_cluster",
]
