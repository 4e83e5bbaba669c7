"""Fit machine-profile parameters from measurement logs, scikit-learn style: each ``fit_*`` takes a
DataFrame and returns a model with ``predict``, ``scores`` and ``to_dict``; :func:`fit_profile`
turns logs into a whole machine profile (see docs/architecture.md)."""

from __future__ import annotations

from plexus_tune.fit.tables import (  # noqa: F401
    SPMM_COLUMNS,
    COLLECTIVE_COLUMNS,
    GEMM_COLUMNS,
    COLLECTIVE_OPS,
    check_frame,
    load_table,
    pd_numeric,
)
from plexus_tune.fit.scoring import (  # noqa: F401
    DEFAULT_SPLITS,
    TRAIN_FRACTION,
    R2_SEM,
    MIN_SPLITS,
    min_rows,
    regression_scores,
    single_threaded_blas,
    split_indices,
    repeated_split_scores,
)
from plexus_tune.fit.solvers import (  # noqa: F401
    RIDGE_ALPHAS,
    nnls_relative,
    ridge_loo,
)
from plexus_tune.fit.spmm import (  # noqa: F401
    SPMM_KINDS,
    LEARNED_FEATURE_SET,
    BOOSTED_FEATURE_SET,
    SPMM_PARAMETERS,
    BOOSTING,
    complete_tree,
    exported_trees,
    SpmmModel,
    fit_spmm,
)
from plexus_tune.fit.collectives import (  # noqa: F401
    COLLECTIVE_FORMS,
    ring_terms,
    bus_bandwidth_gbps,
    CollectiveModel,
    MAX_BETA_GBPS,
    collective_time_sharing,
    fit_collectives,
    no_worse,
)
from plexus_tune.fit.gemm import (  # noqa: F401
    GemmModel,
    fit_gemm,
)
from plexus_tune.fit.epoch import (  # noqa: F401
    EPOCH_COMPONENTS,
    EpochModel,
    fit_epoch,
    scores_table_rows,
)
from plexus_tune.fit.quant import (  # noqa: F401
    fit_call_ms,
    fit_quant_rates,
    split_precisions,
)
from plexus_tune.fit.profile import (  # noqa: F401
    MIN_SCALE,
    FittedProfile,
    fit_profile,
    load_tables,
    scale_spmm_entry,
    apply_epoch_fit,
    json_copy,
    profile_json_text,
    write_profile,
)
