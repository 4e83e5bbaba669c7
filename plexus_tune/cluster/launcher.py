"""Start one torchrun agent per emulated node, inside that node's namespace.

``run_torchrun(cluster, ["plexus_tune.cluster.probe", "--out", d], timeout_s=60)``
runs, in namespace ``ptIDn<k>``::

    python -m torch.distributed.run --nnodes N --nproc-per-node R --node-rank k \\
        --rdzv-backend c10d --rdzv-endpoint <node 0 address>:<port> --rdzv-id <id> \\
        --rdzv-conf is_host=<k == 0> --local-addr <node k address> --max-restarts 0 \\
        -m <module> <args>

with ``GLOO_SOCKET_IFNAME=nic0``, ``PLEXUS_TUNE_NODE=k`` and
``PLEXUS_TUNE_CLUSTER=<spec>`` in the environment.  c10d orders nodes by their
``--local-addr`` strings, which follow node order for up to 9 nodes (node k has
host number k + 1); beyond that use ``rdzv="static"`` (``--master-addr``,
``--master-port``, ``--node-rank``) so that rank // ranks_per_node is the node.

When one node's agent fails, or ``timeout_s`` passes, every agent gets SIGTERM,
then everything still running in the node namespaces gets SIGKILL: no hangs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from plexus_tune.errors import UserError

from .emulated import EmulatedCluster, _kill_netns_processes

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
TAIL_CHARS = 4000
POLL_S = 0.1


@dataclass
class TorchrunResult:
    """Outcome of :func:`run_torchrun`; ``returncodes[k]`` is node k's agent (< 0: killed by that signal)."""

    returncodes: list[int | None]
    output_tails: list[str]
    elapsed_s: float
    timed_out: bool = False
    failed_node: int | None = None
    killed: bool = False
    argv: list[list[str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(code == 0 for code in self.returncodes)


def torchrun_argv(cluster: EmulatedCluster, node: int, module_argv: list[str], *, rdzv: str, port: int,
                  rdzv_id: str, join_timeout_s: float) -> list[str]:
    """Agent command line for ``node`` (without the namespace prefix)."""
    spec = cluster.spec
    argv = [sys.executable, "-m", "torch.distributed.run",
            "--nnodes", str(spec.nodes), "--nproc-per-node", str(spec.ranks_per_node),
            "--node-rank", str(node), "--max-restarts", "0", "--monitor-interval", "0.2"]
    if rdzv == "c10d":
        conf = f"is_host={1 if node == 0 else 0},join_timeout={int(join_timeout_s)}"
        argv += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{cluster.address(0)}:{port}",
                 "--rdzv-id", rdzv_id, "--rdzv-conf", conf, "--local-addr", cluster.address(node)]
    else:
        argv += ["--rdzv-backend", "static", "--master-addr", cluster.address(0), "--master-port", str(port),
                 "--local-addr", cluster.address(node)]
    return argv + ["-m", *module_argv]


def run_torchrun(
    cluster: EmulatedCluster,
    module_argv: list[str],
    *,
    env: dict[str, str] | None = None,
    timeout_s: float,
    rdzv: str = "c10d",
    port: int = 29400,
    log_dir: str | Path | None = None,
) -> TorchrunResult:
    """Run ``python -m module_argv...`` on every node of ``cluster`` via torchrun."""
    if rdzv not in ("c10d", "static"):
        raise UserError(f"rdzv must be 'c10d' or 'static', got {rdzv!r}")
    if rdzv == "c10d" and cluster.nodes > 9:
        raise UserError(f"c10d rendezvous orders nodes by address text, which breaks past 9 nodes ({cluster.nodes}); use rdzv='static'")
    if not cluster.started or cluster.closed:
        raise UserError("run_torchrun needs a started cluster; use it inside 'with EmulatedCluster(spec) as cluster:'")
    if not module_argv:
        raise UserError("module_argv is empty; give the module to run, e.g. ['plexus_tune.cluster.probe', '--out', DIR]")
    rdzv_id = f"pt{cluster.id}-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    logs = []
    procs: list[subprocess.Popen] = []
    argvs = []
    start = time.monotonic()
    result = None
    try:
        for k in range(cluster.nodes):
            node_env = dict(os.environ)
            path = node_env.get("PYTHONPATH", "")
            if str(PACKAGE_ROOT) not in path.split(os.pathsep):
                node_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), path) if p)
            node_env.setdefault("OMP_NUM_THREADS", "1")
            node_env.update(env or {})
            node_env.update({
                "GLOO_SOCKET_IFNAME": cluster.nic(k),
                "PLEXUS_TUNE_NODE": str(k),
                "PLEXUS_TUNE_CLUSTER": cluster.spec.to_string(),
                "PLEXUS_TUNE_CLUSTER_ID": cluster.id,
            })
            argv = cluster.exec_argv(k, torchrun_argv(cluster, k, module_argv, rdzv=rdzv, port=port,
                                                      rdzv_id=rdzv_id, join_timeout_s=max(10.0, timeout_s)))
            argvs.append(argv)
            log = tempfile.TemporaryFile()
            logs.append(log)
            procs.append(subprocess.Popen(argv, env=node_env, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))
        timed_out = False
        failed_node = None
        while True:
            codes = [p.poll() for p in procs]
            if all(code is not None for code in codes):
                break
            bad = [k for k, code in enumerate(codes) if code not in (None, 0)]
            if bad:
                failed_node = bad[0]
                break
            if time.monotonic() - start > timeout_s:
                timed_out = True
                break
            time.sleep(POLL_S)
        killed = any(p.poll() is None for p in procs)
        result = TorchrunResult(returncodes=[], output_tails=[], elapsed_s=0.0, timed_out=timed_out,
                                failed_node=failed_node, killed=killed, argv=argvs)
    finally:
        _stop(cluster, procs)
        tails = []
        for k, log in enumerate(logs):
            log.seek(0)
            text = log.read().decode(errors="replace")
            log.close()
            if log_dir is not None:
                Path(log_dir).mkdir(parents=True, exist_ok=True)
                (Path(log_dir) / f"node{k}.log").write_text(text)
            tails.append(text[-TAIL_CHARS:])
    result.returncodes = [p.returncode for p in procs]
    result.output_tails = tails
    result.elapsed_s = time.monotonic() - start
    return result


def _stop(cluster: EmulatedCluster, procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """SIGTERM the agents still running, then SIGKILL all that is left in the node namespaces."""
    running = [p for p in procs if p.poll() is None]
    if not running:
        return
    for p in running:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while any(p.poll() is None for p in running) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    for ns in cluster.node_namespaces:
        _kill_netns_processes(ns)
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.wait()
