"""Model-driven search is exact when the space is cheap to enumerate (plexus_tune.search.evaluate)."""

import numpy as np
import pytest

from plexus_tune.model.costs import predict_grids
from plexus_tune.model.grid import enumerate_grids
from plexus_tune.model.machine import load_machine
from plexus_tune.model.workload import list_datasets, workload_from_dataset
from plexus_tune.search import ModelEvaluator, SearchSpace, parse_gpus
from plexus_tune.search.evaluate import count_configurations, exhaustive_search, grid_count, plan_search

GPUS = parse_gpus("8..4096")
MACHINE = load_machine("perlmutter")


def test_grid_count_is_the_number_of_ordered_factorizations():
    for g in (1, 7, 8, 12, 64, 360, 4096):
        brute = sum(1 for x in range(1, g + 1) for y in range(1, g + 1) if g % (x * y) == 0)
        assert grid_count(g) == brute == len(enumerate_grids(g))
    assert count_configurations(SearchSpace(GPUS)) == 168708  # the count for G = 8..4096
    assert count_configurations(SearchSpace((64,), (1024, 4096))) == 28 * 4  # unblocked + 1024, 2048, 4096


def test_plan_enumerates_small_spaces_and_leaves_large_ones_to_tpe():
    ev = ModelEvaluator(workload_from_dataset("ogbn-products"), MACHINE)
    plan = plan_search(SearchSpace(GPUS), ev, budget_s=60)  # about 2 s on an idle 2-core host
    assert plan.method == "exhaustive" and plan.configurations == 168708 and 0 < plan.estimated_s <= plan.budget_s
    assert "exhaustive" in plan.describe() and plan.probe_configurations >= 4096
    assert plan_search(SearchSpace(GPUS), ev, budget_s=0).method == "tpe"
    tiny = plan_search(SearchSpace(GPUS), ev, budget_s=1e-4)
    assert tiny.method == "tpe" and "over the" in tiny.describe()


def brute_force_optima(workload, objectives=("epoch", "gpu-hours")):
    """Best feasible (value, grid) per objective over every grid of every G, from one
    predict_grids of all grids."""
    grids = np.concatenate([enumerate_grids(g) for g in GPUS])
    pred = predict_grids(workload, MACHINE, grids)
    gpus = grids.prod(axis=1).astype(np.float64)
    out = {}
    for objective in objectives:
        value = pred["total_ms"] if objective == "epoch" else pred["total_ms"] * gpus * 100 / 3.6e6
        value = np.where(pred["feasible"], value, np.inf)
        best = int(np.argmin(value))
        out[objective] = float(value[best]), tuple(int(v) for v in grids[best])
    return out


def brute_force_optimum(workload, objective):
    """Best feasible (value, grid) of ``objective`` over every grid of every G."""
    return brute_force_optima(workload, (objective,))[objective]


# Every catalog dataset runs in CI; the quick suite keeps one of each feasibility regime on
# this machine: every grid feasible (Reddit), some infeasible (europe_osm), most (IGB260M).
QUICK_DATASETS = {"Reddit", "europe_osm", "IGB260M"}


@pytest.mark.parametrize("dataset", [info.name if info.name in QUICK_DATASETS else
                                     pytest.param(info.name, marks=pytest.mark.slow) for info in list_datasets()])
def test_exact_search_returns_the_brute_force_optimum_on_every_catalog_dataset(dataset):
    workload = workload_from_dataset(dataset)
    ev = ModelEvaluator(workload, MACHINE)
    optima = brute_force_optima(workload)
    for objective in ("epoch", "gpu-hours"):
        ref_value, ref_grid = optima[objective]
        frame = exhaustive_search(SearchSpace(GPUS), ev, objective)
        top = frame.iloc[0]
        assert bool(top["feasible"])
        assert float(top["value"]) == pytest.approx(ref_value, rel=1e-12)
        # the same grid unless another has exactly the same value
        if (int(top.gx), int(top.gy), int(top.gz)) != ref_grid:
            assert float(top["value"]) == ref_value
        # spot check: predicting one G on its own gives the same rows
        g = int(top["gpus"])
        alone = predict_grids(workload, MACHINE, g)
        assert float(top["total_ms"]) in set(alone["total_ms"].tolist())


def test_search_cli_says_which_method_ran(run_cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["search", "--dataset", "Reddit", "--gpus", "8..4096", "--objective", "gpu-hours", "--top", "1",
                              "--exact-budget", "60"])
    assert code == 0, err
    assert "method: exhaustive: every one of 168,708 configurations" in out.replace("\n", " ")
    ref_value, ref_grid = brute_force_optimum(workload_from_dataset("Reddit"), "gpu-hours")
    assert "x".join(map(str, ref_grid)) in out
    assert not (tmp_path / "measurements").exists()  # no study was written
    code, out, err = run_cli(["search", "--dataset", "Reddit", "--gpus", "8..64", "--exact-budget", "0", "--trials", "3",
                              "--storage", f"sqlite:///{tmp_path / 's.db'}"])
    assert code == 0, err
    assert "method: TPE" in out
