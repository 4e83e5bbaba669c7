"""The process groups of a grid's axes, as every rank creates them (trainer/comm.axis_groups)."""

from plexus_tune.model.grid import coords_of
from plexus_tune.trainer.comm import axis_groups


def test_axis_groups_of_a_2x1x2_grid_by_hand():
    """rank = z Gx Gy + x Gy + y (model/grid): on 2 x 1 x 2 the x groups are {0, 1} (z = 0) and
    {2, 3} (z = 1), the z groups {0, 2} (x = 0) and {1, 3}; y has one rank and no group; an offset
    shifts every rank."""
    assert axis_groups((2, 1, 2)) == [(0, [0, 1]), (0, [2, 3]), (2, [0, 2]), (2, [1, 3])]
    assert axis_groups((2, 1, 2), offset=4) == [(0, [4, 5]), (0, [6, 7]), (2, [4, 6]), (2, [5, 7])]
    assert axis_groups((1, 1, 1)) == []


def test_axis_groups_partition_the_ranks_along_each_axis():
    grid = (2, 3, 4)
    groups = axis_groups(grid)
    for axis in range(3):
        members = [m for a, m in groups if a == axis]
        assert sorted(r for m in members for r in m) == list(range(24))  # each rank in one group per axis
        for m in members:  # the members differ only in their coordinate along the axis
            coords = [tuple(int(c) for c in coords_of(r, grid)) for r in m]
            assert [c[axis] for c in coords] == list(range(grid[axis]))
            assert len({c[:axis] + c[axis + 1:] for c in coords}) == 1
