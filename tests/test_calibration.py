import numpy as np
import pytest
import scipy.sparse as sp

from plexus_tune.measure.collectives import calibrate_collectives, collective_shapes, parse_sizes, partition
from plexus_tune.measure.spmm import calibrate_graph_shards, random_csr, spmm_sweep, sweep_shapes
from plexus_tune.model.collectives import bandwidths_gbps, collective_elements
from plexus_tune.cli import main
from plexus_tune.model.collectives import nodes_spanned
from plexus_tune.errors import UserError
from plexus_tune.measure.store import read_records


def test_group_shapes_of_every_grid_of_8():
    # axes of size > 1: Y (stride 1), X (stride Gy), Z (stride Gx Gy), over the 10 grids of 8
    assert collective_shapes(8) == [(2, 1), (2, 2), (2, 4), (4, 1), (4, 2), (8, 1)]
    assert collective_shapes(6) == [(2, 1), (2, 3), (3, 1), (3, 2), (6, 1)]
    assert collective_shapes(1) == []


def test_partition_follows_rank_placement():
    assert partition(8, 2, 1) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert partition(8, 2, 4) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert partition(8, 4, 2) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    with pytest.raises(UserError):
        partition(6, 4, 1)
    assert nodes_spanned([0, 4], 4) == 2 and nodes_spanned([0, 2], 4) == 1


def test_buffers_split_evenly_and_bandwidths_follow_nccl_tests():
    assert collective_elements("all_reduce", 1000, 3) == 250
    assert collective_elements("all_gather", 1000, 3) == 249  # 250 rounded to a multiple of 3
    assert collective_elements("reduce_scatter", 4, 8) == 8
    algbw, busbw = bandwidths_gbps("all_reduce", 4, 1e9, 1000.0)
    assert (algbw, busbw) == pytest.approx((1.0, 1.5))
    assert bandwidths_gbps("all_gather", 4, 1e9, 1000.0)[1] == pytest.approx(0.75)


def test_parse_sizes():
    assert parse_sizes("1K:64M") == [1024 * 4**k for k in range(9)]
    assert parse_sizes("1K:8K:x2") == [1024, 2048, 4096, 8192]
    assert parse_sizes("4096,1M") == [4096, 1 << 20]
    for bad in ("1Q", "8K:1K", "1K:2K:x1", "0"):
        with pytest.raises(UserError):
            parse_sizes(bad)


def test_collectives_on_two_local_ranks(tmp_path):
    records = calibrate_collectives(2, sizes=[1024, 65536], warmup=1, repeats=3, backend="gloo")
    assert {(r["op"], r["message_bytes"]) for r in records} == {
        (op, m) for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "point_to_point") for m in (1024, 65536)
    }
    for r in records:
        assert r["group_size"] == 2 and r["stride"] == 1 and r["nodes_spanned"] == 1 and r["contiguous"]
        assert r["time_min_ms"] <= r["time_ms"] <= r["time_max_ms"]
        factor = 1.0 if r["op"] in ("all_reduce", "broadcast") else 0.5  # nccl-tests: 2(g-1)/g, 1, (g-1)/g
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * factor)
        assert r["algbw_gbps"] == pytest.approx(r["message_bytes"] / (r["time_ms"] * 1e6))


def test_random_csr_and_sweep_records():
    rng = np.random.default_rng(0)
    A = random_csr(50, 40, 300, rng)
    assert A.shape == (50, 40) and A._nnz() == 300
    crow = A.crow_indices().numpy()
    cols = A.col_indices().numpy()
    assert crow[0] == 0 and crow[-1] == 300 and cols.min() >= 0 and cols.max() < 40
    shapes = sweep_shapes(4, seed=1, rows=(64, 256), common=(64, 256), dense_cols=(1, 8), max_nnz=2000)
    assert all(64 <= s["rows"] <= 256 and 1 <= s["dense_cols"] <= 8 and s["nnz"] <= 2000 for s in shapes)
    records = spmm_sweep(shapes, repeats=2)
    assert [r["rows"] for r in records] == [s["rows"] for s in shapes]
    assert all(r["time_ms"] > 0 and r["schema"] == "plexus-tune/spmm-v2" for r in records)


def test_graph_shards_have_the_cost_model_shapes_and_cover_every_nonzero():
    rng = np.random.default_rng(3)
    n = 30
    dense = (rng.random((n, n)) < 0.2).astype(np.float32)
    adj = sp.csr_matrix(dense + dense.T)
    widths = [6, 5, 3]
    records = calibrate_graph_shards(adj, widths, 4, grids=[(2, 1, 2)], repeats=1, all_shards=True)
    spmm = [r for r in records if r["schema"].endswith("spmm-v2")]
    gemm = [r for r in records if r["schema"].endswith("gemm-v2")]
    # layer 0 roles (outer X=2, inner Y=1, depth Z=2): rows ceil(30/2)=15, common 15, cols ceil(6/1)=6
    fwd0 = [r for r in spmm if r["layer"] == 0 and r["direction"] == "forward"]
    assert len(fwd0) == 4  # g_d x g_o distinct shards
    assert {(r["rows"], r["common"], r["dense_cols"]) for r in fwd0} == {(15, 15, 6)}
    assert sum(r["nnz"] for r in fwd0) == adj.nnz  # the permuted shards partition the nonzeros
    # layer 1 roles (outer Z=2, inner X=2, depth Y=1): rows 30, common 15, cols ceil(5/2)=3
    bwd1 = [r for r in spmm if r["layer"] == 1 and r["direction"] == "backward"]
    assert {(r["rows"], r["common"], r["dense_cols"]) for r in bwd1} == {(15, 30, 3)}
    assert sum(r["nnz"] for r in bwd1) == adj.nnz
    # GEMM Q = H W of layer 1: r_d=30 x c_i=3 x c_o=ceil(3/2)=2
    q1 = [r for r in gemm if r["layer"] == 1 and r["product"] == "forward H W"]
    assert [(r["rows"], r["inner"], r["cols"]) for r in q1] == [(30, 3, 2)]
    largest_only = calibrate_graph_shards(adj, widths, 4, grids=[(2, 1, 2)], repeats=1)
    fwd0_one = [r for r in largest_only if r.get("layer") == 0 and r.get("direction") == "forward"]
    assert len(fwd0_one) == 1 and fwd0_one[0]["nnz"] == max(r["nnz"] for r in fwd0)


def test_cli_sweep_appends_to_a_log_and_rejects_bad_input(tmp_path, capsys):
    out = tmp_path / "spmm.jsonl"
    code = main(["calibrate", "spmm", "--sweep", "--count", "3", "--max-rows", "300", "--max-cols", "4", "--repeats", "2", "--out", str(out)])
    assert code == 0
    records, problems = read_records(out)
    assert len(records) == 3 and problems == []
    assert main(["calibrate", "spmm", "--sweep", "--count", "0", "--out", str(out)]) == 2
    assert "--count: must be a whole number >= 1, got '0'" in capsys.readouterr().err
    assert main(["calibrate", "spmm", "--graph", "rmat:nodes=64,edges=256", "--out", str(out)]) == 2
    assert "needs --gpus" in capsys.readouterr().err
    assert main(["calibrate", "collectives", "--gpus", "1", "--out", str(out)]) == 2


def test_sweep_passes_time_the_same_matrices_and_keep_the_minimum():
    shapes = sweep_shapes(3, seed=2, rows=(64, 128), common=(64, 128), dense_cols=(1, 4), max_nnz=500)
    one = spmm_sweep(shapes, seed=5, repeats=1, passes=1)
    three = spmm_sweep(shapes, seed=5, repeats=1, passes=3)
    # shape i's matrix is drawn from the generator seeded (seed, i): same nnz in every sweep
    assert [r["nnz"] for r in one] == [r["nnz"] for r in three]
    assert all(r["passes"] == 3 and "3 interleaved pass" in r["statistic"] and r["time_ms"] > 0 for r in three)
    assert all(r["time_ms"] == r["time_min_ms"] <= r["time_median_ms"] for r in three)


def test_sweep_passes_are_interleaved_and_reduced_per_shape(monkeypatch):
    import plexus_tune.measure.spmm as calibration

    shapes = sweep_shapes(4, seed=3, rows=(64, 128), common=(64, 128), dense_cols=(1, 4), max_nnz=500)
    visits = []  # (shape index, returned time)

    def fake_spmm_ms(A, B, **kw):
        index = next(i for i, s in enumerate(shapes) if s["rows"] == A.shape[0] and s["common"] == A.shape[1] and s["dense_cols"] == B.shape[1])
        value = float(len(visits) + 1)  # strictly increasing: pass p of shape i returns its visit number
        visits.append((index, value, id(A)))
        return value

    monkeypatch.setattr(calibration, "spmm_ms", fake_spmm_ms)
    records = calibration.spmm_sweep(shapes, seed=1, passes=5, statistic="median")
    assert len(visits) == 20
    for p in range(5):  # every pass visits every shape exactly once
        assert sorted(v[0] for v in visits[4 * p:4 * p + 4]) == [0, 1, 2, 3]
    assert len({tuple(v[0] for v in visits[4 * p:4 * p + 4]) for p in range(5)}) > 1  # orders differ
    for i, r in enumerate(records):
        mine = [v[1] for v in visits if v[0] == i]
        assert r["time_min_ms"] == min(mine) and r["time_median_ms"] == float(np.median(mine))
        assert r["time_ms"] == r["time_median_ms"]
        assert len({v[2] for v in visits if v[0] == i}) == 1  # the cached matrix is reused across passes
    with pytest.raises(UserError, match="unknown sweep statistic"):
        calibration.spmm_sweep(shapes, statistic="mean")
