"""Typed records: v1 logs load as v2, one run identity, one runs table, the shipped logs' figures."""

import json
import re
from dataclasses import fields
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from plexus_tune.errors import UserError
from plexus_tune.fit.collectives import fit_collectives
from plexus_tune.fit.tables import load_table
from plexus_tune.report.validation import leave_one_group_out
from plexus_tune.measure import records as R
from plexus_tune.measure.identity import IDENTITY_NAMES, run_identity, run_setting
from plexus_tune.measure.table import runs_table
from plexus_tune.measure.campaign import campaign_config, config_identity
from plexus_tune.measure.store import append_records, read_records, read_runs
from plexus_tune.measure.training import base_record

ROOT = Path(__file__).resolve().parent.parent
LOGS = {
    "cpu-gloo-2026-11-23": "measurements/cpu-gloo-2026-11-23/profiles/cpu-gloo-2core-fitted-2026-11-23.json",
    "cpu-gloo": "models/cpu-gloo-2core-fitted.json",
}
SPEC = "rmat:nodes=256,edges=1024,features=8,classes=3,seed=0"


def _v1_run(**over):
    rec = {"schema": "plexus-tune/run-v1", "kind": "train", "timestamp": "2026-11-23T12:00:00+00:00", "status": "ok",
           "machine": "prof", "backend": "gloo", "graph_source": "synthetic:g", "grid": "2x1x1", "gx": 2, "gy": 1, "gz": 1,
           "gpus": 2, "layers": 3, "hidden": 16, "epochs": 10, "warmup": 2,
           "options": {"permute": "double", "block_rows": None, "overlap": False, "dtype": "float32"},
           "environment": {"host": "box"}, "graph": "g", "nodes": 100, "nnz": 900, "features": 8, "classes": 3,
           "widths": [8, 16, 16, 3], "padded_nodes": 100, "epoch_ms": 10.0, "spmm_ms": 4.0,
           "predicted": {"total_ms": 9.0, "spmm_ms": 3.0, "machine": "prof", "feasible": True}}
    rec.update(over)
    return rec


# --------------------------------------------------------------------------- versions


def test_v1_records_are_upgraded_with_their_fields_renamed_in_place():
    v1 = _v1_run()
    v2 = R.upgrade(v1)
    assert v2["schema"] == "plexus-tune/run-v2" and v2["graph_nodes"] == 100 and v2["padded_graph_nodes"] == 100
    assert "nodes" not in v2 and "padded_nodes" not in v2
    keys = list(v2)
    assert keys.index("graph_nodes") == list(v1).index("nodes")  # renamed where it stood
    assert (v2["launcher"], v2["cluster"], v2["rank_nodes"], v2["hosts"], v2["comm_precision"]) == ("local", None, None, None, "fp32")
    # v1 measure logged the prediction profile as the machine: the record now names its host
    assert v2["machine"] == "box" and v2["predicted"]["machine"] == "prof"
    # a train --machine record (no prediction) keeps the machine it names
    assert R.upgrade(_v1_run(predicted=None, machine="rig"))["machine"] == "rig"
    assert v1["nodes"] == 100 and v1["schema"].endswith("v1")  # the input is not changed
    coll = R.upgrade({"schema": "plexus-tune/collective-v1", "op": "all_reduce", "group_size": 2, "nodes": 2})
    assert coll["nodes_spanned"] == 2 and "nodes" not in coll and coll["schema"] == R.COLLECTIVE_SCHEMA
    for kind in ("spmm", "gemm"):
        rec = R.upgrade({"schema": f"plexus-tune/{kind}-v1", "graph": "g", "nodes": 7, "time_ms": 1.0})
        assert rec["graph_nodes"] == 7 and "nodes" not in rec and "launcher" not in rec
    assert R.upgrade(v2) == v2  # current records pass unchanged
    assert R.upgrade({"nodes": 5}, kind="run")["graph_nodes"] == 5  # no schema: v1 of the type asked for
    with pytest.raises(UserError, match="newer than this plexus-tune understands"):
        R.upgrade({"schema": "plexus-tune/run-v3"})


def test_typed_round_trip_and_extra_fields():
    rec = R.RunRecord.from_dict(_v1_run(custom={"a": 1}))
    assert rec.graph_nodes == 100 and rec.launcher == "local" and rec.extra == {"custom": {"a": 1}}
    out = rec.to_dict()
    assert out["schema"] == R.RUN_SCHEMA and out["custom"] == {"a": 1}
    assert out == {k: v for k, v in R.upgrade(_v1_run(custom={"a": 1})).items() if v is not None}
    with pytest.raises(TypeError):
        R.RunRecord(nodes=3)  # the v1 name is not a field
    assert R.CollectiveRecord.from_dict({"schema": "plexus-tune/collective-v1", "nodes": 3}).nodes_spanned == 3


def test_writers_cannot_log_a_v1_name_under_a_v2_schema(tmp_path):
    log = tmp_path / "runs.jsonl"
    with pytest.raises(UserError, match="'nodes' 'graph_nodes' since v2"):
        append_records(log, [{"nodes": 5, "epoch_ms": 1.0}])
    with pytest.raises(UserError, match="'nodes_spanned'"):
        append_records(log, [{"op": "all_reduce", "nodes": 1}], schema=R.COLLECTIVE_SCHEMA)
    assert not log.exists()
    append_records(log, [_v1_run()])  # an old record keeps its old schema and loads as v2
    (rec,), _ = read_records(log)
    assert rec["schema"] == "plexus-tune/run-v1"
    assert runs_table([rec])["graph_nodes"].tolist() == [100]


def test_every_schema_field_is_documented():
    doc = (ROOT / "docs" / "records.md").read_text()
    for cls in (R.RunRecord, R.RunOptions, R.SpmmRecord, R.GemmRecord, R.CollectiveRecord, R.QuantRecord, R.BandwidthRecord):
        for f in fields(cls):
            if f.name != "extra":
                assert re.search(rf"^\| `{f.name}` \|", doc, re.M), f"{cls.__name__}.{f.name} is not in docs/records.md"
    for name in IDENTITY_NAMES:
        assert f"`{name}`" in doc


# --------------------------------------------------------------------------- identity


def test_identity_separates_everything_that_changes_the_time():
    base = R.upgrade(_v1_run())
    ident = run_identity(base)
    changes = {
        "permutation": {"options": {**base["options"], "permute": "none"}},
        "overlap": {"options": {**base["options"], "block_rows": 64, "overlap": True}},
        "block rows": {"options": {**base["options"], "block_rows": 64}},
        "dtype": {"options": {**base["options"], "dtype": "float64"}},
        "threads": {"options": {**base["options"], "threads_per_rank": 2}},
        "comm precision": {"comm_precision": "bf16"},
        "cluster": {"cluster": {"kind": "emulated", "nodes": 2, "ranks_per_node": 1, "inter_gbps": 0.5}},
        "launcher": {"launcher": "torchrun"},
        "backend": {"backend": "nccl"},
        "machine": {"machine": "other-box"},
        "grid": {"gx": 1, "gy": 2, "grid": "1x2x1"},
        "hidden": {"hidden": 32},
        "layers": {"layers": 2},
        "epochs": {"epochs": 20},
        "graph": {"graph_source": "synthetic:h"},
    }
    seen = {ident}
    for what, change in changes.items():
        other = run_identity({**base, **change})
        assert other != ident, what
        seen.add(other)
    assert len(seen) == len(changes) + 1
    # what does not change the work: trial, time of day, seed, learning rate, provenance, hosts
    same = {**base, "trial": 4, "timestamp": "2030-01-01", "options": {**base["options"], "seed": 9, "lr": 0.5},
            "environment": {"host": "x"}, "hosts": ["a", "b"], "rank_nodes": [0, 1]}
    assert run_identity(same) == ident
    # the v1 record and its upgrade are one identity; missing new fields take their defaults
    assert run_identity(_v1_run()) == ident
    assert run_identity({**base, "comm_precision": "fp32", "launcher": "local", "cluster": None}) == ident
    # a cluster is the same cluster whatever the order of its keys
    a = {"kind": "emulated", "nodes": 2, "ranks_per_node": 1}
    b = dict(reversed(list(a.items())))
    assert run_identity({**base, "cluster": a}) == run_identity({**base, "cluster": b})
    # block_rows None and 0 are one thing; the grid string stands in for missing gx, gy, gz
    assert run_identity({**base, "options": {**base["options"], "block_rows": 0}}) == ident
    assert run_identity({k: v for k, v in base.items() if k not in ("gx", "gy", "gz")}) == ident
    assert run_setting(run_identity({**base, "gx": 1, "gy": 2})) == run_setting(ident)


def test_the_identity_a_campaign_probes_is_the_identity_its_record_gets():
    config = campaign_config(SPEC, (2, 1, 1), layers=2, hidden=8, epochs=3, warmup=1,
                             options={"permute": "single", "block_rows": 32, "backend": "gloo"})
    ident = config_identity(config)
    assert ident == run_identity(base_record(config))
    assert (ident.permute, ident.block_rows, ident.layers, ident.hidden, ident.graph) == ("single", 32, 2, 8, f"synthetic:{SPEC}")


# --------------------------------------------------------------------------- runs table


def test_runs_table_never_pools_different_permutations_and_counts_failures():
    double = [_v1_run(epoch_ms=t, spmm_ms=t / 2, trial=i) for i, t in enumerate((10.0, 14.0, 12.0))]
    none = [_v1_run(epoch_ms=t, trial=i, options={"permute": "none"}) for i, t in enumerate((30.0, 31.0))]
    failed = _v1_run(status="oom", reason="out of memory", epoch_ms=None, trial=2, options={"permute": "none"})
    only_failed = _v1_run(status="timeout", reason="slow", epoch_ms=None, gx=1, gy=2, grid="1x2x1")
    table = runs_table(double + none + [failed, only_failed])
    assert len(table) == 2 and table.attrs["failed_trials"] == 2
    d = table[table["permute"] == "double"].iloc[0]
    n = table[table["permute"] == "none"].iloc[0]
    assert (d["trials"], d["failed"], n["trials"], n["failed"]) == (3, 0, 2, 1)
    assert d["obs_epoch_ms"] == 12.0 and d["obs_spmm_ms"] == 6.0 and n["obs_epoch_ms"] == 30.5
    assert d["obs_epoch_ms_std"] == pytest.approx(np.sqrt(8 / 3))  # population std of 10, 12, 14
    assert (d["obs_epoch_ms_min"], d["obs_epoch_ms_max"]) == (10.0, 14.0)
    assert n["last_failure"] == "oom: out of memory" and d["last_failure"] == ""
    assert d["pred_total_ms"] == 9.0 and d["pred_spmm_ms"] == 3.0 and np.isnan(d["pred_gemm_ms"])
    assert d["grid"] == "2x1x1" and d["gpus"] == 2 and d["widths"] == (8, 16, 16, 3) and d["bytes_per_element"] == 4
    assert not any(c.startswith(("observed_", "predicted")) for c in table.columns)
    full = runs_table(double + none + [failed, only_failed], include_failed=True)
    gone = full[full["trials"] == 0].iloc[0]
    assert len(full) == 3 and gone["grid"] == "1x2x1" and gone["failed"] == 1 and np.isnan(gone["obs_epoch_ms"])
    # widths come from the one home of widths when a record lacks them
    assert runs_table([{k: v for k, v in double[0].items() if k != "widths"}])["widths"].iloc[0] == (8, 16, 16, 3)


@pytest.mark.parametrize("key, value", [("epoch_ms", float("nan")), ("spmm_ms", -1.0), ("epoch_ms", 0.0)])
def test_runs_table_names_a_bad_time(key, value):
    bad = _v1_run(**{key: value})
    with pytest.raises(UserError, match=re.escape(f"run 2x1x1 of synthetic:g at 2026-11-23T12:00:00+00:00: {key} = {value!r}")):
        runs_table([bad])


@pytest.mark.parametrize("name", sorted(LOGS))
def test_shipped_v1_run_logs_give_the_old_medians(name):
    log = ROOT / "measurements" / name / "runs.jsonl"
    raw = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert all(r["schema"] == "plexus-tune/run-v1" for r in raw)
    table = runs_table(read_runs(log))
    # brute force: group the raw lines by (graph source, grid) and take medians with numpy
    groups: dict = {}
    for r in raw:
        groups.setdefault((r["graph_source"], r["grid"]), []).append(r)
    assert len(table) == len(groups)
    for _, row in table.iterrows():
        trials = groups[(row["graph"], row["grid"])]
        assert row["trials"] == len(trials) and row["failed"] == 0
        for key in ("epoch_ms", "spmm_ms", "comm_ms", "other_ms"):
            assert row[f"obs_{key}"] == pytest.approx(float(np.median([t[key] for t in trials])), rel=1e-12)
        assert row["pred_total_ms"] == pytest.approx(float(np.median([t["predicted"]["total_ms"] for t in trials])), rel=1e-12)
        assert row["graph_nodes"] == trials[0]["nodes"] and row["machine"] == trials[0]["environment"]["host"]


@pytest.mark.parametrize("name", sorted(LOGS))
def test_shipped_logs_validate_against_brute_force_scores(name):
    """validate as is, scored by hand: the groups and their observed best come from the raw log
    lines (medians over trials with numpy), each run's prediction is the profile's
    (predict_runs), and Spearman (scipy), regret and MAPE are recomputed from those pairs."""
    from scipy.stats import spearmanr

    from plexus_tune.measure.table import predict_runs

    raw = [json.loads(line) for line in (ROOT / "measurements" / name / "runs.jsonl").read_text().splitlines() if line.strip()]
    observed: dict = {}
    for r in raw:
        observed.setdefault((r["graph_source"], r["gx"] * r["gy"] * r["gz"]), {}).setdefault(r["grid"], []).append(r["epoch_ms"])
    table = runs_table(read_runs(ROOT / "measurements" / name / "runs.jsonl"))
    predicted = predict_runs(table, str(ROOT / LOGS[name]))
    got = leave_one_group_out(table, str(ROOT / LOGS[name]), refit=False)
    assert len(got["groups"]) == len(observed)
    for g in got["groups"]:
        obs = {grid: float(np.median(times)) for grid, times in observed[(g["graph"], g["gpus"])].items()}
        rows = predicted[(predicted["graph"] == g["graph"]) & (predicted["gpus"] == g["gpus"])]
        pred = dict(zip(rows["grid"], rows["pred_total_ms"]))
        grids = sorted(obs)
        p, o = np.array([pred[k] for k in grids]), np.array([obs[k] for k in grids])
        assert g["observed_best"] == min(obs, key=obs.get) and g["predicted_best"] == min(pred, key=pred.get)
        assert g["regret"] == pytest.approx(obs[g["predicted_best"]] / min(obs.values()), rel=1e-12)
        assert g["mape"] == pytest.approx(100 * np.mean(np.abs(p - o) / o), rel=1e-9)
        if len(grids) > 2:
            assert g["spearman"] == pytest.approx(spearmanr(p, o)[0], rel=1e-9)


def test_shipped_v1_collectives_fit_as_before():
    path = ROOT / "measurements" / "cpu-gloo-2026-11-23" / "collectives.jsonl"
    raw = pd.DataFrame([json.loads(line) for line in path.read_text().splitlines() if line.strip()])
    table = load_table(path, schema="collective")
    assert (table["nodes_spanned"].to_numpy() == raw["nodes"].to_numpy()).all()
    assert (table["nodes"].to_numpy() == raw["nodes"].to_numpy()).all()  # the fit's API column
    old, new = fit_collectives(raw, n_splits=0), fit_collectives(table, n_splits=0)
    assert new.tiers == old.tiers
    assert R.table_row({"schema": R.COLLECTIVE_SCHEMA, "op": "all_gather", "nodes_spanned": 2})["nodes"] == 2


def test_validation_keeps_settings_apart():
    """Two settings of one graph and G are two grid choice problems, named by what differs."""
    from tests.test_validation import PROFILE, _runs

    runs = [r for r in _runs() if r.get("status") == "ok"]
    unpermuted = [{**r, "options": {"permute": "none"}, "epoch_ms": r["epoch_ms"] * 3.0} for r in runs]
    table = runs_table(runs + unpermuted)
    assert len(table) == 2 * len(runs_table(runs))
    result = leave_one_group_out(table, PROFILE, refit=False)
    assert result["mean"]["groups"] == 8
    assert {g["setting"] for g in result["groups"]} == {"permute=double", "permute=none"}
    # scored as is, a problem depends on its own rows only: the double-permuted problems
    # score as they do without the unpermuted runs beside them, grid counts included
    alone = {(g["graph"], g["gpus"]): g for g in leave_one_group_out(runs_table(runs), PROFILE, refit=False)["groups"]}
    for g in result["groups"]:
        ref = alone[(g["graph"], g["gpus"])]
        assert g["grids"] == ref["grids"] == (6 if g["gpus"] == 4 else 10)
        if g["setting"] == "permute=double":
            assert (g["spearman"], g["regret"], g["mape"]) == pytest.approx((ref["spearman"], ref["regret"], ref["mape"]))
        else:  # 3x slower: the same ranking, and MAPE of predicted p against 3 t
            assert g["spearman"] == pytest.approx(ref["spearman"]) and g["mape"] != pytest.approx(ref["mape"])


def test_old_study_trial_attributes_are_read_with_the_current_names():
    """Studies written before the predicted total and the observed epoch had one name each."""
    from plexus_tune.measure.records import upgrade_trial_attrs

    assert upgrade_trial_attrs({"predicted_ms": 1.5, "observed_ms": 2.5, "grid": "2x2x2"}) == {
        "total_ms": 1.5, "epoch_ms": 2.5, "grid": "2x2x2"}
    # a trial that has both keeps the current name's value
    assert upgrade_trial_attrs({"predicted_ms": 1.0, "total_ms": 2.0}) == {"total_ms": 2.0}
