"""Assemble machine profiles from fitted models."""

from __future__ import annotations
import math
from collections.abc import Mapping
from plexus_tune.errors import UserError
from plexus_tune.fit.epoch import EpochModel
from plexus_tune.model.collectives import scale_collectives


# --------------------------------------------------------------------------- profiles

#: floor for a fitted epoch scale factor (a zero would make a rate infinite)
MIN_SCALE = 0.05


def scale_spmm_entry(entry: Mapping, s: float) -> dict:
    """An SpMM model entry whose predictions are multiplied by s."""
    entry = dict(entry)
    kind = entry.get("kind")
    if kind in ("paper", "paper-spmm"):
        for key in ("c0", "c1", "c2"):
            entry[key] = float(entry[key]) * s
    elif kind == "roofline":
        entry["coefficients"] = {k: float(v) * s for k, v in entry["coefficients"].items()}
    elif kind == "learned":
        entry["intercept"] = float(entry["intercept"]) + math.log(s)
    elif kind == "boosted":
        entry["init"] = float(entry["init"]) + math.log(s)
    else:
        raise UserError(f"cannot rescale an SpMM model of kind {kind!r}")
    return entry


def apply_epoch_fit(profile: Mapping, epoch: "EpochModel") -> dict:
    """Fold epoch-level scale factors into a profile's rates; the overhead goes to ``epoch_overhead_ms``.

    spmm times x s_spmm; gemm_tflops / s_gemm; collective alphas x s_comm and every beta
    / s_comm (tiers, bandwidth_table, per_span); elementwise_gbps / s_other. Scales below :data:`MIN_SCALE` are raised to it.
    """
    out = json_copy(profile)
    s = {k: max(float(v), MIN_SCALE) for k, v in epoch.scales.items()}
    if "spmm_ms" in s:
        out["spmm"] = scale_spmm_entry(out["spmm"], s["spmm_ms"])
    if "gemm_ms" in s:
        out["gemm_tflops"] = float(out["gemm_tflops"]) / s["gemm_ms"]
    if "comm_ms" in s:
        out["collectives"] = scale_collectives(out["collectives"], s["comm_ms"])
    if "other_ms" in s and out.get("elementwise_gbps"):
        out["elementwise_gbps"] = float(out["elementwise_gbps"]) / s["other_ms"]
    out["epoch_overhead_ms"] = float(epoch.overhead_ms)
    return out


def json_copy(value):
    """A deep copy made of plain JSON types."""
    import json

    return json.loads(json.dumps(value))


def profile_json_text(profile) -> str:
    """JSON text of a profile: indented objects, every list of numbers or strings on one line."""
    import json
    import re

    text = json.dumps(json_copy(profile), indent=2)
    # a list holding no list or object: join its lines (JSON strings hold no raw newline,
    # so only whitespace between elements is touched)
    return re.sub(r"\[\s*\n\s*([^\[\]{}]*?)\s*\n\s*\]", lambda m: "[" + re.sub(r",\n\s*", ", ", m.group(1)) + "]", text) + "\n"
