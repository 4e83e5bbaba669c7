"""What the trainers of every algorithm family share beyond the training loop.

A family trainer (:mod:`plexus_tune.trainer.cagnet`, :mod:`plexus_tune.trainer.partitioned`)
is a :class:`plexus_tune.trainer.loop.RankTrainer` whose constructor lays out the
graph its own way and whose ``forward`` runs its own layer; the epoch loop, the
sharded loss and accuracy (:mod:`plexus_tune.trainer.loss`), the timers, the byte
counter and the memory accounting are shared with the 3D trainer. Each family places the rows of its logits in some order
(``out_perm``: row k of that order is original node ``out_perm[k]``) and returns its
output block in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from plexus_tune.graph.splits import TRAIN, random_split
from plexus_tune.model.workload import model_widths
from plexus_tune.trainer.comm import PhaseTimer
from plexus_tune.trainer.loop import RankTrainer
from plexus_tune.trainer.loss import LossShard
from plexus_tune.trainer.tensors import glorot_weights
from plexus_tune.trainer.layout import Block


@dataclass
class FamilyShard:
    """One rank's view of one layer: its index, the collectives and the timed kernels."""

    index: int
    comm: object
    timer: PhaseTimer
    saved_bytes: list = field(default_factory=list)

    def spmm(self, a, dense, direction: str = "fwd"):
        t0 = self.timer.now()
        out = torch.sparse.mm(a, dense)
        self.timer.add(t0, "spmm_ms", f"spmm_{direction}_{self.index}_ms")
        return out

    def gemm(self, x, y):
        t0 = self.timer.now()
        out = x @ y
        self.timer.add(t0, "gemm_ms")
        return out


def fused_gradient_reduce(comm, dw: torch.Tensor, db: torch.Tensor, axis: int):
    """dW and db summed over ``axis`` in one all-reduce of the ``gather`` class: one buffer of
    (D_l + 1) rows, W's rows then b's."""
    if comm.grid[axis] == 1:
        return dw, db
    buf = torch.cat([dw, db.unsqueeze(0)], dim=0)
    comm.all_reduce(buf, axis, comm_class="gather")
    return buf[:-1], buf[-1]


def dense_forward(ctx, shard, t: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Z = T W + b, the layer's GEMM after its aggregation T; T and W are saved for
    :func:`dense_backward` and their bytes counted as the layer's activations."""
    z = shard.gemm(t, w) + b
    ctx.save_for_backward(t, w)
    ctx.shard = shard
    shard.saved_bytes.append(t.numel() * t.element_size() + z.numel() * z.element_size())
    return z


def dense_backward(ctx, dz: torch.Tensor, reduce_axes=()):
    """(dW, db, dT) of :func:`dense_forward`: dW = T^T dZ and db = sum_rows dZ, each summed over
    ``reduce_axes`` (:func:`fused_gradient_reduce`), dT = dZ W^T; dT is None for fixed
    features (layer 0 stops after dW and db)."""
    t, w = ctx.saved_tensors
    shard = ctx.shard
    dz = dz.contiguous()
    dw = shard.gemm(t.t(), dz)
    t0 = shard.timer.now()
    db = dz.sum(dim=0)
    shard.timer.add(t0, "gemm_ms")
    for axis in reduce_axes:
        dw, db = fused_gradient_reduce(shard.comm, dw, db, axis)
    if not ctx.needs_input_grad[0]:
        return dw, db, None
    return dw, db, shard.gemm(dz, w.t()).contiguous()


class FamilyTrainer(RankTrainer):
    """Common setup of the family trainers (see module docstring)."""

    def _setup(self, data, config, rank: int, device) -> None:
        self.config = config
        self.rank = rank
        self.device = torch.device(device)
        self.dtype = torch.float64 if config.dtype == "float64" else torch.float32
        self.timer = PhaseTimer(cuda=self.device.type == "cuda")
        self.widths = model_widths(data.num_features, data.num_classes, config.layers, config.hidden)
        self.weights = glorot_weights(self.widths, config.seed)
        self.persistent_bytes = 0
        self.shard_nnz: list[int] = []
        self.shards: list[FamilyShard] = []

    def _tensor(self, array) -> torch.Tensor:
        return torch.tensor(np.asarray(array), dtype=self.dtype, device=self.device)

    def _finish(self, data, params, *, out_perm, rows: Block, cols: Block, split, class_axis: int,
                row_axis, padded_nodes: int, padded_widths) -> None:
        """Loss shard, optimizer and accounting once the parameters are placed.

        ``rows`` are this rank's logit rows in the order ``out_perm`` (padding past
        ``rows.real``), ``cols`` its class columns.
        """
        n = data.nodes
        self.out_perm = np.asarray(out_perm)
        self.rows, self.cols = rows, cols
        self.padded_nodes, self.padded_widths = int(padded_nodes), [int(w) for w in padded_widths]
        labels = np.full(rows.size, -1, dtype=np.int64)
        original = self.out_perm[rows.start:rows.stop]
        labels[: rows.real] = data.pg.labels[original]
        split = random_split(n, self.config.seed) if split is None else np.asarray(split, dtype=np.int8)
        self.split = split
        codes = np.full(rows.size, -1, dtype=np.int8)
        codes[: rows.real] = split[original]
        train_labels = np.where(codes == TRAIN, labels, -1)
        self.loss_shard = LossShard(
            labels=torch.tensor(train_labels, device=self.device), col_start=cols.start, classes=data.num_classes,
            nodes=max(1, int((split == TRAIN).sum())), class_axis=class_axis, row_axis=row_axis, comm=self.comm,
            timer=self.timer, all_labels=torch.tensor(labels, device=self.device),
            split=torch.tensor(codes, device=self.device))
        self.loss_shard.prepare(cols.size)
        self.place_optimizer(params)
        self.persistent_bytes += self.loss_shard.labels.numel() * 8

    def record_shapes(self) -> dict:
        return {"n_pad": self.padded_nodes, "padded_widths": self.padded_widths,
                "w_split": [False] * len(self.shards)}

    def output_block(self):
        """(row Block, column Block, logits) of this rank's final logits, or None for a replica."""
        if not self.owns_output:
            return None
        return (self.rows, self.cols, self.last_logits.cpu().numpy())
