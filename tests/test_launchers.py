"""Launchers: torchrun agents with c10d rendezvous, results and failures collected per rank,
and the placement check against the model's rank order."""

import pytest

from plexus_tune.errors import UserError
from plexus_tune.launch import RankFailure
from plexus_tune.launch.launchers import Launcher, TorchrunLauncher, check_placement, expected_nodes
from plexus_tune.launch.probe import all_reduce_ranks


def _placement(nodes):
    return [{"rank": r, "host": "h", "node": n} for r, n in enumerate(nodes)]


def test_expected_nodes_fill_a_node_with_consecutive_ranks():
    assert expected_nodes(8, 4) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert expected_nodes(6, 2) == [0, 0, 1, 1, 2, 2]


def test_check_placement_accepts_relabelled_nodes_and_rejects_interleaving():
    assert check_placement(_placement([0, 0, 1, 1]), 2)["placement_ok"]
    assert check_placement(_placement([1, 1, 0, 0]), 2)["placement_ok"]  # labels are free
    bad = check_placement(_placement([0, 1, 0, 1]), 2)  # round-robin: Y would cross nodes
    assert not bad["placement_ok"] and bad["rank_nodes"] == [0, 1, 0, 1]
    assert not check_placement(_placement([0, 0, 0, 1]), 2)["placement_ok"]


def test_local_launcher_reports_one_node():
    with Launcher() as launcher:
        out = launcher.run(all_reduce_ranks, 2, timeout_s=60)
    assert [v["sum"] for v in out.values] == [1.0, 1.0]
    assert check_placement(out.placement, 2)["placement_ok"]
    assert launcher.describe() == {"launcher": "local", "cluster": None}


def test_torchrun_agents_per_node_rendezvous_and_placement():
    launcher = TorchrunLauncher(["localhost", "localhost"], 2)
    out = launcher.run(all_reduce_ranks, 4, timeout_s=90)
    assert [v["sum"] for v in out.values] == [6.0] * 4
    assert [p["rank"] for p in out.placement] == [0, 1, 2, 3]
    assert sorted(p["node"] for p in out.placement) == [0, 0, 1, 1]
    assert check_placement(out.placement, 2)["placement_ok"]


def test_torchrun_failure_names_the_failing_rank():
    launcher = TorchrunLauncher(["localhost", "localhost"], 1)
    with pytest.raises(RankFailure) as info:
        launcher.run(all_reduce_ranks, 2, (1,), timeout_s=60)
    assert info.value.rank == 1 and "asked to fail" in info.value.reason


def test_torchrun_world_that_does_not_fit_is_rejected_before_starting():
    with pytest.raises(UserError, match="do not fit 2 node"):
        TorchrunLauncher(["localhost", "localhost"], 2).check(6)


@pytest.mark.slow
def test_emulated_launcher_runs_ranks_on_their_nodes():
    import os

    from plexus_tune.launch.launchers import make_launcher

    if os.geteuid() != 0:
        pytest.skip("the emulated cluster needs root")
    launcher = make_launcher(cluster="emulated:nodes=2,ranks_per_node=2,inter_gbps=0.2")
    with launcher:
        launcher.check(4)
        out = launcher.run(all_reduce_ranks, 4, timeout_s=90)
    assert [v["sum"] for v in out.values] == [6.0] * 4
    assert [p["node"] for p in out.placement] == [0, 0, 1, 1]
    assert check_placement(out.placement, 2)["placement_ok"]
    described = launcher.describe()
    assert described["launcher"] == "emulated" and described["cluster"]["inter_gbps"] == 0.2
    from plexus_tune.cluster.emulated import netns_list

    assert not set(launcher.emulated.node_namespaces) & set(netns_list())  # removed on exit


def test_make_launcher_rejects_bad_choices():
    from plexus_tune.launch.launchers import make_launcher

    with pytest.raises(UserError, match="unknown launcher"):
        make_launcher("mpirun")
    with pytest.raises(UserError, match="hosts"):
        make_launcher("torchrun")
    with pytest.raises(UserError):
        make_launcher(cluster="emulated:nodes=2,ranks_per_node=2,inter_gbps=-1")


def test_watchdog_ends_a_blocked_rank_and_names_where_it_was():
    """A rank blocked past its timeout (as in a collective whose peer stopped answering) exits
    with status 124, saying where it was; a rank that finishes in time is left alone."""
    import subprocess
    import sys
    import time

    code = ("import time\nfrom plexus_tune.launch.local import start_watchdog\n"
            "def blocked_in_a_collective():\n    time.sleep(30)\n"
            "start_watchdog(0.5, 3)\nblocked_in_a_collective()\n")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 124 and time.monotonic() - started < 20
    assert "rank 3: timed out after 0.5 s; rank 3 was in" in proc.stderr
    finished = subprocess.run([sys.executable, "-c", "import time\nfrom plexus_tune.launch.local import start_watchdog\n"
                               "start_watchdog(1.0, 0).set()\ntime.sleep(1.5)\n"], capture_output=True, text=True, timeout=60)
    assert finished.returncode == 0 and finished.stderr == ""
