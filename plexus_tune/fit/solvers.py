"""Least-squares solvers the estimators share (numpy; scipy's NNLS imported when first used)."""

from __future__ import annotations

import numpy as np

#: ridge penalties tried by :func:`ridge_loo`
RIDGE_ALPHAS = np.logspace(-6, 3, 19)


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
    ``loo_mse``) with t ~ intercept + ((Phi - mean)/scale) @ coef. With Z the
    standardized Phi, centred t and hat matrix H = Z (Z^T Z + alpha I)^-1 Z^T + 1/n, the
    leave-one-out residual of row i is (t_i - fitted_i) / (1 - H_ii).
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
