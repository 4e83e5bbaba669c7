"""The planner's ScaleGNN 4D mini-batch model (model/scalegnn) and predict --algorithm scalegnn-4d."""

import itertools
import json

import numpy as np
import pytest

from plexus_tune.graph import gcn_normalize
from plexus_tune.graph.generators import rmat_adjacency
from plexus_tune.graph.sampling import expected_sampled_nnz
from plexus_tune.model.breakdown import TOTAL_PARTS
from plexus_tune.model.comm_precision import parse_comm_precision
from plexus_tune.model.machine import collective_time_ms, load_machine
from plexus_tune.model.scalegnn import (
    MEMORY_PARTS,
    configurations,
    graph_sampled_nnz,
    parameter_elements,
    predict_config,
    rank_minibatch,
    sampled_nnz_per_shard,
    step_collectives,
    steps_per_epoch,
)
from plexus_tune.model.workload import Workload, workload_from_dataset

FP32 = parse_comm_precision("fp32")
ALL_ON = {"rmsnorm": True, "residual": True, "dropout": True}


def test_configurations_are_every_gd_with_every_3d_grid():
    got = {tuple(r) for r in configurations(12).tolist()}
    want = {c for c in itertools.product(range(1, 13), repeat=4) if np.prod(c) == 12}
    assert got == want
    assert {tuple(r) for r in configurations(8, dp=2).tolist()} == {
        c for c in itertools.product(range(1, 9), repeat=4) if np.prod(c) == 8 and c[0] == 2}


def test_epoch_is_steps_times_step_and_parts_add_up():
    w = workload_from_dataset("ogbn-products")
    m = load_machine("perlmutter")
    for dp, grid in ((1, (2, 2, 2)), (4, (2, 1, 1)), (8, (1, 1, 1))):
        p = predict_config(w, m, dp, grid, 8192, choice=FP32)
        assert p["steps"] == steps_per_epoch(w.nodes, 8192, dp) == -(-w.nodes // (8192 * dp))
        assert p["total_ms"] == pytest.approx(sum(p[k] for k in TOTAL_PARTS))
        assert p["total_ms"] - p["overhead_ms"] - p["other_sync_ms"] == pytest.approx(p["steps"] * p["step_ms"])
        assert p["comm_ms"] == pytest.approx(p["comm_x_ms"] + p["comm_y_ms"] + p["comm_z_ms"] + p["comm_dp_ms"])
        assert p["memory_bytes"] == pytest.approx(sum(p[f"memory_{k}_bytes"] for k in MEMORY_PARTS))
        assert p["other_ms"] == pytest.approx(p["other_elementwise_ms"] + p["other_optimizer_ms"] + p["other_sync_ms"]
                                              + p["other_sampling_ms"])


def test_data_parallel_all_reduce_crosses_at_stride_of_the_group():
    w = Workload("t", 4096, 40960, (16, 8, 8, 4))
    m = load_machine("perlmutter")
    one = predict_config(w, m, 1, (2, 1, 1), 64, choice=FP32, fixed_features=True)
    two = predict_config(w, m, 2, (2, 1, 1), 64, choice=FP32, fixed_features=True)
    assert one["comm_dp_ms"] == 0
    # hand count on 2x1x1, h = 8, D_0 = 16, C = 4, 3 layers: W_in 16x8; layer 0 (n = Y, o = X) 8x4 + scale 4;
    # layer 1 (n = X, o = Z) 4x8 + 8; layer 2 (n = Z, o = Y) 8x8 + 8; head (roles of layer 3: n = Y, d = Z) 8x4
    assert parameter_elements(w, (2, 1, 1), ALL_ON) == 128 + 36 + 40 + 72 + 32
    want = float(collective_time_ms(m, "all_reduce", 2, 2, 4.0 * 308)) * two["steps"]
    assert two["comm_dp_ms"] == pytest.approx(want)
    # trained input features: the groups' sampled-row gradients (64 / Gx = 32 rows x 16) all-gathered at
    # the same stride, the rank's 2048 x 16 feature block in the optimizer step and 3 more copies in memory
    trained = predict_config(w, m, 2, (2, 1, 1), 64, choice=FP32)
    gather = float(collective_time_ms(m, "all_gather", 2, 2, 2 * 4.0 * 32 * 16)) * two["steps"]
    assert trained["comm_dp_ms"] == pytest.approx(want + gather)
    assert trained["all_gather_ms"] - two["all_gather_ms"] == pytest.approx(gather)
    assert trained["other_optimizer_ms"] / two["other_optimizer_ms"] == pytest.approx((308 + 2048 * 16) / 308)
    assert trained["memory_features_bytes"] - two["memory_features_bytes"] == pytest.approx(3 * 4.0 * 2048 * 16)
    assert trained["gemm_ms"] > two["gemm_ms"]


def test_one_rank_per_group_communicates_only_across_groups():
    w = Workload("t", 4096, 40960, (16, 8, 8, 4))
    m = load_machine("perlmutter")
    p = predict_config(w, m, 4, (1, 1, 1), 64, choice=FP32)
    assert p["comm_x_ms"] == p["comm_y_ms"] == p["comm_z_ms"] == 0
    assert p["comm_ms"] == p["comm_dp_ms"] > 0


def test_switching_components_off_removes_their_collectives():
    w = Workload("t", 4096, 40960, (16, 8, 8, 4))
    on = step_collectives(w, (2, 2, 2), 64, ALL_ON)
    off = step_collectives(w, (2, 2, 2), 64, {"rmsnorm": False, "residual": False, "dropout": False})
    assert len(on) - len(off) == 3 * (3 + 4)  # per layer: RMSNorm 3, residual reshard 4


def test_sampled_nonzeros_from_the_expectation_and_from_a_graph():
    adj = gcn_normalize(rmat_adjacency(4096, 32768, seed=1))
    w = Workload("g", 4096, adj.nnz, (16, 32, 32, 4))
    per_shard = sampled_nnz_per_shard(w, (2, 2, 1), 512)
    assert per_shard[0] == pytest.approx(float(expected_sampled_nnz(4096, adj.nnz, 512)) / 2)  # layer 0: rows over Z (1), columns over X (2)
    per_layer = graph_sampled_nnz(adj, 512, samples=100)
    want = float(expected_sampled_nnz(4096, adj.nnz, 512))
    assert per_layer((1, 1, 1))[0] == pytest.approx(want, rel=0.06)  # one shard: the whole A_S
    # R-MAT's skew: the largest of 4 sampled shards holds well over a quarter
    assert per_layer((2, 1, 2))[0] > 1.2 * want / 4
    ranked = rank_minibatch(w, "perlmutter", 4, batch_sizes=[512], graph=adj, dp=1)
    mean = rank_minibatch(w, "perlmutter", 4, batch_sizes=[512], dp=1)
    by = {r["config"]: r for r in mean}
    assert ranked[0]["spmm_ms"] != by[ranked[0]["config"]]["spmm_ms"]


def test_rank_is_by_feasible_then_time_and_batches_are_searched():
    w = workload_from_dataset("ogbn-products")
    records = rank_minibatch(w, "perlmutter", 16, batch_sizes=[4096, 65536])
    assert len(records) == 2 * len(configurations(16))
    times = [r["total_ms"] for r in records if r["feasible"]]
    assert times == sorted(times)
    assert {r["batch_size"] for r in records} == {4096, 65536}


def test_predict_cli_ranks_gd_grid_and_batch(run_cli):
    code, out, err = run_cli(["predict", "--algorithm", "scalegnn-4d", "--dataset", "ogbn-papers100M", "--gpus",
                              "2048", "--machine", "perlmutter", "--batch-size", "131072", "--top", "5"])
    assert code == 0, err
    assert "Recommended: Gd " in out and "comm DP" in out and "mem GiB" in out
    assert len([ln for ln in out.splitlines() if ln.startswith("│")]) == 5
    code, out, err = run_cli(["predict", "--algorithm", "scalegnn-4d", "--dataset", "ogbn-products", "--gpus", "8",
                              "--machine", "perlmutter", "--batch-size", "4096", "--dp", "2", "--format", "json",
                              "--top", "0"])
    assert code == 0, err
    records = json.loads(out)
    assert {(r["gd"], r["gx"], r["gy"], r["gz"]) for r in records} == {tuple(c) for c in configurations(8, 2).tolist()}


def test_all_lists_the_minibatch_family_apart_and_compares_only_with_epochs(run_cli):
    base = ["predict", "--algorithm", "all", "--dataset", "ogbn-products", "--gpus", "8", "--machine", "perlmutter",
            "--batch-size", "16384", "--top", "3"]
    code, out, err = run_cli(base)
    assert code == 0, err
    assert "scalegnn-4d (mini-batch" in out and "is not a full-graph epoch" in out and "time to accuracy" not in out
    code, out, err = run_cli(base + ["--epochs-to-accuracy", "full=100,minibatch=20"])
    assert code == 0, err
    assert "time to accuracy: full-graph" in out


@pytest.mark.parametrize("extra,needle", [
    (["--batch-size", "1"], "--batch-size"),
    (["--batch-size", "999999999"], "--batch-size"),
    (["--dp", "3"], "--dp"),
    (["--epochs-to-accuracy", "full=3,minibatch=2"], "--epochs-to-accuracy"),
    (["--block-rows", "4"], "--block-rows"),
])
def test_bad_minibatch_input_is_one_line_and_exit_2(run_cli, extra, needle):
    code, out, err = run_cli(["predict", "--algorithm", "scalegnn-4d", "--dataset", "ogbn-products", "--gpus", "8",
                              "--machine", "perlmutter"] + extra)
    assert code == 2
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_minibatch_flags_need_the_family(run_cli):
    code, _, err = run_cli(["predict", "--dataset", "ogbn-products", "--gpus", "8", "--machine", "perlmutter",
                            "--batch-size", "4096"])
    assert code == 2 and "--algorithm scalegnn-4d" in err
    code, _, err = run_cli(["predict", "--algorithm", "all", "--dataset", "ogbn-products", "--gpus", "8", "--machine",
                            "perlmutter", "--epochs-to-accuracy", "full=x"])
    assert code == 2 and "--epochs-to-accuracy" in err


def test_paper_scaling_series_keeps_a_near_cubic_grid_and_doubles_gd():
    from plexus_tune.model.scalegnn import near_cubic_grids, scaling_series

    assert {tuple(g) for g in near_cubic_grids(64).tolist()} == {(4, 4, 4)}
    assert {tuple(g) for g in near_cubic_grids(32).tolist()} == {(4, 4, 2), (4, 2, 4), (2, 4, 4)}
    w = workload_from_dataset("ogbn-papers100M")
    series = scaling_series(w, "perlmutter", 64, 2048, 131072)
    assert series["grid"] == (4, 4, 4)
    rows = series["rows"]
    assert [r["gd"] for r in rows] == [1, 2, 4, 8, 16, 32] and [r["gpus"] for r in rows] == [64 * 2**k for k in range(6)]
    for a, b in zip(rows, rows[1:]):  # the step grows with Gd (the all-reduce), so speedup <= the steps' ratio
        assert b["step_ms"] >= a["step_ms"] and b["total_ms"] < a["total_ms"]
    assert 1 < rows[-1]["speedup"] <= rows[0]["steps"] / rows[-1]["steps"]
    assert rows[0]["comm_dp_ms"] == 0 < rows[-1]["comm_dp_ms"]


def test_a_logged_prediction_equals_predict_for_the_same_settings():
    from plexus_tune.measure.identity import predict_record
    from plexus_tune.measure.training import config_fields
    from plexus_tune.trainer import TrainConfig

    w = Workload("g", 4096, 40960, (16, 32, 32, 4))
    config = TrainConfig(algorithm="scalegnn-4d", grid=(2, 1, 2), dp=2, batch_size=512, hidden=32, layers=3,
                         synthetic="rmat:nodes=4096,edges=16384,features=16,classes=4,seed=0", comm_precision="bf16")
    logged = predict_record(config_fields(config), "perlmutter", workload=w)
    ranked = rank_minibatch(w, "perlmutter", 8, batch_sizes=[512], dp=2, comm_precision="bf16")
    want = next(r for r in ranked if r["grid"] == "2x1x2")
    assert logged["algorithm"] == "scalegnn-4d"
    for key in ("total_ms", "spmm_ms", "comm_ms", "other_ms", "memory_bytes"):
        assert logged[key] == pytest.approx(want[key], rel=1e-12), key


def test_search_points_the_minibatch_family_to_predict(run_cli):
    code, _, err = run_cli(["search", "--algorithm", "scalegnn-4d", "--dataset", "ogbn-products", "--gpus", "8",
                            "--machine", "perlmutter"])
    assert code == 2 and "predict --algorithm scalegnn-4d" in err and len(err.strip().splitlines()) == 1


def test_prefetch_hides_what_the_rest_of_the_step_covers_and_holds_two_samples():
    """As the trainer prefetches: step t ends waiting for step t + 1's sampling, so a step exposes
    max(0, sampling - the rest of the step); the next A_S and A_S^T exist beside the current ones.
    ogbn-products: the step covers the sampling; a graph of degree 10,000 sampled 1,024 vertices at
    a time: the sampled rows' gathers outlast the step."""
    m = load_machine("perlmutter")
    cases = ((workload_from_dataset("ogbn-products"), 2, (2, 2, 1), 8192, False),
             (Workload("dense", 10**5, 10**9, (16, 8, 8, 4)), 1, (1, 1, 1), 1024, True))
    for w, dp, grid, batch, exposed in cases:
        on = predict_config(w, m, dp, grid, batch, choice=FP32, fixed_features=True)
        off = predict_config(w, m, dp, grid, batch, choice=FP32, fixed_features=True, prefetch=False)
        assert off["other_sampling_ms"] == pytest.approx(off["sampling_ms"]) and off["sampling_hidden_ms"] == 0
        rest = off["step_ms"] * off["steps"] - off["other_sampling_ms"]  # the steps without their sampling
        assert on["other_sampling_ms"] == pytest.approx(max(0.0, on["sampling_ms"] - rest))
        assert (on["other_sampling_ms"] > 0) == exposed
        assert on["sampling_hidden_ms"] == pytest.approx(on["sampling_ms"] - on["other_sampling_ms"])
        assert on["total_ms"] < off["total_ms"]
        assert on["memory_sampled_bytes"] == pytest.approx(2 * off["memory_sampled_bytes"])
