"""The CAGNET 1D/1.5D/2D/3D and partitioned trainers equal serial PyTorch Geometric, and send
exactly the bytes of the volume model.

Every configuration of G = 1..8 each family allows trains the 37-node directed graph of
test_trainer (padded on most grids, widths that no axis divides) in one process set per
G. Each rank's logged bytes per class equal :func:`plexus_tune.model.volumes.rank_volumes`
of the family's schedule; hand-derived cases on an 8-node graph of two 4-cliques pin the
numbers down independently of that module.
"""

import math

import numpy as np
import pytest
import scipy.sparse as sp

from plexus_tune.graph import Graph, gcn_normalize
from plexus_tune.graph.partition import partition_exchange, partition_graph, summa_piece_nnz
from plexus_tune.launch import launch_local
from plexus_tune.model.volumes import VOLUME_CLASSES, cagnet_15d_schedule, cagnet_summa_schedule, rank_volumes, supergcn_schedule
from plexus_tune.trainer import TrainConfig, model_widths
from plexus_tune.trainer.algorithms import normalize_config
from plexus_tune.trainer.rank import rank_main
from plexus_tune.trainer.reference import max_relative_difference, reference_train
from test_trainer import CLASSES, EPOCHS, FEATURES, HIDDEN, LOSS_TOL, NODES, OUTPUT_TOL, tiny_graph

PRELOAD = ("torch._dynamo", "plexus_tune.trainer.rank")
COMMON = dict(hidden=HIDDEN, epochs=EPOCHS, warmup=1, lr=0.01, seed=3, collect_outputs=True)


def family_configs(gpus: int, **common) -> list[TrainConfig]:
    """Every configuration of ``gpus`` ranks: cagnet-1d, cagnet-1.5d for each c > 1 with c | G and
    c c <= G, cagnet-2d on every Pr x Pc = G, supergcn with each aggregation (one for G = 1)."""
    common = {**COMMON, **common}
    out = [TrainConfig(algorithm="cagnet-1d", gpus=gpus, **common)]
    out += [TrainConfig(algorithm="cagnet-1.5d", gpus=gpus, replication=c, **common)
            for c in range(2, math.isqrt(gpus) + 1) if gpus % c == 0]
    out += [TrainConfig(algorithm="cagnet-2d", grid=(pr, gpus // pr, 1), gpus=gpus, **common)
            for pr in range(1, gpus + 1) if gpus % pr == 0]
    modes = ("hybrid",) if gpus == 1 else ("pre", "post", "hybrid")
    out += [TrainConfig(algorithm="supergcn", gpus=gpus, aggregation=m, **common) for m in modes]
    return [normalize_config(c) for c in out]


def model_volumes(config: TrainConfig, graph: Graph) -> dict:
    """Per-rank bytes per class of the volume model for a configuration on ``graph``."""
    widths = model_widths(graph.features.shape[1], graph.num_classes, config.layers, config.hidden)
    return rank_volumes(schedule(config, graph, widths), int(np.prod(config.grid)))


def schedule(config: TrainConfig, graph: Graph, widths) -> list:
    """The volume model's communication calls of a configuration on ``graph``."""
    n = graph.adjacency.shape[0]
    gpus = int(np.prod(config.grid))
    if config.algorithm in ("cagnet-1d", "cagnet-1.5d"):
        calls = cagnet_15d_schedule(n, widths, gpus, config.grid[1])
    elif config.algorithm in ("cagnet-2d", "cagnet-3d"):
        pr, pc, pl = config.grid
        calls = cagnet_summa_schedule(n, widths, pr, pc, pl, a_pieces=summa_piece_nnz(graph.adjacency, pr, pc, pl),
                                      at_pieces=summa_piece_nnz(graph.adjacency, pr, pc, pl, transpose=True))
    else:
        plan = partition_exchange(gcn_normalize(graph.adjacency), gpus, seed=config.seed)
        calls = supergcn_schedule(widths, plan.forward_rows(config.aggregation))
    return calls


def logged_volumes(result: dict) -> dict:
    """Per-rank bytes per class of the last epoch (every epoch sends the same)."""
    last = [epochs[-1] for epochs in result["comm_bytes"]]
    return {name: np.array([r.get(name, 0) for r in last], dtype=np.float64) for name in VOLUME_CLASSES}


def train(graph, gpus, configs, timeout_s=400):
    return launch_local(rank_main, gpus, args=(graph, configs, "cpu"), timeout_s=timeout_s, threads_per_rank=1,
                        preload=PRELOAD)[0]


@pytest.fixture(scope="module")
def graph():
    return tiny_graph()


@pytest.fixture(scope="module")
def reference(graph):
    return reference_train(graph, layers=3, hidden=HIDDEN, epochs=EPOCHS, lr=0.01, weight_decay=0.01, seed=3)


def split_3d_configs(gpus: int, **common) -> list[TrainConfig]:
    """cagnet-3d on every Pr x Pc x Pl = G with Pl >= 2."""
    common = {**COMMON, **common}
    grids = [(pr, pc, gpus // (pr * pc)) for pr in range(1, gpus + 1) for pc in range(1, gpus + 1)
             if gpus % (pr * pc) == 0 and gpus // (pr * pc) >= 2]
    return [normalize_config(TrainConfig(algorithm="cagnet-3d", grid=grid, **common)) for grid in grids]


# G = 5 and 7 are slow: G = 3 trains the same paths at a prime rank count (no cagnet-1.5d,
# 1 x G and G x 1 for cagnet-2d, 1 x 1 x G for cagnet-3d, uneven blocks of the 37 nodes).
PRIME_REPEATS = (5, 7)


def gpu_counts(counts):
    return [pytest.param(g, marks=pytest.mark.slow) if g in PRIME_REPEATS else g for g in counts]


@pytest.mark.parametrize("gpus", gpu_counts([1, 2, 3, 4, 5, 6, 7, 8]))
def test_every_family_configuration_equals_serial_pyg(gpus, graph, reference):
    check_against_serial(graph, reference, gpus, family_configs(gpus))


@pytest.mark.parametrize("gpus", gpu_counts([2, 3, 4, 5, 6, 7, 8]))
def test_every_split_3d_grid_equals_serial_pyg(gpus, graph, reference):
    """cagnet-3d (Pl >= 2) on every grid of G ranks: the same losses, logits and model bytes."""
    configs = split_3d_configs(gpus)
    assert configs and all(c.grid[2] >= 2 for c in configs)
    check_against_serial(graph, reference, gpus, configs)


def check_against_serial(graph, reference, gpus, configs):
    results = train(graph, gpus, configs)
    assert len(results) == len(configs)
    for config, result in zip(configs, results):
        what = f"{config.algorithm} grid {config.grid} {config.aggregation or ''}"
        assert max_relative_difference(result["losses"], reference["losses"]) < LOSS_TOL, what
        assert max_relative_difference(result["outputs"], reference["outputs"], normwise=True) < OUTPUT_TOL, what
        assert result["losses"][-1] < result["losses"][0], what
        # bytes per rank and class equal the volume model's, every epoch alike
        want = model_volumes(config, graph)
        got = logged_volumes(result)
        for name in VOLUME_CLASSES:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{what}: {name}")
        assert all(epochs[0] == epochs[-1] for epochs in result["comm_bytes"]), what
        # the phases partition each rank's epoch, and the collectives split comm by operation
        for per_rank in result["timers"]:
            assert len(per_rank) == EPOCHS
            for row in per_rank:
                assert row["spmm_ms"] > 0 and row["gemm_ms"] > 0
                assert row["spmm_ms"] + row["gemm_ms"] + row["comm_ms"] + row["quant_ms"] <= row["epoch_ms"] * 1.001
                ops = sum(row[k] for k in ("all_reduce_ms", "all_gather_ms", "reduce_scatter_ms", "broadcast_ms",
                                           "point_to_point_ms"))
                assert ops == pytest.approx(row["comm_ms"], rel=1e-9, abs=1e-9)
        assert (max(row["comm_ms"] for per_rank in result["timers"] for row in per_rank) > 0) == (gpus > 1), what


def without_layer0_feature_gradient(calls):
    """A schedule less what fixed features drop: layer 0's backward, but for its dW, db reduction."""
    return [c for c in calls if not (c.name.startswith("layer 0 ") and c.direction == "backward"
                                     and c.comm_class != "gather")]


@pytest.mark.parametrize("gpus", [2, 4])
def test_fixed_features_equal_serial_pyg_and_drop_layer0_backward(gpus, graph):
    """With fixed features every family equals serial PyG whose features are a plain tensor, and
    sends the schedule's bytes less layer 0's backward aggregation, combination and adjacency."""
    ref = reference_train(graph, layers=3, hidden=HIDDEN, epochs=EPOCHS, lr=0.01, weight_decay=0.01, seed=3,
                          fixed_features=True)
    trained = reference_train(graph, layers=3, hidden=HIDDEN, epochs=EPOCHS, lr=0.01, weight_decay=0.01, seed=3)
    assert max_relative_difference(ref["losses"], trained["losses"]) > 10 * LOSS_TOL  # the setting matters
    configs = family_configs(gpus, fixed_features=True) + split_3d_configs(gpus, fixed_features=True)
    results = train(graph, gpus, configs)
    widths = model_widths(FEATURES, CLASSES, 3, HIDDEN)
    for config, result in zip(configs, results):
        what = f"{config.algorithm} grid {config.grid} {config.aggregation or ''}"
        assert max_relative_difference(result["losses"], ref["losses"]) < LOSS_TOL, what
        assert max_relative_difference(result["outputs"], ref["outputs"], normwise=True) < OUTPUT_TOL, what
        got = logged_volumes(result)
        want = rank_volumes(without_layer0_feature_gradient(schedule(config, graph, widths)), gpus)
        for name in VOLUME_CLASSES:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{what}: {name}")
        full = model_volumes(config, graph)
        assert sum(got[k].sum() for k in VOLUME_CLASSES) < sum(full[k].sum() for k in VOLUME_CLASSES), what


# ---------------------------------------------------------------------- hand-derived bytes
def two_cliques() -> Graph:
    """Nodes 0-3 and 4-7 form two undirected 4-cliques; directed cut edges u -> v:
    0, 1, 2 -> 4 and 3 -> 5 (from the first clique), 6 -> 0 and 6 -> 1 (from the second)."""
    rows, cols = [], []
    for group in (range(0, 4), range(4, 8)):
        for u in group:
            for v in group:
                if u != v:
                    rows.append(v)
                    cols.append(u)
    for u, v in ((0, 4), (1, 4), (2, 4), (3, 5), (6, 0), (6, 1)):
        rows.append(v)  # row v holds the in-neighbours u of v
        cols.append(u)
    adj = sp.csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, cols)), shape=(8, 8))
    rng = np.random.default_rng(1)
    return Graph(adjacency=adj, features=rng.standard_normal((8, 3)).astype(np.float32),
                 labels=np.array([0, 1, 0, 1, 1, 0, 1, 0]), num_classes=2, name="two-cliques")


def test_hand_derived_bytes_on_two_cliques():
    """widths 3 -> 4 -> 2 (u = 4 bytes). Each sum below is over layers (D_l = 3, 4) of forward plus backward.

    cagnet-1.5d, G = 4, c = 2: R = 2 block rows of b = 4; column 0 owns stage 0, column 1
    stage 1, so ranks 0 = (0,0) and 3 = (1,1) broadcast their block to the other block row:
    (R-1) b D u = 16 D per direction; every rank all-reduces 4 x D partial sums over 2
    replicas: 2 (c-1) ceil(4 D / 2) u = 16 D. Roots 2 (16 + 16)(3 + 4) = 448, others
    2 (16)(7) = 224. Gather: dW, db all-reduced over R = 2: 2 ceil((D+1) D' / 2) 4 =
    4 (4 x 4) + 4 (5 x 2) = 104.

    cagnet-2d, 2 x 2: q = 2, N' = 8, rb = 4, d = ceil(D / 2) = 2, 2, 1. Dense: one piece
    of 4 x d along the column per direction, 16 d: (16)(2 + 2) 2 = 128; combination: the
    all-gather of T and the reduce-scatter of dT, 16 d each: 128. Gather: over Pr = 2,
    2 ceil((D+1) d' / 2) 4: 8 ceil(8 / 2) + 8 ceil(5 / 2) = 56. Adjacency: rank (i, j) owns piece
    (i, j) of A + I and of A^T (pattern): 8 nnz + 4 (rb + 1) per piece, per layer:
    A pieces: (0,0) 16 nnz, (0,1) 2, (1,0) 4, (1,1) 16; A^T pieces: 16, 4, 2, 16.
    rank 0: 2 (148 + 148) = 592, rank 1: 2 (36 + 52) = 176, rank 2: 176, rank 3: 592.

    supergcn, G = 2 (METIS cuts the cliques apart): the first clique sends post {0,1,2,3}
    (4 rows), pre {4,5} (2), hybrid a cover of {0,1,2 -> 4, 3 -> 5}, 2; the second sends
    post {6} (1), pre {0,1} (2), hybrid 1. Forward rows of a part plus backward rows
    (those it received), times 4 (3 + 4) = 28: post 28 (4 + 1) = 140 each; pre 28 (2 + 2)
    = 112 each; hybrid 28 (2 + 1) = 84 each. Gather over 2: 4 (4 x 4) + 4 (5 x 2) = 104.
    """
    graph = two_cliques()
    part = partition_graph(gcn_normalize(graph.adjacency), 2, seed=0)
    assert set(part[:4]) != set(part[4:]) and len(set(part[:4])) == len(set(part[4:])) == 1  # the cliques
    common = dict(layers=2, hidden=4, epochs=3, warmup=1, lr=0.01, seed=0, collect_outputs=True)
    configs = [normalize_config(TrainConfig(algorithm="cagnet-1.5d", gpus=4, replication=2, **common)),
               normalize_config(TrainConfig(algorithm="cagnet-2d", grid=(2, 2, 1), **common))]
    results = train(graph, 4, configs)
    ref = reference_train(graph, layers=2, hidden=4, epochs=3, lr=0.01, weight_decay=0.01, seed=0)
    for result in results:
        assert max_relative_difference(result["losses"], ref["losses"]) < LOSS_TOL
    got = logged_volumes(results[0])
    assert got["aggregation"].tolist() == [448, 224, 224, 448]
    assert got["gather"].tolist() == [104] * 4
    assert got["combination"].tolist() == got["adjacency"].tolist() == [0] * 4
    got = logged_volumes(results[1])
    assert got["aggregation"].tolist() == [128] * 4
    assert got["combination"].tolist() == [128] * 4
    assert got["gather"].tolist() == [56] * 4
    assert got["adjacency"].tolist() == [592, 176, 176, 592]

    modes = ("post", "pre", "hybrid")
    configs = [normalize_config(TrainConfig(algorithm="supergcn", gpus=2, aggregation=m, **common)) for m in modes]
    results = train(graph, 2, configs)
    for mode, result, want in zip(modes, results, (140, 112, 84)):
        assert max_relative_difference(result["losses"], ref["losses"]) < LOSS_TOL, mode
        got = logged_volumes(result)
        assert got["aggregation"].tolist() == [want, want], mode
        assert got["gather"].tolist() == [104, 104], mode


def test_hand_derived_split_3d_bytes_on_two_cliques():
    """cagnet-3d on 2 x 2 x 2, widths 3 -> 4 -> 2, u = 4: q = 2, N' = 8, rb = 4, rf = 2, piece 2,
    d = ceil(D / 2) = 2, 2, 1. Node v = 4 i + 2 k + t sits at inner position 4 k + 2 i + t, so
    pieces (k, s) hold the columns of nodes {0, 1}, {4, 5} (k = 0) and {2, 3}, {6, 7} (k = 1).

    Aggregation per layer: forward broadcasts down the column (Pr-1) rf d u = 16 and
    reduce-scatter over the fibre 16; backward all-gather over the fibre 16 and
    reduce-scatter over the column 16: 2 (64) = 128. Combination: all-gather of T and
    reduce-scatter of dT over the row, 16 each: 64. Gather: dW, db all-reduced over the
    column and over the fibre, 2 ceil(X / 2) 4 each, X = 4 x 2 = 8 and 5 x 1 = 5: 2 (32) + 2 (24) = 112.
    Adjacency: rank (i, j, k) owns piece (k, s = j) of block row i (rows 4 i .. 4 i + 3),
    sent once per layer and direction (Pc - 1 = 1): forward as stored, 8 nnz + 4 (rb + 1)
    bytes, backward its transpose, 8 nnz + 4 (piece + 1) bytes: 2 (16 nnz + 32) per rank.
    Block 0 holds 8, 0, 8, 2 nonzeros in pieces {0,1}, {4,5}, {2,3}, {6,7} (its cut edges
    6 -> 0, 6 -> 1), block 1 holds 2, 8, 2, 8 (0, 1, 2 -> 4 and 3 -> 5). Rank k Pr Pc + i Pc + j:
    320, 64, 128, 320, 320, 128, 128, 320. (The node order would give rank 1 the 8 nonzeros
    of {2, 3}.)
    """
    graph = two_cliques()
    common = dict(layers=2, hidden=4, epochs=3, warmup=1, lr=0.01, seed=0, collect_outputs=True)
    config = normalize_config(TrainConfig(algorithm="cagnet-3d", grid=(2, 2, 2), **common))
    result = train(graph, 8, [config])[0]
    ref = reference_train(graph, layers=2, hidden=4, epochs=3, lr=0.01, weight_decay=0.01, seed=0)
    assert max_relative_difference(result["losses"], ref["losses"]) < LOSS_TOL
    assert max_relative_difference(result["outputs"], ref["outputs"], normwise=True) < OUTPUT_TOL
    got = logged_volumes(result)
    assert got["aggregation"].tolist() == [128] * 8
    assert got["combination"].tolist() == [64] * 8
    assert got["gather"].tolist() == [112] * 8
    assert got["adjacency"].tolist() == [320, 64, 128, 320, 320, 128, 128, 320]


def test_family_checks_refuse_bad_settings():
    from plexus_tune.errors import UserError

    bad = [dict(algorithm="cagnet-1.5d", gpus=8, replication=4),  # c c > G
           dict(algorithm="cagnet-1.5d", gpus=6, replication=4),  # c does not divide G
           dict(algorithm="cagnet-2d", gpus=4),  # no Pr x Pc grid
           dict(algorithm="cagnet-2d", grid=(2, 2, 2)),
           dict(algorithm="supergcn", gpus=4, aggregation="sideways"),
           dict(algorithm="cagnet-1d", gpus=4, aggregation="pre"),
           dict(algorithm="cagnet-1d", gpus=4, replication=2),
           dict(algorithm="supergcn", gpus=4, block_rows=8),
           dict(algorithm="cagnet-1d", gpus=4, grid=(2, 2, 1)),
           dict(algorithm="cagnet-1d", gpus=4, permute="single"),
           dict(algorithm="plexus-2d", gpus=4),
           dict(algorithm="cagnet-3d", grid=(2, 2, 1)),  # Pl = 1 is cagnet-2d
           dict(algorithm="cagnet-3d", gpus=8),  # no Pr x Pc x Pl grid
           dict(algorithm="cagnet-3d", grid=(1, 1, 2), overlap=True)]
    for options in bad:
        with pytest.raises(UserError):
            normalize_config(TrainConfig(**options))
    ok = normalize_config(TrainConfig(algorithm="cagnet-1.5d", gpus=8, replication=2))
    assert ok.grid == (4, 2, 1) and ok.permute == "none"
    assert normalize_config(TrainConfig(algorithm="supergcn", gpus=3)).aggregation == "hybrid"
    assert normalize_config(TrainConfig(algorithm="cagnet-1.5d", grid=(3, 2, 1))).replication == 2


def wire_volumes(calls, gpus: int, precision: str) -> dict:
    """Per-rank bytes per class of a schedule sent at ``precision`` (adjacency as stored): every
    dense block at :func:`plexus_tune.model.comm_precision.wire_bytes` / ``block_bytes``."""
    from plexus_tune.model.comm_precision import block_bytes, wire_bytes

    out = {name: np.zeros(gpus) for name in VOLUME_CLASSES}
    for call in calls:
        sent = np.asarray(call.sent_bytes, dtype=np.float64)
        if call.comm_class == "adjacency":
            out["adjacency"] += sent
        elif call.op == "point_to_point":
            width = int(call.row_bytes) // 4
            per = [[block_bytes(int(r), width, precision) if r else 0 for r in rr] for rr in np.asarray(call.pair_rows)]
            out[call.comm_class] += np.asarray(per, dtype=np.float64).sum(axis=1)
        elif call.op == "broadcast":
            rows = int(call.rows)
            cols = int(call.message_bytes) // (4 * rows)
            blocks = sent / ((call.group_size - 1) * call.message_bytes)
            out[call.comm_class] += blocks * (call.group_size - 1) * block_bytes(rows, cols, precision)
        else:
            wire = wire_bytes(call.op, call.group_size, int(call.message_bytes), precision, int(call.rows)).bytes
            out[call.comm_class] += np.where(sent > 0, wire, 0)
    return out


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_reduced_precision_bytes_follow_the_wire_convention(graph, reference, precision):
    """At bf16 every dense class sends half its FP32 bytes; at int8 each block as packed codes
    plus its rows' zero points and scales; adjacency pieces as stored. Training stays close."""
    from plexus_tune.model.volumes import cagnet_15d_schedule

    common = dict(COMMON, comm_precision=precision)
    configs = [normalize_config(TrainConfig(algorithm="cagnet-1.5d", gpus=4, replication=2, **common)),
               normalize_config(TrainConfig(algorithm="cagnet-2d", grid=(2, 2, 1), **common)),
               normalize_config(TrainConfig(algorithm="cagnet-2d", grid=(1, 4, 1), **common)),
               normalize_config(TrainConfig(algorithm="supergcn", gpus=4, aggregation="hybrid", **common))]
    results = train(graph, 4, configs)
    widths = model_widths(FEATURES, CLASSES, 3, HIDDEN)
    for config, result in zip(configs, results):
        what = f"{config.algorithm} {config.grid} {precision}"
        if config.algorithm == "cagnet-1.5d":
            calls = cagnet_15d_schedule(NODES, widths, 4, 2)
        elif config.algorithm == "cagnet-2d":
            pr, pc = config.grid[:2]
            calls = cagnet_summa_schedule(NODES, widths, pr, pc, a_pieces=summa_piece_nnz(graph.adjacency, pr, pc),
                                          at_pieces=summa_piece_nnz(graph.adjacency, pr, pc, transpose=True))
        else:
            plan = partition_exchange(gcn_normalize(graph.adjacency), 4, seed=config.seed)
            calls = supergcn_schedule(widths, plan.forward_rows("hybrid"))
        got, want = logged_volumes(result), wire_volumes(calls, 4, precision)
        fp32 = rank_volumes(calls, 4)
        for name in VOLUME_CLASSES:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{what}: {name}")
        if precision == "bf16":
            for name in ("aggregation", "combination", "gather"):
                np.testing.assert_array_equal(got[name], fp32[name] / 2, err_msg=what)
        assert max_relative_difference(result["losses"], reference["losses"]) < 1e-2, what
        assert any(row["quant_ms"] > 0 for per_rank in result["timers"] for row in per_rank), what
