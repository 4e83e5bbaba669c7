"""The partitioned GCN trainer (SuperGCN's scheme) on torch.distributed.

The graph's nodes are split into G parts (:func:`plexus_tune.graph.partition.partition_graph`);
rank p owns part p's rows of A_hat, of the features and of every activation, and W, b
are replicated. A cut edge u -> v (u in part q, v in part p, A_hat[v, u] != 0) is either
*post*-aggregated (q sends the row H_u, p adds A_hat[v, u] H_u after receiving it) or
*pre*-aggregated (q sends the partial sum sum_u A_hat[v, u] H_u over its u, p adds it).
:class:`plexus_tune.graph.partition.ExchangePlan` classifies the cut edges of each
ordered pair of parts: all post, all pre, or hybrid (sources in a minimum vertex cover
of the pair's bipartite cut graph post, the rest pre).

Layer l on rank p: T_p = A_pp H_p + sum_q B_qp M_qp, where M_qp = [H_q[post rows];
P_qp H_q] is the message q sent to p (point-to-point) and B_qp scatters it into p's rows
with A_hat's weights (1 for a partial sum); Z_p = T_p W + b. Backward: dW, db all-reduced
over all ranks in one buffer; dT = dZ W^T; p returns B_qp^T dT_p to q (the same rows as
the forward message, the other way), and q adds it to dH through its post rows and P_qp^T.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch

from plexus_tune.graph.partition import check_aggregation, partition_exchange
from plexus_tune.trainer.tensors import csr_bytes, torch_csr
from plexus_tune.trainer.exchange import ExchangeComm
from plexus_tune.trainer.family import FamilyShard, FamilyTrainer, dense_backward, dense_forward
from plexus_tune.trainer.layout import Block

AXIS = 0


class PartitionedLayer(torch.autograd.Function):
    """Z_p = (A_pp H_p + sum_q B_qp M_qp) W + b (module docstring)."""

    @staticmethod
    def forward(ctx, h, w, b, shard):
        comm, plan = shard.comm, shard.plan
        t = shard.spmm(plan.local, h)
        messages = {}
        for peer, (post_idx, pre) in plan.sends.items():
            t0 = shard.timer.now()
            raw = h[post_idx]
            shard.timer.add(t0, "spmm_ms", f"spmm_fwd_{shard.index}_ms")  # the row gather of the aggregation
            messages[peer] = torch.cat([raw, shard.spmm(pre, h)]) if pre is not None else raw
        shapes = {peer: (rows, h.shape[1]) for peer, (rows, _) in plan.receives.items()}
        received = comm.exchange(messages, shapes, comm_class="aggregation", axis=AXIS)
        for peer, (_, scatter) in plan.receives.items():
            t.add_(shard.spmm(scatter, received[peer].contiguous()))
        return dense_forward(ctx, shard, t, w, b)

    @staticmethod
    def backward(ctx, dz):
        shard = ctx.shard
        comm, plan = shard.comm, shard.plan
        dw, db, dt = dense_backward(ctx, dz, (AXIS,))
        if dt is None:  # fixed features: layer 0 stops after dW and db
            return None, dw, db, None
        dh = shard.spmm(plan.local_t, dt, "bwd")
        replies = {peer: shard.spmm(scatter_t, dt, "bwd") for peer, scatter_t in plan.receives_t.items()}
        shapes = {peer: (int(post_idx.numel()) + (pre_t.shape[1] if pre_t is not None else 0), dt.shape[1])
                  for peer, (post_idx, pre_t) in plan.sends_t.items()}
        returned = comm.exchange(replies, shapes, comm_class="aggregation", axis=AXIS)
        for peer, (post_idx, pre_t) in plan.sends_t.items():
            back = returned[peer]
            n_post = int(post_idx.numel())
            t0 = shard.timer.now()
            dh.index_add_(0, post_idx, back[:n_post])
            shard.timer.add(t0, "spmm_ms", f"spmm_bwd_{shard.index}_ms")
            if pre_t is not None:
                dh.add_(shard.spmm(pre_t, back[n_post:].contiguous(), "bwd"))
        return dh, dw, db, None


class RankPlan:
    """Rank p's matrices of the exchange: local block, messages to send and to receive.

    ``sends[peer] = (post_idx, P)``: local rows sent as they are and the (pre rows x
    n_p) pre-aggregation matrix (None without pre rows); ``receives[peer] = (rows, B)``:
    the message's row count and its (n_p x rows) scatter matrix. ``*_t``: the
    transposes the backward uses. A message holds the raw rows (sources in node order)
    then the partial sums (destinations in node order).
    """

    def __init__(self, adjacency: sp.csr_matrix, plan, mode: str, part: int, dtype, device):
        membership = plan.part
        order = np.argsort(membership, kind="stable")
        mine = order[membership[order] == part]
        self.nodes = mine
        local_index = np.full(adjacency.shape[0], -1, dtype=np.int64)
        local_index[mine] = np.arange(mine.size)
        n_p = mine.size
        local = sp.csr_matrix(adjacency[mine][:, mine])
        self.nnz = int(local.nnz)
        self.local = torch_csr(local, dtype, device)
        self.local_t = torch_csr(local.T.tocsr(), dtype, device)
        self.bytes = csr_bytes(self.local) + csr_bytes(self.local_t)
        self.sends, self.sends_t, self.receives, self.receives_t = {}, {}, {}, {}
        post_edge = {"post": np.ones(plan.src.size, dtype=bool), "pre": np.zeros(plan.src.size, dtype=bool),
                     "hybrid": plan.post_edge}[mode]
        weight = np.asarray(adjacency[plan.dst, plan.src]).ravel() if plan.src.size else np.zeros(0)
        src_part, dst_part = membership[plan.src], membership[plan.dst]
        for peer in range(plan.parts):
            if peer == part:
                continue
            for sender, receiver in ((part, peer), (peer, part)):
                pair = (src_part == sender) & (dst_part == receiver)
                post, pre = pair & post_edge, pair & ~post_edge
                post_rows = np.unique(plan.src[post])
                pre_rows = np.unique(plan.dst[pre])
                n_post, n_pre = post_rows.size, pre_rows.size
                if sender == part:
                    post_idx = torch.as_tensor(local_index[post_rows], dtype=torch.int64, device=device)
                    pre_mat = pre_t = None
                    if n_pre:
                        rows = np.searchsorted(pre_rows, plan.dst[pre])
                        mat = sp.csr_matrix((weight[pre], (rows, local_index[plan.src[pre]])), shape=(n_pre, n_p))
                        pre_mat, pre_t = torch_csr(mat, dtype, device), torch_csr(mat.T.tocsr(), dtype, device)
                        self.nnz += int(mat.nnz)
                        self.bytes += csr_bytes(pre_mat) + csr_bytes(pre_t)
                    if n_post or n_pre:
                        self.sends[peer] = (post_idx, pre_mat)
                        self.sends_t[peer] = (post_idx, pre_t)
                elif n_post or n_pre:
                    rows = np.concatenate([local_index[plan.dst[post]], local_index[pre_rows]])
                    cols = np.concatenate([np.searchsorted(post_rows, plan.src[post]), n_post + np.arange(n_pre)])
                    vals = np.concatenate([weight[post], np.ones(n_pre)])
                    mat = sp.csr_matrix((vals, (rows, cols)), shape=(n_p, n_post + n_pre))
                    self.receives[peer] = (n_post + n_pre, torch_csr(mat, dtype, device))
                    self.receives_t[peer] = torch_csr(mat.T.tocsr(), dtype, device)
                    self.nnz += int(mat.nnz)
                    self.bytes += csr_bytes(self.receives[peer][1]) + csr_bytes(self.receives_t[peer])


class PartitionedTrainer(FamilyTrainer):
    """One rank of the partitioned algorithm (``config.aggregation``: pre, post or hybrid)."""

    def __init__(self, data, config, rank: int, world_size: int, device="cpu", comm=None, split=None):
        self._setup(data, config, rank, device)
        adjacency = data.pg.adjacency
        plan = partition_exchange(adjacency, world_size, seed=config.seed)
        membership = plan.part
        self.comm = comm or ExchangeComm((world_size, 1, 1), rank, self.timer, precision=config.comm_precision,
                                         seed=config.seed, dtype=self.dtype, device=self.device)
        rank_plan = RankPlan(adjacency, plan, check_aggregation(config.aggregation or "hybrid"), rank, self.dtype,
                             self.device)
        self.persistent_bytes += rank_plan.bytes
        params_w, params_b = [], []
        for layer, w in enumerate(self.weights):
            shard = FamilyShard(layer, self.comm, self.timer)
            shard.plan = rank_plan
            self.shards.append(shard)
            self.shard_nnz.append(rank_plan.nnz)
            params_w.append(torch.nn.Parameter(self._tensor(w)))
            params_b.append(torch.nn.Parameter(torch.zeros(w.shape[1], dtype=self.dtype, device=self.device)))
        self.params_w, self.params_b = params_w, params_b
        self.features = self.input_features(data.pg.features[rank_plan.nodes])
        self.owns_output = True
        order = np.argsort(membership, kind="stable")
        start = int((membership < rank).sum())
        n_p = int(rank_plan.nodes.size)
        classes = self.widths[-1]
        self._finish(data, [self.features] + params_w + params_b, out_perm=order,
                     rows=Block(start, start + n_p, n_p), cols=Block(0, classes, classes), split=split,
                     class_axis=1, row_axis=AXIS, padded_nodes=data.nodes, padded_widths=self.widths)

    def forward(self):
        x = self.features
        for layer, shard in enumerate(self.shards):
            x = PartitionedLayer.apply(x, self.params_w[layer], self.params_b[layer], shard)
            if layer < len(self.shards) - 1:
                x = torch.relu(x)
        return x
