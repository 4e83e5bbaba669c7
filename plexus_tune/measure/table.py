"""The runs table: one row per run identity, medians over its successful trials (docs/records.md, "Runs table").

:func:`runs_table` reduces run records (observed ``obs_<key>``, logged predictions
``pred_<key>``, trial counts and spread; failed trials counted, never pooled);
:func:`predict_runs` replaces the logged predictions by a profile's.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping

from plexus_tune.errors import UserError
from plexus_tune.graph.io import resolve_graph
from plexus_tune.measure.identity import (
    IDENTITY_NAMES,
    RunIdentity,
    RunSpec,
    grid_label,
    run_identity,
    run_widths,
)
from plexus_tune.measure.records import DTYPE_BYTES, record_type, upgrade
from plexus_tune.model.breakdown import BREAKDOWN_KEYS
from plexus_tune.model.family import GraphContext, family_of
from plexus_tune.model.machine import load_machine
from plexus_tune.model.prediction import predict_run_grids, prediction_of


#: Observed timing keys of a run record, each reduced to ``obs_<key>``.
OBSERVED_KEYS = ("epoch_ms", *BREAKDOWN_KEYS, "fwd_ms", "bwd_ms", "loss_ms", "optimizer_ms", "wait_ms")
#: Keys of a run's ``breakdown_ms`` (the epoch partitioned), each reduced to ``obs_part_<key>``;
#: a phase a newer trainer adds appears as its own column.
PARTITION_COLUMNS_PREFIX = "obs_part_"
#: Predicted keys of a prediction (docs/records.md), each given as ``pred_<key>``.
PREDICTED_KEYS = ("total_ms", *BREAKDOWN_KEYS, "overhead_ms")
#: Graph statistics of the runs (as logged), not part of the identity.
GRAPH_COLUMNS = ("graph_name", "graph_nodes", "nnz", "features", "classes", "widths")
#: Run record fields the runs table needs from a successful run.
REQUIRED_FIELDS = ("graph_nodes", "nnz", "gx", "gy", "gz", "epoch_ms")


#: the longest time a run record may hold (ms; 30,000 years): beyond it sums and squares overflow
MAX_TIME_MS = 1e15


def check_run_times(record: Mapping) -> None:
    """UserError unless a successful run's epoch_ms is finite and > 0 and its other times finite and >= 0,
    every one at most :data:`MAX_TIME_MS`.

    The message names the run by grid, graph and timestamp.
    """
    for key in OBSERVED_KEYS:
        value = record.get(key)
        if value is None and key != "epoch_ms":
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = float("nan")
        if not math.isfinite(number) or number < 0 or number > MAX_TIME_MS or (key == "epoch_ms" and number == 0):
            where = f"run {record.get('gx')}x{record.get('gy')}x{record.get('gz')} of {record.get('graph_source') or record.get('graph', 'graph')}"
            stamp = f" at {record['timestamp']}" if record.get("timestamp") else ""
            need = ("a finite time > 0" if key == "epoch_ms" else "a finite time >= 0") + f" of at most {MAX_TIME_MS:g} ms"
            raise UserError(f"{where}{stamp}: {key} = {value!r} is not {need}; fix or remove that record "
                            "(a run that did not finish needs status 'failed')")


def _number(value) -> float:
    try:
        return float(value) if value is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def runs_table(records: Iterable[Mapping], *, include_failed: bool = False):
    """One row per run identity (and graph as measured): medians over the successful trials.

    Columns (docs/records.md, "Runs table"): the identity (:data:`IDENTITY_NAMES` and
    ``identity``, the :class:`RunIdentity`), ``grid``, ``gpus``, ``bytes_per_element``,
    the graph (:data:`GRAPH_COLUMNS`); ``trials`` (successful), ``failed`` (failed
    trials of the identity) and ``last_failure``; ``obs_<key>`` for
    :data:`OBSERVED_KEYS` (median over the successful trials), ``obs_epoch_ms_std``
    (population std), ``obs_epoch_ms_min``, ``obs_epoch_ms_max``; ``pred_<key>`` for
    :data:`PREDICTED_KEYS` from the logged predictions (median), ``pred_feasible``,
    ``pred_machine``; ``timestamp`` of the latest successful trial.

    Records of other types are ignored. A successful run with a NaN, infinite or
    negative time (or a zero epoch) raises UserError naming it. Identities whose every
    trial failed are left out unless ``include_failed`` (then ``trials`` is 0 and the
    observed columns NaN).
    """
    import pandas as pd

    rows: list[dict] = []
    failures: dict[RunIdentity, list[dict]] = {}
    for record in records:
        kind = record_type(record)
        if kind is not None and kind != "run":
            continue
        rec = upgrade(record, kind="run")
        ident = run_identity(rec)
        if rec.get("status", "ok") != "ok" or rec.get("epoch_ms") is None:
            failures.setdefault(ident, []).append(rec)
            continue
        missing = [k for k in REQUIRED_FIELDS if rec.get(k) is None]
        widths = run_widths(rec)
        if missing or widths is None:
            name = missing[0] if missing else "widths"
            raise UserError(f"run record lacks {name!r}; is this a trainer run log (plexus-tune measure, run or train)?")
        check_run_times(rec)
        predicted = rec.get("predicted") if isinstance(rec.get("predicted"), Mapping) else {}
        row = dict(ident._asdict())
        row.update({
            "identity": ident,
            "graph_name": str(rec.get("graph") or ident.graph),
            "graph_nodes": int(rec["graph_nodes"]),
            "nnz": int(rec["nnz"]),
            "features": int(rec["features"]) if rec.get("features") is not None else int(widths[0]),
            "classes": int(rec["classes"]) if rec.get("classes") is not None else int(widths[-1]),
            "widths": widths,
            "timestamp": str(rec.get("timestamp") or ""),
        })
        for key in OBSERVED_KEYS:
            row[f"obs_{key}"] = _number(rec.get(key))
        if isinstance(rec.get("breakdown_ms"), Mapping):
            for key, value in rec["breakdown_ms"].items():
                row[f"{PARTITION_COLUMNS_PREFIX}{key}"] = _number(value)
        for key in PREDICTED_KEYS:
            row[f"pred_{key}"] = _number(predicted.get(key))
        row["pred_feasible"] = bool(predicted.get("feasible", True))
        row["pred_machine"] = str(predicted.get("machine") or "")
        rows.append(row)

    keys = ["identity", *GRAPH_COLUMNS]
    obs = [f"obs_{k}" for k in OBSERVED_KEYS]
    pred = [f"pred_{k}" for k in PREDICTED_KEYS]
    out_rows = []
    parts = list(dict.fromkeys(k for row in rows for k in row if k.startswith(PARTITION_COLUMNS_PREFIX)))
    obs += parts
    if rows:
        trials = pd.DataFrame(rows)
        for _, group in trials.groupby(keys, sort=False, dropna=False):
            first = group.iloc[0]
            out = {n: first[n] for n in IDENTITY_NAMES}
            out.update({k: first[k] for k in keys})
            out.update(group[obs + pred].median(skipna=True).to_dict())
            epoch = group["obs_epoch_ms"].to_numpy(dtype=float)
            out.update(obs_epoch_ms_std=float(epoch.std()), obs_epoch_ms_min=float(epoch.min()),
                       obs_epoch_ms_max=float(epoch.max()), trials=len(group),
                       pred_feasible=bool(group["pred_feasible"].all()), pred_machine=str(group["pred_machine"].iloc[-1]),
                       timestamp=str(group["timestamp"].max()))
            out_rows.append(out)
    seen = {r["identity"] for r in out_rows}
    for r in out_rows:
        fails = failures.get(r["identity"], [])
        r["failed"] = len(fails)
        r["last_failure"] = _failure_text(fails[-1]) if fails else ""
    if include_failed:
        for ident, fails in failures.items():
            if ident in seen:
                continue
            r = {**ident._asdict(), "identity": ident, "graph_name": str(fails[-1].get("graph") or ident.graph),
                 "trials": 0, "failed": len(fails), "last_failure": _failure_text(fails[-1]),
                 "timestamp": "", "pred_feasible": True, "pred_machine": ""}
            out_rows.append(r)
    columns = [*IDENTITY_NAMES, "identity", "grid", "gpus", "bytes_per_element", *GRAPH_COLUMNS, "trials", "failed",
               "last_failure", *obs, "obs_epoch_ms_std", "obs_epoch_ms_min", "obs_epoch_ms_max", *pred,
               "pred_feasible", "pred_machine", "timestamp"]
    table = pd.DataFrame(out_rows, columns=columns)
    if len(table):
        table["grid"] = [grid_label(i) for i in table["identity"]]
        table["gpus"] = (table["dp"] * table["gx"] * table["gy"] * table["gz"]).astype(int)  # dp groups of the grid
        table["bytes_per_element"] = [DTYPE_BYTES.get(d, 4) for d in table["dtype"]]
        table["trials"] = table["trials"].astype(int)
        table["failed"] = table["failed"].astype(int)
    table.attrs["failed_trials"] = sum(len(f) for f in failures.values())
    return table


def run_graph_context(spec: RunSpec) -> GraphContext | None:
    """The :class:`GraphContext` of a run's graph (:attr:`RunSpec.graph`, the logged source: a file, or a
    synthetic spec generated again): None where it is neither, or its file is no longer there."""
    if spec.synthetic is not None:
        return GraphContext(resolve_graph(("synthetic", spec.synthetic)))
    if not spec.graph or not os.path.isfile(spec.graph):
        return None
    return GraphContext(resolve_graph(spec.graph, pattern_only=True))


def predict_runs(table, machine, *, graphs: bool = True):
    """The runs table (successful runs) with ``machine``'s predictions instead of the logged ones.

    Every row is predicted at every setting of its identity (:meth:`RunSpec.predict` of
    :meth:`RunSpec.from_row`; rows sharing a workload and settings at once): ``pred_<key>`` of :data:`PREDICTED_KEYS`,
    ``pred_feasible``, ``pred_machine``. The values equal :meth:`RunSpec.predict` of each row.
    With ``graphs``, a run of a family whose model reads the graph (:attr:`Family.reads_graph`) is predicted
    from its graph (:func:`run_graph_context`, loaded once per graph), as the families' validation and
    ``predict --graph`` price it; where the graph is not at hand, from N and NNZ.
    """
    if table is None or len(table) == 0 or "trials" not in table or not (table["trials"] > 0).any():
        raise UserError("no successful trainer runs in the log; run 'plexus-tune measure' first")
    machine = load_machine(machine)
    df = table[table["trials"] > 0].copy()
    groups: dict = {}
    contexts: dict = {}
    values = {key: {} for key in (*PREDICTED_KEYS, "feasible")}
    for index, row in df.iterrows():
        spec = RunSpec.from_row(row)
        settings = spec.prediction_settings()
        if graphs and family_of(settings["algorithm"]).reads_graph:
            if spec.graph not in contexts:
                contexts[spec.graph] = run_graph_context(spec)
            if contexts[spec.graph] is not None:
                one = spec.predict(machine, graph=contexts[spec.graph])
                for key in (*PREDICTED_KEYS, "feasible"):
                    values[key][index] = one[key]
                continue
        workload, grid = spec.workload(), spec.grid
        # a family's own options (a dict) as sorted pairs, so that the settings form a key
        key = tuple(sorted((k, tuple(sorted(v.items())) if isinstance(v, Mapping) else v) for k, v in settings.items()))
        groups.setdefault((workload, key), []).append((index, grid))
    for (workload, settings), members in groups.items():
        settings = {k: dict(v) if k == "options" else v for k, v in settings}
        pred = predict_run_grids(workload, machine, [grid for _, grid in members], **settings)
        for j, (index, _) in enumerate(members):
            one = prediction_of(pred, j, machine=machine.name, algorithm=dict(settings)["algorithm"])
            for key in PREDICTED_KEYS:
                values[key][index] = one[key]
            values["feasible"][index] = one["feasible"]
    for key in PREDICTED_KEYS:
        df[f"pred_{key}"] = df.index.map(values[key]).astype(float)
    df["pred_feasible"] = df.index.map(values["feasible"]).astype(bool)
    df["pred_machine"] = machine.name
    return df


def _failure_text(record: Mapping) -> str:
    return f"{record.get('status', 'failed')}: {record.get('reason', '')}"[:200]
