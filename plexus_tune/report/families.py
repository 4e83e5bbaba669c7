"""The joint ranking over families scored on measured runs (docs/algorithms.md, "Validating the
joint ranking").

Per graph, every logged configuration (family, grid, options, communication precision)
of G ranks is one row: observed = median epoch time over its successful trials,
predicted = the run's one prediction (:meth:`plexus_tune.measure.identity.RunSpec.predict`)
at its settings, the graph given (its partition and pieces). Over all rows of a graph:
Spearman of predicted against observed, regret = observed time of the predicted best
over the observed best, and each family's best configuration predicted and observed.
"""

from __future__ import annotations

import numpy as np

from plexus_tune.measure.families import configuration_label
from plexus_tune.measure.identity import RunSpec
from plexus_tune.measure.store import read_records
from plexus_tune.model.family import DEFAULT_FAMILY
from plexus_tune.model.grid import format_grid
from plexus_tune.model.prediction import PREDICTED_TIME_KEYS
from plexus_tune.report.metrics import regret, spearman


def _options_key(record: dict) -> tuple:
    opts = record.get("options") or {}
    return tuple(sorted((k, v) for k, v in opts.items() if k == "aggregation" and v))


def observed_rows(log, graph_source: str, *, gpus: int | None = None) -> list[dict]:
    """One row per configuration of ``graph_source`` (as the records name it) in ``log``:
    family, grid, options, comm_precision, epoch_ms (median over ok trials), trials."""
    records, _ = read_records(log, schema="run")
    times: dict = {}
    for r in records:
        if r.get("status") != "ok" or r.get("graph_source") != graph_source:
            continue
        grid = tuple(int(v) for v in str(r["grid"]).split("x"))
        if gpus is not None and int(np.prod(grid)) != int(gpus):
            continue
        key = (r.get("algorithm") or DEFAULT_FAMILY, grid, _options_key(r), r.get("comm_precision") or "fp32")
        times.setdefault(key, []).append(float(r["epoch_ms"]))
    rows = []
    for (family, grid, opts, precision), values in times.items():
        rows.append({"family": family, "grid": grid, "options": dict(opts), "comm_precision": precision,
                     "epoch_ms": float(np.median(values)), "trials": len(values),
                     "label": configuration_label(family, grid, dict(opts), precision)})
    return rows


def row_spec(row: dict) -> RunSpec:
    """The run of a row: its family, grid, options and communication precision as a run's fields
    (:meth:`plexus_tune.measure.identity.RunSpec.from_record`; the other settings at their defaults)."""
    return RunSpec.from_record({"algorithm": row["family"], "grid": format_grid(row["grid"]),
                                "options": dict(row["options"]), "comm_precision": row["comm_precision"]})


def predict_rows(rows: list[dict], workload, machine, graph=None) -> list[dict]:
    """``rows`` with ``total_ms`` (the predicted total) and ``predicted`` (the prediction's times: its parts,
    overhead and total): the one prediction of a run, :meth:`~plexus_tune.measure.identity.RunSpec.predict`
    of :func:`row_spec` on ``workload``, ``graph`` given to the families whose model reads it."""
    out = []
    for row in rows:
        pred = row_spec(row).predict(machine, workload=workload, graph=graph)
        parts = {key: pred[key] for key in PREDICTED_TIME_KEYS}
        out.append({**row, "total_ms": parts["total_ms"], "predicted": parts})
    return out


def score_rows(rows: list[dict]) -> dict:
    """Spearman, regret, best predicted and observed over all rows, and per family."""
    if not rows:
        return {"configurations": 0, "spearman": float("nan"), "regret": float("nan"), "families": {}}
    p = np.array([r["total_ms"] for r in rows])
    o = np.array([r["epoch_ms"] for r in rows])
    families: dict = {}
    for r in rows:
        f = families.setdefault(r["family"], {"observed_best": None, "epoch_ms": np.inf,
                                              "predicted_best": None, "total_ms": np.inf})
        if r["epoch_ms"] < f["epoch_ms"]:
            f["observed_best"], f["epoch_ms"] = r["label"], r["epoch_ms"]
        if r["total_ms"] < f["total_ms"]:
            f["predicted_best"], f["total_ms"] = r["label"], r["total_ms"]
    for f in families.values():  # the observed time of the family's predicted best
        f["predicted_best_epoch_ms"] = next(r["epoch_ms"] for r in rows if r["label"] == f["predicted_best"])
    return {"configurations": len(rows), "spearman": float(spearman(p, o)), "regret": float(regret(p, o)),
            "predicted_best": rows[int(np.argmin(p))]["label"], "observed_best": rows[int(np.argmin(o))]["label"],
            "families": families}
