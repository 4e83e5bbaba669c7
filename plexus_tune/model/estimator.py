"""The model's Python entry points for notebooks and scripts, each a thin call of
:func:`plexus_tune.model.prediction.predict_run_grids` (every family, any communication
precision; docs/model.md): ``CostModel(machine).predict(workload, grids)`` and
:func:`predict_table`, the ranked predictions as a DataFrame.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from plexus_tune.model.costs import prediction_records
from plexus_tune.model.family import DEFAULT_FAMILY
from plexus_tune.model.machine import load_machine
from plexus_tune.model.prediction import predict_run_grids


class CostModel:
    """Estimator-style wrapper: ``CostModel(machine).predict(workload, grids)``; the settings
    are those of :func:`predict_run_grids` (default: Plexus 3D at FP32, one block)."""

    def __init__(self, machine, *, block_rows: int | None = None, comm_precision: str = "fp32",
                 algorithm: str = DEFAULT_FAMILY, optimizer: str | None = None, options: Mapping | None = None):
        self.machine = load_machine(machine)
        self.block_rows = block_rows
        self.comm_precision = comm_precision
        self.algorithm = algorithm
        self.optimizer = optimizer
        self.options = dict(options or {})

    def predict(self, workload, grids) -> dict[str, np.ndarray]:
        """Breakdown of every grid (``grids`` (K, 3), or a GPU count: all its configurations)."""
        return predict_run_grids(workload, self.machine, grids, block_rows=self.block_rows,
                                 comm_precision=self.comm_precision, algorithm=self.algorithm,
                                 optimizer=self.optimizer, options=self.options)


def predict_table(workload, machine, grids, *, top: int | None = None, **settings):
    """Ranked predictions as a pandas DataFrame (one row per grid: rank, grid and the
    prediction's keys); ``settings`` as :class:`CostModel`."""
    import pandas as pd

    pred = CostModel(machine, **settings).predict(workload, grids)
    return pd.DataFrame.from_records(prediction_records(pred, top=top))
