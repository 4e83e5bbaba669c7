import itertools

import numpy as np
import pytest

from plexus_tune.errors import UserError
from plexus_tune.model.grid import (
    axis_stride, coords_of, divisors, enumerate_grids, layer_roles, parse_grid, rank_of,
)


def brute_force(g):
    return sorted(t for t in itertools.product(range(1, g + 1), repeat=3) if t[0] * t[1] * t[2] == g)


@pytest.mark.parametrize("g", [1, 2, 7, 12, 36, 60, 64])
def test_enumeration_matches_brute_force(g):
    grids = enumerate_grids(g)
    assert grids.dtype == np.int64 and grids.shape[1] == 3
    assert [tuple(map(int, row)) for row in grids] == brute_force(g)


def test_filters_match_brute_force():
    g = 48
    pow2 = [t for t in brute_force(g) if all(v & (v - 1) == 0 for v in t)]
    assert [tuple(map(int, r)) for r in enumerate_grids(g, powers_of_two=True)] == pow2
    bounded = [t for t in brute_force(g) if t[0] <= 4 and t[1] <= 6 and t[2] <= 12]
    assert [tuple(map(int, r)) for r in enumerate_grids(g, max_x=4, max_y=6, max_z=12)] == bounded
    assert enumerate_grids(7, powers_of_two=True).shape == (0, 3)


def test_large_g_count_and_divisors():
    # 720720 = 2^4 3^2 5 7 11 13: ordered triples = C(6,2) * C(4,2) * 3^4 = 15 * 6 * 81
    assert len(enumerate_grids(720720)) == 7290
    assert list(divisors(12)) == [1, 2, 3, 4, 6, 12]


@pytest.mark.parametrize("bad", [0, -4, "abc", "4.5", 2.5, True, None])
def test_bad_gpu_counts(bad):
    with pytest.raises(UserError):
        enumerate_grids(bad)


def test_parse_grid():
    assert parse_grid("2x3x4") == (2, 3, 4)
    assert parse_grid(" 8X1X1 ") == (8, 1, 1)
    for bad in ("2x2", "2x2x0", "axbxc", "2x2x2x2", ""):
        with pytest.raises(UserError):
            parse_grid(bad)


def test_layer_roles_rotate():
    assert layer_roles(0) == (0, 1, 2)
    assert layer_roles(1) == (2, 0, 1)
    assert layer_roles(2) == (1, 2, 0)
    assert layer_roles(3) == (0, 1, 2)
    for i in range(6):
        assert sorted(layer_roles(i)) == [0, 1, 2]


def test_rank_placement_y_fastest():
    grid = (3, 2, 4)
    # brute force: ranks are counted with y innermost, then x, then z
    expected = {}
    r = 0
    for z in range(4):
        for x in range(3):
            for y in range(2):
                expected[(x, y, z)] = r
                r += 1
    for (x, y, z), rank in expected.items():
        assert rank_of(x, y, z, grid) == rank
        assert coords_of(rank, grid) == (x, y, z)


def test_axis_stride_is_rank_distance():
    grid = (3, 2, 4)
    assert axis_stride(1, grid) == 1
    assert axis_stride(0, grid) == 2
    assert axis_stride(2, grid) == 6
    assert rank_of(1, 0, 0, grid) - rank_of(0, 0, 0, grid) == axis_stride(0, grid)
    assert rank_of(0, 0, 1, grid) - rank_of(0, 0, 0, grid) == axis_stride(2, grid)
    arr = np.array([[3, 2, 4], [1, 5, 2]])
    assert list(axis_stride(0, arr)) == [2, 5]
    assert list(axis_stride(2, arr)) == [6, 5]
    assert list(axis_stride(1, arr)) == [1, 1]
