"""Where every block of every matrix lives on a Gx x Gy x Gz grid (pure arithmetic).

Layer i gives the axes the roles (outer, inner, depth) = ``layer_roles(i)``; with
g_o, g_n, g_d their sizes and c_o, c_n, c_d this rank's coordinates on them:

- A shard: rows block c_d of N_pad / g_d, columns block c_o of N_pad / g_o;
- input F_i: rows block c_o of N_pad / g_o, columns block c_n of Dp_i / g_n
  (layer 0: the row block is further split over depth, sub-block c_d);
- W_i: rows block c_n of Dp_i / g_n, columns block c_o of Dp_{i+1} / g_o; split
  further over depth (row sub-block c_d) when g_d divides Dp_i / g_n;
- bias b_i: columns block c_o of Dp_{i+1} / g_o;
- output Q_i: rows block c_d, columns block c_o of Dp_{i+1} / g_o.

Padding: N_pad = ceil(N / G) * G (divisible by every axis and by g_o * g_d);
Dp_i = D_i rounded up to a multiple of the size of the axis that splits it (the inner
axis of layer i, which is the outer axis of layer i - 1).

Row order with permutations (``perm_r``, ``perm_c``): layer i reads its input rows in
order ``in_perm(i)`` = perm_c for even i, perm_r for odd i, and writes its output in
order ``out_perm(i)`` = the other one; its adjacency is A[out_perm][:, in_perm].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from plexus_tune.model.grid import coords_of, layer_roles


def ceil_to(value: int, multiple: int) -> int:
    return int(math.ceil(value / multiple) * multiple)


@dataclass(frozen=True)
class Block:
    """A half-open index range [start, stop) of a padded dimension."""

    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def block(index: int, parts: int, total: int) -> Block:
    size = total // parts
    return Block(index * size, (index + 1) * size)


@dataclass(frozen=True)
class LayerLayout:
    index: int
    outer: int
    inner: int
    depth: int
    sizes: tuple[int, int, int]  # (g_o, g_n, g_d)
    coords: tuple[int, int, int]  # (c_o, c_n, c_d)
    a_rows: Block
    a_cols: Block
    in_cols: Block  # columns of F_i (and rows of W_i)
    out_cols: Block  # columns of W_i, b_i and Q_i
    w_split: bool  # W_i split over depth too
    w_rows: Block  # rows of W_i stored on this rank (a sub-block of in_cols if w_split)
    f_rows: Block  # rows of F_i stored on this rank (layer 0: sub-block over depth)
    parity: int  # 0: A[perm_r][:, perm_c], 1: A[perm_c][:, perm_r]


@dataclass(frozen=True)
class GridLayout:
    grid: tuple[int, int, int]
    rank: int
    nodes: int
    widths: tuple[int, ...]
    n_pad: int
    padded_widths: tuple[int, ...]
    layers: tuple[LayerLayout, ...]

    @property
    def coords(self) -> tuple[int, int, int]:
        return tuple(int(c) for c in coords_of(self.rank, self.grid))


def splitting_axis(i: int, num_layers: int) -> int:
    """The axis that splits the columns of F_i (D_i): inner of layer i, or outer of the last layer."""
    if i < num_layers:
        return layer_roles(i)[1]
    return layer_roles(num_layers - 1)[0]


def make_layout(grid, rank: int, nodes: int, widths) -> GridLayout:
    grid = tuple(int(g) for g in grid)
    widths = tuple(int(w) for w in widths)
    num_layers = len(widths) - 1
    if num_layers < 1:
        raise ValueError("a model needs at least one layer")
    g_total = grid[0] * grid[1] * grid[2]
    n_pad = ceil_to(nodes, g_total)
    padded = tuple(ceil_to(w, grid[splitting_axis(i, num_layers)]) for i, w in enumerate(widths))
    coords = tuple(int(c) for c in coords_of(rank, grid))
    layers = []
    for i in range(num_layers):
        outer, inner, depth = layer_roles(i)
        go, gn, gd = grid[outer], grid[inner], grid[depth]
        co, cn, cd = coords[outer], coords[inner], coords[depth]
        in_cols = block(cn, gn, padded[i])
        out_cols = block(co, go, padded[i + 1])
        w_split = gd > 1 and in_cols.size % gd == 0
        if w_split:
            sub = block(cd, gd, in_cols.size)
            w_rows = Block(in_cols.start + sub.start, in_cols.start + sub.stop)
        else:
            w_rows = in_cols
        f_rows = block(co, go, n_pad)
        if i == 0:
            sub = block(cd, gd, f_rows.size)
            f_rows = Block(f_rows.start + sub.start, f_rows.start + sub.stop)
        layers.append(LayerLayout(
            index=i, outer=outer, inner=inner, depth=depth,
            sizes=(go, gn, gd), coords=(co, cn, cd),
            a_rows=block(cd, gd, n_pad), a_cols=block(co, go, n_pad),
            in_cols=in_cols, out_cols=out_cols, w_split=w_split, w_rows=w_rows,
            f_rows=f_rows, parity=i % 2,
        ))
    return GridLayout(grid=grid, rank=rank, nodes=int(nodes), widths=widths, n_pad=n_pad,
                      padded_widths=padded, layers=tuple(layers))
