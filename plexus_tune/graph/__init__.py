"""Graph data for GCN training: the :class:`Graph` container, GCN normalization,
synthetic generators, loaders and the project's own on-disk format, random
permutations with a load-balance report, and 2D shard files for parallel loading.

Orientation: row v of an adjacency holds v's in-neighbours (edge u -> v is ``A[v, u]``).

The names below load their module when first used, so that importing one graph module
(as the model does) does not load scipy through the others."""

from __future__ import annotations

import importlib

#: Public name -> the module that defines it.
_HOMES = {
    # core
    "Graph": "core", "adjacency_to_edge_index": "core", "as_csr": "core", "edge_index_to_adjacency": "core",
    "gcn_normalize": "core", "is_symmetric": "core",
    # generators
    "GENERATORS": "generators", "degree_labels": "generators", "generate": "generators",
    "grid2d_adjacency": "generators", "parse_spec": "generators", "random_features": "generators",
    "rmat_adjacency": "generators", "synthetic": "generators",
    # io
    "FORMATS": "io", "detect_format": "io", "load_graph": "io", "resolve_graph": "io", "save_graph": "io",
    # permute
    "PERMUTE_MODES": "permute", "TWO_SIDED_MODES": "permute", "balance_report": "permute",
    "block_nnz": "permute", "double_permute": "permute", "grid_parts": "permute",
    "invert_permutation": "permute", "local_permutation": "permute", "make_permutation": "permute",
    "parse_blocks": "permute", "permutations_for": "permute", "inverse_permutations_for": "permute", "permute_matrix": "permute",
    "permute_rows": "permute", "unpermute_rows": "permute",
    # shards
    "load_node_rows": "shards", "load_permutations": "shards", "load_shard": "shards",
    "load_shard_range": "shards", "read_manifest": "shards", "shard_bounds": "shards",
    "write_shards": "shards",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_HOMES))
