"""The families' SpMM from their own pieces when a graph is given, against brute force: the
partitioned trainer's own matrices (local block, pre-aggregation and scatter matrices of
each rank), CAGNET's block-row stage chunks and SUMMA pieces cut from A + I by slicing."""

import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from plexus_tune.graph import gcn_normalize, synthetic
from plexus_tune.graph.partition import partition_exchange
from plexus_tune.model.machine import Machine
from plexus_tune.model.prediction import predict_run_grids
from plexus_tune.model.spmm import predict_spmm_ms
from plexus_tune.model.workload import Workload
from plexus_tune.trainer.partitioned import RankPlan

SPMM = {"kind": "paper", "c0": 1e-3, "c1": 1e-5, "c2": 2e-5}  # sqrt(nnz k) (c0 + c1 common/k + c2 rows/k)
MACHINE = Machine.from_dict({"name": "pieces", "gpus_per_node": 4, "device_memory_gib": 64, "gemm_tflops": 1.0,
                             "spmm": SPMM, "collectives": {"alpha_intra_us": 1.0, "beta_intra_gbps": 10.0,
                                                           "alpha_inter_us": 5.0, "beta_inter_gbps": 1.0}})
GRAPH = synthetic("rmat:nodes=600,edges=3000,features=8,classes=2,seed=5")
HIDDEN = 16


def workload():
    nnz = int(gcn_normalize(GRAPH.adjacency).nnz)
    return Workload.from_graph_stats("g", GRAPH.num_nodes, nnz, GRAPH.num_features, 2, 2, HIDDEN)


def spmm(nnz, rows, common, k, backward=False):
    return float(predict_spmm_ms(SPMM, nnz, rows, common, k, backward=backward))


def predicted_spmm(family, grid, **options):
    pred = predict_run_grids(workload(), MACHINE, np.asarray([grid]), algorithm=family, options={"graph": GRAPH, **options})
    assert not pred["spmm_floored"][0]  # no floor: the profile has no memory bandwidth
    return float(pred["spmm_ms"][0])


def pattern():
    a = (sp.csr_matrix(GRAPH.adjacency) != 0).astype(np.float64)
    return sp.csr_matrix(a + sp.eye(a.shape[0]) - a.multiply(sp.eye(a.shape[0])) != 0)


@pytest.mark.parametrize("mode", ["pre", "post", "hybrid"])
def test_partitioned_spmm_is_the_busiest_ranks_own_matrices(mode):
    parts = 4
    plan = partition_exchange(GRAPH.adjacency, parts, seed=0)
    widths = workload().widths
    normalized = sp.csr_matrix(gcn_normalize(GRAPH.adjacency))
    per_rank = []
    for p in range(parts):
        rp = RankPlan(normalized, plan, mode, p, torch.float32, "cpu")
        calls = [rp.local]
        calls += [pre for _, pre in rp.sends.values() if pre is not None]
        calls += [scatter for _, scatter in rp.receives.values()]
        back = [rp.local_t] + [pre_t for _, pre_t in rp.sends_t.values() if pre_t is not None] + list(rp.receives_t.values())
        total = 0.0
        for d in widths[:-1]:
            for backward, group in ((False, calls), (True, back)):
                for m in group:
                    total += spmm(m._nnz(), m.shape[0], m.shape[1], d, backward)
        per_rank.append(total)
    assert predicted_spmm("supergcn", (parts, 1, 1), aggregation=mode) == pytest.approx(max(per_rank), rel=1e-9)


@pytest.mark.parametrize("gpus,c", [(4, 1), (8, 2), (4, 2)])
def test_block_row_spmm_is_the_busiest_ranks_stage_chunks(gpus, c):
    r = gpus // c
    n = GRAPH.num_nodes
    b = math.ceil(n / r)
    a = pattern()
    blocks = np.array([[a[i * b:(i + 1) * b, k * b:(k + 1) * b].nnz for k in range(r)] for i in range(r)])
    widths = workload().widths
    worst = 0.0
    for i in range(r):
        for j in range(c):
            stages = range(j * r // c, (j + 1) * r // c)
            t = sum(spmm(blocks[i, k], b, b, d, back) for d in widths[:-1] for k in stages
                    for back in (False, True))  # A, then A^T (symmetric: the same blocks)
            worst = max(worst, t)
    family = "cagnet-1d" if c == 1 else "cagnet-1.5d"
    assert predicted_spmm(family, (r, c, 1)) == pytest.approx(worst, rel=1e-9)
    # the imbalance of an R-MAT's block rows makes the busiest rank slower than the even estimate
    even = predict_run_grids(workload(), MACHINE, np.asarray([(r, c, 1)]), algorithm=family)
    assert worst > float(even["spmm_ms"][0])


@pytest.mark.parametrize("pr,pc", [(2, 2), (4, 1), (1, 4)])
def test_summa_spmm_is_the_busiest_block_rows_pieces(pr, pc):
    n = GRAPH.num_nodes
    q = math.lcm(pr, pc)
    n_pad = q * math.ceil(n / q)
    rb, piece = n_pad // pr, n_pad // q
    a = pattern()
    widths = workload().widths
    worst = 0.0
    for i in range(pr):
        nnz = [a[i * rb:(i + 1) * rb, s * piece:(s + 1) * piece].nnz for s in range(q)]
        t = sum(spmm(z, rb, piece, math.ceil(d / pc), back) for d in widths[:-1] for z in nnz for back in (False, True))
        worst = max(worst, t)
    assert predicted_spmm("cagnet-2d", (pr, pc, 1)) == pytest.approx(worst, rel=1e-9)


def test_the_families_that_read_a_graph_are_those_whose_prediction_changes_with_it():
    """``reads_graph`` (which families ``fit`` and ``validate`` predict from a run's graph) says whether
    the family's prediction on a graph's own pieces differs from its N/NNZ estimate."""
    from plexus_tune.model.family import FAMILIES, GraphContext, family_names

    context = GraphContext(GRAPH)
    seen = set()
    for name in family_names():
        family = FAMILIES[name]
        if family.epoch != "full-graph":
            continue
        grid = family.configurations(4)[0]
        extra = family.run_graph_options(context, grid)
        assert bool(extra) == family.reads_graph, name
        if family.reads_graph:
            with_graph = predict_run_grids(workload(), MACHINE, np.asarray([grid]), algorithm=name, options=extra)
            estimate = predict_run_grids(workload(), MACHINE, np.asarray([grid]), algorithm=name)
            assert with_graph["total_ms"][0] != pytest.approx(estimate["total_ms"][0], rel=1e-6), name
        seen.add(family.reads_graph)
    assert seen == {True, False}


def test_calibration_pieces_are_the_trainers_own_spmm_shapes():
    """``calibrate spmm --family-pieces`` times the shapes the families' models price: every SpMM operand
    of the partitioned trainer's ranks (RankPlan, all three modes, both directions, every layer's width)
    is among them, and ``limit`` draws a subset of them."""
    from plexus_tune.measure.spmm import family_piece_shapes

    parts = 4
    widths = workload().widths
    shapes = {tuple(s.values()) for s in family_piece_shapes(GRAPH, widths, parts, limit=10**6)}
    plan = partition_exchange(GRAPH.adjacency, parts, seed=0)
    normalized = sp.csr_matrix(gcn_normalize(GRAPH.adjacency))
    expected = set()
    for mode in ("pre", "post", "hybrid"):
        for p in range(parts):
            rp = RankPlan(normalized, plan, mode, p, torch.float32, "cpu")
            mats = [rp.local, rp.local_t, *rp.receives_t.values()] + [m for _, m in rp.receives.values()]
            mats += [m for _, m in list(rp.sends.values()) + list(rp.sends_t.values()) if m is not None]
            for m in mats:
                if min(m._nnz(), *m.shape) > 1:
                    expected |= {(m._nnz(), m.shape[0], m.shape[1], d) for d in widths[:-1]}
    assert expected and expected <= shapes
    assert len(shapes) > len(expected)  # CAGNET's pieces too
    few = family_piece_shapes(GRAPH, widths, parts, limit=7, seed=3)
    assert len(few) == 7 and {tuple(s.values()) for s in few} <= shapes


def test_family_pieces_need_a_graph_on_the_cpu(tmp_path, capsys):
    from plexus_tune.cli import main

    out = tmp_path / "spmm.jsonl"
    for extra in (["--sweep"], ["--graph", "rmat:nodes=64,edges=256,features=4,classes=2", "--gpus", "2",
                                "--device", "cuda"]):
        assert main(["calibrate", "spmm", *extra, "--family-pieces", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--family-pieces" in err[0]
    assert not out.exists()
