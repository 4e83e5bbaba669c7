"""Local sizes of the 3D-parallel GCN layer: the one definition the cost model, the
memory model, the microbenchmarks and the trainer share (docs/model.md, "Local shapes").

A dimension of length n split over g ranks is cut into g blocks of ceil(n / g) entries;
block c holds entries [c ceil(n/g), (c + 1) ceil(n/g)) clipped to n, and every rank
allocates the full ceil(n / g) (zero padding past n). Each axis pads on its own: there
is no global padded N. For layer i with roles (outer o, inner n, depth d) from
:func:`plexus_tune.model.grid.layer_roles` and axis sizes g_o, g_n, g_d::

    r_d = ceil(N / g_d)            rows of the A shard, of H = A F_i and of Q = H W_i
    r_o = ceil(N / g_o)            columns of the A shard, rows of F_i
    c_i = ceil(D_i / g_n)          columns of F_i and H, rows of the W_i block
    c_o = ceil(D_{i+1} / g_o)      columns of the W_i block, of the bias and of Q
    w   = ceil(c_i / g_d)          rows of W_i a rank keeps (the block split over depth)
    f   = ceil(r_o / g_d)          rows of the input features a rank keeps (layer 0)
    z   = ceil(NNZ / (g_d g_o))    nonzeros of the A shard (an estimate: the mean
                                   over the g_d g_o distinct shards, rounded up)

The all-gathers over depth of W_i and of the layer-0 features return g_d w and
g_d f rows, of which the first c_i and r_o are used (the rest is padding; the
gradient is padded back before its reduce-scatter). Blocked aggregation with at most
``block_rows`` rows per block cuts the r_d rows into b = ceil(r_d / block_rows) blocks
of s = ceil(r_d / b) rows (the last one shorter, never empty).

Layer i's output rows (split over its depth axis) are layer i + 1's input rows (split
over its outer axis, the same axis) and its output columns (split over its outer
axis) are layer i + 1's input columns (inner axis, the same axis), so per-axis
padding chains from layer to layer.

``padded=False`` (profiles with ``"padded_sizes": false``, the paper's model) divides
exactly instead: r_d = N / g_d, ..., w = c_i / g_d, f = r_o / g_d, z = NNZ / (g_d g_o),
all float.

Sparse indices: the trainer stores CSR with int32 indices (4 bytes,
:data:`INDEX_BYTES`) unless the nonzeros or a dimension reach 2^31 - 1, then int64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.model.grid import layer_roles

#: Bytes of one CSR index (row pointer or column index) as the trainer stores them: int32.
INDEX_BYTES = 4
#: Largest nonzero count and dimension that int32 CSR indices hold (exclusive).
INT32_INDEX_LIMIT = 2**31 - 1


def ceil_div(a, b):
    """ceil(a / b) of non-negative integers; Python ints for scalars, int64 arrays otherwise."""
    if np.ndim(a) == 0 and np.ndim(b) == 0:
        return -(-int(a) // int(b))
    return -(-np.asarray(a, dtype=np.int64) // np.asarray(b, dtype=np.int64))


def padded_length(n, g):
    """n rounded up to a multiple of g: the g blocks of ceil(n / g) entries, g ceil(n / g)."""
    return ceil_div(n, g) * g


def csr_index_dtype(nnz: int, rows: int, cols: int):
    """The trainer's CSR index type: int32 while nnz and both dimensions stay below 2^31 - 1."""
    if int(nnz) < INT32_INDEX_LIMIT and max(int(rows), int(cols)) < INT32_INDEX_LIMIT:
        return np.int32
    return np.int64


def csr_index_bytes(nnz, rows, cols):
    """Bytes per index of :func:`csr_index_dtype`, vectorized: 4, or 8 past the int32 range."""
    fits = (np.asarray(nnz) < INT32_INDEX_LIMIT) & (np.maximum(rows, cols) < INT32_INDEX_LIMIT)
    out = np.where(fits, INDEX_BYTES, 8)
    return int(out) if out.ndim == 0 else out


def csr_bytes(nnz, rows, value_bytes, index_bytes, matrices=1):
    """Bytes of CSR storage: nnz (value + index) + (rows + matrices) index.

    ``matrices`` > 1 counts a matrix stored as that many row blocks of ``rows`` rows in
    all (one extra row pointer each).
    """
    return nnz * (value_bytes + index_bytes) + (rows + matrices) * index_bytes


def block_count(rows, block_rows):
    """Row blocks of blocked aggregation: ceil(rows / block_rows) (1 without blocking)."""
    if block_rows is None:
        return np.ones(np.shape(rows), dtype=np.int64) if np.ndim(rows) else 1
    if np.issubdtype(np.asarray(rows).dtype, np.integer):
        return ceil_div(rows, block_rows)
    return np.ceil(np.asarray(rows, dtype=np.float64) / block_rows).astype(np.int64)


def row_blocks(rows: int, block_rows: int | None) -> list[tuple[int, int]]:
    """The trainer's row blocks [start, stop): b = ceil(rows / block_rows) blocks of
    ceil(rows / b) rows, the last one shorter (never empty: (b - 1) ceil(rows / b) < rows)."""
    rows = int(rows)
    blocks = block_count(rows, block_rows)
    step = ceil_div(rows, blocks)
    return [(k * step, min((k + 1) * step, rows)) for k in range(blocks)]


@dataclass(frozen=True)
class LayerShapes:
    """Local sizes of one layer on every grid (arrays of shape (K,)) or on one grid (scalars).

    Axis indices ``outer``, ``inner``, ``depth`` and sizes ``g_o``, ``g_n``, ``g_d``;
    sizes as in the module docstring (``w_rows`` = w, ``feature_rows`` = f).
    ``w_gathered_rows`` = g_d w and ``features_gathered_rows`` = g_d f are the rows the
    all-gathers over depth return (exact division: c_i and r_o). ``z`` is 0 when the
    nonzero count was not given.
    """

    layer: int
    outer: int
    inner: int
    depth: int
    g_o: object
    g_n: object
    g_d: object
    r_d: object
    r_o: object
    c_i: object
    c_o: object
    w_rows: object
    feature_rows: object
    w_gathered_rows: object
    features_gathered_rows: object
    z: object
    blocks: object
    block_rows: object

    @property
    def a_shape(self):
        """(rows, columns) of the A shard; A^T is the transpose."""
        return (self.r_d, self.r_o)

    @property
    def f_shape(self):
        """The layer input F_i (layer 0: after the all-gather over depth, trimmed)."""
        return (self.r_o, self.c_i)

    @property
    def h_shape(self):
        return (self.r_d, self.c_i)

    @property
    def w_block_shape(self):
        """The W_i block the GEMM uses (after the all-gather over depth, trimmed)."""
        return (self.c_i, self.c_o)

    @property
    def w_shape(self):
        """The piece of W_i a rank keeps: its depth share of the block's rows."""
        return (self.w_rows, self.c_o)

    @property
    def q_shape(self):
        return (self.r_d, self.c_o)

    @property
    def features_shape(self):
        """The layer-0 input features a rank keeps: its depth share of F_0's rows."""
        return (self.feature_rows, self.c_i)



def _grid_array(grids):
    arr = np.asarray(grids, dtype=np.int64)
    scalar = arr.ndim == 1
    arr = arr.reshape(-1, 3) if arr.size else arr.reshape(0, 3)
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise UserError(f"grids must be a (K, 3) array of axis sizes, got shape {np.shape(grids)}")
    if arr.size and arr.min() < 1:
        raise UserError("grid axis sizes must be at least 1")
    if scalar and arr.shape[0] != 1:
        raise UserError(f"a grid is three axis sizes, got {np.shape(grids)}")
    return arr, scalar


def layer_shapes(nodes, widths, grids, *, nnz=None, padded: bool = True, block_rows=None) -> tuple[LayerShapes, ...]:
    """Local sizes of every layer: one :class:`LayerShapes` per layer of ``widths`` = (D_0, ..., D_L).

    ``grids``: a (K, 3) array (fields are (K,) arrays) or one (gx, gy, gz) (fields are
    Python numbers). ``padded=False`` divides exactly (floats). ``nnz``: nonzeros of the
    normalized adjacency, for ``z``. ``block_rows``: blocked aggregation (``blocks`` and
    ``block_rows`` are 1 and r_d without it).
    """
    arr, scalar = _grid_array(grids)
    widths = [int(w) for w in widths]
    if len(widths) < 2:
        raise UserError("a model needs at least one layer: give at least two widths")
    n = int(nodes)
    total_nnz = 0 if nnz is None else int(nnz)
    div = ceil_div if padded else (lambda a, b: np.asarray(a, dtype=np.float64) / np.asarray(b, dtype=np.float64))
    out = []
    for i in range(len(widths) - 1):
        o, inner, d = layer_roles(i)
        g_o, g_n, g_d = arr[:, o], arr[:, inner], arr[:, d]
        r_d, r_o = div(n, g_d), div(n, g_o)
        c_i, c_o = div(widths[i], g_n), div(widths[i + 1], g_o)
        w_rows, feature_rows = div(c_i, g_d), div(r_o, g_d)
        w_gathered = g_d * w_rows if padded else c_i
        features_gathered = g_d * feature_rows if padded else r_o
        z = div(total_nnz, g_d * g_o)
        blocks = block_count(r_d, block_rows)
        rows_per_block = div(r_d, blocks) if block_rows else r_d
        values = {"g_o": g_o, "g_n": g_n, "g_d": g_d, "r_d": r_d, "r_o": r_o, "c_i": c_i, "c_o": c_o,
                  "w_rows": w_rows, "feature_rows": feature_rows, "w_gathered_rows": w_gathered,
                  "features_gathered_rows": features_gathered, "z": z, "blocks": blocks,
                  "block_rows": rows_per_block}
        if scalar:
            values = {k: _item(v) for k, v in values.items()}
        else:
            values = {k: np.broadcast_to(np.asarray(v), (arr.shape[0],)) for k, v in values.items()}
        out.append(LayerShapes(layer=i, outer=o, inner=inner, depth=d, **values))
    return tuple(out)


def _item(value):
    value = np.asarray(value).reshape(-1)[0]
    return int(value) if np.issubdtype(value.dtype, np.integer) else float(value)
