"""Uniform vertex sampling (graph/sampling): the same sample on every rank of a group, shards
that assemble to the serial subgraph, unbiased rescaled aggregation, expected nonzeros."""

import itertools

import numpy as np
import pytest
import scipy.sparse as sp

from plexus_tune.errors import UserError
from plexus_tune.graph import gcn_normalize
from plexus_tune.graph.generators import rmat_adjacency
from plexus_tune.graph.sampling import (
    expected_sampled_nnz,
    rescale_factor,
    sample_range,
    sample_vertices,
    sampled_block,
    sampled_shard_nnz,
    sampled_subgraph,
)


def _graph(n=60, edges=400, seed=1):
    rng = np.random.default_rng(seed)
    rows, cols = rng.integers(0, n, edges), rng.integers(0, n, edges)
    adj = sp.csr_matrix((np.ones(edges), (rows, cols)), shape=(n, n))
    adj = ((adj + adj.T) > 0).astype(np.float64)
    adj.setdiag(0)
    adj.eliminate_zeros()
    return gcn_normalize(adj, dtype=np.float64)


def test_sample_is_shared_by_a_group_and_differs_between_groups_and_steps():
    a = sample_vertices(1000, 50, seed=7, step=3, group=1)
    assert np.array_equal(a, sample_vertices(1000, 50, seed=7, step=3, group=1))
    assert len(np.unique(a)) == 50 and np.all(np.diff(a) > 0) and a.min() >= 0 and a.max() < 1000
    assert not np.array_equal(a, sample_vertices(1000, 50, seed=7, step=3, group=0))
    assert not np.array_equal(a, sample_vertices(1000, 50, seed=7, step=4, group=1))
    assert np.array_equal(sample_vertices(10, 10, 0, 0), np.arange(10))


def test_bad_batch_sizes_are_refused():
    for bad in (1, 0, 11, 2.5):
        with pytest.raises(UserError):
            sample_vertices(10, bad, 0, 0)


def test_sample_range_is_a_binary_search():
    sample = np.array([1, 4, 5, 9, 12])
    assert sample_range(sample, 0, 5) == (0, 2)
    assert sample_range(sample, 5, 10) == (2, 4)
    assert sample_range(sample, 13, 20) == (5, 5)


def test_rescaled_subgraph_equals_brute_force():
    a = _graph()
    sample = sample_vertices(a.shape[0], 12, seed=0, step=0)
    p = rescale_factor(a.shape[0], 12)
    dense = a.toarray()[np.ix_(sample, sample)]
    want = np.where(np.eye(12, dtype=bool), dense, dense / p)
    assert np.allclose(sampled_subgraph(a, sample).toarray(), want)
    assert np.allclose(sampled_subgraph(a, sample, rescale=False).toarray(), dense)


@pytest.mark.parametrize("row_parts,col_parts", [(1, 1), (2, 3), (4, 2), (7, 5)])
def test_shards_sampled_alone_assemble_to_the_serial_subgraph(row_parts, col_parts):
    a = _graph()
    n = a.shape[0]
    sample = sample_vertices(n, 17, seed=3, step=2)
    p = rescale_factor(n, 17)
    rs, cs = -(-n // row_parts), -(-n // col_parts)
    rebuilt = np.zeros((17, 17))
    for i, j in itertools.product(range(row_parts), range(col_parts)):
        r0, r1, c0, c1 = i * rs, min((i + 1) * rs, n), j * cs, min((j + 1) * cs, n)
        lo_r, hi_r = sample_range(sample, r0, r1)
        lo_c, hi_c = sample_range(sample, c0, c1)
        block = sampled_block(a[r0:r1, c0:c1], r0, c0, sample[lo_r:hi_r], sample[lo_c:hi_c], p)
        rebuilt[lo_r:hi_r, lo_c:hi_c] = block.toarray()
    assert np.allclose(rebuilt, sampled_subgraph(a, sample).toarray())


def test_expected_nnz_matches_the_exhaustive_average_over_all_samples():
    a = _graph(n=9, edges=20, seed=4)
    n, b = 9, 4
    counts = [sampled_subgraph(a, np.array(s)).nnz for s in itertools.combinations(range(n), b)]
    assert np.mean(counts) == pytest.approx(float(expected_sampled_nnz(n, a.nnz, b)), rel=1e-12)


def test_expected_nnz_matches_monte_carlo_on_an_rmat_graph():
    a = gcn_normalize(rmat_adjacency(2048, 16384, seed=0))
    n, b = a.shape[0], 256
    counts = np.array([sampled_subgraph(a, sample_vertices(n, b, 0, t)).nnz for t in range(200)])
    want = float(expected_sampled_nnz(n, a.nnz, b))
    assert abs(counts.mean() - want) < 4 * counts.std(ddof=1) / np.sqrt(len(counts))
    # the largest shard of a 2 x 2 cut: near the largest of the shards' own expectations
    half = -(-n // 2)
    coo = a.tocoo()
    shard = (coo.row // half) * 2 + coo.col // half
    diag = coo.row == coo.col
    expect = (np.bincount(shard[~diag], minlength=4) * b * (b - 1) / (n * (n - 1))
              + np.bincount(shard[diag], minlength=4) * b / n)
    assert sampled_shard_nnz(a, 2, 2, b, samples=40) == pytest.approx(expect.max(), rel=0.1)


def _aggregation_z_scores(a, x, b, samples, rescale=True):
    """Per-vertex z-scores of the mean sampled aggregation against the full graph's."""
    n = a.shape[0]
    full = a @ x
    total, squares, hits = np.zeros(n), np.zeros(n), np.zeros(n)
    for t in range(samples):
        s = sample_vertices(n, b, seed=11, step=t)
        est = sampled_subgraph(a, s, rescale=rescale) @ x[s]
        total[s] += est
        squares[s] += est * est
        hits[s] += 1
    mean = total / hits
    se = np.sqrt((squares / hits - mean**2) / (hits - 1))
    return (mean - full) / np.maximum(se, 1e-12)


def test_rescaled_aggregation_is_unbiased_within_its_standard_error():
    a = _graph(n=40, edges=200, seed=5)
    x = np.random.default_rng(0).normal(size=40) + 1.0
    z = _aggregation_z_scores(a, x, b=10, samples=3000)
    assert np.abs(z).max() < 4.5  # 40 vertices: P(any |z| > 4.5) ~ 3e-4 for an unbiased estimator
    # without the rescaling the same test fails: the estimate is biased low by the factor p
    assert np.abs(_aggregation_z_scores(a, x, b=10, samples=3000, rescale=False)).max() > 10
