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


#: the most grids :func:`enumerate_grids` lists (a G with more is refused with the count)
MAX_GRIDS = 1 << 17
#: Miller-Rabin bases that decide primality of every n < 3.3e24 (so every 64-bit count)
_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)


def _is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin for n < 3.3e24."""
    if n < 2:
        return False
    for p in _MR_BASES:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _a_factor(n: int) -> int:
    """A nontrivial factor of a composite odd ``n`` (Pollard's rho, Brent's cycle search)."""
    for c in range(1, n):
        x = y = 2
        d = 1
        while d == 1:
            x = (x * x + c) % n
            y = (y * y + c) % n
            y = (y * y + c) % n
            d = math.gcd(abs(x - y), n)
        if d != n:
            return d
    raise AssertionError(n)  # pragma: no cover - rho finds a factor of every composite


def prime_factors(n: int) -> dict[int, int]:
    """{prime: exponent} of ``n`` >= 1: trial division by small primes, then Miller-Rabin and
    Pollard's rho (milliseconds for any 64-bit count, a Mersenne prime or 1e18 included)."""
    out: dict[int, int] = {}
    for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37):
        while n % p == 0:
            out[p] = out.get(p, 0) + 1
            n //= p
    stack = [n] if n > 1 else []
    while stack:
        m = stack.pop()
        if _is_prime(m):
            out[m] = out.get(m, 0) + 1
        else:
            f = _a_factor(m)
            stack += [f, m // f]
    return dict(sorted(out.items()))


def divisors(n: int) -> np.ndarray:
    """All positive divisors of ``n`` in increasing order (int64), from its prime factors."""
    n = int(n)
    if n < 1:
        raise UserError(f"divisors need a positive integer, got {n}")
    out = [1]
    for p, e in prime_factors(n).items():
        out = [d * p**k for d in out for k in range(e + 1)]
    return np.array(sorted(out), dtype=np.int64)


def grid_count(gpus: int) -> int:
    """Ordered grids (gx, gy, gz) of ``gpus``: the product over its prime powers p^e of C(e + 2, 2)."""
    return math.prod((e + 2) * (e + 1) // 2 for e in prime_factors(int(gpus)).values())


def enumerate_grids(gpus, *, powers_of_two: bool = False, max_x=None, max_y=None, max_z=None) -> np.ndarray:
    """Every ordered (gx, gy, gz) with gx * gy * gz == gpus, in lexicographic order.

    ``powers_of_two`` keeps grids whose three sizes are all powers of two;
    ``max_x``/``max_y``/``max_z`` bound the size of one axis. Returns a (K, 3)
    int64 array (K may be 0 when the filters exclude everything). A G with more than
    :data:`MAX_GRIDS` grids is refused (UserError with the count).
    """
    g = check_gpus(gpus)
    count = grid_count(g)
    if count > MAX_GRIDS:
        raise UserError(f"G = {g:,} has {count:,} grids, more than the {MAX_GRIDS:,} listed at once; choose a G with "
                        "fewer divisors (a power of two near it has few)", parameter="gpus")
    d = divisors(g)
    rows = []
    for gx in d:
        rest = g // int(gx)
        gy = d[(d <= rest) & (rest % d == 0)]
        rows.append(np.stack([np.full(gy.size, gx), gy, rest // gy], axis=1))
    grids = np.concatenate(rows).astype(np.int64)
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
