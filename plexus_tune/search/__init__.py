"""Search grids, GPU counts and blocking with Optuna, model-driven or measured (see docs/architecture.md)."""

from __future__ import annotations

from plexus_tune.search.space import (  # noqa: F401
    OBJECTIVES,
    GPU_HOURS_EPOCHS,
    MS_PER_HOUR,
    CONSTRAINT_KEY,
    check_objective,
    objective_value,
    objective_unit,
    parse_gpus,
    divisors,
    nearest_divisor,
    decode_grid,
    encode_grid,
    snap_gpus,
    SIZE_PARAMS,
    Config,
    ENCODINGS,
    SearchSpace,
)
from plexus_tune.search.evaluate import (  # noqa: F401
    Evaluation,
    ModelEvaluator,
    exhaustive_frame,
    exhaustive_optimum,
)
from plexus_tune.search.study import (  # noqa: F401
    default_storage_url,
    open_storage,
    make_sampler,
    open_study,
    finished_trials,
    Objective,
    warm_start,
    spread_starts,
    run_search,
    trials_frame,
    best_configs,
    trials_to_reach,
    default_study_name,
)
from plexus_tune.search.measured import (  # noqa: F401
    graph_workload,
    known_runs,
    MeasuredEvaluator,
)
