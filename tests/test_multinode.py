"""Collectives and training across the nodes of an emulated cluster (2 nodes x 2 ranks).

The references are the physical settings of the emulated link (the tc rate) and the
model's placement formulas; the emulated-cluster tests need root with ``ip`` and ``tc``
and are skipped with the reason otherwise. Their namespaces carry the prefix ``mn``.
"""

import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from netns_token import prefix_for
from plexus_tune.errors import UserError
from plexus_tune.measure.records import CollectiveRecord, table_row
from plexus_tune.model.collectives import placement

PREFIX = prefix_for("m")  # this run's alone (tests/netns_token.py)
LINK_GBPS = 0.05


def _why_not() -> str | None:
    if not sys.platform.startswith("linux"):
        return "Linux only"
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs the {tool} command (iproute2)"
    return None


needs_netns = pytest.mark.skipif(_why_not() is not None, reason=f"emulated cluster: {_why_not()}")


@pytest.fixture
def prefix(monkeypatch):
    """Clusters of the test get this run's namespace prefix; none of them may outlive it."""
    from plexus_tune.cluster.emulated import PREFIX_ENV, namespace_re, netns_list

    monkeypatch.setenv(PREFIX_ENV, PREFIX)
    pattern = namespace_re(PREFIX)
    before = {ns for ns in netns_list() if pattern.match(ns)}
    yield PREFIX
    left = {ns for ns in netns_list() if pattern.match(ns)} - before
    assert not left, f"namespaces left behind: {sorted(left)}"


# --------------------------------------------------------------------- no root needed


def test_namespace_prefix_is_checked_and_keeps_users_apart(monkeypatch):
    from plexus_tune.cluster.emulated import PREFIX_ENV, EmulatedCluster, namespace_re, netns_prefix

    assert netns_prefix("mn") == "mn"
    monkeypatch.setenv(PREFIX_ENV, "mn")
    cluster = EmulatedCluster("emulated:nodes=2,ranks_per_node=1,inter_gbps=0.1")
    assert cluster.switch_ns.startswith("mn") and all(ns.startswith("mn") for ns in cluster.node_namespaces)
    assert cluster.state_file.name == f"mn{cluster.id}.json"
    assert namespace_re("mn").match(cluster.node_namespaces[1]) and not namespace_re("pt").match(cluster.switch_ns)
    for bad in ("MN", "mn1", "", "toolong"):
        monkeypatch.setenv(PREFIX_ENV, bad) if bad else monkeypatch.delenv(PREFIX_ENV)
        if not bad:
            assert netns_prefix() == "pt"
            continue
        with pytest.raises(UserError, match="1 to 4 lower-case letters"):
            EmulatedCluster("emulated:nodes=2,ranks_per_node=1,inter_gbps=0.1")


def test_group_layout_matches_the_model_placement():
    """Nodes spanned, ranks per node and NIC sharing of concurrent groups equal the model's
    k, r and s = min(n, p) for every shape of G = 8 on 2 x 4 and 4 x 2 nodes."""
    from plexus_tune.measure.collectives import collective_shapes, group_layout, partition

    for nodes, n in ((2, 4), (4, 2)):
        rank_nodes = [r // n for r in range(8)]
        for g, p in collective_shapes(8):
            got = group_layout(partition(8, g, p), rank_nodes)
            place = placement(g, p, n)
            assert got["nodes_spanned"] == int(place.nodes) and got["ranks_per_node"] == int(place.ranks_per_node)
            if place.nodes > 1:
                assert got["concurrent"] == int(place.concurrent), (nodes, n, g, p)
            alone = group_layout(partition(8, g, p)[:1], rank_nodes)
            assert alone["concurrent"] == 1 and alone["nodes_spanned"] == int(place.nodes)


def test_fit_reads_logged_sharing():
    """A group timed alone (concurrent = 1) is placed without sharing, the same shape timed
    with all its groups (concurrent = s) with it; the fit recovers beta_inter from both."""
    from plexus_tune.fit.collectives import fit_collectives, frame_placement

    beta_intra, beta_inter, n = 1.0, 0.05, 2
    rows = []
    for m in (2**18, 2**20, 2**22):
        for g, p in ((2, 1), (2, 2), (4, 1)):
            place = placement(g, p, n)
            for alone in (False, True):
                s = 1 if alone or place.nodes == 1 else int(place.concurrent)
                beta = beta_intra if place.nodes == 1 else beta_inter / s
                rows.append({"op": "all_gather", "group_size": g, "stride": p, "nodes_spanned": int(place.nodes),
                             "message_bytes": m, "time_ms": (g - 1) / g * m / beta * 1e-6 + 0.1 * (g - 1),
                             "concurrent": s, "gpus_per_node": n})
    df = pd.DataFrame(rows)
    place, mismatches = frame_placement(df, n)
    assert mismatches == 0 and list(place.concurrent) == list(df["concurrent"])
    model = fit_collectives(df, form="two-tier", n_splits=20)
    assert model.name == "two-tier" and model.network.sharing
    assert model.network.beta_inter_gbps == pytest.approx(beta_inter, rel=1e-3)
    assert model.all_scores["two-tier"]["sizes_out_mape"] < model.all_scores["two-tier/no-sharing"]["sizes_out_mape"]


def test_collective_records_carry_where_groups_ran():
    from plexus_tune.measure.collectives import collective_records

    per_rank = [[(2, 2, "concurrent", "all_gather", 256, [0.002, 0.003, 0.004]),
                 (2, 2, "alone", "all_gather", 256, [0.001, 0.001, 0.001] if r in (0, 2) else None)] for r in range(4)]
    records = collective_records(per_rank, world=4, gpus_per_node=2, backend="gloo", rank_nodes=[0, 0, 1, 1])
    conc, alone = records
    assert (conc["groups"], conc["alone"], conc["nodes_spanned"], conc["ranks_per_node"], conc["concurrent"]) == (2, False, 2, 1, 2)
    assert (alone["groups"], alone["alone"], alone["nodes_spanned"], alone["concurrent"]) == (1, True, 2, 1)
    assert alone["time_ms"] == pytest.approx(1.0) and conc["time_ms"] == pytest.approx(3.0)
    for rec in records:
        assert CollectiveRecord.from_dict(rec).extra == {}
        assert table_row(rec)["nodes"] == 2 and rec["gpus_per_node"] == 2


@pytest.mark.parametrize("argv, needle", [
    (["--gpus", "4", "--cluster", "emulated:nodes=2,ranks_per_node=2,inter_gbps=0.1", "--gpus-per-node", "4"], "disagrees"),
    (["--gpus", "6", "--cluster", "emulated:nodes=2,ranks_per_node=2,inter_gbps=0.1"], "6 ranks do not fit"),
    (["--cluster", "emulated:nodes=2,ranks_per_node=2,inter_gbps=0"], "inter_gbps must be > 0"),
    (["--cluster", "emulated:nodes=2,ranks_per_node=2,inter_gbps=0.1", "--modes", "sometimes"], "--modes"),
    (["--out", "x.jsonl"], "needs --gpus"),
])
def test_calibrate_collectives_bad_input_exits_2_before_any_work(run_cli, tmp_path, argv, needle):
    out = tmp_path / "c.jsonl"
    argv = [a if a != "x.jsonl" else str(out) for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(out)]
    code, _, err = run_cli(["calibrate", "collectives", *argv])
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


# --------------------------------------------------------------------- on the emulated cluster


@pytest.mark.slow
@needs_netns
@pytest.mark.timeout(240)
def test_cross_node_all_gather_fits_the_link_rate(prefix, tmp_path):
    """calibrate collectives on 2 nodes x 2 ranks with a 0.05 GB/s link: the fitted inter-node
    bus bandwidth of the all-gather is the tc rate within 25 %, and intra-node is >= 5x faster."""
    from plexus_tune.fit.collectives import fit_collectives
    from plexus_tune.launch.launchers import make_launcher
    from plexus_tune.measure.collectives import calibrate_collectives
    from plexus_tune.measure.store import append_records
    from plexus_tune.fit.profile import load_tables

    spec = f"emulated:nodes=2,ranks_per_node=2,inter_gbps={LINK_GBPS}"
    launcher = make_launcher(cluster=spec)
    with launcher:
        records = calibrate_collectives(4, launcher=launcher, ops=["all_gather"], sizes=[2**19, 2**21, 2**23],
                                        shapes=[(2, 1), (2, 2), (4, 1)], warmup=1, repeats=3, timeout_s=200)
    log = tmp_path / "coll.jsonl"
    append_records(log, records)
    # 3 shapes x 3 sizes with all groups, and one group of (2, 1) and of (2, 2) alone
    assert len(records) == 15 and sum(rec["alone"] for rec in records) == 6
    for rec in records:
        assert rec["launcher"] == "emulated" and rec["cluster"]["inter_gbps"] == LINK_GBPS and rec["cluster"]["emulated"]
        assert rec["rank_nodes"] == [0, 0, 1, 1] and rec["gpus_per_node"] == 2 and rec["placement_ok"]
        place = placement(rec["group_size"], rec["stride"], 2)
        assert rec["nodes_spanned"] == place.nodes and rec["ranks_per_node"] == place.ranks_per_node
        assert rec["concurrent"] == (1 if rec["alone"] or place.nodes == 1 else place.concurrent)
    model = fit_collectives(load_tables(str(log), "collective"), form="two-tier", n_splits=20)
    net = model.network
    assert net.beta_inter_gbps == pytest.approx(LINK_GBPS, rel=0.25), model.to_dict()
    assert net.beta_intra_gbps >= 5 * net.beta_inter_gbps, model.to_dict()


@pytest.mark.slow
@needs_netns
@pytest.mark.timeout(240)
def test_train_check_equals_pyg_with_an_axis_across_nodes(prefix, tmp_path, run_cli):
    """train --check on 2 nodes x 2 ranks, grid 1x2x2: Y (stride 1) stays in a node, Z (stride
    2) crosses the link; the losses and outputs equal the serial PyG GCN's."""
    from plexus_tune.measure.store import read_records

    spec = f"emulated:nodes=2,ranks_per_node=2,inter_gbps={LINK_GBPS},inter_latency_us=100"
    log = tmp_path / "runs.jsonl"
    code, out, err = run_cli(["train", "--synthetic", "rmat:nodes=61,edges=300,features=6,classes=3,seed=2",
                              "--grid", "1x2x2", "--layers", "3", "--hidden", "5", "--epochs", "3", "--warmup", "1",
                              "--check", "--cluster", spec, "--timeout", "180", "--log", str(log)])
    assert code == 0, err
    assert "check against serial PyG" in out
    (rec,), problems = read_records(log)
    assert problems == [] and rec["status"] == "ok"
    assert rec["launcher"] == "emulated" and rec["cluster"]["nodes"] == 2 and rec["placement_ok"]
    assert rec["rank_nodes"] == [0, 0, 1, 1]
    assert placement(2, 1, 2).nodes == 1 and placement(2, 2, 2).nodes == 2  # Y inside a node, Z across
    assert rec["comm_y_ms"] > 0 and rec["comm_z_ms"] > 0
    assert rec["check_loss_rel_diff"] < 1e-5 and rec["check_output_rel_diff"] < 1e-4


def _namespace_pids(ns: str) -> list[str]:
    return subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()


@pytest.mark.slow
@needs_netns
@pytest.mark.timeout(300)
def test_a_cut_link_stops_a_measured_run_within_its_timeout_and_logs_it(prefix, tmp_path):
    """measure on 2 nodes x 1 rank, grid 1x1x2 (Z over the link): node 1's cable is unplugged at
    the switch while the ranks train. The run stops within its timeout, the failure is logged
    with its reason, the command says so, and no namespace or rank is left."""
    import time

    from plexus_tune.cluster.emulated import PREFIX_ENV, list_clusters
    from plexus_tune.measure.store import read_records

    timeout_s = 45
    log = tmp_path / "runs.jsonl"
    spec = f"emulated:nodes=2,ranks_per_node=1,inter_gbps={LINK_GBPS},inter_latency_us=0"
    # uncut, this run ends inside its timeout (25 s on an idle 2-core host, 18 s of it training)
    argv = [sys.executable, "-m", "plexus_tune", "measure", "--graph", "rmat:nodes=1024,edges=8192,features=16,classes=4,seed=1",
            "--gpus", "2", "--grids", "1x1x2", "--trials", "1", "--epochs", "300", "--warmup", "1", "--hidden", "16",
            "--timeout", str(timeout_s), "--cluster", spec, "--log", str(log)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, PREFIX_ENV: prefix})
    try:
        state, deadline = None, time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            state = next((c for c in list_clusters() if c.get("owner_pid") == proc.pid), None)
            if state and all(any(_namespace_pids(ns)) for ns in state["node_namespaces"]):
                break
            time.sleep(0.2)
        assert state is not None and proc.poll() is None, "the ranks never started"
        time.sleep(4)  # rendezvous, graph and the first epochs
        assert proc.poll() is None and _namespace_pids(state["node_namespaces"][1]), "the run ended before the cut"
        cut_at = time.monotonic()
        subprocess.run(["ip", "-n", state["switch_namespace"], "link", "set", "u1", "down"], check=True)
        out, err = proc.communicate(timeout=timeout_s + 120)
        stopped_after_s = time.monotonic() - cut_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert stopped_after_s < timeout_s + 30, stopped_after_s
    assert proc.returncode == 0 and "1 new run(s), 1 failed" in err, (proc.returncode, out + err)
    (rec,), problems = read_records(log)
    assert problems == []
    # the ranks' watchdog ended them and named the collective they were blocked in
    assert rec["status"] == "timeout" and "stopped answering" in rec["reason"], rec
    assert rec["launcher"] == "emulated" and rec["cluster"]["nodes"] == 2
    for ns in state["node_namespaces"] + [state["switch_namespace"]]:
        assert not os.path.exists(f"/run/netns/{ns}"), f"{ns} left behind"


@pytest.mark.slow
@needs_netns
@pytest.mark.timeout(300)
def test_torchrun_script_spans_two_emulated_nodes(prefix, tmp_path):
    """runners/examples/torchrun_train.sh started on each node of a 2 x 2 emulated cluster, as a user
    would on two hosts (NODE_RANK, MASTER_ADDR = node 0): grid 1x2x2 trains across the link,
    equals serial PyG, and the record carries each rank's node with the placement checked."""
    from pathlib import Path

    from plexus_tune.cluster.emulated import EmulatedCluster
    from plexus_tune.launch import free_port
    from plexus_tune.measure.store import read_records

    root = Path(__file__).resolve().parents[1]
    log = tmp_path / "runs.jsonl"
    spec = f"emulated:nodes=2,ranks_per_node=2,inter_gbps={LINK_GBPS},inter_latency_us=0"
    with EmulatedCluster(spec) as cluster:
        base = {**os.environ, "TORCHRUN": str(Path(sys.executable).with_name("torchrun")), "BACKEND": "gloo",
                "MASTER_ADDR": cluster.address(0), "MASTER_PORT": str(free_port()),
                "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
        procs = []
        for node in range(2):
            env = {**base, "NODE_RANK": str(node), "GLOO_SOCKET_IFNAME": cluster.nic(node)}
            argv = cluster.exec_argv(node, [str(root / "runners" / "examples" / "torchrun_train.sh"), "2", "2", "1x2x2",
                                            "--synthetic", "rmat:nodes=61,edges=300,features=6,classes=3,seed=2",
                                            "--layers", "2", "--hidden", "4", "--epochs", "3", "--warmup", "1",
                                            "--check", "--timeout", "120", "--log", str(log)])
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path))
        outputs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, err[-2000:]
    (rec,), problems = read_records(log)
    assert problems == [] and rec["status"] == "ok" and rec["gpus"] == 4
    assert rec["launcher"] == "torchrun" and rec["rank_nodes"] == [0, 0, 1, 1] and rec["placement_ok"] is True
    assert rec["check_loss_rel_diff"] < 1e-5 and rec["check_output_rel_diff"] < 1e-4


@pytest.mark.slow
@needs_netns
@pytest.mark.timeout(300)
def test_measure_over_two_emulated_nodes_logs_every_grid_with_its_placement(prefix, tmp_path, run_cli):
    """measure on 2 nodes x 2 ranks (one torchrun agent per node, c10d rendezvous at node 0)
    logs every grid of G = 4, each with the node of every rank and the placement checked."""
    from plexus_tune.measure.store import read_records
    from plexus_tune.model.grid import enumerate_grids

    spec = f"emulated:nodes=2,ranks_per_node=2,inter_gbps={LINK_GBPS},inter_latency_us=0"
    log = tmp_path / "runs.jsonl"
    code, out, err = run_cli(["measure", "--synthetic", "rmat:nodes=61,edges=300,features=6,classes=3,seed=2",
                              "--gpus", "4", "--grids", "all", "--trials", "1", "--epochs", "2", "--warmup", "1",
                              "--layers", "2", "--hidden", "4", "--timeout", "120", "--cluster", spec, "--log", str(log)])
    assert code == 0, err
    records, problems = read_records(log)
    assert problems == []
    assert sorted(r["grid"] for r in records) == sorted("x".join(map(str, g)) for g in enumerate_grids(4))
    for rec in records:
        assert rec["status"] == "ok" and rec["launcher"] == "emulated" and rec["cluster"]["nodes"] == 2
        assert rec["rank_nodes"] == [0, 0, 1, 1] and rec["placement_ok"] is True
