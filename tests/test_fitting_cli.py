import json
import re
import subprocess
import sys

import numpy as np
import pytest

from plexus_tune.cli import main
from plexus_tune.model.costs import predict_grids
from plexus_tune.model.grid import enumerate_grids
from plexus_tune.model.machine import Machine, load_machine
from plexus_tune.model.spmm import ROOFLINE_TERMS, roofline_terms
from plexus_tune.measure.store import COLLECTIVE_SCHEMA, GEMM_SCHEMA, SPMM_SCHEMA, append_records
from plexus_tune.model.workload import Workload

ROOF = {"const": 0.02, "flops": 1e-9, "sparse_bytes": 2e-9, "dense_in_bytes": 0.0, "out_bytes": 1e-8, "rows": 0.0}
ALPHA_US, BETA = 40.0, 2.0
TFLOPS = 0.02
SCALES = {"spmm_ms": 1.5, "gemm_ms": 2.0, "comm_ms": 0.8, "other_ms": 3.0}


def _truth_profile(cores=None):
    return {"host_cores": cores,
        "name": "truth", "gpus_per_node": 8, "device_memory_gib": 4, "gemm_tflops": TFLOPS, "elementwise_gbps": 10.0,
        "spmm": {"kind": "roofline", "coefficients": ROOF},
        "collectives": {"alpha_intra_us": ALPHA_US, "beta_intra_gbps": BETA, "alpha_inter_us": ALPHA_US, "beta_inter_gbps": BETA},
    }


def _logs(tmp_path, cores=None):
    rng = np.random.default_rng(0)
    n = 60
    rows = rng.integers(100, 5000, n)
    common = rng.integers(100, 5000, n)
    k = rng.integers(1, 64, n)
    nnz = rows * rng.integers(1, 20, n)
    t = roofline_terms(nnz, rows, common, k) @ np.array([ROOF[name] for name in ROOFLINE_TERMS])
    spmm = tmp_path / "spmm.jsonl"
    append_records(spmm, [{"nnz": int(a), "rows": int(b), "common": int(c), "dense_cols": int(d), "time_ms": float(e)} for a, b, c, d, e in zip(nnz, rows, common, k, t)], schema=SPMM_SCHEMA)
    m, i, c = rng.integers(10, 4000, 30), rng.integers(1, 128, 30), rng.integers(1, 128, 30)
    append_records(spmm, [{"rows": int(a), "inner": int(b), "cols": int(d), "time_ms": float(2 * a * b * d / (TFLOPS * 1e12) * 1e3)} for a, b, d in zip(m, i, c)], schema=GEMM_SCHEMA)
    coll = tmp_path / "coll.jsonl"
    recs = []
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        for g, p in ((2, 1), (2, 2), (4, 1)):
            for size in (1024, 65536, 1 << 22):
                steps = (2 if op == "all_reduce" else 1) * (g - 1)
                t = steps * ALPHA_US * 1e-3 + steps / g * size / (BETA * 1e9) * 1e3
                rec = {"op": op, "group_size": g, "stride": p, "nodes_spanned": 1, "message_bytes": size, "time_ms": t, "world_size": 8, "backend": "gloo"}
                if cores:  # 8 one-thread ranks time-sharing `cores` cores: every call takes 8 / cores as long
                    rec.update(time_ms=t * 8 / cores, machine_info={"cpu_count": cores})
                recs.append(rec)
    append_records(coll, recs, schema=COLLECTIVE_SCHEMA)
    truth = Machine.from_dict(_truth_profile(cores))
    runs = tmp_path / "runs.jsonl"
    recs = []
    for gi, (nodes, nnz_g, widths) in enumerate(((3000, 40000, (16, 32, 32, 4)), (6000, 30000, (8, 32, 32, 4)))):
        w = Workload(name=f"g{gi}", nodes=nodes, nnz=nnz_g, widths=widths)
        grids = enumerate_grids(4)
        pred = predict_grids(w, truth, grids)
        epoch = 2.5 + sum(SCALES[c] * pred[c] for c in SCALES)
        for j, grid in enumerate(grids):
            recs.append({"graph": f"g{gi}", "graph_source": f"synthetic:g{gi}", "graph_nodes": nodes, "nnz": nnz_g, "widths": list(widths),
                         "gx": int(grid[0]), "gy": int(grid[1]), "gz": int(grid[2]), "epoch_ms": float(epoch[j]), "status": "ok", "options": {}})
    append_records(runs, recs)
    return spmm, coll, runs


def test_fit_writes_a_loadable_profile_with_provenance_and_scores(tmp_path, capsys):
    spmm, coll, runs = _logs(tmp_path)
    out = tmp_path / "models" / "fitted.json"
    code = main(["fit", "--spmm", str(spmm), "--collectives", str(coll), "--runs", str(runs), "--machine-name", "fitted",
                 "--out", str(out), "--splits", "20", "--device-memory-gib", "4"])
    assert code == 0
    captured = capsys.readouterr()
    text = captured.out
    for kind in ("paper-spmm", "roofline", "learned", "learned-roofline"):
        assert kind in text
    assert "test R^2" in text and "epoch fit (total) on 12 configurations" in text
    # progress on stderr (not a terminal: one plain line as each stage ends)
    for stage in ("collectives: 1/1", "gemm: 20/20", "epoch: 1/1"):
        assert f"fit: {stage} done" in captured.err
    # the SpMM kinds race on the same splits: each ends once, at most at the 20 asked for
    raced = {kind: int(done) for kind, done in re.findall(r"fit: spmm ([\w-]+): (\d+)/\2 done", captured.err)}
    assert set(raced) == {"paper-spmm", "roofline", "learned", "learned-roofline"} and max(raced.values()) <= 20
    profile = json.loads(out.read_text())
    machine = load_machine(str(out))
    assert machine.name == "fitted" and machine.gpus_per_node == 8
    assert set(profile["fit"]["spmm"]["scores"]) == {"paper-spmm", "roofline", "learned", "learned-roofline"}
    assert profile["fit"]["spmm"]["scores"]["roofline"]["test_mape"] < 1e-3
    assert "provenance" in profile and "spmm" in profile["provenance"]
    # exact synthetic data: the epoch scales come back and are folded into the rates
    scales = profile["fit"]["epoch"]["scales"]
    for key, value in SCALES.items():
        assert scales[key] == pytest.approx(value, rel=1e-4)
    assert profile["gemm_tflops"] == pytest.approx(TFLOPS / SCALES["gemm_ms"], rel=1e-4)
    assert profile["collectives"]["beta_intra_gbps"] == pytest.approx(BETA / SCALES["comm_ms"], rel=1e-4)
    assert profile["epoch_overhead_ms"] == pytest.approx(2.5, rel=1e-3)
    assert len(profile["collectives"]["bandwidth_table"]) == 9  # 3 ops x 3 (stride, group) shapes
    # the profile now predicts the runs (mean over validation groups)
    assert main(["validate", "--machine", str(out), "--runs", str(runs), "--no-refit"]) == 0
    assert "1.000" in capsys.readouterr().out


def test_fit_models_ranks_time_sharing_the_cores_of_a_cpu_host(tmp_path, capsys):
    spmm, coll, runs = _logs(tmp_path, cores=2)
    out = tmp_path / "fitted.json"
    assert main(["fit", "--spmm", str(spmm), "--collectives", str(coll), "--runs", str(runs), "--machine-name", "cpu",
                 "--out", str(out), "--splits", "5", "--device-memory-gib", "4", "--no-table"]) == 0
    assert "divided by the oversubscription" in capsys.readouterr().out
    profile = json.loads(out.read_text())
    assert profile["host_cores"] == 2 and profile["threads_per_rank"] == 1
    # collective timings of 8 ranks on 2 cores were 4x the one-rank ring times: alpha and beta come back
    scales = profile["fit"]["epoch"]["scales"]
    assert profile["fit"]["collectives"]["tiers"]["intra"]["alpha_us"] == pytest.approx(ALPHA_US, rel=1e-3)
    assert profile["collectives"]["beta_intra_gbps"] == pytest.approx(BETA / scales["comm_ms"], rel=1e-3)
    for key, value in SCALES.items():  # runs of 4 ranks on 2 cores (x2) are explained without other changes
        assert scales[key] == pytest.approx(value, rel=1e-3)
    # --host-cores 0 switches the model off: the collective fit then sees 4x slower rings
    plain = tmp_path / "plain.json"
    assert main(["fit", "--spmm", str(spmm), "--collectives", str(coll), "--machine-name", "cpu", "--out", str(plain),
                 "--splits", "1", "--device-memory-gib", "4", "--no-table", "--host-cores", "0"]) == 0
    off = json.loads(plain.read_text())
    assert "host_cores" not in off
    assert off["fit"]["collectives"]["tiers"]["intra"]["alpha_us"] == pytest.approx(4 * ALPHA_US, rel=1e-3)
    assert main(["fit", "--spmm", str(spmm), "--collectives", str(coll), "--machine-name", "cpu", "--out", str(plain),
                 "--host-cores", "-1"]) == 2


def test_fit_bad_csv_is_one_line_exit_2(tmp_path):
    spmm, coll, _ = _logs(tmp_path)
    bad = tmp_path / "bad.csv"
    bad.write_text("nnz,rows,dense_cols,time_ms\n1,2,3,4\n")
    proc = subprocess.run([sys.executable, "-m", "plexus_tune", "fit", "--spmm", str(bad), "--collectives", str(coll),
                           "--machine-name", "x", "--out", str(tmp_path / "x.json")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert "missing column 'common'" in proc.stderr
    nan = tmp_path / "nan.csv"
    nan.write_text("nnz,rows,common,dense_cols,time_ms\n" + "\n".join(f"{10 + i},5,8,4,{0.1 * (i + 1)}" for i in range(20)) + "\n10,5,8,4,nan\n")
    assert main(["fit", "--spmm", str(nan), "--collectives", str(coll), "--machine-name", "x", "--out", str(tmp_path / "x.json"), "--splits", "5"]) == 2
    assert not (tmp_path / "x.json").exists()


def test_fit_names_the_kinds_and_the_flag_of_a_missing_gemm_rate(tmp_path, capsys):
    spmm, coll, _ = _logs(tmp_path)
    out = tmp_path / "x.json"
    assert main(["fit", "--spmm", str(spmm), "--collectives", str(coll), "--machine-name", "x", "--out", str(out), "--kind", "paper"]) == 2
    err = capsys.readouterr().err
    assert "unknown SpMM model kind 'paper' to fit" in err and "'paper-spmm'" in err and "learned-boosted" in err
    csv = tmp_path / "spmm.csv"  # SpMM timings alone: no GEMM records to fall back on
    csv.write_text("nnz,rows,common,dense_cols,time_ms\n" + "\n".join(f"{10 * i},{5 + i},8,4,{0.1 * (i + 1)}" for i in range(1, 30)) + "\n")
    assert main(["fit", "--spmm", str(csv), "--collectives", str(coll), "--machine-name", "x", "--out", str(out), "--splits", "1"]) == 2
    assert "no GEMM measurements" in (err := capsys.readouterr().err) and err.strip().endswith("(--gemm-tflops)")
    assert main(["fit", "--spmm", str(csv), "--collectives", str(coll), "--machine-name", "x", "--out", str(out), "--splits", "1",
                 "--gemm-tflops", "0.5", "--kind", "roofline", "--device-memory-gib", "2"]) == 0
    profile = json.loads(out.read_text())
    assert profile["gemm_tflops"] == 0.5 and profile["provenance"]["gemm_tflops"] == "--gemm-tflops"
    assert profile["provenance"]["device_memory_gib"] == "--device-memory-gib" and profile["spmm"]["kind"] == "roofline"


def test_bandwidth_table_is_kept_only_if_no_held_out_score_is_worse():
    from plexus_tune.fit.collectives import no_worse as _no_worse

    formula = {"test_r2": 0.64, "test_mape": 40.8}
    assert not _no_worse({"test_r2": 0.10, "test_mape": 31.7}, formula)  # lower MAPE, far worse R^2
    assert not _no_worse({"test_r2": 0.90, "test_mape": 45.0}, formula)
    assert _no_worse({"test_r2": 0.90, "test_mape": 30.0}, formula)
    assert not _no_worse({}, formula)


def test_progress_off_a_terminal_is_a_line_per_finished_stage_and_every_interval():
    import io

    from plexus_tune.cli.fit import ProgressReporter

    now = [100.0]
    out = io.StringIO()
    reporter = ProgressReporter(stream=out, interval_s=10.0)
    reporter.clock = lambda: now[0]
    reporter.started = reporter.last = 100.0
    for t, done in ((101.0, 10), (105.0, 20), (112.0, 30), (115.0, 40), (123.0, 50)):
        now[0] = t
        reporter("spmm learned-boosted", done, 1000)
    now[0] = 124.0
    reporter("spmm learned-boosted", 60, 60)  # stopped early: total shrinks to what was scored
    reporter.close()
    assert out.getvalue().splitlines() == [
        "fit: spmm learned-boosted: 30/1000 running (11.0 s; 12.0 s in all)",
        "fit: spmm learned-boosted: 50/1000 running (22.0 s; 23.0 s in all)",
        "fit: spmm learned-boosted: 60/60 done (23.0 s; 24.0 s in all)",
    ]
