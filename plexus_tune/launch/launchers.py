"""Launchers: where and how a command's ranks start (see docs/architecture.md, "Launchers").

- ``local``: processes on this host (:func:`plexus_tune.launch.local.launch_local`);
- ``torchrun``: one torchrun agent per node, c10d rendezvous at the first node; nodes are
  host names reached with ssh, or this host;
- ``emulated``: the same torchrun agents, one inside each node of an emulated cluster
  (network namespaces linked by shaped veth pairs, :mod:`plexus_tune.cluster`);
- ``slurm``: one ``srun`` job step per process set inside an allocation.

A launcher is a context manager (the emulated cluster exists between enter and exit), checks
that a world size fits it before any work starts (:meth:`Launcher.check`), runs
``fn(rank, world_size, *args)`` on every rank (:meth:`Launcher.run`, returning
:class:`~plexus_tune.launch.external.Launched`) and describes itself for records
(:meth:`Launcher.describe`).

Placement: the model assumes rank = z Gx Gy + x Gy + y with consecutive ranks filling a node
(Y fastest, then X, then Z, within and across nodes). :func:`check_placement` compares the
nodes the ranks really ran on with that assumption.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import sys
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Callable

from plexus_tune.resources import check_local_ranks
from plexus_tune.cluster.emulated import EmulatedCluster
from plexus_tune.launch.emulated import node_command
from plexus_tune.cluster.spec import parse_cluster
from plexus_tune.errors import UserError
from plexus_tune.launch import slurm
from plexus_tune.launch.external import WORKER_MODULE, Launched, run_agents, torchrun_argv, write_job
from plexus_tune.launch.local import DEFAULT_TIMEOUT_S, RankFailure, free_port, launch_local

LAUNCHERS = ("local", "torchrun", "emulated", "slurm")


def expected_nodes(world_size: int, ranks_per_node: int) -> list[int]:
    """Node index of each rank under the model's placement: rank // ranks_per_node."""
    return [rank // ranks_per_node for rank in range(world_size)]


def check_placement(placement: Sequence[Mapping], ranks_per_node: int) -> dict:
    """Whether ranks ran where the model assumes: {'placement_ok', 'rank_nodes', 'rank_hosts'}.

    Ranks r and r' must share a node exactly when r // ranks_per_node == r' // ranks_per_node
    (node labels themselves are free). Ranks without a placement report count as mismatched.
    """
    world = len(placement)
    nodes = [p.get("node") for p in placement]
    hosts = [p.get("host") for p in placement]
    keys = [(h, n) for h, n in zip(hosts, nodes)]
    want = expected_nodes(world, ranks_per_node)
    ok = all(p.get("rank") == r for r, p in enumerate(placement))
    ok = ok and all((keys[a] == keys[b]) == (want[a] == want[b]) for a in range(world) for b in range(a + 1, world))
    return {"placement_ok": bool(ok), "rank_nodes": nodes, "rank_hosts": hosts}


class Launcher:
    """Base: a launcher on one node that runs everything locally."""

    name = "local"
    #: start more ranks on this host than its cores and memory hold (:mod:`plexus_tune.resources`)
    oversubscribe = False

    def __init__(self, ranks_per_node: int | None = None):
        self.ranks_per_node = ranks_per_node

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def check(self, world_size: int) -> None:
        """Raise UserError when ``world_size`` ranks cannot run on this launcher (here: this host's
        cores and memory, :func:`plexus_tune.resources.check_local_ranks`)."""
        check_local_ranks(world_size, allow=self.oversubscribe)

    def ranks_per_node_for(self, world_size: int) -> int | None:
        """Ranks per node of a set of ``world_size`` ranks (None: all on this host)."""
        return self.ranks_per_node

    def cluster(self) -> dict | None:
        """The cluster the ranks run on, for records (None: this host)."""
        return None

    def describe(self) -> dict:
        return {"launcher": self.name, "cluster": self.cluster()}

    def machine_name(self) -> str | None:
        """The machine runs happen on, for records (None: the host name)."""
        return None

    def run(self, fn: Callable[..., Any], world_size: int, args: Sequence[Any] = (), *, backend: str = "gloo",
            timeout_s: float = DEFAULT_TIMEOUT_S, threads_per_rank: int | None = None,
            preload: Sequence[str] = ()) -> Launched:
        values = launch_local(fn, world_size, args, backend=backend, timeout_s=timeout_s,
                              threads_per_rank=threads_per_rank, preload=preload)
        host = socket.gethostname()
        return Launched(values, [{"rank": r, "host": host, "node": 0, "local_rank": r} for r in range(world_size)])


class TorchrunLauncher(Launcher):
    """torchrun agents on ``hosts`` (ssh for remote ones), ``ranks_per_node`` ranks each.

    The job directory must be on a file system every host sees (``job_root``).
    """

    name = "torchrun"

    def __init__(self, hosts: Sequence[str], ranks_per_node: int, *, job_root: str | None = None,
                 ssh: Sequence[str] = ("ssh", "-o", "BatchMode=yes")):
        super().__init__(ranks_per_node)
        if not hosts:
            raise UserError("the torchrun launcher needs at least one host")
        self.hosts = list(hosts)
        self.job_root = job_root
        self.ssh = list(ssh)

    @property
    def nodes(self) -> int:
        return len(self.hosts)

    def check(self, world_size: int) -> None:
        if self.nodes * self.ranks_per_node != world_size:
            raise UserError(f"{world_size} ranks do not fit {self.nodes} node(s) x {self.ranks_per_node} ranks per "
                            f"node; choose ranks per node so that nodes x ranks per node = {world_size}")

    def cluster(self) -> dict | None:
        return {"kind": "hosts", "nodes": self.nodes, "ranks_per_node": self.ranks_per_node, "hosts": self.hosts}

    def rendezvous_host(self) -> str:
        return self.hosts[0]

    def local_addr(self, node: int) -> str | None:
        return None

    def agent_command(self, node: int, argv: list[str], env: dict) -> tuple[list[str], dict]:
        host = self.hosts[node]
        if host in ("localhost", "127.0.0.1", socket.gethostname()):
            return argv, env
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k.startswith(("PLEXUS_TUNE", "GLOO", "OMP")))
        return [*self.ssh, host, f"cd {shlex.quote(os.getcwd())} && env {exports} {shlex.join(argv)}"], dict(os.environ)

    def run(self, fn, world_size, args=(), *, backend="gloo", timeout_s=DEFAULT_TIMEOUT_S, threads_per_rank=None,
            preload=()) -> Launched:
        self.check(world_size)
        job_dir = write_job(fn, args, backend=backend, timeout_s=timeout_s, threads_per_rank=threads_per_rank,
                            directory=self.job_root)
        endpoint = f"{self.rendezvous_host()}:{free_port()}"
        run_id = uuid.uuid4().hex[:12]
        agents = []
        for node in range(self.nodes):
            env = {**os.environ, "PLEXUS_TUNE_NODE": str(node)}
            argv = torchrun_argv(nnodes=self.nodes, nproc_per_node=self.ranks_per_node, node_rank=node,
                                 endpoint=endpoint, run_id=run_id, job_dir=str(job_dir),
                                 local_addr=self.local_addr(node))
            agents.append(self.agent_command(node, argv, env))
        return run_agents(agents, job_dir, world_size, timeout_s=timeout_s + 60.0)


class EmulatedLauncher(TorchrunLauncher):
    """torchrun agents inside the nodes of an emulated cluster (:mod:`plexus_tune.cluster`).

    The cluster (namespaces, shaped links) exists between ``__enter__`` and ``__exit__``;
    gloo binds to each node's NIC, so ranks of one node talk over its local route and ranks
    of different nodes over the shaped link.
    """

    name = "emulated"

    def __init__(self, spec):
        super().__init__([f"node{k}" for k in range(spec.nodes)], spec.ranks_per_node)
        self.spec = spec
        self.emulated = EmulatedCluster(spec)
        self.started = False

    def check(self, world_size: int) -> None:
        super().check(world_size)
        check_local_ranks(world_size, allow=self.oversubscribe, where="this host (every emulated node)")

    def __enter__(self):
        self.emulated.start()
        self.started = True
        return self

    def __exit__(self, *exc) -> None:
        self.emulated.close()
        self.started = False

    def cluster(self) -> dict | None:
        return {**self.spec.to_dict(), "emulated": True}

    def rendezvous_host(self) -> str:
        return self.emulated.address(0)

    def local_addr(self, node: int) -> str | None:
        return self.emulated.address(node)

    def agent_command(self, node: int, argv: list[str], env: dict) -> tuple[list[str], dict]:
        return node_command(self.emulated, node, argv, env)

    def run(self, fn, world_size, args=(), **kwargs) -> Launched:
        if not self.started:
            with self:
                return super().run(fn, world_size, args, **kwargs)
        return super().run(fn, world_size, args, **kwargs)


class SlurmLauncher(Launcher):
    """Slurm. Inside an allocation: one ``srun`` job step per process set. Outside one: the
    command is submitted as a batch job whose script runs it again inside the allocation
    (:mod:`plexus_tune.launch.dispatch`); :meth:`run` is for the inside only.

    A step has ``nodes`` nodes of ``ranks_per_node`` tasks (default: the allocation's
    nodes, and G spread evenly over them; outside an allocation one node unless
    ``ranks_per_node`` is given); each task runs the worker module, whose rendezvous
    address is the step's first node. ``submit_options`` (partition, account,
    time_limit, extra sbatch arguments) shape the batch job of the outside.
    """

    name = "slurm"

    def __init__(self, ranks_per_node: int | None = None, *, environ: Mapping[str, str] | None = None,
                 gpus_per_task: int | None = None, job_root: str | None = None,
                 submit_options: Mapping[str, Any] | None = None):
        super().__init__(ranks_per_node)
        env = os.environ if environ is None else environ
        self.inside = slurm.in_allocation(env)
        self.allocation = slurm.allocation_size(env) if self.inside else None
        self.gpus_per_task = gpus_per_task
        self.job_root = job_root or os.getcwd()
        self.submit_options = dict(submit_options or {})
        self.batch_nodes = 1  # nodes of the batch job the outside submits: the largest step checked
        self._cluster_name = env.get("SLURM_CLUSTER_NAME")

    def layout(self, world_size: int) -> tuple[int, int]:
        """(nodes, ranks per node) of a step of ``world_size`` tasks."""
        if self.ranks_per_node:
            return -(-world_size // self.ranks_per_node), self.ranks_per_node
        if self.allocation is None:
            return 1, world_size
        nodes = min(self.allocation.nodes, world_size)
        while world_size % nodes:
            nodes -= 1
        return nodes, world_size // nodes

    def ranks_per_node_for(self, world_size: int) -> int | None:
        return self.layout(world_size)[1]

    def check(self, world_size: int) -> None:
        nodes, per_node = self.layout(world_size)
        if nodes * per_node != world_size:
            raise UserError(f"{world_size} ranks are not a whole number of nodes of {per_node} ranks; "
                            f"choose ranks per node dividing {world_size}")
        if self.allocation is not None:
            slurm.check_allocation(self.allocation, nodes, per_node)
        else:
            self.batch_nodes = max(self.batch_nodes, nodes)

    def cluster(self) -> dict | None:
        # the allocation's shape, not its job id: a run measured again in another job of the
        # same shape is the same measurement (the ids are in the record's ``slurm`` field)
        nodes = self.allocation.nodes if self.allocation is not None else self.batch_nodes
        return {"kind": "slurm", "nodes": nodes, "ranks_per_node": self.ranks_per_node}

    def machine_name(self) -> str | None:
        """The Slurm cluster's name (``slurm:NAME``): the machine runs happen on, the same from a
        login node and from any batch host."""
        if self._cluster_name is None:
            try:
                self._cluster_name = slurm.cluster_name()
            except UserError:
                self._cluster_name = ""
        return f"slurm:{self._cluster_name}" if self._cluster_name else None

    def run(self, fn, world_size, args=(), *, backend="gloo", timeout_s=DEFAULT_TIMEOUT_S, threads_per_rank=None,
            preload=()) -> Launched:
        if self.allocation is None:
            raise UserError("job steps start inside a Slurm allocation; outside one the command is submitted "
                            "with sbatch instead")
        self.check(world_size)
        nodes, per_node = self.layout(world_size)
        job_dir = write_job(fn, args, backend=backend, timeout_s=timeout_s, threads_per_rank=threads_per_rank,
                            directory=self.job_root)
        argv = slurm.srun_step_argv(nodes, per_node, [sys.executable, "-m", WORKER_MODULE, str(job_dir)],
                                    gpus_per_task=self.gpus_per_task, job_name="plexus-tune")
        env = {**os.environ, "MASTER_PORT": str(free_port())}
        env.pop("MASTER_ADDR", None)
        try:
            return run_agents([(argv, env)], job_dir, world_size, timeout_s=timeout_s + 60.0, keep=True)
        except RankFailure as exc:
            exc.fields = {"slurm": slurm.failed_step(job_dir, self.allocation.job_id)}
            raise
        finally:
            shutil.rmtree(job_dir, ignore_errors=True)


def make_launcher(name: str | None = None, *, cluster: str | None = None, hosts: str | None = None,
                  ranks_per_node: int | None = None, environ: Mapping[str, str] | None = None,
                  submit_options: Mapping[str, Any] | None = None) -> Launcher:
    """The launcher a command asked for; ``slurm`` by default inside an allocation.

    ``cluster`` (an emulated-cluster spec) implies ``emulated``; ``hosts`` (comma-separated)
    is required by ``torchrun``; ``submit_options`` shape the batch job of ``slurm`` outside
    an allocation (:class:`SlurmLauncher`).
    """
    env = os.environ if environ is None else environ
    if name is None:
        name = "emulated" if cluster else ("slurm" if slurm.in_allocation(env) else "local")
    if name not in LAUNCHERS:
        raise UserError(f"unknown launcher {name!r}; choose one of {', '.join(LAUNCHERS)}")
    if cluster and name != "emulated":
        raise UserError(f"a cluster spec goes with the emulated launcher, not {name!r}")
    if name == "local":
        return Launcher(ranks_per_node)
    if name == "slurm":
        needed = "srun" if slurm.in_allocation(env) else "sbatch"
        if shutil.which(needed) is None:
            raise UserError(f"the slurm launcher needs {needed} on the PATH: run on a Slurm login node or "
                            f"inside an allocation, or choose another launcher")
        return SlurmLauncher(ranks_per_node, environ=env, submit_options=submit_options)
    if name == "torchrun":
        host_list = [h.strip() for h in (hosts or "").split(",") if h.strip()]
        if not host_list or not ranks_per_node:
            raise UserError("the torchrun launcher needs the node hosts (comma-separated) and the ranks per node")
        return TorchrunLauncher(host_list, ranks_per_node)

    if not cluster:
        raise UserError("the emulated launcher needs a cluster spec such as "
                        "emulated:nodes=2,ranks_per_node=4,inter_gbps=0.5,inter_latency_us=200")
    return EmulatedLauncher(parse_cluster(cluster))

