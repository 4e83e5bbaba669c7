"""Figures: predicted against observed, breakdowns, strong scaling, search history.

Every ``plot_*`` function takes plain data (DataFrames, an Optuna study) and returns a
matplotlib Figure (Agg backend, no display needed); :func:`save_figure` writes it as
PNG and SVG. The ``*_frame`` helpers build the DataFrames from run logs (the runs
table of :mod:`plexus_tune.measure.records`: medians over trials, observed columns
``obs_<key>``, predicted ``pred_<key>``; docs/records.md) and the cost model.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from collections.abc import Iterable, Sequence

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.measure.identity import setting_labels
from plexus_tune.measure.table import predict_runs, runs_table
from plexus_tune.measure.store import read_runs
from plexus_tune.model.grid import enumerate_grids, format_grid
from plexus_tune.model.prediction import predict_run_grids
from plexus_tune.model.workload import workload_from_dataset
from plexus_tune.report.metrics import mape_percent, median_ratio, r2_identity, spearman
from plexus_tune.model.breakdown import LEGEND_LABELS

#: Colour of each stacked component of a breakdown bar; overhead_ms is predicted only,
#: wait_ms observed only (docs/records.md, Observed breakdown).
PART_COLOURS = {"spmm_ms": "#4c72b0", "gemm_ms": "#55a868", "comm_x_ms": "#c44e52", "comm_y_ms": "#dd8452",
                "comm_z_ms": "#8172b2", "quant_ms": "#64b5cd", "other_ms": "#937860", "overhead_ms": "#8c8c8c",
                "wait_ms": "#da8bc3"}
#: Stacked components of a breakdown bar: (column suffix, label, colour).
BREAKDOWN_PARTS = tuple((key, LEGEND_LABELS[key], colour) for key, colour in PART_COLOURS.items())


def _figure(width=7.0, height=5.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)  # a renderer for text extents (label placement)
    return fig


def safe_name(text: str) -> str:
    """File-name friendly text: letters, digits, '.', '-', '_' kept, the rest '-'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-") or "plot"


def save_figure(fig, directory, stem: str, formats: Sequence[str] = ("png", "svg"), dpi: int = 120) -> list[str]:
    """Write ``fig`` as ``<directory>/<stem>.<fmt>`` for each format (atomically, with the
    permissions the umask gives new files); returns the paths."""
    try:
        os.makedirs(directory, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise UserError(f"cannot create the directory {directory}: a file is in the way; "
                        "give a directory for the figures") from None
    except OSError as exc:
        raise UserError(f"cannot create the directory {directory}: {exc.strerror}") from None
    mask = os.umask(0)
    os.umask(mask)
    paths = []
    for fmt in formats:
        path = os.path.join(directory, f"{safe_name(stem)}.{fmt}")
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=f".{fmt}", dir=directory)
        try:
            with os.fdopen(fd, "wb") as handle:
                fig.savefig(handle, format=fmt, dpi=dpi, bbox_inches="tight")
            os.chmod(tmp, 0o666 & ~mask)  # mkstemp creates 0600
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        paths.append(path)
    return paths


# --------------------------------------------------------------------------------------
# Data from logs


def runs_frame(log_or_records):
    """The runs table (one row per run identity, medians over its successful trials) of a log, logs or records."""
    source = log_or_records
    if isinstance(source, (str, os.PathLike)) or (isinstance(source, (list, tuple)) and source
                                                   and all(isinstance(s, (str, os.PathLike)) for s in source)):
        paths = [source] if isinstance(source, (str, os.PathLike)) else list(source)
        for path in paths:
            if not os.path.exists(path):
                raise UserError(f"run log {str(path)!r} does not exist; log runs first (plexus-tune measure, or train with a log)",
                                parameter="log")
        source = read_runs(paths)
    return runs_table(source)


def select_runs(frame, graph: str | None = None, gpus: int | None = None):
    """Rows of the runs table for one graph (its name or source) and G, the graph's name and G; UserError naming what is there."""
    if frame.empty:
        raise UserError("the run log has no successful run")
    graphs = sorted(set(frame["graph_name"].dropna().astype(str)))
    if graph is None:
        if len(graphs) != 1:
            raise UserError(f"the log holds several graphs ({', '.join(graphs)}); choose one", parameter="graph")
        graph = graphs[0]
    mask = np.zeros(len(frame), dtype=bool)
    for col in ("graph_name", "graph"):
        mask |= frame[col].astype(str).to_numpy() == str(graph)
    sub = frame[mask]
    if sub.empty:
        raise UserError(f"no run of graph {graph!r} in the log; it holds {', '.join(graphs) or 'none'}")
    if gpus is None:
        counts = sorted(set(sub["gpus"].astype(int)))
        if len(counts) != 1:
            raise UserError(f"graph {graph!r} was run on several GPU counts ({', '.join(map(str, counts))}); choose one",
                            parameter="gpus")
        gpus = counts[0]
    sub = sub[sub["gpus"].astype(int) == int(gpus)]
    if sub.empty:
        raise UserError(f"no run of graph {graph!r} on {gpus} GPUs in the log")
    names = sorted(set(sub["graph_name"].dropna().astype(str)))
    # one graph, one name: chosen by its source (a file, a spec) or its name, it is called by its name
    return sub.reset_index(drop=True), (names[0] if len(names) == 1 else str(graph)), int(gpus)


def pred_obs_frame(runs, machine=None):
    """One row per grid (and setting) of runs-table rows: the observed medians and the prediction.

    Predictions come from ``machine`` (a profile: predicted again with the cost model)
    or, without one, from the predictions the runs were logged with; the profile's
    fixed per-epoch overhead is its own part, ``pred_overhead_ms``. The observed parts
    are the runs' partition of the epoch (``obs_part_<key>``, with ``obs_wait_ms`` the
    imbalance/wait remainder) where logged, else the per-key maxima over ranks.
    Columns: grid (with the setting when several are selected), gx, gy, gz, trials,
    obs_epoch_ms, obs_epoch_ms_std, obs_<key>, pred_total_ms, pred_<key>, pred_feasible
    (keys: :data:`BREAKDOWN_PARTS` and comm_ms).
    """
    keys = [k for k, _, _ in BREAKDOWN_PARTS] + ["comm_ms"]
    if machine is not None:
        runs = predict_runs(runs, machine)
    frame = runs.copy()
    labels = setting_labels(frame)
    frame["grid"] = [f"{g} ({s})" if s else g for g, s in zip(frame["grid"], labels)]
    for key in keys:
        part = f"obs_part_{key}"
        if part in frame:  # the partition of the epoch, where the runs logged one
            frame[f"obs_{key}"] = frame[part].where(frame[part].notna(), frame.get(f"obs_{key}"))
        for prefix in ("obs_", "pred_"):
            if prefix + key not in frame:
                frame[prefix + key] = np.nan
    frame = frame.sort_values("grid").reset_index(drop=True)
    columns = ["grid", "gx", "gy", "gz", "trials", "obs_epoch_ms", "obs_epoch_ms_std", *(f"obs_{k}" for k in keys),
               "pred_total_ms", *(f"pred_{k}" for k in keys), "pred_feasible"]
    frame = frame[columns]
    if frame["pred_total_ms"].isna().all():
        raise UserError("the runs carry no prediction; give a machine profile to predict them", parameter="machine")
    return frame


def predicted_frame(pred, order=None):
    """A breakdown frame of cost-model predictions (:func:`plexus_tune.model.prediction.predict_run_grids`):
    ``grid``, ``pred_total_ms`` (the total) and ``pred_<key>`` of every :data:`BREAKDOWN_PARTS`
    key the model predicts, rows in ``order`` (default: all)."""
    import pandas as pd

    order = np.arange(len(pred["total_ms"])) if order is None else np.asarray(order)
    frame = pd.DataFrame({"grid": [format_grid((pred["gx"][i], pred["gy"][i], pred["gz"][i])) for i in order]})
    frame["pred_total_ms"] = np.asarray(pred["total_ms"], dtype=float)[order]
    for key, _, _ in BREAKDOWN_PARTS:
        if key in pred:  # observed-only parts (wait) have no prediction
            frame[f"pred_{key}"] = np.asarray(pred[key], dtype=float)[order]
    return frame


#: most GPU counts a scaling plot draws (one point each)
SCALING_POINTS = 4096


def scaling_frame(datasets: Iterable[str], machine, gpus: Sequence[int], *, layers=3, hidden=128):
    """Predicted best feasible grid and epoch time for every dataset and G (rows without a feasible grid are dropped)."""
    import pandas as pd

    if len(gpus) > SCALING_POINTS:
        raise UserError(f"a scaling plot draws one point per GPU count: {len(gpus):,} counts is more than the "
                        f"{SCALING_POINTS:,} a plot can show; give a list or a range with :pow2", parameter="gpus")
    rows = []
    for name in datasets:
        workload = workload_from_dataset(name, layers=layers, hidden=hidden)
        grids = np.concatenate([np.asarray(enumerate_grids(g), dtype=np.int64).reshape(-1, 3) for g in gpus])
        pred = predict_run_grids(workload, machine, grids)
        total = np.where(pred["feasible"], np.asarray(pred["total_ms"], dtype=float), np.inf)
        per_g = grids.prod(axis=1)
        for g in gpus:
            idx = np.flatnonzero(per_g == g)
            j = idx[int(np.argmin(total[idx]))]
            if np.isfinite(total[j]):
                rows.append({"dataset": workload.name, "gpus": int(g), "best_grid": format_grid(grids[j]),
                             "pred_total_ms": float(total[j])})
    return pd.DataFrame(rows, columns=["dataset", "gpus", "best_grid", "pred_total_ms"])


def observed_scaling_frame(runs):
    """Best observed epoch per (graph, G) (and setting, when several) of a runs table: dataset, gpus, best_grid, obs_epoch_ms."""
    import pandas as pd

    if runs.empty:
        return pd.DataFrame(columns=["dataset", "gpus", "best_grid", "obs_epoch_ms"])
    runs = runs.assign(dataset=[f"{g} ({s})" if s else g for g, s in zip(runs["graph_name"], setting_labels(runs))])
    best = runs.loc[runs.groupby(["dataset", "gpus"], sort=True)["obs_epoch_ms"].idxmin()]
    return best.rename(columns={"grid": "best_grid"})[["dataset", "gpus", "best_grid", "obs_epoch_ms"]].reset_index(drop=True)


# --------------------------------------------------------------------------------------
# Figures


def plot_pred_vs_obs(frame, *, title: str = "", label_points: bool = True):
    """Observed against predicted epoch time, one labelled point per grid, y = x, and the picks.

    Marked: the recommended grid (best predicted among feasible ones, a star) and the
    observed best (a ring). The legend gives Spearman's rho and R^2 about y = x, and what the
    error bars are (the standard deviation of the observed epoch over the trials).
    """
    fig = _figure()
    ax = fig.add_subplot()
    pred = frame["pred_total_ms"].to_numpy(dtype=float)
    obs = frame["obs_epoch_ms"].to_numpy(dtype=float)
    rho, r2 = spearman(pred, obs), r2_identity(pred, obs)
    mape, ratio = mape_percent(pred, obs), median_ratio(pred, obs)
    ax.scatter(pred, obs, s=36, color="#4c72b0", zorder=3,
               label=f"grids (n={len(frame)}): Spearman {rho:.3f}, R$^2$ {r2:.3f},\n"
                     f"MAPE {mape:.1f} %, median obs/pred {ratio:.2f}")
    std = frame["obs_epoch_ms_std"].fillna(0).to_numpy(dtype=float) if "obs_epoch_ms_std" in frame else np.zeros(len(frame))
    if (std > 0).any():
        ax.errorbar(pred, obs, yerr=std, fmt="none", ecolor="#4c72b0", alpha=0.5, zorder=2,
                    label="bars: observed +- std over the trials")
    lo = float(np.nanmin(np.concatenate([pred, obs - std])))  # the axes hold the error bars whole
    hi = float(np.nanmax(np.concatenate([pred, obs + std])))
    pad = 0.05 * (hi - lo if hi > lo else max(abs(hi), 1.0))
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="grey", linestyle="--", linewidth=1, label="y = x")
    big = 0.12 * (hi - lo if hi > lo else max(abs(hi), 1.0))  # room for the labels
    ax.set_xlim(lo - big, hi + big)
    ax.set_ylim(lo - big, hi + big)
    feasible = frame["pred_feasible"].to_numpy(dtype=bool) if "pred_feasible" in frame else np.ones(len(frame), dtype=bool)
    if feasible.any():
        rec = int(np.flatnonzero(feasible)[np.argmin(pred[feasible])])
        ax.scatter([pred[rec]], [obs[rec]], marker="*", s=260, color="#dd8452", zorder=4,
                   label=f"recommended {frame['grid'].iloc[rec]}")
    best = int(np.nanargmin(obs))
    ax.scatter([pred[best]], [obs[best]], marker="o", s=260, facecolors="none", edgecolors="#c44e52", linewidths=2,
               zorder=5, label=f"observed best {frame['grid'].iloc[best]}")
    ax.set_xlabel("predicted epoch time (ms)")
    ax.set_ylabel("observed epoch time (ms)")
    ax.set_title(title or "predicted vs observed epoch time")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.grid(True, alpha=0.3)
    if label_points:
        sizes = np.full(len(pred), 36.0)
        sizes[best] = 260.0
        if feasible.any():
            sizes[rec] = 260.0
        place_labels(ax, pred, obs, [str(g) for g in frame["grid"]], marker_sizes=sizes, fontsize=8)
    return fig


def _marker_boxes(ax, x, y, marker_sizes):
    """Display-space boxes (x0, y0, x1, y1) of scatter markers of area ``marker_sizes`` (points^2)."""
    xy = ax.transData.transform(np.column_stack([x, y]))
    half = np.sqrt(np.asarray(marker_sizes, dtype=float)) / 2 * ax.figure.dpi / 72.0
    return np.column_stack([xy[:, 0] - half, xy[:, 1] - half, xy[:, 0] + half, xy[:, 1] + half])


def _overlap(box, boxes) -> float:
    """Total intersection area of ``box`` with each of ``boxes`` (display units)."""
    if len(boxes) == 0:
        return 0.0
    b = np.asarray(boxes, dtype=float).reshape(-1, 4)
    w = np.clip(np.minimum(box[2], b[:, 2]) - np.maximum(box[0], b[:, 0]), 0, None)
    h = np.clip(np.minimum(box[3], b[:, 3]) - np.maximum(box[1], b[:, 1]), 0, None)
    return float((w * h).sum())


def place_labels(ax, x, y, labels, *, marker_sizes=None, fontsize=8):
    """Label points without overlaps: each label takes the first offset around its point
    (8 directions, growing radii) whose box meets no marker and no label placed before;
    if none is free, the offset with the least overlap. Axis limits must be final.
    Returns the Text objects."""
    fig = ax.figure
    fig.canvas.draw()  # runs the layout: the axes take their final place
    fig.set_layout_engine("none")  # and keep it, so the placement below stays valid
    renderer = fig.canvas.get_renderer()
    sizes = np.full(len(x), 36.0) if marker_sizes is None else np.asarray(marker_sizes, dtype=float)
    markers = _marker_boxes(ax, x, y, sizes)
    pixels = fig.dpi / 72.0
    directions = [(1, 1), (1, -1), (-1, 1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1)]
    placed, texts = [], []
    for i in np.argsort(-np.asarray(y, dtype=float), kind="stable"):  # top to bottom
        text = ax.annotate(labels[i], (x[i], y[i]), textcoords="offset points", xytext=(0, 0), fontsize=fontsize,
                           ha="center", va="center", annotation_clip=False)
        ext = text.get_window_extent(renderer)
        w, h = ext.width, ext.height
        cx, cy = ax.transData.transform((x[i], y[i]))
        r0 = np.sqrt(sizes[i]) / 2 * pixels + 2
        best = None
        for radius in (r0, r0 + 6, r0 + 14, r0 + 26, r0 + 42):
            for dx, dy in directions:
                ox = dx * (radius + w / 2)
                oy = dy * (radius + h / 2)
                box = np.array([cx + ox - w / 2, cy + oy - h / 2, cx + ox + w / 2, cy + oy + h / 2])
                cost = _overlap(box, markers) + _overlap(box, placed)
                if best is None or cost < best[0]:
                    best = (cost, ox, oy, box)
                if cost == 0:
                    break
            if best[0] == 0:
                break
        _, ox, oy, box = best
        text.xyann = (ox / pixels, oy / pixels)
        placed.append(box)
        texts.append(text)
    return texts


def plot_breakdown(frame, *, title: str = "", observed: bool | None = None):
    """Stacked bars per grid (:data:`BREAKDOWN_PARTS`): predicted and, if present, observed side by side.

    ``frame`` has ``grid`` and ``pred_<key>`` (and ``obs_<key>``) columns, as
    :func:`pred_obs_frame` makes; the number of bar segments is grids x parts x sides.
    Grids are sorted by time (observed epoch, else predicted total); a black line marks
    each observed epoch; the y axis leaves room above the tallest bar.
    """
    if observed is None:
        observed = any(f"obs_{k}" in frame and frame[f"obs_{k}"].notna().any() for k, _, _ in BREAKDOWN_PARTS)
    # sorted by time: observed epoch when observed, else the predicted total
    time_col = "obs_epoch_ms" if observed and "obs_epoch_ms" in frame else "pred_total_ms"
    if time_col not in frame:
        parts = [f"pred_{k}" for k, _, _ in BREAKDOWN_PARTS if f"pred_{k}" in frame]
        frame = frame.assign(pred_total_ms=frame[parts].fillna(0.0).sum(axis=1))
    frame = frame.sort_values(time_col, kind="stable").reset_index(drop=True)
    sides = [("pred", "predicted", 1.0)] + ([("obs", "observed", 0.55)] if observed else [])
    n = len(frame)
    tallest = 0.0
    fig = _figure(max(6.0, 0.6 * n * len(sides) + 2.0), 5.0)
    ax = fig.add_subplot()
    x = np.arange(n, dtype=float)
    width = 0.8 / len(sides)
    for s, (prefix, side_label, alpha) in enumerate(sides):
        bottom = np.zeros(n)
        offset = (s - (len(sides) - 1) / 2) * width
        for key, label, colour in BREAKDOWN_PARTS:
            col = f"{prefix}_{key}"
            vals = np.nan_to_num(frame[col].to_numpy(dtype=float)) if col in frame else np.zeros(n)
            shown = bool(np.any(vals > 0))  # a part of zero height everywhere gets no legend entry
            ax.bar(x + offset, vals, width * 0.95, bottom=bottom, color=colour, alpha=alpha,
                   hatch="//" if prefix == "obs" else None, edgecolor="white" if prefix == "pred" else colour,
                   label=f"{label} ({side_label})" if shown and (s == 0 or observed) else None)
            bottom += vals
        tallest = max(tallest, float(bottom.max()) if n else 0.0)
        if prefix == "obs" and "obs_epoch_ms" in frame:
            epoch = frame["obs_epoch_ms"].to_numpy(dtype=float)
            ax.hlines(epoch, x + offset - width * 0.55, x + offset + width * 0.55, colors="black", linewidths=2,
                      zorder=5, label="observed epoch")
            tallest = max(tallest, float(np.nanmax(epoch)) if n else 0.0)
    ax.set_ylim(0, tallest * 1.08 if tallest > 0 else 1.0)  # room above the tallest bar
    ax.set_xticks(x)
    ax.set_xticklabels(frame["grid"].astype(str), rotation=45, ha="right")
    ax.set_xlabel("grid Gx x Gy x Gz")
    ax.set_ylabel("epoch time (ms)")
    ax.set_title(title or ("breakdown per grid: predicted (solid) vs observed (hatched)" if observed else "predicted breakdown per grid"))
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, axis="y", alpha=0.3)
    return fig


def plot_strong_scaling(predicted, observed=None, *, title: str = "", machine: str = ""):
    """Predicted best epoch time against G, one line per dataset; observed best points where logged."""
    fig = _figure()
    ax = fig.add_subplot()
    colours = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b2", "#937860", "#da8bc3", "#8c8c8c"]
    datasets = list(dict.fromkeys(list(predicted["dataset"]) + (list(observed["dataset"]) if observed is not None else [])))
    for i, name in enumerate(datasets):
        colour = colours[i % len(colours)]
        part = predicted[predicted["dataset"] == name].sort_values("gpus")
        if not part.empty:
            ax.plot(part["gpus"], part["pred_total_ms"], marker=".", color=colour, label=f"{name} (predicted)")
        if observed is not None:
            obs = observed[observed["dataset"] == name]
            if not obs.empty:
                ax.scatter(obs["gpus"], obs["obs_epoch_ms"], marker="s", s=40, color=colour, edgecolors="black",
                           zorder=4, label=f"{name} (observed)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    plain_log_ticks(ax.yaxis)
    ax.set_xlabel("GPUs (G)")
    ax.set_ylabel("best epoch time (ms)")
    ax.set_title(title or f"strong scaling{' on ' + machine if machine else ''}: best feasible grid per G")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return fig


def plain_log_ticks(axis) -> None:
    """Plain number tick labels ("60", "200") on a log axis: decades and their 2 and 5 multiples."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    def plain(value, _pos=None):
        return f"{value:g}" if value > 0 else ""

    axis.set_major_locator(LogLocator(base=10.0, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(plain))
    axis.set_minor_locator(LogLocator(base=10.0, subs=(3.0, 4.0, 6.0, 7.0, 8.0, 9.0)))
    axis.set_minor_formatter(FuncFormatter(lambda v, p=None: ""))


def plot_search_history(trials, *, title: str = "", objective: str = "value"):
    """Objective per trial (feasible dots, infeasible crosses) and the best feasible value so far.

    ``trials`` is :func:`plexus_tune.search.trials_frame` of a study.
    """
    done = trials[(trials["state"] == "COMPLETE") & trials["value"].notna()].sort_values("number")
    if done.empty:
        raise UserError("the study has no finished trial to plot")
    feasible = done["feasible"].fillna(True).astype(bool).to_numpy()
    fig = _figure()
    ax = fig.add_subplot()
    num, val = done["number"].to_numpy(), done["value"].to_numpy(dtype=float)
    ax.scatter(num[feasible], val[feasible], s=18, color="#4c72b0", label="feasible trial", zorder=3)
    # the y range is the feasible trials'; infeasible ones outside it are drawn at its edge
    shown = val[feasible] if feasible.any() else val
    lo, hi = float(np.nanmin(shown)), float(np.nanmax(shown))
    log = bool((shown > 0).all() and hi / max(lo, 1e-300) > 30)
    if log:
        ylim = (lo / 1.3, hi * 1.3)
    else:
        pad = 0.08 * (hi - lo) if hi > lo else 0.1 * max(abs(hi), 1.0)
        ylim = (lo - pad, hi + pad)
    if (~feasible).any():
        bad = val[~feasible]
        clipped = np.clip(bad, *ylim)
        ax.scatter(num[~feasible], clipped, s=24, marker="x", color="#c44e52", zorder=3, clip_on=False,
                   label="infeasible (memory)" + (", beyond the range: at its edge" if (clipped != bad).any() else ""))
    best = np.minimum.accumulate(np.where(feasible, val, np.inf))
    ok = np.isfinite(best)
    ax.step(num[ok], best[ok], where="post", color="#dd8452", linewidth=2, label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(objective)
    if log:
        ax.set_yscale("log")
    ax.set_ylim(*ylim)
    ax.set_title(title or "search history")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    return fig


def param_importances(study, seed: int = 0) -> dict[str, float]:
    """fANOVA importances of the study's parameters (over complete trials)."""
    import optuna

    try:
        return optuna.importance.get_param_importances(study, evaluator=optuna.importance.FanovaImportanceEvaluator(seed=seed))
    except (RuntimeError, ValueError) as exc:
        raise UserError(f"cannot compute parameter importances: {exc}") from None


def plot_param_importances(importances: dict[str, float] | object, *, title: str = ""):
    """Horizontal bars, one per parameter (a dict, or a study whose importances are computed)."""
    if not isinstance(importances, dict):
        importances = param_importances(importances)
    if not importances:
        raise UserError("no parameter importances to plot (the study needs complete trials with varying parameters)")
    names = list(importances)[::-1]
    values = [importances[n] for n in names]
    fig = _figure(6.0, 0.5 * len(names) + 1.8)
    ax = fig.add_subplot()
    ax.barh(names, values, color="#4c72b0")
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.2f}", va="center", fontsize=8)
    ax.set_xlabel("importance (fANOVA)")
    ax.set_xlim(0, max(1.0, max(values) * 1.15) if all(math.isfinite(v) for v in values) else 1.0)
    ax.set_title(title or "parameter importances")
    return fig
