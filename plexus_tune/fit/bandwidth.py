"""The rates of the epoch's ``other`` part from bandwidth records and trainer runs (docs/profiles.md).

- ``elementwise_gbps``: the median over the elementwise ops (copy, relu,
  relu_backward, column_sum) of bytes / time at the largest size timed (the size the epoch's
  arrays have; small arrays fit in caches).
- ``optimizer_gbps``: bytes / time of the profile's optimizer at the largest size; or,
  from trainer runs, the median over runs of optimizer bytes / the optimizer phase
  (:func:`optimizer_gbps_from_runs`).
- ``sync_us``: the median synchronisation time.
- ``epoch_overhead_ms`` (without an epoch-level fit): the median over trainer runs of
  their observed ``other_ms`` less the predicted other parts
  (:func:`epoch_latency_from_runs`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from plexus_tune.errors import UserError
from plexus_tune.measure.records import DTYPE_BYTES
from plexus_tune.model.other import (
    LEGACY_OPTIMIZERS,
    LEGACY_PASSES,
    OPTIMIZER_ACCESSES,
    TRAINER_PASSES,
    other_ms,
    trainable_elements,
)
from plexus_tune.model.shapes import layer_shapes

ELEMENTWISE_OP_NAMES = ("copy", "relu", "relu_backward", "column_sum")


def fit_bandwidths(records, optimizer: str) -> dict:
    """{elementwise_gbps, optimizer_gbps, sync_us, samples} from bandwidth records (absent keys: not timed)."""
    records = [r for r in records if isinstance(r, Mapping) and float(r.get("time_ms") or 0) > 0]
    out: dict = {"samples": len(records)}
    elementwise = [r for r in records if r.get("op") in ELEMENTWISE_OP_NAMES]
    if elementwise:
        largest = max(int(r["elements"]) for r in elementwise)
        out["elementwise_gbps"] = statistics.median(_gbps(r) for r in elementwise if int(r["elements"]) == largest)
        out["elementwise_elements"] = largest
    stepped = [r for r in records if r.get("op") == "optimizer" and r.get("optimizer") == optimizer]
    if stepped:
        largest = max(int(r["elements"]) for r in stepped)
        out["optimizer_gbps"] = statistics.median(_gbps(r) for r in stepped if int(r["elements"]) == largest)
        out["optimizer_elements"] = largest
    syncs = [float(r["time_ms"]) * 1e3 for r in records if r.get("op") == "sync" and r.get("time_ms") is not None]
    if syncs:
        out["sync_us"] = statistics.median(syncs)
    return out


def _gbps(record: Mapping) -> float:
    return float(record["bytes"]) / (float(record["time_ms"]) * 1e-3) / 1e9


def run_optimizer(record: Mapping) -> str:
    """The optimizer a trainer run stepped: its ``optimizer`` field, else torch's default AdamW of its device."""
    name = record.get("optimizer")
    if name:
        if name not in OPTIMIZER_ACCESSES:
            raise UserError(f"trainer run: unknown optimizer {name!r}; known: {', '.join(OPTIMIZER_ACCESSES)}")
        return str(name)
    return LEGACY_OPTIMIZERS["cuda" if run_on_gpu(record) else "cpu"]


def run_passes(record: Mapping):
    """The elementwise passes of the trainer that made a run: the earlier trainer's for a record
    without an ``optimizer`` field (:data:`plexus_tune.model.other.LEGACY_PASSES`)."""
    return TRAINER_PASSES if record.get("optimizer") else LEGACY_PASSES


def run_optimizer_bytes(record: Mapping) -> float:
    """Bytes the optimizer step of a run moves on its largest rank (u P ACCESSES, docs/model.md, Other)."""
    shapes, u = _run_shapes(record)
    return float(u * OPTIMIZER_ACCESSES[run_optimizer(record)] * trainable_elements(shapes))


def _run_shapes(record: Mapping):
    grid = tuple(int(record[k]) for k in ("gx", "gy", "gz"))
    u = DTYPE_BYTES.get(str((record.get("options") or {}).get("dtype", "float32")), 4)
    return layer_shapes(int(record["graph_nodes"]), [int(w) for w in record["widths"]], grid), u


def run_on_gpu(record: Mapping) -> bool:
    """Whether a trainer run ran on GPUs (nccl, or a CUDA device named in the record)."""
    return str(record.get("backend")) == "nccl" or str(record.get("device") or "cpu") not in ("cpu", "None")


def _timed_runs(records, gpu: bool | None = None) -> list[dict]:
    """Successful runs with an optimizer phase (on GPUs only, or on CPUs only, when ``gpu`` says)."""
    return [r for r in records if r.get("status", "ok") == "ok" and r.get("optimizer_ms") and r.get("widths")
            and r.get("other_ms") is not None and (gpu is None or run_on_gpu(r) == gpu)]


def epoch_latency_from_runs(records, profile: Mapping, gpu: bool | None = None) -> tuple[float, int]:
    """(median over runs of observed other_ms less the predicted other parts, runs used), at least 0.

    Each run's other parts are predicted with the profile's rates, the run's own
    optimizer (:func:`run_optimizer`) and its trainer's passes (:func:`run_passes`): what remains is the host's per-epoch latency
    (kernel launches, synchronisations), which no byte count describes.
    """
    residuals = []
    for r in _timed_runs(records, gpu):
        shapes, u = _run_shapes(r)
        parts = other_ms(shapes, u, elementwise_gbps=profile.get("elementwise_gbps"), optimizer_gbps=profile.get("optimizer_gbps"),
                         sync_us=profile.get("sync_us") or 0.0, optimizer=run_optimizer(r), passes=run_passes(r))
        residuals.append(float(r["other_ms"]) - float(parts["other_ms"]))
    if not residuals:
        raise UserError("no trainer run with an optimizer phase to take the epoch latency from")
    return max(0.0, float(statistics.median(residuals))), len(residuals)


def optimizer_gbps_from_runs(records, optimizer: str | None = None, gpu: bool | None = None) -> tuple[float, int]:
    """(median over successful runs of optimizer bytes / optimizer_ms, runs used); runs of ``optimizer``
    only when given, on GPUs only (``gpu`` True) or CPUs only (False) when given."""
    rates = []
    for r in _timed_runs(records, gpu):
        if optimizer is not None and run_optimizer(r) != optimizer:
            continue
        rates.append(run_optimizer_bytes(r) / (float(r["optimizer_ms"]) * 1e-3) / 1e9)
    if not rates:
        raise UserError("no trainer run with an optimizer phase" + (f" of {optimizer}" if optimizer else "")
                        + " to take the optimizer rate from")
    return float(statistics.median(rates)), len(rates)
