"""A logged prediction is what ``plexus-tune predict --graph`` says for the same settings.

``measure`` on a graph logs each run's prediction read from the run's graph (the SUMMA pieces
of cagnet-*, supergcn's partition), as ``predict --graph`` ranks the same configuration. The figures come from the two commands; the
prediction without the graph differs, so a campaign that dropped the graph would fail here.
"""

import json

import pytest

import plexus_tune.measure.campaign as campaign_mod
from plexus_tune.cli import main
from plexus_tune.measure.campaign import load_stats, workload_of
from plexus_tune.measure.identity import RunSpec
from plexus_tune.measure.store import read_records
from plexus_tune.measure.training import config_fields
from plexus_tune.model.prediction import PREDICTED_TIME_KEYS, TOTAL_PARTS
from plexus_tune.model.workload import model_widths

GRAPH = "rmat:nodes=256,edges=2048,features=8,classes=3,seed=0"
SIZES = ["--layers", "2", "--hidden", "8"]
MACHINE = "perlmutter"
#: (family, --grids or None for the family's one configuration of 2 ranks)
RUNS = [("cagnet-2d", "1x2x1"), ("cagnet-1d", None), ("supergcn", None)]


def _recorded_trainer(config, raise_on_failure=True, launcher=None, spec=None):
    """A run's record as the trainer logs its fields (no ranks started: the prediction reads the spec and graph)."""
    stats = load_stats(GRAPH)
    return {"kind": "train", "status": "ok", **config_fields(config), "epoch_ms": 1.0, "graph_nodes": stats.nodes,
            "nnz": stats.nnz, "widths": model_widths(stats.features, stats.classes, 2, 8)}


def _measure(tmp_path, run_cli, algorithm, grids) -> list[dict]:
    log = tmp_path / f"{algorithm}.jsonl"
    argv = ["measure", "--graph", GRAPH, "--gpus", "2", "--trials", "1", "--epochs", "2", "--warmup", "1", *SIZES,
            "--machine", MACHINE, "--log", str(log), "--algorithm", algorithm] + (["--grids", grids] if grids else [])
    code, _, err = run_cli(argv)
    assert code == 0, err
    records, problems = read_records(log)
    assert problems == [] and records
    return records


def _predicted(run_cli, algorithm) -> dict:
    """``predict --graph --format json``'s figures per (grid, aggregation)."""
    code, out, err = run_cli(["predict", "--graph", GRAPH, "--gpus", "2", "--machine", MACHINE, "--algorithm", algorithm,
                              *SIZES, "--format", "json", "--top", "0", "--no-cache"])
    assert code == 0, err
    data = json.loads(out)
    rows = data["ranking"] if isinstance(data, dict) else data
    return {(r["grid"], r.get("aggregation") or None): r for r in rows}


def _check(record, planner):
    logged = record["predicted"]
    want = planner[(record["grid"], record.get("options", {}).get("aggregation") or None)]
    for key in PREDICTED_TIME_KEYS:
        if key in want:
            assert logged[key] == pytest.approx(want[key], rel=1e-12, abs=1e-15), key
    assert "total_ms" in want and "spmm_ms" in want
    assert sum(logged[k] for k in TOTAL_PARTS) == pytest.approx(logged["total_ms"], rel=1e-12)
    # without the graph the model prices another run: the check above could fail
    blind = RunSpec.from_record(record).predict(MACHINE, workload=workload_of(load_stats(GRAPH), 2, 8))
    assert blind["total_ms"] != pytest.approx(logged["total_ms"], rel=1e-6)


@pytest.mark.parametrize("algorithm,grids", RUNS)
def test_measure_logs_the_prediction_predict_gives_on_the_same_graph(tmp_path, run_cli, monkeypatch, algorithm, grids):
    monkeypatch.setattr(campaign_mod, "run_training", _recorded_trainer)
    records = _measure(tmp_path, run_cli, algorithm, grids)
    planner = _predicted(run_cli, algorithm)
    for record in records:
        assert record["algorithm"] == algorithm
        _check(record, planner)


@pytest.mark.parametrize("algorithm,grid", [("cagnet-2d", "1x2x1"), ("supergcn", "2x1x1")])
def test_run_ranks_and_logs_the_prediction_predict_gives_on_the_same_graph(tmp_path, run_cli, monkeypatch, algorithm,
                                                                             grid):
    """``run``: the grid ranking it prints and the prediction it logs are predict's on the graph."""
    import plexus_tune.cli.run as run_mod

    monkeypatch.setattr(run_mod, "run_training", _recorded_trainer)
    log = tmp_path / "runs.jsonl"
    code, out, err = run_cli(["run", "--graph", GRAPH, "--gpus", "2", "--grid", grid, "--epochs", "2", "--warmup", "1",
                              *SIZES, "--machine", MACHINE, "--log", str(log), "--algorithm", algorithm])
    assert code == 0, err
    records, _ = read_records(log)
    assert len(records) == 1 and records[0]["grid"] == grid
    planner = _predicted(run_cli, algorithm)
    _check(records[0], planner)
    row = next(line for line in out.splitlines() if f" {grid} " in line and "│" in line)
    assert f" {planner[(grid, records[0].get('options', {}).get('aggregation') or None)]['total_ms']:.2f} " in row


@pytest.mark.slow
@pytest.mark.parametrize("algorithm,grids", [("cagnet-2d", "1x2x1"), ("supergcn", None)])
def test_trained_runs_log_the_prediction_predict_gives(tmp_path, run_cli, algorithm, grids):
    """The same with the bundled trainers on 2 local ranks (the record as the trainer writes it)."""
    records = _measure(tmp_path, run_cli, algorithm, grids)
    assert all(r["status"] == "ok" for r in records)
    planner = _predicted(run_cli, algorithm)
    for record in records:
        _check(record, planner)
