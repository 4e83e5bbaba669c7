"""Collectives that send fewer bits: 16-bit floats or stochastically rounded integers.

Precisions (:data:`COMM_PRECISIONS`): ``fp32`` (plain collectives), ``bf16`` and
``fp16`` (values cast to 16 bits on the wire, summed in FP32), ``int8``, ``int4`` and
``int2`` (per-row affine quantization with stochastic rounding, packed into bytes,
with an FP32 zero point and scale per row beside the data). Only the communicated
bytes change: every sum is taken in FP32 and every result is FP32.

Pure tensor functions
    :func:`quantize` / :func:`dequantize` and the size formulas
    :func:`packed_bytes` / :func:`param_bytes` (shared with the cost model in
    :mod:`plexus_tune.model.comm_precision`).

Collectives over a ``torch.distributed`` group
    :func:`all_reduce` (in place), :func:`all_gather` and :func:`reduce_scatter`
    (the gathers' backward). Each counts the bytes it hands to the process group
    for other ranks, and the time spent in local quantization work, in an optional
    :class:`CommCounter`. With a group of one rank they return the input unchanged.

Every rank of a group ends with bitwise the same all-reduced or gathered tensor:
an owned chunk is quantized once by its owner and every rank, the owner included,
decodes the same bytes. Pass each rank its own ``torch.Generator`` (seeded with
the rank) so that the rounding noise of different ranks is independent.

Schemes and error bounds are described in ``docs/comm-precision.md``.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from plexus_tune.model.comm_precision import (
    COMM_CLASSES,
    COUNTED_CLASSES,
    COMM_PRECISIONS,
    PRECISION_BITS,
    QUANTIZED_PRECISIONS,
    CommPrecision,
    check_comm_class,
    is_quantized,
    packed_bytes,
    param_bytes,
    parse_comm_precision,
    parse_precision,
)

__all__ = [
    "COMM_CLASSES", "COMM_PRECISIONS", "QUANTIZED_PRECISIONS", "CommCounter", "CommPrecision",
    "Quantized", "all_gather", "all_reduce", "dequantize", "is_quantized", "packed_bytes",
    "param_bytes", "parse_comm_precision", "parse_precision", "quantize", "reduce_scatter",
]

_LOW_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
_INT_BITS = (2, 4, 8)


# ----------------------------------------------------------------------------------------
# quantization (no process group)
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Quantized:
    """A tensor quantized per row: ``h' = q * scale[row] + zero[row]``.

    ``data`` is ``uint8`` of shape ``(rows, ceil(cols * bits / 8))``: value ``k`` of a
    byte sits in bits ``k*bits .. (k+1)*bits - 1`` (int4: two values a byte, int2:
    four), the last byte of a row zero-padded. ``zero`` and ``scale`` are FP32 of
    shape ``(rows,)``. Rows are the product of all dimensions but the last of
    ``shape`` (a 1-D tensor is one row).
    """

    data: torch.Tensor
    zero: torch.Tensor
    scale: torch.Tensor
    shape: tuple[int, ...]
    bits: int

    @property
    def rows(self) -> int:
        return _rows_cols(self.shape)[0]

    @property
    def cols(self) -> int:
        return _rows_cols(self.shape)[1]

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: packed data plus parameters."""
        return int(self.data.numel()) + param_bytes(self.rows)


def _bits_of(bits) -> int:
    if isinstance(bits, str):
        name = parse_precision(bits)
        if not is_quantized(name):
            raise ValueError(f"{name} is not an integer precision")
        return PRECISION_BITS[name]
    if int(bits) not in _INT_BITS:
        raise ValueError(f"bits must be one of {_INT_BITS}, got {bits!r}")
    return int(bits)


def _rows_cols(shape) -> tuple[int, int]:
    shape = tuple(int(s) for s in shape)
    if len(shape) == 0:
        return 1, 1
    return math.prod(shape[:-1]), shape[-1]


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as an FP32 ``rows x cols`` matrix (a copy when it must be one)."""
    rows, cols = _rows_cols(x.shape)
    return x.reshape(rows, cols).to(torch.float32)


def _pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Integer codes below ``2**bits`` (rows x cols, int16) -> packed uint8 (rows x row_bytes).

    The shifts run on int16 and only the packed bytes are narrowed to uint8: on CPU
    this is several times faster than converting every code to uint8 first.
    """
    if bits == 8:
        return q.to(torch.uint8)
    per = 8 // bits
    rows, cols = q.shape
    pad = (-cols) % per
    if pad:
        padded = q.new_zeros((rows, cols + pad))
        padded[:, :cols] = q
        q = padded
    q = q.view(rows, -1, per)
    out = q[..., 0].clone()
    for k in range(1, per):
        out.bitwise_or_(q[..., k] << (k * bits))
    return out.to(torch.uint8)


def _unpack(data: torch.Tensor, cols: int, bits: int) -> torch.Tensor:
    """Packed bytes (rows x row_bytes) -> uint8 values (rows x cols)."""
    if bits == 8:
        return data
    per = 8 // bits
    mask = (1 << bits) - 1
    parts = [(data >> (k * bits)) & mask if k else data & mask for k in range(per)]
    return torch.stack(parts, dim=-1).reshape(data.shape[0], -1)[:, :cols]


def _uniform(shape, generator, device) -> torch.Tensor:
    """FP32 uniforms (k + 1/2) / 2**16, k = 0 .. 2**16 - 1, four from each random 64-bit word.

    16 bits of noise are as many as ``floor(v + u)`` resolves anyway for int8 codes
    near 255 (FP32 spacing there is 2**-16); the rounding bias is at most 2**-17 of a
    step. ``random_(-2**63, None)`` fills int64 over its full range.
    """
    n = math.prod(shape)
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device)
    words.random_(-2 ** 63, None, generator=generator)
    u = words.view(torch.int16)[:n].view(shape).to(torch.float32)
    return u.mul_(2.0 ** -16).add_(0.5 + 2.0 ** -17)


def _quantize_rows(h: torch.Tensor, bits: int, generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(data, zero, scale) of an FP32 matrix; stochastic rounding floor(v + U[0, 1))."""
    rows, cols = h.shape
    levels = (1 << bits) - 1
    if rows == 0 or cols == 0:
        empty = torch.zeros(rows, device=h.device, dtype=torch.float32)
        data = torch.zeros((rows, (cols * bits + 7) // 8), dtype=torch.uint8, device=h.device)
        return data, empty, empty.clone()
    lo = h.amin(dim=1)                       # amin + amax: much faster than aminmax on CPU
    scale = (h.amax(dim=1) - lo) / levels
    divisor = torch.where(scale > 0, scale, torch.ones_like(scale))
    v = h - lo[:, None]                      # >= 0 exactly: lo is the row minimum
    v.div_(divisor[:, None])                 # in [0, levels] up to rounding; 0 on constant rows
    v.add_(_uniform(v.shape, generator, h.device))
    v.clamp_(0, levels)                      # v >= 0, so truncation below is the floor
    return _pack(v.to(torch.int16), bits), lo, scale


def _dequantize_rows(data: torch.Tensor, zero: torch.Tensor, scale: torch.Tensor, cols: int,
                     bits: int) -> torch.Tensor:
    q = _unpack(data, cols, bits).to(torch.float32)
    return q.mul_(scale[:, None]).add_(zero[:, None])


def quantize(x: torch.Tensor, bits, generator: torch.Generator | None = None) -> Quantized:
    """Quantize ``x`` per row to ``bits`` (2, 4, 8 or "int2"/"int4"/"int8").

    Row ``i`` of the ``rows x cols`` view gets ``Z = min``, ``S = (max - min) /
    (2**bits - 1)`` and ``q = floor((h - Z) / S + U)`` with ``U ~ U[0, 1)`` from
    ``generator``: ``E[q] = (h - Z) / S`` (unbiased) and ``|q S + Z - h| <= S``. A
    constant row has ``S = 0`` and comes back exactly. Any layout and floating dtype
    is accepted; values must be finite.
    """
    bits = _bits_of(bits)
    if not x.is_floating_point():
        raise TypeError(f"quantize needs a floating-point tensor, got {x.dtype}")
    data, zero, scale = _quantize_rows(_as_rows(x.detach()), bits, generator)
    return Quantized(data, zero, scale, tuple(int(s) for s in x.shape), bits)


def dequantize(q: Quantized) -> torch.Tensor:
    """The FP32 tensor ``q * scale + zero`` of ``q.shape``."""
    rows, cols = _rows_cols(q.shape)
    if rows == 0 or cols == 0:
        return torch.zeros(q.shape, dtype=torch.float32, device=q.data.device)
    return _dequantize_rows(q.data, q.zero, q.scale, cols, q.bits).reshape(q.shape)


# ----------------------------------------------------------------------------------------
# wire payloads: per chunk [zero (4 c bytes) | scale (4 c) | packed data (c row_bytes)]
# ----------------------------------------------------------------------------------------
def _encode_chunks(h: torch.Tensor, chunks: int, bits: int, generator) -> torch.Tensor:
    """FP32 (chunks * c) x cols -> uint8 (chunks, chunk_bytes), one payload per row chunk."""
    data, zero, scale = _quantize_rows(h, bits, generator)
    c = h.shape[0] // chunks
    return torch.cat([zero.view(torch.uint8).view(chunks, 4 * c),
                      scale.view(torch.uint8).view(chunks, 4 * c),
                      data.reshape(chunks, -1)], dim=1)


def _decode_chunks(buf: torch.Tensor, chunks: int, c: int, cols: int, bits: int) -> torch.Tensor:
    """uint8 (chunks, chunk_bytes) -> FP32 (chunks, c, cols)."""
    # flattened first: a single chunk's slice keeps the row stride, which need not be a multiple of 4
    zero = buf[:, :4 * c].reshape(-1).contiguous().view(torch.float32)
    scale = buf[:, 4 * c:8 * c].reshape(-1).contiguous().view(torch.float32)
    data = buf[:, 8 * c:].reshape(chunks * c, -1)
    return _dequantize_rows(data, zero, scale, cols, bits).view(chunks, c, cols)


# ----------------------------------------------------------------------------------------
# accounting
# ----------------------------------------------------------------------------------------
class CommCounter:
    """Bytes, calls and time of the precision-aware collectives, per collective class.

    ``bytes[cls]``: bytes this rank handed to the process group for other ranks
    (the convention of :mod:`plexus_tune.model.comm_precision`: a ring all-reduce
    counts ``2 (g-1) ceil(n/g)`` elements, an all-gather ``g - 1`` copies of the
    rank's block, an all-to-all the ``g - 1`` chunks addressed to others).
    ``calls[cls]``: process-group calls. ``comm_ms[cls]``: wall time inside them.
    ``quant_ms``: wall time of the local work the reduced precision adds (casts,
    quantize, dequantize, the FP32 sums of received chunks), not included in
    ``comm_ms``.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        # the precision classes always; the adjacency class once something is counted in it
        self.bytes: dict[str, int] = dict.fromkeys(COMM_CLASSES, 0)
        self.calls: dict[str, int] = dict.fromkeys(COMM_CLASSES, 0)
        self.comm_ms: dict[str, float] = dict.fromkeys(COMM_CLASSES, 0.0)
        self.quant_ms = 0.0

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    def add(self, comm_class: str, nbytes: int, ms: float = 0.0, calls: int = 1) -> None:
        if comm_class not in COUNTED_CLASSES:
            check_comm_class(comm_class)
        self.bytes[comm_class] = self.bytes.get(comm_class, 0) + int(nbytes)
        self.calls[comm_class] = self.calls.get(comm_class, 0) + int(calls)
        self.comm_ms[comm_class] = self.comm_ms.get(comm_class, 0.0) + float(ms)

    def as_dict(self) -> dict[str, float]:
        """Flat record for logs: ``<cls>_bytes``, ``<cls>_calls``, ``<cls>_comm_ms``, ``quant_ms``."""
        out: dict[str, float] = {}
        for name in COMM_CLASSES:
            out[f"{name}_bytes"] = self.bytes[name]
            out[f"{name}_calls"] = self.calls[name]
            out[f"{name}_comm_ms"] = self.comm_ms[name]
        out["quant_ms"] = self.quant_ms
        return out

    def __repr__(self) -> str:
        return f"CommCounter(bytes={self.bytes}, calls={self.calls}, quant_ms={self.quant_ms:.3f})"


class _Meter:
    """Times one collective's local work and process-group calls into a counter."""

    def __init__(self, counter: CommCounter | None, comm_class: str):
        self.counter = counter
        self.comm_class = check_comm_class(comm_class)

    @contextmanager
    def local(self):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.counter is not None:
                self.counter.quant_ms += (time.perf_counter() - t0) * 1e3

    def send(self, fn, *args, nbytes: int, **kwargs) -> None:
        t0 = time.perf_counter()
        fn(*args, **kwargs)
        if self.counter is not None:
            self.counter.add(self.comm_class, nbytes, (time.perf_counter() - t0) * 1e3)


def _all_gather_into(out: torch.Tensor, inp: torch.Tensor, group) -> None:
    """Gather contiguous ``inp`` of every rank into contiguous ``out`` (flat views: gloo
    wants the output to be the input's shape with dim 0 scaled by the group size)."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out.view(-1), inp.view(-1), group=group)


def _native_reduce_scatter(out: torch.Tensor, inp: torch.Tensor, group) -> bool:
    """FP32 reduce-scatter by the backend; False where the backend has none."""
    fn = getattr(dist, "reduce_scatter_single", None) or getattr(dist, "reduce_scatter_tensor", None)
    if fn is None:
        return False
    try:
        fn(out, inp, group=group)
    except (RuntimeError, NotImplementedError) as exc:
        if "support" not in str(exc).lower():
            raise
        return False
    return True


def _collective_setup(x, group, precision: str, counter, comm_class: str):
    """(precision parsed, its byte meter, group size) for one collective call, after checking
    that ``x`` is a floating tensor the precision can encode."""
    precision = parse_precision(precision)
    _check_float(x, precision)
    return precision, _Meter(counter, comm_class), dist.get_world_size(group)


def _check_float(x: torch.Tensor, precision: str) -> None:
    if precision != "fp32" and not x.is_floating_point():
        raise TypeError(f"{precision} communication needs a floating-point tensor, got {x.dtype}")


# ----------------------------------------------------------------------------------------
# two halves shared by the collectives
# ----------------------------------------------------------------------------------------
def _exchange_sum(blocks: torch.Tensor, group, g: int, me: int, precision: str, generator,
                  meter: _Meter) -> torch.Tensor:
    """First half of a reduce: send block ``j`` of ``(g, rows, cols)`` FP32 to rank ``j``,
    return this rank's FP32 sum ``(rows, cols)`` of the blocks it receives (its own
    contribution exact, the others at ``precision``)."""
    _, rows, cols = blocks.shape
    if precision in _LOW_DTYPES:
        with meter.local():
            send = blocks.to(_LOW_DTYPES[precision])
            recv = torch.empty_like(send)
        meter.send(dist.all_to_all_single, recv, send, group=group,
                   nbytes=(g - 1) * send[0].numel() * send.element_size())
        with meter.local():
            parts = recv.to(torch.float32)
    else:
        bits = PRECISION_BITS[precision]
        with meter.local():
            # the chunk this rank keeps is not quantized; its slot stays zero
            chunk_bytes = packed_bytes(rows, cols, bits) + param_bytes(rows)
            send = torch.zeros((g, chunk_bytes), dtype=torch.uint8, device=blocks.device)
            for lo, hi in ((0, me), (me + 1, g)):
                if hi > lo:
                    send[lo:hi] = _encode_chunks(blocks[lo:hi].reshape((hi - lo) * rows, cols), hi - lo,
                                                 bits, generator)
            recv = torch.empty_like(send)
        meter.send(dist.all_to_all_single, recv.view(-1), send.view(-1), group=group,
                   nbytes=(g - 1) * send.shape[1])
        with meter.local():
            parts = _decode_chunks(recv, g, rows, cols, bits)
    with meter.local():
        total = blocks[me].clone()          # own contribution, unrounded
        for r in range(g):                  # then the others in rank order
            if r != me:
                total.add_(parts[r])
        return total


def _gather_blocks(block: torch.Tensor, group, g: int, precision: str, generator,
                   meter: _Meter) -> torch.Tensor:
    """All-gather an FP32 ``(rows, cols)`` block at ``precision`` -> FP32 ``(g, rows, cols)``,
    the same on every rank (the own block too is decoded from what was sent)."""
    rows, cols = block.shape
    if precision == "fp32":
        block = block.contiguous()
        out = torch.empty((g, rows, cols), dtype=block.dtype, device=block.device)
        meter.send(_all_gather_into, out, block, group, nbytes=(g - 1) * block.numel() * block.element_size())
        return out
    if precision in _LOW_DTYPES:
        with meter.local():
            send = block.to(_LOW_DTYPES[precision]).contiguous()
            recv = torch.empty((g, rows, cols), dtype=send.dtype, device=send.device)
        meter.send(_all_gather_into, recv, send, group, nbytes=(g - 1) * send.numel() * send.element_size())
        with meter.local():
            return recv.to(torch.float32)
    bits = PRECISION_BITS[precision]
    with meter.local():
        send = _encode_chunks(block, 1, bits, generator).view(-1)
        recv = torch.empty((g, send.numel()), dtype=torch.uint8, device=send.device)
    meter.send(_all_gather_into, recv.view(-1), send, group, nbytes=(g - 1) * send.numel())
    with meter.local():
        return _decode_chunks(recv, g, rows, cols, bits)


# ----------------------------------------------------------------------------------------
# collectives
# ----------------------------------------------------------------------------------------
def all_reduce(x: torch.Tensor, group=None, precision: str = "fp32", *,
               generator: torch.Generator | None = None, counter: CommCounter | None = None,
               comm_class: str = "aggregation") -> torch.Tensor:
    """Sum ``x`` over ``group`` in place at ``precision``; returns ``x``.

    * ``fp32``: ``torch.distributed.all_reduce``.
    * ``bf16`` / ``fp16``: the flattened tensor is cut into ``g`` chunks (zero-padded
      to ``g * ceil(n / g)``); an all-to-all sends chunk ``j`` to rank ``j`` in 16
      bits, rank ``j`` sums its chunks in FP32 (its own unrounded) and rounds the sum
      to 16 bits, an all-gather returns every owned chunk. Wire volume of a ring
      all-reduce at 16 bits; the sum is not rounded at every hop as a 16-bit ring
      would round it.
    * ``int8`` / ``int4`` / ``int2``: the same with row chunks (rows padded to a
      multiple of ``g``), each chunk quantized per row with its own zero and scale;
      the owner dequantizes the ``g - 1`` chunks it receives, sums in FP32 with its
      own, requantizes the sum per row and all-gathers it. Integer codes are never
      added, and scales of different ranks never mix.

    Every rank holds bitwise the same result. ``comm_class`` picks the counter
    entry. The input must be the same shape on every rank.
    """
    precision, meter, g = _collective_setup(x, group, precision, counter, comm_class)
    n = x.numel()
    if g == 1 or n == 0:
        return x
    if precision == "fp32":
        buf = x if x.is_contiguous() else x.contiguous()
        meter.send(dist.all_reduce, buf, group=group,
                   nbytes=2 * (g - 1) * (-(-n // g)) * buf.element_size())
        if buf is not x:
            x.copy_(buf)
        return x
    me = dist.get_rank(group)
    with meter.local():
        if precision in _LOW_DTYPES:
            c = -(-n // g)
            flat = x.reshape(-1).to(torch.float32)
            blocks = _pad_rows(flat, g * c).view(g, 1, c)
        else:
            rows, cols = _rows_cols(x.shape)
            c = -(-rows // g)
            blocks = _pad_rows(_as_rows(x), g * c).view(g, c, cols)
    owned = _exchange_sum(blocks, group, g, me, precision, generator, meter)
    gathered = _gather_blocks(owned, group, g, precision, generator, meter)
    with meter.local():
        if precision in _LOW_DTYPES:
            x.copy_(gathered.reshape(-1)[:n].view(x.shape))
        else:
            x.copy_(gathered.reshape(g * c, -1)[:rows].reshape(x.shape))
    return x


def _pad_rows(h: torch.Tensor, rows: int) -> torch.Tensor:
    """``h`` with zero rows appended up to ``rows`` (``h`` itself when contiguous and long enough)."""
    if h.shape[0] == rows:
        return h.contiguous()
    out = h.new_zeros((rows,) + tuple(h.shape[1:]))
    out[:h.shape[0]] = h
    return out


def _join(blocks: torch.Tensor, dim: int) -> torch.Tensor:
    """``(g, *block_shape)`` -> the blocks concatenated along ``dim``."""
    if dim == 0:
        return blocks.reshape((-1,) + tuple(blocks.shape[2:]))
    return torch.cat(list(blocks.unbind(0)), dim=dim)


def all_gather(x: torch.Tensor, group=None, precision: str = "fp32", *, dim: int = 0,
               generator: torch.Generator | None = None, counter: CommCounter | None = None,
               comm_class: str = "gather") -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` (group rank order) at ``precision``.

    The block is cast (16-bit) or quantized per row (intX) once, the packed bytes
    and per-row parameters gathered in one call, and every block decoded, this
    rank's own included, so that all ranks hold the same tensor. Returns a new
    tensor of ``x``'s dtype (``x`` itself for a group of one).
    """
    precision, meter, g = _collective_setup(x, group, precision, counter, comm_class)
    if g == 1:
        return x
    dim = dim % max(x.dim(), 1)
    if x.numel() == 0:
        return torch.cat([x] * g, dim=dim)
    rows, cols = _rows_cols(x.shape)
    block = x.reshape(rows, cols) if precision == "fp32" else _as_rows(x)
    gathered = _gather_blocks(block, group, g, precision, generator, meter)
    with meter.local():
        out = _join(gathered.view((g,) + tuple(x.shape)), dim)
        return out if out.dtype == x.dtype else out.to(x.dtype)


def reduce_scatter(x: torch.Tensor, group=None, precision: str = "fp32", *, dim: int = 0,
                   generator: torch.Generator | None = None, counter: CommCounter | None = None,
                   comm_class: str = "gather") -> torch.Tensor:
    """Sum ``x`` over ``group`` and keep this rank's block of ``g`` equal blocks along ``dim``.

    The backward of :func:`all_gather`. ``fp32`` uses the backend's reduce-scatter
    (an FP32 all-to-all where it has none); the other precisions send block ``j``
    to rank ``j`` at ``precision`` in one all-to-all and sum the received blocks in
    FP32, this rank's own contribution unrounded. Returns a new tensor.
    """
    precision, meter, g = _collective_setup(x, group, precision, counter, comm_class)
    if g == 1:
        return x
    dim = dim % max(x.dim(), 1)
    if x.dim() == 0 or x.shape[dim] % g:
        raise ValueError(f"reduce_scatter: dimension {dim} of shape {tuple(x.shape)} does not split "
                         f"into {g} equal blocks")
    block_shape = list(x.shape)
    block_shape[dim] //= g
    me = dist.get_rank(group)
    if x.numel() == 0:
        return x.new_zeros(block_shape)
    rows, cols = _rows_cols(block_shape)
    if dim == 0 and x.is_contiguous():
        stacked = x.view(g, rows, cols)
    else:
        stacked = torch.stack(list(x.chunk(g, dim=dim))).reshape(g, rows, cols)
    if precision == "fp32":
        out = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
        nbytes = (g - 1) * out.numel() * out.element_size()
        t0 = time.perf_counter()
        if _native_reduce_scatter(out.view(-1), stacked.reshape(-1), group):
            if counter is not None:
                counter.add(comm_class, nbytes, (time.perf_counter() - t0) * 1e3)
        else:
            recv = torch.empty_like(stacked)
            meter.send(dist.all_to_all_single, recv.view(-1), stacked.reshape(-1), group=group,
                       nbytes=nbytes)
            out = recv.sum(dim=0)
        return out.view(block_shape)
    with meter.local():
        blocks = stacked.to(torch.float32)
    owned = _exchange_sum(blocks, group, g, me, precision, generator, meter)
    with meter.local():
        owned = owned.view(block_shape)
        return owned if owned.dtype == x.dtype else owned.to(x.dtype)
