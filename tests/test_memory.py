"""Memory per GPU against a hand count (docs/model.md, "Memory")."""

import numpy as np
import pytest

from plexus_tune.model.memory import memory_breakdown, memory_bytes
from plexus_tune.model.workload import Workload

W = Workload("toy", nodes=1001, nnz=5000, widths=(12, 8, 6))


def test_hand_count_g8():
    # grid 2x2x2, u = 4 bytes, int32 indices (4 bytes) as the trainer stores them.
    # layer 0 (o X, n Y, d Z): r_d = r_o = 501, c_i = 6, c_o = 4, shard nnz ceil(5000/4) = 1250,
    #   W kept in depth pieces of ceil(6/2) = 3 rows, features of ceil(501/2) = 251 rows
    # layer 1 (o Z, n X, d Y): r_d = r_o = 501, c_i = 4, c_o = 3, shard nnz 1250, W pieces of 2 rows
    shard = 1250 * (4 + 4) + (501 + 1) * 4 + 1250 * (4 + 4) + (501 + 1) * 4  # A and A^T in CSR
    adjacency = 2 * shard                                       # 2 layers: layouts 0 and 1
    weights = 4 * (3 * 4 + 4 + 2 * 3 + 3) * 4                   # value, grad, 2 AdamW moments of W and b
    features = 4 * 251 * 6 * 4
    activations = (2 * 501 * 6 + 2 * 501 * 4 + 2 * 501 * 4 + 2 * 501 * 3) * 4
    gathered = max(2 * 3 * 4, 2 * 251 * 6, 2 * 2 * 3) * 4       # gathered W pieces and features
    labels = 8 * 501
    parts = memory_breakdown(W, [[2, 2, 2]])
    assert parts["adjacency"][0] == adjacency == 48032
    assert parts["weights"][0] == weights == 400
    assert parts["features"][0] == features == 24096
    assert parts["activations"][0] == activations == 68136
    assert parts["gathered"][0] == gathered == 12048
    assert parts["labels"][0] == labels
    total = adjacency + weights + features + activations + gathered + labels
    assert memory_bytes(W, [[2, 2, 2]])[0] == total == 156720
    # int64 indices on request: 8 bytes per index
    wide = memory_breakdown(W, [[2, 2, 2]], index_bytes=8)["adjacency"][0]
    assert wide == 2 * (2 * 1250 * (4 + 8) + (501 + 1 + 501 + 1) * 8) == 76064


def test_blocked_aggregation_adds_one_row_pointer_per_block():
    # ceil(501 / 100) = 6 row blocks replace A: 5 more row pointers (4 bytes) in each of 2 shards
    plain = memory_breakdown(W, [[2, 2, 2]])
    blocked = memory_breakdown(W, [[2, 2, 2]], block_rows=100)
    assert blocked["adjacency"][0] - plain["adjacency"][0] == 2 * 5 * 4
    assert memory_breakdown(W, [[2, 2, 2]], block_rows=501)["total"][0] == plain["total"][0]


def test_index_width_grows_past_int32():
    # 5e9 nonzeros: one GPU's shard needs int64 indices, 4 GPUs on X (layer 0's outer and
    # layer 1's inner) split layer 0's shard to 1.25e9 nonzeros: int32 again
    big = Workload("big", nodes=100_000, nnz=5_000_000_000, widths=(4, 4))  # half of N^2
    one = memory_breakdown(big, [[1, 1, 1]])["adjacency"][0]
    assert one == 2 * 5_000_000_000 * (4 + 8) + (100_001 + 100_001) * 8
    four = memory_breakdown(big, [[4, 1, 1]])["adjacency"][0]
    assert four == 2 * 1_250_000_000 * (4 + 4) + (100_000 + 1 + 25_000 + 1) * 4


def test_shard_count_with_double_permutation():
    deep = Workload("deep", nodes=1001, nnz=5000, widths=(8,) * 8)  # 7 layers
    one_shard = 2 * 1250 * (4 + 4) + (501 + 1 + 501 + 1) * 4
    assert memory_breakdown(deep, [[2, 2, 2]])["adjacency"][0] == 6 * one_shard  # min(6, L)
    single = memory_breakdown(deep, [[2, 2, 2]], double_permutation=False)["adjacency"][0]
    assert single == 3 * one_shard  # min(3, L) without permutation


def test_memory_shrinks_with_more_gpus():
    grids = np.array([[1, 1, 1], [2, 2, 2], [4, 4, 4]])
    m = memory_bytes(W, grids)
    assert m[0] > m[1] > m[2]
    # one GPU holds everything: no padding, nnz 5000 in each of 2 shards, nothing gathered
    assert m[0] == pytest.approx(
        2 * (2 * 5000 * 8 + (1002 + 1002) * 4)
        + 4 * (12 * 8 + 8 + 8 * 6 + 6) * 4 + 4 * 1001 * 12 * 4
        + (2 * 1001 * 12 + 2 * 1001 * 8 + 2 * 1001 * 8 + 2 * 1001 * 6) * 4
        + 8 * 1001
    )
