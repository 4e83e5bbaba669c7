"""Fit a profile's ``quant`` entry: codec rates and the per-call cost of reduced-precision collectives.

Two sources (docs/comm-precision.md, "Calibration"):

* quant records (``plexus-tune calibrate quant``): encode and decode of one tensor in
  one process, or in each of several processes at once (``--processes``, as ranks sharing
  a host's cores); :func:`fit_quant_rates` gives per precision the encode and decode GB/s
  (the median over records of bytes / time, from the records of the most processes).
* collective records at a reduced precision (``plexus-tune calibrate collectives
  --comm-precision``), each paired with the FP32 record of the same op, group and size
  timed in the same run; :func:`fit_call_ms` gives the time each process-group call of
  the scheme adds beyond what the model already counts::

      extra = (t_P - t_fp32) - (net_P(M) - net(M)) - codec_P(M)
      call_ms = max(0, median over the pairs of extra / calls)     (groups inside a node)
      call_inter_ms = the same over the pairs of groups that span nodes

  with ``net`` the profile's collective model and ``net_P`` the same at precision P in
  the trainer's scheme (:func:`plexus_tune.model.machine.precision_wire_time_ms`, the
  bytes' part of the one ``predict`` uses), ``codec_P`` the codec time at the fitted rates and ``calls``
  the process-group calls of one collective at P (two for an all-reduce). A pair is
  taken from one calibration run (same ``measured_at``), on all groups at once. ``predict``
  books ``calls x call_ms`` as communication, where the trainer's timers count it.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from plexus_tune.model.comm_precision import (
    QUANT_CALL_INTER_KEY,
    QUANT_CALL_KEY,
    codec_bytes,
    parse_precision,
    process_group_calls,
    quant_time_ms,
)
from plexus_tune.fit.tables import pd_numeric
from plexus_tune.model.machine import collective_time_ms, is_intra_node, precision_wire_time_ms

#: The placements the per-call time is fitted for: (tier, its ``quant`` key, words for reports).
CALL_TIERS = (("intra", QUANT_CALL_KEY, "inside a node"), ("inter", QUANT_CALL_INTER_KEY, "across nodes"))

#: an FP32 record of another size is used for pairing only this close (ratio of sizes)
PAIR_SIZE_RATIO = 1.25


def fit_quant_rates(records) -> dict:
    """A profile's ``quant`` entry from quant records: per precision, encode and decode GB/s.

    Time is taken as proportional to the FP32 bytes (t = bytes / rate); each rate is the
    median over the records of bytes / time, so that one slow timing (a page fault, a
    busy core) does not set it, as it would a least-squares fit, which weights the
    largest tensor most (docs/comm-precision.md, "In the cost model"). Per precision only
    the records timed by the most processes at once (``processes``, absent: 1) count: the
    rate a rank sees when the ranks sharing its host's cores all run the codec.
    """
    records = [rec for rec in records if rec.get("encode_ms") is not None and rec.get("decode_ms") is not None
               and rec.get("fp32_bytes")]
    most: dict = defaultdict(int)
    for rec in records:
        p = parse_precision(rec["precision"])
        most[p] = max(most[p], int(rec.get("processes") or 1))
    rates: dict = defaultdict(lambda: ([], []))
    for rec in records:
        if int(rec.get("processes") or 1) != most[parse_precision(rec["precision"])]:
            continue
        b, enc_s, dec_s = float(rec["fp32_bytes"]), float(rec["encode_ms"]) * 1e-3, float(rec["decode_ms"]) * 1e-3
        if enc_s > 0 and dec_s > 0:
            encode, decode = rates[parse_precision(rec["precision"])]
            encode.append(b / enc_s)
            decode.append(b / dec_s)
    out = {}
    for p, (encode, decode) in rates.items():
        out[p] = {"encode_gbps": float(np.median(encode)) / 1e9, "decode_gbps": float(np.median(decode)) / 1e9,
                  "samples": len(encode)}
        if most[p] > 1:
            out[p]["processes"] = most[p]
    return out


def split_precisions(df):
    """(FP32 rows, reduced-precision rows) of a collective table (no ``comm_precision``: all FP32)."""
    if "comm_precision" not in df:
        return df, df.iloc[:0]
    reduced = df["comm_precision"].fillna("fp32").astype(str).str.strip().str.lower() != "fp32"
    return df[~reduced], df[reduced]


def _concurrent(df):
    """Rows timed on every group of their shape at once, as training runs them."""
    if "alone" not in df:
        return df
    return df[~df["alone"].fillna(False).astype(bool)]


def _local_rates(rows) -> dict:
    """Codec rates from the local time of reduced-precision collective records, where no quant
    record gives them: one rate, the median of codec bytes / local time, for encode and decode."""
    out = {}
    for precision, part in rows.groupby(rows["comm_precision"].map(parse_precision)):
        rates = []
        for r in part.itertuples():
            local = float(getattr(r, "quant_ms", np.nan))
            enc, dec = codec_bytes(r.op, int(r.group_size), float(r.message_bytes))
            if np.isfinite(local) and local > 0 and float(enc + dec) > 0:
                rates.append(float(enc + dec) / (local * 1e-3))
        if rates:
            rate = float(np.median(rates)) / 1e9
            out[precision] = {"encode_gbps": rate, "decode_gbps": rate, "samples": len(rates),
                              "rates_from": "local steps of the collective records"}
    return out


def fit_call_ms(collective_df, machine, quant: dict | None = None) -> tuple[dict, dict]:
    """(``quant`` entry with ``call_ms`` per precision, report) from collective records at
    reduced precisions paired with FP32 ones (formula in the module docstring).

    ``machine``: the profile (:class:`~plexus_tune.model.machine.Machine`) whose collective
    model ``predict`` uses; ``quant``: its codec rates, kept, and completed from the
    records' local times for a precision they lack. Only records timed on all groups at
    once are used. The report gives per precision the pairs used and the quartiles of
    ``extra / calls``.
    """
    fp32, reduced = split_precisions(_concurrent(collective_df))
    out = {k: dict(v) for k, v in (quant or {}).items() if isinstance(v, dict)}
    report: dict = {}
    if not len(reduced):
        return out, report
    for precision, entry in _local_rates(reduced).items():
        out.setdefault(precision, entry)
    needed = {"op", "group_size", "stride", "message_bytes", "time_ms"}
    if not len(fp32) or not needed <= set(collective_df.columns):
        return out, report
    codec_rates = {p: {k: v for k, v in entry.items() if k != QUANT_CALL_KEY} for p, entry in out.items()}
    # pairs from one calibration run (one measured_at stamp) where the logs say which
    run = "measured_at" if "measured_at" in fp32 and "measured_at" in reduced else None
    keys = ["op", "group_size", "stride"] + ([run] if run else [])
    base = {key: part for key, part in fp32.groupby(keys)}
    per_call: dict = defaultdict(list)
    for r in reduced.itertuples():
        precision = parse_precision(r.comm_precision)
        part = base.get((r.op, r.group_size, r.stride) + ((getattr(r, run),) if run else ()))
        if part is None or precision not in out:
            continue
        sizes = pd_numeric(part["message_bytes"], np.nan)
        m = float(r.message_bytes)
        nearest = int(np.nanargmin(np.abs(np.log(sizes / m))))
        m32 = float(sizes[nearest])
        if max(m32, m) / min(m32, m) > PAIR_SIZE_RATIO:
            continue
        g, p = int(r.group_size), int(r.stride)
        rows = float(r.rows) if np.isfinite(float(getattr(r, "rows", np.nan))) else 1.0
        net = lambda nbytes: float(collective_time_ms(machine, r.op, g, p, nbytes))  # noqa: E731
        t32 = float(part["time_ms"].iloc[nearest]) + net(m) - net(m32)  # the FP32 time at this size
        codec = float(quant_time_ms(codec_rates, precision, r.op, g, m))
        wire = float(precision_wire_time_ms(machine, r.op, g, p, m, rows, precision))
        extra = (float(r.time_ms) - t32) - (wire - net(m)) - codec
        tier = "intra" if bool(is_intra_node(machine, g, p)) else "inter"
        per_call[(precision, tier)].append(extra / process_group_calls(r.op, precision))
    keys = {tier: key for tier, key, _ in CALL_TIERS}
    for precision in sorted({key[0] for key in per_call}):
        tiers = {tier: per_call[(precision, tier)] for tier in keys if per_call.get((precision, tier))}
        if len(tiers) == 1:  # one placement measured: one value for both
            tiers = {"intra": next(iter(tiers.values()))}
        entry = report[precision] = {"pairs": sum(len(v) for v in tiers.values())}
        for tier, values in tiers.items():
            q1, median, q3 = (float(v) for v in np.percentile(values, [25, 50, 75]))
            out[precision][keys[tier]] = entry[keys[tier]] = max(0.0, median)
            entry.update({f"{tier}_pairs": len(values), f"{tier}_q1_ms": q1, f"{tier}_median_ms": median,
                          f"{tier}_q3_ms": q3})
        out[precision]["call_samples"] = entry["pairs"]
    return out, report
