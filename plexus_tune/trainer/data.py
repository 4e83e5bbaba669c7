"""The graph a rank trains on: normalized once per process, then cut into its blocks.

:class:`MemoryData` holds the whole graph on every rank and cuts the permuted blocks;
:class:`ShardData` reads only the 2D shard files that cover a rank's blocks
(``plexus-tune graph shard``). Both give blocks of A_hat[perm_r][:, perm_c] (or of its
alternate layout, by parity) and the matching feature and label rows (docs/trainer.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from plexus_tune.graph import TWO_SIDED_MODES, gcn_normalize, grid_parts, permutations_for, permute_matrix
from plexus_tune.graph.shards import (
    load_node_rows,
    load_permutations,
    load_shard_range,
    read_manifest,
)
from plexus_tune.trainer.tensors import take_block


@dataclass
class PreparedGraph:
    """The normalized adjacency, features and labels, loaded once per process."""

    adjacency: sp.csr_matrix  # normalized (self-loops added), float32
    features: np.ndarray
    labels: np.ndarray
    num_classes: int
    name: str
    raw_nnz: int

    @property
    def nodes(self) -> int:
        return int(self.adjacency.shape[0])


def prepare_graph(graph) -> PreparedGraph:
    return PreparedGraph(
        adjacency=gcn_normalize(graph.adjacency),
        features=np.asarray(graph.features, dtype=np.float32),
        labels=np.asarray(graph.labels, dtype=np.int64),
        num_classes=int(graph.num_classes),
        name=str(graph.name),
        raw_nnz=int(graph.nnz),
    )


def clip_block(block_, n: int) -> tuple[int, int]:
    """[start, stop) of a block cut to the first ``n`` rows."""
    return max(0, min(block_.start, n)), max(0, min(block_.stop, n))


def _pad_rows(part: sp.csr_matrix, rows: int, cols: int) -> sp.csr_matrix:
    part = sp.csr_matrix(part)
    indptr = np.concatenate([part.indptr, np.full(rows - part.shape[0], part.indptr[-1], dtype=part.indptr.dtype)])
    return sp.csr_matrix((part.data, part.indices, indptr), shape=(rows, cols))


class MemoryData:
    """Blocks of the permuted graph from a whole graph held by every rank."""

    def __init__(self, pg: PreparedGraph, permute: str, seed: int, grid=(1, 1, 1)):
        """``grid``: the splits the ``local`` permutation keeps balanced (graph/permute)."""
        self.pg = pg
        self.nodes, self.num_classes, self.name = pg.nodes, pg.num_classes, pg.name
        self.num_features = int(pg.features.shape[1])
        self.nnz, self.raw_nnz = int(pg.adjacency.nnz), pg.raw_nnz
        self.permute = permute
        self.perms = permutations_for(permute, self.nodes, seed, parts=grid_parts(grid))
        perm_r, perm_c = self.perms
        self.permuted = {0: permute_matrix(pg.adjacency, perm_r, perm_c)}
        self.permuted[1] = self.permuted[0] if permute == "none" else permute_matrix(pg.adjacency, perm_c, perm_r)

    def adjacency_block(self, parity: int, rows, cols) -> sp.csr_matrix:
        """Rows x columns of A[out_perm][:, in_perm] (parity 0: (perm_r, perm_c); 1: (perm_c, perm_r)), zero padded."""
        return take_block(self.permuted[parity], rows, cols)

    def feature_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of X[perm_c] (zeros past N)."""
        out = np.zeros((stop - start, self.num_features), dtype=np.float32)
        lo, hi = max(0, min(start, self.nodes)), max(0, min(stop, self.nodes))
        out[: hi - lo] = self.pg.features[self.perms[1][lo:hi]]
        return out

    def label_rows(self, parity: int, start: int, stop: int) -> np.ndarray:
        """Labels of rows [start, stop) in the output order of a layer of this parity (-1 past N)."""
        perm = self.perms[0] if parity == 0 else self.perms[1]
        out = np.full(stop - start, -1, dtype=np.int64)
        lo, hi = max(0, min(start, self.nodes)), max(0, min(stop, self.nodes))
        out[: hi - lo] = self.pg.labels[perm[lo:hi]]
        return out


class ShardData:
    """Blocks of the permuted graph read from a directory of 2D shard files: each rank
    reads only the files that cover its blocks (``plexus-tune graph shard`` writes them).

    The files store B = A_hat[perm_r][:, perm_c]; the alternate layout A_hat[perm_c][:, perm_r]
    is B^T for a symmetric graph, and B itself for the single and no permutations.
    """

    def __init__(self, directory):
        self.dir = directory
        self.manifest = read_manifest(directory)
        m = self.manifest
        node_data = m.get("node_data") or {}
        if not node_data:
            raise ValueError(f"{directory}: shards written without features and labels cannot be trained on")
        self.nodes, self.nnz = int(m["num_nodes"]), int(m["nnz"])
        self.raw_nnz = None
        self.num_features, self.num_classes = int(node_data["num_features"]), int(node_data["num_classes"])
        self.name = str(m.get("name", "shards"))
        self.permute = m["permutation"]["mode"]
        self.symmetric = bool(m.get("symmetric"))
        if self.permute in TWO_SIDED_MODES and not self.symmetric:
            raise ValueError(f"{directory}: {self.permute}-permuted shards of a directed graph lack the alternate "
                             "layout; shard it with a single permutation or none")
        self.perms = load_permutations(directory)

    def _range(self, rows, cols) -> sp.csr_matrix:
        r0, r1 = clip_block(rows, self.nodes)
        c0, c1 = clip_block(cols, self.nodes)
        part = load_shard_range(self.dir, (r0, r1), (c0, c1), manifest=self.manifest)
        return _pad_rows(part, rows.size, cols.size)

    def adjacency_block(self, parity: int, rows, cols) -> sp.csr_matrix:
        if parity == 0 or self.permute not in TWO_SIDED_MODES:
            return self._range(rows, cols)
        return self._range(cols, rows).T.tocsr()

    def feature_rows(self, start: int, stop: int) -> np.ndarray:
        feats, _ = load_node_rows(self.dir, start, stop, perm="col")
        return np.asarray(feats, dtype=np.float32)

    def label_rows(self, parity: int, start: int, stop: int) -> np.ndarray:
        _, labels = load_node_rows(self.dir, start, stop, perm="row" if parity == 0 else "col")
        return np.asarray(labels, dtype=np.int64)


def is_shard_directory(source) -> bool:
    """Whether ``source`` is a directory with a ``manifest.json`` (read and checked by
    :func:`plexus_tune.graph.shards.read_manifest`, which refuses one of another kind)."""
    if not isinstance(source, (str, os.PathLike)):
        return False
    return (Path(source) / "manifest.json").is_file()

