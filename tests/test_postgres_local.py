"""An Optuna study shared by two processes through PostgreSQL
(.ci/postgres/local-server.sh, URL in PLEXUS_TUNE_PG_URL or its default).

Skips without a PostgreSQL driver for SQLAlchemy, and without a server outside CI;
under PLEXUS_TUNE_CI=1 a missing server fails.
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import uuid

import pytest

pytestmark = pytest.mark.slow  # a PostgreSQL server

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
        message = (f"postgres not reachable at {URL}: start it with .ci/postgres/local-server.sh "
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


GRAPH = "rmat:nodes=128,edges=1024,features=8,classes=4"


def test_two_measured_search_workers_share_a_study_without_measuring_twice(pg_url, tmp_path):
    """Two `search --measured` processes on one PostgreSQL study: every configuration is
    trained once (the log holds one run per grid), and the study holds every worker's trials."""
    import subprocess
    import sys
    from pathlib import Path

    import optuna

    repo = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])))
    name = f"plexus-tune-workers-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "runs.jsonl"
    argv = [sys.executable, "-m", "plexus_tune", "search", "--measured", "--graph", GRAPH, "--gpus", "2",
            "--trials", "5", "--warm-start", "0", "--epochs", "2", "--warmup", "1", "--hidden", "4", "--layers", "2",
            "--storage", pg_url, "--study", name, "--log", str(log)]
    try:
        workers = [subprocess.Popen(argv + ["--seed", str(k)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True) for k in range(2)]
        outputs = [w.communicate(timeout=600)[0] for w in workers]
        assert [w.returncode for w in workers] == [0, 0], outputs
        runs = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        grids = [r["grid"] for r in runs]
        assert len(grids) == len(set(grids)), f"a configuration was measured twice: {grids}"
        study = optuna.load_study(study_name=name, storage=pg_url)
        done = [t for t in study.trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL)]
        assert len(done) >= 5
        assert {t.user_attrs["config"].split(" ")[0] for t in done} >= set(grids)
        assert all("epoch_ms" in t.user_attrs for t in done if t.state == optuna.trial.TrialState.COMPLETE)
    finally:
        optuna.delete_study(study_name=name, storage=pg_url)
