"""``plexus-tune train``: the logged record, failure handling and bad input."""

import json
import subprocess
import sys
import time

import pytest

from plexus_tune.cli import main
from plexus_tune.measure.store import read_records
from plexus_tune.trainer import TrainConfig
from plexus_tune.measure.training import TrainingFailed, run_training
from plexus_tune.trainer.loop import FAIL_ENV

SPEC = "rmat:nodes=61,edges=300,features=6,classes=3,seed=2"
BREAKDOWN = ("spmm_ms", "gemm_ms", "comm_ms", "comm_x_ms", "comm_y_ms", "comm_z_ms", "all_reduce_ms",
             "all_gather_ms", "reduce_scatter_ms", "other_ms", "epoch_ms")


def test_train_cli_logs_a_checked_record(tmp_path, capsys):
    log = tmp_path / "runs.jsonl"
    code = main(["train", "--synthetic", SPEC, "--grid", "1x2x1", "--layers", "2", "--hidden", "5",
                 "--epochs", "4", "--warmup", "1", "--check", "--log", str(log), "--machine", "testbox"])
    out = capsys.readouterr().out
    assert code == 0
    assert "grid 1x2x1" in out and "check against serial PyG" in out
    records, problems = read_records(log)
    assert problems == [] and len(records) == 1
    rec = records[0]
    assert rec["schema"] == "plexus-tune/run-v2" and rec["status"] == "ok"
    assert (rec["gx"], rec["gy"], rec["gz"], rec["gpus"], rec["machine"]) == (1, 2, 1, 2, "testbox")
    assert rec["graph_nodes"] == 61 and rec["widths"] == [6, 5, 3] and rec["backend"] == "gloo"
    assert rec["check_loss_rel_diff"] < 1e-5 and rec["check_output_rel_diff"] < 1e-4
    assert len(rec["losses"]) == 4 and len(rec["epoch_times_ms"]) == 4
    for key in BREAKDOWN:
        assert rec[key] >= 0 and key in rec["imbalance"] and key in rec["rank_mean_ms"]
    # the record's epoch time is the mean of the measured epochs (warm-up left out)
    assert rec["epoch_ms"] == pytest.approx(sum(rec["epoch_times_ms"][1:]) / 3)
    assert rec["comm_ms"] > 0 and rec["comm_y_ms"] > 0 and rec["comm_x_ms"] == 0 and rec["comm_z_ms"] == 0
    assert rec["imbalance"]["epoch_ms"] >= 1.0
    assert rec["peak_memory_bytes"] > 0 and len(rec["peak_rss_bytes_per_rank"]) == 2
    assert rec["torch"] and rec["python"] and rec["timestamp"]


@pytest.mark.parametrize("mode, status, needle", [
    ("raise", "failed", "injected failure on rank 1 at epoch 2"),
    ("kill", "failed", "SIGKILL"),
    ("oom", "oom", "allocate"),
])
def test_failing_rank_stops_run_and_is_logged(tmp_path, monkeypatch, mode, status, needle):
    log = tmp_path / "runs.jsonl"
    monkeypatch.setenv(FAIL_ENV, f"1:2:{mode}")
    config = TrainConfig(grid=(2, 1, 2), synthetic=SPEC, layers=2, hidden=4, epochs=5, warmup=1,
                         log=str(log), timeout_s=300)
    start = time.monotonic()
    with pytest.raises(TrainingFailed) as info:
        run_training(config)
    assert time.monotonic() - start < 90  # bounded: the other ranks were waiting in collectives
    assert "rank 1" in str(info.value) and needle in str(info.value)
    records, _ = read_records(log)
    assert len(records) == 1
    rec = records[0]
    assert rec["status"] == status and needle in rec["reason"] and rec["failed_rank"] == 1
    assert rec["grid"] == "2x1x2"


def test_failing_run_exits_nonzero_with_the_rank_error(tmp_path, monkeypatch, capsys):
    """In process, on the session's fork server (the exit status of ``python -m plexus_tune`` is
    main's return value: test_bad_input_subprocess_has_no_traceback)."""
    log = tmp_path / "runs.jsonl"
    monkeypatch.setenv(FAIL_ENV, "0:1:raise")
    code = main(["train", "--synthetic", SPEC, "--grid", "2x1x1", "--layers", "2", "--hidden", "4", "--epochs", "3",
                 "--warmup", "1", "--log", str(log)])
    err = capsys.readouterr().err
    assert code == 1
    assert "rank 0 failed: RuntimeError: injected failure on rank 0 at epoch 1" in err and "Traceback" not in err
    assert json.loads(log.read_text().splitlines()[0])["status"] == "failed"


@pytest.mark.parametrize("args, needle", [
    (["--grid", "2x2"], "GXxGYxGZ"),
    (["--grid", "2xAx1"], "GXxGYxGZ"),
    (["--grid", "2x2x2", "--gpus", "4"], "the GPU count is 4; make the product of the grid equal the GPU count (--gpus)"),
    (["--grid", "1x1x1", "--backend", "nccl"], "CUDA"),
    (["--grid", "1x1x1", "--warmup", "5", "--epochs", "5"], "warmup < epochs"),
    (["--grid", "1x1x1", "--overlap"], "overlap needs row blocks (it overlaps the all-reduce of one row block with the next SpMM) (--block-rows)"),
])
def test_bad_input_is_one_line_exit_2(args, needle, capsys):
    assert main(["train", "--synthetic", SPEC] + args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err and "Traceback" not in err


def test_missing_graph_and_world_size_mismatch(tmp_path, capsys, monkeypatch):
    assert main(["train", "--graph", str(tmp_path / "none.npz"), "--grid", "1x1x1"]) == 2
    assert "does not exist" in capsys.readouterr().err
    # under torchrun with a world size that differs from the grid
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert main(["train", "--synthetic", SPEC, "--grid", "2x1x1"]) == 2
    err = capsys.readouterr().err
    assert "launcher started 3" in err and err.count("\n") == 1


def test_bad_input_subprocess_has_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "plexus_tune", "train", "--synthetic", SPEC, "--grid", "0x1x1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_torchrun_runner_joins_its_process_set(tmp_path):
    """runners/examples/torchrun_train.sh: two torchrun ranks on gloo; only rank 0 logs, and the run checks out."""
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    log = tmp_path / "runs.jsonl"
    torchrun = Path(sys.executable).with_name("torchrun")
    from plexus_tune.launch import free_port

    env = {**os.environ, "TORCHRUN": str(torchrun), "BACKEND": "gloo", "MASTER_PORT": str(free_port())}
    proc = subprocess.run([str(root / "runners" / "examples" / "torchrun_train.sh"), "1", "2", "1x2x1", "--synthetic", SPEC,
                           "--layers", "2", "--hidden", "4", "--epochs", "3", "--warmup", "1", "--check",
                           "--log", str(log)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[:4000] + "\n[...]\n" + proc.stderr[-2000:]  # a rank's own error comes first, torchrun's summary last
    assert proc.stdout.count("grid 1x2x1 (2 ranks, gloo") == 1
    records, _ = read_records(log)
    assert len(records) == 1 and records[0]["status"] == "ok" and records[0]["gpus"] == 2
    assert records[0]["check_loss_rel_diff"] < 1e-5
    # torchrun chose the layout: every rank reported its host and node, and the record checks them
    assert records[0]["launcher"] == "torchrun" and records[0]["rank_nodes"] == [0, 0]
    assert records[0]["placement_ok"] is True and len(records[0]["hosts"]) == 1
    bad = subprocess.run([str(root / "runners" / "examples" / "torchrun_train.sh"), "1", "2", "2x2x1"], capture_output=True,
                         text=True, timeout=60, env=env)
    assert bad.returncode == 2 and "does not have" in bad.stderr
