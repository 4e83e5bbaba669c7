"""Exact per-rank volumes of the CAGNET and SuperGCN families against hand-derived values,
and the minimum vertex cover against brute force."""

import itertools

import numpy as np
import pytest
import scipy.sparse as sp

from plexus_tune.errors import UserError
from plexus_tune.graph.partition import (
    exchange_plan,
    minimum_vertex_cover,
    partition_exchange,
    partition_graph,
    summa_piece_nnz,
)
from plexus_tune.model.volumes import (
    cagnet_15d_schedule,
    cagnet_summa_schedule,
    rank_volumes,
    stage_chunks,
    supergcn_schedule,
)


def test_1d_every_rank_broadcasts_its_block_once():
    # N = 10 on 4 ranks: b = 3 padded rows; widths 3 -> 2
    vol = rank_volumes(cagnet_15d_schedule(10, [3, 2], 4, 1), 4)
    # forward and backward: (4 - 1) ranks x 3 rows x 3 cols x 4 bytes each
    assert vol["aggregation"].tolist() == [2 * 3 * 3 * 3 * 4] * 4
    # dW (3 x 2) and db (2) as one buffer of 8 elements: 2 (4-1) ceil(8/4) elements
    assert vol["gather"].tolist() == [2 * 3 * 2 * 4] * 4
    assert vol["combination"].sum() == 0 and vol["adjacency"].sum() == 0


def test_15d_roots_follow_the_stage_chunks():
    # P = 8, c = 2: R = 4 block rows of b = ceil(9/4) = 3; columns run stages [0,2) and [2,4)
    assert [list(ch) for ch in stage_chunks(4, 2)] == [[0, 1], [2, 3]]
    calls = cagnet_15d_schedule(9, [5, 2], 8, 2)
    fwd = rank_volumes(calls, 8, direction="forward")["aggregation"]
    bcast = 3 * 3 * 5 * 4  # b D u
    reduce = 2 * 1 * 8 * 4  # 2 (c-1) ceil(b D / c) = 2 ceil(15/2) = 16 elements
    roots = {0, 2, 5, 7}  # rank k c + j for k in chunk j
    assert fwd.tolist() == [(bcast if r in roots else 0) + reduce for r in range(8)]
    assert rank_volumes(calls, 8, direction="backward")["aggregation"].tolist() == fwd.tolist()
    # dW + db: 6 x 2 = 12 elements all-reduced over R = 4 ranks: 2 * 3 * 3 elements
    assert rank_volumes(calls, 8)["gather"].tolist() == [2 * 3 * 3 * 4] * 8


def test_15d_total_volume_falls_as_c_grows():
    widths = [64, 64, 16]
    totals = [sum(v.sum() for v in rank_volumes(cagnet_15d_schedule(4096, widths, 64, c), 64).values())
              for c in (1, 2, 4, 8)]
    assert totals == sorted(totals, reverse=True)


@pytest.mark.parametrize("gpus,c", [(8, 3), (8, 4), (6, 0)])
def test_15d_rejects_bad_replication(gpus, c):
    with pytest.raises(UserError):
        cagnet_15d_schedule(10, [3, 2], gpus, c)


def test_2d_hand_derived_on_a_graph_without_edges():
    # N = 8 on 2 x 2, widths 4 -> 2: q = 2, N' = 8, rb = 4, piece = 4, d_0 = 2, d_1 = 1
    adj = sp.csr_matrix((8, 8))
    pieces = summa_piece_nnz(adj, 2, 2)
    assert pieces.tolist() == [[[4, 0], [0, 4]]]  # A + I = I
    calls = cagnet_summa_schedule(8, [4, 2], 2, 2, a_pieces=pieces, at_pieces=pieces)
    vol = rank_volumes(calls, 4)
    u = 4
    # aggregation: forward and backward (Pr-1) rb d_0 u
    assert vol["aggregation"].tolist() == [2 * 1 * 4 * 2 * u] * 4
    # combination: T all-gather forward, dT reduce-scatter backward (no logits gather: the loss is sharded)
    assert vol["combination"].tolist() == [(4 * 2 + 4 * 2) * u] * 4
    # gather: (4 + 1) x 1 over Pr = 2: 2 (2-1) ceil(5/2) = 6 elements
    assert vol["gather"].tolist() == [6 * u] * 4
    # adjacency: rank (i, j) owns piece j of block row i: nnz 4 on the diagonal;
    # CSR bytes nnz (4 + 4) + (4 + 1) 4, sent to Pc - 1 = 1 rank, forward and backward
    expected = [2 * ((32 if i == j else 0) + 20) for i in range(2) for j in range(2)]
    assert vol["adjacency"].tolist() == expected


def test_2d_rectangular_pieces_cover_the_matrix():
    rng = np.random.default_rng(3)
    adj = sp.random(37, 37, density=0.1, random_state=rng, format="csr")
    for pr, pc in [(2, 3), (3, 2), (4, 2), (1, 4)]:
        pieces = summa_piece_nnz(adj, pr, pc)
        loops = sp.csr_matrix(adj)
        loops.data[:] = 1
        expected = (loops + sp.eye(37)).tocsr()
        expected.sum_duplicates()
        assert pieces.sum() == expected.nnz
        vol = rank_volumes(cagnet_summa_schedule(37, [6, 3], pr, pc, a_pieces=pieces), pr * pc)
        # dense SpMM traffic: (Pr - 1) rb d_0 u twice, rb = N'/Pr, N' = lcm ceil(N / lcm)
        q = np.lcm(pr, pc)
        rb = q * -(-37 // q) // pr
        assert vol["aggregation"].tolist() == [2 * (pr - 1) * rb * -(-6 // pc) * 4] * (pr * pc)


def test_3d_adds_the_fibre_reduce_scatter():
    vol = rank_volumes(cagnet_summa_schedule(16, [4, 2], 2, 2, 2, nnz=32), 8, direction="forward")
    # q = 2, N' = 16, rb = 8, rf = 4, d_0 = 2: (Pr-1) rf d u + (Pl-1) rf d u
    assert vol["aggregation"].tolist() == [(4 * 2 + 4 * 2) * 4] * 8


def fig4_graph():
    # nodes 0..2 on part 0 (destinations 1, 2, 3 of the example as 0, 1, 2), 3..5 on part 1 (sources 4, 5, 6)
    edges = [(3, 0), (3, 1), (3, 2), (4, 1), (5, 1)]  # u -> v is A[v, u]
    rows = [v for _, v in edges]
    cols = [u for u, _ in edges]
    adj = sp.csr_matrix((np.ones(len(edges)), (rows, cols)), shape=(6, 6))
    return adj, np.array([0, 0, 0, 1, 1, 1])


def test_supergcn_pre_post_hybrid_rows_hand_derived():
    adj, part = fig4_graph()
    plan = exchange_plan(adj, part)
    assert plan.rows["post"].tolist() == [[0, 0], [3, 0]]
    assert plan.rows["pre"].tolist() == [[0, 0], [3, 0]]
    assert plan.rows["hybrid"].tolist() == [[0, 0], [2, 0]]
    # hybrid: source 3 (in the cover) is sent as it is; edges from 4 and 5 are summed into 1's row
    post = {(int(u), int(v)) for u, v, e in zip(plan.src, plan.dst, plan.post_edge) if e}
    assert post == {(3, 0), (3, 1), (3, 2)}
    calls = supergcn_schedule([4, 2], plan.rows["hybrid"])
    fwd = rank_volumes(calls, 2, direction="forward")["aggregation"]
    bwd = rank_volumes(calls, 2, direction="backward")["aggregation"]
    assert fwd.tolist() == [0, 2 * 4 * 4] and bwd.tolist() == [2 * 4 * 4, 0]
    # dW (4 x 2) + db: 10 elements over 2 ranks: 2 (2-1) 5 elements
    assert rank_volumes(calls, 2)["gather"].tolist() == [10 * 4, 10 * 4]


def brute_force_cover(b):
    n_left, n_right = b.shape
    coo = b.tocoo()
    edges = list(zip(coo.row.tolist(), coo.col.tolist()))
    for size in range(n_left + n_right + 1):
        for chosen in itertools.combinations(range(n_left + n_right), size):
            s = set(chosen)
            if all(u in s or (n_left + v) in s for u, v in edges):
                return size
    raise AssertionError


@pytest.mark.parametrize("seed", range(12))
def test_minimum_vertex_cover_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n_left, n_right = rng.integers(1, 6, size=2)
    b = sp.csr_matrix((rng.random((n_left, n_right)) < 0.4).astype(np.int8))
    left, right = minimum_vertex_cover(b)
    coo = b.tocoo()
    assert all(left[u] or right[v] for u, v in zip(coo.row, coo.col))
    assert int(left.sum() + right.sum()) == brute_force_cover(b)


def test_metis_partition_is_seeded_and_hybrid_never_exceeds_pre_or_post():
    rng = np.random.default_rng(0)
    a = sp.random(300, 300, density=0.03, random_state=rng, format="csr")
    a = ((a + a.T) > 0).astype(np.float32)
    p1 = partition_graph(a, 4, seed=1, cache=False)
    assert np.array_equal(p1, partition_graph(a, 4, seed=1, cache=False))  # METIS itself, not the cache
    assert sorted(np.unique(p1).tolist()) == [0, 1, 2, 3]
    plan = partition_exchange(a, 4, seed=1)
    assert np.all(plan.rows["hybrid"] <= np.minimum(plan.rows["pre"], plan.rows["post"]))
    # symmetric graph: pre from p to q is post from q to p
    assert np.array_equal(plan.rows["pre"], plan.rows["post"].T)
    assert plan.nodes.sum() == 300


def test_partition_rejects_more_parts_than_nodes():
    with pytest.raises(UserError):
        partition_graph(sp.eye(3, format="csr"), 4)


def test_table5_runner_tiny_prints_ratios_of_at_least_one():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "runners/campaigns/supergcn_volumes.py", "--tiny"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith(("rmat:", "grid2d:"))]
    assert len(rows) == 4
    for row in rows:
        pre, post, hybrid = (int(v.replace(",", "")) for v in row[3:6])
        assert hybrid <= min(pre, post) and float(row[8]) == pytest.approx(pre / hybrid, abs=1e-3)
    assert "1.524" in out.stdout


def test_plan_keeps_empty_parts():
    adj, part = fig4_graph()
    plan = exchange_plan(adj, part, 4)
    assert plan.parts == 4 and plan.rows["hybrid"].shape == (4, 4) and plan.nodes.tolist() == [3, 3, 0, 0]
    with pytest.raises(UserError):
        exchange_plan(adj, part, 1)
