"""``train``, ``measure`` and torchrun with ``--algorithm``: records, resumption and bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plexus_tune.cli import main
from plexus_tune.measure.identity import run_identity
from plexus_tune.measure.store import read_records

SPEC = "rmat:nodes=61,edges=300,features=6,classes=3,seed=2"
ROOT = Path(__file__).resolve().parents[1]


def test_train_logs_family_records(tmp_path, capsys):
    log = tmp_path / "runs.jsonl"
    common = ["--synthetic", SPEC, "--layers", "2", "--hidden", "5", "--epochs", "3", "--warmup", "1", "--check",
              "--log", str(log)]
    assert main(["train", "--algorithm", "cagnet-1.5d", "--gpus", "4", "--replication", "2", *common]) == 0
    assert main(["train", "--algorithm", "cagnet-2d", "--grid", "2x2x1", *common]) == 0
    assert main(["train", "--algorithm", "supergcn", "--gpus", "2", "--aggregation", "pre", *common]) == 0
    out = capsys.readouterr().out
    assert "cagnet-1.5d (c = 2) grid 2x2x1" in out and "supergcn (pre) grid 2x1x1" in out
    records, problems = read_records(log)
    assert problems == [] and len(records) == 3
    one5, two, part = records
    assert (one5["algorithm"], one5["grid"], one5["options"]["replication"], one5["options"]["permute"]) == \
        ("cagnet-1.5d", "2x2x1", 2, "none")
    assert (two["algorithm"], two["grid"]) == ("cagnet-2d", "2x2x1")
    assert (part["algorithm"], part["options"]["aggregation"]) == ("supergcn", "pre")
    for rec in records:
        assert rec["status"] == "ok" and rec["check_loss_rel_diff"] < 1e-5 and rec["check_output_rel_diff"] < 1e-4
        parts = sum(rec["breakdown_ms"][k] for k in ("spmm_ms", "gemm_ms", "comm_ms", "quant_ms", "other_ms", "wait_ms"))
        assert parts == pytest.approx(rec["epoch_ms"], rel=1e-6)
    assert one5["broadcast_ms"] > 0 and part["point_to_point_ms"] > 0
    assert two["comm_bytes"]["adjacency"] > 0 and "adjacency" not in one5["comm_bytes"]
    # the same grid under two algorithms is two identities
    assert run_identity(one5) != run_identity(two)


def test_measure_runs_a_family_and_resumes(tmp_path, capsys):
    log = tmp_path / "runs.jsonl"
    argv = ["measure", "--synthetic", SPEC, "--gpus", "4", "--algorithm", "cagnet-2d", "--layers", "2", "--hidden", "5",
            "--epochs", "2", "--warmup", "1", "--trials", "1", "--log", str(log)]
    assert main(argv) == 0
    records, _ = read_records(log)
    assert sorted(r["grid"] for r in records) == ["1x4x1", "2x2x1", "4x1x1"]  # every Pr x Pc of 4
    assert {r["algorithm"] for r in records} == {"cagnet-2d"} and all(r["status"] == "ok" for r in records)
    capsys.readouterr()
    assert main(argv) == 0  # all logged: nothing runs again
    assert "0 new run(s)" in capsys.readouterr().err
    assert len(read_records(log)[0]) == 3
    # a partitioned run beside them: validate ranks every configuration of the (graph, G) together
    assert main(["measure", "--synthetic", SPEC, "--gpus", "4", "--algorithm", "supergcn", "--aggregation", "pre",
                 "--layers", "2", "--hidden", "5", "--epochs", "2", "--warmup", "1", "--trials", "1",
                 "--log", str(log)]) == 0
    capsys.readouterr()
    report = tmp_path / "validation.json"
    assert main(["validate", "--machine", "cpu-gloo-2core", "--runs", str(log), "--no-refit", "--json", str(report)]) == 0
    groups = json.loads(report.read_text())["groups"]
    assert [g["grids"] for g in groups] == [4]


@pytest.mark.parametrize("args, needle", [
    (["train", "--synthetic", SPEC, "--gpus", "4", "--algorithm", "cagnet-9d"], "unknown algorithm"),
    (["train", "--synthetic", SPEC, "--grid", "2x2x1", "--algorithm", "cagnet-3d"], "not 2x2x1"),
    (["train", "--synthetic", SPEC, "--algorithm", "cagnet-2d", "--gpus", "4"], "--grid"),
    (["train", "--synthetic", SPEC, "--algorithm", "cagnet-1d"], "--gpus"),
    (["train", "--synthetic", SPEC, "--algorithm", "cagnet-1.5d", "--gpus", "8", "--replication", "4"], "c*c <= G"),
    (["train", "--synthetic", SPEC, "--algorithm", "cagnet-1.5d", "--gpus", "4", "--replication", "-2"], "replication"),
    (["train", "--synthetic", SPEC, "--algorithm", "supergcn", "--gpus", "4", "--aggregation", "both"], "aggregation"),
    (["train", "--synthetic", SPEC, "--algorithm", "supergcn", "--gpus", "4", "--grid", "2x2x1"], "runs on the grid"),
    (["train", "--synthetic", SPEC, "--algorithm", "cagnet-1d", "--gpus", "4", "--block-rows", "8"], "row blocks"),
    (["train", "--synthetic", SPEC, "--grid", "2x2x1", "--aggregation", "pre"], "not of plexus-3d"),
    (["measure", "--synthetic", SPEC, "--gpus", "4", "--algorithm", "cagnet-1.5d", "--grids", "1x4x1", "--log", "x.jsonl"],
     "not a configuration"),
])
def test_bad_family_input_is_one_line_exit_2(args, needle, run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(args)
    assert code == 2 and needle in err and err.count("\n") == 1, err
    assert not (tmp_path / "x.jsonl").exists()


def test_shard_directory_is_refused_for_a_family(tmp_path, capsys):
    from plexus_tune.graph import synthetic
    from plexus_tune.graph.shards import write_shards

    write_shards(synthetic(SPEC), tmp_path / "shards", blocks=(2, 2), mode="none", seed=0)
    assert main(["train", "--graph", str(tmp_path / "shards"), "--algorithm", "cagnet-1d", "--gpus", "2"]) == 2
    err = capsys.readouterr().err
    assert "shard files" in err and err.count("\n") == 1


@pytest.mark.slow
def test_torchrun_runs_a_family(tmp_path):
    """runners/examples/torchrun_train.sh with --algorithm: two torchrun ranks of the partitioned trainer."""
    from plexus_tune.launch import free_port

    log = tmp_path / "runs.jsonl"
    env = {**os.environ, "TORCHRUN": str(Path(sys.executable).with_name("torchrun")), "BACKEND": "gloo",
           "MASTER_PORT": str(free_port())}
    proc = subprocess.run([str(ROOT / "runners" / "examples" / "torchrun_train.sh"), "1", "2", "2x1x1", "--synthetic", SPEC,
                           "--algorithm", "supergcn", "--aggregation", "hybrid", "--layers", "2", "--hidden", "4",
                           "--epochs", "3", "--warmup", "1", "--check", "--log", str(log)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[:4000] + "\n[...]\n" + proc.stderr[-2000:]  # a rank's own error comes first, torchrun's summary last
    records, _ = read_records(log)
    assert len(records) == 1 and records[0]["launcher"] == "torchrun"
    assert records[0]["algorithm"] == "supergcn" and records[0]["check_loss_rel_diff"] < 1e-5


def test_train_without_a_graph_trains_the_built_in_example(tmp_path, capsys):
    """Neither --graph nor --synthetic: the run says so on stderr and trains EXAMPLE_SPEC, the graph
    the record names (ScaleGNN with Gd = 2, one step checked against PyG)."""
    from plexus_tune.graph.generators import EXAMPLE_SPEC, parse_spec

    log = tmp_path / "runs.jsonl"
    assert main(["train", "--algorithm", "scalegnn-4d", "--dp", "2", "--grid", "2x1x1", "--batch-size", "256",
                 "--layers", "2", "--hidden", "8", "--epochs", "2", "--warmup", "1", "--check", "--log", str(log)]) == 0
    captured = capsys.readouterr()
    assert f"training on the built-in example {EXAMPLE_SPEC}" in captured.err and "PASSED" in captured.out
    (rec,), _ = read_records(log)
    assert rec["graph_source"].endswith(EXAMPLE_SPEC) and rec["graph_nodes"] == parse_spec(EXAMPLE_SPEC)[1]["nodes"]
