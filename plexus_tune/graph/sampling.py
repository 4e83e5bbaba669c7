"""Communication-free uniform vertex sampling of mini-batch subgraphs (docs/model.md, "ScaleGNN").

At step t every rank of data-parallel group d draws the same sorted sample S of B
vertices, without replacement, from the stream (seed + t, d) (:func:`sample_vertices`),
so ranks of one group agree on S without exchanging anything and groups draw different
samples. A rank that holds the 2D shard rows [R0, R1) x columns [C0, C1) of the
adjacency keeps the sampled rows S_r = S in [R0, R1) and columns S_c = S in [C0, C1),
found by binary search in the sorted sample (:func:`sample_range`), and extracts the
induced block (:func:`sampled_block`): rows gathered through the CSR row pointer,
columns kept where they are members of S_c (binary search), indices remapped to
positions in S. Off-diagonal weights are divided by

    p = (B - 1) / (N - 1)         (the probability that u is sampled given v is)

and self-loops are kept, so that for every sampled v the aggregation
sum_{u in S} A_S[v, u] x_u is an unbiased estimate of (A x)_v. The expected nonzeros
of A_S, with one self-loop per node among NNZ (:func:`expected_sampled_nnz`), are

    E[nnz(A_S)] = (NNZ - N) B (B - 1) / (N (N - 1)) + B.
"""

from __future__ import annotations

import numpy as np

from plexus_tune.errors import UserError

__all__ = ["check_batch_size", "expected_sampled_nnz", "rescale_factor", "sample_range", "sample_vertices",
           "sampled_block", "sampled_shard_nnz", "sampled_subgraph"]


def check_batch_size(batch: int, nodes: int) -> int:
    """``batch`` as an int if 2 <= B <= N, else UserError saying what to give."""
    if isinstance(batch, bool) or int(batch) != batch:
        raise UserError(f"the batch size must be a whole number of vertices, got {batch!r}", parameter="batch_size")
    batch = int(batch)
    if batch < 2 or batch > int(nodes):
        raise UserError(f"the batch size must be between 2 and the graph's {int(nodes):,} nodes, got {batch:,}",
                        parameter="batch_size")
    return batch


def rescale_factor(nodes: int, batch: int) -> float:
    """p = (B - 1) / (N - 1): the probability that a vertex u != v is in the sample given v is."""
    return (int(batch) - 1) / (int(nodes) - 1) if nodes > 1 else 1.0


def sample_vertices(nodes: int, batch: int, seed: int, step: int, group: int = 0) -> np.ndarray:
    """The sorted sample (int64, B distinct vertices of [0, N)) of ``step`` in data-parallel ``group``.

    Drawn from numpy's PCG64 seeded by the sequence (seed + step) with spawn key
    (group,): every rank of a group computes the same sample, other groups other ones.
    """
    batch = check_batch_size(batch, nodes)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(int(seed) + int(step), spawn_key=(int(group),))))
    if batch == nodes:
        return np.arange(nodes, dtype=np.int64)
    return np.sort(rng.choice(int(nodes), size=batch, replace=False, shuffle=False).astype(np.int64))


def sample_range(sample: np.ndarray, start: int, stop: int) -> tuple[int, int]:
    """Positions [lo, hi) of the sorted ``sample`` whose vertices lie in [start, stop) (binary search)."""
    lo, hi = np.searchsorted(sample, [int(start), int(stop)], side="left")
    return int(lo), int(hi)


def sampled_block(shard: sp.csr_matrix, row_start: int, col_start: int, rows: np.ndarray, cols: np.ndarray,
                  p: float, *, rescale: bool = True) -> sp.csr_matrix:
    """The induced block of a 2D shard: (len(rows), len(cols)) CSR, off-diagonals divided by ``p``.

    ``shard`` holds global rows [row_start, ...) and columns [col_start, ...);
    ``rows`` and ``cols`` are the sorted sampled vertices inside its ranges (global
    ids). Row k of the result is vertex rows[k], column j vertex cols[j].
    """
    import scipy.sparse as sp
    shard = shard.tocsr()
    local_rows = np.asarray(rows, dtype=np.int64) - int(row_start)
    counts = shard.indptr[local_rows + 1] - shard.indptr[local_rows]
    owner = np.repeat(np.arange(len(local_rows), dtype=np.int64), counts)  # output row of each gathered nonzero
    first = np.repeat(shard.indptr[local_rows].astype(np.int64) - np.cumsum(counts) + counts, counts)
    flat = first + np.arange(int(counts.sum()), dtype=np.int64)
    global_cols = shard.indices[flat].astype(np.int64) + int(col_start)
    cols = np.asarray(cols, dtype=np.int64)
    pos = np.searchsorted(cols, global_cols)
    keep = (pos < len(cols)) & (cols[np.minimum(pos, max(len(cols) - 1, 0))] == global_cols) if len(cols) else \
        np.zeros(len(global_cols), dtype=bool)
    values = shard.data[flat][keep].astype(np.float64)
    out_rows, out_cols = owner[keep], pos[keep]
    if rescale:
        off = np.asarray(rows, dtype=np.int64)[out_rows] != global_cols[keep]
        values = np.where(off, values / float(p), values)
    block = sp.csr_matrix((values.astype(shard.dtype), (out_rows, out_cols)), shape=(len(local_rows), len(cols)))
    block.sum_duplicates()
    return block


def sampled_subgraph(adjacency: sp.csr_matrix, sample: np.ndarray, *, rescale: bool = True) -> sp.csr_matrix:
    """A_S of the whole graph: the (B, B) induced adjacency of ``sample``, rescaled (the serial reference)."""
    n = adjacency.shape[0]
    return sampled_block(adjacency, 0, 0, sample, sample, rescale_factor(n, len(sample)), rescale=rescale)


def expected_sampled_nnz(nodes, nnz, batch):
    """E[nnz(A_S)] = (NNZ - N) B (B - 1) / (N (N - 1)) + B (one self-loop per node; arrays broadcast)."""
    n = np.asarray(nodes, dtype=np.float64)
    z = np.asarray(nnz, dtype=np.float64)
    b = np.asarray(batch, dtype=np.float64)
    return (z - n) * b * (b - 1.0) / (n * np.maximum(n - 1.0, 1.0)) + b


def sampled_shard_nnz(adjacency: sp.csr_matrix, row_parts: int, col_parts: int, batch: int, *, samples: int = 4,
                      seed: int = 0) -> float:
    """The largest 2D shard's nonzeros of A_S, mean over ``samples`` samples of the graph.

    The graph's rows are cut into ``row_parts`` blocks of ceil(N / row_parts) and its
    columns into ``col_parts`` blocks (the shards of one layer of a group's 3D grid);
    each sample's A_S is cut at the same global boundaries (docs/model.md, "ScaleGNN").
    """
    adjacency = adjacency.tocsr()
    n = adjacency.shape[0]
    batch = check_batch_size(batch, n)
    row_size, col_size = -(-n // int(row_parts)), -(-n // int(col_parts))
    worst = []
    for k in range(int(samples)):
        sample = sample_vertices(n, batch, seed, k)
        sub = sampled_subgraph(adjacency, sample, rescale=False).tocoo()
        r = sample[sub.row] // row_size
        c = sample[sub.col] // col_size
        counts = np.bincount(r * int(col_parts) + c, minlength=int(row_parts) * int(col_parts))
        worst.append(float(counts.max()))
    return float(np.mean(worst))
