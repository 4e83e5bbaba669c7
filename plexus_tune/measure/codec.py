"""Codec microbenchmarks of the reduced communication precisions (``calibrate quant``):
the encode and decode of :mod:`plexus_tune.trainer.precision`, logged as quant records
(docs/comm-precision.md, "Calibration")."""

from __future__ import annotations

from plexus_tune.model.comm_precision import PRECISION_BITS, is_quantized
from plexus_tune.measure.records import QuantRecord
from plexus_tune.measure.store import append_records, environment_info, now_utc
from plexus_tune.resources import check_memory


#: With several processes, each times a case for at least this long (s) so that they overlap.
CONCURRENT_WINDOW_S = 0.25


def time_quant(precision: str, rows: int, cols: int, *, repeats: int = 5, seed: int = 0,
               window_s: float = 0.0) -> dict:
    """Encode and decode times (ms) of an FP32 ``rows x cols`` tensor: the min over ``repeats``
    calls, or with ``window_s`` > 0 the mean over the calls of at least ``window_s`` seconds (and
    ``repeats`` calls), the time a call takes while other processes share the cores.

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
    start = time.perf_counter()
    while len(enc) < max(1, repeats) + 1 or (window_s > 0 and time.perf_counter() - start < window_s):
        t0 = time.perf_counter()  # the first call warms up
        packed = quantize(x, PRECISION_BITS[precision], gen) if is_quantized(precision) else x.to(low[precision])
        t1 = time.perf_counter()
        back = dequantize(packed) if is_quantized(precision) else packed.to(torch.float32)
        t2 = time.perf_counter()
        enc.append((t1 - t0) * 1e3)
        dec.append((t2 - t1) * 1e3)
        del back
    if window_s > 0:
        return {"encode_ms": sum(enc[1:]) / len(enc[1:]), "decode_ms": sum(dec[1:]) / len(dec[1:])}
    return {"encode_ms": min(enc[1:]), "decode_ms": min(dec[1:])}


def _cases(precisions, rows, cols):
    return [(p, int(r), int(c)) for p in precisions for r in rows for c in cols]


def _concurrent_worker(cases, repeats, threads, barrier, conn) -> None:
    """One of the processes of :func:`run_quant_benchmark`: each case timed after all processes
    reach the barrier, so that they run the codec at the same time."""
    import torch

    torch.set_num_threads(int(threads))
    times = []
    for precision, r, c in cases:
        barrier.wait()
        times.append(time_quant(precision, r, c, repeats=repeats, window_s=CONCURRENT_WINDOW_S))
    conn.send(times)
    conn.close()


def _time_concurrently(cases, repeats: int, threads: int, processes: int) -> list[dict]:
    """Per case, the median over ``processes`` processes (started at once, each timing every case
    after a common barrier, for :data:`CONCURRENT_WINDOW_S`) of their mean encode and decode times."""
    import multiprocessing as mp
    import statistics

    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(processes)
    pipes, workers = [], []
    for _ in range(processes):
        parent, child = ctx.Pipe(duplex=False)
        worker = ctx.Process(target=_concurrent_worker, args=(cases, repeats, threads, barrier, child), daemon=True)
        worker.start()
        child.close()
        pipes.append(parent)
        workers.append(worker)
    try:
        results = [pipe.recv() for pipe in pipes]
    except EOFError:
        raise RuntimeError("a codec timing process ended before reporting; see its error above") from None
    finally:
        for worker in workers:
            worker.join(timeout=60)
            if worker.is_alive():
                worker.terminate()
    return [{key: statistics.median(res[k][key] for res in results) for key in ("encode_ms", "decode_ms")}
            for k in range(len(cases))]


def run_quant_benchmark(log, *, precisions=("bf16", "fp16", "int8", "int4", "int2"), rows=(4096, 16384),
                        cols=(32, 128), repeats: int = 5, threads: int = 1, processes: int = 1) -> list[dict]:
    """Time every (precision, rows, cols) on ``threads`` torch threads; append quant records to ``log``.

    ``processes`` > 1: that many processes time every case at the same moment (a barrier
    before each), as the ranks sharing a host's cores run the codec in training, each the
    mean of its calls over :data:`CONCURRENT_WINDOW_S` (a min would pick the calls that
    ran alone); each record holds the median process's times and ``processes``
    (docs/comm-precision.md, "Calibration"). Refused before any work if the largest tensor, its encoding and its
    decoding (12 bytes per element, per process) exceed the available memory."""
    processes = int(processes)
    check_memory(12 * max(map(int, rows)) * max(map(int, cols)) * processes,
                 f"encoding {max(map(int, rows)):,} x {max(map(int, cols)):,} values in {processes} process(es)")
    cases = _cases(precisions, rows, cols)
    if processes > 1:
        timed = _time_concurrently(cases, repeats, threads, processes)
    else:
        import torch

        torch.set_num_threads(int(threads))
        timed = [time_quant(p, r, c, repeats=repeats) for p, r, c in cases]
    env = environment_info()
    out = []
    for (precision, r, c), times in zip(cases, timed):
        rec = QuantRecord(precision=precision, rows=r, cols=c, fp32_bytes=4 * r * c, repeats=int(repeats),
                          threads=int(threads), processes=processes if processes > 1 else None,
                          measured_at=now_utc(), machine_info=env, **times)
        out.append(rec.to_dict())
    append_records(log, out)
    return out
