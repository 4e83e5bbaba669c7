"""Fit and score per-SpMM time models (the kinds of :mod:`plexus_tune.model.spmm`) from timings."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.fit.scoring import (DEFAULT_SPLITS, MIN_SPLITS, R2_SEM, TRAIN_FRACTION, min_rows, race_split_scores,
                                     repeated_split_scores, split_cap)
from plexus_tune.fit.tables import SPMM_COLUMNS, _where, check_frame
from plexus_tune.model.sparsity import SHARE_POINTS, STRUCTURE_KEYS, check_structure, structure_arrays
from plexus_tune.fit.spmm_kinds import fit_kind
from plexus_tune.model.spmm import FIT_KINDS, SPMM_MODELS, SpmmKind

#: the kinds ``fit_spmm`` fits and scores, cheapest first (names as in profiles)
SPMM_KINDS = FIT_KINDS
#: parameters each kind estimates (the minimum number of rows is derived from it)
SPMM_PARAMETERS = {kind: SPMM_MODELS[kind].n_parameters for kind in SPMM_KINDS}


def spmm_shapes(df) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(df[c], dtype=np.float64) for c in ("nnz", "rows", "common", "dense_cols"))


def spmm_structure(df) -> dict | None:
    """The sparsity structure of each measured operand (arrays of :mod:`plexus_tune.model.sparsity`).

    A record's ``structure`` field (flattened to ``structure.<key>`` columns) gives it;
    a record without one timed uniformly random nonzeros (:func:`uniform_structure`). A
    structure without its ``column_share`` curve is refused. None when no record has a
    structure (every operand uniform).
    """
    present = [c for c in df.columns if str(c).startswith("structure.")]
    if not present:
        return None
    fast = _checked_structure_columns(df, present)
    if fast is not None:
        return fast
    records = []
    curves = df["structure.column_share"].tolist() if "structure.column_share" in df.columns else [None] * len(df)
    for pos in range(len(df)):
        curve = curves[pos]
        has_any = any(_is_value(df[c].iloc[pos]) for c in present)
        if not has_any:
            records.append(None)
            continue
        if not isinstance(curve, (list, tuple, np.ndarray)):
            raise UserError(f"{_where(df, pos)}: its structure has no 'column_share' curve; add the structure "
                            "statistics of its operand (plexus-tune calibrate spmm records them, docs/records.md)")
        entry = {key: df[f"structure.{key}"].iloc[pos] if f"structure.{key}" in df.columns else None for key in STRUCTURE_KEYS}
        entry["column_share"] = list(curve)
        records.append(check_structure(entry, _where(df, pos)))
    shapes = spmm_shapes(df)
    return structure_arrays(records, shapes[0], shapes[1], shapes[2])


def _checked_structure_columns(df, present) -> dict | None:
    """The arrays of :func:`spmm_structure` built column by column when every record with a
    structure holds a valid one (each checked as :func:`check_structure` does; a record
    without one: :func:`uniform_structure`), else None (the record-by-record path then
    names the first bad one)."""
    if "structure.column_share" not in df.columns or any(f"structure.{key}" not in df.columns for key in STRUCTURE_KEYS):
        return None
    has = np.zeros(len(df), dtype=bool)
    for c in present:
        has |= df[c].notna().to_numpy()
    given = df[has]
    out = {}
    for key in STRUCTURE_KEYS[:3]:
        column = given[f"structure.{key}"]
        if column.dtype.kind not in "fiuO" or column.dtype.kind == "b":
            return None
        if column.dtype.kind == "O" and not all(type(v) in (int, float) for v in column.tolist()):
            return None  # booleans, strings, missing values: checked record by record
        values = column.to_numpy(dtype=np.float64)
        if not np.all(np.isfinite(values)) or np.any(values < 0):
            return None
        out[key] = values
    curves = given["structure.column_share"].tolist()
    if not all(isinstance(c, (list, tuple, np.ndarray)) and len(c) == SHARE_POINTS for c in curves):
        return None
    try:
        share = np.array(curves, dtype=np.float64).reshape(len(curves), SHARE_POINTS)
    except (TypeError, ValueError):
        return None
    if not np.all(np.isfinite(share)) or share.min(initial=0.0) < 0 or share.max(initial=0.0) > 1 + 1e-9:
        return None
    out["column_share"] = share
    if np.all(has):
        return out
    nnz, rows, common, _ = spmm_shapes(df[~has])
    uniform = structure_arrays([None] * int((~has).sum()), nnz, rows, common)
    merged = {}
    for key, values in out.items():
        full = np.empty((len(df),) + values.shape[1:], dtype=np.float64)
        full[has], full[~has] = values, uniform[key].reshape((-1,) + values.shape[1:])
        merged[key] = full
    return merged


def _is_value(value) -> bool:
    if isinstance(value, (list, tuple, np.ndarray, dict)):
        return True
    try:
        return value is not None and not (isinstance(value, float) and math.isnan(value))
    except TypeError:
        return True


def _unknown_kind(kind) -> UserError:
    hint = "; 'paper' keeps the paper's coefficients, its fitted per-SpMM form is 'paper-spmm'" if kind == "paper" else ""
    return UserError(f"unknown SpMM model kind {kind!r} to fit; choose one of {', '.join(SPMM_KINDS + ('auto',))}{hint}")


def check_kind(kind: str) -> str:
    """``kind`` if fit_spmm can fit it (a name of :data:`SPMM_KINDS` or auto), else UserError listing them."""
    if kind != "auto" and kind not in SPMM_KINDS:
        raise _unknown_kind(kind)
    return kind


@dataclass
class SpmmModel:
    """A fitted per-SpMM time model: ``predict(df)`` in ms, ``scores``, ``to_dict()``.

    ``model`` is the fitted kind (:class:`plexus_tune.model.spmm.SpmmKind`), ``scores``
    its held-out scores and ``all_scores`` those of every kind scored beside it.
    """

    kind: str
    model: SpmmKind
    scores: dict = field(default_factory=dict)
    all_scores: dict = field(default_factory=dict)
    n_samples: int = 0

    @property
    def params(self) -> dict:
        return self.model.to_dict()

    def predict(self, df) -> np.ndarray:
        if self.model.uses_structure:
            return np.asarray(self.model.predict(*spmm_shapes(df), spmm_structure(df)), dtype=np.float64)
        return np.asarray(self.model.predict(*spmm_shapes(df)), dtype=np.float64)

    def to_dict(self) -> dict:
        """The machine profile's ``spmm`` entry (evaluated by plexus_tune.model.spmm)."""
        return self.model.to_dict()


def _rows_of(structure: dict | None, idx) -> dict | None:
    return None if structure is None else {key: value[idx] for key, value in structure.items()}


def _fitter(cls: type[SpmmKind], shapes: tuple[np.ndarray, ...], y: np.ndarray, structure: dict | None = None) -> Callable:
    """fit(train rows) -> predict(rows) for repeated_split_scores (picklable: no local state but arrays)."""

    def fit_rows(idx):
        model = fit_kind(cls, tuple(a[idx] for a in shapes), y[idx], _rows_of(structure, idx))
        if cls.uses_structure:
            return lambda rows: model.predict(*(a[rows] for a in shapes), _rows_of(structure, rows))
        return lambda rows: model.predict(*(a[rows] for a in shapes))

    return fit_rows


def fit_spmm(
    df,
    kind: str = "auto",
    *,
    n_splits: int = DEFAULT_SPLITS,
    seed: int = 0,
    kinds=None,
    r2_sem: float | None = R2_SEM,
    min_splits: int = MIN_SPLITS,
    n_jobs: int = 1,
    progress: Callable[[str, int, int], None] | None = None,
) -> SpmmModel:
    """Fit a per-SpMM model on df (columns nnz, rows, common, dense_cols, time_ms).

    ``kind`` is one of :data:`SPMM_KINDS` (paper-spmm, roofline, learned,
    learned-roofline, learned-boosted) or auto. Every kind in ``kinds`` (default: all
    for auto, else ``kind`` alone) that the data supports is scored on the same random
    70/30 splits: at most ``n_splits``, fewer once the standard error of the mean
    held-out R^2 is at most ``r2_sem``, or once more splits could shrink its standard
    error by at most 2.5 % (:func:`plexus_tune.fit.scoring.split_cap`: 50 splits; see
    :func:`plexus_tune.fit.scoring.repeated_split_scores`; None scores all). auto
    keeps the kind of lowest mean held-out MAPE; the kinds are raced
    (:func:`plexus_tune.fit.scoring.race_split_scores`): one whose MAPE trails the best
    kind's on the same splits by more than :data:`plexus_tune.fit.scoring.RACE_SEMS`
    standard errors of the paired difference stops being scored (``beaten`` in its scores). The returned model is refitted on all
    rows; ``scores`` holds the chosen kind's split scores and ``all_scores`` every
    scored kind's. ``progress(kind, done, total)`` reports the splits scored.
    """
    check_kind(kind)
    if n_splits < 0:
        raise UserError(f"the number of splits must be >= 0, got {n_splits}")
    compared = list(SPMM_KINDS if kind == "auto" else (kind,)) if kinds is None else list(kinds)
    for k in compared:
        if k not in SPMM_KINDS:
            raise _unknown_kind(k)
    if kind == "auto":
        # auto keeps the kinds the data can support, if at least the cheapest one
        need = min(min_rows(SPMM_PARAMETERS[k]) for k in compared)
    else:
        need = min_rows(SPMM_PARAMETERS[kind])
    check_frame(df, SPMM_COLUMNS, positive=("rows", "common", "dense_cols", "time_ms"), min_count=need, what=f"SpMM measurements (kind {kind!r})")
    nnz = np.asarray(df["nnz"], dtype=np.float64)
    if np.any(nnz < 0):
        pos = int(np.flatnonzero(nnz < 0)[0])
        raise UserError(f"{_where(df, pos)}: nnz = {nnz[pos]:g} must be >= 0")
    candidates = [k for k in compared if len(df) >= min_rows(SPMM_PARAMETERS[k])]
    if kind != "auto" and kind not in candidates:
        candidates.append(kind)
    shapes = spmm_shapes(df)
    structure = None
    if any(SPMM_MODELS[k].uses_structure for k in candidates):
        try:
            structure = spmm_structure(df)
        except UserError:
            if kind != "auto" and SPMM_MODELS[kind].uses_structure:
                raise
            # the kinds compared are those the records support: none that reads structure here
            candidates = [k for k in candidates if not SPMM_MODELS[k].uses_structure]
    y = np.asarray(df["time_ms"], dtype=np.float64)
    if structure is None and any(SPMM_MODELS[k].uses_structure for k in candidates):
        # every operand uniformly random: its expected structure, once per row
        structure = structure_arrays([None] * len(y), *shapes[:3])
    cap = split_cap(TRAIN_FRACTION) if r2_sem else None
    if n_splits == 0:
        all_scores = {k: {} for k in candidates}
    elif kind == "auto":
        # a kind stops being scored once it trails the best on the same splits (its splits are then fewer)
        all_scores = race_split_scores({k: _fitter(SPMM_MODELS[k], shapes, y, structure) for k in candidates}, y,
                                       n_splits=n_splits, seed=seed, r2_sem=r2_sem, min_splits=min_splits, n_jobs=n_jobs,
                                       progress=progress, cap=cap)
    else:  # a kind given: it and the kinds compared with it, each scored in full
        all_scores = {k: repeated_split_scores(_fitter(SPMM_MODELS[k], shapes, y, structure), y, n_splits=n_splits, seed=seed,
                                               r2_sem=r2_sem, min_splits=min_splits, n_jobs=n_jobs, cap=cap,
                                               progress=None if progress is None else (lambda done, total, k=k: progress(k, done, total)))
                      for k in candidates}
    chosen = min(candidates, key=lambda k: all_scores[k].get("test_mape", math.inf)) if kind == "auto" else kind
    model = fit_kind(SPMM_MODELS[chosen], shapes, y, structure)
    return SpmmModel(kind=chosen, model=model, scores=all_scores[chosen], all_scores=all_scores, n_samples=len(y))
