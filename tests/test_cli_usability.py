"""Messages, help texts and file permissions a new user meets first."""

import json
import os
import re
import stat
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from plexus_tune.errors import UserError
from plexus_tune.report.figures import save_figure

from test_plotting import write_log

REPO = Path(__file__).resolve().parents[1]


def _words(text: str) -> str:
    return " ".join(text.split())


def _one_line_error(code, err):
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    return err


def test_machine_given_as_a_directory_says_what_to_give(run_cli, tmp_path):
    (tmp_path / "mine.json").write_text((REPO / "models" / "perlmutter.json").read_text(encoding="utf-8"))
    code, _, err = run_cli(["predict", "--dataset", "reddit", "--gpus", "8", "--machine", str(tmp_path)])
    err = _one_line_error(code, err)
    assert "is a directory" in err and "IsADirectoryError" not in err
    assert str(tmp_path / "mine.json") in err and "PLEXUS_TUNE_MODELS" in err


@pytest.mark.parametrize("action", ["shard", "stats"])
def test_block_grid_needs_both_sizes(run_cli, tmp_path, action):
    out = tmp_path / "shards"
    argv = ["graph", action, "grid2d:nodes=256", "--blocks", "3"] + (["--out", str(out)] if action == "shard" else [])
    code, _, err = run_cli(argv)
    err = _one_line_error(code, err)
    assert "3x3" in err and "RxC" in err
    assert not out.exists()


def test_graph_generate_help_shows_single_percent_signs(run_cli):
    code, out, _ = run_cli(["graph", "generate", "--help"])
    assert code == 0 and "10% of lattice edges dropped and 1% random" in _words(out) and "%%" not in out


def test_plot_help_texts(run_cli):
    code, out, _ = run_cli(["plot", "pred-vs-obs", "--help"])
    log_help = _words(out).split("--log LOG", 2)[-1].split("--graph")[0].strip()
    assert code == 0 and log_help == "run log (JSON Lines) written by plexus-tune measure, train --log or run"
    code, out, _ = run_cli(["plot", "scaling", "--help"])
    assert code == 0 and "predicted best epoch time against G per dataset" in _words(out)
    assert "fits in memory" in _words(out)


def test_train_dtype_has_help(run_cli):
    code, out, _ = run_cli(["train", "--help"])
    dtype_help = _words(out).split("--dtype {float32,float64}", 2)[-1].strip()
    assert code == 0 and dtype_help.startswith("floating-point type of the adjacency, features and weights")


def test_plot_out_that_is_a_file(run_cli, tmp_path):
    log = write_log(tmp_path / "runs.jsonl")
    existing = tmp_path / "figure.png"
    existing.write_bytes(b"not a directory")
    code, _, err = run_cli(["plot", "pred-vs-obs", "--log", str(log), "--gpus", "8", "--out", str(existing)])
    err = _one_line_error(code, err)
    assert f"--out {existing} is a file" in err and "FileExistsError" not in err
    assert existing.read_bytes() == b"not a directory"
    # the library says the same without naming the flag, also for a file in the way higher up
    for directory in (existing, existing / "sub"):
        with pytest.raises(UserError, match="a file is in the way"):
            save_figure(Figure(), directory, "x", ["png"])


def test_breakdown_with_zero_gpus_names_the_bad_value(run_cli, tmp_path):
    code, _, err = run_cli(["plot", "breakdown", "--dataset", "reddit", "--gpus", "0", "--machine", "perlmutter",
                            "--out", str(tmp_path)])
    err = _one_line_error(code, err)
    assert "--gpus: must be a whole number >= 1, got '0'" in err and "needs --dataset" not in err


@pytest.mark.parametrize("umask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)])
def test_outputs_follow_the_umask(run_cli, tmp_path, umask, file_mode, dir_mode):
    previous = os.umask(umask)
    try:
        for argv in (["graph", "generate", "grid2d", "--nodes", "256", "--features", "4", "--out", "g.npz"],
                     ["graph", "generate", "grid2d", "--nodes", "256", "--features", "4", "--out", "gdir"],
                     ["graph", "shard", "g.npz", "--blocks", "2x2", "--out", "shards"],
                     ["plot", "breakdown", "--dataset", "reddit", "--gpus", "8", "--machine", "perlmutter",
                      "--format", "png,svg", "--out", "plots"]):
            argv = [str(tmp_path / a) if a in ("g.npz", "gdir", "shards", "plots") else a for a in argv]
            code, _, err = run_cli(argv)
            assert code == 0, err
    finally:
        os.umask(previous)
    paths = sorted(tmp_path.rglob("*"))
    assert {p.name for p in paths} >= {"g.npz", "gdir", "shards", "plots", "manifest.json"}
    assert sum(p.suffix == ".png" for p in paths) == 1 and sum(p.suffix == ".svg" for p in paths) == 1
    for path in paths:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (dir_mode if path.is_dir() else file_mode), (path, oct(mode))
    assert not [p for p in paths if ".tmp" in p.name]


def _row_cells(table: str, name: str) -> list[str]:
    """The cells of the first line of the row named ``name`` in a rich table."""
    for line in table.splitlines():
        cells = [c.strip() for c in re.split("[│┃]", line)[1:-1]]
        if cells and cells[0] == name:
            return cells
    raise AssertionError(f"no row {name!r} in\n{table}")


def test_machines_listing_describes_cpu_hosts_and_rounds(run_cli):
    code, out, _ = run_cli(["machines"])
    assert code == 0
    assert _row_cells(out, "name")[1:4] == ["per node", "memory GiB", "GEMM TFLOP/s"]
    column = {"per node": 1, "memory GiB": 2, "GEMM TFLOP/s": 3, "beta intra/inter GB/s": 5}
    # models/cpu-gloo-2core-fitted.json: 8 ranks on host_cores 2, 2.943 GiB each,
    # gemm_tflops 0.10456103738734644, beta 1.9870... GB/s both tiers
    cpu = _row_cells(out, "cpu-gloo-2core-fitted")
    assert cpu[column["per node"]] == "8 ranks, 2 cores"
    assert cpu[column["memory GiB"]] == "2.943 per rank"
    assert cpu[column["GEMM TFLOP/s"]] == "0.1046"
    assert cpu[column["beta intra/inter GB/s"]] == "1.987 / 1.987"
    gpu = _row_cells(out, "perlmutter")
    assert gpu[column["per node"]] == "4 GPUs" and gpu[column["memory GiB"]] == "40 per GPU"
    assert gpu[column["GEMM TFLOP/s"]] == "19.5" and gpu[column["beta intra/inter GB/s"]] == "225 / 66.59"
    # every number of the listing has at most 4 significant digits
    for path in sorted((REPO / "models").glob("*.json")):
        cells = _row_cells(out, path.stem)
        for key in ("GEMM TFLOP/s", "beta intra/inter GB/s"):
            for number in re.findall(r"[0-9.]+", cells[column[key]]):
                assert len(number.replace(".", "").lstrip("0")) <= 4, (path.stem, key, number)

    code, out, _ = run_cli(["machines", "cpu-gloo-2core-fitted"])
    assert code == 0
    assert _row_cells(out, "host_cores")[1] == "2" and _row_cells(out, "threads_per_rank")[1] == "1"
    code, out, _ = run_cli(["machines", "--format", "json"])
    listed = {e["name"]: e for e in json.loads(out)}
    assert listed["cpu-gloo-2core-fitted"]["host_cores"] == 2 and listed["perlmutter"]["host_cores"] is None
