"""The sharded softmax cross-entropy and accuracy every trainer shares.

The logits are split over a row axis and a class axis of the process grid; the row
maxima and sums of exponentials are reduced over the class axis, the losses and the
accuracy counts over the row axis, always in FP32 (docs/trainer.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plexus_tune.graph.splits import SPLIT_PARTS
from plexus_tune.trainer.comm import GridComm, PhaseTimer


@dataclass
class LossShard:
    """Local view of the logits for the sharded softmax cross-entropy.

    :meth:`prepare` builds, once, the masks and indices the loss and the accuracy use
    every epoch (valid classes, valid rows, each training row's target position), so an
    epoch never reads a device value on the host."""

    labels: torch.Tensor  # (rows,) label of each local row in [0, C), -1 for padding rows
    col_start: int
    classes: int  # true number of classes C
    nodes: int  # true number of nodes N (the mean's denominator)
    class_axis: int
    row_axis: int | tuple  # the axis (or axes) that split the rows
    comm: GridComm
    timer: PhaseTimer
    all_labels: torch.Tensor | None = None  # (rows,) label of every local row, -1 for padding rows
    split: torch.Tensor | None = None  # (rows,) split code of each local row (graph/splits), -1 for padding
    cols: int | None = None  # local logit columns (set by prepare)

    def prepare(self, cols: int) -> "LossShard":
        labels = self.labels
        device = labels.device
        self.cols = int(cols)
        self.col_ids = torch.arange(self.col_start, self.col_start + self.cols, device=device)
        self.col_valid = self.col_ids < self.classes
        self.any_col = self.cols > 0 and self.col_start < self.classes  # host arithmetic, no device read
        self.all_cols = self.col_start + self.cols <= self.classes
        self.row_valid = labels >= 0
        local = (labels - self.col_start).cpu()
        mine = (labels.cpu() >= 0) & (local >= 0) & (local < self.cols)
        idx = torch.nonzero(mine).squeeze(1)
        self.target_rows = idx.to(device)
        self.target_cols = local[idx].to(device)
        if self.split is not None:
            codes = torch.arange(len(SPLIT_PARTS), device=device, dtype=self.split.dtype)
            self.part_masks = self.split.unsqueeze(0) == codes.unsqueeze(1)  # (parts, rows)
            self.part_sizes = self.part_masks.sum(dim=1).to(torch.float64)
        return self

    def sum_rows(self, t, collective=None):
        """``t`` summed in place over the axes that split the rows (FP32, no class);
        ``collective(t, group)``: the reduction to use instead of the timed all-reduce."""
        axes = self.row_axis if isinstance(self.row_axis, tuple) else (self.row_axis,)
        for axis in axes:
            if self.comm.grid[axis] > 1:
                if collective is None:
                    self.comm.all_reduce(t, axis)
                else:
                    collective(t, self.comm.groups[axis])
        return t

    def masked_logits(self, z):
        """``z`` with the padding classes at -inf (``z`` itself when every column is a class)."""
        if self.all_cols:
            return z
        return z.masked_fill(~self.col_valid.unsqueeze(0), float("-inf"))


def accuracy_counts(z, shard: LossShard) -> torch.Tensor:
    """(correct, total) of each part of the split over this rank's rows, on the device
    (float64, ``2 len(SPLIT_PARTS)``); the trainer sums them over the row axis before
    :func:`accuracy_from_counts`.

    The prediction of a row is its first class of largest logit: the maximum over the
    class axis, then the smallest class index that attains it (FP32 collectives over the
    class axis, untimed).
    """
    comm = shard.comm
    dist = comm.dist
    rows, cols = z.shape
    z = z.detach()
    zm = shard.masked_logits(z)
    if cols and shard.any_col:
        top = zm.max(dim=1).values
    else:
        top = torch.full((rows,), float("-inf"), dtype=z.dtype, device=z.device)

    def reduce(t, axis, op):
        if comm.grid[axis] > 1:
            dist.all_reduce(t, op=op, group=comm.groups[axis])
        return t

    top = reduce(top, shard.class_axis, dist.ReduceOp.MAX)
    big = float(shard.classes + 1)
    hit = (zm == top.unsqueeze(1)) & shard.col_valid.unsqueeze(0)
    neg_ids = -shard.col_ids.to(torch.float64).unsqueeze(0)
    if cols:
        first = torch.where(hit, neg_ids, -big).max(dim=1).values
    else:
        first = torch.full((rows,), -big, dtype=torch.float64, device=z.device)
    pred = -reduce(first, shard.class_axis, dist.ReduceOp.MAX)
    correct = (pred == shard.all_labels.to(torch.float64)) & (shard.all_labels >= 0)
    hits = (shard.part_masks & correct.unsqueeze(0)).sum(dim=1).to(torch.float64)
    return torch.stack([hits, shard.part_sizes], dim=1).reshape(-1)


def accuracy_from_counts(counts) -> dict[str, float]:
    """Accuracy per part from summed (correct, total) counts (host values)."""
    counts = [float(c) for c in counts]
    return {part: counts[2 * k] / counts[2 * k + 1] if counts[2 * k + 1] > 0 else float("nan")
            for k, part in enumerate(SPLIT_PARTS)}


class ShardedCrossEntropy(torch.autograd.Function):
    """mean_v [log sum_c exp(z_vc) - z_v,y_v] over sharded logits (log-softmax where the
    class axis is not split).

    The row max and the sum of exponentials are reduced over the axis that splits the
    classes, the per-row losses summed over the axis that splits the rows; padded rows
    and classes are masked out. Every rank ends with the same scalar.
    """

    @staticmethod
    def forward(ctx, z, shard: LossShard):
        comm = shard.comm
        rows, cols = z.shape
        if shard.cols != cols:
            shard.prepare(cols)
        if comm.grid[shard.class_axis] == 1:  # every class is local: torch's fused log-softmax
            t0 = shard.timer.now()
            logp = torch.log_softmax(shard.masked_logits(z), dim=1)
            total = -logp[shard.target_rows, shard.target_cols].sum().reshape(1)
            shard.timer.add(t0, "loss_ms")
            shard.sum_rows(total)
            ctx.save_for_backward(logp, None)
            ctx.shard = shard
            return (total / shard.nodes).reshape(())
        t0 = shard.timer.now()
        zm = shard.masked_logits(z)
        if shard.any_col:
            row_max = zm.max(dim=1).values
        else:
            row_max = torch.full((rows,), float("-inf"), dtype=z.dtype, device=z.device)
        shard.timer.add(t0, "loss_ms")
        comm.all_reduce(row_max, shard.class_axis, op="max")
        t0 = shard.timer.now()
        row_max = torch.where(torch.isfinite(row_max), row_max, 0.0)
        exp = torch.exp(zm - row_max.unsqueeze(1))
        sums = torch.zeros((rows, 2), dtype=z.dtype, device=z.device)
        sums[:, 0] = exp.sum(dim=1)
        sums[shard.target_rows, 1] = z[shard.target_rows, shard.target_cols]
        shard.timer.add(t0, "loss_ms")
        comm.all_reduce(sums, shard.class_axis)
        t0 = shard.timer.now()
        row_loss = torch.log(sums[:, 0]) + row_max - sums[:, 1]
        total = torch.where(shard.row_valid, row_loss, 0.0).sum().reshape(1)
        shard.timer.add(t0, "loss_ms")
        shard.sum_rows(total)
        ctx.save_for_backward(exp, sums[:, 0].clone())
        ctx.shard = shard
        return (total / shard.nodes).reshape(())

    @staticmethod
    def backward(ctx, grad):
        first, sumexp = ctx.saved_tensors
        shard: LossShard = ctx.shard
        t0 = shard.timer.now()
        # dz = (softmax - onehot) on valid rows, times grad / N: one pass over the logits
        scale = torch.where(shard.row_valid, grad / shard.nodes, 0.0).to(first.dtype)
        if sumexp is None:  # first = log-softmax
            dz = torch.exp(first).mul_(scale.unsqueeze(1))
        else:  # first = exp(z - max)
            dz = first * (scale / sumexp).unsqueeze(1)
        dz[shard.target_rows, shard.target_cols] -= scale[shard.target_rows]
        shard.timer.add(t0, "loss_ms")
        return dz, None

