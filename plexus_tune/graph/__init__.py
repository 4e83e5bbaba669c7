"""Graph data for GCN training: the :class:`Graph` container, GCN normalization,
synthetic generators, loaders and the project's own on-disk format, random
permutations with a load-balance report, and 2D shard files for parallel loading.

Orientation: row v of an adjacency holds v's in-neighbours (edge u -> v is ``A[v, u]``).
"""

from plexus_tune.graph.core import (
    Graph,
    adjacency_to_edge_index,
    as_csr,
    edge_index_to_adjacency,
    gcn_normalize,
    is_symmetric,
)
from plexus_tune.graph.generators import (
    GENERATORS,
    degree_labels,
    generate,
    grid2d_adjacency,
    parse_spec,
    random_features,
    rmat_adjacency,
    synthetic,
)
from plexus_tune.graph.io import FORMATS, detect_format, load_graph, resolve_graph, save_graph
from plexus_tune.graph.shards import (
    load_node_rows,
    load_permutations,
    load_shard,
    load_shard_range,
    read_manifest,
    shard_bounds,
    write_shards,
)
from plexus_tune.graph.permute import (
    PERMUTE_MODES,
    TWO_SIDED_MODES,
    balance_report,
    block_nnz,
    double_permute,
    grid_parts,
    invert_permutation,
    local_permutation,
    make_permutation,
    parse_blocks,
    permutations_for,
    permute_matrix,
    permute_rows,
    unpermute_rows,
)

__all__ = [
    "FORMATS",
    "detect_format",
    "load_graph",
    "resolve_graph",
    "save_graph",
    "GENERATORS",
    "PERMUTE_MODES",
    "TWO_SIDED_MODES",
    "Graph",
    "adjacency_to_edge_index",
    "as_csr",
    "balance_report",
    "block_nnz",
    "degree_labels",
    "double_permute",
    "grid_parts",
    "local_permutation",
    "edge_index_to_adjacency",
    "gcn_normalize",
    "generate",
    "grid2d_adjacency",
    "invert_permutation",
    "is_symmetric",
    "make_permutation",
    "parse_blocks",
    "parse_spec",
    "permutations_for",
    "permute_matrix",
    "permute_rows",
    "random_features",
    "rmat_adjacency",
    "synthetic",
    "unpermute_rows",
    "load_node_rows",
    "load_permutations",
    "load_shard",
    "load_shard_range",
    "read_manifest",
    "shard_bounds",
    "write_shards",
]
