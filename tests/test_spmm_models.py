import numpy as np
import pytest

from plexus_tune.errors import UserError
from plexus_tune.spmm_models import monomial_exponents, predict_spmm_ms


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
