"""model/shapes.py against hand-derived values and against the trainer's real per-rank tensors.

The trainer part builds every rank of every grid of G = 1..8 with the trainer's own
construction code (:class:`Plexus3dTrainer`) and trains one epoch through its own layer and
loss functions, with a stand-in for torch.distributed that runs each rank alone and keeps
every collective's shapes (gathers return g pieces, reduce-scatters keep one, all-reduces
change nothing). Autograd checks every gradient's shape against its parameter; the test
records the operands of every SpMM and GEMM and compares them, the stored shards,
parameters and labels, and the trainer's tracked memory with model/shapes.py and
model/memory.py. Graphs of 37 and 13 nodes (13: some row blocks are wholly padding),
widths 13, 11, 11, (11,) 5.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import scipy.sparse as sp

from plexus_tune.errors import UserError
from plexus_tune.graph import Graph
from plexus_tune.model.grid import coords_of, enumerate_grids
from plexus_tune.model.memory import memory_breakdown
from plexus_tune.model.shapes import (
    INDEX_BYTES,
    ceil_div,
    csr_bytes,
    csr_index_bytes,
    csr_index_dtype,
    layer_shapes,
    padded_length,
    row_blocks,
)
from plexus_tune.model.workload import Workload

FEATURES, HIDDEN, CLASSES = 13, 11, 5


# --------------------------------------------------------------------------- pure arithmetic


def test_hand_derived_sizes_of_a_non_divisible_grid():
    # N = 1001, NNZ = 5000, widths 12, 8, 6, 7 on 2x3x4 (x=2, y=3, z=4)
    s0, s1, s2 = layer_shapes(1001, (12, 8, 6, 7), (2, 3, 4), nnz=5000)
    # layer 0 (o X, n Y, d Z): r_d = ceil(1001/4) = 251, r_o = ceil(1001/2) = 501, c_i = 12/3 = 4,
    # c_o = 8/2 = 4, w = ceil(4/4) = 1, f = ceil(501/4) = 126, z = ceil(5000/8) = 625
    assert (s0.outer, s0.inner, s0.depth) == (0, 1, 2)
    assert (s0.r_d, s0.r_o, s0.c_i, s0.c_o, s0.w_rows, s0.feature_rows, s0.z) == (251, 501, 4, 4, 1, 126, 625)
    assert (s0.w_gathered_rows, s0.features_gathered_rows) == (4, 504)
    # layer 1 (o Z, n X, d Y): r_d = ceil(1001/3) = 334, r_o = 251, c_i = 8/2 = 4, c_o = ceil(6/4) = 2,
    # w = ceil(4/3) = 2 (gathered 6), z = ceil(5000/12) = 417
    assert (s1.r_d, s1.r_o, s1.c_i, s1.c_o, s1.w_rows, s1.w_gathered_rows, s1.z) == (334, 251, 4, 2, 2, 6, 417)
    # layer 2 (o Y, n Z, d X): r_d = 501, r_o = 334, c_i = ceil(6/4) = 2, c_o = ceil(7/3) = 3, w = 1
    assert (s2.r_d, s2.r_o, s2.c_i, s2.c_o, s2.w_rows, s2.z) == (501, 334, 2, 3, 1, ceil_div(5000, 6))
    assert s2.a_shape == (501, 334) and s2.w_shape == (1, 3) and s2.q_shape == (501, 3)
    assert (s0.blocks, s0.block_rows) == (1, 251)  # no blocking: one block of all rows
    assert all(isinstance(v, int) for v in (s0.r_d, s1.c_o, s2.z, s0.blocks))


def test_blocked_aggregation_row_blocks():
    # 251 rows, at most 100 per block: ceil(251/100) = 3 blocks of ceil(251/3) = 84 rows (84, 84, 83)
    s0 = layer_shapes(1001, (12, 8), (2, 3, 4), block_rows=100)[0]
    assert (s0.blocks, s0.block_rows) == (3, 84)
    assert row_blocks(251, 100) == [(0, 84), (84, 168), (168, 251)]
    assert row_blocks(251, None) == [(0, 251)] and row_blocks(251, 251) == [(0, 251)]
    # brute force: b = ceil(r / B) blocks of ceil(r / b) rows tile [0, r), none empty, none over B
    for rows in range(1, 200):
        for limit in range(1, rows + 3):
            blocks = row_blocks(rows, limit)
            assert len(blocks) == -(-rows // limit)
            assert blocks[0][0] == 0 and blocks[-1][1] == rows
            assert all(a[1] == b[0] for a, b in itertools.pairwise(blocks))
            sizes = [b - a for a, b in blocks]
            assert min(sizes) >= 1 and max(sizes) <= limit and max(sizes) == -(-rows // len(blocks))


def test_exact_division_variant():
    s0, s1 = layer_shapes(1001, (12, 8, 6), (2, 2, 2), nnz=5000, padded=False)
    assert (s0.r_d, s0.r_o, s0.c_i, s0.c_o, s0.w_rows, s0.feature_rows) == (500.5, 500.5, 6.0, 4.0, 3.0, 250.25)
    assert (s0.w_gathered_rows, s0.features_gathered_rows, s0.z) == (6.0, 500.5, 1250.0)
    assert (s1.c_i, s1.c_o) == (4.0, 3.0)
    s0 = layer_shapes(1001, (12, 8), (2, 2, 2), padded=False, block_rows=100)[0]
    assert (s0.blocks, s0.block_rows) == (6, 500.5 / 6)


def test_vectorized_equals_every_grid_one_at_a_time():
    widths = (13, 11, 11, 11, 5)
    for gpus in (1, 6, 8, 12, 30, 64):
        grids = enumerate_grids(gpus)
        for padded in (True, False):
            many = layer_shapes(1009, widths, grids, nnz=7777, padded=padded, block_rows=50)
            for k, grid in enumerate(grids):
                one = layer_shapes(1009, widths, tuple(grid), nnz=7777, padded=padded, block_rows=50)
                for a, b in zip(many, one):
                    for field in ("r_d", "r_o", "c_i", "c_o", "w_rows", "feature_rows", "w_gathered_rows",
                                  "features_gathered_rows", "z", "blocks", "block_rows"):
                        assert getattr(a, field)[k] == getattr(b, field), (grid, field)
                    # and the definitions, brute force: the smallest block size that covers n in g blocks
                    if padded:
                        g_o, g_n, g_d = (int(grid[ax]) for ax in (b.outer, b.inner, b.depth))
                        assert b.r_d == min(m for m in range(1, 1010) if m * g_d >= 1009)
                        assert b.c_i == min(m for m in range(1, 14) if m * g_n >= widths[b.layer])
                        assert b.w_rows == min(m for m in range(1, 14) if m * g_d >= b.c_i)
                        assert b.z == min(m for m in range(1, 7778) if m * g_d * g_o >= 7777)


def test_helpers():
    assert ceil_div(7, 2) == 4 and ceil_div(8, 2) == 4 and ceil_div(0, 3) == 0
    assert list(ceil_div(np.array([7, 8, 9]), 3)) == [3, 3, 3]
    assert padded_length(37, 8) == 40 and padded_length(40, 8) == 40
    assert INDEX_BYTES == 4
    assert csr_index_dtype(10, 5, 5) is np.int32
    assert csr_index_dtype(2**31 - 1, 5, 5) is np.int64 and csr_index_dtype(5, 2**31, 5) is np.int64
    assert list(csr_index_bytes(np.array([10, 2**31]), 5, 5)) == [4, 8]
    assert csr_bytes(10, 5, 4, 4) == 10 * 8 + 6 * 4 and csr_bytes(10, 5, 4, 4, matrices=3) == 10 * 8 + 8 * 4
    with pytest.raises(UserError):
        layer_shapes(10, (4, 4), [[2, 0, 1]])
    with pytest.raises(UserError):
        layer_shapes(10, (4,), (1, 1, 1))


# --------------------------------------------------------------------------- the trainer's tensors


def small_graph(nodes: int, seed: int) -> Graph:
    rng = np.random.default_rng(seed)
    src = rng.integers(0, nodes, 5 * nodes)
    dst = rng.integers(0, nodes, 5 * nodes)
    adj = sp.csr_matrix((np.ones(src.size, dtype=np.float32), (dst, src)), shape=(nodes, nodes))
    adj.sum_duplicates()
    adj.data[:] = 1.0
    features = rng.standard_normal((nodes, FEATURES)).astype(np.float32)
    labels = (np.arange(nodes) % CLASSES).astype(np.int64)
    return Graph(adjacency=adj, features=features, labels=labels, num_classes=CLASSES, name=f"g{nodes}")


class _Done:
    def wait(self):
        return None


class _ShapeDist:
    """torch.distributed for a rank alone: the group is its size; collectives keep shapes only."""

    class ReduceOp:
        SUM, MAX = "sum", "max"

    @staticmethod
    def all_reduce(tensor, op=None, group=None, async_op=False):
        return _Done() if async_op else None

    @staticmethod
    def all_gather_into_tensor(out, tensor, group=None):
        import torch

        assert out.shape[0] == group * tensor.shape[0] and out.shape[1:] == tensor.shape[1:]
        out.copy_(torch.cat([tensor] * group))

    @staticmethod
    def reduce_scatter_tensor(out, tensor, group=None):
        assert tensor.shape[0] == group * out.shape[0] and out.shape[1:] == tensor.shape[1:]
        out.copy_(tensor[: out.shape[0]])


def shape_comm(grid, rank, timer):
    """The trainer's GridComm (its buffer allocation and gather accounting) on :class:`_ShapeDist`."""
    from plexus_tune.trainer.comm import GridComm

    comm = GridComm.__new__(GridComm)
    comm.dist, comm.grid, comm.rank, comm.timer = _ShapeDist(), tuple(grid), rank, timer
    comm.coords = tuple(int(c) for c in coords_of(rank, grid))
    comm.groups = list(grid)  # the group of an axis: its size, for the stand-in
    comm.max_gathered_bytes, comm._created = 0, []
    return comm


def record_calls(shard, log):
    spmm, gemm = shard.spmm, shard.gemm

    def spmm_rec(a, dense, direction="fwd"):
        out = spmm(a, dense, direction)
        log.append(("spmm_" + direction, shard.layout.index, tuple(a.shape), tuple(dense.shape), tuple(out.shape)))
        return out

    def gemm_rec(x, y, bias=None):
        out = gemm(x, y, bias)
        log.append(("gemm", shard.layout.index, tuple(x.shape), tuple(y.shape), tuple(out.shape)))
        return out

    shard.spmm, shard.gemm = spmm_rec, gemm_rec


CONFIGS = ({"layers": 4, "permute": "double", "block_rows": None}, {"layers": 3, "permute": "none", "block_rows": 3})


@pytest.fixture(scope="module")
def datasets():
    from plexus_tune.trainer.data import MemoryData, prepare_graph

    out = {}
    for nodes in (37, 13):
        pg = prepare_graph(small_graph(nodes, seed=nodes))
        for permute in ("double", "none"):
            out[nodes, permute] = MemoryData(pg, permute, seed=1)
    return out


def build_rank(data, grid, rank, opts):
    import torch

    from plexus_tune.trainer import TrainConfig
    from plexus_tune.trainer.comm import PhaseTimer
    from plexus_tune.trainer.plexus3d import Plexus3dTrainer

    torch.set_num_threads(1)
    config = TrainConfig(grid=grid, hidden=HIDDEN, epochs=1, warmup=0, seed=3, **opts)
    trainer = Plexus3dTrainer(data, config, rank, int(np.prod(grid)), comm=shape_comm(grid, rank, PhaseTimer()))
    log = []
    for shard in trainer.shards:
        record_calls(shard, log)
    trainer.train(1)  # autograd rejects any gradient whose shape differs from its parameter's
    return trainer, log


def check_rank(trainer, log, shapes, opts):
    """Every tensor and operand of one rank against model/shapes.py."""
    from plexus_tune.trainer.tensors import csr_bytes as tensor_bytes

    for s, shard, w, b in zip(shapes, trainer.shards, trainer.params_w, trainer.params_b):
        i = s.layer
        assert tuple(shard.a_t.shape) == (s.r_o, s.r_d)
        if s.blocks > 1:
            assert shard.a is None and len(shard.a_blocks) == s.blocks
            rows = [blk.shape[0] for blk in shard.a_blocks]
            assert sum(rows) == s.r_d and rows[0] == s.block_rows and max(rows) == s.block_rows
            assert all(blk.shape[1] == s.r_o for blk in shard.a_blocks)
        else:
            assert tuple(shard.a.shape) == s.a_shape and shard.a_blocks == []
        assert tuple(w.shape) == s.w_shape and tuple(b.shape) == (s.c_o,)
        calls = [c for c in log if c[1] == i]
        fwd = [c for c in calls if c[0] == "spmm_fwd"]
        assert len(fwd) == s.blocks and all(c[3] == s.f_shape for c in fwd)  # F (layer 0: gathered, trimmed)
        assert sum(c[4][0] for c in fwd) == s.r_d and {c[4][1] for c in fwd} == {s.c_i}  # H
        gemms = [c for c in calls if c[0] == "gemm"]
        assert gemms[0][2:] == (s.h_shape, s.w_block_shape, s.q_shape)  # Q = H W
        assert gemms[1][2:] == ((s.c_i, s.r_d), s.q_shape, s.w_block_shape)  # dW = H^T dQ
        assert gemms[2][2:] == (s.q_shape, (s.c_o, s.c_i), s.h_shape)  # dH = dQ W^T
        bwd = [c for c in calls if c[0] == "spmm_bwd"]
        assert [c[2:] for c in bwd] == [((s.r_o, s.r_d), s.h_shape, s.f_shape)]  # dF = A^T dH
        for tensor in [shard.a_t] + ([shard.a] if shard.a is not None else list(shard.a_blocks)):
            want = np.int32 if INDEX_BYTES == 4 else np.int64
            assert tensor.crow_indices().numpy().dtype == want and tensor.col_indices().numpy().dtype == want
    assert tuple(trainer.features.shape) == shapes[0].features_shape
    assert tuple(trainer.loss_shard.labels.shape) == (shapes[-1].r_d,)

    # memory: tracked bytes = the memory model's terms, with the real nonzeros in the shards
    u = trainer.features.element_size()
    distinct = {}
    for s, shard in zip(shapes, trainer.shards):
        if id(shard.a_t) not in distinct:
            nnz = int(shard.a_t.values().numel())
            ib = csr_index_bytes(nnz, s.r_d, s.r_o)
            model = csr_bytes(nnz, s.r_d, u, ib, s.blocks) + csr_bytes(nnz, s.r_o, u, ib)
            stored = [shard.a_t] + ([shard.a] if shard.a is not None else list(shard.a_blocks))
            assert sum(tensor_bytes(t) for t in stored) == model
            distinct[id(shard.a_t)] = model
    assert len(distinct) == min(len(shapes), 6 if opts["permute"] != "none" else 3)
    # the dense terms below do not depend on nnz: the smallest valid one (a self-loop per node)
    work = Workload("w", nodes=trainer.layout.nodes, nnz=trainer.layout.nodes, widths=tuple(trainer.widths))
    parts = memory_breakdown(work, [trainer.layout.grid], block_rows=opts["block_rows"],
                             double_permutation=opts["permute"] != "none")
    dense = sum(float(parts[k][0]) for k in ("weights", "features", "activations", "gathered", "labels"))
    assert trainer.peak_tracked_bytes == sum(distinct.values()) + dense


@pytest.mark.parametrize("gpus", range(1, 9))
@pytest.mark.parametrize("nodes", [37, 13])
def test_trainer_tensors_have_the_model_shapes_on_every_grid(gpus, nodes, datasets):
    for opts in CONFIGS:
        data = datasets[nodes, opts["permute"]]
        widths = [FEATURES] + [HIDDEN] * (opts["layers"] - 1) + [CLASSES]
        for grid in enumerate_grids(gpus):
            grid = tuple(int(g) for g in grid)
            shapes = layer_shapes(nodes, widths, grid, nnz=data.nnz, block_rows=opts["block_rows"])
            layouts, shard_nnz = [], []
            for rank in range(gpus):
                trainer, log = build_rank(data, grid, rank, opts)
                check_rank(trainer, log, shapes, opts)
                layouts.append(trainer.layout)
                shard_nnz.append(trainer.shard_nnz)
            check_blocks_tile(layouts, widths, nodes)
            check_nonzero_estimate(layouts, shard_nnz, shapes, data.nnz)


def check_blocks_tile(layouts, widths, nodes):
    """Brute force: the real parts of the blocks cover every entry exactly once."""
    for i in range(len(widths) - 1):
        a = np.zeros((nodes, nodes), dtype=np.int64)
        w = np.zeros((widths[i], widths[i + 1]), dtype=np.int64)
        f = np.zeros((nodes, widths[0]), dtype=np.int64)
        out = np.zeros((nodes, widths[-1]), dtype=np.int64)
        seen = set()
        for lay in layouts:
            l_ = lay.layers[i]
            co, _, cd = l_.coords
            if (cd, co) not in seen:  # the A shard repeats along the inner axis
                seen.add((cd, co))
                a[l_.a_rows.start:l_.a_rows.stop, l_.a_cols.start:l_.a_cols.stop] += 1
            w[l_.w_rows.start:l_.w_rows.stop, l_.out_cols.start:l_.out_cols.stop] += 1
            first, last = lay.layers[0], lay.layers[-1]
            f[first.f_rows.start:first.f_rows.stop, first.in_cols.start:first.in_cols.stop] += 1
            if last.coords[1] == 0:  # the output rank of each block (inner coordinate 0)
                out[last.a_rows.start:last.a_rows.stop, last.out_cols.start:last.out_cols.stop] += 1
            for blk in (l_.a_rows, l_.a_cols, l_.in_cols, l_.out_cols, l_.w_rows, l_.f_rows):
                assert 0 <= blk.start <= blk.stop and blk.stop - blk.start <= blk.size
        assert (a == 1).all() and (w == 1).all() and (f == 1).all() and (out == 1).all(), i


def check_nonzero_estimate(layouts, shard_nnz, shapes, nnz):
    """z = ceil(NNZ / (g_d g_o)): the mean nonzeros of the g_d g_o distinct shards, rounded up."""
    for s in shapes:
        by_shard = {}
        for lay, counts in zip(layouts, shard_nnz):
            co, _, cd = lay.layers[s.layer].coords
            by_shard.setdefault((cd, co), set()).add(counts[s.layer])
        assert all(len(v) == 1 for v in by_shard.values())  # the same shard along the inner axis
        assert len(by_shard) == s.g_d * s.g_o
        total = sum(next(iter(v)) for v in by_shard.values())
        assert total == nnz  # the shards partition the nonzeros
        assert s.z == -(-total // len(by_shard)) and total / len(by_shard) <= s.z < total / len(by_shard) + 1


def test_every_grid_shape_sweep_covers_padding_cases():
    """The sweep above meets W and feature pieces that do not divide, and blocks wholly padding."""
    cases = set()
    for gpus, nodes in itertools.product(range(1, 9), (37, 13)):
        for grid in enumerate_grids(gpus):
            for s in layer_shapes(nodes, [FEATURES, HIDDEN, HIDDEN, HIDDEN, CLASSES], tuple(grid)):
                if s.g_d > 1 and s.c_i % s.g_d:
                    cases.add("w piece padded")
                if s.layer == 0 and s.g_d > 1 and s.r_o % s.g_d:
                    cases.add("feature piece padded")
                if (s.g_d - 1) * s.r_d >= nodes:
                    cases.add("row block all padding")
                if (s.g_o - 1) * s.c_o >= CLASSES and s.layer == 3:
                    cases.add("class block all padding")
    assert cases == {"w piece padded", "feature piece padded", "row block all padding", "class block all padding"}
