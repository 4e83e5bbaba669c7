"""Joint model-driven search over algorithm families and GPU counts: the planner's joint ranking
(:func:`plexus_tune.model.planner.joint_ranking`) at every count, ranked by the search's
objective (docs/model.md, Planner)."""

from __future__ import annotations

import time

from plexus_tune.errors import UserError
from plexus_tune.model.planner import Ranking, check_choices, joint_ranking, joint_space_size
from plexus_tune.model.family import family_names
from plexus_tune.search.space import check_objective, objective_value


#: Most configurations :func:`search_ranking` evaluates (about a minute on a 2-core host).
MAX_SEARCH_CONFIGURATIONS = 20_000


def search_ranking(workload, machine, gpus_counts, *, objective: str = "epoch", algorithms=None,
                   precisions=("fp32",), graph=None, seed: int = 0, replication=None, aggregation=None) -> Ranking:
    """:func:`joint_ranking` over several GPU counts, ranked by ``objective`` (epoch time, or
    GPU-hours per 100 epochs: :func:`plexus_tune.search.space.objective_value`'s formula,
    ``objective_value`` in each record). Exact; UserError past
    :data:`MAX_SEARCH_CONFIGURATIONS`."""
    check_objective(objective)
    algorithms = tuple(algorithms or family_names())
    counts = [int(g) for g in gpus_counts]
    fixed = {k: v for k, v in (("replication", replication), ("aggregation", aggregation)) if v is not None}
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
                             replication=replication, aggregation=aggregation)
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
