import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from plexus_tune.errors import UserError
from plexus_tune.graph import (
    balance_report,
    block_nnz,
    degree_labels,
    double_permute,
    edge_index_to_adjacency,
    gcn_normalize,
    grid2d_adjacency,
    invert_permutation,
    is_symmetric,
    make_permutation,
    parse_blocks,
    parse_spec,
    permutations_for,
    permute_matrix,
    permute_rows,
    rmat_adjacency,
    synthetic,
    unpermute_rows,
)


def pyg_dense(edge_index, weights, n):
    """Dense operator of PyG's GCN propagation: out[dst] += norm * x[src]."""
    ei = torch.as_tensor(edge_index, dtype=torch.long)
    w = None if weights is None else torch.as_tensor(weights, dtype=torch.float32)
    ei2, norm = gcn_norm(ei, w, num_nodes=n, add_self_loops=True)
    dense = np.zeros((n, n))
    np.add.at(dense, (ei2[1].numpy(), ei2[0].numpy()), norm.numpy())
    return dense


def test_gcn_normalize_path_graph_by_hand():
    # path 0-1-2: degrees with self-loops 2, 3, 2
    adj = edge_index_to_adjacency(np.array([[0, 1, 1, 2], [1, 0, 2, 1]]), 3)
    got = gcn_normalize(adj).toarray()
    expected = np.array([
        [1 / 2, 1 / math.sqrt(6), 0],
        [1 / math.sqrt(6), 1 / 3, 1 / math.sqrt(6)],
        [0, 1 / math.sqrt(6), 1 / 2],
    ])
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_gcn_normalize_matches_pyg_undirected():
    rng = np.random.default_rng(3)
    n = 30
    pairs = {tuple(sorted(p)) for p in rng.integers(0, n, size=(80, 2)) if p[0] != p[1]}
    src = np.array([p[0] for p in pairs] + [p[1] for p in pairs])
    dst = np.array([p[1] for p in pairs] + [p[0] for p in pairs])
    ei = np.vstack([src, dst])
    adj = edge_index_to_adjacency(ei, n)
    assert is_symmetric(adj)
    np.testing.assert_allclose(gcn_normalize(adj).toarray(), pyg_dense(ei, None, n), rtol=1e-5, atol=1e-7)


def test_gcn_normalize_matches_pyg_directed_weighted_with_existing_self_loop():
    # directed edges u -> v; node 2 already has a self-loop of weight 3 (kept, as PyG does);
    # node 4 is isolated (gets a self-loop of weight 1)
    ei = np.array([[0, 0, 1, 2, 3, 2], [1, 2, 2, 3, 0, 2]])
    w = np.array([1.0, 2.0, 0.5, 1.5, 1.0, 3.0])
    n = 5
    adj = edge_index_to_adjacency(ei, n, w)
    assert adj[1, 0] == 1.0 and adj[2, 0] == 2.0  # row v holds in-neighbours
    assert not is_symmetric(adj)
    np.testing.assert_allclose(gcn_normalize(adj).toarray(), pyg_dense(ei, w, n), rtol=1e-5, atol=1e-7)


def test_rmat_exact_edges_simple_symmetric_and_seeded():
    adj = rmat_adjacency(1000, 5000, seed=7)  # not a power of two
    assert adj.shape == (1000, 1000)
    assert adj.nnz == 2 * 5000
    assert is_symmetric(adj)
    assert adj.diagonal().sum() == 0
    assert np.all(adj.data == 1.0)  # no duplicate was summed
    assert adj.indices.max() < 1000
    again = rmat_adjacency(1000, 5000, seed=7)
    assert (adj != again).nnz == 0
    other = rmat_adjacency(1000, 5000, seed=8)
    assert (adj != other).nnz > 0


def test_rmat_is_skewed_without_scramble():
    adj = rmat_adjacency(1024, 8192, seed=1, scramble=False)
    degree = np.diff(adj.indptr)
    # a=.57 puts the hubs at the low ids: the first 1/8 of ids holds far more than 1/8 of the edges
    assert degree[:128].sum() > 0.35 * degree.sum()
    assert degree.max() > 10 * degree.mean()


def test_rmat_rejects_too_dense():
    with pytest.raises(UserError):
        rmat_adjacency(10, 40)


def test_grid2d_full_lattice_by_hand():
    # 4x4 lattice: 2 * 4 * 3 = 24 edges; corners have degree 2, inner nodes 4
    adj = grid2d_adjacency(16, drop=0.0, long_edges=0.0)
    assert adj.nnz == 48
    degree = np.diff(adj.indptr)
    assert degree[0] == 2 and degree[5] == 4 and degree[15] == 2
    assert adj[5, 6] == 1 and adj[5, 9] == 1 and adj[5, 10] == 0
    eight = grid2d_adjacency(16, neighbors=8, drop=0.0, long_edges=0.0)
    assert eight.nnz == 48 + 2 * 2 * 9  # plus 9 down-right and 9 down-left diagonals
    assert is_symmetric(eight)


def test_grid2d_band_and_ragged_last_row():
    adj = grid2d_adjacency(1000, drop=0.2, long_edges=0.0, seed=2)
    coo = adj.tocoo()
    cols = math.ceil(math.sqrt(1000))
    assert np.abs(coo.row - coo.col).max() <= cols
    assert is_symmetric(adj) and adj.diagonal().sum() == 0


def test_degree_labels_equal_frequency_and_monotone():
    adj = rmat_adjacency(512, 3000, seed=0)
    labels = degree_labels(adj, 8, seed=0)
    assert labels.dtype == np.int64
    assert np.bincount(labels).tolist() == [64] * 8
    degree = np.diff(adj.indptr)
    for c in range(7):
        assert degree[labels == c].max() <= degree[labels == c + 1].min()


def test_synthetic_spec_and_determinism():
    g = synthetic("rmat:nodes=300,edges=1200,features=16,classes=5,seed=4")
    assert (g.num_nodes, g.nnz, g.num_features, g.num_classes) == (300, 2400, 16, 5)
    assert g.features.dtype == np.float32 and g.labels.dtype == np.int64
    h = synthetic("rmat:nodes=300,edges=1200,features=16,classes=5,seed=4")
    assert np.array_equal(g.features, h.features) and np.array_equal(g.labels, h.labels)
    assert synthetic("grid2d:nodes=1k,features=3,classes=2").num_nodes == 1000
    assert parse_spec("rmat:nodes=16M,edges=1e6") == ("rmat", {"nodes": 16_000_000, "edges": 1_000_000})
    for bad in ["nope:nodes=3", "rmat:nodes=abc", "rmat:nodes=10,bogus=1", "grid2d:nodes=10,edges=5", "rmat:nodes"]:
        with pytest.raises(UserError):
            synthetic(bad)


def test_permute_matrix_equals_dense_indexing_and_commutes_with_spmm():
    rng = np.random.default_rng(0)
    a = sp.random(23, 23, density=0.2, random_state=1, format="csr", dtype=np.float64)
    rp, cp = make_permutation(23, 5), make_permutation(23, 6)
    b = permute_matrix(a, rp, cp)
    assert b.has_canonical_format
    np.testing.assert_array_equal(b.toarray(), a.toarray()[rp][:, cp])
    x = rng.standard_normal((23, 4))
    np.testing.assert_allclose(b @ permute_rows(x, cp), (a @ x)[rp])
    np.testing.assert_allclose(unpermute_rows(b @ x[cp], rp), a @ x)
    assert np.array_equal(invert_permutation(rp)[rp], np.arange(23))


def test_permutation_modes():
    r, c = permutations_for("none", 5)
    assert r.tolist() == c.tolist() == list(range(5))
    r, c = permutations_for("single", 50, seed=3)
    assert np.array_equal(r, c) and sorted(r.tolist()) == list(range(50))
    r, c = permutations_for("double", 50, seed=3)
    assert not np.array_equal(r, c) and np.array_equal(r, make_permutation(50, 3))
    with pytest.raises(UserError):
        permutations_for("triple", 5)
    b, r, c = double_permute(sp.eye(10, format="csr"), seed=1)
    np.testing.assert_array_equal(b.toarray(), np.eye(10)[r][:, c])


def test_block_nnz_brute_force_ragged():
    a = sp.random(37, 37, density=0.3, random_state=2, format="csr")
    dense = a.toarray() != 0
    counts = block_nnz(a, 4, 3)
    br, bc = 10, 13  # ceil(37/4), ceil(37/3)
    for r in range(4):
        for c in range(3):
            assert counts[r, c] == dense[r * br:(r + 1) * br, c * bc:(c + 1) * bc].sum()


def test_balance_report_locality_graph():
    adj = grid2d_adjacency(40_000, seed=0)
    orig = balance_report(adj, (8, 8), "none")
    single = balance_report(adj, (8, 8), "single")
    double = balance_report(adj, (8, 8), "double")
    assert orig["nnz"] == adj.nnz + 40_000  # counts A + I
    assert orig["max_over_mean"] >= 3
    assert double["max_over_mean"] < single["max_over_mean"] < orig["max_over_mean"]
    assert double["max_over_mean"] < 1.15
    assert parse_blocks("8x4") == (8, 4) and parse_blocks(" 6X6 ") == (6, 6)
    for bad in ("8x0", "6", "8x4x2", "ax4"):
        with pytest.raises(UserError):
            parse_blocks(bad)
