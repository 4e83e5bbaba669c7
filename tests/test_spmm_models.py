import json
from pathlib import Path

import numpy as np
import pytest

from plexus_tune.errors import UserError
from plexus_tune.fit.spmm_kinds import BOOSTING, fit_kind
from plexus_tune.model import spmm as spmm_models
from plexus_tune.model.spmm import (
    FIT_KINDS,
    SPMM_MODELS,
    LearnedBoosted,
    LearnedRoofline,
    Paper,
    Roofline,
    current_kind,
    monomial_exponents,
    predict_spmm_ms,
    spmm_model_from_dict,
)

ROOT = Path(__file__).resolve().parents[1]
ROOF = {"const": 1.0, "flops": 0.0, "sparse_bytes": 0.0, "dense_in_bytes": 0.0, "out_bytes": 0.0, "rows": 0.01}


def _shapes(n, seed=0):
    rng = np.random.default_rng(seed)
    rows = np.round(np.exp(rng.uniform(np.log(50), np.log(20000), n)))
    common = np.round(np.exp(rng.uniform(np.log(50), np.log(20000), n)))
    k = 2.0 ** rng.integers(0, 8, n)
    nnz = np.round(rows * np.exp(rng.uniform(0, np.log(30), n)))
    return nnz, rows, common, k


def test_learned_evaluator_by_hand():
    # log t = log 2 + (log(nnz + 1) - 0) / 1  ->  t = 2 (nnz + 1)
    model = {"kind": "learned", "exponents": [[1, 0, 0, 0]], "mean": [0.0], "scale": [1.0], "coef": [1.0], "intercept": float(np.log(2.0))}
    np.testing.assert_allclose(predict_spmm_ms(model, [0, 9, 99], 10, 10, 4), [2.0, 20.0, 200.0])
    # second-degree term on log k, standardized: coef 0.5 on ((log k)^2 - 1) / 2
    model = {"kind": "learned", "exponents": [[0, 0, 0, 2]], "mean": [1.0], "scale": [2.0], "coef": [0.5], "intercept": 0.0}
    k = np.exp(3.0)
    assert predict_spmm_ms(model, 5, 5, 5, k) == pytest.approx(np.exp(0.5 * (9.0 - 1.0) / 2.0))


def test_older_learned_with_roofline_base_loads_as_learned_roofline():
    base = {"kind": "roofline", "coefficients": ROOF}
    old = {"kind": "learned", "exponents": [[0, 1, 0, 0]], "mean": [0.0], "scale": [1.0], "coef": [0.0], "intercept": float(np.log(3.0)), "base": base}
    assert current_kind(old) == "learned-roofline"
    model = spmm_model_from_dict(old)
    assert isinstance(model, LearnedRoofline) and isinstance(model.base, Roofline)
    # base = 1 + 0.01 rows = 2 at rows=100; correction exp(log 3) = 3
    assert predict_spmm_ms(old, 50, 100, 10, 8) == pytest.approx(6.0)
    new = model.to_dict()
    assert new["kind"] == "learned-roofline" and new["base"]["kind"] == "roofline"
    assert predict_spmm_ms(new, 50, 100, 10, 8) == predict_spmm_ms(old, 50, 100, 10, 8)
    # a plain learned model (older fits wrote "base": null) stays learned
    assert current_kind({**old, "base": None}) == "learned"
    with pytest.raises(UserError, match="only a roofline base"):
        spmm_model_from_dict({**old, "base": {"kind": "paper-spmm", "c0": 1.0, "c1": 0.0, "c2": 0.0}})


def test_older_boosted_loads_as_learned_boosted():
    learned = {"kind": "learned", "exponents": [[1, 0, 0, 0]], "mean": [0.0], "scale": [1.0], "coef": [1.0], "intercept": 0.0}
    # one depth-1 tree: z[0] = log(nnz + 1) <= log 5 -> leaf 0.0, else 1.0 (x e^0.5 at rate 0.5)
    old = {"kind": "boosted", "features": "log-shape-polynomial", "depth": 1, "learning_rate": 0.5, "init": 0.0,
           "feature": [[0]], "threshold": [[float(np.log(5.0))]], "leaf": [[0.0, 1.0]], "base": learned}
    model = spmm_model_from_dict(old)
    assert isinstance(model, LearnedBoosted) and model.base.name == "learned"
    assert predict_spmm_ms(old, 3, 1, 1, 1) == pytest.approx(4.0)  # base nnz + 1 = 4, leaf 0
    assert predict_spmm_ms(old, 9, 1, 1, 1) == pytest.approx(10.0 * np.exp(0.5))
    assert model.to_dict()["kind"] == "learned-boosted"
    assert model.describe() == "learned-boosted: 1 trees of depth 1 on log-shape-polynomial; correcting learned: ridge on 1 monomials of degree <= ? of log-shape-polynomial"


def test_paper_splits_the_layer_form_over_its_two_spmms_and_only_paper_spmm_fits():
    coefs = {"c0": 1e-3, "c1": 2e-6, "c2": -1e-6}
    # f = nnz k = 400: sqrt(f) = 20; forward c0/2 + c1 common/k, backward c0/2 + c2 common/k
    fwd = predict_spmm_ms({"kind": "paper", **coefs}, 100, 200, 400, 4)
    bwd = predict_spmm_ms({"kind": "paper", **coefs}, 100, 400, 200, 4, backward=True)
    assert fwd == pytest.approx(20 * (0.5e-3 + 2e-6 * 400 / 4))
    assert bwd == pytest.approx(20 * (0.5e-3 - 1e-6 * 200 / 4))
    # the pair adds up to the paper's per-layer term sqrt(f) (c0 + c1 fwd_penalty + c2 bwd_penalty)
    assert fwd + bwd == pytest.approx(20 * (1e-3 + 2e-6 * 100 - 1e-6 * 50))
    # paper-spmm is direction-free: c0 sqrt(f) + c1 sqrt(f) common/k + c2 sqrt(f) rows/k
    b = predict_spmm_ms({"kind": "paper-spmm", **coefs}, 100, 200, 400, 4, backward=True)
    assert b == pytest.approx(20 * (1e-3 + 2e-6 * 100 - 1e-6 * 50))
    assert "paper" not in FIT_KINDS and set(FIT_KINDS) == set(SPMM_MODELS) - {"paper"}
    with pytest.raises(UserError, match="paper-spmm"):
        fit_kind("paper", _shapes(10), np.ones(10))


def test_monomials_and_bad_models():
    assert monomial_exponents(2, 2) == [[1, 0], [0, 1], [2, 0], [1, 1], [0, 2]]
    assert len(monomial_exponents(4, 3)) == 34  # C(7,3) - 1
    with pytest.raises(UserError, match="lacks 'coef'"):
        predict_spmm_ms({"kind": "learned", "exponents": [], "mean": [], "scale": [], "intercept": 0}, 1, 1, 1, 1)
    with pytest.raises(UserError, match="unknown SpMM model kind"):
        predict_spmm_ms({"kind": "magic"}, 1, 1, 1, 1)
    with pytest.raises(UserError, match=r"lacks coefficients \['rows'\]"):
        predict_spmm_ms({"kind": "roofline", "coefficients": {k: 0.0 for k in list(ROOF)[:-1]}}, 1, 1, 1, 1)
    with pytest.raises(UserError, match="finite number"):
        spmm_model_from_dict({"kind": "paper-spmm", "c0": "fast", "c1": 0, "c2": 0})
    with pytest.raises(UserError, match="lacks its 'base'"):
        spmm_model_from_dict({"kind": "learned-boosted", "depth": 1, "feature": [], "threshold": [], "leaf": []})


def test_polynomial_features_against_brute_force():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(7, 3))
    exps = monomial_exponents(3, 3)
    brute = np.array([[np.prod([row[j] ** e[j] for j in range(3)]) for e in exps] for row in z])
    got = spmm_models.polynomial_features(z, exps)
    np.testing.assert_allclose(got, brute, rtol=1e-14)
    assert got.flags.c_contiguous


def test_cache_lines_per_row_against_brute_force():
    from plexus_tune.model.spmm import cache_lines_per_row

    def brute(k, s=4, line=64, n=4096):
        total = 0
        for i in range(n):  # row i occupies bytes [i k s, (i + 1) k s) of a line-aligned matrix
            first, last = (i * k * s) // line, ((i + 1) * k * s - 1) // line
            total += last - first + 1
        return total / n

    ks = np.array([1, 2, 3, 4, 5, 8, 9, 12, 15, 16, 17, 24, 31, 32, 33, 48, 100, 255])
    np.testing.assert_allclose(cache_lines_per_row(ks), [brute(int(k)) for k in ks], rtol=1e-12)
    # 64 bytes fill one line; 68 bytes always take two; 36 bytes take two from half the offsets (32..60)
    assert cache_lines_per_row(16) == 1.0 and cache_lines_per_row(17) == 2.0 and cache_lines_per_row(9) == 1.5
    np.testing.assert_allclose(cache_lines_per_row(np.array([[8, 16]]), bytes_per_element=8), [[1.0, 2.0]])


def test_learned_features_with_lines_and_inconsistent_models():
    from plexus_tune.model.spmm import cache_lines_per_row

    # log t = log(lines(k)): the fifth variable alone
    model = {"kind": "learned", "features": "log-shape-lines-polynomial", "exponents": [[0, 0, 0, 0, 1]],
             "mean": [0.0], "scale": [1.0], "coef": [1.0], "intercept": 0.0}
    np.testing.assert_allclose(predict_spmm_ms(model, 10, 10, 10, [16, 17, 3]), cache_lines_per_row([16, 17, 3]))
    with pytest.raises(UserError, match="5 variables"):
        predict_spmm_ms({**model, "exponents": [[0, 0, 0, 1]]}, 10, 10, 10, 4)
    with pytest.raises(UserError, match="feature set"):
        predict_spmm_ms({**model, "features": "magic"}, 10, 10, 10, 4)


def test_learned_model_does_not_extrapolate_beyond_its_fitted_box():
    # log t = (log k)^2: inside the box [log 2, log 8] exact, outside held at the boundary
    model = {"kind": "learned", "exponents": [[0, 0, 0, 2]], "mean": [0.0], "scale": [1.0], "coef": [1.0], "intercept": 0.0,
             "z_min": [0.0, 0.0, 0.0, float(np.log(2))], "z_max": [99.0, 99.0, 99.0, float(np.log(8))]}
    t = predict_spmm_ms(model, 10, 10, 10, [1, 4, 64])
    np.testing.assert_allclose(t, np.exp(np.log([2.0, 4.0, 8.0]) ** 2))


@pytest.fixture(scope="module")
def fitted_kinds():
    """Every fittable kind fitted on one noisy synthetic data set (boosted needs 150 rows)."""
    shapes = _shapes(220, seed=3)
    nnz, rows, common, k = shapes
    rng = np.random.default_rng(4)
    time_ms = (0.01 + 2e-6 * nnz * k**0.9 + 1e-7 * rows * k) * np.where(rows > 4000, 1.6, 1.0) * np.exp(rng.normal(0, 0.05, len(k)))
    return shapes, {name: fit_kind(name, shapes, time_ms) for name in FIT_KINDS}


def test_every_kind_round_trips_through_json_with_identical_predictions(fitted_kinds):
    fresh = _shapes(50, seed=9)
    far = (np.array([1e8, 0.0]), np.array([1e7, 3.0]), np.array([1e7, 2.0]), np.array([2048.0, 1.0]))  # outside the data
    for name, model in fitted_kinds[1].items():
        entry = json.loads(json.dumps(model.to_dict()))
        assert entry["kind"] == name
        again = spmm_model_from_dict(entry)
        assert type(again) is type(model) and again.to_dict() == entry
        for shapes in (fresh, far):
            np.testing.assert_array_equal(again.predict(*shapes), model.predict(*shapes))
            np.testing.assert_array_equal(predict_spmm_ms(entry, *shapes), model.predict(*shapes))
        assert again.describe() == model.describe() and again.describe().startswith(name + ":")
        assert model.n_parameters == type(model).n_parameters > 0


def test_every_kind_scales_its_predictions(fitted_kinds):
    fresh = _shapes(30, seed=10)
    for name, model in {**fitted_kinds[1], "paper": Paper(1e-3, 2e-6, -1e-6)}.items():
        scaled = model.scaled(2.5)
        assert type(scaled) is type(model)
        np.testing.assert_allclose(scaled.predict(*fresh), 2.5 * model.predict(*fresh), rtol=1e-12)
        np.testing.assert_array_equal(model.predict(*fresh), spmm_model_from_dict(model.to_dict()).predict(*fresh))  # unchanged


def test_fitted_boosted_corrects_a_learned_roofline(fitted_kinds):
    boosted = fitted_kinds[1]["learned-boosted"]
    entry = boosted.to_dict()
    assert entry["base"]["kind"] == "learned-roofline" and entry["base"]["base"]["kind"] == "roofline"
    assert len(entry["feature"]) == BOOSTING["max_iter"]
    assert all(len(t) == 2 ** entry["depth"] - 1 for t in entry["threshold"])


def test_unfitted_model_says_so():
    with pytest.raises(ValueError, match="not fitted"):
        Roofline().predict(1, 1, 1, 1)
    assert "not fitted" in repr(LearnedBoosted())


SHAPES = {"nnz": np.array([1e3, 5e4, 2e6, 3e7, 1.2e8]), "rows": np.array([100, 2_000, 40_000, 600_000, 2_449_029]),
          "common": np.array([400, 8_000, 40_000, 150_000, 2_449_029]), "dense_cols": np.array([2, 16, 64, 128, 100])}


def _shipped(kind=None):
    out = []
    for path in sorted((ROOT / "models").glob("*.json")):
        profile = json.loads(path.read_text())
        if kind is None or profile["spmm"].get("kind") in kind:
            out.append(profile)
    return out


@pytest.mark.parametrize("profile", _shipped({"paper"}), ids=lambda p: p["name"])
def test_shipped_paper_profiles_follow_the_papers_formula(profile):
    """By hand (docs/model.md, SpMM): forward c0/2 sqrt(f) + c1 sqrt(f) common/k, backward
    c0/2 sqrt(f) + c2 sqrt(f) common/k, f = nnz k, with the profile's coefficients."""
    c0, c1, c2 = (profile["spmm"][k] for k in ("c0", "c1", "c2"))
    nnz, common, k = SHAPES["nnz"], SHAPES["common"], SHAPES["dense_cols"]
    root_f = np.sqrt(nnz * k)
    fwd = predict_spmm_ms(profile["spmm"], nnz, SHAPES["rows"], common, k)
    bwd = predict_spmm_ms(profile["spmm"], nnz, SHAPES["rows"], common, k, backward=True)
    np.testing.assert_allclose(fwd, c0 / 2 * root_f + c1 * root_f * common / k, rtol=1e-12)
    np.testing.assert_allclose(bwd, c0 / 2 * root_f + c2 * root_f * common / k, rtol=1e-12)


@pytest.mark.parametrize("profile", _shipped({"roofline"}), ids=lambda p: p["name"])
def test_shipped_roofline_profiles_price_each_term_by_hand(profile):
    """By hand: const + flops 2 nnz k + sparse bytes nnz (s + 4) + dense input s common k +
    output s rows k + rows, each times the profile's coefficient (s = bytes per element)."""
    coef, s = profile["spmm"]["coefficients"], profile["spmm"].get("bytes_per_element", 4)
    nnz, rows, common, k = (SHAPES[c] for c in ("nnz", "rows", "common", "dense_cols"))
    want = (coef["const"] + coef["flops"] * 2 * nnz * k + coef["sparse_bytes"] * nnz * (s + 4)
            + coef["dense_in_bytes"] * s * common * k + coef["out_bytes"] * s * rows * k + coef["rows"] * rows)
    np.testing.assert_allclose(predict_spmm_ms(profile["spmm"], nnz, rows, common, k), want, rtol=1e-12)


FITTED = [p for p in _shipped() if p["spmm"].get("kind") not in ("paper", "roofline")]


@pytest.mark.parametrize("profile", FITTED, ids=lambda p: p["name"])
def test_shipped_fitted_profiles_rank_their_measured_spmm_timings(profile):
    """The measured SpMM timings each fitted profile names in its ``fit`` record (data the
    code reads, never writes): the profile's SpMM model ranks them (Spearman >= 0.95) and
    its ratio to them is nearly constant (the 90th percentile of predicted / measured within
    a factor 2 of the 10th: the run fit may rescale the whole model, not its shape)."""
    from scipy.stats import spearmanr

    from plexus_tune.fit.spmm import spmm_shapes, spmm_structure
    from plexus_tune.fit.tables import load_table

    paths = sorted({s["path"] for s in _sources(profile["fit"]) if "spmm" in Path(s["path"]).name})
    assert paths, profile["name"]
    import pandas as pd

    df = pd.concat([load_table(ROOT / p, schema="spmm") for p in paths], ignore_index=True)
    model = spmm_model_from_dict(profile["spmm"])
    structure = spmm_structure(df) if model.uses_structure else None
    got = predict_spmm_ms(model, *spmm_shapes(df), structure)
    measured = df["time_ms"].to_numpy(dtype=float)
    assert spearmanr(got, measured)[0] >= 0.95
    lo, hi = np.percentile(got / measured, [10, 90])
    assert hi / lo <= 2.0


def _sources(fit):
    out = []
    if isinstance(fit, dict):
        out += [fit] if isinstance(fit.get("path"), str) else []
        for v in fit.values():
            out += _sources(v)
    elif isinstance(fit, list):
        for v in fit:
            out += _sources(v)
    return out


