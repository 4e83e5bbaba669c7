"""Reduced-precision collectives: quantization, error bounds, bytes on the wire, parsing."""

import math

import numpy as np
import pytest
import torch

from plexus_tune.model.comm_precision import (
    COMM_CLASSES,
    COMM_PRECISIONS,
    CommPrecision,
    block_bytes,
    packed_bytes,
    param_bytes,
    parse_comm_precision,
    parse_precision,
    wire_bytes,
)
from plexus_tune.errors import UserError
from plexus_tune.launch import launch_local
from plexus_tune.trainer.precision import CommCounter, dequantize, quantize

U16 = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}  # unit roundoff of the 16-bit formats
LEVELS = {"int8": 255, "int4": 15, "int2": 3}
EPS32 = 2.0 ** -23


# ----------------------------------------------------------------------------------------
# inputs shared by the ranks and the checks
# ----------------------------------------------------------------------------------------
def _make_input(shape, rank, salt=0):
    """A deterministic per-rank tensor: rows of different scale and offset, one constant row."""
    seed = 10007 * salt + 7919 * rank + 31 * sum(shape) + len(shape)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen)
    if x.dim() >= 2:
        rows = x.shape[0]
        x = x * (1.0 + 10.0 * (torch.arange(rows) % 3)).view(-1, *([1] * (x.dim() - 1)))
        x = x + torch.arange(rows).view(-1, *([1] * (x.dim() - 1))) * 0.5
        if rows >= 3:
            x[2] = 1.25
    return x


def _cases(g):
    """(op, shape, dim) of the distributed checks for a group of g ranks."""
    reduce_shapes = [(2 * g, 16), (2 * g + 1, 6), (1, 5), (13, 3), (7,)]
    gather_shapes = [(3, 16), (5, 6), (7,)]
    cases = [("all_reduce", s, 0) for s in reduce_shapes]
    cases += [("all_gather", s, 0) for s in gather_shapes] + [("all_gather", (4, 3), 1)]
    cases += [("reduce_scatter", (3 * g, 8), 0), ("reduce_scatter", (5, 4 * g), 1)]
    return cases


def _rows_cols(shape):
    return (1, shape[0]) if len(shape) == 1 else (math.prod(shape[:-1]), shape[-1])


# ----------------------------------------------------------------------------------------
# rank bodies (module level: launch_local imports them)
# ----------------------------------------------------------------------------------------
def _run_cases(rank, world_size):
    import torch.distributed as dist

    from plexus_tune.trainer.precision import CommCounter, all_gather, all_reduce, reduce_scatter

    gen = torch.Generator().manual_seed(1000 + rank)
    results = {}
    for op, shape, dim in _cases(world_size):
        for precision in COMM_PRECISIONS:
            x = _make_input(shape, rank)
            before = x.clone()
            counter = CommCounter()
            if op == "all_reduce":
                out = all_reduce(x, None, precision, generator=gen, counter=counter)
                assert out is x
                cls = "aggregation"
            elif op == "all_gather":
                out = all_gather(x, None, precision, dim=dim, generator=gen, counter=counter)
                assert torch.equal(x, before)
                cls = "gather"
            else:
                out = reduce_scatter(x, None, precision, dim=dim, generator=gen, counter=counter)
                assert torch.equal(x, before)
                cls = "gather"
            others = [c for c in COMM_CLASSES if c != cls]
            assert all(counter.bytes[c] == 0 for c in others)
            results[(op, shape, dim, precision)] = (out.numpy().copy(), counter.bytes[cls], counter.calls[cls],
                                                    counter.quant_ms)

    # a non-contiguous input is reduced in place
    x = _make_input((6, 4), rank).t()
    out = all_reduce(x, None, "int4", generator=gen, comm_class="combination")
    results["transposed"] = (out is x, x.numpy().copy())

    # groups of one rank: the input comes back unchanged, nothing is counted
    singles = [dist.new_group([r]) for r in range(world_size)]
    x = _make_input((5, 3), rank)
    counter = CommCounter()
    same = []
    for precision in COMM_PRECISIONS:
        ref = x.clone()
        same.append(all_reduce(x, singles[rank], precision, generator=gen, counter=counter) is x
                    and torch.equal(x, ref))
        same.append(all_gather(x, singles[rank], precision, counter=counter) is x)
        same.append(reduce_scatter(x, singles[rank], precision, counter=counter) is x)
    results["single"] = (all(same), counter.total_bytes, sum(counter.calls.values()))

    # a sub-group: pairs {0, 1}, {2, 3} reduce separately
    if world_size == 4:
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        x = _make_input((5, 8), rank, salt=3)
        counter = CommCounter()
        all_reduce(x, pairs[rank // 2], "int8", generator=gen, counter=counter, comm_class="gather")
        results["pairs"] = (x.numpy().copy(), counter.bytes["gather"])
    return results  # numpy arrays: torch tensors would travel through shared memory


_RUNS = {}


def _results(g):
    """Per-rank results of :func:`_run_cases` on g local gloo ranks (one launch per g)."""
    if g not in _RUNS:
        runs = launch_local(_run_cases, g, timeout_s=120, threads_per_rank=1)
        _RUNS[g] = [{key: tuple(torch.from_numpy(v) if isinstance(v, np.ndarray) else v for v in value)
                     for key, value in per.items()} for per in runs]
    return _RUNS[g]


# ----------------------------------------------------------------------------------------
# error bounds derived from the inputs
# ----------------------------------------------------------------------------------------
def _row_steps(x, levels):
    """Per-row quantization step S = (max - min) / levels of x's rows x cols view, float64."""
    rows, cols = _rows_cols(tuple(x.shape))
    m = x.reshape(rows, cols).double()
    return (m.max(dim=1).values - m.min(dim=1).values) / levels


def _fp_slack(inputs, g):
    """Floating-point rounding of FP32 arithmetic over the g inputs (elementwise)."""
    return 4 * g * EPS32 * sum(x.double().abs() for x in inputs) + 1e-30


def _int_reduce_bound(inputs, levels):
    """All-reduce at intX, per element of the rows x cols view.

    Stage 1: each received chunk row is off by at most its sender's step, so the
    owner's FP32 sum s' is within E1 = sum_r S_r of the exact sum s. Stage 2: the
    requantized row is within S2 = range(s') / levels <= (range(s) + 2 E1) / levels.
    """
    rows, cols = _rows_cols(tuple(inputs[0].shape))
    e1 = sum(_row_steps(x, levels) for x in inputs)
    exact = sum(x.double() for x in inputs).reshape(rows, cols)
    s2 = (exact.max(dim=1).values - exact.min(dim=1).values + 2 * e1) / levels
    return (e1 + s2).view(rows, 1).expand(rows, cols)


def _check_within(result, exact, bound, label):
    err = (result.double() - exact).abs()
    worst = float((err - bound).max())
    assert worst <= 0, f"{label}: error exceeds bound by {worst:g}"
    return float(err.max())


# ----------------------------------------------------------------------------------------
# pure tests
# ----------------------------------------------------------------------------------------
def test_parse_precision_and_per_class_choices():
    assert parse_precision(" BF16 ") == "bf16"
    assert parse_comm_precision("bf16") == CommPrecision("bf16", "bf16", "bf16")
    mixed = parse_comm_precision("aggregation=int8, combination=bf16,gather=fp32")
    assert mixed == CommPrecision("int8", "bf16", "fp32")
    assert mixed.of("aggregation") == "int8" and mixed.of("gather") == "fp32"
    assert parse_comm_precision("int4,gather=fp32") == CommPrecision("int4", "int4", "fp32")
    assert parse_comm_precision("combination=int2") == CommPrecision("fp32", "int2", "fp32")
    for value in (mixed, CommPrecision("int2", "int2", "int2")):
        assert parse_comm_precision(str(value)) == value
    assert COMM_CLASSES == ("aggregation", "combination", "gather")


@pytest.mark.parametrize("text", ["int3", "fp64", "", "aggregation=int9", "scatter=bf16",
                                  "bf16,int8", "gather=bf16,gather=fp32", "aggregation=int8,,"])
def test_bad_precision_is_a_one_line_user_error(text):
    with pytest.raises(UserError) as info:
        parse_comm_precision(text)
    assert "\n" not in str(info.value) and str(info.value)


def test_quantize_round_trip_within_one_step():
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(37, 13, generator=gen) * 5, torch.randn(8, 9, generator=gen).t(),
              torch.randn(2, 3, 7, generator=gen), torch.randn(11, generator=gen),
              torch.randn(4, 6, generator=gen)[:, ::2]]
    for bits in (8, 4, 2):
        for x in inputs:
            q = quantize(x, bits, gen)
            rows, cols = _rows_cols(tuple(x.shape))
            assert q.data.dtype == torch.uint8 and q.data.shape == (rows, (cols * bits + 7) // 8)
            assert q.data.numel() == packed_bytes(rows, cols, bits)
            assert q.zero.dtype == q.scale.dtype == torch.float32 and q.zero.shape == (rows,)
            assert q.nbytes == packed_bytes(rows, cols, bits) + param_bytes(rows)
            y = dequantize(q)
            assert y.shape == x.shape and y.dtype == torch.float32
            step = _row_steps(x, 2 ** bits - 1).view(rows, 1)
            slack = 4 * EPS32 * x.abs().max().double()
            err = (y.reshape(rows, cols).double() - x.reshape(rows, cols).double()).abs()
            assert float((err - step - slack).max()) <= 0
            assert float(err.max()) > 0  # it really was rounded


def test_quantize_edge_cases():
    gen = torch.Generator().manual_seed(1)
    const = torch.full((3, 5), -2.75)
    mixed = torch.randn(4, 5, generator=gen)
    mixed[1] = 7.0
    for bits in (8, 4, 2):
        assert torch.equal(dequantize(quantize(const, bits, gen)), const)
        q = quantize(mixed, bits, gen)
        assert float(q.scale[1]) == 0.0 and torch.equal(dequantize(q)[1], mixed[1])
        for shape in [(0, 4), (4, 0), (0,)]:
            q = quantize(torch.empty(shape), bits, gen)
            assert dequantize(q).shape == shape
            rows, cols = _rows_cols(shape)
            assert q.nbytes == packed_bytes(rows, cols, bits) + param_bytes(rows)
        assert float(dequantize(quantize(torch.tensor(3.5), bits, gen))) == 3.5
    # int2 packs four codes a byte, int4 two, int8 one; rows keep byte boundaries
    assert [packed_bytes(3, 5, b) for b in (8, 4, 2)] == [15, 9, 6]
    with pytest.raises(ValueError):
        quantize(mixed, 3, gen)
    assert quantize(mixed, "int4", gen).bits == 4
    with pytest.raises(ValueError):
        quantize(mixed, "bf16", gen)


def test_counter_records_per_class():
    counter = CommCounter()
    counter.add("aggregation", 100, 1.5)
    counter.add("gather", 7, 0.5, calls=2)
    counter.quant_ms += 2.0
    record = counter.as_dict()
    assert record["aggregation_bytes"] == 100 and record["gather_calls"] == 2
    assert record["combination_bytes"] == 0 and record["quant_ms"] == 2.0
    assert counter.total_bytes == 107
    with pytest.raises(ValueError):
        counter.add("scatter", 1)
    counter.reset()
    assert counter.total_bytes == 0 and counter.quant_ms == 0.0


def test_stochastic_rounding_is_unbiased():
    """The mean of n independent quantizations is within 5 sigma of the input, with
    sigma <= S / (2 sqrt(n)) (a Bernoulli step of size S has variance <= S^2 / 4);
    rounding to nearest would be biased by up to S / 2 and fail."""
    n = 4000
    gen = torch.Generator().manual_seed(2)
    base = torch.linspace(-1.0, 2.0, 21)  # row min -1, max 2: fractional positions on every grid
    for bits in (2, 4, 8):
        levels = 2 ** bits - 1
        step = 3.0 / levels
        copies = base.expand(n, -1)  # every row has the same min and max: n draws per element
        mean = dequantize(quantize(copies, bits, gen)).double().mean(dim=0)
        bound = 5 * step / (2 * math.sqrt(n)) + 1e-6
        assert float((mean - base.double()).abs().max()) <= bound
        nearest = torch.round((base.double() + 1.0) / step) * step - 1.0
        assert float((nearest - base.double()).abs().max()) > bound  # the check can tell
    # successive calls draw fresh noise from the generator
    a = quantize(base, 2, gen).data
    assert any(not torch.equal(a, quantize(base, 2, gen).data) for _ in range(5))


def test_wire_bytes_formulas():
    g, rows, cols = 4, 1000, 64
    m = rows * cols * 4
    fp32 = wire_bytes("all_reduce", g, m, "fp32", rows)
    assert fp32.bytes == 2 * (g - 1) * m // g and fp32.steps == 2 * (g - 1) and fp32.calls == 1
    bf16 = wire_bytes("all_reduce", g, m, "bf16", rows)
    assert bf16.bytes * 2 == fp32.bytes and bf16.extra_steps == 0 and bf16.calls == 2
    int2 = wire_bytes("all_reduce", g, m, "int2", rows)
    assert int2.bytes == fp32.bytes // 16 + 2 * (g - 1) * param_bytes(rows // g)
    gather = wire_bytes("all_gather", g, m, "int4", rows)
    assert gather.bytes == (g - 1) * (packed_bytes(rows // g, cols, 4) + param_bytes(rows // g))
    assert wire_bytes("reduce_scatter", g, m, "int8", rows, dim=1).bytes == \
        (g - 1) * block_bytes(rows, cols // g, "int8")
    assert wire_bytes("all_reduce", 1, m, "int2", rows) == (0, 0, 0, 0)
    assert wire_bytes("all_gather", g, 0, "int8", 0).bytes == 0
    # numpy arrays of sizes
    sizes = np.array([16, 64, 256]) * rows * 4
    arr = wire_bytes("all_reduce", g, sizes, "int8", rows).bytes
    assert arr.tolist() == [wire_bytes("all_reduce", g, int(s), "int8", rows).bytes for s in sizes]
    with pytest.raises(ValueError):
        wire_bytes("all_gather", 3, m, "fp32", rows)  # 1000 rows do not split into 3 blocks


def test_model_module_does_not_import_torch():
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    code = ("import sys; import plexus_tune.model.comm_precision as m; "
            "m.wire_bytes('all_reduce', 4, 4096, 'int4', 16); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------------------------
# distributed tests (gloo, local processes)
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("g", [2, 3, 4])
def test_collectives_within_error_bounds(g):
    per_rank = _results(g)
    for op, shape, dim in _cases(g):
        inputs = [_make_input(shape, r) for r in range(g)]
        for precision in COMM_PRECISIONS:
            key = (op, shape, dim, precision)
            outs = [per_rank[r][key][0] for r in range(g)]
            label = f"g={g} {op} {shape} dim={dim} {precision}"
            slack = _fp_slack(inputs, g)
            if op == "all_reduce":
                exact = sum(x.double() for x in inputs)
                assert all(torch.equal(outs[0], o) for o in outs), f"{label}: ranks differ"
                if precision == "fp32":
                    bound = slack
                elif precision in U16:
                    u = U16[precision]
                    bound = (2 * u + 2 * u * u) * sum(x.double().abs() for x in inputs) + slack + 2.0 ** -24
                else:
                    bound = _int_reduce_bound(inputs, LEVELS[precision]).reshape(exact.shape) + slack
                err = _check_within(outs[0], exact, bound, label)
                assert precision == "fp32" or err > 0, f"{label}: no rounding at all"
            elif op == "all_gather":
                exact = torch.cat([x.double() for x in inputs], dim=dim)
                assert all(torch.equal(outs[0], o) for o in outs), f"{label}: ranks differ"
                if precision == "fp32":
                    assert torch.equal(outs[0].double(), exact), label
                    continue
                parts = []
                for x in inputs:
                    if precision in U16:
                        parts.append(U16[precision] * x.double().abs() + 2.0 ** -24)
                    else:
                        rows, cols = _rows_cols(tuple(x.shape))
                        steps = _row_steps(x, LEVELS[precision]).view(rows, 1).expand(rows, cols)
                        parts.append(steps.reshape(x.shape) + 4 * EPS32 * x.double().abs().max())
                _check_within(outs[0], exact, torch.cat(parts, dim=dim), label)
            else:
                blocks = [list(x.double().chunk(g, dim=dim)) for x in inputs]
                for r in range(g):
                    exact = sum(b[r] for b in blocks)
                    others = [inputs[k].chunk(g, dim=dim)[r] for k in range(g) if k != r]
                    own_slack = _fp_slack([b[r] for b in blocks], g)
                    if precision == "fp32":
                        bound = own_slack
                    elif precision in U16:
                        bound = U16[precision] * sum(o.double().abs() for o in others) + own_slack + 2.0 ** -24
                    else:
                        rows, cols = _rows_cols(tuple(exact.shape))
                        steps = sum(_row_steps(o, LEVELS[precision]) for o in others)
                        bound = steps.view(rows, 1).expand(rows, cols).reshape(exact.shape) + own_slack
                    _check_within(per_rank[r][key][0], exact, bound, f"{label} rank {r}")


@pytest.mark.parametrize("g", [2, 3, 4])
def test_counted_bytes_match_the_model_and_the_packed_sizes(g):
    per_rank = _results(g)
    for op, shape, dim in _cases(g):
        rows, cols = _rows_cols(shape)
        full_rows = rows * g if op == "all_gather" and dim == 0 else rows
        full_cols = cols * g if op == "all_gather" and dim == 1 else cols
        m = full_rows * full_cols * 4
        measured = {}
        for precision in COMM_PRECISIONS:
            counted = {per_rank[r][(op, shape, dim, precision)][1] for r in range(g)}
            calls = {per_rank[r][(op, shape, dim, precision)][2] for r in range(g)}
            assert len(counted) == 1 and len(calls) == 1
            measured[precision] = counted.pop()
            model = wire_bytes(op, g, m, precision, full_rows, dim=dim)
            assert measured[precision] == model.bytes, (op, shape, dim, precision)
            assert calls.pop() == model.calls
        label = (g, op, shape, dim)
        assert measured["bf16"] * 2 == measured["fp32"] == 2 * measured["fp16"], label
        # int2: 1/16 of FP32 plus the per-row parameters, exactly the packed sizes
        if op == "all_reduce":
            c = -(-rows // g)
            assert measured["int2"] == 2 * (g - 1) * (packed_bytes(c, cols, 2) + param_bytes(c)), label
            assert measured["int8"] == 2 * (g - 1) * (packed_bytes(c, cols, 8) + param_bytes(c)), label
            if rows % g == 0 and cols % 4 == 0:
                assert measured["int2"] == measured["fp32"] // 16 + 2 * (g - 1) * param_bytes(c), label
        else:
            if op == "all_gather":
                rb, cb = rows, cols  # the shape is the block
            else:
                rb, cb = (rows // g, cols) if dim == 0 else (rows, cols // g)
            assert measured["int2"] == (g - 1) * (packed_bytes(rb, cb, 2) + param_bytes(rb)), label
            if cb % 4 == 0:
                assert measured["int2"] == measured["fp32"] // 16 + (g - 1) * param_bytes(rb), label


def test_quant_time_is_counted_for_reduced_precisions():
    per_rank = _results(2)
    key = ("all_reduce", (4, 16), 0)
    assert per_rank[0][key + ("fp32",)][3] == 0.0
    assert all(per_rank[0][key + (p,)][3] > 0.0 for p in ("bf16", "int8", "int2"))


def test_in_place_non_contiguous_groups_of_one_and_sub_groups():
    for g in (2, 3, 4):
        per_rank = _results(g)
        inputs = [_make_input((6, 4), r).t() for r in range(g)]
        exact = sum(x.double() for x in inputs)
        bound = _int_reduce_bound(inputs, LEVELS["int4"]) + _fp_slack(inputs, g)
        for r in range(g):
            in_place, value = per_rank[r]["transposed"]
            assert in_place
            _check_within(value, exact, bound, f"g={g} transposed rank {r}")
            assert per_rank[r]["single"] == (True, 0, 0)
    per_rank = _results(4)
    for pair in ((0, 1), (2, 3)):
        inputs = [_make_input((5, 8), r, salt=3) for r in pair]
        bound = _int_reduce_bound(inputs, LEVELS["int8"]) + _fp_slack(inputs, 2)
        for r in pair:
            value, counted = per_rank[r]["pairs"]
            _check_within(value, sum(x.double() for x in inputs), bound, f"pair {pair} rank {r}")
            assert counted == wire_bytes("all_reduce", 2, 5 * 8 * 4, "int8", 5).bytes
