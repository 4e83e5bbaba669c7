"""Wire volume of reduced-precision collectives, without torch.

This module holds everything about communication precision that a cost model needs:
the precision names, the per-class choice parser, the packed-size formulas and
:func:`wire_bytes`. The torch implementation (:mod:`plexus_tune.trainer.precision`)
imports its names and sizes from here, so the model and what is sent cannot drift
apart.

Byte accounting convention: **bytes one rank sends to other ranks** for one call,
under the textbook algorithm of each primitive:

* ring all-reduce of ``n`` elements: the buffer is cut into ``g`` chunks of
  ``ceil(n / g)`` elements; a rank sends ``g - 1`` chunks while reducing and
  ``g - 1`` while gathering, ``2 (g - 1) ceil(n / g)`` elements (``2 (g - 1) / g M``
  when ``g`` divides ``n``);
* all-gather / reduce-scatter of ``g`` equal blocks: ``g - 1`` blocks (the ring
  forwards ``g - 1`` blocks, a direct scheme sends its block to ``g - 1`` peers);
* all-to-all: the ``g - 1`` chunks addressed to other ranks (the chunk a rank keeps
  costs nothing).

Latency is counted in steps, the sequential message rounds of one rank: a ring
all-reduce takes ``2 (g - 1)``, a ring all-gather or reduce-scatter ``g - 1``, a
pairwise all-to-all ``g - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from plexus_tune.errors import UserError

#: Communication precisions, widest first.
COMM_PRECISIONS = ("fp32", "bf16", "fp16", "int8", "int4", "int2")
#: Bits per value on the wire.
PRECISION_BITS = {"fp32": 32, "bf16": 16, "fp16": 16, "int8": 8, "int4": 4, "int2": 2}
#: Integer precisions: per-row affine quantization with stochastic rounding.
QUANTIZED_PRECISIONS = ("int8", "int4", "int2")
#: Collective classes of the 3D-parallel GCN layer that take a precision each:
#: ``aggregation`` all-reduces H = A F (and dH) over the outer axis, ``combination``
#: all-reduces Q = H W over the inner axis, ``gather`` all-gathers F and W over depth
#: and covers the matching reduce-scatters and depth all-reduces of gradients.
COMM_CLASSES = ("aggregation", "combination", "gather")
#: Sparse adjacency pieces that an algorithm moves (CAGNET 2D): counted beside the
#: precision classes, always sent as FP32 values with int32 indices (docs/algorithms.md).
ADJACENCY_CLASS = "adjacency"
#: Every class whose bytes the trainer counts.
COUNTED_CLASSES = COMM_CLASSES + (ADJACENCY_CLASS,)
#: Collective operations :func:`wire_bytes` knows.
COMM_OPS = ("all_reduce", "all_gather", "reduce_scatter")
#: Bytes of quantization parameters per row: zero point and scale, FP32 each.
PARAM_BYTES_PER_ROW = 8


def parse_precision(text: str) -> str:
    """The canonical name of a communication precision (case and spaces ignored)."""
    name = str(text).strip().lower()
    if name not in COMM_PRECISIONS:
        raise UserError(f"unknown communication precision {str(text).strip()!r}; "
                        f"choose one of {', '.join(COMM_PRECISIONS)}")
    return name


def is_quantized(precision: str) -> bool:
    """True for the integer precisions (int8, int4, int2)."""
    return precision in QUANTIZED_PRECISIONS


def check_comm_class(name: str) -> str:
    """``name`` if it is one of :data:`COMM_CLASSES`, else ValueError."""
    if name not in COMM_CLASSES:
        raise ValueError(f"unknown collective class {name!r}; expected one of {', '.join(COMM_CLASSES)}")
    return name


@dataclass(frozen=True)
class CommPrecision:
    """The precision of each collective class."""

    aggregation: str = "fp32"
    combination: str = "fp32"
    gather: str = "fp32"

    def of(self, comm_class: str) -> str:
        """The precision of one collective class."""
        return getattr(self, check_comm_class(comm_class))

    def as_dict(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in COMM_CLASSES}

    def __str__(self) -> str:
        values = [getattr(self, name) for name in COMM_CLASSES]
        if len(set(values)) == 1:
            return values[0]
        return ",".join(f"{name}={value}" for name, value in zip(COMM_CLASSES, values))


def parse_comm_precision(text: str) -> CommPrecision:
    """Per-class precisions from ``"bf16"`` or ``"aggregation=int8,combination=bf16"``.

    A comma-separated list of ``class=precision`` items and at most one bare
    precision, which applies to every class the list does not name; classes named
    nowhere stay ``fp32``. ``str()`` of the result parses back to the same value.
    """
    raw = str(text).strip()
    if not raw:
        raise UserError("empty communication precision; give e.g. 'bf16' or "
                        "'aggregation=int8,combination=bf16,gather=fp32'")
    default = None
    chosen: dict[str, str] = {}
    for item in raw.split(","):
        item = item.strip()
        if not item:
            raise UserError(f"empty item in communication precision {raw!r}")
        if "=" not in item:
            if default is not None:
                raise UserError(f"communication precision {raw!r} gives more than one precision "
                                "without a class name")
            default = parse_precision(item)
            continue
        name, _, value = item.partition("=")
        name = name.strip().lower()
        if name not in COMM_CLASSES:
            raise UserError(f"unknown collective class {name!r} in {raw!r}; "
                            f"choose from {', '.join(COMM_CLASSES)}")
        if name in chosen:
            raise UserError(f"collective class {name!r} given twice in {raw!r}")
        chosen[name] = parse_precision(value)
    base = default or "fp32"
    return CommPrecision(**{name: chosen.get(name, base) for name in COMM_CLASSES})


#: Element type each precision puts on the wire (the integer codes travel as bytes).
WIRE_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16",
               "int8": "uint8", "int4": "uint8", "int2": "uint8"}
#: Element types the collectives of each torch.distributed backend send (all-reduce,
#: all-gather, reduce-scatter and all-to-all; checked for gloo on torch 2.13, and
#: NCCL's types since 2.10 list float32, bfloat16, float16 and uint8). A backend not
#: named here is taken to send FP32 only.
BACKEND_WIRE_DTYPES = {"gloo": ("float32", "bfloat16", "float16", "uint8"),
                       "nccl": ("float32", "bfloat16", "float16", "uint8")}


def check_backend(backend: str, choice: "CommPrecision | str") -> None:
    """UserError if ``backend`` cannot send the element type some class of ``choice`` needs."""
    choice = choice if isinstance(choice, CommPrecision) else parse_comm_precision(choice)
    sends = BACKEND_WIRE_DTYPES.get(str(backend), ("float32",))
    for name in COMM_CLASSES:
        precision = choice.of(name)
        dtype = WIRE_DTYPES[precision]
        if dtype not in sends:
            raise UserError(f"the {backend} backend cannot send {dtype}, which {precision} communication "
                            f"needs ({name} collectives); choose another precision or backend")


def packed_bytes(rows, cols, bits: int):
    """Bytes of the packed values of a ``rows x cols`` block at ``bits`` per value.

    Each row starts on a byte boundary: ``rows * ceil(cols * bits / 8)`` (int8 one
    value a byte, int4 two, int2 four; the last byte of a row is zero-padded). Works
    on ints and numpy arrays alike.
    """
    rows = np.asarray(rows, dtype=np.int64)
    cols = np.asarray(cols, dtype=np.int64)
    return _scalar(rows * ((cols * int(bits) + 7) // 8))


def param_bytes(rows):
    """Bytes of the quantization parameters of ``rows`` rows: zero and scale, FP32."""
    return _scalar(np.asarray(rows, dtype=np.int64) * PARAM_BYTES_PER_ROW)


def block_bytes(rows, cols, precision: str):
    """Bytes of one ``rows x cols`` block as sent at ``precision`` (data plus parameters)."""
    bits = PRECISION_BITS[parse_precision(precision)]
    size = np.asarray(packed_bytes(rows, cols, bits), dtype=np.int64)
    if is_quantized(precision):
        size = size + np.asarray(param_bytes(rows), dtype=np.int64)
    return _scalar(size)


def process_group_calls(op: str, precision: str) -> int:
    """Process-group calls of one collective at ``precision`` (group of 2+ ranks, non-empty buffer).

    The reduced-precision all-reduce is two (all-to-all of chunks, then all-gather of the
    owned sums); every other collective, and the FP32 all-reduce, one.
    """
    if op not in COMM_OPS:
        raise ValueError(f"unknown collective {op!r}; expected one of {', '.join(COMM_OPS)}")
    return 2 if op == "all_reduce" and parse_precision(precision) != "fp32" else 1


class WireCost(NamedTuple):
    """What one rank pays for one collective call.

    ``bytes``: bytes sent to other ranks; ``steps``: sequential message rounds;
    ``extra_steps``: steps beyond the FP32 collective it replaces; ``calls``:
    process-group calls (the low-precision all-reduce is two: all-to-all, then
    all-gather).
    """

    bytes: int
    steps: int
    extra_steps: int
    calls: int


def wire_bytes(op: str, group_size: int, message_bytes_fp32, precision: str, rows=None, *,
               dim: int = 0) -> WireCost:
    """Bytes one rank sends for ``op`` over a ``message_bytes_fp32``-byte FP32 buffer.

    ``message_bytes_fp32`` (M) and ``rows`` describe the whole buffer, seen as a 2-D
    ``rows x cols`` FP32 tensor (``cols = M / (4 rows)``): the reduced tensor of
    ``all_reduce``, the gathered output of ``all_gather``, the input of
    ``reduce_scatter``. The all-gather and reduce-scatter blocks split it along
    ``dim`` (0: rows, 1: columns) into ``g`` equal blocks of ``rb x cb``.
    Quantized blocks carry their own per-row parameters. With ``g = 1`` or an empty
    buffer nothing is sent. Let ``n = M / 4`` and ``b`` the bits of ``precision``:

    ``all_reduce``
        * fp32, ring: ``2 (g-1) ceil(n/g) 4`` bytes, ``2 (g-1)`` steps, 1 call;
        * bf16/fp16, all-to-all of ``g`` flat 16-bit chunks of ``c = ceil(n/g)``
          elements (summed in FP32 by their owner), then all-gather of the owned
          16-bit chunks: ``2 (g-1) c 2`` bytes, exactly half of FP32;
        * intX, rows cut into ``g`` chunks of ``c = ceil(rows/g)`` rows (the last
          ones zero-padded), each sent as ``packed_bytes(c, cols, b) +
          param_bytes(c)``, once in the all-to-all and once in the all-gather:
          ``2 (g-1) (packed_bytes(c, cols, b) + 8 c)``, i.e. ``2 (g-1)/g (M b/32 +
          8 rows)`` when ``g`` divides ``rows`` and ``cols b`` is a multiple of 8.
        The two-call schemes take ``(g-1) + (g-1)`` steps, as many as the ring.

    ``all_gather`` (ring, ``g - 1`` steps, 1 call)
        ``(g-1) block`` with ``block = rb cb 4`` (fp32), ``rb cb 2`` (16-bit) or
        ``packed_bytes(rb, cb, b) + 8 rb`` (intX).

    ``reduce_scatter`` (``g - 1`` steps, 1 call)
        the same ``(g-1) block``: fp32 as a ring reduce-scatter, the other
        precisions as an all-to-all of the ``g`` blocks whose owner sums them in FP32.

    Accepts numpy arrays for ``message_bytes_fp32`` and ``rows``; ``bytes`` is then
    an array (``steps`` and ``calls`` assume a non-empty buffer).
    """
    if op not in COMM_OPS:
        raise ValueError(f"unknown collective {op!r}; expected one of {', '.join(COMM_OPS)}")
    precision = parse_precision(precision)
    g = int(group_size)
    if g < 1:
        raise ValueError("group_size must be at least 1")
    bits = PRECISION_BITS[precision]
    m = np.asarray(message_bytes_fp32, dtype=np.int64)
    if np.any(m % 4):
        raise ValueError("message_bytes_fp32 must be a whole number of FP32 values")
    n = m // 4
    quantized = is_quantized(precision)
    if rows is None:
        if quantized or op != "all_reduce":
            raise ValueError(f"rows is needed for {op} at {precision}")
        rows = np.ones_like(n)
    r = np.asarray(rows, dtype=np.int64)
    cols = np.where(r > 0, n // np.maximum(r, 1), 0)
    if np.any(cols * r != n):
        raise ValueError("message_bytes_fp32 / 4 must be a multiple of rows")

    if op == "all_reduce":
        steps = 2 * (g - 1)
        calls = process_group_calls(op, precision)
        if quantized:
            c = -(-r // g)
            per_chunk = np.asarray(block_bytes(c, cols, precision), dtype=np.int64)
            sent = 2 * (g - 1) * per_chunk
        else:
            c = -(-n // g)
            sent = 2 * (g - 1) * c * (bits // 8)
    else:
        if dim not in (0, 1):
            raise ValueError("dim must be 0 (rows) or 1 (columns)")
        split = r if dim == 0 else cols
        if np.any(split % g):
            raise ValueError(f"{'rows' if dim == 0 else 'columns'} must split into {g} equal blocks")
        rb, cb = (r // g, cols) if dim == 0 else (r, cols // g)
        sent = (g - 1) * np.asarray(block_bytes(rb, cb, precision), dtype=np.int64)
        steps, calls = g - 1, 1
    sent = np.where(n > 0, sent, 0)
    if g == 1 or (n.ndim == 0 and n == 0):
        return WireCost(_scalar(np.zeros_like(sent)), 0, 0, 0)
    baseline_steps = 2 * (g - 1) if op == "all_reduce" else g - 1
    return WireCost(_scalar(sent), steps, steps - baseline_steps, calls)


def _scalar(value):
    """A Python int for a 0-d result, the array otherwise."""
    arr = np.asarray(value)
    return int(arr) if arr.ndim == 0 else arr


# ----------------------------------------------------------------------------------------
# cost model terms (docs/comm-precision.md, "In the cost model")
# ----------------------------------------------------------------------------------------
def wire_message_bytes(message_bytes_fp32, rows, precision: str, element_bytes: float = 4.0):
    """The FP32-equivalent buffer M' whose ring collective sends what ``precision`` sends.

    ``M' = (M / u) b / 8 + [intX] 8 rows`` for an M-byte buffer of u-byte elements
    seen as ``rows`` rows: the values at b bits plus the FP32 zero point and scale of
    every row. A ring moves ``factor M'`` bytes per rank, which is :func:`wire_bytes`
    exactly when ``g`` divides ``rows`` and ``cols b`` is a multiple of 8 (the
    continuous form of SuperGCN, section 6, eqs. 3-8). Vectorized (floats allowed).
    """
    precision = parse_precision(precision)
    m = np.asarray(message_bytes_fp32, dtype=np.float64)
    out = m / float(element_bytes) * PRECISION_BITS[precision] / 8.0
    if is_quantized(precision):
        out = out + PARAM_BYTES_PER_ROW * np.asarray(rows, dtype=np.float64)
    return out


def codec_bytes(op: str, group_size, message_bytes_fp32) -> tuple[np.ndarray, np.ndarray]:
    """(encoded, decoded) FP32 bytes one rank quantizes and dequantizes (or casts) per call.

    With g ranks and an M-byte buffer (docs/comm-precision.md, "Schemes"):
    all-reduce encodes the g-1 chunks it sends and its owned sum, M, and decodes the
    g-1 received chunks and the g gathered ones, (2g-1)/g M; all-gather encodes its
    block, M/g, and decodes all g, M; reduce-scatter encodes and decodes g-1 blocks,
    (g-1)/g M each. A group of one rank does nothing.
    """
    if op not in COMM_OPS:
        raise ValueError(f"unknown collective {op!r}; expected one of {', '.join(COMM_OPS)}")
    g = np.asarray(group_size, dtype=np.float64)
    m = np.asarray(message_bytes_fp32, dtype=np.float64)
    if op == "all_reduce":
        enc, dec = m, (2.0 * g - 1.0) / g * m
    elif op == "all_gather":
        enc, dec = m / g, m
    else:
        enc = dec = (g - 1.0) / g * m
    alone = g <= 1
    return np.where(alone, 0.0, enc), np.where(alone, 0.0, dec)


#: keys of a profile's ``quant`` entry per precision (GB/s of FP32 data through the codec)
QUANT_RATE_KEYS = ("encode_gbps", "decode_gbps")
#: optional key of a ``quant`` entry: ms each process-group call of the scheme adds
QUANT_CALL_KEY = "call_ms"
#: optional key of a ``quant`` entry: the same for groups that span nodes (default: ``call_ms``)
QUANT_CALL_INTER_KEY = "call_inter_ms"


def quant_rates(quant: dict | None, precision: str) -> tuple[float, float, float, float] | None:
    """(encode GB/s, decode GB/s, call ms, inter-node call ms) of ``precision`` from a profile's
    ``quant`` entry (None if absent).

    ``quant`` maps a precision to ``{"encode_gbps": .., "decode_gbps": .., "call_ms": ..,
    "call_inter_ms": ..}``: the codec rates (the casts for bf16/fp16, quantize and dequantize
    for intX, per rank, one thread) and the time each process-group call of the scheme adds
    beyond its bytes and its codec, in a group inside one node and in a group that spans
    nodes (both optional: default 0, and the inter-node one defaults to ``call_ms``;
    docs/comm-precision.md, "In the cost model").
    """
    precision = parse_precision(precision)
    entry = (quant or {}).get(precision)
    if precision == "fp32" or entry is None:
        return None
    try:
        rates = tuple(float(entry[k]) for k in QUANT_RATE_KEYS)
        call_ms = float(entry.get(QUANT_CALL_KEY, 0.0))
        call_inter_ms = float(entry.get(QUANT_CALL_INTER_KEY, call_ms))
    except (KeyError, TypeError, ValueError, AttributeError):
        raise UserError(f"profile quant entry for {precision} needs positive numbers "
                        f"{' and '.join(QUANT_RATE_KEYS)} (and optionally {QUANT_CALL_KEY} and "
                        f"{QUANT_CALL_INTER_KEY} >= 0)") from None
    if not all(r > 0 for r in rates):
        raise UserError(f"profile quant entry for {precision}: rates must be positive")
    for key, value in ((QUANT_CALL_KEY, call_ms), (QUANT_CALL_INTER_KEY, call_inter_ms)):
        if not value >= 0:
            raise UserError(f"profile quant entry for {precision}: {key} must be a number >= 0")
    return rates + (call_ms, call_inter_ms)


def codec_passes(precision: str) -> tuple[float, float]:
    """(encode, decode) bytes of device memory a codec moves per FP32 byte it handles.

    A cast (bf16, fp16) reads the FP32 values and writes b/32 of their bytes; decoding
    reads those and writes FP32: 1 + b/32 each. A row-wise stochastic quantizer (intX)
    reads the row twice (its minimum and maximum, then scale and round), writes and reads
    one FP32 random number per value, and writes the b-bit codes: 4 + b/32; decoding
    reads the codes and writes FP32: 1 + b/32 (docs/comm-precision.md, "Estimated codec").
    """
    precision = parse_precision(precision)
    packed = PRECISION_BITS[precision] / 32.0
    encode = (4.0 if is_quantized(precision) else 1.0) + packed
    return encode, 1.0 + packed


def estimated_quant_entry(precision: str, bandwidth_gbps: float) -> dict:
    """The ``quant`` entry of a precision without measured rates: its codec's passes
    (:func:`codec_passes`) at B, the rate of the trainer's elementwise passes on the machine
    (``elementwise_gbps``, else the memory bandwidth), ``rate = B / passes`` GB/s of FP32
    data, and no per-call time (docs/comm-precision.md, "Estimated codec")."""
    encode, decode = codec_passes(precision)
    bandwidth = float(bandwidth_gbps)
    return {"encode_gbps": bandwidth / encode, "decode_gbps": bandwidth / decode, QUANT_CALL_KEY: 0.0,
            "estimated": True}


def quant_time_ms(quant: dict | None, precision: str, op: str, group_size, message_bytes_fp32, messages=1):
    """Codec time (ms) a reduced precision adds to one collective, the local work the trainer
    times as ``quant_ms``: ``encoded / encode rate + decoded / decode rate`` (:func:`codec_bytes`).
    0 at fp32, for a group of one rank and where the profile has no entry for ``precision``.
    The per-call time ``call_ms`` is communication (:func:`call_overhead_ms`).
    """
    rates = quant_rates(quant, precision)
    enc, dec = codec_bytes(op, group_size, message_bytes_fp32)
    if rates is None:
        return np.zeros_like(enc)
    return (enc / (rates[0] * 1e9) + dec / (rates[1] * 1e9)) * 1e3


def call_overhead_ms(quant: dict | None, precision: str, op: str, group_size, messages=1, intra=True):
    """Time (ms) the process-group calls of a reduced-precision collective add beyond its bytes:
    ``messages x process_group_calls(op) x call_ms``, with ``call_inter_ms`` where the group
    spans nodes (``intra`` false; vectorized). The trainer's timers count it in
    ``comm_ms`` (it passes between the codec's steps), so the model books it there too
    (docs/comm-precision.md, "In the cost model"). 0 at fp32, for a group of one rank and
    where the profile has no entry for ``precision``.
    """
    rates = quant_rates(quant, precision)
    g = np.asarray(group_size)
    if rates is None:
        return np.zeros(np.broadcast(g, np.asarray(messages)).shape, dtype=np.float64)
    calls = process_group_calls(op, precision) * np.asarray(messages, dtype=np.float64)
    return np.where(g > 1, calls * np.where(intra, rates[2], rates[3]), 0.0)
