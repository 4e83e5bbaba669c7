"""Fit machine-profile coefficients from measurements, and score fits on held-out data.

Scikit-learn-like: ``fit_*`` functions take a pandas DataFrame and return a fitted model
with ``predict(df)`` (ms), ``scores`` (mean over repeated random 70/30 splits of train
and test R^2, RMSE in ms and MAPE in %) and ``to_dict()`` (the machine-profile entry).

- :func:`fit_spmm`: per-SpMM time from (nnz, rows, common, dense_cols). Kinds
  ``paper`` (DESIGN.md 4.1 for one SpMM, ordinary least squares as in the paper),
  ``roofline`` (non-negative costs per term, least squares on relative error),
  ``learned`` (ridge regression on polynomial features of the log shape and the cache
  lines per dense row (:func:`plexus_tune.spmm_models.cache_lines_per_row`) predicting log time;
  ``learned-roofline`` is the same as a multiplicative correction of the roofline;
  ``learned-boosted`` adds gradient-boosted regression trees on those features and the
  logs of nonzeros per row, output and dense-input elements, correcting the log
  residual of ``learned-roofline``, for kernels whose cost steps),
  ``auto`` (the kind with the lowest mean held-out MAPE).
- :func:`fit_collectives`: alpha (per step latency) and beta (bus bandwidth) per tier,
  intra-node (nodes == 1) and inter-node (nodes > 1), from the ring formulas
  (DESIGN.md 4.2): t = steps alpha + factor M / beta with steps 2(g-1), factor 2(g-1)/g
  for all-reduce and steps g-1, factor (g-1)/g for all-gather and reduce-scatter.
- :func:`fit_gemm`: t = overhead + 2 m n k / (tflops 1e12).
- :func:`fit_epoch`: non-negative scale factors of the predicted breakdown and an
  overhead per epoch, from trainer runs: epoch = s_spmm spmm + s_gemm gemm + s_comm comm
  + s_other other + overhead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from plexus_tune import spmm_models
from plexus_tune.errors import UserError

SPMM_COLUMNS = ("nnz", "rows", "common", "dense_cols", "time_ms")
COLLECTIVE_COLUMNS = ("op", "group_size", "nodes", "message_bytes", "time_ms")
GEMM_COLUMNS = ("rows", "inner", "cols", "time_ms")
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter")
SPMM_KINDS = ("paper", "roofline", "learned", "learned-roofline", "learned-boosted")
#: parameters each kind estimates (the minimum number of rows is derived from it)
#: The feature set of the learned kinds (see plexus_tune.spmm_models.LEARNED_FEATURES).
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
DEFAULT_SPLITS = 1000
TRAIN_FRACTION = 0.7
RIDGE_ALPHAS = np.logspace(-6, 3, 19)


def min_rows(parameters: int) -> int:
    """Rows needed so that a 70 % training split still over-determines the parameters."""
    return max(5, math.ceil((parameters + 2) / TRAIN_FRACTION))


# --------------------------------------------------------------------------- input checks


def _where(df, pos: int) -> str:
    lines = df.attrs.get("line_numbers")
    source = df.attrs.get("source")
    if lines is not None and source:
        return f"{source} line {lines[pos]}"
    return f"row {pos + 1}"


def check_frame(df, columns, *, positive=("time_ms",), numeric=None, min_count: int = 1, what: str = "measurements"):
    """Check a measurement table; UserError naming the column or row at fault.

    Every column in ``columns`` must exist; numeric columns must hold finite numbers;
    columns in ``positive`` must be > 0; at least ``min_count`` rows.
    """
    import pandas as pd

    if not isinstance(df, pd.DataFrame):
        raise UserError(f"{what} must be a table (pandas DataFrame), not {type(df).__name__}")
    source = df.attrs.get("source", what)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        have = ", ".join(map(str, df.columns)) or "none"
        raise UserError(f"{source}: missing column {missing[0]!r} (needs {', '.join(columns)}; has {have})")
    numeric = [c for c in columns if c != "op"] if numeric is None else numeric
    for col in numeric:
        values = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raw = df[col].iloc[bad[0]]
            raise UserError(f"{_where(df, int(bad[0]))}: column {col!r} is {raw!r}, not a finite number")
        if col in positive:
            bad = np.flatnonzero(values <= 0)
            if bad.size:
                raise UserError(f"{_where(df, int(bad[0]))}: {col} = {values[bad[0]]:g} must be > 0")
    if len(df) < min_count:
        raise UserError(f"{source}: {len(df)} rows of {what}, at least {min_count} needed")


def load_table(path, *, schema: str | None = None):
    """A measurement table from a CSV file or a JSON Lines log (plexus_tune.store).

    The frame's ``attrs`` remember the file and each row's line number so that errors
    can name the line.
    """
    import pandas as pd

    from plexus_tune.store import flatten_record, parse_lines

    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path} does not exist") from None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None
    if path.suffix.lower() == ".csv":
        import io

        try:
            df = pd.read_csv(io.BytesIO(data))
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise UserError(f"{path}: not a readable CSV file ({str(exc).splitlines()[0]})") from None
        line_numbers = list(range(2, len(df) + 2))
    else:
        import warnings

        records, problems = parse_lines(data)
        if problems:
            warnings.warn(f"{path}: skipped {len(problems)} bad line(s): {'; '.join(map(str, problems[:5]))}", stacklevel=2)
        lines = _record_line_numbers(data)
        kept = []
        from plexus_tune.store import record_type

        want = record_type({"schema": schema}) if schema else None
        good_lines = [n for n in lines if n not in {p.line for p in problems}]
        for number, rec in zip(good_lines, records):
            if want is None or record_type(rec) == want:
                kept.append((number, rec))
        df = pd.DataFrame([flatten_record(r) for _, r in kept])
        line_numbers = [n for n, _ in kept]
    df.attrs["source"] = str(path)
    df.attrs["line_numbers"] = line_numbers
    return df


def _record_line_numbers(data: bytes) -> list[int]:
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines = lines[:-1]
    return [i for i, raw in enumerate(lines, start=1) if raw.strip()]


# --------------------------------------------------------------------------- scoring


def regression_scores(observed, predicted) -> dict:
    """R^2, RMSE (ms) and MAPE (%) of predicted against observed."""
    observed = np.asarray(observed, dtype=np.float64)
    predicted = np.asarray(predicted, dtype=np.float64)
    resid = observed - predicted
    ss_tot = float(np.sum((observed - observed.mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid**2)) / ss_tot if ss_tot > 0 else float("nan")
    return {
        "r2": r2,
        "rmse_ms": float(np.sqrt(np.mean(resid**2))),
        "mape": float(100.0 * np.mean(np.abs(resid) / np.abs(observed))),
    }


def single_threaded_blas():
    """Context limiting BLAS to one thread (no-op if threadpoolctl is missing)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(limits=1)


def split_indices(n: int, n_splits: int = DEFAULT_SPLITS, *, train_fraction: float = TRAIN_FRACTION, seed: int = 0):
    """(train, test) index arrays of shape (n_splits, n_train) and (n_splits, n - n_train)."""
    n_train = int(round(train_fraction * n))
    n_train = min(max(n_train, 1), n - 1)
    rng = np.random.default_rng(seed)
    order = np.argsort(rng.random((n_splits, n)), axis=1)
    return order[:, :n_train], order[:, n_train:]


def repeated_split_scores(
    fit: Callable[[np.ndarray], Callable[[np.ndarray], np.ndarray]],
    y: np.ndarray,
    *,
    n_splits: int = DEFAULT_SPLITS,
    seed: int = 0,
    train_fraction: float = TRAIN_FRACTION,
) -> dict:
    """Mean (and std) train/test scores over repeated random splits.

    ``fit(train_idx)`` fits on those rows and returns ``predict(idx)`` giving ms for rows.
    """
    y = np.asarray(y, dtype=np.float64)
    train, test = split_indices(len(y), n_splits, train_fraction=train_fraction, seed=seed)
    rows = {"train": [], "test": []}
    with single_threaded_blas():  # many tiny solves: threads only add overhead
        for tr, te in zip(train, test):
            predict = fit(tr)
            rows["train"].append(regression_scores(y[tr], predict(tr)))
            rows["test"].append(regression_scores(y[te], predict(te)))
    out: dict = {"splits": int(n_splits), "train_fraction": train_fraction}
    for part, scores in rows.items():
        for key in ("r2", "rmse_ms", "mape"):
            values = np.array([s[key] for s in scores])
            out[f"{part}_{key}"] = float(np.nanmean(values))
            out[f"{part}_{key}_std"] = float(np.nanstd(values))
    return out


# --------------------------------------------------------------------------- solvers


def nnls_relative(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative w minimizing sum(((X w - y) / y) ** 2) (columns rescaled for conditioning)."""
    from scipy.optimize import nnls

    A = X / y[:, None]
    norms = np.linalg.norm(A, axis=0)
    norms[norms == 0] = 1.0
    w, _ = nnls(A / norms, np.ones_like(y), maxiter=50 * X.shape[1] + 100)
    return w / norms


def ridge_loo(Phi: np.ndarray, t: np.ndarray, alphas=RIDGE_ALPHAS) -> dict:
    """Ridge regression of t on standardized Phi, alpha chosen by exact leave-one-out error.

    Returns mean, scale, coef, intercept, alpha (and its leave-one-out mean squared error
    ``loo_mse``) with t ~ intercept + ((Phi - mean)/scale) @ coef.
    """
    mean = Phi.mean(axis=0)
    scale = Phi.std(axis=0)
    scale[scale == 0] = 1.0
    Z = (Phi - mean) / scale
    intercept = float(t.mean())
    tc = t - intercept
    # eigen-decomposition of the small Gram matrix: Z = U S V^T with U S = Z V
    evals, V = np.linalg.eigh(Z.T @ Z)
    evals = np.maximum(evals, 0.0)
    ZV = Z @ V
    ZVt = ZV.T @ tc  # = S U^T tc
    ZV2 = ZV**2
    n = len(t)
    best = None
    for alpha in alphas:
        inv = 1.0 / (evals + alpha)
        coef_v = inv * ZVt
        fitted = ZV @ coef_v
        h = ZV2 @ inv + 1.0 / n
        loo = np.mean(((tc - fitted) / np.maximum(1.0 - h, 1e-9)) ** 2)
        if best is None or loo < best[0]:
            best = (loo, alpha, V @ coef_v)
    loo, alpha, coef = best
    return {"mean": mean, "scale": scale, "coef": coef, "intercept": intercept, "alpha": float(alpha), "loo_mse": float(loo)}


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
        """The machine profile's ``spmm`` entry (evaluated by plexus_tune.spmm_models)."""
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


# --------------------------------------------------------------------------- collectives


def ring_terms(op, group_size) -> tuple[np.ndarray, np.ndarray]:
    """(steps, factor) of the ring formula per row: all-reduce 2(g-1), 2(g-1)/g; others g-1, (g-1)/g."""
    op = np.asarray(op)
    g = np.asarray(group_size, dtype=np.float64)
    bad = ~np.isin(op, COLLECTIVE_OPS)
    if np.any(bad):
        raise UserError(f"unknown collective op {str(op[bad][0])!r}; expected one of {', '.join(COLLECTIVE_OPS)}")
    mult = np.where(op == "all_reduce", 2.0, 1.0)
    return mult * (g - 1.0), mult * (g - 1.0) / g


def bus_bandwidth_gbps(op, group_size, message_bytes, time_ms) -> tuple[np.ndarray, np.ndarray]:
    """(algbw, busbw) in GB/s with nccl-tests conventions: algbw = M / t, busbw = algbw * factor."""
    _, factor = ring_terms(op, group_size)
    algbw = np.asarray(message_bytes, dtype=np.float64) / (np.asarray(time_ms, dtype=np.float64) * 1e-3) / 1e9
    return algbw, algbw * factor


@dataclass
class CollectiveModel:
    """alpha (us per ring step) and beta (bus bandwidth, GB/s) per tier (intra, inter).

    With a ``table`` (entries op, stride, group, beta_gbps), a row whose (op, stride,
    group size) is listed uses that bus bandwidth instead of its tier's beta.
    """

    tiers: dict
    table: list = field(default_factory=list)
    scores: dict = field(default_factory=dict)
    n_samples: int = 0

    def predict(self, df) -> np.ndarray:
        """time_ms = steps alpha + factor M / beta, with the tier chosen by nodes (1: intra)."""
        op = np.asarray(df["op"]).astype(str)
        g = np.asarray(df["group_size"])
        steps, factor = ring_terms(op, g)
        inter = np.asarray(df["nodes"], dtype=np.float64) > 1
        alpha_us = np.where(inter, self._get("inter", "alpha_us"), self._get("intra", "alpha_us"))
        beta = np.where(inter, self._get("inter", "beta_gbps"), self._get("intra", "beta_gbps")).astype(np.float64)
        if self.table and "stride" in df:
            stride = np.asarray(df["stride"])
            for e in self.table:
                hit = (op == e["op"]) & (stride == e["stride"]) & (g == e["group"])
                beta = np.where(hit, e["beta_gbps"], beta)
        m = np.asarray(df["message_bytes"], dtype=np.float64)
        return steps * alpha_us * 1e-3 + factor * m / (beta * 1e9) * 1e3

    def _get(self, tier: str, key: str) -> float:
        t = self.tiers.get(tier) or self.tiers.get("intra") or self.tiers.get("inter")
        return float(t[key])

    def to_dict(self) -> dict:
        """The machine profile's ``collectives`` entry (inter copies intra if not measured)."""
        intra = self.tiers.get("intra") or self.tiers["inter"]
        inter = self.tiers.get("inter") or intra
        out = {
            "alpha_intra_us": intra["alpha_us"],
            "beta_intra_gbps": intra["beta_gbps"],
            "alpha_inter_us": inter["alpha_us"],
            "beta_inter_gbps": inter["beta_gbps"],
        }
        if self.table:
            out["bandwidth_table"] = [
                {"stride": [e["stride"], e["stride"]], "group": [e["group"], e["group"]], "beta_gbps": e["beta_gbps"], "ops": [e["op"]]}
                for e in self.table
            ]
        if "inter" not in self.tiers:
            out["note"] = "no inter-node measurements: inter-node values copy the intra-node fit"
        return out


#: bandwidth reported when the bandwidth term fits to zero (latency-bound data only)
MAX_BETA_GBPS = 1e4


def _fit_alpha_beta(steps, factor, m, y) -> tuple[float, float]:
    X = np.stack([steps * 1e-3, factor * m * 1e-6], axis=1)  # alpha in us, 1/beta in 1/(GB/s)
    alpha_us, inv_beta = nnls_relative(X, y)
    return float(alpha_us), float(1.0 / max(inv_beta, 1.0 / MAX_BETA_GBPS))


def _fit_beta_given_alpha(steps, factor, m, y, alpha_us) -> float:
    """Least relative error 1/beta >= 0 with alpha fixed: t - steps alpha = factor M / beta."""
    a = factor * m * 1e-6 / y
    b = 1.0 - steps * alpha_us * 1e-3 / y
    inv = max(float(a @ b) / float(a @ a), 1.0 / MAX_BETA_GBPS)
    return 1.0 / inv


def _fit_collective_rows(idx, op, steps, factor, m, y, inter, stride, g, table: bool):
    tiers = {}
    for tier, mask in (("intra", ~inter), ("inter", inter)):
        sel = idx[mask[idx]]
        if len(sel) >= 2:
            alpha, beta = _fit_alpha_beta(steps[sel], factor[sel], m[sel], y[sel])
            tiers[tier] = {"alpha_us": alpha, "beta_gbps": beta, "samples": int(len(sel))}
    entries = []
    if table and stride is not None and tiers:
        keys = sorted({(op[i], int(stride[i]), int(g[i])) for i in idx})
        for o, p, gs in keys:
            sel = idx[(op[idx] == o) & (stride[idx] == p) & (g[idx] == gs) & ~inter[idx]]
            if len(sel) >= 2:
                alpha = tiers.get("intra", tiers.get("inter"))["alpha_us"]
                beta = _fit_beta_given_alpha(steps[sel], factor[sel], m[sel], y[sel], alpha)
                entries.append({"op": o, "stride": p, "group": gs, "beta_gbps": float(beta)})
    return tiers, entries


def collective_time_sharing(df, host_cores: int | None) -> np.ndarray:
    """Per row, the :func:`~plexus_tune.machine.time_sharing_factor` the measurement ran under.

    A CPU calibration of ``world_size`` ranks on ``machine_info.cpu_count`` cores (else
    ``host_cores``) with ``threads_per_rank`` threads (default max(1, cores // world))
    took ``factor`` times as long as one rank alone would; dividing by it gives the
    per-rank time the cost model's collectives describe. 1 where ``host_cores`` is
    None or the world size is unknown.
    """
    from plexus_tune.machine import time_sharing_factor

    n = len(df)
    if host_cores is None or "world_size" not in df:
        return np.ones(n)
    world = pd_numeric(df["world_size"], np.nan)
    cores = pd_numeric(df["machine_info.cpu_count"], host_cores) if "machine_info.cpu_count" in df else np.full(n, float(host_cores))
    default_threads = np.maximum(1, np.floor(cores / np.maximum(world, 1)))
    threads = pd_numeric(df["threads_per_rank"], np.nan) if "threads_per_rank" in df else np.full(n, np.nan)
    threads = np.where(np.isfinite(threads), threads, default_threads)
    factor = time_sharing_factor(np.where(np.isfinite(world), world, 1), threads, cores)
    return np.where(np.isfinite(world), factor, 1.0)


def pd_numeric(column, fill: float) -> np.ndarray:
    """A column as float64 with missing or non-numeric entries replaced by ``fill``."""
    import pandas as pd

    values = pd.to_numeric(column, errors="coerce").to_numpy(dtype=np.float64)
    return np.where(np.isfinite(values), values, fill)


def fit_collectives(df, *, n_splits: int = DEFAULT_SPLITS, seed: int = 0, table: bool = False) -> CollectiveModel:
    """Fit alpha and beta per tier (intra: nodes == 1, inter: nodes > 1) to ring formulas.

    df columns: op, group_size, nodes, message_bytes (full buffer), time_ms (and stride,
    for ``table``). Rows with a group of one rank carry no ring term and are ignored.
    Least squares on relative error with alpha, 1/beta >= 0. With ``table``, every
    intra-node (op, stride, group size) also gets its own bus bandwidth (alpha kept
    from the tier fit): the profile's ``bandwidth_table``.
    """
    check_frame(df, COLLECTIVE_COLUMNS, positive=("group_size", "nodes", "message_bytes", "time_ms"), min_count=2, what="collective measurements")
    df = df[np.asarray(df["group_size"], dtype=np.float64) > 1].reset_index(drop=True)
    if len(df) < 2:
        raise UserError("collective measurements: fewer than 2 rows with group_size > 1; measure groups of 2 or more ranks")
    op = np.asarray(df["op"]).astype(str)
    g = np.asarray(df["group_size"]).astype(np.int64)
    steps, factor = ring_terms(op, g)
    m = np.asarray(df["message_bytes"], dtype=np.float64)
    y = np.asarray(df["time_ms"], dtype=np.float64)
    inter = np.asarray(df["nodes"], dtype=np.float64) > 1
    if table and "stride" not in df:
        raise UserError("collective measurements: missing column 'stride' (needed for a bandwidth table)")
    stride = np.asarray(df["stride"]).astype(np.int64) if "stride" in df else None
    args = (op, steps, factor, m, y, inter, stride, g, table)
    tiers, entries = _fit_collective_rows(np.arange(len(y)), *args)
    model = CollectiveModel(tiers=tiers, table=entries, n_samples=len(y))
    if n_splits > 0 and len(y) >= 5:

        def fit_rows(idx):
            t, e = _fit_collective_rows(idx, *args)
            sub = CollectiveModel(tiers=t or tiers, table=e)
            return lambda rows: sub.predict(df.iloc[rows])

        model.scores = repeated_split_scores(fit_rows, y, n_splits=n_splits, seed=seed)
    return model


# --------------------------------------------------------------------------- GEMM


@dataclass
class GemmModel:
    """t = overhead_ms + 2 m n k / (tflops 1e12) * 1e3."""

    tflops: float
    overhead_ms: float
    scores: dict = field(default_factory=dict)

    def predict(self, df) -> np.ndarray:
        flops = 2.0 * np.asarray(df["rows"], float) * np.asarray(df["inner"], float) * np.asarray(df["cols"], float)
        return self.overhead_ms + flops / (self.tflops * 1e12) * 1e3

    def to_dict(self) -> dict:
        return {"gemm_tflops": self.tflops, "gemm_overhead_ms": self.overhead_ms}


def fit_gemm(df, *, n_splits: int = DEFAULT_SPLITS, seed: int = 0) -> GemmModel:
    """Fit GEMM throughput and a fixed overhead (non-negative, relative least squares).

    When the fit puts all time in the overhead (tiny GEMMs), the rate is bounded by the
    fastest measurement instead: tflops = max(flops / time).
    """
    check_frame(df, GEMM_COLUMNS, positive=GEMM_COLUMNS, min_count=min_rows(2), what="GEMM measurements")
    flops = 2.0 * np.prod([np.asarray(df[c], float) for c in ("rows", "inner", "cols")], axis=0)
    y = np.asarray(df["time_ms"], float)
    X = np.stack([np.ones_like(y), flops * 1e-9], axis=1)  # ms, ms per GFLOP

    def solve(idx):
        over, per_gflop = nnls_relative(X[idx], y[idx])
        if per_gflop <= 0:  # every GEMM overhead-bound: bound the rate by the fastest one observed
            per_gflop = float(np.min(y[idx] / X[idx, 1]))
        return GemmModel(tflops=1.0 / per_gflop, overhead_ms=float(over))

    model = solve(np.arange(len(y)))
    if n_splits > 0:

        def fit_rows(idx):
            sub = solve(idx)
            return lambda rows: sub.predict(df.iloc[rows])

        model.scores = repeated_split_scores(fit_rows, y, n_splits=n_splits, seed=seed)
    return model


# --------------------------------------------------------------------------- epoch level

EPOCH_COMPONENTS = ("spmm_ms", "gemm_ms", "comm_ms", "other_ms")


@dataclass
class EpochModel:
    """epoch_ms = sum_c scale[c] * predicted[c] + overhead_ms (all coefficients >= 0)."""

    scales: dict
    overhead_ms: float
    scores: dict = field(default_factory=dict)
    method: str = "total"

    def predict(self, df) -> np.ndarray:
        out = np.full(len(df), self.overhead_ms, dtype=np.float64)
        for comp, s in self.scales.items():
            out = out + s * np.asarray(df[comp], dtype=np.float64)
        return out

    def to_dict(self) -> dict:
        return {"scales": dict(self.scales), "overhead_ms": self.overhead_ms, "method": self.method}


def fit_epoch(
    df,
    *,
    observed: str = "epoch_ms",
    components=EPOCH_COMPONENTS,
    breakdown_prefix: str = "observed_",
    n_splits: int = DEFAULT_SPLITS,
    seed: int = 0,
) -> EpochModel:
    """Fit non-negative scale factors of predicted components and an epoch overhead.

    df holds one row per run: the model's predicted components (``components``, ms)
    and the observed epoch time (``observed``). Components that are zero everywhere
    keep scale 1. Two methods:

    - ``breakdown``, when df also holds the observed components (``observed_spmm_ms``...,
      the trainer's breakdown): each component's own scale b_c from observed_c = b_c
      predicted_c (relative least squares), then an overlap factor a and the overhead
      from the epoch time: epoch = a sum_c b_c predicted_c + overhead. Scales are
      a b_c. Every coefficient is pinned by its own data, so the scales say how far
      each part of the model is off.
    - ``total`` otherwise: epoch = sum_c s_c predicted_c + overhead by non-negative
      relative least squares on epoch times alone (parts that vary together across
      configurations can trade their scales).
    """
    comps = [c for c in components if c in df.columns]
    if not comps:
        raise UserError(f"trainer runs: missing column {components[0]!r} (predicted breakdown)")
    check_frame(df, tuple(comps) + (observed,), positive=(observed,), min_count=min_rows(len(comps) + 1), what="trainer runs")
    y = np.asarray(df[observed], dtype=np.float64)
    P = np.stack([np.asarray(df[c], dtype=np.float64) for c in comps], axis=1)
    active = np.any(P != 0, axis=0)
    breakdown_cols = [f"{breakdown_prefix}{c}" for c in comps]
    method = "breakdown" if all(c in df.columns for c in breakdown_cols) else "total"
    if method == "breakdown":
        O = np.stack([pd_numeric(df[c], np.nan) for c in breakdown_cols], axis=1)
        predicted = P[:, active] > 0
        if not np.all(np.isfinite(O[:, active])) or np.any(O[:, active] < 0) or np.any(predicted & (O[:, active] <= 0)):
            method = "total"  # a breakdown is missing where the model predicts the part

    def solve(idx):
        scales = {c: 1.0 for c in comps}
        if method == "breakdown":
            b = np.ones(len(comps))
            for j in np.flatnonzero(active):
                seen = idx[(O[idx, j] > 0) & (P[idx, j] > 0)]  # runs where the part happened and is predicted
                b[j] = nnls_relative(P[seen, j : j + 1], O[seen, j])[0] if len(seen) else 1.0
            a, overhead = nnls_relative(np.stack([P[idx] @ b, np.ones(len(idx))], axis=1), y[idx])
            for j, c in enumerate(comps):
                if active[j]:
                    scales[c] = float(a * b[j])
            return EpochModel(scales=scales, overhead_ms=float(overhead), method=method)
        X = np.concatenate([P[idx][:, active], np.ones((len(idx), 1))], axis=1)
        w = nnls_relative(X, y[idx])
        for c, v in zip(np.array(comps)[active], w[:-1]):
            scales[str(c)] = float(v)
        return EpochModel(scales=scales, overhead_ms=float(w[-1]), method=method)

    model = solve(np.arange(len(y)))
    if n_splits > 0:

        def fit_rows(idx):
            sub = solve(idx)
            return lambda rows: sub.predict(df.iloc[rows])

        model.scores = repeated_split_scores(fit_rows, y, n_splits=n_splits, seed=seed)
    return model


def scores_table_rows(all_scores: Mapping) -> list[dict]:
    """Flat rows (kind, train/test R^2, RMSE, MAPE) for printing or saving."""
    rows = []
    for kind, s in all_scores.items():
        rows.append({"kind": kind, **{k: s.get(k) for k in ("train_r2", "test_r2", "train_rmse_ms", "test_rmse_ms", "train_mape", "test_mape")}})
    return rows


# --------------------------------------------------------------------------- profiles

#: floor for a fitted epoch scale factor (a zero would make a rate infinite)
MIN_SCALE = 0.05


def scale_spmm_entry(entry: Mapping, s: float) -> dict:
    """An SpMM model entry whose predictions are multiplied by s."""
    entry = dict(entry)
    kind = entry.get("kind")
    if kind in ("paper", "paper-spmm"):
        for key in ("c0", "c1", "c2"):
            entry[key] = float(entry[key]) * s
    elif kind == "roofline":
        entry["coefficients"] = {k: float(v) * s for k, v in entry["coefficients"].items()}
    elif kind == "learned":
        entry["intercept"] = float(entry["intercept"]) + math.log(s)
    elif kind == "boosted":
        entry["init"] = float(entry["init"]) + math.log(s)
    else:
        raise UserError(f"cannot rescale an SpMM model of kind {kind!r}")
    return entry


def apply_epoch_fit(profile: Mapping, epoch: "EpochModel") -> dict:
    """Fold epoch-level scale factors into a profile's rates; the overhead goes to ``epoch_overhead_ms``.

    spmm times x s_spmm; gemm_tflops / s_gemm; collective alpha x s_comm and every beta
    / s_comm; elementwise_gbps / s_other. Scales below :data:`MIN_SCALE` are raised to it.
    """
    out = json_copy(profile)
    s = {k: max(float(v), MIN_SCALE) for k, v in epoch.scales.items()}
    if "spmm_ms" in s:
        out["spmm"] = scale_spmm_entry(out["spmm"], s["spmm_ms"])
    if "gemm_ms" in s:
        out["gemm_tflops"] = float(out["gemm_tflops"]) / s["gemm_ms"]
    if "comm_ms" in s:
        coll = dict(out["collectives"])
        for key in ("alpha_intra_us", "alpha_inter_us"):
            coll[key] = float(coll[key]) * s["comm_ms"]
        for key in ("beta_intra_gbps", "beta_inter_gbps"):
            coll[key] = float(coll[key]) / s["comm_ms"]
        if coll.get("bandwidth_table"):
            coll["bandwidth_table"] = [{**e, "beta_gbps": float(e["beta_gbps"]) / s["comm_ms"]} for e in coll["bandwidth_table"]]
        out["collectives"] = coll
    if "other_ms" in s and out.get("elementwise_gbps"):
        out["elementwise_gbps"] = float(out["elementwise_gbps"]) / s["other_ms"]
    out["epoch_overhead_ms"] = float(epoch.overhead_ms)
    return out


def json_copy(value):
    """A deep copy made of plain JSON types."""
    import json

    return json.loads(json.dumps(value))


def profile_json_text(profile) -> str:
    """JSON text of a profile: indented objects, every list of numbers or strings on one line."""
    import json
    import re

    text = json.dumps(json_copy(profile), indent=2)
    # a list holding no list or object: join its lines (JSON strings hold no raw newline,
    # so only whitespace between elements is touched)
    return re.sub(r"\[\s*\n\s*([^\[\]{}]*?)\s*\n\s*\]", lambda m: "[" + re.sub(r",\n\s*", ", ", m.group(1)) + "]", text) + "\n"
