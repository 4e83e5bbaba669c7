"""Choosing a communication precision: which ones may be chosen, the fastest of them, and
what is known of each one's effect on accuracy (docs/comm-precision.md, "In the cost model").

``predict --comm-precision auto`` and ``search --comm-precision auto`` evaluate every
allowed precision and pick with :func:`pick_precision`; both print the
:data:`ACCURACY_EVIDENCE` of the pick.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from plexus_tune.errors import UserError
from plexus_tune.model.comm_precision import COMM_PRECISIONS, parse_precision


#: What is known about each precision's effect on accuracy (cited by paper and section;
#: the host measurements are in measurements/comm-precision-*). ``search`` and
#: ``predict --comm-precision auto`` print the entry of the precision they pick.
ACCURACY_EVIDENCE = {
    "fp32": "reference precision",
    "bf16": "ScaleGNN (section V-B): BF16 all-reduces of the 3D products gave test-accuracy curves "
            "indistinguishable from FP32 on ogbn-products and Reddit",
    "fp16": "no published GCN evidence in the cited systems; same 16 bits as bf16 but overflows beyond 65504 "
            "(no loss scaling is applied)",
    "int8": "SuperGCN (section 6): stochastic int8 matched FP32 test accuracy",
    "int4": "SuperGCN (section 6): stochastic int4 matched FP32 test accuracy on ogbn-products, Reddit, IGB260M",
    "int2": "SuperGCN (section 6): stochastic int2 with LayerNorm matched FP32 test accuracy on ogbn-products, "
            "Reddit and IGB260M; papers100M and mag240M needed label propagation",
}


def parse_allowed(text: str) -> tuple[str, ...]:
    """Precisions a search may pick, from ``"fp32,bf16,int8"`` (each once, widest first)."""
    names = [parse_precision(t) for t in str(text).split(",") if t.strip()]
    if not names:
        raise UserError("no precision to choose from; give e.g. fp32,bf16,int8")
    return tuple(p for p in COMM_PRECISIONS if p in names)


def pick_precision(best_of: Mapping[str, float | None]) -> tuple[str | None, list[tuple[str, float]]]:
    """The precision whose best value (epoch ms, GPU-hours...) is smallest, and every finite
    (precision, best value) ranked; ties go to the widest precision, as :data:`COMM_PRECISIONS`
    orders them. None when no precision has a finite value (nothing feasible)."""
    found = [(p, float(v)) for p, v in best_of.items() if v is not None and math.isfinite(float(v))]
    if not found:
        return None, []
    order = {p: i for i, p in enumerate(COMM_PRECISIONS)}
    ranked = sorted(found, key=lambda pv: (pv[1], order.get(pv[0].split("=")[-1], len(order))))
    return ranked[0][0], ranked


def best_feasible_ms(by_precision: Mapping[str, Mapping]) -> dict[str, float]:
    """The fastest feasible ``total_ms`` of each precision's predictions (inf where none fits),
    the input of :func:`pick_precision`."""
    import numpy as np

    out = {}
    for precision, pred in by_precision.items():
        ok = np.flatnonzero(pred["feasible"])
        out[precision] = float(np.asarray(pred["total_ms"])[ok].min()) if ok.size else float("inf")
    return out


def accuracy_evidence(precision: str) -> str:
    """What is known of ``precision``'s effect on accuracy (the last class's choice of a per-class text)."""
    return ACCURACY_EVIDENCE.get(str(precision).split("=")[-1], "none recorded")
