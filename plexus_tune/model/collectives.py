"""Collective communication: ring step counts, nccl-tests bandwidths, group placement and the
network models that time a collective (docs/model.md, "Collectives").

Ring algorithms. For a buffer of M bytes (the full reduced or gathered result) on g ranks,
a ring takes ``steps`` steps of latency alpha and moves ``factor * M`` bytes per rank::

    all_reduce:                  steps = 2 (g - 1)   factor = 2 (g - 1) / g
    all_gather, reduce_scatter:  steps =   (g - 1)   factor =   (g - 1) / g

    time = steps alpha m + factor M / beta

with m the number of messages the buffer is sent in (latency per message, bandwidth once)
and beta the bus bandwidth. nccl-tests conventions: algbw = M / t, busbw = algbw * factor;
profiles store busbw as beta. A group of one rank costs nothing.

Placement. Rank = z Gx Gy + x Gy + y, so the group of an axis of size g at stride p (1
for Y, Gy for X, Gx Gy for Z) is {r0 + j p : j < g}. On nodes of n ranks it spans
k = min(g, ceil(p g / n)) nodes (1 exactly when p g <= n) with r = ceil(g / k) of its
ranks per node, and min(n, p) groups of the axis share a node's NICs (the Plexus paper,
eq. 4.6: beta_inter / min(n, p)). k and r are exact when p g divides n or n divides p g.

Network forms (``collectives.form`` of a profile), each with or without ``sharing``
(s = min(n, p) when sharing, else 1; only inter-node bandwidth is shared):

two-tier (default)
    a group inside a node (k = 1) runs the ring at alpha_intra, beta_intra; a group across
    nodes at alpha_inter, beta_inter / s. A measured ``bandwidth_table`` replaces beta
    (shared or not) for the (op, stride, group size) ranges it lists, first match wins.
per-span
    measured alpha and beta per (op, group size, nodes spanned[, stride]) (``per_span``
    entries, first match wins): steps alpha m + factor M s / beta, s only for k > 1;
    shapes no entry covers use the two-tier formula of the same profile.
hierarchical
    a group of k nodes with r ranks on each: reduce-scatter among the r local ranks
    (beta_intra), the op among the k nodes on M / r by each local rank (r rings per group
    and s groups leave each node at once, so each gets beta_inter / (r s)), then all-gather
    among the r local ranks. Per rank::

        all_reduce:      2 (r-1) alpha_intra m + 2 (k-1) alpha_inter m
                         + 2 (r-1)/r M / beta_intra + 2 (k-1)/k M s / beta_inter
        all_gather,
        reduce_scatter:    (r-1) alpha_intra m +   (k-1) alpha_inter m
                         +   (r-1)/r M / beta_intra +   (k-1)/k M s / beta_inter

    (all-gather: inter stage first, on M / r, then intra; reduce-scatter: intra first).
    It equals the intra ring when k = 1 and the two-tier inter ring when r = 1.

A backend that reduce-scatters by all-reducing the whole buffer and keeping its block
(gloo's reduce_scatter_tensor; ``collectives.reduce_scatter_form`` ``all_reduce``) has its
reduce-scatter of M timed as the all-reduce of M, whatever the form.

Broadcasts and point-to-point exchanges (the CAGNET and partitioned families' operations)
have tier parameters of their own where the profile gives them (``collectives.op_tiers``,
fitted from ``calibrate collectives`` timings of these ops), else the collectives' tiers.
Whatever the form, they are timed per rank on the two tiers (docs/model.md, "Broadcast and
point to point")::

    broadcast (root's block of M bytes to g ranks), form ``ring`` (pipelined; the default):
        (g-1) alpha m + M s / beta                  (intra when k = 1, else inter)
    form ``flat`` (the root sends M to each member, as gloo's broadcast measures):
        (r-1) (alpha_intra m + M / beta_intra) + (g-r) (alpha_inter m + M s / beta_inter)
    form ``flat-overlapped`` (the same sends posted at once, their latencies overlapping):
        [r > 1] alpha_intra m + (r-1) M / beta_intra + [g > r] alpha_inter m + (g-r) M s / beta_inter
    point_to_point (every rank sends M / g bytes to each of the g-1 others; r of them
    on its node, s = r (groups sharing its NICs) senders crossing from its node):
        (r-1) alpha_intra m + (r-1) M/g / beta_intra
        + (g-r) alpha_inter m + (g-r) M/g s / beta_inter

nccl-tests' bus bandwidth: busbw = algbw * factor with factor 1 for broadcast and
(g-1)/g for point_to_point (nccl-tests' alltoall; M the whole send buffer, own block
included).

Every form is linear in (alpha_intra, alpha_inter, 1 / beta_intra, 1 / beta_inter) given
the :class:`Terms` of a shape, which is how ``plexus_tune.fit.collectives`` fits them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import ClassVar, NamedTuple

import numpy as np

from plexus_tune.errors import UserError

GB = 1e9
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter")
#: the families' operations beside the collectives, with tier parameters of their own
EXCHANGE_OPS = ("broadcast", "point_to_point")
ALL_OPS = (*COLLECTIVE_OPS, *EXCHANGE_OPS)
#: how a broadcast's bytes travel: a pipelined ring, or the root sending to each member
BROADCAST_FORMS = ("ring", "flat", "flat-overlapped")
#: how the backend runs a reduce-scatter: a ring, or an all-reduce of the whole buffer of
#: which each rank keeps its block (gloo's reduce_scatter_tensor)
REDUCE_SCATTER_FORMS = ("ring", "all_reduce")
FORMS = ("two-tier", "per-span", "hierarchical")
DEFAULT_FORM = "two-tier"
TIER_KEYS = ("alpha_intra_us", "beta_intra_gbps", "alpha_inter_us", "beta_inter_gbps")


# ----------------------------------------------------------------------------- ring terms


def op_array(op) -> np.ndarray:
    """``op`` (a name or an array of names) as a string array; UserError for an unknown one."""
    ops = np.asarray(op).astype(str)
    bad = ~np.isin(ops, ALL_OPS)
    if np.any(bad):
        raise UserError(f"unknown collective op {str(ops[bad].flat[0])!r}; known: {', '.join(ALL_OPS)}")
    return ops


def ring_terms(op, group_size) -> tuple[np.ndarray, np.ndarray]:
    """(steps, factor) per row: all-reduce 2(g-1), 2(g-1)/g; all-gather, reduce-scatter and
    point_to_point g-1, (g-1)/g; broadcast g-1, 1 (nccl-tests' bus bandwidth factors)."""
    ops = op_array(op)
    g = np.asarray(group_size, dtype=np.float64)
    steps = np.where(ops == "all_reduce", 2.0, 1.0) * (g - 1.0)
    return steps, np.where(ops == "broadcast", 1.0, steps / np.maximum(g, 1.0))


def bus_bandwidth_gbps(op, group_size, message_bytes, time_ms) -> tuple[np.ndarray, np.ndarray]:
    """(algbw, busbw) in GB/s, nccl-tests conventions: algbw = M / t, busbw = algbw * factor."""
    _, factor = ring_terms(op, group_size)
    algbw = np.asarray(message_bytes, dtype=np.float64) / (np.asarray(time_ms, dtype=np.float64) * 1e-3) / GB
    return algbw, algbw * factor


#: the name the microbenchmarks use
bandwidths_gbps = bus_bandwidth_gbps


def collective_elements(op: str, message_bytes: int, group_size: int, element_size: int = 4) -> int:
    """Elements of the full buffer, rounded so that all-gather, reduce-scatter and point_to_point split evenly."""
    elems = max(1, round(message_bytes / element_size))
    if op not in ("all_reduce", "broadcast"):
        elems = max(group_size, round(elems / group_size) * group_size)
    return elems


# ----------------------------------------------------------------------------- placement


def nodes_spanned(members: Iterable[int], gpus_per_node: int) -> int:
    """How many nodes (consecutive blocks of ``gpus_per_node`` ranks) hold the members."""
    return len({m // gpus_per_node for m in members})


@dataclass(frozen=True)
class Placement:
    """Where the groups of a shape sit, per row: nodes spanned k, ranks per node r, groups
    sharing a node's NICs s = min(n, p), and the stride p (None when unknown)."""

    nodes: np.ndarray
    ranks_per_node: np.ndarray
    concurrent: np.ndarray
    stride: np.ndarray | None = None

    def __getitem__(self, idx) -> Placement:
        return Placement(self.nodes[idx], self.ranks_per_node[idx], self.concurrent[idx],
                         None if self.stride is None else self.stride[idx])


def placement(group_size, stride, gpus_per_node: int) -> Placement:
    """Placement of an axis group of ``group_size`` ranks at ``stride`` on nodes of ``gpus_per_node``.

        k = min(g, ceil(p g / n)),  r = ceil(g / k),  s = min(n, p)
    """
    g, p = np.broadcast_arrays(np.asarray(group_size, dtype=np.int64), np.asarray(stride, dtype=np.int64))
    n = int(gpus_per_node)
    k = np.maximum(1, np.minimum(g, -(-(p * g) // n)))
    return Placement(nodes=k, ranks_per_node=-(-g // k), concurrent=np.minimum(n, p), stride=p)


# ----------------------------------------------------------------------------- terms


class Terms(NamedTuple):
    """What a collective costs per unit parameter: ring steps paid at alpha_intra and at
    alpha_inter (messages included), and bytes moved at beta_intra and at beta_inter
    (sharing included). time_ms = 1e-3 (lat_intra alpha_intra_us + lat_inter alpha_inter_us)
    + 1e-6 (bytes_intra / beta_intra_gbps + bytes_inter / beta_inter_gbps)."""

    lat_intra: np.ndarray
    lat_inter: np.ndarray
    bytes_intra: np.ndarray
    bytes_inter: np.ndarray


def _shared(place: Placement, sharing: bool) -> np.ndarray:
    return place.concurrent.astype(np.float64) if sharing else np.ones(place.nodes.shape)


def two_tier_terms(op, group_size, place: Placement, message_bytes, messages, sharing: bool) -> Terms:
    """Ring on one tier: intra when the group stays in a node (k = 1), else inter with M s."""
    steps, factor = ring_terms(op, group_size)
    lat = steps * messages
    vol = factor * np.asarray(message_bytes, dtype=np.float64)
    intra = place.nodes <= 1
    zero = np.zeros(intra.shape)
    return Terms(np.where(intra, lat, zero), np.where(intra, zero, lat), np.where(intra, vol, zero),
                 np.where(intra, zero, vol * _shared(place, sharing)))


def hierarchical_terms(op, group_size, place: Placement, message_bytes, messages, sharing: bool) -> Terms:
    """Intra stages among r local ranks and inter stages among k nodes (module docstring)."""
    ops = op_array(op)
    mult = np.where(ops == "all_reduce", 2.0, 1.0)
    r = place.ranks_per_node.astype(np.float64)
    k = place.nodes.astype(np.float64)
    m = np.asarray(message_bytes, dtype=np.float64)
    return Terms(mult * (r - 1.0) * messages, mult * (k - 1.0) * messages, mult * (r - 1.0) / r * m,
                 mult * (k - 1.0) / k * m * _shared(place, sharing))


def exchange_terms(op, group_size, place: Placement, message_bytes, messages, sharing: bool,
                   broadcast_form: str = "ring") -> Terms:
    """Per-rank :class:`Terms` of broadcast and point_to_point (module docstring).

    point_to_point: r - 1 messages of M / g inside the node and g - r across, the crossing
    bytes times the r s senders of the node. broadcast, ``ring``: the two-tier ring with
    factor 1, (g-1) alpha + M s / beta; ``flat``: the root sends M to each member, r - 1
    inside its node and g - r across (times the s groups sharing the node)."""
    ops = op_array(op)
    g = np.asarray(group_size, dtype=np.float64)
    m = np.asarray(message_bytes, dtype=np.float64)
    msgs = np.asarray(messages, dtype=np.float64)
    if broadcast_form not in BROADCAST_FORMS:
        raise UserError(f"unknown broadcast form {broadcast_form!r}; choose one of {', '.join(BROADCAST_FORMS)}")
    ring = two_tier_terms(ops, group_size, place, m, msgs, sharing)
    r = np.minimum(place.ranks_per_node.astype(np.float64), g)
    s = _shared(place, sharing)
    crossing = g > r
    p2p = ops == "point_to_point"
    flat = (ops == "broadcast") & (broadcast_form in ("flat", "flat-overlapped"))
    per_message = np.where(p2p, m / np.maximum(g, 1.0), m)
    share = np.where(p2p & crossing, r * s, s) if sharing else np.ones(g.shape)
    own = p2p | flat
    lat_intra, lat_inter = (r - 1.0) * msgs, (g - r) * msgs
    if broadcast_form == "flat-overlapped":  # one latency per tier for the broadcasts
        lat_intra = np.where(p2p, lat_intra, np.minimum(lat_intra, msgs))
        lat_inter = np.where(p2p, lat_inter, np.minimum(lat_inter, msgs))
    return Terms(np.where(own, lat_intra, ring.lat_intra), np.where(own, lat_inter, ring.lat_inter),
                 np.where(own, (r - 1.0) * per_message, ring.bytes_intra),
                 np.where(own, (g - r) * per_message * share, ring.bytes_inter))


def exchange_time_ms(tiers: Mapping, intra_msgs, inter_msgs, intra_bytes, inter_bytes) -> np.ndarray:
    """time_ms of a rank's messages on the two tiers (``inter_bytes`` with its sharing):
    1e-3 (m_intra alpha_intra_us + m_inter alpha_inter_us) + 1e-6 (B_intra / beta_intra_gbps + B_inter / beta_inter_gbps)."""
    return terms_time_ms(Terms(np.asarray(intra_msgs, dtype=np.float64), np.asarray(inter_msgs, dtype=np.float64),
                               np.asarray(intra_bytes, dtype=np.float64), np.asarray(inter_bytes, dtype=np.float64)),
                         tiers["alpha_intra_us"], tiers["alpha_inter_us"], tiers["beta_intra_gbps"], tiers["beta_inter_gbps"])


def terms_time_ms(terms: Terms, alpha_intra_us, alpha_inter_us, beta_intra_gbps, beta_inter_gbps) -> np.ndarray:
    """time_ms of :class:`Terms` with the given tier parameters."""
    return (1e-3 * (terms.lat_intra * alpha_intra_us + terms.lat_inter * alpha_inter_us)
            + 1e-6 * (terms.bytes_intra / beta_intra_gbps + terms.bytes_inter / beta_inter_gbps))


# ----------------------------------------------------------------------------- profile checks


def _where(source: str) -> str:
    return f"machine profile {source}"


#: the largest magnitude of a profile number in its unit (GiB, TFLOP/s, GB/s, us, ms): beyond it
#: a product of two fields can overflow, and no machine comes near it
PROFILE_MAX = 1e15


def profile_number(data: Mapping, key: str, where: str, source: str, *, positive: bool = False, nonneg: bool = False) -> float:
    """The number ``data[key]`` of a machine profile (field ``where + key``), checked finite, at most
    :data:`PROFILE_MAX` in magnitude (and positive, or not negative); a UserError naming the
    profile and field otherwise."""
    if key not in data:
        raise UserError(f"{_where(source)} lacks the field '{where}{key}'; see docs/profiles.md")
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{_where(source)}: '{where}{key}' must be a number, got {value!r}")
    if abs(value) > PROFILE_MAX:
        raise UserError(f"{_where(source)}: '{where}{key}' is {value!r}, beyond any machine (at most {PROFILE_MAX:g} "
                        "in its unit)")
    if positive and value <= 0:
        raise UserError(f"{_where(source)}: '{where}{key}' must be positive, got {value!r}")
    if nonneg and value < 0:
        raise UserError(f"{_where(source)}: '{where}{key}' must not be negative, got {value!r}")
    return float(value)


def _int(value, what: str, source: str, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise UserError(f"{_where(source)}: {what} must be an integer >= {low}, got {value!r}")
    return value


def _range(value, what: str, source: str) -> tuple[int, float]:
    """A table range: an int, or [min, max] with max null meaning unbounded."""
    if isinstance(value, int) and not isinstance(value, bool):
        low, high = value, value
    elif isinstance(value, list) and len(value) == 2:
        low, high = value
    else:
        raise UserError(f"{_where(source)}: bandwidth_table {what} must be an integer or [min, max], got {value!r}")
    if isinstance(low, bool) or not isinstance(low, int) or low < 1:
        raise UserError(f"{_where(source)}: bandwidth_table {what} minimum must be an integer >= 1, got {low!r}")
    if high is None:
        high = math.inf
    elif isinstance(high, bool) or not isinstance(high, int) or high < low:
        raise UserError(f"{_where(source)}: bandwidth_table {what} maximum must be an integer >= {low} or null, got {high!r}")
    return low, high


def _ops(entry: Mapping, what: str, source: str) -> tuple[str, ...]:
    ops = entry.get("ops", list(COLLECTIVE_OPS))
    if not isinstance(ops, list) or any(op not in COLLECTIVE_OPS for op in ops):
        raise UserError(f"{_where(source)}: {what}.ops must list some of {', '.join(COLLECTIVE_OPS)}")
    return tuple(ops)


def check_table(table, source: str) -> list[dict]:
    """Checked ``bandwidth_table`` entries: stride and group (min, max), beta_gbps, ops."""
    if not isinstance(table, list):
        raise UserError(f"{_where(source)}: collectives.bandwidth_table must be a list of entries")
    entries = []
    for k, entry in enumerate(table):
        if not isinstance(entry, Mapping):
            raise UserError(f"{_where(source)}: bandwidth_table[{k}] must be an object")
        for key in ("stride", "group", "beta_gbps"):
            if key not in entry:
                raise UserError(f"{_where(source)} lacks the field 'collectives.bandwidth_table[{k}].{key}'")
        stride = _range(entry["stride"], f"[{k}].stride", source)
        group = _range(entry["group"], f"[{k}].group", source)
        beta = profile_number(entry, "beta_gbps", f"collectives.bandwidth_table[{k}].", source, positive=True)
        entries.append({"stride": stride, "group": group, "beta_gbps": beta, "ops": _ops(entry, f"bandwidth_table[{k}]", source)})
    return entries


def check_per_span(entries, source: str) -> list[dict]:
    """Checked ``per_span`` entries: op, group, nodes, stride (or None), alpha_us, beta_gbps."""
    if not isinstance(entries, list) or not entries:
        raise UserError(f"{_where(source)}: collectives.per_span must be a non-empty list of entries")
    out = []
    for k, entry in enumerate(entries):
        where = f"collectives.per_span[{k}]"
        if not isinstance(entry, Mapping):
            raise UserError(f"{_where(source)}: {where} must be an object")
        for key in ("op", "group", "nodes", "alpha_us", "beta_gbps"):
            if key not in entry:
                raise UserError(f"{_where(source)} lacks the field '{where}.{key}'")
        if entry["op"] not in COLLECTIVE_OPS:
            raise UserError(f"{_where(source)}: {where}.op must be one of {', '.join(COLLECTIVE_OPS)}, got {entry['op']!r}")
        stride = entry.get("stride")
        out.append({
            "op": entry["op"],
            "group": _int(entry["group"], f"{where}.group", source, low=2),
            "nodes": _int(entry["nodes"], f"{where}.nodes", source),
            "stride": None if stride is None else _int(stride, f"{where}.stride", source),
            "alpha_us": profile_number(entry, "alpha_us", f"{where}.", source, nonneg=True),
            "beta_gbps": profile_number(entry, "beta_gbps", f"{where}.", source, positive=True),
        })
    return out


def check_op_tiers(data, source: str) -> dict:
    """Checked ``op_tiers``: {op: the four tier parameters} for ops of :data:`EXCHANGE_OPS`."""
    if not isinstance(data, Mapping):
        raise UserError(f"{_where(source)}: collectives.op_tiers must be an object of op -> tier parameters")
    out = {}
    for op, tiers in data.items():
        if op not in EXCHANGE_OPS:
            raise UserError(f"{_where(source)}: collectives.op_tiers has {op!r}; its ops are {', '.join(EXCHANGE_OPS)}")
        if not isinstance(tiers, Mapping):
            raise UserError(f"{_where(source)}: collectives.op_tiers.{op} must be an object")
        where = f"collectives.op_tiers.{op}."
        out[op] = {key: profile_number(tiers, key, where, source, **({"nonneg": True} if key.startswith("alpha") else {"positive": True}))
                   for key in TIER_KEYS}
        if "form" in tiers:
            if op != "broadcast" or tiers["form"] not in BROADCAST_FORMS:
                raise UserError(f"{_where(source)}: {where}form must be one of {', '.join(BROADCAST_FORMS)} "
                                f"(broadcast only), got {tiers['form']!r}")
            out[op]["form"] = tiers["form"]
    return out


def check_collectives(data, source: str = "<dict>") -> dict:
    """Validate a profile's ``collectives`` object; returns the checked values.

    Keys: the four tier parameters (floats), ``form``, ``sharing``, and where given the
    checked ``bandwidth_table`` and ``per_span`` entries. Other keys (e.g. ``note``) are
    ignored.
    """
    if not isinstance(data, Mapping):
        raise UserError(f"{_where(source)}: 'collectives' must be an object")
    for key in TIER_KEYS:
        if key not in data:
            raise UserError(f"{_where(source)} lacks the field 'collectives.{key}'; see docs/profiles.md")
    checked: dict = {}
    for key in ("alpha_intra_us", "alpha_inter_us"):
        checked[key] = profile_number(data, key, "collectives.", source, nonneg=True)
    for key in ("beta_intra_gbps", "beta_inter_gbps"):
        checked[key] = profile_number(data, key, "collectives.", source, positive=True)
    form = data.get("form", DEFAULT_FORM)
    if form not in FORMS:
        raise UserError(f"{_where(source)}: collectives.form must be one of {', '.join(FORMS)}, got {form!r}")
    sharing = data.get("sharing", True)
    if not isinstance(sharing, bool):
        raise UserError(f"{_where(source)}: collectives.sharing must be true or false, got {sharing!r}")
    checked["form"], checked["sharing"] = form, sharing
    if data.get("bandwidth_table") is not None:
        if form == "hierarchical":
            raise UserError(f"{_where(source)}: collectives.bandwidth_table applies to the forms two-tier and per-span, not hierarchical")
        checked["bandwidth_table"] = check_table(data["bandwidth_table"], source)
    if form == "per-span":
        if data.get("per_span") is None:
            raise UserError(f"{_where(source)} lacks the field 'collectives.per_span' (form per-span); see docs/profiles.md")
        checked["per_span"] = check_per_span(data["per_span"], source)
    elif data.get("per_span") is not None:
        raise UserError(f"{_where(source)}: collectives.per_span is read only by form per-span, not {form}")
    if data.get("op_tiers") is not None:
        checked["op_tiers"] = check_op_tiers(data["op_tiers"], source)
    rs_form = data.get("reduce_scatter_form", "ring")
    if rs_form not in REDUCE_SCATTER_FORMS:
        raise UserError(f"{_where(source)}: collectives.reduce_scatter_form must be one of "
                        f"{', '.join(REDUCE_SCATTER_FORMS)}, got {rs_form!r}")
    checked["reduce_scatter_form"] = rs_form
    return checked


# ----------------------------------------------------------------------------- network models


def _broadcast(group_size, stride, message_bytes, messages):
    return np.broadcast_arrays(np.asarray(group_size, dtype=np.int64), np.asarray(stride, dtype=np.int64),
                               np.asarray(message_bytes, dtype=np.float64), np.asarray(messages, dtype=np.float64))


@dataclass(frozen=True)
class Network:
    """A collective model: times an op of M bytes on an axis group (vectorized numpy).

    Build one from a profile's ``collectives`` object with :meth:`from_dict`; :meth:`to_dict`
    writes it back. ``gpus_per_node`` places groups given by stride (:func:`placement`).
    """

    gpus_per_node: int | None
    alpha_intra_us: float
    beta_intra_gbps: float
    alpha_inter_us: float
    beta_inter_gbps: float
    sharing: bool = True
    #: ((op, {tier parameters}), ...) of broadcast and point_to_point, where measured
    op_tiers: tuple = ()
    #: one of :data:`REDUCE_SCATTER_FORMS`: ``all_reduce`` times a reduce-scatter of M as an all-reduce of M
    reduce_scatter_form: str = "ring"
    form: ClassVar[str] = ""

    # -- construction ---------------------------------------------------------------
    @staticmethod
    def from_dict(data: Mapping, gpus_per_node: int | None = None, source: str = "<dict>") -> Network:
        """The network of a profile's ``collectives`` object (validated; UserError if bad)."""
        return Network.from_checked(check_collectives(data, source), gpus_per_node)

    @staticmethod
    def from_checked(checked: Mapping, gpus_per_node: int | None = None) -> Network:
        """The network of values :func:`check_collectives` returned."""
        tiers = {key: float(checked[key]) for key in TIER_KEYS}
        common = dict(gpus_per_node=None if gpus_per_node is None else int(gpus_per_node), sharing=bool(checked.get("sharing", True)),
                      op_tiers=tuple((op, dict(t)) for op, t in sorted((checked.get("op_tiers") or {}).items())),
                      reduce_scatter_form=checked.get("reduce_scatter_form", "ring"), **tiers)
        form = checked.get("form", DEFAULT_FORM)
        table = tuple(dict(e) for e in checked.get("bandwidth_table") or ())
        if form == "hierarchical":
            return HierarchicalNetwork(**common)
        if form == "per-span":
            return PerSpanNetwork(**common, bandwidth_table=table, entries=tuple(dict(e) for e in checked["per_span"]))
        return TwoTierNetwork(**common, bandwidth_table=table)

    def to_dict(self) -> dict:
        """The profile's ``collectives`` object (JSON types)."""
        out = {"form": self.form, "sharing": self.sharing, "alpha_intra_us": self.alpha_intra_us,
               "beta_intra_gbps": self.beta_intra_gbps, "alpha_inter_us": self.alpha_inter_us,
               "beta_inter_gbps": self.beta_inter_gbps}
        if self.op_tiers:
            out["op_tiers"] = {op: {k: (v if k == "form" else float(v)) for k, v in t.items()} for op, t in self.op_tiers}
        if self.reduce_scatter_form != "ring":
            out["reduce_scatter_form"] = self.reduce_scatter_form
        return out

    def tiers(self, op: str) -> dict:
        """The four tier parameters ``op`` is timed with: its own (``op_tiers``) or the collectives'."""
        own = dict(self.op_tiers).get(op)
        return dict(own) if own is not None else {key: getattr(self, key) for key in TIER_KEYS}

    def scaled(self, s: float) -> Network:
        """The same network with every time multiplied by s (alphas x s, betas / s)."""
        return replace(self, alpha_intra_us=self.alpha_intra_us * s, alpha_inter_us=self.alpha_inter_us * s,
                       beta_intra_gbps=self.beta_intra_gbps / s, beta_inter_gbps=self.beta_inter_gbps / s,
                       op_tiers=tuple((op, _scale_tiers(t, s)) for op, t in self.op_tiers))

    # -- evaluation -----------------------------------------------------------------
    def placement(self, group_size, stride) -> Placement:
        if self.gpus_per_node is None:
            raise UserError("this collective model has no gpus_per_node: give it to place groups by stride")
        return placement(group_size, stride, self.gpus_per_node)

    def terms(self, op, group_size, place: Placement, message_bytes, messages=1) -> Terms:
        """The form's :class:`Terms` (the tier formula, before any measured override)."""
        raise NotImplementedError

    def time_ms(self, op, group_size, stride, message_bytes, messages=1) -> np.ndarray:
        """Time (ms) of ``op`` on groups of ``group_size`` ranks at ``stride`` (vectorized).

        ``message_bytes`` is the full buffer; ``messages`` splits it into that many sends
        (latency per message, bandwidth once). ``op`` is a name or an array of names.
        """
        op = op_array(op)
        g, p, m_bytes, msgs = _broadcast(group_size, stride, message_bytes, messages)
        return self.placed_time_ms(op, g, self.placement(g, p), m_bytes, msgs)

    def timed_ops(self, op) -> np.ndarray:
        """``op`` as the backend runs it: a reduce-scatter as an all-reduce of its whole buffer
        where ``reduce_scatter_form`` is ``all_reduce``."""
        ops = op_array(op)
        if self.reduce_scatter_form == "all_reduce":
            ops = np.where(ops == "reduce_scatter", "all_reduce", ops)
        return ops

    def placed_time_ms(self, op, group_size, place: Placement, message_bytes, messages=1) -> np.ndarray:
        """:meth:`time_ms` of groups whose :class:`Placement` is given (e.g. read from a log);
        an op is timed as :meth:`timed_ops` says the backend runs it."""
        op = self.timed_ops(op)
        g = np.asarray(group_size, dtype=np.int64)
        m_bytes = np.asarray(message_bytes, dtype=np.float64)
        msgs = np.asarray(messages, dtype=np.float64)
        t = self._time(op, g, place, m_bytes, msgs)
        for name in EXCHANGE_OPS:
            rows = op == name
            if np.any(rows):
                tiers = self.tiers(name)
                terms = exchange_terms(op, g, place, m_bytes, msgs, self.sharing, tiers.get("form", "ring"))
                own = terms_time_ms(terms, tiers["alpha_intra_us"], tiers["alpha_inter_us"], tiers["beta_intra_gbps"],
                                    tiers["beta_inter_gbps"])
                t = np.where(rows, own, t)
        return np.where(g > 1, t, 0.0)

    def _time(self, op, g, place, m_bytes, msgs) -> np.ndarray:
        terms = self.terms(op, g, place, m_bytes, msgs)
        return terms_time_ms(terms, self.alpha_intra_us, self.alpha_inter_us, self.beta_intra_gbps, self.beta_inter_gbps)

    def effective_beta_gbps(self, op, group_size, stride) -> np.ndarray:
        """Bus bandwidth (GB/s) a group sees: factor M over the bandwidth part of its time."""
        op = op_array(op)
        g, p, _, _ = _broadcast(group_size, stride, 1.0, 1.0)
        one = np.ones(g.shape)
        with np.errstate(divide="ignore", invalid="ignore"):
            bw_ms = self._time(op, g, self.placement(g, p), one, np.zeros(g.shape))
            _, factor = ring_terms(op, g)
            beta = factor / (bw_ms * 1e6)
        return np.where(g > 1, beta, self.beta_intra_gbps)


def _table_hits(table, op, g, stride):
    """(hit, beta_gbps) per row of the first matching ``bandwidth_table`` entry."""
    beta = np.zeros(g.shape)
    done = np.zeros(g.shape, dtype=bool)
    if not table or stride is None:
        return done, beta
    p = np.broadcast_to(stride, g.shape)
    for entry in table:
        (p_lo, p_hi), (g_lo, g_hi) = entry["stride"], entry["group"]
        hit = ~done & np.isin(op, entry["ops"]) & (p >= p_lo) & (p <= p_hi) & (g >= g_lo) & (g <= g_hi)
        beta = np.where(hit, entry["beta_gbps"], beta)
        done |= hit
    return done, beta


def _table_json(entry: Mapping) -> dict:
    def rng(lo, hi):
        return [int(lo), None if hi == math.inf else int(hi)]

    out = {"stride": rng(*entry["stride"]), "group": rng(*entry["group"]), "beta_gbps": float(entry["beta_gbps"])}
    if tuple(entry["ops"]) != COLLECTIVE_OPS:
        out["ops"] = list(entry["ops"])
    return out


@dataclass(frozen=True)
class TwoTierNetwork(Network):
    """Ring at the intra or inter tier; inter bandwidth shared by min(n, p) groups; measured
    ``bandwidth_table`` entries (checked form) replace beta where they match."""

    bandwidth_table: tuple = ()
    form: ClassVar[str] = "two-tier"

    def terms(self, op, group_size, place, message_bytes, messages=1) -> Terms:
        return two_tier_terms(op, group_size, place, message_bytes, messages, self.sharing)

    def _time(self, op, g, place, m_bytes, msgs) -> np.ndarray:
        terms = self.terms(op, g, place, m_bytes, msgs)
        t = terms_time_ms(terms, self.alpha_intra_us, self.alpha_inter_us, self.beta_intra_gbps, self.beta_inter_gbps)
        hit, beta = _table_hits(self.bandwidth_table, op, g, place.stride)
        if np.any(hit):
            _, factor = ring_terms(op, g)
            latency = 1e-3 * (terms.lat_intra * self.alpha_intra_us + terms.lat_inter * self.alpha_inter_us)
            t = np.where(hit, latency + 1e-6 * factor * m_bytes / np.where(hit, beta, 1.0), t)
        return t

    def effective_beta_gbps(self, op, group_size, stride) -> np.ndarray:
        """beta_intra inside a node, beta_inter / s across nodes, or the matching table entry's."""
        op = op_array(op)
        g, p, _, _ = _broadcast(group_size, stride, 1.0, 1.0)
        place = self.placement(g, p)
        beta = np.where(place.nodes <= 1, self.beta_intra_gbps, self.beta_inter_gbps / _shared(place, self.sharing))
        hit, table_beta = _table_hits(self.bandwidth_table, op, g, place.stride)
        return np.where(hit, table_beta, beta)

    def to_dict(self) -> dict:
        out = super().to_dict()
        if self.bandwidth_table:
            out["bandwidth_table"] = [_table_json(e) for e in self.bandwidth_table]
        return out

    def scaled(self, s: float) -> TwoTierNetwork:
        base = super().scaled(s)
        return replace(base, bandwidth_table=tuple({**e, "beta_gbps": e["beta_gbps"] / s} for e in self.bandwidth_table))


@dataclass(frozen=True)
class PerSpanNetwork(TwoTierNetwork):
    """alpha and beta measured per (op, group size, nodes spanned[, stride]); ``entries``
    (checked ``per_span``) are tried in order, shapes none covers use the two-tier formula."""

    entries: tuple = ()
    form: ClassVar[str] = "per-span"

    def entry_index(self, op, g, place: Placement) -> np.ndarray:
        """Index of the first matching entry per row (-1: none)."""
        idx = np.full(g.shape, -1, dtype=np.int64)
        for i, e in enumerate(self.entries):
            hit = (idx < 0) & (op == e["op"]) & (g == e["group"]) & (place.nodes == e["nodes"])
            if e["stride"] is not None:
                hit &= False if place.stride is None else (place.stride == e["stride"])
            idx = np.where(hit, i, idx)
        return idx

    def _time(self, op, g, place, m_bytes, msgs) -> np.ndarray:
        t = super()._time(op, g, place, m_bytes, msgs)
        idx = self.entry_index(op, g, place)
        if np.any(idx >= 0):
            alpha = np.array([e["alpha_us"] for e in self.entries] + [0.0])[idx]
            beta = np.array([e["beta_gbps"] for e in self.entries] + [1.0])[idx]
            steps, factor = ring_terms(op, g)
            s = np.where(place.nodes > 1, _shared(place, self.sharing), 1.0)
            own = 1e-3 * steps * msgs * alpha + 1e-6 * factor * m_bytes * s / beta
            t = np.where(idx >= 0, own, t)
        return t

    def effective_beta_gbps(self, op, group_size, stride) -> np.ndarray:
        """The two-tier value, or the matching entry's beta / s."""
        op = op_array(op)
        g, p, _, _ = _broadcast(group_size, stride, 1.0, 1.0)
        place = self.placement(g, p)
        idx = self.entry_index(op, g, place)
        own = np.array([e["beta_gbps"] for e in self.entries] + [1.0])[idx]
        own = own / np.where(place.nodes > 1, _shared(place, self.sharing), 1.0)
        return np.where(idx >= 0, own, super().effective_beta_gbps(op, g, p))

    def to_dict(self) -> dict:
        out = super().to_dict()
        out["per_span"] = [
            {"op": e["op"], "group": int(e["group"]), "nodes": int(e["nodes"]),
             **({} if e["stride"] is None else {"stride": int(e["stride"])}),
             "alpha_us": float(e["alpha_us"]), "beta_gbps": float(e["beta_gbps"])}
            for e in self.entries
        ]
        return out

    def scaled(self, s: float) -> PerSpanNetwork:
        base = super().scaled(s)
        return replace(base, entries=tuple({**e, "alpha_us": e["alpha_us"] * s, "beta_gbps": e["beta_gbps"] / s} for e in self.entries))


@dataclass(frozen=True)
class HierarchicalNetwork(Network):
    """Intra-node reduce-scatter, inter-node op on M / r, intra-node all-gather."""

    form: ClassVar[str] = "hierarchical"

    def terms(self, op, group_size, place, message_bytes, messages=1) -> Terms:
        return hierarchical_terms(op, group_size, place, message_bytes, messages, self.sharing)


def _scale_tiers(tiers: Mapping, s: float) -> dict:
    return {key: (v if key == "form" else float(v) * s if key.startswith("alpha") else float(v) / s)
            for key, v in tiers.items()}


def scale_collectives(collectives: Mapping, s: float) -> dict:
    """A profile's ``collectives`` object with every time multiplied by s: alphas x s, every
    beta (tiers, ``bandwidth_table``, ``per_span``) / s; other keys kept."""
    coll = dict(collectives)
    for key in ("alpha_intra_us", "alpha_inter_us"):
        coll[key] = float(coll[key]) * s
    for key in ("beta_intra_gbps", "beta_inter_gbps"):
        coll[key] = float(coll[key]) / s
    if coll.get("bandwidth_table"):
        coll["bandwidth_table"] = [{**e, "beta_gbps": float(e["beta_gbps"]) / s} for e in coll["bandwidth_table"]]
    if coll.get("per_span"):
        coll["per_span"] = [{**e, "alpha_us": float(e["alpha_us"]) * s, "beta_gbps": float(e["beta_gbps"]) / s} for e in coll["per_span"]]
    if coll.get("op_tiers"):
        coll["op_tiers"] = {op: _scale_tiers(t, s) for op, t in coll["op_tiers"].items()}
    return coll
