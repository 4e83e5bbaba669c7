"""What this host can hold, compared before a command starts or allocates anything.

One home for the resource guard (docs/cli.md, "Sizes a host cannot hold"):

- :func:`check_local_ranks`: ranks started on this host against its cores
  (at most :data:`RANKS_PER_CORE` time-shared per core) and its available memory
  (:data:`RANK_MEMORY_BYTES` per rank, the resident size of a gloo rank with torch
  loaded, plus what the ranks load);
- :func:`check_memory`: one allocation (a generated graph, a table) against the
  available memory; :func:`check_device_memory` against a device's (a CUDA device's
  free memory, the host's for ``cpu``): every command that allocates calls one of them
  with its peak estimate before allocating (the calibrations' operands, the trainer's
  weights and activations, the prediction's grids).

A refusal is one :class:`~plexus_tune.errors.UserError` line with the figures. Where a
user may mean it (more ranks per core than the guard allows, an estimate they know to
be pessimistic) ``allow=True`` lifts the check; the command line's flag for it is
``--oversubscribe``.

:func:`worker_pool` gives the worker processes a command scores or fits in: they start
with Ctrl-C ignored, so that an interrupt reaches the command alone, which stops them.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from concurrent.futures import Future, ProcessPoolExecutor

from plexus_tune.errors import UserError

#: ranks time-shared per core before a local launch is refused (tests run 8 ranks on 2 cores)
RANKS_PER_CORE = 8
#: resident memory of one local rank before its share of the graph (a gloo rank with torch loaded)
RANK_MEMORY_BYTES = 256 << 20
GIB = 2**30


def host_cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def available_memory_bytes() -> int:
    """Memory available to new work on this host: MemAvailable of /proc/meminfo, else free pages."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 1 << 62


def check_local_ranks(ranks: int, *, load_bytes: int = 0, allow: bool = False, where: str = "this host") -> None:
    """UserError if ``ranks`` processes on this host exceed its cores x :data:`RANKS_PER_CORE` or its
    available memory (``ranks`` x :data:`RANK_MEMORY_BYTES` + ``load_bytes``); ``allow`` lifts it."""
    if allow:
        return
    ranks = int(ranks)
    cores = host_cores()
    if ranks > RANKS_PER_CORE * cores:
        raise UserError(f"{ranks:,} ranks on {where} would share {cores} cores ({ranks / cores:,.0f} per core, at most "
                        f"{RANKS_PER_CORE} allowed); use fewer ranks, a launcher that spreads them over nodes, or allow "
                        f"oversubscribing", parameter="oversubscribe")
    need = ranks * RANK_MEMORY_BYTES + int(load_bytes)
    have = available_memory_bytes()
    if need > have:
        raise UserError(f"{ranks:,} ranks on {where} need about {need / GIB:,.1f} GiB ({RANK_MEMORY_BYTES >> 20} MiB each"
                        + (f" and {load_bytes / GIB:,.1f} GiB of data" if load_bytes else "")
                        + f"), {have / GIB:,.1f} GiB is available; use fewer ranks or allow oversubscribing",
                        parameter="oversubscribe")


def check_memory(nbytes: float, what: str, *, allow: bool = False) -> None:
    """UserError if ``what`` needs more than the available memory (``nbytes``, an estimate); ``allow`` lifts it."""
    if allow:
        return
    have = available_memory_bytes()
    if nbytes > have:
        raise UserError(f"{what} needs about {nbytes / GIB:,.1f} GiB of memory, {have / GIB:,.1f} GiB is available "
                        f"on this host; make it smaller")


def device_free_bytes(device) -> int:
    """Free memory of ``device``: a CUDA device's (``torch.cuda.mem_get_info``), else the host's available memory."""
    text = str(device)
    if text.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            index = torch.device(text).index
            return int(torch.cuda.mem_get_info(0 if index is None else index)[0])
    return available_memory_bytes()


def check_device_memory(nbytes: float, what: str, device="cpu", *, allow: bool = False) -> None:
    """UserError if ``what`` needs more than ``device``'s free memory (``nbytes``, a lower bound of the peak)."""
    if allow:
        return
    have = device_free_bytes(device)
    if nbytes > have:
        where = "this host" if not str(device).startswith("cuda") else str(device)
        raise UserError(f"{what} needs about {nbytes / GIB:,.1f} GiB of memory, {have / GIB:,.1f} GiB is free on "
                        f"{where}; make it smaller")


class WorkerPool:
    """Spawned worker processes that leave Ctrl-C to the command that started them.

    A worker starts inside :meth:`submit` with SIGINT ignored (an ignored signal stays
    ignored across exec, and Python then installs no KeyboardInterrupt handler), so
    Ctrl-C in a terminal, which reaches the whole foreground group, interrupts only the
    command; :meth:`terminate` then stops the workers at once.
    """

    def __init__(self, max_workers: int):
        self.max_workers = int(max_workers)
        self._pool = ProcessPoolExecutor(max_workers=self.max_workers, mp_context=multiprocessing.get_context("spawn"))

    def submit(self, fn, /, *args, **kwargs) -> Future:
        if threading.current_thread() is not threading.main_thread():  # signal handlers belong to the main thread
            return self._pool.submit(fn, *args, **kwargs)
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:  # a worker, if this submit starts one, inherits SIG_IGN; the window is the fork and exec only
            return self._pool.submit(fn, *args, **kwargs)
        finally:
            signal.signal(signal.SIGINT, previous)

    def terminate(self) -> None:
        """Cancel what has not started and stop the workers without waiting for their tasks."""
        processes = list(getattr(self._pool, "_processes", {}).values())
        manager = getattr(self._pool, "_executor_manager_thread", None)
        self._pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            if process.is_alive():
                process.terminate()
        for process in processes:
            process.join(5)
        if manager is not None:  # it closes its wake-up pipe as it ends: done before the interpreter's exit
            manager.join(5)      # writes to that pipe, not while (EBADF, printed as an ignored exception)

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, kind, *_) -> None:
        if kind is None:
            self._pool.shutdown(wait=True)
        else:
            self.terminate()


_shared: WorkerPool | None = None


def worker_pool(max_workers: int) -> WorkerPool:
    """The command's pool of ``max_workers`` workers, started once and reused by later calls."""
    global _shared
    if _shared is None or _shared.max_workers != int(max_workers):
        if _shared is not None:
            _shared.terminate()
        _shared = WorkerPool(max_workers)
    return _shared


def stop_worker_pool() -> None:
    """Stop the shared pool's workers now (an interrupt, an error): nothing waits for their tasks."""
    global _shared
    if _shared is not None:
        _shared.terminate()
        _shared = None
