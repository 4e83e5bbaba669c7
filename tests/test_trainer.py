"""The 3D-parallel trainer equals serial PyTorch Geometric on every grid of G in {1,2,3,4,6,8}.

One process set per world size trains every configuration of that size in turn
(process groups are rebuilt per grid), so the test pays one launch per G. The graph
has 37 nodes (prime: padded on every grid but 1x1x1), 7 features, 5 classes and hidden
width 9, so no dimension divides the axis sizes; it is directed and has two self-loops.
"""

import numpy as np
import pytest
import scipy.sparse as sp

from plexus_tune.graph import Graph
from plexus_tune.model.grid import enumerate_grids
from plexus_tune.launch import launch_local
from plexus_tune.model.shapes import layer_shapes
from plexus_tune.trainer import TrainConfig, model_widths
from plexus_tune.trainer.rank import rank_main
from plexus_tune.trainer.layout import make_layout
from plexus_tune.trainer.reference import max_relative_difference, reference_train

NODES, FEATURES, CLASSES, HIDDEN, EPOCHS = 37, 7, 5, 9, 3  # 3 epochs: the first and two with AdamW moments
LOSS_TOL, OUTPUT_TOL = 1e-5, 1e-4


def tiny_graph() -> Graph:
    rng = np.random.default_rng(7)
    src = rng.integers(0, NODES, 160)
    dst = rng.integers(0, NODES, 160)
    keep = src != dst
    rows = np.concatenate([dst[keep], [3, 11]])  # row v holds in-neighbours u of edge u -> v
    cols = np.concatenate([src[keep], [3, 11]])  # plus two self-loops
    adj = sp.csr_matrix((np.ones(rows.size, dtype=np.float32), (rows, cols)), shape=(NODES, NODES))
    adj.data[:] = 1.0  # duplicates summed to 1 edge
    adj.sum_duplicates()
    adj.data[:] = 1.0
    features = rng.standard_normal((NODES, FEATURES)).astype(np.float32)
    labels = np.arange(NODES, dtype=np.int64) % CLASSES
    rng.shuffle(labels)
    return Graph(adjacency=adj, features=features, labels=labels, num_classes=CLASSES, name="tiny37")


def configs_for(gpus: int) -> list[TrainConfig]:
    """Every grid of ``gpus`` with double permutation, again without permutation but with
    blocked, overlapped aggregation, and again with the local permutation; plus single permutation, blocking without overlap and
    deeper or shallower models on a few grids."""
    common = dict(hidden=HIDDEN, epochs=EPOCHS, warmup=1, lr=0.01, seed=3, collect_outputs=True)
    out = []
    for grid in enumerate_grids(gpus):
        grid = tuple(int(g) for g in grid)
        out.append(TrainConfig(grid=grid, layers=3, permute="double", **common))
        out.append(TrainConfig(grid=grid, layers=3, permute="none", block_rows=4, overlap=True, **common))
        out.append(TrainConfig(grid=grid, layers=3, permute="local", **common))
    extras = {
        1: [((1, 1, 1), dict(layers=5, permute="single", block_rows=10))],
        2: [((1, 1, 2), dict(layers=4, permute="single"))],
        4: [((2, 1, 2), dict(layers=4, permute="double", block_rows=3)),
            ((1, 2, 2), dict(layers=1, permute="single")),
            ((2, 2, 1), dict(layers=5, permute="double", block_rows=5, overlap=True))],
        8: [((2, 2, 2), dict(layers=7, permute="double"))],
    }
    for grid, opts in extras.get(gpus, []):
        out.append(TrainConfig(grid=grid, **{**common, **opts}))
    return out


@pytest.fixture(scope="module")
def graph():
    return tiny_graph()


@pytest.fixture(scope="module")
def references(graph):
    cache = {}

    def get(layers):
        if layers not in cache:
            cache[layers] = reference_train(graph, layers=layers, hidden=HIDDEN, epochs=EPOCHS, lr=0.01,
                                            weight_decay=0.01, seed=3)
        return cache[layers]
    return get


@pytest.mark.parametrize("gpus", [1, 2, 3, 4, 6, 8])
def test_every_grid_equals_serial_pyg(gpus, graph, references):
    configs = configs_for(gpus)
    results = launch_local(rank_main, gpus, args=(graph, configs, "cpu"), timeout_s=400, threads_per_rank=1,
                           preload=("torch._dynamo", "plexus_tune.trainer.rank"))[0]
    assert len(results) == len(configs)
    for config, result in zip(configs, results):
        ref = references(config.layers)
        what = f"grid {config.grid} layers {config.layers} permute {config.permute} blocks {config.block_rows}"
        assert len(result["losses"]) == EPOCHS
        loss_diff = max_relative_difference(result["losses"], ref["losses"])
        out_diff = max_relative_difference(result["outputs"], ref["outputs"], normwise=True)
        assert loss_diff < LOSS_TOL, (what, loss_diff)
        assert out_diff < OUTPUT_TOL, (what, out_diff)
        assert result["losses"][-1] < result["losses"][0], what  # it trains
        # every rank timed every epoch, and the phases fit in the epoch
        assert len(result["timers"]) == gpus and all(len(t) == EPOCHS for t in result["timers"])
        for per_rank in result["timers"]:
            for row in per_rank:
                assert row["spmm_ms"] > 0 and row["epoch_ms"] > 0
                assert row["spmm_ms"] + row["gemm_ms"] + row["comm_ms"] <= row["epoch_ms"] * 1.001
                assert (row["comm_ms"] > 0) == (gpus > 1)
        assert result["n_pad"] == max(g * -(-NODES // g) for g in config.grid)  # each axis pads N on its own
    if gpus == 8:
        splits = {tuple(r["w_split"]) for r in results}
        flat = {s for t in splits for s in t}
        assert flat == {True, False}  # weights split over depth (g_d > 1) and whole (g_d = 1) both exercised
        # W pieces and layer-0 feature pieces padded (rows not divisible by the depth) both exercised
        shapes = [s for c in configs for s in layer_shapes(NODES, model_widths(FEATURES, CLASSES, c.layers, HIDDEN),
                                                             c.grid) if s.g_d > 1]
        assert any(s.c_i % s.g_d for s in shapes) and any(s.r_o % s.g_d for s in shapes if s.layer == 0)


def rng(b):
    """A block as (start, stop, size): real indices [start, stop) in a buffer of size entries."""
    return (b.start, b.stop, b.size)


@pytest.mark.parametrize("gpus, grids", [(4, [(2, 1, 2), (1, 2, 2), (2, 2, 1)]), (8, [(2, 2, 2)])])
def test_fixed_features_equal_serial_pyg(gpus, grids, graph):
    """With fixed features the 3D trainer equals serial PyG whose features are a plain tensor,
    with and without LayerNorm and row blocks."""
    configs = [TrainConfig(grid=grid, hidden=HIDDEN, epochs=EPOCHS, warmup=1, lr=0.01, seed=3, collect_outputs=True,
                           fixed_features=True, layer_norm=norm, block_rows=blocks)
               for grid in grids for norm, blocks in ((False, None), (True, 4))]
    results = launch_local(rank_main, gpus, args=(graph, configs, "cpu"), timeout_s=400, threads_per_rank=1,
                           preload=("torch._dynamo", "plexus_tune.trainer.rank"))[0]
    refs = {norm: reference_train(graph, layers=3, hidden=HIDDEN, epochs=EPOCHS, lr=0.01, weight_decay=0.01, seed=3,
                                  layer_norm=norm, fixed_features=True) for norm in (False, True)}
    for config, result in zip(configs, results):
        ref = refs[config.layer_norm]
        what = f"grid {config.grid} layer norm {config.layer_norm}"
        assert max_relative_difference(result["losses"], ref["losses"]) < LOSS_TOL, what
        assert max_relative_difference(result["outputs"], ref["outputs"], normwise=True) < OUTPUT_TOL, what


def test_layout_hand_derived_blocks():
    # grid 2x3x1, rank 4 = (x=1, y=1, z=0); N = 37; widths 7, 9, 9, 5. Every axis pads on its
    # own: blocks of ceil(37/2) = 19 rows over X, ceil(37/3) = 13 over Y, 37 over Z
    lay = make_layout((2, 3, 1), 4, 37, (7, 9, 9, 5))
    assert lay.padded_nodes == 39 and lay.padded_widths == (9, 10, 9, 6)  # 3 * 13; widths over Y, X, Z, Y
    l0, l1, l2 = lay.layers
    # layer 0 (o X, n Y, d Z): rows all 37 (Z = 1), columns block x=1 of 19: [19, 37) + 1 padding row
    assert (l0.outer, l0.inner, l0.depth) == (0, 1, 2)
    assert (rng(l0.a_rows), rng(l0.a_cols)) == ((0, 37, 37), (19, 37, 19))
    assert (rng(l0.in_cols), rng(l0.out_cols)) == ((3, 6, 3), (5, 9, 5))  # ceil(7/3) = 3, ceil(9/2) = 5
    assert rng(l0.f_rows) == (19, 37, 19) and not l0.w_split  # depth Z = 1: nothing split
    # layer 1 (o Z, n X, d Y): rows block y=1 of 13, inputs columns block x=1 of ceil(9/2) = 5
    assert (l1.outer, l1.inner, l1.depth) == (2, 0, 1)
    assert (rng(l1.a_rows), rng(l1.a_cols)) == ((13, 26, 13), (0, 37, 37))
    assert (rng(l1.in_cols), rng(l1.out_cols)) == ((5, 9, 5), (0, 9, 9))
    # W's 5 rows over a depth of 3: pieces of ceil(5/3) = 2 rows, y = 1 holds rows 7, 8
    assert l1.w_split and rng(l1.w_rows) == (7, 9, 2)
    assert rng(make_layout((2, 3, 1), 5, 37, (7, 9, 9, 5)).layers[1].w_rows) == (9, 9, 2)  # y = 2: all padding
    # layer 2 (o Y, n Z, d X): rows block x=1 of 19, columns block y=1 of 13, classes block y=1 of 2
    assert (rng(l2.a_rows), rng(l2.a_cols)) == ((19, 37, 19), (13, 26, 13))
    assert rng(l2.out_cols) == (2, 4, 2) and rng(l2.w_rows) == (5, 9, 5)  # ceil(9/2) = 5 rows of W
    # 2x2x2: layer 0 has ceil(7/2) = 4 input columns, over depth 2 -> W pieces of 2 rows; the
    # features' 19-row block over X is kept in depth pieces of ceil(19/2) = 10 rows
    l0 = make_layout((2, 2, 2), 0, 37, (7, 9, 9, 5)).layers[0]
    assert l0.w_split and rng(l0.w_rows) == (0, 2, 2)
    assert rng(l0.f_rows) == (0, 10, 10)
    l0 = make_layout((2, 2, 2), 6, 37, (7, 9, 9, 5)).layers[0]  # rank 6 = (x=1, y=0, z=1)
    assert rng(l0.f_rows) == (29, 37, 10)  # rows 29..36, then 2 padding rows


@pytest.mark.parametrize("grid", [(3, 2, 1), (1, 2, 4), (2, 3, 2), (4, 1, 3)])
def test_layout_chains_output_to_next_input(grid):
    g = int(np.prod(grid))
    for rank in range(g):
        lay = make_layout(grid, rank, 53, (11, 13, 13, 13, 13, 7))
        for a, b in zip(lay.layers[:-1], lay.layers[1:]):
            assert a.out_cols == b.in_cols
            assert a.a_rows == b.a_cols
            assert b.parity != a.parity


@pytest.mark.parametrize("mode", ["double", "single", "local"])
def test_shard_files_train_like_the_whole_graph(tmp_path, mode):
    """Ranks read only their 2D shard files (files cut 2x3, grids that do not match the cut)."""
    from plexus_tune.graph import synthetic
    from plexus_tune.graph.shards import write_shards

    g = synthetic("rmat:nodes=45,edges=150,features=7,classes=4,seed=5")  # symmetric
    if mode == "single":  # a directed graph: the alternate layout equals the stored one
        adj = sp.triu(g.adjacency, k=1, format="csr")
        g = Graph(adjacency=adj, features=g.features, labels=g.labels, num_classes=4, name="directed45")
    shard_dir = tmp_path / "shards"
    write_shards(g, shard_dir, blocks=(2, 3), mode=mode, seed=9)
    configs = [TrainConfig(grid=grid, layers=3, hidden=HIDDEN, epochs=EPOCHS, warmup=1, seed=3, collect_outputs=True)
               for grid in [(2, 1, 2), (1, 4, 1), (2, 2, 1)]]
    results = launch_local(rank_main, 4, args=(str(shard_dir), configs, "cpu"), timeout_s=300, threads_per_rank=1,
                           preload=("torch._dynamo", "plexus_tune.trainer.rank"))[0]
    ref = reference_train(g, layers=3, hidden=HIDDEN, epochs=EPOCHS, lr=0.01, weight_decay=0.01, seed=3)
    for config, result in zip(configs, results):
        assert result["permute"] == mode
        assert max_relative_difference(result["losses"], ref["losses"]) < LOSS_TOL, config.grid
        assert max_relative_difference(result["outputs"], ref["outputs"], normwise=True) < OUTPUT_TOL, config.grid
