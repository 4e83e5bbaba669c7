"""Machine profiles: loading, validation and the collective-communication model.

A machine profile is a JSON file (see ``models/README.md`` for the full schema and
:data:`FIELDS` for a one-line description of every field). Profiles are found by
name in the directories listed in the environment variable ``PLEXUS_TUNE_MODELS``
(``os.pathsep``-separated, searched first) and then in the ``models/`` directory
that ships with the package; any argument that names an existing file, contains a
path separator or ends in ``.json`` is read as a path.

Collectives (DESIGN.md 4.2, ring algorithms, alpha-beta). For a buffer of M bytes
(the full reduced or gathered result) on g ranks with per-step latency alpha and
bus bandwidth beta (nccl-tests convention)::

    all_reduce:                   2 (g - 1) alpha * m + 2 (g - 1) / g * M / beta
    all_gather, reduce_scatter:     (g - 1) alpha * m +   (g - 1) / g * M / beta

where m is the number of messages the buffer is sent in (1 unless the aggregation
is blocked). A group of one rank costs nothing.

Topology (DESIGN.md 4.3): with stride p (product of the faster axes' sizes) and n
GPUs per node, a group is intra-node when p * g <= n (alpha_intra, beta_intra);
otherwise it crosses nodes and the p groups sharing a node share its NICs:
alpha_inter and beta_inter / min(n, p). A measured ``bandwidth_table`` overrides
beta for the (stride, group size) ranges it lists; the first matching entry wins
and unmatched shapes fall back to the tier formula.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from plexus_tune.errors import UserError

GIB = 2**30
GB = 1e9
SCHEMA = "plexus-tune/machine/1"
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter")

#: Every field of a machine profile, with a one-line description.
FIELDS = {
    "schema": "optional; format tag, 'plexus-tune/machine/1'",
    "name": "required; profile name (what --machine takes)",
    "description": "optional; one line about the machine",
    "gpus_per_node": "required; devices per node sharing the intra-node network (integer >= 1)",
    "device_memory_gib": "required; memory of one device in GiB (2**30 bytes), > 0",
    "memory_reserved_gib": "optional; memory per device unavailable to tensors (runtime, allocator), GiB, >= 0, default 0",
    "gemm_tflops": "required; dense fp32 GEMM rate per device in TFLOP/s (1e12 flop/s), > 0",
    "elementwise_gbps": "optional; memory bandwidth for elementwise work (activations, loss, optimizer) in GB/s; "
    "absent: that time is not modelled (0)",
    "epoch_overhead_ms": "optional; fixed time per epoch not explained by the modelled parts (launch, "
    "synchronisation, Python), ms, >= 0, default 0; fitted from trainer runs by 'plexus-tune fit'",
    "spmm": "required; SpMM model: {'kind': 'paper', 'c0', 'c1', 'c2'} is the epoch-level form of DESIGN.md 4.1 "
    "(ms); any other kind is a per-SpMM model evaluated by plexus_tune.model.spmm",
    "collectives": "required; the collective-communication model, an object with the collectives.* fields",
    "collectives.alpha_intra_us": "required; per-step latency inside a node, microseconds, >= 0",
    "collectives.beta_intra_gbps": "required; bus bandwidth inside a node, GB/s (1e9 bytes/s), > 0",
    "collectives.alpha_inter_us": "required; per-step latency across nodes, microseconds, >= 0",
    "collectives.beta_inter_gbps": "required; bus bandwidth per node across nodes, GB/s, shared by min(n, stride) groups, > 0",
    "collectives.bandwidth_table": "optional; measured bus bandwidth by stride and group size: list of "
    "{'stride': [min, max|null], 'group': [min, max|null], 'beta_gbps': > 0, 'ops': [...] (optional)}; "
    "first match wins",
    "host_cores": "optional; CPU cores shared by the ranks of one node when ranks are processes on a CPU "
    "(gloo); null/absent for GPUs. When ranks_per_node x threads_per_rank exceeds it, the ranks time-share "
    "the cores and every modelled time stretches by that ratio (see oversubscription())",
    "threads_per_rank": "optional; CPU threads of each rank (integer >= 1, default 1); used with host_cores",
    "padded_sizes": "optional; true (default): local sizes of communicated and multiplied blocks are ceil(n / g) "
    "as the trainer pads them; false: exact division n / g, as the paper's model computes",
    "provenance": "optional; field name -> where its number came from",
}

_REQUIRED_TOP = ("name", "gpus_per_node", "device_memory_gib", "gemm_tflops", "spmm", "collectives")
_REQUIRED_COLL = ("alpha_intra_us", "beta_intra_gbps", "alpha_inter_us", "beta_inter_gbps")


@dataclass(frozen=True)
class Machine:
    """A validated machine profile. ``raw`` is the JSON object it was built from."""

    name: str
    gpus_per_node: int
    device_memory_bytes: int
    spmm: dict
    collectives: dict
    gemm_tflops: float
    raw: dict = field(repr=False)
    elementwise_gbps: float | None = None
    memory_reserved_bytes: int = 0
    description: str = ""
    path: str | None = None
    padded_sizes: bool = True
    epoch_overhead_ms: float = 0.0
    host_cores: int | None = None
    threads_per_rank: int = 1

    @property
    def usable_memory_bytes(self) -> int:
        """Device memory available to the training tensors."""
        return self.device_memory_bytes - self.memory_reserved_bytes

    @classmethod
    def from_dict(cls, data: Mapping, source: str = "<dict>") -> "Machine":
        """Validate a profile object (as read from JSON) and build a Machine."""
        return _build_machine(data, source)


# ----------------------------------------------------------------------------- loading


def models_dirs() -> list[Path]:
    """Directories searched for profiles by name, in order."""
    dirs = []
    env = os.environ.get("PLEXUS_TUNE_MODELS", "")
    for part in env.split(os.pathsep):
        if part.strip():
            dirs.append(Path(part.strip()).expanduser())
    import plexus_tune

    dirs.append(Path(plexus_tune.__file__).resolve().parents[1] / "models")
    return dirs


def _number(data: Mapping, key: str, where: str, source: str, *, positive: bool = False, nonneg: bool = False):
    if key not in data:
        raise UserError(f"machine profile {source} lacks the field '{where}{key}'; see models/README.md")
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"machine profile {source}: '{where}{key}' must be a number, got {value!r}")
    if positive and value <= 0:
        raise UserError(f"machine profile {source}: '{where}{key}' must be positive, got {value!r}")
    if nonneg and value < 0:
        raise UserError(f"machine profile {source}: '{where}{key}' must not be negative, got {value!r}")
    return value


def _range(value, what: str, source: str) -> tuple[int, float]:
    """A table range: an int, or [min, max] with max null meaning unbounded."""
    if isinstance(value, int) and not isinstance(value, bool):
        low, high = value, value
    elif isinstance(value, list) and len(value) == 2:
        low, high = value
    else:
        raise UserError(f"machine profile {source}: bandwidth_table {what} must be an integer or [min, max], got {value!r}")
    if isinstance(low, bool) or not isinstance(low, int) or low < 1:
        raise UserError(f"machine profile {source}: bandwidth_table {what} minimum must be an integer >= 1, got {low!r}")
    if high is None:
        high = math.inf
    elif isinstance(high, bool) or not isinstance(high, int) or high < low:
        raise UserError(f"machine profile {source}: bandwidth_table {what} maximum must be an integer >= {low} or null, got {high!r}")
    return low, high


def _check_table(table, source: str) -> list[dict]:
    if not isinstance(table, list):
        raise UserError(f"machine profile {source}: collectives.bandwidth_table must be a list of entries")
    entries = []
    for k, entry in enumerate(table):
        if not isinstance(entry, Mapping):
            raise UserError(f"machine profile {source}: bandwidth_table[{k}] must be an object")
        for key in ("stride", "group", "beta_gbps"):
            if key not in entry:
                raise UserError(f"machine profile {source} lacks the field 'collectives.bandwidth_table[{k}].{key}'")
        stride = _range(entry["stride"], f"[{k}].stride", source)
        group = _range(entry["group"], f"[{k}].group", source)
        beta = _number(entry, "beta_gbps", f"collectives.bandwidth_table[{k}].", source, positive=True)
        ops = entry.get("ops", list(COLLECTIVE_OPS))
        if not isinstance(ops, list) or any(op not in COLLECTIVE_OPS for op in ops):
            raise UserError(f"machine profile {source}: bandwidth_table[{k}].ops must list some of {', '.join(COLLECTIVE_OPS)}")
        entries.append({"stride": stride, "group": group, "beta_gbps": float(beta), "ops": tuple(ops)})
    return entries


def _build_machine(data, source: str) -> Machine:
    if not isinstance(data, Mapping):
        raise UserError(f"machine profile {source} must be a JSON object")
    for key in _REQUIRED_TOP:
        if key not in data:
            raise UserError(f"machine profile {source} lacks the field '{key}'; see models/README.md")
    name = data["name"]
    if not isinstance(name, str) or not name.strip():
        raise UserError(f"machine profile {source}: 'name' must be a non-empty string")
    gpn = _number(data, "gpus_per_node", "", source, positive=True)
    if int(gpn) != gpn:
        raise UserError(f"machine profile {source}: 'gpus_per_node' must be an integer, got {gpn!r}")
    mem = _number(data, "device_memory_gib", "", source, positive=True)
    reserved = _number(data, "memory_reserved_gib", "", source, nonneg=True) if "memory_reserved_gib" in data else 0
    if reserved >= mem:
        raise UserError(f"machine profile {source}: 'memory_reserved_gib' must be below 'device_memory_gib'")
    gemm = _number(data, "gemm_tflops", "", source, positive=True)
    elementwise = None
    if data.get("elementwise_gbps") is not None:
        elementwise = float(_number(data, "elementwise_gbps", "", source, positive=True))

    overhead_ms = 0.0
    if data.get("epoch_overhead_ms") is not None:
        overhead_ms = float(_number(data, "epoch_overhead_ms", "", source, nonneg=True))

    spmm = data["spmm"]
    if not isinstance(spmm, Mapping) or not isinstance(spmm.get("kind"), str):
        raise UserError(f"machine profile {source}: 'spmm' must be an object with a string 'kind'")
    if spmm["kind"] == "paper":
        for key in ("c0", "c1", "c2"):
            _number(spmm, key, "spmm.", source)  # signs are free: the paper's c2 is negative
    from plexus_tune.model import spmm as spmm_models

    try:  # checks the entry and maps the kind names of older profiles to today's
        spmm = spmm_models.spmm_model_from_dict(spmm).to_dict()
    except UserError as exc:
        raise UserError(f"machine profile {source}: spmm: {exc}") from None

    coll = data["collectives"]
    if not isinstance(coll, Mapping):
        raise UserError(f"machine profile {source}: 'collectives' must be an object")
    for key in _REQUIRED_COLL:
        if key not in coll:
            raise UserError(f"machine profile {source} lacks the field 'collectives.{key}'; see models/README.md")
    checked = {}
    for key in ("alpha_intra_us", "alpha_inter_us"):
        checked[key] = float(_number(coll, key, "collectives.", source, nonneg=True))
    for key in ("beta_intra_gbps", "beta_inter_gbps"):
        checked[key] = float(_number(coll, key, "collectives.", source, positive=True))
    if coll.get("bandwidth_table") is not None:
        checked["bandwidth_table"] = _check_table(coll["bandwidth_table"], source)
    host_cores = None
    if data.get("host_cores") is not None:
        host_cores = _number(data, "host_cores", "", source, positive=True)
        if int(host_cores) != host_cores:
            raise UserError(f"machine profile {source}: 'host_cores' must be an integer, got {host_cores!r}")
    threads = _number(data, "threads_per_rank", "", source, positive=True) if data.get("threads_per_rank") is not None else 1
    if int(threads) != threads:
        raise UserError(f"machine profile {source}: 'threads_per_rank' must be an integer, got {threads!r}")
    padded = data.get("padded_sizes", True)
    if not isinstance(padded, bool):
        raise UserError(f"machine profile {source}: 'padded_sizes' must be true or false, got {padded!r}")
    return Machine(
        padded_sizes=padded,
        epoch_overhead_ms=overhead_ms,
        host_cores=None if host_cores is None else int(host_cores),
        threads_per_rank=int(threads),
        name=name.strip(),
        gpus_per_node=int(gpn),
        device_memory_bytes=int(round(float(mem) * GIB)),
        spmm=dict(spmm),
        collectives=checked,
        gemm_tflops=float(gemm),
        raw=dict(data),
        elementwise_gbps=elementwise,
        memory_reserved_bytes=int(round(float(reserved) * GIB)),
        description=str(data.get("description", "")),
        path=None if source.startswith("<") else source,
    )


def read_machine_file(path) -> Machine:
    """Load and validate one profile file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"machine profile {path} does not exist") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read machine profile {path}: {exc.__class__.__name__}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"machine profile {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    return _build_machine(data, str(path))


def _looks_like_path(text: str) -> bool:
    return text.endswith(".json") or os.sep in text or (os.altsep is not None and os.altsep in text) or Path(text).is_file()


def load_machine(name_or_path) -> Machine:
    """A profile by name (searched in :func:`models_dirs`) or by path; a Machine passes through."""
    if isinstance(name_or_path, Machine):
        return name_or_path
    if isinstance(name_or_path, Mapping):
        return Machine.from_dict(name_or_path)
    text = str(name_or_path).strip()
    if not text:
        raise UserError("no machine given; name one of the profiles listed by 'plexus-tune machines' or give a JSON path")
    if _looks_like_path(text):
        return read_machine_file(text)
    for directory in models_dirs():
        candidate = directory / f"{text}.json"
        if candidate.is_file():
            return read_machine_file(candidate)
    lowered = text.lower()
    for directory in models_dirs():
        if directory.is_dir():
            for candidate in sorted(directory.glob("*.json")):
                if candidate.stem.lower() == lowered:
                    return read_machine_file(candidate)
    known = ", ".join(entry["name"] for entry in list_machines()) or "none found"
    raise UserError(f"unknown machine {text!r}; known machines: {known} (or give the path of a profile JSON file)")


def list_machines() -> list[dict]:
    """Every profile found by name: dicts with name, path, description and problem (None if valid)."""
    seen = set()
    out = []
    for directory in models_dirs():
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.json")):
            if path.stem in seen:
                continue
            seen.add(path.stem)
            try:
                machine = read_machine_file(path)
                out.append({"name": path.stem, "path": str(path), "description": machine.description,
                            "machine": machine, "problem": None})
            except UserError as exc:
                out.append({"name": path.stem, "path": str(path), "description": "", "machine": None,
                            "problem": str(exc)})
    return out


# ----------------------------------------------------------------------------- collectives


def is_intra_node(machine: Machine, group_size, stride) -> np.ndarray:
    """True where a group of ``group_size`` ranks at ``stride`` stays inside one node (p * g <= n)."""
    g = np.asarray(group_size, dtype=np.int64)
    p = np.asarray(stride, dtype=np.int64)
    return p * g <= machine.gpus_per_node


def time_sharing_factor(ranks, threads_per_rank, cores) -> np.ndarray:
    """Stretch of wall time when ``ranks`` processes of ``threads_per_rank`` threads share ``cores``.

        factor = max(1, ranks * threads_per_rank / cores)

    Every rank does its part of each phase at the same time, so CPU-bound work that
    takes t alone takes t * factor when the cores are oversubscribed (vectorized).
    """
    r, t, c = np.broadcast_arrays(np.asarray(ranks, dtype=np.float64), np.asarray(threads_per_rank, dtype=np.float64),
                                  np.asarray(cores, dtype=np.float64))
    return np.maximum(1.0, r * t / c)


def oversubscription(machine: Machine, gpus) -> np.ndarray:
    """The machine's :func:`time_sharing_factor` for runs of ``gpus`` ranks (1 without ``host_cores``).

    Ranks per node = min(G, gpus_per_node).
    """
    g = np.asarray(gpus, dtype=np.int64)
    if machine.host_cores is None:
        return np.ones(g.shape, dtype=np.float64)
    return time_sharing_factor(np.minimum(g, machine.gpus_per_node), machine.threads_per_rank, machine.host_cores)


def effective_beta_gbps(machine: Machine, op: str, group_size, stride) -> np.ndarray:
    """Bus bandwidth (GB/s) of a group: the tier formula of DESIGN.md 4.3, or the measured table."""
    g, p = np.broadcast_arrays(np.asarray(group_size, dtype=np.int64), np.asarray(stride, dtype=np.int64))
    coll = machine.collectives
    n = machine.gpus_per_node
    intra = p * g <= n
    beta = np.where(intra, coll["beta_intra_gbps"], coll["beta_inter_gbps"] / np.minimum(n, p)).astype(np.float64)
    table = coll.get("bandwidth_table")
    if table:
        done = np.zeros(g.shape, dtype=bool)
        for entry in table:
            if op not in entry["ops"]:
                continue
            (p_lo, p_hi), (g_lo, g_hi) = entry["stride"], entry["group"]
            hit = ~done & (p >= p_lo) & (p <= p_hi) & (g >= g_lo) & (g <= g_hi)
            beta = np.where(hit, entry["beta_gbps"], beta)
            done |= hit
    return beta


def collective_time_ms(machine: Machine, op: str, group_size, stride, message_bytes, messages=1) -> np.ndarray:
    """Time (ms) of one collective ``op`` on ``group_size`` ranks at ``stride`` (vectorized).

    ``message_bytes`` is the full buffer (reduced or gathered result). ``messages``
    splits it into that many sends: latency is paid per message, bandwidth once::

        all_reduce:      2 (g-1) alpha m + 2 (g-1)/g M / beta
        all_gather,
        reduce_scatter:    (g-1) alpha m +   (g-1)/g M / beta
    """
    if op not in COLLECTIVE_OPS:
        raise UserError(f"unknown collective {op!r}; known: {', '.join(COLLECTIVE_OPS)}")
    g, p, m_bytes, msgs = np.broadcast_arrays(
        np.asarray(group_size, dtype=np.int64),
        np.asarray(stride, dtype=np.int64),
        np.asarray(message_bytes, dtype=np.float64),
        np.asarray(messages, dtype=np.float64),
    )
    coll = machine.collectives
    intra = p * g <= machine.gpus_per_node
    alpha_us = np.where(intra, coll["alpha_intra_us"], coll["alpha_inter_us"])
    beta = effective_beta_gbps(machine, op, g, p)
    steps = 2.0 * (g - 1) if op == "all_reduce" else (g - 1).astype(np.float64)
    factor = steps / g
    time_ms = steps * alpha_us * msgs * 1e-3 + factor * m_bytes / (beta * GB) * 1e3
    return np.where(g > 1, time_ms, 0.0)
