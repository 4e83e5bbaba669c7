"""Fixed one-way delay for the emulated cluster's uplinks, in user space.

Where the kernel lacks ``sch_netem``, the switch namespace runs this small
forwarder instead: for every node it reads the frames the node
sends (an ``AF_PACKET`` socket on the switch-side end of the node's cable,
``PACKET_VNET_HDR`` so 64 KiB GSO frames pass whole) and writes each one, after
``delay_us`` counted from the kernel's receive timestamp, into the veth that
leads to the bridge.  Frames coming back from the bridge never pass through
here (a ``tc`` mirred redirect sends them straight to the node's cable).

Frames are sent early by the measured wake-up latency (an integral controller),
so the median lateness is ~0; the process asks for SCHED_FIFO because on a busy
host ordinary scheduling delays its wake-ups by milliseconds.  Standard library
only, so it also runs by path.  Run inside the switch namespace::

    python delayline.py --owner-pid PID --delay-us 200 --pair u0:q0 --pair u1:q1

It exits when the owner process dies, on SIGTERM/SIGINT, or when an interface
disappears, and prints a JSON summary (lateness percentiles in us, frames,
bytes, drops per link) as its last stdout line.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import errno
import json
import os
import select
import signal
import socket
import struct
import sys
import time

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_IGNORE_OUTGOING = 23
SO_TIMESTAMPNS = 35  # SO_TIMESTAMPNS_OLD: struct timespec of two longs
SO_RCVBUFFORCE = 33
SO_SNDBUFFORCE = 32
PR_SET_TIMERSLACK = 29
VNET_HDR_BYTES = 10
# skb->len of a GSO frame stays below 64 KiB (gso_max_size); a little slack on top.
RECV_BYTES = VNET_HDR_BYTES + 65536 + 256
SOCKET_BUFFER_BYTES = 16 << 20
OWNER_CHECK_S = 0.25
MAX_BIAS_NS = 150_000
MAX_SAMPLES = 200_000


class _Path:
    """One node's uplink: frames read on ``rx_ifname`` leave on ``tx_ifname``."""

    def __init__(self, rx_ifname: str, tx_ifname: str):
        self.rx_ifname = rx_ifname
        self.tx_ifname = tx_ifname
        self.rx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.rx.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
        self.rx.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
        self.rx.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.rx.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, SOCKET_BUFFER_BYTES)
        self.rx.bind((rx_ifname, ETH_P_ALL))
        self.rx.setblocking(False)
        # Protocol 0: this socket only sends and receives nothing.
        self.tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
        self.tx.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
        self.tx.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, SOCKET_BUFFER_BYTES)
        self.tx.bind((tx_ifname, 0))
        self.queue: collections.deque[tuple[int, bytes]] = collections.deque()
        self.frames = 0
        self.bytes = 0
        self.dropped = 0


def _set_timer_slack_ns(slack_ns: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(slack_ns), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _set_realtime() -> None:
    """SCHED_FIFO (lowest priority): on a busy host the ranks otherwise delay our
    wake-ups by milliseconds.  The loop sleeps in select(), so it cannot hog a core."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except (OSError, AttributeError):
        pass


def _owner_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _drain(path: _Path, delay_ns: int) -> None:
    """Read every waiting frame of ``path`` and queue it with its due time."""
    while True:
        try:
            data, anc, flags, _addr = path.rx.recvmsg(RECV_BYTES, 64)
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno == errno.ENETDOWN:  # link cut; the socket resumes when it is up
                return
            raise
        if flags & socket.MSG_TRUNC:
            path.dropped += 1
            continue
        rx_ns = 0
        for level, kind, value in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(value) >= 16:
                sec, nsec = struct.unpack("qq", value[:16])
                rx_ns = sec * 1_000_000_000 + nsec
        if rx_ns == 0:
            rx_ns = time.time_ns()
        path.queue.append((rx_ns + delay_ns, data))


class _Clock:
    """Sends early by the measured wake-up latency, so the mean delay hits the setting.

    ``bias_ns`` is an integral controller on the lateness of the first frame sent
    after each timed wait; it stays within [0, min(delay/2, MAX_BIAS_NS)].
    """

    def __init__(self, delay_ns: int):
        self.delay_ns = delay_ns
        self.bias_ns = 0
        self.max_bias_ns = min(delay_ns // 2, MAX_BIAS_NS)
        self.late_ns: list[int] = []

    def sent(self, due_ns: int, now_ns: int, after_wait: bool) -> None:
        late_ns = now_ns - due_ns
        if after_wait and abs(late_ns) < 4 * MAX_BIAS_NS:
            self.bias_ns = max(0, min(self.max_bias_ns, self.bias_ns + late_ns // 8))
        if len(self.late_ns) < MAX_SAMPLES:
            self.late_ns.append(late_ns)

    def summary(self) -> dict:
        late = sorted(self.late_ns)
        if not late:
            return {"frames_sampled": 0, "bias_us": self.bias_ns / 1e3}
        pick = lambda q: late[int(q * (len(late) - 1))] / 1e3  # noqa: E731
        return {
            "frames_sampled": len(late),
            "late_us_p10": pick(0.1),
            "late_us_p50": pick(0.5),
            "late_us_p90": pick(0.9),
            "late_us_mean": sum(late) / len(late) / 1e3,
            "bias_us": self.bias_ns / 1e3,
        }


def _send_due(paths: list[_Path], clock: _Clock, after_wait: bool) -> int | None:
    """Send every frame due by now (less the bias); return the next due time or None.

    ``after_wait``: the call follows a timed wait that ended without input, so the
    first frame's lateness measures the wake-up latency.
    """
    next_due = None
    for path in paths:
        queue = path.queue
        while queue:
            now_ns = time.time_ns()
            if queue[0][0] - clock.bias_ns > now_ns:
                break
            due_ns, data = queue.popleft()
            clock.sent(due_ns, now_ns, after_wait)
            after_wait = False
            try:
                path.tx.send(data)
            except OSError as exc:
                if exc.errno in (errno.ENXIO, errno.ENODEV, errno.ENETDOWN):
                    raise
                path.dropped += 1
                continue
            path.frames += 1
            path.bytes += len(data) - VNET_HDR_BYTES
        if queue and (next_due is None or queue[0][0] < next_due):
            next_due = queue[0][0]
    return next_due


def serve(pairs: list[tuple[str, str]], delay_us: float, owner_pid: int) -> int:
    """Forward frames of every (rx, tx) interface pair with a fixed delay."""
    _set_timer_slack_ns(1000)
    _set_realtime()
    stop: list[int] = []

    def _stop(signum, _frame):
        stop.append(signum)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    paths = [_Path(rx, tx) for rx, tx in pairs]
    clock = _Clock(int(round(delay_us * 1000)))
    by_fd = {path.rx.fileno(): path for path in paths}
    fds = list(by_fd)
    next_owner_check = time.monotonic() + OWNER_CHECK_S
    print("ready", flush=True)
    code = 0
    after_wait = False
    try:
        while not stop:
            next_due = _send_due(paths, clock, after_wait)
            timeout_s = OWNER_CHECK_S
            target_ns = None
            if next_due is not None:
                target_ns = next_due - clock.bias_ns
                timeout_s = min(timeout_s, max(0.0, (target_ns - time.time_ns()) / 1e9))
            ready, _, _ = select.select(fds, [], [], timeout_s)
            after_wait = not ready and target_ns is not None
            for fd in ready:
                _drain(by_fd[fd], clock.delay_ns)
            if time.monotonic() >= next_owner_check:
                next_owner_check = time.monotonic() + OWNER_CHECK_S
                if not _owner_alive(owner_pid):
                    break
    except OSError as exc:
        print(f"delayline: stopping: {exc}", file=sys.stderr, flush=True)
        code = 1
    summary = clock.summary()
    summary["links"] = {
        f"{p.rx_ifname}->{p.tx_ifname}": {"frames": p.frames, "bytes": p.bytes, "dropped": p.dropped}
        for p in paths
    }
    print(json.dumps(summary), flush=True)
    return code


def _pair(text: str) -> tuple[str, str]:
    rx, sep, tx = text.partition(":")
    if not sep or not rx or not tx:
        raise argparse.ArgumentTypeError(f"expected RX:TX interface names, got {text!r}")
    return rx, tx


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plexus_tune.cluster.delayline")
    parser.add_argument("--owner-pid", type=int, required=True)
    parser.add_argument("--delay-us", type=float, required=True)
    parser.add_argument("--pair", type=_pair, action="append", required=True)
    args = parser.parse_args(argv)
    return serve(args.pair, args.delay_us, args.owner_pid)


if __name__ == "__main__":
    sys.exit(main())
