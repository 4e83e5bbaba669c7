"""``plexus-tune plot KIND`` writes PNG and SVG files named after what they show."""

import subprocess
import sys

import pytest
from matplotlib.figure import Figure

from plexus_tune.cli import build_parser, main
from plexus_tune.cli.plot import make_figure
from plexus_tune.report import figures as plotting

from test_plotting import GRIDS_8, check_files, write_log


def run_plot(argv, capsys):
    assert main(["plot"] + argv) == 0
    return capsys.readouterr().out.split()


def test_every_kind_from_logged_data(tmp_path, capsys):
    log = str(write_log(tmp_path / "runs.jsonl"))
    out = str(tmp_path / "plots")
    paths = run_plot(["pred-vs-obs", "--log", log, "--gpus", "8", "--out", out], capsys)
    assert [p.rsplit("/", 1)[1] for p in paths] == ["pred-vs-obs_tiny_G8.png", "pred-vs-obs_tiny_G8.svg"]
    check_files(paths)
    # the same figure object: one point per logged grid; with --machine the model predicts them again
    args = build_parser().parse_args(["plot", "pred-vs-obs", "--log", log, "--gpus", "8", "--machine", "perlmutter"])
    fig, stem = make_figure(args)
    assert isinstance(fig, Figure) and stem == "pred-vs-obs_tiny_G8"
    assert len(fig.axes[0].collections[0].get_offsets()) == len(GRIDS_8)

    paths = run_plot(["breakdown", "--log", log, "--gpus", "8", "--out", out], capsys)
    assert paths[0].endswith("breakdown_tiny_G8.png")
    check_files(paths)
    fig, _ = make_figure(build_parser().parse_args(["plot", "breakdown", "--log", log, "--gpus", "8"]))
    assert len(fig.axes[0].patches) == len(GRIDS_8) * len(plotting.BREAKDOWN_PARTS) * 2
    fig, stem = make_figure(build_parser().parse_args(["plot", "breakdown", "--dataset", "Reddit", "--gpus", "16", "--machine", "perlmutter", "--top", "4"]))
    assert stem == "breakdown_Reddit_G16_perlmutter" and len(fig.axes[0].patches) == 4 * len(plotting.BREAKDOWN_PARTS)

    paths = run_plot(["scaling", "--datasets", "ogbn-products,Reddit", "--machine", "perlmutter", "--gpus", "8..64:pow2", "--log", log, "--out", out], capsys)
    assert paths[0].endswith("scaling_perlmutter_ogbn-products-Reddit.png")
    check_files(paths)

    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    assert main(["search", "--dataset", "ogbn-products", "--gpus", "8..64", "--exact-budget", "0", "--trials", "20", "--storage", storage, "--study", "s1", "--snap", "4"]) == 0
    capsys.readouterr()
    paths = run_plot(["history", "--study", "s1", "--storage", storage, "--out", out], capsys)
    assert paths[0].endswith("history_s1.png")
    check_files(paths)
    fig, _ = make_figure(build_parser().parse_args(["plot", "history", "--study", "s1", "--storage", storage]))
    assert sum(len(c.get_offsets()) for c in fig.axes[0].collections) == 20
    paths = run_plot(["importances", "--study", "s1", "--storage", storage, "--out", out], capsys)
    assert paths[0].endswith("importances_s1.png")
    check_files(paths)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["pred-vs-obs", "--log", "nope.jsonl"], "does not exist"),
        (["history", "--study", "absent", "--storage", "sqlite:///{tmp}/s.db"], "s.db does not exist: no search saved a study there"),
        (["scaling", "--datasets", "nosuch", "--machine", "perlmutter"], "nosuch"),
        (["breakdown", "--gpus", "8"], "breakdown needs --log"),
        (["pred-vs-obs", "--log", "{tmp}/runs.jsonl", "--format", "gif"], "unknown format"),
    ],
)
def test_errors_are_one_line(tmp_path, argv, message):
    write_log(tmp_path / "runs.jsonl")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    proc = subprocess.run([sys.executable, "-m", "plexus_tune", "plot"] + argv, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and proc.stderr.strip().count("\n") == 0
