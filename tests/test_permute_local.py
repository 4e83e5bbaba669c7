"""The locality-preserving balanced permutation (``--permute local``, graph/permute)."""

import numpy as np
import pytest
import scipy.sparse as sp

from plexus_tune.graph import (
    balance_report,
    block_nnz,
    grid2d_adjacency,
    grid_parts,
    local_permutation,
    make_permutation,
    permutations_for,
    permute_matrix,
)
from plexus_tune.graph.permute import segment_bounds, with_self_loops_pattern


def test_segment_bounds_by_hand():
    # n = 37: halves of ceil(37/2) = 19, thirds of 13
    assert segment_bounds(37, (2, 3)).tolist() == [0, 13, 19, 26, 37]
    assert segment_bounds(37, (1,)).tolist() == [0, 37]
    assert segment_bounds(5, (8,)).tolist() == [0, 1, 2, 3, 4, 5]  # more parts than nodes: empty ones vanish
    with pytest.raises(ValueError):
        segment_bounds(10, (0,))


def test_grid_parts_and_block_size_by_hand():
    from plexus_tune.graph.permute import LOCAL_BLOCKS_PER_SHARD, local_block_size

    assert grid_parts((1, 1, 1)) == (1, 1, 1)
    assert grid_parts((2, 1, 4)) == (1, 2, 4)
    assert LOCAL_BLOCKS_PER_SHARD == 2048
    assert local_block_size(1_000_000, (8, 8)) == 7  # 1e6 // (2048 * 64)
    assert local_block_size(1_000_000, (1, 2, 4)) == 61  # finest 2D split 4 x 2: 1e6 // (2048 * 8)
    assert local_block_size(1_000_000, (1, 1, 1)) == 488
    assert local_block_size(1000, (8, 8)) == 1


def test_local_blocks_of_ids_stay_together():
    """With blocks of 5 ids, every id block lies in one segment (ascending, consecutive)
    unless a segment bound cuts it; the segments' id blocks are the seeded block order's."""
    n, b, parts = 103, 5, (4,)
    perm = local_permutation(n, 3, parts, block=5)
    assert np.array_equal(np.sort(perm), np.arange(n))
    order = np.random.default_rng(3).permutation(-(-n // b))
    unsorted = (order[:, None] * b + np.arange(b)[None, :]).ravel()
    unsorted = unsorted[unsorted < n]
    bounds = segment_bounds(n, parts)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        seg = perm[lo:hi]
        assert np.array_equal(seg, np.sort(unsorted[lo:hi]))
        runs = np.split(seg, np.nonzero(np.diff(seg) != 1)[0] + 1)
        assert all(len(r) <= hi - lo for r in runs)
    # whole blocks: an id block is split between segments only where a bound cuts the block order
    where = np.empty(n, dtype=np.int64)
    where[perm] = np.searchsorted(bounds, np.arange(n), side="right") - 1
    split_blocks = [k for k in range(-(-n // b)) if len(set(where[k * b:min(n, (k + 1) * b)])) > 1]
    assert len(split_blocks) <= len(bounds) - 2


def test_local_with_blocks_keeps_the_lattice_balance():
    adj = grid2d_adjacency(40_000, seed=0)
    pattern = with_self_loops_pattern(adj)
    r, c = local_permutation(40_000, 0, (8, 8), block=4), local_permutation(40_000, 1, (8, 8), block=4)
    counts = block_nnz(permute_matrix(pattern, r, c), 8, 8)
    assert counts.max() / counts.mean() < 1.15


@pytest.mark.parametrize("n,parts", [(37, (2, 3)), (1000, (8,)), (999, (1, 2, 4)), (64, (64,))])
def test_local_is_double_sorted_within_segments(n, parts):
    """Same node set per segment as the double permutation, ascending ids inside each."""
    row, col = permutations_for("local", n, seed=4, parts=parts)
    for perm, seed in ((row, 4), (col, 5)):
        assert np.array_equal(np.sort(perm), np.arange(n))
        ref = make_permutation(n, seed)
        bounds = segment_bounds(n, parts)
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            assert np.array_equal(perm[lo:hi], np.sort(ref[lo:hi]))
            assert np.all(np.diff(perm[lo:hi]) > 0)
    assert not np.array_equal(row, col)
    assert np.array_equal(local_permutation(n, 4, parts), row)  # reproducible


def test_local_on_one_part_is_the_identity():
    row, col = permutations_for("local", 50_000, seed=1, parts=grid_parts((1, 1, 1)))
    assert row.tolist() == col.tolist() == list(range(50_000))


def test_local_needs_parts():
    with pytest.raises(ValueError):
        permutations_for("local", 10, seed=0)


@pytest.mark.parametrize("blocks", [(8, 8), (4, 2), (3, 5)])
def test_local_blocks_hold_the_double_nonzeros(blocks):
    """Every block of the R x C split has exactly the double permutation's nonzeros."""
    adj = grid2d_adjacency(4_001, seed=2)
    pattern = with_self_loops_pattern(adj)
    dr, dc = permutations_for("double", 4_001, seed=0)
    lr, lc = permutations_for("local", 4_001, seed=0, parts=blocks)
    double = block_nnz(permute_matrix(pattern, dr, dc), *blocks)
    local = block_nnz(permute_matrix(pattern, lr, lc), *blocks)
    assert np.array_equal(double, local)
    rep = balance_report(adj, blocks, "local")
    assert rep["block_nnz"] == local.tolist()


def test_local_keeps_the_lattice_neighbours_close():
    """Locality by hand: read in row order, the columns a row block gathers from one
    column block of a split into 8 ascend with the rows under the local permutation (the
    lattice links ids at most cols + 1 apart, ascending rows meet ascending columns), so
    the mean jump between consecutive gathers within a column block stays a few times
    cols / 8; under the double permutation it is a third of the block (5,000 / 3)."""
    n, parts = 40_000, 8
    adj = with_self_loops_pattern(grid2d_adjacency(n, seed=0, long_edges=0.0))
    step = -(-n // parts)

    def mean_jump(mode):
        r, c = permutations_for(mode, n, seed=0, parts=(parts,))
        b = permute_matrix(adj, r, c)
        jumps = []
        for q in range(parts):
            seq = b.indices[b.indices // step == q].astype(np.int64)  # CSR order: rows ascending
            jumps.append(np.abs(np.diff(seq)))
        return float(np.mean(np.concatenate(jumps)))

    double, local = mean_jump("double"), mean_jump("local")
    assert double == pytest.approx(step / 3, rel=0.1)
    assert local < 200 / 8 * 4  # cols = 200


def test_balance_report_local_on_lattice():
    adj = grid2d_adjacency(40_000, seed=0)
    double = balance_report(adj, (8, 8), "double")
    local = balance_report(adj, (8, 8), "local")
    assert local["max_over_mean"] == pytest.approx(double["max_over_mean"]) and local["max_over_mean"] < 1.15
    assert local["nnz"] == double["nnz"]
    assert sp.issparse(adj)


@pytest.mark.parametrize("mode", ["double", "local"])
def test_two_sided_shards_of_a_directed_graph_are_refused_before_training(tmp_path, mode):
    from plexus_tune.errors import UserError
    from plexus_tune.graph import Graph, synthetic
    from plexus_tune.graph.shards import write_shards
    from plexus_tune.trainer import TrainConfig
    from plexus_tune.trainer.run import graph_source

    g = synthetic("rmat:nodes=30,edges=90,features=3,classes=2,seed=1")
    directed = Graph(adjacency=sp.triu(g.adjacency, k=1, format="csr"), features=g.features, labels=g.labels,
                     num_classes=2, name="directed30")
    write_shards(directed, tmp_path / "s", blocks=(2, 2), mode=mode, seed=0)
    with pytest.raises(UserError, match=f"{mode}-permuted shards of a directed graph"):
        graph_source(TrainConfig(graph=str(tmp_path / "s"), grid=(1, 1, 1), epochs=2, warmup=1))
