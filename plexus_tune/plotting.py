"""Figures: predicted against observed, breakdowns, strong scaling, search history.

Every ``plot_*`` function takes plain data (DataFrames, an Optuna study) and returns a
matplotlib Figure (Agg backend, no display needed); :func:`save_figure` writes it as
PNG and SVG. The ``*_frame`` helpers build the DataFrames from run logs
(``plexus-tune/run-v1`` records, shared breakdown keys) and the cost model.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from collections.abc import Iterable, Sequence

import numpy as np

from plexus_tune.errors import UserError

#: Stacked components of a breakdown bar: (column suffix, label, colour).
BREAKDOWN_PARTS = (
    ("spmm_ms", "SpMM", "#4c72b0"),
    ("gemm_ms", "GEMM", "#55a868"),
    ("comm_x_ms", "comm X", "#c44e52"),
    ("comm_y_ms", "comm Y", "#dd8452"),
    ("comm_z_ms", "comm Z", "#8172b2"),
    ("other_ms", "other", "#937860"),  # predicted: elementwise work plus the fixed epoch overhead
)


def _figure(width=7.0, height=5.0):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


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
# Statistics


def spearman(x, y) -> float:
    """Spearman rank correlation (average ranks for ties); nan for fewer than 2 points."""
    from scipy.stats import spearmanr

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return float("nan")
    return float(spearmanr(x, y).statistic)


def r2_identity(predicted, observed) -> float:
    """R^2 of ``observed`` against the line y = x: 1 - sum (obs - pred)^2 / sum (obs - mean obs)^2."""
    p, o = np.asarray(predicted, dtype=float), np.asarray(observed, dtype=float)
    ss_tot = float(((o - o.mean()) ** 2).sum())
    if len(o) < 2 or ss_tot == 0:
        return float("nan")
    return 1.0 - float(((o - p) ** 2).sum()) / ss_tot


# --------------------------------------------------------------------------------------
# Data from logs


def runs_frame(log_or_records):
    """Successful run records of a log (path, list of paths, or records) as a DataFrame."""
    from plexus_tune.measure.store import records_frame

    if isinstance(log_or_records, (str, os.PathLike)) and not os.path.exists(log_or_records):
        raise UserError(f"run log {str(log_or_records)!r} does not exist; run plexus-tune measure or train --log first")
    frame = records_frame(log_or_records, schema="plexus-tune/run-v1")
    if frame.empty:
        return frame
    if "status" in frame:
        frame = frame[frame["status"].fillna("ok") == "ok"]
    return frame[frame["epoch_ms"].notna()].reset_index(drop=True) if "epoch_ms" in frame else frame.iloc[0:0]


def select_runs(frame, graph: str | None = None, gpus: int | None = None):
    """Rows of ``frame`` for one graph (its name or source) and G; UserError naming what is there."""
    if frame.empty:
        raise UserError("the run log has no successful run")
    graphs = sorted(set(frame.get("graph", frame.get("graph_source")).dropna().astype(str)))
    if graph is None:
        if len(graphs) != 1:
            raise UserError(f"the log holds several graphs ({', '.join(graphs)}); choose one with --graph")
        graph = graphs[0]
    mask = np.zeros(len(frame), dtype=bool)
    for col in ("graph", "graph_source"):
        if col in frame:
            mask |= frame[col].astype(str).to_numpy() == str(graph)
    sub = frame[mask]
    if sub.empty:
        raise UserError(f"no run of graph {graph!r} in the log; it holds {', '.join(graphs) or 'none'}")
    if gpus is None:
        counts = sorted(set(sub["gpus"].astype(int)))
        if len(counts) != 1:
            raise UserError(f"graph {graph!r} was run on several GPU counts ({', '.join(map(str, counts))}); choose one with --gpus")
        gpus = counts[0]
    sub = sub[sub["gpus"].astype(int) == int(gpus)]
    if sub.empty:
        raise UserError(f"no run of graph {graph!r} on {gpus} GPUs in the log")
    return sub.reset_index(drop=True), str(graph), int(gpus)


def workload_of_runs(runs):
    """The workload the runs trained (graph statistics and widths of the first record)."""
    from plexus_tune.model.workload import Workload

    r = runs.iloc[0]
    try:
        return Workload.from_graph_stats(str(r.get("graph", "graph")), int(r["nodes"]), int(r["nnz"]), int(r["features"]),
                                         int(r["classes"]), int(r["layers"]), int(r["hidden"]))
    except (KeyError, TypeError, ValueError):
        raise UserError("the run records lack graph statistics (nodes, nnz, features, classes); give --machine with a catalog dataset") from None


def pred_obs_frame(runs, machine=None):
    """One row per grid: observed median (and std over trials) of every breakdown key, and the prediction.

    Predictions come from ``machine`` (a profile: predicted again with the cost model)
    or, without one, from the ``predicted.*`` fields the runs were logged with.
    Columns: grid, gx, gy, gz, trials, observed_ms, observed_std_ms, obs_<key>,
    predicted_ms, pred_<key>, feasible.
    """
    import pandas as pd

    keys = [k for k, _, _ in BREAKDOWN_PARTS] + ["comm_ms"]
    rows = []
    for grid, group in runs.groupby("grid", sort=True):
        g0 = group.iloc[0]
        row = {"grid": str(grid), "gx": int(g0["gx"]), "gy": int(g0["gy"]), "gz": int(g0["gz"]), "trials": len(group),
               "observed_ms": float(group["epoch_ms"].median()), "observed_std_ms": float(group["epoch_ms"].std(ddof=0))}
        for k in keys:
            row[f"obs_{k}"] = float(group[k].median()) if k in group else float("nan")
        if machine is None:
            row["predicted_ms"] = float(group["predicted.total_ms"].mean()) if "predicted.total_ms" in group else float("nan")
            for k in keys:
                col = f"predicted.{k}"
                row[f"pred_{k}"] = float(group[col].mean()) if col in group else float("nan")
            row["feasible"] = bool(group["predicted.feasible"].iloc[0]) if "predicted.feasible" in group else True
        rows.append(row)
    frame = pd.DataFrame(rows)
    if machine is not None:
        from plexus_tune.model.costs import predict_grids

        pred = predict_grids(workload_of_runs(runs), machine, frame[["gx", "gy", "gz"]].to_numpy(dtype=np.int64))
        frame["predicted_ms"] = np.asarray(pred["total_ms"], dtype=float)
        for k in keys:
            frame[f"pred_{k}"] = np.asarray(pred[k], dtype=float)
        # the profile's fixed per-epoch overhead is shown with the other (unattributed) time
        frame["pred_other_ms"] += np.asarray(pred.get("overhead_ms", 0.0), dtype=float)
        frame["feasible"] = np.asarray(pred["feasible"], dtype=bool)
    if frame["predicted_ms"].isna().all():
        raise UserError("the runs carry no prediction; give --machine to predict them with a profile")
    return frame


def scaling_frame(datasets: Iterable[str], machine, gpus: Sequence[int], *, layers=3, hidden=128):
    """Predicted best feasible grid and epoch time for every dataset and G (rows without a feasible grid are dropped)."""
    import pandas as pd

    from plexus_tune.model.costs import predict_grids
    from plexus_tune.model.grid import enumerate_grids
    from plexus_tune.model.workload import workload_from_dataset

    rows = []
    for name in datasets:
        workload = workload_from_dataset(name, layers=layers, hidden=hidden)
        grids = np.concatenate([np.asarray(enumerate_grids(g), dtype=np.int64).reshape(-1, 3) for g in gpus])
        pred = predict_grids(workload, machine, grids)
        total = np.where(pred["feasible"], np.asarray(pred["total_ms"], dtype=float), np.inf)
        per_g = grids.prod(axis=1)
        for g in gpus:
            idx = np.flatnonzero(per_g == g)
            j = idx[int(np.argmin(total[idx]))]
            if np.isfinite(total[j]):
                rows.append({"dataset": workload.name, "gpus": int(g), "best_grid": "x".join(map(str, grids[j])),
                             "predicted_ms": float(total[j])})
    return pd.DataFrame(rows, columns=["dataset", "gpus", "best_grid", "predicted_ms"])


def observed_scaling_frame(runs):
    """Best observed epoch per (graph, G) from run records: dataset, gpus, best_grid, observed_ms."""
    import pandas as pd

    if runs.empty:
        return pd.DataFrame(columns=["dataset", "gpus", "best_grid", "observed_ms"])
    medians = runs.groupby(["graph", "gpus", "grid"], as_index=False)["epoch_ms"].median()
    best = medians.loc[medians.groupby(["graph", "gpus"])["epoch_ms"].idxmin()]
    return best.rename(columns={"graph": "dataset", "grid": "best_grid", "epoch_ms": "observed_ms"}).reset_index(drop=True)


# --------------------------------------------------------------------------------------
# Figures


def plot_pred_vs_obs(frame, *, title: str = "", label_points: bool = True):
    """Observed against predicted epoch time, one labelled point per grid, y = x, and the picks.

    Marked: the recommended grid (best predicted among feasible ones, a star) and the
    observed best (a ring). The legend gives Spearman's rho and R^2 about y = x.
    """
    fig = _figure()
    ax = fig.add_subplot()
    pred = frame["predicted_ms"].to_numpy(dtype=float)
    obs = frame["observed_ms"].to_numpy(dtype=float)
    rho, r2 = spearman(pred, obs), r2_identity(pred, obs)
    ax.scatter(pred, obs, s=36, color="#4c72b0", zorder=3, label=f"grids (n={len(frame)}): Spearman {rho:.3f}, R$^2$ {r2:.3f}")
    if "observed_std_ms" in frame and frame["observed_std_ms"].fillna(0).gt(0).any():
        ax.errorbar(pred, obs, yerr=frame["observed_std_ms"].fillna(0).to_numpy(), fmt="none", ecolor="#4c72b0", alpha=0.5, zorder=2)
    if label_points:
        for p, o, g in zip(pred, obs, frame["grid"]):
            ax.annotate(str(g), (p, o), textcoords="offset points", xytext=(4, 4), fontsize=8)
    lo = float(np.nanmin(np.concatenate([pred, obs])))
    hi = float(np.nanmax(np.concatenate([pred, obs])))
    pad = 0.05 * (hi - lo if hi > lo else max(abs(hi), 1.0))
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="grey", linestyle="--", linewidth=1, label="y = x")
    feasible = frame["feasible"].to_numpy(dtype=bool) if "feasible" in frame else np.ones(len(frame), dtype=bool)
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
    ax.legend(loc="best", fontsize=8)
    ax.grid(True, alpha=0.3)
    return fig


def plot_breakdown(frame, *, title: str = "", observed: bool | None = None):
    """Stacked bars per grid (SpMM, GEMM, comm per axis, other): predicted and, if present, observed side by side.

    ``frame`` has ``grid`` and ``pred_<key>`` (and ``obs_<key>``) columns, as
    :func:`pred_obs_frame` makes; the number of bar segments is grids x parts x sides.
    """
    if observed is None:
        observed = any(f"obs_{k}" in frame and frame[f"obs_{k}"].notna().any() for k, _, _ in BREAKDOWN_PARTS)
    sides = [("pred", "predicted", 1.0)] + ([("obs", "observed", 0.55)] if observed else [])
    n = len(frame)
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
            ax.bar(x + offset, vals, width * 0.95, bottom=bottom, color=colour, alpha=alpha,
                   hatch="//" if prefix == "obs" else None, edgecolor="white" if prefix == "pred" else colour,
                   label=f"{label} ({side_label})" if s == 0 or observed else None)
            bottom += vals
    ax.set_xticks(x)
    ax.set_xticklabels(frame["grid"].astype(str), rotation=45, ha="right")
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
            ax.plot(part["gpus"], part["predicted_ms"], marker=".", color=colour, label=f"{name} (predicted)")
        if observed is not None:
            obs = observed[observed["dataset"] == name]
            if not obs.empty:
                ax.scatter(obs["gpus"], obs["observed_ms"], marker="s", s=40, color=colour, edgecolors="black",
                           zorder=4, label=f"{name} (observed)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("GPUs (G)")
    ax.set_ylabel("best epoch time (ms)")
    ax.set_title(title or f"strong scaling{' on ' + machine if machine else ''}: best feasible grid per G")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    return fig


def plot_search_history(trials, *, title: str = "", objective: str = "value"):
    """Objective per trial (feasible dots, infeasible crosses) and the best feasible value so far.

    ``trials`` is :func:`plexus_tune.search.trials_frame` of a study (or the study itself).
    """
    if not hasattr(trials, "columns"):
        from plexus_tune.search import trials_frame

        trials = trials_frame(trials)
    done = trials[(trials["state"] == "COMPLETE") & trials["value"].notna()].sort_values("number")
    if done.empty:
        raise UserError("the study has no finished trial to plot")
    feasible = done["feasible"].fillna(True).astype(bool).to_numpy()
    fig = _figure()
    ax = fig.add_subplot()
    num, val = done["number"].to_numpy(), done["value"].to_numpy(dtype=float)
    ax.scatter(num[feasible], val[feasible], s=18, color="#4c72b0", label="feasible trial", zorder=3)
    if (~feasible).any():
        ax.scatter(num[~feasible], val[~feasible], s=24, marker="x", color="#c44e52", label="infeasible (memory)", zorder=3)
    best = np.minimum.accumulate(np.where(feasible, val, np.inf))
    ok = np.isfinite(best)
    ax.step(num[ok], best[ok], where="post", color="#dd8452", linewidth=2, label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(objective)
    if (val[np.isfinite(val)] > 0).all() and val.max() / max(val.min(), 1e-300) > 30:
        ax.set_yscale("log")
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
