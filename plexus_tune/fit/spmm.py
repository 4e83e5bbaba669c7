"""Fit per-SpMM time models from (nnz, rows, common, dense_cols) timings."""

from __future__ import annotations
import math
from dataclasses import dataclass, field
import numpy as np
from plexus_tune.model import spmm as spmm_models
from plexus_tune.errors import UserError
from plexus_tune.fit.scoring import DEFAULT_SPLITS, min_rows, repeated_split_scores
from plexus_tune.fit.solvers import nnls_relative, ridge_loo
from plexus_tune.fit.tables import SPMM_COLUMNS, _where, check_frame


SPMM_KINDS = ("paper", "roofline", "learned", "learned-roofline", "learned-boosted")
#: parameters each kind estimates (the minimum number of rows is derived from it)
#: The feature set of the learned kinds (see plexus_tune.model.spmm.LEARNED_FEATURES).
LEARNED_FEATURE_SET = "log-shape-lines-polynomial"
_LEARNED_VARIABLES = spmm_models.LEARNED_FEATURES[LEARNED_FEATURE_SET]
#: The feature set of the trees of learned-boosted.
BOOSTED_FEATURE_SET = "log-shape-footprints"
SPMM_PARAMETERS = {
    "paper": 3,
    "roofline": len(spmm_models.ROOFLINE_TERMS),
    "learned": len(spmm_models.monomial_exponents(_LEARNED_VARIABLES, 2)) + 1,
    "learned-roofline": len(spmm_models.monomial_exponents(_LEARNED_VARIABLES, 2)) + 1 + len(spmm_models.ROOFLINE_TERMS),
    # trees need many more rows than parameters of the polynomial: 100 (150 rows) at least
    "learned-boosted": 100,
}
#: Gradient boosting of the learned-boosted kind (scikit-learn GradientBoostingRegressor):
#: 150 trees of depth 5, shrinkage 0.1, 80 % row subsampling, at least 5 rows per leaf.
BOOSTING = {"n_estimators": 150, "max_depth": 5, "learning_rate": 0.1, "subsample": 0.8, "min_samples_leaf": 5, "random_state": 0}
# --------------------------------------------------------------------------- SpMM


def _spmm_shapes(df) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(df[c], dtype=np.float64) for c in ("nnz", "rows", "common", "dense_cols"))


def _fit_spmm_kind(kind: str, shapes: tuple[np.ndarray, ...], y: np.ndarray, degree: int | None = None) -> dict:
    """Fit one kind on arrays; returns the model dict evaluated by spmm_models."""
    if kind == "paper":
        X = spmm_models.paper_terms(*shapes)
        coef, *_ = np.linalg.lstsq(X, y, rcond=None)
        return {"kind": "paper-spmm", "c0": float(coef[0]), "c1": float(coef[1]), "c2": float(coef[2])}
    if kind == "roofline":
        X = spmm_models.roofline_terms(*shapes)
        w = nnls_relative(X, y)
        return {
            "kind": "roofline",
            "bytes_per_element": 4,
            "coefficients": {name: float(v) for name, v in zip(spmm_models.ROOFLINE_TERMS, w)},
        }
    if kind == "learned-boosted":
        return _fit_boosted(shapes, y, _fit_spmm_kind("learned-roofline", shapes, y, degree=degree))
    if kind in ("learned", "learned-roofline"):
        base = _fit_spmm_kind("roofline", shapes, y) if kind == "learned-roofline" else None
        features = LEARNED_FEATURE_SET
        z = spmm_models.learned_features(features, *shapes)
        target = np.log(y)
        if base is not None:
            target = target - np.log(np.maximum(spmm_models.predict_spmm_ms(base, *shapes), 1e-12))
        best = None
        # degree 2, 3 or 4 (20, 55, 125 monomials of 5 variables), a higher one only with at
        # least 3 rows per monomial; exact leave-one-out picks the degree and the ridge alpha
        for deg in (2, 3, 4) if degree is None else (degree,):
            exponents = spmm_models.monomial_exponents(z.shape[1], deg)
            if degree is None and deg > 2 and len(y) < 3 * len(exponents):
                continue
            r = ridge_loo(spmm_models.polynomial_features(z, exponents), target)
            if best is None or r["loo_mse"] < best[0]["loo_mse"]:
                best = (r, deg, exponents)
        r, deg, exponents = best
        return {
            "kind": "learned",
            "features": features,
            "degree": deg,
            "exponents": exponents,
            "mean": r["mean"].tolist(),
            "scale": r["scale"].tolist(),
            "coef": r["coef"].tolist(),
            "intercept": r["intercept"],
            "ridge_alpha": r["alpha"],
            "z_min": z.min(axis=0).tolist(),
            "z_max": z.max(axis=0).tolist(),
            "base": base,
        }
    raise UserError(f"unknown SpMM model kind {kind!r}; choose one of {', '.join(SPMM_KINDS + ('auto',))}")


def _fit_boosted(shapes: tuple[np.ndarray, ...], y: np.ndarray, base: dict) -> dict:
    """Boosted trees on the learned features fitted to log(y / base(y)); the ``boosted`` dict."""
    from sklearn.ensemble import GradientBoostingRegressor

    z = spmm_models.learned_features(BOOSTED_FEATURE_SET, *shapes)
    residual = np.log(y) - np.log(np.maximum(spmm_models.predict_spmm_ms(base, *shapes), 1e-12))
    model = GradientBoostingRegressor(loss="squared_error", **BOOSTING).fit(z, residual)
    depth = int(BOOSTING["max_depth"])
    trees = [complete_tree(est.tree_, depth) for est in model.estimators_[:, 0]]
    return {
        "kind": "boosted",
        "features": BOOSTED_FEATURE_SET,
        "depth": depth,
        "learning_rate": float(BOOSTING["learning_rate"]),
        "init": float(model.init_.constant_.ravel()[0]),
        "feature": [t[0] for t in trees],
        "threshold": [t[1] for t in trees],
        "leaf": [t[2] for t in trees],
        "base": base,
    }


def complete_tree(tree, depth: int) -> tuple[list, list, list]:
    """(feature, threshold, leaf) of a scikit-learn regression tree laid out complete in heap order.

    Internal heap node i has children 2i + 1 (z <= threshold) and 2i + 2; a leaf reached
    above ``depth`` becomes padding nodes (feature 0, threshold TREE_PAD: always left)
    over copies of its value. Thresholds keep 9 significant digits (exact for the
    float32 values scikit-learn compares), leaves 7.
    """
    internal = 2**depth - 1
    feature = [0] * internal
    threshold = [spmm_models.TREE_PAD] * internal
    leaf = [0.0] * (internal + 1)

    def place(node: int, i: int, level: int) -> None:
        is_leaf = tree.children_left[node] == -1
        if level == depth:
            if not is_leaf:
                raise ValueError(f"tree deeper than {depth}")
            leaf[i - internal] = float(f"{tree.value[node].ravel()[0]:.7g}")
            return
        if is_leaf:
            place(node, 2 * i + 1, level + 1)
            place(node, 2 * i + 2, level + 1)
            return
        feature[i] = int(tree.feature[node])
        threshold[i] = float(f"{tree.threshold[node]:.9g}")
        place(int(tree.children_left[node]), 2 * i + 1, level + 1)
        place(int(tree.children_right[node]), 2 * i + 2, level + 1)

    place(0, 0, 0)
    return feature, threshold, leaf


@dataclass
class SpmmModel:
    """A fitted per-SpMM time model: ``predict(df)`` in ms, ``scores``, ``to_dict()``."""

    kind: str
    params: dict
    scores: dict = field(default_factory=dict)
    all_scores: dict = field(default_factory=dict)
    n_samples: int = 0

    def predict(self, df) -> np.ndarray:
        nnz, rows, common, k = _spmm_shapes(df)
        return spmm_models.predict_spmm_ms(self.params, nnz, rows, common, k)

    def to_dict(self) -> dict:
        """The machine profile's ``spmm`` entry (evaluated by plexus_tune.model.spmm)."""
        return dict(self.params)


def fit_spmm(df, kind: str = "auto", *, n_splits: int = DEFAULT_SPLITS, seed: int = 0, kinds=SPMM_KINDS) -> SpmmModel:
    """Fit a per-SpMM model on df (columns nnz, rows, common, dense_cols, time_ms).

    ``kind`` is one of paper, roofline, learned, learned-roofline, learned-boosted or auto (every kind in
    ``kinds`` is scored on the same ``n_splits`` random 70/30 splits and the lowest mean
    test MAPE wins). The returned model is refitted on all rows; ``scores`` holds the
    chosen kind's split scores and ``all_scores`` every scored kind's.
    """
    if kind != "auto" and kind not in SPMM_KINDS:
        raise UserError(f"unknown SpMM model kind {kind!r}; choose one of {', '.join(SPMM_KINDS + ('auto',))}")
    candidates = list(kinds) if kind == "auto" else [kind]
    need = max(min_rows(SPMM_PARAMETERS[k]) for k in candidates)
    if kind == "auto":
        # auto keeps the kinds the data can support, if at least the cheapest one
        usable = [k for k in candidates if len(df) >= min_rows(SPMM_PARAMETERS[k])]
        need = min(min_rows(SPMM_PARAMETERS[k]) for k in candidates)
        candidates = usable or candidates
    check_frame(df, SPMM_COLUMNS, positive=("rows", "common", "dense_cols", "time_ms"), min_count=need, what=f"SpMM measurements (kind {kind!r})")
    nnz = np.asarray(df["nnz"], dtype=np.float64)
    if np.any(nnz < 0):
        pos = int(np.flatnonzero(nnz < 0)[0])
        raise UserError(f"{_where(df, pos)}: nnz = {nnz[pos]:g} must be >= 0")
    shapes = _spmm_shapes(df)
    y = np.asarray(df["time_ms"], dtype=np.float64)
    all_scores = {}
    for k in candidates:

        def fit_rows(idx, k=k):
            params = _fit_spmm_kind(k, tuple(a[idx] for a in shapes), y[idx])
            return lambda rows: spmm_models.predict_spmm_ms(params, *(a[rows] for a in shapes))

        all_scores[k] = repeated_split_scores(fit_rows, y, n_splits=n_splits, seed=seed) if n_splits > 0 else {}
    if kind == "auto":
        chosen = min(candidates, key=lambda k: all_scores[k].get("test_mape", math.inf))
    else:
        chosen = kind
    params = _fit_spmm_kind(chosen, shapes, y)
    return SpmmModel(kind=chosen, params=params, scores=all_scores[chosen], all_scores=all_scores, n_samples=len(y))
