"""The joint ranking over families scored on measured runs: configurations of every trained
family, named clusters, the scores by hand, and the runner end to end (slow: emulated cluster)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from netns_token import prefix_for

from plexus_tune.errors import UserError
from plexus_tune.measure.families import (cluster_spec, configuration_label, family_configurations, trained_families,
                                          untrained_families)
from plexus_tune.model.family import family_names
from plexus_tune.model.breakdown import TOTAL_PARTS
from plexus_tune.trainer.algorithms import TRAINED_ALGORITHMS
from plexus_tune.report.families import score_rows

REPO = Path(__file__).resolve().parents[1]


def test_every_trained_family_and_variant_is_a_configuration():
    configs = family_configurations(8)
    by_family = {}
    for family, grid, options in configs:
        assert int(np.prod(grid)) == 8
        by_family.setdefault(family, []).append((grid, options.get("aggregation")))
    assert set(by_family) == set(trained_families())
    assert len(by_family["plexus-3d"]) == 10  # every ordered factorization of 8 into three axes
    assert sorted(a for _, a in by_family["supergcn"]) == ["hybrid", "post", "pre"]
    assert sorted(g for g, _ in by_family["cagnet-2d"]) == [(1, 8, 1), (2, 4, 1), (4, 2, 1), (8, 1, 1)]
    assert set(untrained_families()) == set(family_names()) - set(TRAINED_ALGORITHMS)
    if "cagnet-3d" in by_family:  # split-3D: every Pr x Pc x Pl with Pl >= 2
        assert sorted(g for g, _ in by_family["cagnet-3d"]) == [(1, 1, 8), (1, 2, 4), (1, 4, 2), (2, 1, 4), (2, 2, 2), (4, 1, 2)]


def test_named_clusters():
    assert cluster_spec("2x4") == "emulated:nodes=2,ranks_per_node=4,inter_gbps=0.05,inter_latency_us=0"
    assert cluster_spec("4x2").startswith("emulated:nodes=4,ranks_per_node=2,")
    assert cluster_spec("emulated:nodes=2,ranks_per_node=2") == "emulated:nodes=2,ranks_per_node=2"
    for bad in ("2x", "x4", "2by4", "0x4"):
        with pytest.raises(UserError, match="NODESxRANKS"):
            cluster_spec(bad)


def test_scores_by_hand():
    def row(family, grid, agg, precision, observed, predicted):
        options = {"aggregation": agg} if agg else {}
        return {"family": family, "grid": grid, "options": options, "comm_precision": precision, "epoch_ms": observed,
                "total_ms": predicted, "label": configuration_label(family, grid, options, precision)}

    rows = [row("plexus-3d", (2, 2, 2), None, "fp32", 100.0, 90.0),
            row("plexus-3d", (8, 1, 1), None, "bf16", 120.0, 80.0),  # predicted best, observed second
            row("supergcn", (8, 1, 1), "post", "fp32", 110.0, 95.0),
            row("cagnet-1d", (8, 1, 1), None, "fp32", 300.0, 200.0)]
    scores = score_rows(rows)
    # ranks predicted (3, 1, 2, 4) (by 90, 80, 95, 200 -> 2, 1, 3, 4) against observed (1, 3, 2, 4):
    # d = (1, -2, 1, 0), Spearman = 1 - 6 * 6 / (4 * 15) = 0.4
    assert scores["spearman"] == pytest.approx(0.4)
    assert scores["regret"] == pytest.approx(120.0 / 100.0)
    assert scores["predicted_best"] == "plexus-3d 8x1x1 bf16" and scores["observed_best"] == "plexus-3d 2x2x2"
    fam = scores["families"]
    assert fam["plexus-3d"]["observed_best"] == "plexus-3d 2x2x2" and fam["plexus-3d"]["predicted_best"] == "plexus-3d 8x1x1 bf16"
    assert fam["plexus-3d"]["predicted_best_epoch_ms"] == 120.0
    assert fam["supergcn"]["observed_best"] == "supergcn 8x1x1 post"


def test_runner_refuses_bad_input_before_any_run(tmp_path):
    for args, message in ((["--cluster", "2by4"], "NODESxRANKS"), (["--graph", "nosuch:nodes=5"], "unknown graph generator"),
                          (["--comm-precision", "fp7"], "precision")):
        proc = subprocess.run([sys.executable, str(REPO / "runners" / "campaigns" / "emulated_families.py"), "--out-dir",
                               str(tmp_path / "out"), *args], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert message in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_tiny_campaign_on_the_emulated_cluster(tmp_path):
    if os.geteuid() != 0 or not Path("/sbin/ip").exists() and not Path("/usr/sbin/ip").exists():
        pytest.skip("the emulated cluster needs root with ip and tc")
    out = tmp_path / "tiny"
    env = {**os.environ, "PLEXUS_TUNE_NETNS_PREFIX": prefix_for("v")}
    proc = subprocess.run([sys.executable, str(REPO / "runners" / "campaigns" / "emulated_families.py"), "--tiny", "--out-dir", str(out)],
                          capture_output=True, text=True, timeout=1500, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("mean Spearman ") and ", mean regret " in last
    summary = json.loads((out / "summary.json").read_text())
    (graph,) = summary["graphs"]
    # every trained family's configurations at both precisions, each measured once
    assert graph["configurations"] == 2 * len(family_configurations(8))
    assert {r["comm_precision"] for r in graph["rows"]} == {"fp32", "bf16"}
    assert set(graph["families"]) == set(trained_families())
    assert float(last.split()[2].rstrip(",")) == pytest.approx(graph["spearman"], abs=5e-4)
    assert -1.0 <= graph["spearman"] <= 1.0 and graph["regret"] >= 1.0


@pytest.mark.slow  # trains on 2 local ranks: about 2 minutes on the loaded 2-core host
def test_measured_search_over_families_trains_the_models_best_first(tmp_path):
    from plexus_tune.measure.store import read_records
    from plexus_tune.search.joint import measured_joint_search, search_ranking
    from plexus_tune.measure.campaign import load_stats, workload_of

    graph = "rmat:nodes=512,edges=2048,features=8,classes=2,seed=1"
    workload = workload_of(load_stats(graph), 2, 8)
    ranking = search_ranking(workload, "cpu-gloo-2core-fitted", [2], algorithms=("cagnet-1d", "supergcn"))
    log = tmp_path / "runs.jsonl"
    rows = measured_joint_search(ranking, graph, log=log, count=2, epochs=2, warmup=1, layers=2, hidden=8)
    expected = [r for r in ranking.records if r["feasible"]][:2]
    assert [(r["algorithm"], r["config"]) for r in rows] == [(r["algorithm"], r["config"]) for r in expected]
    records, _ = read_records(log, schema="run")
    assert sorted(r["algorithm"] for r in records) == sorted(r["algorithm"] for r in expected)
    for row in rows:
        mine = [r for r in records if r["algorithm"] == row["algorithm"]
                and (r.get("options") or {}).get("aggregation") == row.get("aggregation")]
        assert row["trials_ok"] == 1 and row["epoch_ms"] == pytest.approx(mine[0]["epoch_ms"])
    # a second call reuses the logged runs: nothing new is trained
    again = measured_joint_search(ranking, graph, log=log, count=2, epochs=2, warmup=1, layers=2, hidden=8)
    assert len(read_records(log, schema="run")[0]) == len(records)
    assert [r["epoch_ms"] for r in again] == [r["epoch_ms"] for r in rows]


def test_a_campaign_trains_only_what_the_trainers_run():
    from plexus_tune.errors import UserError
    from plexus_tune.measure.families import trainer_options

    assert trainer_options("cagnet-2d", {"schedule": "bundled"}) == {}
    assert trainer_options("supergcn", {"aggregation": "post"}) == {"aggregation": "post"}
    with pytest.raises(UserError, match="trains its schedule 'bundled', not 'paper'"):
        trainer_options("cagnet-3d", {"schedule": "paper"})


def test_scored_rows_are_the_planner_s_predictions_of_the_same_runs(capsys):
    """A logged configuration's row is predicted as ``plexus-tune predict --graph`` ranks the same
    configuration (the one prediction of a run, the graph read by the families whose model reads it)."""
    from plexus_tune.cli import main
    from plexus_tune.measure.campaign import load_graph_source, load_stats, workload_of
    from plexus_tune.report.families import predict_rows

    graph = "rmat:nodes=512,edges=4096,features=8,classes=4,seed=0"
    rows = [{"family": "supergcn", "grid": (4, 1, 1), "options": {"aggregation": mode}, "comm_precision": precision,
             "epoch_ms": 1.0, "label": mode} for mode in ("pre", "post", "hybrid") for precision in ("fp32", "bf16")]
    rows += [{"family": "cagnet-1d", "grid": (4, 1, 1), "options": {}, "comm_precision": "fp32", "epoch_ms": 1.0,
              "label": "1d"},
             {"family": "cagnet-1.5d", "grid": (2, 2, 1), "options": {}, "comm_precision": "bf16", "epoch_ms": 1.0,
              "label": "1.5d"}]
    predicted = predict_rows(rows, workload_of(load_stats(graph), 3, 16), "perlmutter", load_graph_source(graph))
    planner = {}
    for family in ("supergcn", "cagnet-1d", "cagnet-1.5d"):
        for precision in ("fp32", "bf16"):
            assert main(["predict", "--graph", graph, "--gpus", "4", "--machine", "perlmutter", "--algorithm", family,
                         "--layers", "3", "--hidden", "16", "--comm-precision", precision, "--format", "json",
                         "--top", "0", "--no-cache"]) == 0
            for r in json.loads(capsys.readouterr().out)["ranking"]:
                planner[(r["algorithm"], r["grid"], r.get("aggregation") or "", r["comm_precision"])] = r["total_ms"]
    for row in predicted:
        key = (row["family"], "x".join(map(str, row["grid"])), row["options"].get("aggregation", ""), row["comm_precision"])
        assert row["total_ms"] == pytest.approx(planner[key], rel=1e-12), key
        assert sum(row["predicted"][k] for k in TOTAL_PARTS) == pytest.approx(row["total_ms"], rel=1e-12)
    # the family's option reaches its model: the three aggregation modes are three predictions
    assert len({row["total_ms"] for row in predicted[:6:2]}) == 3
