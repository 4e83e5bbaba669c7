"""Start one torchrun agent per emulated node, inside that node's namespace.

``run_torchrun(cluster, ["plexus_tune.cluster.probe", "--out", d], timeout_s=60)``
runs, in namespace ``ptIDn<k>``::

    python -m torch.distributed.run --nnodes=N --nproc-per-node=R --node-rank=k --max-restarts=0 \\
        --rdzv-backend=c10d --rdzv-endpoint=<node 0 address>:<port> --rdzv-id=<id> \\
        --rdzv-conf=is_host=<k == 0>,join_timeout=<s> --local-addr=<node k address> \\
        -m <module> <args>

(:func:`plexus_tune.launch.external.torchrun_argv`) with ``GLOO_SOCKET_IFNAME=nic0``,
``PLEXUS_TUNE_NODE=k`` and ``PLEXUS_TUNE_CLUSTER=<spec>`` in the environment
(:func:`node_command`, which the emulated launcher uses as well).  c10d orders nodes by their
``--local-addr`` strings, which follow node order for up to 9 nodes (node k has
host number k + 1); beyond that use ``rdzv="static"`` (``--master-addr``,
``--master-port``, ``--node-rank``) so that rank // ranks_per_node is the node.

When one node's agent fails, or ``timeout_s`` passes, every agent gets SIGTERM,
then everything still running in the node namespaces gets SIGKILL: no hangs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from plexus_tune.errors import UserError
from plexus_tune.launch.external import start_agent, stop_agents, torchrun_argv, wait_agents

from plexus_tune.cluster.emulated import EmulatedCluster, _kill_netns_processes

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


def node_command(cluster: EmulatedCluster, node: int, argv: list[str], env: dict) -> tuple[list[str], dict]:
    """``argv`` run inside ``node``'s namespace, and ``env`` with gloo bound to the node's NIC,
    the node index and the cluster (spec and id) added."""
    env = {**env, "GLOO_SOCKET_IFNAME": cluster.nic(node), "PLEXUS_TUNE_NODE": str(node),
           "PLEXUS_TUNE_CLUSTER": cluster.spec.to_string(), "PLEXUS_TUNE_CLUSTER_ID": cluster.id}
    return cluster.exec_argv(node, argv), env


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
    base_env = dict(os.environ)
    path = base_env.get("PYTHONPATH", "")
    if str(PACKAGE_ROOT) not in path.split(os.pathsep):
        base_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), path) if p)
    base_env.setdefault("OMP_NUM_THREADS", "1")
    base_env.update(env or {})
    logs = []
    procs: list[subprocess.Popen] = []
    argvs = []
    start = time.monotonic()
    agent_logs = tempfile.mkdtemp(prefix="plexus-torchrun-")  # torchrun's own files; removed below
    try:
        for k in range(cluster.nodes):
            argv = torchrun_argv(nnodes=cluster.nodes, nproc_per_node=cluster.spec.ranks_per_node, node_rank=k,
                                 endpoint=f"{cluster.address(0)}:{port}", run_id=rdzv_id, module_argv=module_argv,
                                 local_addr=cluster.address(k), rdzv=rdzv, join_timeout_s=max(10.0, timeout_s),
                                 monitor_interval_s=0.2, log_dir=agent_logs)
            argv, node_env = node_command(cluster, k, argv, base_env)
            argvs.append(argv)
            logs.append(tempfile.TemporaryFile())
            procs.append(start_agent(argv, node_env, logs[-1]))
        codes, timed_out = wait_agents(procs, timeout_s, failure_grace_s=0.0, poll_s=POLL_S)
    finally:
        _stop(cluster, procs)
        shutil.rmtree(agent_logs, ignore_errors=True)
        tails = []
        for k, log in enumerate(logs):
            log.seek(0)
            text = log.read().decode(errors="replace")
            log.close()
            if log_dir is not None:
                Path(log_dir).mkdir(parents=True, exist_ok=True)
                (Path(log_dir) / f"node{k}.log").write_text(text)
            tails.append(text[-TAIL_CHARS:])
    failed = [k for k, code in enumerate(codes) if code not in (None, 0)]
    return TorchrunResult(returncodes=[p.returncode for p in procs], output_tails=tails,
                          elapsed_s=time.monotonic() - start, timed_out=timed_out,
                          failed_node=failed[0] if failed else None, killed=any(code is None for code in codes),
                          argv=argvs)


def _stop(cluster: EmulatedCluster, procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """Stop the agents (:func:`~plexus_tune.launch.external.stop_agents`), then SIGKILL all that is
    left in the node namespaces."""
    if all(p.poll() is not None for p in procs):
        return
    stop_agents(procs, grace_s)
    for ns in cluster.node_namespaces:
        _kill_netns_processes(ns)
