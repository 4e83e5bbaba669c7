"""The epoch model of ScaleGNN's 4D mini-batch training (docs/model.md, "ScaleGNN").

G = Gd x Gx x Gy x Gz GPUs: Gd data-parallel groups, each a Plexus 3D grid Gx x Gy x Gz
(layer rotation of period 3, :func:`plexus_tune.model.grid.layer_roles`) that holds the
whole graph and trains on its own sample of B vertices every step
(:mod:`plexus_tune.graph.sampling`). Rank = d Gx Gy Gz + z Gx Gy + x Gy + y, so the
gradient all-reduce over the Gd groups runs at stride Gx Gy Gz.

The model: input projection X W_in (D_0 -> h), L GCN layers (SpMM, GEMM, RMSNorm, ReLU,
dropout, residual), output head (h -> C), cross-entropy over the sampled training
vertices. Per step and rank, with B-row operands and u the element size (layer i has
roles (o, n, d), r_d = ceil(B / g_d), r_o = ceil(B / g_o), c_n = ceil(h / g_n),
c_o = ceil(h / g_o), z the sampled shard nonzeros):

- SpMM: the machine's per-SpMM model of the forward A_S F (z, r_d, r_o, c_n) and the
  backward A_S^T dH (z, r_o, r_d, c_n), floored at their memory traffic;
- GEMM: 6 r_d c_n c_o per layer, 4 of the projection (no input gradient), 6 of the head;
- communication (:func:`step_collectives`, timed by the machine's network model):
  forward all-reduce H over o, Q over n; backward all-reduce dW over d, dH over o, dF
  over d; RMSNorm's sum of squares over o (forward and backward, FP32) and its scale's
  gradient over d; the residual's reshard (all-gather over n, then over o; backward:
  all-reduce of the B x h gradient over d and over o); the projection's all-reduce over
  Z and dW_in over X; the head's over n, dW_out over o, dX over d; the loss's row max
  and sums over the class axis (FP32); the gradients of all parameters over the Gd groups
  in one FP32 all-reduce at stride Gx Gy Gz (``comm_dp_ms``); with trained input features
  (not ``fixed_features``) also dX_S = dP W_in^T (2 r_x k_in c_in flops) all-reduced over Y
  and the groups' row gradients all-gathered over the Gd groups at the same stride
  (:func:`feature_collectives`);
- other: the elementwise passes (:data:`LAYER_PASSES`), the optimizer step over the
  rank's parameters (:data:`plexus_tune.model.other.OPTIMIZER_ACCESSES`; trained input
  features add the rank's whole N / Gx x D_0 / Gz block) and the exposed
  sampling (:func:`sampling_ms`; with prefetch only what exceeds the rest of the step).

An epoch is ceil(N / (B Gd)) steps: every time part is steps x its step time, and so is the
profile's fixed overhead (``epoch_overhead_ms``, fitted on full-graph epochs of one training
iteration each, is that of one iteration).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.graph.core import gcn_normalize
from plexus_tune.graph.sampling import check_batch_size, expected_sampled_nnz, sampled_shard_nnz
from plexus_tune.model.breakdown import COMM_AXIS_KEYS, COMM_OP_KEYS, TOTAL_PARTS
from plexus_tune.model.comm_precision import CommPrecision, parse_comm_precision, quant_time_ms
from plexus_tune.model.grid import AXIS_NAMES, axis_stride, check_gpus, divisors, enumerate_grids, format_grid, layer_roles
from plexus_tune.model.machine import GIB, Machine, collective_time_ms, load_machine, oversubscription, precision_collective_time_ms
from plexus_tune.model.other import OPTIMIZER_ACCESSES, SYNCS_PER_EPOCH, check_optimizer
from plexus_tune.model.shapes import ceil_div, csr_bytes, csr_index_bytes
from plexus_tune.model.spmm import predict_spmm_ms, spmm_traffic_bytes

#: The family's name.
NAME = "scalegnn-4d"
#: Components of a GCN layer that can be switched off (options of the model and the trainer).
COMPONENTS = ("rmsnorm", "residual", "dropout")
#: Array accesses per element of a GCN layer's B x h output, forward and backward, per component.
LAYER_PASSES = {"relu": 5, "rmsnorm": 8, "dropout": 5, "residual": 5}
#: Array accesses per logit of the loss (forward and backward), as the 3D trainer's.
LOSS_PASSES = 6
#: Bytes moved per nonzero gathered from a sampled row (row ids, flat positions, global
#: column, membership search) beyond its value and index, and per kept nonzero (A_S and
#: A_S^T assembled: written and read once each).
SAMPLE_GATHER_BYTES = 24
SAMPLE_KEEP_PASSES = 4
#: Memory parts (``memory_<part>_bytes``).
MEMORY_PARTS = ("graph_shards", "sampled", "features", "activations", "parameters")
#: Time keys beyond the common prediction keys.
EXTRA_KEYS = ("comm_dp_ms", "sampling_ms", "sampling_hidden_ms", "other_sampling_ms", "other_elementwise_ms",
              "other_optimizer_ms", "other_sync_ms", "step_ms", "steps")


def check_components(options: Mapping | None) -> dict[str, bool]:
    """Which components are on (default all), from ``options`` keys of :data:`COMPONENTS`."""
    options = dict(options or {})
    return {name: bool(options.get(name, True)) for name in COMPONENTS}


def configurations(gpus: int, dp: int | None = None) -> np.ndarray:
    """(K, 4) rows (Gd, Gx, Gy, Gz): every Gd | G (or the given one) with every 3D grid of G / Gd."""
    gpus = check_gpus(gpus)
    rows = []
    for gd in divisors(gpus).tolist():
        if dp is not None and gd != int(dp):
            continue
        for grid in enumerate_grids(gpus // gd).tolist():
            rows.append((gd, *grid))
    if dp is not None and not rows:
        raise UserError(f"the data-parallel degree {dp} does not divide {gpus} GPUs; choose a divisor of {gpus}",
                        parameter="dp")
    return np.asarray(rows, dtype=np.int64).reshape(-1, 4)


def steps_per_epoch(nodes: int, batch: int, dp: int) -> int:
    """ceil(N / (B Gd)): the steps in which the Gd groups together draw N vertices."""
    return int(math.ceil(int(nodes) / (int(batch) * int(dp))))


def _hidden(workload) -> int:
    """The hidden width h: D_1 of the workload's widths (model.workload.model_widths; a
    one-layer workload names no hidden width and is taken as h = C)."""
    return int(workload.widths[1]) if workload.layers > 1 else int(workload.widths[-1])


def layer_sizes(workload, grid, batch: int) -> list[dict]:
    """Per GCN layer: roles and the local sizes r_d, r_o, c_n, c_o of B-row operands (module docstring)."""
    h = _hidden(workload)
    out = []
    for i in range(workload.layers):
        o, n, d = layer_roles(i)
        out.append({"outer": o, "inner": n, "depth": d, "r_d": ceil_div(batch, grid[d]), "r_o": ceil_div(batch, grid[o]),
                    "c_n": ceil_div(h, grid[n]), "c_o": ceil_div(h, grid[o])})
    return out


def step_collectives(workload, grid, batch: int, components: Mapping) -> list[tuple]:
    """The collectives of one step on one rank of a group: (op, axis, message bytes, rows, class).

    Class ``None`` is always FP32 (RMSNorm statistics, the loss). The data-parallel
    all-reduce is not included (:func:`parameter_elements`).
    """
    u = float(workload.bytes_per_element)
    h, d0, classes = _hidden(workload), int(workload.widths[0]), int(workload.widths[-1])
    gx, gy, gz = grid
    calls = []
    # input projection: rows over X, D_0 over Z, h over Y; all-reduce over Z, dW_in over X
    rx, k_in, c_in = ceil_div(batch, gx), ceil_div(d0, gz), ceil_div(h, gy)
    calls.append(("all_reduce", 2, u * rx * c_in, rx, "combination"))
    calls.append(("all_reduce", 0, u * k_in * c_in, k_in, "gather"))
    for s in layer_sizes(workload, grid, batch):
        o, n, d = s["outer"], s["inner"], s["depth"]
        r_d, r_o, c_n, c_o = s["r_d"], s["r_o"], s["c_n"], s["c_o"]
        calls += [("all_reduce", o, u * r_d * c_n, r_d, "aggregation"),  # H
                  ("all_reduce", n, u * r_d * c_o, r_d, "combination"),  # Q
                  ("all_reduce", d, u * c_n * c_o, c_n, "gather"),  # dW
                  ("all_reduce", o, u * r_d * c_n, r_d, "aggregation"),  # dH
                  ("all_reduce", d, u * r_o * c_n, r_o, "gather")]  # dF
        if components["rmsnorm"]:
            calls += [("all_reduce", o, u * r_d, r_d, None), ("all_reduce", o, u * r_d, r_d, None),
                      ("all_reduce", d, u * c_o, 1, "gather")]
        if components["residual"]:
            full_cols = grid[n] * c_n
            calls += [("all_gather", n, u * r_o * full_cols, r_o, "gather"),
                      ("all_gather", o, u * grid[o] * r_o * full_cols, grid[o] * r_o, "gather"),
                      ("all_reduce", d, u * batch * h, batch, "gather"),
                      ("all_reduce", o, u * batch * h, batch, "gather")]
    o, n, d = layer_roles(workload.layers)
    r, k, c = ceil_div(batch, grid[o]), ceil_div(h, grid[n]), ceil_div(classes, grid[d])
    calls += [("all_reduce", n, u * r * c, r, "combination"), ("all_reduce", o, u * k * c, k, "gather"),
              ("all_reduce", d, u * r * k, r, "aggregation"),
              ("all_reduce", d, u * r, r, None), ("all_reduce", d, 2 * u * r, r, None), ("all_reduce", o, u, 1, None)]
    return calls


def parameter_elements(workload, grid, components: Mapping) -> int:
    """Parameters one rank holds: W_in, every W_l (and RMSNorm scale), W_out blocks."""
    h, d0, classes = _hidden(workload), int(workload.widths[0]), int(workload.widths[-1])
    gx, gy, gz = grid
    total = ceil_div(d0, gz) * ceil_div(h, gy)
    for i in range(workload.layers):
        o, n, _ = layer_roles(i)
        total += ceil_div(h, grid[n]) * ceil_div(h, grid[o]) + (ceil_div(h, grid[o]) if components["rmsnorm"] else 0)
    o, n, d = layer_roles(workload.layers)
    return int(total + ceil_div(h, grid[n]) * ceil_div(classes, grid[d]))


def feature_elements(workload, grid) -> int:
    """Input-feature elements one rank holds: ceil(N / Gx) x ceil(D_0 / Gz)."""
    return int(ceil_div(workload.nodes, grid[0]) * ceil_div(int(workload.widths[0]), grid[2]))


def feature_collectives(workload, grid, batch: int, dp: int) -> list[tuple]:
    """Trained input features' collectives of one step (op, axis, message bytes, rows, class):
    dX_S all-reduced over Y (the projection's width is split there), and the Gd groups'
    sampled-row gradients all-gathered at stride Gx Gy Gz (axis 3; every rank knows every
    group's sample, so only the values move; FP32 like the parameters' average)."""
    u = float(workload.bytes_per_element)
    rx, k_in = ceil_div(batch, grid[0]), ceil_div(int(workload.widths[0]), grid[2])
    calls = [("all_reduce", 1, u * rx * k_in, rx, "gather")]
    if dp > 1:
        calls.append(("all_gather", 3, dp * u * rx * k_in, dp * rx, None))
    return calls


def sampled_nnz_per_shard(workload, grid, batch: int, sampled_nnz=None) -> list[float]:
    """Nonzeros of each layer's A_S shard: ``sampled_nnz`` (per layer, from a graph), else
    E[nnz(A_S)] / (g_d g_o) (:func:`plexus_tune.graph.sampling.expected_sampled_nnz`)."""
    if sampled_nnz is not None:
        values = [float(v) for v in np.atleast_1d(sampled_nnz)]
        return [values[i % len(values)] for i in range(workload.layers)]
    total = float(expected_sampled_nnz(workload.nodes, workload.nnz, batch))
    return [total / (grid[s["depth"]] * grid[s["outer"]]) for s in layer_sizes(workload, grid, batch)]


def sampling_work(workload, grid, batch: int, sampled=None) -> tuple[int, float]:
    """(layouts, bytes) of one step's sampling on one rank: the kernel that
    ``calibrate sampling`` times (:mod:`plexus_tune.measure.sampling`).

    Per distinct layer layout (at most 3, one kernel call each): the sampled rows' nonzeros
    of the full shard, NNZ / (g_d g_o) x B / N, each read (value and index) and handled
    with :data:`SAMPLE_GATHER_BYTES` plus a binary search of log2(r_o) 8-byte probes; the
    kept nonzeros z written into A_S and A_S^T (:data:`SAMPLE_KEEP_PASSES` passes of
    value and index). Plus the sample itself, 16 B per vertex.
    """
    u = float(workload.bytes_per_element)
    n, nnz = workload.nodes, workload.nnz
    sizes = layer_sizes(workload, grid, batch)
    z = sampled_nnz_per_shard(workload, grid, batch, sampled)
    total = 16.0 * batch
    layouts = min(workload.layers, 3)
    for i in range(layouts):
        s = sizes[i]
        full = nnz / (grid[s["depth"]] * grid[s["outer"]])
        gathered = full * batch / n
        ib = float(csr_index_bytes(full, ceil_div(n, grid[s["depth"]]), ceil_div(n, grid[s["outer"]])))
        total += gathered * (u + ib + SAMPLE_GATHER_BYTES + 8.0 * math.log2(max(2.0, s["r_o"])))
        total += z[i] * SAMPLE_KEEP_PASSES * (u + 4.0)
    return int(layouts), float(total)


def sampling_ms(workload, machine: Machine, grid, batch: int, sampled=None) -> float:
    """One step's sampling on one rank (ms): ``layouts`` x call_ms + bytes / gbps of
    :func:`sampling_work`, at the profile's calibrated ``sampling`` entry (``calibrate
    sampling``, then ``fit``), else the bytes at ``elementwise_gbps`` (0 without it).
    docs/model.md, "ScaleGNN", Sampling."""
    layouts, work = sampling_work(workload, grid, batch, sampled)
    entry = machine.sampling
    if entry:
        return float(entry["call_ms"]) * layouts + work / (float(entry["gbps"]) * 1e9) * 1e3
    rate = machine.elementwise_gbps
    return work / (float(rate) * 1e9) * 1e3 if rate else 0.0


def feature_gather_bytes(workload, grid, batch: int) -> float:
    """Bytes of gathering a step's sampled input-feature rows (read and written) and labels on one
    rank: ceil(B / Gx) x (2 ceil(D_0 / Gz) u + 16); elementwise work of the step."""
    gx, _, gz = grid
    return ceil_div(batch, gx) * (2.0 * ceil_div(int(workload.widths[0]), gz) * float(workload.bytes_per_element) + 16.0)


def _comm(machine, calls, grid, choice: CommPrecision, u):
    out = dict.fromkeys(("comm_ms", *COMM_AXIS_KEYS, *COMM_OP_KEYS, "quant_ms"), 0.0)
    quant = machine.quant
    for op, axis, message, rows, comm_class in calls:
        g = int(grid[axis])
        if g <= 1:
            continue
        precision = "fp32" if comm_class is None else choice.of(comm_class)
        t = float(precision_collective_time_ms(machine, op, g, axis_stride(axis, grid), message, rows, precision, u))
        out["comm_ms"] += t
        out[f"comm_{AXIS_NAMES[axis]}_ms"] += t
        out[f"{op}_ms"] += t
        if precision != "fp32":
            out["quant_ms"] += float(quant_time_ms(quant, precision, op, g, message * 4.0 / u))
    return out


def predict_config(workload, machine: Machine, dp: int, grid, batch: int, *, choice: CommPrecision,
                   optimizer: str | None = None, components: Mapping | None = None, prefetch: bool = True,
                   sampled_nnz=None, fixed_features: bool = False) -> dict:
    """The epoch prediction of one configuration (Gd, (Gx, Gy, Gz), B); plain floats.

    Keys: the common prediction keys (:data:`plexus_tune.model.costs.PREDICTION_KEYS`:
    parts in ms per epoch adding up to ``total_ms``, memory, feasibility), ``comm_dp_ms``
    (the data-parallel all-reduce, inside ``comm_ms`` and ``all_reduce_ms`` beside the
    X, Y, Z splits), ``sampling_ms`` (the sampling work), ``sampling_hidden_ms`` (the
    part the prefetch hides), ``step_ms``, ``steps`` and ``memory_<part>_bytes``.
    """
    components = check_components(components)
    grid = tuple(int(g) for g in grid)
    dp = int(dp)
    batch = check_batch_size(batch, workload.nodes)
    u = float(workload.bytes_per_element)
    n, h, d0, classes = workload.nodes, _hidden(workload), int(workload.widths[0]), int(workload.widths[-1])
    gx, gy, gz = grid
    g3 = gx * gy * gz
    sizes = layer_sizes(workload, grid, batch)
    z = sampled_nnz_per_shard(workload, grid, batch, sampled_nnz)
    spmm = traffic = flops = 0.0
    act = 0.0
    for s, zi in zip(sizes, z):
        r_d, r_o, c_n, c_o = s["r_d"], s["r_o"], s["c_n"], s["c_o"]
        ib = float(csr_index_bytes(zi, r_d, r_o))
        spmm += float(predict_spmm_ms(machine.spmm, zi, r_d, r_o, c_n)) + float(predict_spmm_ms(machine.spmm, zi, r_o, r_d, c_n, backward=True))
        traffic += float(spmm_traffic_bytes(zi, r_d, r_o, c_n, u, ib)) + float(spmm_traffic_bytes(zi, r_o, r_d, c_n, u, ib))
        flops += 6.0 * r_d * c_n * c_o
        act += 2.0 * u * (r_o * c_n + r_d * c_n + 5.0 * r_d * c_o)
    rx, k_in, c_in = ceil_div(batch, gx), ceil_div(d0, gz), ceil_div(h, gy)
    flops += (4.0 if fixed_features else 6.0) * rx * k_in * c_in
    o, nn, d = layer_roles(workload.layers)
    r_h, k_h, c_h = ceil_div(batch, grid[o]), ceil_div(h, grid[nn]), ceil_div(classes, grid[d])
    flops += 6.0 * r_h * k_h * c_h
    act += 2.0 * u * (rx * (k_in + c_in) + 3.0 * r_h * c_h) + (u * batch * h if components["residual"] else 0.0)
    bandwidth = machine.memory_bandwidth_gbps
    floor = traffic / (bandwidth * 1e9) * 1e3 if bandwidth else 0.0
    step = {"spmm_ms": max(spmm, 0.0, floor), "spmm_floor_ms": floor, "spmm_floored": floor > spmm,
            "gemm_ms": flops / (machine.gemm_tflops * 1e12) * 1e3}
    step.update(_comm(machine, step_collectives(workload, grid, batch, components), grid, choice, u))
    params = parameter_elements(workload, grid, components)
    dp_ops = {"all_reduce": float(collective_time_ms(machine, "all_reduce", dp, g3, u * params)) if dp > 1 else 0.0}
    trained = 0 if fixed_features else feature_elements(workload, grid)
    if trained:
        for op, axis, message, _, _ in feature_collectives(workload, grid, batch, dp):
            if axis == 3:  # across the Gd groups
                dp_ops[op] = dp_ops.get(op, 0.0) + float(collective_time_ms(machine, op, dp, g3, message))
            elif grid[axis] > 1:
                t = float(collective_time_ms(machine, op, grid[axis], axis_stride(axis, grid), message))
                step["comm_ms"] += t
                step[f"comm_{AXIS_NAMES[axis]}_ms"] += t
                step[f"{op}_ms"] += t
    step["comm_dp_ms"] = sum(dp_ops.values())
    step["comm_ms"] += step["comm_dp_ms"]
    for op, t in dp_ops.items():
        step[f"{op}_ms"] += t
    passes = LAYER_PASSES["relu"] + sum(LAYER_PASSES[c] for c in COMPONENTS if components[c])
    elementwise = (u * (sum(passes * s["r_d"] * s["c_o"] for s in sizes) + LOSS_PASSES * r_h * c_h)
                   + feature_gather_bytes(workload, grid, batch))
    rate = machine.elementwise_gbps
    step["other_elementwise_ms"] = elementwise / (rate * 1e9) * 1e3 if rate else 0.0
    opt_rate = machine.optimizer_gbps or rate
    accesses = OPTIMIZER_ACCESSES[check_optimizer(optimizer or machine.optimizer)]
    step["other_optimizer_ms"] = u * accesses * (params + trained) / (opt_rate * 1e9) * 1e3 if opt_rate else 0.0
    sample = sampling_ms(workload, machine, grid, batch, sampled_nnz)
    busy = (step["spmm_ms"] + step["gemm_ms"] + step["comm_ms"] + step["quant_ms"] + step["other_elementwise_ms"]
            + step["other_optimizer_ms"])
    exposed = max(0.0, sample - busy) if prefetch else sample
    step["sampling_ms"] = sample
    step["sampling_hidden_ms"] = sample - exposed
    step["other_sampling_ms"] = exposed
    step["other_ms"] = step["other_elementwise_ms"] + step["other_optimizer_ms"] + exposed
    stretch = float(oversubscription(machine, np.asarray([dp * g3]))[0])
    steps = steps_per_epoch(n, batch, dp)
    out = {"gd": dp, "gx": gx, "gy": gy, "gz": gz, "batch_size": batch, "steps": float(steps)}
    for key, value in step.items():
        out[key] = value * steps * stretch if key.endswith("_ms") else value
    out["other_sync_ms"] = SYNCS_PER_EPOCH * float(machine.sync_us or 0.0) / 1e3 * stretch
    out["other_ms"] += out["other_sync_ms"]
    out["step_ms"] = sum(step[k] for k in ("spmm_ms", "gemm_ms", "comm_ms", "quant_ms", "other_ms")) * stretch
    out["oversubscription"] = stretch
    out["overhead_ms"] = steps * machine.epoch_overhead_ms  # fitted per full-graph epoch: one training iteration
    out["total_ms"] = sum(out[key] for key in TOTAL_PARTS)
    memory = {}
    shards = sampled = 0.0
    for i in range(min(workload.layers, 3)):
        s = sizes[i]
        rows, cols = ceil_div(n, grid[s["depth"]]), ceil_div(n, grid[s["outer"]])
        full = workload.nnz / (grid[s["depth"]] * grid[s["outer"]])
        shards += float(csr_bytes(full, rows, u, float(csr_index_bytes(full, rows, cols))))
        sampled += 2.0 * float(csr_bytes(z[i], max(s["r_d"], s["r_o"]), u, 4.0))
    memory["graph_shards"] = shards
    memory["sampled"] = sampled * (2.0 if prefetch else 1.0)  # with prefetch the next step's are built meanwhile
    memory["features"] = ceil_div(n, gx) * (ceil_div(d0, gz) * u * (1.0 if fixed_features else 4.0) + 8.0)
    memory["activations"] = act
    memory["parameters"] = 4.0 * u * params
    total = sum(memory.values())
    for part, value in memory.items():
        out[f"memory_{part}_bytes"] = value
    out["memory_bytes"] = total
    out["memory_gib"] = total / GIB
    out["feasible"] = total <= machine.usable_memory_bytes
    return out


def predict_configs(workload, machine, configs, *, batch_size: int, comm_precision=None, optimizer=None,
                    options: Mapping | None = None) -> dict[str, np.ndarray]:
    """Vectorized over (K, 4) rows (Gd, Gx, Gy, Gz): arrays of :func:`predict_config`'s keys.

    ``options``: the components of :data:`COMPONENTS` (bools), ``prefetch`` (default
    True: sampling of step t + 1 overlaps step t), ``fixed_features`` (default False: the
    input features are trained) and ``sampled_nnz`` (a callable
    ``grid -> per-layer shard nonzeros``, e.g. from a graph, else the expectation).
    """
    machine = machine if isinstance(machine, Machine) else load_machine(machine)
    choice = comm_precision if isinstance(comm_precision, CommPrecision) else parse_comm_precision(comm_precision or "fp32")
    options = dict(options or {})
    unknown = sorted(set(options) - {*COMPONENTS, "prefetch", "sampled_nnz", "fixed_features"})
    if unknown:
        raise UserError(f"{NAME} takes no option {', '.join(unknown)}; its options: "
                        f"{', '.join((*COMPONENTS, 'prefetch', 'fixed_features'))}")
    sampled = options.get("sampled_nnz")
    configs = np.asarray(configs, dtype=np.int64).reshape(-1, 4)
    if configs.size and configs.min() < 1:
        raise UserError("configurations must be rows of four positive sizes (Gd, Gx, Gy, Gz)")
    rows = [predict_config(workload, machine, int(c[0]), c[1:], batch_size, choice=choice, optimizer=optimizer,
                           components=options, prefetch=bool(options.get("prefetch", True)),
                           fixed_features=bool(options.get("fixed_features", False)),
                           sampled_nnz=sampled(tuple(int(g) for g in c[1:])) if callable(sampled) else sampled)
            for c in configs]
    if not rows:
        return {}
    return {key: np.asarray([r[key] for r in rows]) for key in rows[0]}


def graph_sampled_nnz(adjacency, batch: int, *, samples: int = 4, seed: int = 0):
    """A callable ``grid -> per-layer largest A_S shard nonzeros`` that samples ``adjacency``
    (:func:`plexus_tune.graph.sampling.sampled_shard_nnz`), cached per shard cut."""
    cache: dict[tuple[int, int], float] = {}

    def per_layer(grid):
        out = []
        for i in range(3):
            o, _, d = layer_roles(i)
            key = (int(grid[d]), int(grid[o]))
            if key not in cache:
                cache[key] = sampled_shard_nnz(adjacency, key[0], key[1], batch, samples=samples, seed=seed)
            out.append(cache[key])
        return out

    return per_layer


#: Batch sizes the planner tries when none is given: powers of 4 from 1,024 to 1,048,576 (at most N).
DEFAULT_BATCH_SIZES = tuple(4**k for k in range(5, 11))


def batch_candidates(nodes: int, batch_sizes=None) -> tuple[int, ...]:
    """The batch sizes to rank: the given ones (each checked), else :data:`DEFAULT_BATCH_SIZES` up to N."""
    if batch_sizes:
        return tuple(check_batch_size(b, nodes) for b in batch_sizes)
    out = tuple(b for b in DEFAULT_BATCH_SIZES if b <= nodes)
    return out or (int(nodes),)


def config_label(dp: int, grid) -> str:
    """``Gd x (Gx x Gy x Gz)``, e.g. ``4 x (2x2x2)``."""
    return f"{int(dp)} x ({'x'.join(str(int(g)) for g in grid)})"


def rank_minibatch(workload, machine, gpus: int, *, batch_sizes=None, dp: int | None = None, comm_precision="fp32",
                   optimizer=None, options: Mapping | None = None, graph=None, samples: int = 4,
                   seed: int = 0) -> list[dict]:
    """Every (Gd, grid, B) of ``gpus`` GPUs ranked: feasible first, then by epoch time.

    Records hold :func:`predict_config`'s keys plus ``algorithm``, ``gpus``, ``config``,
    ``grid``, ``comm_precision`` and ``rank``. ``graph`` (an adjacency or Graph) gives the
    sampled shard nonzeros by sampling it (:func:`graph_sampled_nnz`, ``samples`` samples).
    """
    machine = machine if isinstance(machine, Machine) else load_machine(machine)
    choice = comm_precision if isinstance(comm_precision, CommPrecision) else parse_comm_precision(comm_precision or "fp32")
    configs = configurations(gpus, dp)
    records = []
    for batch in batch_candidates(workload.nodes, batch_sizes):
        opts = dict(options or {})
        if graph is not None:
            adjacency = getattr(graph, "adjacency", graph)
            if adjacency.shape[0] != workload.nodes:
                raise UserError(f"the graph has {adjacency.shape[0]} nodes but the workload {workload.nodes}; "
                                "describe the workload by the graph")
            opts["sampled_nnz"] = graph_sampled_nnz(_normalized(adjacency), batch, samples=samples, seed=seed)
        pred = predict_configs(workload, machine, configs, batch_size=batch, comm_precision=choice,
                               optimizer=optimizer, options=opts)
        for k in range(len(configs)):
            rec = {key: (value[k].item() if hasattr(value[k], "item") else value[k]) for key, value in pred.items()}
            grid = (int(rec["gx"]), int(rec["gy"]), int(rec["gz"]))
            rec.update({"algorithm": NAME, "gpus": int(gpus), "config": config_label(rec["gd"], grid),
                        "grid": format_grid(grid), "comm_precision": str(choice),
                        "memory_bytes": int(round(rec["memory_bytes"])), "feasible": bool(rec["feasible"])})
            records.append(rec)
    records.sort(key=lambda r: (not r["feasible"], r["total_ms"]))
    for rank, rec in enumerate(records, start=1):
        rec["rank"] = rank
    return records


def _normalized(adjacency):
    """The GCN-normalized adjacency the trainer samples (its nonzeros: the graph's with self-loops)."""
    return gcn_normalize(adjacency)


def parse_epochs_to_accuracy(text: str) -> dict[str, float]:
    """``full=E1,minibatch=E2`` -> {"full": E1, "minibatch": E2} (positive numbers); UserError otherwise."""
    out: dict[str, float] = {}
    for part in str(text).split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in ("full", "minibatch") or key in out:
            raise UserError(f"expected full=E1,minibatch=E2 (epochs each kind of training needs to reach the target "
                            f"accuracy), got {text!r}")
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not number > 0 or math.isinf(number):
            raise UserError(f"epochs must be positive numbers, got {key}={value.strip()!r}")
        out[key] = number
    if set(out) != {"full", "minibatch"}:
        raise UserError(f"give both, as full=E1,minibatch=E2; got {text!r}")
    return out


def time_to_accuracy(full_epoch_ms: float, minibatch_epoch_ms: float, epochs: Mapping) -> dict[str, float]:
    """Training time (s) to the target accuracy of each kind: epochs x epoch time."""
    return {"full_s": float(epochs["full"]) * float(full_epoch_ms) / 1e3,
            "minibatch_s": float(epochs["minibatch"]) * float(minibatch_epoch_ms) / 1e3}


#: The paper's strong-scaling results on Perlmutter (ScaleGNN: Communication-free Sampling and
#: 4D Hybrid Parallelism for Scalable Mini-batch GNN Training): dataset, first and last GPU
#: count (a near-cubic 3D grid of the first count, Gd from 1 up), measured speedup.
PAPER_SCALING = (("ogbn-papers100M", 64, 2048, 21.7), ("products-14M", 32, 1024, 19.8), ("ogbn-products", 8, 128, 7.8))


def near_cubic_grids(gpus: int) -> np.ndarray:
    """The 3D grids of ``gpus`` closest to a cube: those whose largest / smallest axis is least."""
    grids = enumerate_grids(check_gpus(gpus))
    spread = grids.max(axis=1) / grids.min(axis=1)
    return grids[spread == spread.min()]


def scaling_series(workload, machine, first_gpus: int, last_gpus: int, batch_size: int, *,
                   comm_precision="bf16", optimizer=None, fixed_features: bool = True) -> dict:
    """Strong scaling as the paper runs it: the fastest near-cubic grid of ``first_gpus`` at Gd = 1,
    kept, and Gd doubled up to ``last_gpus`` / ``first_gpus``; the input features fixed
    (``fixed_features``; docs/model.md, "Paper scaling"). Returns ``grid`` and ``rows``
    (gpus, gd, steps, total_ms, comm_dp_ms, step_ms, speedup over the first row)."""
    machine = machine if isinstance(machine, Machine) else load_machine(machine)
    if last_gpus % first_gpus:
        raise UserError(f"{last_gpus} GPUs is no multiple of {first_gpus}")
    candidates = near_cubic_grids(first_gpus)
    base = predict_configs(workload, machine, np.column_stack([np.ones(len(candidates), dtype=np.int64), candidates]),
                           batch_size=batch_size, comm_precision=comm_precision, optimizer=optimizer,
                           options={"fixed_features": fixed_features})
    grid = tuple(int(g) for g in candidates[int(np.argmin(base["total_ms"]))])
    dps = []
    gd = 1
    while gd * first_gpus <= last_gpus:
        dps.append(gd)
        gd *= 2
    pred = predict_configs(workload, machine, [(d, *grid) for d in dps], batch_size=batch_size,
                           comm_precision=comm_precision, optimizer=optimizer,
                           options={"fixed_features": fixed_features})
    rows = [{"gpus": d * first_gpus, "gd": d, "steps": int(pred["steps"][k]), "total_ms": float(pred["total_ms"][k]),
             "comm_dp_ms": float(pred["comm_dp_ms"][k]), "step_ms": float(pred["step_ms"][k]),
             "speedup": float(pred["total_ms"][0] / pred["total_ms"][k])} for k, d in enumerate(dps)]
    return {"grid": grid, "rows": rows}
