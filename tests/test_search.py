"""Search-space encoding, caching, constraints and resumption, against brute force."""

from types import SimpleNamespace

import numpy as np
import optuna
import pytest

from plexus_tune.errors import UserError
from plexus_tune.model.grid import enumerate_grids
from plexus_tune.search import (
    Config,
    ModelEvaluator,
    Objective,
    SearchSpace,
    best_configs,
    decode_grid,
    encode_grid,
    exhaustive_frame,
    exhaustive_optimum,
    objective_value,
    open_storage,
    open_study,
    parse_gpus,
    run_search,
    trials_frame,
    trials_to_reach,
    warm_start,
)

GIB = 2**30


def toy_predict(workload, machine, grids, block_rows=None):
    """A hand-made model: compute shrinks with G, comm grows with the lopsidedness of the grid.

    epoch = 1000 / G + 3 * (gx + 2 gy + 4 gz) (+ 1 per block if blocked); memory = 64 GiB / G
    + 1 GiB * gx (so 1D-along-X grids blow the memory).
    """
    g = np.asarray(grids, dtype=np.float64)
    G = g.prod(axis=1)
    total = 1000.0 / G + 3.0 * (g[:, 0] + 2 * g[:, 1] + 4 * g[:, 2])
    if block_rows:
        total = total + 1.0
    mem = 64.0 * GIB / G + GIB * g[:, 0]
    zero = np.zeros_like(total)
    return {
        "gx": g[:, 0].astype(np.int64), "gy": g[:, 1].astype(np.int64), "gz": g[:, 2].astype(np.int64),
        "spmm_ms": 1000.0 / G, "gemm_ms": zero, "comm_ms": total - 1000.0 / G, "comm_x_ms": zero,
        "comm_y_ms": zero, "comm_z_ms": zero, "other_ms": zero, "total_ms": total,
        "memory_bytes": mem, "memory_gib": mem / GIB, "feasible": mem <= 16 * GIB,
    }


MACHINE = SimpleNamespace(name="toy", device_memory_bytes=16 * GIB, usable_memory_bytes=16 * GIB)


def toy_value(cfg, objective="epoch"):
    gx, gy, gz = cfg
    G = gx * gy * gz
    t = 1000.0 / G + 3.0 * (gx + 2 * gy + 4 * gz)
    return t if objective == "epoch" else t * G * 100 / 3.6e6


class CountingEvaluator(ModelEvaluator):
    def __init__(self):
        super().__init__(workload=None, machine=MACHINE, predict=toy_predict)
        self.calls = []

    def evaluate(self, config):
        self.calls.append(config)
        return super().evaluate(config)


def memory_study(seed=0):
    return optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed, multivariate=True))


def test_decode_hand_values():
    assert decode_grid(8, 1 / 3, 1 / 2) == (2, 2, 2)
    assert decode_grid(8, 1.0, 0.0) == (8, 1, 1)
    assert decode_grid(8, 0.0, 1.0) == (1, 8, 1)
    assert decode_grid(8, 0.0, 0.0) == (1, 1, 8)
    assert decode_grid(64, 0.5, 0.5) == (8, 2, 4) or decode_grid(64, 0.5, 0.5) == (8, 4, 2)
    assert decode_grid(7, 0.6, 0.0) == (7, 1, 1)  # a prime: 7**0.6 = 3.2 is nearer 7 than 1 in log scale


@pytest.mark.parametrize("g", [1, 7, 8, 12, 30, 64, 360, 4096])
def test_every_grid_is_reachable_and_round_trips(g):
    grids = [tuple(int(a) for a in row) for row in enumerate_grids(g)]
    for grid in grids:
        assert decode_grid(g, *encode_grid(grid)) == grid
    # decoding covers exactly the grids of g (brute force over a fine (u, v) lattice)
    seen = {decode_grid(g, u, v) for u in np.linspace(0, 1, 61) for v in np.linspace(0, 1, 61)}
    assert seen <= set(grids)
    assert len(seen) >= min(len(grids), 3)


def test_parse_gpus():
    assert parse_gpus("8") == (8,)
    assert tuple(parse_gpus("8..12")) == (8, 9, 10, 11, 12)
    huge = parse_gpus("1..1e12")  # a range, not a list of 10^12 counts
    assert len(huge) == 10**12 and huge[-1] == 10**12 and isinstance(huge, range)
    assert parse_gpus("1e3") == (1000,) and parse_gpus("1..1e12:pow2")[-1] == 2**39
    assert parse_gpus("8..64:pow2") == (8, 16, 32, 64)
    assert parse_gpus("64,8,16,8") == (8, 16, 64)
    for bad in ("16..8", "x,y", "", "3..3:pow2", "0,4", "8,,16", "0..4"):
        with pytest.raises(UserError):
            parse_gpus(bad)


def test_objective_values():
    assert objective_value(100.0, 8, "epoch") == 100.0
    assert objective_value(100.0, 8, "gpu-hours") == pytest.approx(100.0 * 8 * 100 / 3.6e6)
    with pytest.raises(UserError, match="unknown objective"):
        objective_value(1.0, 8, "latency")


def test_exhaustive_optimum_matches_brute_force():
    space = SearchSpace(parse_gpus("4..24"))
    ev = ModelEvaluator(None, MACHINE, predict=toy_predict)
    for objective in ("epoch", "gpu-hours"):
        best = None
        for g in space.gpus:
            for grid in enumerate_grids(g).tolist():
                if 64.0 / g + grid[0] > 16:  # memory in GiB
                    continue
                val = toy_value(grid, objective)
                if best is None or val < best[1]:
                    best = (tuple(grid), val)
        cfg, val = exhaustive_optimum(space, ev, objective)
        assert cfg.grid == best[0]
        assert val == pytest.approx(best[1])
    frame = exhaustive_frame(space, ev)
    assert len(frame) == sum(len(enumerate_grids(g)) for g in space.gpus)


def test_search_caches_configs_and_marks_infeasible():
    # G = 8 has 10 grids: 60 trials must evaluate each at most once
    space = SearchSpace((8,))
    ev = CountingEvaluator()
    study = memory_study()
    obj = Objective(space, ev, "epoch")
    study.optimize(obj, n_trials=60)
    assert len(ev.calls) == len(set(ev.calls)) <= 10
    frame = trials_frame(study)
    assert frame["config"].nunique() == len(ev.calls)
    assert (frame["duplicate_of"].notna()).sum() == 60 - len(ev.calls)
    # 8x1x1 needs 8 + 8 = 16 GiB: feasible; a 2 GiB device makes every grid with gx >= 2 infeasible
    small = SimpleNamespace(name="small", device_memory_bytes=10 * GIB, usable_memory_bytes=10 * GIB)
    ev2 = ModelEvaluator(None, small, predict=toy_predict)
    study2 = memory_study(1)
    study2.optimize(Objective(space, ev2, "epoch"), n_trials=30)
    f2 = trials_frame(study2)
    infeasible = f2[f2["gx"] > 2]
    assert not infeasible.empty
    assert (~infeasible["feasible"].astype(bool)).all()
    # infeasible trials keep their real value (not a penalty) and carry the constraint
    t = study2.trials[int(infeasible["number"].iloc[0])]
    assert t.value == pytest.approx(toy_value((t.user_attrs["gx"], t.user_attrs["gy"], t.user_attrs["gz"])))
    assert max(t.constraints.values()) > 0 if hasattr(t, "constraints") else True
    # the best trial is the best feasible one, though an infeasible trial has a lower value
    feasible_vals = f2[f2["feasible"].astype(bool)]["value"]
    assert study2.best_value == pytest.approx(feasible_vals.min())
    assert study2.best_trial.user_attrs["gx"] <= 2
    cheapest = f2.loc[f2["value"].idxmin()]
    assert not cheapest["feasible"] and cheapest["value"] < study2.best_value
    top = best_configs(study2, 3)
    assert top["feasible"].all() and top["value"].is_monotonic_increasing
    assert top["config"].iloc[0] == study2.best_trial.user_attrs["config"]


def test_model_ranked_snapping_picks_best_neighbour():
    space = SearchSpace(parse_gpus("8..64"))
    ev = CountingEvaluator()
    obj = Objective(space, ev, "epoch", snap_neighbours=len(space.grid_table()))
    study = memory_study()
    study.optimize(obj, n_trials=1)
    # with every grid as a neighbour, the first trial is the brute-force optimum
    grids = [g for G in space.gpus for g in enumerate_grids(G).tolist() if 64.0 / G + g[0] <= 16]
    best = min(grids, key=toy_value)
    assert ev.calls == [Config(*best)]
    assert obj.model_evaluations == len(space.grid_table())


def test_warm_start_runs_enqueued_configs_first():
    space = SearchSpace(parse_gpus("8..64"))
    ev = CountingEvaluator()
    study = memory_study()
    starts = [Config(2, 2, 2), Config(4, 4, 4), Config(3, 3, 3)]
    assert warm_start(study, space, starts) == 3
    assert warm_start(study, space, starts) == 0  # already queued
    study.optimize(Objective(space, ev, "epoch"), n_trials=5)
    assert ev.calls[:3] == starts


def test_top_k_is_model_ranking():
    space = SearchSpace((8,))
    ev = ModelEvaluator(None, MACHINE, predict=toy_predict)
    ranked = sorted(enumerate_grids(8).tolist(), key=toy_value)
    assert [c.grid for c in ev.top_k(space, 3)] == [tuple(g) for g in ranked[:3]]


def test_resume_reuses_finished_trials(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    space = SearchSpace(parse_gpus("8..32"))
    storage = open_storage(url)
    s1 = open_study("toy", storage, objective="epoch", seed=3)
    ev1 = CountingEvaluator()
    assert run_search(s1, Objective(space, ev1, "epoch", study=s1), 12) == 12
    done = {t.number: t.value for t in s1.trials}
    # a new process: the cache is rebuilt from storage, only the missing trials run
    s2 = open_study("toy", open_storage(url), objective="epoch", seed=3)
    ev2 = CountingEvaluator()
    obj2 = Objective(space, ev2, "epoch", study=s2)
    assert set(obj2.cache) == set(ev1.calls)
    assert run_search(s2, obj2, 20) == 8
    assert run_search(s2, obj2, 20) == 0
    assert len(s2.trials) == 20
    assert {t.number: t.value for t in s2.trials if t.number in done} == done
    assert not set(ev2.calls) & set(ev1.calls)
    with pytest.raises(UserError, match="optimizes 'epoch'"):
        open_study("toy", open_storage(url), objective="gpu-hours")


def test_unreachable_storage_is_user_error(tmp_path):
    (tmp_path / "a-file").write_text("not a directory")
    cases = ((f"sqlite:///{tmp_path}/a-file/x.db", "a-file is a file, not a directory"),
             ("nosuchdb://host/x", "cannot open storage"), ("postgresql://u@127.0.0.1:1/none", "cannot open storage"))
    for url, message in cases:
        with pytest.raises(UserError, match=message):
            open_storage(url)


def test_trials_to_reach():
    assert trials_to_reach([5.0, 3.0, 2.01, 2.0], 2.0) == 3
    assert trials_to_reach([5.0, 2.0], 2.0, feasible=[True, False]) is None
    assert trials_to_reach([float("nan"), 2.0], 2.0) == 2


def test_block_sizes_are_powers_of_two_and_round_trip():
    space = SearchSpace((8,), block_rows_range=(1024, 65536))
    for cfg in (Config(2, 2, 2), Config(2, 2, 2, 4096), Config(8, 1, 1, 65536), Config(1, 1, 8, 1024)):
        assert space.config_of_params(space.params_of(cfg)) == cfg
    assert space.config_of_params({"log2_gx": 1, "log2_gy": 1, "log2_gz": 1, "blocked": True, "block_rows_log2": 13.8}).block_rows == 16384
    assert space.config_of_params({"log2_gx": 1, "log2_gy": 1, "log2_gz": 1, "blocked": False, "block_rows_log2": 13.8}).block_rows is None
    # exhaustive: every grid unblocked plus every power of two in range
    frame = exhaustive_frame(space, ModelEvaluator(None, MACHINE, predict=toy_predict))
    assert len(frame) == 10 * (1 + 7)
    assert set(frame["block_rows"]) == {0, 1024, 2048, 4096, 8192, 16384, 32768, 65536}


@pytest.mark.parametrize("encoding", ["sizes", "uv"])
def test_every_configuration_round_trips_through_trial_params(encoding):
    space = SearchSpace(parse_gpus("8..64"), encoding=encoding)
    configs = list(space.configs())
    assert len(configs) == sum(len(enumerate_grids(g)) for g in space.gpus)
    for cfg in configs:
        assert space.config_of_params(space.params_of(cfg)) == cfg
    # a point between grids goes to the nearest allowed grid in log2 sizes (3x2x2: |log2 3 - 1.6| = 0.015)
    assert SearchSpace(parse_gpus("8..64")).nearest_grid([1.6, 1.0, 1.0]) == (3, 2, 2)
    assert SearchSpace((8,)).nearest_grid([3.0, 0.2, -0.1]) == (8, 1, 1)


def test_failed_runs_count_as_trials_but_dead_processes_do_not():
    from plexus_tune.search import finished_trials

    class Failing(CountingEvaluator):
        def evaluate(self, config):
            ev = super().evaluate(config)
            if config.gx == 8:
                ev.failure = "oom: out of memory"
            return ev

    study = memory_study()
    study.enqueue_trial(SearchSpace((8,)).params_of(Config(8, 1, 1)))
    study.optimize(Objective(SearchSpace((8,)), Failing(), "epoch"), n_trials=3)
    assert study.trials[0].state.name == "FAIL" and study.trials[0].user_attrs["failure"].startswith("oom")
    # a trial left behind by a killed process, failed later by the heartbeat: no failure attribute
    dead = study.ask()
    study.tell(dead, state=optuna.trial.TrialState.FAIL)
    assert len(finished_trials(study)) == 3


def test_run_study_resumes_and_its_best_is_never_below_the_exhaustive_optimum(tmp_path):
    from plexus_tune.search import driver

    url = f"sqlite:///{tmp_path / 'd.db'}"
    space = SearchSpace(parse_gpus("8..32"))
    model = ModelEvaluator(None, MACHINE, predict=toy_predict)
    name = driver.study_name("toy-data", "toy", space, "epoch", measured=False)
    assert driver.study_name("toy-data", "toy", space, "epoch", measured=False, precision="bf16") == name + "-comm-bf16"
    assert driver.study_name("toy-data", "toy", space, "epoch", measured=False, name="mine") == "mine"
    first = driver.run_study(driver.StudyOptions(name, "epoch", 12, seed=3, starts=4), open_storage(url), space, model)
    assert (first.before, first.ran) == (0, 12)
    again = driver.run_study(driver.StudyOptions(name, "epoch", 20, seed=3, starts=4), open_storage(url), space, model)
    assert (again.before, again.ran) == (12, 8)
    values = [t.value for t in again.study.trials if t.value is not None and t.user_attrs.get("feasible", True)]
    _, optimum = exhaustive_optimum(space, model, "epoch")
    assert again.best_value == pytest.approx(min(values))
    assert again.best_value >= optimum - 1e-9
    with pytest.raises(UserError, match="unknown objective"):
        driver.StudyOptions(name, "latency", 20)
    with pytest.raises(UserError, match="at least 1 trial"):
        driver.StudyOptions(name, "epoch", 0)
    with pytest.raises(UserError, match="study name is empty"):
        driver.StudyOptions(" ", "epoch", 5)


def test_ctrl_c_between_trials_leaves_no_heartbeat_thread(tmp_path, monkeypatch):
    """Ctrl-C just as Optuna starts a trial's heartbeat thread (between trials, outside the
    objective) is held until the objective runs: the trial fails as interrupted, the thread is
    joined, and nothing keeps the command from exiting (a live non-daemon thread would)."""
    import signal
    import threading

    from optuna.storages._heartbeat import HeartbeatThread

    real_start = HeartbeatThread.start
    starts = []

    def start(self):
        real_start(self)
        starts.append(self)
        if len(starts) == 2:  # the second trial: Ctrl-C as its heartbeat thread has started
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(HeartbeatThread, "start", start)
    storage = open_storage(f"sqlite:///{tmp_path / 'db.sqlite'}", heartbeat_interval=60, grace_period=120)
    study = optuna.create_study(storage=storage, direction="minimize")
    calls = []

    def objective(trial):
        calls.append(trial.number)
        return trial.suggest_float("x", 0.0, 1.0)

    with pytest.raises(KeyboardInterrupt):
        run_search(study, objective, 5)
    assert calls == [0]  # the held Ctrl-C ends trial 1 as its objective starts
    assert [t.state for t in study.get_trials()] == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL]
    assert not any(t._thread.is_alive() for t in starts)
    assert not [t for t in threading.enumerate() if "_record_heartbeat" in t.name]
