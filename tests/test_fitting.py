import json

import numpy as np
import pandas as pd
import pytest

from plexus_tune.model import spmm as spmm_models
from plexus_tune.errors import UserError
from plexus_tune.fit import (
    bus_bandwidth_gbps,
    fit_collectives,
    fit_epoch,
    fit_gemm,
    fit_spmm,
    load_table,
    regression_scores,
    split_indices,
)


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


def test_paper_kind_recovers_its_coefficients_and_serializes_as_paper_spmm():
    df = _shapes(60)
    f = df.nnz * df.dense_cols
    # t = c0 sqrt(f) + c1 sqrt(f) common/k + c2 sqrt(f) rows/k
    df["time_ms"] = 2e-3 * np.sqrt(f) + 3e-6 * np.sqrt(f) * df.common / df.dense_cols + 1e-6 * np.sqrt(f) * df.rows / df.dense_cols
    model = fit_spmm(df, "paper", n_splits=20)
    d = model.to_dict()
    assert d["kind"] == "paper-spmm"
    assert [d["c0"], d["c1"], d["c2"]] == pytest.approx([2e-3, 3e-6, 1e-6], rel=1e-6)
    assert model.scores["test_r2"] == pytest.approx(1.0, abs=1e-9)
    # one hand-computed point: nnz=100, k=4 -> sqrt(f)=20; common=400, rows=200
    one = pd.DataFrame({"nnz": [100], "rows": [200], "common": [400], "dense_cols": [4]})
    assert model.predict(one)[0] == pytest.approx(20 * (2e-3 + 3e-6 * 100 + 1e-6 * 50))


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
    assert entry["kind"] == "learned" and entry["base"]["kind"] == "roofline"
    assert model.scores["test_mape"] < 2.0
    plain = fit_spmm(df, "roofline", n_splits=10)
    assert model.scores["test_mape"] < plain.scores["test_mape"]


def test_auto_picks_the_lowest_held_out_error_and_reports_every_kind():
    df = _shapes(100, seed=4)
    rng = np.random.default_rng(0)
    df["time_ms"] = 3e-6 * df.nnz**0.8 * df.dense_cols**1.2 * np.exp(rng.normal(0, 0.02, len(df)))
    model = fit_spmm(df, "auto", n_splits=30)
    assert set(model.all_scores) == {"paper", "roofline", "learned", "learned-roofline"}
    best = min(model.all_scores, key=lambda k: model.all_scores[k]["test_mape"])
    assert model.kind == best
    assert model.scores["test_mape"] < model.all_scores["paper"]["test_mape"]
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
        fit_spmm(df, "paper", n_splits=5)
    with pytest.raises(UserError, match="does not exist"):
        load_table(tmp_path / "nope.csv")
    with pytest.raises(UserError, match="unknown collective op 'broadcast'"):
        fit_collectives(pd.DataFrame({"op": ["broadcast", "all_reduce"], "group_size": [2, 2], "nodes": [1, 1], "message_bytes": [8, 8], "time_ms": [1, 1]}))


def test_collective_time_sharing_of_each_calibration_run():
    import pandas as pd

    from plexus_tune.fit import collective_time_sharing

    df = pd.DataFrame({"world_size": [8, 4, 2, 2, None], "machine_info.cpu_count": [2, 2, 2, 8, 2],
                       "threads_per_rank": [None, None, 2, None, None]})
    # 8/2, 4/2, 2 ranks x 2 threads on 2 cores, 2 ranks of max(1, 8 // 2) = 4 threads on 8 cores, unknown world
    assert list(collective_time_sharing(df, host_cores=2)) == [4.0, 2.0, 2.0, 1.0, 1.0]
    assert list(collective_time_sharing(df, host_cores=None)) == [1.0] * 5
    assert list(collective_time_sharing(pd.DataFrame({"world_size": [8]}), host_cores=4)) == [2.0]


def test_boosted_trees_evaluate_as_scikit_learn_predicts():
    from sklearn.ensemble import GradientBoostingRegressor

    from plexus_tune.fit import BOOSTING, complete_tree

    rng = np.random.default_rng(5)
    z = rng.normal(size=(300, 4))
    target = np.where(z[:, 0] > 0.3, 1.0, -0.5) + 0.3 * z[:, 1] * z[:, 2] + rng.normal(0, 0.05, 300)
    gbr = GradientBoostingRegressor(**{**BOOSTING, "min_samples_leaf": 40}).fit(z, target)  # big leaves: some trees end early
    depth = BOOSTING["max_depth"]
    trees = [complete_tree(est.tree_, depth) for est in gbr.estimators_[:, 0]]
    assert any(spmm_models.TREE_PAD in t[1] for t in trees)  # padding was needed and is exercised
    model = {"depth": depth, "learning_rate": BOOSTING["learning_rate"], "init": float(gbr.init_.constant_.ravel()[0]),
             "feature": [t[0] for t in trees], "threshold": [t[1] for t in trees], "leaf": [t[2] for t in trees]}
    fresh = rng.normal(size=(500, 4))
    np.testing.assert_allclose(spmm_models.boosted_correction(model, fresh), gbr.predict(fresh), atol=1e-5)
    with pytest.raises(UserError, match="inconsistent"):
        spmm_models.boosted_correction({**model, "leaf": [t[2][:-1] for t in trees]}, fresh)


def test_learned_boosted_follows_a_step_the_polynomial_cannot():
    df = _shapes(600, seed=6)
    # a kernel that turns 2.5x slower per row past 8000 rows (a change of regime)
    df["time_ms"] = 2e-6 * df.nnz * df.dense_cols**0.8 * np.where(df.rows > 8000, 2.5, 1.0)
    smooth = fit_spmm(df, "learned-roofline", n_splits=5)
    boosted = fit_spmm(df, "learned-boosted", n_splits=5)
    assert boosted.scores["test_mape"] < 0.5 * smooth.scores["test_mape"]
    assert boosted.scores["test_mape"] < 5.0
    entry = json.loads(json.dumps(boosted.to_dict()))
    assert entry["kind"] == "boosted" and entry["base"]["kind"] == "learned"
    again = spmm_models.predict_spmm_ms(entry, df.nnz, df.rows, df.common, df.dense_cols)
    np.testing.assert_allclose(again, boosted.predict(df), rtol=1e-9)
    # beyond the measured rows the trees stay constant: the base model alone scales
    # (two shapes past every measured size, with the same nonzeros per row)
    far = spmm_models.predict_spmm_ms(entry, 4e7, 4e6, 1e6, 1024) / spmm_models.predict_spmm_ms(entry["base"], 4e7, 4e6, 1e6, 1024)
    near = spmm_models.predict_spmm_ms(entry, 4e6, 4e5, 1e5, 512) / spmm_models.predict_spmm_ms(entry["base"], 4e6, 4e5, 1e5, 512)
    assert far == pytest.approx(near, rel=1e-9)


def test_profile_json_text_puts_flat_lists_on_one_line_and_round_trips():
    from plexus_tune.fit import profile_json_text

    profile = {"name": "m", "spmm": {"leaf": [[0.5, -1.25], [2.0, 3.0]], "note": "see [1,\n 2]"}, "empty": [], "objs": [{"a": [1, 2]}]}
    text = profile_json_text(profile)
    assert json.loads(text) == profile
    assert '"leaf": [\n' in text and "[0.5, -1.25]" in text and '"a": [1, 2]' in text
    assert text.endswith("}\n")
