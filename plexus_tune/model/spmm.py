"""Per-SpMM time models, evaluated with numpy (no scikit-learn, no torch).

One SpMM multiplies a sparse ``rows x common`` matrix holding ``nnz`` nonzeros by a
dense ``common x dense_cols`` matrix (``dense_cols`` is written k below). A model is a
plain dict (the ``spmm`` entry of a machine profile, or what
:mod:`plexus_tune.fit` writes) with a ``kind`` key; :func:`predict_spmm_ms`
evaluates it on arrays of shapes and returns milliseconds.

Kinds:

``paper``
    The paper's form (docs/model.md, SpMM) at the level of one SpMM, with f = nnz * k::

        t = c0 sqrt(f) + c1 sqrt(f) common / k + c2 sqrt(f) rows / k

    For the forward A F of a layer, common / k is the paper's forward penalty
    (N/g_o)(g_n/D_i); for the backward A^T dH it is the backward penalty.
``roofline``
    Non-negative costs per unit of work and traffic::

        t = sum_j coef[j] * term_j(nnz, rows, common, k)

    with the terms of :data:`ROOFLINE_TERMS` (s = ``bytes_per_element``).
``paper-spmm``
    The same as ``paper``: the name machine profiles use, because there kind
    ``paper`` means the paper's epoch-level form.
``learned``
    A ridge regression on polynomial features of log shapes, predicting log time::

        z = (log(nnz + 1), log rows, log common, log k [, log lines(k)])
        phi_m = prod_j z_j ** exponents[m][j]          (every monomial up to ``degree``)

    ``features`` names z: ``log-shape-polynomial`` (the four logs) or
    ``log-shape-lines-polynomial``, which adds the cache lines a dense row of k
    elements touches (:func:`cache_lines_per_row`): rows of B and of the output start
    at offsets i k s mod 64 bytes, so 16 fp32 values fill one line exactly, 17 always
    take two and 9 take two from half the offsets; that step pattern in k is not
    smooth in log k.
        log t = intercept + sum_m coef[m] (phi_m - mean[m]) / scale[m]  [+ log base(t)]

    With a ``base`` model (a roofline dict) the regression is a multiplicative
    correction of that model: t = base(t) * exp(...). With ``z_min``/``z_max`` (the
    range of the fitted shapes) z is clipped to that box first, so a polynomial
    never extrapolates: outside the measured shapes the correction stays at its
    boundary value (and a ``base`` still scales with the shape).
``boosted``
    Gradient-boosted regression trees on a feature set z (``features``, by default
    ``log-shape-footprints``: the learned z plus log nonzeros per row, log rows k and
    log common k), correcting a ``base`` model (a
    ``learned`` dict) in log time::

        log t = log base(t) + init + learning_rate * sum_trees leaf_tree(z)

    A kernel whose cost steps where a smooth polynomial cannot follow (a change of
    regime past some row count, say) is fitted piecewise by the trees. Every tree is
    stored complete, in heap order, to ``depth``: internal node i has children
    2i + 1 (taken when z[feature[i]] <= threshold[i]) and 2i + 2; a branch that ended
    early is padded with nodes whose threshold is :data:`TREE_PAD` (always left).
    ``feature`` and ``threshold`` are lists of 2^depth - 1 entries per tree, ``leaf``
    of 2^depth. Outside the measured shapes the trees stay constant.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from plexus_tune.errors import UserError

#: Roofline terms: name -> (description, function of (nnz, rows, common, k, s)).
ROOFLINE_TERMS = {
    "const": ("kernel launch and fixed overhead", lambda nnz, rows, common, k, s: np.ones_like(nnz)),
    "flops": ("multiply-adds counted as 2 nnz k", lambda nnz, rows, common, k, s: 2.0 * nnz * k),
    "sparse_bytes": ("CSR values and int32 column indices, nnz (s + 4)", lambda nnz, rows, common, k, s: nnz * (s + 4.0)),
    "dense_in_bytes": ("dense operand read once, s common k", lambda nnz, rows, common, k, s: s * common * k),
    "out_bytes": ("output written once, s rows k", lambda nnz, rows, common, k, s: s * rows * k),
    "rows": ("per-row overhead (row pointers, scheduling)", lambda nnz, rows, common, k, s: rows * 1.0),
}


def shape_arrays(nnz, rows, common, dense_cols):
    """Broadcast the four shape descriptors to float64 arrays of one shape."""
    return np.broadcast_arrays(
        np.asarray(nnz, dtype=np.float64),
        np.asarray(rows, dtype=np.float64),
        np.asarray(common, dtype=np.float64),
        np.asarray(dense_cols, dtype=np.float64),
    )


def paper_terms(nnz, rows, common, dense_cols) -> np.ndarray:
    """Design matrix of the paper form: columns sqrt(f), sqrt(f) common/k, sqrt(f) rows/k."""
    nnz, rows, common, k = shape_arrays(nnz, rows, common, dense_cols)
    root_f = np.sqrt(nnz * k)
    return np.stack([root_f, root_f * common / k, root_f * rows / k], axis=-1)


def roofline_terms(nnz, rows, common, dense_cols, bytes_per_element: float = 4.0) -> np.ndarray:
    """Design matrix of the roofline form, one column per entry of :data:`ROOFLINE_TERMS`."""
    nnz, rows, common, k = shape_arrays(nnz, rows, common, dense_cols)
    return np.stack([fn(nnz, rows, common, k, float(bytes_per_element)) for _, fn in ROOFLINE_TERMS.values()], axis=-1)


def _predict_paper(model: Mapping, nnz, rows, common, dense_cols) -> np.ndarray:
    coef = np.array([float(model["c0"]), float(model["c1"]), float(model["c2"])])
    return paper_terms(nnz, rows, common, dense_cols) @ coef


def _predict_roofline(model: Mapping, nnz, rows, common, dense_cols) -> np.ndarray:
    coefs = model["coefficients"]
    missing = [name for name in ROOFLINE_TERMS if name not in coefs]
    if missing:
        raise UserError(f"roofline SpMM model lacks coefficients {missing}; refit it with 'plexus-tune fit'")
    coef = np.array([float(coefs[name]) for name in ROOFLINE_TERMS])
    terms = roofline_terms(nnz, rows, common, dense_cols, model.get("bytes_per_element", 4))
    return terms @ coef


def log_shape_features(nnz, rows, common, dense_cols) -> np.ndarray:
    """The log shape vector z = (log(nnz + 1), log rows, log common, log k), shape (..., 4)."""
    nnz, rows, common, k = shape_arrays(nnz, rows, common, dense_cols)
    return np.stack([np.log1p(nnz), np.log(rows), np.log(common), np.log(k)], axis=-1)


def cache_lines_per_row(dense_cols, bytes_per_element: int = 4, line_bytes: int = 64) -> np.ndarray:
    """Mean number of ``line_bytes`` cache lines touched by one row of a row-major dense matrix.

    Row i of a matrix with k columns of s bytes starts at byte offset (i k s) mod L
    (L = ``line_bytes``, the matrix itself aligned to L). These offsets run over the
    multiples of g = gcd(k s, L) equally often, and a row starting at offset o touches
    ceil((o + k s) / L) lines, so::

        lines(k) = (g / L) * sum_{o = 0, g, ..., L - g} ceil((o + k s) / L)
    """
    k = np.asarray(dense_cols, dtype=np.int64)
    out = np.empty(k.shape, dtype=np.float64)
    for value in np.unique(k):
        row_bytes = int(value) * int(bytes_per_element)
        step = math.gcd(row_bytes, int(line_bytes))
        offsets = np.arange(0, int(line_bytes), step)
        out[k == value] = np.mean(-(-(offsets + row_bytes) // int(line_bytes)))
    return out


#: Feature sets of the learned kinds: name -> number of variables in z.
#: ``log-shape-footprints`` (for trees, which split on one variable at a time) adds to
#: ``log-shape-lines-polynomial`` the logs of nonzeros per row, output elements (rows k)
#: and dense-input elements (common k): the sizes that decide what fits in a cache.
LEARNED_FEATURES = {"log-shape-polynomial": 4, "log-shape-lines-polynomial": 5, "log-shape-footprints": 8}


def learned_features(name: str, nnz, rows, common, dense_cols) -> np.ndarray:
    """The vector z of the learned kind's feature set ``name``, shape (..., variables)."""
    z = log_shape_features(nnz, rows, common, dense_cols)
    if name == "log-shape-polynomial":
        return z
    if name == "log-shape-lines-polynomial":
        k = np.broadcast_to(np.asarray(dense_cols), z.shape[:-1])
        return np.concatenate([z, np.log(cache_lines_per_row(np.maximum(k, 1)))[..., None]], axis=-1)
    if name == "log-shape-footprints":
        z = learned_features("log-shape-lines-polynomial", nnz, rows, common, dense_cols)
        footprints = [z[..., 0] - z[..., 1], z[..., 1] + z[..., 3], z[..., 2] + z[..., 3]]
        return np.concatenate([z, np.stack(footprints, axis=-1)], axis=-1)
    raise UserError(f"unknown learned SpMM feature set {name!r}; known: {', '.join(LEARNED_FEATURES)}")


def monomial_exponents(variables: int, degree: int) -> list[list[int]]:
    """Exponent vectors of every monomial of total degree 1..degree, in a fixed order."""
    out: list[list[int]] = []

    def rec(prefix: list[int], left: int) -> None:
        if len(prefix) == variables:
            if 0 < sum(prefix):
                out.append(prefix)
            return
        for e in range(left + 1):
            rec(prefix + [e], left - e)

    rec([], degree)
    return sorted(out, key=lambda e: (sum(e), [-x for x in e]))


def polynomial_features(z: np.ndarray, exponents) -> np.ndarray:
    """phi[..., m] = prod_j z[..., j] ** exponents[m][j]."""
    exps = np.asarray(exponents, dtype=np.int64)
    return np.prod(z[..., None, :] ** exps, axis=-1)


def _predict_learned(model: Mapping, nnz, rows, common, dense_cols) -> np.ndarray:
    try:
        exponents = model["exponents"]
        mean = np.asarray(model["mean"], dtype=np.float64)
        scale = np.asarray(model["scale"], dtype=np.float64)
        coef = np.asarray(model["coef"], dtype=np.float64)
        intercept = float(model["intercept"])
    except KeyError as exc:
        raise UserError(f"learned SpMM model lacks {exc.args[0]!r}; refit it with 'plexus-tune fit'") from None
    if not (len(exponents) == len(mean) == len(scale) == len(coef)):
        raise UserError("learned SpMM model is inconsistent: exponents, mean, scale and coef differ in length")
    z = learned_features(model.get("features", "log-shape-polynomial"), nnz, rows, common, dense_cols)
    if any(len(e) != z.shape[-1] for e in exponents):
        raise UserError(f"learned SpMM model is inconsistent: its exponents do not have {z.shape[-1]} variables")
    if model.get("z_min") is not None and model.get("z_max") is not None:
        z = np.clip(z, np.asarray(model["z_min"], dtype=np.float64), np.asarray(model["z_max"], dtype=np.float64))
    phi = polynomial_features(z, exponents)
    log_t = intercept + ((phi - mean) / scale) @ coef
    base = model.get("base")
    if base:
        log_t = log_t + np.log(np.maximum(predict_spmm_ms(base, nnz, rows, common, dense_cols), 1e-12))
    return np.exp(log_t)


#: Threshold of a padding node of a complete tree (above any log shape): always go left.
TREE_PAD = 1e30


def boosted_correction(model: Mapping, z: np.ndarray) -> np.ndarray:
    """init + learning_rate * sum over trees of the leaf z falls in; z has shape (n, variables)."""
    try:
        depth = int(model["depth"])
        feature = np.asarray(model["feature"], dtype=np.int64)
        threshold = np.asarray(model["threshold"], dtype=np.float64)
        leaf = np.asarray(model["leaf"], dtype=np.float64)
        init, rate = float(model["init"]), float(model["learning_rate"])
    except KeyError as exc:
        raise UserError(f"boosted SpMM model lacks {exc.args[0]!r}; refit it with 'plexus-tune fit'") from None
    internal = 2**depth - 1
    trees = len(feature)
    if feature.shape != (trees, internal) or threshold.shape != (trees, internal) or leaf.shape != (trees, internal + 1):
        raise UserError(f"boosted SpMM model is inconsistent: each tree needs {internal} feature/threshold and {internal + 1} leaf entries")
    if trees and (feature.min() < 0 or feature.max() >= z.shape[1]):
        raise UserError(f"boosted SpMM model is inconsistent: a tree uses a feature outside 0..{z.shape[1] - 1}")
    rows = np.arange(len(z))[:, None]
    tree = np.arange(trees)[None, :]
    node = np.zeros((len(z), trees), dtype=np.int64)
    for _ in range(depth):
        right = z[rows, feature[tree, node]] > threshold[tree, node]
        node = 2 * node + 1 + right
    return init + rate * leaf[tree, node - internal].sum(axis=1)


def _predict_boosted(model: Mapping, nnz, rows, common, dense_cols) -> np.ndarray:
    base = model.get("base")
    if not base:
        raise UserError("boosted SpMM model lacks its 'base' model; refit it with 'plexus-tune fit'")
    z = learned_features(model.get("features", "log-shape-footprints"), nnz, rows, common, dense_cols)
    shape = z.shape[:-1]
    correction = boosted_correction(model, z.reshape(-1, z.shape[-1])).reshape(shape)
    return predict_spmm_ms(base, nnz, rows, common, dense_cols) * np.exp(correction)


#: kind -> evaluator(model, nnz, rows, common, dense_cols) -> ms
EVALUATORS = {
    "paper": _predict_paper,
    "paper-spmm": _predict_paper,
    "roofline": _predict_roofline,
    "learned": _predict_learned,
    "boosted": _predict_boosted,
}


def describe_spmm_model(model: Mapping) -> str:
    """One line naming a model's kind and size, its base models included (for listings)."""
    kind = model.get("kind")
    if kind == "boosted":
        text = f"boosted: {len(model.get('feature', []))} trees of depth {model.get('depth')} on {model.get('features')}"
    elif kind == "learned":
        text = f"learned: ridge on {len(model.get('coef', []))} monomials of degree <= {model.get('degree', '?')} of {model.get('features', 'log-shape-polynomial')}"
    elif kind == "roofline":
        text = "roofline: " + ", ".join(f"{k} {float(v):.3g}" for k, v in (model.get("coefficients") or {}).items())
    else:
        text = f"{kind}: " + ", ".join(f"{k} {model[k]:.4g}" for k in ("c0", "c1", "c2") if isinstance(model.get(k), (int, float)))
    base = model.get("base")
    return text + (f"; correcting {describe_spmm_model(base)}" if base else "")


def predict_spmm_ms(model: Mapping, nnz, rows, common, dense_cols) -> np.ndarray:
    """Time in ms of each SpMM described by the (broadcast) shape arrays."""
    kind = model.get("kind")
    evaluator = EVALUATORS.get(kind)
    if evaluator is None:
        raise UserError(f"unknown SpMM model kind {kind!r}; known kinds: {', '.join(sorted(EVALUATORS))}")
    return np.asarray(evaluator(model, nnz, rows, common, dense_cols), dtype=np.float64)
