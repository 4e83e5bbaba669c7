"""An emulated multi-node cluster on one Linux machine (root only).

Topology of ``EmulatedCluster(spec)`` with id ``ID`` (6 hex digits)::

    node k: netns ptIDn<k>, lo + nic0 (10.X.Y.<k+1>/24, MTU 9000)
              | veth
    switch: netns ptIDsw, u<k> --[delay line]--> q<k> ~ b<k> --- br0 (Linux bridge)
                          u<k> <--[tc mirred]--- q<k> ~ b<k> ---'

Shaping, per node link and direction:

* rate: ``tbf`` of ``nics * inter_gbps`` GB/s on the uplink (nic0 egress in the
  node) and on the downlink (u<k> egress in the switch).  tbf counts frames as on
  the wire (headers included), so TCP payload gets ~99% of the rate at MTU 9000.
  ``nics > 1`` is one link of the aggregate rate: an ideal bond that even a single
  flow can fill, unlike real per-flow hashing.
* latency: ``inter_latency_us`` is added once per node-to-node path, on the
  sender's uplink, so one way is ``inter_latency_us`` and a round trip twice that.
  ``sch_netem`` is often not built (CONFIG_NET_SCH_NETEM unset in many VM
  kernels), so a user-space delay line (:mod:`plexus_tune.cluster.delayline`) in
  the switch namespace holds each frame until its kernel receive time plus the
  delay; one way measures the setting + 10-30 us (about 50 us at the least).  It
  carries every inter-node byte, so with latency on, CPU-poor hosts reach lower
  rates than without.  With ``inter_latency_us=0`` the u<k> ports sit on the
  bridge directly and no delay line runs.

Ranks of one node reach each other through the node's own address, which Linux
routes over ``lo``: intra-node traffic is never shaped.

Every live cluster has a state file ``/run/plexus-tune/clusters/<id>.json``
(owner pid, namespaces, helper pids), written before anything is created;
:func:`cleanup_leftovers` removes clusters whose owner died (SIGKILL), and
``pt`` namespaces with no state file.  Normal exit, exceptions, SIGINT, SIGTERM
and SIGHUP tear a cluster down.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import json
import os
import re
import secrets
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from plexus_tune.errors import UserError

from .spec import ClusterSpec, parse_cluster

STATE_DIR = Path("/run/plexus-tune/clusters")
NETNS_DIR = Path("/run/netns")
PREFIX = "pt"
NS_RE = re.compile(r"^pt([0-9a-f]{6})(?:n\d+|sw)$")
NIC = "nic0"
BRIDGE = "br0"
MAX_NODES = 64
DEFAULT_MTU_BYTES = 9000
ORPHAN_GRACE_S = 30.0
COMMAND_TIMEOUT_S = 30.0
DELAYLINE_READY_S = 15.0
NEEDS_ROOT = "emulated cluster needs root (network namespaces and tc); run as root or use the local cluster"
_HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


# ---------------------------------------------------------------- small helpers


def _run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess:
    """Run a short command (ip, tc, sysctl); raise UserError on failure when ``check``."""
    proc = subprocess.run(
        argv,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    if check and proc.returncode != 0:
        message = (proc.stderr or proc.stdout).strip().replace("\n", "; ")
        raise UserError(
            f"emulated cluster setup failed at '{' '.join(argv)}': {message}; "
            "the kernel needs network namespaces, veth, bridge, tbf, ingress and mirred"
        )
    return proc


def _proc_start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces; fields resume after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def _alive(pid: int | None, start_ticks: int | None) -> bool:
    if not pid:
        return False
    ticks = _proc_start_ticks(pid)
    return ticks is not None and (start_ticks is None or ticks == start_ticks)


def netns_list() -> list[str]:
    """Names of all named network namespaces (``ip netns list``)."""
    proc = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def _kill_netns_processes(ns: str) -> None:
    """SIGKILL every process inside namespace ``ns`` (until none is left)."""
    for _attempt in range(20):
        proc = _run(["ip", "netns", "pids", ns], check=False)
        pids = [int(p) for p in proc.stdout.split() if p.isdigit() and int(p) != os.getpid()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def _delete_netns(ns: str) -> bool:
    """Kill the processes of ``ns`` and delete it; True when it existed."""
    if not (NETNS_DIR / ns).exists():
        return False
    _kill_netns_processes(ns)
    _run(["ip", "netns", "del", ns], check=False)
    return True


def _kill_helper(pid: int | None, start_ticks: int | None) -> None:
    if _alive(pid, start_ticks):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _remove_recorded(state: dict) -> list[str]:
    """Tear down what a state file names: helpers, node namespaces, then the switch."""
    for helper in state.get("helpers", []):
        _kill_helper(helper.get("pid"), helper.get("start_ticks"))
    removed = []
    names = list(state.get("node_namespaces", [])) + [state.get("switch_namespace")]
    for ns in names:
        if ns and _delete_netns(ns):
            removed.append(ns)
    return removed


CLONE_NEWNET = 0x40000000


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def socket_in_netns(ns: str, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM,
                    proto: int = 0) -> socket.socket:
    """A socket that lives in network namespace ``ns`` (the calling thread switches
    there to create it and back; only that thread is affected)."""
    with open("/proc/thread-self/ns/net") as here, open(NETNS_DIR / ns) as there:
        _setns(there.fileno())
        try:
            return socket.socket(family, kind, proto)
        finally:
            _setns(here.fileno())


def _read_state(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def list_clusters() -> list[dict]:
    """State of every registered cluster, with ``alive`` (owner still running)."""
    out = []
    for path in sorted(STATE_DIR.glob("*.json")):
        state = _read_state(path)
        if state is None:
            continue
        state["alive"] = _alive(state.get("owner_pid"), state.get("owner_start_ticks"))
        state["state_file"] = str(path)
        out.append(state)
    return out


def cleanup_leftovers(grace_s: float = ORPHAN_GRACE_S) -> list[str]:
    """Remove clusters whose owner is dead, and ``pt`` namespaces nobody owns.

    A ``pt<6 hex>n<k>``/``pt<6 hex>sw`` namespace without a state file is removed
    once it is older than ``grace_s`` seconds.  Returns the namespaces removed.
    """
    if os.geteuid() != 0:
        return []
    removed: list[str] = []
    owned: set[str] = set()
    for state in list_clusters():
        if state["alive"] or state.get("id") in _LIVE:
            owned.update(state.get("node_namespaces", []))
            owned.add(state.get("switch_namespace"))
            continue
        removed += _remove_recorded(state)
        Path(state["state_file"]).unlink(missing_ok=True)
    now = time.time()
    for ns in netns_list():
        if not NS_RE.match(ns) or ns in owned:
            continue
        cluster_id = NS_RE.match(ns).group(1)
        if cluster_id in _LIVE or (STATE_DIR / f"{cluster_id}.json").exists():
            continue
        try:
            age_s = now - (NETNS_DIR / ns).stat().st_mtime
        except OSError:
            continue
        if age_s >= grace_s and _delete_netns(ns):
            removed.append(ns)
    return removed


# ------------------------------------------------- signals, atexit, live registry

_LIVE: dict[str, "EmulatedCluster"] = {}
_LOCK = threading.RLock()
_PREVIOUS: dict[int, object] = {}
_CRITICAL = {"depth": 0, "thread": None}
_PENDING: list[int] = []
_ATEXIT = []


@contextmanager
def _critical():
    """Defer the main thread's signal handling while setup or teardown runs in it;
    a signal that came meanwhile is handled on the way out (also on errors)."""
    deliver = None
    try:
        with _LOCK:
            _CRITICAL["depth"] += 1
            _CRITICAL["thread"] = threading.get_ident()
            try:
                yield
            finally:
                _CRITICAL["depth"] -= 1
                if _CRITICAL["depth"] == 0:
                    _CRITICAL["thread"] = None
                    if _PENDING and threading.current_thread() is threading.main_thread():
                        deliver = _PENDING[0]
                        _PENDING.clear()
    finally:
        if deliver is not None:
            _dispatch(deliver, None)


def close_all() -> None:
    """Tear down every cluster this process holds."""
    with _LOCK:
        for cluster in list(_LIVE.values()):
            cluster.close()


def _on_signal(signum, frame):
    if _CRITICAL["depth"] and _CRITICAL["thread"] == threading.get_ident():
        _PENDING.append(signum)
        return
    _dispatch(signum, frame)


def _dispatch(signum, frame):
    previous = _PREVIOUS.get(signum, signal.SIG_DFL)
    close_all()
    if callable(previous):
        previous(signum, frame)
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    if not _ATEXIT:
        atexit.register(close_all)
        _ATEXIT.append(True)
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in _HANDLED_SIGNALS:
        current = signal.getsignal(signum)
        if current is _on_signal or current == signal.SIG_IGN:
            continue
        _PREVIOUS[signum] = current
        signal.signal(signum, _on_signal)


def _restore_handlers() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, previous in list(_PREVIOUS.items()):
        if signal.getsignal(signum) is _on_signal:
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        del _PREVIOUS[signum]


# ------------------------------------------------------------------- the cluster


class EmulatedCluster:
    """Network namespaces, veths, a bridge and tc shaping for an ``emulated`` spec.

    ``tcp_congestion``: TCP congestion control inside the nodes (None keeps the
    host's default).  BBR's periodic ProbeRTT (cwnd of 4 packets for 200 ms every
    10 s) shows as slow all-reduces once latency is set; loss-based ``reno``
    (cubic where the host allows it) gives steadier rates.

    Use as a context manager (or ``start()``/``close()``)::

        with EmulatedCluster(parse_cluster("emulated:nodes=2,ranks_per_node=2,inter_gbps=0.05")) as c:
            subprocess.run(c.exec_argv(0, ["ip", "addr"]))
    """

    def __init__(
        self,
        spec: ClusterSpec | str,
        run_id: str | None = None,
        *,
        mtu_bytes: int = DEFAULT_MTU_BYTES,
        tcp_congestion: str | None = None,
    ):
        if isinstance(spec, str):
            spec = parse_cluster(spec)
        if spec.kind != "emulated":
            raise UserError(f"EmulatedCluster needs an 'emulated:...' cluster spec, got {spec}")
        if spec.nodes > MAX_NODES:
            raise UserError(f"cluster {spec}: at most {MAX_NODES} emulated nodes, got {spec.nodes}; use fewer nodes")
        if not 1280 <= mtu_bytes <= 65535:
            raise UserError(f"mtu_bytes must be in [1280, 65535], got {mtu_bytes}")
        self.spec = spec
        self.run_id = run_id
        if run_id is None:
            self.id = secrets.token_hex(3)
        else:
            self.id = hashlib.sha1(run_id.encode()).hexdigest()[:6]
        self.mtu_bytes = mtu_bytes
        self.tcp_congestion = tcp_congestion
        self.state_file = STATE_DIR / f"{self.id}.json"
        self.owner_pid = os.getpid()
        x, y = int(self.id[:2], 16), int(self.id[2:4], 16)
        self.subnet = f"10.{x}.{y}.0/24"
        self._prefix = f"10.{x}.{y}."
        self.switch_ns = f"{PREFIX}{self.id}sw"
        self.node_namespaces = [f"{PREFIX}{self.id}n{k}" for k in range(spec.nodes)]
        self.rate_bit_per_s = spec.link_gbps * 8e9
        self.burst_bytes, self.limit_bytes = _tbf_sizes(spec.link_gbps * 1e9, mtu_bytes)
        self.delay_us = float(spec.inter_latency_us)
        self._delayline: subprocess.Popen | None = None
        self._delayline_stderr = None
        self.delayline_summary: dict | None = None
        self._applied: dict[str, str] = {}
        self._congestion_control: str | None = None
        self._links_down: set[int] = set()
        self.started = False
        self.closed = False

    # -- names and addresses

    @property
    def nodes(self) -> int:
        return self.spec.nodes

    def namespace(self, node: int) -> str:
        self._check_node(node)
        return self.node_namespaces[node]

    def address(self, node: int) -> str:
        """IPv4 address of ``node``'s NIC (no prefix length)."""
        self._check_node(node)
        return f"{self._prefix}{node + 1}"

    def nic(self, node: int) -> str:
        """Interface name of the node's NIC inside its namespace (for GLOO_SOCKET_IFNAME)."""
        self._check_node(node)
        return NIC

    def exec_argv(self, node: int, argv: list[str]) -> list[str]:
        """``argv`` prefixed to run inside ``node``'s namespace."""
        return ["ip", "netns", "exec", self.namespace(node), *argv]

    def switch_exec_argv(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.switch_ns, *argv]

    def _check_node(self, node: int) -> None:
        if not isinstance(node, int) or not 0 <= node < self.spec.nodes:
            raise UserError(f"node must be in [0, {self.spec.nodes}), got {node!r}")

    # -- lifecycle

    def __enter__(self) -> "EmulatedCluster":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> "EmulatedCluster":
        if self.started:
            return self
        _check_host()
        self.owner_pid = os.getpid()
        with _critical():
            cleanup_leftovers()
            if self.id in _LIVE or self.state_file.exists() or any(
                (NETNS_DIR / ns).exists() for ns in [self.switch_ns, *self.node_namespaces]
            ):
                raise UserError(f"emulated cluster id {self.id} is in use; pick another run_id or let it choose")
            self.started = True
            _LIVE[self.id] = self
            _install_handlers()
            try:
                self._write_state()
                self._build()
                self._write_state()
            except BaseException:
                self.close()
                raise
        return self

    def close(self) -> None:
        """Tear everything down (idempotent; a no-op in forked children)."""
        if not self.started or self.closed or os.getpid() != self.owner_pid:
            return
        with _critical():
            if self.closed:
                return
            self._stop_delayline()
            _remove_recorded(self._state())
            self.state_file.unlink(missing_ok=True)
            self.closed = True
            _LIVE.pop(self.id, None)
            if not _LIVE:
                _restore_handlers()

    # -- building

    def _state(self) -> dict:
        helpers = []
        if self._delayline is not None:
            pid = self._delayline.pid
            helpers.append({"role": "delayline", "pid": pid, "start_ticks": _proc_start_ticks(pid)})
        return {
            "id": self.id,
            "run_id": self.run_id,
            "owner_pid": self.owner_pid,
            "owner_start_ticks": _proc_start_ticks(self.owner_pid),
            "created_unix_s": time.time(),
            "spec": self.spec.to_string(),
            "switch_namespace": self.switch_ns,
            "node_namespaces": self.node_namespaces,
            "helpers": helpers,
        }

    def _write_state(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._state(), indent=1) + "\n")
        os.replace(tmp, self.state_file)

    def _ns_setup(self, ns: str) -> None:
        _run(["ip", "netns", "add", ns])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        # No IPv6: no router solicitations or DAD on the links, gloo picks IPv4.
        _run(["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1",
              "net.ipv6.conf.default.disable_ipv6=1"], check=False)

    def _set_congestion(self, ns: str) -> None:
        done = _run(["ip", "netns", "exec", ns, "sysctl", "-qw",
                     f"net.ipv4.tcp_congestion_control={self.tcp_congestion}"], check=False)
        if done.returncode != 0:
            allowed = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control").read_text().strip()
            raise UserError(f"tcp_congestion={self.tcp_congestion!r} cannot be set in a network namespace; "
                            f"use one of: {allowed} (net.ipv4.tcp_allowed_congestion_control)")

    def _tbf(self, ns: str, dev: str) -> None:
        _run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "tbf",
              "rate", f"{int(round(self.rate_bit_per_s))}bit",
              "burst", str(self.burst_bytes), "limit", str(self.limit_bytes)])
        shown = _run(["tc", "-n", ns, "qdisc", "show", "dev", dev], check=False).stdout.strip()
        self._applied[f"{ns}/{dev}"] = shown

    def _build(self) -> None:
        sw = self.switch_ns
        self._ns_setup(sw)
        _run(["ip", "-n", sw, "link", "add", BRIDGE, "type", "bridge"])
        _run(["ip", "-n", sw, "link", "set", BRIDGE, "mtu", str(self.mtu_bytes), "up"])
        delayed = self.delay_us > 0
        for k, ns in enumerate(self.node_namespaces):
            self._ns_setup(ns)
            if self.tcp_congestion:
                self._set_congestion(ns)
            port = f"u{k}"
            _run(["ip", "link", "add", NIC, "netns", ns, "mtu", str(self.mtu_bytes), "type", "veth",
                  "peer", "name", port, "netns", sw, "mtu", str(self.mtu_bytes)])
            _run(["ip", "-n", ns, "addr", "add", f"{self.address(k)}/24", "dev", NIC])
            _run(["ip", "-n", ns, "link", "set", NIC, "up"])
            self._tbf(ns, NIC)
            self._tbf(sw, port)
            if delayed:
                inject, bridge_port = f"q{k}", f"b{k}"
                _run(["ip", "-n", sw, "link", "add", inject, "mtu", str(self.mtu_bytes), "type", "veth",
                      "peer", "name", bridge_port, "mtu", str(self.mtu_bytes)])
                _run(["ip", "-n", sw, "link", "set", bridge_port, "master", BRIDGE, "up"])
                _run(["ip", "-n", sw, "link", "set", inject, "up"])
                # Frames from the bridge bypass the delay line: straight to the node's cable.
                _run(["tc", "-n", sw, "qdisc", "add", "dev", inject, "ingress"])
                _run(["tc", "-n", sw, "filter", "add", "dev", inject, "parent", "ffff:", "protocol", "all",
                      "u32", "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", port])
                _run(["ip", "-n", sw, "link", "set", port, "up"])
            else:
                _run(["ip", "-n", sw, "link", "set", port, "master", BRIDGE, "up"])
        if delayed:
            self._start_delayline()
        cc = _run(["ip", "netns", "exec", self.node_namespaces[0], "sysctl", "-n",
                   "net.ipv4.tcp_congestion_control"], check=False)
        self._congestion_control = cc.stdout.strip() or None

    def _start_delayline(self) -> None:
        script = Path(__file__).with_name("delayline.py")
        argv = self.switch_exec_argv([sys.executable, str(script), "--owner-pid", str(os.getpid()),
                                      "--delay-us", repr(self.delay_us)])
        for k in range(self.spec.nodes):
            argv += ["--pair", f"u{k}:q{k}"]
        self._delayline_stderr = tempfile.TemporaryFile()
        self._delayline = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._delayline_stderr,
            start_new_session=True,
        )
        self._write_state()
        ready, _, _ = select.select([self._delayline.stdout], [], [], DELAYLINE_READY_S)
        line = self._delayline.stdout.readline().decode().strip() if ready else ""
        if line != "ready":
            self._delayline_stderr.seek(0)
            err = self._delayline_stderr.read().decode(errors="replace").strip().splitlines()
            raise UserError(f"emulated cluster: the delay line did not start: {err[-1] if err else 'no output'}")

    def _stop_delayline(self) -> None:
        proc = self._delayline
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        try:
            tail = proc.stdout.read().decode(errors="replace").strip().splitlines()
            if tail:
                self.delayline_summary = json.loads(tail[-1])
        except (OSError, ValueError):
            pass
        proc.stdout.close()
        if self._delayline_stderr is not None:
            self._delayline_stderr.close()

    @property
    def helper_pids(self) -> list[int]:
        """Pids of the helper processes (the delay line) this cluster runs."""
        return [helper["pid"] for helper in self._state()["helpers"]]

    # -- mid-run control and records

    def set_link(self, node: int, up: bool = True) -> None:
        """Plug (``up``) or unplug node's cable at the switch (its switch port goes down)."""
        self._check_node(node)
        _run(["ip", "-n", self.switch_ns, "link", "set", f"u{node}", "up" if up else "down"])
        (self._links_down.discard if up else self._links_down.add)(node)

    def socket(self, node: int, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM,
               proto: int = 0) -> socket.socket:
        """A socket inside ``node``'s namespace, e.g. to measure the links from Python."""
        return socket_in_netns(self.namespace(node), family, kind, proto)

    def one_way_us(self, src: int, dst: int, count: int = 20, interval_s: float = 0.002) -> list[float]:
        """One-way delays of small UDP datagrams from ``src`` to ``dst``, us.

        Kernel timestamps of each datagram leaving src's NIC and entering dst's
        NIC (both ``AF_PACKET`` taps on one clock): no software overhead included.
        """
        if src == dst:
            raise UserError("one_way_us needs two different nodes")
        taps = []
        for node in (src, dst):
            tap = self.socket(node, socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ALL))
            tap.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            tap.bind((NIC, _ETH_P_ALL))
            tap.setblocking(False)
            taps.append(tap)
        sender = self.socket(src, socket.AF_INET, socket.SOCK_DGRAM)
        receiver = self.socket(dst, socket.AF_INET, socket.SOCK_DGRAM)
        token = secrets.token_bytes(8)
        seen: list[dict[int, int]] = [{}, {}]
        try:
            receiver.bind((self.address(dst), 0))
            target = (self.address(dst), receiver.getsockname()[1])
            for seq in range(count + 1):  # the first one waits for ARP: not counted
                sender.sendto(token + seq.to_bytes(4, "big"), target)
                time.sleep(interval_s)
            deadline = time.monotonic() + 1.0 + 2 * self.delay_us / 1e6
            while time.monotonic() < deadline and len(seen[1]) < count + 1:
                select.select(taps, [], [], 0.05)
                for side, tap in enumerate(taps):
                    _read_tap(tap, token, outgoing=(side == 0), into=seen[side])
            return [(seen[1][seq] - seen[0][seq]) / 1e3 for seq in range(1, count + 1)
                    if seq in seen[0] and seq in seen[1]]
        finally:
            for sock in (*taps, sender, receiver):
                sock.close()

    def rtt_us(self, src: int, dst: int, count: int = 20, interval_s: float = 0.005,
               timeout_s: float = 2.0) -> list[float]:
        """Round trips of a small UDP datagram from ``src`` to ``dst`` and back, us.

        ``src == dst`` measures the node's own (loopback) path: the software
        baseline that every inter-node round trip also pays.
        """
        server = self.socket(dst, socket.AF_INET, socket.SOCK_DGRAM)
        client = self.socket(src, socket.AF_INET, socket.SOCK_DGRAM)
        stop = threading.Event()

        def echo():
            while not stop.is_set():
                try:
                    data, peer = server.recvfrom(64)
                except (TimeoutError, OSError):
                    continue
                server.sendto(data, peer)

        thread = threading.Thread(target=echo, daemon=True)
        try:
            server.bind((self.address(dst), 0))
            server.settimeout(0.1)
            client.settimeout(timeout_s)
            target = (self.address(dst), server.getsockname()[1])
            thread.start()
            rtts = []
            for seq in range(count + 1):  # the first one also resolves ARP: not counted
                payload = seq.to_bytes(4, "big")
                t0 = time.perf_counter_ns()
                client.sendto(payload, target)
                while client.recv(64) != payload:
                    pass
                if seq:
                    rtts.append((time.perf_counter_ns() - t0) / 1e3)
                time.sleep(interval_s)
            return rtts
        finally:
            stop.set()
            if thread.is_alive():
                thread.join(1.0)
            client.close()
            server.close()

    def describe(self) -> dict:
        """Record of the spec, names, addresses and the tc settings applied."""
        nodes = []
        for k, ns in enumerate(self.node_namespaces):
            nodes.append({
                "node": k,
                "namespace": ns,
                "nic": NIC,
                "address": f"{self.address(k)}/24",
                "switch_port": f"u{k}",
                "link_up": k not in self._links_down,
                "uplink_tc": self._applied.get(f"{ns}/{NIC}"),
                "downlink_tc": self._applied.get(f"{self.switch_ns}/u{k}"),
            })
        return {
            "spec": self.spec.to_dict(),
            "spec_string": self.spec.to_string(),
            "id": self.id,
            "run_id": self.run_id,
            "switch_namespace": self.switch_ns,
            "bridge": BRIDGE,
            "subnet": self.subnet,
            "mtu_bytes": self.mtu_bytes,
            "nodes": nodes,
            "shaping": {
                "link_gbps": self.spec.link_gbps,
                "rate_bit_per_s": self.rate_bit_per_s,
                "qdisc": "tbf",
                "burst_bytes": self.burst_bytes,
                "limit_bytes": self.limit_bytes,
                "where": "node uplink (nic0 egress) and downlink (switch port egress)",
                "nics_model": "one link of nics * inter_gbps",
            },
            "latency": {
                "one_way_us": self.delay_us,
                "mode": "userspace-delayline" if self.delay_us > 0 else "none",
                "where": "sender's uplink, once per node-to-node path",
                "delayline": self.delayline_summary,
            },
            "intra_node": "loopback (node's own address routes over lo, unshaped)",
            "tcp_congestion_control": self._congestion_control,
        }


_ETH_P_ALL = 0x0003
_SO_TIMESTAMPNS = 35
_PACKET_OUTGOING = 4


def _read_tap(tap: socket.socket, token: bytes, *, outgoing: bool, into: dict[int, int]) -> None:
    """Record kernel timestamps (ns) of the UDP datagrams carrying ``token`` on ``tap``."""
    while True:
        try:
            frame, anc, _flags, addr = tap.recvmsg(2048, 64)
        except BlockingIOError:
            return
        if (addr[2] == _PACKET_OUTGOING) != outgoing:
            continue
        if len(frame) < 34 or frame[12:14] != b"\x08\x00" or frame[23] != 17:
            continue
        start = 14 + (frame[14] & 0x0F) * 4 + 8
        if frame[start : start + 8] != token:
            continue
        seq = int.from_bytes(frame[start + 8 : start + 12], "big")
        for level, kind, value in anc:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS:
                sec, nsec = struct.unpack("qq", value[:16])
                into.setdefault(seq, sec * 1_000_000_000 + nsec)


def _tbf_sizes(rate_bytes_per_s: float, mtu_bytes: int) -> tuple[int, int]:
    """tbf burst and queue limit, bytes.

    The burst holds a whole 64 KiB GSO frame (smaller bursts make tbf split GSO
    frames, at a CPU cost) or 1 ms at the rate; the queue holds 20 ms at the rate
    (at least 4 bursts) so TCP rarely sees drops at the shaper.
    """
    burst = max(65536 + 2 * mtu_bytes, int(rate_bytes_per_s * 1e-3))
    limit = max(4 * burst, int(rate_bytes_per_s * 20e-3))
    return burst, limit


def _check_host() -> None:
    if os.geteuid() != 0:
        raise UserError(NEEDS_ROOT, parameter="cluster")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise UserError(f"emulated cluster needs the {' and '.join(missing)} command (iproute2); install iproute2 or use the local cluster",
                        parameter="cluster")
