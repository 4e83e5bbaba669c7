"""Measurement records: one schema per record type, their versions, run identity, the runs table.

Four record types are logged (JSON Lines, :mod:`plexus_tune.measure.store`), each named
by its ``schema`` field ``plexus-tune/<type>-v<version>``: ``run`` (a trainer run, one
trial), ``spmm`` and ``gemm`` (a timed kernel), ``collective`` (a timed collective).
Each has a dataclass here (:class:`RunRecord`, :class:`SpmmRecord`,
:class:`GemmRecord`, :class:`CollectiveRecord`) whose fields, with units, are the
schema; docs/records.md lists them. On disk a record is a plain JSON object: a field
that is absent holds its default.

Versions: v2 renamed ``nodes``, which meant two things: in run, spmm and gemm records
it is the graph's vertex count, now ``graph_nodes``; in collective records it is the
machine nodes a group spans, now ``nodes_spanned``. :func:`upgrade` maps an older
record to the current version (and fills the defaults of fields added since), so v1
logs load everywhere.

The identity of a run and its prediction are :mod:`plexus_tune.measure.identity`'s, the
runs table :mod:`plexus_tune.measure.table`'s (their names import from here too).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from plexus_tune.errors import UserError
from plexus_tune.model.family import DEFAULT_FAMILY

SCHEMA_PREFIX = "plexus-tune/"
#: record type -> current version
SCHEMA_VERSIONS = {"run": 2, "spmm": 2, "gemm": 2, "collective": 2, "quant": 1, "bandwidth": 1, "sampling": 1}
FAILURE_STATUSES = ("failed", "oom", "timeout", "cancelled")
_SCHEMA_RE = re.compile(r"^plexus-tune/([a-z_]+)-v(\d+)$")


def schema_name(kind: str, version: int | None = None) -> str:
    """``plexus-tune/<kind>-v<version>`` (default: the current version of ``kind``)."""
    return f"{SCHEMA_PREFIX}{kind}-v{SCHEMA_VERSIONS[kind] if version is None else int(version)}"


RUN_SCHEMA = schema_name("run")
SPMM_SCHEMA = schema_name("spmm")
GEMM_SCHEMA = schema_name("gemm")
COLLECTIVE_SCHEMA = schema_name("collective")
QUANT_SCHEMA = schema_name("quant")
BANDWIDTH_SCHEMA = schema_name("bandwidth")

#: (type, version) -> {old field: new field}: the renames from that version to the next.
RENAMES: dict[tuple[str, int], dict[str, str]] = {
    ("run", 1): {"nodes": "graph_nodes", "padded_nodes": "padded_graph_nodes"},
    ("spmm", 1): {"nodes": "graph_nodes"},
    ("gemm", 1): {"nodes": "graph_nodes"},
    ("collective", 1): {"nodes": "nodes_spanned"},
}

#: Where and how a measurement ran (run and collective records); the defaults are
#: what every record written before these fields existed means.
CONTEXT_DEFAULTS = {"launcher": "local", "cluster": None, "rank_nodes": None, "hosts": None, "comm_precision": "fp32"}
#: What a run record written before the algorithm families existed ran.
RUN_DEFAULTS = {"algorithm": DEFAULT_FAMILY}
#: Bytes of one element of each trainer dtype.
DTYPE_BYTES = {"float32": 4, "float64": 8, "bfloat16": 2, "float16": 2}


def parse_schema(schema) -> tuple[str, int] | None:
    """(type, version) of a schema name, or None if it is not of our form."""
    match = _SCHEMA_RE.match(schema) if isinstance(schema, str) else None
    return (match.group(1), int(match.group(2))) if match else None


def check_schema(schema, *, where: str) -> tuple[str, int]:
    """(type, version) of a schema this reader understands; UserError naming ``where`` otherwise."""
    parsed = parse_schema(schema)
    if parsed is None:
        raise UserError(f"{where}: schema {schema!r} is not of the form 'plexus-tune/<type>-v<N>'")
    kind, version = parsed
    if kind not in SCHEMA_VERSIONS:
        raise UserError(f"{where}: unknown record type {kind!r} (known: {', '.join(sorted(SCHEMA_VERSIONS))})")
    if version > SCHEMA_VERSIONS[kind]:
        raise UserError(f"{where}: schema {schema} is newer than this plexus-tune understands (v{SCHEMA_VERSIONS[kind]})")
    return kind, version


def record_type(record: Mapping) -> str | None:
    """``"run"`` for ``plexus-tune/run-v2`` and so on (None if the schema is not ours)."""
    schema = record.get("schema", "")
    parsed = parse_schema(schema)
    if parsed is None:
        return schema if schema in SCHEMA_VERSIONS else None
    return parsed[0]


def check_current_fields(record: Mapping, *, where: str) -> None:
    """UserError if a record of a current schema uses a field name that an older version had."""
    parsed = parse_schema(record.get("schema"))
    if parsed is None or parsed[1] != SCHEMA_VERSIONS.get(parsed[0]):
        return
    kind, version = parsed
    for (k, v), renames in RENAMES.items():
        if k != kind:
            continue
        for old, new in renames.items():
            if old in record and new not in record:
                raise UserError(f"{where}: {kind} records name {old!r} {new!r} since v{v + 1} (docs/records.md); "
                                f"write {new!r}, or give the record the schema {schema_name(kind, v)}")


#: Former names of a search trial's attributes (studies written before the predicted
#: total and the observed epoch had one name each: ``total_ms``, ``epoch_ms``).
TRIAL_RENAMES = {"predicted_ms": "total_ms", "observed_ms": "epoch_ms"}


def upgrade_trial_attrs(attrs: Mapping) -> dict:
    """A search trial's attributes with former names (:data:`TRIAL_RENAMES`) renamed."""
    return {TRIAL_RENAMES.get(k, k): v for k, v in attrs.items() if TRIAL_RENAMES.get(k) not in attrs}


def upgrade(record: Mapping, kind: str | None = None) -> dict:
    """A copy of ``record`` at the current version of its type (docs/records.md, "Versions").

    Fields renamed since its version get their new names (in place, order kept) and
    the context fields added since get their defaults. A record without a ``schema``
    is taken to be of type ``kind`` at version 1 (renames apply only where the new name
    is absent); without either it is returned as a plain copy.
    """
    parsed = parse_schema(record.get("schema"))
    if parsed is not None:
        kind, version = check_schema(record["schema"], where="record")
    elif kind is None:
        return dict(record)
    else:
        version = 1
    out = dict(record)
    for v in range(version, SCHEMA_VERSIONS[kind]):
        renames = RENAMES.get((kind, v), {})
        if any(old in out and new not in out for old, new in renames.items()):
            out = {(renames[k] if k in renames and renames[k] not in out else k): val for k, val in out.items()}
        if (kind, v) == ("run", 1):
            out = _run_machine_v1(out)
    if kind in ("run", "collective"):
        for key, default in CONTEXT_DEFAULTS.items():
            out.setdefault(key, default)
    if kind == "run":
        for key, default in RUN_DEFAULTS.items():
            out.setdefault(key, default)
    out["schema"] = schema_name(kind)
    return out


def _run_machine_v1(record: dict) -> dict:
    """v1 ``measure`` and ``run`` logged the prediction profile's name as ``machine``; v2 logs where it ran.

    Such a record (its ``machine`` equals ``predicted.machine``) gets the host name of
    its ``environment`` as ``machine`` (kept when the environment does not say).
    """
    predicted = record.get("predicted")
    host = (record.get("environment") or {}).get("host") if isinstance(record.get("environment"), Mapping) else None
    if isinstance(predicted, Mapping) and host and record.get("machine") is not None and predicted.get("machine") == record["machine"]:
        return {**record, "machine": host}
    return record


# --------------------------------------------------------------------------- schemas


def _f(default: Any = None, unit: str = "", doc: str = "", factory=None):
    """A schema field: default (or factory), unit and one-line meaning (docs/records.md)."""
    meta = {"unit": unit, "doc": doc}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(kw_only=True)
class _Record:
    """Common behaviour: ``to_dict`` for the log, ``from_dict`` from any version."""

    KIND: ClassVar[str] = ""
    extra: dict = _f(factory=dict, doc="fields outside the schema, kept as written")

    @classmethod
    def schema(cls) -> str:
        return schema_name(cls.KIND)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if f.name != "extra")

    @classmethod
    def from_dict(cls, record: Mapping):
        """The typed record of a logged one (any version; unknown fields go to ``extra``)."""
        data = upgrade(record, kind=cls.KIND)
        names = set(cls.field_names())
        known = {k: v for k, v in data.items() if k in names}
        extra = {k: v for k, v in data.items() if k not in names and k != "schema"}
        return cls(**known, extra=extra)

    def to_dict(self) -> dict:
        """The record as logged: ``schema`` first, then every field that is not None, then ``extra``."""
        out = {"schema": self.schema()}
        for name in self.field_names():
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        clash = sorted(set(self.extra) & set(out))
        if clash:
            raise ValueError(f"extra fields {clash} shadow schema fields of a {self.KIND} record")
        out.update(self.extra)
        return out


@dataclass(kw_only=True)
class RunOptions:
    """``options`` of a run record: how the trainer ran (docs/records.md)."""

    permute: str = _f("double", doc="vertex permutation: double, single or none")
    block_rows: int | None = _f(None, "rows", "rows per SpMM block of blocked aggregation (None: one block)")
    overlap: bool = _f(False, doc="all-reduce of a row block overlapped with the next block's SpMM")
    dtype: str = _f("float32", doc="element type of features, weights and activations")
    lr: float = _f(0.01, doc="AdamW learning rate")
    weight_decay: float = _f(0.01, doc="AdamW weight decay")
    seed: int = _f(0, doc="seed of weights, permutation and synthetic graphs")
    threads_per_rank: int | None = _f(None, "threads", "torch threads per rank (None: the launcher's default)")
    layer_norm: bool = _f(False, doc="LayerNorm (no scale and shift) before each layer")
    fixed_features: bool = _f(False, doc="input features fixed, not trained (no layer-0 feature gradient)")
    replication: int | None = _f(None, "ranks", "cagnet-1.5d: replication factor c of the block rows (None: other families)")
    aggregation: str | None = _f(None, doc="supergcn: pre, post or hybrid aggregation of the cut edges (None: other families)")
    dp: int = _f(1, "groups", "scalegnn-4d: data-parallel groups, each on the grid (1: other families)")
    batch_size: int | None = _f(None, "vertices", "scalegnn-4d: vertices sampled per step and group (None: full graph)")
    prefetch: bool | None = _f(None, doc="scalegnn-4d: sampling of step t + 1 on a background thread during step t (None: other families)")


OPTION_DEFAULTS = {f.name: f.default for f in fields(RunOptions)}


@dataclass(kw_only=True)
class RunRecord(_Record):
    """One trainer run (one trial): what ran, where, and its timings or its failure."""

    KIND: ClassVar[str] = "run"
    kind: str = _f("train", doc="always 'train'")
    timestamp: str | None = _f(None, "ISO 8601 UTC", "when the run started")
    status: str = _f("ok", doc="ok, or the failure kind: failed, oom, timeout, cancelled (stopped from outside: measured again on resume)")
    reason: str | None = _f(None, doc="why it failed")
    failed_rank: int | None = _f(None, doc="the rank that failed first")
    traceback: str | None = _f(None, doc="end of the failing rank's traceback")
    # where
    machine: str | None = _f(None, doc="name of the machine the run happened on: train --machine, else the host name")
    backend: str = _f("gloo", doc="torch.distributed backend: gloo or nccl")
    device: str | None = _f(None, doc="cpu or the CUDA device name")
    launcher: str = _f("local", doc="who started the ranks: local, torchrun, slurm")
    cluster: dict | None = _f(None, doc="cluster description (kind, nodes, ranks_per_node, link settings, emulated or real); None: one host")
    rank_nodes: list | None = _f(None, doc="node index of each rank (rank order)")
    hosts: list | None = _f(None, doc="host name of each node index")
    placement_ok: bool | None = _f(None, doc="whether ranks ran where the model assumes (consecutive ranks fill a node: Y, then X, then Z); rank_nodes says where they ran")
    comm_precision: str = _f("fp32", doc="precision of the collectives' payloads")
    algorithm: str = _f(DEFAULT_FAMILY, doc="algorithm family, a name of the family registry (plexus_tune.model.family); the grid is its process grid (docs/algorithms.md)")
    slurm: dict | None = _f(None, doc="Slurm runs: job_id and step_id; for a failed step also its state, exit_code and reason")
    # what
    graph_source: str | None = _f(None, doc="graph file path or 'synthetic:<spec>'")
    graph: str | None = _f(None, doc="graph name")
    graph_nodes: int | None = _f(None, "vertices", "N, the graph's vertex count (v1: nodes)")
    nnz: int | None = _f(None, "nonzeros", "nonzeros of the normalized adjacency, self-loops included")
    raw_nnz: int | None = _f(None, "nonzeros", "nonzeros of the adjacency as loaded")
    features: int | None = _f(None, "columns", "input feature width D_0")
    classes: int | None = _f(None, "columns", "output width D_L")
    widths: list | None = _f(None, "columns", "layer widths D_0..D_L = model_widths(features, classes, layers, hidden)")
    padded_graph_nodes: int | None = _f(None, "vertices", "N padded to a multiple of the grid's divisions (v1: padded_nodes)")
    padded_widths: list | None = _f(None, "columns", "widths padded likewise")
    w_split_over_depth: list | None = _f(None, doc="per layer: weights split over the depth axis")
    grid: str | None = _f(None, doc="'GxxGyxGz'")
    gx: int | None = _f(None, "ranks", "grid size along X")
    gy: int | None = _f(None, "ranks", "grid size along Y")
    gz: int | None = _f(None, "ranks", "grid size along Z")
    gpus: int | None = _f(None, "ranks", "G = Gx Gy Gz")
    layers: int | None = _f(None, doc="GCN layers L")
    hidden: int | None = _f(None, "columns", "hidden width")
    epochs: int | None = _f(None, doc="epochs trained, warm-up included")
    warmup: int | None = _f(None, doc="warm-up epochs left out of the timings")
    options: dict = _f(factory=lambda: dict(OPTION_DEFAULTS), doc="RunOptions: permute, block_rows, overlap, dtype, lr, weight_decay, seed, threads_per_rank, layer_norm, fixed_features")
    environment: dict | None = _f(None, doc="host, platform, processor, cpu_count, python, numpy, torch, scipy, commit")
    python: str | None = _f(None, doc="Python version")
    torch: str | None = _f(None, doc="torch version")
    commit: str | None = _f(None, doc="git commit of plexus-tune")
    # timings: per epoch, max over ranks, mean over the measured epochs
    epoch_ms: float | None = _f(None, "ms", "epoch time")
    spmm_ms: float | None = _f(None, "ms", "SpMM time")
    gemm_ms: float | None = _f(None, "ms", "dense GEMM time")
    comm_ms: float | None = _f(None, "ms", "collective time, all axes")
    comm_x_ms: float | None = _f(None, "ms", "collective time on the X axis")
    comm_y_ms: float | None = _f(None, "ms", "collective time on the Y axis")
    comm_z_ms: float | None = _f(None, "ms", "collective time on the Z axis")
    all_reduce_ms: float | None = _f(None, "ms", "all-reduce time")
    all_gather_ms: float | None = _f(None, "ms", "all-gather time")
    reduce_scatter_ms: float | None = _f(None, "ms", "reduce-scatter time")
    broadcast_ms: float | None = _f(None, "ms", "broadcast time (CAGNET families)")
    point_to_point_ms: float | None = _f(None, "ms", "point-to-point exchange time (supergcn)")
    quant_ms: float | None = _f(None, "ms", "local work of reduced-precision collectives: casts, quantize, dequantize, sums of received chunks (docs/comm-precision.md)")
    other_ms: float | None = _f(None, "ms", "epoch - spmm - gemm - comm - quant, at least 0")
    fwd_ms: float | None = _f(None, "ms", "forward pass")
    bwd_ms: float | None = _f(None, "ms", "backward pass")
    loss_ms: float | None = _f(None, "ms", "loss")
    optimizer_ms: float | None = _f(None, "ms", "optimizer step")
    epoch_ms_std: float | None = _f(None, "ms", "std over the measured epochs of the epoch time")
    epoch_times_ms: list | None = _f(None, "ms", "every epoch's time, warm-up included")
    comm_dp_ms: float | None = _f(None, "ms", "scalegnn-4d: the gradient all-reduce over the data-parallel groups "
                                  "(inside comm_ms and all_reduce_ms)")
    sample_ms: float | None = _f(None, "ms", "scalegnn-4d: the exposed sampling: the waits for each step's sample "
                                 "(with prefetch, what outlasts the previous step; inside other_ms)")
    sample_work_ms: float | None = _f(None, "ms", "scalegnn-4d: the communication-free sampling work of every step "
                                      "(host clock; with prefetch on a background thread)")
    rank_mean_ms: dict | None = _f(None, "ms", "per timing key: mean over ranks instead of max")
    imbalance: dict | None = _f(None, "ratio", "per timing key: max over ranks / mean over ranks")
    per_rank_epoch_ms: list | None = _f(None, "ms", "each rank's mean epoch time")
    spmm_layer_ms: dict | None = _f(None, "ms", "fwd and bwd: each layer's SpMM time")
    breakdown_ms: dict | None = _f(None, "ms", "the epoch partitioned: phase -> ms (critical rank's work, least "
                                   "collective time, wait_ms); the phases and wait_ms add up to epoch_ms")
    wait_ms: float | None = _f(None, "ms", "imbalance/wait: epoch_ms less the parts of breakdown_ms, >= 0")
    shard_nnz_max: list | None = _f(None, "nonzeros", "per layer: the largest shard's nonzeros")
    shard_nnz_imbalance: list | None = _f(None, "ratio", "per layer: max / mean shard nonzeros")
    memory_source: str | None = _f(None, doc="cuda_allocator or tracked_tensors")
    peak_memory_bytes: int | None = _f(None, "bytes", "peak device memory of the fullest rank")
    peak_memory_bytes_per_rank: list | None = _f(None, "bytes", "peak device memory of each rank")
    peak_rss_bytes_per_rank: list | None = _f(None, "bytes", "peak resident set size of each rank")
    rss_growth_bytes_per_rank: list | None = _f(None, "bytes", "RSS growth of each rank during training")
    persistent_bytes_per_rank: list | None = _f(None, "bytes", "memory held between epochs by each rank")
    comm_bytes: dict | None = _f(None, "bytes", "per collective class (aggregation, combination, gather): bytes all ranks sent to other ranks in one epoch")
    comm_bytes_per_rank: dict | None = _f(None, "bytes", "per collective class: each rank's bytes sent in one epoch")
    split: str | None = _f(None, doc="node split: 'ogb:<kind>' (the graph's OGB split files) or 'random:train=..,valid=..,seed=..'")
    split_sizes: dict | None = _f(None, "vertices", "train, valid, test: nodes in each part")
    accuracy: dict | None = _f(None, "ratio", "train, valid, test: accuracy of every epoch's forward pass")
    final_accuracy: dict | None = _f(None, "ratio", "train, valid, test: accuracy of the last epoch")
    losses: list | None = _f(None, doc="training loss of every epoch (mean cross-entropy over the training nodes)")
    final_loss: float | None = _f(None, doc="last epoch's loss")
    setup_s: float | None = _f(None, "s", "process-group and layout set-up")
    load_s: float | None = _f(None, "s", "graph load and sharding")
    wall_s: float | None = _f(None, "s", "wall time of the whole run (per run in a batch)")
    check_loss_rel_diff: float | None = _f(None, "ratio", "--check: max relative difference of the losses from the serial reference")
    check_output_rel_diff: float | None = _f(None, "ratio", "--check: normwise relative difference of the outputs")
    check_grad_rel_diff: float | None = _f(None, "ratio", "--check of scalegnn-4d: normwise relative difference of the "
                                           "gradients after the data-parallel average (largest over the parameters)")
    reference_losses: list | None = _f(None, doc="--check: the serial reference's losses")
    reference_epoch_ms: float | None = _f(None, "ms", "--check: the serial reference's epoch time")
    reference_accuracy: dict | None = _f(None, "ratio", "--check: train, valid, test accuracy of the serial FP32 reference's last epoch")
    # campaign
    trial: int | None = _f(None, doc="trial index among the runs of one identity")
    campaign: dict | None = _f(None, doc="gpus, trials and grids of the campaign that ran it")
    batched: int | None = _f(None, "runs", "runs trained in one process set with it")
    predicted: dict | None = _f(None, "ms", "the cost model's prediction: PREDICTED_KEYS, feasible, machine")


@dataclass(kw_only=True)
class SpmmRecord(_Record):
    """One timed SpMM (``torch.sparse.mm`` of a CSR shard by a dense matrix)."""

    KIND: ClassVar[str] = "spmm"
    nnz: int | None = _f(None, "nonzeros", "nonzeros of the sparse operand")
    rows: int | None = _f(None, "rows", "rows of the sparse operand and of the output")
    common: int | None = _f(None, "columns", "columns of the sparse operand = rows of the dense one")
    dense_cols: int | None = _f(None, "columns", "columns of the dense operand and of the output")
    time_ms: float | None = _f(None, "ms", "the reported time (see statistic)")
    time_min_ms: float | None = _f(None, "ms", "sweep: min over passes")
    time_median_ms: float | None = _f(None, "ms", "sweep: median over passes")
    statistic: str | None = _f(None, doc="how time_ms was reduced from samples")
    source: str | None = _f(None, doc="sweep (random shapes) or graph (real shards)")
    kernel: str | None = _f(None, doc="the timed call")
    threads: int | None = _f(None, "threads", "torch threads")
    passes: int | None = _f(None, doc="sweep: interleaved passes over all shapes")
    repeats: int | None = _f(None, doc="samples per pass")
    measured_at: str | None = _f(None, "ISO 8601 UTC", "when")
    graph: str | None = _f(None, doc="graph: its name")
    graph_nodes: int | None = _f(None, "vertices", "graph: N (v1: nodes)")
    grid: str | None = _f(None, doc="graph: the grid whose shard this is")
    gx: int | None = _f(None, "ranks", "graph: grid size along X")
    gy: int | None = _f(None, "ranks", "graph: grid size along Y")
    gz: int | None = _f(None, "ranks", "graph: grid size along Z")
    gpus: int | None = _f(None, "ranks", "graph: G")
    layer: int | None = _f(None, doc="graph: layer index")
    direction: str | None = _f(None, doc="graph: forward (A F) or backward (A^T dH)")
    shard: list | None = _f(None, doc="graph: (depth, outer) coordinates of the shard")
    nnz_imbalance: float | None = _f(None, "ratio", "graph: max / mean shard nonzeros of the layer")
    machine_info: dict | None = _f(None, doc="environment of the host (as RunRecord.environment)")


@dataclass(kw_only=True)
class GemmRecord(_Record):
    """One timed dense GEMM of a layer's shard shapes: (rows x inner) @ (inner x cols)."""

    KIND: ClassVar[str] = "gemm"
    rows: int | None = _f(None, "rows", "rows of the left operand and of the output")
    inner: int | None = _f(None, "columns", "the contracted dimension")
    cols: int | None = _f(None, "columns", "columns of the right operand and of the output")
    time_ms: float | None = _f(None, "ms", "min over samples")
    product: str | None = _f(None, doc="which product of the layer")
    graph: str | None = _f(None, doc="graph name")
    graph_nodes: int | None = _f(None, "vertices", "N (v1: nodes)")
    grid: str | None = _f(None, doc="the grid whose shard this is")
    gx: int | None = _f(None, "ranks", "grid size along X")
    gy: int | None = _f(None, "ranks", "grid size along Y")
    gz: int | None = _f(None, "ranks", "grid size along Z")
    gpus: int | None = _f(None, "ranks", "G")
    layer: int | None = _f(None, doc="layer index")
    threads: int | None = _f(None, "threads", "torch threads")
    measured_at: str | None = _f(None, "ISO 8601 UTC", "when")
    machine_info: dict | None = _f(None, doc="environment of the host")


@dataclass(kw_only=True)
class CollectiveRecord(_Record):
    """One timed collective on every group of one (group size, stride) at once."""

    KIND: ClassVar[str] = "collective"
    op: str | None = _f(None, doc="all_reduce, all_gather or reduce_scatter")
    group_size: int | None = _f(None, "ranks", "g, ranks per group")
    stride: int | None = _f(None, "ranks", "rank distance between group members")
    contiguous: bool | None = _f(None, doc="stride == 1")
    groups: int | None = _f(None, doc="groups timed at once (world / g)")
    nodes_spanned: int | None = _f(None, "nodes", "machine nodes a group spans, the most of any group (v1: nodes)")
    ranks_per_node: int | None = _f(None, "ranks", "members of one group on one node, the most of any group and node")
    concurrent: int | None = _f(None, doc="groups spanning several nodes that share one node's NICs during the timing, the most of any node (1: none or one)")
    alone: bool | None = _f(None, doc="one group timed while the others waited (false: all groups at once)")
    message_bytes: int | None = _f(None, "bytes", "M, the full buffer: the reduced or gathered result")
    time_ms: float | None = _f(None, "ms", "median over calls of the slowest rank's time")
    time_min_ms: float | None = _f(None, "ms", "fastest call")
    time_max_ms: float | None = _f(None, "ms", "slowest call")
    repeats: int | None = _f(None, doc="timed calls")
    algbw_gbps: float | None = _f(None, "GB/s", "M / time")
    busbw_gbps: float | None = _f(None, "GB/s", "algbw x 2(g-1)/g (all-reduce) or (g-1)/g (nccl-tests)")
    world_size: int | None = _f(None, "ranks", "ranks started")
    gpus_per_node: int | None = _f(None, "ranks", "ranks per machine node")
    backend: str | None = _f(None, doc="gloo or nccl")
    measured_at: str | None = _f(None, "ISO 8601 UTC", "when")
    launcher: str = _f("local", doc="who started the ranks")
    cluster: dict | None = _f(None, doc="cluster description, as in run records")
    rank_nodes: list | None = _f(None, doc="node index of each rank")
    hosts: list | None = _f(None, doc="host name of each node index")
    placement_ok: bool | None = _f(None, doc="whether ranks ran where the model assumes (consecutive ranks fill a node)")
    comm_precision: str = _f("fp32", doc="precision of the payload; other than fp32: the trainer's reduced-precision collective (docs/comm-precision.md)")
    rows: int | None = _f(None, "rows", "reduced precision: rows of the FP32 buffer (one zero point and scale each for intX)")
    cols: int | None = _f(None, "columns", "reduced precision: columns of the FP32 buffer")
    wire_bytes: int | None = _f(None, "bytes", "reduced precision: bytes one rank sent in one call")
    quant_ms: float | None = _f(None, "ms", "reduced precision: the call's local steps (casts, quantize, dequantize, sums), median over calls of the slowest rank; part of time_ms")
    machine_info: dict | None = _f(None, doc="environment of the host")
    threads_per_rank: int | None = _f(None, "threads", "torch threads per rank")


@dataclass(kw_only=True)
class QuantRecord(_Record):
    """One timed encode and decode of a reduced communication precision (docs/comm-precision.md)."""

    KIND: ClassVar[str] = "quant"
    precision: str | None = _f(None, doc="bf16, fp16 (casts) or int8, int4, int2 (stochastic quantization, packed)")
    rows: int | None = _f(None, "rows", "rows of the FP32 tensor (one zero point and scale each for intX)")
    cols: int | None = _f(None, "columns", "columns of the FP32 tensor")
    fp32_bytes: int | None = _f(None, "bytes", "4 rows cols, the FP32 data encoded and decoded")
    encode_ms: float | None = _f(None, "ms", "cast or quantize, min over repeats")
    decode_ms: float | None = _f(None, "ms", "cast back or dequantize, min over repeats")
    repeats: int | None = _f(None, doc="timed calls of each")
    threads: int | None = _f(None, "threads", "torch threads")
    processes: int | None = _f(None, "processes", "processes timing the codec at once on the host (then the "
                               "median process's mean time per call); absent: 1")
    measured_at: str | None = _f(None, "ISO 8601 UTC", "when")
    machine_info: dict | None = _f(None, doc="environment of the host")


@dataclass(kw_only=True)
class SamplingRecord(_Record):
    """One timed step of ScaleGNN's sampling on every rank of a 3D grid (docs/model.md, "ScaleGNN")."""

    KIND: ClassVar[str] = "sampling"
    graph_source: str | None = _f(None, doc="the graph: a file or synthetic:<spec>")
    nodes: int | None = _f(None, "nodes", "N")
    nnz: int | None = _f(None, "nonzeros", "nonzeros of the GCN-normalized adjacency (self-loops included)")
    grid: str | None = _f(None, doc="the 3D grid GxxGyxGz whose ranks sampled")
    batch_size: int | None = _f(None, "vertices", "B, vertices sampled per step")
    layouts: int | None = _f(None, "layouts", "distinct layer layouts cut per step (at most 3)")
    work_bytes: float | None = _f(None, "bytes", "the model's count of the bytes one rank's step moves (model.scalegnn.sampling_work)")
    time_ms: float | None = _f(None, "ms", "mean over the ranks of the median over the repeats (median over the processes)")
    repeats: int | None = _f(None, doc="timed steps per rank (one untimed first)")
    processes: int | None = _f(None, doc="copies of the sweep run at once")
    measured_at: str | None = _f(None, "ISO 8601 UTC", "when")
    machine_info: dict | None = _f(None, doc="environment of the host")


@dataclass(kw_only=True)
class BandwidthRecord(_Record):
    """One timed memory-bound step of the epoch's ``other`` part (docs/model.md, Other)."""

    KIND: ClassVar[str] = "bandwidth"
    op: str | None = _f(None, doc="copy, bias, relu, relu_backward (elementwise), optimizer, or sync")
    optimizer: str | None = _f(None, doc="op optimizer: the optimizer stepped (adamw-fused, adamw-foreach, adamw-for-loop)")
    elements: int | None = _f(None, "elements", "elements of each array the op touches (optimizer: trainable elements)")
    accesses: int | None = _f(None, "arrays", "array reads plus writes per element")
    bytes: int | None = _f(None, "bytes", "element size x accesses x elements: the bytes the op must move")
    time_ms: float | None = _f(None, "ms", "min over samples")
    time_min_ms: float | None = _f(None, "ms", "min over samples")
    time_median_ms: float | None = _f(None, "ms", "median over samples")
    gbps: float | None = _f(None, "GB/s", "bytes / time_ms (sync: 0)")
    repeats: int | None = _f(None, doc="timed samples")
    statistic: str | None = _f(None, doc="how time_ms was reduced from samples, and the timer")
    device: str | None = _f(None, doc="cpu, or the CUDA device name")
    threads: int | None = _f(None, "threads", "torch CPU threads")
    measured_at: str | None = _f(None, "ISO 8601 UTC", "when")
    machine_info: dict | None = _f(None, doc="environment of the host and device")


SCHEMAS = {cls.KIND: cls for cls in (RunRecord, SpmmRecord, GemmRecord, CollectiveRecord, QuantRecord, BandwidthRecord,
                                     SamplingRecord)}


def flatten_record(record: Mapping, *, sep: str = ".") -> dict:
    """Flatten nested dicts: ``{"grid": {"gx": 2}}`` becomes ``{"grid.gx": 2}``; lists stay."""
    flat: dict = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, Mapping) and value:
            for key, sub in value.items():
                walk(f"{prefix}{sep}{key}" if prefix else str(key), sub)
        else:
            flat[prefix] = value

    walk("", record)
    return flat


def table_row(record: Mapping) -> dict:
    """One flat row of a measurement table (fitting input) from a record of any version.

    Nested dicts are flattened with dots. Collective rows also carry ``nodes`` (=
    ``nodes_spanned``), the column name of the collective fit's table API (op,
    group_size, nodes, message_bytes, time_ms).
    """
    row = flatten_record(upgrade(record))
    if record_type(row) == "collective" and "nodes_spanned" in row:
        row["nodes"] = row["nodes_spanned"]
    return row
