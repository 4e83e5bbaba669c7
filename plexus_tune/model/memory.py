"""Memory per GPU of a 3D-parallel GCN (DESIGN.md 4.4), vectorized over grids.

Local sizes are padded: a dimension of length n split over g ranks holds
ceil(n / g) entries on every rank. With u = bytes per element, ``index_bytes`` the
size of a sparse index (8: torch CSR uses int64) and, for layer i with roles
(outer o, inner n, depth d) and sizes g_o, g_n, g_d::

    r_d = ceil(N / g_d), r_o = ceil(N / g_o)          local rows of H / of F_i
    c_i = ceil(D_i / g_n), c_o = ceil(D_{i+1} / g_o)  local columns of F_i / of Q
    z_i = ceil(NNZ / (g_d g_o))                        local nonzeros of the A shard

Counted terms:

- adjacency: one shard per distinct (layout i mod 3, permutation parity i mod 2)
  among the layers, i.e. min(6, L) shards with double permutation (min(3, L)
  without); each stored as A (r_d rows) and A^T (r_o rows), CSR:
  2 z_i (u + index_bytes) + (r_d + 1 + r_o + 1) index_bytes bytes;
- weights: parameter, gradient and two Adam moments of the local W_i block, also
  split over depth: 4 ceil(c_i c_o / g_d) elements;
- input features (trainable): 4 ceil(r_o c_0 / g_d) elements at layer 0;
- per layer: saved aggregation output H and its gradient, 2 r_d c_i elements, and
  the layer output Q and its gradient, 2 r_d c_o elements;
- the largest temporary gathered buffer: max over layers of the gathered W_i block
  (c_i c_o) and, at layer 0, the gathered input features (r_o c_0) elements;
- labels: int64 for the rows of the last layer's output, 8 r_d(L-1) bytes.
"""

from __future__ import annotations

import numpy as np

from plexus_tune.model.grid import layer_roles


def _ceil_div(a, b):
    return -(-np.asarray(a, dtype=np.int64) // np.asarray(b, dtype=np.int64))


def memory_breakdown(workload, grids, *, index_bytes: int = 8, double_permutation: bool = True) -> dict[str, np.ndarray]:
    """Bytes per GPU by part (keys adjacency, weights, features, activations, gathered, labels, total)."""
    grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
    u = int(workload.bytes_per_element)
    n_nodes, nnz, widths = int(workload.nodes), int(workload.nnz), workload.widths
    layers = workload.layers
    k = grids.shape[0]
    adjacency = np.zeros(k, dtype=np.float64)
    weight_elems = np.zeros(k, dtype=np.float64)
    act_elems = np.zeros(k, dtype=np.float64)
    gathered = np.zeros(k, dtype=np.float64)
    seen_shards = set()
    feature_elems = np.zeros(k, dtype=np.float64)
    labels = np.zeros(k, dtype=np.float64)
    for i in range(layers):
        o, n, d = layer_roles(i)
        g_o, g_n, g_d = grids[:, o], grids[:, n], grids[:, d]
        r_d, r_o = _ceil_div(n_nodes, g_d), _ceil_div(n_nodes, g_o)
        c_i, c_o = _ceil_div(widths[i], g_n), _ceil_div(widths[i + 1], g_o)
        shard = (i % 3, i % 2 if double_permutation else 0)
        if shard not in seen_shards:
            seen_shards.add(shard)
            z = _ceil_div(nnz, g_d * g_o)
            adjacency += 2 * z * (u + index_bytes) + (r_d + 1 + r_o + 1) * index_bytes
        weight_elems += 4 * _ceil_div(c_i * c_o, g_d)
        act_elems += 2 * r_d * c_i + 2 * r_d * c_o
        gathered = np.maximum(gathered, c_i * c_o)
        if i == 0:
            feature_elems = 4 * _ceil_div(r_o * c_i, g_d).astype(np.float64)
            gathered = np.maximum(gathered, r_o * c_i)
        if i == layers - 1:
            labels = 8.0 * r_d
    parts = {
        "adjacency": adjacency,
        "weights": weight_elems * u,
        "features": feature_elems * u,
        "activations": act_elems * u,
        "gathered": gathered.astype(np.float64) * u,
        "labels": labels,
    }
    parts["total"] = sum(parts.values())
    return parts


def memory_bytes(workload, grids, **kwargs) -> np.ndarray:
    """Total bytes per GPU of each grid (see :func:`memory_breakdown`)."""
    return memory_breakdown(workload, grids, **kwargs)["total"]
