"""The SpMM floor (docs/model.md, SpMM floor) and predicted parts that add up to the total."""

import csv
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest

from plexus_tune.errors import UserError
from plexus_tune.model.costs import predict_grids, rank_order
from plexus_tune.model.machine import Machine, load_machine
from plexus_tune.model.spmm import spmm_traffic_bytes
from plexus_tune.model.workload import Workload, list_datasets, workload_from_dataset

CPU_2026_11_23 = (Path(__file__).resolve().parents[1] / "measurements" / "cpu-gloo-2026-11-23" / "profiles"
                  / "cpu-gloo-2core-fitted-2026-11-23.json")


def machine(**over):
    data = {
        "name": "toy", "gpus_per_node": 4, "device_memory_gib": 16, "gemm_tflops": 1.0,
        "memory_bandwidth_gbps": 1.0,
        "spmm": {"kind": "paper", "c0": 0.0, "c1": 0.0, "c2": 0.0},
        "collectives": {"alpha_intra_us": 10, "beta_intra_gbps": 100, "alpha_inter_us": 20, "beta_inter_gbps": 40},
    }
    data.update(over)
    return Machine.from_dict(data)


def test_floor_of_one_shard_by_hand():
    # one layer, widths (16, 8), N = 1000, NNZ = 10000, grid 2x1x1: outer X = 2, inner Y = 1, depth Z = 1
    # forward A F: nnz z = 10000 / 2 = 5000, rows r_d = 1000, common r_o = 500, k = c_i = 16, u = ib = 4
    fwd = 5000 * 8 + 1001 * 4 + 4 * 16 * 500 * (1 - math.exp(-5000 / 500)) + 4 * 16 * 1000
    # backward A^T dH: rows 500, common 1000
    bwd = 5000 * 8 + 501 * 4 + 4 * 16 * 1000 * (1 - math.exp(-5000 / 1000)) + 4 * 16 * 500
    w = Workload("hand", nodes=1000, nnz=10000, widths=(16, 8))
    pred = predict_grids(w, machine(), [[2, 1, 1]])
    expected_ms = (fwd + bwd) / 1e9 * 1e3  # 1 GB/s
    assert pred["spmm_floor_ms"][0] == pytest.approx(expected_ms, rel=1e-12)
    assert pred["spmm_ms"][0] == pytest.approx(expected_ms, rel=1e-12)  # the model predicts 0: floored
    assert bool(pred["spmm_floored"][0])
    assert spmm_traffic_bytes(5000, 1000, 500, 16, 4, 4) == pytest.approx(fwd, rel=1e-12)


def test_blocked_floor_counts_row_pointers_and_columns_per_block():
    # 4 blocks of 250 rows, 1250 nonzeros each: 4 extra row pointers and 4 x the columns one block touches
    blocked = spmm_traffic_bytes(5000, 1000, 500, 16, 4, 4, blocks=4)
    expected = 5000 * 8 + (1000 + 4) * 4 + 4 * 16 * 4 * 500 * (1 - math.exp(-1250 / 500)) + 4 * 16 * 1000
    assert blocked == pytest.approx(expected, rel=1e-12)


def test_floor_only_raises_and_is_absent_without_bandwidth():
    w = workload_from_dataset("ogbn-products")
    fast = machine(spmm={"kind": "paper", "c0": 1.0, "c1": 0.0, "c2": 0.0})
    pred = predict_grids(w, fast, 64)
    # c0 sqrt(F) with c0 = 1 ms: about 1e6 ms per epoch, far above the traffic at 1 GB/s (a few seconds)
    assert not pred["spmm_floored"].any() and (pred["spmm_ms"] > pred["spmm_floor_ms"]).all()
    data = {k: v for k, v in machine().raw.items() if k != "memory_bandwidth_gbps"}
    none = predict_grids(w, Machine.from_dict(data), 64)
    assert (none["spmm_floor_ms"] == 0).all() and not none["spmm_floored"].any() and (none["spmm_ms"] == 0).all()
    with pytest.raises(UserError, match="memory_bandwidth_gbps"):
        machine(memory_bandwidth_gbps=0)


def test_every_shipped_profile_has_a_bandwidth_with_provenance():
    from plexus_tune.model.machine import list_machines

    for entry in list_machines():
        m = load_machine(entry["name"])
        assert m.memory_bandwidth_gbps and m.memory_bandwidth_gbps > 0, m.name
        assert m.raw["provenance"].get("memory_bandwidth_gbps"), m.name


def test_papers100m_frontier_ranks_floored_grids_only_on_their_floored_total():
    w = workload_from_dataset("ogbn-papers100M")
    pred = predict_grids(w, "frontier", 1024)
    floored = pred["spmm_floored"]
    assert floored.sum() == 6  # the 6 grids whose paper-form SpMM is negative
    assert (floored == pred["spmm_clipped"]).all()
    assert (pred["spmm_ms"][floored] >= pred["spmm_floor_ms"][floored]).all()
    assert (pred["spmm_ms"][floored] > 0).all()
    order = rank_order(pred)
    feasible = pred["feasible"][order]
    total = pred["total_ms"][order]
    flags = floored[order]
    for i in range(len(order)):
        for j in range(i + 1, len(order)):
            if flags[i] and not flags[j] and feasible[i] == feasible[j]:
                assert total[i] <= total[j]  # ranked above only with a genuinely lower (floored) total


@pytest.mark.parametrize("name", ["perlmutter", "frontier", str(CPU_2026_11_23)])
def test_predicted_parts_add_up_to_the_total(name):
    pred = predict_grids(workload_from_dataset("reddit"), name, 48)
    parts = pred["spmm_ms"] + pred["gemm_ms"] + pred["comm_ms"] + pred["other_ms"] + pred["overhead_ms"]
    np.testing.assert_allclose(parts, pred["total_ms"], rtol=1e-12)


ARGS = ["predict", "--dataset", "ogbn-papers100M", "--gpus", "1024", "--machine", "frontier"]


def test_predict_marks_floored_grids_in_every_format(run_cli):
    code, out, err = run_cli(ARGS + ["--format", "json", "--top", "0"])
    assert code == 0, err
    records = json.loads(out)
    assert sum(r["spmm_floored"] for r in records) == 6
    assert "6 of 66 grids floored" in err
    code, out, err = run_cli(ARGS + ["--format", "csv", "--top", "0"])
    rows = list(csv.DictReader(io.StringIO(out)))
    assert sum(r["spmm_floored"] == "True" for r in rows) == 6 and "spmm_floor_ms" in rows[0]
    code, out, err = run_cli(ARGS + ["--top", "0"])
    body = [ln for ln in out.splitlines() if ln.startswith("│")]
    marked = [ln for ln in body if "* │" in ln]
    assert len(marked) == 6
    assert "6 of 66 grids floored" in err


def test_predict_table_shows_overhead_and_parts_add_up(run_cli):
    code, out, err = run_cli(["predict", "--dataset", "reddit", "--gpus", "8", "--machine",
                              str(CPU_2026_11_23), "--top", "0"])
    assert code == 0, err
    header = next(ln for ln in out.splitlines() if "total ms" in ln)
    cells = [c.strip() for c in header.strip("┃").split("┃")]
    body = [ln for ln in out.splitlines() if ln.startswith("│")]
    assert "overhead" in cells and len(body) == 10
    idx = {name: cells.index(name) for name in ("total ms", "SpMM", "GEMM", "comm", "other", "overhead")}

    def number(text):
        return float(text.rstrip("*").replace(",", ""))

    for line in body:
        row = [c.strip() for c in line.strip("│").split("│")]
        parts = sum(number(row[idx[k]]) for k in ("SpMM", "GEMM", "comm", "other", "overhead"))
        assert parts == pytest.approx(number(row[idx["total ms"]]), rel=0.01, abs=0.05)
        assert number(row[idx["overhead"]]) == pytest.approx(49.80, abs=0.01)
    code, out, _ = run_cli(["predict", "--dataset", "reddit", "--gpus", "8", "--machine",
                            str(CPU_2026_11_23), "--top", "0", "--format", "json"])
    for r in json.loads(out):
        assert r["spmm_ms"] + r["gemm_ms"] + r["comm_ms"] + r["other_ms"] + r["overhead_ms"] == pytest.approx(r["total_ms"], rel=1e-12)


def test_catalog_is_floored_only_where_the_model_predicts_less():
    for info in list_datasets():
        pred = predict_grids(workload_from_dataset(info.name), "perlmutter", 64)
        raw_below = pred["spmm_floored"]
        assert (pred["spmm_ms"][~raw_below] >= pred["spmm_floor_ms"][~raw_below]).all()
