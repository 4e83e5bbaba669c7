"""The device-built SpMM/GEMM benchmarks (the CUDA path) run on the CPU: same shards and shapes as the host-built ones."""

import numpy as np
import torch

from plexus_tune.measure.campaign import load_graph_source
from plexus_tune.measure.spmm import calibrate_graph_shards, sweep_shapes
from plexus_tune.measure.spmm_device import device_graph_shards, device_spmm_sweep, random_csr_on


def _key(r):
    return (r["schema"], r["grid"], r["layer"], r.get("direction"), r.get("product"))


def test_device_shards_match_the_host_shards():
    g = load_graph_source("rmat:nodes=512,edges=4096,features=8,classes=3")
    a = g.normalized_adjacency()
    widths = [8, 16, 3]
    mine = device_graph_shards(a, widths, 2, torch.device("cpu"), graph_name=g.name, min_samples=2, min_time_s=0.0)
    host = calibrate_graph_shards(a, widths, 2, repeats=1, graph_name=g.name)
    by_key = {_key(r): r for r in host}
    assert {_key(r) for r in mine} == set(by_key)
    for r in mine:
        ref = by_key[_key(r)]
        for field in ("nnz", "rows", "common", "dense_cols", "inner", "cols", "shard", "nnz_imbalance"):
            if field in ref:
                assert r[field] == ref[field] or np.isclose(r[field], ref[field]), (field, r, ref)
        assert 0 < r["time_ms"] <= r["time_median_ms"] and r["repeats"] >= 2
        assert r["machine_info"]["device"] == "cpu" and "torch_geometric" in r["machine_info"]
    stats = [r["structure"] for r in mine if r["schema"].startswith("plexus-tune/spmm-")]
    assert all(0 < s["touched_column_fraction"] <= 1 and 0 < s["top1pct_column_share"] <= 1 for s in stats)


def test_device_shard_is_the_host_shard_in_both_layouts():
    from plexus_tune.graph.permute import double_permute
    from plexus_tune.measure.spmm import shard
    from plexus_tune.measure.spmm_device import largest_shard_on, layout_on

    g = load_graph_source("rmat:nodes=300,edges=2000,features=4,classes=2")
    permuted, _, _ = double_permute(g.normalized_adjacency(), seed=0)
    r_d, r_o, g_d, g_o = 100, 150, 3, 2
    for matrix in (permuted, permuted.T):  # the transpose layout comes in column order from scipy
        A, At, counts, (a, b), _ = largest_shard_on(layout_on(matrix, torch.device("cpu")), r_d, r_o, g_d, g_o)
        ref = shard(matrix.tocsr(), r_d, r_o, a, b).toarray()
        assert int(counts.max()) == int((ref != 0).sum())
        assert np.allclose(A.to_dense().numpy(), ref) and np.allclose(At.to_dense().numpy(), ref.T)
        x = torch.rand(r_o, 5)
        assert torch.allclose(torch.sparse.mm(A, x), torch.from_numpy(ref).float() @ x, atol=1e-5)


def test_layouts_permuted_on_the_device_are_the_host_ones():
    from plexus_tune.graph.permute import double_permute
    from plexus_tune.measure.spmm_device import layout_on, permuted_layouts_on

    a = load_graph_source("rmat:nodes=300,edges=2000,features=4,classes=2").normalized_adjacency()
    permuted, row_perm, col_perm = double_permute(a, seed=3)
    mine = permuted_layouts_on(a, row_perm, col_perm, torch.device("cpu"))
    for got, matrix in zip(mine, (permuted, permuted.T)):
        for x, y in zip(got, layout_on(matrix, torch.device("cpu"))):
            assert torch.equal(x, y) if x.dtype == torch.int64 else torch.allclose(x, y)


def test_device_csr_and_sweep():
    gen = torch.Generator().manual_seed(0)
    A = random_csr_on(torch.device("cpu"), 50, 40, 300, gen)
    dense = A.to_dense()
    assert A.col_indices().dtype == torch.int32 and A.shape == (50, 40)
    assert int((dense != 0).sum()) == A.values().numel() <= 300  # duplicates merged, none lost
    B = torch.rand(40, 3)
    assert torch.allclose(torch.sparse.mm(A, B), dense @ B, atol=1e-5)
    shapes = sweep_shapes(3, rows=(64, 128), common=(64, 128), dense_cols=(1, 8), max_nnz=2000)
    recs = device_spmm_sweep(shapes, torch.device("cpu"), min_samples=2, min_time_s=0.0)
    assert [(r["rows"], r["common"], r["dense_cols"]) for r in recs] == [(s["rows"], s["common"], s["dense_cols"]) for s in shapes]
    assert all(r["nnz"] <= s["nnz"] and r["time_ms"] > 0 for r, s in zip(recs, shapes))
    assert all(len(r["structure"]["column_share"]) == 32 and r["structure"]["generator"] == "uniform" for r in recs)
    # structured shapes: the host sweep's positions (same seed, same counts), built on the device
    from plexus_tune.measure.spmm import structured_csr

    shapes = sweep_shapes(3, rows=(64, 128), common=(64, 128), dense_cols=(1, 8), max_nnz=2000, structure="zipf", seed=2)
    recs = device_spmm_sweep(shapes, torch.device("cpu"), seed=2, min_samples=2, min_time_s=0.0)
    for i, (r, s) in enumerate(zip(recs, shapes)):
        host, structure = structured_csr(s["rows"], s["common"], s["nnz"], s["structure"], np.random.default_rng([2, i]))
        assert r["nnz"] == host.values().numel() and r["structure"] == structure
