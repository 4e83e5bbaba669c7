"""Cluster specs: ``KIND[:key=value,...]`` strings and the frozen :class:`ClusterSpec`.

Kinds::

    local[:ranks_per_node=R]                      one node, no shaping
    emulated:nodes=N,ranks_per_node=R,inter_gbps=B[,inter_latency_us=L][,nics=K][,intra=loopback]
    torchrun[:key=value,...]                      kept open: the keys are returned as given
    slurm[:key=value,...]                         likewise

Units: bandwidth in GB/s (1e9 bytes/s) per direction of a node's link,
latency in microseconds one way between two nodes.  Pure Python, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from plexus_tune.errors import UserError
from plexus_tune.numbers import whole_number

KINDS = ("local", "emulated", "torchrun", "slurm")
OPEN_KINDS = ("torchrun", "slurm")
EMULATED_KEYS = ("nodes", "ranks_per_node", "inter_gbps", "inter_latency_us", "nics", "intra")
EMULATED_REQUIRED = ("nodes", "ranks_per_node", "inter_gbps")
LOCAL_KEYS = ("ranks_per_node",)
INTRA_MODES = ("loopback",)
EXAMPLE = "emulated:nodes=2,ranks_per_node=4,inter_gbps=0.5,inter_latency_us=200"


@dataclass(frozen=True)
class ClusterSpec:
    """Where the ranks run.

    ``inter_gbps``: each node's link rate per direction, GB/s (1e9 bytes/s);
    ``inter_latency_us``: one-way node-to-node latency, microseconds;
    ``nics``: links per node, emulated as one link of ``nics * inter_gbps``.
    ``ranks_per_node`` is None for ``local`` without it (any G fits).
    ``options``: the raw ``key=value`` pairs of the open kinds (torchrun, slurm).
    """

    kind: str
    nodes: int | None = 1
    ranks_per_node: int | None = None
    inter_gbps: float | None = None
    inter_latency_us: float = 0.0
    nics: int = 1
    options: tuple[tuple[str, str], ...] = field(default=())

    @property
    def world_size(self) -> int | None:
        """Number of ranks, or None when the spec leaves it open."""
        if self.nodes is None or self.ranks_per_node is None:
            return None
        return self.nodes * self.ranks_per_node

    @property
    def link_gbps(self) -> float | None:
        """Rate of a node's (aggregated) link per direction, GB/s."""
        if self.inter_gbps is None:
            return None
        return self.inter_gbps * self.nics

    def node_of_rank(self, rank: int) -> int:
        """Node that holds global ``rank`` (ranks fill node 0 first)."""
        if self.ranks_per_node is None:
            if self.nodes == 1:
                return 0
            raise UserError(f"cluster {self.to_string()} does not set ranks_per_node; add ranks_per_node=R")
        if rank < 0 or (self.world_size is not None and rank >= self.world_size):
            raise UserError(f"rank {rank} is outside cluster {self.to_string()} ({self.world_size} ranks)")
        return rank // self.ranks_per_node

    def to_dict(self) -> dict:
        """Plain dict for run records (JSON-safe)."""
        out: dict = {"kind": self.kind, "nodes": self.nodes, "ranks_per_node": self.ranks_per_node}
        if self.kind == "emulated":
            out.update(
                inter_gbps=self.inter_gbps,
                inter_latency_us=self.inter_latency_us,
                nics=self.nics,
            )
        if self.options:
            out["options"] = dict(self.options)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "ClusterSpec":
        """Inverse of :meth:`to_dict`; validates like :func:`parse_cluster`."""
        if not isinstance(data, dict) or "kind" not in data:
            raise UserError("cluster record must be a dict with a 'kind'; write it with ClusterSpec.to_dict()")
        kind = data["kind"]
        if kind == "emulated":
            pairs = [(key, data.get(key)) for key in EMULATED_KEYS if data.get(key) is not None]
        elif kind == "local":
            pairs = [("ranks_per_node", data["ranks_per_node"])] if data.get("ranks_per_node") is not None else []
        elif kind in OPEN_KINDS:
            pairs = list((data.get("options") or {}).items())
        else:
            raise UserError(f"cluster record has unknown kind {kind!r}; use one of {', '.join(KINDS)}")
        text = kind + (":" + ",".join(f"{k}={_format_value(v)}" for k, v in pairs) if pairs else "")
        return parse_cluster(text)

    def to_string(self) -> str:
        """Canonical spec string; ``parse_cluster(spec.to_string()) == spec``."""
        if self.kind == "emulated":
            parts = [
                f"nodes={self.nodes}",
                f"ranks_per_node={self.ranks_per_node}",
                f"inter_gbps={_format_value(self.inter_gbps)}",
                f"inter_latency_us={_format_value(self.inter_latency_us)}",
            ]
            if self.nics != 1:
                parts.append(f"nics={self.nics}")
            return "emulated:" + ",".join(parts)
        if self.kind == "local":
            return "local" if self.ranks_per_node is None else f"local:ranks_per_node={self.ranks_per_node}"
        if self.options:
            return self.kind + ":" + ",".join(f"{k}={v}" for k, v in self.options)
        return self.kind

    def __str__(self) -> str:
        return self.to_string()


def _format_value(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _split(text: str) -> tuple[str, list[tuple[str, str]]]:
    if not isinstance(text, str) or not text.strip():
        raise UserError(f"cluster spec is empty; use 'local' or e.g. '{EXAMPLE}'")
    kind, sep, rest = text.strip().partition(":")
    kind = kind.strip()
    if kind not in KINDS:
        raise UserError(f"cluster spec {text!r}: unknown kind {kind!r}; use one of {', '.join(KINDS)} (e.g. '{EXAMPLE}')")
    pairs: list[tuple[str, str]] = []
    if sep and not rest.strip():
        raise UserError(f"cluster spec {text!r}: nothing after ':'; write key=value pairs separated by commas or drop the ':'")
    seen: set[str] = set()
    for item in rest.split(",") if rest.strip() else []:
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key or not value:
            raise UserError(f"cluster spec {text!r}: {item.strip()!r} is not key=value; separate pairs with commas, e.g. '{EXAMPLE}'")
        if key in seen:
            raise UserError(f"cluster spec {text!r}: key {key!r} given twice; give it once")
        seen.add(key)
        pairs.append((key, value))
    return kind, pairs


def _int(text: str, key: str, spec: str, minimum: int) -> int:
    return whole_number(text, f"cluster spec {spec!r}: {key}", minimum=minimum)


def _float(text: str, key: str, spec: str, *, positive: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
        bad = True
    else:
        bad = not math.isfinite(value)
    if bad:
        raise UserError(f"cluster spec {spec!r}: {key} must be a finite number, got {text!r}")
    if positive and value <= 0:
        raise UserError(f"cluster spec {spec!r}: {key} must be > 0 (GB/s, 1e9 bytes/s), got {text}")
    if not positive and value < 0:
        raise UserError(f"cluster spec {spec!r}: {key} must be >= 0 (microseconds), got {text}")
    return value


def parse_cluster(text: str) -> ClusterSpec:
    """Parse a cluster spec string; bad input raises :class:`UserError` (one line)."""
    kind, pairs = _split(text)
    values = dict(pairs)
    if kind in OPEN_KINDS:
        nodes = _int(values["nodes"], "nodes", text, 1) if "nodes" in values else None
        rpn = _int(values["ranks_per_node"], "ranks_per_node", text, 1) if "ranks_per_node" in values else None
        return ClusterSpec(kind=kind, nodes=nodes, ranks_per_node=rpn, options=tuple(pairs))
    known = EMULATED_KEYS if kind == "emulated" else LOCAL_KEYS
    for key, _value in pairs:
        if key not in known:
            raise UserError(f"cluster spec {text!r}: unknown key {key!r} for kind {kind}; known keys: {', '.join(known)}")
    if kind == "local":
        rpn = _int(values["ranks_per_node"], "ranks_per_node", text, 1) if "ranks_per_node" in values else None
        return ClusterSpec(kind="local", nodes=1, ranks_per_node=rpn)
    missing = [key for key in EMULATED_REQUIRED if key not in values]
    if missing:
        raise UserError(f"cluster spec {text!r}: missing {', '.join(missing)}; e.g. '{EXAMPLE}'")
    intra = values.get("intra", "loopback")
    if intra not in INTRA_MODES:
        raise UserError(f"cluster spec {text!r}: intra={intra!r} is not supported; use intra=loopback (ranks of one node talk over the node's own routes)")
    return ClusterSpec(
        kind="emulated",
        nodes=_int(values["nodes"], "nodes", text, 1),
        ranks_per_node=_int(values["ranks_per_node"], "ranks_per_node", text, 1),
        inter_gbps=_float(values["inter_gbps"], "inter_gbps", text, positive=True),
        inter_latency_us=_float(values.get("inter_latency_us", "0"), "inter_latency_us", text, positive=False),
        nics=_int(values.get("nics", "1"), "nics", text, 1),
    )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_world(spec: ClusterSpec, gpus: int) -> None:
    """Raise :class:`UserError` unless ``spec`` holds exactly ``gpus`` ranks (G)."""
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise UserError(f"G must be a whole number >= 1, got {gpus!r}")
    if spec.kind == "local":
        if spec.ranks_per_node is not None and spec.ranks_per_node != gpus:
            raise UserError(f"cluster {spec} runs {spec.ranks_per_node} ranks but G = {gpus}; use ranks_per_node={gpus} or plain 'local'")
        return
    if spec.nodes is None:
        return
    if gpus % spec.nodes != 0:
        choices = ", ".join(str(d) for d in _divisors(gpus))
        raise UserError(f"cluster {spec}: {spec.nodes} nodes do not divide G = {gpus}; use nodes among {choices}")
    if spec.ranks_per_node is not None and spec.nodes * spec.ranks_per_node != gpus:
        raise UserError(
            f"cluster {spec}: nodes x ranks_per_node = {spec.nodes} x {spec.ranks_per_node} = "
            f"{spec.nodes * spec.ranks_per_node} ranks but G = {gpus}; use ranks_per_node={gpus // spec.nodes}"
        )
