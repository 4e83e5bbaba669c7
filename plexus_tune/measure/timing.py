"""Wall-clock timing of a call on the host (the CPU microbenchmarks' convention; docs/records.md)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


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
