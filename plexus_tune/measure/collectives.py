"""Collective microbenchmarks that calibrate a machine profile's network (``calibrate collectives``).

:func:`calibrate_collectives` starts G ranks with a launcher (:mod:`plexus_tune.launch.launchers`:
local processes, torchrun agents, an emulated cluster, Slurm; gloo on CPU, nccl on GPUs)
and, for every (group size g, stride p) an axis of some grid of G can have, splits the G
ranks into the G / g groups of that axis (ranks r, r + p, ..., the placement rank =
z Gx Gy + x Gy + y) and times all-reduce, all-gather and reduce-scatter on all groups at
once, as training does (``concurrent``), and on one group while the others wait
(``alone``; by default only when the ranks span several nodes): the ratio of the two is
the link sharing of eq. 4.6. Besides the collectives, the families' operations:
``broadcast`` (one root's buffer to its group, the root moving round the group call by
call, as the CAGNET trainers broadcast each block row from its owner) and
``point_to_point`` (every member sends M / g bytes to each other member at once with
batched isend/irecv, as the partitioned trainer exchanges its boundary rows). Per message size: warm-up calls, then ``repeats`` timed
calls each started after a barrier; a call's time is the slowest taking part, the
reported time is the median over calls. M is the full buffer (the reduced or gathered
result; a broadcast's buffer; a point-to-point exchange's send buffer per rank, own block
included); algbw = M / t and busbw = algbw * 2(g-1)/g for all-reduce, 1 for broadcast,
(g-1)/g for the others (nccl-tests; point_to_point as its alltoall). Records (schema collective of :mod:`plexus_tune.measure.records`;
docs/records.md) say where the active groups sat: nodes spanned, ranks per node, groups
sharing a node's NICs (``concurrent``), from the node each rank ran on (on one host:
blocks of ``gpus_per_node`` consecutive ranks).
"""

from __future__ import annotations

import statistics
import time
import warnings

import numpy as np

from plexus_tune.model.comm_precision import check_backend, parse_precision
from plexus_tune.errors import UserError
from plexus_tune.launch import RankFailure, default_threads_per_rank
from plexus_tune.launch.launchers import Launcher
from plexus_tune.measure.placement import placement_fields
from plexus_tune.measure.store import COLLECTIVE_SCHEMA, environment_info, now_utc
from plexus_tune.model.collectives import ALL_OPS, EXCHANGE_OPS, bandwidths_gbps, collective_elements
from plexus_tune.model.grid import axis_stride, enumerate_grids

KIB = 1024
DEFAULT_MESSAGE_BYTES = tuple(KIB * 4**k for k in range(9))  # 1 KiB .. 64 MiB, factor 4


# --------------------------------------------------------------------------- groups


def collective_shapes(gpus: int) -> list[tuple[int, int]]:
    """Every (group size, stride) that an axis of size > 1 of some grid of ``gpus`` has."""
    shapes = set()
    for grid in enumerate_grids(gpus):
        for axis in range(3):
            g = int(grid[axis])
            if g > 1:
                shapes.add((g, int(axis_stride(axis, grid))))
    return sorted(shapes)


def group_members(rank: int, group_size: int, stride: int) -> list[int]:
    """Ranks of ``rank``'s group along an axis of size ``group_size`` and ``stride``."""
    coord = (rank // stride) % group_size
    base = rank - coord * stride
    return [base + j * stride for j in range(group_size)]


def partition(world: int, group_size: int, stride: int) -> list[list[int]]:
    """The world's ranks split into the groups of one axis, in order of their first rank."""
    if world % (group_size * stride) != 0:
        raise UserError(f"a group of {group_size} ranks at stride {stride} does not tile {world} ranks")
    seen, groups = set(), []
    for r in range(world):
        if r not in seen:
            members = group_members(r, group_size, stride)
            seen.update(members)
            groups.append(members)
    return groups


# --------------------------------------------------------------------------- collectives


def _collective_call(dist, op: str, group, buf, out):
    if op == "all_reduce":
        return lambda: dist.all_reduce(buf, group=group)
    if op == "all_gather":
        fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: fn(out, buf, group=group)
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return lambda: fn(out, buf, group=group)


def _precision_buffers(torch, op: str, elems: int, g: int, cols: int, dev, rank: int):
    """(input, rows) of a ``rows x cols`` FP32 buffer near ``elems`` elements for a reduced-precision
    call: the reduced tensor of all-reduce, the gathered output (input: one block) of all-gather,
    the input of reduce-scatter; rows a multiple of ``g`` for the last two."""
    if op == "all_reduce":
        rows = max(1, round(elems / cols))
    else:
        rows = max(g, round(elems / (cols * g)) * g)
    gen = torch.Generator().manual_seed(rank)
    full = torch.randn((rows, cols), generator=gen).to(dev)
    return (full[: rows // g].contiguous() if op == "all_gather" else full), rows


def collective_worker(rank, world, shapes, sizes, ops, warmup, repeats, device, modes=("concurrent",),
                      precisions=("fp32",), cols: int = 64):
    """Body of one rank: times every (shape, mode, precision, op, size); returns rank-local times.

    ``modes``: ``concurrent`` runs the op on every group of the shape at once, ``alone``
    only on the group of rank 0 (the other ranks wait at the barriers; not timed for a shape
    of one group, which ``concurrent`` times already). ``precisions``: fp32 times the
    backend's collective on a flat buffer; the others time the trainer's reduced-precision
    collective (:mod:`plexus_tune.trainer.precision`) on a ``rows x cols`` FP32 tensor,
    recording per call its local steps and the bytes it sent. Result: list of
    (group_size, stride, mode, op, elements, [seconds per timed call] or None where this
    rank took no part), with a seventh item for a reduced precision: ``{"precision",
    "rows", "cols", "local_ms": [per call], "wire_bytes"}``.
    """
    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning)
    dev = torch.device(device)
    results = []
    for g, p in shapes:
        parts = partition(world, g, p)
        groups = [dist.new_group(ranks=members) for members in parts]
        index = next(i for i, members in enumerate(parts) if rank in members)
        mine = groups[index]
        for mode in modes if len(parts) > 1 else ("concurrent",):  # one group: alone is concurrent
            active = mode == "concurrent" or index == 0
            for precision in precisions:
                for op in ops:
                    if op in EXCHANGE_OPS and precision != "fp32":
                        continue
                    for size in sizes:
                        results.append(_time_collective(torch, dist, dev, mine, g, p, mode, active, precision, op, size,
                                                        warmup, repeats, cols, rank, parts[index]))
        for grp in groups:
            dist.destroy_process_group(grp)
    return results


def _exchange_call(torch, dist, dev, group, op: str, elems: int, members: list[int], rank: int):
    """A broadcast whose root moves round ``members`` call by call, or a point-to-point exchange
    of ``elems / g`` elements with every other member (batched isend/irecv)."""
    g = len(members)
    if op == "broadcast":
        buf = torch.ones(elems, device=dev)
        calls = [0]

        def broadcast():
            dist.broadcast(buf, src=members[calls[0] % g], group=group)
            calls[0] += 1

        return broadcast
    send, recv = torch.ones(elems, device=dev), torch.empty(elems, device=dev)
    block = elems // g
    ops = []
    for j, peer in enumerate(members):
        if peer != rank:
            ops.append(dist.P2POp(dist.isend, send[j * block:(j + 1) * block], peer))
            ops.append(dist.P2POp(dist.irecv, recv[j * block:(j + 1) * block], peer))

    def exchange():
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    return exchange


def _time_collective(torch, dist, dev, group, g, p, mode, active, precision, op, size, warmup, repeats, cols, rank,
                     members=None):
    """One (shape, mode, precision, op, size) entry of :func:`collective_worker`."""
    elems = collective_elements(op, size, g)
    call, counter, info = None, None, None
    if op in EXCHANGE_OPS:
        if active:
            call = _exchange_call(torch, dist, dev, group, op, elems, list(members), rank)
    elif precision != "fp32":
        from plexus_tune.trainer import precision as reduced  # loads torch

        counter = reduced.CommCounter()
        buf, rows = _precision_buffers(torch, op, elems, g, cols, dev, rank)
        elems = rows * cols
        info = {"precision": precision, "rows": rows, "cols": cols, "local_ms": [], "wire_bytes": 0}
        gen = torch.Generator(device=dev).manual_seed(rank)
        fn = {"all_reduce": reduced.all_reduce, "all_gather": reduced.all_gather,
              "reduce_scatter": reduced.reduce_scatter}[op]
        if active:
            call = lambda: fn(buf, group, precision, generator=gen, counter=counter)  # noqa: E731
    elif active:
        if op == "all_reduce":
            buf, out = torch.ones(elems, device=dev), None
        elif op == "all_gather":
            buf, out = torch.ones(elems // g, device=dev), torch.empty(elems, device=dev)
        else:
            buf, out = torch.ones(elems, device=dev), torch.empty(elems // g, device=dev)
        call = _collective_call(dist, op, group, buf, out)
    if call is not None:
        for _ in range(warmup):
            call()
    times = []
    for _ in range(repeats):
        dist.barrier()
        if call is None:
            continue
        if counter is not None:
            counter.reset()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        call()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
        if info is not None:
            info["local_ms"].append(counter.quant_ms)
            info["wire_bytes"] = counter.total_bytes
    entry = (g, p, mode, op, elems, times if active else None)
    return entry if info is None else entry + (info,)


def group_layout(groups: list[list[int]], rank_nodes: list[int]) -> dict:
    """Where the given (active) groups sit, from the node of each rank.

    ``nodes_spanned``: the most nodes any group spans; ``ranks_per_node``: the most members
    of one group on one node; ``concurrent``: the most groups spanning several nodes that
    have a member on one node, i.e. that share its NICs (1 when none or one crosses).
    """
    spans, per_node, crossing = [], [], {}
    for members in groups:
        nodes = [rank_nodes[m] for m in members]
        spans.append(len(set(nodes)))
        per_node.append(max(nodes.count(n) for n in set(nodes)))
        if len(set(nodes)) > 1:
            for n in set(nodes):
                crossing[n] = crossing.get(n, 0) + 1
    return {"nodes_spanned": max(spans), "ranks_per_node": max(per_node), "concurrent": max([1, *crossing.values()])}


def collective_records(per_rank: list, *, world: int, gpus_per_node: int, backend: str, element_size: int = 4,
                       rank_nodes: list[int] | None = None, extra: dict | None = None) -> list[dict]:
    """Reduce per-rank timings to records: per call the slowest taking part, then the median.

    ``rank_nodes``: the node each rank ran on (default rank // gpus_per_node).
    """
    records = []
    stamp = now_utc()
    nodes_of = list(rank_nodes) if rank_nodes is not None else [r // gpus_per_node for r in range(world)]
    for idx, entry in enumerate(per_rank[0]):
        g, p, mode, op, elems = entry[:5]
        taking_part = [rank_results[idx] for rank_results in per_rank if rank_results[idx][5] is not None]
        calls = np.max(np.array([e[5] for e in taking_part]), axis=0)
        t_ms = float(statistics.median(calls)) * 1e3
        m = elems * element_size
        algbw, busbw = bandwidths_gbps(op, g, m, t_ms)
        parts = partition(world, g, p)
        active = parts if mode == "concurrent" else parts[:1]
        reduced = {}
        if len(entry) > 6:
            # per call the slowest rank's local steps, then the median over calls, as for time_ms
            local = np.max(np.array([e[6]["local_ms"] for e in taking_part]), axis=0)
            reduced = {"comm_precision": entry[6]["precision"], "rows": entry[6]["rows"], "cols": entry[6]["cols"],
                       "quant_ms": float(statistics.median(local)),
                       "wire_bytes": int(max(e[6]["wire_bytes"] for e in taking_part))}
        records.append(
            {
                "schema": COLLECTIVE_SCHEMA,
                "op": op,
                "group_size": g,
                "stride": p,
                "contiguous": p == 1,
                "groups": len(active),
                "alone": mode == "alone",
                **group_layout(active, nodes_of),
                "message_bytes": m,
                "time_ms": t_ms,
                "time_min_ms": float(np.min(calls)) * 1e3,
                "time_max_ms": float(np.max(calls)) * 1e3,
                "repeats": len(calls),
                "algbw_gbps": algbw,
                "busbw_gbps": busbw,
                "world_size": world,
                "gpus_per_node": gpus_per_node,
                "backend": backend,
                "measured_at": stamp,
                "launcher": "local",
                "rank_nodes": nodes_of,
                "comm_precision": "fp32",
                **reduced,
                **(extra or {}),
            }
        )
    return records


COLLECTIVE_MODES = ("concurrent", "alone")


def calibrate_collectives(
    gpus: int,
    *,
    gpus_per_node: int | None = None,
    sizes=DEFAULT_MESSAGE_BYTES,
    ops=ALL_OPS,
    warmup: int = 2,
    repeats: int = 5,
    backend: str | None = None,
    shapes=None,
    timeout_s: float = 1800.0,
    launcher=None,
    modes=None,
    precisions=("fp32",),
    cols: int = 64,
) -> list[dict]:
    """Time the collectives of every group shape of ``gpus`` ranks; returns records.

    ``launcher`` (:mod:`plexus_tune.launch.launchers`; default local processes) starts the
    ranks; its ranks per node are ``gpus_per_node`` unless given (a different value is an
    error). ``modes``: ``concurrent`` (all groups of a shape at once) and/or ``alone``
    (one group); default both when the ranks span several nodes, else concurrent only.
    ``precisions``: besides fp32, the trainer's reduced-precision collectives on
    ``rows x cols`` FP32 buffers (docs/comm-precision.md, "Calibration"); broadcast and
    point_to_point are timed at fp32 only. ``ops``: default every op of
    :data:`~plexus_tune.model.collectives.ALL_OPS`.
    """
    if gpus < 2:
        raise UserError("calibrating collectives needs 2 or more GPUs", parameter="gpus")
    launcher = launcher or Launcher()
    per_node = launcher.ranks_per_node_for(gpus)
    if gpus_per_node is not None and per_node is not None and int(gpus_per_node) != per_node:
        raise UserError(f"{gpus_per_node} GPUs per node disagree with the launcher's {per_node} ranks per node; "
                        "give the launcher's or none", parameter="gpus_per_node")
    gpus_per_node = int(gpus_per_node if gpus_per_node is not None else (per_node or gpus))
    if gpus_per_node < 1:
        raise UserError("GPUs per node must be at least 1", parameter="gpus_per_node")
    bad = [op for op in ops if op not in ALL_OPS]
    if bad:
        raise UserError(f"unknown collective {bad[0]!r}; choose from {', '.join(ALL_OPS)}")
    if modes is None:
        modes = COLLECTIVE_MODES if gpus_per_node < gpus else ("concurrent",)
    modes = tuple(modes)
    if not modes or any(m not in COLLECTIVE_MODES for m in modes):
        raise UserError(f"collective timing modes must be some of {', '.join(COLLECTIVE_MODES)}, got {', '.join(modes) or 'none'}")
    precisions = tuple(parse_precision(p) for p in precisions)
    if not precisions:
        raise UserError("no communication precision to time", parameter="precisions")
    if int(cols) < 1:
        raise UserError(f"columns must be at least 1, got {cols}", parameter="cols")
    launcher.check(gpus)
    if backend is None:
        import torch

        backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= gpus else "gloo"
    for precision in precisions:
        check_backend(backend, precision)
    device = "cuda" if backend == "nccl" else "cpu"
    shapes = collective_shapes(gpus) if shapes is None else [tuple(s) for s in shapes]
    try:
        launched = launcher.run(collective_worker, gpus,
                                args=(shapes, list(sizes), list(ops), int(warmup), int(repeats), device, modes,
                                      precisions, int(cols)),
                                backend=backend, timeout_s=timeout_s)
    except RankFailure as exc:
        raise UserError(f"collective calibration failed: {exc}") from None
    where = placement_fields(launched.placement, gpus_per_node)
    extra = {"machine_info": environment_info(), **launcher.describe(), "hosts": where["hosts"], "placement_ok": where["placement_ok"]}
    if device == "cpu":
        extra["threads_per_rank"] = default_threads_per_rank(gpus)
    # on one host, nodes are the logical blocks of gpus_per_node ranks; on a cluster, where the ranks ran
    real = launcher.cluster() is not None and all(isinstance(n, int) for n in where["rank_nodes"])
    nodes = where["rank_nodes"] if real else None
    return collective_records(launched.values, world=gpus, gpus_per_node=gpus_per_node, backend=backend,
                              rank_nodes=nodes, extra=extra)


def parse_sizes(text: str) -> list[int]:
    """Message sizes like '1K:64M' (factor 4 steps), '1K:64M:x2' or '4096,1M' in bytes."""
    units = {"": 1, "B": 1, "K": KIB, "KIB": KIB, "M": KIB**2, "MIB": KIB**2, "G": KIB**3, "GIB": KIB**3}

    def one(tok: str) -> int:
        tok = tok.strip().upper()
        num = tok.rstrip("KMGIB")
        unit = tok[len(num) :]
        try:
            value = float(num) * units[unit]
        except (ValueError, KeyError):
            raise UserError(f"bad message size {tok!r}; write e.g. 1K, 64M or 4096") from None
        if value < 1:
            raise UserError(f"message size {tok!r} must be at least 1 byte")
        return int(value)

    text = text.strip()
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise UserError(f"bad size range {text!r}; write LOW:HIGH or LOW:HIGH:xFACTOR")
        lo, hi = one(parts[0]), one(parts[1])
        factor = 4.0
        if len(parts) == 3:
            try:
                factor = float(parts[2].lstrip("xX"))
            except ValueError:
                raise UserError(f"bad size factor {parts[2]!r}; write e.g. x2") from None
        if factor <= 1 or hi < lo:
            raise UserError(f"bad size range {text!r}: need LOW <= HIGH and a factor > 1")
        out, v = [], float(lo)
        while v <= hi * (1 + 1e-9):
            out.append(int(round(v)))
            v *= factor
        return out
    return [one(t) for t in text.split(",") if t.strip()]
