"""One rank of ScaleGNN's 4D mini-batch trainer (docs/trainer.md, "ScaleGNN 4D mini-batch").

G = Gd x Gx x Gy x Gz ranks; rank r is member d = r // (Gx Gy Gz) of the data-parallel
groups and has 3D coordinates ``coords_of(r mod Gx Gy Gz)``. Each group holds the whole
graph sharded as Plexus shards it (layer i: rows over its depth axis, columns over its
outer axis, :func:`plexus_tune.model.grid.layer_roles`; at most three distinct shards)
and trains on its own sample at every step: step t of group d samples
:func:`plexus_tune.graph.sampling.sample_vertices` (seed, t, d) and each rank cuts its
own A_S and A_S^T from its shards (:func:`plexus_tune.graph.sampling.sampled_block`), with
no communication. The B sampled vertices, in sorted order, are split over an axis of
size g at the graph's own block boundaries (block k holds the sampled vertices of
[k ceil(N/g), (k+1) ceil(N/g))), so every rank knows every block's size.

Model (every operand has B rows): X_S W_in (all-reduce over Z), then per layer with
roles (o, n, d): H = A_S F (all-reduce over o), Q = H W (all-reduce over n), RMSNorm
(sum of squares all-reduced over o in FP32), ReLU, dropout (one mask drawn for the
whole B x h output from the seed, the step, the layer and the group, so replicas agree),
residual (the input resharded from rows over o and columns over n to rows over d and
columns over o: all-gather over n, then over o; backward: all-reduce of the B x h
gradient over d and over o); then the head X W_out (all-reduce over n) and the sharded
cross-entropy over the sample's training vertices. Unless ``fixed_features``, the rank's
block of the input features (rows over X, columns over Z) is a parameter: dX_S is summed over
Y (:class:`CopyTo`) and the Gd groups' sampled-row gradients are all-gathered at stride
Gx Gy Gz (every rank draws every group's sample itself, so only the values move) and
averaged (:meth:`ScaleGnnTrainer.average_feature_gradient`). With ``prefetch`` (default) the sampling of
step t + 1 runs on a background thread while step t trains (it needs no communication),
and step t ends by waiting for it: ``sample_ms`` times that wait (the exposed sampling,
inside ``other_ms``), ``sample_work_ms`` the sampling itself; the first sample is drawn
before the first epoch. Every epoch starts after an untimed barrier of all ranks: the
full-graph evaluation between epochs is untimed and its ranks finish it at different
times, which would otherwise surface as the first cross-group collective's wait. Gradients that a replicated operand
receives from different shards are summed over the replicas' axis in the backward pass
(:class:`CopyTo`); every parameter's gradient is then averaged over the Gd groups in one
FP32 all-reduce at stride Gx Gy Gz before AdamW steps.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from plexus_tune.graph.sampling import rescale_factor, sample_vertices, sampled_block
from plexus_tune.graph.splits import TRAIN, random_split
from plexus_tune.model.comm_precision import CommPrecision, parse_comm_precision
from plexus_tune.model.grid import coords_of, layer_roles
from plexus_tune.model.scalegnn import steps_per_epoch
from plexus_tune.model.workload import model_widths
from plexus_tune.trainer.comm import GridComm, PhaseTimer, axis_groups
from plexus_tune.trainer.layout import Block, block
from plexus_tune.trainer.loop import RankTrainer, _current_rss_bytes, _maybe_fail, make_adamw
from plexus_tune.trainer.loss import LossShard, ShardedCrossEntropy, accuracy_counts, accuracy_from_counts
from plexus_tune.trainer.precision import CommCounter
from plexus_tune.trainer.tensors import glorot_weights, torch_csr

#: RMSNorm's epsilon.
RMS_EPS = 1e-6


def minibatch_weights(features: int, hidden: int, classes: int, layers: int, seed: int) -> list[np.ndarray]:
    """W_in (D_0 x h), W_1..W_L (h x h) and W_out (h x C), Glorot-uniform from ``seed``
    (:func:`plexus_tune.trainer.tensors.glorot_weights`): the same on every rank and in the reference."""
    return glorot_weights([features] + [hidden] * (layers + 1) + [classes], seed)


def dropout_mask(batch: int, hidden: int, rate: float, seed: int, step: int, layer: int, group: int) -> np.ndarray:
    """The (B, h) dropout scale of one layer at one step of one group: 0 or 1 / (1 - rate)."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), int(step), int(layer)],
                                                                     spawn_key=(int(group), 7))))
    keep = rng.random((batch, hidden)) >= rate
    return keep.astype(np.float64) / (1.0 - rate)


class GroupComm(GridComm):
    """The collectives of one rank of a Gd x (Gx x Gy x Gz) grid: :class:`GridComm`'s axis groups
    inside its own data-parallel group, and the group of the ranks with its 3D coordinates
    in every data-parallel group (stride Gx Gy Gz), :meth:`all_reduce_dp`."""

    def __init__(self, grid, dp: int, rank: int, timer: PhaseTimer, backend=None, precision=None, seed: int = 0):
        import torch.distributed as dist

        self.dist = dist
        self.grid = tuple(int(g) for g in grid)
        self.dp = int(dp)
        g3 = self.grid[0] * self.grid[1] * self.grid[2]
        self.group_index, local = divmod(int(rank), g3)
        self.rank = local
        self.timer = timer
        if precision is not None:
            self.precision = precision if isinstance(precision, CommPrecision) else parse_comm_precision(precision)
        self.counter = CommCounter()
        self.generator = torch.Generator().manual_seed(1_000_003 * int(seed) + int(rank))
        self.coords = tuple(int(c) for c in coords_of(local, self.grid))
        self.groups = [None, None, None]
        self.dp_group = None
        self.max_gathered_bytes = 0
        self._created = []
        for d in range(self.dp):  # every rank creates every group, in the same order
            for axis, members in axis_groups(self.grid, offset=d * g3):
                group = dist.new_group(members, backend=backend)
                self._created.append(group)
                if rank in members:
                    self.groups[axis] = group
        if self.dp > 1:
            for k in range(g3):
                members = [d * g3 + k for d in range(self.dp)]
                group = dist.new_group(members, backend=backend)
                self._created.append(group)
                if rank in members:
                    self.dp_group = group

    def all_gather_dp(self, tensor):
        """The Gd groups' ``tensor`` stacked along dim 0 in group order (timed as ``comm_dp_ms``)."""
        if self.dp == 1:
            return tensor
        import torch

        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(self.dp)]
        t0 = self.timer.now()
        self.dist.all_gather(parts, tensor, group=self.dp_group)
        self.timer.add(t0, "comm_ms", "comm_dp_ms", "all_gather_ms")
        if self.counter is not None:
            self.counter.add("gather", (self.dp - 1) * tensor.numel() * tensor.element_size())
        return torch.cat(parts, dim=0)

    def all_reduce_dp(self, tensor):
        """Sum over the Gd groups in FP32, in place (timed as ``comm_dp_ms``)."""
        if self.dp == 1:
            return tensor
        t0 = self.timer.now()
        self.dist.all_reduce(tensor, group=self.dp_group)
        self.timer.add(t0, "comm_ms", "comm_dp_ms", "all_reduce_ms")
        if self.counter is not None:
            self.counter.add("gather", 2 * (self.dp - 1) * (-(-tensor.numel() // self.dp)) * tensor.element_size())
        return tensor


class SumOver(torch.autograd.Function):
    """Partial sums over an axis made whole: all-reduce forward, the gradient passed as is."""

    @staticmethod
    def forward(ctx, x, comm, axis: int, comm_class):
        out = x.clone()
        comm.all_reduce(out, axis, comm_class=comm_class)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None


class CopyTo(torch.autograd.Function):
    """An operand replicated over an axis and used by different shards: identity forward,
    the replicas' gradients summed (all-reduce) backward."""

    @staticmethod
    def forward(ctx, x, comm, axis: int, comm_class):
        ctx.comm, ctx.axis, ctx.comm_class = comm, axis, comm_class
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        ctx.comm.all_reduce(grad, ctx.axis, comm_class=ctx.comm_class)
        return grad, None, None, None


class AllReduceBoth(torch.autograd.Function):
    """A sum over an axis whose every replica's result feeds its own shard: all-reduce both ways (FP32)."""

    @staticmethod
    def forward(ctx, x, comm, axis: int):
        ctx.comm, ctx.axis = comm, axis
        out = x.clone()
        comm.all_reduce(out, axis)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        ctx.comm.all_reduce(grad, ctx.axis)
        return grad, None, None


@dataclass
class Sample:
    """One step's sample seen by one rank: the sorted vertices and, per axis, the block bounds."""

    vertices: np.ndarray
    bounds: list  # per axis: (g + 1,) positions in ``vertices`` of the blocks' starts
    step: int
    group: int

    def rows(self, axis: int, coord: int) -> tuple[int, int]:
        b = self.bounds[axis]
        return int(b[coord]), int(b[coord + 1])

    def counts(self, axis: int) -> np.ndarray:
        return np.diff(self.bounds[axis])


def graph_shards_of(adjacency, grid, coords, layers: int) -> list[tuple[int, int, object]]:
    """(row start, column start, CSR shard) of each distinct layer layout (at most 3) of the rank at
    ``coords``: rows over the layer's depth axis, columns over its outer axis (ceil(N / g) per block)."""
    n = adjacency.shape[0]
    out = []
    for i in range(min(int(layers), 3)):
        o, _, d = layer_roles(i)
        rows = block(coords[d], -(-n // grid[d]), n)
        cols = block(coords[o], -(-n // grid[o]), n)
        out.append((rows.start, cols.start, adjacency[rows.start:rows.stop, cols.start:cols.stop].tocsr()))
    return out


def draw_sample(nodes: int, grid, batch: int, seed: int, step: int, group: int) -> Sample:
    """Step ``step``'s sample of data-parallel group ``group`` and its block bounds per axis
    (block k of an axis of size g: the sampled vertices of [k ceil(N / g), (k + 1) ceil(N / g)))."""
    vertices = sample_vertices(nodes, batch, seed, step, group)
    bounds = []
    for axis in range(3):
        size = -(-nodes // grid[axis])
        edges = np.minimum(np.arange(grid[axis] + 1) * size, nodes)
        bounds.append(np.searchsorted(vertices, edges, side="left"))
    return Sample(vertices, bounds, step, group)


def cut_sampled_shards(graph_shards, coords, sample: Sample, nodes: int, dtype, device, rescale: bool = True) -> list:
    """(A_S, A_S^T) of each distinct layer layout, cut from the rank's ``graph_shards``
    (:func:`graph_shards_of`) by :func:`plexus_tune.graph.sampling.sampled_block`: no communication."""
    out = []
    p = rescale_factor(nodes, len(sample.vertices))
    for i, (r_start, c_start, shard) in enumerate(graph_shards):
        o, _, d = layer_roles(i)
        r0, r1 = sample.rows(d, coords[d])
        c0, c1 = sample.rows(o, coords[o])
        a = sampled_block(shard, r_start, c_start, sample.vertices[r0:r1], sample.vertices[c0:c1], p, rescale=rescale)
        out.append((torch_csr(a, dtype, device), torch_csr(a.T.tocsr(), dtype, device)))
    return out


class Reshard(torch.autograd.Function):
    """The residual moved from rows over ``src_rows`` x columns over ``src_cols`` to rows over
    ``dst_rows`` x columns over ``dst_cols`` (module docstring)."""

    @staticmethod
    def forward(ctx, x, trainer, sample, layer: int):
        o, n, d = layer_roles(layer)
        ctx.trainer, ctx.sample, ctx.layer = trainer, sample, layer
        comm, h = trainer.comm, trainer.hidden
        # columns over n: gather the transposed blocks (rows of the gather) and keep the first h
        cols = comm.all_gather(x.t().contiguous(), n, comm_class="gather").t()[:, :h]
        counts = sample.counts(o)
        most = int(counts.max())
        padded = torch.zeros((most, h), dtype=x.dtype, device=x.device)
        padded[: cols.shape[0]] = cols
        gathered = comm.all_gather(padded, o, comm_class="gather")
        full = torch.cat([gathered[k * most: k * most + int(c)] for k, c in enumerate(counts.tolist())], dim=0)
        r0, r1 = sample.rows(d, comm.coords[d])
        cb = trainer.col_block(h, o)
        out = torch.zeros((r1 - r0, cb.size), dtype=x.dtype, device=x.device)
        out[:, : cb.real] = full[r0:r1, cb.start:cb.stop]
        return out

    @staticmethod
    def backward(ctx, grad):
        trainer, sample, layer = ctx.trainer, ctx.sample, ctx.layer
        o, n, d = layer_roles(layer)
        comm, h = trainer.comm, trainer.hidden
        full = torch.zeros((len(sample.vertices), h), dtype=grad.dtype, device=grad.device)
        r0, r1 = sample.rows(d, comm.coords[d])
        cb = trainer.col_block(h, o)
        full[r0:r1, cb.start:cb.stop] = grad[:, : cb.real]
        comm.all_reduce(full, d, comm_class="gather")
        comm.all_reduce(full, o, comm_class="gather")
        s0, s1 = sample.rows(o, comm.coords[o])
        nb = trainer.col_block(h, n)
        out = torch.zeros((s1 - s0, nb.size), dtype=grad.dtype, device=grad.device)
        out[:, : nb.real] = full[s0:s1, nb.start:nb.stop]
        return out, None, None, None


@dataclass
class _Stats:
    saved_bytes: list = field(default_factory=list)


class ScaleGnnTrainer(RankTrainer):
    """One rank of the 4D mini-batch trainer (module docstring)."""

    def __init__(self, data, config, rank: int, world_size: int, device="cpu", comm=None, split=None):
        self.config = config
        self.rank = rank
        self.device = torch.device(device)
        self.dtype = torch.float64 if config.dtype == "float64" else torch.float32
        self.timer = PhaseTimer(cuda=self.device.type == "cuda")
        self.grid = tuple(int(g) for g in config.grid)
        self.dp = int(getattr(config, "dp", 1) or 1)
        g3 = self.grid[0] * self.grid[1] * self.grid[2]
        if self.dp * g3 != world_size:
            raise ValueError(f"{self.dp} x grid {self.grid} needs {self.dp * g3} ranks, world size is {world_size}")
        options = dict(config.extra.get("minibatch") or {})
        self.batch = int(config.batch_size)
        self.components = {name: bool(options.get(name, True)) for name in ("rmsnorm", "residual")}
        self.dropout = float(options.get("dropout", 0.0))
        self.prefetch = bool(getattr(config, "prefetch", True))
        self.comm = comm or GroupComm(self.grid, self.dp, rank, self.timer, precision=config.comm_precision,
                                      seed=config.seed)
        self.group = self.comm.group_index
        self.coords = self.comm.coords
        self.pg = data.pg
        n = self.nodes = data.nodes
        self.features_in, self.classes = data.num_features, data.num_classes
        self.hidden, self.layers = int(config.hidden), int(config.layers)
        # the record's widths, as every family's (model.workload.model_widths): the planner's workload
        self.widths = model_widths(self.features_in, self.classes, self.layers, self.hidden)
        self.split = random_split(n, config.seed) if split is None else np.asarray(split, dtype=np.int8)
        self.labels = np.asarray(data.pg.labels, dtype=np.int64)
        # the group's replica of the graph: this rank's shard of each distinct layer layout
        adjacency = data.pg.adjacency.tocsr()
        self.graph_shards = graph_shards_of(adjacency, self.grid, self.coords, self.layers)
        self.persistent_bytes = sum(s.data.nbytes + s.indices.nbytes + s.indptr.nbytes for _, _, s in self.graph_shards)
        self.shard_nnz = [int(self.graph_shards[i % 3][2].nnz) for i in range(self.layers)]
        xr, zc = self.node_block(0), block(self.coords[2], -(-self.features_in // self.grid[2]), self.features_in)
        self.x_rows, self.x_cols = xr, zc
        x_local = np.zeros((xr.stop - xr.start, zc.size), dtype=np.float64)
        x_local[:, : zc.real] = np.asarray(data.pg.features, dtype=np.float64)[xr.start:xr.stop, zc.start:zc.stop]
        self.fixed_features = bool(getattr(config, "fixed_features", False))
        x_t = torch.tensor(x_local, dtype=self.dtype, device=self.device)
        self.x_param = x_t if self.fixed_features else torch.nn.Parameter(x_t)
        self.persistent_bytes += x_t.numel() * x_t.element_size() * (1 if self.fixed_features else 4)
        weights = minibatch_weights(self.features_in, self.hidden, self.classes, self.layers, config.seed)
        self.w_in = self._param(weights[0], block(self.coords[2], zc.size, self.features_in), self.col_block(self.hidden, 1))
        self.w_layers, self.gammas = [], []
        for i in range(self.layers):
            o, nn, _ = layer_roles(i)
            self.w_layers.append(self._param(weights[i + 1], self.col_block(self.hidden, nn), self.col_block(self.hidden, o)))
            cb = self.col_block(self.hidden, o)
            gamma = np.zeros(cb.size)
            gamma[: cb.real] = 1.0
            self.gammas.append(torch.nn.Parameter(torch.tensor(gamma, dtype=self.dtype, device=self.device)))
        o, nn, d = layer_roles(self.layers)
        self.head_roles = (o, nn, d)
        self.w_out = self._param(weights[-1], self.col_block(self.hidden, nn), self.col_block(self.classes, d))
        self.params = [self.w_in, *self.w_layers, *(self.gammas if self.components["rmsnorm"] else []), self.w_out]
        trained = [] if self.fixed_features else [self.x_param]
        self.optimizer, self.optimizer_name = make_adamw(self.params + trained, lr=config.lr,
                                                         weight_decay=config.weight_decay, device_type=self.device.type)
        self.persistent_bytes += 4 * sum(p.numel() * p.element_size() for p in self.params)
        self.steps = steps_per_epoch(n, self.batch, self.dp)
        self.shards = [_Stats()]
        self.loss_shard = None
        self.check_payload = None

    # ----------------------------------------------------------------------------- layout

    def node_block(self, axis: int) -> Block:
        """This rank's block of the N vertices over ``axis`` (ceil(N / g) per block)."""
        return block(self.coords[axis], -(-self.nodes // self.grid[axis]), self.nodes)

    def col_block(self, width: int, axis: int) -> Block:
        """This rank's block of ``width`` columns over ``axis`` (ceil(width / g) per block, zero padded)."""
        return block(self.coords[axis], -(-int(width) // self.grid[axis]), int(width))

    def _param(self, full: np.ndarray, rows: Block, cols: Block) -> torch.nn.Parameter:
        local = np.zeros((rows.size, cols.size))
        local[: rows.real, : cols.real] = full[rows.start:rows.stop, cols.start:cols.stop]
        return torch.nn.Parameter(torch.tensor(local, dtype=self.dtype, device=self.device))

    # ----------------------------------------------------------------------------- sampling

    def sample(self, step: int, batch: int | None = None) -> Sample:
        """Step ``step``'s sample of this rank's group and its block bounds per axis (:func:`draw_sample`)."""
        return draw_sample(self.nodes, self.grid, self.batch if batch is None else batch, self.config.seed, step,
                           self.group)

    def sampled_shards(self, sample: Sample, rescale: bool = True) -> list:
        """(A_S, A_S^T) of each distinct layer layout, cut from this rank's shards (:func:`cut_sampled_shards`)."""
        return cut_sampled_shards(self.graph_shards, self.coords, sample, self.nodes, self.dtype, self.device, rescale)

    # ----------------------------------------------------------------------------- model

    def _spmm(self, a, dense, direction, layer):
        t0 = self.timer.now()
        out = torch.sparse.mm(a, dense)
        self.timer.add(t0, "spmm_ms", f"spmm_{direction}_{layer}_ms")
        return out

    def _gemm(self, x, y):
        t0 = self.timer.now()
        out = x @ y
        self.timer.add(t0, "gemm_ms")
        return out

    def forward_sample(self, sample: Sample, shards, *, train: bool = True):
        """Logits of this rank's block (rows over the head's outer axis, classes over its depth axis)."""
        comm = self.comm
        r0, r1 = sample.rows(0, self.coords[0])
        rows = torch.as_tensor(sample.vertices[r0:r1] - self.x_rows.start, device=self.device)
        x_s = self.x_param.index_select(0, rows)
        if not self.fixed_features:  # its gradient: partial sums over the projection's Y-split width
            x_s = CopyTo.apply(x_s, comm, 1, "gather")
        x = SumOver.apply(self._gemm(x_s, CopyTo.apply(self.w_in, comm, 0, "gather")), comm, 2, "combination")
        for i in range(self.layers):
            o, n, d = layer_roles(i)
            a, a_t = shards[i % 3]
            f = CopyTo.apply(x, comm, d, "gather")
            h = SumOver.apply(_SpMM.apply(f, a, a_t, self, i), comm, o, "aggregation")
            h = CopyTo.apply(h, comm, o, "aggregation")
            q = SumOver.apply(self._gemm(h, CopyTo.apply(self.w_layers[i], comm, d, "gather")), comm, n, "combination")
            if self.components["rmsnorm"]:
                squares = AllReduceBoth.apply((q * q).sum(dim=1, keepdim=True), comm, o)
                q = q * torch.rsqrt(squares / self.hidden + RMS_EPS) * CopyTo.apply(self.gammas[i], comm, d, "gather")
            q = torch.relu(q)
            if train and self.dropout > 0:
                mask = dropout_mask(len(sample.vertices), self.hidden, self.dropout, self.config.seed, sample.step, i,
                                    sample.group)
                q0, q1 = sample.rows(d, self.coords[d])
                cb = self.col_block(self.hidden, o)
                local = np.zeros((q1 - q0, cb.size))
                local[:, : cb.real] = mask[q0:q1, cb.start:cb.stop]
                q = q * torch.tensor(local, dtype=self.dtype, device=self.device)
            if self.components["residual"]:
                q = q + Reshard.apply(x, self, sample, i)
            x = q
        o, n, d = self.head_roles
        xh = CopyTo.apply(x, comm, d, "aggregation")
        return SumOver.apply(self._gemm(xh, CopyTo.apply(self.w_out, comm, o, "gather")), comm, n, "combination")

    def loss_shard_for(self, sample: Sample, *, train_only: bool = True) -> LossShard:
        """The sharded loss of a sample: its training vertices' mean cross-entropy."""
        o, _, d = self.head_roles
        r0, r1 = sample.rows(o, self.coords[o])
        vertices = sample.vertices[r0:r1]
        labels = self.labels[vertices]
        codes = self.split[vertices]
        train_labels = np.where(codes == TRAIN, labels, -1)
        cols = self.col_block(self.classes, d)
        shard = LossShard(labels=torch.tensor(train_labels if train_only else labels, device=self.device),
                          col_start=cols.start, classes=self.classes,
                          nodes=max(1, int((self.split[sample.vertices] == TRAIN).sum())), class_axis=d, row_axis=o,
                          comm=self.comm, timer=self.timer, all_labels=torch.tensor(labels, device=self.device),
                          split=torch.tensor(codes.astype(np.int8), device=self.device))
        return shard.prepare(cols.size)

    # ----------------------------------------------------------------------------- training

    def prepare(self, t: int) -> tuple:
        """Step ``t``'s sample and its (A_S, A_S^T) per layout, with the host ms the sampling took
        (no communication, no timer: safe on the prefetch thread)."""
        t0 = time.perf_counter()
        sample = self.sample(t)
        shards = self.sampled_shards(sample)
        return sample, shards, (time.perf_counter() - t0) * 1e3

    def step(self, t: int, prepared: tuple | None = None):
        """One training step on ``prepared`` (:meth:`prepare` of ``t``; drawn here and timed as
        ``sample_ms`` if None): forward, loss, backward, data-parallel average, AdamW. Returns the loss."""
        if prepared is None:
            t0 = self.timer.now()
            prepared = self.prepare(t)
            self.timer.add(t0, "sample_ms")
        sample, shards, work_ms = prepared
        self.timer.add_ms(work_ms, "sample_work_ms")
        self.last_sample_nnz = [int(a._nnz()) for a, _ in shards]
        t0 = self.timer.now()
        self.optimizer.zero_grad(set_to_none=True)
        self.timer.add(t0, "optimizer_ms")
        logits = self.forward_sample(sample, shards)
        self.loss_shard = self.loss_shard_for(sample)
        loss = ShardedCrossEntropy.apply(logits, self.loss_shard)
        t0 = self.timer.now()
        loss.backward()
        self.timer.add(t0, "bwd_ms")
        self.average_gradients()
        self.average_feature_gradient(sample)
        if self.config.check and t == 0:
            self.check_payload = self._check_blocks(sample, logits, loss)
        t0 = self.timer.now()
        self.optimizer.step()
        self.timer.add(t0, "optimizer_ms")
        return loss.detach()

    def average_gradients(self) -> None:
        """Every parameter's gradient averaged over the Gd groups: one flat FP32 all-reduce."""
        if self.dp == 1:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads]).to(torch.float32 if self.dtype == torch.float32 else self.dtype)
        self.comm.all_reduce_dp(flat)
        flat /= self.dp
        offset = 0
        for p, g in zip(self.params, grads):
            p.grad = flat[offset: offset + g.numel()].view_as(g).to(self.dtype)
            offset += g.numel()

    def average_feature_gradient(self, sample: Sample) -> None:
        """Trained features: the feature block's gradient averaged over the Gd groups. Each group's
        gradient is nonzero on its sampled rows only; those rows are all-gathered (FP32, padded
        to the largest count) and added where each group's sample puts them, then divided by Gd."""
        if self.fixed_features or self.dp == 1 or self.x_param.grad is None:
            return
        lo, hi = self.x_rows.start, self.x_rows.stop
        rows = []
        for g in range(self.dp):
            vertices = sample.vertices if g == self.group else sample_vertices(
                self.nodes, len(sample.vertices), self.config.seed, sample.step, g)
            a, b = np.searchsorted(vertices, [lo, hi], side="left")
            rows.append(torch.as_tensor(vertices[a:b] - lo, device=self.device))
        most = max(int(r.numel()) for r in rows)
        grad = self.x_param.grad
        send = torch.zeros((most, grad.shape[1]), dtype=grad.dtype, device=self.device)  # FP32 (FP64 runs: FP64)
        mine = rows[self.group]
        send[: mine.numel()] = grad.index_select(0, mine)
        gathered = self.comm.all_gather_dp(send)
        out = torch.zeros_like(grad)
        for g, r in enumerate(rows):
            out.index_add_(0, r, gathered[g * most: g * most + r.numel()])
        self.x_param.grad = out / self.dp

    def _check_blocks(self, sample, logits, loss) -> dict:
        """This rank's blocks of step 0 for ``--check``: loss, logits, gradients after the average."""
        o, _, d = self.head_roles
        r0, r1 = sample.rows(o, self.coords[o])
        cb = self.col_block(self.classes, d)
        blocks = {"group": self.group, "loss": float(loss.detach()), "sample": sample.vertices,
                  "logits": (r0, r1, cb.start, cb.stop, logits.detach().cpu().numpy()[:, : cb.real])}
        grads = {}
        zc = block(self.coords[2], -(-self.features_in // self.grid[2]), self.features_in)
        specs = [("w_in", self.w_in, zc, self.col_block(self.hidden, 1))]
        for i in range(self.layers):
            oo, nn, _ = layer_roles(i)
            specs.append((f"w_{i}", self.w_layers[i], self.col_block(self.hidden, nn), self.col_block(self.hidden, oo)))
            if self.components["rmsnorm"]:
                cbg = self.col_block(self.hidden, oo)
                grads[f"gamma_{i}"] = (cbg.start, cbg.stop, self.gammas[i].grad.cpu().numpy()[: cbg.real])
        oo, nn, dd = self.head_roles
        specs.append(("w_out", self.w_out, self.col_block(self.hidden, nn), self.col_block(self.classes, dd)))
        for name, p, rb, cbk in specs:
            grads[name] = (rb.start, rb.stop, cbk.start, cbk.stop, p.grad.cpu().numpy()[: rb.real, : cbk.real])
        if not self.fixed_features and self.coords[1] == 0:  # the feature block (replicated over Y)
            xr, xc = self.x_rows, self.x_cols
            grads["x"] = (xr.start, xr.stop, xc.start, xc.stop, self.x_param.grad.cpu().numpy()[:, : xc.real])
        blocks["grads"] = grads
        return blocks

    def evaluate(self) -> list[float]:
        """Accuracy counts (correct, total per split part) of a full-graph forward pass (B = N,
        no rescaling, no dropout), summed over the head's row axis; untimed."""
        saved = self.timer
        self.timer = self.comm.timer = PhaseTimer(cuda=self.device.type == "cuda")
        try:
            with torch.no_grad():
                sample = self.sample(0, batch=self.nodes)
                logits = self.forward_sample(sample, self.sampled_shards(sample), train=False)
                shard = self.loss_shard_for(sample, train_only=False)
                counts = accuracy_counts(logits, shard)
                if self.grid[shard.row_axis] > 1:
                    self.comm.dist.all_reduce(counts, group=self.comm.groups[shard.row_axis])
            self.last_logits = logits
            self.eval_sample = sample
            return counts.cpu().tolist()
        finally:
            self.timer = self.comm.timer = saved

    def _train_epochs(self, epochs, rss_start, progress):
        """Train ``epochs`` epochs of :attr:`steps` steps; with :attr:`prefetch` step t + 1 is
        prepared on a background thread while step t trains, and step t ends waiting for it
        (``sample_ms``); the first sample is drawn before the first epoch, untimed."""
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sampling") if self.prefetch else None
        try:
            ahead = self.prepare(0) if pool is not None else None
            t = 0
            for epoch in range(epochs):
                _maybe_fail(self.rank, epoch)
                if self.comm.counter is not None:
                    self.comm.counter.reset()
                # untimed: every rank starts the epoch together, so the skew of the untimed evaluation
                # before it does not surface as the first collective's wait (docs/trainer.md)
                self.comm.dist.barrier()
                t_epoch = self.timer.now()
                losses = []
                for _ in range(self.steps):
                    if pool is None:
                        losses.append(self.step(t))
                    else:
                        future = pool.submit(self.prepare, t + 1)
                        losses.append(self.step(t, ahead))
                        t0 = self.timer.now()
                        ahead = future.result()
                        self.timer.add(t0, "sample_ms")
                    t += 1
                self.timer.end_epoch(t_epoch)
                self._end_epoch(epoch, losses, progress, rss_start)
        finally:
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    def _end_epoch(self, epoch, losses, progress, rss_start):
        if self.comm.counter is not None:
            self.comm_epochs.append(dict(self.comm.counter.bytes))
        self.losses.append(float(torch.stack(losses).to(torch.float64).mean()))
        for part, value in accuracy_from_counts(self.evaluate()).items():
            self.accuracy[part].append(value)
        self.timer.resolve(wait=True)
        if progress is not None:
            progress.update(epoch, self.timer._epochs[epoch]["epoch_ms"], self.losses[-1])
        tracked = self.persistent_bytes + self.comm.max_gathered_bytes
        self.peak_tracked_bytes = max(self.peak_tracked_bytes, tracked)
        self.peak_rss_delta = max(self.peak_rss_delta, _current_rss_bytes() - rss_start)

    # ----------------------------------------------------------------------------- results

    @property
    def out_perm(self):
        return np.arange(self.nodes)

    def output_block(self):
        """(row Block, column Block, logits) of the last full-graph evaluation, from group 0's
        ranks of inner coordinate 0 on the head (the others hold replicas)."""
        o, n, d = self.head_roles
        if self.group != 0 or self.coords[n] != 0:
            return None
        r0, r1 = self.eval_sample.rows(o, self.coords[o])
        cb = self.col_block(self.classes, d)
        return (Block(r0, r1, r1 - r0), cb, self.last_logits.cpu().numpy())

    def assemble_check(self, payloads) -> dict:
        """The ranks' ``--check`` blocks assembled (:func:`assemble_check`)."""
        return assemble_check(payloads, self.nodes, (self.features_in, self.hidden, self.classes))

    def record_shapes(self) -> dict:
        return {"n_pad": self.nodes, "padded_widths": list(self.widths), "w_split": [False] * self.layers,
                "dp": self.dp, "batch_size": self.batch, "steps_per_epoch": self.steps}


class _SpMM(torch.autograd.Function):
    """A_S F (forward) and A_S^T dH (backward), timed as the layer's SpMMs."""

    @staticmethod
    def forward(ctx, f, a, a_t, trainer, layer):
        ctx.a_t, ctx.trainer, ctx.layer = a_t, trainer, layer
        return trainer._spmm(a, f.contiguous(), "fwd", layer)

    @staticmethod
    def backward(ctx, grad):
        return ctx.trainer._spmm(ctx.a_t, grad.contiguous(), "bwd", ctx.layer), None, None, None, None


def assemble_check(payloads, nodes: int, widths) -> dict:
    """Rank 0's view of ``--check``: per group its loss and sample, group 0's (B, C) logits,
    and the full gradient matrices after the data-parallel average (from any group; ``x``
    the (N, D_0) input features' where they are trained);
    ``widths`` = (D_0, h, C)."""
    groups = {}
    logits = None
    grads: dict[str, np.ndarray] = {}
    for item in payloads:
        if item is None:
            continue
        groups.setdefault(item["group"], {"loss": item["loss"], "sample": item["sample"]})
        if item["group"] == 0:
            r0, r1, c0, c1, values = item["logits"]
            if logits is None:
                logits = np.zeros((len(item["sample"]), widths[-1]))
            logits[r0:r1, c0:c1] = values
        for name, spec in item["grads"].items():
            if name.startswith("gamma"):
                c0, c1, values = spec
                grads.setdefault(name, np.zeros(widths[1]))[c0:c1] = values
            else:
                r0, r1, c0, c1, values = spec
                if name not in grads:
                    rows = nodes if name == "x" else widths[0] if name == "w_in" else widths[1]
                    cols = widths[0] if name == "x" else widths[-1] if name == "w_out" else widths[1]
                    grads[name] = np.zeros((rows, cols))
                grads[name][r0:r1, c0:c1] = values
    return {"groups": [groups[g] for g in sorted(groups)], "logits": logits, "grads": grads}
