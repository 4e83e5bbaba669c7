"""The floor report: compulsory work by hand, parts that add up to the epoch, the runner at a tiny size."""

from pathlib import Path

import pytest

from plexus_tune.measure.floor import FLOOR_PARTS, floor_table, floor_work, measured_parts
from plexus_tune.model.shapes import layer_shapes

ROOT = Path(__file__).resolve().parents[1]


def bench():
    from plexus_tune.measure import efficiency

    return efficiency


def test_floor_work_by_hand_one_rank():
    # N = 10, widths 4 -> 6 -> 3 on 1x1x1: r_d = r_o = 10; z = 30 nonzeros per layer
    shapes = layer_shapes(10, (4, 6, 3), (1, 1, 1))
    work = floor_work(shapes, [30, 30], classes_local=3)
    u, ib = 4, 4
    # traffic(z, rows, common, k) = z (u + ib) + (rows + 1) ib + u k common (1 - exp(-z / common)) + u k rows
    import math

    def traffic(k):
        return 30 * (u + ib) + 11 * ib + u * k * 10 * (1 - math.exp(-3.0)) + u * k * 10

    assert work["spmm"]["bytes"] == pytest.approx(2 * traffic(4) + 2 * traffic(6))
    assert work["gemm"]["flops"] == 6 * 10 * (4 * 6 + 6 * 3)
    assert work["gemm"]["bytes"] == u * 10 * (3 * 4 + 3 * 6 + 3 * 6 + 3 * 3)
    assert work["optimizer"]["bytes"] == u * 7 * (10 * 4 + 4 * 6 + 6 + 6 * 3 + 3)
    assert work["elementwise"]["bytes"] == u * 10 * (6 * 6 + 1 * 3)
    assert work["loss"]["bytes"] == u * 10 * 3 * 6
    assert work["comm"]["bytes"] == 0 and work["sync"]["bytes"] == 0


def test_ceilings_are_measured():
    from plexus_tune.measure.floor import measure_ceilings

    c = measure_ceilings("cpu", copy_elements=1 << 16, gemm_size=64, gather_rows=1 << 12, min_time_s=0.01)
    assert c["copy_gbps"] > 0 and c["gemm_gflops"] > 0 and c["gather_gbps"] > 0


def test_parts_add_up_and_ratios():
    rows = [{"epoch_ms": 10.0, "spmm_ms": 4.0, "gemm_ms": 2.0, "comm_ms": 1.0, "quant_ms": 0.5, "other_ms": 2.5,
             "loss_ms": 0.5, "optimizer_ms": 1.0, "elementwise_ms": 0.75}] * 3
    parts = measured_parts(rows)
    assert sum(parts[p] for p in FLOOR_PARTS) == pytest.approx(parts["epoch"])
    assert parts["comm"] == 1.5 and parts["sync"] == pytest.approx(0.25)
    work = {p: {"bytes": 1e9 if p != "sync" else 0.0, "flops": 0.0} for p in FLOOR_PARTS}
    work["gemm"] = {"bytes": 1e9, "flops": 4e12}
    table = {r["part"]: r for r in floor_table(parts, work, {"copy_gbps": 1000.0, "gemm_gflops": 2000.0})}
    assert table["spmm"]["floor_ms"] == pytest.approx(1.0) and table["spmm"]["ratio"] == pytest.approx(4.0)
    assert table["gemm"]["floor_ms"] == pytest.approx(2000.0) and table["gemm"]["basis"] == "flops"
    assert table["sync"]["floor_ms"] == 0 and table["sync"]["ratio"] != table["sync"]["ratio"]  # nan


def test_floor_report_runs_at_a_tiny_size():
    from plexus_tune.graph import synthetic

    b = bench()
    g = synthetic("rmat:nodes=300,edges=1200,features=8,classes=4,seed=0")
    ceilings = {"copy_gbps": 5.0, "gemm_gflops": 20.0, "copy_gbps_median": 5.0, "gemm_gflops_median": 20.0,
                "gemm_size": 64, "gather_gbps": 2.0, "gather_cols": 64}
    report = b.floor_report(g, (1, 1, 2), hidden=8, epochs=3, warmup=1, ceilings=ceilings)
    parts = report["parts"]
    assert sum(parts[p] for p in FLOOR_PARTS) == pytest.approx(parts["epoch"], rel=1e-6)
    assert parts["comm"] > 0 and parts["spmm"] > 0 and parts["optimizer"] > 0 and parts["elementwise"] > 0
    table = {r["part"]: r for r in report["rows"]}
    assert all(table[p]["floor_ms"] > 0 for p in FLOOR_PARTS if p != "sync")
    assert 0 < b.other_share(report) < 1


def test_pyg_baseline_and_lattice_permutations_at_a_tiny_size():
    from plexus_tune.graph import synthetic

    b = bench()
    g = synthetic("rmat:nodes=200,edges=800,features=6,classes=3,seed=1")
    out = b.trainer_vs_pyg(g, hidden=8, epochs=3, warmup=1)
    assert out["trainer_ms"] > 0 and out["pyg_ms"] > 0 and out["ratio"] == pytest.approx(
        out["trainer_ms"] / out["pyg_ms"])
    pyg = b.pyg_fair_epoch(g, hidden=8, epochs=4, warmup=1)
    assert len(pyg["epoch_ms"]) == 4
    lattice = synthetic("grid2d:nodes=400,features=6,classes=3,seed=0")
    perms = b.lattice_permutations(lattice, hidden=8, epochs=2, warmup=1, split_grids=((4, 1, 1),))
    assert set(perms) == {"none", "double", "local", "local@4x1x1"}
    assert perms["none"]["spmm_vs_none"] == 1.0 and all(p["spmm_ms"] > 0 for p in perms.values())
