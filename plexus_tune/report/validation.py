"""Validate a machine profile on logged trainer runs: is the recommended grid the right one?

Runs are reduced to the runs table (:func:`plexus_tune.measure.table.runs_table`: one
row per run identity, the median over its successful trials; failed runs left out) and
grouped into grid choice problems: one per setting (the run identity without the grid)
and G. For every problem held out in turn, the epoch-level coefficients (scale factors
of the predicted SpMM, GEMM, communication and elementwise times, and an overhead per
epoch; see :func:`plexus_tune.fit.fit_epoch`) are refitted on the other problems' rows
and the held-out one is predicted. Per problem:

- Spearman rank correlation of predicted and observed epoch times over its grids;
- regret = observed time of the predicted best grid / observed best time (1 is perfect);
- MAPE of predicted against observed epoch time (%).

The refit is exact under rescaling (non-negative scales of each component), so a
profile whose own scales came from all runs gets the same held-out figures as one
that never saw the runs. ``refit=False`` scores the profile as it is.
"""

from __future__ import annotations

import numpy as np

from plexus_tune.fit.epoch import EPOCH_COMPONENTS, epoch_parameters, fit_epoch
from plexus_tune.fit.scoring import min_rows
from plexus_tune.report.metrics import group_scores
from plexus_tune.measure.identity import SETTING_NAMES, setting_labels
from plexus_tune.measure.table import predict_runs

COMPONENTS = EPOCH_COMPONENTS


def _nanmean(values) -> float:
    """Mean of the finite values (nan when there is none, without a warning)."""
    finite = [v for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


def problem_keys(df) -> list[str]:
    """Columns that split a runs table into grid choice problems: the setting and G."""
    return [c for c in SETTING_NAMES if c in df] + ["gpus"]


def leave_one_group_out(df, machine, *, refit: bool = True) -> dict:
    """Per grid choice problem (setting and G) held out: Spearman, regret and MAPE; and their means.

    MAPE and regret average over every group; Spearman, a ranking, over the groups of two or more
    grids (``spearman_groups`` of them; a one-grid group's Spearman is nan and shown as "-").

    ``df`` is the runs table (:func:`plexus_tune.measure.table.runs_table`). Returns
    ``{"groups": [...], "mean": {...}, "runs": [...]}``; each group names its ``graph``,
    ``gpus`` and ``setting`` (the other setting fields that differ between groups, "" if
    none do); each run its grid, ``profile_total_ms`` (the profile's prediction at the run's
    settings), ``total_ms`` (after the held-out refit, or the same) and ``epoch_ms`` (observed).
    """
    df = predict_runs(df, machine).reset_index(drop=True)
    keys = problem_keys(df)
    problem = df[keys].apply(tuple, axis=1)
    labels = dict(zip(problem, setting_labels(df)))
    groups = list(dict.fromkeys(problem))
    pred_cols = [f"pred_{c}" for c in COMPONENTS]
    out, runs = [], []
    for key in groups:
        held = (problem == key).to_numpy()
        train = df[~held]
        pred = df.loc[held, "pred_total_ms"].to_numpy()
        how = "profile as is"
        if refit and len(train) >= min_rows(epoch_parameters(train)):
            model = fit_epoch(train, n_splits=0)
            pred = model.predict(df.loc[held, pred_cols])
            how = f"refitted on {len(train)} other runs"
        observed = df.loc[held, "obs_epoch_ms"].to_numpy()
        scores = group_scores(pred, observed)
        for (_, row), p, o in zip(df.loc[held].iterrows(), pred, observed):
            runs.append({"graph": str(row["graph"]), "gpus": int(row["gpus"]), "setting": labels[key], "grid": row["grid"],
                         "comm_precision": str(row["comm_precision"]), "block_rows": int(row["block_rows"]),
                         "profile_total_ms": float(row["pred_total_ms"]), "total_ms": float(p), "epoch_ms": float(o)})
        best = df.loc[held].iloc[int(np.argmin(pred))]
        true_best = df.loc[held].iloc[int(np.argmin(observed))]
        first = df.loc[held].iloc[0]
        out.append(
            {
                "graph": str(first["graph"]),
                "gpus": int(first["gpus"]),
                "setting": labels[key],
                **scores,
                "predicted_best": best["grid"],
                "observed_best": true_best["grid"],
                "how": how,
            }
        )
    ranked = [g for g in out if g["grids"] >= 2]  # a ranking needs two grids: one-grid groups have none
    mean = {
        "spearman": _nanmean([g["spearman"] for g in ranked]),
        "spearman_groups": len(ranked),
        "regret": float(np.mean([g["regret"] for g in out])) if out else float("nan"),
        "max_regret": float(np.max([g["regret"] for g in out])) if out else float("nan"),
        "mape": float(np.mean([g["mape"] for g in out])) if out else float("nan"),
        "groups": len(out),
    }
    return {"groups": out, "mean": mean, "runs": runs, "parts": part_errors(df)}


#: a prediction whose fixed per-epoch overhead is at least this share of its total says so
OVERHEAD_NOTE_SHARE = 0.25


def overhead_note(predicted: dict, observed_ms: float | None = None) -> str | None:
    """A line saying that a prediction leans on the profile's fixed per-epoch overhead (at least
    :data:`OVERHEAD_NOTE_SHARE` of ``predicted["total_ms"]``), with what its parts alone predict; else None."""
    total, overhead = float(predicted.get("total_ms") or 0.0), float(predicted.get("overhead_ms") or 0.0)
    if total <= 0 or overhead / total < OVERHEAD_NOTE_SHARE:
        return None
    against = f" against {observed_ms:.2f} ms observed" if observed_ms is not None else ""
    return (f"note: {overhead / total:.0%} of the prediction is the profile's fixed overhead ({overhead:.2f} ms per epoch, "
            f"fitted to the runs it was fitted on): its parts alone predict {total - overhead:.2f} ms{against}")


def part_errors(df) -> dict:
    """The profile's predicted parts against the observed ones over the runs of ``df`` (with the
    profile's predictions, :func:`plexus_tune.measure.table.predict_runs`): per part of
    :data:`COMPONENTS` observed above 0, ``mape`` (%) and ``ratio`` (median predicted / observed);
    ``overhead_share``, the mean fraction of the predicted total that is the fixed per-epoch overhead."""
    out: dict = {}
    for part in COMPONENTS:
        pred, obs = f"pred_{part}", f"obs_{part}"
        if pred not in df or obs not in df:
            continue
        p, o = df[pred].to_numpy(dtype=float), df[obs].to_numpy(dtype=float)
        ok = np.isfinite(p) & np.isfinite(o) & (o > 0)
        if ok.any():
            out[part] = {"mape": float(np.mean(np.abs(p[ok] - o[ok]) / o[ok]) * 100),
                         "ratio": float(np.median(p[ok] / o[ok])), "runs": int(ok.sum())}
    if "pred_overhead_ms" in df and "pred_total_ms" in df:
        total = df["pred_total_ms"].to_numpy(dtype=float)
        ok = np.isfinite(total) & (total > 0)
        if ok.any():
            out["overhead_share"] = float(np.mean(df["pred_overhead_ms"].to_numpy(dtype=float)[ok] / total[ok]))
    return out
