"""CAGNET's 1.5D block-row (1D as c = 1) and 2D (SUMMA) GCN trainers on torch.distributed.

Both compute layer l as T = A_hat H (SpMM), Z = T W + b (GEMM), ReLU between layers, with
trained input features (with fixed features, layer 0's backward stops after dW and db:
no dT, no dH, none of their collectives); docs/algorithms.md gives the layouts, and the bytes each rank
sends per class that :mod:`plexus_tune.model.volumes` predicts.

1.5D, G = R c ranks, rank (i, j) = i c + j: block row i (b = ceil(N / R) rows, zero
padded) of A_hat, A_hat^T, H and the logits is replicated on the c ranks of process row
i; W and b are replicated everywhere. Process column j (R ranks, x axis) owns the stages
k in [floor(j R / c), floor((j + 1) R / c)): forward, rank (k, j) broadcasts H_k over the
column and every rank adds A_ik H_k; the partial sums are all-reduced over the process
row (c ranks, y axis). Backward: dW, db reduced over the column in one buffer;
dT = dZ W^T; dH by the same stages with A_hat^T and dT.

2D, Pr x Pc ranks, rank (i, j) = i Pc + j, q = lcm(Pr, Pc), N' = q ceil(N / q): rank
(i, j) holds rows block i (N'/Pr) and columns block j (N'/Pc) of A_hat and of A_hat^T,
and the columns block j (d_l = ceil(D_l / Pc), zero padded) of H's rows block i, W's
columns and b. Forward, stage s of q (N'/q inner indices): the owner of A_hat's piece s
in process row i broadcasts it over the row (y axis, as CSR, the ``adjacency`` class),
the owner of H's piece s in process column j broadcasts it over the column (x axis);
then T's blocks are all-gathered over the row and Z_ij = T_i W_j + b_j. Backward:
dW_j, db_j reduced over the column; dT = dZ_ij W_j^T reduce-scattered over the row;
dH by SUMMA with A_hat^T. The loss is sharded over class columns (as the 3D trainer's).
"""

from __future__ import annotations

import numpy as np
import torch

from plexus_tune.model.shapes import ceil_div, csr_index_dtype
from plexus_tune.model.volumes import stage_chunks, summa_sizes
from plexus_tune.trainer.tensors import csr_bytes, take_block, take_dense, torch_csr
from plexus_tune.trainer.exchange import ExchangeComm
from plexus_tune.trainer.family import FamilyShard, FamilyTrainer, dense_backward, dense_forward
from plexus_tune.trainer.layout import Block, block

X_AXIS, Y_AXIS, Z_AXIS = 0, 1, 2


# ------------------------------------------------------------------------------ 1.5D
class Cagnet15dLayer(torch.autograd.Function):
    """Z = (A_hat H) W + b on a 1.5D grid (module docstring)."""

    @staticmethod
    def forward(ctx, h, w, b, shard):
        comm = shard.comm
        t = torch.zeros_like(h)
        for k, a_ik, _ in shard.pieces:
            h_k = comm.broadcast(h if k == shard.i else None, h.shape, X_AXIS, k)
            t.add_(shard.spmm(a_ik, h_k))
        comm.all_reduce(t, Y_AXIS, comm_class="aggregation")
        return dense_forward(ctx, shard, t, w, b)

    @staticmethod
    def backward(ctx, dz):
        shard = ctx.shard
        comm = shard.comm
        dw, db, dt = dense_backward(ctx, dz, (X_AXIS,))
        if dt is None:  # fixed features (module docstring)
            return None, dw, db, None
        dh = torch.zeros_like(dt)
        for k, _, at_ik in shard.pieces:
            dt_k = comm.broadcast(dt if k == shard.i else None, dt.shape, X_AXIS, k)
            dh.add_(shard.spmm(at_ik, dt_k, "bwd"))
        comm.all_reduce(dh, Y_AXIS, comm_class="aggregation")
        return dh, dw, db, None


class Cagnet15dTrainer(FamilyTrainer):
    """One rank of CAGNET's 1.5D algorithm on the (R, c, 1) grid ``config.grid`` (c = 1 is 1D)."""

    def __init__(self, data, config, rank: int, world_size: int, device="cpu", comm=None, split=None):
        self._setup(data, config, rank, device)
        r, c = int(config.grid[0]), int(config.grid[1])
        if r * c != world_size or c * c > world_size:
            raise ValueError(f"1.5D grid {r}x{c} needs R c = G and c c <= G, G = {world_size}")
        self.i, self.j = divmod(rank, c)
        n = data.nodes
        b = ceil_div(n, r)
        self.comm = comm or ExchangeComm((r, c, 1), rank, self.timer, precision=config.comm_precision,
                                         seed=config.seed, dtype=self.dtype, device=self.device)
        adj = data.pg.adjacency
        adj_t = adj.T.tocsr()
        rows = block(self.i, b, n)
        pieces, nnz = [], 0
        for k in stage_chunks(r, c)[self.j]:
            cols = block(k, b, n)
            a_ik = take_block(adj, rows, cols)
            at_ik = take_block(adj_t, rows, cols)
            nnz += int(a_ik.nnz)
            pieces.append((k, torch_csr(a_ik, self.dtype, self.device), torch_csr(at_ik, self.dtype, self.device)))
            self.persistent_bytes += csr_bytes(pieces[-1][1]) + csr_bytes(pieces[-1][2])
        params_w, params_b = [], []
        for layer, w in enumerate(self.weights):
            shard = FamilyShard(layer, self.comm, self.timer)
            shard.i, shard.pieces = self.i, pieces
            self.shards.append(shard)
            self.shard_nnz.append(nnz)
            params_w.append(torch.nn.Parameter(self._tensor(w)))
            params_b.append(torch.nn.Parameter(torch.zeros(w.shape[1], dtype=self.dtype, device=self.device)))
        self.params_w, self.params_b = params_w, params_b
        d0 = self.widths[0]
        self.features = self.input_features(take_dense(data.pg.features, rows, Block(0, d0, d0)))
        self.owns_output = self.j == 0
        classes = self.widths[-1]
        self._finish(data, [self.features] + self.params_w + self.params_b, out_perm=np.arange(n), rows=rows,
                     cols=Block(0, classes, classes), split=split, class_axis=Z_AXIS, row_axis=X_AXIS,
                     padded_nodes=r * b, padded_widths=self.widths)

    def forward(self):
        x = self.features
        for layer, shard in enumerate(self.shards):
            x = Cagnet15dLayer.apply(x, self.params_w[layer], self.params_b[layer], shard)
            if layer < len(self.shards) - 1:
                x = torch.relu(x)
        return x


# ------------------------------------------------------------------------------ 2D
def combine_forward(ctx, shard, t, w, b):
    """Z = T_row W + b on a SUMMA grid: T's column blocks all-gathered along Y into the row
    block T_row, which is saved with W for :func:`combine_backward` (docs/algorithms.md)."""
    comm = shard.comm
    pc = comm.grid[Y_AXIS]
    rows, d = t.shape
    if pc > 1:
        t = comm.all_gather(t, Y_AXIS, comm_class="combination").view(pc, rows, d).permute(1, 0, 2)
    return dense_forward(ctx, shard, t.reshape(rows, pc * d)[:, : shard.width_in].contiguous(), w, b)


def combine_backward(ctx, dz, reduce_axes):
    """(dW, db, dT) of :func:`combine_forward`: dW and db summed over ``reduce_axes``, dT = dZ W^T
    reduce-scattered back to T's column block along Y; dT is None for fixed features."""
    comm = ctx.shard.comm
    dw, db, dt = dense_backward(ctx, dz, reduce_axes)
    if dt is None:  # fixed features: layer 0 stops after dW and db (module docstring)
        return dw, db, None
    pc = comm.grid[Y_AXIS]
    rows, d = dt.shape[0], ctx.shard.block_in
    if pc > 1:
        padded = torch.nn.functional.pad(dt, (0, pc * d - dt.shape[1]))
        stacked = padded.view(rows, pc, d).permute(1, 0, 2).reshape(pc * rows, d)
        dt = comm.reduce_scatter(stacked, Y_AXIS, comm_class="combination")
    return dw, db, dt


class Cagnet2dLayer(torch.autograd.Function):
    """Z_ij = (A_hat H)_i W_j + b_j on a Pr x Pc grid (module docstring)."""

    @staticmethod
    def forward(ctx, h, w, b, shard):
        return combine_forward(ctx, shard, summa(shard, h, shard.a_pieces, "fwd"), w, b)

    @staticmethod
    def backward(ctx, dz):
        dw, db, dt = combine_backward(ctx, dz, (X_AXIS,))
        if dt is None:
            return None, dw, db, None
        return summa(ctx.shard, dt.contiguous(), ctx.shard.at_pieces, "bwd"), dw, db, None


def summa(shard, dense, pieces, direction: str):
    """sum_s P_is D_sj over the q stages: ``pieces[s]`` is this rank's piece s (CSR, or None
    if another rank of the process row owns it), ``dense`` this rank's rows block (N'/Pr x d)."""
    comm = shard.comm
    out = torch.zeros_like(dense)
    per_col, per_row, piece_rows = shard.pieces_per_col, shard.pieces_per_row, shard.piece_rows
    for s in range(shard.stages):
        owner_j = s // per_col
        a_is = comm.broadcast_csr(pieces.get(s), shard.row_block, piece_rows, shard.piece_nnz[direction][s],
                                  Y_AXIS, owner_j, shard.index_dtype)
        owner_i = s // per_row
        if owner_i == shard.i:
            lo = (s % per_row) * piece_rows
            mine = dense[lo: lo + piece_rows]
        else:
            mine = None
        d_sj = comm.broadcast(mine, (piece_rows, dense.shape[1]), X_AXIS, owner_i)
        out.add_(shard.spmm(a_is, d_sj.contiguous(), direction))
    return out


def summa_layers(trainer: FamilyTrainer, pc: int, local_nnz: int, **layout) -> list[int]:
    """One :class:`FamilyShard` per layer carrying the SUMMA ``layout`` (stages, pieces, rank
    coordinates) and the layer's W_j, b_j: the trainer's columns block j of every layer's
    output, ceil(D / Pc) wide. Returns those block widths, layer 0's input first."""
    widths = trainer.widths
    blocks = [ceil_div(w, pc) for w in widths]
    params_w, params_b = [], []
    for layer, w in enumerate(trainer.weights):
        shard = FamilyShard(layer, trainer.comm, trainer.timer)
        for name, value in layout.items():
            setattr(shard, name, value)
        shard.width_in, shard.block_in = widths[layer], blocks[layer]
        trainer.shards.append(shard)
        trainer.shard_nnz.append(local_nnz)
        out_cols = block(trainer.j, blocks[layer + 1], widths[layer + 1])
        w_local = take_dense(w, Block(0, widths[layer], widths[layer]), out_cols)
        params_w.append(torch.nn.Parameter(trainer._tensor(w_local)))
        params_b.append(torch.nn.Parameter(torch.zeros(out_cols.size, dtype=trainer.dtype, device=trainer.device)))
    trainer.params_w, trainer.params_b = params_w, params_b
    return blocks


class Cagnet2dTrainer(FamilyTrainer):
    """One rank of CAGNET's 2D (SUMMA) algorithm on a Pr x Pc grid (``config.grid[:2]``)."""

    def __init__(self, data, config, rank: int, world_size: int, device="cpu", comm=None, split=None):
        self._setup(data, config, rank, device)
        pr, pc = int(config.grid[0]), int(config.grid[1])
        if pr * pc != world_size:
            raise ValueError(f"2D grid {pr}x{pc} needs {pr * pc} ranks, world size is {world_size}")
        self.i, self.j = divmod(rank, pc)
        n = data.nodes
        sizes = summa_sizes(n, pr, pc)
        q, n_pad, piece, row_block = sizes["q"], sizes["n_pad"], sizes["piece"], sizes["rb"]
        self.comm = comm or ExchangeComm((pr, pc, 1), rank, self.timer, precision=config.comm_precision,
                                         seed=config.seed, dtype=self.dtype, device=self.device)
        adj = data.pg.adjacency
        adj_t = adj.T.tocsr()
        rows = block(self.i, row_block, n)
        per_col, per_row = q // pc, q // pr
        piece_nnz = {"fwd": [], "bwd": []}
        a_pieces, at_pieces = {}, {}
        for s in range(q):
            cols = block(s, piece, n)
            for direction, matrix, store in (("fwd", adj, a_pieces), ("bwd", adj_t, at_pieces)):
                part = take_block(matrix, rows, cols)
                piece_nnz[direction].append(int(part.nnz))
                if s // per_col == self.j:
                    store[s] = torch_csr(part, self.dtype, self.device)
                    self.persistent_bytes += csr_bytes(store[s])
        # every piece travels with the index type its owner stores it in (int32 while N' and nnz fit)
        nnz_max = max(piece_nnz["fwd"] + piece_nnz["bwd"] + [0])
        index_dtype = torch.int32 if csr_index_dtype(nnz_max, row_block, piece) == np.int32 else torch.int64
        local_nnz = sum(piece_nnz["fwd"][s] for s in a_pieces)
        blocks = summa_layers(self, pc, local_nnz, i=self.i, j=self.j, stages=q, pieces_per_col=per_col,
                              pieces_per_row=per_row, piece_rows=piece, row_block=row_block, index_dtype=index_dtype,
                              piece_nnz=piece_nnz, a_pieces=a_pieces, at_pieces=at_pieces)
        widths = self.widths
        in_cols = block(self.j, blocks[0], widths[0])
        self.features = self.input_features(take_dense(data.pg.features, rows, in_cols))
        self.owns_output = True
        self._finish(data, [self.features] + self.params_w + self.params_b, out_perm=np.arange(n), rows=rows,
                     cols=block(self.j, blocks[-1], widths[-1]), split=split, class_axis=Y_AXIS, row_axis=X_AXIS,
                     padded_nodes=n_pad, padded_widths=[pc * d for d in blocks])

    def forward(self):
        x = self.features
        for layer, shard in enumerate(self.shards):
            x = Cagnet2dLayer.apply(x, self.params_w[layer], self.params_b[layer], shard)
            if layer < len(self.shards) - 1:
                x = torch.relu(x)
        return x
