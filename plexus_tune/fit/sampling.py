"""Fit a profile's ``sampling`` entry from sampling records (``plexus-tune calibrate sampling``).

ScaleGNN's sampling step on one rank is modelled as (docs/model.md, "ScaleGNN", Sampling)::

    t = call_ms x layouts + work_bytes / gbps

with ``layouts`` and ``work_bytes`` the model's own count
(:func:`plexus_tune.model.scalegnn.sampling_work`, logged with each record).
:func:`fit_sampling` finds call_ms >= 0 and 1 / gbps >= 0 by non-negative least squares
on the relative residuals (t_model - t) / t, so small and large steps weigh alike.
"""

from __future__ import annotations

import numpy as np

from plexus_tune.fit.solvers import nnls_relative

#: fewest records a fit takes (two unknowns, and some to spare)
MIN_RECORDS = 4


def fit_sampling(records) -> dict | None:
    """``{"call_ms", "gbps", "records", "mape"}`` from sampling records (None with fewer than
    :data:`MIN_RECORDS` usable ones, or when no byte rate is found)."""
    rows = [(float(r["layouts"]), float(r["work_bytes"]), float(r["time_ms"])) for r in records
            if r.get("layouts") and r.get("work_bytes") and r.get("time_ms") and float(r["time_ms"]) > 0]
    if len(rows) < MIN_RECORDS:
        return None
    a = np.asarray(rows, dtype=np.float64)
    layouts, work, t = a[:, 0], a[:, 1], a[:, 2]
    call_ms, ms_per_byte = nnls_relative(np.column_stack([layouts, work]), t)
    if ms_per_byte <= 0:
        return None
    predicted = call_ms * layouts + ms_per_byte * work
    return {"call_ms": float(call_ms), "gbps": float(1e-6 / ms_per_byte), "records": int(len(rows)),
            "mape": float(np.mean(np.abs(predicted - t) / t) * 100.0)}
