"""Assemble machine profiles from fitted models: :func:`fit_profile` turns logs into a profile.

The steps (docs/profiles.md, fitted profiles): the SpMM model (every kind scored on the
same random 70/30 splits, auto keeping the lowest held-out MAPE), collective timings
divided by the oversubscription they ran under on a CPU host, the collective network
model (every form scored on random splits and by leaving message sizes out; a bus
bandwidth table kept only if no held-out score is worse), the GEMM rate, and from trainer runs the epoch-level scale factors and
overhead, folded into the rates. The profile records where every number came from
(``provenance``) and every score (``fit``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune import resources
from plexus_tune.fit.collectives import COLLECTIVE_FORMS, CollectiveModel, collective_time_sharing, fit_collectives
from plexus_tune.fit.epoch import EpochModel, fit_epoch, scores_table_rows
from plexus_tune.fit.gemm import GemmModel, fit_gemm
from plexus_tune.fit.quant import fit_call_ms, fit_quant_rates, split_precisions
from plexus_tune.fit.sampling import fit_sampling
from plexus_tune.fit.scoring import DEFAULT_SPLITS, MIN_SPLITS, R2_SEM, mape_percent, min_rows, single_threaded_blas
from plexus_tune.fit.spmm import SPMM_KINDS, SPMM_PARAMETERS, SpmmModel, check_kind, fit_spmm
from plexus_tune.fit.tables import COLLECTIVE_COLUMNS, GEMM_COLUMNS, SPMM_COLUMNS, check_frame, load_table, pd_numeric
from plexus_tune.model.comm_precision import QUANT_CALL_INTER_KEY, QUANT_CALL_KEY, QUANT_RATE_KEYS
from plexus_tune.measure.table import predict_runs, runs_table
from plexus_tune.measure.store import environment_info, now_utc, read_records, read_runs
from plexus_tune.model.collectives import BROADCAST_FORMS, scale_collectives
from plexus_tune.model import spmm as spmm_models
from plexus_tune.fit.bandwidth import epoch_latency_from_runs, fit_bandwidths, optimizer_gbps_from_runs
from plexus_tune.model.machine import FIELDS, Machine, load_machine
from plexus_tune.model.other import check_optimizer, trainer_optimizer

# --------------------------------------------------------------------------- profiles

#: floor for a fitted epoch scale factor (a zero would make a rate infinite)
MIN_SCALE = 0.05
#: random splits of the trainer runs on which collective candidates are compared
SELECTION_SPLITS = 200
#: the schema tag of profiles written by :func:`fit_profile`
PROFILE_SCHEMA = "plexus-tune/machine/1"


def scale_spmm_entry(entry: Mapping, s: float) -> dict:
    """An SpMM model entry whose predictions are multiplied by s (any kind; older names load)."""
    return spmm_models.spmm_model_from_dict(entry).scaled(float(s)).to_dict()


def apply_epoch_fit(profile: Mapping, epoch: "EpochModel") -> dict:
    """Fold epoch-level scale factors into a profile's rates; the overhead goes to ``epoch_overhead_ms``.

    spmm times x s_spmm; gemm_tflops / s_gemm; collective alphas x s_comm and every beta
    / s_comm (tiers, bandwidth_table, per_span); each precision's codec rates of ``quant``
    / s_quant and its call_ms x s_comm (predict counts it in comm_ms); elementwise_gbps and optimizer_gbps / s_other,
    sync_us x s_other. Scales
    below :data:`MIN_SCALE` are raised to it.
    """
    out = json_copy(profile)
    s = {k: max(float(v), MIN_SCALE) for k, v in epoch.scales.items()}
    if "spmm_ms" in s:
        out["spmm"] = scale_spmm_entry(out["spmm"], s["spmm_ms"])
    if "gemm_ms" in s:
        out["gemm_tflops"] = float(out["gemm_tflops"]) / s["gemm_ms"]
    if "comm_ms" in s:
        out["collectives"] = scale_collectives(out["collectives"], s["comm_ms"])
    if ("quant_ms" in s or "comm_ms" in s) and out.get("quant"):
        out["quant"] = {precision: {k: (float(v) * s.get("comm_ms", 1.0) if k in (QUANT_CALL_KEY, QUANT_CALL_INTER_KEY) else
                                        float(v) / s.get("quant_ms", 1.0) if k in QUANT_RATE_KEYS else v)
                                    for k, v in entry.items()} if isinstance(entry, Mapping) else entry
                        for precision, entry in out["quant"].items()}
    if "other_ms" in s and out.get("elementwise_gbps"):
        out["elementwise_gbps"] = float(out["elementwise_gbps"]) / s["other_ms"]
        if out.get("optimizer_gbps"):
            out["optimizer_gbps"] = float(out["optimizer_gbps"]) / s["other_ms"]
        if out.get("sync_us"):
            out["sync_us"] = float(out["sync_us"]) * s["other_ms"]
    out["epoch_overhead_ms"] = float(epoch.overhead_ms)
    return out


def json_copy(value):
    """A deep copy made of plain JSON types."""
    return json.loads(json.dumps(value))


def profile_json_text(profile) -> str:
    """JSON text of a profile: indented objects, every list of numbers or strings on one line."""
    text = json.dumps(json_copy(profile), indent=2)
    # a list holding no list or object: join its lines (JSON strings hold no raw newline,
    # so only whitespace between elements is touched)
    return re.sub(r"\[\s*\n\s*([^\[\]{}]*?)\s*\n\s*\]", lambda m: "[" + re.sub(r",\n\s*", ", ", m.group(1)) + "]", text) + "\n"


def provenance_notes(items) -> dict[str, str]:
    """``FIELD=TEXT`` items as {field: text}, each field a profile field (docs/profiles.md);
    UserError naming the item otherwise."""
    notes = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip() or not text.strip():
            raise UserError(f"expected FIELD=TEXT, got {item!r}")
        if key.strip() not in FIELDS or key.strip() in ("provenance", "schema"):
            raise UserError(f"{key.strip()!r} is not a profile field (docs/profiles.md lists them)")
        notes[key.strip()] = text.strip()
    return notes


def annotate_provenance(profile: dict, given: Mapping[str, str], notes: Mapping[str, str]) -> dict:
    """``profile`` with the provenance of each field that says "given" replaced by
    ``given[field]`` (where the value came from) and each note appended to its field's."""
    provenance = profile["provenance"]
    for key, where in given.items():
        if str(provenance.get(key, "")).startswith("given"):
            provenance[key] = where
    for key, text in notes.items():
        provenance[key] = "; ".join(p for p in (provenance.get(key), text) if p)
    return profile


def write_profile(profile: Mapping, path) -> None:
    """Write a profile as JSON (:func:`profile_json_text`) atomically: a temporary file, then a rename."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as fh:
            fh.write(profile_json_text(profile))
        os.replace(tmp, path)
    finally:  # interrupted: no half-written file is left
        if os.path.exists(tmp):
            os.unlink(tmp)


# --------------------------------------------------------------------------- inputs


def _as_list(value) -> list:
    if value is None:
        return []
    if isinstance(value, (str, os.PathLike)) or hasattr(value, "columns"):
        return [value]
    return list(value)


def _describe(source) -> str:
    return str(source) if isinstance(source, (str, os.PathLike)) else str(getattr(source, "attrs", {}).get("source", "a table"))


def load_tables(sources, schema: str):
    """One table from paths (CSV or JSON Lines logs, records of ``schema`` kept) or DataFrames."""
    import pandas as pd

    frames = []
    for source in _as_list(sources):
        frame = load_table(source, schema=schema) if isinstance(source, (str, os.PathLike)) else source
        if not hasattr(frame, "columns"):
            raise UserError(f"measurements must be file paths or tables (pandas DataFrame), not {type(frame).__name__}")
        if len(frame):
            frames.append(frame)
    if not frames:
        return pd.DataFrame()
    if len(frames) == 1:
        return frames[0]
    out = pd.concat(frames, ignore_index=True)
    out.attrs["source"] = ", ".join(_describe(s) for s in _as_list(sources))
    return out


def input_info(sources) -> list[dict]:
    """Provenance of inputs: per file its path, sha256 (first 16 hex digits) and line count;
    per table its source and rows; run records given directly: their count."""
    out, records = [], 0
    for source in _as_list(sources):
        if isinstance(source, (str, os.PathLike)):
            data = Path(source).read_bytes()
            out.append({"path": str(source), "sha256": hashlib.sha256(data).hexdigest()[:16], "lines": data.count(b"\n")})
        elif hasattr(source, "columns"):
            out.append({"table": _describe(source), "rows": int(len(source))})
        else:
            records += 1
    return out + ([{"records": records}] if records else [])


def _run_records(runs, what: str = "runs") -> list[dict]:
    """The records of trainer run logs (paths: each an existing log, :func:`_check_log_path`) or run records."""
    records: list[dict] = []
    for source in _as_list(runs):
        if isinstance(source, (str, os.PathLike)):
            _check_log_path(source, f"{what} log")
            records.extend(read_runs(source))
        elif isinstance(source, Mapping):
            records.append(dict(source))
        else:
            raise UserError(f"trainer runs must be log paths or run records, not {type(source).__name__}")
    return records


# --------------------------------------------------------------------------- the pipeline


@dataclass
class FittedProfile:
    """What :func:`fit_profile` returns.

    ``profile``: the machine profile (the dict written as JSON, with ``provenance`` and
    ``fit``: inputs, scores, splits). ``report``: the figures a caller shows: ``spmm``
    (samples, splits, chosen kind, one score row per kind), ``time_sharing`` (or None),
    ``collectives`` (every candidate form's held-out scores and the chosen one), ``gemm`` and
    ``epoch`` (or None), ``seconds`` per stage. The fitted models are kept too.
    """

    profile: dict
    report: dict
    spmm: SpmmModel
    collectives: object
    gemm: GemmModel | None = None
    epoch: EpochModel | None = None


#: progress(stage, done, total): stages are "spmm <kind>", "collectives", "gemm", "epoch"
Progress = Callable[[str, int, int], None]


def _stage(progress: Progress | None, name: str):
    """progress for one stage: (done, total) -> progress(name, done, total)."""
    return None if progress is None else (lambda done, total: progress(name, done, total))


@dataclass(frozen=True)
class FitOptions:
    """The inputs and settings of one profile fit (:func:`fit_profile`), checked when made.

    ``spmm``, ``collectives`` and ``gemm``: log paths (CSV or JSON Lines; one or a
    list) or DataFrames; ``gemm`` defaults to the GEMM records of the ``spmm`` logs.
    ``runs``: trainer run logs (or run records) for the epoch-level fit. ``kind``: the
    SpMM kind (:data:`plexus_tune.fit.spmm.SPMM_KINDS`) or auto; every kind the data
    supports is scored beside it. ``collective_form``: two-tier, per-span, hierarchical
    or auto (the lowest leave-sizes-out MAPE); ``collective_sharing``: None scores the forms
    with and without NIC sharing, True or False fixes it; ``table``: also try a bandwidth table.
    Scores use at most ``n_splits`` random 70/30 splits,
    fewer for a model whose mean held-out R^2 has a standard error of at most
    ``r2_sem`` (None: all); ``n_jobs`` worker processes (at most one per core) score the expensive kinds.
    ``host_cores``: CPU cores shared by the ranks of a node (None: the CPU count of
    gloo collective logs; 0: no time-sharing model). ``gpus_per_node`` (default: the
    largest gpus_per_node, else world size, of the collective logs), ``device_memory_gib`` (default: this
    host's memory / gpus_per_node), ``gemm_tflops`` (used when there are no GEMM
    timings), ``elementwise_gbps`` (a starting value the run fit rescales) and
    ``description`` go into the profile; ``source`` names it in validation errors.

    ``collectives_profile`` (a profile name or path) replaces the collective fit: its
    ``collectives`` (and ``gpus_per_node`` unless given) are copied, with provenance
    saying they were not measured here. ``bandwidth``: bandwidth logs (``calibrate
    bandwidth``) giving ``elementwise_gbps``, ``optimizer_gbps`` and ``sync_us``
    (:mod:`plexus_tune.fit.bandwidth`); ``optimizer_runs``: trainer runs whose optimizer
    phase gives ``optimizer_gbps`` where no bandwidth log times the optimizer;
    ``optimizer``: the profile's optimizer (default: the trainer's). ``quant``: further
    logs holding quant records (``calibrate quant``).
    """

    spmm: Any
    collectives: Any
    name: str
    gemm: Any = None
    runs: Any = None
    quant: Any = None
    bandwidth: Any = None
    optimizer_runs: Any = None
    collectives_profile: Any = None
    kind: str = "auto"
    n_splits: int = DEFAULT_SPLITS
    seed: int = 0
    r2_sem: float | None = R2_SEM
    min_splits: int = MIN_SPLITS
    n_jobs: int = 1
    table: bool = True
    collective_form: str = "auto"
    collective_sharing: bool | None = None
    host_cores: int | None = None
    gpus_per_node: int | None = None
    device_memory_gib: float | None = None
    gemm_tflops: float | None = None
    elementwise_gbps: float = 10.0
    memory_bandwidth_gbps: float | None = None
    optimizer: str | None = None
    description: str | None = None
    source: str = "<fitted profile>"

    def __post_init__(self):
        check_kind(self.kind)
        if self.collective_form not in COLLECTIVE_FORMS:
            raise UserError(f"unknown collective model form {self.collective_form!r}; "
                            f"choose one of {', '.join(COLLECTIVE_FORMS)}")
        if self.n_splits < 0:
            raise UserError(f"the number of splits must be >= 0, got {self.n_splits}")
        if self.host_cores is not None and self.host_cores < 0:
            raise UserError(f"host_cores must be >= 0 (0: no time-sharing model), got {self.host_cores}")
        if self.collectives_profile is not None and _given(self.collectives):
            raise UserError("give collective logs or a profile to copy the collectives from, not both")


def _given(inputs) -> bool:
    """Whether logs (paths, a list of them, or a DataFrame) are given."""
    if inputs is None or isinstance(inputs, (str, os.PathLike)):
        return bool(inputs and os.fspath(inputs))
    return bool(len(inputs))


def fit_profile(options: FitOptions, *, progress: Progress | None = None) -> FittedProfile:
    """Fit a machine profile from SpMM, collective, GEMM and trainer-run measurements
    (``options``: :class:`FitOptions`).

    ``progress(stage, done, total)`` is called as work is done. Warnings name input
    lines that were skipped.
    """
    o = options
    spmm, collectives, gemm, runs, quant, name = o.spmm, o.collectives, o.gemm, o.runs, o.quant, o.name
    bandwidth, optimizer_runs, collectives_profile, optimizer = o.bandwidth, o.optimizer_runs, o.collectives_profile, o.optimizer
    kind, n_splits, seed, r2_sem, min_splits, table = o.kind, o.n_splits, o.seed, o.r2_sem, o.min_splits, o.table
    collective_form, collective_sharing, host_cores, gpus_per_node = (o.collective_form, o.collective_sharing,
                                                                      o.host_cores, o.gpus_per_node)
    device_memory_gib, gemm_tflops, elementwise_gbps = o.device_memory_gib, o.gemm_tflops, o.elementwise_gbps
    memory_bandwidth_gbps, description, source = o.memory_bandwidth_gbps, o.description, o.source
    n_jobs = max(1, min(int(o.n_jobs), resources.host_cores()))  # workers beyond the cores only queue
    timings: dict = {}
    started = time.perf_counter()
    spmm_df = load_tables(spmm, "spmm")
    copied = None
    if collectives_profile is not None:
        copied = load_machine(collectives_profile)
        coll_df = None
    else:
        coll_df = load_tables(collectives, "collective")
    gemm_sources = spmm if gemm is None else gemm
    gemm_df = load_tables(gemm_sources, "gemm")
    if gemm is None and not set(GEMM_COLUMNS) <= set(gemm_df.columns):  # SpMM tables without GEMM records
        gemm_df = gemm_df.iloc[:0]
    if not len(spmm_df):
        raise UserError(f"no SpMM measurements in {', '.join(map(_describe, _as_list(spmm))) or 'the SpMM inputs'}; "
                        "time some with 'plexus-tune calibrate spmm'")
    check_frame(spmm_df, SPMM_COLUMNS, positive=("rows", "common", "dense_cols", "time_ms"), what="SpMM measurements")  # before any fit
    if copied is None and not len(coll_df):
        raise UserError(f"no collective measurements in {', '.join(map(_describe, _as_list(collectives))) or 'the collective inputs'}; "
                        "time them with 'plexus-tune calibrate collectives'")
    if not len(gemm_df) and not gemm_tflops:
        err = UserError(f"no GEMM measurements in {', '.join(map(_describe, _as_list(gemm_sources)))}; "
                        "measure GEMMs ('plexus-tune calibrate spmm' on a graph) or give a GEMM rate")
        err.parameter = "gemm_tflops"
        raise err
    if copied is None:
        check_frame(coll_df, COLLECTIVE_COLUMNS, positive=("group_size", "nodes", "message_bytes", "time_ms"),
                    what="collective measurements")
    if len(gemm_df):
        check_frame(gemm_df, GEMM_COLUMNS, positive=GEMM_COLUMNS, what="GEMM measurements")
    # every other input is read and checked here too, before minutes of fitting
    bandwidth_records = _bandwidth_records(bandwidth) if bandwidth else []
    if bandwidth and not bandwidth_records:
        raise UserError(f"no bandwidth records in {', '.join(map(str, _as_list(bandwidth)))}; "
                        "time them with 'plexus-tune calibrate bandwidth'")
    optimizer_records = _run_records(optimizer_runs, "optimizer runs") if optimizer_runs else []
    runs_tbl = runs_table(_run_records(runs, "runs")) if runs else None
    if runs and not len(runs_tbl):
        raise UserError(f"no successful trainer runs in {', '.join(map(_describe, _as_list(runs)))}; "
                        "give run logs of plexus-tune measure, run or train", parameter="runs")
    timings["load"] = time.perf_counter() - started

    # time-sharing of CPU cores by the ranks of one node (gloo on a CPU host)
    if copied is not None:
        cores, cores_from = (host_cores or None), ("given" if host_cores else None)
        coll_df = _copied_collective_frame()
    else:
        cores, cores_from = _host_cores(coll_df, host_cores)
    stretch = collective_time_sharing(coll_df, cores) if copied is None else np.ones(0)
    time_sharing = None
    if np.any(stretch > 1):
        coll_df = coll_df.copy()
        coll_df["time_ms"] = np.asarray(coll_df["time_ms"], dtype=np.float64) / stretch
        time_sharing = {"host_cores": int(cores), "min": float(stretch.min()), "max": float(stretch.max())}

    # the network is fitted on FP32 timings; reduced-precision ones give the quant entry's call_ms
    every_precision = coll_df
    coll_df, reduced_df = split_precisions(every_precision) if copied is None else (coll_df, None)
    if copied is None and not len(coll_df):
        raise UserError("the collective logs hold only reduced-precision timings; time FP32 beside them "
                        "(plexus-tune calibrate collectives, with fp32 among the precisions)")

    if copied is not None:
        world, logged_gpn = copied.gpus_per_node, np.nan
        gpn = int(gpus_per_node or copied.gpus_per_node)
    else:
        world = int(np.nanmax(coll_df["world_size"])) if "world_size" in coll_df else int(np.nanmax(coll_df["group_size"]))
        logged_gpn = np.nanmax(pd_numeric(coll_df["gpus_per_node"], np.nan)) if "gpus_per_node" in coll_df else np.nan
        gpn = int(gpus_per_node or (logged_gpn if np.isfinite(logged_gpn) else world))

    def spmm_stage():
        started = time.perf_counter()
        fitted = fit_spmm(spmm_df, kind, n_splits=n_splits, seed=seed, kinds=None if kind == "auto" else _comparable(spmm_df, kind),
                          r2_sem=r2_sem, min_splits=min_splits, n_jobs=n_jobs,
                          progress=None if progress is None else (lambda k, done, total: progress(f"spmm {k}", done, total)))
        timings["spmm"] = time.perf_counter() - started
        return fitted

    if copied is not None:
        spmm_model = spmm_stage()
        started_gemm = time.perf_counter()
        with single_threaded_blas():
            gemm_model = fit_gemm(gemm_df, n_splits=n_splits, seed=seed, progress=_stage(progress, "gemm")) if len(gemm_df) else None
        timings["gemm"] = time.perf_counter() - started_gemm
        coll, coll_report = None, None
    elif n_jobs > 1:
        # the collective and GEMM fits in a process of their own, beside the SpMM scoring
        for stage in ("collectives", "gemm"):
            if progress:
                progress(stage, 0, 1)
        with resources.WorkerPool(1) as pool:
            others = pool.submit(_other_fits, coll_df, gemm_df, n_splits=n_splits, seed=seed, form=collective_form,
                                 sharing=collective_sharing, table=table,
                                 gpus_per_node=gpn)
            if progress:
                others.add_done_callback(lambda done: _report_other_fits(done, progress))
            spmm_model = spmm_stage()
            (coll, coll_report), gemm_model, seconds = others.result()
        timings.update(seconds)
    else:
        spmm_model = spmm_stage()
        (coll, coll_report), gemm_model, seconds = _other_fits(coll_df, gemm_df, n_splits=n_splits, seed=seed, form=collective_form,
                                                                sharing=collective_sharing,
                                                                table=table, gpus_per_node=gpn, progress=progress)
        timings.update(seconds)
    rate = gemm_model.tflops if gemm_model else float(gemm_tflops)

    if device_memory_gib:
        memory = float(device_memory_gib)
    else:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 / gpn
    env = environment_info()
    stamp = now_utc()
    backend = coll_df["backend"].iloc[0] if "backend" in coll_df and len(coll_df) else ("nccl" if copied is not None else "gloo")
    optimizer_given = optimizer is not None
    optimizer = check_optimizer(optimizer or trainer_optimizer("cpu" if cores else "cuda"))
    rates = fit_bandwidths(bandwidth_records, optimizer) if bandwidth else {"samples": 0}
    if optimizer_runs and "optimizer_gbps" not in rates:
        rates["optimizer_gbps"], rates["optimizer_runs"] = optimizer_gbps_from_runs(optimizer_records, gpu=not cores)
    profile = {
        "schema": PROFILE_SCHEMA,
        "name": name,
        "description": description or f"fitted on {env.get('host', 'this host')} ({env.get('processor', '')}, {env.get('cpu_count')} CPUs, {backend}) on {stamp[:10]}",
        "gpus_per_node": gpn,
        "device_memory_gib": round(memory, 3),
        "gemm_tflops": rate,
        "elementwise_gbps": float(rates.get("elementwise_gbps", elementwise_gbps)),
        "optimizer": optimizer,
        "spmm": spmm_model.to_dict(),
        "collectives": coll.to_dict() if coll is not None else json_copy(copied.raw["collectives"]),
    }
    if memory_bandwidth_gbps:
        profile["memory_bandwidth_gbps"] = float(memory_bandwidth_gbps)
    if "optimizer_gbps" in rates:
        profile["optimizer_gbps"] = float(rates["optimizer_gbps"])
    if "sync_us" in rates:
        profile["sync_us"] = float(rates["sync_us"])
    if optimizer_runs and not runs:
        profile["epoch_overhead_ms"], rates["latency_runs"] = epoch_latency_from_runs(optimizer_records, profile, gpu=not cores)
    if cores:
        profile["host_cores"] = int(cores)
        profile["threads_per_rank"] = 1
    if coll is not None and runs_tbl is not None and collective_form == "auto" and len(coll.candidates) > 1:
        started = time.perf_counter()
        coll = _choose_collectives_on_runs(profile, coll, runs_tbl, n_splits=n_splits, seed=seed, progress=_stage(progress, "collectives on runs"))
        profile["collectives"] = coll.to_dict()
        coll_report = _collectives_report(coll)
        timings["collectives on runs"] = time.perf_counter() - started
    provenance = {
        "gpus_per_node": "given" if gpus_per_node else (f"copied from the profile {copied.name} with its collectives" if copied is not None
                                                         else f"largest gpus_per_node in the collective logs ({gpn})" if np.isfinite(logged_gpn)
                                                         else f"largest world size in the collective logs ({world})"),
        "device_memory_gib": "given" if device_memory_gib else "host memory / gpus_per_node",
        "gemm_tflops": f"fit_gemm on {len(gemm_df)} GEMM timings" if gemm_model else "given GEMM rate",
        "elementwise_gbps": (f"fit_bandwidths: median bytes / time of the elementwise ops at {rates['elementwise_elements']} "
                             f"elements ({rates['samples']} bandwidth records)" if "elementwise_gbps" in rates
                             else f"given: {elementwise_gbps} GB/s"),
        "optimizer": "given" if optimizer_given else "the trainer's optimizer (plexus_tune.model.other.TRAINER_OPTIMIZERS)",
        "spmm": f"fit_spmm kind {spmm_model.kind} ({'chosen by lowest held-out MAPE' if kind == 'auto' else 'as asked'}) on {len(spmm_df)} SpMM timings",
        "collectives": _collectives_provenance(coll, copied, time_sharing),
    }
    if memory_bandwidth_gbps:
        provenance["memory_bandwidth_gbps"] = f"given: {memory_bandwidth_gbps} GB/s; the SpMM floor's rate"
    if "optimizer_gbps" in rates:
        provenance["optimizer_gbps"] = (
            f"fit_bandwidths: bytes / time of {optimizer} at {rates['optimizer_elements']} elements" if "optimizer_elements" in rates
            else f"optimizer_gbps_from_runs: median over {rates['optimizer_runs']} trainer runs on "
                 f"{'CPUs' if cores else 'GPUs'} of the bytes of each run's "
                 "optimizer step (its optimizer's accesses, docs/model.md, Other) / the run's optimizer phase")
    if "epoch_overhead_ms" in profile:
        provenance["epoch_overhead_ms"] = (f"epoch_latency_from_runs: median over {rates['latency_runs']} trainer runs on "
                                           f"{'CPUs' if cores else 'GPUs'} of the "
                                           "observed other_ms less the predicted other parts (each run's optimizer): the host's "
                                           "launch and synchronisation latency per epoch")
    if "sync_us" in rates:
        provenance["sync_us"] = "fit_bandwidths: median time of a one-element kernel and a device synchronisation"
    if cores:
        provenance["host_cores"] = cores_from
        provenance["threads_per_rank"] = "1, as the trainer runs each rank when ranks outnumber cores"
    fit_info = {
        "date": stamp,
        "environment": env,
        "inputs": {
            "spmm": input_info(spmm),
            "collectives": input_info(collectives) if copied is None else [{"profile": copied.name}],
            "bandwidth": input_info(bandwidth),
            "optimizer_runs": input_info(optimizer_runs),
            "runs": input_info(runs),
            "gemm": input_info(gemm),
        },
        "splits": n_splits,
        "r2_sem": r2_sem or None,
        "seed": seed,
        "spmm": {"chosen": spmm_model.kind, "samples": len(spmm_df), "scores": spmm_model.all_scores},
        "collectives": ({"chosen": coll.name, "form": coll.form, "selected_by": coll.selected_by, "tiers": coll.tiers, "scores": coll.all_scores,
                         "epoch_scores": coll.epoch_scores or None,
                         "op_tiers": ({op: {**dict(coll.network.op_tiers)[op], **fit} for op, fit in coll.op_fit.items()}
                                      or None),
                         "reduce_scatter": coll.reduce_scatter_fit or None,
                         "same_as": coll.same_as, "placement_mismatches": coll.placement_mismatches,
                         "table_rule": "a bandwidth table replaces the plain formula only if neither held-out R^2 nor MAPE is worse"}
                        if coll is not None else {"copied_from": copied.name}),
        "bandwidth": {k: v for k, v in rates.items()},
        "gemm": {"tflops": gemm_model.tflops, "overhead_ms": gemm_model.overhead_ms, "scores": gemm_model.scores} if gemm_model else None,
    }
    Machine.from_dict(profile, source=source)  # validates before any epoch fit

    quant_records = _quant_records([quant, spmm, [] if collectives is None else collectives])
    if quant_records:
        profile["quant"] = fit_quant_rates(quant_records)
        concurrent = sorted({int(v["processes"]) for v in profile["quant"].values() if v.get("processes")})
        provenance["quant"] = (f"fit_quant_rates on {len(quant_records)} quant records "
                               "(plexus-tune calibrate quant; median of bytes / time"
                               + (f"; timed by {', '.join(map(str, concurrent))} processes at once" if concurrent else "")
                               + ")")
    sampling = fit_sampling(_quant_records([quant, spmm, [] if collectives is None else collectives], schema="sampling"))
    if sampling is not None:
        profile["sampling"] = {"call_ms": sampling["call_ms"], "gbps": sampling["gbps"]}
        provenance["sampling"] = (f"fit_sampling on {sampling['records']} sampling records (plexus-tune calibrate "
                                  f"sampling; call_ms x layouts + bytes / gbps, relative NNLS, MAPE "
                                  f"{sampling['mape']:.1f} %)")
    quant_report = None
    if reduced_df is not None and len(reduced_df):
        profile["quant"], quant_report = fit_call_ms(every_precision, Machine.from_dict(profile, source=source), profile.get("quant"))
        provenance["quant"] = ((provenance.get("quant", "") + "; ") if quant_records else "") + (
            f"call_ms by fit_call_ms on {len(reduced_df)} reduced-precision collective timings paired with FP32 ones "
            "(plexus-tune calibrate collectives --comm-precision; median per call)")
    epoch = None
    report_epoch = None
    if runs:
        started = time.perf_counter()
        epoch, report_epoch = _fit_epoch(profile, runs_tbl, n_splits=n_splits, seed=seed, progress=_stage(progress, "epoch"))
        profile = apply_epoch_fit(profile, epoch)
        provenance["epoch_overhead_ms"] = f"fit_epoch ({epoch.method} method) on {report_epoch['configurations']} trainer configurations (median over trials)"
        for key, comp in (("spmm", "spmm_ms"), ("gemm_tflops", "gemm_ms"), ("collectives", "comm_ms"), ("quant", "quant_ms"),
                          ("elementwise_gbps", "other_ms")):
            if key in provenance:
                provenance[key] += f"; rescaled by the run fit (x{epoch.scales.get(comp, 1.0):.3g} on {comp})"
        fit_info["epoch"] = {"method": epoch.method, "scales": epoch.scales, "overhead_ms": epoch.overhead_ms, "configurations": report_epoch["configurations"],
                             "mape_before_run_fit": report_epoch["mape_before"], "scores": epoch.scores}
        timings["epoch"] = time.perf_counter() - started
    profile["provenance"] = provenance
    profile["fit"] = fit_info
    Machine.from_dict(profile, source=source)
    report = {
        "spmm": {"samples": len(spmm_df), "splits": n_splits, "chosen": spmm_model.kind, "rows": scores_table_rows(spmm_model.all_scores)},
        "time_sharing": time_sharing,
        "collectives": coll_report,
        "gemm": {"samples": len(gemm_df), "tflops": gemm_model.tflops, "overhead_ms": gemm_model.overhead_ms, "scores": gemm_model.scores} if gemm_model else None,
        "epoch": report_epoch,
        "quant": quant_report,
        "seconds": timings,
    }
    return FittedProfile(profile=profile, report=report, spmm=spmm_model, collectives=coll, gemm=gemm_model, epoch=epoch)


def _copied_collective_frame():
    import pandas as pd

    return pd.DataFrame()


def _collectives_provenance(coll, copied, time_sharing) -> str:
    """Where the profile's collectives came from: the fit, or the profile they were copied from."""
    if coll is None:
        source = (copied.raw.get("provenance") or {}).get("collectives") or copied.description or copied.name
        return (f"copied from the profile {copied.name}; NOT measured on this machine ({source})")
    return (f"fit_collectives form {coll.name} ("
            + (f"lowest {coll.selected_by} of {len(coll.candidates)} candidates" if coll.selected_by else "as asked")
            + f"; relative least squares) on {coll.n_samples} timings"
            + (f"; bandwidth_table: one bus bandwidth per (op, stride, group size), {len(coll.table)} entries" if coll.table else "")
            + ("; times divided by the oversubscription of each calibration run" if time_sharing else "")
            + "".join(f"; op_tiers.{op}: fit_op_tiers (relative least squares on its per-rank terms) on "
                      f"{fit['rows']} {op} timings ({fit['intra']} with intra-node and {fit['inter']} with inter-node messages; "
                      + (f"form {fit['form']}, the lower MAPE of {', '.join(BROADCAST_FORMS)}; " if "form" in fit else "")
                      + f"in-sample MAPE {fit['mape']:.1f} %)" for op, fit in coll.op_fit.items())
            + (f"; reduce_scatter_form {coll.reduce_scatter_fit['form']}: the lower in-sample MAPE of the "
               f"{coll.reduce_scatter_fit['rows']} reduce-scatter timings as rings "
               f"({coll.reduce_scatter_fit['mape']['ring']:.1f} %) or as all-reduces of the whole buffer "
               f"({coll.reduce_scatter_fit['mape']['all_reduce']:.1f} %)" if coll.reduce_scatter_fit else ""))


def _check_log_path(path, what: str) -> None:
    """UserError unless ``path`` is an existing regular file."""
    if not os.path.exists(path):
        raise UserError(f"{what} {path} does not exist")
    if os.path.isdir(path):
        raise UserError(f"{what} {path} is a directory; give the log file in it")


def _bandwidth_records(sources) -> list[dict]:
    """The bandwidth records of the given logs."""
    out = []
    for item in _as_list(sources):
        _check_log_path(item, "bandwidth log")
        out.extend(read_records(item, schema="bandwidth")[0])
    return out


def _host_cores(coll_df, host_cores: int | None) -> tuple[int | None, str | None]:
    """(cores shared by a node's ranks, where the number came from): given, a gloo log's CPU count, or none."""
    if host_cores is not None:
        return (host_cores or None), "given"
    if "backend" in coll_df and (coll_df["backend"].astype(str) == "gloo").all() and "machine_info.cpu_count" in coll_df:
        return int(np.nanmax(pd_numeric(coll_df["machine_info.cpu_count"], np.nan))), "CPU count recorded in the gloo collective logs"
    return None, None


def _other_fits(coll_df, gemm_df, *, n_splits: int, seed: int, form: str, table: bool, gpus_per_node: int, progress=None,
                sharing: bool | None = None):
    """((collective model, its report), GEMM model or None, seconds of each): the fits that do not need the SpMM model."""
    seconds = {}
    with single_threaded_blas():  # many small solves
        started = time.perf_counter()
        coll = _fit_collectives(coll_df, n_splits=n_splits, seed=seed, form=form, sharing=sharing, table=table, gpus_per_node=gpus_per_node,
                                progress=_stage(progress, "collectives"))
        seconds["collectives"] = time.perf_counter() - started
        started = time.perf_counter()
        gemm = fit_gemm(gemm_df, n_splits=n_splits, seed=seed, progress=_stage(progress, "gemm")) if len(gemm_df) else None
        seconds["gemm"] = time.perf_counter() - started
    return coll, gemm, seconds


def _report_other_fits(future, progress: Progress) -> None:
    """progress of the collective and GEMM stages once their process has finished them."""
    if future.cancelled() or future.exception() is not None:
        return
    _, gemm, _ = future.result()
    progress("collectives", 1, 1)
    splits = int((gemm.scores or {}).get("splits", 1)) if gemm else 1
    progress("gemm", splits, splits)


def _fit_collectives(coll_df, *, n_splits: int, seed: int, form: str, table: bool, gpus_per_node: int,
                     progress, sharing: bool | None = None) -> tuple[CollectiveModel, dict]:
    """The collective network model (every form scored unless one is given) and its report:
    samples, the chosen candidate, every candidate's scores, table entries, placement mismatches."""
    if progress:
        progress(0, 1)
    coll = fit_collectives(coll_df, n_splits=n_splits, seed=seed, form=form, table=table and "stride" in coll_df,
                           gpus_per_node=gpus_per_node, sharing=sharing)
    if progress:
        progress(1, 1)
    return coll, _collectives_report(coll)


def _collectives_report(coll: CollectiveModel) -> dict:
    """What the CLI shows of a collective fit: samples, the chosen candidate, every candidate's
    scores (and epoch-fit scores when chosen on runs), table and per-span entries, alpha and beta."""
    net = coll.network
    return {"samples": coll.n_samples, "chosen": coll.name, "form": coll.form, "selected_by": coll.selected_by,
            "scores": coll.all_scores, "same_as": coll.same_as, "table_entries": len(coll.table),
            "per_span_entries": len(getattr(net, "entries", ()) or ()) if coll.form == "per-span" else 0,
            "alpha_us": {"intra": net.alpha_intra_us, "inter": net.alpha_inter_us},
            "beta_gbps": {"intra": net.beta_intra_gbps, "inter": net.beta_inter_gbps},
            "placement_mismatches": coll.placement_mismatches, "epoch_scores": coll.epoch_scores}


def _choose_collectives_on_runs(profile: Mapping, coll: CollectiveModel, runs_tbl, *, n_splits: int, seed: int,
                                progress) -> CollectiveModel:
    """The collective candidate whose profile fits the trainer runs best: the lowest held-out
    MAPE of the epoch-level fit (random splits of the configurations), each candidate's
    network put in the profile in turn. Collective timings alone can favour a form that
    ranks grids worse (docs/profiles.md, fitted profiles); the runs are the end-to-end
    evidence. Ties keep the candidate chosen on the collective timings. The comparison
    uses at most :data:`SELECTION_SPLITS` splits; the chosen profile's epoch fit then
    uses all of them."""
    scores = {}
    names = list(coll.candidates)
    for i, name in enumerate(names):
        if progress:
            progress(i, len(names))
        trial = {**profile, "collectives": coll.choose(name, "").to_dict()}
        epoch, _ = _fit_epoch(trial, runs_tbl, n_splits=min(n_splits, SELECTION_SPLITS), seed=seed, progress=None)
        scores[name] = epoch.scores
    if progress:
        progress(len(names), len(names))
    best = coll.name
    for name in names:
        if scores[name].get("test_mape", math.inf) < scores[best].get("test_mape", math.inf) - 1e-9:
            best = name
    chosen = coll.choose(best, "epoch-fit held-out MAPE on trainer runs")
    chosen.epoch_scores = scores
    return chosen


def _fit_epoch(profile: Mapping, runs_tbl, *, n_splits: int, seed: int, progress) -> tuple[EpochModel, dict]:
    """The epoch-level fit of the profile's predictions to trainer runs (the runs table: medians over trials) and its report."""
    if progress:
        progress(0, 1)
    frame = predict_runs(runs_tbl, profile)
    raw_mape = mape_percent(frame["pred_total_ms"], frame["obs_epoch_ms"])
    epoch = fit_epoch(frame, n_splits=n_splits, seed=seed)
    if progress:
        progress(1, 1)
    return epoch, {"method": epoch.method, "configurations": len(frame), "scales": dict(epoch.scales), "overhead_ms": epoch.overhead_ms,
                   "mape_before": raw_mape, "scores": epoch.scores}


def _comparable(df, kind: str) -> list[str]:
    """The kinds scored beside an explicitly chosen ``kind``: every kind the data supports."""
    return [k for k in SPMM_KINDS if k == kind or len(df) >= min_rows(SPMM_PARAMETERS[k])]


def _quant_records(sources, schema: str = "quant") -> list[dict]:
    """The records of type ``schema`` (quant, sampling) of every JSON Lines log among ``sources``
    (paths or lists of paths)."""
    out, seen = [], set()
    for source in sources:
        for item in _as_list(source):
            if not isinstance(item, (str, os.PathLike)) or str(item) in seen or str(item).endswith(".csv"):
                continue
            seen.add(str(item))
            if os.path.exists(item):
                out.extend(read_records(item, schema=schema)[0])
    return out
