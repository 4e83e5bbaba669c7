"""A trainer run measured: its record built from the ranks' raw results, logged.

Timing protocol: every phase is timed per rank and per epoch; an epoch's phase time is
the max over ranks (the straggler decides), ``imbalance`` is that max over the mean
over ranks; the warm-up epochs are trained but left out, and the record gives the mean
over the remaining epochs (``epoch_ms``, ``spmm_ms``, ...), their spread
(``epoch_ms_std``) and every epoch's time (``epoch_times_ms``). Those per-key maxima
come from different ranks and overlap; ``breakdown_ms`` (:func:`partition_epoch`)
partitions the epoch instead, with ``wait_ms`` the imbalance/wait remainder. The record is a
:class:`plexus_tune.measure.records.RunRecord` (fields and units: docs/records.md).
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace

import numpy as np

from plexus_tune.graph.io import resolve_graph
from plexus_tune.launch import RankFailure, detect_environment
from plexus_tune.launch.launchers import Launcher
from plexus_tune.measure.identity import RunSpec
from plexus_tune.measure.placement import placement_fields
from plexus_tune.measure.records import RunOptions, RunRecord
from plexus_tune.measure.store import append_records, environment_info, now_utc
from plexus_tune.model.grid import format_grid
from plexus_tune.model.comm_precision import COMM_CLASSES, COUNTED_CLASSES
from plexus_tune.trainer.comm import PARTITION_KEYS, PARTITION_SPLITS, PHASE_KEYS, TIMER_KEYS, WAITING_KEYS
from plexus_tune.trainer.config import TrainConfig
from plexus_tune.trainer.reference import max_relative_difference, reference_minibatch_step, reference_train
from plexus_tune.trainer.run import train


class TrainingFailed(RuntimeError):
    """A run failed on some rank; ``record`` is the failed-run record (also logged)."""

    def __init__(self, message: str, record: dict):
        super().__init__(message)
        self.record = record


def _failure_status(reason: str) -> str:
    text = reason.lower()
    if any(s in text for s in ("out of memory", "can't allocate", "cannot allocate", "memoryerror", "outofmemory")):
        return "oom"
    if "timed out" in text or "timeout" in text:
        return "timeout"
    return "failed"


def partition_epoch(rank_rows) -> dict:
    """One epoch's observed breakdown that partitions its time (docs/records.md, Observed breakdown).

    ``rank_rows``: each rank's timer row of the epoch. The epoch is the slowest rank's
    time. The critical rank c is the rank with the most local work (the sum of the
    :data:`PARTITION_KEYS` outside :data:`WAITING_KEYS`); each local phase is c's
    time. A waiting phase (collectives) is the least time any rank spent in it, the
    part no rank avoided; its splits (per axis, per collective) are those of the rank
    with that least time, so they add up to it. ``wait_ms`` (imbalance/wait) is the rest::

        wait = epoch - sum(parts) = (epoch - epoch_c) + sum_waiting (t_c - min_r t_r) >= 0

    Works for any phase names in :data:`PARTITION_KEYS`.
    """
    epoch = max(float(row.get("epoch_ms", 0.0)) for row in rank_rows)
    local = [key for key in PARTITION_KEYS if key not in WAITING_KEYS]
    critical = max(rank_rows, key=lambda row: sum(float(row.get(k, 0.0)) for k in local))
    out = {key: float(critical.get(key, 0.0)) for key in local}
    for key in PARTITION_KEYS:
        if key not in WAITING_KEYS:
            continue
        least = min(rank_rows, key=lambda row: float(row.get(key, 0.0)))
        out[key] = float(least.get(key, 0.0))
        for split in PARTITION_SPLITS.get(key, ()):
            out.update({name: float(least.get(name, 0.0)) for name in split})
    parts = sum(out[key] for key in PARTITION_KEYS)
    out["wait_ms"] = max(0.0, epoch - parts)
    return out


def summarize_timers(timers, warmup: int) -> dict:
    """Per-epoch max and mean over ranks -> record fields (see module docstring)."""
    keys = TIMER_KEYS + PHASE_KEYS
    ranks = len(timers)
    epochs = len(timers[0])
    table = np.array([[[timers[r][e].get(k, 0.0) for k in keys] for e in range(epochs)] for r in range(ranks)])
    per_epoch_max = table.max(axis=0)  # (epochs, keys)
    per_epoch_mean = table.mean(axis=0)
    measured = slice(warmup, epochs)
    out = {}
    for j, key in enumerate(keys):
        out[key] = float(per_epoch_max[measured, j].mean())
    k_epoch = keys.index("epoch_ms")
    out["epoch_ms_std"] = float(per_epoch_max[measured, k_epoch].std())
    out["epoch_times_ms"] = [float(v) for v in per_epoch_max[:, k_epoch]]
    out["rank_mean_ms"] = {key: float(per_epoch_mean[measured, j].mean()) for j, key in enumerate(keys)}
    imbalance = {}
    for j, key in enumerate(keys):
        mean = per_epoch_mean[measured, j]
        ok = mean > 0
        imbalance[key] = float((per_epoch_max[measured, j][ok] / mean[ok]).mean()) if ok.any() else 1.0
    out["imbalance"] = imbalance
    out["per_rank_epoch_ms"] = [float(table[r, measured, k_epoch].mean()) for r in range(ranks)]
    # each SpMM (forward A F and backward A^T dH of every layer), max over ranks
    layer_keys = sorted({k for k in timers[0][0] if k.startswith(("spmm_fwd_", "spmm_bwd_"))},
                        key=lambda k: (k.split("_")[1], int(k.split("_")[2])))
    per_layer = {"fwd": [], "bwd": []}
    for key in layer_keys:
        values = np.array([[timers[r][e].get(key, 0.0) for e in range(epochs)] for r in range(ranks)])
        per_layer[key.split("_")[1]].append(float(values.max(axis=0)[measured].mean()))
    out["spmm_layer_ms"] = per_layer
    for key in ("comm_dp_ms", "sample_ms", "sample_work_ms"):  # the mini-batch family's own timers, max over ranks
        if any(key in row for row in timers[0]):
            values = np.array([[timers[r][e].get(key, 0.0) for e in range(epochs)] for r in range(ranks)])
            out[key] = float(values.max(axis=0)[measured].mean())
    parts = [partition_epoch([timers[r][e] for r in range(ranks)]) for e in range(warmup, epochs)]
    if parts:
        out["breakdown_ms"] = {key: float(np.mean([p[key] for p in parts])) for key in parts[0]}
        out["wait_ms"] = out["breakdown_ms"]["wait_ms"]
    return out


def comm_bytes_fields(per_rank_epochs) -> dict:
    """``comm_bytes`` (per class: bytes all ranks sent in the last epoch) and
    ``comm_bytes_per_rank`` (per class: each rank's bytes in that epoch).

    ``per_rank_epochs[r][e]`` is rank r's ``{class: bytes}`` of epoch e; every epoch
    sends the same, so the last one stands for all.
    """
    if not per_rank_epochs or not all(per_rank_epochs):
        return {}
    last = [epochs[-1] for epochs in per_rank_epochs]
    names = [n for n in COUNTED_CLASSES if n in COMM_CLASSES or any(r.get(n) for r in last)]
    per_rank = {name: [int(r.get(name, 0)) for r in last] for name in names}
    return {"comm_bytes": {name: int(sum(v)) for name, v in per_rank.items()}, "comm_bytes_per_rank": per_rank}


def accuracy_fields(result: dict) -> dict:
    """``split``, ``split_sizes``, ``accuracy`` (per part, every epoch) and ``final_accuracy``."""
    acc = result.get("accuracy")
    if not acc:
        return {}
    return {"split": result.get("split"), "split_sizes": result.get("split_sizes"),
            "accuracy": {k: [float(v) for v in vals] for k, vals in acc.items()},
            "final_accuracy": {k: float(vals[-1]) for k, vals in acc.items() if vals}}


def config_fields(config: TrainConfig, *, spec: RunSpec | None = None, launcher: str | None = None, rank_nodes=None,
                  hosts=None, placement_ok=None, slurm=None) -> dict:
    """The run record fields a configuration fixes before it runs: its :class:`~plexus_tune.measure.identity.RunSpec`'s
    (:meth:`~plexus_tune.measure.identity.RunSpec.from_config`) and the training settings (lr, weight decay, seed).

    ``RunSpec.from_record(config_fields(config)).identity()`` is ``RunSpec.from_config(config).identity()``,
    the identity the run's record will have (docs/records.md). ``spec``: the configuration's spec, where the
    caller has it.
    """
    spec = spec if spec is not None else RunSpec.from_config(config)
    options = RunOptions(permute=spec.permute, block_rows=spec.block_rows, overlap=spec.overlap, dtype=spec.dtype,
                         lr=config.lr, weight_decay=config.weight_decay, seed=config.seed,
                         threads_per_rank=spec.threads_per_rank, layer_norm=spec.layer_norm,
                         fixed_features=spec.fixed_features, replication=spec.replication, aggregation=spec.aggregation,
                         dp=spec.dp, batch_size=spec.batch_size,
                         prefetch=spec.prefetch if spec.batch_size else None)
    return {
        "machine": spec.machine,
        "backend": spec.backend,
        "launcher": launcher or spec.launcher,
        "cluster": config.cluster,  # as described (the spec holds its canonical text)
        "rank_nodes": rank_nodes,
        "hosts": hosts,
        "placement_ok": placement_ok,
        "slurm": slurm,
        "comm_precision": str(spec.comm_precision),
        "algorithm": spec.algorithm,
        "graph_source": spec.graph,
        "grid": format_grid(spec.grid),
        "gx": spec.grid[0], "gy": spec.grid[1], "gz": spec.grid[2],
        "gpus": spec.dp * int(np.prod(spec.grid)),
        "layers": spec.layers,
        "hidden": spec.hidden,
        "epochs": spec.epochs,
        "warmup": spec.warmup,
        "options": asdict(options),
    }


def base_record(config: TrainConfig, *, spec: RunSpec | None = None, launcher: str | None = None, rank_nodes=None,
                hosts=None, placement_ok=None, slurm=None) -> dict:
    """The record of a run before its results: what runs where, when, with what software (``spec``: as for
    :func:`config_fields`)."""
    env = environment_info()
    record = RunRecord(timestamp=now_utc(), status="ok", environment=env, python=env.get("python"),
                       torch=env.get("torch"), commit=env.get("commit"),
                       **config_fields(config, spec=spec, launcher=launcher, rank_nodes=rank_nodes, hosts=hosts,
                                     placement_ok=placement_ok, slurm=slurm))
    return record.to_dict()


def build_record(config: TrainConfig, result: dict, wall_s: float, device: str, *, spec: RunSpec | None = None,
                 **where) -> dict:
    """The record of a finished run (``spec`` and ``where``: launcher, rank_nodes, hosts as for :func:`base_record`)."""
    record = RunRecord.from_dict(base_record(config, spec=spec, **where))
    record.options["permute"] = result.get("permute", config.permute)  # shard files fix their own
    timers = summarize_timers(result["timers"], config.warmup)
    names = set(RunRecord.field_names())
    record.extra.update({k: v for k, v in timers.items() if k not in names})  # a timer the schema does not name yet
    timers = {k: v for k, v in timers.items() if k in names}
    nnz = np.array(result["shard_nnz"], dtype=np.float64)  # (ranks, layers)
    mean = nnz.mean(axis=0)
    memory = result["memory"]
    key = "cuda_max_allocated_bytes" if "cuda_max_allocated_bytes" in memory[0] else "tracked_bytes"
    losses = [float(v) for v in result["losses"]]
    record = replace(
        record,
        device=device,
        graph=result["graph_name"],
        graph_nodes=result["nodes"],
        nnz=result["nnz"],
        raw_nnz=result["raw_nnz"],
        features=result["features"],
        classes=result["classes"],
        widths=result["widths"],
        padded_graph_nodes=result["n_pad"],
        padded_widths=result["padded_widths"],
        w_split_over_depth=result["w_split"],
        **timers,
        shard_nnz_max=[int(v) for v in nnz.max(axis=0)],
        shard_nnz_imbalance=[float(m / a) if a > 0 else 1.0 for m, a in zip(nnz.max(axis=0), mean)],
        memory_source="cuda_allocator" if key.startswith("cuda") else "tracked_tensors",
        peak_memory_bytes=int(max(m[key] for m in memory)),
        peak_memory_bytes_per_rank=[int(m[key]) for m in memory],
        peak_rss_bytes_per_rank=[int(m["rss_bytes"]) for m in memory],
        rss_growth_bytes_per_rank=[int(m.get("rss_delta_bytes", 0)) for m in memory],
        persistent_bytes_per_rank=[int(m.get("persistent_bytes", 0)) for m in memory],
        **comm_bytes_fields(result.get("comm_bytes")),
        **accuracy_fields(result),
        losses=losses,
        final_loss=losses[-1],
        setup_s=float(result["setup_s"]),
        load_s=float(result["load_s"]),
        wall_s=float(wall_s),
    )
    return record.to_dict()


def _append(config: TrainConfig, record: dict) -> None:
    if config.log:
        append_records(config.log, [record])


def _check_one_step(config: TrainConfig, source, result: dict, record: dict) -> dict:
    """A mini-batch run's --check: its first step against the serial PyG step on the same samples
    (:func:`plexus_tune.trainer.reference.reference_minibatch_step`)."""
    got = result["check_step"]
    options = dict(config.extra.get("minibatch") or {})
    ref = reference_minibatch_step(resolve_graph(source), [g["sample"] for g in got["groups"]], layers=config.layers,
                                   hidden=config.hidden, seed=config.seed, dtype=config.dtype,
                                   split=result.get("split_codes"), rmsnorm=bool(options.get("rmsnorm", True)),
                                   residual=bool(options.get("residual", True)),
                                   dropout=float(options.get("dropout", 0.0)),
                                   fixed_features=bool(config.fixed_features))
    grad = max(max_relative_difference(got["grads"][k], ref["grads"][k], normwise=True) for k in ref["grads"])
    return replace(RunRecord.from_dict(record),
                   check_loss_rel_diff=max_relative_difference([g["loss"] for g in got["groups"]], ref["losses"]),
                   check_output_rel_diff=max_relative_difference(got["logits"], ref["logits"], normwise=True),
                   check_grad_rel_diff=grad, reference_losses=ref["losses"]).to_dict()


def run_training(config: TrainConfig, *, raise_on_failure: bool = True, launcher=None,
                 spec: RunSpec | None = None) -> dict | None:
    """Train one configuration and return its record (appended to ``config.log`` if set).

    Run by hand it starts ``prod(grid)`` ranks with ``launcher`` (default: local processes;
    see :mod:`plexus_tune.launch.launchers`); under torchrun or srun this
    process is one rank and only rank 0 returns the record (others return None). A
    failing rank stops the run; the failed-run record is logged and
    :class:`TrainingFailed` raised (or the record returned if ``raise_on_failure`` is
    False). ``spec``: the run's :class:`~plexus_tune.measure.identity.RunSpec` where the caller has it (a
    campaign; its launcher's fields in it), else made once here (:meth:`RunSpec.from_config` with the
    launcher); the trainer runs :meth:`RunSpec.train_config` of it, with ``config``'s training settings.
    """
    env = detect_environment()
    if env is None:
        launcher = launcher or Launcher()
    if spec is None:  # the run as it will run: its record's fields (a campaign made it already)
        spec = RunSpec.from_config(config, launcher=launcher if env is None else None)
    config = spec.train_config(config)
    where = {} if env is None else {"launcher": env.source}
    start = time.perf_counter()
    try:
        trained = train(config, launcher=launcher, env=env)  # checked and launched in one call
    except RankFailure as exc:
        where = {**where, **getattr(exc, "fields", {})}  # e.g. the Slurm step's state
        record = replace(RunRecord.from_dict(base_record(config, spec=spec, **where)), status=_failure_status(exc.reason),
                         reason=str(exc), failed_rank=exc.rank, wall_s=time.perf_counter() - start,
                         traceback=exc.details[-4000:] if exc.details else None).to_dict()
        _append(config, record)
        if raise_on_failure:
            raise TrainingFailed(str(exc), record) from None
        return record
    if trained is None:
        return None
    where = {**where, **placement_fields(trained.placement, trained.ranks_per_node)}
    config, result = trained.config, trained.results[0]
    record = build_record(config, result, trained.wall_s, trained.device, spec=spec, **where)
    if config.check and "check_step" in result:
        record = _check_one_step(config, trained.source, result, record)
    elif config.check:
        ref = reference_train(resolve_graph(trained.source), layers=config.layers, hidden=config.hidden,
                              epochs=config.epochs, lr=config.lr, weight_decay=config.weight_decay,
                              seed=config.seed, dtype=config.dtype, split=result.get("split_codes"),
                              layer_norm=bool(config.layer_norm), fixed_features=bool(config.fixed_features))
        record = replace(RunRecord.from_dict(record),
                         check_loss_rel_diff=max_relative_difference(result["losses"], ref["losses"]),
                         check_output_rel_diff=max_relative_difference(result["outputs"], ref["outputs"], normwise=True),
                         reference_losses=ref["losses"],
                         reference_epoch_ms=float(np.mean(ref["epoch_ms"][config.warmup:])),
                         reference_accuracy={k: float(v[-1]) for k, v in ref["accuracy"].items()}).to_dict()
    _append(config, record)
    if config.collect_outputs:
        record = dict(record)
        record["outputs"] = result["outputs"]
    return record
