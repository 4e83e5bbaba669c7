"""The identity of a run and its prediction (docs/records.md, "Run identity").

:data:`IDENTITY_FIELDS`: the fields of a run that change its measured time; trials of
one identity are repeated measurements of one thing. :func:`predict_record` predicts a
run at every setting of its identity (:mod:`plexus_tune.model.prediction`).
"""

from __future__ import annotations

import json
from collections import namedtuple
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from plexus_tune.errors import UserError
from plexus_tune.measure.records import DTYPE_BYTES, upgrade
from plexus_tune.model.family import DEFAULT_FAMILY, FAMILIES, record_field_names
from plexus_tune.model.grid import format_grid
from plexus_tune.model.prediction import predict_run
from plexus_tune.model.workload import Workload, model_widths


@dataclass(frozen=True)
class IdentityField:
    """One part of a run's identity: its name, where it sits in a record, its default."""

    name: str
    path: tuple[str, ...]
    default: Any
    kind: type


#: What makes two runs the same measurement (trial aside): every option that changes
#: the measured time. A missing field takes its default (the meaning it had before the
#: field existed); a new option joins the identity by a new entry here.
IDENTITY_FIELDS: tuple[IdentityField, ...] = (
    IdentityField("graph", ("graph_source",), "", str),
    IdentityField("gx", ("gx",), 0, int),
    IdentityField("gy", ("gy",), 0, int),
    IdentityField("gz", ("gz",), 0, int),
    IdentityField("layers", ("layers",), 0, int),
    IdentityField("hidden", ("hidden",), 0, int),
    IdentityField("permute", ("options", "permute"), "double", str),
    IdentityField("block_rows", ("options", "block_rows"), 0, int),
    IdentityField("overlap", ("options", "overlap"), False, bool),
    IdentityField("dtype", ("options", "dtype"), "float32", str),
    IdentityField("threads_per_rank", ("options", "threads_per_rank"), 0, int),
    IdentityField("backend", ("backend",), "gloo", str),
    IdentityField("epochs", ("epochs",), 0, int),
    IdentityField("warmup", ("warmup",), 0, int),
    IdentityField("launcher", ("launcher",), "local", str),
    IdentityField("cluster", ("cluster",), "", str),
    IdentityField("machine", ("machine",), "", str),
    IdentityField("comm_precision", ("comm_precision",), "fp32", str),
    IdentityField("layer_norm", ("options", "layer_norm"), False, bool),
    IdentityField("fixed_features", ("options", "fixed_features"), False, bool),
    IdentityField("algorithm", ("algorithm",), DEFAULT_FAMILY, str),
    IdentityField("replication", ("options", "replication"), 0, int),
    IdentityField("aggregation", ("options", "aggregation"), "", str),
    IdentityField("schedule", ("options", "schedule"), "", str),
    IdentityField("dp", ("options", "dp"), 1, int),
    IdentityField("batch_size", ("options", "batch_size"), 0, int),
)
IDENTITY_NAMES = tuple(f.name for f in IDENTITY_FIELDS)
GRID_FIELDS = ("gx", "gy", "gz")
#: The identity without the configuration: the settings a choice of algorithm and grid is made under.
#: The configuration chosen among the ways to run a setting: the algorithm family, its
#: process grid and its own options (cagnet-1.5d's c, supergcn's aggregation).
CONFIGURATION_FIELDS = tuple(dict.fromkeys(("algorithm", *GRID_FIELDS, *record_field_names(), "dp", "batch_size")))
SETTING_NAMES = tuple(n for n in IDENTITY_NAMES if n not in CONFIGURATION_FIELDS)
RunIdentity = namedtuple("RunIdentity", IDENTITY_NAMES)


def _lookup(record: Mapping, path: tuple[str, ...]):
    value = record
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _identity_value(spec: IdentityField, value):
    if value is None:
        return spec.default
    if spec.name == "cluster":
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True, separators=(",", ":"))
    if spec.kind is bool:
        return bool(value)
    if spec.kind is int:
        return int(value)
    return str(value)


def run_identity(record: Mapping) -> RunIdentity:
    """The identity of a run record (any version, or the fields of a run not yet made).

    ``graph`` is the graph's source (file path or synthetic spec; the name when the
    source is missing); the widths are fixed by the graph (features, classes) and
    ``layers``, ``hidden`` (``model.workload.model_widths``); ``block_rows`` and
    ``threads_per_rank`` are 0 for None; ``cluster`` is its canonical JSON text ("" for
    one host). The grid comes from ``gx, gy, gz`` or else from ``grid`` ("2x1x2").
    """
    rec = upgrade(record, kind="run")
    values = [_identity_value(spec, _lookup(rec, spec.path)) for spec in IDENTITY_FIELDS]
    ident = RunIdentity(*values)
    if not ident.graph and rec.get("graph"):
        ident = ident._replace(graph=str(rec["graph"]))
    if ident.gx == 0 and isinstance(rec.get("grid"), str) and rec["grid"].count("x") == 2:
        try:
            gx, gy, gz = (int(v) for v in rec["grid"].split("x"))
        except ValueError:
            pass
        else:
            ident = ident._replace(gx=gx, gy=gy, gz=gz)
    return ident


def prediction_settings(record: Mapping) -> dict:
    """The settings of a run's identity that its prediction depends on: :func:`plexus_tune.model.prediction.predict_run`'s
    keyword arguments (``block_rows``, ``overlap``, ``comm_precision``, ``algorithm``, and ``options``: the
    identity fields the family passes to its model, :attr:`plexus_tune.model.family.Family.identity_options`).

    ``record`` is a run record (any version), a run not yet made (its fields) or a runs-table row.
    """
    ident = record.get("identity")
    if not isinstance(ident, RunIdentity):
        ident = run_identity(record)
    settings = {"block_rows": ident.block_rows or None, "overlap": bool(ident.overlap),
                "fixed_features": bool(getattr(ident, "fixed_features", False)),
                "comm_precision": ident.comm_precision,
                "algorithm": getattr(ident, "algorithm", None) or record.get("algorithm") or DEFAULT_FAMILY}
    family = FAMILIES.get(settings["algorithm"])  # an unknown family is refused when it is predicted
    options = {name: getattr(ident, name) for name in getattr(family, "identity_options", ()) if getattr(ident, name, None)}
    if options:
        settings["options"] = options
    return settings


def run_workload(record: Mapping) -> Workload:
    """The workload a run trained: N, NNZ, widths and element size as logged (run record or runs-table row)."""
    rec = record if isinstance(record.get("identity"), RunIdentity) else upgrade(record, kind="run")
    widths = run_widths(rec)
    missing = [k for k in ("graph_nodes", "nnz") if rec.get(k) is None] + (["widths"] if widths is None else [])
    if missing:
        raise UserError(f"run record lacks {missing[0]!r}; is this a trainer run log (plexus-tune measure, run or train)?")
    elem = rec.get("bytes_per_element")
    if elem is None:
        dtype = rec.get("dtype") or (rec.get("options") or {}).get("dtype") or "float32"
        elem = DTYPE_BYTES.get(dtype, 4)
    return Workload(name=str(rec.get("graph_name") or rec.get("graph") or "graph"), nodes=int(rec["graph_nodes"]),
                    nnz=int(rec["nnz"]), widths=tuple(widths), bytes_per_element=int(elem))


def prediction_inputs(record: Mapping, *, workload: Workload | None = None) -> tuple[Workload, tuple, dict]:
    """(workload, grid, settings) that predict a run (record, runs-table row or the fields of a run not yet made).

    The workload is ``workload`` (else :func:`run_workload`) with the element size of the
    identity's dtype; the grid and :func:`prediction_settings` come from the identity.
    """
    ident = record.get("identity")
    if not isinstance(ident, RunIdentity):
        ident = run_identity(record)
    workload = workload if workload is not None else run_workload(record)
    workload = replace(workload, bytes_per_element=DTYPE_BYTES.get(ident.dtype, 4))
    return workload, (ident.gx, ident.gy, ident.gz), prediction_settings({"identity": ident, "algorithm": record.get("algorithm")})


def predict_record(record: Mapping, machine, *, workload: Workload | None = None) -> dict:
    """The prediction of a run at every setting of its identity (:func:`prediction_inputs`).

    :func:`plexus_tune.model.prediction.predict_run`, so a logged prediction is what
    ``plexus-tune predict`` gives for the same settings.
    """
    workload, grid, settings = prediction_inputs(record, workload=workload)
    return predict_run(workload, machine, grid, **settings)


def run_setting(identity: RunIdentity) -> tuple:
    """The identity without the configuration (:data:`SETTING_NAMES`)."""
    return tuple(getattr(identity, n) for n in SETTING_NAMES)


def grid_label(identity) -> str:
    return format_grid((identity.gx, identity.gy, identity.gz))


def setting_labels(frame, columns=SETTING_NAMES, skip=("graph",)) -> list[str]:
    """Per row, ``name=value`` of the setting columns whose values differ between rows ("" if none do)."""
    varying = [c for c in columns if c in frame and c not in skip and frame[c].astype(str).nunique() > 1]
    return [", ".join(f"{c}={row[c]}" for c in varying) for _, row in frame[varying].iterrows()] if varying else [""] * len(frame)


def run_widths(rec: Mapping):
    """The layer widths D_0..D_L of a run (logged, else from its features, classes, layers and hidden; None if unknown)."""
    if rec.get("widths") is not None:
        return tuple(int(w) for w in rec["widths"])
    needed = (rec.get("features"), rec.get("classes"), rec.get("layers"), rec.get("hidden"))
    if any(v is None for v in needed):
        return None

    return tuple(model_widths(*needed))
