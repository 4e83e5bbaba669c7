import json
import re

import numpy as np
import pytest

from plexus_tune.cli import main
from plexus_tune.model.costs import predict_grids
from plexus_tune.errors import UserError
from plexus_tune.fit.epoch import EpochModel
from plexus_tune.fit.profile import apply_epoch_fit, scale_spmm_entry
from plexus_tune.model.grid import enumerate_grids
from plexus_tune.model.machine import Machine
from plexus_tune.model.spmm import predict_spmm_ms
from plexus_tune.measure.store import append_records
from plexus_tune.measure.table import predict_runs
from plexus_tune.report.metrics import regret, spearman
from plexus_tune.report.validation import leave_one_group_out
from plexus_tune.measure.table import runs_table
from plexus_tune.model.workload import Workload

PROFILE = {
    "name": "toy",
    "gpus_per_node": 8,
    "device_memory_gib": 16,
    "gemm_tflops": 0.05,
    "elementwise_gbps": 5.0,
    "spmm": {"kind": "roofline", "coefficients": {"const": 0.01, "flops": 2e-9, "sparse_bytes": 1e-9, "dense_in_bytes": 1e-8, "out_bytes": 2e-8, "rows": 1e-6}},
    "collectives": {"alpha_intra_us": 50.0, "beta_intra_gbps": 1.0, "alpha_inter_us": 50.0, "beta_inter_gbps": 1.0},
}
TRUE_SCALES = {"spmm_ms": 2.0, "gemm_ms": 1.5, "comm_ms": 0.5, "other_ms": 1.0}
OVERHEAD = 3.0


def _runs(graphs=((4096, 60000, (32, 64, 64, 8)), (8192, 40000, (16, 64, 64, 4))), gpus=(4, 8)):
    """Run records whose observed epoch is an exact rescaling of the toy profile's prediction."""
    machine = Machine.from_dict(PROFILE)
    records = []
    for gi, (n, nnz, widths) in enumerate(graphs):
        w = Workload(name=f"g{gi}", nodes=n, nnz=nnz, widths=widths)
        for g in gpus:
            grids = enumerate_grids(g)
            pred = predict_grids(w, machine, grids)
            epoch = OVERHEAD + sum(TRUE_SCALES[k] * pred[k] for k in TRUE_SCALES)
            for j, grid in enumerate(grids):
                for trial in range(2):
                    records.append(
                        {
                            "graph": f"g{gi}", "graph_source": f"synthetic:g{gi}", "status": "ok", "graph_nodes": n, "nnz": nnz,
                            "widths": list(widths), "gx": int(grid[0]), "gy": int(grid[1]), "gz": int(grid[2]),
                            "epoch_ms": float(epoch[j]) * (1.01 if trial else 0.99), "options": {"block_rows": None},
                        }
                    )
    records.append({"graph": "g0", "graph_source": "synthetic:g0", "status": "oom", "reason": "out of memory", "gx": 8, "gy": 1, "gz": 1})
    return records


def test_spearman_and_regret_by_hand():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    # ranks (1,2,3,4) vs (2,1,3,4): d^2 = 2 -> 1 - 6*2/(4*15) = 0.8
    assert spearman([1, 2, 3, 4], [2, 1, 3, 4]) == pytest.approx(0.8)
    assert regret([3.0, 1.0, 2.0], [10.0, 12.0, 11.0]) == pytest.approx(1.2)
    assert regret([1.0, 2.0], [5.0, 6.0]) == 1.0


def test_runs_table_takes_the_median_trial_and_drops_failures():
    records = _runs()
    df = runs_table(records)
    assert (df["trials"] == 2).all()
    assert len(df) == 2 * (6 + 10)  # grids of 4 and of 8, two graphs
    # the failed 8x1x1 run of g0 is counted with the identity it failed in, not pooled
    failed = df[(df["graph"] == "synthetic:g0") & (df["grid"] == "8x1x1")]
    assert list(failed["failed"]) == [1] and failed["last_failure"].iloc[0] == "oom: out of memory"
    assert df["failed"].sum() == 1 and df.attrs["failed_trials"] == 1
    # a third trial that met a stall 10x slower: the median of (0.99, 1.01, 10) x t is 1.01 x t
    first = records[0]
    stalled = {**first, "epoch_ms": first["epoch_ms"] / 0.99 * 10.0}
    df3 = runs_table(records + [stalled])
    row = df3[(df3["graph"] == first["graph_source"]) & (df3["gx"] == first["gx"]) & (df3["gy"] == first["gy"]) & (df3["gz"] == first["gz"])].iloc[0]
    assert row["trials"] == 3
    assert row["obs_epoch_ms"] == pytest.approx(first["epoch_ms"] / 0.99 * 1.01)
    assert row["obs_epoch_ms_max"] == pytest.approx(first["epoch_ms"] / 0.99 * 10.0)
    assert row["obs_epoch_ms_min"] == pytest.approx(first["epoch_ms"])
    with pytest.raises(UserError, match="no successful"):
        predict_runs(runs_table([{"status": "failed"}]), PROFILE)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("epoch_ms", float("nan"), "epoch_ms = nan is not a finite time > 0"),
        ("epoch_ms", -3.0, "epoch_ms = -3.0 is not a finite time > 0"),
        ("epoch_ms", 0.0, "epoch_ms = 0.0 is not a finite time > 0"),
        ("epoch_ms", "fast", "epoch_ms = 'fast' is not a finite time > 0"),
        ("comm_ms", -1.0, "comm_ms = -1.0 is not a finite time >= 0"),
        ("spmm_ms", float("inf"), "spmm_ms = inf is not a finite time >= 0"),
    ],
)
def test_runs_with_bad_times_are_named_not_scored(key, value, message):
    records = _runs()
    bad = {**records[3], key: value, "timestamp": "2026-01-01T00:00:00+00:00"}
    where = f"run {bad['gx']}x{bad['gy']}x{bad['gz']} of synthetic:g0 at 2026-01-01T00:00:00+00:00: "
    with pytest.raises(UserError, match=re.escape(where + message)):
        runs_table(records[:3] + [bad] + records[4:])
    # a run that did not finish is dropped, not an error
    failed = {**bad, "status": "failed", "epoch_ms": None}
    assert len(runs_table(records[:3] + [failed] + records[4:])) == len(runs_table(records))


def test_validate_cli_rejects_a_nan_time_in_one_line(tmp_path, run_cli):
    log = tmp_path / "runs.jsonl"
    records = _runs()
    append_records(log, records)
    with open(log, "a") as fh:  # JSON's NaN literal, as a careless writer may leave it
        fh.write(json.dumps({**records[5], "schema": "plexus-tune/run-v2", "epoch_ms": float("nan")}) + "\n")
    before = log.read_bytes()
    prof = tmp_path / "toy.json"
    prof.write_text(json.dumps(PROFILE))
    code, out, err = run_cli(["validate", "--machine", str(prof), "--runs", str(log), "--json", str(tmp_path / "v.json")])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "epoch_ms = nan is not a finite time > 0" in err and "Traceback" not in err
    assert log.read_bytes() == before and not (tmp_path / "v.json").exists()


def test_leave_one_group_out_recovers_a_rescaled_model():
    df = runs_table(_runs())
    result = leave_one_group_out(df, PROFILE)
    assert result["mean"]["groups"] == 4
    for g in result["groups"]:
        assert g["spearman"] == pytest.approx(1.0)
        assert g["regret"] == pytest.approx(1.0)
        assert g["mape"] < 1e-6
        assert g["predicted_best"] == g["observed_best"]
    as_is = leave_one_group_out(df, PROFILE, refit=False)
    # the toy profile itself is off by the scales: each group's MAPE by brute force
    machine = Machine.from_dict(PROFILE)
    by_hand = []
    for gi, (n, nnz, widths) in enumerate(((4096, 60000, (32, 64, 64, 8)), (8192, 40000, (16, 64, 64, 4)))):
        for g in (4, 8):
            pred = predict_grids(Workload(name=f"g{gi}", nodes=n, nnz=nnz, widths=widths), machine, enumerate_grids(g))
            observed = OVERHEAD + sum(TRUE_SCALES[k] * pred[k] for k in TRUE_SCALES)
            by_hand.append(100 * np.mean(np.abs(pred["total_ms"] - observed) / observed))
    assert as_is["mean"]["mape"] == pytest.approx(np.mean(by_hand), rel=1e-9)
    assert as_is["mean"]["mape"] > 5


def test_epoch_fit_folds_into_the_profile_exactly():
    s = {"spmm_ms": 2.0, "gemm_ms": 4.0, "comm_ms": 0.5, "other_ms": 2.0}
    scaled = apply_epoch_fit(PROFILE, EpochModel(scales=s, overhead_ms=1.5))
    w = Workload(name="w", nodes=1000, nnz=20000, widths=(16, 32, 4))
    base = predict_grids(w, Machine.from_dict(PROFILE), enumerate_grids(4))
    new = predict_grids(w, Machine.from_dict(scaled), enumerate_grids(4))
    for key in s:
        np.testing.assert_allclose(new[key], s[key] * base[key], rtol=1e-12)
    assert scaled["epoch_overhead_ms"] == 1.5
    learned = {"kind": "learned", "exponents": [[1, 0, 0, 0]], "mean": [0.0], "scale": [1.0], "coef": [1.0], "intercept": 0.0}
    assert predict_spmm_ms(scale_spmm_entry(learned, 3.0), 9, 1, 1, 1) == pytest.approx(30.0)
    # one depth-1 tree: z[0] = log(nnz + 1) <= log 5 -> leaf 0.0, else 1.0 (x e^0.5 at rate 0.5)
    boosted = {"kind": "boosted", "features": "log-shape-polynomial", "depth": 1, "learning_rate": 0.5, "init": 0.0,
               "feature": [[0]], "threshold": [[np.log(5.0)]], "leaf": [[0.0, 1.0]], "base": learned}
    assert predict_spmm_ms(boosted, 3, 1, 1, 1) == pytest.approx(4.0)
    assert predict_spmm_ms(scale_spmm_entry(boosted, 3.0), 9, 1, 1, 1) == pytest.approx(3.0 * 10.0 * np.exp(0.5))


def test_validate_cli_prints_and_writes_json(tmp_path, capsys):
    log = tmp_path / "runs.jsonl"
    append_records(log, _runs())
    prof = tmp_path / "toy.json"
    prof.write_text(json.dumps(PROFILE))
    out = tmp_path / "v.json"
    assert main(["validate", "--machine", str(prof), "--runs", str(log), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Spearman" in text and "synthetic:g1" in text
    data = json.loads(out.read_text())
    assert data["mean"]["spearman"] == pytest.approx(1.0) and data["mean"]["regret"] == pytest.approx(1.0)
    assert main(["validate", "--machine", str(prof), "--runs", str(tmp_path / "missing.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_validate_says_refitted_only_when_a_group_was_refitted(tmp_path, capsys):
    prof = tmp_path / "toy.json"
    prof.write_text(json.dumps(PROFILE))
    one = tmp_path / "one.jsonl"
    append_records(one, _runs(graphs=((4096, 60000, (32, 64, 64, 8)),), gpus=(8,)))  # a single (graph, G) group
    assert main(["validate", "--machine", str(prof), "--runs", str(one), "--json", str(tmp_path / "v.json")]) == 0
    title = " ".join(capsys.readouterr().out.split())
    assert "(refitted)" not in title and "as is: too few other runs to refit" in title
    assert json.loads((tmp_path / "v.json").read_text())["refitted_groups"] == 0
    many = tmp_path / "many.jsonl"
    append_records(many, _runs())
    assert main(["validate", "--machine", str(prof), "--runs", str(many)]) == 0
    assert "(refitted)" in " ".join(capsys.readouterr().out.split())
