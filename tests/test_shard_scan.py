"""The one-scan shard statistics and the vectorized uniform structure against brute force.

References: :func:`plexus_tune.graph.structure.split_structure` on the explicitly permuted
pattern (every block counted apart), Poisson tail sums written out with scipy.stats, the
normal limit from statistics.NormalDist.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.stats import poisson

from plexus_tune.graph import generate, permutations_for
from plexus_tune.graph.structure import (
    PermutedPattern,
    diagonal_rows,
    normalized_nnz,
    split_statistics,
    split_structure,
)
from plexus_tune.model.sparsity import SHARE_POINTS, uniform_structure

SPLITS = [(r, c) for r in (1, 2, 3, 4, 7) for c in (1, 2, 3, 5, 8)]


@pytest.fixture(params=["compiled", "numpy"], autouse=True)
def loops(request, monkeypatch):
    """Every test runs the compiled loops (graph/kernels) and the vectorized numpy forms."""
    import plexus_tune.graph.structure as structure
    from plexus_tune.graph.kernels import compiled

    if request.param == "compiled":
        if compiled() is None:
            pytest.fail("numba is a dependency: install the project (pip install -e .)")
    else:
        monkeypatch.setattr(structure, "compiled", lambda: None)
    return request.param


def _directed(n: int, edges: int, seed: int) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    src = (rng.pareto(1.2, edges) * 7).astype(np.int64) % n  # a few popular targets
    dst = rng.integers(0, n, edges)
    a = sp.csr_matrix((np.ones(edges, dtype=np.float32), (src, dst)), shape=(n, n))
    a.sum_duplicates()
    return a


@pytest.mark.parametrize("graph", ["rmat", "grid2d", "directed"])
@pytest.mark.parametrize("mode", ["none", "single", "double", "local"])
def test_one_scan_equals_every_block_counted(graph, mode, monkeypatch):
    import plexus_tune.graph.structure as structure

    if graph == "directed":
        adjacency = _directed(1200, 9000, seed=1)
    else:
        adjacency = generate(graph, nodes=1600, seed=4, **({"edges": 8000} if graph == "rmat" else {})).adjacency
    n = adjacency.shape[0]
    row_perm, col_perm = permutations_for(mode, n, 5, parts=(2, 3, 8) if mode == "local" else None)
    pattern = PermutedPattern(adjacency, row_perm, col_perm)
    # chunks far smaller than the graph: every chunk boundary path is taken
    got = split_statistics(adjacency, SPLITS, row_perm, col_perm, chunk_entries=613)
    for split in SPLITS:
        assert got[split] == split_structure(pattern, *split), split
    assert got[(1, 1)]["nnz_max"] == pattern.nnz == normalized_nnz(adjacency)
    if graph != "directed":  # a symmetric pattern: the second scan in the stored row order, rows bounded too
        assert (adjacency != adjacency.T).nnz == 0
        monkeypatch.setattr(structure, "SCAN_MAX_ROW_CELLS", 97)
        fast = split_statistics(adjacency, SPLITS, row_perm, col_perm, chunk_entries=613, symmetric_pattern=True)
        for split in SPLITS:
            _assert_same_statistics(fast[split], got[split])
        few = [(1, 1), (2, 3), (7, 5), (4, 8)]  # few splits: one scan keeping every block
        one = split_statistics(adjacency, few, row_perm, col_perm, symmetric_pattern=True)
        for split in few:
            _assert_same_statistics(one[split], got[split])


def _assert_same_statistics(got: dict, want: dict) -> None:
    """Equal shard statistics; the row-length CV to rounding (its vector is summed in another order)."""
    assert {k: got[k] for k in ("nnz_max", "nnz_mean", "block")} == {k: want[k] for k in ("nnz_max", "nnz_mean", "block")}
    for side in ("forward", "transpose"):
        assert got[side]["row_length_cv"] == pytest.approx(want[side]["row_length_cv"], rel=1e-12, abs=1e-15)
        assert {k: v for k, v in got[side].items() if k != "row_length_cv"} == \
            {k: v for k, v in want[side].items() if k != "row_length_cv"}


def test_one_scan_of_a_stored_matrix_adds_no_self_loops():
    adjacency = generate("rmat", nodes=900, edges=5000, seed=2).adjacency
    pattern = PermutedPattern(adjacency, self_loops=False)
    got = split_statistics(adjacency, SPLITS, self_loops=False, chunk_entries=1000)
    assert all(got[s] == split_structure(pattern, *s) for s in SPLITS)
    assert got[(1, 1)]["nnz_max"] == adjacency.nnz


def test_one_scan_in_column_groups_equals_one_histogram(monkeypatch):
    import plexus_tune.graph.structure as structure

    adjacency = generate("rmat", nodes=700, edges=4000, seed=6).adjacency
    row_perm, col_perm = permutations_for("double", 700, 1)
    whole = split_statistics(adjacency, SPLITS, row_perm, col_perm)
    monkeypatch.setattr(structure, "SCAN_MAX_CELLS", 40)  # forces the column counts into groups
    assert structure.split_statistics(adjacency, SPLITS, row_perm, col_perm, chunk_entries=500) == whole


def test_diagonal_rows_by_hand():
    adj = sp.csr_matrix(np.array([[0, 1, 0], [1, 1, 0], [0, 0, 1]], dtype=np.float32))
    assert diagonal_rows(adj, chunk_entries=1).tolist() == [False, True, True]


def _top_share_brute_force(lam: float, common: float, m: float, nnz: float) -> float:
    """Columns taken from the most popular count down: common p(x) columns hold x nonzeros each."""
    if m >= common:
        return 1.0
    if lam > 200:
        q = m / common
        z = NormalDist().inv_cdf(1.0 - q)
        return min(1.0, m * (lam + math.exp(-z * z / 2) / math.sqrt(2 * math.pi) / q * math.sqrt(lam)) / nnz)
    top = int(lam + 12 * math.sqrt(lam) + 30) - 1
    left, held = m, 0.0
    for x in range(top, -1, -1):
        columns = common * float(poisson.pmf(x, lam))
        take = min(columns, left)
        held += take * x
        left -= take
        if left <= 0:
            break
    return min(1.0, held / nnz)


@pytest.mark.parametrize("nnz,rows,common", [(1, 1, 1), (5, 3, 100), (1000, 100, 100), (2e6, 1e3, 1e4),
                                             (123, 45, 6789), (3e5, 2e5, 2e5), (1e7, 3e4, 4e4), (5e4, 1, 1),
                                             (4e6, 1e5, 1e4), (64, 64, 64)])
def test_uniform_structure_equals_poisson_sums(nnz, rows, common):
    s = uniform_structure(nnz, rows, common)
    lam = nnz / common
    assert s["row_length_cv"] == pytest.approx(math.sqrt(max(1 - 1 / rows, 0) * rows / nnz), rel=1e-12)
    assert s["touched_column_fraction"] == pytest.approx(1 - (1 - 1 / common) ** nnz if common > 1 else 1.0, rel=1e-9)
    assert s["top1pct_column_share"] == pytest.approx(
        _top_share_brute_force(lam, common, max(1.0, math.floor(common / 100)), nnz), rel=1e-9, abs=1e-12)
    expected = [round(_top_share_brute_force(lam, common, 2.0**j, nnz), 6) for j in range(SHARE_POINTS)]
    assert s["column_share"] == pytest.approx(expected, abs=1.01e-6)
