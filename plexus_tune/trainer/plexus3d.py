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

from dataclasses import dataclass, field

import numpy as np
import torch

from plexus_tune.graph.splits import TRAIN, random_split
from plexus_tune.model.shapes import row_blocks
from plexus_tune.model.workload import model_widths
from plexus_tune.trainer.comm import GridComm, PhaseTimer
from plexus_tune.trainer.data import clip_block
from plexus_tune.trainer.layout import Block, GridLayout, LayerLayout, make_layout
from plexus_tune.trainer.loop import RankTrainer
from plexus_tune.trainer.loss import LossShard
from plexus_tune.trainer.tensors import csr_bytes, glorot_weights, pad_rows, take_dense, torch_csr


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
        if not ctx.needs_input_grad[0]:  # fixed features: no dF, so no dH, its SpMM or collectives
            return None, dw, db, None
        if lay.w_split:
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


class Plexus3dTrainer(RankTrainer):
    """One rank of the 3D algorithm: builds its shards and parameters for one configuration
    (the epoch loop is :class:`RankTrainer`'s)."""

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
        self.features = self.input_features(f_local)
        last = self.layout.layers[-1]
        self.out_perm = perm_r if last.parity == 0 else perm_c
        labels = np.full(last.a_rows.size, -1, dtype=np.int64)  # -1: padding rows
        labels[: last.a_rows.real] = data.label_rows(last.parity, last.a_rows.start, last.a_rows.stop)
        split = random_split(n, config.seed) if split is None else np.asarray(split, dtype=np.int8)
        self.split = split
        codes = np.full(last.a_rows.size, -1, dtype=np.int8)
        lo, hi = clip_block(last.a_rows, n)
        codes[: hi - lo] = split[self.out_perm[lo:hi]]
        train_labels = np.where(codes == TRAIN, labels, -1)
        self.loss_shard = LossShard(
            labels=torch.tensor(train_labels, device=self.device),
            col_start=last.out_cols.start, classes=data.num_classes, nodes=max(1, int((split == TRAIN).sum())),
            class_axis=last.outer, row_axis=last.depth, comm=self.comm, timer=self.timer,
            all_labels=torch.tensor(labels, device=self.device), split=torch.tensor(codes, device=self.device))
        self.loss_shard.prepare(last.out_cols.size)
        self.place_optimizer([self.features] + self.params_w + self.params_b)
        self.persistent_bytes += self.loss_shard.labels.numel() * 8

    def forward(self):
        x = self.features
        for i, shard in enumerate(self.shards):
            if getattr(self.config, "layer_norm", False):
                lay = shard.layout
                x = sharded_layer_norm(x, self.widths[i], lay.in_cols.real, self.comm, lay.inner)
            x = GCNLayerFunction.apply(x, self.params_w[i], self.params_b[i], shard)  # ReLU inside
        return x

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

