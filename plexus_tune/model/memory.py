"""Memory per GPU of a 3D-parallel GCN (docs/model.md, "Memory"), vectorized over grids.

The bytes the bundled trainer allocates on one rank, with the local sizes of
:func:`plexus_tune.model.shapes.layer_shapes` (per-axis padding: a dimension of length
n split over g ranks holds ceil(n / g) entries). With u = bytes per element, ``ib``
the bytes of a sparse index (:func:`plexus_tune.model.shapes.csr_index_bytes`: 4, the
trainer's int32, unless a shard reaches 2^31 - 1 nonzeros or rows) and, for layer i
with roles (outer o, inner n, depth d) and sizes g_o, g_n, g_d::

    r_d = ceil(N / g_d), r_o = ceil(N / g_o)          local rows of H and Q / of F_i
    c_i = ceil(D_i / g_n), c_o = ceil(D_{i+1} / g_o)  local columns of F_i / of Q
    w = ceil(c_i / g_d), f = ceil(r_o / g_d)          kept rows of W_i / of F_0
    z_i = ceil(NNZ / (g_d g_o))                        local nonzeros of the A shard
    b_i = ceil(r_d / block_rows)                       row blocks (1 without blocking)

Counted terms:

- adjacency: one shard per distinct (layout i mod 3, permutation parity i mod 2)
  among the layers, i.e. min(6, L) shards when the rows and columns are permuted
  differently (``double_permutation``; the trainer does so for ``permute`` double and
  single) and min(3, L) without permutation; each stored as A (r_d rows, as b_i row
  blocks with blocked aggregation) and A^T (r_o rows), CSR:
  2 z_i (u + ib) + (r_d + b_i + r_o + 1) ib bytes;
- weights: value, gradient and two AdamW moments of the kept piece of W_i and of the
  bias b_i: 4 (w c_o + c_o) elements;
- input features (trainable): 4 f c_0 elements at layer 0;
- per layer: saved aggregation output H and its gradient, 2 r_d c_i elements, and
  the layer output Q and its gradient, 2 r_d c_o elements;
- the largest buffer an all-gather over depth returns (none where g_d = 1): max over
  layers of the gathered W_i piece, g_d w c_o, and at layer 0 the gathered features,
  g_d f c_0 elements;
- labels: int64 for the rows of the last layer's output, 8 r_d(L-1) bytes.
"""

from __future__ import annotations

import numpy as np

from plexus_tune.model.shapes import csr_bytes, csr_index_bytes, layer_shapes
from plexus_tune.resources import check_memory


def memory_breakdown(workload, grids, *, index_bytes: int | None = None, double_permutation: bool = True,
                     block_rows=None, fixed_features: bool = False) -> dict[str, np.ndarray]:
    """Bytes per GPU by part (keys adjacency, weights, features, activations, gathered, labels, total).

    ``index_bytes`` overrides the trainer's index width (default: int32, int64 past
    2^31 - 1); ``block_rows`` counts the row blocks of blocked aggregation.
    """
    grids = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
    u = int(workload.bytes_per_element)
    k = grids.shape[0]
    shapes = layer_shapes(workload.nodes, workload.widths, grids, nnz=workload.nnz, block_rows=block_rows)
    adjacency = np.zeros(k, dtype=np.float64)
    weight_elems = np.zeros(k, dtype=np.float64)
    act_elems = np.zeros(k, dtype=np.float64)
    gathered = np.zeros(k, dtype=np.float64)
    seen_shards = set()
    feature_elems = np.zeros(k, dtype=np.float64)
    labels = np.zeros(k, dtype=np.float64)
    for s in shapes:
        i = s.layer
        r_d, r_o, c_i, c_o, z = s.r_d, s.r_o, s.c_i, s.c_o, s.z
        shard = (i % 3, i % 2 if double_permutation else 0)
        if shard not in seen_shards:
            seen_shards.add(shard)
            ib = csr_index_bytes(z, r_d, r_o) if index_bytes is None else index_bytes
            adjacency += csr_bytes(z, r_d, u, ib, s.blocks) + csr_bytes(z, r_o, u, ib)
        weight_elems += 4 * (s.w_rows * c_o + c_o)
        act_elems += 2 * r_d * c_i + 2 * r_d * c_o
        split = s.g_d > 1
        gathered = np.maximum(gathered, np.where(split, s.w_gathered_rows * c_o, 0))
        if i == 0:
            # value, gradient and two optimizer moments; the value alone when the features are fixed
            feature_elems = (1.0 if fixed_features else 4.0) * s.feature_rows * c_i
            gathered = np.maximum(gathered, np.where(split, s.features_gathered_rows * c_i, 0))
        if i == len(shapes) - 1:
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


#: Launchers whose ranks run on this host (the others start them elsewhere).
HOST_LAUNCHERS = ("local", "emulated")


def training_floor_bytes(layers: int, hidden: int, nodes: int = 0) -> int:
    """A lower bound of the memory a training run needs on the host that runs all its ranks,
    whatever the grid: each of the (layers - 1) hidden x hidden weights held once over the ranks
    with its gradient and two AdamW moments (16 bytes), and each layer's N x hidden activations
    once (4 bytes; ``nodes`` N, 0 where unknown)::

        16 (L - 1) h^2 + 4 L N h
    """
    return 16 * (int(layers) - 1) * int(hidden) * int(hidden) + 4 * int(layers) * int(nodes) * int(hidden)


def check_training_memory(layers: int, hidden: int, nodes: int = 0, launcher=None) -> None:
    """UserError if the ranks ``launcher`` starts on this host (the local and emulated launchers,
    :data:`HOST_LAUNCHERS`; None is local) cannot hold :func:`training_floor_bytes`, before any
    rank starts (:func:`plexus_tune.resources.check_memory`; the launcher's ``oversubscribe`` lifts it)."""
    if getattr(launcher, "name", "local") not in HOST_LAUNCHERS:
        return
    layers, hidden, nodes = int(layers), int(hidden), int(nodes)
    check_memory(training_floor_bytes(layers, hidden, nodes),
                 f"training {layers:,} layers of width {hidden:,} (weights, AdamW state"
                 + (f", activations of {nodes:,} nodes)" if nodes else ")"),
                 allow=bool(getattr(launcher, "oversubscribe", False)))
