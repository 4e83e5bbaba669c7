"""Statistics of a graph and of its shard files: sizes, degrees and the 2D load balance
(``plexus-tune graph stats``)."""

from __future__ import annotations

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.graph.permute import balance_report
from plexus_tune.graph.shards import read_manifest


def graph_statistics(graph, blocks, modes, seed: int = 0) -> dict:
    """Sizes, degrees, symmetry and, per permutation of ``modes``, the nonzeros of A + I per block of
    a ``blocks`` grid (:func:`plexus_tune.graph.permute.balance_report`)."""
    degree = np.diff(graph.adjacency.indptr)
    out = {
        "name": graph.name,
        "nodes": graph.num_nodes,
        "edges": graph.num_edges,
        "nnz": graph.nnz,
        "nnz_normalized": graph.nnz + int(np.count_nonzero(graph.adjacency.diagonal() == 0)),
        "features": graph.num_features,
        "classes": graph.num_classes,
        "symmetric": bool(graph.meta.get("symmetric", False)),
        "degree_min": int(degree.min()) if degree.size else 0,
        "degree_mean": float(degree.mean()) if degree.size else 0.0,
        "degree_max": int(degree.max()) if degree.size else 0,
        "isolated_nodes": int(np.count_nonzero(degree == 0)),
        "blocks": list(blocks),
        "balance": {},
    }
    for mode in modes:
        report = balance_report(graph.adjacency, blocks, mode, seed)
        out["balance"][mode] = {k: report[k] for k in ("max_over_mean", "max_nnz", "mean_nnz", "min_nnz", "block_nnz")}
    return out


def shard_statistics(path, blocks) -> dict:
    """The load balance of a shard directory on a ``blocks`` grid that divides its files' grid (from the manifest)."""
    manifest = read_manifest(path)
    fr, fc = manifest["blocks"]
    rb, cb = blocks
    if fr % rb or fc % cb:
        raise UserError(f"block grid {rb}x{cb} does not divide the {fr}x{fc} shard files; "
                        f"use sizes dividing {fr} and {fc}")
    counts = np.asarray(manifest["block_nnz"], dtype=np.int64).reshape(rb, fr // rb, cb, fc // cb).sum(axis=(1, 3))
    mean = counts.sum() / counts.size
    return {
        "name": manifest["name"],
        "nodes": manifest["num_nodes"],
        "nodes_padded": manifest["num_nodes_padded"],
        "nnz_normalized": manifest["nnz"],
        "file_blocks": [fr, fc],
        "permutation": manifest["permutation"],
        "blocks": [rb, cb],
        "block_shape": [manifest["num_nodes_padded"] // rb, manifest["num_nodes_padded"] // cb],
        "max_over_mean": float(counts.max() / mean) if mean else float("nan"),
        "block_nnz": counts.tolist(),
    }
