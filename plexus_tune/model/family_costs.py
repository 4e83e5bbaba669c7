"""Epoch-time and memory models of the CAGNET and SuperGCN families (docs/model.md,
"Other algorithm families"), with the parts and keys of the Plexus 3D model.

The family classes of :mod:`plexus_tune.model.family` call these functions, one
configuration at a time; each returns the keys of
:data:`plexus_tune.model.costs.PREDICTION_KEYS` plus ``broadcast_ms``,
``point_to_point_ms``, ``volume_bytes`` (the most any rank sends per epoch) and
``estimated`` (True where partition-dependent figures were estimated, not computed from
a graph).

Parts, per rank (the busiest one where ranks differ):

- communication: every :class:`plexus_tune.model.volumes.CommCall` of the family's
  schedule, timed by the machine's network model: collectives as for Plexus; a
  broadcast of M bytes on g ranks as a pipelined ring, (g-1) alpha + M / beta; the
  point-to-point exchange per rank p (:func:`point_to_point_ms`), both with their own
  calibrated tier parameters where the profile has them (``collectives.op_tiers``); each collective
  class at its communication precision (wire bytes and codec time as for Plexus);
  sparse pieces always at their own size;
- SpMM: the machine's per-SpMM model on each local product, floored at the memory
  traffic bound (as for Plexus);
- GEMM: 6 rows D_in D_out flops per layer at ``gemm_tflops``;
- other: :func:`plexus_tune.model.other.other_ms` (elementwise passes, optimizer, syncs) on
  the rank's rows, weight columns and input-feature block;
- memory: adjacency, weights (value, gradient, two moments), trainable input
  features, activations, receive buffers, labels (docs/model.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from plexus_tune.model.comm_precision import (
    CommPrecision,
    quant_rates,
    quant_time_ms,
    wire_message_bytes,
)
from plexus_tune.errors import UserError
from plexus_tune.graph.partition import check_aggregation
from plexus_tune.model.breakdown import BREAKDOWN_KEYS, COMM_AXIS_KEYS, COMM_OP_KEYS, TOTAL_PARTS
from plexus_tune.model.collectives import Network, exchange_time_ms
from plexus_tune.model.costs import codec_estimated
from plexus_tune.model.machine import GIB, Machine, oversubscription, precision_collective_time_ms
from plexus_tune.model.other import OTHER_PARTS, other_ms
from plexus_tune.model.shapes import ceil_div, csr_bytes, csr_index_bytes
from plexus_tune.model.spmm import predict_spmm_ms, spmm_traffic_bytes
from plexus_tune.model.volumes import (
    FP32_CLASSES,
    VOLUME_CLASSES,
    cagnet_15d_schedule,
    cagnet_summa_schedule,
    check_replication,
    check_schedule,
    loss_calls,
    summa_piece_shape,
    summa_sizes,
    supergcn_schedule,
    UniformExchange,
)

#: Times the oversubscription factor stretches.
_TIME_KEYS = (*BREAKDOWN_KEYS, "spmm_floor_ms", *OTHER_PARTS)
#: Memory parts, as :func:`plexus_tune.model.memory.memory_breakdown`.
MEMORY_PARTS = ("adjacency", "weights", "features", "activations", "gathered", "labels")


# ----------------------------------------------------------------------------- network


def _network(machine: Machine) -> Network:
    return machine.network or Network.from_checked(machine.collectives, machine.gpus_per_node)


def exchange_stats(pair_rows, gpus_per_node: int, sharing: bool = True) -> dict[str, np.ndarray]:
    """Per-rank figures of a point-to-point exchange (``pair_rows[p, q]`` rows p sends q):
    rows and messages to ranks of its own node (intra) and of other nodes (inter), the
    rows it receives, and ``share``: how many times its own inter-node rows the node's link
    carries until its last row is through, with every sender of the node starting at once
    and the link shared fairly (processor sharing)::

        share_p = sum over q of p's node of min(R_q, R_p) / R_p     (R: inter-node rows)

    the number of inter-node senders of the node when they send alike; a rank that sends
    the most waits for the node's whole inter-node volume. 1 without ``sharing``."""
    n = int(gpus_per_node)
    if isinstance(pair_rows, UniformExchange):
        g, r = pair_rows.parts, float(pair_rows.rows)
        local = min(n, g)
        ones = np.ones(g)
        sends = 1.0 if r > 0 else 0.0
        return {"intra_rows": r * (local - 1) * ones, "inter_rows": r * (g - local) * ones,
                "intra_msgs": sends * (local - 1) * ones, "inter_msgs": sends * (g - local) * ones,
                "share": (local if (sharing and g > local and r > 0) else 1.0) * ones,
                "recv_rows": r * (g - 1) * ones}
    mat = np.asarray(pair_rows, dtype=np.float64)
    g = mat.shape[0]
    node = np.arange(g) // n
    same = node[:, None] == node[None, :]
    active = mat > 0
    np.fill_diagonal(active, False)
    inter_active = active & ~same
    off = np.where(active, mat, 0.0)
    inter_rows = np.where(~same, off, 0.0).sum(axis=1)
    share = np.ones(g)
    if sharing:
        carried = np.where(same, np.minimum(inter_rows[None, :], inter_rows[:, None]), 0.0).sum(axis=1)
        share = np.where(inter_rows > 0, carried / np.maximum(inter_rows, 1e-300), 1.0)
    return {"intra_rows": np.where(same, off, 0.0).sum(axis=1), "inter_rows": inter_rows,
            "intra_msgs": (active & same).sum(axis=1).astype(np.float64),
            "inter_msgs": inter_active.sum(axis=1).astype(np.float64), "share": share, "recv_rows": off.sum(axis=0)}


def point_to_point_ms(machine: Machine, stats: Mapping, row_bytes: float) -> float:
    """Time (ms) of an exchange of rows of ``row_bytes`` bytes with the :func:`exchange_stats` ``stats``.

    Per sender p (node of p: p // gpus_per_node), every message is one send::

        T_p = m_intra alpha_intra + R_intra w / beta_intra + m_inter alpha_inter + R_inter w s_p / beta_inter

    m and R the messages and rows p sends inside its node and to other nodes, w the row
    bytes, s_p p's share of its node's link (:func:`exchange_stats`: the node's inter-node
    senders when they send alike, fair sharing otherwise; 1 without ``sharing``). The exchange takes max_p T_p (SuperGCN's
    bottleneck form), with the point_to_point tiers of the machine's network
    (:meth:`plexus_tune.model.collectives.Network.tiers`).
    """
    tiers = _network(machine).tiers("point_to_point")
    t = exchange_time_ms(tiers, stats["intra_msgs"], stats["inter_msgs"], row_bytes * stats["intra_rows"],
                         row_bytes * stats["inter_rows"] * stats["share"])
    return float(t.max()) if t.size else 0.0


def _codec_ms(rates, encoded_bytes, decoded_bytes):
    """Codec time (ms) of ``encoded_bytes`` and ``decoded_bytes`` FP32 bytes at the (encode, decode,
    call) ``rates``: a broadcast or an exchange at a reduced precision makes the process-group calls
    it makes at FP32, so the per-call time of the collective schemes (``call_ms``) is not added."""
    if rates is None:
        return 0.0
    return (encoded_bytes / (rates[0] * 1e9) + decoded_bytes / (rates[1] * 1e9)) * 1e3


def schedule_times(machine: Machine, calls, choice: CommPrecision, u: float) -> dict[str, float]:
    """Communication and codec time (ms) of a schedule, split by axis and operation.

    Collectives of one operation and precision are timed in one vectorized call of the
    network model, a reduced precision in the trainer's scheme
    (:func:`plexus_tune.model.machine.precision_collective_time_ms`);
    a broadcast of M bytes on g ranks takes (g-1) alpha + M / beta with the broadcast's
    tier parameters (the collectives' where the profile has none). Codec per call, times the
    calls: a collective's :func:`quant_time_ms`; a broadcast's M / g encoded and (g-1)/g M
    decoded (a rank is the root of 1 in g); an exchange's rows the busiest rank sends and
    receives; broadcasts and exchanges add no ``call_ms`` (no process-group call beyond FP32's)."""
    out = dict.fromkeys(("comm_ms", *COMM_AXIS_KEYS, *COMM_OP_KEYS, "quant_ms"), 0.0)
    quant = machine.quant
    net = _network(machine)
    batches: dict[str, list] = {}
    stats_of: dict[int, dict] = {}
    for call in calls:
        precision = "fp32" if call.comm_class in FP32_CLASSES else choice.of(call.comm_class)
        g = call.group_size
        if g <= 1 or call.calls == 0:
            continue
        if call.op == "point_to_point":
            key = id(call.pair_rows)
            if key not in stats_of:
                stats_of[key] = exchange_stats(call.pair_rows, machine.gpus_per_node, net.sharing)
            stats = stats_of[key]
            w = call.row_bytes if precision == "fp32" else float(wire_message_bytes(call.row_bytes, 1, precision, u))
            t = point_to_point_ms(machine, stats, w)
            q = 0.0
            if precision != "fp32":
                sent = stats["intra_rows"] + stats["inter_rows"]
                worst = int(np.argmax(sent + stats["recv_rows"]))
                scale = call.row_bytes * 4.0 / u
                q = _codec_ms(quant_rates(quant, precision), sent[worst] * scale, stats["recv_rows"][worst] * scale)
            out["comm_ms"] += t
            out[COMM_AXIS_KEYS[call.axis]] += t
            out["point_to_point_ms"] += t
            out["quant_ms"] += q
            continue
        m = call.message_bytes
        if call.op == "broadcast":  # the root's block sent as it is encoded, once per member
            wire = m if precision == "fp32" else float(wire_message_bytes(m, call.rows, precision, u))
            if precision != "fp32":  # per call a rank encodes as the root (1 in g) or decodes M
                fp32_bytes = m * 4.0 / u
                out["quant_ms"] += call.calls * _codec_ms(quant_rates(quant, precision), fp32_bytes / g,
                                                          (g - 1) / g * fp32_bytes)
            key, size = ("broadcast", "fp32"), wire
        else:
            if precision != "fp32":  # each of the calls sends the whole buffer, in `messages` sends
                out["quant_ms"] += call.calls * float(quant_time_ms(quant, precision, call.op, g, m * 4.0 / u,
                                                                    call.messages))
            key, size = (call.op, precision), m
        batches.setdefault(key, []).append((g, call.stride, size, call.rows, call.calls, call.axis, call.op,
                                            call.messages))
    for (timed_op, precision), rows in batches.items():
        g, stride, size, nrows, count, axis, op, messages = (np.asarray(col) for col in zip(*rows))
        times = np.asarray(precision_collective_time_ms(machine, timed_op, g, stride, size, nrows, precision, u, messages),
                           dtype=np.float64) * count
        for t, a, o in zip(times.tolist(), axis.tolist(), op.tolist()):
            out["comm_ms"] += t
            out[COMM_AXIS_KEYS[a]] += t
            out[f"{o}_ms"] += t
    return out


# ----------------------------------------------------------------------------- per family


def _spmm(machine, nnz, rows, common, cols, u, calls=1, backward=False):
    """(model ms, floor bytes) of ``calls`` equal local SpMMs (``backward``: a layer's A^T dH)."""
    ib = csr_index_bytes(nnz, rows, common)
    t = float(predict_spmm_ms(machine.spmm, nnz, rows, common, cols, backward=backward)) * calls
    traffic = float(spmm_traffic_bytes(nnz, rows, common, cols, u, ib)) * calls
    return t, traffic


def _weights_elements(widths, cols_of=lambda d: d):
    return sum((int(widths[i]) + 1) * cols_of(int(widths[i + 1])) for i in range(len(widths) - 1))


class _Shape(NamedTuple):
    """A layer's local sizes as :func:`plexus_tune.model.other.other_ms` reads them."""

    layer: int
    r_d: float  # rows of the layer's output on the rank
    c_o: float  # its columns
    w_rows: float  # rows of W_i the rank updates
    c_i: float  # columns of the input features (layer 0)
    feature_rows: float  # rows of the input features the rank updates


def _shapes(widths, rows, feature_rows, cols_of=lambda d: d):
    return [_Shape(i, float(rows), float(cols_of(int(widths[i + 1]))), float(widths[i]), float(cols_of(int(widths[0]))),
                   float(feature_rows)) for i in range(len(widths) - 1)]


def _finish(machine, workload, grid, times, spmm_ms, floor_bytes, gemm_flops, shapes, memory, volume, estimated,
            optimizer=None, choice=None, fixed_features=False):
    u = workload.bytes_per_element
    bandwidth = machine.memory_bandwidth_gbps
    floor = floor_bytes / (bandwidth * 1e9) * 1e3 if bandwidth else 0.0
    spmm = max(max(spmm_ms, 0.0), floor)
    out = dict(times)
    out["spmm_ms"] = spmm
    out["spmm_floor_ms"] = floor
    out["spmm_floored"] = floor > spmm_ms
    out["spmm_clipped"] = spmm_ms < 0
    out["gemm_ms"] = gemm_flops / (machine.gemm_tflops * 1e12) * 1e3
    other = other_ms(shapes, u, elementwise_gbps=machine.elementwise_gbps, optimizer_gbps=machine.optimizer_gbps,
                     sync_us=machine.sync_us, optimizer=optimizer or machine.optimizer, fixed_features=fixed_features)
    for key in ("other_ms", *OTHER_PARTS):
        out[key] = float(other[key])
    gpus = int(np.prod(grid))
    stretch = float(oversubscription(machine, np.asarray([gpus]))[0])
    for key in _TIME_KEYS:
        out[key] = out[key] * stretch
    out["oversubscription"] = stretch
    out["overhead_ms"] = machine.epoch_overhead_ms
    out["total_ms"] = sum(out[key] for key in TOTAL_PARTS)
    total = sum(memory.values())
    out["memory_bytes"] = total
    out["memory_gib"] = total / GIB
    out["feasible"] = total <= machine.usable_memory_bytes
    for part in MEMORY_PARTS:
        out[f"memory_{part}_bytes"] = memory[part]
    out["volume_bytes"] = volume
    out["estimated"] = estimated
    out["quant_estimated"] = bool(out["quant_ms"] > 0 and choice is not None and codec_estimated(machine, choice))
    out["gx"], out["gy"], out["gz"] = (int(g) for g in grid)
    del u
    return out


def _max_volume(calls, gpus):
    per_rank = np.zeros(gpus)
    for call in calls:
        if call.comm_class in VOLUME_CLASSES:
            per_rank += call.sent_bytes
    return float(per_rank.max()) if gpus else 0.0


def cagnet_15d_config(workload, machine, gpus: int, c: int, choice: CommPrecision, optimizer=None, blocks=None,
                      fixed_features: bool = False) -> dict:
    """Prediction of CAGNET 1.5D (1D at c = 1) on (G/c) x c ranks. ``blocks``: (A, A^T) nonzeros
    of the r x r blocks of b = ceil(N / r) rows from a graph (:meth:`PiecePattern.pieces` (r, r));
    rank (i, j) multiplies the blocks (i, k) of its stages k in [j r / c, (j+1) r / c), and the
    busiest rank's SpMM time is taken; else NNZ / r^2 per block. ``fixed_features``: layer 0
    computes no feature gradient (:func:`feature_gradient_dropped`)."""
    c = check_replication(gpus, c)
    r = gpus // c
    n, nnz, widths, u = workload.nodes, workload.nnz, workload.widths, workload.bytes_per_element
    b = ceil_div(n, r)
    stage_sets = [range(j * r // c, (j + 1) * r // c) for j in range(c)]
    stages = max(len(k) for k in stage_sets)
    calls = feature_gradient_dropped(cagnet_15d_schedule(n, widths, gpus, c, u), fixed_features)
    # the loss: classes whole on every rank, rows split over the R ranks of a process column
    times = schedule_times(machine, calls + loss_calls(b, (2, 1, gpus), [(0, r, c)], gpus, u), choice, u)
    flops = act = 0.0
    if blocks is not None:
        # per rank (i, j): the blocks (i, k) of its stages; forward A, backward A^T
        mine = [[np.asarray(a, dtype=np.float64).reshape(r, r)[:, list(k)] for k in stage_sets] for a in blocks]
        spmm_rank = np.zeros((r, c))
        floor_rank = np.zeros((r, c))
        for i in range(workload.layers):
            for backward, direction in zip((False, True), mine):
                if backward and fixed_features and i == 0:
                    continue  # no feature gradient
                for j, z in enumerate(direction):
                    t, f = _pieces_spmm(machine, z, b, b, widths[i], u, backward=backward)
                    spmm_rank[:, j] += t
                    floor_rank[:, j] += f
        busiest = np.unravel_index(int(np.argmax(spmm_rank)), spmm_rank.shape)
        spmm, floor = float(spmm_rank[busiest]), float(floor_rank[busiest])
        z_rank = float(max(np.asarray(blocks[0], dtype=np.float64).reshape(r, r)[:, list(k)].sum(axis=1).max()
                           for k in stage_sets))
    else:
        z_stage = nnz / (r * r)
        spmm = floor = 0.0
        for i in range(workload.layers):
            for backward in (False, True) if not (fixed_features and i == 0) else (False,):
                t, f = _spmm(machine, z_stage, b, b, widths[i], u, stages, backward)
                spmm += t
                floor += f
        z_rank = nnz * stages / (r * r)
    for i in range(workload.layers):
        d_in, d_out = widths[i], widths[i + 1]
        flops += (4.0 if fixed_features and i == 0 else 6.0) * b * d_in * d_out
        act += (2.0 * b * d_in + 2.0 * b * d_out) * u
    params = _weights_elements(widths)
    ib = csr_index_bytes(z_rank, b, n)
    memory = {
        "adjacency": 2.0 * csr_bytes(z_rank, b * stages, u, ib, stages),
        "weights": 4.0 * params * u,
        "features": (1.0 if fixed_features else 4.0) * b * widths[0] * u,
        "activations": act,
        "gathered": float(max(widths[:-1])) * b * u if r > 1 else 0.0,
        "labels": 8.0 * b,
    }
    return _finish(machine, workload, (r, c, 1), times, spmm, floor, flops, _shapes(widths, b, b), memory,
                   _max_volume(calls, gpus), False, optimizer, choice, fixed_features)


def cagnet_summa_config(workload, machine, pr: int, pc: int, pl: int, choice: CommPrecision, pieces=None,
                        optimizer=None, schedule: str = "bundled", fixed_features: bool = False) -> dict:
    """Prediction of CAGNET 2D (pl = 1) or split-3D on Pr x Pc x Pl ranks. ``pieces``: (A, A^T)
    piece nonzeros from a graph (:func:`plexus_tune.graph.partition.summa_piece_nnz`): the
    SpMM time is the busiest block row's sum over its q pieces; else NNZ spread evenly. Split-3D's
    backward multiplies the pieces' transposes (N'/(Pl q) x rb each)."""
    n, nnz, widths, u = workload.nodes, workload.nnz, workload.widths, workload.bytes_per_element
    gpus = pr * pc * pl
    a_pieces, at_pieces = pieces if pieces is not None else (None, None)
    calls = cagnet_summa_schedule(n, widths, pr, pc, pl, bytes_per_element=u, a_pieces=a_pieces,
                                  at_pieces=at_pieces, nnz=nnz, schedule=schedule)
    calls = feature_gradient_dropped(calls, fixed_features)
    sizes = summa_sizes(n, pr, pc, pl)
    q, rb, rf, piece = sizes["q"], sizes["rb"], sizes["rf"], sizes["piece"]
    # the bundled trainers' loss: classes split over the row (Pc), rows over the column and the fibre;
    # the paper's schedule counts its own (log_softmax all-gather)
    bundled = check_schedule(schedule) == "bundled"
    loss = loss_calls(rf, (1, pc, 1), [(0, pr, pc), (2, pl, pr * pc)], gpus, u) if bundled else []
    times = schedule_times(machine, calls + loss, choice, u)
    if a_pieces is not None:
        z_piece = float(np.max(a_pieces))
        z_rank = float(np.asarray(a_pieces).reshape(pl, pr, pc, q // pc).sum(axis=3).max())
    else:
        z_piece = nnz / (pr * pl * q)
        z_rank = nnz / gpus
    spmm = floor = flops = act = 0.0
    gathered = 0.0
    if a_pieces is not None:  # every rank of block row i (mesh layer l) multiplies the pieces (l, i, s)
        per_row = np.zeros((pl, pr))
        floor_row = np.zeros((pl, pr))
        for i in range(workload.layers):
            for backward, z in ((False, a_pieces), (True, at_pieces)):
                if backward and fixed_features and i == 0:
                    continue  # no feature gradient
                rows, common = summa_piece_shape(sizes, pl, backward)
                t, f = _pieces_spmm(machine, np.asarray(z, dtype=np.float64), rows, common, ceil_div(widths[i], pc), u,
                                    backward=backward)
                per_row += t
                floor_row += f
        busiest = np.unravel_index(int(np.argmax(per_row)), per_row.shape)
        spmm, floor = float(per_row[busiest]), float(floor_row[busiest])
    for i in range(workload.layers):
        d_in = ceil_div(widths[i], pc)
        d_out = ceil_div(widths[i + 1], pc)
        if a_pieces is None:
            for backward in (False, True) if not (fixed_features and i == 0) else (False,):
                rows, common = summa_piece_shape(sizes, pl, backward)
                t, f = _spmm(machine, z_piece, rows, common, d_in, u, q, backward)
                spmm += t
                floor += f
        flops += (4.0 if fixed_features and i == 0 else 6.0) * rf * pc * d_in * d_out
        act += (2.0 * rb * d_in * (pl > 1) + 2.0 * rf * pc * d_in + 2.0 * rf * d_out) * u
        gathered = max(gathered, piece * d_in * u + float(csr_bytes(z_piece, rb, u, 4)))
    params = _weights_elements(widths, lambda d: ceil_div(d, pc))
    memory = {
        "adjacency": 2.0 * float(csr_bytes(z_rank, rb * (q // pc), u, csr_index_bytes(z_rank, rb, n), q // pc)),
        "weights": 4.0 * params * u,
        "features": (1.0 if fixed_features else 4.0) * rf * ceil_div(widths[0], pc) * u,
        "activations": act,
        "gathered": gathered if gpus > 1 else 0.0,
        "labels": 8.0 * rf,
    }
    return _finish(machine, workload, (pr, pc, pl), times, spmm, floor, flops,
                   _shapes(widths, rf, rf, lambda d: ceil_div(d, pc)), memory,
                   _max_volume(calls, gpus), a_pieces is None and pc > 1, optimizer, choice, fixed_features)


def feature_gradient_dropped(calls, fixed_features: bool):
    """``calls`` without what only the input features' gradient needs when they are fixed: layer 0's
    backward communication other than its weight gradient (``gather`` class)."""
    if not fixed_features:
        return calls
    return [c for c in calls if not (c.name.startswith("layer 0 ") and c.direction == "backward"
                                     and c.comm_class != "gather")]


def estimated_boundary_rows(nodes: int, nnz: int, parts: int) -> UniformExchange:
    """Boundary rows (P, P) per aggregation when no graph is given: the documented estimate.

    Nodes assigned to parts at random (no partitioner): the E = NNZ - N off-diagonal
    nonzeros spread evenly, E / P^2 per ordered pair, each pair's N/P possible sources
    hit E / P^2 times at random, so post = pre = (N/P)(1 - exp(-E / (P N))) rows per pair;
    hybrid is taken equal (no gain assumed). An upper bound on what METIS achieves on a
    graph with locality (docs/model.md, SuperGCN).
    """
    if parts <= 1:
        return UniformExchange(1, 0.0)
    per_part = nodes / parts
    edges = max(nnz - nodes, 0) / parts**2
    return UniformExchange(int(parts), per_part * (1.0 - math.exp(-edges / per_part)))


def _pieces_spmm(machine, nnz, rows, common, cols, u, used=None, *, backward=False):
    """(model ms, floor bytes) of one SpMM per entry of the broadcast shape arrays, summed over
    the last axis; entries where ``used`` is False cost nothing (no call is made);
    ``backward``: the SpMMs are a layer's backward ones."""
    nnz, rows, common = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64) for a in (nnz, rows, common)))
    if used is not None:  # shapes of calls not made stay valid for the model
        nnz, rows, common = (np.where(used, a, 1.0) for a in (nnz, rows, common))
    ib = csr_index_bytes(nnz, rows, common)
    t = predict_spmm_ms(machine.spmm, nnz, rows, common, cols, backward=backward)
    f = spmm_traffic_bytes(nnz, rows, common, cols, u, ib)
    if used is not None:
        t, f = np.where(used, t, 0.0), np.where(used, f, 0.0)
    return t.sum(axis=-1), f.sum(axis=-1)


def _partition_spmm(machine, parts: dict, nodes_p, widths, layers: int, u,
                    fixed_features: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per part, the SpMMs of the partitioned trainer over all layers (docs/model.md, SuperGCN):
    forward A_pp H_p, each pre-aggregation P_pq H_p (pre_rows x n_p) and each scatter of a
    received message (n_p x message rows); backward their transposes. (ms, floor bytes) arrays."""
    n = np.asarray(nodes_p, dtype=np.float64)
    local = parts["local_nnz"].astype(np.float64)
    pre_e, pre_r = parts["pre_edges"].astype(np.float64), parts["pre_rows"].astype(np.float64)
    post_e, post_r = parts["post_edges"].astype(np.float64), parts["post_rows"].astype(np.float64)
    msg_rows = (pre_r + post_r).T  # [p, q]: rows p receives from q
    msg_nnz = (post_e + pre_r).T
    total_t = np.zeros(n.size)
    total_f = np.zeros(n.size)
    for i in range(layers):
        d = widths[i]
        for backward, rows_pre, common_pre, rows_msg, common_msg in ((False, pre_r, n[:, None], n[:, None], msg_rows),
                                                                     (True, n[:, None], pre_r, msg_rows, n[:, None])):
            if backward and fixed_features and i == 0:
                continue  # no feature gradient
            t0, f0 = _pieces_spmm(machine, local[:, None], n[:, None], n[:, None], d, u, backward=backward)
            t1, f1 = _pieces_spmm(machine, pre_e, rows_pre, common_pre, d, u, pre_e > 0, backward=backward)
            t2, f2 = _pieces_spmm(machine, msg_nnz, rows_msg, common_msg, d, u, msg_rows > 0, backward=backward)
            total_t += t0 + t1 + t2
            total_f += f0 + f1 + f2
    return total_t, total_f


def supergcn_config(workload, machine, gpus: int, mode: str, choice: CommPrecision, plan=None, optimizer=None,
                    fixed_features: bool = False) -> dict:
    """Prediction of the partitioned GCN on G ranks, ``mode`` pre, post or hybrid; ``plan`` an
    :class:`plexus_tune.graph.partition.ExchangePlan` of G parts, else the estimate."""
    mode = check_aggregation(mode)
    n, nnz, widths, u = workload.nodes, workload.nnz, workload.widths, workload.bytes_per_element
    if plan is not None:
        if plan.parts != gpus:
            raise UserError(f"the partition has {plan.parts} parts but the run has {gpus} GPUs; partition into {gpus}")
        rows = plan.forward_rows(mode).astype(np.float64)
        nodes_p = plan.nodes.astype(np.float64)
        local_nnz = plan.local_nnz.astype(np.float64)
    else:
        rows = estimated_boundary_rows(n, nnz, gpus)
        nodes_p = np.full(gpus, float(ceil_div(n, gpus)))
        local_nnz = np.full(gpus, nnz / gpus)
    calls = feature_gradient_dropped(supergcn_schedule(widths, rows, u), fixed_features)
    # the loss: classes whole, rows split over all P ranks
    loss = loss_calls(float(nodes_p.max()), (1, 1, 1), [(0, gpus, 1)], gpus, u)
    times = schedule_times(machine, calls + loss, choice, u)
    if isinstance(rows, UniformExchange):
        sent = recv = rows.sent()
    else:
        recv, sent = rows.sum(axis=0) - np.diag(rows), rows.sum(axis=1) - np.diag(rows)
    if plan is not None:
        spmm_p, floor_p = _partition_spmm(machine, plan.spmm_parts(mode), nodes_p, widths, workload.layers, u,
                                          fixed_features)
    else:
        spmm_p = np.zeros(gpus)
        floor_p = np.zeros(gpus)
        ib = csr_index_bytes(local_nnz, nodes_p, nodes_p + recv)
        for i in range(workload.layers):
            directions = (False,) if fixed_features and i == 0 else (False, True)  # forward A F, backward A^T dH
            t = sum(predict_spmm_ms(machine.spmm, local_nnz, nodes_p, nodes_p + recv, widths[i], backward=back)
                    for back in directions)
            f = spmm_traffic_bytes(local_nnz, nodes_p, nodes_p + recv, widths[i], u, ib)
            spmm_p += t
            floor_p += len(directions) * f
    rate = (machine.memory_bandwidth_gbps or 0.0) * 1e9
    floor_ms = floor_p / rate * 1e3 if rate else np.zeros(gpus)
    busiest = int(np.argmax(np.maximum(spmm_p, floor_ms)))
    n_max = float(nodes_p.max())
    flops = sum((4.0 if fixed_features and i == 0 else 6.0) * n_max * widths[i] * widths[i + 1]
                for i in range(workload.layers))
    params = _weights_elements(widths)
    z = float(local_nnz.max())
    halo = float((recv + sent).max())
    memory = {
        "adjacency": 2.0 * float(csr_bytes(z, n_max, u, csr_index_bytes(z, n_max, n))),
        "weights": 4.0 * params * u,
        "features": (1.0 if fixed_features else 4.0) * n_max * widths[0] * u,
        "activations": sum((2.0 * n_max * widths[i] + 2.0 * n_max * widths[i + 1]) * u for i in range(workload.layers)),
        "gathered": halo * max(widths[:-1]) * u,
        "labels": 8.0 * n_max,
    }
    return _finish(machine, workload, (gpus, 1, 1), times, float(spmm_p[busiest]), float(floor_p[busiest]), flops,
                   _shapes(widths, n_max, n_max), memory, _max_volume(calls, gpus), plan is None, optimizer, choice,
                   fixed_features)

