"""Measured search: configurations trained with the bundled trainer and logged."""

from __future__ import annotations
import os
import numpy as np
from plexus_tune.search.evaluate import Evaluation, ModelEvaluator
from plexus_tune.search.space import Config


# --------------------------------------------------------------------------------------
# Measured search: the bundled trainer evaluates, the run log remembers


def graph_workload(graph: str, *, layers: int = 3, hidden: int = 128):
    """(stats, workload) of a graph file or synthetic spec, as the measurement campaigns see it."""
    from plexus_tune.measure.campaign import load_stats, workload_of

    stats = load_stats(graph)
    return stats, workload_of(stats, layers, hidden)


def _same_run(record: dict, source: str, layers: int, hidden: int, epochs: int, warmup: int, block_rows) -> bool:
    opts = record.get("options") or {}
    return (
        record.get("graph_source") == source
        and int(record.get("layers", -1)) == layers
        and int(record.get("hidden", -1)) == hidden
        and int(record.get("epochs", -1)) == epochs
        and int(record.get("warmup", -1)) == warmup
        and (opts.get("block_rows") or None) == (block_rows or None)
        and not opts.get("overlap")
    )


def known_runs(log_path, graph: str, model: ModelEvaluator, *, layers: int, hidden: int, epochs: int = 10, warmup: int = 2) -> dict:
    """Logged runs of ``graph`` with these settings, by configuration (mean epoch over trials).

    A configuration whose logged runs all failed maps to a failed Evaluation, so a
    search does not train it again.
    """
    from plexus_tune.measure.campaign import graph_source_text
    from plexus_tune.measure.store import read_records

    if not log_path or not os.path.exists(log_path):
        return {}
    source = graph_source_text(graph)[0]
    records, _ = read_records(log_path, schema="plexus-tune/run-v1")
    groups: dict[Config, list[dict]] = {}
    for r in records:
        try:
            cfg = Config(int(r["gx"]), int(r["gy"]), int(r["gz"]), (r.get("options") or {}).get("block_rows") or None)
        except (KeyError, TypeError, ValueError):
            continue
        if _same_run(r, source, layers, hidden, epochs, warmup, cfg.block_rows):
            groups.setdefault(cfg, []).append(r)
    out = {}
    for cfg, recs in groups.items():
        base = model.evaluate(cfg)
        ok = [r for r in recs if r.get("status", "ok") == "ok" and r.get("epoch_ms") is not None]
        if ok:
            base.observed_ms = float(np.median([r["epoch_ms"] for r in ok]))  # median over trials
            base.run_id = str(ok[-1].get("timestamp"))
        else:
            base.failure = f"{recs[-1].get('status')}: {recs[-1].get('reason', '')}"[:200]
        out[cfg] = base
    return out


class MeasuredEvaluator:
    """Train a configuration with the bundled trainer (one logged run), predicted by ``model`` too.

    Configurations the model predicts do not fit in memory are not trained: they are
    marked infeasible with their predicted time. Runs go through
    :func:`plexus_tune.measure.campaign.run_campaign`, so they are logged with the prediction.
    """

    measured = True

    def __init__(self, model: ModelEvaluator, graph: str, *, stats=None, layers: int = 3, hidden: int = 128,
                 epochs: int = 10, warmup: int = 2, backend: str = "gloo", timeout_s: float = 600.0,
                 log_path: str = os.path.join("measurements", "runs.jsonl"), train_options: dict | None = None):
        self.model = model
        self.graph = graph
        self.stats = stats
        self.layers, self.hidden, self.epochs, self.warmup = layers, hidden, epochs, warmup
        self.log_path = log_path
        self.options = {"backend": backend, "timeout_s": float(timeout_s), **(train_options or {})}
        self.runs = 0

    def evaluate(self, config: Config) -> Evaluation:
        from plexus_tune.measure.campaign import run_campaign

        ev = self.model.evaluate(config)
        if not ev.feasible:
            return ev
        directory = os.path.dirname(self.log_path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        options = dict(self.options)
        if config.block_rows:
            options["block_rows"] = int(config.block_rows)
        new = run_campaign(self.graph, config.gpus, [config.grid], log=self.log_path, trials=1, epochs=self.epochs,
                           warmup=self.warmup, layers=self.layers, hidden=self.hidden, machine=self.model.machine,
                           stats=self.stats, train_options=options)
        self.runs += len(new)
        if not new:  # logged meanwhile (another worker): read it back
            known = known_runs(self.log_path, self.graph, self.model, layers=self.layers, hidden=self.hidden,
                               epochs=self.epochs, warmup=self.warmup)
            return known.get(config, Evaluation(ev.predicted_ms, ev.memory_gib, ev.memory_excess_gib, failure="no run logged"))
        record = new[-1]
        ev.run_id = str(record.get("timestamp"))
        if record.get("status", "ok") == "ok" and record.get("epoch_ms") is not None:
            ev.observed_ms = float(record["epoch_ms"])
            ev.breakdown = {k: float(v) for k, v in record.items() if k.endswith("_ms") and isinstance(v, (int, float))}
        else:
            ev.failure = f"{record.get('status')}: {record.get('reason', '')}"[:200]
        return ev
