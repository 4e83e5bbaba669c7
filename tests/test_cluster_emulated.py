"""Cluster specs, and the emulated multi-node cluster (network namespaces, tc, torchrun).

The emulated-cluster tests need root with ``ip`` and ``tc``; without them they are
skipped with the reason.  Sizes are small: the whole module runs in about a minute.
"""

import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from netns_token import prefix_for
from plexus_tune.cluster.spec import ClusterSpec, check_world, parse_cluster
from plexus_tune.errors import UserError

pytestmark = pytest.mark.slow  # the emulated cluster

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------- specs


def test_parse_emulated_spec():
    spec = parse_cluster("emulated:nodes=2,ranks_per_node=4,inter_gbps=0.5,inter_latency_us=200")
    assert spec == ClusterSpec(kind="emulated", nodes=2, ranks_per_node=4, inter_gbps=0.5,
                               inter_latency_us=200.0, nics=1)
    assert spec.world_size == 8
    assert [spec.node_of_rank(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert spec.to_dict() == {"kind": "emulated", "nodes": 2, "ranks_per_node": 4, "inter_gbps": 0.5,
                              "inter_latency_us": 200.0, "nics": 1}
    assert ClusterSpec.from_dict(spec.to_dict()) == spec
    assert parse_cluster(spec.to_string()) == spec
    json.dumps(spec.to_dict())


def test_parse_optional_keys_and_other_kinds():
    spec = parse_cluster(" emulated: nodes=3, ranks_per_node=2, inter_gbps=0.02, nics=2, intra=loopback ")
    assert (spec.nodes, spec.ranks_per_node, spec.inter_latency_us, spec.nics) == (3, 2, 0.0, 2)
    assert spec.link_gbps == pytest.approx(0.04)
    assert ClusterSpec.from_dict(spec.to_dict()) == spec
    local = parse_cluster("local")
    assert (local.kind, local.nodes, local.world_size) == ("local", 1, None)
    assert local.node_of_rank(5) == 0
    assert parse_cluster("local:ranks_per_node=4").world_size == 4
    other = parse_cluster("slurm:partition=gpu,nodes=4")
    assert (other.kind, other.nodes, dict(other.options)) == ("slurm", 4, {"partition": "gpu", "nodes": "4"})
    assert ClusterSpec.from_dict(other.to_dict()) == other
    assert parse_cluster("torchrun").kind == "torchrun"


BAD_SPECS = [
    ("", "empty"),
    ("cloud:nodes=2", "unknown kind"),
    ("emulated", "missing nodes"),
    ("emulated:", "nothing after"),
    ("emulated:nodes=2,ranks_per_node=2", "missing inter_gbps"),
    ("emulated:nodes2,ranks_per_node=2,inter_gbps=1", "not key=value"),
    ("emulated:nodes=2,,ranks_per_node=2,inter_gbps=1", "not key=value"),
    ("emulated:nodes=2,nodes=3,ranks_per_node=2,inter_gbps=1", "given twice"),
    ("emulated:nodes=2,ranks_per_node=2,inter_gbps=1,speed=3", "unknown key 'speed'"),
    ("emulated:nodes=0,ranks_per_node=2,inter_gbps=1", "nodes must be a whole number >= 1, got 0"),
    ("emulated:nodes=1.5,ranks_per_node=2,inter_gbps=1", "nodes must be a whole number"),
    ("emulated:nodes=2,ranks_per_node=0,inter_gbps=1", "ranks_per_node must be a whole number >= 1, got 0"),
    ("emulated:nodes=2,ranks_per_node=2,inter_gbps=0", "inter_gbps must be > 0"),
    ("emulated:nodes=2,ranks_per_node=2,inter_gbps=-1", "inter_gbps must be > 0"),
    ("emulated:nodes=2,ranks_per_node=2,inter_gbps=nan", "finite"),
    ("emulated:nodes=2,ranks_per_node=2,inter_gbps=inf", "finite"),
    ("emulated:nodes=2,ranks_per_node=2,inter_gbps=fast", "finite"),
    ("emulated:nodes=2,ranks_per_node=2,inter_gbps=1,inter_latency_us=-5", "inter_latency_us must be >= 0"),
    ("emulated:nodes=2,ranks_per_node=2,inter_gbps=1,inter_latency_us=inf", "finite"),
    ("emulated:nodes=2,ranks_per_node=2,inter_gbps=1,nics=0", "nics must be a whole number >= 1, got 0"),
    ("emulated:nodes=2,ranks_per_node=2,inter_gbps=1,intra=nvlink", "intra=loopback"),
    ("local:nodes=2", "unknown key 'nodes'"),
]


@pytest.mark.parametrize("text,needle", BAD_SPECS)
def test_bad_specs_raise_one_line_user_error(text, needle):
    with pytest.raises(UserError) as info:
        parse_cluster(text)
    message = str(info.value)
    assert needle in message
    assert "\n" not in message


def test_check_world():
    spec = parse_cluster("emulated:nodes=2,ranks_per_node=4,inter_gbps=0.5")
    check_world(spec, 8)
    with pytest.raises(UserError, match="use ranks_per_node=3"):
        check_world(spec, 6)
    with pytest.raises(UserError, match="2 nodes do not divide G = 5; use nodes among 1, 5"):
        check_world(spec, 5)
    with pytest.raises(UserError, match="G must be"):
        check_world(spec, 0)
    check_world(parse_cluster("local"), 3)
    with pytest.raises(UserError, match="ranks_per_node=3"):
        check_world(parse_cluster("local:ranks_per_node=2"), 3)
    with pytest.raises(UserError, match="outside"):
        spec.node_of_rank(8)
    with pytest.raises(UserError, match="kind"):
        ClusterSpec.from_dict({"nodes": 2})


def test_busbw_factors_follow_nccl_tests():
    from plexus_tune.cluster.probe import busbw_factor

    assert busbw_factor("all_reduce", 2) == 1.0
    assert busbw_factor("all_reduce", 8) == pytest.approx(1.75)
    assert busbw_factor("all_gather", 4) == pytest.approx(0.75)
    assert busbw_factor("reduce_scatter", 2) == pytest.approx(0.5)


def test_run_torchrun_rejects_bad_calls():
    from plexus_tune.cluster.emulated import EmulatedCluster
    from plexus_tune.launch.emulated import run_torchrun

    cluster = EmulatedCluster("emulated:nodes=2,ranks_per_node=1,inter_gbps=0.1")  # not started
    with pytest.raises(UserError, match="started cluster"):
        run_torchrun(cluster, ["plexus_tune.cluster.probe"], timeout_s=5)
    with pytest.raises(UserError, match="rdzv"):
        run_torchrun(cluster, ["plexus_tune.cluster.probe"], timeout_s=5, rdzv="etcd")
    big = EmulatedCluster("emulated:nodes=10,ranks_per_node=1,inter_gbps=0.1")
    with pytest.raises(UserError, match="static"):
        run_torchrun(big, ["plexus_tune.cluster.probe"], timeout_s=5)


def test_cluster_package_does_not_import_torch():
    code = "import sys, plexus_tune.cluster; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, env=_child_env())


# ------------------------------------------------------------ emulated cluster


def _can_make_namespaces() -> str | None:
    """None when namespaces, veth and tbf work here; else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs the {tool} command (iproute2)"
    probe = f"ptprobe{os.getpid()}"
    try:
        made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
        if made.returncode != 0:
            return f"cannot create network namespaces: {made.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


_WHY_NOT = _can_make_namespaces() if sys.platform.startswith("linux") else "Linux only"
needs_netns = pytest.mark.skipif(_WHY_NOT is not None, reason=f"emulated cluster: {_WHY_NOT}")


#: namespace prefix of this module's clusters in this run, so that other users' clusters on a shared
#: host (default prefix ``pt``) and a concurrent test run neither count as left behind nor get
#: removed by its cleanup tests
PREFIX = prefix_for("e")


def _ours(names):
    from plexus_tune.cluster.emulated import namespace_re

    pattern = namespace_re(PREFIX)
    return {name for name in names if pattern.match(name)}


@pytest.fixture(scope="module", autouse=True)
def no_namespaces_left_behind():
    """After the module, none of the namespaces it created may remain."""
    if _WHY_NOT is not None:
        yield
        return
    from plexus_tune.cluster.emulated import PREFIX_ENV, netns_list

    saved = os.environ.get(PREFIX_ENV)
    os.environ[PREFIX_ENV] = PREFIX
    before = _ours(netns_list())
    yield
    if saved is None:
        os.environ.pop(PREFIX_ENV, None)
    else:
        os.environ[PREFIX_ENV] = saved
    left = _ours(netns_list()) - before
    assert not left, f"namespaces left behind: {sorted(left)}"


def _child_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


HOLDER = r"""
import json, sys, time
from plexus_tune.cluster.emulated import EmulatedCluster
cluster = EmulatedCluster(sys.argv[1]).start()
print(json.dumps({"namespaces": [cluster.switch_ns, *cluster.node_namespaces],
                  "state_file": str(cluster.state_file), "helpers": cluster.helper_pids}), flush=True)
time.sleep(600)
"""


def _start_holder(spec_text):
    # Its own process group, so that a group-wide SIGINT is what Ctrl-C in a terminal sends.
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, spec_text], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_child_env(), text=True, start_new_session=True)
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    line = proc.stdout.readline() if ready else ""
    if not line:
        proc.kill()
        raise AssertionError(f"holder did not start: {proc.stderr.read()}")
    return proc, json.loads(line)


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_pid_alive(p) for p in pids):
        time.sleep(0.05)
    return not any(_pid_alive(p) for p in pids)


@needs_netns
def test_without_root_or_tools_nothing_is_created(monkeypatch):
    from plexus_tune.cluster.emulated import EmulatedCluster, netns_list

    before = set(netns_list())
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(UserError, match="needs root.*use the local cluster") as err:
        EmulatedCluster("emulated:nodes=2,ranks_per_node=1,inter_gbps=0.1").start()
    assert err.value.parameter == "cluster"
    monkeypatch.undo()
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "tc" else real_which(tool))
    with pytest.raises(UserError, match="needs the tc command"):
        EmulatedCluster("emulated:nodes=2,ranks_per_node=1,inter_gbps=0.1").start()
    assert set(netns_list()) == before
    with pytest.raises(UserError, match="emulated"):
        EmulatedCluster("local")


@needs_netns
def test_topology_describe_and_nics():
    from plexus_tune.cluster.emulated import EmulatedCluster, list_clusters, netns_list

    spec = "emulated:nodes=3,ranks_per_node=1,inter_gbps=0.025,inter_latency_us=100,nics=2"
    with EmulatedCluster(spec, tcp_congestion="reno") as cluster:
        names = [cluster.switch_ns, *cluster.node_namespaces]
        assert set(names) <= set(netns_list())
        assert all(len(n) <= 15 for n in names)
        info = cluster.describe()
        assert info["spec"]["nics"] == 2 and info["shaping"]["link_gbps"] == pytest.approx(0.05)
        assert info["shaping"]["rate_bit_per_s"] == pytest.approx(0.05 * 8e9)
        for k, node in enumerate(info["nodes"]):
            assert node["address"] == f"{cluster.address(k)}/24" and cluster.address(k).endswith(f".{k + 1}")
            assert "tbf" in node["uplink_tc"] and "400Mbit" in node["uplink_tc"]
            assert "tbf" in node["downlink_tc"] and "400Mbit" in node["downlink_tc"]
        assert info["latency"]["one_way_us"] == 100
        assert info["tcp_congestion_control"] == "reno"
        assert [c["id"] for c in list_clusters() if c["alive"]].count(cluster.id) == 1
        out = subprocess.run(cluster.exec_argv(2, ["ip", "-o", "-4", "addr", "show", "dev", "nic0"]),
                             capture_output=True, text=True, check=True).stdout
        assert cluster.address(2) in out
        # Aggregated link: a single TCP flow gets nics x inter_gbps.
        gbps = _tcp_gbps(cluster, 0, 1, 8_000_000)
        assert 0.05 * 0.8 <= gbps <= 0.05 * 1.15, gbps
    assert not set(names) & set(netns_list())
    assert not Path(cluster.state_file).exists()
    assert cluster.delayline_summary is not None and cluster.delayline_summary["frames_sampled"] > 0


def _tcp_gbps(cluster, src, dst, message_bytes):
    """Payload rate of one TCP flow src -> dst, GB/s, timed at the receiver."""
    server = cluster.socket(dst)
    server.bind((cluster.address(dst), 0))
    server.listen(1)
    box = {}

    def receive():
        conn, _ = server.accept()
        buf = bytearray(1 << 20)
        got, first = 0, None
        while got < message_bytes:
            n = conn.recv_into(buf)
            if not n:
                break
            if first is None:
                first = time.perf_counter()
            got += n
        box["gbps"] = got / (time.perf_counter() - first) / 1e9
        conn.close()

    thread = threading.Thread(target=receive)
    thread.start()
    client = cluster.socket(src)
    client.connect((cluster.address(dst), server.getsockname()[1]))
    client.sendall(b"\0" * 200_000)  # warm-up: ARP and TCP slow start, not timed ...
    chunk = b"\1" * (1 << 20)
    sent = 200_000
    while sent < message_bytes:
        client.sendall(chunk[: message_bytes - sent])
        sent += min(len(chunk), message_bytes - sent)
    thread.join(30)
    client.close()
    server.close()
    return box["gbps"]


@needs_netns
def test_latency_one_way_and_round_trip():
    from plexus_tune.cluster.emulated import EmulatedCluster

    latency_us = 500
    with EmulatedCluster(f"emulated:nodes=2,ranks_per_node=1,inter_gbps=0.1,inter_latency_us={latency_us}") as c:
        forward = c.one_way_us(0, 1, count=20)
        backward = c.one_way_us(1, 0, count=20)
        rtt = c.rtt_us(0, 1, count=20)
        local = c.rtt_us(0, 0, count=20)
    assert len(forward) >= 18 and len(backward) >= 18
    for delays in (forward, backward):
        # Kernel timestamps: the setting plus the veth/bridge path (~10-30 us).
        assert latency_us * 0.95 <= statistics.median(delays) <= latency_us * 1.1 + 40, delays
    # A UDP ping-pong from Python: every round trip pays 2 x setting; the
    # fastest adds no more than the software round trip. (The median is not
    # bounded above: on a loaded host a Python wake-up can add a millisecond.)
    assert min(rtt) >= 2 * latency_us * 0.95, rtt
    assert min(rtt) <= 2 * latency_us + statistics.median(local) + 400, rtt
    assert statistics.median(local) < latency_us


@needs_netns
def test_sigkilled_owner_is_cleaned_up_by_next_cluster():
    from plexus_tune.cluster.emulated import EmulatedCluster, list_clusters, netns_list

    proc, held = _start_holder("emulated:nodes=2,ranks_per_node=1,inter_gbps=0.1,inter_latency_us=50")
    assert set(held["namespaces"]) <= set(netns_list())
    proc.kill()
    proc.wait(10)
    # The delay line notices its owner died and stops by itself.
    assert _wait_gone(held["helpers"])
    assert set(held["namespaces"]) <= set(netns_list())
    with EmulatedCluster("emulated:nodes=1,ranks_per_node=1,inter_gbps=0.1"):
        assert not set(held["namespaces"]) & set(netns_list())
        assert not Path(held["state_file"]).exists()
        assert all(state["alive"] for state in list_clusters())


@needs_netns
def test_orphan_namespace_without_state_file_is_removed():
    from plexus_tune.cluster.emulated import cleanup_leftovers, netns_list

    name = f"{PREFIX}{os.getpid() % 0xFFFFFF:06x}n0"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert name not in cleanup_leftovers(grace_s=3600)
        assert name in netns_list()
        assert name in cleanup_leftovers(grace_s=0)
        assert name not in netns_list()
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


@needs_netns
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_tears_down(signum):
    from plexus_tune.cluster.emulated import netns_list

    proc, held = _start_holder("emulated:nodes=2,ranks_per_node=1,inter_gbps=0.1,inter_latency_us=50")
    assert set(held["namespaces"]) <= set(netns_list())
    if signum == signal.SIGINT:
        os.killpg(proc.pid, signum)  # like Ctrl-C: the whole foreground group
    else:
        proc.send_signal(signum)
    code = proc.wait(20)
    assert code != 0
    if signum == signal.SIGTERM:
        assert code == -signal.SIGTERM
    else:
        assert "KeyboardInterrupt" in proc.stderr.read() or code == -signal.SIGINT
    assert not set(held["namespaces"]) & set(netns_list())
    assert not Path(held["state_file"]).exists()
    assert _wait_gone(held["helpers"])


@needs_netns
@pytest.mark.timeout(150)
def test_torchrun_shaping_inter_and_intra_node(tmp_path):
    from plexus_tune.cluster.emulated import EmulatedCluster
    from plexus_tune.launch.emulated import run_torchrun

    inter_gbps, latency_us, message_bytes = 0.05, 200, 12_000_000  # ~0.24 s per all-reduce
    spec = f"emulated:nodes=2,ranks_per_node=2,inter_gbps={inter_gbps},inter_latency_us={latency_us}"
    with EmulatedCluster(spec) as cluster:
        result = run_torchrun(cluster, ["plexus_tune.cluster.probe", "--out", str(tmp_path),
                                        "--message-bytes", str(message_bytes), "--iters", "2",
                                        "--pingpong-rounds", "10", "--timeout-s", "60"], timeout_s=120)
        assert result.ok, "\n".join(result.output_tails)
        master = cluster.address(0)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    for rank in ranks:
        # c10d rendezvous keeps node order: rank // ranks_per_node is the node.
        assert rank["node"] == rank["rank"] // 2 == rank["group_rank"]
        assert rank["cluster"] == spec and rank["gloo_socket_ifname"] == "nic0"
        assert rank["master_addr"] == master
    results = {item["pair"]: item for item in ranks[0]["results"]}
    inter, intra = results["inter_node"]["busbw_gbps"], results["intra_node"]["busbw_gbps"]
    assert inter == pytest.approx(inter_gbps, rel=0.25), results
    assert intra >= 5 * inter, results
    other = {item["pair"]: item for item in ranks[2]["results"]}
    assert other["inter_node"]["busbw_gbps"] == pytest.approx(inter_gbps, rel=0.25)
    assert ranks[0]["pingpong"]["rtt_us_min"] >= 2 * latency_us * 0.9


@needs_netns
@pytest.mark.timeout(150)
def test_cut_link_fails_the_job_in_bounded_time(tmp_path):
    from plexus_tune.cluster.emulated import EmulatedCluster
    from plexus_tune.launch.emulated import run_torchrun

    gloo_timeout_s, timeout_s = 8, 60
    with EmulatedCluster("emulated:nodes=2,ranks_per_node=1,inter_gbps=0.1,inter_latency_us=0") as cluster:
        box = {}
        argv = ["plexus_tune.cluster.probe", "--out", str(tmp_path), "--message-bytes", "65536",
                "--iters", "1", "--pingpong-rounds", "0", "--loop-s", "300", "--timeout-s", str(gloo_timeout_s)]
        worker = threading.Thread(target=lambda: box.update(result=run_torchrun(cluster, argv, timeout_s=timeout_s)))
        worker.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and worker.is_alive():
            if all((tmp_path / f"rank{r}.loop").exists() for r in range(2)):
                break
            time.sleep(0.2)
        assert all((tmp_path / f"rank{r}.loop").exists() for r in range(2)), "the job never started its loop"
        cut_at = time.monotonic()
        cluster.set_link(1, up=False)
        assert cluster.describe()["nodes"][1]["link_up"] is False
        worker.join(timeout_s + 30)
        assert not worker.is_alive()
        stopped_after_s = time.monotonic() - cut_at
        result = box["result"]
        assert not result.ok
        assert stopped_after_s < timeout_s
        assert any(code not in (0, None) for code in result.returncodes)
        for ns in cluster.node_namespaces:
            left = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            assert not left, f"processes left in {ns}: {left}"
