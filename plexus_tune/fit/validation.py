"""Validate a machine profile on logged trainer runs: is the recommended grid the right one?

Runs are grouped by (graph, G) — one grid choice problem each. For every group held out
in turn, the epoch-level coefficients (scale factors of the predicted SpMM, GEMM,
communication and elementwise times, and an overhead per epoch; see
:func:`plexus_tune.fit.fit_epoch`) are refitted on the other groups' runs and the
held-out group is predicted. Per group:

- Spearman rank correlation of predicted and observed epoch times over its grids;
- regret = observed time of the predicted best grid / observed best time (1 is perfect);
- MAPE of predicted against observed epoch time (%).

The refit is exact under rescaling (non-negative scales of each component), so a
profile whose own scales came from all runs gets the same held-out figures as one
that never saw the runs. Observed times are medians over trials (a trial that met a
slow spell of the host does not move them); failed runs are left out. ``refit=False``
scores the profile as it is.
"""

from __future__ import annotations

import numpy as np

from plexus_tune.errors import UserError

COMPONENTS = ("spmm_ms", "gemm_ms", "comm_ms", "other_ms")


def runs_frame(records) -> "pandas.DataFrame":  # noqa: F821
    """One row per (graph, G, grid, model): median observed epoch and components over ok trials."""
    import pandas as pd

    rows = []
    for r in records:
        if r.get("status", "ok") != "ok" or r.get("epoch_ms") is None:
            continue
        missing = [k for k in ("nodes", "nnz", "widths", "gx", "gy", "gz", "epoch_ms") if r.get(k) is None]
        if missing:
            raise UserError(f"run record lacks {missing[0]!r}; is this a trainer run log (plexus-tune measure / train --log)?")
        _check_run_times(r)
        rows.append(
            {
                "graph": r.get("graph_source") or r.get("graph", "graph"),
                "graph_name": r.get("graph", "graph"),
                "nodes": int(r["nodes"]),
                "nnz": int(r["nnz"]),
                "widths": tuple(int(w) for w in r["widths"]),
                "gpus": int(r["gx"]) * int(r["gy"]) * int(r["gz"]),
                "gx": int(r["gx"]),
                "gy": int(r["gy"]),
                "gz": int(r["gz"]),
                "block_rows": (r.get("options") or {}).get("block_rows"),
                **{f"observed_{k}": float(r.get(k, np.nan) or 0.0) for k in COMPONENTS},
                "epoch_ms": float(r["epoch_ms"]),
            }
        )
    if not rows:
        raise UserError("no successful trainer runs in the log; run 'plexus-tune measure' first")
    df = pd.DataFrame(rows)
    keys = ["graph", "graph_name", "nodes", "nnz", "widths", "gpus", "gx", "gy", "gz"]
    df["block_rows"] = df["block_rows"].fillna(0).astype(int)
    keys.append("block_rows")
    agg = {c: "median" for c in df.columns if c not in keys}
    out = df.groupby(keys, sort=False).agg(agg).reset_index()
    out["trials"] = df.groupby(keys, sort=False).size().to_numpy()
    return out


def _check_run_times(record) -> None:
    """UserError unless a successful run's epoch_ms is finite and > 0 and its parts finite and >= 0."""
    for key in ("epoch_ms",) + COMPONENTS:
        value = record.get(key)
        if value is None and key != "epoch_ms":
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = float("nan")
        if not np.isfinite(number) or number < 0 or (key == "epoch_ms" and number == 0):
            where = f"run {record.get('gx')}x{record.get('gy')}x{record.get('gz')} of {record.get('graph_source') or record.get('graph', 'graph')}"
            stamp = f" at {record['timestamp']}" if record.get("timestamp") else ""
            need = "a finite time > 0" if key == "epoch_ms" else "a finite time >= 0"
            raise UserError(f"{where}{stamp}: {key} = {value!r} is not {need}; fix or remove that record (a run that did not finish needs status 'failed')")


def predict_runs(df, machine) -> "pandas.DataFrame":  # noqa: F821
    """Add the profile's predicted components (``pred_spmm_ms``...) and ``pred_total_ms``."""
    from plexus_tune.model.costs import predict_grids
    from plexus_tune.model.machine import load_machine
    from plexus_tune.model.workload import Workload

    machine = load_machine(machine)
    df = df.copy()
    for key in COMPONENTS + ("total_ms",):
        df[f"pred_{key}"] = np.nan
    for (name, nodes, nnz, widths, block), idx in df.groupby(["graph_name", "nodes", "nnz", "widths", "block_rows"], sort=False).groups.items():
        workload = Workload(name=str(name), nodes=int(nodes), nnz=int(nnz), widths=tuple(widths))
        grids = df.loc[idx, ["gx", "gy", "gz"]].to_numpy()
        pred = predict_grids(workload, machine, grids, block_rows=int(block) or None)
        for key in COMPONENTS:
            df.loc[idx, f"pred_{key}"] = pred[key]
        df.loc[idx, "pred_total_ms"] = pred["total_ms"]
    return df


def spearman(a, b) -> float:
    """Spearman rank correlation (average ranks for ties); nan for fewer than 2 points."""
    import pandas as pd  # its average-rank is cheaper to import than scipy.stats

    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 2:
        return float("nan")
    ra, rb = pd.Series(a).rank().to_numpy(), pd.Series(b).rank().to_numpy()
    if np.std(ra) == 0 or np.std(rb) == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def regret(predicted, observed) -> float:
    """Observed time of the predicted best over the observed best (>= 1)."""
    predicted, observed = np.asarray(predicted, float), np.asarray(observed, float)
    return float(observed[int(np.argmin(predicted))] / observed.min())


def group_scores(predicted, observed) -> dict:
    predicted, observed = np.asarray(predicted, float), np.asarray(observed, float)
    return {
        "grids": int(len(observed)),
        "spearman": spearman(predicted, observed),
        "regret": regret(predicted, observed),
        "mape": float(100.0 * np.mean(np.abs(predicted - observed) / observed)),
    }


def leave_one_group_out(df, machine, *, refit: bool = True) -> dict:
    """Per (graph, G) held out: Spearman, regret and MAPE; and their means.

    ``df`` is :func:`runs_frame` output. Returns ``{"groups": [...], "mean": {...}}``.
    """
    from plexus_tune.fit import fit_epoch, min_rows

    df = predict_runs(df, machine)
    keys = df[["graph", "gpus"]].apply(tuple, axis=1)
    groups = list(dict.fromkeys(keys))
    out = []
    for key in groups:
        held = (keys == key).to_numpy()
        train = df[~held]
        pred = df.loc[held, "pred_total_ms"].to_numpy()
        how = "profile as is"
        if refit and len(train) >= min_rows(len(COMPONENTS) + 1):
            frame = train[[f"pred_{c}" for c in COMPONENTS] + [f"observed_{c}" for c in COMPONENTS] + ["epoch_ms"]].rename(columns={f"pred_{c}": c for c in COMPONENTS})
            model = fit_epoch(frame, n_splits=0)
            test = df.loc[held, [f"pred_{c}" for c in COMPONENTS]].rename(columns={f"pred_{c}": c for c in COMPONENTS})
            pred = model.predict(test)
            how = f"refitted on {len(train)} other runs"
        scores = group_scores(pred, df.loc[held, "epoch_ms"].to_numpy())
        best = df.loc[held].iloc[int(np.argmin(pred))]
        true_best = df.loc[held].iloc[int(np.argmin(df.loc[held, "epoch_ms"].to_numpy()))]
        out.append(
            {
                "graph": key[0],
                "gpus": int(key[1]),
                **scores,
                "predicted_best": f"{best.gx}x{best.gy}x{best.gz}",
                "observed_best": f"{true_best.gx}x{true_best.gy}x{true_best.gz}",
                "how": how,
            }
        )
    mean = {
        "spearman": float(np.nanmean([g["spearman"] for g in out])) if out else float("nan"),
        "regret": float(np.mean([g["regret"] for g in out])) if out else float("nan"),
        "max_regret": float(np.max([g["regret"] for g in out])) if out else float("nan"),
        "mape": float(np.mean([g["mape"] for g in out])) if out else float("nan"),
        "groups": len(out),
    }
    return {"groups": out, "mean": mean}
