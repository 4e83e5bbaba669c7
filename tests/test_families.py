"""Cost and memory models of the CAGNET and SuperGCN families, the joint planner and its CLI."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from plexus_tune.errors import UserError
from plexus_tune.graph.partition import exchange_plan
from plexus_tune.model.breakdown import COMM_OP_KEYS, TOTAL_PARTS
from plexus_tune.model.family import FAMILIES, family_names, family_of
from plexus_tune.model.family_costs import (
    exchange_stats,
    point_to_point_ms,
    schedule_times,
)
from plexus_tune.model.machine import Machine, load_machine
from plexus_tune.model.planner import joint_ranking, joint_space_size
from plexus_tune.model.volumes import CommCall, UniformExchange
from plexus_tune.model.workload import Workload, workload_from_dataset
from plexus_tune.model.comm_precision import parse_comm_precision


def tiny_machine(**collectives):
    coll = {"alpha_intra_us": 1.0, "beta_intra_gbps": 10.0, "alpha_inter_us": 5.0, "beta_inter_gbps": 1.0}
    coll.update(collectives)
    return Machine.from_dict({"name": "tiny", "gpus_per_node": 2, "device_memory_gib": 1, "gemm_tflops": 1,
                              "spmm": {"kind": "paper", "c0": 1e-3, "c1": 0.0, "c2": 0.0}, "collectives": coll})


def test_point_to_point_time_hand_derived():
    # 4 ranks on 2 nodes: rank 0 sends 3 rows to 1 (same node) and 2 to 2 (other node),
    # rank 1 sends 1 row to 3; both ranks of node 0 send across nodes and share its link fairly:
    # rank 1's row is through when 2 rows have crossed, rank 0's 2 when the node's 3 have
    rows = np.zeros((4, 4))
    rows[0, 1], rows[0, 2], rows[1, 3] = 3, 2, 1
    machine = tiny_machine()
    stats = exchange_stats(rows, 2)
    t0 = 1e-3 * (1 * 1.0 + 1 * 5.0) + 1e-6 * 1000 * (3 / 10.0 + 3 / 1.0)
    t1 = 1e-3 * 5.0 + 1e-6 * 1000 * (2 / 1.0)
    assert point_to_point_ms(machine, stats, 1000.0) == pytest.approx(max(t0, t1))
    unshared = exchange_stats(rows, 2, sharing=False)
    assert point_to_point_ms(machine, unshared, 1000.0) == pytest.approx(1e-3 * 6.0 + 1e-6 * 1000 * (0.3 + 2.0))


def test_uniform_exchange_equals_its_matrix():
    machine = tiny_machine()
    matrix = np.full((6, 6), 2.5)
    np.fill_diagonal(matrix, 0)
    a = point_to_point_ms(machine, exchange_stats(matrix, 2), 64.0)
    b = point_to_point_ms(machine, exchange_stats(UniformExchange(6, 2.5), 2), 64.0)
    assert a == pytest.approx(b)


def test_broadcast_is_a_pipelined_ring():
    # g = 2 ranks inside a node: (g-1) alpha + M / beta
    machine = tiny_machine()
    call = CommCall("b", "broadcast", "aggregation", "forward", 0, 2, 1, 1e6, 10, 3, np.zeros(2))
    times = schedule_times(machine, [call], parse_comm_precision("fp32"), 4)
    assert times["broadcast_ms"] == pytest.approx(3 * (1e-3 * 1.0 + 1e-6 * 1e6 / 10.0))
    assert times["comm_ms"] == times["broadcast_ms"] == times["comm_x_ms"]


def test_15d_memory_hand_derived():
    # N = 10, NNZ = 30, widths 3 -> 2 on 4 ranks, c = 1: b = 3 rows; a rank runs all 4 stages and
    # keeps its block row as 4 pieces of 3 rows and 30/16 nonzeros each
    w = Workload("t", 10, 30, (3, 2))
    pred = FAMILIES["cagnet-1d"].predict(w, load_machine("perlmutter"), [(4, 1, 1)])
    z = 4 * 30 / 16
    expected = {
        "adjacency": 2 * (z * 8 + (4 * 3 + 4) * 4),  # A and A^T: nnz (4 + 4) + (rows + one per piece) 4
        "weights": 4 * (3 + 1) * 2 * 4,  # value, gradient, two moments of W (3 x 2) and b (2)
        "features": 4 * 3 * 3 * 4,  # trainable input block b x D_0
        "activations": (2 * 3 * 3 + 2 * 3 * 2) * 4,
        "gathered": 3 * 3 * 4,  # one received block b x max D_i
        "labels": 8 * 3,
    }
    for part, value in expected.items():
        assert pred[f"memory_{part}_bytes"][0] == pytest.approx(value)
    assert pred["memory_bytes"][0] == pytest.approx(sum(expected.values()))


@pytest.mark.parametrize("family,grid", [("cagnet-1d", (16, 1, 1)), ("cagnet-1.5d", (4, 4, 1)), ("cagnet-2d", (4, 4, 1)),
                                         ("cagnet-3d", (2, 2, 4)), ("supergcn", (16, 1, 1))])
def test_parts_add_up(family, grid):
    w = workload_from_dataset("ogbn-products")
    for precision in ("fp32", "int8"):
        pred = FAMILIES[family].predict(w, load_machine("perlmutter"), [grid], comm_precision=precision)
        assert pred["total_ms"][0] == pytest.approx(sum(pred[k][0] for k in TOTAL_PARTS))
        assert pred["comm_ms"][0] == pytest.approx(sum(pred[k][0] for k in COMM_OP_KEYS))
        assert pred["comm_ms"][0] == pytest.approx(pred["comm_x_ms"][0] + pred["comm_y_ms"][0] + pred["comm_z_ms"][0])
        assert pred["comm_ms"][0] > 0 and pred["spmm_ms"][0] > 0


def test_reduced_precision_shortens_the_exchange():
    w = workload_from_dataset("ogbn-products")
    m = load_machine("perlmutter")
    fp32 = FAMILIES["supergcn"].predict(w, m, [(64, 1, 1)], comm_precision="fp32")
    int2 = FAMILIES["supergcn"].predict(w, m, [(64, 1, 1)], comm_precision="int2")
    assert int2["point_to_point_ms"][0] < fp32["point_to_point_ms"][0] / 4


def ring_graph(n=64):
    rows = np.arange(n)
    a = sp.csr_matrix((np.ones(2 * n), (np.r_[rows, rows], np.r_[(rows + 1) % n, (rows - 1) % n])), shape=(n, n))
    return a


def test_supergcn_from_a_graph_uses_its_partition():
    a = ring_graph()
    w = Workload("ring", 64, 64 * 3, (4, 2))
    m = load_machine("perlmutter")
    part = np.repeat(np.arange(4), 16)  # contiguous arcs: each part sends one row to each neighbour part
    plan = exchange_plan(a, part)
    assert plan.rows["hybrid"].sum() == 8
    pred = FAMILIES["supergcn"].predict(w, m, [(4, 1, 1)], options={"aggregation": "hybrid", "plan": plan})
    assert not pred["estimated"][0]
    # busiest rank sends 2 rows of 4 (layer 0) and 2 rows of 2... forward and backward, plus the dW all-reduce
    assert pred["volume_bytes"][0] == (2 * 2 * 4 * 4) + 2 * 3 * math.ceil(10 / 4) * 4
    est = FAMILIES["supergcn"].predict(w, m, [(4, 1, 1)])
    assert est["estimated"][0]


def test_joint_ranking_matches_each_family_and_is_sorted():
    w = workload_from_dataset("ogbn-products")
    m = load_machine("perlmutter")
    ranking = joint_ranking(w, m, 16, precisions=("fp32", "bf16"))
    assert len(ranking.records) == joint_space_size(16, 2)["total"]
    feasible = [r["total_ms"] for r in ranking.records if r["feasible"]]
    assert feasible == sorted(feasible)
    assert [r["rank"] for r in ranking.records] == list(range(1, len(ranking.records) + 1))
    best = ranking.best_per_family()
    for family in family_names():
        mine = [r for r in ranking.records if r["algorithm"] == family and r["feasible"]]
        assert best[family]["total_ms"] == min(r["total_ms"] for r in mine)
    for rec in ranking.records[:40]:
        if rec["algorithm"] == "plexus-3d":
            continue
        grid = (rec["gx"], rec["gy"], rec["gz"])
        options = {"aggregation": rec["aggregation"]} if rec["algorithm"] == "supergcn" else None
        own = FAMILIES[rec["algorithm"]].predict(w, m, [grid], comm_precision=rec["comm_precision"], options=options)
        assert rec["total_ms"] == pytest.approx(own["total_ms"][0])
        assert rec["memory_bytes"] == round(own["memory_bytes"][0])


def test_family_grids():
    assert family_of("cagnet-1.5d").configurations(64).tolist() == [[32, 2, 1], [16, 4, 1], [8, 8, 1]]
    assert len(family_of("cagnet-2d").configurations(12)) == 6
    assert all(g[2] >= 2 for g in family_of("cagnet-3d").configurations(8))
    assert family_of("cagnet-1.5d").configurations(3).size == 0


def test_bad_family_inputs():
    w = workload_from_dataset("ogbn-products")
    m = load_machine("perlmutter")
    with pytest.raises(UserError):
        FAMILIES["cagnet-1.5d"].predict(w, m, [(2, 4, 1)])  # c*c > G
    with pytest.raises(UserError):
        FAMILIES["cagnet-3d"].predict(w, m, [(4, 4, 1)])
    with pytest.raises(UserError):
        FAMILIES["supergcn"].predict(w, m, [(4, 1, 1)], options={"aggregation": "sideways"})
    with pytest.raises(UserError):
        FAMILIES["cagnet-2d"].predict(w, m, [(4, 4, 1)], block_rows=128)
    with pytest.raises(UserError):
        joint_ranking(w, m, 64, algorithms=("cagnet-1.5d",), replication=3)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "plexus_tune", *args], capture_output=True, text=True, timeout=120)


def test_predict_all_prints_joint_ranking_and_family_bests():
    out = cli("predict", "--algorithm", "all", "--dataset", "ogbn-products", "--gpus", "64", "--machine", "perlmutter")
    assert out.returncode == 0, out.stderr
    assert "joint ranking" in out.stdout and "best of each family" in out.stdout
    for family in family_names():
        assert family in out.stdout
    assert "estimated" in out.stdout and "Recommended:" in out.stdout


def test_predict_all_json_agrees_with_the_library():
    out = cli("predict", "--algorithm", "all", "--dataset", "ogbn-products", "--gpus", "16", "--machine", "perlmutter",
              "--comm-precision", "fp32", "--format", "json", "--top", "0")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    ranking = joint_ranking(workload_from_dataset("ogbn-products"), "perlmutter", 16)
    assert len(data["ranking"]) == len(ranking.records)
    assert [r["total_ms"] for r in data["ranking"][:10]] == pytest.approx([r["total_ms"] for r in ranking.records[:10]])


@pytest.mark.parametrize("extra", [
    ["--algorithm", "cagnet-4d"],
    ["--algorithm", "cagnet-1.5d", "--replication", "3"],
    ["--algorithm", "cagnet-1.5d", "--replication", "16"],
    ["--algorithm", "cagnet-1.5d", "--replication", "nan"],
    ["--algorithm", "supergcn", "--aggregation", "mid"],
    ["--algorithm", "plexus-3d", "--aggregation", "pre"],
    ["--algorithm", "all", "--block-rows", "64"],
])
def test_predict_bad_family_inputs_one_line_exit_2(extra):
    out = cli("predict", "--dataset", "ogbn-products", "--gpus", "64", "--machine", "perlmutter", *extra)
    assert out.returncode == 2
    assert out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_search_all_over_counts_with_a_graph_is_exact_and_not_estimated():
    out = cli("search", "--algorithm", "all", "--graph", "rmat:nodes=1024,edges=8192", "--gpus", "4,8",
              "--machine", "perlmutter", "--comm-precision", "fp32", "--top", "3")
    assert out.returncode == 0, out.stderr
    assert "estimated" not in out.stdout and "partition-dependent figures from graph" in out.stdout
    assert "best of each family" in out.stdout and "4,8 GPUs" in out.stdout


def test_search_families_refuses_block_rows_and_measured_without_a_graph():
    for extra in (["--graph", "rmat:nodes=1024,edges=8192", "--block-rows", "64..128"],
                  ["--dataset", "reddit", "--measured"]):
        out = cli("search", "--algorithm", "cagnet-2d", "--gpus", "4", *extra)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_search_ranking_objective_gpu_hours():
    from plexus_tune.search.joint import search_ranking

    w = workload_from_dataset("ogbn-products")
    r = search_ranking(w, "perlmutter", [8, 16], objective="gpu-hours", algorithms=("cagnet-1.5d", "cagnet-2d"))
    values = [rec["objective_value"] for rec in r.records if rec["feasible"]]
    assert values == sorted(values)
    for rec in r.records:
        assert rec["objective_value"] == pytest.approx(rec["total_ms"] * rec["gpus"] * 100 / 3.6e6)


def test_run_prediction_of_a_family_run_is_the_family_model():
    from plexus_tune.model.prediction import predict_run

    w = Workload("ring", 64, 64 * 3, (4, 2))
    g = ring_graph()
    run = predict_run(w, "perlmutter", (4, 1, 1), algorithm="supergcn", options={"aggregation": "pre", "graph": g})
    own = FAMILIES["supergcn"].predict(w, load_machine("perlmutter"), [(4, 1, 1)],
                                    options={"aggregation": "pre", "graph": g})
    assert run["total_ms"] == pytest.approx(own["total_ms"][0]) and run["algorithm"] == "supergcn"
    run = predict_run(w, "perlmutter", (2, 2, 1), algorithm="cagnet-1.5d", options={"replication": 2})
    assert run["total_ms"] == pytest.approx(FAMILIES["cagnet-1.5d"].predict(w, "perlmutter", [(2, 2, 1)])["total_ms"][0])
    with pytest.raises(UserError):
        predict_run(w, "perlmutter", (2, 2, 1), algorithm="cagnet-1.5d", options={"replication": 4})


def test_supergcn_estimate_hand_derived():
    from plexus_tune.model.family_costs import estimated_boundary_rows

    est = estimated_boundary_rows(100, 500, 4)
    # 400 off-diagonal nonzeros, 25 per ordered pair, hitting 25 possible sources: 25 (1 - e^-1)
    assert est.rows == pytest.approx(25 * (1 - math.exp(-1)))
    assert est.sent().tolist() == pytest.approx([3 * 25 * (1 - math.exp(-1))] * 4)


def test_predict_graph_gives_partition_figures():
    out = cli("predict", "--algorithm", "all", "--graph", "rmat:nodes=1024,edges=8192", "--gpus", "8",
              "--machine", "perlmutter", "--comm-precision", "fp32", "--format", "json", "--top", "0")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["estimated"] == []
    modes = {r["aggregation"]: r for r in data["ranking"] if r["algorithm"] == "supergcn"}
    assert modes["hybrid"]["comm_ms"] <= min(modes["pre"]["comm_ms"], modes["post"]["comm_ms"]) + 1e-9
    assert all(not r["estimated"] for r in data["ranking"])


def test_supergcn_memory_hand_derived():
    # ring of 64 nodes in 4 arcs of 16: each part keeps 16 rows with 3 nonzeros each (two
    # neighbours and the self-loop) and sends and receives one row to and from each neighbour part
    a = ring_graph()
    w = Workload("ring", 64, 64 * 3, (4, 2))
    plan = exchange_plan(a, np.repeat(np.arange(4), 16))
    pred = FAMILIES["supergcn"].predict(w, load_machine("perlmutter"), [(4, 1, 1)], options={"plan": plan})
    expected = {
        "adjacency": 2 * (48 * 8 + (16 + 1) * 4),  # A and A^T of the part, CSR int32
        "weights": 4 * (4 + 1) * 2 * 4,
        "features": 4 * 16 * 4 * 4,
        "activations": (2 * 16 * 4 + 2 * 16 * 2) * 4,
        "gathered": (2 + 2) * 4 * 4,  # send and receive buffers of the widest exchange
        "labels": 8 * 16,
    }
    for part, value in expected.items():
        assert pred[f"memory_{part}_bytes"][0] == pytest.approx(value), part


def test_joint_ranking_plexus_rows_equal_plain_predict_with_a_graph():
    common = ["--graph", "rmat:nodes=1024,edges=8192", "--gpus", "8", "--machine", "perlmutter", "--comm-precision",
              "fp32", "--format", "json", "--top", "0"]
    plain = cli("predict", *common)
    joint = cli("predict", "--algorithm", "all", *common)
    assert plain.returncode == 0 and joint.returncode == 0, plain.stderr + joint.stderr
    by_grid = {r["grid"]: r["total_ms"] for r in json.loads(plain.stdout)}
    rows = [r for r in json.loads(joint.stdout)["ranking"] if r["algorithm"] == "plexus-3d"]
    assert len(rows) == len(by_grid)
    for r in rows:
        assert r["total_ms"] == pytest.approx(by_grid[r["grid"]])


def test_a_registered_family_joins_the_planner_and_the_records():
    # a seventh family: one subclass, one register call; the planner, the space size, the
    # labels and the run identity take it from the registry with no change elsewhere
    from plexus_tune.model.family import Family, register
    from plexus_tune.model.family_costs import cagnet_15d_config
    from plexus_tune.model.family import _stack

    class Rows(Family):
        name = "test-rows"
        options = ("graph",)
        choices = ("replication",)

        def configurations(self, gpus, **fixed):
            return np.asarray([(gpus, 1, 1)], dtype=np.int64)

        def check_choice(self, option, value, gpus):
            return int(value)

        def label(self, grid, options=None):
            return f"{grid[0]} rows"

        def record_fields(self, grid, options=None):
            return {"replication": 1}

        def evaluate(self, workload, machine, grids, *, block_rows, choice, optimizer, options):
            return _stack([cagnet_15d_config(workload, machine, int(g[0]), 1, choice, optimizer) for g in grids])

    register(Rows())
    try:
        w = workload_from_dataset("ogbn-products")
        ranking = joint_ranking(w, "perlmutter", 8, algorithms=("test-rows", "cagnet-1d"))
        mine = [r for r in ranking.records if r["algorithm"] == "test-rows"]
        theirs = [r for r in ranking.records if r["algorithm"] == "cagnet-1d"]
        assert len(mine) == 1 and mine[0]["config"] == "8 rows" and mine[0]["replication"] == 1
        assert mine[0]["total_ms"] == pytest.approx(theirs[0]["total_ms"])  # the same schedule, priced alike
        assert joint_space_size(8, 2, ("test-rows",))["total"] == 2
        with pytest.raises(ValueError):
            register(Rows())  # names are unique
    finally:
        FAMILIES.pop("test-rows")
    with pytest.raises(UserError, match="unknown algorithm"):
        family_of("test-rows")


SHIPPED = sorted(p.stem for p in (__import__("pathlib").Path(__file__).resolve().parents[1] / "models").glob("*.json"))


@pytest.mark.parametrize("name", SHIPPED)
def test_every_family_costs_one_gpu_alike_on_every_shipped_profile(name):
    # at G = 1 every family runs the same local SpMMs, GEMMs and optimizer step with no
    # communication: the totals must agree within 1 %
    w = workload_from_dataset("ogbn-products")
    ranking = joint_ranking(w, name, 1)
    totals = {}
    for rec in ranking.records:
        totals.setdefault(rec["algorithm"], rec["total_ms"])
        assert rec["comm_ms"] == 0.0 and rec["quant_ms"] == 0.0
    assert set(totals) >= {"plexus-3d", "cagnet-1d", "cagnet-2d", "supergcn"}
    low, high = min(totals.values()), max(totals.values())
    assert high <= 1.01 * low, totals


def test_paper_spmm_of_each_family_by_hand_at_g4():
    # the paper kind prices each local SpMM as c0/2 sqrt(f) + c_dir sqrt(f) common/k (f = nnz k):
    # the families differ only by the local SpMMs their algorithm runs
    c0, c1, c2 = 1e-3, 2e-4, -1e-4
    m = Machine.from_dict({"name": "p", "gpus_per_node": 4, "device_memory_gib": 16, "gemm_tflops": 1,
                           "spmm": {"kind": "paper", "c0": c0, "c1": c1, "c2": c2},
                           "collectives": {"alpha_intra_us": 1, "beta_intra_gbps": 10, "alpha_inter_us": 1,
                                           "beta_inter_gbps": 10}})
    w = Workload("toy", 1000, 8000, (16, 8))  # one layer, D_0 = 16

    def pair(nnz, rows, common, k, calls=1):
        root = math.sqrt(nnz * k)
        return calls * ((0.5 * c0 * root + c1 * root * common / k) + (0.5 * c0 * root + c2 * root * rows / k))

    # cagnet-1d on 4 ranks: 4 stages per direction, each an SpMM of a 250 x 250 block with
    # 8000 / 16 = 500 nonzeros and the 16 columns of F (forward common 250, backward common 250)
    got = FAMILIES["cagnet-1d"].predict(w, m, [(4, 1, 1)])["spmm_ms"][0]
    assert got == pytest.approx(pair(500, 250, 250, 16, calls=4))
    # cagnet-2d 2x2: q = 2 stages, rb = 500 rows, A pieces of 500 x 500 with 8000 / 4 = 2000
    # nonzeros, d = 16 / 2 = 8 columns
    got = FAMILIES["cagnet-2d"].predict(w, m, [(2, 2, 1)])["spmm_ms"][0]
    assert got == pytest.approx(pair(2000, 500, 500, 8, calls=2))
    # supergcn, 4 parts (estimate): 250 rows, 2000 nonzeros, common 250 + the received boundary rows
    est = estimated_boundary_rows_for_test(1000, 8000, 4)
    got = FAMILIES["supergcn"].predict(w, m, [(4, 1, 1)])["spmm_ms"][0]
    root = math.sqrt(2000 * 16)
    common = 250 + est
    assert got == pytest.approx(c0 * root + c1 * root * common / 16 + c2 * root * common / 16)
    # plexus-3d 1x4x1 (layer 0 roles: outer X, inner Y, depth Z): the whole A (8000 nonzeros,
    # 1000 x 1000) times a quarter of the columns, k = 4
    got = FAMILIES["plexus-3d"].predict(w, m, [(1, 4, 1)])["spmm_ms"][0]
    assert got == pytest.approx(pair(8000, 1000, 1000, 4))


def estimated_boundary_rows_for_test(nodes, nnz, parts):
    # docs/model.md, SuperGCN: (N/P)(1 - exp(-E / (P N))) rows per ordered pair, P - 1 senders
    per_part = nodes / parts
    return (parts - 1) * per_part * (1 - math.exp(-((nnz - nodes) / parts**2) / per_part))


def test_every_reduced_precision_pays_its_codec():
    # a profile without measured codec rates gets the codec's passes over its bytes at its
    # elementwise rate (else the memory bandwidth): int8 encodes in 4 + 8/32 passes (min/max, scale and round, one FP32
    # random number written and read, the codes written), decodes in 1 + 8/32; bf16 casts in
    # 1 + 16/32 each way
    from plexus_tune.model.comm_precision import estimated_quant_entry

    entry = estimated_quant_entry("int8", 1000.0)
    assert entry["encode_gbps"] == pytest.approx(1000 / 4.25) and entry["decode_gbps"] == pytest.approx(800.0)
    entry = estimated_quant_entry("bf16", 1000.0)
    assert entry["encode_gbps"] == pytest.approx(1000 / 1.5) == entry["decode_gbps"]
    w = workload_from_dataset("ogbn-products")
    for name in SHIPPED:
        machine = load_machine(name)
        ranking = joint_ranking(w, machine, 8, precisions=("fp32", "bf16", "int8"))
        for rec in ranking.records:
            if rec["comm_precision"] != "fp32" and rec["comm_ms"] > 0:
                assert rec["quant_ms"] > 0, (name, rec["algorithm"], rec["config"], rec["comm_precision"])
                assert rec["quant_estimated"] == (rec["comm_precision"] in machine.quant_estimated)
            else:
                assert not rec["quant_estimated"]
    # the estimate is used exactly as measured rates of the same values would be
    perlmutter = load_machine("perlmutter")
    assert "int8" in perlmutter.quant_estimated
    measured = Machine.from_dict({**perlmutter.raw, "quant": {"int8": {
        k: v for k, v in estimated_quant_entry("int8", perlmutter.elementwise_gbps).items() if k != "estimated"}}})
    assert "int8" not in measured.quant_estimated
    for family in ("plexus-3d", "cagnet-2d", "supergcn"):
        grids = family_of(family).configurations(8)[:3]
        a = family_of(family).predict(w, perlmutter, grids, comm_precision="int8")
        b = family_of(family).predict(w, measured, grids, comm_precision="int8")
        np.testing.assert_allclose(a["quant_ms"], b["quant_ms"], rtol=1e-12)
        assert (a["quant_ms"] > 0).all() and a["quant_estimated"].all() and not b["quant_estimated"].any()


def test_the_codec_estimate_is_marked_in_the_table_and_json():
    args = ["predict", "--algorithm", "all", "--dataset", "ogbn-products", "--gpus", "8", "--machine", "perlmutter",
            "--allow-precisions", "fp32,int8", "--top", "0"]
    out = subprocess.run([sys.executable, "-m", "plexus_tune", *args, "--format", "json"], capture_output=True,
                         text=True, check=True).stdout
    records = json.loads(out)["ranking"]
    reduced = [r for r in records if r["comm_precision"] == "int8" and r["comm_ms"] > 0]
    assert reduced and all(r["quant_estimated"] and r["quant_ms"] > 0 for r in reduced)
    table = subprocess.run([sys.executable, "-m", "plexus_tune", *args], capture_output=True, text=True,
                           env={**__import__("os").environ, "COLUMNS": "250"}).stdout
    assert "(estimated)" in table and "quant (estimated): perlmutter has no measured codec rates for int8" in table


def _dense_words(calls):
    return float(sum(c.sent_bytes for c in calls if c.comm_class != "adjacency").max()) / 4


def test_cagnet_schedules_word_counts_on_ogbn_products_by_hand():
    # ogbn-products with every width 128 (the paper's constant f), 3 layers, FP32 words per process
    from plexus_tune.model.volumes import cagnet_summa_schedule

    n, nnz = 2449029, 126167053
    widths = (128, 128, 128, 128)
    # 2D 8x8: q = 8, N' = 8 ceil(N / 8) = 2449032, rb = rf = 306129 rows, d = 128 / 8 = 16 columns.
    # bundled, per layer: SUMMA broadcast of F and of dT over the column, all-gather of T and
    # reduce-scatter of dT over the row: 4 units of (8 - 1) rb d; all-reduce of dW, db
    # ((128 + 1) x 16) over the column: 2 (8 - 1) ceil(2064 / 8)
    unit = 7 * 306129 * 16
    bundled = 3 * (4 * unit + 2 * 7 * 258)
    # paper: the same 4 units, plus the log_softmax all-gather of Z, the sigma'(Z) all-gather and
    # the dense SUMMA of dW (H along the row, A G along the column): 8 units; and the f x f
    # result all-gathered on all 64 ranks, 63 ceil(129 * 128 / 64), instead of the all-reduce
    paper = 3 * (8 * unit + 63 * 258)
    got_b = _dense_words(cagnet_summa_schedule(n, widths, 8, 8, 1, nnz=nnz))
    got_p = _dense_words(cagnet_summa_schedule(n, widths, 8, 8, 1, nnz=nnz, schedule="paper"))
    assert got_b == bundled and got_p == paper
    assert round(got_b / 1e8, 1) == 4.1  # the bundled trainers' 4.1e8
    # CAGNET's own count, L (8 n f / sqrt(P)) = 9.4e8, counts every broadcast block in full;
    # the collectives send (sqrt(P) - 1) / sqrt(P) of it
    formula = 3 * 8 * 2449032 * 128 / 8
    assert round(3 * 8 * n * 128 / 8 / 1e8, 1) == 9.4
    assert got_p == pytest.approx(formula * 7 / 8 + 3 * 63 * 258, rel=1e-12)
    # split-3D 4x4x4: q = 4, N' = 16 ceil(N / 16) = 2449040, rb = 612260, rf = 153065, d = 32.
    # bundled, per layer: 6 units of (4 - 1) rf d (SUMMA and fibre reduce-scatter, all-gather of
    # T forward; their backward counterparts) and the dW all-reduces over column and fibre
    unit = 3 * 153065 * 32
    bundled = 3 * (6 * unit + 2 * (2 * 3 * 1032))
    # paper: CAGNET's 12 units (the partial 3D product's fibre all-gather forward and backward,
    # log_softmax and sigma' all-gathers, the dense SUMMA of dW) and the f x f all-gather
    paper = 3 * (12 * unit + 63 * 258)
    got_b = _dense_words(cagnet_summa_schedule(n, widths, 4, 4, 4, nnz=nnz))
    got_p = _dense_words(cagnet_summa_schedule(n, widths, 4, 4, 4, nnz=nnz, schedule="paper"))
    assert got_b == bundled and got_p == paper
    assert round(got_b / 1e8, 1) == 2.6 and round(3 * 12 * n * 128 / 16 / 1e8, 1) == 7.1
    assert got_p == pytest.approx(3 * 12 * 2449040 * 128 / 16 * 3 / 4 + 3 * 63 * 258, rel=1e-12)


def test_the_paper_schedule_is_an_option_of_the_summa_families():
    w = workload_from_dataset("ogbn-products")
    bundled = joint_ranking(w, "perlmutter", 64, algorithms=("cagnet-2d", "cagnet-3d"))
    paper = joint_ranking(w, "perlmutter", 64, algorithms=("cagnet-2d", "cagnet-3d"), schedule="paper")
    assert {r["schedule"] for r in bundled.records} == {"bundled"}
    assert {r["schedule"] for r in paper.records} == {"paper"}
    by = {(r["algorithm"], r["grid"]): r for r in bundled.records}
    for rec in paper.records:
        base = by[(rec["algorithm"], rec["grid"])]
        assert rec["config"].endswith("paper schedule")
        assert rec["comm_ms"] > base["comm_ms"]  # more collectives
        assert rec["spmm_ms"] == base["spmm_ms"] and rec["gemm_ms"] == base["gemm_ms"]
    with pytest.raises(UserError, match="schedule"):
        joint_ranking(w, "perlmutter", 64, algorithms=("cagnet-1d",), schedule="paper")
    with pytest.raises(UserError, match="unknown CAGNET schedule"):
        joint_ranking(w, "perlmutter", 64, algorithms=("cagnet-2d",), schedule="theirs")


@pytest.mark.parametrize("name", ["perlmutter", "frontier", "h100-80gb-fitted"])
def test_fixed_features_lower_every_family_and_stay_alike_at_one_gpu(name):
    w = workload_from_dataset("ogbn-products")
    one = joint_ranking(w, name, 1, fixed_features=True)
    totals = {r["algorithm"]: r["total_ms"] for r in one.records}
    assert max(totals.values()) <= 1.01 * min(totals.values()), totals
    trained = {r["algorithm"]: r["total_ms"] for r in joint_ranking(w, name, 1).records}
    assert all(totals[f] < trained[f] for f in totals)
    for family in ("cagnet-1.5d", "cagnet-2d", "cagnet-3d", "supergcn"):
        grid = family_of(family).configurations(16)[:1]
        a = family_of(family).predict(w, name, grid)
        b = family_of(family).predict(w, name, grid, options={"fixed_features": True})
        assert b["spmm_ms"][0] < a["spmm_ms"][0] and b["gemm_ms"][0] < a["gemm_ms"][0]
        assert b["comm_ms"][0] < a["comm_ms"][0] and b["memory_bytes"][0] < a["memory_bytes"][0]
        assert b["memory_features_bytes"][0] == pytest.approx(a["memory_features_bytes"][0] / 4)


def test_run_identity_carries_fixed_features_and_old_records_read_as_trainable():
    from plexus_tune.measure.identity import RunSpec, run_identity

    old = {"graph_source": "rmat:nodes=64", "gx": 2, "gy": 1, "gz": 1, "algorithm": "cagnet-2d", "options": {}}
    new = {**old, "options": {"fixed_features": True}}
    assert run_identity(old).fixed_features is False and run_identity(new).fixed_features is True
    assert run_identity(old) != run_identity(new)
    assert RunSpec.from_record(old).prediction_settings()["fixed_features"] is False
    assert RunSpec.from_record(new).prediction_settings()["fixed_features"] is True
    paper = {**old, "options": {"schedule": "paper"}}
    assert RunSpec.from_record(paper).prediction_settings()["options"] == {"schedule": "paper"}


def test_measure_logs_and_predicts_fixed_features():
    # measure's --fixed-features is a TrainConfig field: the run identity carries it and the
    # prediction logged beside the run is predict's with fixed features
    from plexus_tune.measure.campaign import campaign_config, config_settings
    from plexus_tune.model.prediction import predict_run

    spec = "rmat:nodes=256,edges=2048,features=8,classes=4,seed=1"
    config = campaign_config(spec, (2, 1, 1), layers=2, hidden=8, epochs=3, warmup=1,
                             options={"fixed_features": True, "algorithm": "cagnet-1d"})
    settings = config_settings(config)
    assert settings["fixed_features"] is True
    w = Workload("g", 256, 2304, (8, 8, 4))
    logged = predict_run(w, "perlmutter", (2, 1, 1), **settings)
    own = FAMILIES["cagnet-1d"].predict(w, "perlmutter", [(2, 1, 1)], options={"fixed_features": True})
    assert logged["total_ms"] == pytest.approx(float(own["total_ms"][0]))
    assert logged["total_ms"] < predict_run(w, "perlmutter", (2, 1, 1), algorithm="cagnet-1d")["total_ms"]


def test_the_sharded_loss_and_db_reductions_are_timed_hand_derived():
    """Every family times the trainers' small per-epoch reductions (counted on the trainers with
    torch.distributed wrapped: the loss's row maxima and sums over a split class axis, its loss
    sum over each split row axis; Plexus 3D's db over depth). One node of 8 (alpha 1 us,
    beta 10 GB/s): an all-reduce of M bytes on g ranks takes 2 (g-1) alpha + 2 (g-1)/g M / beta."""
    from plexus_tune.model.costs import predict_grids
    from plexus_tune.model.family_costs import cagnet_summa_config, estimated_boundary_rows, supergcn_config
    from plexus_tune.model.volumes import LOSS_CLASS, cagnet_summa_schedule, loss_calls, supergcn_schedule

    machine = Machine.from_dict({"name": "tiny8", "gpus_per_node": 8, "device_memory_gib": 1, "gemm_tflops": 1,
                                 "spmm": {"kind": "paper", "c0": 1e-3, "c1": 0.0, "c2": 0.0},
                                 "collectives": {"alpha_intra_us": 1.0, "beta_intra_gbps": 10.0,
                                                 "alpha_inter_us": 5.0, "beta_inter_gbps": 1.0}})
    ring = lambda g, m: 1e-3 * 2 * (g - 1) * 1.0 + 2 * (g - 1) / g * m / 10e9 * 1e3  # noqa: E731
    fp32 = parse_comm_precision("fp32")
    bf16 = parse_comm_precision("bf16")
    w = Workload("t", 8, 24, (4, 4, 2))
    # the calls: classes over 2 ranks of axis 1, rows over 2 ranks of axis 0 (stride 2) and none of axis 2
    calls = loss_calls(4, (1, 2, 1), [(0, 2, 2), (2, 1, 4)], 4, 4)
    assert [(c.comm_class, c.axis, c.group_size, c.stride, c.message_bytes) for c in calls] == [
        (LOSS_CLASS, 1, 2, 1, 16.0), (LOSS_CLASS, 1, 2, 1, 32.0), (LOSS_CLASS, 0, 2, 2, 4.0)]
    # SuperGCN on 4 ranks: classes whole, the loss sum over all 4 (4 bytes), at every precision in FP32
    for choice in (fp32, bf16):
        pred = supergcn_config(w, machine, 4, "post", choice)
        base = schedule_times(machine, supergcn_schedule(w.widths, estimated_boundary_rows(8, 24, 4), 4), choice, 4)
        assert pred["comm_ms"] - base["comm_ms"] == pytest.approx(ring(4, 4.0), rel=1e-9)
    # CAGNET 2D 2 x 2: N' = 8, rf = 4 logit rows: maxima 16 B and sums 32 B over the row, the loss sum over the column
    pred = cagnet_summa_config(w, machine, 2, 2, 1, fp32)
    base = schedule_times(machine, cagnet_summa_schedule(8, w.widths, 2, 2, 1, nnz=24), fp32, 4)
    assert pred["comm_ms"] - base["comm_ms"] == pytest.approx(ring(2, 16) + ring(2, 32) + ring(2, 4), rel=1e-9)
    assert pred["volume_bytes"] == max(sum(c.sent_bytes for c in cagnet_summa_schedule(8, w.widths, 2, 2, 1, nnz=24)))
    # Plexus 2x2x2 (exact division, so only these differ from the paper's model): db of c_o = 2 and
    # 1 columns over depth, the loss's maxima (r_d = 4 rows, 16 B), sums (32 B) and loss sum (4 B)
    grid = np.array([[2, 2, 2]])
    trainer = predict_grids(w, machine, grid)
    paper = predict_grids(w, machine, grid, padded=False)
    extra = ring(2, 8) + ring(2, 4) + ring(2, 16) + ring(2, 32) + ring(2, 4)
    assert trainer["comm_ms"][0] - paper["comm_ms"][0] == pytest.approx(extra, rel=1e-9)
    assert trainer["all_reduce_ms"][0] - paper["all_reduce_ms"][0] == pytest.approx(extra, rel=1e-9)
