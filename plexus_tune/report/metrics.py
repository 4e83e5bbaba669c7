"""Scores of predictions against observations, each defined once (docs/architecture.md, "Report").

``mape_percent`` is the fits' own (:func:`plexus_tune.fit.scoring.mape_percent`), re-exported
here with the rank and ratio scores of the report.
"""

from __future__ import annotations

import numpy as np

from plexus_tune.fit.scoring import mape_percent

__all__ = ["group_scores", "mape_percent", "median_ratio", "r2_identity", "regret", "spearman"]


def spearman(a, b) -> float:
    """Spearman rank correlation (average ranks for ties); nan for fewer than 2 points."""
    import pandas as pd  # its average-rank is cheaper to import than scipy.stats

    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 2:
        return float("nan")
    ra, rb = pd.Series(a).rank().to_numpy(), pd.Series(b).rank().to_numpy()
    if np.std(ra) == 0 or np.std(rb) == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def regret(predicted, observed) -> float:
    """Observed time of the predicted best over the observed best (>= 1)."""
    predicted, observed = np.asarray(predicted, float), np.asarray(observed, float)
    return float(observed[int(np.argmin(predicted))] / observed.min())


def group_scores(predicted, observed) -> dict:
    predicted, observed = np.asarray(predicted, float), np.asarray(observed, float)
    return {
        "grids": int(len(observed)),
        "spearman": spearman(predicted, observed),
        "regret": regret(predicted, observed),
        "mape": mape_percent(predicted, observed),
    }


def median_ratio(predicted, observed) -> float:
    """Median of observed / predicted (1: no constant offset; 2: observed twice the prediction)."""
    p, o = np.asarray(predicted, dtype=float), np.asarray(observed, dtype=float)
    return float(np.median(o / p)) if len(o) else float("nan")


def r2_identity(predicted, observed) -> float:
    """R^2 of ``observed`` against the line y = x: 1 - sum (obs - pred)^2 / sum (obs - mean obs)^2."""
    p, o = np.asarray(predicted, dtype=float), np.asarray(observed, dtype=float)
    ss_tot = float(((o - o.mean()) ** 2).sum())
    if len(o) < 2 or ss_tot == 0:
        return float("nan")
    return 1.0 - float(((o - p) ** 2).sum()) / ss_tot
