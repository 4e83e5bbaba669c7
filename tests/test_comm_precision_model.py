"""The cost model's communication precision: wire volume, codec time, predict and auto choice."""

import json
import subprocess
import sys

import numpy as np
import pytest

from plexus_tune.model.comm_precision import codec_bytes, quant_time_ms, wire_bytes, wire_message_bytes
from plexus_tune.errors import UserError
from plexus_tune.model.costs import predict_grids
from plexus_tune.model.grid import enumerate_grids
from plexus_tune.model.machine import Machine, load_machine
from plexus_tune.model.workload import workload_from_dataset as get_workload


def test_continuous_wire_volume_equals_the_exact_bytes_when_blocks_divide():
    for g in (2, 3, 4, 8):
        for rows, cols in ((8 * g, 16), (24 * g, 64)):
            m = 4 * rows * cols
            for p in ("fp32", "bf16", "fp16", "int8", "int4", "int2"):
                for op, factor in (("all_reduce", 2 * (g - 1) / g), ("all_gather", (g - 1) / g),
                                   ("reduce_scatter", (g - 1) / g)):
                    exact = wire_bytes(op, g, m, p, rows).bytes
                    assert factor * wire_message_bytes(m, rows, p) == pytest.approx(exact, rel=1e-12), (g, p, op)


def test_codec_bytes_hand_derived():
    # g = 4, M = 400: all-reduce encodes 3 chunks + its sum = 400, decodes 3 + 4 chunks = 700
    assert [float(v) for v in codec_bytes("all_reduce", 4, 400)] == [400.0, 700.0]
    assert [float(v) for v in codec_bytes("all_gather", 4, 400)] == [100.0, 400.0]
    assert [float(v) for v in codec_bytes("reduce_scatter", 4, 400)] == [300.0, 300.0]
    assert [float(v) for v in codec_bytes("all_reduce", 1, 400)] == [0.0, 0.0]
    quant = {"int8": {"encode_gbps": 1.0, "decode_gbps": 2.0}}
    # 400 B / 1 GB/s + 700 B / 2 GB/s = 750 ns
    assert float(quant_time_ms(quant, "int8", "all_reduce", 4, 400)) == pytest.approx(750e-6)
    assert float(quant_time_ms(quant, "int4", "all_reduce", 4, 400)) == 0.0  # no rate: not counted


def _no_latency(name="perlmutter", quant=None, gpus_per_node=None):
    raw = json.loads(json.dumps(load_machine(name).raw))
    raw["collectives"]["alpha_intra_us"] = raw["collectives"]["alpha_inter_us"] = 0
    if quant:
        raw["quant"] = quant
    if gpus_per_node:  # every group inside one node, at the tiers' beta (no measured table)
        raw["gpus_per_node"] = gpus_per_node
        raw["collectives"].pop("bandwidth_table", None)
    return Machine.from_dict(raw, source="test")


def test_bandwidth_bound_comm_scales_with_bits():
    """Without latency a collective inside a node is M'/beta: bf16 exactly half of FP32 (the
    all-to-all and all-gather of the scheme move what the ring moves), apart from the
    loss's reductions, FP32 at every precision; int2 1/16 plus 8 bytes a row."""
    from plexus_tune.model.grid import axis_stride
    from plexus_tune.model.machine import collective_time_ms
    from plexus_tune.model.shapes import layer_shapes

    w = get_workload("ogbn-products")
    grids = enumerate_grids(64)
    machine = _no_latency(gpus_per_node=64)
    fp32 = predict_grids(w, machine, grids)
    bf16 = predict_grids(w, machine, grids, comm_precision="bf16")
    last = layer_shapes(w.nodes, w.widths, grids, nnz=w.nnz)[-1]
    o, d = last.outer, last.depth
    loss = sum(collective_time_ms(machine, "all_reduce", grids[:, a], axis_stride(a, grids), m)
               for a, m in ((o, 4.0 * last.r_d), (o, 8.0 * last.r_d), (d, 4.0)))
    np.testing.assert_allclose(bf16["comm_ms"] - loss, (fp32["comm_ms"] - loss) / 2, rtol=1e-12)
    # no measured bf16 rates: the cast's estimated passes, 1.5 each way, at the memory bandwidth
    assert (bf16["quant_ms"] > 0).all() and bf16["quant_estimated"].all()
    # only the aggregation class at int2: its all-reduces shrink to 1/16 + 8 bytes per row of H
    only = predict_grids(w, machine, grids, comm_precision="aggregation=int2")
    split = predict_grids(w, machine, grids, comm_precision="aggregation=fp32")
    assert (only["comm_ms"] < split["comm_ms"]).all()
    assert np.array_equal(split["comm_ms"], fp32["comm_ms"])


def test_int2_aggregation_hand_derived_on_one_grid():
    """Grid 1x2x1 of a one-layer model: layer 0 is (outer X, inner Y, depth Z), so only
    Q = H W is all-reduced (combination class, over Y)."""
    from plexus_tune.model.workload import Workload

    w = Workload(name="t", nodes=1000, nnz=10_000, widths=(64, 16))
    machine = _no_latency("cpu-gloo-2core")
    grid = np.array([[1, 2, 1]])
    fp32 = predict_grids(w, machine, grid)["comm_ms"][0]
    int2 = predict_grids(w, machine, grid, comm_precision="int2")["comm_ms"][0]
    # the contraction (64 columns) is split over inner, so each rank holds a partial Q of
    # 1000 x 16 (16 output columns over outer = 1): M = 64000 bytes,
    # M' = 64000 * 2/32 + 8 * 1000 = 12000
    assert int2 / fp32 == pytest.approx(12000 / 64000, rel=1e-12)


def test_predict_cli_bf16_halves_bandwidth_bound_comm_and_auto_names_its_pick():
    def run(*extra):
        out = subprocess.run([sys.executable, "-m", "plexus_tune", "predict", "--dataset", "ogbn-products", "--gpus", "64",
                              "--machine", "perlmutter", "--format", "json", "--top", "0", *extra],
                             capture_output=True, text=True, check=True)
        return {r["grid"]: r for r in json.loads(out.stdout)}

    fp32, bf16 = run(), run("--comm-precision", "bf16")
    ratio = [bf16[g]["comm_ms"] / fp32[g]["comm_ms"] for g in fp32]
    # latency (alpha, unchanged) keeps the ratio above 1/2, and so does the all-to-all half of the
    # 16-bit scheme on groups across nodes (the node's ranks share its link: on a group of 64 over
    # 16 nodes it moves more than the FP32 ring); most grids still gain
    assert 0.5 <= min(ratio) and np.median(ratio) < 0.75 and max(ratio) > 1.0
    text = subprocess.run([sys.executable, "-m", "plexus_tune", "predict", "--dataset", "ogbn-products", "--gpus", "64",
                           "--machine", "perlmutter", "--comm-precision", "auto", "--allow-precisions", "fp32,bf16"],
                          capture_output=True, text=True, check=True).stdout
    assert "Picked precision: bf16" in text and "ScaleGNN (section V-B)" in text
    bad = subprocess.run([sys.executable, "-m", "plexus_tune", "predict", "--dataset", "ogbn-products", "--gpus", "64",
                          "--machine", "perlmutter", "--comm-precision", "auto", "--allow-precisions", "fp32,int3"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--allow-precisions" in bad.stderr


def test_quant_rates_fit_hand_derived_and_calibrate_cli(tmp_path):
    from plexus_tune.fit.quant import fit_quant_rates

    recs = [{"precision": "int8", "fp32_bytes": 1e6, "encode_ms": 1.0, "decode_ms": 0.1},
            {"precision": "int8", "fp32_bytes": 2e6, "encode_ms": 2.5, "decode_ms": 0.2},
            # one slow timing of the largest tensor (40x): a least-squares fit would take its rate
            {"precision": "int8", "fp32_bytes": 8e6, "encode_ms": 400.0, "decode_ms": 0.9}]
    # per record b / t: encode 1.0, 0.8 and 0.02 GB/s, decode 10, 10 and 8.9 GB/s; the medians
    got = fit_quant_rates(recs)["int8"]
    assert got["encode_gbps"] == pytest.approx(0.8) and got["samples"] == 3
    assert got["decode_gbps"] == pytest.approx(10.0)
    log = tmp_path / "q.jsonl"
    out = subprocess.run([sys.executable, "-m", "plexus_tune", "calibrate", "quant", "--out", str(log), "--rows", "64",
                          "--cols", "8", "--repeats", "1", "--precisions", "bf16,int2"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    from plexus_tune.measure.store import read_records

    records = read_records(log, schema="quant")[0]
    assert [r["precision"] for r in records] == ["bf16", "int2"] and all(r["encode_ms"] > 0 for r in records)
    bad = subprocess.run([sys.executable, "-m", "plexus_tune", "calibrate", "quant", "--out", str(log),
                          "--precisions", "int3"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_quant_rates_take_the_most_concurrent_records():
    """Records timed by 8 processes at once set the rates; the single-process ones of the same
    precision are left out, those of another precision kept (hand-derived medians)."""
    from plexus_tune.fit.quant import fit_quant_rates

    recs = [{"precision": "bf16", "fp32_bytes": 1e6, "encode_ms": 0.1, "decode_ms": 0.1},  # 10 GB/s alone
            {"precision": "bf16", "fp32_bytes": 1e6, "encode_ms": 0.5, "decode_ms": 0.4, "processes": 8},
            {"precision": "bf16", "fp32_bytes": 4e6, "encode_ms": 1.6, "decode_ms": 2.0, "processes": 8},
            {"precision": "bf16", "fp32_bytes": 4e6, "encode_ms": 4.0, "decode_ms": 1.0, "processes": 8},
            {"precision": "int8", "fp32_bytes": 1e6, "encode_ms": 1.0, "decode_ms": 0.5}]
    got = fit_quant_rates(recs)
    # encode 2, 2.5, 1 GB/s -> 2; decode 2.5, 2, 4 GB/s -> 2.5
    assert got["bf16"] == {"encode_gbps": pytest.approx(2.0), "decode_gbps": pytest.approx(2.5), "samples": 3,
                           "processes": 8}
    assert got["int8"] == {"encode_gbps": pytest.approx(1.0), "decode_gbps": pytest.approx(2.0), "samples": 1}


@pytest.mark.slow
def test_calibrate_quant_processes_logs_concurrent_records(tmp_path):
    log = tmp_path / "q.jsonl"
    out = subprocess.run([sys.executable, "-m", "plexus_tune", "calibrate", "quant", "--out", str(log), "--rows", "64",
                          "--cols", "8", "--repeats", "1", "--precisions", "bf16", "--processes", "2"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    from plexus_tune.measure.store import read_records

    records = read_records(log, schema="quant")[0]
    assert len(records) == 1 and records[0]["processes"] == 2 and records[0]["encode_ms"] > 0
    bad = subprocess.run([sys.executable, "-m", "plexus_tune", "calibrate", "quant", "--out", str(log),
                          "--processes", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--processes" in bad.stderr
    assert len(read_records(log, schema="quant")[0]) == 1  # nothing logged is lost


def test_search_auto_names_the_precision_it_picked(tmp_path):
    out = subprocess.run([sys.executable, "-m", "plexus_tune", "search", "--dataset", "ogbn-products", "--gpus", "64",
                          "--trials", "6", "--comm-precision", "auto", "--allow-precisions", "fp32,bf16",
                          "--storage", f"sqlite:///{tmp_path / 's.db'}", "--top", "1"],
                         capture_output=True, text=True, env={**__import__("os").environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "Picked precision: bf16" in out.stdout and "ScaleGNN (section V-B)" in out.stdout


def test_per_call_term_of_quant_time_hand_derived():
    from plexus_tune.model.comm_precision import call_overhead_ms, process_group_calls

    assert [process_group_calls("all_reduce", p) for p in ("fp32", "bf16", "int2")] == [1, 2, 2]
    assert [process_group_calls(op, "int8") for op in ("all_gather", "reduce_scatter")] == [1, 1]
    quant = {"int8": {"encode_gbps": 1.0, "decode_gbps": 2.0, "call_ms": 0.5}}
    # all-reduce, g = 4, M = 400 B: codec 400 / 1e9 + 700 / 2e9 s = 750e-6 ms (quant);
    # 3 blocks of 2 calls at 0.5 ms = 3 ms (communication, where the trainer times it)
    assert float(quant_time_ms(quant, "int8", "all_reduce", 4, 400, 3)) == pytest.approx(750e-6)
    assert float(call_overhead_ms(quant, "int8", "all_reduce", 4, 3)) == pytest.approx(3.0)
    # all-gather: 100 B encoded, 400 B decoded; one call
    assert float(quant_time_ms(quant, "int8", "all_gather", 4, 400)) == pytest.approx(300e-9 * 1e3)
    assert float(call_overhead_ms(quant, "int8", "all_gather", 4)) == pytest.approx(0.5)
    assert float(quant_time_ms(quant, "int8", "all_reduce", 1, 400, 3)) == 0.0  # a group of one sends nothing
    assert float(call_overhead_ms(quant, "int8", "all_reduce", 1, 3)) == 0.0
    with pytest.raises(UserError, match="call_ms"):
        quant_time_ms({"int8": {**quant["int8"], "call_ms": -1}}, "int8", "all_reduce", 4, 400)


def _collective_rows(machine, quant, call_ms, stamp, fp32_offset_ms=0.0, offset_ms=0.0, call_inter_ms=None):
    """Collective timings made by the model itself: FP32 at net(M) (+ an offset), int2 at
    net_int2(M) (the scheme's all-to-all and all-gather of M') + codec + calls x call_ms, for two shapes, three ops and three sizes; every
    timing ``offset_ms`` slower (a slower day)."""
    from plexus_tune.model.comm_precision import process_group_calls
    from plexus_tune.model.machine import collective_time_ms, precision_collective_time_ms

    rows = []
    for g, p in ((2, 1), (2, 4)):
        for op in ("all_reduce", "all_gather", "reduce_scatter"):
            for m in (65536, 262144, 1048576):
                r = m // (4 * 64)
                base = {"op": op, "group_size": g, "stride": p, "message_bytes": m, "alone": False, "measured_at": stamp}
                rows.append({**base, "comm_precision": "fp32",
                             "time_ms": float(collective_time_ms(machine, op, g, p, m)) + fp32_offset_ms + offset_ms})
                t = (float(precision_collective_time_ms(machine, op, g, p, m, r, "int2"))
                     + float(quant_time_ms(quant, "int2", op, g, m)) + offset_ms
                     + process_group_calls(op, "int2") * (call_ms if p == 1 or call_inter_ms is None else call_inter_ms))
                rows.append({**base, "comm_precision": "int2", "rows": r, "cols": 64, "time_ms": t, "quant_ms": 0.1})
    return rows


def test_fit_call_ms_recovers_the_per_call_time_pairing_within_one_run():
    import pandas as pd

    from plexus_tune.fit.quant import fit_call_ms
    from plexus_tune.model.machine import load_machine

    machine = load_machine("models/emulated-2x4-fitted.json")
    quant = {"int2": {"encode_gbps": 1.5, "decode_gbps": 5.0}}
    df = pd.DataFrame(_collective_rows(machine, quant, 2.5, "2026-01-01T00:00:00+00:00"))
    got, report = fit_call_ms(df, machine, quant)
    assert got["int2"]["call_ms"] == pytest.approx(2.5, abs=1e-9) and report["int2"]["pairs"] == 18
    assert got["int2"]["encode_gbps"] == 1.5  # the rates are kept
    # a second run on a day when every call took 40 ms longer: paired within each run, the same
    # 2.5 ms; paired with the other run's FP32 timings, it would be 20 or 40 ms per call
    slow = pd.DataFrame(_collective_rows(machine, quant, 2.5, "2026-01-02T00:00:00+00:00", offset_ms=40.0))
    both, report = fit_call_ms(pd.concat([df, slow]), machine, quant)
    assert both["int2"]["call_ms"] == pytest.approx(2.5, abs=1e-9) and report["int2"]["pairs"] == 36
    # a scheme faster than the model says is clipped at 0, not negative
    fast = pd.DataFrame(_collective_rows(machine, quant, 0.0, "2026-01-03T00:00:00+00:00", fp32_offset_ms=40.0))
    got, report = fit_call_ms(fast, machine, quant)
    assert got["int2"]["call_ms"] == 0.0 and report["int2"]["intra_median_ms"] < -10


def test_fit_call_ms_fits_groups_inside_a_node_and_across_nodes_apart():
    """Timings made with 2.5 ms per call in the groups of one node (g = 2, stride 1) and 0.5 ms in
    the groups spanning the 2 x 4 cluster's nodes (stride 4): each placement gets its own, and
    predict adds each where it belongs (2 calls of an all-reduce)."""
    import pandas as pd

    from plexus_tune.fit.quant import fit_call_ms
    from plexus_tune.model.comm_precision import call_overhead_ms
    from plexus_tune.model.machine import load_machine

    machine = load_machine("models/emulated-2x4-fitted.json")
    quant = {"int2": {"encode_gbps": 1.5, "decode_gbps": 5.0}}
    df = pd.DataFrame(_collective_rows(machine, quant, 2.5, "2026-01-01T00:00:00+00:00", call_inter_ms=0.5))
    got, report = fit_call_ms(df, machine, quant)
    assert got["int2"]["call_ms"] == pytest.approx(2.5, abs=1e-9)
    assert got["int2"]["call_inter_ms"] == pytest.approx(0.5, abs=1e-9)
    assert report["int2"]["intra_pairs"] == report["int2"]["inter_pairs"] == 9
    assert call_overhead_ms(got, "int2", "all_reduce", 2, 1, True) == pytest.approx(5.0)
    assert call_overhead_ms(got, "int2", "all_reduce", 2, 1, False) == pytest.approx(1.0)
    # a profile without call_inter_ms charges call_ms everywhere
    assert call_overhead_ms({"int2": {**quant["int2"], "call_ms": 2.5}}, "int2", "all_gather", 2, 3, False) == pytest.approx(7.5)
    # without codec rates, the rates come from the records' local times: codec bytes / 0.1 ms
    alone, _ = fit_call_ms(df, machine, None)
    assert alone["int2"]["rates_from"].startswith("local steps") and alone["int2"]["encode_gbps"] > 0
    # FP32 rows only: nothing to fit; the network fit of fit_profile sees only FP32 rows
    from plexus_tune.fit.quant import split_precisions

    fp32, reduced = split_precisions(df)
    assert set(fp32.comm_precision) == {"fp32"} and set(reduced.comm_precision) == {"int2"}
    assert fit_call_ms(fp32, machine, quant) == ({"int2": quant["int2"]}, {})


@pytest.mark.slow
def test_calibrate_collectives_times_the_reduced_precision_scheme(tmp_path):
    from plexus_tune.model.comm_precision import wire_bytes
    from plexus_tune.measure.store import read_records

    log = tmp_path / "c.jsonl"
    out = subprocess.run([sys.executable, "-m", "plexus_tune", "calibrate", "collectives", "--gpus", "2", "--sizes", "16K,64K",
                          "--comm-precision", "fp32,int2,bf16", "--repeats", "2", "--warmup", "1", "--cols", "32",
                          "--out", str(log)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    records = read_records(log, schema="collective")[0]
    # the three collectives at every precision, broadcast and point-to-point (sent as they are) at fp32, x 2 sizes
    assert len(records) == (3 * 3 + 2) * 2
    assert {r["op"] for r in records if r["comm_precision"] != "fp32"} == {"all_gather", "reduce_scatter", "all_reduce"}
    for rec in records:
        precision = rec["comm_precision"]
        if precision == "fp32":
            assert rec.get("wire_bytes") is None
            continue
        assert rec["cols"] == 32 and rec["rows"] * rec["cols"] * 4 == rec["message_bytes"]
        # bytes the trainer's scheme handed to the process group, against the formula of the model
        assert rec["wire_bytes"] == wire_bytes(rec["op"], 2, rec["message_bytes"], precision, rec["rows"]).bytes
        assert 0 < rec["quant_ms"] < rec["time_ms"] + 1e-9
    bad = subprocess.run([sys.executable, "-m", "plexus_tune", "calibrate", "collectives", "--gpus", "2",
                          "--comm-precision", "fp32,int3", "--out", str(tmp_path / "new.jsonl")], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--comm-precision" in bad.stderr
    assert not (tmp_path / "new.jsonl").exists()


def _two_tier_machine(**extra):
    """4 ranks a node; collectives alpha 5/50 us, beta 20/2 GB/s (intra/inter); the exchange's
    own tiers alpha 10/20 us, beta 10/1 GB/s."""
    return Machine.from_dict({
        "name": "two-tier", "gpus_per_node": 4, "device_memory_gib": 16, "gemm_tflops": 1.0,
        "spmm": {"kind": "paper", "c0": 1e-3, "c1": 0.0, "c2": 0.0},
        "collectives": {"alpha_intra_us": 5.0, "beta_intra_gbps": 20.0, "alpha_inter_us": 50.0, "beta_inter_gbps": 2.0,
                        "op_tiers": {"point_to_point": {"alpha_intra_us": 10.0, "beta_intra_gbps": 10.0,
                                                        "alpha_inter_us": 20.0, "beta_inter_gbps": 1.0}}},
        **extra}, source="test")


def test_reduced_precision_collectives_are_timed_as_the_trainers_all_to_all_scheme():
    """bf16 all-reduce of M = 8 MB (1000 rows) on 8 ranks over 2 nodes of 4 (stride 1): M' = 4 MB.
    All-to-all (the exchange's tiers): 3 intra messages of M'/8 = 0.5 MB, 10 us + 0.5 MB / 10 GB/s
    each -> 0.18 ms; 4 crossing, 20 us each, their 2 MB times the 4 senders of the node over 1 GB/s
    -> 0.08 + 8 ms. All-gather of M' (ring across nodes): 7 x 50 us + 7/8 4 MB / 2 GB/s = 2.1 ms."""
    from plexus_tune.model.machine import collective_time_ms, precision_collective_time_ms

    m = _two_tier_machine()
    t = lambda op, g, p="bf16": float(precision_collective_time_ms(m, op, g, 1, 8e6, 1000, p))  # noqa: E731
    assert t("reduce_scatter", 8) == pytest.approx(0.03 + 0.15 + 0.08 + 8.0, rel=1e-12)
    assert t("all_gather", 8) == pytest.approx(0.35 + 1.75, rel=1e-12)
    assert t("all_reduce", 8) == pytest.approx(8.26 + 2.10, rel=1e-12)
    # FP32 is the backend's ring: 14 x 50 us + 2 x 7/8 x 8 MB / 2 GB/s; bf16 saves nothing here
    assert t("all_reduce", 8, "fp32") == pytest.approx(0.7 + 7.0, rel=1e-12)
    assert t("all_reduce", 8, "fp32") == float(collective_time_ms(m, "all_reduce", 8, 1, 8e6))
    # inside a node (4 ranks): all-to-all 3 x 10 us + 3 MB / 10 GB/s, all-gather 3 x 5 us + 3 MB / 20 GB/s
    assert t("all_reduce", 4) == pytest.approx(0.03 + 0.3 + 0.015 + 0.15, rel=1e-12)
    # int8 sends 1 byte a value plus 8 bytes a row: M' = 2 MB + 8000 B
    wire = 2e6 + 8000
    assert t("reduce_scatter", 8, "int8") == pytest.approx(0.03 + 3 * wire / 8 / 1e10 * 1e3 + 0.08
                                                           + 4 * wire / 8 * 4 / 1e9 * 1e3, rel=1e-12)


def test_family_schedules_time_reduced_collectives_in_the_same_scheme():
    """Three bf16 all-reduces of 8 MB on 8 ranks over 2 nodes (previous test): 3 x 10.36 ms, on axis X."""
    from plexus_tune.model.comm_precision import parse_comm_precision
    from plexus_tune.model.family_costs import schedule_times
    from plexus_tune.model.volumes import CommCall

    call = CommCall(name="layer 0 forward", op="all_reduce", comm_class="aggregation", direction="forward", axis=0,
                    group_size=8, stride=1, message_bytes=8e6, rows=1000, calls=3, sent_bytes=np.zeros(8))
    out = schedule_times(_two_tier_machine(), [call], parse_comm_precision("bf16"), 4.0)
    assert out["all_reduce_ms"] == pytest.approx(3 * 10.36, rel=1e-12)
    assert out["comm_ms"] == out["comm_x_ms"] == out["all_reduce_ms"] and out["quant_ms"] == 0.0  # no codec rates
    fp32 = schedule_times(_two_tier_machine(), [call], parse_comm_precision("fp32"), 4.0)
    assert fp32["all_reduce_ms"] == pytest.approx(3 * 7.7, rel=1e-12)


def test_the_estimated_codec_runs_at_the_elementwise_rate():
    """No measured codec: bf16 casts 1.5 passes each way at elementwise_gbps = 3 GB/s (not at
    the 30 GB/s memory bandwidth): 2 GB/s of FP32 data. One bf16 all-gather of M = 400 MB on 4
    ranks encodes its block, 100 MB, and decodes all four, 400 MB: 500 MB / 2 GB/s = 250 ms."""
    from plexus_tune.model.comm_precision import parse_comm_precision
    from plexus_tune.model.family_costs import schedule_times
    from plexus_tune.model.volumes import CommCall

    both = _two_tier_machine(elementwise_gbps=3.0, memory_bandwidth_gbps=30.0)
    assert both.quant["bf16"]["encode_gbps"] == pytest.approx(2.0) and "bf16" in both.quant_estimated
    assert _two_tier_machine(memory_bandwidth_gbps=30.0).quant["bf16"]["decode_gbps"] == pytest.approx(20.0)
    assert float(quant_time_ms(both.quant, "bf16", "all_gather", 4, 400e6)) == pytest.approx(250.0, rel=1e-12)
    call = CommCall(name="layer 0 forward", op="all_gather", comm_class="gather", direction="forward", axis=2,
                    group_size=4, stride=1, message_bytes=400e6, rows=1000, calls=1, sent_bytes=np.zeros(4))
    out = schedule_times(both, [call], parse_comm_precision("bf16"), 4.0)
    assert out["quant_ms"] == pytest.approx(250.0, rel=1e-12)
    # and the wire: an all-gather of 200 MB inside the node, 3 x 5 us + 3/4 200 MB / 20 GB/s
    assert out["all_gather_ms"] == pytest.approx(0.015 + 7.5, rel=1e-12)


def test_family_codec_counts_every_call_and_no_call_time_for_broadcasts_and_exchanges():
    """Codec rates 2 GB/s each way (elementwise 3 GB/s / 1.5 passes) and call_ms 5 ms.
    Four bf16 broadcasts of 400 MB on 4 ranks: per call a rank encodes 100 MB as root or decodes
    300 MB, 400 MB / 2 GB/s = 200 ms; 4 calls -> 800 ms, no call time (a bf16 broadcast makes
    the FP32 broadcast's calls). Three bf16 all-gathers of 400 MB: 3 x 250 ms codec, and
    3 x 5 ms call time in the communication beside their wire time.
    An exchange of 100 rows of 4,000 B from each of 4 ranks to each other: the busiest rank
    encodes 300 rows and decodes 300 rows, 2.4 MB / 2 GB/s = 1.2 ms, no call time."""
    from plexus_tune.model.comm_precision import parse_comm_precision
    from plexus_tune.model.family_costs import schedule_times
    from plexus_tune.model.machine import precision_wire_time_ms
    from plexus_tune.model.volumes import CommCall, UniformExchange

    machine = _two_tier_machine(elementwise_gbps=3.0, quant={"bf16": {"encode_gbps": 2.0, "decode_gbps": 2.0,
                                                                      "call_ms": 5.0}})
    bf16 = parse_comm_precision("bf16")
    common = dict(comm_class="aggregation", direction="forward", axis=0, group_size=4, stride=1, message_bytes=400e6,
                  rows=1000, sent_bytes=np.zeros(4))
    broadcast = CommCall(name="layer 0 broadcast", op="broadcast", calls=4, **common)
    assert schedule_times(machine, [broadcast], bf16, 4.0)["quant_ms"] == pytest.approx(800.0, rel=1e-12)
    gather = CommCall(name="layer 0 all-gather", op="all_gather", calls=3, **common)
    gathered = schedule_times(machine, [gather], bf16, 4.0)
    assert gathered["quant_ms"] == pytest.approx(3 * 250.0, rel=1e-12)  # the codec; the call time is comm
    assert gathered["comm_ms"] - 3 * float(precision_wire_time_ms(machine, "all_gather", 4, 1, 400e6, 1000, "bf16")) \
        == pytest.approx(3 * 5.0, rel=1e-9)
    exchange = CommCall(name="layer 0 exchange", op="point_to_point", calls=1, pair_rows=UniformExchange(4, 100.0),
                        row_bytes=4000.0, **{**common, "message_bytes": 0.0})
    assert schedule_times(machine, [exchange], bf16, 4.0)["quant_ms"] == pytest.approx(1.2, rel=1e-12)
