"""An Optuna study shared by two processes through PostgreSQL
(runners/postgres/local-server.sh, URL in PLEXUS_TUNE_PG_URL or its default).

Skips without a PostgreSQL driver for SQLAlchemy, and without a server outside CI;
under PLEXUS_TUNE_CI=1 a missing server fails.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import uuid

import pytest

DEFAULT_URL = "postgresql://postgres@127.0.0.1:55432/plexus_tune_test"
URL = os.environ.get("PLEXUS_TUNE_PG_URL", DEFAULT_URL)
IN_CI = os.environ.get("PLEXUS_TUNE_CI") == "1"


def _optimize(url: str, name: str, trials: int) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=name, storage=url)
    study.optimize(lambda t: (t.suggest_float("x", -4.0, 4.0) - 1.0) ** 2, n_trials=trials)


@pytest.fixture(scope="module")
def pg_url():
    if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is None:
        pytest.skip("no PostgreSQL driver: install psycopg[binary]")
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(URL)
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
        engine.dispose()
    except Exception as exc:  # noqa: BLE001 - any failure means no usable server
        message = (f"postgres not reachable at {URL}: start it with runners/postgres/local-server.sh "
                   f"start ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return URL


def test_optuna_study_shared_by_two_processes(pg_url):
    import optuna

    name = f"plexus-tune-test-{uuid.uuid4().hex[:8]}"
    optuna.create_study(study_name=name, storage=pg_url, direction="minimize")
    try:
        ctx = multiprocessing.get_context("spawn")
        workers = [ctx.Process(target=_optimize, args=(pg_url, name, 4)) for _ in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
        assert [w.exitcode for w in workers] == [0, 0]
        study = optuna.load_study(study_name=name, storage=pg_url)
        assert len(study.trials) == 8
        assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    finally:
        optuna.delete_study(study_name=name, storage=pg_url)
