"""Host allocator settings shared by the trainer's ranks and the SpMM/GEMM benchmarks.

glibc malloc maps every block above its mmap threshold (dynamic, at most 32 MiB) with
mmap and unmaps it on free, so a tensor of that size allocated once per call (the
output of each SpMM, an activation) is page-faulted in again on every call: on the
development host an SpMM with a 32 MiB output took twice as long as one with a 31 MiB
output. :func:`retain_large_allocations` raises the mmap and trim thresholds so such
blocks come from the heap and freed memory is reused, which makes time per byte the
same at every size. Benchmarks and trainer call it alike, so calibration measures what
training runs. ``PLEXUS_TUNE_MALLOC=default`` leaves the allocator alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: Blocks up to this size come from the heap; freed heap memory above it is returned.
RETAIN_BYTES = 1 << 30


def retain_large_allocations(threshold_bytes: int = RETAIN_BYTES) -> bool:
    """Set glibc's M_MMAP_THRESHOLD to ``threshold_bytes`` and M_TRIM_THRESHOLD to twice it.

    Returns True when applied; False on a C library without mallopt (musl, macOS) or
    when ``PLEXUS_TUNE_MALLOC=default``.
    """
    if os.environ.get("PLEXUS_TUNE_MALLOC", "").strip().lower() == "default":
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    value = int(min(threshold_bytes, 2**31 - 1))
    trim = int(min(2 * threshold_bytes, 2**31 - 1))
    return bool(mallopt(M_MMAP_THRESHOLD, value)) and bool(mallopt(M_TRIM_THRESHOLD, trim))


def configure_compute_process(threads: int | None = None) -> None:
    """Entry point of a process that trains or times: process-wide settings, set once.

    Raises the allocator thresholds (:func:`retain_large_allocations`) and, when
    ``threads`` is given, sets torch's intra-op thread count. Called where a process
    starts its work (a rank's process body, the ``calibrate`` and ``train`` commands, a
    runner script), never inside library functions, which leave process state alone.
    """
    retain_large_allocations()
    if threads:
        import torch

        torch.set_num_threads(int(threads))
