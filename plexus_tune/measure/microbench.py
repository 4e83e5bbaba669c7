"""Microbenchmarks that calibrate a machine profile: collectives, SpMM and GEMM.

Collectives (:func:`calibrate_collectives`)
    Starts G ranks with a launcher (:mod:`plexus_tune.launch.launchers`: local processes,
    torchrun agents, an emulated cluster, Slurm; gloo on CPU, nccl on GPUs) and, for
    every (group size g, stride p) an axis of some grid of G can have, splits the G ranks
    into the G / g groups of that axis (ranks r, r + p, ..., the placement rank =
    z Gx Gy + x Gy + y) and times all-reduce, all-gather and reduce-scatter on all groups
    at once, as training does (``concurrent``), and on one group while the others wait
    (``alone``; by default only when the ranks span several nodes): the ratio of the two
    is the link sharing of eq. 4.6. Per message size: warm-up calls, then ``repeats``
    timed calls each started after a barrier; a call's time is the slowest taking part,
    the reported time is the median over calls. M is the full buffer (the reduced or
    gathered result); algbw = M / t and busbw = algbw * 2(g-1)/g for all-reduce, (g-1)/g
    for the others (nccl-tests). Records say where the active groups sat: nodes spanned,
    ranks per node, groups sharing a node's NICs (``concurrent``), from the node each
    rank ran on (on one host: blocks of ``gpus_per_node`` consecutive ranks).

SpMM and GEMM (:func:`spmm_sweep`, :func:`calibrate_graph_shards`)
    Time ``torch.sparse.mm`` of a CSR matrix by a dense matrix, the kernel the bundled
    trainer uses, either on random shard shapes (a sweep over nnz, rows, common and
    dense columns) or on the real shards of a graph for every grid of G and every layer
    (forward A F and backward A^T dH, plus the three GEMMs of a layer) on one device:
    the compute cost of any G, measured without G devices.

Each measurement is a plain record (schemas collective, spmm, gemm of
:mod:`plexus_tune.measure.records`; docs/records.md) with what was measured, on what and when.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable

import numpy as np

from plexus_tune.comm_precision_model import PRECISION_BITS, check_backend, is_quantized, parse_precision
from plexus_tune.errors import UserError
from plexus_tune.resources import check_memory
from plexus_tune.graph import double_permute
from plexus_tune.launch import RankFailure, default_threads_per_rank
from plexus_tune.launch.launchers import Launcher
from plexus_tune.measure.records import QuantRecord
from plexus_tune.measure.store import (
    COLLECTIVE_SCHEMA,
    GEMM_SCHEMA,
    SPMM_SCHEMA,
    append_records,
    environment_info,
    now_utc,
)
from plexus_tune.model.collectives import (  # the single home of these; re-exported here
    COLLECTIVE_OPS,
    bandwidths_gbps,
    collective_elements,
)
from plexus_tune.model.grid import axis_stride, enumerate_grids, format_grid
from plexus_tune.model.shapes import csr_index_dtype, layer_shapes
from plexus_tune.trainer.run import placement_fields

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
                    for size in sizes:
                        results.append(_time_collective(torch, dist, dev, mine, g, p, mode, active, precision, op, size,
                                                        warmup, repeats, cols, rank))
        for grp in groups:
            dist.destroy_process_group(grp)
    return results


def _time_collective(torch, dist, dev, group, g, p, mode, active, precision, op, size, warmup, repeats, cols, rank):
    """One (shape, mode, precision, op, size) entry of :func:`collective_worker`."""
    elems = collective_elements(op, size, g)
    call, counter, info = None, None, None
    if precision != "fp32":
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
    ops=COLLECTIVE_OPS,
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
    ``rows x cols`` FP32 buffers (docs/comm-precision.md, "Calibration").
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
    bad = [op for op in ops if op not in COLLECTIVE_OPS]
    if bad:
        raise UserError(f"unknown collective {bad[0]!r}; choose from {', '.join(COLLECTIVE_OPS)}")
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


# --------------------------------------------------------------------------- SpMM / GEMM


def random_csr(rows: int, common: int, nnz: int, rng: np.random.Generator):
    """A torch CSR float32 matrix rows x common with about nnz nonzeros (uniform positions)."""

    nnz = int(min(nnz, rows * common))
    # row lengths: multinomial over rows, columns uniform without duplicates per row
    counts = np.minimum(rng.multinomial(nnz, np.full(rows, 1.0 / rows)), common)
    indptr = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    total = int(indptr[-1])
    cols = rng.integers(0, common, size=total, dtype=np.int64)
    vals = rng.random(total, dtype=np.float32)
    return _csr_tensor(indptr, cols, vals, (rows, common))


def _csr_tensor(indptr, indices, values, shape):
    import torch

    # int32 indices when they fit, as the trainer stores its shards
    index = csr_index_dtype(len(indices), *shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "sparse CSR support is in beta" and invariant-check notes
        return torch.sparse_csr_tensor(
            torch.from_numpy(np.asarray(indptr, dtype=index)),
            torch.from_numpy(np.asarray(indices, dtype=index)),
            torch.from_numpy(np.asarray(values, dtype=np.float32)),
            size=tuple(int(v) for v in shape),
        )


def time_call(fn: Callable[[], object], *, repeats: int = 5, warmup: int = 1, budget_s: float = 0.5, sync=None, sample_s: float = 0.002, statistic: str = "median") -> float:
    """Wall time of one fn() call in ms: the median (or ``statistic="min"``) over samples.

    The minimum is the estimate least disturbed by other processes on a shared host.

    Each of ``repeats`` samples times a loop of n calls, n chosen from the warm-up so
    that a sample lasts about ``sample_s`` (short kernels are otherwise lost in timer
    and scheduler noise); fewer samples when they exceed ``budget_s`` in all.
    """
    t0 = time.perf_counter()
    for _ in range(max(1, warmup)):
        fn()
    if sync is not None:
        sync()
    one = (time.perf_counter() - t0) / max(1, warmup)
    number = max(1, min(1000, int(sample_s / max(one, 1e-7))))
    times = []
    start = time.perf_counter()
    for i in range(repeats):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        if sync is not None:
            sync()
        times.append((time.perf_counter() - t0) / number)
        if i >= 2 and time.perf_counter() - start > budget_s:
            break
    value = min(times) if statistic == "min" else statistics.median(times)
    return float(value) * 1e3


def spmm_ms(A, B, **kw) -> float:
    """ms of torch.sparse.mm(A, B) (see :func:`time_call`)."""
    import torch

    return time_call(lambda: torch.sparse.mm(A, B), **kw)


def sweep_shapes(count: int, *, seed: int = 0, rows=(256, 65536), common=(256, 65536), dense_cols=(1, 256), degree=(1.0, 64.0), max_nnz: int = 4_000_000):
    """Random log-uniform shard shapes: rows, common, dense_cols (powers of two and odd), nnz = rows * degree."""
    rng = np.random.default_rng(seed)

    def log_uniform(lo, hi, n):
        return np.exp(rng.uniform(np.log(lo), np.log(hi), n))

    r = np.round(log_uniform(*rows, count)).astype(np.int64)
    c = np.round(log_uniform(*common, count)).astype(np.int64)
    k = np.maximum(1, np.round(log_uniform(*dense_cols, count))).astype(np.int64)
    nnz = np.round(r * log_uniform(*degree, count)).astype(np.int64)
    nnz = np.minimum(np.minimum(nnz, max_nnz), r * c)
    return [dict(nnz=int(a), rows=int(b), common=int(d), dense_cols=int(e)) for a, b, d, e in zip(nnz, r, c, k)]


SWEEP_STATISTICS = ("min", "median")


def _shape_bytes(shape) -> int:
    """Bytes of one sweep shape's operands: CSR (int32 index + fp32 value per nonzero) and dense B."""
    return 8 * int(shape["nnz"]) + 4 * (int(shape["rows"]) + 1) + 4 * int(shape["common"]) * int(shape["dense_cols"])


def spmm_sweep(shapes, *, seed: int = 0, repeats: int = 5, passes: int = 1,
               statistic: str = "min", cache_bytes: int = 4 * 2**30, progress=None) -> list[dict]:
    """Time torch.sparse.mm on random CSR matrices of the given shapes; spmm records.

    Interleaved passes: each of ``passes`` passes visits every shape once, in a fresh
    random order, and keeps the minimum over ``repeats`` samples of >= 2 ms. A shape's
    passes thus lie spread over the whole sweep, and every shape sees the same mix of
    host states (the speed of a shared host drifts over seconds to minutes, and
    neighbouring shapes in time err together). Per shape::

        time_min_ms    = min over passes      time_median_ms = median over passes
        time_ms        = the one named by ``statistic``

    Shape i's matrix comes from the generator seeded (seed, i); operands are kept in
    memory between passes while they fit ``cache_bytes`` in all, else rebuilt.
    """
    import torch

    if statistic not in SWEEP_STATISTICS:
        raise UserError(f"unknown sweep statistic {statistic!r}; choose from {', '.join(SWEEP_STATISTICS)}")

    passes = max(1, int(passes))
    samples = [[] for _ in shapes]
    nnz = [0] * len(shapes)
    keep = passes > 1 and sum(_shape_bytes(s) for s in shapes) <= cache_bytes
    cache: dict[int, tuple] = {}
    order_rng = np.random.default_rng([seed, len(shapes), passes])

    def operands(i):
        if i in cache:
            return cache[i]
        shape = shapes[i]
        A = random_csr(shape["rows"], shape["common"], shape["nnz"], np.random.default_rng([seed, i]))
        B = torch.rand(shape["common"], shape["dense_cols"], generator=torch.Generator().manual_seed(seed * 1_000_003 + i))
        if keep:
            cache[i] = (A, B)
        return A, B

    for _ in range(passes):
        for i in order_rng.permutation(len(shapes)):
            A, B = operands(int(i))
            samples[i].append(spmm_ms(A, B, repeats=repeats, statistic="min"))
            nnz[i] = int(A._nnz())
            del A, B
            if progress is not None:
                progress()
    cache.clear()
    records = []
    for i, shape in enumerate(shapes):
        t_min, t_med = float(np.min(samples[i])), float(np.median(samples[i]))
        records.append(
            {
                "schema": SPMM_SCHEMA,
                "source": "sweep",
                "statistic": f"{statistic} over {passes} interleaved pass(es) of (min over {repeats} samples of >= 2 ms)",
                "nnz": nnz[i],
                "rows": shape["rows"],
                "common": shape["common"],
                "dense_cols": shape["dense_cols"],
                "time_ms": t_min if statistic == "min" else t_med,
                "time_min_ms": t_min,
                "time_median_ms": t_med,
                "threads": torch.get_num_threads(),
                "passes": passes,
                "repeats": repeats,
                "kernel": "torch.sparse.mm(csr int32, dense)",
                "measured_at": now_utc(),
            }
        )
    return records


def shard(matrix, row_block: int, col_block: int, row_index: int, col_index: int):
    """Block (row_index, col_index) of a scipy CSR matrix cut into row_block x col_block tiles
    (zero padded to row_block x col_block past the matrix, as the trainer allocates)."""
    n_rows, n_cols = matrix.shape
    r0, c0 = row_index * row_block, col_index * col_block
    part = matrix[min(r0, n_rows) : min(r0 + row_block, n_rows), min(c0, n_cols) : min(c0 + col_block, n_cols)]
    import scipy.sparse as sp

    out = sp.csr_matrix((part.data, part.indices, part.indptr), shape=(part.shape[0], part.shape[1]))
    out.resize((row_block, col_block))
    return out


def _torch_csr(m):

    m = m.tocsr()
    return _csr_tensor(m.indptr, m.indices, m.data, m.shape)


def calibrate_graph_shards(
    adjacency,
    widths,
    gpus: int,
    *,
    grids=None,
    seed: int = 0,
    repeats: int = 5,
    all_shards: bool = False,
    graph_name: str = "graph",
    progress=None,
) -> list[dict]:
    """Time the real shard SpMMs (forward A F, backward A^T dH) and GEMMs of every grid and layer.

    ``adjacency`` is the GCN-normalized N x N CSR matrix; it is double-permuted, layer i
    uses P_r A P_c^T for even i and its transpose layout for odd i. The shard of a rank
    is rows ceil(N/g_d), columns ceil(N/g_o) of that layout at its (depth, outer)
    coordinates (:func:`plexus_tune.model.shapes.layer_shapes`, the trainer's shard
    shapes); shards are the same along the inner axis, so each distinct shard is
    timed once (``all_shards``; otherwise the one with the most nonzeros, which decides
    the epoch). Returns spmm and gemm records.
    """
    import torch

    n = adjacency.shape[0]
    perm, _, _ = double_permute(adjacency, seed=seed)
    layouts = [perm.tocsr(), perm.T.tocsr()]
    grids = enumerate_grids(gpus) if grids is None else np.asarray(grids, dtype=np.int64).reshape(-1, 3)
    widest = max(grids, key=lambda g: int(np.prod(sorted(int(v) for v in g)[1:])))
    longest = max(grids, key=lambda g: int(max(g)))
    if int(max(longest)) > n:
        raise UserError(f"grid {'x'.join(map(str, longest))} of G={gpus:,} has more ranks along an axis than the graph's "
                        f"{n:,} nodes: its shards would be empty; give a G whose grids fit the graph")
    check_memory(8 * int(np.prod(sorted(int(v) for v in widest)[1:])), f"the shard counts of grid {'x'.join(map(str, widest))}")
    stamp = now_utc()
    records: list[dict] = []
    for grid in grids:
        grid = tuple(int(v) for v in grid)
        for s in layer_shapes(n, widths, grid):
            layer, g_o, g_d = s.layer, s.g_o, s.g_d
            r_d, r_o, c_i, c_o = s.r_d, s.r_o, s.c_i, s.c_o
            layout = layouts[layer % 2]
            # nonzeros of every (depth, outer) shard, from one pass over the layout
            coo = layout.tocoo()
            counts = np.zeros((g_d, g_o), dtype=np.int64)
            np.add.at(counts, (coo.row // r_d, coo.col // r_o), 1)
            picks = [(a, b) for a in range(g_d) for b in range(g_o)] if all_shards else [np.unravel_index(int(np.argmax(counts)), counts.shape)]
            base = {
                "graph": graph_name,
                "graph_nodes": n,
                "grid": format_grid(grid),
                "gx": grid[0],
                "gy": grid[1],
                "gz": grid[2],
                "gpus": gpus,
                "layer": layer,
                "threads": torch.get_num_threads(),
                "measured_at": stamp,
            }
            imbalance = float(counts.max() / max(counts.mean(), 1e-12))
            for a, b in picks:
                A = shard(layout, r_d, r_o, int(a), int(b))
                At = A.T.tocsr()
                fwd = spmm_ms(_torch_csr(A), torch.rand(r_o, c_i), repeats=repeats, statistic="min")
                bwd = spmm_ms(_torch_csr(At), torch.rand(r_d, c_i), repeats=repeats, statistic="min")
                common = {**base, "statistic": "min over samples of >= 2 ms", "shard": [int(a), int(b)], "nnz_imbalance": imbalance, "source": "graph", "kernel": "torch.sparse.mm(csr int32, dense)"}
                records.append({"schema": SPMM_SCHEMA, **common, "direction": "forward", "nnz": int(A.nnz), "rows": r_d, "common": r_o, "dense_cols": c_i, "time_ms": fwd})
                records.append({"schema": SPMM_SCHEMA, **common, "direction": "backward", "nnz": int(A.nnz), "rows": r_o, "common": r_d, "dense_cols": c_i, "time_ms": bwd})
            H, W, dQ = torch.rand(r_d, c_i), torch.rand(c_i, c_o), torch.rand(r_d, c_o)
            for name, fn, shape in (
                ("forward H W", lambda: H @ W, (r_d, c_i, c_o)),
                ("backward H^T dQ", lambda: H.T @ dQ, (c_i, r_d, c_o)),
                ("backward dQ W^T", lambda: dQ @ W.T, (r_d, c_o, c_i)),
            ):
                t = time_call(fn, repeats=repeats, statistic="min")
                records.append({"schema": GEMM_SCHEMA, **base, "product": name, "rows": shape[0], "inner": shape[1], "cols": shape[2], "time_ms": t})
            if progress is not None:
                progress()
    return records


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


def time_quant(precision: str, rows: int, cols: int, *, repeats: int = 5, seed: int = 0) -> dict:
    """Encode and decode times (ms, min over ``repeats``) of an FP32 ``rows x cols`` tensor.

    bf16/fp16: the casts to 16 bits and back; intX: :func:`plexus_tune.trainer.precision.quantize`
    (per-row zero point and scale, stochastic rounding, packing) and ``dequantize``.
    """
    import time

    import torch

    from plexus_tune.trainer.precision import dequantize, quantize

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn((rows, cols), generator=gen)
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}
    enc, dec = [], []
    for _ in range(max(1, repeats) + 1):  # the first call warms up
        t0 = time.perf_counter()
        packed = quantize(x, PRECISION_BITS[precision], gen) if is_quantized(precision) else x.to(low[precision])
        t1 = time.perf_counter()
        back = dequantize(packed) if is_quantized(precision) else packed.to(torch.float32)
        t2 = time.perf_counter()
        enc.append((t1 - t0) * 1e3)
        dec.append((t2 - t1) * 1e3)
        del back
    return {"encode_ms": min(enc[1:]), "decode_ms": min(dec[1:])}


def run_quant_benchmark(log, *, precisions=("bf16", "fp16", "int8", "int4", "int2"), rows=(4096, 16384),
                        cols=(32, 128), repeats: int = 5, threads: int = 1) -> list[dict]:
    """Time every (precision, rows, cols) on ``threads`` torch threads; append quant records to ``log``."""
    import torch

    torch.set_num_threads(int(threads))
    env = environment_info()
    out = []
    for precision in precisions:
        for r in rows:
            for c in cols:
                times = time_quant(precision, int(r), int(c), repeats=repeats)
                out.append(QuantRecord(precision=precision, rows=int(r), cols=int(c), fp32_bytes=4 * int(r) * int(c),
                                       repeats=int(repeats), threads=int(threads), measured_at=now_utc(),
                                       machine_info=env, **times).to_dict())
    append_records(log, out)
    return out
