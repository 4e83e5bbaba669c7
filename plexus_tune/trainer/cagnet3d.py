"""CAGNET's split-3D GCN trainer (Split-3D-SpMM) on a Pr x Pc x Pl grid, Pl >= 2.

Sizes (:func:`plexus_tune.model.volumes.summa_sizes`): q = lcm(Pr, Pc),
N' = Pl q ceil(N / (Pl q)), rb = N'/Pr, rf = rb/Pl, slab N'/Pl = q pieces of p = N'/(Pl q)
rows; d_l = ceil(D_l / Pc). Rank (i, j, k) = k Pr Pc + i Pc + j holds the output rows
[i rb + k rf, +rf) of every layer (columns block j), which are the inner positions
[k N'/Pl + i rf, +rf) of the next layer's SpMM: the adjacency is multiplied as
M = A_hat[:, order] in the split-3D column order
(:func:`plexus_tune.graph.partition.split3d_positions`), and rank (i, j, k) owns the
pieces M[block i, piece s of slab k] for s in [j q/Pc, (j+1) q/Pc).

Forward of a layer, in mesh layer k (the 2D SUMMA on slab k), stage s of q: the owner
of H's piece s in process column j broadcasts it down the column (x axis,
``aggregation``), the owner of M's piece broadcasts it along the row (y axis,
``adjacency``); every rank adds M_is H_s to its rb x d_l partial sum. The partial sums
are reduce-scattered over the fibre (z axis, ``aggregation``: rank k keeps chunk k),
T's blocks all-gathered over the row (``combination``), Z_ij = T_i W_j + b_j.
Backward, the transpose: dW_j, db_j all-reduced over the column and over the fibre
(``gather``); dT = dZ W_j^T reduce-scattered over the row (``combination``),
all-gathered over the fibre (``aggregation``); the same M pieces broadcast along the
row, now as their transposes M_is^T (stored once by their owners in CSR, a piece-rows x
rb matrix: a CSR SpMM, where multiplying by the transpose view of a CSR piece costs
about ten times as much on CPU), each rank's M_is^T dT_i of its slab's q pieces
reduce-scattered over the column (``aggregation``), which leaves rank (i, j, k) the gradient of its own inner
positions. The bytes per class are :func:`plexus_tune.model.volumes.cagnet_summa_schedule`'s
(docs/algorithms.md).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from plexus_tune.graph.partition import split3d_positions
from plexus_tune.model.shapes import csr_index_dtype
from plexus_tune.model.volumes import summa_sizes
from plexus_tune.trainer.cagnet import combine_backward, combine_forward, summa_layers
from plexus_tune.trainer.exchange import ExchangeComm
from plexus_tune.trainer.family import FamilyTrainer
from plexus_tune.trainer.layout import block
from plexus_tune.trainer.tensors import csr_bytes, take_block, take_dense, torch_csr

X_AXIS, Y_AXIS, Z_AXIS = 0, 1, 2


def _pieces(shard, transposed: bool = False):
    """This rank's M piece of every stage of its slab (``transposed``: M_is^T), broadcast along the
    row by its owner."""
    comm = shard.comm
    own = shard.own_t if transposed else shard.own
    rows, cols = (shard.piece_rows, shard.row_block) if transposed else (shard.row_block, shard.piece_rows)
    for s in range(shard.stages):
        yield s, comm.broadcast_csr(own.get(s), rows, cols, shard.piece_nnz[s], Y_AXIS, s // shard.pieces_per_col,
                                    shard.index_dtype)


class Cagnet3dLayer(torch.autograd.Function):
    """Z_ij = (M H)_(ik) W_j + b_j on a Pr x Pc x Pl grid (module docstring)."""

    @staticmethod
    def forward(ctx, h, w, b, shard):
        comm = shard.comm
        per_row, piece_rows = shard.pieces_per_row, shard.piece_rows
        partial = torch.zeros((shard.row_block, h.shape[1]), dtype=h.dtype, device=h.device)
        for s, a_is in _pieces(shard):
            owner_i = s // per_row
            mine = h[(s % per_row) * piece_rows:(s % per_row + 1) * piece_rows] if owner_i == shard.i else None
            h_s = comm.broadcast(mine, (piece_rows, h.shape[1]), X_AXIS, owner_i)
            partial.add_(shard.spmm(a_is, h_s.contiguous()))
        t = comm.reduce_scatter(partial, Z_AXIS, comm_class="aggregation")
        return combine_forward(ctx, shard, t, w, b)

    @staticmethod
    def backward(ctx, dz):
        shard = ctx.shard
        comm = shard.comm
        dw, db, dt = combine_backward(ctx, dz, (X_AXIS, Z_AXIS))
        if dt is None:  # fixed features: layer 0 stops after dW and db
            return None, dw, db, None
        d = shard.block_in
        dt_block = comm.all_gather(dt.contiguous(), Z_AXIS, comm_class="aggregation")  # rb x d_l, block i
        piece_rows = shard.piece_rows
        partial = torch.empty((shard.stages * piece_rows, d), dtype=dt.dtype, device=dt.device)
        for s, at_is in _pieces(shard, transposed=True):
            partial[s * piece_rows:(s + 1) * piece_rows] = shard.spmm(at_is, dt_block, "bwd")
        dh = comm.reduce_scatter(partial, X_AXIS, comm_class="aggregation")
        return dh, dw, db, None


class Cagnet3dTrainer(FamilyTrainer):
    """One rank of CAGNET's split-3D algorithm on the Pr x Pc x Pl grid ``config.grid``."""

    def __init__(self, data, config, rank: int, world_size: int, device="cpu", comm=None, split=None):
        self._setup(data, config, rank, device)
        pr, pc, pl = (int(g) for g in config.grid)
        if pr * pc * pl != world_size:
            raise ValueError(f"3D grid {pr}x{pc}x{pl} needs {pr * pc * pl} ranks, world size is {world_size}")
        self.k, rest = divmod(rank, pr * pc)
        self.i, self.j = divmod(rest, pc)
        n = data.nodes
        sizes = summa_sizes(n, pr, pc, pl)
        q, n_pad, piece, row_block, rf = sizes["q"], sizes["n_pad"], sizes["piece"], sizes["rb"], sizes["rf"]
        self.comm = comm or ExchangeComm((pr, pc, pl), rank, self.timer, precision=config.comm_precision,
                                         seed=config.seed, dtype=self.dtype, device=self.device)
        # M = A_hat (padded to N' x N') with its columns in the split-3D order
        adj = sp.csr_matrix(data.pg.adjacency)
        adj.resize((n_pad, n_pad))
        order = np.argsort(split3d_positions(n_pad, pr, pl))  # the node at each inner position
        matrix = adj[:, order].tocsr()
        rows = block(self.i, row_block, n)
        per_col, per_row = q // pc, q // pr
        slab = self.k * q
        piece_nnz, own, own_t = [], {}, {}
        for s in range(q):
            part = take_block(matrix, rows, block(slab + s, piece, n_pad))
            piece_nnz.append(int(part.nnz))
            if s // per_col == self.j:
                own[s] = torch_csr(part, self.dtype, self.device)
                own_t[s] = torch_csr(part.T.tocsr(), self.dtype, self.device)
                self.persistent_bytes += csr_bytes(own[s]) + csr_bytes(own_t[s])
        # every piece travels with the index type its owner stores it in (int32 while it fits)
        nnz_max = max(piece_nnz + [0])
        index_dtype = torch.int32 if csr_index_dtype(nnz_max, row_block, piece) == np.int32 else torch.int64
        local_nnz = sum(piece_nnz[s] for s in own)
        blocks = summa_layers(self, pc, local_nnz, i=self.i, j=self.j, k=self.k, stages=q, pieces_per_col=per_col,
                              pieces_per_row=per_row, piece_rows=piece, row_block=row_block, index_dtype=index_dtype,
                              piece_nnz=piece_nnz, own=own, own_t=own_t)
        widths = self.widths
        # output rows of every layer (and input rows of the first): [i rb + k rf, +rf)
        mine = block(self.k, rf, n, offset=self.i * row_block)
        in_cols = block(self.j, blocks[0], widths[0])
        self.features = self.input_features(take_dense(data.pg.features, mine, in_cols))
        self.owns_output = True
        self._finish(data, [self.features] + self.params_w + self.params_b, out_perm=np.arange(n), rows=mine,
                     cols=block(self.j, blocks[-1], widths[-1]), split=split, class_axis=Y_AXIS,
                     row_axis=(X_AXIS, Z_AXIS), padded_nodes=n_pad, padded_widths=[pc * d for d in blocks])

    def forward(self):
        x = self.features
        for layer, shard in enumerate(self.shards):
            x = Cagnet3dLayer.apply(x, self.params_w[layer], self.params_b[layer], shard)
            if layer < len(self.shards) - 1:
                x = torch.relu(x)
        return x
