"""The observed breakdown partitions the epoch (docs/records.md, Observed breakdown)."""

import json

import pytest

from plexus_tune.measure.table import runs_table
from plexus_tune.trainer.comm import PARTITION_KEYS
from plexus_tune.measure.training import partition_epoch, summarize_timers


def row(spmm, gemm, comm, x, y, epoch, **extra):
    out = {"spmm_ms": spmm, "gemm_ms": gemm, "comm_ms": comm, "comm_x_ms": x, "comm_y_ms": y, "comm_z_ms": 0.0,
           "all_reduce_ms": comm, "all_gather_ms": 0.0, "reduce_scatter_ms": 0.0, "epoch_ms": epoch, **extra}
    out["other_ms"] = epoch - spmm - gemm - comm - extra.get("quant_ms", 0.0)
    return out


def test_two_ranks_waiting_for_each_other_by_hand():
    # rank a: SpMM 10, then waits in a collective while b computes its GEMM 10; the per-phase maxima
    # add up to 10 + 10 + 11 + 0.5 = 31.5 ms against a 21.5 ms epoch
    a = row(10.0, 0.0, 11.0, 6.0, 5.0, 21.5)    # other 0.5, local work 10.5: the critical rank
    b = row(0.0, 10.0, 10.5, 10.5, 0.0, 20.5)   # other 0, local work 10; least collective time
    parts = partition_epoch([a, b])
    assert (parts["spmm_ms"], parts["gemm_ms"], parts["other_ms"]) == (10.0, 0.0, 0.5)
    assert parts["comm_ms"] == 10.5 and (parts["comm_x_ms"], parts["comm_y_ms"], parts["comm_z_ms"]) == (10.5, 0.0, 0.0)
    assert parts["wait_ms"] == pytest.approx(21.5 - 10.0 - 0.5 - 10.5)
    assert sum(parts[k] for k in PARTITION_KEYS) + parts["wait_ms"] == pytest.approx(21.5)


def test_partition_by_hand_and_the_per_phase_maxima_that_double_count():
    # three ranks; rank 2 has the most local work (spmm 30 + gemm 5 + other 5 = 40)
    r0 = row(20.0, 5.0, 40.0, 30.0, 10.0, 70.0)   # other 5
    r1 = row(25.0, 6.0, 35.0, 10.0, 25.0, 72.0)   # other 6
    r2 = row(30.0, 5.0, 32.0, 20.0, 12.0, 72.0)   # other 5
    parts = partition_epoch([r0, r1, r2])
    assert parts["spmm_ms"] == 30.0 and parts["gemm_ms"] == 5.0 and parts["other_ms"] == 5.0
    assert parts["comm_ms"] == 32.0 and (parts["comm_x_ms"], parts["comm_y_ms"]) == (20.0, 12.0)  # rank 2's split
    assert parts["wait_ms"] == pytest.approx(72.0 - 30 - 5 - 5 - 32)
    # the per-key maxima the record's spmm_ms, comm_x_ms, ... hold overlap: x + y exceeds comm
    assert max(r["comm_x_ms"] for r in (r0, r1, r2)) + max(r["comm_y_ms"] for r in (r0, r1, r2)) > 40.0


def test_partition_is_general_over_phase_names(monkeypatch):
    import plexus_tune.measure.training as run_mod

    monkeypatch.setattr(run_mod, "PARTITION_KEYS", ("spmm_ms", "gemm_ms", "quant_ms", "comm_ms", "other_ms"))
    r0 = row(10.0, 2.0, 8.0, 8.0, 0.0, 25.0, quant_ms=3.0)
    r1 = row(9.0, 2.0, 12.0, 6.0, 6.0, 26.0, quant_ms=1.0)
    parts = run_mod.partition_epoch([r0, r1])
    assert parts["quant_ms"] == 3.0  # rank 0 has the most local work (10 + 2 + 3 + 2)
    total = sum(parts[k] for k in ("spmm_ms", "gemm_ms", "quant_ms", "comm_ms", "other_ms")) + parts["wait_ms"]
    assert total == pytest.approx(26.0) and parts["wait_ms"] >= 0


def test_real_gloo_run_parts_partition_the_epoch(tmp_path):
    from plexus_tune.trainer import TrainConfig
    from plexus_tune.measure.training import run_training

    log = tmp_path / "runs.jsonl"
    config = TrainConfig(grid=(2, 1, 2), graph=("synthetic", "rmat:nodes=300,edges=2400,features=8,classes=3,seed=1"),
                         layers=3, hidden=16, epochs=5, warmup=1, log=str(log), threads_per_rank=1)
    record = run_training(config)
    parts = record["breakdown_ms"]
    assert set(PARTITION_KEYS) <= set(parts) and "wait_ms" in parts
    assert all(v >= 0 for v in parts.values())
    total = sum(parts[k] for k in PARTITION_KEYS) + parts["wait_ms"]
    assert total == pytest.approx(record["epoch_ms"], rel=1e-9, abs=1e-9)
    assert parts["comm_x_ms"] + parts["comm_y_ms"] + parts["comm_z_ms"] == pytest.approx(parts["comm_ms"], rel=1e-9, abs=1e-12)
    assert record["wait_ms"] == parts["wait_ms"]
    table = runs_table([json.loads(line) for line in log.read_text().splitlines()])
    sums = sum(table[f"obs_part_{k}"] for k in PARTITION_KEYS) + table["obs_part_wait_ms"]
    assert sums.iloc[0] == pytest.approx(table["obs_epoch_ms"].iloc[0], rel=1e-9)
    assert table["obs_wait_ms"].iloc[0] == pytest.approx(parts["wait_ms"])


def test_old_records_without_a_breakdown_still_load():
    rec = {"schema": "plexus-tune/run-v1", "status": "ok", "graph": "g", "nodes": 10, "nnz": 30, "widths": [4, 4, 2],
           "gx": 1, "gy": 1, "gz": 2, "epoch_ms": 5.0, "spmm_ms": 1.0}
    table = runs_table([rec])
    assert table["obs_epoch_ms"].iloc[0] == 5.0 and table["obs_wait_ms"].isna().all()


def test_summarize_timers_means_the_measured_epochs():
    epochs = [[row(1.0, 1.0, 1.0, 1.0, 0.0, 5.0), row(2.0, 1.0, 1.0, 0.5, 0.5, 6.0)] for _ in range(3)]
    timers = [[epochs[e][r] for e in range(3)] for r in range(2)]
    out = summarize_timers(timers, warmup=1)
    b = out["breakdown_ms"]
    assert b["spmm_ms"] == 2.0 and b["comm_ms"] == 1.0 and b["wait_ms"] == pytest.approx(6.0 - 2 - 1 - 1 - 2)
