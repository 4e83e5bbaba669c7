"""Memory per GPU against a hand count (DESIGN.md 4.4)."""

import numpy as np
import pytest

from plexus_tune.model.memory import memory_breakdown, memory_bytes
from plexus_tune.model.workload import Workload

W = Workload("toy", nodes=1001, nnz=5000, widths=(12, 8, 6))


def test_hand_count_g8():
    # grid 2x2x2, u = 4 bytes, int64 indices (8 bytes).
    # layer 0 (o X, n Y, d Z): r_d = r_o = 501, c_i = 6, c_o = 4, shard nnz ceil(5000/4) = 1250
    # layer 1 (o Z, n X, d Y): r_d = r_o = 501, c_i = 4, c_o = 3, shard nnz 1250
    shard = 2 * 1250 * (4 + 8) + (501 + 1 + 501 + 1) * 8       # A and A^T in CSR
    adjacency = 2 * shard                                       # 2 layers: layouts 0 and 1
    weights = 4 * ((6 * 4) // 2 + (4 * 3) // 2) * 4             # param, grad, 2 Adam moments
    features = 4 * ((501 * 6 + 1) // 2) * 4                      # ceil(501*6/2) = 1503 elements
    activations = (2 * 501 * 6 + 2 * 501 * 4 + 2 * 501 * 4 + 2 * 501 * 3) * 4
    gathered = max(6 * 4, 501 * 6, 4 * 3) * 4
    labels = 8 * 501
    parts = memory_breakdown(W, [[2, 2, 2]])
    assert parts["adjacency"][0] == adjacency == 76064
    assert parts["weights"][0] == weights
    assert parts["features"][0] == features
    assert parts["activations"][0] == activations
    assert parts["gathered"][0] == gathered
    assert parts["labels"][0] == labels
    total = adjacency + weights + features + activations + gathered + labels
    assert memory_bytes(W, [[2, 2, 2]])[0] == total == 184568


def test_shard_count_with_double_permutation():
    deep = Workload("deep", nodes=1001, nnz=5000, widths=(8,) * 8)  # 7 layers
    one_shard = 2 * 1250 * (4 + 8) + (501 + 1 + 501 + 1) * 8
    assert memory_breakdown(deep, [[2, 2, 2]])["adjacency"][0] == 6 * one_shard  # min(6, L)
    single = memory_breakdown(deep, [[2, 2, 2]], double_permutation=False)["adjacency"][0]
    assert single == 3 * one_shard  # min(3, L) without the second permutation


def test_memory_shrinks_with_more_gpus():
    grids = np.array([[1, 1, 1], [2, 2, 2], [4, 4, 4]])
    m = memory_bytes(W, grids)
    assert m[0] > m[1] > m[2]
    # one GPU holds everything: no padding, nnz 5000 in each of 2 shards
    assert m[0] == pytest.approx(
        2 * (2 * 5000 * 12 + (1002 + 1002) * 8)
        + 4 * (12 * 8 + 8 * 6) * 4 + 4 * 1001 * 12 * 4
        + (2 * 1001 * 12 + 2 * 1001 * 8 + 2 * 1001 * 8 + 2 * 1001 * 6) * 4
        + 1001 * 12 * 4 + 8 * 1001
    )
