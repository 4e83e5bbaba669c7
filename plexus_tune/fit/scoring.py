"""Scores of fitted models on held-out data: R^2, RMSE, MAPE over repeated random splits."""

from __future__ import annotations
import math
from collections.abc import Callable
import numpy as np


DEFAULT_SPLITS = 1000
TRAIN_FRACTION = 0.7
RIDGE_ALPHAS = np.logspace(-6, 3, 19)


def min_rows(parameters: int) -> int:
    """Rows needed so that a 70 % training split still over-determines the parameters."""
    return max(5, math.ceil((parameters + 2) / TRAIN_FRACTION))

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
