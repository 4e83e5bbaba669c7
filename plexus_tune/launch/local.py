"""Start ``torch.distributed`` process sets: local processes, torchrun or SLURM.

``launch_local(fn, world_size, args)`` starts ``world_size`` processes on this host,
initializes a process group in each (free TCP port on 127.0.0.1), runs
``fn(rank, world_size, *args)`` and returns the list of per-rank return values.
A rank that raises, is killed (SIGKILL, out of memory) or exits without a result
stops the whole set: the parent notices it at once through the child's pipe or
process sentinel, terminates the other ranks (SIGTERM, then SIGKILL after a short
grace period) and raises :class:`RankFailure` naming the rank and its reason. A set
that runs longer than ``timeout_s`` is killed the same way, so a launch never hangs.

``detect_environment()`` recognises processes started by torchrun (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``...) or srun (``SLURM_PROCID``, ``SLURM_NTASKS``...);
``run_in_environment(fn, env, args)`` then runs ``fn`` in the current process, under a
watchdog that ends the process ``timeout_s`` after it started: a gloo collective whose
peer stopped answering (a cut link, a frozen node) can block past the process group's
own timeout, and a rank that never returns would hold its whole set.
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Sequence

from plexus_tune.allocator import configure_compute_process
from plexus_tune.errors import signals_deferred

DEFAULT_TIMEOUT_S = 1800.0
KILL_GRACE_S = 3.0
FAILURE_GRACE_S = 1.5
#: the longest a command's exit waits for its fork server and resource tracker to stop
SERVER_STOP_WAIT_S = 10.0
_PEER_ERROR_WORDS = ("connection", "gloo", "nccl", "socket", "broken pipe", "timed out", "timeout",
                     "peer", "distbackenderror", "process group")


class RankFailure(RuntimeError):
    """A rank of a launched process set failed; ``rank`` and ``reason`` say which and why."""

    def __init__(self, rank: int | None, reason: str, details: str = ""):
        self.rank = rank
        self.reason = reason
        self.details = details
        where = "launch" if rank is None else f"rank {rank}"
        super().__init__(f"{where} failed: {reason}")


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in a process set started by an external launcher."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str  # "torchrun" or "slurm"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _first_slurm_host(nodelist: str) -> str:
    """First host name of a SLURM node list such as ``nid[001-004,010]`` or ``a,b``."""
    match = re.match(r"^([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        return nodelist
    prefix, ranges = match.group(1), match.group(2)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def detect_environment(environ: dict[str, str] | None = None) -> DistEnv | None:
    """The torchrun or srun process-set description in ``environ``, or None when run by hand."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return DistEnv(
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", "29500")),
            source="torchrun",
        )
    step = env.get("SLURM_STEP_ID", env.get("SLURM_STEPID", "")).strip()
    in_step = step.isdigit() and int(step) < 4294967290  # a batch script has no step of its own
    if in_step and "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        nodelist = env.get("SLURM_STEP_NODELIST", env.get("SLURM_JOB_NODELIST", "127.0.0.1"))
        port = env.get("MASTER_PORT")
        if port is None:  # same on every task of a job, away from the ephemeral range
            port = str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 10000)
        return DistEnv(
            rank=int(env["SLURM_PROCID"]),
            world_size=int(env["SLURM_NTASKS"]),
            local_rank=int(env.get("SLURM_LOCALID", "0")),
            master_addr=env.get("MASTER_ADDR", _first_slurm_host(nodelist)),
            master_port=int(port),
            source="slurm",
        )
    return None


def _init_process_group(rank: int, world_size: int, backend: str, addr: str, port: int,
                        timeout_s: float, local_rank: int) -> None:
    import torch
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(local_rank % max(1, torch.cuda.device_count()))
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{addr}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )


def end_with_launcher(pid: int, signum: int = signal.SIGTERM) -> None:
    """End this process (exit ``128 + signum``) as soon as the process ``pid`` that launched it ends.

    A local rank is a child of the fork server, and the fork server lives as long as any
    rank holds its pipe: neither notices the launching command's end by itself. A daemon
    thread waits on a pidfd of the launcher (polling its pid where pidfds are missing), so
    the ranks end with the command however it ends, SIGKILL included.
    """
    import select

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is None and not _alive(pid):
        os._exit(128 + int(signum))

    def watch() -> None:
        if fd is not None:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            while not poller.poll(None):
                pass
        else:
            while _alive(pid):
                time.sleep(1.0)
        os._exit(128 + int(signum))

    threading.Thread(target=watch, name="plexus-tune-launcher-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _child_main(conn, fn, rank, world_size, args, backend, port, timeout_s, threads, env_extra, launcher_pid=None):
    """Body of one local rank: init, run, send ("ok", value) or ("error", reason, traceback).

    The entry point of the rank's process: it sets the environment, the allocator and
    the thread count (:func:`configure_compute_process`) for the whole process, and ends
    with the launching process ``launcher_pid`` (:func:`end_with_launcher`).

    ``env_extra`` is the launching process's environment (plus overrides): a fork
    server's children would otherwise see the environment of the moment the server
    started.
    """
    if launcher_pid is not None:
        end_with_launcher(launcher_pid)
    os.environ.clear()
    os.environ.update(env_extra)
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    try:
        t_start = time.time()
        import torch.distributed as dist

        t_import = time.time()

        configure_compute_process(threads)
        _init_process_group(rank, world_size, backend, "127.0.0.1", port, timeout_s, rank)
        if os.environ.get("PLEXUS_TUNE_LAUNCH_DEBUG"):
            print(f"rank {rank}: start {t_start:.2f} import {t_import - t_start:.2f}s init {time.time() - t_import:.2f}s", flush=True)
        value = fn(rank, world_size, *args)
        conn.send(("ok", value))
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - shutting down anyway
            pass
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        reason = f"{type(exc).__name__}: {exc}".strip()
        try:
            conn.send(("error", reason.splitlines()[0] if reason else type(exc).__name__,
                       traceback.format_exc()))
        except Exception:  # noqa: BLE001
            pass
        conn.close()
        os._exit(1)
    conn.close()


def secondary_failure(failure: RankFailure) -> int:
    """0 for a likely root cause (killed by a signal, or an error of its own), 1 for an error
    that looks like the consequence of a peer's failure (a broken connection, a timeout)."""
    if "terminated by" in failure.reason:
        return 0
    text = failure.reason.lower()
    return int(any(word in text for word in _PEER_ERROR_WORDS))


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = " (by the out-of-memory killer or by hand)" if -code == signal.SIGKILL else ""
        return f"process was terminated by {name}{hint}"
    return f"process exited with code {code} without a result"


def _stop_all(procs, grace_s: float = KILL_GRACE_S) -> None:
    procs = [proc for proc in procs if proc.pid is not None]  # started ones only
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join(1.0)


_PRELOAD = ["torch", "torch.distributed"]


def _context(preload: Sequence[str]):
    """The multiprocessing context: a fork server with torch imported, or spawn."""
    import multiprocessing as mp

    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    wanted = list(dict.fromkeys(_PRELOAD + list(preload)))
    ctx.set_forkserver_preload(wanted)  # takes effect when the server first starts
    if not _STOP_REGISTERED:
        atexit.register(_stop_fork_server)
        _STOP_REGISTERED.append(True)
    return ctx


_STOP_REGISTERED: list = []


def _stop_fork_server() -> None:
    """Stop the fork server and the resource tracker as the command exits, and wait for them: left
    alone they notice the closed pipe only later (2 s, more on a loaded host), outliving the
    command (docs/cli.md, Ending a command)."""
    from multiprocessing import forkserver, resource_tracker

    def stop_servers() -> None:
        for server in (forkserver._forkserver, resource_tracker._resource_tracker):  # the fork server, then its tracker
            stop = getattr(server, "_stop", None)  # the standard library's own shutdown (3.9+)
            if stop is not None:
                try:
                    stop()
                except (OSError, ChildProcessError):
                    pass

    # bounded: a server waits for every process forked from it, and one the command lost track of
    # ends only when the command does (end_with_launcher), so an unbounded wait here would never end
    waiter = threading.Thread(target=stop_servers, name="plexus-tune-stop-fork-server", daemon=True)
    waiter.start()
    waiter.join(SERVER_STOP_WAIT_S)


def default_threads_per_rank(world_size: int) -> int:
    """CPU threads for each of ``world_size`` local ranks: max(1, cores // world_size)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, world_size))


def launch_local(fn: Callable[..., Any], world_size: int, args: Sequence[Any] = (), *,
                 backend: str = "gloo", timeout_s: float = DEFAULT_TIMEOUT_S,
                 threads_per_rank: int | None = None, env: dict[str, str] | None = None,
                 preload: Sequence[str] = ()) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` fresh local processes.

    ``fn`` must be importable (a module-level function). On POSIX the processes are
    forked from a fork server that has imported torch (and the ``preload`` modules)
    once, so a launch does not pay one torch import per rank; elsewhere they are
    spawned. Returns
    the per-rank return values (rank order). Raises :class:`RankFailure` as soon as a
    rank fails or when ``timeout_s`` passes, after stopping every other rank.
    """
    from multiprocessing.connection import wait

    if world_size < 1:
        raise ValueError("world_size must be >= 1")
    threads = threads_per_rank if threads_per_rank is not None else default_threads_per_rank(world_size)
    ctx = _context(preload)
    port = free_port()
    procs, conns = [], []
    env_extra = {**os.environ, **(env or {})}
    results: list[Any] = [None] * world_size
    done = [False] * world_size  # finished: result received or failure recorded
    failures: list[tuple[int, RankFailure]] = []  # (order seen, failure)
    grace_until = None
    timed_out = False
    try:
        # every rank that exists is known to ``procs`` before Ctrl-C or an error can end the launch, so
        # it is stopped with the rest, not left in the rendezvous (where a rank does not see its own
        # Ctrl-C) holding the fork server's pipes
        with signals_deferred():
            for rank in range(world_size):
                parent_conn, child_conn = ctx.Pipe(duplex=False)
                conns.append(parent_conn)
                proc = ctx.Process(
                    target=_child_main,
                    args=(child_conn, fn, rank, world_size, tuple(args), backend, port, timeout_s, threads,
                          env_extra, os.getpid()),
                    name=f"plexus-rank{rank}",
                    daemon=False,
                )
                procs.append(proc)
                proc.start()
                child_conn.close()
        deadline = time.monotonic() + timeout_s
        while not all(done):
            now = time.monotonic()
            if grace_until is not None and now >= grace_until:
                break
            if now >= deadline:
                timed_out = True
                break
            waitables = {}
            for rank in range(world_size):
                if not done[rank]:
                    waitables[conns[rank]] = ("conn", rank)
                    waitables[procs[rank].sentinel] = ("proc", rank)
            limit = (grace_until if grace_until is not None else deadline) - now
            ready = wait(list(waitables), timeout=max(0.0, min(limit, 5.0)))
            # read every message first: a finished rank's result beats its sentinel
            for obj in ready:
                kind, rank = waitables[obj]
                if kind != "conn" or done[rank]:
                    continue
                try:
                    message = conns[rank].recv()
                except (EOFError, OSError):
                    procs[rank].join(2.0)
                    failures.append((len(failures), RankFailure(rank, _describe_exit(procs[rank].exitcode))))
                    done[rank] = True
                    continue
                done[rank] = True
                if message[0] == "ok":
                    results[rank] = message[1]
                else:
                    failures.append((len(failures), RankFailure(rank, message[1], message[2])))
            for obj in ready:
                kind, rank = waitables[obj]
                if kind != "proc" or done[rank]:
                    continue
                if conns[rank].poll():  # a message arrived just before exit: read it next turn
                    continue
                procs[rank].join(1.0)
                failures.append((len(failures), RankFailure(rank, _describe_exit(procs[rank].exitcode))))
                done[rank] = True
            if failures and grace_until is None:
                # the ranks that were talking to the failed one fail next; wait a moment so the
                # report names the root cause rather than a peer's connection error
                grace_until = time.monotonic() + FAILURE_GRACE_S
        if not failures and not timed_out:
            for proc in procs:
                proc.join(30.0)
    except BaseException:
        _stop_all(procs)
        raise
    finally:
        if failures or timed_out:
            _stop_all(procs)
        for proc in procs:
            if proc.is_alive():
                _stop_all(procs)
                break
        for conn in conns:
            conn.close()
    failure = None
    if failures:
        failure = min(failures, key=lambda item: (secondary_failure(item[1]), item[0]))[1]
    elif timed_out:
        failure = RankFailure(None, f"timed out after {timeout_s:g} s; stopped all {world_size} ranks")
    if failure is not None:
        raise failure
    return results


#: exit status of a rank process its watchdog ended (as timeout(1) uses)
WATCHDOG_EXIT = 124


def _where(thread_id: int | None) -> str:
    """``function (file:line)`` of the innermost frame of this package in a thread's stack."""
    frame = sys._current_frames().get(thread_id) if thread_id is not None else None
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if path.startswith(package + os.sep):
            return f"{getattr(frame.f_code, 'co_qualname', frame.f_code.co_name)} ({os.path.relpath(path, os.path.dirname(package))}:{frame.f_lineno})"
        frame = frame.f_back
    return "unknown code"


def start_watchdog(timeout_s: float, rank: int, on_expire: Callable[[str], None] | None = None) -> threading.Event:
    """End this process (exit :data:`WATCHDOG_EXIT`) ``timeout_s`` from now unless the returned
    event is set first; ``on_expire(reason)`` runs just before, the reason naming where the
    main thread was (a collective waiting on a peer, typically)."""
    done = threading.Event()
    main = threading.main_thread().ident

    def watch() -> None:
        if done.wait(timeout_s):
            return
        reason = (f"timed out after {timeout_s:g} s; rank {rank} was in {_where(main)} "
                  f"(a peer stopped answering: a cut link or a lost rank)")
        try:
            if on_expire is not None:
                on_expire(reason)
            else:
                print(f"plexus-tune: rank {rank}: {reason}", file=sys.stderr, flush=True)
        finally:
            os._exit(WATCHDOG_EXIT)

    threading.Thread(target=watch, name="plexus-tune-watchdog", daemon=True).start()
    return done


def run_in_environment(fn: Callable[..., Any], env: DistEnv, args: Sequence[Any] = (), *,
                       backend: str = "gloo", timeout_s: float = DEFAULT_TIMEOUT_S,
                       threads_per_rank: int | None = None, on_timeout: Callable[[str], None] | None = None) -> Any:
    """Run ``fn(rank, world_size, *args)`` in this process, one rank of an external launch.

    The entry point of the rank's process (the worker main calls it): it sets the
    allocator and thread count for the whole process (:func:`configure_compute_process`).
    A watchdog (:func:`start_watchdog`) ends the process ``timeout_s`` after the start,
    calling ``on_timeout(reason)`` first (default: the reason on stderr).
    """
    import torch.distributed as dist

    watchdog = start_watchdog(timeout_s, env.rank, on_timeout)
    configure_compute_process(threads_per_rank)
    _init_process_group(env.rank, env.world_size, backend, env.master_addr, env.master_port,
                        timeout_s, env.local_rank)
    try:
        return fn(env.rank, env.world_size, *args)
    finally:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
        watchdog.set()
