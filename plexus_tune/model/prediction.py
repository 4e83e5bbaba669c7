"""The prediction of one run: the cost model evaluated at every setting of the run's identity.

A run is fixed by its workload (N, NNZ, widths D_0..D_L, element size), its
configuration (algorithm family and grid), block rows, overlap and communication
precision, and the machine profile that predicts it. :func:`predict_run` is the only
place that turns those settings into a prediction; every command that logs, compares,
validates or plots a prediction of a run calls it, so a logged prediction is what
``plexus-tune predict`` gives for the same settings (docs/model.md, Epoch time).

The family of a run is a :class:`plexus_tune.model.family.Family` of the registry; its
``predict`` returns arrays with the keys of :data:`plexus_tune.model.costs.PREDICTION_KEYS`.

``overlap`` (the trainer's all-reduce of a row block overlapped with the next block's
SpMM) is credited by the families that have it (plexus-3d: docs/model.md, "Overlap");
``fixed_features`` (input features not trained) by every family.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from plexus_tune.model.comm_precision import CommPrecision, parse_comm_precision
from plexus_tune.model.breakdown import BREAKDOWN_KEYS, TOTAL_PARTS
from plexus_tune.model.family import DEFAULT_FAMILY, family_of
from plexus_tune.model.machine import Machine, load_machine
from plexus_tune.model.sparsity import graph_sparsity

__all__ = ["BREAKDOWN_KEYS", "DEFAULT_ALGORITHM", "PREDICTED_TIME_KEYS", "TOTAL_PARTS",
           "predict_run", "predict_run_grids", "prediction_of"]

#: The family of a run that names none: the Plexus 3D grid.
DEFAULT_ALGORITHM = DEFAULT_FAMILY

#: The times of a run's prediction, in report order (ms per epoch): its parts, the
#: fixed overhead, and their sum ``total_ms``.
PREDICTED_TIME_KEYS = (*BREAKDOWN_KEYS, "overhead_ms", "total_ms")


def predict_run_grids(workload, machine, grids, *, block_rows: int | None = None, overlap: bool = False,
                      comm_precision: str | CommPrecision | None = "fp32", algorithm: str | None = DEFAULT_ALGORITHM,
                      optimizer: str | None = None, options: Mapping | None = None,
                      fixed_features: bool = False) -> dict[str, np.ndarray]:
    """The predictions of runs that differ only in their grid: the family's model at the run's settings.

    Arrays with the keys of :data:`plexus_tune.model.costs.PREDICTION_KEYS`, one entry per
    row of ``grids`` ((K, 3) or a GPU count: all its grids). Arguments as
    :func:`predict_run`.
    """
    machine = machine if isinstance(machine, Machine) else load_machine(machine)
    choice = comm_precision if isinstance(comm_precision, CommPrecision) else parse_comm_precision(comm_precision or "fp32")
    options = dict(options or {})
    if overlap:
        options["overlap"] = True  # a family without overlap refuses it
    if fixed_features:
        options["fixed_features"] = True
    family = family_of(algorithm)
    if np.ndim(grids) == 0:  # a GPU count: every configuration of it
        grids = family.configurations(int(grids))
    return family.predict(workload, machine, grids, block_rows=int(block_rows) if block_rows else None,
                                        comm_precision=choice, optimizer=optimizer, options=options)


def predict_run(workload, machine, grid, *, block_rows: int | None = None, overlap: bool = False,
                comm_precision: str | CommPrecision | None = "fp32", algorithm: str | None = DEFAULT_ALGORITHM,
                optimizer: str | None = None, options: Mapping | None = None, fixed_features: bool = False) -> dict:
    """The prediction of one run, plain Python values (JSON-ready).

    Keys: :data:`PREDICTED_TIME_KEYS` (floats, ms per epoch; the parts in
    :data:`TOTAL_PARTS` add up to ``total_ms``), ``memory_bytes`` (int, per GPU),
    ``feasible`` (bool: fits the machine's usable memory), ``machine`` (the profile's
    name) and ``algorithm``. ``grid`` is (Gx, Gy, Gz); ``block_rows`` None or 0 means
    one block; ``comm_precision`` is the per-class choice of
    :func:`plexus_tune.model.comm_precision.parse_comm_precision`; ``optimizer`` names the
    optimizer step (:data:`plexus_tune.model.other.OPTIMIZER_ACCESSES`; default the
    machine's); ``options`` are the family's own settings (none for Plexus 3D).
    ``overlap`` and ``fixed_features`` as in the module docstring.
    """
    machine = machine if isinstance(machine, Machine) else load_machine(machine)
    grids = np.asarray([tuple(int(g) for g in grid)], dtype=np.int64)
    pred = predict_run_grids(workload, machine, grids, block_rows=block_rows, overlap=overlap,
                             comm_precision=comm_precision, algorithm=algorithm, optimizer=optimizer, options=options,
                             fixed_features=fixed_features)
    return prediction_of(pred, 0, machine=machine.name, algorithm=algorithm or DEFAULT_ALGORITHM)


def prediction_of(pred: Mapping, index: int, *, machine: str, algorithm: str = DEFAULT_ALGORITHM) -> dict:
    """Entry ``index`` of vectorized predictions as the plain record of :func:`predict_run`."""
    out: dict = {key: float(pred[key][index]) for key in PREDICTED_TIME_KEYS}
    out["memory_bytes"] = int(round(float(pred["memory_bytes"][index])))
    out["feasible"] = bool(pred["feasible"][index])
    out["machine"] = machine
    out["algorithm"] = algorithm
    return out


def permutation_gain(graph, workload, machine, grid, modes, *, block_rows=None, comm_precision="fp32",
                     optimizer=None, cache=None, sample=None, store_permutations: bool = False) -> dict:
    """``{mode: {"spmm_ms", "total_ms"}}`` of one grid with the graph's shards after each permutation mode
    (``cache``: the graph's :class:`plexus_tune.graph.cache.StructureCache`; ``sample``: graph_sparsity's)."""
    out = {}
    for mode in modes:
        sparsity = graph_sparsity(graph, [grid], workload.layers, permute=mode, cache=cache, sample=sample,
                                  store_permutations=store_permutations)
        pred = predict_run_grids(workload, machine, np.asarray([grid]), block_rows=block_rows, comm_precision=comm_precision,
                                 optimizer=optimizer, options={"sparsity": sparsity})
        out[mode] = {"spmm_ms": float(pred["spmm_ms"][0]), "total_ms": float(pred["total_ms"][0])}
    return out
