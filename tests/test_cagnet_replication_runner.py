"""runners/campaigns/cagnet_replication.py at a tiny size: 1D and 1.5D bytes from the trainer's logs."""

import importlib.util
from pathlib import Path

RUNNER = Path(__file__).resolve().parents[1] / "runners" / "campaigns" / "cagnet_replication.py"


def _runner():
    spec = importlib.util.spec_from_file_location("cagnet_replication", RUNNER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_run_prints_less_aggregation_for_c2_than_1d(capsys):
    runner = _runner()
    assert runner.main(["--tiny"]) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip()[:1].isdigit()]
    assert [(row[0], row[1]) for row in lines] == [("8", "1"), ("8", "2")]
    one, two = (int(row[2]) for row in lines)
    # hand-derived (256 nodes, widths 16, 16, 16, 4; forward and backward of 3 layers): 1D broadcasts
    # every 32-row block to 7 ranks, 2 x 3 x 8 x 7 x 32 x 16 x 4 bytes; c = 2: four roots send a
    # 64-row block to 3 ranks, 2 x 3 x 4 x 3 x 64 x 16 x 4, and all 8 ranks all-reduce 64 x 16 over
    # 2 replicas, 2 (c - 1) ceil(1024 / 2) values: 2 x 3 x 8 x 2 x 512 x 4
    assert one == 2 * 3 * 8 * 7 * 32 * 16 * 4
    assert two == 2 * 3 * 4 * 3 * 64 * 16 * 4 + 2 * 3 * 8 * 2 * 512 * 4
    assert two < one
    assert all(row[-2] == "True" for row in lines)  # every rank's bytes equal the volume model


def test_bad_arguments_exit_2(capsys):
    runner = _runner()
    assert runner.main(["--gpus", "4,x"]) == 2
    assert "--gpus" in capsys.readouterr().err
