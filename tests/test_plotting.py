"""Every plot kind from logged data: valid PNG/SVG files, the expected points and bars."""

import xml.etree.ElementTree as ET

import numpy as np
import optuna
import pandas as pd
import pytest
from PIL import Image

from plexus_tune.report import figures as plotting
from plexus_tune.errors import UserError
from plexus_tune.measure.store import append_records

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
GRIDS_8 = [(1, 1, 8), (1, 2, 4), (2, 2, 2), (4, 2, 1), (8, 1, 1)]


def run_record(grid, epoch_ms, trial=0, graph="tiny", gpus=None, status="ok"):
    """A record as the trainer and ``measure`` log it (shared breakdown keys, predicted fields)."""
    gx, gy, gz = grid
    spmm, gemm = 0.5 * epoch_ms, 0.1 * epoch_ms
    cx, cy, cz = 0.1 * epoch_ms * gx / 8, 0.1 * epoch_ms * gy / 8, 0.1 * epoch_ms * gz / 8
    other = epoch_ms - spmm - gemm - cx - cy - cz
    rec = {
        "kind": "train", "status": status, "graph": graph, "graph_source": f"synthetic:rmat:{graph}",
        "grid": f"{gx}x{gy}x{gz}", "gx": gx, "gy": gy, "gz": gz, "gpus": gpus or gx * gy * gz,
        "graph_nodes": 2048, "nnz": 40000, "features": 32, "classes": 8, "layers": 3, "hidden": 16,
        "epochs": 10, "warmup": 2, "trial": trial,
        "epoch_ms": epoch_ms, "spmm_ms": spmm, "gemm_ms": gemm, "comm_ms": cx + cy + cz,
        "comm_x_ms": cx, "comm_y_ms": cy, "comm_z_ms": cz, "other_ms": other,
        "predicted": {"total_ms": 0.9 * epoch_ms + 2.0 * gx, "spmm_ms": 0.4 * epoch_ms, "gemm_ms": 0.1 * epoch_ms,
                      "comm_ms": 0.3 * epoch_ms, "comm_x_ms": 0.1 * epoch_ms, "comm_y_ms": 0.1 * epoch_ms,
                      "comm_z_ms": 0.1 * epoch_ms, "other_ms": 0.1 * epoch_ms, "feasible": gx < 8},
    }
    if status != "ok":
        rec = {k: v for k, v in rec.items() if not k.endswith("_ms")}
        rec["reason"] = "out of memory"
    return rec


def write_log(path):
    records = []
    for i, grid in enumerate(GRIDS_8):
        for trial in range(2):
            records.append(run_record(grid, 100.0 + 10.0 * i + trial, trial))
    records.append(run_record((8, 1, 1), 0.0, 2, status="oom"))
    records.append(run_record((2, 2, 1), 150.0, 0))
    records.append(run_record((1, 2, 2), 140.0, 0))
    append_records(path, records)
    return path


def check_files(paths):
    assert len(paths) == 2
    png, svg = paths
    assert png.endswith(".png") and svg.endswith(".svg")
    with open(png, "rb") as fh:
        assert fh.read(8) == PNG_SIGNATURE
    with Image.open(png) as im:
        im.verify()
    import matplotlib.image

    assert matplotlib.image.imread(png).ndim == 3
    root = ET.parse(svg).getroot()
    assert root.tag.endswith("svg")


def ranks(a):
    order = np.argsort(a)
    r = np.empty(len(a))
    r[order] = np.arange(len(a))
    return r


def test_pred_vs_obs_points_stats_and_marks(tmp_path):
    runs, graph, gpus = plotting.select_runs(plotting.runs_frame(write_log(tmp_path / "runs.jsonl")), gpus=8)
    assert (graph, gpus) == ("tiny", 8)
    frame = plotting.pred_obs_frame(runs)
    assert list(frame["grid"]) == sorted(f"{a}x{b}x{c}" for a, b, c in GRIDS_8)
    assert (frame["trials"] == 2).all()  # the failed run is not data for the means
    fig = plotting.plot_pred_vs_obs(frame, title="t")
    ax = fig.axes[0]
    assert len(ax.collections[0].get_offsets()) == len(GRIDS_8)
    assert sorted(t.get_text() for t in ax.texts) == sorted(frame["grid"])
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    pred, obs = frame["pred_total_ms"].to_numpy(), frame["obs_epoch_ms"].to_numpy()
    # hand references: Spearman = Pearson of ranks (no ties); R^2 about y = x
    rho = np.corrcoef(ranks(pred), ranks(obs))[0, 1]
    r2 = 1 - ((obs - pred) ** 2).sum() / ((obs - obs.mean()) ** 2).sum()
    assert f"Spearman {rho:.3f}" in legend[0] and f"R$^2$ {r2:.3f}" in legend[0]
    # recommended = best predicted feasible (8x1x1 is infeasible in the log); observed best = lowest mean
    feas = frame[frame["pred_feasible"]]
    assert any(f"recommended {feas.loc[feas['pred_total_ms'].idxmin(), 'grid']}" == s for s in legend)
    assert any(f"observed best {frame.loc[frame['obs_epoch_ms'].idxmin(), 'grid']}" == s for s in legend)
    assert (frame["obs_epoch_ms_std"] > 0).any()  # two trials a grid: error bars, and the legend says what they are
    assert "bars: observed +- std over the trials" in legend
    check_files(plotting.save_figure(fig, tmp_path / "out", "pred-vs-obs_tiny_G8"))


def test_breakdown_bar_counts(tmp_path):
    runs, _, _ = plotting.select_runs(plotting.runs_frame(write_log(tmp_path / "runs.jsonl")), "tiny", 8)
    frame = plotting.pred_obs_frame(runs)
    fig = plotting.plot_breakdown(frame)
    parts = len(plotting.BREAKDOWN_PARTS)
    assert len(fig.axes[0].patches) == len(GRIDS_8) * parts * 2
    # stacked observed bars reach the observed epoch time (the parts sum to it)
    heights = {}
    for patch in fig.axes[0].patches:
        x = round(patch.get_x() + patch.get_width() / 2, 3)
        heights[x] = max(heights.get(x, 0.0), patch.get_y() + patch.get_height())
    assert sorted(round(v, 6) for v in heights.values()) == sorted(
        round(v, 6) for v in list(frame["obs_epoch_ms"]) + list(frame[[f"pred_{k}" for k, _, _ in plotting.BREAKDOWN_PARTS]].sum(axis=1))
    )
    only_pred = plotting.plot_breakdown(frame.drop(columns=[c for c in frame if c.startswith("obs_")]))
    assert len(only_pred.axes[0].patches) == len(GRIDS_8) * parts
    check_files(plotting.save_figure(fig, tmp_path, "breakdown_tiny_G8"))


def test_strong_scaling_lines_and_observed_points(tmp_path):
    from plexus_tune.model.machine import load_machine

    gpus = (4, 8, 16, 32, 64)
    pred = plotting.scaling_frame(["ogbn-products", "Reddit"], load_machine("perlmutter"), gpus)
    assert set(pred["dataset"]) == {"ogbn-products", "Reddit"} and len(pred) <= 2 * len(gpus)
    # brute force: the best feasible grid at G = 64 for ogbn-products
    from plexus_tune.model.costs import predict_grids
    from plexus_tune.model.grid import enumerate_grids
    from plexus_tune.model.workload import workload_from_dataset

    grids = enumerate_grids(64)
    p = predict_grids(workload_from_dataset("ogbn-products"), load_machine("perlmutter"), grids)
    best = min(t for t, f in zip(p["total_ms"], p["feasible"]) if f)
    row = pred[(pred["dataset"] == "ogbn-products") & (pred["gpus"] == 64)]
    assert row["pred_total_ms"].iloc[0] == pytest.approx(best)
    observed = plotting.observed_scaling_frame(plotting.runs_frame(write_log(tmp_path / "runs.jsonl")))
    assert list(observed["gpus"]) == [4, 8] and observed["obs_epoch_ms"].iloc[1] == pytest.approx(100.5)
    observed["dataset"] = "ogbn-products"
    fig = plotting.plot_strong_scaling(pred, observed, machine="perlmutter")
    ax = fig.axes[0]
    assert len(ax.lines) == 2
    assert [len(line.get_xdata()) for line in ax.lines] == [int((pred["dataset"] == d).sum()) for d in ("ogbn-products", "Reddit")]
    assert len(ax.collections) == 1 and len(ax.collections[0].get_offsets()) == 2
    check_files(plotting.save_figure(fig, tmp_path, "scaling_perlmutter"))


def _small_study(n=25):
    from plexus_tune.search import ModelEvaluator, Objective, SearchSpace, parse_gpus
    from plexus_tune.model.machine import load_machine
    from plexus_tune.model.workload import workload_from_dataset

    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=0))
    ev = ModelEvaluator(workload_from_dataset("ogbn-papers100M"), load_machine("perlmutter"))
    study.optimize(Objective(SearchSpace(parse_gpus("16..256:pow2")), ev, "epoch"), n_trials=n)
    return study


def test_search_history_and_importances(tmp_path):
    study = _small_study()
    from plexus_tune.search import trials_frame

    frame = trials_frame(study)
    fig = plotting.plot_search_history(frame, objective="epoch (ms)")
    ax = fig.axes[0]
    n_feasible = int(frame["feasible"].sum())
    offsets = [len(c.get_offsets()) for c in ax.collections]
    assert sum(offsets) == len(frame) and offsets[0] == n_feasible
    # best-so-far line ends at the best feasible value
    assert ax.lines[0].get_ydata()[-1] == pytest.approx(study.best_value)
    check_files(plotting.save_figure(fig, tmp_path, "history_s"))
    imp = plotting.param_importances(study)
    assert set(imp) == {"log2_gx", "log2_gy", "log2_gz"} and sum(imp.values()) == pytest.approx(1.0)
    fig2 = plotting.plot_param_importances(imp)
    assert len(fig2.axes[0].patches) == 3
    check_files(plotting.save_figure(fig2, tmp_path, "importances_s"))


def test_selection_errors(tmp_path):
    frame = plotting.runs_frame(write_log(tmp_path / "runs.jsonl"))
    with pytest.raises(UserError, match="several GPU counts"):
        plotting.select_runs(frame, "tiny")
    with pytest.raises(UserError, match="no run of graph 'big'"):
        plotting.select_runs(frame, "big", 8)
    with pytest.raises(UserError, match="does not exist"):
        plotting.runs_frame(tmp_path / "missing.jsonl")
    assert plotting.safe_name("a b/c:d") == "a-b-c-d"
    assert isinstance(frame, pd.DataFrame)


def test_runs_of_two_settings_are_two_points_per_grid(tmp_path):
    """Permuted and unpermuted runs of one grid are not pooled: each is a point, labelled by its setting."""
    records = []
    for i, grid in enumerate(GRIDS_8):
        for trial in range(2):
            records.append(run_record(grid, 100.0 + 10.0 * i + trial, trial))
            records.append({**run_record(grid, 300.0 + 10.0 * i + trial, trial), "options": {"permute": "none"}})
    append_records(tmp_path / "runs.jsonl", records)
    runs, _, _ = plotting.select_runs(plotting.runs_frame(tmp_path / "runs.jsonl"), "tiny", 8)
    frame = plotting.pred_obs_frame(runs)
    assert len(frame) == 2 * len(GRIDS_8) and (frame["trials"] == 2).all()
    by_label = dict(zip(frame["grid"], frame["obs_epoch_ms"]))
    assert by_label["2x2x2 (permute=double)"] == pytest.approx(120.5)  # median of 120, 121: not of 120, 121, 320, 321
    assert by_label["2x2x2 (permute=none)"] == pytest.approx(320.5)
    best = plotting.observed_scaling_frame(plotting.runs_frame(tmp_path / "runs.jsonl"))
    assert sorted(best["dataset"]) == ["tiny (permute=double)", "tiny (permute=none)"]
    assert sorted(best["obs_epoch_ms"]) == [100.5, 300.5]


def test_a_graph_chosen_by_its_source_is_called_by_its_name(tmp_path):
    frame = plotting.runs_frame(write_log(tmp_path / "runs.jsonl"))
    sources = set(frame["graph"].astype(str)) - {"tiny"}
    by_name = plotting.select_runs(frame, "tiny", 8)
    for source in sources:  # the log's source text of the same graph: the same rows, the same name
        by_source = plotting.select_runs(frame, source, 8)
        assert by_source[1:] == by_name[1:] == ("tiny", 8)
        assert len(by_source[0]) == len(by_name[0])
