"""Measured search: warm start with the model's top-k, every configuration trained at most once."""

import json

from plexus_tune.cli import main
from plexus_tune.search import ModelEvaluator, SearchSpace, graph_workload, open_storage, open_study

GRAPH = "rmat:nodes=128,edges=512,features=8,classes=4,seed=2"
ARGS = ["search", "--graph", GRAPH, "--machine", "cpu-gloo-2core", "--gpus", "2", "--measured", "--epochs", "2",
        "--warmup", "1", "--hidden", "4", "--layers", "2", "--warm-start", "2", "--study", "m"]


def test_measured_search_never_trains_a_config_twice(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(ARGS + ["--trials", "5"]) == 0
    out = capsys.readouterr().out
    assert "observed ms" in out
    log = tmp_path / "measurements" / "runs.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    grids = [r["grid"] for r in records]
    assert len(grids) == len(set(grids)) >= 2
    from plexus_tune.model.machine import load_machine

    _, workload = graph_workload(GRAPH, layers=2, hidden=4)
    top = ModelEvaluator(workload, load_machine("cpu-gloo-2core")).top_k(SearchSpace((2,)), 2)
    assert grids[:2] == [c.label for c in top]  # the enqueued warm start ran first
    study = open_study("m", open_storage(f"sqlite:///{tmp_path / 'measurements' / 'studies.db'}"), objective="epoch")
    obs = {t.user_attrs["config"]: t.user_attrs.get("observed_ms") for t in study.trials}
    for r in records:
        assert obs[r["grid"]] == r["epoch_ms"]
        assert r["predicted"]["total_ms"] > 0
    # more trials, then a fresh study on the same log: logged runs are reused, not retrained
    assert main(ARGS + ["--trials", "8"]) == 0
    assert main(ARGS[:-1] + ["m2", "--trials", "4"]) == 0
    capsys.readouterr()
    grids = [json.loads(line)["grid"] for line in log.read_text().splitlines()]
    assert len(grids) == len(set(grids)) <= 3
