"""Machine profiles: loading, validation, and the machine's collective-communication model.

A machine profile is a JSON file (see ``docs/profiles.md`` for the full schema and
:data:`FIELDS` for a one-line description of every field). Profiles are found by
name in the directories listed in the environment variable ``PLEXUS_TUNE_MODELS``
(``os.pathsep``-separated, searched first) and then in the ``models/`` directory
that ships with the package; any argument that names an existing file, contains a
path separator or ends in ``.json`` is read as a path.

Collectives: the profile's ``collectives`` object builds a
:class:`plexus_tune.model.collectives.Network` (``Machine.network``); its forms, the ring
formulas and the placement of groups on nodes are documented there and in docs/model.md.
The default form is the two-tier model: with stride p and n GPUs per node a group is
intra-node when p g <= n (alpha_intra, beta_intra), otherwise it uses alpha_inter and
beta_inter / min(n, p), and a measured ``bandwidth_table`` overrides beta where it matches.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.paths import check_input_file
from plexus_tune.model import spmm as spmm_models
from plexus_tune.model.comm_precision import (PRECISION_BITS, call_overhead_ms, estimated_quant_entry, parse_precision,
                                             wire_message_bytes)
from plexus_tune.model.other import OPTIMIZER_ACCESSES, trainer_optimizer
from plexus_tune.model.collectives import COLLECTIVE_OPS, Network, check_collectives, profile_number  # noqa: F401

GIB = 2**30
GB = 1e9
SCHEMA = "plexus-tune/machine/1"

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
    "optimizer_gbps": "optional; bandwidth of the optimizer step in GB/s (its array accesses over its time, "
    "docs/model.md, Other), > 0; absent: elementwise_gbps",
    "sync_us": "optional; time of one device synchronisation of the trainer's epoch in microseconds, >= 0, default 0",
    "optimizer": "optional; the optimizer the trainer runs on this machine (adamw-fused, adamw-foreach, "
    "adamw-for-loop); absent: the trainer's choice, adamw-fused",
    "memory_bandwidth_gbps": "optional; device memory bandwidth in GB/s, > 0: the SpMM time of an epoch is floored "
    "at the bytes its SpMMs must move at this rate (docs/model.md, SpMM floor); absent: no floor",
    "epoch_overhead_ms": "optional; fixed time per epoch not explained by the modelled parts (launch, "
    "synchronisation, Python), ms, >= 0, default 0; fitted from trainer runs by 'plexus-tune fit'",
    "spmm": "required; SpMM model: {'kind': 'paper', 'c0', 'c1', 'c2'} is the paper's per-layer form of docs/model.md, SpMM "
    "(ms); any other kind is a per-SpMM model evaluated by plexus_tune.model.spmm",
    "collectives": "required; the collective-communication model, an object with the collectives.* fields",
    "collectives.form": "optional; 'two-tier' (default: intra or inter ring), 'per-span' (measured alpha and beta "
    "per op, group size and nodes spanned) or 'hierarchical' (intra-node stages around an inter-node stage)",
    "collectives.sharing": "optional; true (default): the min(n, stride) groups on a node share its inter-node "
    "bandwidth; false: each group has all of it",
    "collectives.alpha_intra_us": "required; per-step latency inside a node, microseconds, >= 0",
    "collectives.beta_intra_gbps": "required; bus bandwidth inside a node, GB/s (1e9 bytes/s), > 0",
    "collectives.alpha_inter_us": "required; per-step latency across nodes, microseconds, >= 0",
    "collectives.beta_inter_gbps": "required; bus bandwidth per node across nodes, GB/s, shared by min(n, stride) groups, > 0",
    "collectives.bandwidth_table": "optional (forms two-tier, per-span); measured bus bandwidth by stride and group size: list of "
    "{'stride': [min, max|null], 'group': [min, max|null], 'beta_gbps': > 0, 'ops': [...] (optional)}; "
    "first match wins",
    "collectives.per_span": "required by form per-span; list of {'op', 'group', 'nodes' (nodes spanned), 'stride' "
    "(optional), 'alpha_us' >= 0, 'beta_gbps' > 0}: steps alpha + factor M / beta (beta / min(n, stride) across "
    "nodes with sharing); first match wins, shapes no entry covers use the two-tier formula",
    "collectives.op_tiers": "optional; {'broadcast'|'point_to_point': {'alpha_intra_us', 'beta_intra_gbps', "
    "'alpha_inter_us', 'beta_inter_gbps'}}: the tier parameters of the families' broadcasts and point-to-point "
    "exchanges (docs/model.md, Point-to-point and broadcast time); absent: the collectives' tiers",
    "collectives.reduce_scatter_form": "optional; 'ring' (default) or 'all_reduce': a reduce-scatter of M takes the "
    "time of an all-reduce of M (a backend that all-reduces and keeps its block, as gloo)",
    "collectives.note": "optional; free text about how the collectives were fitted",
    "host_cores": "optional; CPU cores shared by the ranks of one node when ranks are processes on a CPU "
    "(gloo); null/absent for GPUs. When ranks_per_node x threads_per_rank exceeds it, the ranks time-share "
    "the cores and every modelled time stretches by that ratio (see oversubscription())",
    "threads_per_rank": "optional; CPU threads of each rank (integer >= 1, default 1); used with host_cores",
    "padded_sizes": "optional; true (default): local sizes of communicated and multiplied blocks are ceil(n / g) "
    "as the trainer pads them; false: exact division n / g, as the paper's model computes",
    "sampling": "optional; ScaleGNN's sampling kernel, {'call_ms': >= 0 (per layer layout cut), 'gbps': > 0 "
    "(bytes of model.scalegnn.sampling_work per second)}, fitted from 'calibrate sampling' records; absent: "
    "those bytes at elementwise_gbps",
    "provenance": "optional; field name -> where its number came from",
}

_REQUIRED_TOP = ("name", "gpus_per_node", "device_memory_gib", "gemm_tflops", "spmm", "collectives")


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
    optimizer_gbps: float | None = None
    sync_us: float = 0.0
    optimizer: str = "adamw-fused"
    memory_bandwidth_gbps: float | None = None
    memory_reserved_bytes: int = 0
    description: str = ""
    path: str | None = None
    padded_sizes: bool = True
    epoch_overhead_ms: float = 0.0
    host_cores: int | None = None
    threads_per_rank: int = 1
    network: Network | None = field(default=None, repr=False, compare=False)
    #: codec rates per reduced precision: the profile's ``quant`` entry, with an estimate
    #: (:func:`plexus_tune.model.comm_precision.estimated_quant_entry`) for every
    #: precision it has no rates for
    quant: dict = field(default_factory=dict, repr=False, compare=False)
    #: the precisions whose codec rates are estimated, not measured
    quant_estimated: tuple[str, ...] = ()
    #: ScaleGNN's sampling kernel: {"call_ms", "gbps"} (None: not calibrated)
    sampling: dict | None = field(default=None, repr=False, compare=False)

    @property
    def codec_estimate_gbps(self) -> float | None:
        """The rate the codec of a precision without measured rates runs at (:func:`codec_estimate_gbps`)."""
        return codec_estimate_gbps(self.elementwise_gbps, self.memory_bandwidth_gbps)

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
    """Directories searched for profiles by name, in order: those of ``$PLEXUS_TUNE_MODELS``
    (``os.pathsep``-separated), then the shipped profiles (docs/profiles.md).

    The shipped profiles are the package ``plexus_tune.profiles`` (the repository's
    ``models/`` directory, installed under that name); a source checkout used without
    installing has no such package and reads ``models/`` beside ``plexus_tune/``.
    """
    import importlib.resources

    dirs = []
    env = os.environ.get("PLEXUS_TUNE_MODELS", "")
    for part in env.split(os.pathsep):
        if part.strip():
            dirs.append(Path(part.strip()).expanduser())
    try:
        shipped = Path(str(importlib.resources.files("plexus_tune.profiles")))
    except ModuleNotFoundError:
        shipped = Path(__file__).resolve().parents[2] / "models"
    dirs.append(shipped)
    return dirs


#: shapes an SpMM model must predict finite times for: 1 to 1e12 nonzeros, 1 to 1e9 rows, 1 to 1e5 columns
_PROBE_SHAPES = tuple(np.array(v, dtype=np.float64) for v in np.broadcast_arrays(
    *np.meshgrid([1e3, 1e6, 1e9, 1e12], [1.0, 1e4, 1e9], [1.0, 1e4, 1e9], [1.0, 128.0, 1e5], indexing="ij")))


def _check_spmm_range(model, source: str) -> None:
    """UserError if the profile's SpMM model gives a time that is not a finite number for a shape
    within :data:`_PROBE_SHAPES` (coefficients that overflow)."""
    nnz, rows, common, cols = (a.ravel() for a in _PROBE_SHAPES)
    with np.errstate(all="ignore"):
        try:
            ms = np.asarray(spmm_models.predict_spmm_ms(model, nnz, rows, common, cols), dtype=np.float64)
        except (OverflowError, FloatingPointError, ValueError):
            ms = np.array([np.inf])
    if not np.all(np.isfinite(ms)):
        i = int(np.flatnonzero(~np.isfinite(ms))[0]) if ms.size == nnz.size else 0
        raise UserError(f"machine profile {source}: spmm: the {model.name} model gives {float(ms.flat[i])} ms for "
                        f"{nnz[i]:.0e} nonzeros, {rows[i]:.0e} x {common[i]:.0e} rows and {cols[i]:.0e} columns "
                        "(coefficients that overflow); refit it with 'plexus-tune fit'")


def _build_machine(data, source: str) -> Machine:
    if not isinstance(data, Mapping):
        raise UserError(f"machine profile {source} must be a JSON object")
    for key in _REQUIRED_TOP:
        if key not in data:
            raise UserError(f"machine profile {source} lacks the field '{key}'; see docs/profiles.md")
    name = data["name"]
    if not isinstance(name, str) or not name.strip():
        raise UserError(f"machine profile {source}: 'name' must be a non-empty string")
    gpn = profile_number(data, "gpus_per_node", "", source, positive=True)
    if int(gpn) != gpn:
        raise UserError(f"machine profile {source}: 'gpus_per_node' must be an integer, got {gpn!r}")
    mem = profile_number(data, "device_memory_gib", "", source, positive=True)
    reserved = profile_number(data, "memory_reserved_gib", "", source, nonneg=True) if "memory_reserved_gib" in data else 0
    if reserved >= mem:
        raise UserError(f"machine profile {source}: 'memory_reserved_gib' must be below 'device_memory_gib'")
    gemm = profile_number(data, "gemm_tflops", "", source, positive=True)
    elementwise = None
    if data.get("elementwise_gbps") is not None:
        elementwise = float(profile_number(data, "elementwise_gbps", "", source, positive=True))

    optimizer_gbps = None
    if data.get("optimizer_gbps") is not None:
        optimizer_gbps = float(profile_number(data, "optimizer_gbps", "", source, positive=True))
    sync_us = 0.0
    if data.get("sync_us") is not None:
        sync_us = float(profile_number(data, "sync_us", "", source, nonneg=True))

    bandwidth = None
    if data.get("memory_bandwidth_gbps") is not None:
        bandwidth = float(profile_number(data, "memory_bandwidth_gbps", "", source, positive=True))

    overhead_ms = 0.0
    if data.get("epoch_overhead_ms") is not None:
        overhead_ms = float(profile_number(data, "epoch_overhead_ms", "", source, nonneg=True))

    spmm = data["spmm"]
    if not isinstance(spmm, Mapping) or not isinstance(spmm.get("kind"), str):
        raise UserError(f"machine profile {source}: 'spmm' must be an object with a string 'kind'")
    if spmm["kind"] == "paper":
        for key in ("c0", "c1", "c2"):
            profile_number(spmm, key, "spmm.", source)  # signs are free: the paper's c2 is negative

    try:  # checks the entry and maps the kind names of older profiles to today's
        model = spmm_models.spmm_model_from_dict(spmm)
        spmm = model.to_dict()
    except UserError as exc:
        raise UserError(f"machine profile {source}: spmm: {exc}") from None
    _check_spmm_range(model, source)

    checked = check_collectives(data["collectives"], source)
    host_cores = None
    if data.get("host_cores") is not None:
        host_cores = profile_number(data, "host_cores", "", source, positive=True)
        if int(host_cores) != host_cores:
            raise UserError(f"machine profile {source}: 'host_cores' must be an integer, got {host_cores!r}")
    threads = profile_number(data, "threads_per_rank", "", source, positive=True) if data.get("threads_per_rank") is not None else 1
    if int(threads) != threads:
        raise UserError(f"machine profile {source}: 'threads_per_rank' must be an integer, got {threads!r}")
    optimizer = data.get("optimizer")
    if optimizer is None:
        optimizer = trainer_optimizer("cpu" if host_cores is not None else "cuda")
    elif not isinstance(optimizer, str) or optimizer not in OPTIMIZER_ACCESSES:
        raise UserError(f"machine profile {source}: 'optimizer' must be one of {', '.join(OPTIMIZER_ACCESSES)}, "
                        f"got {optimizer!r}")
    sampling = None
    if data.get("sampling") is not None:
        entry = data["sampling"]
        if not isinstance(entry, Mapping):
            raise UserError(f"machine profile {source}: 'sampling' must be an object with 'call_ms' and 'gbps'")
        sampling = {"call_ms": float(profile_number(entry, "call_ms", "sampling.", source, nonneg=True)),
                    "gbps": float(profile_number(entry, "gbps", "sampling.", source, positive=True))}
    padded = data.get("padded_sizes", True)
    if not isinstance(padded, bool):
        raise UserError(f"machine profile {source}: 'padded_sizes' must be true or false, got {padded!r}")
    return Machine(
        sampling=sampling,
        padded_sizes=padded,
        epoch_overhead_ms=overhead_ms,
        host_cores=None if host_cores is None else int(host_cores),
        threads_per_rank=int(threads),
        name=name.strip(),
        gpus_per_node=int(gpn),
        device_memory_bytes=int(round(float(mem) * GIB)),
        spmm=dict(spmm),
        collectives=checked,
        network=Network.from_checked(checked, int(gpn)),
        gemm_tflops=float(gemm),
        raw=dict(data),
        elementwise_gbps=elementwise,
        optimizer_gbps=optimizer_gbps,
        sync_us=sync_us,
        optimizer=optimizer,
        memory_bandwidth_gbps=bandwidth,
        memory_reserved_bytes=int(round(float(reserved) * GIB)),
        description=str(data.get("description", "")),
        path=None if source.startswith("<") else source,
        **_quant_fields(data.get("quant"), codec_estimate_gbps(elementwise, bandwidth)),
    )


def codec_estimate_gbps(elementwise_gbps, memory_bandwidth_gbps):
    """The rate (GB/s) a codec without measured rates is estimated at: the trainer's elementwise
    rate, else the memory bandwidth; None without either (docs/comm-precision.md, Estimated codec)."""
    return elementwise_gbps or memory_bandwidth_gbps or None


def _quant_fields(measured, bandwidth_gbps) -> dict:
    """The Machine's ``quant`` (measured entries, then estimates at ``bandwidth_gbps`` for the
    other reduced precisions: the profile's elementwise rate, else its memory bandwidth) and
    ``quant_estimated``; no estimate without a bandwidth."""
    quant = {k: v for k, v in dict(measured or {}).items()}
    estimated = []
    if bandwidth_gbps:
        for precision in PRECISION_BITS:
            if precision != "fp32" and precision not in quant:
                quant[precision] = estimated_quant_entry(precision, bandwidth_gbps)
                estimated.append(precision)
    return {"quant": quant, "quant_estimated": tuple(estimated)}


#: the largest profile file read (a profile with a bandwidth table is well under 1 MiB)
PROFILE_MAX_BYTES = 64 << 20


def read_machine_file(path) -> Machine:
    """Load and validate one profile file."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        check_input_file(path, "machine profile", max_bytes=PROFILE_MAX_BYTES)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"machine profile {path} does not exist") from None
    except IsADirectoryError:
        found = sorted(path.glob("*.json"))
        example = f" such as {found[0]}" if found else ""
        raise UserError(f"machine profile {path} is a directory; give a profile JSON file{example}, or a profile "
                        f"name with the directory listed in PLEXUS_TUNE_MODELS") from None
    except (PermissionError, UnicodeDecodeError) as exc:
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


def _network(machine: Machine) -> Network:
    return machine.network or Network.from_checked(machine.collectives, machine.gpus_per_node)


def effective_beta_gbps(machine: Machine, op: str, group_size, stride) -> np.ndarray:
    """Bus bandwidth (GB/s) a group of ``group_size`` ranks at ``stride`` sees on the machine's network
    (two-tier: beta_intra, beta_inter / min(n, p), or the measured table's entry)."""
    return _network(machine).effective_beta_gbps(op, group_size, stride)


def collective_time_ms(machine: Machine, op: str, group_size, stride, message_bytes, messages=1) -> np.ndarray:
    """Time (ms) of one collective ``op`` on ``group_size`` ranks at ``stride`` (vectorized), by the
    machine's :class:`~plexus_tune.model.collectives.Network`.

    ``message_bytes`` is the full buffer (reduced or gathered result). ``messages``
    splits it into that many sends: latency is paid per message, bandwidth once; for the
    two-tier form::

        all_reduce:      2 (g-1) alpha m + 2 (g-1)/g M / beta
        all_gather,
        reduce_scatter:    (g-1) alpha m +   (g-1)/g M / beta
    """
    return _network(machine).time_ms(op, group_size, stride, message_bytes, messages)


def precision_collective_time_ms(machine: Machine, op: str, group_size, stride, message_bytes, rows, precision: str,
                                 element_bytes: float = 4.0, messages=1) -> np.ndarray:
    """Communication time (ms) of one collective ``op`` sent at ``precision``, in the scheme the trainer
    runs (docs/comm-precision.md, "In the cost model"), as the trainer's timers count it: the
    network time below plus, at a reduced precision, the scheme's per-call time
    (:func:`~plexus_tune.model.comm_precision.call_overhead_ms`; the codec is ``quant_ms``).
    M' = :func:`wire_message_bytes` (M, rows)::

        fp32                 op on M                      (:func:`collective_time_ms`)
        all_gather           all-gather of M'
        reduced reduce-scatter  all-to-all of M'          (the ``point_to_point`` op)
        reduced all-reduce   all-to-all of M', then all-gather of M'

    The all-to-all is timed as the exchange it is (every rank sends M'/g to each other
    rank, the crossing ranks of a node sharing its link), not as a ring: across nodes it
    moves more bytes over the node link than the ring of the same wire volume. Vectorized.
    """
    wire = precision_wire_time_ms(machine, op, group_size, stride, message_bytes, rows, precision, element_bytes, messages)
    if parse_precision(precision) == "fp32":
        return wire
    return wire + call_overhead_ms(machine.quant, precision, op, group_size, messages,
                                   is_intra_node(machine, group_size, stride))


def precision_wire_time_ms(machine: Machine, op: str, group_size, stride, message_bytes, rows, precision: str,
                           element_bytes: float = 4.0, messages=1) -> np.ndarray:
    """The bytes' part of :func:`precision_collective_time_ms`: its schemes on the network,
    without the per-call time of the reduced-precision scheme (vectorized)."""
    precision = parse_precision(precision)
    if precision == "fp32":
        return collective_time_ms(machine, op, group_size, stride, message_bytes, messages)
    wire = wire_message_bytes(message_bytes, rows, precision, element_bytes)
    if op == "all_gather":
        return collective_time_ms(machine, op, group_size, stride, wire, messages)
    t = collective_time_ms(machine, "point_to_point", group_size, stride, wire, messages)
    if op == "all_reduce":
        t = t + collective_time_ms(machine, "all_gather", group_size, stride, wire, messages)
    elif op != "reduce_scatter":
        raise UserError(f"unknown collective {op!r} at {precision}; expected all_reduce, all_gather or reduce_scatter")
    return t
