"""The estimators of the per-SpMM kinds: one function per fitted kind of
:data:`plexus_tune.model.spmm.SPMM_MODELS`, which estimates its coefficients from
timings (least squares, NNLS, ridge with leave-one-out, scikit-learn's gradient-boosted
trees exported as complete trees) and returns the kind holding them; the model stage
only evaluates them. Formulas: docs/model.md (SpMM kinds).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.fit.scoring import single_threaded_blas
from plexus_tune.fit.solvers import nnls_relative, ridge_loo
from plexus_tune.model.spmm import (
    LEARNED_MIN_DEGREE,
    ROOFLINE_TERMS,
    SPMM_MODELS,
    TINY_MS,
    TREE_PAD,
    Learned,
    LearnedBoosted,
    LearnedRoofline,
    PaperSpmm,
    Roofline,
    SpmmKind,
    StructureBoosted,
    base_log_ms,
    learned_features,
    monomial_exponents,
    paper_terms,
    polynomial_features,
    roofline_terms,
    structure_features,
)

#: Polynomial degrees the learned kinds choose from by leave-one-out error.
LEARNED_DEGREES = (LEARNED_MIN_DEGREE, 3, 4)
#: Gradient boosting of ``learned-boosted`` (scikit-learn HistGradientBoostingRegressor):
#: 150 trees of depth 5, shrinkage 0.1, at least 5 rows per leaf, no early stopping.
BOOSTING = {"max_iter": 150, "max_depth": 5, "learning_rate": 0.1, "min_samples_leaf": 5, "max_leaf_nodes": None,
            "early_stopping": False, "random_state": 0}
#: Gradient boosting of ``structure-boosted``: as :data:`BOOSTING` with trees of depth 4.
STRUCTURE_BOOSTING = {**BOOSTING, "max_depth": 4}
#: Cache sizes (bytes) the ``structure-boosted`` kind chooses from (by its base's fit error).
CACHE_BYTES_CANDIDATES = tuple(2**20 * m for m in (8, 16, 32, 64, 128))


def fit_arrays(shapes, time_ms) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """``shapes = (nnz, rows, common, dense_cols)`` and ``time_ms`` as float64 arrays of one length."""
    shapes = tuple(np.asarray(a, dtype=np.float64) for a in shapes)
    y = np.asarray(time_ms, dtype=np.float64)
    if len(shapes) != 4 or any(a.shape != y.shape for a in shapes) or y.ndim != 1:
        raise ValueError("fit takes shapes = (nnz, rows, common, dense_cols), four arrays as long as time_ms")
    return shapes, y


def fit_paper_spmm(shapes, time_ms) -> PaperSpmm:
    """c0, c1, c2 of ``paper-spmm`` by least squares."""
    shapes, y = fit_arrays(shapes, time_ms)
    coef, *_ = np.linalg.lstsq(paper_terms(*shapes), y, rcond=None)
    return PaperSpmm(*(float(c) for c in coef))


def fit_roofline(shapes, time_ms, *, bytes_per_element: float = 4) -> Roofline:
    """The non-negative costs of the roofline terms minimizing the relative error (NNLS)."""
    shapes, y = fit_arrays(shapes, time_ms)
    w = nnls_relative(roofline_terms(*shapes, bytes_per_element), y)
    return Roofline({name: float(v) for name, v in zip(ROOFLINE_TERMS, w)}, bytes_per_element)


def _fit_log_correction(model: Learned, shapes, target: np.ndarray, degrees=LEARNED_DEGREES) -> Learned:
    """The learned kinds' polynomial in log time fitted to ``target``: the degree of least leave-one-out error."""
    z = learned_features(model.features, *shapes)
    best = None
    # the lowest degree always; a higher one only with at least 3 rows per monomial
    for deg in degrees:
        exponents = monomial_exponents(z.shape[1], deg)
        if deg > degrees[0] and len(target) < 3 * len(exponents):
            continue
        r = ridge_loo(polynomial_features(z, exponents), target)
        if best is None or r["loo_mse"] < best[0]["loo_mse"]:
            best = (r, deg, exponents)
    r, deg, exponents = best
    model.degree, model.exponents = deg, exponents
    model.mean, model.scale, model.coef = r["mean"], r["scale"], r["coef"]
    model.intercept, model.ridge_alpha = float(r["intercept"]), float(r["alpha"])
    model.z_min, model.z_max = z.min(axis=0), z.max(axis=0)
    return model


def fit_learned(shapes, time_ms, *, degrees=LEARNED_DEGREES) -> Learned:
    """``learned``: ridge on monomials of the log shapes, fitted to log t."""
    shapes, y = fit_arrays(shapes, time_ms)
    return _fit_log_correction(Learned(), shapes, np.log(y), degrees)


def fit_learned_roofline(shapes, time_ms, *, degrees=LEARNED_DEGREES) -> LearnedRoofline:
    """``learned-roofline``: a roofline, then ``learned`` fitted to log(t / roofline(t))."""
    shapes, y = fit_arrays(shapes, time_ms)
    model = LearnedRoofline()
    model.base = fit_roofline(shapes, y)
    return _fit_log_correction(model, shapes, np.log(y) - base_log_ms(model.base, shapes), degrees)


def _boosted_trees(z: np.ndarray, residual: np.ndarray, boosting: Mapping) -> tuple[int, float, float, tuple]:
    """(depth, learning rate, init, (feature, threshold, leaf) arrays) of trees boosted on the residual."""
    import sklearn
    from sklearn.ensemble import HistGradientBoostingRegressor

    if not (np.all(np.isfinite(z)) and np.all(np.isfinite(residual))):
        raise ValueError("boosted trees need finite features and log times")
    # the inputs are checked above: skip scikit-learn's own checks. One OpenMP thread: on a few
    # thousand rows threads only wait for each other (on a loaded host, each fit 40x longer);
    # limited here, once scikit-learn has loaded its OpenMP runtime, which a limit set earlier misses
    with sklearn.config_context(assume_finite=True, skip_parameter_validation=True), single_threaded_blas():
        hgb = HistGradientBoostingRegressor(loss="squared_error", **boosting).fit(z, residual)
    depth = int(boosting["max_depth"])
    init, trees = exported_trees(hgb, depth)
    arrays = tuple(np.array(part, dtype=dtype) for part, dtype in zip(trees, (np.int64, np.float64, np.float64)))
    return depth, float(boosting["learning_rate"]), init, arrays


def fit_learned_boosted(shapes, time_ms, *, boosting: Mapping = BOOSTING) -> LearnedBoosted:
    """``learned-boosted``: a ``learned-roofline``, corrected in log time by boosted trees."""
    shapes, y = fit_arrays(shapes, time_ms)
    model = LearnedBoosted()
    model.base = fit_learned_roofline(shapes, y)
    z = learned_features(model.features, *shapes)
    residual = np.log(y) - base_log_ms(model.base, shapes)
    model.depth, model.learning_rate, model.init, (model.feature, model.threshold, model.leaf) = _boosted_trees(
        z, residual, boosting)
    return model


def fit_structure_boosted(shapes, time_ms, structure=None, *, boosting: Mapping = STRUCTURE_BOOSTING,
                          bytes_per_element: float = 4) -> StructureBoosted:
    """``structure-boosted``: the cache-aware roofline of the cache size (of
    :data:`CACHE_BYTES_CANDIDATES`) with the least relative error, corrected by boosted trees."""
    shapes, y = fit_arrays(shapes, time_ms)
    model = StructureBoosted(bytes_per_element=bytes_per_element)
    best = None
    for cache in CACHE_BYTES_CANDIDATES:
        terms, z = structure_features(*shapes, structure, cache_bytes=cache, bytes_per_element=bytes_per_element)
        w = nnls_relative(terms, y)
        err = float(np.mean(((terms @ w) / y - 1.0) ** 2))
        if best is None or err < best[0]:
            best = (err, cache, w, terms, z)
    _, model.cache_bytes, w, terms, z = best
    model.coefficients = w
    residual = np.log(y) - np.log(np.maximum(terms @ w, TINY_MS))
    if not (np.all(np.isfinite(z)) and np.all(np.isfinite(residual))):
        raise ValueError("boosted trees need finite features and log times")
    model.z_min, model.z_max = z.min(axis=0), z.max(axis=0)
    model.depth, model.learning_rate, model.init, (model.feature, model.threshold, model.leaf) = _boosted_trees(
        z, residual, boosting)
    return model


def exported_trees(hgb, depth: int) -> tuple[float, tuple[list, list, list]]:
    """(init, (features, thresholds, leaves)) of a fitted HistGradientBoostingRegressor.

    Each tree is laid out complete in heap order by :func:`complete_tree`; its leaves are
    divided by the learning rate, so that init + learning_rate * sum(leaves) is the
    regressor's own prediction. The trees come from scikit-learn's fitted predictors
    (``_predictors``, ``_baseline_prediction``): a scikit-learn without them is refused.
    """
    try:
        predictors, baseline = hgb._predictors, hgb._baseline_prediction
    except AttributeError:  # pragma: no cover - a scikit-learn that stores its trees elsewhere
        raise UserError("this scikit-learn does not expose the trees of HistGradientBoostingRegressor; "
                        "install a scikit-learn between 1.3 and 1.9") from None
    rate = float(hgb.learning_rate)
    trees = [complete_tree(stage[0].nodes, depth, rate) for stage in predictors]
    return float(np.ravel(baseline)[0]), tuple([t[k] for t in trees] for k in range(3))


def complete_tree(nodes, depth: int, learning_rate: float) -> tuple[list, list, list]:
    """(feature, threshold, leaf / learning_rate) of one HistGradientBoosting tree, complete in heap order.

    ``nodes`` is the tree's node array (fields ``is_leaf``, ``left``, ``right``,
    ``feature_idx``, ``num_threshold``, ``value``). Internal heap node i has children
    2i + 1 (z <= threshold) and 2i + 2; a leaf reached above ``depth`` becomes padding
    nodes (feature 0, threshold TREE_PAD: always left) over copies of its value.
    Thresholds are kept exactly (scikit-learn compares float64 values), leaves to 7
    significant digits.
    """
    internal = 2**depth - 1
    feature = [0] * internal
    threshold = [TREE_PAD] * internal
    leaf = [0.0] * (internal + 1)
    # plain lists once: indexing a structured array field by field is slow
    is_leaf, left, right = nodes["is_leaf"].tolist(), nodes["left"].tolist(), nodes["right"].tolist()
    split_on, split_at, value = nodes["feature_idx"].tolist(), nodes["num_threshold"].tolist(), nodes["value"].tolist()

    def place(node: int, i: int, level: int) -> None:
        if level == depth:
            if not is_leaf[node]:
                raise ValueError(f"tree deeper than {depth}")
            leaf[i - internal] = float(f"{value[node] / learning_rate:.7g}")
            return
        if is_leaf[node]:
            place(node, 2 * i + 1, level + 1)
            place(node, 2 * i + 2, level + 1)
            return
        feature[i] = int(split_on[node])
        threshold[i] = float(split_at[node])
        place(left[node], 2 * i + 1, level + 1)
        place(right[node], 2 * i + 2, level + 1)

    place(0, 0, 0)
    return feature, threshold, leaf


#: kind name -> its estimator ``(shapes, time_ms[, structure]) -> kind``
ESTIMATORS: dict[str, Callable[..., SpmmKind]] = {
    PaperSpmm.name: fit_paper_spmm, Roofline.name: fit_roofline, Learned.name: fit_learned,
    LearnedRoofline.name: fit_learned_roofline, LearnedBoosted.name: fit_learned_boosted,
    StructureBoosted.name: fit_structure_boosted,
}


def fit_kind(kind, shapes, time_ms, structure: dict | None = None) -> SpmmKind:
    """The kind (a name or a class of :data:`SPMM_MODELS`) fitted on shapes and times, and on
    the operands' structure for the kinds that read it."""
    cls = kind if isinstance(kind, type) else SPMM_MODELS.get(kind)
    if cls is None:
        raise UserError(f"unknown SpMM model kind {kind!r}; known kinds: {', '.join(SPMM_MODELS)}")
    estimator = ESTIMATORS.get(cls.name)
    if estimator is None:
        raise UserError(f"SpMM kind {cls.name!r} is not fitted from SpMM timings{cls.not_fitted_hint}")
    if cls.uses_structure:
        return estimator(shapes, time_ms, structure)
    return estimator(shapes, time_ms)
