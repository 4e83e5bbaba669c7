import pytest

import plexus_tune.measure.campaign as campaign_mod
from plexus_tune.cli import main
from plexus_tune.errors import UserError
from plexus_tune.measure.campaign import Campaign, choose_grids, load_stats, run_campaign
from plexus_tune.measure.store import read_records
from plexus_tune.measure.training import config_fields
from plexus_tune.model.prediction import predict_run

SPEC = "rmat:nodes=256,edges=1024,features=8,classes=3,seed=0"


def _fake_trainer(calls, fail_grids=()):
    def run_training(config, raise_on_failure=True, launcher=None, spec=None):
        calls.append((tuple(config.grid), config.synthetic))
        base = {"kind": "train", "status": "ok", **config_fields(config)}  # what the trainer's record starts with
        if config.grid in fail_grids:
            return {**base, "status": "oom", "reason": "rank 1 failed: MemoryError"}
        return {**base, "epoch_ms": 10.0 + config.grid[0]}

    return run_training


def test_campaign_logs_every_trial_keeps_failures_and_resumes(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(campaign_mod, "run_training", _fake_trainer(calls, fail_grids={(1, 2, 1)}))
    log = tmp_path / "runs.jsonl"
    grids = [(2, 1, 1), (1, 2, 1)]
    new = run_campaign(Campaign(SPEC, 2, grids, log=log, trials=2, epochs=3, warmup=1, hidden=8), machine="perlmutter")
    assert len(new) == 4 and len(calls) == 4
    records, problems = read_records(log)
    assert problems == [] and len(records) == 4
    assert sorted((r["grid"], r["trial"]) for r in records) == [("1x2x1", 0), ("1x2x1", 1), ("2x1x1", 0), ("2x1x1", 1)]
    failed = [r for r in records if r["status"] != "ok"]
    assert len(failed) == 2 and all(r["reason"].startswith("rank 1 failed") for r in failed)
    assert all(r["predicted"]["machine"] == "perlmutter" and r["predicted"]["total_ms"] > 0 for r in records)
    # resume: nothing new; retry_failed reruns only the failures; a third trial runs once per grid
    assert run_campaign(Campaign(SPEC, 2, grids, log=log, trials=2, epochs=3, warmup=1, hidden=8)) == []
    again = run_campaign(Campaign(SPEC, 2, grids, log=log, trials=2, epochs=3, warmup=1, hidden=8, retry_failed=True))
    assert [tuple(r["grid"].split("x")) for r in again] == [("1", "2", "1")] * 2
    more = run_campaign(Campaign(SPEC, 2, grids, log=log, trials=3, epochs=3, warmup=1, hidden=8))
    assert sorted(r["grid"] for r in more) == ["1x2x1", "2x1x1"] and all(r["trial"] == 2 for r in more)
    # a different model is a different measurement
    assert len(run_campaign(Campaign(SPEC, 2, grids[:1], log=log, trials=1, epochs=3, warmup=1, hidden=16))) == 1


def test_choose_grids():
    assert choose_grids(4, "all") == [(1, 1, 4), (1, 2, 2), (1, 4, 1), (2, 1, 2), (2, 2, 1), (4, 1, 1)]
    assert choose_grids(4, "2x2x1,1x1x4") == [(2, 2, 1), (1, 1, 4)]
    with pytest.raises(UserError, match="has 8 ranks"):
        choose_grids(4, "2x2x2")
    with pytest.raises(UserError, match="need a machine profile") as err:
        choose_grids(4, "top:2")
    assert err.value.parameter == "machine" and "--" not in str(err.value)  # the CLI names the flag
    from plexus_tune.model.costs import predict_grids, rank_order
    from plexus_tune.model.machine import load_machine
    from plexus_tune.measure.campaign import workload_of

    stats = load_stats(SPEC)
    assert stats.nodes == 256 and stats.features == 8 and stats.classes == 3
    w = workload_of(stats, 3, 16)
    top = choose_grids(8, "top:3", workload=w, machine=load_machine("perlmutter"))
    grids = choose_grids(8, "all")
    import numpy as np

    pred = predict_grids(w, load_machine("perlmutter"), np.array(grids))
    assert top == [grids[i] for i in rank_order(pred)[:3]]


def test_measure_cli_runs_the_real_trainer_in_one_process_set(tmp_path, capsys):
    log = tmp_path / "runs.jsonl"
    args = ["measure", "--graph", SPEC, "--gpus", "2", "--grids", "2x1x1,1x1x2", "--trials", "1", "--epochs", "3",
            "--warmup", "1", "--hidden", "8", "--machine", "perlmutter", "--batch", "2", "--log", str(log)]
    assert main(args) == 0
    records, _ = read_records(log)
    assert [r["grid"] for r in records] == ["2x1x1", "1x1x2"]
    for r in records:
        assert r["status"] == "ok" and r["epoch_ms"] > 0 and r["batched"] == 2
        assert r["predicted"]["total_ms"] > 0 and r["widths"] == [8, 8, 8, 3]
    out = capsys.readouterr().out
    assert "2x1x1" in out and "predicted ms" in out
    assert main(args) == 0  # resumed: nothing to run
    assert len(read_records(log)[0]) == 2
    assert main(["measure", "--graph", SPEC, "--gpus", "2", "--warmup", "5", "--epochs", "3", "--log", str(log)]) == 2
    assert "--warmup" in capsys.readouterr().err


@pytest.mark.parametrize(
    "spec, message",
    [
        ("rmat:nodes=x", "nodes must be a whole number"),
        ("rmat:edges=1024", "needs nodes=N"),
        ("ring:nodes=64", "unknown graph generator 'ring'"),
        ("no-such-file.npz", "neither an existing file nor a synthetic spec"),
    ],
)
def test_measure_and_train_reject_a_bad_graph_before_any_run(tmp_path, run_cli, spec, message):
    log = tmp_path / "runs.jsonl"
    code, out, err = run_cli(["measure", "--graph", spec, "--gpus", "2", "--log", str(log)])
    assert code == 2 and message in err and err.count("\n") == 1
    assert not log.exists()
    if ":" in spec:
        code, _, err = run_cli(["train", "--synthetic", spec, "--grid", "1x1x2", "--log", str(log)])
        assert code == 2 and message in err and "rank" not in err
        assert not log.exists()


def test_campaign_interleaves_trials_in_fresh_orders(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(campaign_mod, "run_training", _fake_trainer(calls))
    grids = [(4, 1, 1), (1, 4, 1), (1, 1, 4), (2, 2, 1), (2, 1, 2), (1, 2, 2)]
    new = run_campaign(Campaign(SPEC, 4, grids, log=tmp_path / "runs.jsonl", trials=3, epochs=3, warmup=1, hidden=8))
    trials = [r["trial"] for r in new]
    assert trials == sorted(trials)  # every grid's trial t before any grid's trial t + 1
    orders = [[c[0] for c in calls[t * 6 : (t + 1) * 6]] for t in range(3)]
    assert all(sorted(o) == sorted(grids) for o in orders)
    assert len({tuple(o) for o in orders}) > 1  # not one fixed order for every trial


def test_campaign_resumes_a_v1_log(tmp_path, monkeypatch):
    """Trials logged by the v1 writer (the profile's name as machine, nodes) count as done."""
    import json
    import platform

    from plexus_tune.measure.campaign import campaign_config

    calls = []
    monkeypatch.setattr(campaign_mod, "run_training", _fake_trainer(calls))
    log = tmp_path / "runs.jsonl"
    with open(log, "w") as fh:
        for trial in range(2):
            config = campaign_config(SPEC, (2, 1, 1), layers=3, hidden=8, epochs=3, warmup=1)
            v1 = {"schema": "plexus-tune/run-v1", "kind": "train", "status": "ok", **config_fields(config),
                  "machine": "perlmutter", "predicted": {"machine": "perlmutter", "total_ms": 1.0},
                  "environment": {"host": platform.node()}, "nodes": 256, "epoch_ms": 10.0, "trial": trial}
            for key in ("launcher", "cluster", "rank_nodes", "hosts", "comm_precision"):
                v1.pop(key)
            fh.write(json.dumps(v1) + "\n")
    new = run_campaign(Campaign(SPEC, 2, [(2, 1, 1), (1, 2, 1)], log=log, trials=3, epochs=3, warmup=1, hidden=8), machine="perlmutter")
    assert sorted((r["grid"], r["trial"]) for r in new) == [("1x2x1", 0), ("1x2x1", 1), ("1x2x1", 2), ("2x1x1", 2)]


def test_a_job_that_ended_early_logs_its_run_with_the_slurm_state_and_prediction(tmp_path):
    """measure outside an allocation: the run a dead job had in flight is logged failed, with the
    job's state, the campaign and the prediction at the run's settings."""
    import json

    from plexus_tune.launch.slurm import JobState
    from plexus_tune.measure.campaign import campaign_config, job_failure_record, log_campaign_run
    from plexus_tune.model.workload import Workload

    config = campaign_config("rmat:nodes=64,edges=256,features=4,classes=2", (2, 1, 1), layers=2, hidden=4, epochs=2,
                             warmup=1, options={"comm_precision": "bf16", "block_rows": 16})
    log = tmp_path / "runs.jsonl"
    w = Workload("g", 64, 384, (4, 4, 2))
    for state, status, why in ((JobState("17", None, "TIMEOUT", "TimeLimit", None), "timeout", "TIMEOUT (reason TimeLimit)"),
                               (JobState("18", 2, "FAILED", "NonZeroExitCode", 1), "failed", "exit code 1"),
                               (JobState("19", None, "CANCELLED", "", None, signal=15), "cancelled", "signal 15")):
        record = log_campaign_run(log, job_failure_record(config, state, launcher="slurm"), trial=1, gpus=2, trials=2,
                                  grids=[(2, 1, 1)], machine="perlmutter", workload=w)
        assert record["status"] == status and why in record["reason"] and record["slurm"]["state"] == state.state
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["slurm"]["job_id"] for r in logged] == ["17", "18_2", "19"] and all(r["trial"] == 1 for r in logged)
    want = predict_run(w, "perlmutter", (2, 1, 1), comm_precision="bf16", block_rows=16)["total_ms"]
    assert all(r["predicted"]["total_ms"] == want for r in logged)
    assert want != predict_run(w, "perlmutter", (2, 1, 1))["total_ms"]


def test_campaign_options_are_checked_before_any_run(tmp_path):
    from plexus_tune.errors import UserError

    with pytest.raises(UserError, match="0 <= warmup < epochs") as bad:
        Campaign(SPEC, 2, [(2, 1, 1)], log=tmp_path / "l.jsonl", epochs=2, warmup=2)
    assert bad.value.parameter == ("warmup", "epochs")
    with pytest.raises(UserError, match="redo or retry_failed"):
        Campaign(SPEC, 2, [(2, 1, 1)], redo=True, retry_failed=True)
    with pytest.raises(UserError, match="at least one grid"):
        Campaign(SPEC, 2, [])
    campaign = Campaign(SPEC, 2, [[2, 1, 1], (1, 2, 1)], log=tmp_path / "l.jsonl", trials=2)
    assert campaign.grids == ((2, 1, 1), (1, 2, 1)) and campaign.runs() == 4 and campaign.log == str(tmp_path / "l.jsonl")
    assert not (tmp_path / "l.jsonl").exists()


def test_log_run_numbers_trials_and_logs_the_prediction(tmp_path):
    """measure/campaign.log_run (run's single run): trial 0, then 1 for the same settings, each with
    predict's prediction at the run's settings."""
    import json

    from plexus_tune.launch.slurm import JobState
    from plexus_tune.measure.campaign import campaign_config, job_failure_record, log_run
    from plexus_tune.model.workload import Workload

    config = campaign_config("rmat:nodes=64,edges=256,features=4,classes=2", (2, 1, 1), layers=2, hidden=4, epochs=2,
                             warmup=1, options={"comm_precision": "bf16"})
    log, w = tmp_path / "runs.jsonl", Workload("g", 64, 384, (4, 4, 2))
    for _ in range(2):
        log_run(log, job_failure_record(config, JobState("7", None, "FAILED", "x", 1), launcher="local"),
                machine="perlmutter", workload=w)
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["trial"] for r in logged] == [0, 1]
    want = predict_run(w, "perlmutter", (2, 1, 1), comm_precision="bf16")["total_ms"]
    assert all(r["predicted"]["total_ms"] == want for r in logged)
