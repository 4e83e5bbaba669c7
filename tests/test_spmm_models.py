import numpy as np
import pytest

from plexus_tune.errors import UserError
from plexus_tune.model.spmm import monomial_exponents, predict_spmm_ms


def test_learned_evaluator_by_hand():
    # log t = log 2 + (log(nnz + 1) - 0) / 1  ->  t = 2 (nnz + 1)
    model = {"kind": "learned", "exponents": [[1, 0, 0, 0]], "mean": [0.0], "scale": [1.0], "coef": [1.0], "intercept": float(np.log(2.0))}
    np.testing.assert_allclose(predict_spmm_ms(model, [0, 9, 99], 10, 10, 4), [2.0, 20.0, 200.0])
    # second-degree term on log k, standardized: coef 0.5 on ((log k)^2 - 1) / 2
    model = {"kind": "learned", "exponents": [[0, 0, 0, 2]], "mean": [1.0], "scale": [2.0], "coef": [0.5], "intercept": 0.0}
    k = np.exp(3.0)
    assert predict_spmm_ms(model, 5, 5, 5, k) == pytest.approx(np.exp(0.5 * (9.0 - 1.0) / 2.0))


def test_learned_with_roofline_base_multiplies_it():
    base = {"kind": "roofline", "coefficients": {"const": 1.0, "flops": 0.0, "sparse_bytes": 0.0, "dense_in_bytes": 0.0, "out_bytes": 0.0, "rows": 0.01}}
    model = {"kind": "learned", "exponents": [[0, 1, 0, 0]], "mean": [0.0], "scale": [1.0], "coef": [0.0], "intercept": float(np.log(3.0)), "base": base}
    # base = 1 + 0.01 rows = 2 at rows=100; correction exp(log 3) = 3
    assert predict_spmm_ms(model, 50, 100, 10, 8) == pytest.approx(6.0)


def test_paper_spmm_alias_equals_paper():
    coefs = {"c0": 1e-3, "c1": 2e-6, "c2": -1e-6}
    a = predict_spmm_ms({"kind": "paper", **coefs}, 100, 200, 400, 4)
    b = predict_spmm_ms({"kind": "paper-spmm", **coefs}, 100, 200, 400, 4)
    assert a == b == pytest.approx(20 * (1e-3 + 2e-6 * 100 - 1e-6 * 50))


def test_monomials_and_bad_models():
    assert monomial_exponents(2, 2) == [[1, 0], [0, 1], [2, 0], [1, 1], [0, 2]]
    assert len(monomial_exponents(4, 3)) == 34  # C(7,3) - 1
    with pytest.raises(UserError, match="lacks 'coef'"):
        predict_spmm_ms({"kind": "learned", "exponents": [], "mean": [], "scale": [], "intercept": 0}, 1, 1, 1, 1)
    with pytest.raises(UserError, match="unknown SpMM model kind"):
        predict_spmm_ms({"kind": "magic"}, 1, 1, 1, 1)


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
