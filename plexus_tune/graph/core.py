"""The in-memory graph and GCN normalization.

Orientation convention (used everywhere in :mod:`plexus_tune.graph`): the adjacency is
stored with one row per *target* node. A directed edge ``u -> v`` (PyG ``edge_index``
column ``(u, v)`` with the default ``source_to_target`` flow) is the entry ``A[v, u]``,
so row ``v`` lists the in-neighbours of ``v`` and the aggregation ``A @ X`` sums the
features of in-neighbours, exactly as PyG's ``GCNConv`` does. Undirected graphs store
both directions, so ``A`` is symmetric.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Graph:
    """A node-classification graph.

    ``adjacency`` is the raw (unnormalized) N x N CSR matrix, row v holding v's
    in-neighbours; ``features`` float32 (N, F); ``labels`` int64 (N,) in
    ``[0, num_classes)``; ``meta`` free-form provenance (generator, seed, source file).
    """

    adjacency: sp.csr_matrix
    features: np.ndarray
    labels: np.ndarray
    num_classes: int
    name: str = "graph"
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        n_rows, n_cols = self.adjacency.shape
        if n_rows != n_cols:
            raise ValueError(f"adjacency must be square, got {n_rows} x {n_cols}")
        if self.features.ndim != 2 or self.features.shape[0] != n_rows:
            raise ValueError(f"features must be ({n_rows}, F), got {self.features.shape}")
        if self.labels.shape != (n_rows,):
            raise ValueError(f"labels must be ({n_rows},), got {self.labels.shape}")

    @property
    def num_nodes(self) -> int:
        return int(self.adjacency.shape[0])

    @property
    def nnz(self) -> int:
        """Stored nonzeros of the raw adjacency (self-loops not added)."""
        return int(self.adjacency.nnz)

    @property
    def num_features(self) -> int:
        return int(self.features.shape[1])

    @property
    def num_edges(self) -> int:
        """Undirected edges if the adjacency is symmetric, else directed edges."""
        if self.meta.get("symmetric"):
            loops = int(np.count_nonzero(self.adjacency.diagonal()))
            return (self.nnz - loops) // 2 + loops
        return self.nnz

    def normalized_adjacency(self) -> sp.csr_matrix:
        return gcn_normalize(self.adjacency)


def as_csr(adj) -> sp.csr_matrix:
    """Canonical CSR: sorted indices, duplicates summed, explicit zeros kept out."""
    import scipy.sparse as sp
    csr = sp.csr_matrix(adj)
    if not csr.has_canonical_format:
        csr = csr.copy()
        csr.sum_duplicates()
    return csr


def gcn_normalize(adj, *, dtype=np.float32) -> sp.csr_matrix:
    """GCN normalization ``A_hat = D^-1/2 (A + I) D^-1/2`` as CSR of ``dtype``.

    Self-loops follow PyG's ``add_remaining_self_loops``: a node without a self-loop gets
    one of weight 1, a node that already has one keeps its stored weight. ``d_v`` is the
    row sum of row v of (A + I), i.e. the weighted in-degree plus the self-loop, so
    ``A_hat[v, u] = w_uv / sqrt(d_u d_v)``. With row v holding in-neighbours this equals
    ``torch_geometric.nn.conv.gcn_conv.gcn_norm(edge_index, w)`` for ``edge_index = (u, v)``,
    for directed and undirected graphs alike.
    """
    import scipy.sparse as sp
    csr = as_csr(adj)
    n = csr.shape[0]
    if csr.shape[1] != n:
        raise ValueError(f"adjacency must be square, got {csr.shape}")
    fill = np.where(csr.diagonal() != 0, 0.0, 1.0)
    with_loops = (csr.astype(np.float64) + sp.diags(fill, format="csr")).tocsr()
    with_loops.sum_duplicates()
    deg = np.asarray(with_loops.sum(axis=1)).ravel()
    inv_sqrt = np.zeros_like(deg)
    positive = deg > 0
    inv_sqrt[positive] = 1.0 / np.sqrt(deg[positive])
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(with_loops.indptr))
    data = with_loops.data * inv_sqrt[rows] * inv_sqrt[with_loops.indices]
    out = sp.csr_matrix((data.astype(dtype), with_loops.indices, with_loops.indptr), shape=(n, n))
    out.eliminate_zeros()
    return out


def edge_index_to_adjacency(edge_index: np.ndarray, num_nodes: int, weights=None) -> sp.csr_matrix:
    """CSR adjacency with row v holding in-neighbours: edge (u, v) -> entry A[v, u].

    Duplicate edges are summed (so an unweighted multi-edge has weight > 1).
    """
    import scipy.sparse as sp
    edge_index = np.asarray(edge_index)
    src = edge_index[0].astype(np.int64, copy=False)
    dst = edge_index[1].astype(np.int64, copy=False)
    if weights is None:
        weights = np.ones(src.shape[0], dtype=np.float32)
    adj = sp.coo_matrix((np.asarray(weights), (dst, src)), shape=(num_nodes, num_nodes)).tocsr()
    adj.sum_duplicates()
    return adj


def adjacency_to_edge_index(adj) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`edge_index_to_adjacency`: ``(edge_index (2, E) int64, weights)``."""
    import scipy.sparse as sp
    coo = sp.coo_matrix(adj)
    edge_index = np.vstack([coo.col.astype(np.int64), coo.row.astype(np.int64)])
    return edge_index, coo.data


def is_symmetric(adj) -> bool:
    csr = as_csr(adj)
    diff = csr - csr.T
    return diff.count_nonzero() == 0
