"""Per-SpMM time models ("kinds"), one class each, evaluated with numpy alone.

One SpMM multiplies a sparse ``rows x common`` matrix holding ``nnz`` nonzeros by a
dense ``common x dense_cols`` matrix (``dense_cols`` is written k below). Every kind is
a class with ``predict(nnz, rows, common, dense_cols)`` (ms), ``to_dict()``/``from_dict()``
(the ``spmm`` entry of a machine profile: the coefficients its estimator exported),
``describe()``, ``scaled(s)`` and ``n_parameters``; :data:`SPMM_MODELS` registers each
under the one name that both ``plexus-tune fit --kind`` and a profile's ``spmm.kind`` use.
The estimators (scipy, scikit-learn) are in :mod:`plexus_tune.fit.spmm_kinds`, one per
fitted kind; this module needs numpy only. Formulas: docs/model.md (SpMM kinds).

Kinds:

``paper``
    The paper's form over a whole epoch (docs/model.md, SpMM): in a profile,
    :mod:`plexus_tune.model.costs` evaluates c0 sqrt(F) + c1 sqrt(F) P_fwd +
    c2 sqrt(F) P_bwd on the epoch's sums. ``predict`` evaluates the same formula on
    single SpMMs (as ``paper-spmm``); it is not fitted from SpMM timings.
``paper-spmm``
    The paper's form at the level of one SpMM, with f = nnz * k::

        t = c0 sqrt(f) + c1 sqrt(f) common / k + c2 sqrt(f) rows / k

    For the forward A F of a layer, common / k is the paper's forward penalty
    (N/g_o)(g_n/D_i); for the backward A^T dH it is the backward penalty. Fitted by
    ordinary least squares.
``roofline``
    Non-negative costs per unit of work and traffic, fitted by non-negative least
    squares of the relative error::

        t = sum_j coef[j] * term_j(nnz, rows, common, k)

    with the terms of :data:`ROOFLINE_TERMS` (s = ``bytes_per_element``).
``learned``
    A ridge regression on polynomial features of log shapes, predicting log time::

        z = (log(nnz + 1), log rows, log common, log k [, log lines(k)])
        phi_m = prod_j z_j ** exponents[m][j]          (every monomial up to ``degree``)
        log t = intercept + sum_m coef[m] (phi_m - mean[m]) / scale[m]

    ``features`` names z: ``log-shape-polynomial`` (the four logs) or
    ``log-shape-lines-polynomial``, which adds the cache lines a dense row of k
    elements touches (:func:`cache_lines_per_row`): rows of B and of the output start
    at offsets i k s mod 64 bytes, so 16 fp32 values fill one line exactly, 17 always
    take two and 9 take two from half the offsets; that step pattern in k is not
    smooth in log k. Exact leave-one-out error picks the degree (2, 3 or 4; a higher
    one only with 3 rows per monomial) and the ridge penalty. With ``z_min``/``z_max``
    (the range of the fitted shapes) z is clipped to that box first, so a polynomial
    never extrapolates: outside the measured shapes the correction stays at its
    boundary value.
``learned-roofline``
    ``learned`` as a multiplicative correction of a ``roofline`` model (its ``base``),
    fitted to log(t / base(t)) after the roofline::

        t = base(t) * exp(intercept + sum_m coef[m] (phi_m - mean[m]) / scale[m])

    Outside the measured shapes the correction is held at the box and the base
    still scales with the shape.
``learned-boosted``
    Gradient-boosted regression trees on a feature set z (``features``, by default
    ``log-shape-footprints``: the learned z plus log nonzeros per row, log rows k and
    log common k), correcting a ``learned-roofline`` ``base`` in log time::

        log t = log base(t) + init + learning_rate * sum_trees leaf_tree(z)

    A kernel whose cost steps where a smooth polynomial cannot follow (a change of
    regime past some row count, say) is fitted piecewise by the trees. Every tree is
    stored complete, in heap order, to ``depth``: internal node i has children
    2i + 1 (taken when z[feature[i]] <= threshold[i]) and 2i + 2; a branch that ended
    early is padded with nodes whose threshold is :data:`TREE_PAD` (always left).
    ``feature`` and ``threshold`` are lists of 2^depth - 1 entries per tree, ``leaf``
    of 2^depth. Outside the measured shapes the trees stay constant.

Profiles written before the kinds had one name each still load (:func:`current_kind`):
``boosted`` is ``learned-boosted``, and ``learned`` with a roofline ``base`` is
``learned-roofline``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.model.sparsity import SHARE_POINTS, share_at, uniform_structure

#: Roofline terms: name -> (description, function of (nnz, rows, common, k, s)).
ROOFLINE_TERMS = {
    "const": ("kernel launch and fixed overhead", lambda nnz, rows, common, k, s: np.ones_like(nnz)),
    "flops": ("multiply-adds counted as 2 nnz k", lambda nnz, rows, common, k, s: 2.0 * nnz * k),
    "sparse_bytes": ("CSR values and int32 column indices, nnz (s + 4)", lambda nnz, rows, common, k, s: nnz * (s + 4.0)),
    "dense_in_bytes": ("dense operand read once, s common k", lambda nnz, rows, common, k, s: s * common * k),
    "out_bytes": ("output written once, s rows k", lambda nnz, rows, common, k, s: s * rows * k),
    "rows": ("per-row overhead (row pointers, scheduling)", lambda nnz, rows, common, k, s: rows * 1.0),
}

#: Feature sets of the learned kinds: name -> number of variables in z.
#: ``log-shape-footprints`` (for trees, which split on one variable at a time) adds to
#: ``log-shape-lines-polynomial`` the logs of nonzeros per row, output elements (rows k)
#: and dense-input elements (common k): the sizes that decide what fits in a cache.
LEARNED_FEATURES = {"log-shape-polynomial": 4, "log-shape-lines-polynomial": 5, "log-shape-footprints": 8}
#: The feature set that ``learned`` and ``learned-roofline`` fit on.
LEARNED_FEATURE_SET = "log-shape-lines-polynomial"
#: The feature set that the trees of ``learned-boosted`` split on.
BOOSTED_FEATURE_SET = "log-shape-footprints"
#: The lowest polynomial degree a fit of the learned kinds tries (it sets their parameter count;
#: the estimators are in :mod:`plexus_tune.fit.spmm_kinds`).
LEARNED_MIN_DEGREE = 2
#: Threshold of a padding node of a complete tree (above any log shape): always go left.
TREE_PAD = 1e30
#: Floor of a base model's time before its log is taken (ms).
TINY_MS = 1e-12


# --------------------------------------------------------------------------- features


def shape_arrays(nnz, rows, common, dense_cols):
    """Broadcast the four shape descriptors to float64 arrays of one shape."""
    return np.broadcast_arrays(
        np.asarray(nnz, dtype=np.float64),
        np.asarray(rows, dtype=np.float64),
        np.asarray(common, dtype=np.float64),
        np.asarray(dense_cols, dtype=np.float64),
    )


def spmm_traffic_bytes(nnz, rows, common, dense_cols, bytes_per_element, index_bytes, blocks=1) -> np.ndarray:
    """Bytes one SpMM must move to and from device memory (docs/model.md, SpMM floor), vectorized.

    The sparse ``rows x common`` operand with ``nnz`` nonzeros in CSR, stored as
    ``blocks`` row blocks, times a dense ``common x k`` operand (k = ``dense_cols``),
    u = ``bytes_per_element``, ib = ``index_bytes``::

        sparse  = nnz (u + ib) + (rows + blocks) ib     values, column indices, row pointers
        dense   = u k blocks common (1 - exp(-nnz / (blocks common)))
        output  = u k rows
        bytes   = sparse + dense + output

    The dense term reads each dense row the nonzeros of a block touch once: with the
    nonzeros of a block spread uniformly over the columns (the trainer permutes the
    graph at random), common (1 - exp(-nnz_block / common)) is the expected number of
    distinct columns touched, at most min(nnz_block, common).
    """
    nnz, rows, common, k = shape_arrays(nnz, rows, common, dense_cols)
    u = np.asarray(bytes_per_element, dtype=np.float64)
    ib = np.asarray(index_bytes, dtype=np.float64)
    b = np.asarray(blocks, dtype=np.float64)
    safe_common = np.maximum(common, 1.0)
    touched = b * common * -np.expm1(-nnz / (b * safe_common))
    return nnz * (u + ib) + (rows + b) * ib + u * k * touched + u * k * rows


def paper_terms(nnz, rows, common, dense_cols) -> np.ndarray:
    """Design matrix of the paper form: columns sqrt(f), sqrt(f) common/k, sqrt(f) rows/k."""
    nnz, rows, common, k = shape_arrays(nnz, rows, common, dense_cols)
    root_f = np.sqrt(nnz * k)
    return np.stack([root_f, root_f * common / k, root_f * rows / k], axis=-1)


def roofline_terms(nnz, rows, common, dense_cols, bytes_per_element: float = 4.0) -> np.ndarray:
    """Design matrix of the roofline form, one column per entry of :data:`ROOFLINE_TERMS`."""
    nnz, rows, common, k = shape_arrays(nnz, rows, common, dense_cols)
    return np.stack([fn(nnz, rows, common, k, float(bytes_per_element)) for _, fn in ROOFLINE_TERMS.values()], axis=-1)


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
    distinct, inverse = np.unique(k, return_inverse=True)
    lines = np.empty(distinct.shape, dtype=np.float64)
    for i, value in enumerate(distinct.tolist()):
        row_bytes = int(value) * int(bytes_per_element)
        step = math.gcd(row_bytes, int(line_bytes))
        offsets = np.arange(0, int(line_bytes), step)
        lines[i] = np.mean(-(-(offsets + row_bytes) // int(line_bytes)))
    return lines[inverse.reshape(k.shape)]


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
    """phi[..., m] = prod_j z[..., j] ** exponents[m][j] (the product taken over j in order)."""
    exps = np.asarray(exponents, dtype=np.int64).reshape(-1, z.shape[-1])
    if not len(exps):
        return np.ones(z.shape[:-1] + (0,))
    # every power z_j ** d once (the same pow as z ** exponent elementwise), then the
    # monomials as running products over the variables
    powers = z[..., None, :] ** np.arange(int(exps.max()) + 1)[:, None]
    out = powers[..., exps[:, 0], 0]
    for j in range(1, exps.shape[1]):
        out = out * powers[..., exps[:, j], j]
    return np.ascontiguousarray(out)  # C order, as the matrix products that follow expect


# --------------------------------------------------------------------------- helpers


def _lacks(kind: str, key: str) -> UserError:
    return UserError(f"{kind} SpMM model lacks {key!r}; refit it with 'plexus-tune fit'")


def _float(data: Mapping, key: str, kind: str) -> float:
    if key not in data:
        raise _lacks(kind, key)
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{kind} SpMM model: {key!r} must be a finite number, got {value!r}")
    return float(value)


def _floats(data: Mapping, key: str, kind: str) -> np.ndarray:
    if key not in data:
        raise _lacks(kind, key)
    try:
        values = np.asarray(data[key], dtype=np.float64)
    except (TypeError, ValueError):
        raise UserError(f"{kind} SpMM model: {key!r} must be a list of numbers") from None
    if not np.all(np.isfinite(values)):
        raise UserError(f"{kind} SpMM model: {key!r} holds a value that is not a finite number")
    return values


def base_log_ms(base: "SpmmKind", shapes) -> np.ndarray:
    return np.log(np.maximum(base.predict(*shapes), TINY_MS))


# --------------------------------------------------------------------------- kinds


class SpmmKind:
    """A per-SpMM time model: the base class of the kinds in :data:`SPMM_MODELS`.

    ``fit(shapes, time_ms)`` estimates it from arrays ``shapes = (nnz, rows, common,
    dense_cols)`` and times in ms (and returns it); ``predict(nnz, rows, common,
    dense_cols)`` gives ms for broadcast shape arrays.
    """

    #: the kind's name: the registry key, ``fit --kind`` and a profile's ``spmm.kind``
    name: str = ""
    #: parameters a fit estimates (at least); fitting needs more rows than that
    n_parameters: int = 0
    #: whether the kind is fitted from SpMM timings (``paper`` keeps the paper's coefficients)
    fittable: bool = True
    #: what to fit instead, for a kind that is not fitted ("; ..." appended to the refusal)
    not_fitted_hint: str = ""
    #: whether fit and predict read the operands' sparsity structure (``structure=``);
    #: the other kinds ignore it
    uses_structure: bool = False
    #: whether predict tells a forward A F from a backward A^T dH (``backward=``; ``paper``)
    directional: bool = False

    def predict(self, nnz, rows, common, dense_cols, structure=None) -> np.ndarray:
        raise NotImplementedError

    def to_dict(self) -> dict:
        raise NotImplementedError

    @classmethod
    def from_dict(cls, data: Mapping) -> "SpmmKind":
        raise NotImplementedError

    def describe(self) -> str:
        """One line naming the kind and its size, base models included (for listings)."""
        raise NotImplementedError

    def scaled(self, factor: float) -> "SpmmKind":
        """The same model with every prediction multiplied by ``factor`` > 0."""
        raise NotImplementedError

    def _log_shifted(self, attribute: str, factor: float) -> "SpmmKind":
        """A copy whose log-time offset ``attribute`` is raised by log(factor): every prediction x factor."""
        out = self.from_dict(self.to_dict())
        setattr(out, attribute, getattr(self, attribute) + math.log(factor))
        return out

    def _check_fitted(self, attribute: str) -> None:
        if getattr(self, attribute, None) is None:
            raise ValueError(f"this {self.name} SpMM model is not fitted: fit it (plexus_tune.fit.spmm_kinds.fit_kind) or build it with from_dict()")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe() if self._is_fitted() else 'not fitted'}>"

    def _is_fitted(self) -> bool:
        try:
            self.to_dict()
        except (ValueError, TypeError, AttributeError):
            return False
        return True


class PaperSpmm(SpmmKind):
    """t = c0 sqrt(f) + c1 sqrt(f) common / k + c2 sqrt(f) rows / k with f = nnz k (least squares)."""

    name = "paper-spmm"
    n_parameters = 3

    def __init__(self, c0: float | None = None, c1: float | None = None, c2: float | None = None):
        self.c0, self.c1, self.c2 = c0, c1, c2

    def predict(self, nnz, rows, common, dense_cols, structure=None) -> np.ndarray:
        self._check_fitted("c0")
        return paper_terms(nnz, rows, common, dense_cols) @ np.array([self.c0, self.c1, self.c2])

    def to_dict(self) -> dict:
        self._check_fitted("c0")
        return {"kind": self.name, "c0": float(self.c0), "c1": float(self.c1), "c2": float(self.c2)}

    @classmethod
    def from_dict(cls, data: Mapping) -> "PaperSpmm":
        # signs are free: the paper's c2 is negative
        return cls(*(_float(data, key, cls.name) for key in ("c0", "c1", "c2")))

    def describe(self) -> str:
        return f"{self.name}: " + ", ".join(f"{key} {getattr(self, key):.4g}" for key in ("c0", "c1", "c2"))

    def scaled(self, factor: float) -> "PaperSpmm":
        return type(self)(self.c0 * factor, self.c1 * factor, self.c2 * factor)


class Paper(PaperSpmm):
    """The Plexus paper's eq. 4.4, per layer and split over the layer's two SpMMs (docs/model.md, SpMM).

    The paper sums over layers sqrt(f) (c0 + c1 fwd_penalty + c2 bwd_penalty), f the
    layer's local flops, each penalty the common dimension over the dense columns of
    that direction's SpMM. Per local SpMM, f = nnz k::

        forward   t = c0 / 2 sqrt(f) + c1 sqrt(f) common / k
        backward  t = c0 / 2 sqrt(f) + c2 sqrt(f) common / k

    so a layer's forward and backward SpMM add up to the paper's term, and every family
    prices its local SpMMs with the same form. Not fitted from SpMM timings (fit
    ``paper-spmm``, the direction-free form, for that).
    """

    name = "paper"
    fittable = False
    not_fitted_hint = "; it is the paper's per-layer form: fit its per-SpMM form, kind 'paper-spmm'"
    directional = True

    def predict(self, nnz, rows, common, dense_cols, structure=None, backward=False) -> np.ndarray:
        self._check_fitted("c0")
        nnz, rows, common, k = shape_arrays(nnz, rows, common, dense_cols)
        root_f = np.sqrt(nnz * k)
        return 0.5 * self.c0 * root_f + (self.c2 if backward else self.c1) * root_f * common / k


class Roofline(SpmmKind):
    """t = sum_j coef[j] term_j(nnz, rows, common, k): non-negative costs of :data:`ROOFLINE_TERMS`."""

    name = "roofline"
    n_parameters = len(ROOFLINE_TERMS)

    def __init__(self, coefficients: Mapping | None = None, bytes_per_element: float = 4):
        self.coefficients = None if coefficients is None else {k: float(v) for k, v in coefficients.items()}
        self.bytes_per_element = bytes_per_element

    def predict(self, nnz, rows, common, dense_cols, structure=None) -> np.ndarray:
        self._check_fitted("coefficients")
        coef = np.array([self.coefficients[name] for name in ROOFLINE_TERMS])
        return roofline_terms(nnz, rows, common, dense_cols, self.bytes_per_element) @ coef

    def to_dict(self) -> dict:
        self._check_fitted("coefficients")
        return {"kind": self.name, "bytes_per_element": self.bytes_per_element, "coefficients": dict(self.coefficients)}

    @classmethod
    def from_dict(cls, data: Mapping) -> "Roofline":
        coefs = data.get("coefficients")
        if not isinstance(coefs, Mapping):
            raise _lacks(cls.name, "coefficients")
        missing = [name for name in ROOFLINE_TERMS if name not in coefs]
        if missing:
            raise UserError(f"roofline SpMM model lacks coefficients {missing}; refit it with 'plexus-tune fit'")
        size = data.get("bytes_per_element", 4)
        if isinstance(size, bool) or not isinstance(size, (int, float)) or not size > 0:
            raise UserError(f"roofline SpMM model: 'bytes_per_element' must be a positive number, got {size!r}")
        return cls({name: _float(coefs, name, cls.name) for name in ROOFLINE_TERMS}, size)

    def describe(self) -> str:
        return f"{self.name}: " + ", ".join(f"{k} {v:.3g}" for k, v in self.coefficients.items())

    def scaled(self, factor: float) -> "Roofline":
        return type(self)({k: v * factor for k, v in self.coefficients.items()}, self.bytes_per_element)


class Learned(SpmmKind):
    """log t = intercept + ((phi(z) - mean) / scale) @ coef: ridge on monomials of the log shapes z."""

    name = "learned"
    n_parameters = len(monomial_exponents(LEARNED_FEATURES[LEARNED_FEATURE_SET], LEARNED_MIN_DEGREE)) + 1
    #: the fitted keys of the dict besides kind, features and base
    _KEYS = ("degree", "exponents", "mean", "scale", "coef", "intercept", "ridge_alpha", "z_min", "z_max")

    def __init__(self, features: str = LEARNED_FEATURE_SET):
        if features not in LEARNED_FEATURES:
            raise UserError(f"unknown learned SpMM feature set {features!r}; known: {', '.join(LEARNED_FEATURES)}")
        self.features = features
        self.exponents = None
        self.degree = self.ridge_alpha = self.z_min = self.z_max = None

    def _log_correction(self, nnz, rows, common, dense_cols) -> np.ndarray:
        self._check_fitted("exponents")
        z = learned_features(self.features, nnz, rows, common, dense_cols)
        if self.z_min is not None and self.z_max is not None:
            z = np.clip(z, self.z_min, self.z_max)
        return self.intercept + ((polynomial_features(z, self.exponents) - self.mean) / self.scale) @ self.coef

    def predict(self, nnz, rows, common, dense_cols, structure=None) -> np.ndarray:
        return np.exp(self._log_correction(nnz, rows, common, dense_cols))

    def to_dict(self) -> dict:
        self._check_fitted("exponents")
        out = {"kind": self.name, "features": self.features}
        for key in self._KEYS:
            value = getattr(self, key)
            if value is not None:
                out[key] = value.tolist() if isinstance(value, np.ndarray) else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping) -> "Learned":
        model = cls(features=data.get("features", "log-shape-polynomial"))
        model._read(data)
        return model

    def _read(self, data: Mapping) -> None:
        kind = self.name
        if "exponents" not in data:
            raise _lacks(kind, "exponents")
        self.mean, self.scale, self.coef = (_floats(data, key, kind) for key in ("mean", "scale", "coef"))
        self.intercept = _float(data, "intercept", kind)
        exponents = data["exponents"]
        if not isinstance(exponents, (list, tuple)):
            raise UserError(f"{kind} SpMM model: 'exponents' must be a list of exponent lists")
        if not (len(exponents) == len(self.mean) == len(self.scale) == len(self.coef)) or self.coef.ndim != 1:
            raise UserError(f"{kind} SpMM model is inconsistent: exponents, mean, scale and coef differ in length")
        variables = LEARNED_FEATURES[self.features]
        if any(not isinstance(e, (list, tuple)) or len(e) != variables for e in exponents):
            raise UserError(f"{kind} SpMM model is inconsistent: its exponents do not have {variables} variables")
        if any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for e in exponents for x in e):
            raise UserError(f"{kind} SpMM model: exponents must be non-negative integers")
        self.exponents = [list(e) for e in exponents]
        if data.get("z_min") is not None and data.get("z_max") is not None:
            self.z_min, self.z_max = _floats(data, "z_min", kind), _floats(data, "z_max", kind)
            if self.z_min.shape != (variables,) or self.z_max.shape != (variables,):
                raise UserError(f"{kind} SpMM model is inconsistent: z_min and z_max need {variables} entries")
        self.degree = data.get("degree")
        self.ridge_alpha = data.get("ridge_alpha")

    def describe(self) -> str:
        return f"{self.name}: ridge on {len(self.coef)} monomials of degree <= {self.degree or '?'} of {self.features}"

    def scaled(self, factor: float) -> "Learned":
        return self._log_shifted("intercept", factor)


class LearnedRoofline(Learned):
    """t = base(t) exp(learned correction): ``learned`` fitted to log(t / roofline(t))."""

    name = "learned-roofline"
    n_parameters = Learned.n_parameters + Roofline.n_parameters

    def __init__(self, features: str = LEARNED_FEATURE_SET):
        super().__init__(features)
        self.base: Roofline | None = None

    def predict(self, nnz, rows, common, dense_cols, structure=None) -> np.ndarray:
        self._check_fitted("base")
        log_t = self._log_correction(nnz, rows, common, dense_cols)
        return np.exp(log_t + base_log_ms(self.base, (nnz, rows, common, dense_cols)))

    def to_dict(self) -> dict:
        self._check_fitted("base")
        return {**super().to_dict(), "base": self.base.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping) -> "LearnedRoofline":
        model = super().from_dict(data)
        base = data.get("base")
        if not base:
            raise _lacks(cls.name, "base")
        model.base = spmm_model_from_dict(base)
        if not isinstance(model.base, Roofline):
            raise UserError(f"{cls.name} SpMM model corrects a {model.base.name} model; its base must be a roofline")
        return model

    def describe(self) -> str:
        return super().describe() + f"; correcting {self.base.describe()}"


class LearnedBoosted(SpmmKind):
    """log t = log base(t) + init + learning_rate sum_trees leaf(z): boosted trees on a learned-roofline."""

    name = "learned-boosted"
    # trees need many more rows than a polynomial's parameters: 100 (150 rows) at least
    n_parameters = 100

    def __init__(self, features: str = BOOSTED_FEATURE_SET):
        if features not in LEARNED_FEATURES:
            raise UserError(f"unknown learned SpMM feature set {features!r}; known: {', '.join(LEARNED_FEATURES)}")
        self.features = features
        self.base: SpmmKind | None = None
        self.depth = self.learning_rate = self.init = None
        self.feature = self.threshold = self.leaf = None

    def _trees(self) -> dict:
        return {"depth": self.depth, "learning_rate": self.learning_rate, "init": self.init,
                "feature": self.feature, "threshold": self.threshold, "leaf": self.leaf}

    def predict(self, nnz, rows, common, dense_cols, structure=None) -> np.ndarray:
        self._check_fitted("base")
        z = learned_features(self.features, nnz, rows, common, dense_cols)
        correction = boosted_correction(self._trees(), z.reshape(-1, z.shape[-1])).reshape(z.shape[:-1])
        return self.base.predict(nnz, rows, common, dense_cols) * np.exp(correction)

    def to_dict(self) -> dict:
        self._check_fitted("base")
        return {"kind": self.name, "features": self.features, "depth": self.depth, "learning_rate": self.learning_rate,
                "init": self.init, "feature": self.feature.tolist(), "threshold": self.threshold.tolist(),
                "leaf": self.leaf.tolist(), "base": self.base.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping) -> "LearnedBoosted":
        kind = cls.name
        model = cls(features=data.get("features", BOOSTED_FEATURE_SET))
        base = data.get("base")
        if not base:
            raise UserError(f"{kind} SpMM model lacks its 'base' model; refit it with 'plexus-tune fit'")
        model.base = spmm_model_from_dict(base)
        if not model.base.fittable:
            raise UserError(f"{kind} SpMM model corrects a '{model.base.name}' model, which is not fitted from SpMM timings; its base must be a fitted per-SpMM kind")
        depth = _float(data, "depth", kind)
        if depth != int(depth) or depth < 0:
            raise UserError(f"{kind} SpMM model: 'depth' must be a non-negative integer, got {data['depth']!r}")
        model.depth = int(depth)
        model.learning_rate, model.init = _float(data, "learning_rate", kind), _float(data, "init", kind)
        model.feature = _floats(data, "feature", kind).astype(np.int64)
        model.threshold, model.leaf = _floats(data, "threshold", kind), _floats(data, "leaf", kind)
        _check_trees(model._trees(), LEARNED_FEATURES[model.features])
        return model

    def describe(self) -> str:
        return f"{self.name}: {len(self.feature)} trees of depth {self.depth} on {self.features}; correcting {self.base.describe()}"

    def scaled(self, factor: float) -> "LearnedBoosted":
        return self._log_shifted("init", factor)


def _check_trees(trees: Mapping, variables: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    depth = int(trees["depth"])
    feature = np.asarray(trees["feature"], dtype=np.int64)
    threshold = np.asarray(trees["threshold"], dtype=np.float64)
    leaf = np.asarray(trees["leaf"], dtype=np.float64)
    internal = 2**depth - 1
    count = len(feature)
    if count == 0:  # no trees: empty lists of any shape
        return feature.reshape(0, internal), threshold.reshape(0, internal), leaf.reshape(0, internal + 1)
    if feature.shape != (count, internal) or threshold.shape != (count, internal) or leaf.shape != (count, internal + 1):
        raise UserError(f"boosted SpMM model is inconsistent: each tree needs {internal} feature/threshold and {internal + 1} leaf entries")
    if feature.min() < 0 or feature.max() >= variables:
        raise UserError(f"boosted SpMM model is inconsistent: a tree uses a feature outside 0..{variables - 1}")
    return feature, threshold, leaf


def boosted_correction(trees: Mapping, z: np.ndarray) -> np.ndarray:
    """init + learning_rate * sum over trees of the leaf z falls in; z has shape (n, variables).

    ``trees`` holds depth, learning_rate, init and the complete trees feature,
    threshold and leaf (see the ``learned-boosted`` kind).
    """
    try:
        init, rate = float(trees["init"]), float(trees["learning_rate"])
        feature, threshold, leaf = _check_trees(trees, z.shape[1])
    except KeyError as exc:
        raise _lacks("learned-boosted", exc.args[0]) from None
    depth = int(trees["depth"])
    internal = 2**depth - 1
    # flat indices into the raveled arrays, one take per level, over blocks of rows whose
    # (rows x trees) temporaries stay in cache
    values = np.ascontiguousarray(z, dtype=np.float64)
    trees_n = leaf.shape[0]
    feature, threshold, leaves = feature.reshape(-1), threshold.reshape(-1), leaf.reshape(-1)
    tree_start = (np.arange(trees_n) * internal)[None, :]
    leaf_start = (np.arange(trees_n) * (internal + 1) - internal)[None, :]
    total = np.empty(len(z), dtype=np.float64)
    for lo in range(0, len(z), _TREE_BLOCK_ROWS):
        block = values[lo:lo + _TREE_BLOCK_ROWS]
        row_start = (np.arange(len(block)) * z.shape[1])[:, None]
        flat = block.reshape(-1)
        node = np.zeros((len(block), trees_n), dtype=np.intp)
        for _ in range(depth):
            at = node + tree_start
            right = flat.take(row_start + feature.take(at)) > threshold.take(at)
            node *= 2
            node += 1
            node += right
        total[lo:lo + len(block)] = leaves.take(node + leaf_start).sum(axis=1)
    return init + rate * total


#: rows evaluated together by :func:`boosted_correction`
_TREE_BLOCK_ROWS = 1024


# --------------------------------------------------------------------------- structure-boosted

#: Granule of a gathered dense row: rows are read in 32-byte sectors.
SECTOR_BYTES = 32
#: Terms of the ``structure-boosted`` base, each once for k = 1 and once for k > 1.
STRUCTURE_BASE_TERMS = ("const", "nonzeros", "rows", "gather_miss_bytes", "gather_hit_bytes", "out_bytes",
                        "touched_bytes")
#: Variables the trees of ``structure-boosted`` split on.
STRUCTURE_TREE_FEATURES = ("log k", "log nonzeros per row", "log nonzeros per column", "log touched footprint / cache",
                           "log nnz", "miss share", "log(1 + row-length CV)", "touched column fraction")


def _structure_columns(structure, nnz, rows, common) -> dict:
    """The structure arrays of n operands: a dict of arrays as given, None for uniform random."""
    n = nnz.size
    if structure is None:
        # uniform random nonzeros: one expectation per distinct shape
        keys = np.stack([nnz.reshape(-1), rows.reshape(-1), common.reshape(-1)], axis=1)
        uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
        stats = [uniform_structure(*row) for row in uniq]
        inverse = inverse.reshape(-1)
        return {"row_length_cv": np.array([s["row_length_cv"] for s in stats])[inverse],
                "touched_column_fraction": np.array([s["touched_column_fraction"] for s in stats])[inverse],
                "column_share": np.array([s["column_share"] for s in stats]).reshape(-1, SHARE_POINTS)[inverse]}
    out = {}
    for key in ("row_length_cv", "touched_column_fraction"):
        out[key] = np.broadcast_to(np.asarray(structure[key], dtype=np.float64), nnz.shape).reshape(-1)
    curve = np.asarray(structure["column_share"], dtype=np.float64)
    out["column_share"] = np.broadcast_to(curve, nnz.shape + (SHARE_POINTS,)).reshape(n, SHARE_POINTS)
    return out


def structure_features(nnz, rows, common, dense_cols, structure=None, *, cache_bytes: float,
                       bytes_per_element: float = 4) -> tuple[np.ndarray, np.ndarray]:
    """(base terms (n, 14), tree variables (n, 8)) of the ``structure-boosted`` kind.

    With s the element size, a gathered dense row moves g = 32 ceil(s k / 32) bytes; a
    cache of ``cache_bytes`` holds C = cache / (s k) dense rows, and
    h = share_at(column_share, C) is the share of the nonzeros whose column is among the
    C most popular (hit in cache once loaded; docs/model.md, "Sparsity structure"). With
    T = touched fraction x common the touched columns, the base terms are 1, nnz, rows,
    nnz g (1 - h), nnz g h, s rows k and T g, repeated for k = 1 and k > 1 (the k = 1
    copy is zero for k > 1 and conversely). Tree variables:
    :data:`STRUCTURE_TREE_FEATURES` (miss share 1 - h, footprint T s k / cache).
    """
    nnz, rows, common, k = shape_arrays(nnz, rows, common, dense_cols)
    shape = nnz.shape
    cols = _structure_columns(structure, nnz, rows, common)
    n, r, c, kk = (a.reshape(-1) for a in (nnz, rows, common, k))
    s = float(bytes_per_element)
    granule = SECTOR_BYTES * np.ceil(s * kk / SECTOR_BYTES)
    hit = share_at(cols["column_share"], cache_bytes / (s * kk))
    touched = cols["touched_column_fraction"] * c
    terms = np.stack([np.ones_like(n), n, r, n * granule * (1.0 - hit), n * granule * hit, s * r * kk,
                      touched * granule], axis=-1)
    one = (kk == 1)[:, None]
    terms = np.concatenate([terms * one, terms * ~one], axis=-1)
    z = np.stack([np.log(kk), np.log((n + 1) / r), np.log((n + 1) / c),
                  np.log(np.maximum(touched, 1.0) * s * kk / cache_bytes), np.log1p(n), 1.0 - hit,
                  np.log1p(cols["row_length_cv"]), cols["touched_column_fraction"]], axis=-1)
    return terms.reshape(shape + terms.shape[-1:]), z.reshape(shape + z.shape[-1:])


class StructureBoosted(SpmmKind):
    """log t = log base(t) + trees(z), base and z from the shape and the operand's sparsity structure.

    ``base`` = sum_j coef[j] term_j, the non-negative costs of the terms of
    :func:`structure_features` (a roofline whose gathers hit or miss a cache of
    ``cache_bytes`` according to the operand's column popularity, with its own costs
    for k = 1); the trees correct it in log time on the variables of
    :data:`STRUCTURE_TREE_FEATURES`, clipped to the fitted box (``z_min``/``z_max``),
    so that outside the measured shapes only the base scales. ``predict`` takes
    ``structure`` (the arrays of :mod:`plexus_tune.model.sparsity`; None: uniformly
    random nonzeros). Fitting chooses ``cache_bytes`` from
    :data:`plexus_tune.fit.spmm_kinds.CACHE_BYTES_CANDIDATES` by the base's relative error. docs/model.md
    (SpMM kinds, structure-boosted).
    """

    name = "structure-boosted"
    n_parameters = 100
    uses_structure = True

    def __init__(self, bytes_per_element: float = 4):
        self.bytes_per_element = bytes_per_element
        self.coefficients = self.cache_bytes = None
        self.z_min = self.z_max = None
        self.depth = self.learning_rate = self.init = None
        self.feature = self.threshold = self.leaf = None

    def _trees(self) -> dict:
        return {"depth": self.depth, "learning_rate": self.learning_rate, "init": self.init,
                "feature": self.feature, "threshold": self.threshold, "leaf": self.leaf}

    def base_ms(self, nnz, rows, common, dense_cols, structure=None) -> np.ndarray:
        """The base alone: sum_j coef[j] term_j (ms)."""
        self._check_fitted("coefficients")
        terms, _ = structure_features(nnz, rows, common, dense_cols, structure, cache_bytes=self.cache_bytes,
                                      bytes_per_element=self.bytes_per_element)
        return terms @ np.asarray(self.coefficients, dtype=np.float64)

    def predict(self, nnz, rows, common, dense_cols, structure=None) -> np.ndarray:
        self._check_fitted("coefficients")
        terms, z = structure_features(nnz, rows, common, dense_cols, structure, cache_bytes=self.cache_bytes,
                                      bytes_per_element=self.bytes_per_element)
        base = np.maximum(terms @ np.asarray(self.coefficients, dtype=np.float64), TINY_MS)
        flat = np.clip(z.reshape(-1, z.shape[-1]), self.z_min, self.z_max)
        correction = boosted_correction(self._trees(), flat).reshape(z.shape[:-1])
        return base * np.exp(correction)

    def to_dict(self) -> dict:
        self._check_fitted("coefficients")
        return {"kind": self.name, "bytes_per_element": self.bytes_per_element, "cache_bytes": float(self.cache_bytes),
                "terms": [f"{t} (k={one})" for one in ("1", ">1") for t in STRUCTURE_BASE_TERMS],
                "coefficients": [float(v) for v in self.coefficients],
                "z_min": [float(v) for v in self.z_min], "z_max": [float(v) for v in self.z_max],
                "depth": self.depth, "learning_rate": self.learning_rate, "init": self.init,
                "feature": self.feature.tolist(), "threshold": self.threshold.tolist(), "leaf": self.leaf.tolist()}

    @classmethod
    def from_dict(cls, data: Mapping) -> "StructureBoosted":
        kind = cls.name
        size = data.get("bytes_per_element", 4)
        if isinstance(size, bool) or not isinstance(size, (int, float)) or not size > 0:
            raise UserError(f"{kind} SpMM model: 'bytes_per_element' must be a positive number, got {size!r}")
        model = cls(bytes_per_element=size)
        model.cache_bytes = _float(data, "cache_bytes", kind)
        if model.cache_bytes <= 0:
            raise UserError(f"{kind} SpMM model: 'cache_bytes' must be > 0, got {model.cache_bytes!r}")
        coef = _floats(data, "coefficients", kind)
        if coef.shape != (2 * len(STRUCTURE_BASE_TERMS),) or np.any(coef < 0):
            raise UserError(f"{kind} SpMM model: 'coefficients' must be {2 * len(STRUCTURE_BASE_TERMS)} numbers >= 0")
        model.coefficients = coef
        variables = len(STRUCTURE_TREE_FEATURES)
        model.z_min, model.z_max = _floats(data, "z_min", kind), _floats(data, "z_max", kind)
        if model.z_min.shape != (variables,) or model.z_max.shape != (variables,):
            raise UserError(f"{kind} SpMM model is inconsistent: z_min and z_max need {variables} entries")
        depth = _float(data, "depth", kind)
        if depth != int(depth) or depth < 0:
            raise UserError(f"{kind} SpMM model: 'depth' must be a non-negative integer, got {data['depth']!r}")
        model.depth = int(depth)
        model.learning_rate, model.init = _float(data, "learning_rate", kind), _float(data, "init", kind)
        model.feature = _floats(data, "feature", kind).astype(np.int64)
        model.threshold, model.leaf = _floats(data, "threshold", kind), _floats(data, "leaf", kind)
        _check_trees(model._trees(), variables)
        return model

    def describe(self) -> str:
        return (f"{self.name}: {len(self.feature)} trees of depth {self.depth} on shape and structure, correcting a "
                f"cache-aware roofline (cache {self.cache_bytes / 2**20:.0f} MiB)")

    def scaled(self, factor: float) -> "StructureBoosted":
        out = self.from_dict(self.to_dict())
        out.coefficients = out.coefficients * factor
        return out


# --------------------------------------------------------------------------- registry

#: kind name -> class; the name is what ``fit --kind`` takes and a profile's ``spmm.kind`` holds
SPMM_MODELS: dict[str, type[SpmmKind]] = {cls.name: cls for cls in (Paper, PaperSpmm, Roofline, Learned, LearnedRoofline, LearnedBoosted,
                                                                   StructureBoosted)}
#: the kinds fitted from SpMM timings, cheapest first
FIT_KINDS = tuple(name for name, cls in SPMM_MODELS.items() if cls.fittable)


def current_kind(data: Mapping) -> str:
    """The kind of an ``spmm`` entry, with the names of older profiles mapped to today's.

    ``boosted`` is ``learned-boosted``; ``learned`` with a ``base`` is
    ``learned-roofline`` (the base must be a roofline); every other name is kept.
    """
    kind = data.get("kind")
    if kind == "boosted":
        return "learned-boosted"
    if kind == "learned" and data.get("base"):
        base = data["base"]
        if not isinstance(base, Mapping) or current_kind(base) != "roofline":
            base_kind = base.get("kind") if isinstance(base, Mapping) else type(base).__name__
            raise UserError(f"learned SpMM model corrects a {base_kind!r} model; only a roofline base is supported (kind 'learned-roofline')")
        return "learned-roofline"
    return kind


def spmm_model_from_dict(data) -> SpmmKind:
    """The model of an ``spmm`` entry (a profile's dict; a model passes through)."""
    if isinstance(data, SpmmKind):
        return data
    if not isinstance(data, Mapping):
        raise UserError(f"an SpMM model must be an object with a 'kind', not {type(data).__name__}")
    kind = current_kind(data)
    cls = SPMM_MODELS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise UserError(f"unknown SpMM model kind {kind!r}; known kinds: {', '.join(SPMM_MODELS)}")
    return cls.from_dict(data)


def describe_spmm_model(model) -> str:
    """One line naming a model's kind and size, its base models included (for listings)."""
    return spmm_model_from_dict(model).describe()


def predict_spmm_ms(model, nnz, rows, common, dense_cols, structure=None, *, backward: bool = False) -> np.ndarray:
    """Time in ms of each SpMM described by the (broadcast) shape arrays; model: a dict or an SpmmKind.

    ``structure``: the operands' sparsity structure (arrays of :mod:`plexus_tune.model.sparsity`,
    None for uniformly random nonzeros), read by the kinds that use it. ``backward``: the
    SpMM is a layer's backward A^T dH (read by the directional kind ``paper``).
    """
    kind = spmm_model_from_dict(model)
    if kind.directional:
        return np.asarray(kind.predict(nnz, rows, common, dense_cols, backward=backward), dtype=np.float64)
    if kind.uses_structure:
        return np.asarray(kind.predict(nnz, rows, common, dense_cols, structure), dtype=np.float64)
    return np.asarray(kind.predict(nnz, rows, common, dense_cols), dtype=np.float64)
