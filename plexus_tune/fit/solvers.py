"""Least-squares solvers shared by the fitted models (defined in :mod:`plexus_tune.model.solvers`)."""

from __future__ import annotations

from plexus_tune.model.solvers import RIDGE_ALPHAS, nnls_relative, ridge_loo  # noqa: F401
