"""The analytic epoch-time model of a 3D-parallel GCN, vectorized over grids.

Input: a :class:`~plexus_tune.model.workload.Workload` (N, NNZ, widths D_0..D_L, element
size u), a :class:`~plexus_tune.model.machine.Machine` and a (K, 3) array of grids. Every
quantity is computed for all K grids at once; the only Python loop is over layers.

Notation for layer i with roles (outer o, inner n, depth d) from
:func:`plexus_tune.model.grid.layer_roles` and axis sizes g_o, g_n, g_d; padded local
sizes (a dimension n split over g ranks holds ceil(n / g) entries), all from
:func:`plexus_tune.model.shapes.layer_shapes`, the sizes the trainer allocates::

    r_d = ceil(N / g_d)   rows of H = A F_i and of Q = H W_i
    r_o = ceil(N / g_o)   rows of F_i (the common dimension of A F_i)
    c_i = ceil(D_i / g_n)      columns of F_i and H
    c_o = ceil(D_{i+1} / g_o)  columns of Q
    w   = ceil(c_i / g_d)      rows of W_i a rank keeps; its all-gather returns g_d w rows
    f   = ceil(r_o / g_d)      rows of the layer-0 features a rank keeps (g_d f gathered)
    z   = ceil(NNZ / (g_d g_o))  nonzeros of the local A shard

The gathered W_i block and layer-0 features (and the dW, dF_0 reduce-scatters) carry
g_d w c_o and g_d f c_0 elements (c_0 = c_i of layer 0), padded to whole rows per rank;
with exact division g_d w = c_i and g_d f = r_o, the paper's messages.

SpMM (``spmm_ms``)
    The machine's per-SpMM model (:func:`plexus_tune.model.spmm.predict_spmm_ms`, the
    same for every family) summed over the forward A F_i (nnz z, rows r_d, common r_o,
    dense columns c_i) and the backward A^T dH (nnz z, rows r_o, common r_d, dense
    columns c_i) of each layer. For kind ``paper`` (the paper's eq. 4.4, per layer) the
    forward pays c0/2 sqrt(f) + c1 sqrt(f) r_o / c_i and the backward c0/2 sqrt(f) +
    c2 sqrt(f) r_d / c_i, f = z c_i; the paper's c2 is negative, so far outside the
    fitted range the sum can go negative: flagged in ``spmm_clipped`` and floored (below). With ``block_rows`` the forward SpMM runs as b = ceil(r_d / block_rows)
    blocks of ceil(r_d / b) rows (the trainer's blocks; its last one is shorter) and
    z / b nonzeros each.

SpMM floor (``spmm_floor_ms``, docs/model.md, SpMM floor): with the profile's
``memory_bandwidth_gbps`` B, no epoch's SpMMs can take less than the bytes they must
move at B, summed over the forward and backward SpMM of every layer
(:func:`plexus_tune.model.spmm.spmm_traffic_bytes`, u the element size, ib the
trainer's CSR index bytes)::

    floor = sum_i [bytes(z, r_d, r_o, c_i; b blocks) + bytes(z, r_o, r_d, c_i)] / (B 1e9) 1e3   [ms]
    spmm  = max(predicted, floor)      (a negative prediction counts as 0 before the max)

``spmm_floored`` marks the grids where the floor is above the model's prediction.
Without ``memory_bandwidth_gbps`` the floor is 0.

Communication (``comm_ms``): every collective of docs/model.md, Per-layer collectives, with the
padded sizes above, timed by :func:`plexus_tune.model.machine.precision_collective_time_ms` (ring
alpha-beta, topology of docs/model.md, Collectives, or the machine's measured table; a reduced
precision in the trainer's all-to-all scheme), M in bytes:

    forward   layer 0: all-gather F over d,  M = u g_d f c_0
              all-reduce H over o,           M = u r_d c_i   (b messages if blocked)
              all-gather W over d,           M = u g_d w c_o
              all-reduce Q over n,           M = u r_d c_o
    backward  reduce-scatter dW over d,      M = u g_d w c_o
              all-gather W over d,           M = u g_d w c_o
              all-reduce dH over o,          M = u r_d c_i
              layer 0: reduce-scatter dF over d, M = u g_d f c_0;
              other layers: all-reduce dF over d, M = u r_o c_i

              db all-reduce over d,          M = u c_o
    last layer, the sharded loss (classes over o, rows over d; FP32):
              all-reduce row maxima over o,  M = u r_d
              all-reduce row sums over o,    M = 2 u r_d
              all-reduce the loss sum over d, M = u

The W all-gather and dW reduce-scatter are always counted (W split over depth). The db
all-reduce and the loss's reductions are the trainer's; the paper's model (``padded``
false) leaves them out.
A profile with ``"padded_sizes": false`` (``perlmutter-paper``) divides exactly
instead of padding, reproducing the paper's communication model.
``comm_x_ms``/``comm_y_ms``/``comm_z_ms`` split the time by grid axis and
``all_reduce_ms``/``all_gather_ms``/``reduce_scatter_ms`` by collective kind.

Dense GEMM (``gemm_ms``): forward Q = H W_i, backward dW = H^T dQ and dH = dQ W^T,
each 2 r_d c_i c_o flops, at the machine's ``gemm_tflops``: 6 r_d c_i c_o / rate.

Other (``other_ms``, :mod:`plexus_tune.model.other`; docs/model.md, "Other"): the
elementwise passes of every layer (bias, activation forward and backward, loss) and
the gradient bookkeeping at the machine's ``elementwise_gbps``, the optimizer step over
every trainable tensor (input features included) at ``optimizer_gbps``, and the
trainer's synchronisations at ``sync_us`` each; 0 when the profile lacks
``elementwise_gbps``. ``other_elementwise_ms``, ``other_optimizer_ms`` and
``other_sync_ms`` add up to ``other_ms``.

``overhead_ms``: the profile's fixed ``epoch_overhead_ms`` (0 unless fitted from
trainer runs by ``plexus-tune fit``), the same for every grid.

Oversubscribed CPU hosts: a profile with ``host_cores`` (ranks are processes that
time-share a node's CPU cores) multiplies spmm, gemm, comm (and its splits) and
other by ``oversubscription`` = max(1, min(G, gpus_per_node) threads_per_rank /
host_cores) (:func:`plexus_tune.model.machine.oversubscription`); 1 for GPU profiles.
The component models themselves describe one rank running alone.

Communication precision (docs/comm-precision.md, "In the cost model"): each collective
above belongs to a class (aggregation: H and dH; combination: Q; gather: F, W, dW, dF)
sent at that class's precision: the ring moves M' = (M / u) b / 8 (+ 8 rows for intX, the
zero points and scales) instead of M, and ``quant_ms`` adds the encode and decode time of
the scheme at the machine's codec rates (0 at fp32): the profile's measured ``quant``
entry, else the estimate of :func:`plexus_tune.model.comm_precision.estimated_quant_entry`,
flagged in ``quant_estimated``.

``total_ms`` = spmm + gemm + comm + quant + other + overhead. Memory per GPU is
:func:`plexus_tune.model.memory.memory_bytes`; a grid is ``feasible`` when it fits the
machine's usable device memory.
"""

from __future__ import annotations

import numpy as np

from plexus_tune.model.comm_precision import (
    CommPrecision,
    parse_comm_precision,
    quant_time_ms,
)
from plexus_tune.errors import UserError
from plexus_tune.model.breakdown import BREAKDOWN_KEYS, COMM_OP_KEYS, TOTAL_PARTS
from plexus_tune.model.grid import AXIS_NAMES, axis_stride, enumerate_grids, format_grid
from plexus_tune.model.machine import GIB, Machine, load_machine, oversubscription, precision_collective_time_ms
from plexus_tune.model.memory import memory_breakdown
from plexus_tune.model.other import OTHER_PARTS, other_ms
from plexus_tune.model.shapes import csr_index_bytes, layer_shapes
from plexus_tune.model.spmm import predict_spmm_ms, spmm_traffic_bytes
from plexus_tune.model.volumes import FP32_CLASSES, LOSS_CLASS

#: Keys of every prediction, in report order.
PREDICTION_KEYS = ("gx", "gy", "gz", *BREAKDOWN_KEYS, "overhead_ms", "total_ms", *OTHER_PARTS,
                   "spmm_floor_ms", "spmm_floored", "oversubscription", "memory_bytes", "memory_gib", "feasible",
                   "quant_estimated")

#: Time components that the oversubscription factor stretches.
_STRETCHED_KEYS = (*BREAKDOWN_KEYS, "spmm_floor_ms", *OTHER_PARTS)


def _as_grids(grids) -> np.ndarray:
    if isinstance(grids, (int, np.integer)) and not isinstance(grids, bool):
        return enumerate_grids(int(grids))
    arr = np.asarray(grids, dtype=np.int64)
    if arr.ndim == 1 and arr.size == 3:
        arr = arr.reshape(1, 3)
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise UserError(f"grids must be a (K, 3) array of axis sizes, got shape {arr.shape}")
    if arr.size and arr.min() < 1:
        raise UserError("grid axis sizes must be at least 1")
    return arr


def _check_block_rows(block_rows):
    if block_rows is None:
        return None
    if isinstance(block_rows, bool) or int(block_rows) != block_rows or int(block_rows) < 1:
        raise UserError(f"block_rows must be a positive integer, got {block_rows!r}")
    return int(block_rows)


def predict_grids(workload, machine, grids, *, block_rows=None, padded=None,
                  comm_precision=None, optimizer=None, sparsity=None, fixed_features: bool = False,
                  overlap: bool = False) -> dict[str, np.ndarray]:
    """Predicted per-epoch breakdown (ms) and memory of every grid; keys :data:`PREDICTION_KEYS`.

    ``optimizer`` (a name of :data:`plexus_tune.model.other.OPTIMIZER_ACCESSES`; default
    the machine's, :attr:`Machine.optimizer`) sets the optimizer part of ``other_ms``.

    ``comm_precision`` (text or :class:`plexus_tune.model.comm_precision.CommPrecision`,
    default fp32) sends each collective class at its precision: the wire buffer
    :func:`~plexus_tune.model.comm_precision.wire_message_bytes` instead of M, in the
    trainer's scheme (:func:`~plexus_tune.model.machine.precision_collective_time_ms`), and
    ``quant_ms`` adds the codec time at the profile's ``quant`` rates
    (docs/comm-precision.md, "In the cost model").

    ``fixed_features``: the input features are not trained: layer 0 computes no dH or dF
    (no backward SpMM, its all-gather of W, all-reduce of dH and reduce-scatter of dF, a
    third of its GEMM flops) and the features have no gradient or optimizer state.
    ``overlap`` (with ``block_rows``): each forward row block's aggregation all-reduce runs
    under the next block's SpMM, hiding (b - 1) min(SpMM, all-reduce) of a block per layer
    from ``comm_ms`` (``overlap_hidden_ms``; docs/model.md, "Overlap").

    ``padded`` (default: the machine's ``padded_sizes``, normally True) chooses
    ceil(n / g) local sizes; False divides exactly, as the paper's model does
    (:func:`plexus_tune.model.shapes.layer_shapes`). Memory always uses padded sizes.

    ``sparsity`` (a :class:`plexus_tune.model.sparsity.GraphSparsity` of the graph) replaces
    the mean shard nonzeros z by the largest shard's and gives the SpMM model each
    operand's structure (docs/model.md, "Sparsity structure"); without it every shard
    holds z nonzeros placed uniformly at random.
    """
    machine = load_machine(machine) if not isinstance(machine, Machine) else machine
    choice = comm_precision if isinstance(comm_precision, CommPrecision) else parse_comm_precision(comm_precision or "fp32")
    quant_profile = machine.quant
    grids = _as_grids(grids)
    block_rows = _check_block_rows(block_rows)
    padded = machine.padded_sizes if padded is None else bool(padded)
    k = grids.shape[0]
    u = float(workload.bytes_per_element)
    shapes = layer_shapes(workload.nodes, workload.widths, grids, nnz=workload.nnz, padded=padded,
                          block_rows=block_rows)
    zeros = lambda: np.zeros(k, dtype=np.float64)  # noqa: E731
    comm_axis = [zeros(), zeros(), zeros()]
    comm_kind = {key[:-3]: zeros() for key in COMM_OP_KEYS}  # no broadcast or point-to-point on the 3D grid
    strides = [axis_stride(a, grids) for a in range(3)]
    gemm_flops = zeros()
    overlap_hidden = zeros()
    spmm = zeros()
    spmm_bytes = zeros()

    quant = zeros()

    def add(op, axis, message_bytes, rows, comm_class, messages=1):
        precision = "fp32" if comm_class in FP32_CLASSES else choice.of(comm_class)
        g = grids[:, axis]
        t = precision_collective_time_ms(machine, op, g, strides[axis], message_bytes, rows, precision, u, messages)
        comm_axis[axis] += t
        comm_kind[op] += t
        if precision != "fp32":
            quant[:] += quant_time_ms(quant_profile, precision, op, g, message_bytes * 4.0 / u, messages)
        return t

    for i, s in enumerate(shapes):
        o, inner, d = s.outer, s.inner, s.depth
        r_d, r_o, c_i, c_o, blocks = s.r_d, s.r_o, s.c_i, s.c_o, s.blocks
        h_bytes = u * r_d * c_i
        f_bytes = u * (s.features_gathered_rows if i == 0 else r_o) * c_i
        w_bytes = u * s.w_gathered_rows * c_o
        q_bytes = u * r_d * c_o
        # forward
        f_rows = s.features_gathered_rows if i == 0 else r_o
        if i == 0:
            add("all_gather", d, f_bytes, f_rows, "gather")
        aggregation_ms = add("all_reduce", o, h_bytes, r_d, "aggregation", blocks)
        add("all_gather", d, w_bytes, s.w_gathered_rows, "gather")
        add("all_reduce", inner, q_bytes, r_d, "combination")
        # backward; with fixed features layer 0 computes dW only (no dH, dF, nor its SpMM)
        feature_gradient = not (fixed_features and i == 0)
        add("reduce_scatter", d, w_bytes, s.w_gathered_rows, "gather")
        if padded:  # the trainer's db all-reduce (the paper's model leaves it out)
            add("all_reduce", d, u * c_o, 1, "gather")
        if feature_gradient:
            add("all_gather", d, w_bytes, s.w_gathered_rows, "gather")
            add("all_reduce", o, h_bytes, r_d, "aggregation")
            add("reduce_scatter" if i == 0 else "all_reduce", d, f_bytes, f_rows, "gather")

        gemm_flops += (6.0 if feature_gradient else 4.0) * r_d * c_i * c_o

        z = np.asarray(s.z, dtype=np.float64)
        forward = backward = None
        if sparsity is not None:  # the graph's own largest shard and its structure
            z, forward, backward = sparsity.layer(i, s.g_d, s.g_o)
        ib = csr_index_bytes(z, r_d, r_o)
        spmm_bytes += spmm_traffic_bytes(z, r_d, r_o, c_i, u, ib, blocks)
        block_ms = predict_spmm_ms(machine.spmm, z / blocks, s.block_rows, r_o, c_i, forward)
        spmm += blocks * block_ms
        if feature_gradient:
            spmm_bytes += spmm_traffic_bytes(z, r_o, r_d, c_i, u, ib)
            spmm += predict_spmm_ms(machine.spmm, z, r_o, r_d, c_i, backward, backward=True)
        if overlap:
            # block k's all-reduce runs under block k+1's SpMM: (b - 1) min(SpMM, all-reduce) of a block hidden
            hidden = (blocks - 1) * np.minimum(np.maximum(block_ms, 0.0), aggregation_ms / blocks)
            overlap_hidden = overlap_hidden + hidden
            comm_axis[o] -= hidden
            comm_kind["all_reduce"] -= hidden

    if padded:  # the trainer's sharded loss (volumes.loss_calls): classes over o, rows over d of the last layer
        last = shapes[-1]
        for elements in (last.r_d, 2 * last.r_d):  # row maxima, row sums
            add("all_reduce", last.outer, u * elements, last.r_d, LOSS_CLASS)
        add("all_reduce", last.depth, u, 1, LOSS_CLASS)  # the loss sum

    clipped = spmm < 0
    bandwidth = machine.memory_bandwidth_gbps
    floor = spmm_bytes / (bandwidth * 1e9) * 1e3 if bandwidth else zeros()
    floored = floor > spmm
    spmm = np.maximum(np.maximum(spmm, 0.0), floor)
    gemm = gemm_flops / (machine.gemm_tflops * 1e12) * 1e3
    other = other_ms(shapes, u, elementwise_gbps=machine.elementwise_gbps, optimizer_gbps=machine.optimizer_gbps,
                     sync_us=machine.sync_us, optimizer=optimizer or machine.optimizer, fixed_features=fixed_features)
    comm = comm_axis[0] + comm_axis[1] + comm_axis[2]
    mem = memory_breakdown(workload, grids, block_rows=block_rows, fixed_features=fixed_features)["total"]
    out = {
        "gx": grids[:, 0].copy(), "gy": grids[:, 1].copy(), "gz": grids[:, 2].copy(),
        "spmm_ms": np.asarray(spmm, dtype=np.float64), "spmm_floor_ms": floor, "gemm_ms": gemm, "comm_ms": comm,
    }
    for a, name in enumerate(AXIS_NAMES):
        out[f"comm_{name}_ms"] = comm_axis[a]
    for op, t in comm_kind.items():
        out[f"{op}_ms"] = t
    out["quant_ms"] = quant
    for key in ("other_ms", *OTHER_PARTS):
        out[key] = zeros() + other[key]
    stretch = oversubscription(machine, np.prod(grids, axis=1))
    for key in _STRETCHED_KEYS:
        out[key] = out[key] * stretch
    out["oversubscription"] = stretch
    out["overhead_ms"] = np.full(k, machine.epoch_overhead_ms, dtype=np.float64)
    out["total_ms"] = sum(out[key] for key in TOTAL_PARTS)
    out["memory_bytes"] = mem
    out["memory_gib"] = mem / GIB
    out["feasible"] = mem <= machine.usable_memory_bytes
    out["spmm_clipped"] = clipped
    out["spmm_floored"] = floored
    out["quant_estimated"] = (out["quant_ms"] > 0) & codec_estimated(machine, choice)
    out["overlap_hidden_ms"] = overlap_hidden * stretch
    return out


def codec_estimated(machine: Machine, choice: CommPrecision) -> bool:
    """Whether a precision of ``choice`` uses codec rates ``machine`` estimates (docs/comm-precision.md)."""
    return any(p in machine.quant_estimated for p in choice.as_dict().values())


def rank_order(pred: dict) -> np.ndarray:
    """Indices ranking grids: feasible ones first, each group by increasing total_ms."""
    total = np.asarray(pred["total_ms"], dtype=np.float64)
    feasible = np.asarray(pred["feasible"], dtype=bool)
    return np.lexsort((total, ~feasible))


def prediction_records(pred: dict, order=None, top: int | None = None) -> list[dict]:
    """Plain-Python records (JSON-ready) in ``order`` (default :func:`rank_order`), the first ``top``."""
    order = rank_order(pred) if order is None else np.asarray(order)
    if top:
        order = order[:top]
    records = []
    for rank, idx in enumerate(order, start=1):
        rec = {"rank": rank, "grid": format_grid((pred["gx"][idx], pred["gy"][idx], pred["gz"][idx]))}
        for key in PREDICTION_KEYS:
            value = pred[key][idx]
            if key in ("gx", "gy", "gz"):
                rec[key] = int(value)
            elif key in ("feasible", "spmm_floored", "quant_estimated"):
                rec[key] = bool(value)
            elif key == "memory_bytes":
                rec[key] = int(round(float(value)))
            else:
                rec[key] = float(value)
        records.append(rec)
    return records
