"""One rank of the 3D-parallel GCN: shards, the layer and loss autograd functions, training.

Forward of layer i (roles and shapes in :mod:`plexus_tune.trainer.layout`, sizes in
:mod:`plexus_tune.model.shapes`):
[layer 0: all-gather F over depth] -> H = A F (SpMM) -> all-reduce H over outer ->
[all-gather W over depth] -> Q = H W (GEMM) -> all-reduce Q over inner -> Q += b
(inside the GEMM of inner coordinate 0 when the all-reduce sums in FP32) -> ReLU.
Backward (given dQ): db = sum_rows dQ, all-reduce over depth; dW = H^T dQ,
reduce-scatter over depth; [all-gather W over depth]; dH = dQ W^T, all-reduce over
outer; dF = A^T dH, layer 0: reduce-scatter over depth, other layers: all-reduce over
depth. The activation (ReLU) ends every layer but the last. W and the layer-0 features are split
over depth in pieces of ceil(rows / g_d) rows: a gather returns g_d pieces and the
first c_i (r_o) rows are used; the gradient is zero padded back before its scatter.

SpMM uses ``torch.sparse.mm`` on CSR tensors with int32 indices (MKL on x86 CPUs;
cuSPARSE on CUDA); both A and A^T shards are stored as CSR.
"""

from __future__ import annotations

import math
import os
import resource
import signal
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
import torch

from plexus_tune.graph import TWO_SIDED_MODES, gcn_normalize, grid_parts, permutations_for, permute_matrix
from plexus_tune.graph.io import resolve_graph
from plexus_tune.graph.splits import SPLIT_PARTS, TRAIN, node_split, random_split, split_sizes
from plexus_tune.graph.shards import (
    load_node_rows,
    load_permutations,
    load_shard_range,
    read_manifest,
)
from plexus_tune.model.shapes import csr_index_dtype, row_blocks
from plexus_tune.model.workload import model_widths
from plexus_tune.trainer.algorithms import trainer_class
from plexus_tune.trainer.comm import GridComm, PhaseTimer
from plexus_tune.model.other import trainer_optimizer
from plexus_tune.trainer.layout import Block, GridLayout, LayerLayout, make_layout
from plexus_tune.trainer.optimizer import build_optimizer
from plexus_tune.trainer.progress import EpochProgress

FAIL_ENV = "PLEXUS_TUNE_INJECT_FAILURE"  # "rank:epoch:mode", mode in raise|kill|oom


def glorot_weights(widths, seed: int) -> list[np.ndarray]:
    """Initial W_i (D_i x D_{i+1}), Glorot-uniform: U(-a, a), a = sqrt(6 / (D_i + D_{i+1})).

    Drawn with a torch generator seeded ``seed``, identically on every rank and in the
    serial reference, so sharded and serial models start equal.
    """
    gen = torch.Generator().manual_seed(int(seed))
    out = []
    for d_in, d_out in zip(widths[:-1], widths[1:]):
        bound = math.sqrt(6.0 / (d_in + d_out))
        w = (torch.rand((d_in, d_out), generator=gen, dtype=torch.float64) * 2.0 - 1.0) * bound
        out.append(w.to(torch.float32).numpy())
    return out


def torch_csr(matrix: sp.csr_matrix, dtype: torch.dtype, device) -> torch.Tensor:
    """A scipy CSR matrix as a torch sparse CSR tensor (int32 indices when they fit)."""
    matrix = sp.csr_matrix(matrix)
    matrix.sort_indices()
    index_dtype = csr_index_dtype(matrix.nnz, *matrix.shape)
    crow = torch.from_numpy(matrix.indptr.astype(index_dtype))
    col = torch.from_numpy(matrix.indices.astype(index_dtype))
    val = torch.from_numpy(matrix.data.astype(np.float64)).to(dtype)
    with warnings.catch_warnings():  # "sparse CSR support is in beta"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, col, val, size=matrix.shape, device=device,
                                       check_invariants=False)


def csr_bytes(t: torch.Tensor) -> int:
    return sum(x.numel() * x.element_size() for x in (t.crow_indices(), t.col_indices(), t.values()))


def take_block(matrix: sp.csr_matrix, rows: Block, cols: Block) -> sp.csr_matrix:
    """The rows x cols block of ``matrix``, rows.size x cols.size, zero past its real entries."""
    n_rows, n_cols = matrix.shape
    r0, r1 = min(rows.start, n_rows), min(rows.stop, n_rows)
    c0, c1 = min(cols.start, n_cols), min(cols.stop, n_cols)
    part = sp.csr_matrix(matrix[r0:r1, c0:c1])
    pad_rows = rows.size - (r1 - r0)
    indptr = np.concatenate([part.indptr, np.full(pad_rows, part.indptr[-1], dtype=part.indptr.dtype)])
    return sp.csr_matrix((part.data, part.indices, indptr), shape=(rows.size, cols.size))


def take_dense(array: np.ndarray, rows: Block, cols: Block) -> np.ndarray:
    """The rows x cols block of a dense array, rows.size x cols.size, zero past its real entries."""
    out = np.zeros((rows.size, cols.size), dtype=array.dtype)
    out[: rows.real, : cols.real] = array[rows.start:rows.stop, cols.start:cols.stop]
    return out


def pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """``tensor`` with zero rows appended up to ``rows`` rows."""
    extra = int(rows) - tensor.shape[0]
    return torch.nn.functional.pad(tensor, (0, 0, 0, extra)) if extra > 0 else tensor


@dataclass
class LayerShard:
    """Everything one rank needs for one layer: its layout, adjacency shards, options."""

    layout: LayerLayout
    a: torch.Tensor | None  # N/g_d x N/g_o shard (None when stored as row blocks)
    a_t: torch.Tensor  # its transpose
    a_blocks: list  # row blocks of ``a`` for blocked aggregation (or [])
    comm: GridComm
    timer: PhaseTimer
    overlap: bool = False
    first: bool = False
    relu: bool = False  # ReLU on the output (every layer but the last)
    bias_in_gemm: bool = False  # add b in the GEMM (inner coordinate 0, FP32 or no inner all-reduce)
    saved_bytes: list = field(default_factory=list)

    def spmm(self, a, dense, direction: str = "fwd"):
        """``a @ dense`` written straight into a fresh output (``addmm`` with beta 0: no zero
        fill and no copy of the result, which ``torch.sparse.mm`` adds on CPU)."""
        t0 = self.timer.now()
        out = torch.empty((a.shape[0], dense.shape[1]), dtype=dense.dtype, device=dense.device)
        torch.addmm(out, a, dense, beta=0, out=out)
        self.timer.add(t0, "spmm_ms", f"spmm_{direction}_{self.layout.index}_ms")
        return out

    def gemm(self, x, y, bias=None):
        """``x @ y``, or ``bias + x @ y`` in one call (the bias in the GEMM's output pass)."""
        t0 = self.timer.now()
        out = x @ y if bias is None else torch.addmm(bias, x, y)
        self.timer.add(t0, "gemm_ms")
        return out

    def aggregate(self, f):
        """H = A F with its all-reduce over outer, optionally in row blocks (overlapped)."""
        outer = self.layout.outer
        if not self.a_blocks:
            h = self.spmm(self.a, f)
            return self.comm.all_reduce(h, outer, comm_class="aggregation")
        parts, pending = [], []
        for a_block in self.a_blocks:
            h_block = self.spmm(a_block, f)  # per-block times add up in the layer's forward SpMM
            parts.append(h_block)
            if self.overlap:
                pending.append(self.comm.all_reduce_async(h_block, outer, comm_class="aggregation"))
            else:
                self.comm.all_reduce(h_block, outer, comm_class="aggregation")
        for work in pending:
            self.comm.wait(work, outer)
        t0 = self.timer.now()
        h = torch.cat(parts, dim=0)
        self.timer.add(t0, "spmm_ms")
        return h


class GCNLayerFunction(torch.autograd.Function):
    """Q = (A F) W + b, then ReLU (``shard.relu``), with the collectives of the 3D algorithm
    (see module docstring). The bias is added by the GEMM where it may join the inner
    all-reduce, the ReLU in place on Q; the backward masks dQ and sums db in one pass
    (docs/trainer.md)."""

    @staticmethod
    def forward(ctx, f_local, w_local, b_local, shard: LayerShard):
        lay, comm = shard.layout, shard.comm
        f = comm.all_gather(f_local, lay.depth, comm_class="gather")[: lay.shapes.r_o] if shard.first else f_local
        h = shard.aggregate(f.contiguous())
        w = comm.all_gather(w_local, lay.depth, comm_class="gather")[: lay.shapes.c_i] if lay.w_split else w_local
        # b joins the inner all-reduce's sum once: from inner coordinate 0 (module docstring)
        fuse = shard.bias_in_gemm and lay.coords[1] == 0
        q = shard.gemm(h, w, b_local if fuse else None)
        comm.all_reduce(q, lay.inner, comm_class="combination")
        if not shard.bias_in_gemm or shard.relu:
            t0 = shard.timer.now()
            if not shard.bias_in_gemm:
                q.add_(b_local)
            if shard.relu:
                q.relu_()
            shard.timer.add(t0, "elementwise_ms")
        ctx.save_for_backward(h, w_local, q if shard.relu else None)
        ctx.shard = shard
        shard.saved_bytes.append(h.numel() * h.element_size() + q.numel() * q.element_size())
        return q

    @staticmethod
    def backward(ctx, dq):
        h, w_local, out = ctx.saved_tensors
        shard: LayerShard = ctx.shard
        lay, comm = shard.layout, shard.comm
        t0 = shard.timer.now()
        if out is not None:  # ReLU backward: one pass reading dQ and the saved output
            dq = torch.ops.aten.threshold_backward(dq, out, 0)
        else:
            dq = dq.contiguous()
        db = dq.sum(dim=0)
        shard.timer.add(t0, "elementwise_ms")
        comm.all_reduce(db, lay.depth, comm_class="gather")
        dw = shard.gemm(h.t(), dq)
        if lay.w_split:
            dw = comm.reduce_scatter(pad_rows(dw, lay.shapes.w_gathered_rows), lay.depth, comm_class="gather")
            w = comm.all_gather(w_local, lay.depth, comm_class="gather")[: lay.shapes.c_i]
        else:
            w = w_local
        dh = shard.gemm(dq, w.t())
        comm.all_reduce(dh, lay.outer, comm_class="aggregation")
        df = shard.spmm(shard.a_t, dh, "bwd")
        if shard.first:
            df = comm.reduce_scatter(pad_rows(df, lay.shapes.features_gathered_rows), lay.depth,
                                     comm_class="gather")
        else:
            comm.all_reduce(df, lay.depth, comm_class="gather")
        return df, dw, db, None


class AllReduceSum(torch.autograd.Function):
    """Sum over an axis group in FP32, differentiable: the gradient is summed over the group too."""

    @staticmethod
    def forward(ctx, t, comm, axis: int):
        ctx.comm, ctx.axis = comm, axis
        out = t.clone()
        comm.all_reduce(out, axis)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        ctx.comm.all_reduce(grad, ctx.axis)
        return grad, None, None


def sharded_layer_norm(x, width: int, real_cols: int, comm, axis: int, eps: float = 1e-5):
    """LayerNorm without scale and shift over rows whose ``width`` columns are split over ``axis``.

    y = (x - mean) / sqrt(var + eps) with the mean and the (biased) variance of the
    row's ``width`` true columns; the two sums are reduced over ``axis`` in FP32 (they
    are statistics, never sent at a reduced precision). The local padding columns
    (``real_cols`` onwards) stay zero.
    """
    mask = (torch.arange(x.shape[1], device=x.device) < real_cols).to(x.dtype)
    mean = AllReduceSum.apply((x * mask).sum(dim=1, keepdim=True), comm, axis) / width
    centered = (x - mean) * mask
    var = AllReduceSum.apply((centered * centered).sum(dim=1, keepdim=True), comm, axis) / width
    return centered * torch.rsqrt(var + eps)


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
    row_axis: int
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
            comm.all_reduce(total, shard.row_axis)
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
        comm.all_reduce(total, shard.row_axis)
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


def _peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _current_rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _maybe_fail(rank: int, epoch: int) -> None:
    """Failure injection for tests of the failure path: ``PLEXUS_TUNE_INJECT_FAILURE=rank:epoch:mode``."""
    spec = os.environ.get(FAIL_ENV)
    if not spec:
        return
    want_rank, want_epoch, mode = spec.split(":")
    if int(want_rank) != rank or int(want_epoch) != epoch:
        return
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "oom":
        torch.empty(2**50, dtype=torch.uint8)  # raises: cannot allocate
    raise RuntimeError(f"injected failure on rank {rank} at epoch {epoch}")


@dataclass
class PreparedGraph:
    """The normalized adjacency, features and labels, loaded once per process."""

    adjacency: sp.csr_matrix  # normalized (self-loops added), float32
    features: np.ndarray
    labels: np.ndarray
    num_classes: int
    name: str
    raw_nnz: int

    @property
    def nodes(self) -> int:
        return int(self.adjacency.shape[0])


def prepare_graph(graph) -> PreparedGraph:
    return PreparedGraph(
        adjacency=gcn_normalize(graph.adjacency),
        features=np.asarray(graph.features, dtype=np.float32),
        labels=np.asarray(graph.labels, dtype=np.int64),
        num_classes=int(graph.num_classes),
        name=str(graph.name),
        raw_nnz=int(graph.nnz),
    )


def _clip(block_, n: int):
    return max(0, min(block_.start, n)), max(0, min(block_.stop, n))


def _pad_rows(part: sp.csr_matrix, rows: int, cols: int) -> sp.csr_matrix:
    part = sp.csr_matrix(part)
    indptr = np.concatenate([part.indptr, np.full(rows - part.shape[0], part.indptr[-1], dtype=part.indptr.dtype)])
    return sp.csr_matrix((part.data, part.indices, indptr), shape=(rows, cols))


class MemoryData:
    """Blocks of the permuted graph from a whole graph held by every rank."""

    def __init__(self, pg: PreparedGraph, permute: str, seed: int, grid=(1, 1, 1)):
        """``grid``: the splits the ``local`` permutation keeps balanced (graph/permute)."""
        self.pg = pg
        self.nodes, self.num_classes, self.name = pg.nodes, pg.num_classes, pg.name
        self.num_features = int(pg.features.shape[1])
        self.nnz, self.raw_nnz = int(pg.adjacency.nnz), pg.raw_nnz
        self.permute = permute
        self.perms = permutations_for(permute, self.nodes, seed, parts=grid_parts(grid))
        perm_r, perm_c = self.perms
        self.permuted = {0: permute_matrix(pg.adjacency, perm_r, perm_c)}
        self.permuted[1] = self.permuted[0] if permute == "none" else permute_matrix(pg.adjacency, perm_c, perm_r)

    def adjacency_block(self, parity: int, rows, cols) -> sp.csr_matrix:
        """Rows x columns of A[out_perm][:, in_perm] (parity 0: (perm_r, perm_c); 1: (perm_c, perm_r)), zero padded."""
        return take_block(self.permuted[parity], rows, cols)

    def feature_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of X[perm_c] (zeros past N)."""
        out = np.zeros((stop - start, self.num_features), dtype=np.float32)
        lo, hi = max(0, min(start, self.nodes)), max(0, min(stop, self.nodes))
        out[: hi - lo] = self.pg.features[self.perms[1][lo:hi]]
        return out

    def label_rows(self, parity: int, start: int, stop: int) -> np.ndarray:
        """Labels of rows [start, stop) in the output order of a layer of this parity (-1 past N)."""
        perm = self.perms[0] if parity == 0 else self.perms[1]
        out = np.full(stop - start, -1, dtype=np.int64)
        lo, hi = max(0, min(start, self.nodes)), max(0, min(stop, self.nodes))
        out[: hi - lo] = self.pg.labels[perm[lo:hi]]
        return out


class ShardData:
    """Blocks of the permuted graph read from a directory of 2D shard files: each rank
    reads only the files that cover its blocks (``plexus-tune graph shard`` writes them).

    The files store B = A_hat[perm_r][:, perm_c]; the alternate layout A_hat[perm_c][:, perm_r]
    is B^T for a symmetric graph, and B itself for the single and no permutations.
    """

    def __init__(self, directory):
        self.dir = directory
        self.manifest = read_manifest(directory)
        m = self.manifest
        node_data = m.get("node_data") or {}
        if not node_data:
            raise ValueError(f"{directory}: shards written without features and labels cannot be trained on")
        self.nodes, self.nnz = int(m["num_nodes"]), int(m["nnz"])
        self.raw_nnz = None
        self.num_features, self.num_classes = int(node_data["num_features"]), int(node_data["num_classes"])
        self.name = str(m.get("name", "shards"))
        self.permute = m["permutation"]["mode"]
        self.symmetric = bool(m.get("symmetric"))
        if self.permute in TWO_SIDED_MODES and not self.symmetric:
            raise ValueError(f"{directory}: {self.permute}-permuted shards of a directed graph lack the alternate "
                             "layout; shard it with a single permutation or none")
        self.perms = load_permutations(directory)

    def _range(self, rows, cols) -> sp.csr_matrix:
        r0, r1 = _clip(rows, self.nodes)
        c0, c1 = _clip(cols, self.nodes)
        part = load_shard_range(self.dir, (r0, r1), (c0, c1), manifest=self.manifest)
        return _pad_rows(part, rows.size, cols.size)

    def adjacency_block(self, parity: int, rows, cols) -> sp.csr_matrix:
        if parity == 0 or self.permute not in TWO_SIDED_MODES:
            return self._range(rows, cols)
        return self._range(cols, rows).T.tocsr()

    def feature_rows(self, start: int, stop: int) -> np.ndarray:
        feats, _ = load_node_rows(self.dir, start, stop, perm="col")
        return np.asarray(feats, dtype=np.float32)

    def label_rows(self, parity: int, start: int, stop: int) -> np.ndarray:
        _, labels = load_node_rows(self.dir, start, stop, perm="row" if parity == 0 else "col")
        return np.asarray(labels, dtype=np.int64)


def is_shard_directory(source) -> bool:
    from pathlib import Path

    if not isinstance(source, (str, os.PathLike)):
        return False
    path = Path(source) / "manifest.json"
    if not path.is_file():
        return False
    try:
        import json

        data = json.loads(path.read_text())
        return isinstance(data, dict) and data.get("format") == "plexus-shards"
    except (OSError, ValueError):
        return False


def make_adamw(params, *, lr: float, weight_decay: float, device_type: str = "cpu"):
    """The trainer's AdamW (:func:`plexus_tune.model.other.trainer_optimizer`: fused on CUDA
    and CPU, one pass that reads the parameter, gradient and both moments and writes the
    parameter and both moments) and its name; ``adamw-foreach`` where this torch or
    device lacks the fused kernel (docs/trainer.md)."""
    name = trainer_optimizer(device_type)
    params = list(params)
    try:
        return build_optimizer(name, params, lr=lr, weight_decay=weight_decay), name
    except (RuntimeError, TypeError, ValueError):
        return build_optimizer("adamw-foreach", params, lr=lr, weight_decay=weight_decay), "adamw-foreach"


class RankTrainer:
    """Builds this rank's shards and parameters for one configuration and trains."""

    def __init__(self, data, config, rank: int, world_size: int, device="cpu", comm=None, split=None):
        """``comm``: the collectives (default: a :class:`GridComm` on torch.distributed);
        ``split``: split codes of the nodes in their original order (graph/splits;
        default: the seeded random split). The loss is the mean over the training nodes."""
        self.config = config
        self.rank = rank
        self.device = torch.device(device)
        self.dtype = torch.float64 if config.dtype == "float64" else torch.float32
        self.timer = PhaseTimer(cuda=self.device.type == "cuda")
        grid = tuple(int(g) for g in config.grid)
        if grid[0] * grid[1] * grid[2] != world_size:
            raise ValueError(f"grid {grid} needs {grid[0] * grid[1] * grid[2]} ranks, world size is {world_size}")
        n = data.nodes
        self.widths = model_widths(data.num_features, data.num_classes, config.layers, config.hidden)
        self.layout: GridLayout = make_layout(grid, rank, n, self.widths, block_rows=config.block_rows)
        if comm is None:
            comm = GridComm(grid, rank, self.timer, precision=getattr(config, "comm_precision", None),
                            seed=config.seed)
        self.comm = comm
        self.perms = data.perms
        perm_r, perm_c = self.perms
        weights = glorot_weights(self.widths, config.seed)
        self.shards: list[LayerShard] = []
        self.params_w, self.params_b = [], []
        self.persistent_bytes = 0
        self.shard_nnz = []
        built = {}  # one adjacency shard per distinct (layout i mod 3, permutation parity i mod 2)
        for lay in self.layout.layers:
            key = lay.index % 6 if data.permute != "none" else lay.index % 3
            if key not in built:
                local = data.adjacency_block(lay.parity, lay.a_rows, lay.a_cols)
                a_t = torch_csr(local.T.tocsr(), self.dtype, self.device)
                blocks = []
                bounds = row_blocks(local.shape[0], config.block_rows)
                if len(bounds) > 1:
                    # the row blocks replace A in the forward pass (A^T serves the backward)
                    for r0, r1 in bounds:
                        blocks.append(torch_csr(local[r0:r1], self.dtype, self.device))
                    a = None
                else:
                    a = torch_csr(local, self.dtype, self.device)
                self.persistent_bytes += (csr_bytes(a) if a is not None else 0) + csr_bytes(a_t)
                self.persistent_bytes += sum(csr_bytes(b) for b in blocks)
                built[key] = (int(local.nnz), a, a_t, blocks)
            nnz, a, a_t, blocks = built[key]
            self.shard_nnz.append(nnz)
            exact_sum = grid[lay.inner] == 1 or self.comm.precision.of("combination") == "fp32"
            self.shards.append(LayerShard(layout=lay, a=a, a_t=a_t, a_blocks=blocks, comm=self.comm,
                                          timer=self.timer, overlap=bool(config.overlap), first=lay.index == 0,
                                          relu=lay.index < len(self.layout.layers) - 1, bias_in_gemm=exact_sum))
            w_local = take_dense(weights[lay.index], lay.w_rows, lay.out_cols)
            self.params_w.append(torch.nn.Parameter(torch.tensor(w_local, dtype=self.dtype, device=self.device)))
            self.params_b.append(torch.nn.Parameter(torch.zeros(lay.out_cols.size, dtype=self.dtype,
                                                                device=self.device)))
        first = self.layout.layers[0]
        f_real = data.feature_rows(first.f_rows.start, first.f_rows.stop)
        f_local = take_dense(f_real, Block(0, first.f_rows.real, first.f_rows.size), first.in_cols)
        self.features = torch.nn.Parameter(torch.tensor(f_local, dtype=self.dtype, device=self.device))
        last = self.layout.layers[-1]
        self.out_perm = perm_r if last.parity == 0 else perm_c
        labels = np.full(last.a_rows.size, -1, dtype=np.int64)  # -1: padding rows
        labels[: last.a_rows.real] = data.label_rows(last.parity, last.a_rows.start, last.a_rows.stop)
        split = random_split(n, config.seed) if split is None else np.asarray(split, dtype=np.int8)
        self.split = split
        codes = np.full(last.a_rows.size, -1, dtype=np.int8)
        lo, hi = _clip(last.a_rows, n)
        codes[: hi - lo] = split[self.out_perm[lo:hi]]
        train_labels = np.where(codes == TRAIN, labels, -1)
        self.loss_shard = LossShard(
            labels=torch.tensor(train_labels, device=self.device),
            col_start=last.out_cols.start, classes=data.num_classes, nodes=max(1, int((split == TRAIN).sum())),
            class_axis=last.outer, row_axis=last.depth, comm=self.comm, timer=self.timer,
            all_labels=torch.tensor(labels, device=self.device), split=torch.tensor(codes, device=self.device))
        self.loss_shard.prepare(last.out_cols.size)
        params = [self.features] + self.params_w + self.params_b
        self.optimizer, self.optimizer_name = make_adamw(params, lr=config.lr, weight_decay=config.weight_decay,
                                                         device_type=self.device.type)
        # parameters, gradients and two AdamW moments
        self.persistent_bytes += 4 * sum(p.numel() * p.element_size() for p in params)
        self.persistent_bytes += self.loss_shard.labels.numel() * 8

    def forward(self):
        x = self.features
        for i, shard in enumerate(self.shards):
            if getattr(self.config, "layer_norm", False):
                lay = shard.layout
                x = sharded_layer_norm(x, self.widths[i], lay.in_cols.real, self.comm, lay.inner)
            x = GCNLayerFunction.apply(x, self.params_w[i], self.params_b[i], shard)  # ReLU inside
        return x

    def train(self, epochs: int):
        """Train ``epochs`` epochs; returns the losses (host floats).

        Losses and accuracy counts stay on the device during an epoch; they are summed
        over the row axis and read on the host every ``config.extra["stats_every"]``
        epochs (default 1; 0: once, after the last epoch), together with the phase timers
        (:class:`PhaseTimer`). With the progress display they are read every epoch."""
        self.comm_epochs = []  # per epoch: bytes sent to other ranks per collective class
        self.accuracy = {"train": [], "valid": [], "test": []}  # per epoch, of the epoch's forward pass
        self.losses = []
        self.peak_tracked_bytes = self.persistent_bytes
        self.peak_rss_delta = 0
        rss_start = _current_rss_bytes()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        progress = None
        if self.rank == 0 and self.config.extra.get("progress"):
            progress = EpochProgress(epochs, self.config.warmup)
        try:
            self._train_epochs(epochs, rss_start, progress)
            return self.losses
        finally:
            if progress is not None:
                progress.close()

    def _read_stats(self, losses, count_list, progress) -> None:
        """Sum the epochs' accuracy counts over the row axis (one collective) and read them,
        with the losses and the timers, on the host (one synchronisation on CUDA); empties
        both lists."""
        if not losses:
            return
        shard = self.loss_shard
        counts = torch.stack(count_list)
        if self.comm.grid[shard.row_axis] > 1:
            self.comm.dist.all_reduce(counts, op=self.comm.dist.ReduceOp.SUM, group=self.comm.groups[shard.row_axis])
        host = torch.cat([torch.stack(losses).to(torch.float64).reshape(-1, 1), counts.to(torch.float64)], dim=1)
        host = host.cpu().tolist()
        self.timer.resolve(wait=True)
        for row in host:
            self.losses.append(float(row[0]))
            for part, value in accuracy_from_counts(row[1:]).items():
                self.accuracy[part].append(value)
            if progress is not None:
                epoch = len(self.losses) - 1
                progress.update(epoch, self.timer._epochs[epoch]["epoch_ms"], self.losses[-1])
        losses.clear()
        count_list.clear()

    def _train_epochs(self, epochs, rss_start, progress):
        # the same cadence on every rank: the row-axis sum is a collective
        every = 1 if self.config.extra.get("progress") else int(self.config.extra.get("stats_every", 1))
        pending_losses, pending_counts = [], []
        last_logits = None
        for epoch in range(epochs):
            _maybe_fail(self.rank, epoch)
            if self.comm.counter is not None:
                self.comm.counter.reset()
            for shard in self.shards:
                shard.saved_bytes.clear()
            t_epoch = self.timer.now()
            t0 = self.timer.now()
            self.optimizer.zero_grad(set_to_none=True)
            self.timer.add(t0, "optimizer_ms")
            logits = self.forward()
            self.timer.add(t_epoch, "fwd_ms")
            rss_mid_epoch = _current_rss_bytes()  # activations saved for backward are all alive here
            loss = ShardedCrossEntropy.apply(logits, self.loss_shard)  # times its own loss_ms
            t0 = self.timer.now()
            loss.backward()
            self.timer.add(t0, "bwd_ms")
            t0 = self.timer.now()
            self.optimizer.step()
            self.timer.add(t0, "optimizer_ms")
            self.timer.end_epoch(t_epoch)
            if self.comm.counter is not None:
                self.comm_epochs.append(dict(self.comm.counter.bytes))
            last_logits = logits.detach()
            pending_losses.append(loss.detach())
            pending_counts.append(accuracy_counts(last_logits, self.loss_shard))
            if every > 0 and len(pending_losses) >= every:
                self._read_stats(pending_losses, pending_counts, progress)
            saved = sum(sum(s.saved_bytes) for s in self.shards)
            # saved H and Q of every layer, their gradients, and the largest gathered buffer
            tracked = self.persistent_bytes + 2 * saved + self.comm.max_gathered_bytes
            self.peak_tracked_bytes = max(self.peak_tracked_bytes, tracked)
            self.peak_rss_delta = max(self.peak_rss_delta, rss_mid_epoch - rss_start)
        self._read_stats(pending_losses, pending_counts, progress)
        self.last_logits = last_logits

    def memory(self) -> dict:
        out = {"tracked_bytes": int(self.peak_tracked_bytes), "rss_bytes": _peak_rss_bytes(),
               "rss_delta_bytes": int(self.peak_rss_delta), "persistent_bytes": int(self.persistent_bytes)}
        if self.device.type == "cuda":
            out["cuda_max_allocated_bytes"] = int(torch.cuda.max_memory_allocated(self.device))
        return out

    def output_block(self):
        """(row Block, column Block, logits) of this rank's final logits if it is inner coordinate 0."""
        last = self.layout.layers[-1]
        if last.coords[1] != 0:
            return None
        return (last.a_rows, last.out_cols, self.last_logits.cpu().numpy())

    def record_shapes(self) -> dict:
        """Padded node count, padded widths and which layers split W over depth (for the record)."""
        return {"n_pad": self.layout.padded_nodes, "padded_widths": list(self.layout.padded_widths),
                "w_split": [lay.w_split for lay in self.layout.layers]}

    def close(self) -> None:
        self.comm.close()


def assemble_outputs(blocks, n: int, classes: int, out_perm) -> np.ndarray:
    """Full (N, C) logits in the original node order from the ranks' output blocks."""
    permuted = None
    for item in blocks:
        if item is None:
            continue
        rows, cols, block_ = item
        if permuted is None:
            permuted = np.zeros((n, classes), dtype=block_.dtype)
        permuted[rows.start:rows.stop, cols.start:cols.stop] = block_[: rows.real, : cols.real]
    out = np.empty_like(permuted)
    out[np.asarray(out_perm)] = permuted
    return out


def rank_main(rank: int, world_size: int, graph_source, configs, device_kind: str = "cpu"):
    """Train every configuration in ``configs`` (in order) on this rank.

    Returns, on rank 0, one result per configuration (losses, per-rank per-epoch
    timers, memory, shard nonzeros, and the assembled outputs when asked); other
    ranks return None. ``graph_source`` is a Graph, a path, or ("synthetic", spec).
    """
    import torch.distributed as dist

    device = "cpu"
    if device_kind == "cuda":
        device = f"cuda:{torch.cuda.current_device()}"
    t_load = time.perf_counter()
    shards = ShardData(graph_source) if is_shard_directory(graph_source) else None
    pg = None if shards is not None else prepare_graph(resolve_graph(graph_source))
    load_s = time.perf_counter() - t_load
    results = []
    for config in configs:
        t_setup = time.perf_counter()
        data = shards if shards is not None else MemoryData(pg, config.permute, config.seed,
                                                                      config.extra.get("permute_grid", config.grid))
        split, split_text = node_split(graph_source if isinstance(graph_source, (str, os.PathLike)) else None,
                                       data.nodes, config.seed)
        trainer = trainer_class(config.algorithm)(data, config, rank, world_size, device=device, split=split)
        setup_s = time.perf_counter() - t_setup
        try:
            losses = trainer.train(int(config.epochs))
            want_outputs = bool(config.collect_outputs or config.check)
            payload = {
                "timers": trainer.timer.epochs,
                "memory": trainer.memory(),
                "shard_nnz": trainer.shard_nnz,
                "comm_bytes": trainer.comm_epochs,
                "setup_s": setup_s,
                "load_s": load_s,
                "output": trainer.output_block() if want_outputs else None,
            }
            gathered = [None] * world_size if rank == 0 else None
            dist.gather_object(payload, gathered, dst=0)
        finally:
            trainer.close()
        if rank == 0:
            result = {
                "losses": losses,
                "timers": [g["timers"] for g in gathered],
                "memory": [g["memory"] for g in gathered],
                "shard_nnz": [g["shard_nnz"] for g in gathered],
                "comm_bytes": [g["comm_bytes"] for g in gathered],
                "accuracy": trainer.accuracy,
                "optimizer": trainer.optimizer_name,
                "split": split_text,
                "split_sizes": split_sizes(split),
                "split_codes": split if (config.check or config.collect_outputs) else None,
                "setup_s": max(g["setup_s"] for g in gathered),
                "load_s": max(g["load_s"] for g in gathered),
                "nodes": data.nodes,
                "nnz": data.nnz,
                "raw_nnz": data.raw_nnz,
                "features": data.num_features,
                "classes": data.num_classes,
                "graph_name": data.name,
                "permute": data.permute,
                "widths": trainer.widths,
                **trainer.record_shapes(),
                "outputs": None,
            }
            if config.collect_outputs or config.check:
                result["outputs"] = assemble_outputs(
                    [g["output"] for g in gathered], data.nodes, data.num_classes, trainer.out_perm)
            results.append(result)
    return results if rank == 0 else None
