"""The epoch's other part: bytes by hand, rates from bandwidth records and trainer runs, the CPU benchmark."""

import json
from pathlib import Path

import numpy as np
import pytest

from plexus_tune.errors import UserError
from plexus_tune.fit.bandwidth import (
    epoch_latency_from_runs,
    fit_bandwidths,
    optimizer_gbps_from_runs,
    run_optimizer,
)
from plexus_tune.model.costs import TOTAL_PARTS, predict_grids
from plexus_tune.model.machine import Machine
from plexus_tune.model.other import (
    LEGACY_PASSES,
    OPTIMIZER_ACCESSES,
    OTHER_PARTS,
    elementwise_bytes,
    other_ms,
    trainable_elements,
)
from plexus_tune.model.shapes import layer_shapes
from plexus_tune.model.workload import Workload

REPO = Path(__file__).resolve().parents[1]
H100_RUNS = REPO / "measurements" / "h100-2026-11-25" / "trainer-runs.jsonl"


def _machine(**over):
    data = {"name": "toy", "gpus_per_node": 1, "device_memory_gib": 80, "gemm_tflops": 50, "elementwise_gbps": 2000.0,
            "spmm": {"kind": "paper", "c0": 1e-3, "c1": 2e-4, "c2": -1e-4},
            "collectives": {"alpha_intra_us": 5, "beta_intra_gbps": 100, "alpha_inter_us": 10, "beta_inter_gbps": 25}}
    data.update(over)
    return Machine.from_dict(data)


def test_one_gpu_bytes_by_hand():
    # N = 1000, widths 10-8-3 on one GPU: P = 1000*10 features + 10*8 + 8 + 8*3 + 3 = 10115
    shapes = layer_shapes(1000, [10, 8, 3], (1, 1, 1))
    assert float(trainable_elements(shapes)) == 10115
    # the trainer: layer 0 relu 2 + masked backward 3 + db 1 on 1000 x 8; layer 1 (last): db 1 + loss 6
    # on 1000 x 3; gradients released, never cleared
    assert float(elementwise_bytes(shapes, 4)) == 4 * (6 * 8000 + 7 * 3000)
    # the earlier trainer: bias 2 + relu 2 + 3; bias 2 + loss 14; gradients zeroed and accumulated, 4 P
    assert float(elementwise_bytes(shapes, 4, LEGACY_PASSES)) == 4 * (7 * 8000 + 16 * 3000 + 4 * 10115)
    parts = other_ms(shapes, 4, elementwise_gbps=2.0, optimizer_gbps=1.0, sync_us=50.0, optimizer="adamw-foreach")
    assert float(parts["other_optimizer_ms"]) == pytest.approx(4 * 20 * 10115 / 1e9 * 1e3)
    assert float(parts["other_elementwise_ms"]) == pytest.approx(4 * (6 * 8000 + 7 * 3000) / 2e9 * 1e3)
    assert float(parts["other_sync_ms"]) == pytest.approx(0.05)
    assert float(parts["other_ms"]) == pytest.approx(sum(float(parts[k]) for k in OTHER_PARTS))


def test_parts_add_up_and_the_optimizer_is_chosen():
    w = Workload("w", nodes=50_000, nnz=600_000, widths=(64, 128, 128, 16))
    m = _machine(optimizer_gbps=1000.0, sync_us=20.0)
    assert m.optimizer == "adamw-fused"
    fused = predict_grids(w, m, 8)
    foreach = predict_grids(w, m, 8, optimizer="adamw-foreach")
    for pred in (fused, foreach):
        assert np.allclose(sum(pred[k] for k in OTHER_PARTS), pred["other_ms"])
        assert np.allclose(sum(pred[k] for k in TOTAL_PARTS), pred["total_ms"])
    ratio = foreach["other_optimizer_ms"] / fused["other_optimizer_ms"]
    assert np.allclose(ratio, OPTIMIZER_ACCESSES["adamw-foreach"] / OPTIMIZER_ACCESSES["adamw-fused"])
    assert np.allclose(fused["other_elementwise_ms"], foreach["other_elementwise_ms"])
    # no elementwise rate: nothing modelled
    bare = predict_grids(w, _machine(elementwise_gbps=None), 8)
    assert not bare["other_ms"].any()
    with pytest.raises(UserError, match="unknown optimizer 'adam'"):
        predict_grids(w, m, 8, optimizer="adam")
    with pytest.raises(UserError, match="'optimizer' must be one of"):
        _machine(optimizer="sgd")


def test_rates_from_bandwidth_records():
    rec = lambda op, elements, accesses, ms, **kw: {"op": op, "elements": elements, "accesses": accesses,  # noqa: E731
                                                    "bytes": 4 * accesses * elements, "time_ms": ms, **kw}
    records = [rec("copy", 1000, 2, 1.0), rec("copy", 10**6, 2, 0.004), rec("relu", 10**6, 2, 0.008),
               rec("relu_backward", 10**6, 3, 0.006), rec("optimizer", 10**6, 7, 0.014, optimizer="adamw-fused"),
               rec("optimizer", 10**6, 20, 0.1, optimizer="adamw-foreach"), rec("sync", 0, 0, 0.012)]
    rates = fit_bandwidths(records, "adamw-fused")
    # largest size only: copy 2000, relu 1000, relu_backward 2000 GB/s -> median 2000
    assert rates["elementwise_gbps"] == pytest.approx(2000.0)
    assert rates["optimizer_gbps"] == pytest.approx(2000.0)
    assert rates["sync_us"] == pytest.approx(12.0)
    assert fit_bandwidths(records, "adamw-foreach")["optimizer_gbps"] == pytest.approx(800.0)


def test_optimizer_rate_and_latency_from_the_h100_runs():
    runs = [json.loads(line) for line in H100_RUNS.read_text().splitlines()]
    gpu = [r for r in runs if r.get("backend") == "nccl" and r["status"] == "ok"]
    assert {run_optimizer(r) for r in gpu} == {"adamw-foreach"}
    lattice = next(r for r in gpu if r["graph"].startswith("grid2d") and r["options"]["permute"] == "none")
    # 4M x 128 trainable features + 128x128 + 128x128 + 128x16 weights + 128 + 128 + 16 biases, 20 accesses of 4 bytes
    elements = 4_000_000 * 128 + 2 * 128 * 128 + 128 * 16 + 128 + 128 + 16
    rate, used = optimizer_gbps_from_runs([lattice])
    assert used == 1 and rate == pytest.approx(4 * 20 * elements / (lattice["optimizer_ms"] * 1e-3) / 1e9)
    # the latency is what the byte counts leave of the observed other part
    profile = {"elementwise_gbps": 3000.0, "optimizer_gbps": rate}
    latency, used = epoch_latency_from_runs([lattice], profile)
    shapes = layer_shapes(4_000_000, [128, 128, 128, 16], (1, 1, 1))
    # a record without an optimizer field is the earlier trainer's: its passes
    predicted = float(elementwise_bytes(shapes, 4, LEGACY_PASSES)) / 3e12 * 1e3 + lattice["optimizer_ms"]
    assert latency == pytest.approx(lattice["other_ms"] - predicted)
    with pytest.raises(UserError, match="no trainer run with an optimizer phase"):
        optimizer_gbps_from_runs([{"status": "oom"}])


def test_cpu_bandwidth_benchmark_records():
    import torch

    from plexus_tune.measure.bandwidth import bandwidth_benchmark

    records = bandwidth_benchmark(torch.device("cpu"), sizes=(4096,), optimizers=("adamw-fused",), min_samples=3, min_time_s=0.0)
    ops = [r["op"] for r in records]
    assert ops == ["copy", "relu", "relu_backward", "column_sum", "optimizer", "sync"]
    for r in records:
        assert r["bytes"] == 4 * r["accesses"] * r["elements"]
        assert 0 < r["time_ms"] <= r["time_median_ms"] and r["repeats"] >= 3
        assert r["device"] == "cpu" and r["machine_info"]["torch"] == torch.__version__
    assert records[4]["accesses"] == 7 and records[4]["elements"] == 4096
    rates = fit_bandwidths(records, "adamw-fused")
    assert rates["elementwise_gbps"] > 0 and rates["optimizer_gbps"] > 0 and rates["sync_us"] > 0


def test_cuda_device_without_a_gpu_is_one_user_error():
    import torch

    from plexus_tune.measure.device import resolve_device

    assert resolve_device("cpu").type == "cpu"
    with pytest.raises(UserError, match="unknown device 'tpu'"):
        resolve_device("tpu")
    if torch.cuda.is_available():
        assert resolve_device("cuda").type == "cuda"
    else:
        with pytest.raises(UserError, match="no CUDA device is visible"):
            resolve_device("cuda")


H100 = REPO / "measurements" / "h100-2026-11-25"


@pytest.mark.slow
def test_fit_a_gpu_profile_without_collective_logs(tmp_path, run_cli):
    from plexus_tune.measure.store import read_runs
    from plexus_tune.model.machine import load_machine

    out = tmp_path / "gpu.json"
    args = ["fit", "--machine-name", "gpu", "--out", str(out), "--spmm", str(H100 / "spmm-sweep.jsonl"),
            "--gemm", str(H100 / "rmat-gemm-shards.jsonl"), "--collectives-from", "perlmutter", "--elementwise-gbps", "2967.7",
            "--optimizer-runs", str(H100 / "trainer-runs.jsonl"), "--device-memory-gib", "79.18", "--kind", "roofline",
            "--splits", "10", "--jobs", "1", "--provenance", "elementwise_gbps=the copy rate of env.json"]
    # bad inputs: one line, exit 2, nothing written
    for bad, message in ((["--provenance", "nonsense=x"], "'nonsense' is not a profile field"),
                         (["--provenance", "elementwise_gbps"], "expected FIELD=TEXT"),
                         (["--optimizer", "sgd"], "unknown optimizer 'sgd'")):
        code, _, err = run_cli(args[:-2] + bad if bad[0] == "--provenance" else args + bad)
        assert code == 2 and message in err and err.count("\n") == 1, err
        assert not out.exists()
    code, _, err = run_cli(args + ["--collectives", str(H100 / "env.json")])
    assert code == 2 and not out.exists()
    code, stdout, err = run_cli(args)
    assert code == 0, err
    profile = json.loads(out.read_text())
    perlmutter = load_machine("perlmutter")
    assert profile["collectives"] == perlmutter.raw["collectives"] and profile["gpus_per_node"] == 4
    assert "NOT measured on this machine" in profile["provenance"]["collectives"]
    assert profile["provenance"]["elementwise_gbps"].endswith("the copy rate of env.json")
    assert profile["optimizer"] == "adamw-fused" and profile["elementwise_gbps"] == 2967.7
    runs = read_runs(H100 / "trainer-runs.jsonl")
    rate, used = optimizer_gbps_from_runs(runs, gpu=True)
    assert used == 6 and profile["optimizer_gbps"] == pytest.approx(rate)
    latency, _ = epoch_latency_from_runs(runs, profile, gpu=True)
    assert profile["epoch_overhead_ms"] == pytest.approx(latency) and 3.0 < latency < 7.0
    machine = load_machine(str(out))
    assert machine.optimizer_gbps == pytest.approx(rate) and "other: elementwise 2968 GB/s" in stdout


def test_calibrate_bandwidth_cli(tmp_path, run_cli):
    log = tmp_path / "bw.jsonl"
    code, _, err = run_cli(["calibrate", "bandwidth", "--optimizers", "adam", "--out", str(log)])
    assert code == 2 and "unknown optimizer 'adam'" in err and not log.exists()
    code, _, err = run_cli(["calibrate", "bandwidth", "--sizes", "0", "--out", str(log)])
    assert code == 2 and not log.exists()
    code, out, err = run_cli(["calibrate", "bandwidth", "--sizes", "4096", "--optimizers", "adamw-fused", "--out", str(log)])
    assert code == 0, err
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["op"] for r in records] == ["copy", "relu", "relu_backward", "column_sum", "optimizer", "sync"]
    assert all(r["schema"] == "plexus-tune/bandwidth-v1" and r["elements"] in (0, 4096) for r in records)
    assert "6 records appended" in out


def test_predict_optimizer_option(run_cli):
    base = ["predict", "--gpus", "1", "--machine", str(REPO / "models" / "h100-80gb-fitted.json"), "--nodes", "262144",
            "--nnz", "4456448", "--features", "128", "--classes", "16", "--format", "json"]
    code, out, err = run_cli(base)
    assert code == 0, err
    (fused,) = json.loads(out)
    code, out, err = run_cli(base + ["--optimizer", "adamw-foreach"])
    (foreach,) = json.loads(out)
    assert foreach["other_optimizer_ms"] == pytest.approx(fused["other_optimizer_ms"] * 20 / 7)
    for rec in (fused, foreach):
        assert rec["other_ms"] == pytest.approx(rec["other_elementwise_ms"] + rec["other_optimizer_ms"] + rec["other_sync_ms"])
        assert rec["total_ms"] == pytest.approx(sum(rec[k] for k in TOTAL_PARTS))
    code, out, err = run_cli(base + ["--optimizer", "sgd"])
    assert code == 2 and out == "" and err.count("\n") == 1 and "--optimizer: unknown optimizer 'sgd'" in err


def test_the_h100_profile_says_where_every_number_came_from():
    profile = json.loads((REPO / "models" / "h100-80gb-fitted.json").read_text())
    numbers = [k for k in profile if k not in ("schema", "name", "description", "provenance", "fit")]
    assert set(numbers) <= set(profile["provenance"]), set(numbers) - set(profile["provenance"])
    assert "NOT measured" in profile["provenance"]["collectives"]
    # every input the fit read is shipped beside the profile, unchanged
    import hashlib

    for kind, inputs in profile["fit"]["inputs"].items():
        for item in inputs:
            if "path" in item:
                data = (REPO / item["path"]).read_bytes()
                assert hashlib.sha256(data).hexdigest()[:16] == item["sha256"], (kind, item["path"])
