"""Measured search: configurations trained with the bundled trainer and logged."""

from __future__ import annotations
import os
from plexus_tune.measure.campaign import (
    Campaign,
    campaign_config,
    config_identity,
    launcher_options,
    load_stats,
    run_campaign,
    workload_of,
)
from plexus_tune.measure.table import runs_table
from plexus_tune.model.breakdown import BREAKDOWN_KEYS
from plexus_tune.paths import default_run_log
from plexus_tune.measure.store import read_runs
from plexus_tune.search.evaluate import Evaluation, ModelEvaluator
from plexus_tune.search.space import Config


# --------------------------------------------------------------------------------------
# Measured search: the bundled trainer evaluates, the run log remembers


def graph_workload(graph: str, *, layers: int = 3, hidden: int = 128):
    """(stats, workload) of a graph file or synthetic spec, as the measurement campaigns see it."""
    stats = load_stats(graph)
    return stats, workload_of(stats, layers, hidden)


def known_runs(log_path, graph: str, model: ModelEvaluator, *, layers: int, hidden: int, epochs: int = 10, warmup: int = 2,
               train_options: dict | None = None, launcher=None) -> dict:
    """Logged runs of ``graph`` that a measured search with these settings would make, by configuration.

    A configuration's run identity (docs/records.md) must match exactly: the grid and
    block rows come from the configuration, the rest from the arguments and
    ``train_options`` (backend, overlap, ...) and ``launcher`` (its name, cluster and machine),
    as :class:`MeasuredEvaluator` trains. The
    observed time is the runs table's median over the successful trials; a
    configuration whose logged runs all failed maps to a failed Evaluation, so a search
    does not train it again.
    """
    if not log_path or not os.path.exists(log_path):
        return {}
    table = runs_table(read_runs(log_path, warn=False), include_failed=True)
    out = {}
    for _, row in table.iterrows():
        cfg = Config(int(row["gx"]), int(row["gy"]), int(row["gz"]), int(row["block_rows"]) or None)
        options = launcher_options(train_options, launcher)
        if cfg.block_rows:
            options["block_rows"] = int(cfg.block_rows)
        probe = campaign_config(graph, cfg.grid, layers=layers, hidden=hidden, epochs=epochs, warmup=warmup, options=options)
        if row["identity"] != config_identity(probe):
            continue
        base = model.evaluate(cfg)
        if int(row["trials"]) > 0:
            base.epoch_ms = float(row["obs_epoch_ms"])
            base.run_id = str(row["timestamp"])
        else:
            base.failure = str(row["last_failure"])
        out[cfg] = base
    return out


class MeasuredEvaluator:
    """Train a configuration with the bundled trainer (one logged run), predicted by ``model`` too.

    Configurations the model predicts do not fit in memory are not trained: they are
    marked infeasible with their predicted time. Runs go through
    :func:`plexus_tune.measure.campaign.run_campaign` with ``launcher`` (default: local
    processes), so they are logged with the prediction.
    """

    measured = True

    def __init__(self, model: ModelEvaluator, graph: str, *, stats=None, layers: int = 3, hidden: int = 128,
                 epochs: int = 10, warmup: int = 2, backend: str = "gloo", timeout_s: float = 600.0,
                 log_path: str | None = None, train_options: dict | None = None,
                 launcher=None):
        self.model = model
        self.graph = graph
        self.stats = stats
        self.layers, self.hidden, self.epochs, self.warmup = layers, hidden, epochs, warmup
        self.log_path = str(log_path or default_run_log())  # the default run log (plexus_tune.paths)
        self.options = {"backend": backend, "timeout_s": float(timeout_s), **(train_options or {})}
        self.launcher = launcher
        self.runs = 0

    def known_runs(self) -> dict:
        """The configurations its log already holds runs of (:func:`known_runs` with its settings)."""
        return known_runs(self.log_path, self.graph, self.model, layers=self.layers, hidden=self.hidden,
                          epochs=self.epochs, warmup=self.warmup, train_options=self.options, launcher=self.launcher)

    def evaluate(self, config: Config) -> Evaluation:
        ev = self.model.evaluate(config)
        if not ev.feasible:
            return ev
        directory = os.path.dirname(self.log_path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        options = dict(self.options)
        if config.block_rows:
            options["block_rows"] = int(config.block_rows)
        campaign = Campaign(self.graph, config.gpus, [config.grid], log=self.log_path, trials=1, epochs=self.epochs,
                            warmup=self.warmup, layers=self.layers, hidden=self.hidden, train_options=options)
        new = run_campaign(campaign, machine=self.model.machine, stats=self.stats, launcher=self.launcher)
        self.runs += len(new)
        if not new:  # logged meanwhile (another worker): read it back
            return self.known_runs().get(config, Evaluation(ev.total_ms, ev.memory_gib, ev.memory_excess_gib, failure="no run logged"))
        record = new[-1]
        ev.run_id = str(record.get("timestamp"))
        if record.get("status", "ok") == "ok" and record.get("epoch_ms") is not None:
            ev.epoch_ms = float(record["epoch_ms"])
            ev.breakdown = {k: float(record[k]) for k in BREAKDOWN_KEYS if isinstance(record.get(k), (int, float))}
        else:
            ev.failure = f"{record.get('status')}: {record.get('reason', '')}"[:200]
        return ev
