"""The cost model against values derived by hand from docs/model.md (SpMM, Collectives).

Toy workload: N = 1001 nodes (not divisible: exercises padding), NNZ = 5000,
widths (12, 8, 6) -> 2 layers, fp32 (u = 4). Toy machine: 4 GPUs per node,
alpha_intra 10 us, beta_intra 100 GB/s, alpha_inter 20 us, beta_inter 40 GB/s.
Times in ms: alpha_us * 1e-3, bytes / (GB/s * 1e9) * 1e3.
"""

import math
from pathlib import Path

import numpy as np
import pytest

from plexus_tune.model.costs import PREDICTION_KEYS, predict_grids, rank_order
from plexus_tune.model.estimator import CostModel, predict_table
from plexus_tune.errors import UserError
from plexus_tune.model.machine import Machine
from plexus_tune.model.workload import Workload, workload_from_dataset

W = Workload("toy", nodes=1001, nnz=5000, widths=(12, 8, 6))


def toy_machine(**over):
    data = {
        "name": "toy", "gpus_per_node": 4, "device_memory_gib": 16, "gemm_tflops": 1e-3, "elementwise_gbps": 1.0,
        "spmm": {"kind": "paper", "c0": 1e-3, "c1": 2e-4, "c2": -1e-4},
        "collectives": {"alpha_intra_us": 10, "beta_intra_gbps": 100, "alpha_inter_us": 20, "beta_inter_gbps": 40},
    }
    data.update(over)
    return Machine.from_dict(data)


def one(pred, key):
    assert pred[key].shape == (1,)
    return float(pred[key][0])


def test_g8_every_collective_term_by_hand():
    # grid 2x2x2; strides Y 1, X 2, Z 4. Y: 1*2 <= 4 intra; X: 2*2 <= 4 intra;
    # Z: 4*2 > 4 inter with beta 40 / min(4, 4) = 10 GB/s.
    # layer 0 roles (o, n, d) = (X, Y, Z): r_d = r_o = ceil(1001/2) = 501, c_i = 12/2 = 6, c_o = 8/2 = 4;
    # the features are kept in depth pieces of ceil(501/2) = 251 rows: the gather returns 2 * 251 = 502
    ag_f_z = 1 * 20e-3 + (1 / 2) * (4 * 502 * 6) / 10e9 * 1e3      # all-gather F over Z
    ar_h_x = 2 * 10e-3 + (2 * 1 / 2) * (4 * 501 * 6) / 100e9 * 1e3  # all-reduce H over X
    ag_w_z = 1 * 20e-3 + (1 / 2) * (4 * 6 * 4) / 10e9 * 1e3        # all-gather W over Z
    ar_q_y = 2 * 10e-3 + 1 * (4 * 501 * 4) / 100e9 * 1e3           # all-reduce Q over Y
    rs_dw_z = ag_w_z                                              # reduce-scatter dW over Z
    ar_dh_x = ar_h_x                                              # all-reduce dH over X
    rs_df_z = ag_f_z                                              # layer 0: reduce-scatter dF over Z
    # layer 1 roles (Z, X, Y): r_d = r_o = 501, c_i = 8/2 = 4, c_o = 6/2 = 3
    ar_h_z = 2 * 20e-3 + 1 * (4 * 501 * 4) / 10e9 * 1e3            # all-reduce H over Z
    ag_w_y = 1 * 10e-3 + (1 / 2) * (4 * 4 * 3) / 100e9 * 1e3       # all-gather W over Y
    ar_q_x = 2 * 10e-3 + 1 * (4 * 501 * 3) / 100e9 * 1e3           # all-reduce Q over X
    rs_dw_y = ag_w_y
    ar_dh_z = ar_h_z
    ar_df_y = 2 * 10e-3 + 1 * (4 * 501 * 4) / 100e9 * 1e3          # layer >= 1: all-reduce dF over Y
    # the trainer's small all-reduces: db over depth (layer 0: c_o = 4 over Z, layer 1: 3 over Y);
    # the loss on layer 1's logits (classes over o = Z, rows over d = Y): row maxima (501) and
    # sums (2 x 501) over Z, the loss sum (1) over Y
    ar_db_z = 2 * 20e-3 + 1 * (4 * 4) / 10e9 * 1e3
    ar_db_y = 2 * 10e-3 + 1 * (4 * 3) / 100e9 * 1e3
    loss_z = (2 * 20e-3 + 1 * (4 * 501) / 10e9 * 1e3) + (2 * 20e-3 + 1 * (8 * 501) / 10e9 * 1e3)
    loss_y = 2 * 10e-3 + 1 * 4 / 100e9 * 1e3
    small = ar_db_z + ar_db_y + loss_z + loss_y

    pred = predict_grids(W, toy_machine(), np.array([[2, 2, 2]]))
    x = ar_h_x + ar_dh_x + ar_q_x
    y = ar_q_y + ag_w_y + rs_dw_y + ag_w_y + ar_df_y + ar_db_y + loss_y
    z = ag_f_z + 2 * ag_w_z + rs_dw_z + rs_df_z + ar_h_z + ar_dh_z + ar_db_z + loss_z
    assert one(pred, "comm_x_ms") == pytest.approx(x, rel=1e-12)
    assert one(pred, "comm_y_ms") == pytest.approx(y, rel=1e-12)
    assert one(pred, "comm_z_ms") == pytest.approx(z, rel=1e-12)
    assert one(pred, "comm_ms") == pytest.approx(x + y + z, rel=1e-12)
    assert one(pred, "all_reduce_ms") == pytest.approx(
        ar_h_x + ar_q_y + ar_dh_x + ar_h_z + ar_q_x + ar_dh_z + ar_df_y + small, rel=1e-12)
    assert one(pred, "all_gather_ms") == pytest.approx(ag_f_z + 2 * ag_w_z + 2 * ag_w_y, rel=1e-12)
    assert one(pred, "reduce_scatter_ms") == pytest.approx(rs_dw_z + rs_df_z + rs_dw_y, rel=1e-12)

    # SpMM, the paper's per-layer form split over the layer's two local SpMMs: z = 5000/4 = 1250
    # nonzeros, f = z c_i; forward c0/2 sqrt(f) + c1 sqrt(f) r_o / c_i, backward c0/2 sqrt(f) +
    # c2 sqrt(f) r_d / c_i, with r_o = r_d = 501 and c_i = 6 (layer 0), 4 (layer 1)
    spmm = 0.0
    for c in (6, 4):
        root = math.sqrt(1250 * c)
        spmm += (0.5e-3 * root + 2e-4 * root * 501 / c) + (0.5e-3 * root - 1e-4 * root * 501 / c)
    assert one(pred, "spmm_ms") == pytest.approx(spmm, rel=1e-12)
    # GEMM: 6 r_d c_i c_o per layer at 1e9 flop/s
    gemm = (6 * 501 * 6 * 4 + 6 * 501 * 4 * 3) / 1e9 * 1e3
    assert one(pred, "gemm_ms") == pytest.approx(gemm, rel=1e-12)
    # other at 1 GB/s (docs/model.md, Other): layer 0 (hidden) relu 2 + masked backward 3 + bias
    # gradient 1 access of its 501 x 4 output, layer 1 (last) bias gradient 1 + loss 6 of 501 x 3;
    # trainable elements: features ceil(501/2) x 6, W pieces ceil(6/2) x 4 and ceil(4/2) x 3,
    # biases 4 and 3: 1531, each with 7 accesses of the fused AdamW (the default optimizer)
    trainable = 251 * 6 + 3 * 4 + 4 + 2 * 3 + 3
    elementwise_bytes = 4 * (6 * 501 * 4 + 7 * 501 * 3)
    optimizer_bytes = 4 * 7 * trainable
    other_bytes = elementwise_bytes + optimizer_bytes
    assert one(pred, "other_elementwise_ms") == pytest.approx(elementwise_bytes / 1e9 * 1e3, rel=1e-12)
    assert one(pred, "other_optimizer_ms") == pytest.approx(optimizer_bytes / 1e9 * 1e3, rel=1e-12)
    assert one(pred, "other_sync_ms") == 0.0
    assert one(pred, "other_ms") == pytest.approx(other_bytes / 1e9 * 1e3, rel=1e-12)
    assert one(pred, "total_ms") == pytest.approx(spmm + gemm + x + y + z + other_bytes / 1e6, rel=1e-12)


def test_g12_non_power_of_two_by_hand():
    # grid 2x3x2: Y (g 3, stride 1): 3 <= 4 intra; X (g 2, stride 3): 6 > 4 inter, beta 40/3;
    # Z (g 2, stride 6): inter, beta 40/min(4, 6) = 10.
    bx = 40 / 3 * 1e9
    # layer 0 roles (X, Y, Z): r_d = r_o = 501, c_i = 12/3 = 4, c_o = 8/2 = 4;
    # gathered features 2 ceil(501/2) = 502 rows, gathered W 2 ceil(4/2) = 4 rows
    ag_f_z = 20e-3 + 0.5 * (4 * 502 * 4) / 10e9 * 1e3
    ar_h_x = 2 * 20e-3 + 1 * (4 * 501 * 4) / bx * 1e3
    ag_w_z = 20e-3 + 0.5 * (4 * 4 * 4) / 10e9 * 1e3
    ar_q_y = 4 * 10e-3 + (4 / 3) * (4 * 501 * 4) / 100e9 * 1e3
    # layer 1 roles (Z, X, Y): r_d = ceil(1001/3) = 334, r_o = 501, c_i = 8/2 = 4, c_o = 6/2 = 3;
    # W kept in depth pieces of ceil(4/3) = 2 rows: the gather returns 3 * 2 = 6 rows
    ar_h_z = 2 * 20e-3 + 1 * (4 * 334 * 4) / 10e9 * 1e3
    ag_w_y = 2 * 10e-3 + (2 / 3) * (4 * 6 * 3) / 100e9 * 1e3
    ar_q_x = 2 * 20e-3 + 1 * (4 * 334 * 3) / bx * 1e3
    ar_df_y = 4 * 10e-3 + (4 / 3) * (4 * 501 * 4) / 100e9 * 1e3
    # db over depth (layer 0: 4 over Z; layer 1: 3 over Y); the loss on 334 rows: maxima and sums over Z,
    # the loss sum over Y
    ar_db_z = 2 * 20e-3 + 1 * (4 * 4) / 10e9 * 1e3
    ar_db_y = 4 * 10e-3 + (4 / 3) * (4 * 3) / 100e9 * 1e3
    loss_z = (2 * 20e-3 + 1 * (4 * 334) / 10e9 * 1e3) + (2 * 20e-3 + 1 * (8 * 334) / 10e9 * 1e3)
    loss_y = 4 * 10e-3 + (4 / 3) * 4 / 100e9 * 1e3
    pred = predict_grids(W, toy_machine(), [[2, 3, 2]])
    assert one(pred, "comm_x_ms") == pytest.approx(2 * ar_h_x + ar_q_x, rel=1e-12)
    assert one(pred, "comm_y_ms") == pytest.approx(ar_q_y + 3 * ag_w_y + ar_df_y + ar_db_y + loss_y, rel=1e-12)
    assert one(pred, "comm_z_ms") == pytest.approx(2 * ag_f_z + 3 * ag_w_z + 2 * ar_h_z + ar_db_z + loss_z,
                                                   rel=1e-12)
    assert one(pred, "reduce_scatter_ms") == pytest.approx(ag_w_z + ag_f_z + ag_w_y, rel=1e-12)
    assert one(pred, "all_gather_ms") == pytest.approx(ag_f_z + 2 * ag_w_z + 2 * ag_w_y, rel=1e-12)
    assert one(pred, "all_reduce_ms") == pytest.approx(
        2 * ar_h_x + ar_q_y + 2 * ar_h_z + ar_q_x + ar_df_y + ar_db_z + ar_db_y + loss_z + loss_y, rel=1e-12)
    # SpMM per local SpMM (paper kind): layer 0 z = ceil(5000/4) = 1250, c_i = 4, forward common
    # r_o = 501, backward common r_d = 501; layer 1 z = ceil(5000/6) = 834, c_i = 4, forward
    # common r_o = 501, backward common r_d = 334
    spmm = 0.0
    for z, c, r_o, r_d in ((1250, 4, 501, 501), (834, 4, 501, 334)):
        root = math.sqrt(z * c)
        spmm += 1e-3 * root + 2e-4 * root * r_o / c - 1e-4 * root * r_d / c
    assert one(pred, "spmm_ms") == pytest.approx(spmm, rel=1e-12)
    gemm = (6 * 501 * 4 * 4 + 6 * 334 * 4 * 3) / 1e9 * 1e3
    assert one(pred, "gemm_ms") == pytest.approx(gemm, rel=1e-12)


def test_blocked_aggregation_adds_latency_only():
    m = toy_machine()
    plain = predict_grids(W, m, [[2, 2, 2]])
    blocked = predict_grids(W, m, [[2, 2, 2]], block_rows=100)
    # ceil(501 / 100) = 6 messages instead of 1 in each forward aggregation all-reduce:
    # layer 0 over X (intra, 2 steps of 10 us), layer 1 over Z (inter, 2 steps of 20 us)
    extra_x = 5 * 2 * 10e-3
    extra_z = 5 * 2 * 20e-3
    assert one(blocked, "comm_x_ms") - one(plain, "comm_x_ms") == pytest.approx(extra_x)
    assert one(blocked, "comm_z_ms") - one(plain, "comm_z_ms") == pytest.approx(extra_z)
    assert one(blocked, "comm_y_ms") == pytest.approx(one(plain, "comm_y_ms"))
    # the forward SpMM of each layer runs as 6 blocks of 1250 / 6 nonzeros: each block pays
    # c0/2 sqrt(f / 6) + c1 sqrt(f / 6) r_o / c_i, so the forward grows by sqrt(6)
    extra = sum((math.sqrt(6) - 1) * math.sqrt(1250 * c) * (0.5e-3 + 2e-4 * 501 / c) for c in (6, 4))
    assert one(blocked, "spmm_ms") - one(plain, "spmm_ms") == pytest.approx(extra, rel=1e-9)


def roofline(**coefs):
    full = dict(const=0.0, flops=0.0, sparse_bytes=0.0, dense_in_bytes=0.0, out_bytes=0.0, rows=0.0)
    full.update(coefs)
    return {"kind": "roofline", "bytes_per_element": 4, "coefficients": full}


def test_per_spmm_kinds_get_padded_local_shapes():
    grid = [[2, 3, 2]]
    # rows term: forward rows r_d, backward rows r_o. Layer 0: 501 + 501; layer 1: 334 + 501
    pred = predict_grids(W, toy_machine(spmm=roofline(rows=1.0)), grid)
    assert one(pred, "spmm_ms") == pytest.approx(501 + 501 + 334 + 501)
    # dense operand read: 4 * common * k; forward common r_o, backward common r_d
    pred = predict_grids(W, toy_machine(spmm=roofline(dense_in_bytes=1.0)), grid)
    assert one(pred, "spmm_ms") == pytest.approx(4 * (501 * 4 + 501 * 4) + 4 * (501 * 4 + 334 * 4))
    # flops 2 nnz k with nnz = ceil(5000 / (g_d g_o)): layer 0 ceil(5000/4) = 1250, k 4; layer 1 ceil(5000/6) = 834, k 4
    pred = predict_grids(W, toy_machine(spmm=roofline(flops=1.0)), grid)
    assert one(pred, "spmm_ms") == pytest.approx(2 * (2 * 1250 * 4) + 2 * (2 * 834 * 4))
    # blocked forward SpMM: ceil(501/100) = 6 and ceil(334/100) = 4 blocks, each paying the constant
    pred = predict_grids(W, toy_machine(spmm=roofline(const=1.0)), grid, block_rows=100)
    assert one(pred, "spmm_ms") == pytest.approx((6 + 1) + (4 + 1))


def test_figure5_3d_grids_rank_ahead_of_1d():
    w = workload_from_dataset("ogbn-products", layers=3, hidden=128)
    pred = CostModel("perlmutter-paper").predict(w, 64)
    order = rank_order(pred)
    grids = np.stack([pred["gx"], pred["gy"], pred["gz"]], axis=1)[order]
    position = {tuple(map(int, g)): i for i, g in enumerate(grids)}
    one_d = [(64, 1, 1), (1, 64, 1), (1, 1, 64)]
    three_d = [g for g in position if min(g) > 1]
    assert len(three_d) == 10
    assert max(position[g] for g in three_d) < min(position[g] for g in one_d)
    best = tuple(map(int, grids[0]))
    assert min(best) > 1 and max(best) <= 8  # the best grid is 3D and near-symmetric
    assert pred["feasible"].all()


def test_paper_spmm_against_its_published_shape():
    # the paper's claim: the same flops, Gx = 64 (common dimension split) is cheaper
    # in the penalty terms than Gy = 64 (skinny dense operand)
    w = workload_from_dataset("ogbn-products")
    m = toy_machine(spmm={"kind": "paper", "c0": 7.8e-4, "c1": 7.8e-10, "c2": -2.6e-10})
    t = predict_grids(w, m, [[64, 1, 1], [1, 64, 1]])["spmm_ms"]
    assert t[0] < t[1]


def test_rank_order_and_infeasible_grids():
    w = workload_from_dataset("ogbn-papers100M")
    pred = predict_grids(w, "perlmutter-paper", [[1, 1, 1], [2, 2, 2], [8, 8, 4]])
    assert list(pred["feasible"]) == [False, False, True]
    order = rank_order(pred)
    assert order[0] == 2  # the only feasible grid ranks first, whatever its time
    assert set(PREDICTION_KEYS) <= set(pred)


def test_vectorized_equals_one_at_a_time_and_table():
    w = workload_from_dataset("reddit")
    m = toy_machine()
    grids = np.array([[1, 2, 6], [3, 4, 1], [2, 3, 2], [12, 1, 1]])
    all_at_once = predict_grids(w, m, grids)
    for k, g in enumerate(grids):
        single = predict_grids(w, m, [g])
        for key in ("total_ms", "comm_ms", "spmm_ms", "memory_bytes"):
            assert single[key][0] == pytest.approx(all_at_once[key][k], rel=1e-12)
    df = predict_table(w, m, grids, top=3)
    assert list(df["rank"]) == [1, 2, 3]
    assert df["total_ms"].is_monotonic_increasing


def reference_paper_comm_ms(n, widths, grid, beta_intra=200.0, beta_inter=100.0, per_node=4):
    """Scalar re-derivation of docs/model.md, Per-layer collectives, without latency and padding."""
    gx, gy, gz = grid
    sizes = {"x": gx, "y": gy, "z": gz}
    stride = {"y": 1, "x": gy, "z": gx * gy}
    roles = [("x", "y", "z"), ("z", "x", "y"), ("y", "z", "x")]

    def bw(axis):
        p, g = stride[axis], sizes[axis]
        return beta_intra if p * g <= per_node else beta_inter / min(per_node, p)

    def ring(axis, nbytes, all_reduce):
        g = sizes[axis]
        share = (2 if all_reduce else 1) * (g - 1) / g
        return share * nbytes / (bw(axis) * 1e9) * 1e3

    total = 0.0
    for i in range(len(widths) - 1):
        o, inner, d = roles[i % 3]
        go, gn, gd = sizes[o], sizes[inner], sizes[d]
        f = 4 * (n / go) * (widths[i] / gn)
        h = 4 * (n / gd) * (widths[i] / gn)
        w = 4 * (widths[i] / gn) * (widths[i + 1] / go)
        q = 4 * (n / gd) * (widths[i + 1] / go)
        total += ring(d, f, False) if i == 0 else 0.0
        total += ring(o, h, True) + ring(d, w, False) + ring(inner, q, True)
        total += ring(d, w, False) + ring(d, w, False) + ring(o, h, True)
        total += ring(d, f, i != 0)
    return total


def test_perlmutter_paper_matches_scalar_reference_on_every_grid():
    w = workload_from_dataset("ogbn-products")
    pred = predict_grids(w, "perlmutter-paper", 64)
    for k in range(len(pred["gx"])):
        grid = (int(pred["gx"][k]), int(pred["gy"][k]), int(pred["gz"][k]))
        ref = reference_paper_comm_ms(w.nodes, w.widths, grid)
        assert pred["comm_ms"][k] == pytest.approx(ref, rel=1e-12), grid


def test_unpadded_option_divides_exactly():
    # all-reduce of Q over Y on the 2x2x2 grid, layer 0: M = 4 * (1001/2) * (8/2) exactly; the paper's
    # model also leaves out the trainer's db all-reduce (layer 1 over Y, 3 columns) and loss sum (over Y)
    pred = predict_grids(W, toy_machine(padded_sizes=False), [[2, 2, 2]])
    padded = predict_grids(W, toy_machine(), [[2, 2, 2]])
    assert one(padded, "comm_y_ms") - one(pred, "comm_y_ms") == pytest.approx(
        1 * (4 * 501 * 4 - 4 * 500.5 * 4) / 100e9 * 1e3      # layer 0 AR Q over Y
        + 2 * (1 / 2) * (4 * 4 * 3 - 4 * 4 * 3) / 100e9 * 1e3  # layer 1 W blocks are exact anyway
        + 1 * (4 * 501 * 4 - 4 * 500.5 * 4) / 100e9 * 1e3     # layer 1 AR dF over Y
        + 2 * 10e-3 + 1 * (4 * 3) / 100e9 * 1e3               # db over Y
        + 2 * 10e-3 + 1 * 4 / 100e9 * 1e3,                    # the loss sum over Y
        rel=1e-9)


def test_negative_paper_spmm_is_clipped_and_flagged():
    # c2 < 0 with depth much smaller than outer drives the paper form below zero
    m = toy_machine(spmm={"kind": "paper", "c0": 1e-3, "c1": 0.0, "c2": -1.0})
    pred = predict_grids(W, m, [[8, 1, 1], [1, 1, 1]])
    assert list(pred["spmm_clipped"]) == [True, True]
    assert list(pred["spmm_ms"]) == [0.0, 0.0]
    ok = predict_grids(workload_from_dataset("ogbn-products"), "perlmutter-paper", 64)
    assert not ok["spmm_clipped"].any() and (ok["spmm_ms"] > 0).all()


def test_epoch_overhead_is_added_to_every_grid_total():
    import json

    from plexus_tune.model.machine import Machine

    base = json.loads((Path(__file__).resolve().parents[1] / "models" / "perlmutter-paper.json").read_text())
    with_overhead = dict(base, epoch_overhead_ms=12.5)
    workload = workload_from_dataset("ogbn-products")
    plain = predict_grids(workload, Machine.from_dict(base), 8)
    shifted = predict_grids(workload, Machine.from_dict(with_overhead), 8)
    assert np.all(plain["overhead_ms"] == 0.0)
    assert np.allclose(shifted["overhead_ms"], 12.5)
    assert np.allclose(shifted["total_ms"] - plain["total_ms"], 12.5)
    assert np.allclose(shifted["other_ms"], plain["other_ms"])


def test_negative_epoch_overhead_is_rejected():
    import json

    from plexus_tune.model.machine import Machine

    base = json.loads((Path(__file__).resolve().parents[1] / "models" / "perlmutter-paper.json").read_text())
    with pytest.raises(UserError, match="epoch_overhead_ms"):
        Machine.from_dict(dict(base, epoch_overhead_ms=-1.0))


def test_ranks_time_sharing_cpu_cores_stretch_every_modelled_part():
    from plexus_tune.model.machine import oversubscription, time_sharing_factor

    # hand values: 8 one-thread ranks on 2 cores take 4x; 2 ranks of 2 threads on 8 cores are not stretched
    assert time_sharing_factor(8, 1, 2) == 4.0 and time_sharing_factor(2, 2, 8) == 1.0 and time_sharing_factor(3, 2, 4) == 1.5
    gpu, cpu = toy_machine(), toy_machine(host_cores=2)
    cpu2 = toy_machine(host_cores=2, threads_per_rank=2)
    grids = np.array([[1, 1, 1], [2, 1, 1], [2, 2, 1], [2, 2, 2], [1, 1, 12]])
    # ranks per node are capped by gpus_per_node (4): G = 8 and G = 12 span nodes of 4 ranks
    assert list(oversubscription(cpu, grids.prod(axis=1))) == [1.0, 1.0, 2.0, 2.0, 2.0]
    assert list(oversubscription(cpu2, grids.prod(axis=1))) == [1.0, 2.0, 4.0, 4.0, 4.0]
    assert list(oversubscription(gpu, grids.prod(axis=1))) == [1.0] * 5
    plain, shared = predict_grids(W, gpu, grids), predict_grids(W, cpu, grids)
    factor = np.array([1.0, 1.0, 2.0, 2.0, 2.0])
    for key in ("spmm_ms", "gemm_ms", "comm_ms", "comm_x_ms", "comm_z_ms", "all_reduce_ms", "reduce_scatter_ms", "other_ms"):
        assert np.allclose(shared[key], factor * plain[key]), key
    assert np.allclose(shared["overhead_ms"], plain["overhead_ms"])
    assert np.allclose(shared["total_ms"], shared["spmm_ms"] + shared["gemm_ms"] + shared["comm_ms"] + shared["other_ms"])
    assert np.allclose(shared["oversubscription"], factor)
    for bad in (0, 1.5, -2):
        with pytest.raises(UserError, match="host_cores"):
            toy_machine(host_cores=bad)
    with pytest.raises(UserError, match="threads_per_rank"):
        toy_machine(host_cores=2, threads_per_rank=0)


def test_fixed_features_drop_layer0_feature_gradient_by_hand():
    # grid 2x2x2 as in test_g8_every_collective_term_by_hand: layer 0 roles (X, Y, Z); fixed
    # features drop its backward all-gather of W over Z, all-reduce of dH over X,
    # reduce-scatter of dF over Z, backward SpMM, the dH GEMM and the features' gradient
    # and optimizer state (3 of 4 copies of ceil(501/2) x 6 elements)
    m = toy_machine()
    plain = predict_grids(W, m, [[2, 2, 2]])
    fixed = predict_grids(W, m, [[2, 2, 2]], fixed_features=True)
    ag_w_z = 1 * 20e-3 + (1 / 2) * (4 * 6 * 4) / 10e9 * 1e3
    ar_dh_x = 2 * 10e-3 + (2 * 1 / 2) * (4 * 501 * 6) / 100e9 * 1e3
    rs_df_z = 1 * 20e-3 + (1 / 2) * (4 * 502 * 6) / 10e9 * 1e3
    assert one(plain, "comm_x_ms") - one(fixed, "comm_x_ms") == pytest.approx(ar_dh_x, rel=1e-9)
    assert one(plain, "comm_z_ms") - one(fixed, "comm_z_ms") == pytest.approx(ag_w_z + rs_df_z, rel=1e-9)
    assert one(plain, "comm_y_ms") == pytest.approx(one(fixed, "comm_y_ms"), rel=1e-12)
    root = math.sqrt(1250 * 6)
    assert one(plain, "spmm_ms") - one(fixed, "spmm_ms") == pytest.approx(0.5e-3 * root - 1e-4 * root * 501 / 6)
    assert one(plain, "gemm_ms") - one(fixed, "gemm_ms") == pytest.approx(2 * 501 * 6 * 4 / 1e9 * 1e3)
    assert one(plain, "memory_bytes") - one(fixed, "memory_bytes") == pytest.approx(3 * 251 * 6 * 4)
    # the optimizer (7 accesses, fused AdamW) and the gradient pass (1) no longer touch the features
    features = 251 * 6
    assert one(plain, "other_optimizer_ms") - one(fixed, "other_optimizer_ms") == pytest.approx(
        4 * 7 * features / 1e9 * 1e3)


def test_overlap_hides_each_blocks_all_reduce_under_the_next_spmm_by_hand():
    # 2x2x2, block_rows 100: 6 blocks of the forward aggregation in each layer. Per block, the
    # all-reduce (layer 0 over X, intra: 2 alpha 10 us; layer 1 over Z, inter: 2 alpha 20 us,
    # beta 10 GB/s) is far shorter than the block's SpMM, so (6 - 1) all-reduces are hidden
    m = toy_machine()
    plain = predict_grids(W, m, [[2, 2, 2]], block_rows=100)
    over = predict_grids(W, m, [[2, 2, 2]], block_rows=100, overlap=True)
    ar0 = (6 * 2 * 10e-3 + (4 * 501 * 6) / 100e9 * 1e3) / 6
    ar1 = (6 * 2 * 20e-3 + (4 * 501 * 4) / 10e9 * 1e3) / 6
    # the SpMM of a block: c0/2 sqrt(f) + c1 sqrt(f) r_o / c_i, f = (1250 / 6) c_i
    for c in (6, 4):
        root = math.sqrt(1250 / 6 * c)
        assert 0.5e-3 * root + 2e-4 * root * 501 / c > max(ar0, ar1)
    assert one(plain, "comm_x_ms") - one(over, "comm_x_ms") == pytest.approx(5 * ar0, rel=1e-9)
    assert one(plain, "comm_z_ms") - one(over, "comm_z_ms") == pytest.approx(5 * ar1, rel=1e-9)
    assert one(over, "overlap_hidden_ms") == pytest.approx(5 * (ar0 + ar1), rel=1e-9)
    assert one(plain, "total_ms") - one(over, "total_ms") == pytest.approx(5 * (ar0 + ar1), rel=1e-9)
    assert one(over, "spmm_ms") == one(plain, "spmm_ms")
    # one block: nothing to overlap
    assert one(predict_grids(W, m, [[2, 2, 2]], overlap=True), "total_ms") == pytest.approx(
        one(predict_grids(W, m, [[2, 2, 2]]), "total_ms"))
