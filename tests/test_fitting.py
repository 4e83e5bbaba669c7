import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from plexus_tune.model import spmm as spmm_models
from plexus_tune.model.spmm import PaperSpmm, Roofline
from plexus_tune.errors import UserError
from plexus_tune.fit.collectives import bus_bandwidth_gbps, fit_collectives
from plexus_tune.fit.epoch import fit_epoch
from plexus_tune.fit.gemm import fit_gemm
from plexus_tune.fit.scoring import regression_scores, repeated_split_scores, split_indices
from plexus_tune.fit.spmm import fit_spmm, SPMM_KINDS
from plexus_tune.fit.tables import load_table


def _shapes(n, seed=0):
    rng = np.random.default_rng(seed)
    rows = np.round(np.exp(rng.uniform(np.log(50), np.log(20000), n)))
    common = np.round(np.exp(rng.uniform(np.log(50), np.log(20000), n)))
    k = 2.0 ** rng.integers(2, 8, n)
    nnz = np.round(rows * np.exp(rng.uniform(0, np.log(30), n)))
    return pd.DataFrame({"nnz": nnz, "rows": rows, "common": common, "dense_cols": k})


def test_regression_scores_by_hand():
    s = regression_scores([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 6.0])
    # ss_res = 4, ss_tot = 5 -> R^2 = 0.2; RMSE = sqrt(4/4) = 1; MAPE = 100 * (2/4)/4 = 12.5 %
    assert s["r2"] == pytest.approx(0.2)
    assert s["rmse_ms"] == pytest.approx(1.0)
    assert s["mape"] == pytest.approx(12.5)


def test_splits_are_70_30_partitions():
    train, test = split_indices(10, 50, seed=3)
    assert train.shape == (50, 7) and test.shape == (50, 3)
    for tr, te in zip(train, test):
        assert sorted(np.concatenate([tr, te]).tolist()) == list(range(10))
    assert len({tuple(sorted(t)) for t in train}) > 1


def test_paper_spmm_kind_recovers_its_coefficients():
    df = _shapes(60)
    f = df.nnz * df.dense_cols
    # t = c0 sqrt(f) + c1 sqrt(f) common/k + c2 sqrt(f) rows/k
    df["time_ms"] = 2e-3 * np.sqrt(f) + 3e-6 * np.sqrt(f) * df.common / df.dense_cols + 1e-6 * np.sqrt(f) * df.rows / df.dense_cols
    model = fit_spmm(df, "paper-spmm", n_splits=20)
    d = model.to_dict()
    assert d["kind"] == "paper-spmm"
    assert [d["c0"], d["c1"], d["c2"]] == pytest.approx([2e-3, 3e-6, 1e-6], rel=1e-6)
    assert model.scores["test_r2"] == pytest.approx(1.0, abs=1e-9)
    # one hand-computed point: nnz=100, k=4 -> sqrt(f)=20; common=400, rows=200
    one = pd.DataFrame({"nnz": [100], "rows": [200], "common": [400], "dense_cols": [4]})
    assert model.predict(one)[0] == pytest.approx(20 * (2e-3 + 3e-6 * 100 + 1e-6 * 50))
    # 'paper' keeps the paper's coefficients in profiles: fit says which kind to ask for
    with pytest.raises(UserError, match="its fitted per-SpMM form is 'paper-spmm'"):
        fit_spmm(df, "paper", n_splits=5)


def test_roofline_kind_recovers_non_negative_costs():
    df = _shapes(80, seed=1)
    truth = {"const": 0.01, "flops": 2e-9, "sparse_bytes": 0.0, "dense_in_bytes": 1e-8, "out_bytes": 3e-8, "rows": 0.0}
    X = spmm_models.roofline_terms(df.nnz, df.rows, df.common, df.dense_cols)
    df["time_ms"] = X @ np.array([truth[k] for k in spmm_models.ROOFLINE_TERMS])
    model = fit_spmm(df, "roofline", n_splits=10)
    got = model.to_dict()["coefficients"]
    assert all(v >= 0 for v in got.values())
    assert model.scores["test_mape"] < 1e-3
    for name in ("const", "flops", "dense_in_bytes", "out_bytes"):
        assert got[name] == pytest.approx(truth[name], rel=1e-3)


def test_learned_kind_fits_a_power_law_and_round_trips_through_json():
    df = _shapes(120, seed=2)
    df["time_ms"] = 1e-5 * df.nnz**0.9 * df.dense_cols**1.1 * df.rows**0.1
    model = fit_spmm(df, "learned", n_splits=10)
    assert model.scores["test_mape"] < 1.0
    entry = json.loads(json.dumps(model.to_dict()))
    assert entry["kind"] == "learned"
    again = spmm_models.predict_spmm_ms(entry, df.nnz, df.rows, df.common, df.dense_cols)
    np.testing.assert_allclose(again, model.predict(df), rtol=1e-12)
    np.testing.assert_allclose(again, df.time_ms, rtol=0.02)


def test_learned_roofline_is_a_correction_of_the_roofline():
    df = _shapes(150, seed=3)
    X = spmm_models.roofline_terms(df.nnz, df.rows, df.common, df.dense_cols)
    base = X @ np.array([0.02, 1e-9, 0.0, 0.0, 2e-8, 0.0])
    df["time_ms"] = base * (1.0 + 0.5 * np.log(df.dense_cols) / np.log(128))  # shape-dependent efficiency
    model = fit_spmm(df, "learned-roofline", n_splits=10)
    entry = model.to_dict()
    assert entry["kind"] == "learned-roofline" and entry["base"]["kind"] == "roofline"
    assert model.scores["test_mape"] < 2.0
    plain = fit_spmm(df, "roofline", n_splits=10)
    assert model.scores["test_mape"] < plain.scores["test_mape"]


def test_auto_picks_the_lowest_held_out_error_and_reports_every_kind():
    df = _shapes(100, seed=4)
    rng = np.random.default_rng(0)
    df["time_ms"] = 3e-6 * df.nnz**0.8 * df.dense_cols**1.2 * np.exp(rng.normal(0, 0.02, len(df)))
    model = fit_spmm(df, "auto", n_splits=30)
    assert set(model.all_scores) == {"paper-spmm", "roofline", "learned", "learned-roofline"}  # 100 rows: too few for trees
    best = min(model.all_scores, key=lambda k: model.all_scores[k]["test_mape"])
    assert model.kind == best
    assert model.scores["test_mape"] < model.all_scores["paper-spmm"]["test_mape"]
    assert model.scores["test_r2"] > 0.95


def test_collectives_recover_alpha_beta_per_tier():
    rows = []
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        for g in (2, 4, 8):
            for m in (1024, 65536, 1 << 22):
                for nodes, alpha_us, beta in ((1, 20.0, 5.0), (2, 50.0, 1.0)):
                    steps = (2 if op == "all_reduce" else 1) * (g - 1)
                    factor = steps / g
                    t = steps * alpha_us * 1e-3 + factor * m / (beta * 1e9) * 1e3
                    rows.append({"op": op, "group_size": g, "nodes": nodes, "message_bytes": m, "time_ms": t})
    df = pd.DataFrame(rows)
    model = fit_collectives(df, n_splits=10)
    assert model.tiers["intra"]["alpha_us"] == pytest.approx(20.0, rel=1e-6)
    assert model.tiers["intra"]["beta_gbps"] == pytest.approx(5.0, rel=1e-6)
    assert model.tiers["inter"]["alpha_us"] == pytest.approx(50.0, rel=1e-6)
    assert model.tiers["inter"]["beta_gbps"] == pytest.approx(1.0, rel=1e-6)
    # all-reduce of 1 MB on 4 ranks in a node: 6 * 20 us + 1.5 * 1e6 B / 5 GB/s = 0.12 + 0.3 ms
    one = pd.DataFrame({"op": ["all_reduce"], "group_size": [4], "nodes": [1], "message_bytes": [1e6]})
    assert model.predict(one)[0] == pytest.approx(0.42)
    d = model.to_dict()
    assert d["beta_inter_gbps"] == pytest.approx(1.0, rel=1e-6) and "note" not in d
    assert model.scores["test_mape"] < 1e-3


def test_collectives_single_tier_copies_intra_into_profile():
    df = pd.DataFrame(
        {"op": ["all_gather"] * 4, "group_size": [2, 2, 4, 4], "nodes": [1] * 4, "message_bytes": [1e3, 1e6, 1e3, 1e6]}
    )
    df["time_ms"] = [0.0105, 0.02, 0.0307, 0.045]
    d = fit_collectives(df, n_splits=0).to_dict()
    assert d["alpha_inter_us"] == d["alpha_intra_us"] and "note" in d


def test_busbw_follows_nccl_tests():
    algbw, busbw = bus_bandwidth_gbps(np.array(["all_reduce", "all_gather"]), np.array([4, 4]), np.array([1e9, 1e9]), np.array([1000.0, 500.0]))
    np.testing.assert_allclose(algbw, [1.0, 2.0])
    np.testing.assert_allclose(busbw, [1.5, 1.5])  # 2(g-1)/g = 1.5 and (g-1)/g = 0.75


def test_gemm_and_epoch_fits_recover_coefficients():
    rng = np.random.default_rng(5)
    g = pd.DataFrame({"rows": rng.integers(64, 4096, 40), "inner": rng.integers(8, 256, 40), "cols": rng.integers(8, 256, 40)})
    g["time_ms"] = 0.005 + 2.0 * g.rows * g.inner * g.cols / 50e9 * 1e3
    gm = fit_gemm(g, n_splits=5)
    assert gm.tflops == pytest.approx(0.05, rel=1e-6)
    assert gm.overhead_ms == pytest.approx(0.005, rel=1e-6)
    runs = pd.DataFrame({"pred_spmm_ms": rng.uniform(1, 50, 30), "pred_gemm_ms": rng.uniform(1, 10, 30), "pred_comm_ms": rng.uniform(0, 40, 30), "pred_other_ms": 0.0})
    runs["obs_epoch_ms"] = 1.3 * runs.pred_spmm_ms + 2.0 * runs.pred_gemm_ms + 0.7 * runs.pred_comm_ms + 4.0
    em = fit_epoch(runs, n_splits=5)
    assert em.scales["spmm_ms"] == pytest.approx(1.3, rel=1e-6)
    assert em.scales["gemm_ms"] == pytest.approx(2.0, rel=1e-6)
    assert em.scales["comm_ms"] == pytest.approx(0.7, rel=1e-6)
    assert em.scales["other_ms"] == 1.0  # all zero: left alone
    assert em.overhead_ms == pytest.approx(4.0, rel=1e-6) and em.method == "total"


def test_epoch_fit_pins_each_scale_on_the_logged_breakdown():
    rng = np.random.default_rng(8)
    runs = pd.DataFrame({"pred_spmm_ms": rng.uniform(1, 50, 30), "pred_gemm_ms": rng.uniform(1, 10, 30), "pred_comm_ms": rng.uniform(1, 40, 30), "pred_other_ms": 0.0})
    own = {"spmm_ms": 1.5, "gemm_ms": 1.2, "comm_ms": 2.0}  # observed part = own scale x predicted part
    for c, b in own.items():
        runs[f"obs_{c}"] = b * runs[f"pred_{c}"] * np.exp(rng.normal(0, 0.01, 30))
    runs["obs_other_ms"] = 0.0
    # phases overlap: the epoch is 0.8 of the sum of the observed parts, plus 6 ms
    runs["obs_epoch_ms"] = 0.8 * sum(b * runs[f"pred_{c}"] for c, b in own.items()) + 6.0
    em = fit_epoch(runs, n_splits=5)
    assert em.method == "breakdown"
    for c, b in own.items():
        assert em.scales[c] == pytest.approx(0.8 * b, rel=0.01)
    assert em.scales["other_ms"] == 1.0
    assert em.overhead_ms == pytest.approx(6.0, rel=0.05)
    assert em.scores["test_mape"] < 1.0
    # a breakdown missing where a part is predicted: back to the total method
    partial = runs.assign(obs_comm_ms=runs.obs_comm_ms.where(runs.index != 4, 0.0))
    assert fit_epoch(partial, n_splits=0).method == "total"


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda df: df.drop(columns="common"), "missing column 'common'"),
        (lambda df: df.assign(time_ms=df.time_ms.where(df.index != 7, np.nan)), "row 8: column 'time_ms'"),
        (lambda df: df.assign(time_ms=df.time_ms.where(df.index != 3, 0.0)), "row 4: time_ms = 0 must be > 0"),
        (lambda df: df.assign(time_ms=df.time_ms.where(df.index != 5, -1.0)), "row 6: time_ms = -1 must be > 0"),
        (lambda df: df.head(9), "9 rows"),
    ],
)
def test_bad_spmm_input_names_the_column_or_row(mutate, message):
    df = _shapes(40)
    df["time_ms"] = 1.0 + df.nnz * 1e-6
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        fit_spmm(mutate(df), "roofline", n_splits=5)


def test_load_table_names_file_lines(tmp_path):
    path = tmp_path / "spmm.csv"
    path.write_text("nnz,rows,common,dense_cols,time_ms\n" + "\n".join(f"{10 + i},{5 + i},8,4,{0.1 * (i + 1)}" for i in range(30)) + "\n10,5,8,4,-3\n")
    df = load_table(path)
    with pytest.raises(UserError, match=r"spmm.csv line 32: time_ms = -3 must be > 0"):
        fit_spmm(df, "paper-spmm", n_splits=5)
    with pytest.raises(UserError, match="does not exist"):
        load_table(tmp_path / "nope.csv")
    with pytest.raises(UserError, match="unknown collective op 'gather'"):
        fit_collectives(pd.DataFrame({"op": ["gather", "all_reduce"], "group_size": [2, 2], "nodes": [1, 1], "message_bytes": [8, 8], "time_ms": [1, 1]}))


def test_collective_time_sharing_of_each_calibration_run():
    import pandas as pd

    from plexus_tune.fit.collectives import collective_time_sharing

    df = pd.DataFrame({"world_size": [8, 4, 2, 2, None], "machine_info.cpu_count": [2, 2, 2, 8, 2],
                       "threads_per_rank": [None, None, 2, None, None]})
    # 8/2, 4/2, 2 ranks x 2 threads on 2 cores, 2 ranks of max(1, 8 // 2) = 4 threads on 8 cores, unknown world
    assert list(collective_time_sharing(df, host_cores=2)) == [4.0, 2.0, 2.0, 1.0, 1.0]
    assert list(collective_time_sharing(df, host_cores=None)) == [1.0] * 5
    assert list(collective_time_sharing(pd.DataFrame({"world_size": [8]}), host_cores=4)) == [2.0]


def test_boosted_trees_evaluate_as_scikit_learn_predicts():
    from sklearn.ensemble import HistGradientBoostingRegressor

    from plexus_tune.fit.spmm_kinds import BOOSTING, exported_trees

    rng = np.random.default_rng(5)
    z = rng.normal(size=(300, 4))
    target = np.where(z[:, 0] > 0.3, 1.0, -0.5) + 0.3 * z[:, 1] * z[:, 2] + rng.normal(0, 0.05, 300)
    hgb = HistGradientBoostingRegressor(**{**BOOSTING, "min_samples_leaf": 40}).fit(z, target)  # big leaves: some trees end early
    depth = BOOSTING["max_depth"]
    init, (feature, threshold, leaf) = exported_trees(hgb, depth)
    assert len(feature) == BOOSTING["max_iter"]
    assert any(spmm_models.TREE_PAD in t for t in threshold)  # padding was needed and is exercised
    model = {"depth": depth, "learning_rate": BOOSTING["learning_rate"], "init": init, "feature": feature, "threshold": threshold, "leaf": leaf}
    fresh = np.concatenate([rng.normal(size=(500, 4)), z])  # the training rows include values at the thresholds' bins
    np.testing.assert_allclose(spmm_models.boosted_correction(model, fresh), hgb.predict(fresh), atol=1e-5)
    with pytest.raises(UserError, match="inconsistent"):
        spmm_models.boosted_correction({**model, "leaf": [t[:-1] for t in leaf]}, fresh)


def test_learned_boosted_follows_a_step_the_polynomial_cannot():
    df = _shapes(600, seed=6)
    # a kernel that turns 2.5x slower per row past 8000 rows (a change of regime)
    df["time_ms"] = 2e-6 * df.nnz * df.dense_cols**0.8 * np.where(df.rows > 8000, 2.5, 1.0)
    calls = []
    boosted = fit_spmm(df, "auto", n_splits=5, progress=lambda *a: calls.append(a))
    smooth = boosted.all_scores["learned-roofline"]
    assert boosted.kind == "learned-boosted"  # auto recovers the kind that can follow the step
    assert boosted.scores["test_mape"] < 0.5 * smooth["test_mape"]
    assert boosted.scores["test_mape"] < 5.0
    # progress: every kind reports its splits, ending at the count it scored
    assert [c for c in calls if c[1] == c[2]] == [(k, 5, 5) for k in SPMM_KINDS]
    entry = json.loads(json.dumps(boosted.to_dict()))
    assert entry["kind"] == "learned-boosted" and entry["base"]["kind"] == "learned-roofline"
    again = spmm_models.predict_spmm_ms(entry, df.nnz, df.rows, df.common, df.dense_cols)
    np.testing.assert_allclose(again, boosted.predict(df), rtol=1e-9)
    # beyond the measured rows the trees stay constant: the base model alone scales
    # (two shapes past every measured size, with the same nonzeros per row)
    far = spmm_models.predict_spmm_ms(entry, 4e7, 4e6, 1e6, 1024) / spmm_models.predict_spmm_ms(entry["base"], 4e7, 4e6, 1e6, 1024)
    near = spmm_models.predict_spmm_ms(entry, 4e6, 4e5, 1e5, 512) / spmm_models.predict_spmm_ms(entry["base"], 4e6, 4e5, 1e5, 512)
    assert far == pytest.approx(near, rel=1e-9)


def _known(kind):
    """A model of ``kind`` built by hand (learned: t = 1e-5 (nnz + 1)^0.8 k^0.9 e^(0.05 log rows log k) lines(k)^0.3)."""
    if kind == "paper-spmm":
        return PaperSpmm(2e-3, 3e-6, 1e-6)
    if kind == "roofline":
        return Roofline({"const": 0.02, "flops": 1e-9, "sparse_bytes": 0.0, "dense_in_bytes": 0.0, "out_bytes": 2e-8, "rows": 1e-6})
    return spmm_models.Learned.from_dict({
        "kind": "learned", "features": "log-shape-lines-polynomial",
        "exponents": [[1, 0, 0, 0, 0], [0, 0, 0, 1, 0], [0, 1, 0, 1, 0], [0, 0, 0, 0, 1]],
        "mean": [0.0] * 4, "scale": [1.0] * 4, "coef": [0.8, 0.9, 0.05, 0.3], "intercept": float(np.log(1e-5))})


@pytest.mark.parametrize("kind, noise", [("paper-spmm", 0.0), ("roofline", 0.03), ("learned", 0.0)])
def test_auto_recovers_the_kind_that_generated_the_data(kind, noise):
    df = _shapes(140, seed=11)
    truth = _known(kind)
    clean = truth.predict(df.nnz, df.rows, df.common, df.dense_cols)
    df["time_ms"] = clean * np.exp(np.random.default_rng(12).normal(0, noise, len(df)))
    model = fit_spmm(df, "auto", n_splits=20)
    assert model.kind == kind
    assert type(model.model) is type(truth)
    rel = np.abs(model.predict(df) / clean - 1)
    assert rel.max() < (0.05 if noise else 1e-3)


def _linear_problem(n=60, seed=0):
    rng = np.random.default_rng(seed)
    X = np.stack([np.ones(n), rng.uniform(1, 10, n)], axis=1)
    y = X @ np.array([1.0, 2.0]) * np.exp(rng.normal(0, 0.2, n))

    def fit(idx):
        w = np.linalg.lstsq(X[idx], y[idx], rcond=None)[0]
        return lambda rows: X[rows] @ w

    return fit, X, y


def test_scoring_stops_at_the_first_check_where_the_r2_standard_error_is_small_enough():
    fit, X, y = _linear_problem()
    target = 0.01
    fast = repeated_split_scores(fit, y, n_splits=500, r2_sem=target, min_splits=20)
    n = fast["splits"]
    # by hand: held-out R^2 of each split, std / sqrt(n) at every tenth split from 20 on
    train, test = split_indices(len(y), 500)
    r2 = np.array([regression_scores(y[te], fit(tr)(te))["r2"] for tr, te in zip(train, test)])
    sem = {m: r2[:m].std() / np.sqrt(m) for m in range(20, 501, 10)}
    first = min(m for m, v in sem.items() if v <= target)
    assert n == first < 500 and fast["test_r2_sem"] == pytest.approx(sem[first])
    assert fast["test_r2"] == pytest.approx(r2[:n].mean()) and fast["splits_requested"] == 500
    # the splits scored are the first n of the full run's: the same means as a run of n splits
    prefix = repeated_split_scores(fit, y, n_splits=n)
    assert {k: fast[k] for k in prefix} == prefix
    # too strict a target: every split is scored
    assert repeated_split_scores(fit, y, n_splits=40, r2_sem=1e-9, min_splits=20)["splits"] == 40


def test_split_cap_bounds_the_share_of_the_score_variance_left_to_the_splits():
    from plexus_tune.fit.scoring import race_split_scores, split_cap

    # by hand: 1/J <= share p / (1 - p), rounded up to a multiple of 10
    assert split_cap(0.7) == 50  # J >= 0.7 / (0.05 * 0.3) = 46.7
    assert split_cap(0.8) == 80 and split_cap(0.5) == 20  # 80 and 20 exactly
    assert split_cap(0.7, share=0.01) == 240  # 233.3
    fit, X, y = _linear_problem()
    capped = repeated_split_scores(fit, y, n_splits=500, r2_sem=1e-9, min_splits=20, cap=50)
    # a target never met: the cap stops it, on the first 50 splits of the full run
    assert capped["splits"] == 50 and capped["split_cap"] == 50
    prefix = repeated_split_scores(fit, y, n_splits=50)
    assert {k: capped[k] for k in prefix} == prefix
    raced = race_split_scores({"a": fit, "b": fit}, y, n_splits=500, r2_sem=1e-9, min_splits=20, cap=50)
    assert raced["a"] == raced["b"] and {k: raced["a"][k] for k in prefix} == prefix and raced["a"]["split_cap"] == 50
    # fit_spmm caps its kinds where a standard-error target is given, not where every split is asked for
    df = _shapes(120, seed=3)
    df["time_ms"] = 1e-4 * df.nnz * df.dense_cols ** 0.5 * np.exp(np.random.default_rng(3).normal(0, 0.3, len(df)))
    assert fit_spmm(df, "learned", n_splits=200, r2_sem=1e-9).scores["splits"] == split_cap()
    assert fit_spmm(df, "learned", n_splits=200, r2_sem=None).scores["splits"] == 200


def test_parallel_scoring_gives_the_same_scores(monkeypatch):
    from plexus_tune.fit import scoring

    fit, X, y = _linear_problem(seed=1)
    serial = repeated_split_scores(fit, y, n_splits=60, r2_sem=0.01, min_splits=20)
    monkeypatch.setattr(scoring, "PARALLEL_MIN_SECONDS", 0.0)  # even these cheap splits go to the workers
    seen = []
    parallel = repeated_split_scores(fit, y, n_splits=60, r2_sem=0.01, min_splits=20, n_jobs=2, progress=lambda d, t: seen.append((d, t)))
    assert parallel == serial
    # two splits in-process (one timed), then rounds of 10 per worker; the last call is the stop
    assert seen[:2] == [(2, 60), (22, 60)] and seen[-1] == (serial["splits"], serial["splits"]) and serial["splits"] == 50


def test_profile_json_text_puts_flat_lists_on_one_line_and_round_trips():
    from plexus_tune.fit.profile import profile_json_text

    profile = {"name": "m", "spmm": {"leaf": [[0.5, -1.25], [2.0, 3.0]], "note": "see [1,\n 2]"}, "empty": [], "objs": [{"a": [1, 2]}]}
    text = profile_json_text(profile)
    assert json.loads(text) == profile
    assert '"leaf": [\n' in text and "[0.5, -1.25]" in text and '"a": [1, 2]' in text
    assert text.endswith("}\n")


def test_fit_profile_from_the_shipped_logs_gives_a_loadable_profile():
    from plexus_tune.fit.profile import FitOptions, fit_profile
    from plexus_tune.model.machine import load_machine

    logs = Path(__file__).resolve().parents[1] / "measurements" / "cpu-gloo-2026-11-23"
    calls = []
    fitted = fit_profile(FitOptions(spmm=logs / "spmm-sweep.jsonl", gemm=[logs / "spmm-shards.jsonl"], collectives=logs / "collectives.jsonl",
                         runs=logs / "runs.jsonl", name="shipped-logs", n_splits=3, device_memory_gib=4), progress=lambda *a: calls.append(a))
    profile = fitted.profile
    machine = load_machine(profile)
    assert machine.name == "shipped-logs" and machine.host_cores == 2 and machine.gpus_per_node == 8
    # the inputs are the files the shipped profile names (same hashes) and every score is recorded
    shipped = json.loads((logs / "profiles" / "cpu-gloo-2core-fitted-2026-11-23.json").read_text())
    assert [i["sha256"] for i in profile["fit"]["inputs"]["spmm"]] == [i["sha256"] for i in shipped["fit"]["inputs"]["spmm"]]
    assert [i["sha256"] for i in profile["fit"]["inputs"]["runs"]] == [i["sha256"] for i in shipped["fit"]["inputs"]["runs"]]
    assert set(profile["fit"]["spmm"]["scores"]) == set(SPMM_KINDS)
    assert profile["spmm"]["kind"] == fitted.report["spmm"]["chosen"] == fitted.spmm.kind
    assert profile["fit"]["epoch"]["configurations"] == 50 and fitted.report["epoch"]["configurations"] == 50
    assert fitted.report["time_sharing"] == {"host_cores": 2, "min": 2.0, "max": 4.0}
    # progress: each stage starts and finishes, in pipeline order
    stages = [c[0] for c in calls if c[1] == c[2]]
    assert stages == [f"spmm {k}" for k in SPMM_KINDS] + ["collectives", "gemm", "collectives on runs", "epoch"]
    # with trainer runs, the collective form is the candidate whose profile fits the runs best (held-out epoch MAPE)
    coll = fitted.collectives
    on_runs = profile["fit"]["collectives"]["epoch_scores"]
    assert set(on_runs) == set(coll.candidates) and len(on_runs) >= 3
    assert coll.name == min(on_runs, key=lambda n: on_runs[n]["test_mape"]) == profile["fit"]["collectives"]["chosen"]
    assert coll.selected_by == "epoch-fit held-out MAPE on trainer runs"
    assert all(sc["splits"] == 3 for sc in on_runs.values())  # min(n_splits, SELECTION_SPLITS)
    # folding the run fit into the rates: the SpMM entry is the fitted model scaled by the epoch's spmm factor
    shapes = (np.array([1e4, 3e5]), np.array([500.0, 9000.0]), np.array([800.0, 16000.0]), np.array([16.0, 64.0]))
    np.testing.assert_allclose(spmm_models.predict_spmm_ms(profile["spmm"], *shapes),
                               fitted.profile["fit"]["epoch"]["scales"]["spmm_ms"] * fitted.spmm.model.predict(*shapes), rtol=1e-12)


def test_fit_profile_takes_tables_and_says_what_is_missing():
    from plexus_tune.fit.profile import FitOptions, fit_profile

    df = _shapes(40)
    df["time_ms"] = 0.01 + 1e-6 * df.nnz * df.dense_cols
    coll = pd.DataFrame({"op": ["all_gather"] * 4, "group_size": [2, 2, 4, 4], "nodes": [1] * 4, "message_bytes": [1e3, 1e6, 1e3, 1e6],
                         "time_ms": [0.0105, 0.02, 0.0307, 0.045]})
    with pytest.raises(UserError, match="no GEMM measurements") as err:
        fit_profile(FitOptions(spmm=df, collectives=coll, name="t", n_splits=0))
    assert err.value.parameter == "gemm_tflops"  # the command line names its flag
    fitted = fit_profile(FitOptions(spmm=df, collectives=coll, name="t", kind="roofline", n_splits=4, gemm_tflops=0.5, device_memory_gib=1))
    assert fitted.profile["gemm_tflops"] == 0.5 and fitted.profile["spmm"]["kind"] == "roofline"
    assert fitted.profile["fit"]["inputs"]["spmm"] == [{"table": "a table", "rows": 40}]
    # an explicit kind is scored beside every other kind the 40 rows support: rows > (parameters + 2) / 0.7,
    # so learned (21) needs 33, learned-roofline (27) 42 and learned-boosted (100) 146
    assert set(fitted.profile["fit"]["spmm"]["scores"]) == {"paper-spmm", "roofline", "learned"}
    with pytest.raises(UserError, match="number of splits"):
        fit_profile(FitOptions(spmm=df, collectives=coll, name="t", n_splits=-1, gemm_tflops=0.5))


def test_fit_profile_fits_the_network_on_fp32_and_the_per_call_time_on_the_rest():
    from plexus_tune.fit.profile import FitOptions, fit_profile

    df = _shapes(40)
    df["time_ms"] = 0.01 + 1e-6 * df.nnz * df.dense_cols
    sizes = [1 << 14, 1 << 16, 1 << 18, 1 << 20]
    # FP32: 0.2 ms per step + 1 GB/s bus bandwidth; int2 the same ring on M/16 + 8 B a row,
    # plus 1.5 ms per process-group call (two for the all-reduce), no codec rates: those come
    # from the records' local steps (0.05 ms)
    rows = []
    for op, steps, factor in (("all_reduce", 2, 1.0), ("all_gather", 1, 0.5)):
        for m in sizes:
            base = {"op": op, "group_size": 2, "stride": 1, "nodes": 1, "message_bytes": m, "measured_at": "t0"}
            rows.append({**base, "comm_precision": "fp32", "time_ms": steps * 0.2 + factor * m / 1e9 * 1e3})
            wire = m / 16 + 8 * (m // 256)
            rows.append({**base, "comm_precision": "int2", "rows": m // 256, "cols": 64, "quant_ms": 0.05,
                         "time_ms": steps * 0.2 + factor * wire / 1e9 * 1e3 + 0.05 + 1.5 * (2 if op == "all_reduce" else 1)})
    coll = pd.DataFrame(rows)
    kw = dict(spmm=df, name="t", kind="roofline", n_splits=4, gemm_tflops=0.5, device_memory_gib=1)
    both = fit_profile(FitOptions(collectives=coll, **kw))
    fp32 = fit_profile(FitOptions(collectives=coll[coll.comm_precision == "fp32"].drop(columns=["rows", "cols", "quant_ms"]), **kw))
    assert both.profile["collectives"] == fp32.profile["collectives"]  # the network sees FP32 timings only
    assert "quant" not in fp32.profile
    entry = both.profile["quant"]["int2"]
    # codec time is (enc + dec) bytes / rate = 0.05 ms by construction, so the rest is 1.5 ms a call
    assert entry["call_ms"] == pytest.approx(1.5, rel=0.05) and entry["call_samples"] == 8
    assert both.report["quant"]["int2"]["pairs"] == 8 and "call_ms" in both.profile["provenance"]["quant"]
    with pytest.raises(UserError, match="only reduced-precision"):
        fit_profile(FitOptions(collectives=coll[coll.comm_precision == "int2"], **kw))


def test_scoring_stops_once_a_rival_is_beaten_by_four_standard_errors():
    from plexus_tune.fit.scoring import RACE_SEMS, upper_mape

    fit, X, y = _linear_problem(seed=2)
    full = repeated_split_scores(fit, y, n_splits=200)
    train, test = split_indices(len(y), 200)
    mape = np.array([regression_scores(y[te], fit(tr)(te))["mape"] for tr, te in zip(train, test)])
    lower = {m: mape[:m].mean() - RACE_SEMS * mape[:m].std() / np.sqrt(m) for m in range(20, 201, 10)}
    rival = lower[20] - 1.0  # beaten at the first check
    raced = repeated_split_scores(fit, y, n_splits=200, min_splits=20, beaten_by=rival)
    assert raced["beaten"] and raced["splits"] == 20 and raced["test_mape"] == pytest.approx(mape[:20].mean())
    # a rival worse than this model's lower bound at every check: every split is scored, as without a rival
    unbeaten = repeated_split_scores(fit, y, n_splits=200, min_splits=20, beaten_by=min(lower.values()) - 1e-9 + 100)
    assert "beaten" not in unbeaten and unbeaten == full
    assert upper_mape(full) == pytest.approx(full["test_mape"] + RACE_SEMS * full["test_mape_std"] / np.sqrt(200))


def test_auto_keeps_the_kind_that_scoring_every_split_keeps():
    df = _shapes(120, seed=5)
    f = df.nnz * df.dense_cols
    rng = np.random.default_rng(5)
    df["time_ms"] = (2e-3 * np.sqrt(f) + 3e-6 * np.sqrt(f) * df.common / df.dense_cols) * np.exp(rng.normal(0, 0.05, len(df)))
    kinds = ("paper-spmm", "roofline", "learned")
    raced = fit_spmm(df, "auto", kinds=kinds, n_splits=200, r2_sem=None, min_splits=20)
    every = {k: fit_spmm(df, k, n_splits=200, r2_sem=None).scores for k in kinds}
    assert raced.kind == min(kinds, key=lambda k: every[k]["test_mape"])
    beaten = [k for k, s in raced.all_scores.items() if s.get("beaten")]
    assert beaten and all(raced.all_scores[k]["splits"] < 200 for k in beaten)
    assert raced.scores == every[raced.kind]


def test_scoring_workers_leave_ctrl_c_to_the_command():
    """Ctrl-C reaches the whole foreground group: the workers ignore it, the command stops them."""
    import signal

    from plexus_tune import resources

    pool = resources.worker_pool(2)
    try:
        assert pool.submit(signal.getsignal, signal.SIGINT).result(120) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the command's own handler is back
        slow = pool.submit(time.sleep, 600)
        while not slow.running():
            time.sleep(0.05)
    finally:
        started = time.monotonic()
        resources.stop_worker_pool()
    assert time.monotonic() - started < 60  # the 600 s task was stopped, not waited for


def test_provenance_notes_and_annotation():
    from plexus_tune.fit.profile import FitOptions, annotate_provenance, provenance_notes

    assert provenance_notes(["gemm_tflops= measured by hand ", "sync_us=x"]) == {"gemm_tflops": "measured by hand",
                                                                                 "sync_us": "x"}
    for bad, why in (("gemm_tflops", "FIELD=TEXT"), ("nonsense=x", "not a profile field"), ("schema=x", "not a profile")):
        with pytest.raises(UserError, match=why):
            provenance_notes([bad])
    profile = {"provenance": {"gemm_tflops": "given GEMM rate", "spmm": "fit_spmm kind roofline"}}
    annotate_provenance(profile, {"gemm_tflops": "--gemm-tflops", "host_cores": "--host-cores"}, {"spmm": "note"})
    assert profile["provenance"] == {"gemm_tflops": "--gemm-tflops", "spmm": "fit_spmm kind roofline; note"}
    with pytest.raises(UserError, match="not both"):
        FitOptions(spmm="s.jsonl", collectives=["c.jsonl"], collectives_profile="perlmutter", name="x")
    with pytest.raises(UserError, match="unknown collective model form"):
        FitOptions(spmm="s.jsonl", collectives=["c.jsonl"], name="x", collective_form="ring")
    assert FitOptions(spmm="s.jsonl", collectives=[], collectives_profile="perlmutter", name="x").collectives == []
