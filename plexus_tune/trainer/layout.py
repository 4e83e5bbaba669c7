"""Where every block of every matrix lives on a Gx x Gy x Gz grid (pure arithmetic).

Sizes come from :func:`plexus_tune.model.shapes.layer_shapes` (the cost and memory
models use the same): a dimension of length n split over g ranks is cut into blocks of
ceil(n / g) entries, block c covering [c ceil(n/g), (c + 1) ceil(n/g)) clipped to n;
every rank allocates the full block (zero padding past the real entries). Each axis
pads on its own.

Layer i gives the axes the roles (outer, inner, depth) = ``layer_roles(i)``; with
g_o, g_n, g_d their sizes and c_o, c_n, c_d this rank's coordinates on them, and
r_d, r_o, c_i, c_o, w, f the sizes of :mod:`plexus_tune.model.shapes`:

- A shard: rows block c_d of r_d (N over depth), columns block c_o of r_o (N over outer);
- input F_i: rows block c_o of r_o, columns block c_n of c_i (D_i over inner);
  layer 0 keeps sub-block c_d of f rows of its row block (the features split over
  depth);
- W_i: rows block c_n of c_i, columns block c_o of c_o (D_{i+1} over outer); a rank
  keeps sub-block c_d of w rows of its row block (split over depth);
- bias b_i: columns block c_o of c_o;
- output Q_i: rows block c_d of r_d, columns block c_o of c_o.

Layer i's output rows and columns are split over its depth and outer axes, which are
layer i + 1's outer and inner axes, so the blocks chain between layers.

Row order with permutations (``perm_r``, ``perm_c``): layer i reads its input rows in
order ``in_perm(i)`` = perm_c for even i, perm_r for odd i, and writes its output in
order ``out_perm(i)`` = the other one; its adjacency is A[out_perm][:, in_perm].
"""

from __future__ import annotations

from dataclasses import dataclass

from plexus_tune.model.grid import coords_of, layer_roles
from plexus_tune.model.shapes import LayerShapes, layer_shapes, padded_length


@dataclass(frozen=True)
class Block:
    """A local buffer of ``size`` entries holding indices [start, stop) of a dimension.

    ``stop - start <= size``; the buffer's entries past ``stop - start`` are zero
    padding. ``start`` and ``stop`` are clipped to the real length (a block wholly past
    it is empty).
    """

    start: int
    stop: int
    size: int

    @property
    def real(self) -> int:
        """Entries that hold real indices (the rest of the buffer is padding)."""
        return self.stop - self.start


def block(index: int, size: int, limit: int, offset: int = 0) -> Block:
    """Block ``index`` of ``size`` entries starting at ``offset``, real up to ``limit``."""
    start = min(offset + index * size, limit)
    return Block(start, min(offset + (index + 1) * size, limit), size)


def sub_block(parent: Block, index: int, size: int) -> Block:
    """Block ``index`` of ``size`` entries of a parent block's buffer (real up to the parent's)."""
    return block(index, size, parent.stop, parent.start)


@dataclass(frozen=True)
class LayerLayout:
    index: int
    outer: int
    inner: int
    depth: int
    sizes: tuple[int, int, int]  # (g_o, g_n, g_d)
    coords: tuple[int, int, int]  # (c_o, c_n, c_d)
    shapes: LayerShapes  # the local sizes (model.shapes) of this layer on this grid
    a_rows: Block
    a_cols: Block
    in_cols: Block  # columns of F_i (and rows of the W_i block)
    out_cols: Block  # columns of W_i, b_i and Q_i
    w_split: bool  # W_i split over depth (g_d > 1)
    w_rows: Block  # rows of W_i stored on this rank: its depth share of in_cols
    f_rows: Block  # rows of F_i stored on this rank (layer 0: its depth share)
    parity: int  # 0: A[perm_r][:, perm_c], 1: A[perm_c][:, perm_r]


@dataclass(frozen=True)
class GridLayout:
    grid: tuple[int, int, int]
    rank: int
    nodes: int
    widths: tuple[int, ...]
    padded_widths: tuple[int, ...]
    layers: tuple[LayerLayout, ...]

    @property
    def coords(self) -> tuple[int, int, int]:
        return tuple(int(c) for c in coords_of(self.rank, self.grid))

    @property
    def padded_nodes(self) -> int:
        """The largest padded row count of any axis, max over axes of g ceil(N / g)."""
        return max(padded_length(self.nodes, g) for g in self.grid)


def splitting_axis(i: int, num_layers: int) -> int:
    """The axis that splits the columns of F_i (D_i): inner of layer i, or outer of the last layer."""
    if i < num_layers:
        return layer_roles(i)[1]
    return layer_roles(num_layers - 1)[0]


def make_layout(grid, rank: int, nodes: int, widths, *, block_rows=None) -> GridLayout:
    grid = tuple(int(g) for g in grid)
    widths = tuple(int(w) for w in widths)
    num_layers = len(widths) - 1
    if num_layers < 1:
        raise ValueError("a model needs at least one layer")
    nodes = int(nodes)
    shapes = layer_shapes(nodes, widths, grid, block_rows=block_rows)
    padded = tuple(padded_length(w, grid[splitting_axis(i, num_layers)]) for i, w in enumerate(widths))
    coords = tuple(int(c) for c in coords_of(rank, grid))
    layers = []
    for i, s in enumerate(shapes):
        outer, inner, depth = layer_roles(i)
        co, cn, cd = coords[outer], coords[inner], coords[depth]
        in_cols = block(cn, s.c_i, widths[i])
        out_cols = block(co, s.c_o, widths[i + 1])
        a_cols = block(co, s.r_o, nodes)
        f_rows = sub_block(a_cols, cd, s.feature_rows) if i == 0 else a_cols
        layers.append(LayerLayout(
            index=i, outer=outer, inner=inner, depth=depth,
            sizes=(s.g_o, s.g_n, s.g_d), coords=(co, cn, cd), shapes=s,
            a_rows=block(cd, s.r_d, nodes), a_cols=a_cols,
            in_cols=in_cols, out_cols=out_cols, w_split=s.g_d > 1, w_rows=sub_block(in_cols, cd, s.w_rows),
            f_rows=f_rows, parity=i % 2,
        ))
    return GridLayout(grid=grid, rank=rank, nodes=nodes, widths=widths, padded_widths=padded,
                      layers=tuple(layers))
