"""Measured search: warm start with the model's top-k, every configuration trained at most once."""

import json

from plexus_tune.cli import main
from plexus_tune.search import ModelEvaluator, SearchSpace, graph_workload, open_storage, open_study

GRAPH = "rmat:nodes=128,edges=512,features=8,classes=4,seed=2"
ARGS = ["search", "--graph", GRAPH, "--machine", "cpu-gloo-2core", "--gpus", "2", "--measured", "--epochs", "2",
        "--warmup", "1", "--hidden", "4", "--layers", "2", "--warm-start", "2", "--study", "m"]


def test_measured_search_never_trains_a_config_twice(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PLEXUS_TUNE_DATA", str(tmp_path / "measurements"))  # the default log and studies
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
    obs = {t.user_attrs["config"]: t.user_attrs.get("epoch_ms") for t in study.trials}
    for r in records:
        assert obs[r["grid"]] == r["epoch_ms"]
        assert r["predicted"]["total_ms"] > 0
    # more trials, then a fresh study on the same log: logged runs are reused, not retrained
    assert main(ARGS + ["--trials", "8"]) == 0
    assert main(ARGS[:-1] + ["m2", "--trials", "4"]) == 0
    capsys.readouterr()
    grids = [json.loads(line)["grid"] for line in log.read_text().splitlines()]
    assert len(grids) == len(set(grids)) <= 3


def test_known_runs_reuse_only_the_identity_the_search_would_train(tmp_path):
    """Logged runs of another overlap, backend or permutation are not this search's runs; trials pool by median."""
    from plexus_tune.measure.campaign import campaign_config
    from plexus_tune.measure.store import append_records
    from plexus_tune.model.machine import load_machine
    from plexus_tune.search import Config, known_runs
    from plexus_tune.measure.training import config_fields

    _, workload = graph_workload(GRAPH, layers=2, hidden=4)
    model = ModelEvaluator(workload, load_machine("cpu-gloo-2core"))
    stats = {"graph": "g", "graph_nodes": 128, "nnz": 1000, "features": 8, "classes": 4, "widths": [8, 4, 4]}

    def record(grid, epoch_ms, trial=0, **options):
        config = campaign_config(GRAPH, grid, layers=2, hidden=4, epochs=2, warmup=1, options=options)
        rec = {"kind": "train", "status": "ok", **config_fields(config), **stats, "trial": trial, "timestamp": f"t{trial}"}
        return {**rec, "epoch_ms": epoch_ms} if epoch_ms else {**rec, "status": "oom", "reason": "out of memory"}

    log = tmp_path / "runs.jsonl"
    append_records(log, [
        record((2, 1, 1), 10.0, 0), record((2, 1, 1), 30.0, 1), record((2, 1, 1), 11.0, 2),  # median 11
        record((2, 1, 1), 1.0, 0, permute="none"),  # another permutation
        record((1, 2, 1), 2.0, 0, backend="nccl"),  # another backend
        record((1, 1, 2), 3.0, 0, block_rows=16, overlap=True),  # overlapped: not what the search trains
        record((1, 1, 2), 7.0, 0, block_rows=16),
        record((1, 2, 1), None, 0),  # only failed
    ])
    known = known_runs(log, GRAPH, model, layers=2, hidden=4, epochs=2, warmup=1)
    assert set(known) == {Config(2, 1, 1), Config(1, 1, 2, 16), Config(1, 2, 1)}
    assert known[Config(2, 1, 1)].epoch_ms == 11.0 and known[Config(2, 1, 1)].run_id == "t2"
    assert known[Config(1, 1, 2, 16)].epoch_ms == 7.0
    assert known[Config(1, 2, 1)].epoch_ms is None and known[Config(1, 2, 1)].failure == "oom: out of memory"
    # a search on the nccl backend sees the nccl run (and not the gloo ones)
    nccl = known_runs(log, GRAPH, model, layers=2, hidden=4, epochs=2, warmup=1, train_options={"backend": "nccl"})
    assert set(nccl) == {Config(1, 2, 1)} and nccl[Config(1, 2, 1)].epoch_ms == 2.0
    # different epochs: nothing to reuse
    assert known_runs(log, GRAPH, model, layers=2, hidden=4, epochs=3, warmup=1) == {}


def test_measured_search_at_a_precision_trains_at_it_and_auto_picks_a_measured_one(tmp_path, capsys, monkeypatch):
    """--comm-precision bf16 trains every configuration at bf16 (bf16 runs in the log, the
    study named for it); auto runs one measured study per allowed precision and names the
    precision of the lowest observed epoch with its accuracy evidence. fp32 runs already in the
    log are not taken for bf16 ones."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PLEXUS_TUNE_DATA", str(tmp_path / "measurements"))
    log = tmp_path / "measurements" / "runs.jsonl"
    assert main(ARGS + ["--trials", "2", "--comm-precision", "bf16"]) == 0
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 2 and {r["comm_precision"] for r in records} == {"bf16"}
    assert all(r["status"] == "ok" and r["comm_bytes"] for r in records)
    study = open_study("m-comm-bf16", open_storage(f"sqlite:///{tmp_path / 'measurements' / 'studies.db'}"), objective="epoch")
    assert len(study.trials) == 2 and {t.user_attrs.get("epoch_ms") for t in study.trials} == {r["epoch_ms"] for r in records}
    capsys.readouterr()
    assert main(ARGS + ["--trials", "2", "--comm-precision", "auto", "--allow-precisions", "fp32,bf16"]) == 0
    out = capsys.readouterr().out
    records = [json.loads(line) for line in log.read_text().splitlines()]
    by_precision = {}
    for r in records:
        by_precision.setdefault(r["comm_precision"], []).append(r["epoch_ms"])
    assert sorted(by_precision) == ["bf16", "fp32"] and len(by_precision["bf16"]) == 2  # bf16 reused, fp32 trained
    pick = min(by_precision, key=lambda p: min(by_precision[p]))
    assert f"Picked precision: {pick}" in out and f"accuracy evidence for {pick}" in out
