"""Scores of fitted models on held-out data: R^2, RMSE, MAPE over repeated random splits."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping

import numpy as np

from plexus_tune import resources

#: the most random 70/30 splits a score is averaged over
DEFAULT_SPLITS = 1000
TRAIN_FRACTION = 0.7
#: stop scoring once the standard error of the mean held-out R^2 is at most this
#: (None or 0: score every split; see :func:`repeated_split_scores`): two standard
#: errors, the half-width of a 95 % interval, are then 0.005
R2_SEM = 0.0025
#: the share of a mean held-out score's variance that may come from the choice of splits. The mean
#: over J random splits holding out a fraction p of the rows has a variance of about
#: sigma^2 (1/J + p / (1 - p)), sigma^2 the variance of one split's score (Nadeau and Bengio,
#: "Inference for the generalization error"): the second part comes from the data and does not
#: shrink with J. At 0.05, J >= 47 for p = 0.3, and more splits shrink the score's standard
#: error by at most 2.5 % (:func:`split_cap`; docs/model.md, scoring)
SPLIT_VARIANCE_SHARE = 0.05
#: splits scored before the standard error is first looked at
MIN_SPLITS = 10
#: the standard error is looked at after every this many splits
CHECK_EVERY = 10
#: with n_jobs > 1, a model whose splits take less than this (s) each is scored in-process
PARALLEL_MIN_SECONDS = 0.005
_COLUMNS = ("r2", "rmse_ms", "mape")
#: standard errors of the mean MAPE by which a model must trail a rival before its scoring stops
RACE_SEMS = 4.0
#: splits every model of a race (:func:`race_split_scores`) scores before the first comparison
RACE_FIRST = 5


def split_cap(train_fraction: float = TRAIN_FRACTION, share: float = SPLIT_VARIANCE_SHARE) -> int:
    """Splits J past which the choice of splits holds at most ``share`` of the mean score's variance:
    the least multiple of :data:`CHECK_EVERY` with 1/J <= share p / (1 - p), p = 1 - train_fraction."""
    held_out = 1.0 - train_fraction
    need = train_fraction / (share * held_out)
    return int(math.ceil(need / CHECK_EVERY - 1e-9) * CHECK_EVERY)


def min_rows(parameters: int) -> int:
    """Rows needed so that a 70 % training split still over-determines the parameters."""
    return max(5, math.ceil((parameters + 2) / TRAIN_FRACTION))


def mape_percent(predicted, observed) -> float:
    """Mean absolute percentage error: 100 mean |predicted - observed| / |observed| (nan without data)."""
    p, o = np.asarray(predicted, dtype=float), np.asarray(observed, dtype=float)
    return float(100.0 * np.mean(np.abs(p - o) / np.abs(o))) if len(o) else float("nan")


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
        "mape": mape_percent(predicted, observed),
    }


_THREADPOOLS: dict = {}


def single_threaded_blas():
    """Context limiting BLAS and OpenMP to one thread (no-op if threadpoolctl is missing).

    The thread pools loaded are found once per process and found again only when a
    library has been loaded since (threadpoolctl's scan of the loaded libraries costs
    about 10 ms, more than a small fit)."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover
        import contextlib

        return contextlib.nullcontext()
    import sys

    loaded = len(sys.modules)  # a new extension module may bring a new thread pool
    if _THREADPOOLS.get("modules") != loaded:
        _THREADPOOLS["controller"], _THREADPOOLS["modules"] = ThreadpoolController(), loaded
    return _THREADPOOLS["controller"].limit(limits=1)


def split_indices(n: int, n_splits: int = DEFAULT_SPLITS, *, train_fraction: float = TRAIN_FRACTION, seed: int = 0):
    """(train, test) index arrays of shape (n_splits, n_train) and (n_splits, n - n_train).

    The first k splits do not depend on ``n_splits`` (k <= n_splits), so a run stopped
    early scored a prefix of the splits a full run scores.
    """
    n_train = int(round(train_fraction * n))
    n_train = min(max(n_train, 1), n - 1)
    rng = np.random.default_rng(seed)
    order = np.argsort(rng.random((n_splits, n)), axis=1)
    return order[:, :n_train], order[:, n_train:]


def _score_splits(fit, y: np.ndarray, train: np.ndarray, test: np.ndarray) -> np.ndarray:
    """Rows (train r2, rmse, mape, test r2, rmse, mape), one per split."""
    out = np.empty((len(train), 2 * len(_COLUMNS)))
    with single_threaded_blas():  # many tiny solves: threads only add overhead
        for i, (tr, te) in enumerate(zip(train, test)):
            predicted = fit(tr)(np.concatenate([tr, te]))  # one call: a model's fixed cost once
            a, b = regression_scores(y[tr], predicted[:len(tr)]), regression_scores(y[te], predicted[len(tr):])
            out[i] = [a[c] for c in _COLUMNS] + [b[c] for c in _COLUMNS]
    return out


def _score_pickled(payload: bytes, y: np.ndarray, train: np.ndarray, test: np.ndarray) -> np.ndarray:
    """:func:`_score_splits` in a worker, for a ``fit`` pickled by cloudpickle."""
    import pickle

    return _score_splits(pickle.loads(payload), y, train, test)


def _r2_sem(test_r2: np.ndarray) -> float:
    values = test_r2[np.isfinite(test_r2)]
    return float(np.std(values) / math.sqrt(len(values))) if len(values) > 1 else math.inf


def repeated_split_scores(
    fit: Callable[[np.ndarray], Callable[[np.ndarray], np.ndarray]],
    y: np.ndarray,
    *,
    n_splits: int = DEFAULT_SPLITS,
    seed: int = 0,
    train_fraction: float = TRAIN_FRACTION,
    r2_sem: float | None = None,
    min_splits: int = MIN_SPLITS,
    n_jobs: int = 1,
    progress: Callable[[int, int], None] | None = None,
    beaten_by: float | None = None,
    cap: int | None = None,
) -> dict:
    """Mean (and std) train/test scores over repeated random splits.

    ``fit(train_idx)`` fits on those rows and returns ``predict(idx)`` giving ms for rows.
    With ``r2_sem``, scoring stops at the first multiple of :data:`CHECK_EVERY` splits
    (at least ``min_splits``) where the standard error of the mean held-out R^2,
    std / sqrt(n), is at most ``r2_sem``; the splits scored are the first n of the
    ``n_splits``, and the result (``splits``: n, ``test_r2_sem``) does not depend on
    ``n_jobs``. ``cap`` (with ``r2_sem``): stop at the latest after that many splits
    (:func:`split_cap`). ``n_jobs`` > 1 scores batches of splits in that many worker processes
    when one split takes at least :data:`PARALLEL_MIN_SECONDS` (``fit`` must then
    pickle with cloudpickle, as closures do). ``progress(done, total)`` is called after
    each batch; total is ``n_splits`` until the run stops. ``beaten_by``: the held-out
    MAPE (%) of a rival; scoring stops at the first check (at least ``min_splits``) where
    this model's mean held-out MAPE less :data:`RACE_SEMS` standard errors exceeds it, as
    it can no longer be the lower (``beaten``: True in the result).
    """
    y = np.asarray(y, dtype=np.float64)
    train, test = split_indices(len(y), n_splits, train_fraction=train_fraction, seed=seed)
    adaptive = bool(r2_sem) and r2_sem > 0
    stop = n_splits
    rows = np.empty((0, 2 * len(_COLUMNS)))
    parallel = None
    beaten = False
    while len(rows) < stop:
        lo = len(rows)
        if parallel is None:
            # in-process; with n_jobs > 1 the first two splits time one split (the first pays
            # one-off costs such as imports), then the rest goes to the workers if it is slow
            hi = min(stop, lo + (2 if n_jobs > 1 and lo == 0 else CHECK_EVERY))
            first = min(lo + 1, hi) if lo == 0 else lo
            batch = _score_splits(fit, y, train[lo:first], test[lo:first])
            started = time.perf_counter()
            batch = np.concatenate([batch, _score_splits(fit, y, train[first:hi], test[first:hi])])
            if n_jobs > 1 and hi > first and (time.perf_counter() - started) / (hi - first) >= PARALLEL_MIN_SECONDS:
                import cloudpickle  # closures pickle by value

                parallel, payload = resources.worker_pool(n_jobs), cloudpickle.dumps(fit)
        else:
            hi = min(stop, lo + n_jobs * CHECK_EVERY)
            bounds = list(range(lo, hi, CHECK_EVERY)) + [hi]
            try:
                futures = [parallel.submit(_score_pickled, payload, y, train[a:b], test[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
                batch = np.concatenate([future.result() for future in futures])
            except BaseException:  # Ctrl-C, a worker's error: stop the workers rather than wait for them
                resources.stop_worker_pool()
                raise
        rows = np.concatenate([rows, batch])
        if adaptive or beaten_by is not None:
            for n in range(lo + 1, len(rows) + 1):
                if n < min_splits or n % CHECK_EVERY:
                    continue
                if adaptive and (_r2_sem(rows[:n, 3]) <= r2_sem or (cap is not None and n >= cap)):
                    stop = n
                    break
                if beaten_by is not None and _lower_mape(rows[:n, 5]) > beaten_by:
                    stop, beaten = n, True
                    break
            rows = rows[:stop]
        if progress is not None:
            progress(len(rows), stop)
    out: dict = {"splits": int(len(rows)), "train_fraction": train_fraction}
    for p, part in enumerate(("train", "test")):
        for c, key in enumerate(_COLUMNS):
            values = rows[:, p * len(_COLUMNS) + c]
            out[f"{part}_{key}"] = float(np.nanmean(values)) if len(values) else float("nan")
            out[f"{part}_{key}_std"] = float(np.nanstd(values)) if len(values) else float("nan")
    if adaptive:
        out["splits_requested"] = int(n_splits)
        out["test_r2_sem"] = _r2_sem(rows[:, 3])
        out["r2_sem_target"] = float(r2_sem)
        if cap is not None:
            out["split_cap"] = int(cap)
    if beaten:
        out["beaten"] = True
    return out


def _lower_mape(test_mape: np.ndarray) -> float:
    """Mean held-out MAPE less RACE_SEMS standard errors of the mean."""
    values = test_mape[np.isfinite(test_mape)]
    if len(values) < 2:
        return -math.inf
    return float(values.mean() - RACE_SEMS * values.std() / math.sqrt(len(values)))


def upper_mape(scores: dict) -> float:
    """A scored model's mean held-out MAPE plus RACE_SEMS standard errors (a rival's bound)."""
    if not scores or not math.isfinite(scores.get("test_mape", math.nan)):
        return math.inf
    return scores["test_mape"] + RACE_SEMS * scores.get("test_mape_std", math.inf) / math.sqrt(max(scores.get("splits", 1), 1))


def _scores_of(rows: np.ndarray, train_fraction: float) -> dict:
    out: dict = {"splits": int(len(rows)), "train_fraction": train_fraction}
    for p, part in enumerate(("train", "test")):
        for c, key in enumerate(_COLUMNS):
            values = rows[:, p * len(_COLUMNS) + c]
            out[f"{part}_{key}"] = float(np.nanmean(values)) if len(values) else float("nan")
            out[f"{part}_{key}_std"] = float(np.nanstd(values)) if len(values) else float("nan")
    return out


def trails(mape: np.ndarray, rival: np.ndarray) -> bool:
    """Whether a model's held-out MAPE on the splits both scored exceeds a rival's by more than
    :data:`RACE_SEMS` standard errors of the paired difference: mean(d) - RACE_SEMS sd(d) / sqrt(n) > 0,
    d = mape - rival per split (sd with n - 1; at least :data:`RACE_FIRST` splits)."""
    n = min(len(mape), len(rival))
    d = mape[:n] - rival[:n]
    d = d[np.isfinite(d)]
    if len(d) < RACE_FIRST:
        return False
    return bool(d.mean() - RACE_SEMS * d.std(ddof=1) / math.sqrt(len(d)) > 0)


def race_split_scores(
    fits: Mapping[str, Callable[[np.ndarray], Callable[[np.ndarray], np.ndarray]]],
    y: np.ndarray,
    *,
    n_splits: int = DEFAULT_SPLITS,
    seed: int = 0,
    train_fraction: float = TRAIN_FRACTION,
    r2_sem: float | None = None,
    min_splits: int = MIN_SPLITS,
    n_jobs: int = 1,
    progress: Callable[[str, int, int], None] | None = None,
    cap: int | None = None,
) -> dict:
    """Scores of rival models on the same splits, raced: ``{name: scores}`` as :func:`repeated_split_scores`.

    Every model scores the first :data:`RACE_FIRST` splits, then the survivors advance
    together, :data:`CHECK_EVERY` splits a round. After each round, a model whose held-out
    MAPE trails the best model's (lowest mean MAPE) on the splits both scored by more
    than :data:`RACE_SEMS` standard errors of the paired difference (:func:`trails`)
    stops (``beaten``: True). A model also stops as :func:`repeated_split_scores` does:
    after ``n_splits``, or with ``r2_sem`` at the first multiple of :data:`CHECK_EVERY`
    (at least ``min_splits``) where the standard error of its mean held-out R^2 is at
    most ``r2_sem`` or ``cap`` splits scored; a model that is never beaten thus gets the scores
    :func:`repeated_split_scores` gives it alone. With ``n_jobs`` > 1 the models whose
    splits take at least :data:`PARALLEL_MIN_SECONDS` are scored in that many worker
    processes (each round's batches at once, the slowest first; ``fit`` must pickle
    with cloudpickle), the others in-process meanwhile. ``progress(name, done, total)``
    after each round.
    """
    y = np.asarray(y, dtype=np.float64)
    names = list(fits)
    train, test = split_indices(len(y), n_splits, train_fraction=train_fraction, seed=seed)
    adaptive = bool(r2_sem) and r2_sem > 0
    rows = {k: np.empty((0, 2 * len(_COLUMNS))) for k in names}
    stop = {k: n_splits for k in names}
    beaten: set = set()
    seconds = {k: 0.0 for k in names}  # per split, as last measured
    payloads: dict = {}
    pool = None
    while any(len(rows[k]) < stop[k] for k in names):
        running = [k for k in names if len(rows[k]) < stop[k]]
        ranges = {}
        for k in running:
            lo = len(rows[k])
            hi = RACE_FIRST if lo < RACE_FIRST else (lo // CHECK_EVERY + 1) * CHECK_EVERY
            if n_jobs > 1 and lo == 0 and pool is None:
                hi = 1  # one split in-process first: is the model slow enough for the workers?
            ranges[k] = (lo, min(hi, stop[k]))
        batches: dict = {}
        remote = [k for k in running if k in payloads]
        futures = _submit_batches(pool, {k: payloads[k] for k in remote}, seconds, ranges, y, train, test, n_jobs)
        for k in running:  # the models come cheapest first: once one is slow, those after it go to the workers too
            if k in remote:
                continue
            lo, hi = ranges[k]
            if pool is not None and not seconds[k]:
                import cloudpickle  # closures pickle by value

                payloads[k], seconds[k] = cloudpickle.dumps(fits[k]), max(seconds.values())
                ranges[k] = (lo, min(max(hi, RACE_FIRST), stop[k]))
                futures += _submit_batches(pool, {k: payloads[k]}, seconds, ranges, y, train, test, n_jobs)
                continue
            started = time.perf_counter()
            batches[k] = _score_splits(fits[k], y, train[lo:hi], test[lo:hi])
            seconds[k] = (time.perf_counter() - started) / max(hi - lo, 1)  # the first split's includes imports
            if n_jobs > 1 and seconds[k] >= PARALLEL_MIN_SECONDS:
                import cloudpickle  # closures pickle by value

                payloads[k] = cloudpickle.dumps(fits[k])
                pool = pool or resources.worker_pool(n_jobs)
        if futures:
            try:
                parts: dict = {}
                for k, a, future in futures:
                    parts.setdefault(k, []).append((a, future.result()))
            except BaseException:  # Ctrl-C, a worker's error: stop the workers rather than wait for them
                resources.stop_worker_pool()
                raise
            for k, got in parts.items():
                batches[k] = np.concatenate([part for _, part in sorted(got, key=lambda t: t[0])])
        for k, batch in batches.items():
            lo = len(rows[k])
            rows[k] = np.concatenate([rows[k], batch])
            if adaptive:
                for n in range(lo + 1, len(rows[k]) + 1):
                    if n >= min_splits and n % CHECK_EVERY == 0 and (_r2_sem(rows[k][:n, 3]) <= r2_sem or (cap is not None and n >= cap)):
                        stop[k] = n
                        rows[k] = rows[k][:n]
                        break
        scored = [k for k in names if k not in beaten and len(rows[k])]
        if len(scored) > 1:
            best = min(scored, key=lambda k: np.nanmean(rows[k][:, 5]) if np.any(np.isfinite(rows[k][:, 5])) else math.inf)
            for k in running:
                if k != best and k not in beaten and trails(rows[k][:, 5], rows[best][:, 5]):
                    beaten.add(k)
                    stop[k] = len(rows[k])
        if progress is not None:
            for k in running:
                progress(k, len(rows[k]), stop[k])
    out = {}
    for k in names:
        out[k] = _scores_of(rows[k], train_fraction)
        if adaptive:
            out[k]["splits_requested"] = int(n_splits)
            out[k]["test_r2_sem"] = _r2_sem(rows[k][:, 3])
            out[k]["r2_sem_target"] = float(r2_sem)
            if cap is not None:
                out[k]["split_cap"] = int(cap)
        if k in beaten:
            out[k]["beaten"] = True
    return out


def _submit_batches(pool, payloads: Mapping, seconds: Mapping, ranges: Mapping, y, train, test, n_jobs: int) -> list:
    """(name, first split, future) for the split ranges of the models in ``payloads``, the longest batches first."""
    tasks = []
    for k in payloads:
        lo, hi = ranges[k]
        size = max(1, math.ceil((hi - lo) / n_jobs))
        tasks += [(seconds[k] * (min(a + size, hi) - a), k, a, min(a + size, hi)) for a in range(lo, hi, size)]
    tasks.sort(key=lambda t: -t[0])  # the longest first: the workers finish together
    try:
        return [(k, a, pool.submit(_score_pickled, payloads[k], y, train[a:b], test[a:b])) for _, k, a, b in tasks]
    except BaseException:
        resources.stop_worker_pool()
        raise
