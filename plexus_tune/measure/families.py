"""Campaigns over every algorithm family: each family's configurations of G ranks, at each
communication precision, on one or more graphs, through the campaign code of
:mod:`plexus_tune.measure.campaign` (docs/algorithms.md, "Validating the joint ranking").

A family configuration is (family, process grid, options): every registered family the
trainer runs (:func:`trained_families`), each of its option variants
(:meth:`~plexus_tune.model.family.Family.variants`: supergcn's pre, post and hybrid
aggregation) at each of its configurations (plexus-3d every grid, cagnet-1d, 1.5d, 2d,
3d). Families without a trainer are left out and named (:func:`untrained_families`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.measure.campaign import Campaign, check_graph, log_campaign_run, pending_runs, run_batch
from plexus_tune.measure.store import RUN_LOG, check_log
from plexus_tune.model.comm_precision import parse_precision
from plexus_tune.model.family import family_names, family_of
from plexus_tune.trainer.algorithms import TRAINED_ALGORITHMS
from plexus_tune.trainer.config import TrainConfig

#: Named emulated clusters: ``NxR`` -> N nodes of R ranks, 0.05 GB/s per node link, no added latency.
CLUSTER_SPEC = "emulated:nodes={nodes},ranks_per_node={ranks},inter_gbps=0.05,inter_latency_us=0"


def cluster_spec(text: str) -> str:
    """``2x4`` -> the emulated-cluster spec of 2 nodes x 4 ranks (:data:`CLUSTER_SPEC`); a full
    ``emulated:...`` spec is returned as given."""
    text = str(text).strip()
    if text.startswith("emulated:"):
        return text
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise UserError(f"bad cluster {text!r}; write NODESxRANKS (e.g. 2x4) or an emulated:... spec")
    return CLUSTER_SPEC.format(nodes=int(parts[0]), ranks=int(parts[1]))


def trained_families() -> list[str]:
    """Registered families the trainer runs (:data:`plexus_tune.trainer.algorithms.TRAINED_ALGORITHMS`), in registry order."""
    return [name for name in family_names() if name in TRAINED_ALGORITHMS]


def untrained_families() -> list[str]:
    """Registered families the trainer does not run (left out of campaigns)."""
    return [name for name in family_names() if name not in TRAINED_ALGORITHMS]


def family_settings() -> list[tuple[str, dict]]:
    """(family, options) of every trained family's variants, in registry order."""
    return [(name, dict(variant)) for name in trained_families() for variant in family_of(name).variants()]


def family_configurations(gpus: int) -> list[tuple[str, tuple[int, int, int], dict]]:
    """(family, grid, options) of every trained family's configurations of ``gpus`` ranks."""
    return [(name, tuple(int(v) for v in grid), options) for name, options in family_settings()
            for grid in family_of(name).configurations(gpus)]


def configuration_label(family: str, grid, options: dict | None = None, comm_precision: str | None = None) -> str:
    """``cagnet-2d 2x4x1``, ``supergcn 8x1x1 post``, with `` bf16`` for a reduced precision."""
    text = f"{family} {'x'.join(str(int(v)) for v in grid)}"
    if (options or {}).get("aggregation"):
        text += f" {options['aggregation']}"
    if comm_precision and comm_precision != "fp32":
        text += f" {comm_precision}"
    return text


def run_family_campaign(graph: str, gpus: int, *, log, precisions: Sequence[str] = ("fp32",), trials: int = 3,
                        epochs: int = 6, warmup: int = 2, layers: int = 3, hidden: int = 64, batch: int = 4,
                        launcher=None, timeout_s: float = 900.0,
                        on_result: Callable[[dict, tuple], None] | None = None,
                        on_start: Callable[[int, int], None] | None = None) -> list[dict]:
    """Measure every trained family configuration of ``gpus`` ranks on ``graph`` at each precision
    (:func:`measure_configurations` of all of them). Returns the new records."""
    precisions = [parse_precision(p) for p in precisions]
    if not precisions:
        raise UserError("no communication precision to measure; give fp32 and/or a reduced one")
    configs = [(family, grid, options, precision) for precision in precisions
               for family, grid, options in family_configurations(gpus)]
    return measure_configurations(graph, configs, log=log, trials=trials, epochs=epochs, warmup=warmup, layers=layers,
                                  hidden=hidden, batch=batch, launcher=launcher, timeout_s=timeout_s,
                                  on_result=on_result, on_start=on_start)


def trainer_options(family: str, options: dict) -> dict:
    """The options of a configuration that its run sets (TrainConfig fields). An option the
    trainers do not take (a CAGNET ``schedule``) must have the value the family trains,
    that of its first variant; UserError otherwise."""
    train_fields = {f.name for f in fields(TrainConfig)}
    trained = family_of(family).variants()[0]
    for key, value in options.items():
        if key not in train_fields and value != trained.get(key):
            raise UserError(f"{family} trains its {key} {trained.get(key)!r}, not {value!r}: that configuration "
                            "can be predicted but not measured", parameter=key)
    return {key: value for key, value in options.items() if key in train_fields}


def measure_configurations(graph: str, configs, *, log, trials: int = 1, epochs: int = 6, warmup: int = 2,
                           layers: int = 3, hidden: int = 64, batch: int = 4, launcher=None, timeout_s: float = 900.0,
                           on_result: Callable[[dict, tuple], None] | None = None,
                           on_start: Callable[[int, int], None] | None = None) -> list[dict]:
    """Train ``configs`` ((family, grid, options, comm precision) of any families and GPU counts)
    on ``graph``, ``trials`` times each, through the campaign code.

    Trial t of every configuration runs (in a seeded random order) before any trial t + 1;
    runs of one GPU count go ``batch`` to a process set whatever their family (one start
    and graph load); runs already in ``log`` are skipped
    (:func:`plexus_tune.measure.campaign.pending_runs`). ``on_start(done, total)`` is called
    before each process set. Returns the new records.
    """
    check_graph(graph)
    if log is not None:
        check_log(log, kinds=RUN_LOG, inputs=[graph])
    pending = []
    for family, grid, options, precision in configs:
        grid = tuple(int(v) for v in grid)
        campaign = Campaign(graph, int(np.prod(grid)), [grid], log=log, trials=trials, epochs=epochs, warmup=warmup,
                            layers=layers, hidden=hidden,
                            train_options={"algorithm": family, "comm_precision": parse_precision(precision),
                                           "timeout_s": float(timeout_s), **trainer_options(family, dict(options))})
        for g, trial, config, _ in pending_runs(campaign, launcher=launcher):
            pending.append((trial, g, config))
    rng = np.random.default_rng([len(pending), trials])
    keys = {i: (pending[i][0], int(np.prod(pending[i][1])), rng.random()) for i in range(len(pending))}
    pending = [pending[i] for i in sorted(keys, key=keys.get)]
    new = []
    batch = max(1, int(batch))
    start = 0
    while start < len(pending):
        world = int(np.prod(pending[start][1]))
        chunk = [pending[start]]
        while len(chunk) < batch and start + len(chunk) < len(pending) \
                and int(np.prod(pending[start + len(chunk)][1])) == world:
            chunk.append(pending[start + len(chunk)])
        if on_start is not None:
            on_start(start, len(pending))
        for (trial, grid, _), record in zip(chunk, run_batch([c for _, _, c in chunk], launcher)):
            log_campaign_run(log, record, trial=trial, gpus=world, trials=trials, grids=[grid])
            new.append(record)
            if on_result is not None:
                on_result(record, grid)
        start += len(chunk)
    return new
