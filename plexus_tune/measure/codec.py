"""Codec microbenchmarks of the reduced communication precisions (``calibrate quant``):
the encode and decode of :mod:`plexus_tune.trainer.precision`, logged as quant records
(docs/comm-precision.md, "Calibration")."""

from __future__ import annotations

from plexus_tune.model.comm_precision import PRECISION_BITS, is_quantized
from plexus_tune.measure.records import QuantRecord
from plexus_tune.measure.store import append_records, environment_info, now_utc
from plexus_tune.resources import check_memory


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
    """Time every (precision, rows, cols) on ``threads`` torch threads; append quant records to ``log``.
    Refused before any work if the largest tensor, its encoding and its decoding (12 bytes per
    element) exceed the available memory."""
    check_memory(12 * max(map(int, rows)) * max(map(int, cols)),
                 f"encoding {max(map(int, rows)):,} x {max(map(int, cols)):,} values")
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
