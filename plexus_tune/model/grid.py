"""Process grids Gx x Gy x Gz: enumeration, parsing, layer roles and rank placement.

Axes are numbered X=0, Y=1, Z=2. Ranks are placed with Y varying fastest, then X,
then Z::

    rank = z * Gx * Gy + x * Gy + y

so the stride of an axis (the product of the sizes of the faster axes) is 1 for Y,
Gy for X and Gx * Gy for Z.
"""

from __future__ import annotations

import math
import re

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.numbers import parse_count

AXIS_NAMES = ("x", "y", "z")

#: layer index mod 3 -> (outer, inner, depth) axis indices (docs/model.md, The 3D layer and its roles).
_ROLES = ((0, 1, 2), (2, 0, 1), (1, 2, 0))


def check_gpus(gpus) -> int:
    """Return ``gpus`` as a positive int, or raise UserError."""
    if isinstance(gpus, bool):
        raise UserError(f"the number of GPUs must be a positive integer, got {gpus!r}")
    if isinstance(gpus, (int, np.integer)):
        value = int(gpus)
    elif isinstance(gpus, float) and gpus.is_integer():
        value = int(gpus)
    elif isinstance(gpus, str):
        try:
            value = parse_count(gpus, "the number of GPUs")  # 1e3 and 16k as in every command
        except UserError:
            raise UserError(f"the number of GPUs must be a positive integer, got {gpus!r}") from None
    else:
        raise UserError(f"the number of GPUs must be a positive integer, got {gpus!r}")
    if value < 1:
        raise UserError(f"the number of GPUs must be at least 1, got {value}")
    return value


def divisors(n: int) -> np.ndarray:
    """All positive divisors of ``n`` in increasing order (int64)."""
    n = int(n)
    if n < 1:
        raise UserError(f"divisors need a positive integer, got {n}")
    root = math.isqrt(n)
    small = np.arange(1, root + 1, dtype=np.int64)
    small = small[n % small == 0]
    large = n // small[::-1]
    out = np.concatenate([small, large])
    return np.unique(out)


def enumerate_grids(gpus, *, powers_of_two: bool = False, max_x=None, max_y=None, max_z=None) -> np.ndarray:
    """Every ordered (gx, gy, gz) with gx * gy * gz == gpus, in lexicographic order.

    ``powers_of_two`` keeps grids whose three sizes are all powers of two;
    ``max_x``/``max_y``/``max_z`` bound the size of one axis. Returns a (K, 3)
    int64 array (K may be 0 when the filters exclude everything).
    """
    g = check_gpus(gpus)
    d = divisors(g)
    gx = np.repeat(d, d.size)
    gy = np.tile(d, d.size)
    keep = (g % (gx * gy)) == 0
    gx, gy = gx[keep], gy[keep]
    gz = g // (gx * gy)
    grids = np.stack([gx, gy, gz], axis=1).astype(np.int64)
    mask = np.ones(len(grids), dtype=bool)
    if powers_of_two:
        mask &= np.all((grids & (grids - 1)) == 0, axis=1)
    for axis, bound in enumerate((max_x, max_y, max_z)):
        if bound is not None:
            if int(bound) < 1:
                raise UserError(f"the bound on axis {AXIS_NAMES[axis].upper()} must be at least 1, got {bound}")
            mask &= grids[:, axis] <= int(bound)
    return grids[mask]


def parse_grid(text: str) -> tuple[int, int, int]:
    """Parse ``"GxxGyxGz"`` (e.g. ``"2x2x2"``, also ``"2,2,2"``) into a tuple of ints."""
    parts = re.split(r"\s*[x,*]\s*", str(text).strip().lower())
    if len(parts) != 3 or not all(re.fullmatch(r"\d+", p) for p in parts):
        raise UserError(f"a grid is written GXxGYxGZ with three positive integers (e.g. 4x4x4), got {text!r}")
    values = tuple(int(p) for p in parts)
    if min(values) < 1:
        raise UserError(f"grid sizes must be at least 1, got {text!r}")
    return values  # type: ignore[return-value]


def format_grid(grid) -> str:
    """``(2, 4, 8) -> "2x4x8"``."""
    return "x".join(str(int(v)) for v in grid)


def layer_roles(i: int) -> tuple[int, int, int]:
    """Axis indices (outer, inner, depth) of layer ``i``.

    i % 3 == 0 -> (X, Y, Z); 1 -> (Z, X, Y); 2 -> (Y, Z, X). The outer axis carries
    the aggregation all-reduce, the inner axis the combination all-reduce and the
    depth axis the all-gathers.
    """
    return _ROLES[int(i) % 3]


def rank_of(x, y, z, grid):
    """Global rank of grid coordinates: ``z * Gx * Gy + x * Gy + y`` (works on arrays)."""
    gx, gy, _ = grid
    return z * gx * gy + x * gy + y


def coords_of(rank, grid):
    """Inverse of :func:`rank_of`: ``(x, y, z)`` of a rank (works on arrays)."""
    gx, gy, _ = grid
    z, rest = divmod(rank, gx * gy)
    x, y = divmod(rest, gy)
    return x, y, z


def axis_stride(axis: int, grid):
    """Rank distance between neighbours along ``axis``: Y -> 1, X -> Gy, Z -> Gx * Gy.

    ``grid`` may be a triple or a (K, 3) array (then the result is a (K,) array).
    """
    arr = np.asarray(grid)
    if arr.ndim == 1:
        gx, gy = int(arr[0]), int(arr[1])
        return {1: 1, 0: gy, 2: gx * gy}[int(axis)]
    one = np.ones(arr.shape[0], dtype=np.int64)
    return {1: one, 0: arr[:, 1].astype(np.int64), 2: (arr[:, 0] * arr[:, 1]).astype(np.int64)}[int(axis)]
