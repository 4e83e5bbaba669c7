"""Joint model-driven search over algorithm families and GPU counts: the planner's joint ranking
(:func:`plexus_tune.model.planner.joint_ranking`) at every count, ranked by the search's
objective (docs/model.md, Planner)."""

from __future__ import annotations

import time

from plexus_tune.errors import UserError
from plexus_tune.measure.campaign import graph_source_text
from plexus_tune.measure.families import configuration_label, measure_configurations, trained_families
from plexus_tune.report.families import observed_rows
from plexus_tune.model.planner import Ranking, check_choices, joint_ranking, joint_space_size
from plexus_tune.model.family import family_names, family_of
from plexus_tune.search.space import check_objective, objective_value


#: Most configurations :func:`search_ranking` evaluates (about a minute on a 2-core host).
MAX_SEARCH_CONFIGURATIONS = 20_000


def search_ranking(workload, machine, gpus_counts, *, objective: str = "epoch", algorithms=None,
                   precisions=("fp32",), graph=None, seed: int = 0, replication=None, aggregation=None,
                   schedule=None, fixed_features: bool = False) -> Ranking:
    """:func:`joint_ranking` over several GPU counts, ranked by ``objective`` (epoch time, or
    GPU-hours per 100 epochs: :func:`plexus_tune.search.space.objective_value`'s formula,
    ``objective_value`` in each record). Exact; UserError past
    :data:`MAX_SEARCH_CONFIGURATIONS`."""
    check_objective(objective)
    algorithms = tuple(algorithms or family_names())
    counts = [int(g) for g in gpus_counts]
    fixed = {k: v for k, v in (("replication", replication), ("aggregation", aggregation), ("schedule", schedule))
             if v is not None}
    total = sum(joint_space_size(g, len(precisions), algorithms, **fixed)["total"] for g in counts)
    if total > MAX_SEARCH_CONFIGURATIONS:
        raise UserError(f"{total:,} configurations over {len(counts)} GPU counts is more than the exact planner "
                        f"evaluates ({MAX_SEARCH_CONFIGURATIONS:,}); give powers of two (A..B:pow2) or a list of counts")
    start = time.perf_counter()
    records: list[dict] = []
    estimated: set = set()
    refused = None
    for g in counts:
        try:
            check_choices(g, algorithms, fixed)
        except UserError as exc:
            refused = exc  # a choice this count does not allow (e.g. c must divide G, c c <= G)
            continue
        part = joint_ranking(workload, machine, g, algorithms=algorithms, precisions=precisions, graph=graph, seed=seed,
                             replication=replication, aggregation=aggregation, schedule=schedule,
                             fixed_features=fixed_features)
        records += part.records
        estimated.update(part.estimated_families)
    if not records:
        raise UserError(f"no GPU count of the range allows the chosen options ({refused}); choose counts they allow")
    for rec in records:
        rec["objective_value"] = float(objective_value(rec["total_ms"], rec["gpus"], objective))
    records.sort(key=lambda r: (not r["feasible"], r["objective_value"]))
    for rank, rec in enumerate(records, start=1):
        rec["rank"] = rank
    return Ranking(records, counts[0] if len(counts) == 1 else tuple(counts), tuple(precisions), tuple(algorithms),
                   time.perf_counter() - start, tuple(f for f in algorithms if f in estimated))


def measured_joint_search(ranking: Ranking, graph: str, *, log, count: int = 10, trials: int = 1, epochs: int = 6,
                          warmup: int = 2, layers: int = 3, hidden: int = 128, batch: int = 4, launcher=None,
                          timeout_s: float = 900.0, on_result=None) -> list[dict]:
    """Measure the joint space's most promising configurations, model-ranked first.

    The first ``count`` feasible records of ``ranking`` (any family the trainer runs, any
    precision and GPU count, in the model's order) are trained ``trials`` times each on
    ``graph`` through the campaign code and ``launcher``
    (:func:`plexus_tune.measure.families.measure_configurations`; runs already in ``log``
    are reused). Returns one row per measured configuration, in the model's order: the
    ranked record (``total_ms`` predicted), ``epoch_ms`` (observed: the median over its successful trials in ``log``, nan if
    none) and ``trials_ok``; families without a trainer are skipped.
    """
    if count < 1:
        raise UserError(f"the number of configurations to measure must be at least 1, got {count}")
    trained = set(trained_families())
    chosen = [r for r in ranking.records if r["feasible"] and r["algorithm"] in trained][:count]
    if not chosen:
        raise UserError("no feasible configuration of a family the trainer runs; allow more GPUs or other families")

    def options_of(rec):
        return {k: rec[k] for k in family_of(rec["algorithm"]).identity_options if rec.get(k) is not None}

    configs = [(r["algorithm"], (r["gx"], r["gy"], r["gz"]), options_of(r), r["comm_precision"]) for r in chosen]
    measure_configurations(graph, configs, log=log, trials=trials, epochs=epochs, warmup=warmup, layers=layers,
                           hidden=hidden, batch=batch, launcher=launcher, timeout_s=timeout_s, on_result=on_result)
    source, _, _ = graph_source_text(graph)
    observed = {}
    for gpus in sorted({r["gpus"] for r in chosen}):
        observed.update({row["label"]: row for row in observed_rows(log, source, gpus=gpus)})
    out = []
    for rec, (family, grid, options, precision) in zip(chosen, configs):
        row = observed.get(configuration_label(family, grid, options, precision))
        out.append({**rec, "label": configuration_label(family, grid, options, precision),
                    "epoch_ms": float("nan") if row is None else row["epoch_ms"],
                    "trials_ok": 0 if row is None else row["trials"]})
    return out
