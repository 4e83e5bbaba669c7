"""ScaleGNN's sampling cost: the calibrated kernel (calibrate sampling, fit), the profile's
sampling entry in the model, and the prefetch switch from the command line to the prediction."""

import json

import numpy as np
import pytest

from plexus_tune.errors import UserError
from plexus_tune.fit.sampling import fit_sampling
from plexus_tune.model.comm_precision import parse_comm_precision
from plexus_tune.model.machine import Machine, load_machine
from plexus_tune.model.scalegnn import predict_config, sampled_nnz_per_shard, sampling_ms, sampling_work
from plexus_tune.model.workload import Workload

FP32 = parse_comm_precision("fp32")


def _profile(**extra) -> Machine:
    data = json.loads(json.dumps(load_machine("perlmutter").raw))
    data.update(extra)
    return Machine.from_dict(data)


def test_sampling_work_is_the_hand_count():
    """N = 1024, NNZ = 8192, B = 256, grid 2x1x1, 3 layers, u = 4: layer 0 (o = X, d = Z) cuts shards of
    NNZ / 2 over 512 x 1024 (CSR indices 4 B); layers 1 (o = Y, d = X) and 2 (o = Z, d = Y) likewise of
    NNZ / 2 over 1024 x 512 and NNZ / 1 over 1024 x 1024. Per layout: gathered = shard x B / N nonzeros,
    each u + 4 + 24 + 8 log2(r_o) bytes; kept z = E[nnz(A_S)] / (g_d g_o), 4 passes of u + 4 bytes."""
    w = Workload("t", 1024, 8192, (16, 8, 8, 4))
    layouts, work = sampling_work(w, (2, 1, 1), 256)
    z_total = (8192 - 1024) * 256 * 255 / (1024 * 1023) + 256
    want = 16 * 256
    for shard, g_o, g_d in ((8192 / 2, 2, 1), (8192 / 2, 1, 2), (8192, 1, 1)):
        r_o = -(-256 // g_o)
        want += shard * 256 / 1024 * (4 + 4 + 24 + 8 * np.log2(r_o))
        want += z_total / (g_o * g_d) * 4 * (4 + 4)
    assert layouts == 3
    assert work == pytest.approx(want, rel=1e-12)
    assert sampled_nnz_per_shard(w, (2, 1, 1), 256)[0] == pytest.approx(z_total / 2)


def test_sampling_time_is_call_cost_per_layout_plus_bytes_at_the_calibrated_rate():
    w = Workload("t", 1024, 8192, (16, 8, 8, 4))
    layouts, work = sampling_work(w, (1, 2, 1), 512)
    calibrated = _profile(sampling={"call_ms": 0.25, "gbps": 0.5})
    assert sampling_ms(w, calibrated, (1, 2, 1), 512) == pytest.approx(0.25 * layouts + work / 0.5e9 * 1e3)
    plain = load_machine("perlmutter")  # no sampling entry: the bytes at the elementwise rate
    assert plain.sampling is None
    assert sampling_ms(w, plain, (1, 2, 1), 512) == pytest.approx(work / (plain.elementwise_gbps * 1e9) * 1e3)
    # what the prediction exposes follows: all of it without prefetch
    off = predict_config(w, calibrated, 2, (1, 2, 1), 512, choice=FP32, prefetch=False)
    assert off["other_sampling_ms"] == pytest.approx(off["steps"] * sampling_ms(w, calibrated, (1, 2, 1), 512))


@pytest.mark.parametrize("entry,needle", [
    ({"call_ms": -1, "gbps": 1}, "sampling.call_ms"),
    ({"call_ms": 0.1, "gbps": 0}, "sampling.gbps"),
    ({"call_ms": 0.1}, "sampling.gbps"),
    ([1, 2], "'sampling' must be an object"),
])
def test_bad_sampling_entry_names_the_field(entry, needle):
    with pytest.raises(UserError, match=needle.replace(".", r"\.")):
        _profile(sampling=entry)


def test_fit_recovers_the_call_cost_and_the_rate_of_exact_timings():
    rows = [(3, 2e6), (3, 8e6), (2, 1e6), (1, 4e5), (3, 3e7)]
    records = [{"layouts": n, "work_bytes": b, "time_ms": 0.4 * n + b / 0.25e9 * 1e3} for n, b in rows]
    got = fit_sampling(records)
    assert got["call_ms"] == pytest.approx(0.4, rel=1e-9)
    assert got["gbps"] == pytest.approx(0.25, rel=1e-9)
    assert got["records"] == 5 and got["mape"] == pytest.approx(0.0, abs=1e-9)
    assert fit_sampling(records[:3]) is None  # too few to fit two numbers with some to spare


def test_calibrate_sampling_logs_the_kernel_and_fit_writes_the_entry(run_cli, tmp_path):
    log = tmp_path / "sampling.jsonl"
    graph = "rmat:nodes=1024,edges=8192,features=8,classes=4,seed=5"
    code, out, err = run_cli(["calibrate", "sampling", "--graph", graph, "--gpus", "2", "--batch-sizes", "128,512",
                              "--repeats", "2", "--out", str(log)])
    assert code == 0, err
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 3 * 2  # grids 2x1x1, 1x2x1, 1x1x2 by two batch sizes
    w = Workload("g", records[0]["nodes"], records[0]["nnz"], (8, 64, 64, 4))
    for rec in records:
        assert rec["schema"] == "plexus-tune/sampling-v1" and rec["time_ms"] > 0
        grid = tuple(int(g) for g in rec["grid"].split("x"))
        assert (rec["layouts"], rec["work_bytes"]) == pytest.approx(sampling_work(w, grid, rec["batch_size"]))
    got = fit_sampling(records)
    assert got["call_ms"] >= 0 and got["gbps"] > 0


@pytest.mark.parametrize("args,needle", [
    (["--batch-sizes", "1"], "--batch-sizes"),
    (["--batch-sizes", "5000"], "--batch-sizes"),
    (["--processes", "0"], "--processes"),
    (["--processes", "100000"], "--processes"),  # more processes than the host's cores hold: refused before any start
])
def test_bad_calibrate_sampling_input_is_one_line_and_exit_2(run_cli, tmp_path, args, needle):
    code, _, err = run_cli(["calibrate", "sampling", "--graph", "rmat:nodes=1024,edges=8192,features=8,classes=4,seed=5",
                            "--out", str(tmp_path / "s.jsonl")] + args)
    assert code == 2 and needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s.jsonl").exists()


def test_prefetch_is_in_the_run_identity_and_the_logged_prediction():
    from plexus_tune.measure.identity import RunSpec, predict_record
    from plexus_tune.measure.training import config_fields
    from plexus_tune.trainer import TrainConfig

    w = Workload("g", 4096, 40960, (16, 32, 32, 4))
    common = dict(algorithm="scalegnn-4d", grid=(2, 1, 2), dp=2, batch_size=512, hidden=32, layers=3,
                  synthetic="rmat:nodes=4096,edges=16384,features=16,classes=4,seed=0")
    on, off = (config_fields(TrainConfig(prefetch=p, **common)) for p in (True, False))
    assert on["options"]["prefetch"] is True and off["options"]["prefetch"] is False
    assert RunSpec.from_record(on).identity() != RunSpec.from_record(off).identity()
    old = json.loads(json.dumps(on))
    del old["options"]["prefetch"]  # logged before the switch: those runs prefetched
    assert RunSpec.from_record(old).identity() == RunSpec.from_record(on).identity()
    m = load_machine("perlmutter")
    for record, prefetch in ((on, True), (off, False)):
        want = predict_config(w, m, 2, (2, 1, 2), 512, choice=FP32, prefetch=prefetch)
        assert predict_record(record, m, workload=w)["total_ms"] == pytest.approx(want["total_ms"], rel=1e-12)
    full = config_fields(TrainConfig(algorithm="plexus-3d", grid=(2, 1, 2), hidden=32, layers=3,
                                     synthetic=common["synthetic"]))
    assert full["options"]["prefetch"] is None  # no sampling in a full-graph family


@pytest.mark.parametrize("command,args", [
    ("train", ["--grid", "2x1x1", "--no-prefetch"]),
    ("measure", ["--gpus", "2", "--prefetch", "--log", "never-written.jsonl"]),
])
def test_prefetch_needs_the_minibatch_family(run_cli, command, args):
    code, _, err = run_cli([command, "--graph", "rmat:nodes=512,edges=4096,features=16,classes=4,seed=0"] + args)
    assert code == 2 and "--prefetch" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_fixed_overhead_counts_once_per_step():
    """The profile's epoch_overhead_ms is fitted on full-graph epochs, one training iteration each:
    a mini-batch epoch of ceil(N / (B Gd)) steps pays it per step (a shipped profile, its
    overhead set to 20 ms: a run fit may find none)."""
    import dataclasses

    m = dataclasses.replace(load_machine("emulated-2x4-fitted"), epoch_overhead_ms=20.0)
    w = Workload("t", 8192, 65536, (64, 64, 64, 8))
    for dp, steps in ((1, 4), (2, 2), (4, 1)):
        p = predict_config(w, m, dp, (8 // dp, 1, 1), 2048, choice=FP32, fixed_features=True)
        assert p["steps"] == steps and p["overhead_ms"] == pytest.approx(steps * m.epoch_overhead_ms)
