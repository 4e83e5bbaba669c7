"""The search space: objectives, GPU counts, grid encodings and configurations."""

from __future__ import annotations
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
import numpy as np
from plexus_tune.errors import UserError
from plexus_tune.numbers import parse_count
from plexus_tune.model.grid import enumerate_grids, format_grid


OBJECTIVES = ("epoch", "gpu-hours")
#: Epochs that the ``gpu-hours`` objective counts.
GPU_HOURS_EPOCHS = 100
MS_PER_HOUR = 3.6e6
CONSTRAINT_KEY = "memory_excess_gib"
# --------------------------------------------------------------------------------------
# Objectives and GPU counts


def check_objective(objective: str) -> str:
    """Return ``objective`` if known, else raise UserError listing the known ones."""
    if objective not in OBJECTIVES:
        raise UserError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    return objective


def objective_value(epoch_ms, gpus, objective: str):
    """The value minimized: ``epoch_ms`` or GPU-hours per 100 epochs (``epoch_ms G 100 / 3.6e6``)."""
    check_objective(objective)
    epoch_ms = np.asarray(epoch_ms, dtype=np.float64)
    if objective == "epoch":
        out = epoch_ms
    else:
        out = epoch_ms * np.asarray(gpus, dtype=np.float64) * GPU_HOURS_EPOCHS / MS_PER_HOUR
    return float(out) if out.ndim == 0 else out


def objective_unit(objective: str) -> str:
    check_objective(objective)
    return "ms" if objective == "epoch" else f"GPU-h/{GPU_HOURS_EPOCHS} epochs"


_RANGE_RE = re.compile(r"^\s*(\d[\d_]*(?:[eE]\+?\d+)?[kKmMgGtT]?)\s*(?:\.\.|-|:)\s*(\d[\d_]*(?:[eE]\+?\d+)?[kKmMgGtT]?)\s*(?::\s*(pow2|2\^k))?\s*$")


def parse_gpus(text: str | int | Sequence[int]) -> tuple[int, ...]:
    """Parse a GPU count, a range ``A..B`` (every integer), ``A..B:pow2`` or a list ``8,16,64``.

    Returns the sorted, distinct counts; UserError if the result is empty or invalid.
    """
    if isinstance(text, (int, np.integer)):
        values = [int(text)]
    elif isinstance(text, str):
        s = text.strip()
        m = _RANGE_RE.match(s)
        if m:
            lo, hi = parse_count(m.group(1), "GPU count"), parse_count(m.group(2), "GPU count")
            if hi < lo:
                raise UserError(f"empty GPU range {text!r}: the upper end is below the lower end; write e.g. 8..4096")
            if lo < 1:
                raise UserError(f"GPU counts must be positive, got {lo} in {text!r}")
            if m.group(3):
                values = [1 << k for k in range(max(0, (lo - 1).bit_length()), hi.bit_length()) if lo <= 1 << k <= hi]
            else:
                return range(lo, hi + 1)  # a range stays a range: 1..10^12 is not materialised
        else:
            parts = [part.strip() for part in s.split(",")]
            if any(not part for part in parts):
                raise UserError(f"empty item in the GPU counts {text!r}; write a count (8), a range (8..4096) or a list (8,16,64)")
            try:
                values = [parse_count(part, "GPU count") for part in parts]
            except UserError:
                raise UserError(
                    f"cannot read GPU counts {text!r}; write a count (8), a range (8..4096, 8..4096:pow2) or a list (8,16,64)"
                ) from None
    else:
        values = [int(v) for v in text]
    values = sorted(set(values))
    if not values:
        raise UserError(f"no GPU count in {text!r}; write a count (8), a range (8..4096) or a list (8,16,64)")
    if values[0] < 1:
        raise UserError(f"GPU counts must be positive, got {values[0]} in {text!r}")
    return tuple(values)


# --------------------------------------------------------------------------------------
# Factorization encoding


@lru_cache(maxsize=8192)
def divisors(n: int) -> tuple[int, ...]:
    """All divisors of ``n`` in increasing order."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return tuple(small + large[::-1])


def nearest_divisor(n: int, target: float) -> int:
    """The divisor d of ``n`` minimizing |log d - log target| (the smaller on ties)."""
    divs = np.asarray(divisors(n), dtype=np.float64)
    dist = np.abs(np.log(divs) - math.log(max(target, 1e-300)))
    return int(divs[int(np.argmin(dist))])


def decode_grid(gpus: int, u: float, v: float) -> tuple[int, int, int]:
    """Map (u, v) in [0, 1]^2 to a grid of ``gpus``: gx ~ G**u, gy ~ (G/gx)**v, gz = rest."""
    gx = nearest_divisor(gpus, gpus ** float(u))
    rest = gpus // gx
    gy = nearest_divisor(rest, rest ** float(v))
    return gx, gy, rest // gy


def encode_grid(grid: Sequence[int]) -> tuple[float, float]:
    """A (u, v) that :func:`decode_grid` maps back to ``grid`` (used to enqueue trials)."""
    gx, gy, gz = (int(a) for a in grid)
    g = gx * gy * gz
    u = math.log(gx) / math.log(g) if g > 1 else 0.0
    rest = gy * gz
    v = math.log(gy) / math.log(rest) if rest > 1 else 0.0
    return min(max(u, 0.0), 1.0), min(max(v, 0.0), 1.0)


def snap_gpus(allowed: Sequence[int], log2_value: float) -> int:
    """The allowed GPU count nearest ``2**log2_value`` in log scale (a ``range`` is not materialised)."""
    if isinstance(allowed, range) and allowed.step == 1:
        target = 2.0 ** float(log2_value)
        low = min(max(int(math.floor(target)), allowed.start), allowed[-1])
        high = min(low + 1, allowed[-1])
        return low if abs(math.log2(low) - log2_value) <= abs(math.log2(high) - log2_value) else high
    arr = np.asarray(allowed, dtype=np.float64)
    return int(arr[int(np.argmin(np.abs(np.log2(arr) - float(log2_value))))])


# --------------------------------------------------------------------------------------
# Configurations and the search space

SIZE_PARAMS = ("log2_gx", "log2_gy", "log2_gz")
#: at most this many GPU counts get the "sizes" encoding (a table of all their grids); a larger
#: range (1..10^12 is a range, never a list) is searched with the "uv" encoding
TABLE_GPU_COUNTS = 4096
_GRID_TABLES: dict = {}


@dataclass(frozen=True, order=True)
class Config:
    """One point of the search space: a grid (its product is G) and the block size (None = unblocked)."""

    gx: int
    gy: int
    gz: int
    block_rows: int | None = None

    @property
    def gpus(self) -> int:
        return self.gx * self.gy * self.gz

    @property
    def grid(self) -> tuple[int, int, int]:
        return (self.gx, self.gy, self.gz)

    @property
    def grid_label(self) -> str:
        return format_grid((self.gx, self.gy, self.gz))

    @property
    def label(self) -> str:
        return self.grid_label + (f"/b{self.block_rows}" if self.block_rows else "")

    def as_dict(self) -> dict:
        return {"gpus": self.gpus, "gx": self.gx, "gy": self.gy, "gz": self.gz, "block_rows": self.block_rows}


ENCODINGS = ("sizes", "uv")


@dataclass(frozen=True)
class SearchSpace:
    """GPU counts to search, and the block sizes (``block_rows_range`` = (min, max), None = never blocked).

    ``encoding`` chooses how trial parameters map to grids (see the module docstring):
    ``"sizes"`` (default) samples log2 of each axis size and projects onto the nearest
    allowed grid; ``"uv"`` samples G and the split exponents (u, v).
    """

    gpus: tuple[int, ...]
    block_rows_range: tuple[int, int] | None = None
    encoding: str = "sizes"

    def __post_init__(self):
        if not self.gpus:
            raise UserError("the search space has no GPU count")
        if self.encoding not in ENCODINGS:
            raise UserError(f"unknown encoding {self.encoding!r}; choose one of {', '.join(ENCODINGS)}")
        if self.encoding == "sizes" and len(self.gpus) > TABLE_GPU_COUNTS:
            # the sizes encoding needs a table of every grid of every G: sample G instead
            object.__setattr__(self, "encoding", "uv")
        if self.block_rows_range is not None:
            lo, hi = self.block_rows_range
            if lo < 1 or hi < lo:
                raise UserError(f"bad block size range {lo}..{hi}; write e.g. 1024..65536")

    # -- the allowed grids, for the "sizes" encoding
    def grid_table(self) -> np.ndarray:
        """Every allowed grid of every G, (K, 3) int64."""
        cached = _GRID_TABLES.get(self.gpus)
        if cached is None:
            grids = np.concatenate([np.asarray(enumerate_grids(g), dtype=np.int64).reshape(-1, 3) for g in self.gpus])
            from scipy.spatial import cKDTree

            cached = (grids, cKDTree(np.log2(grids.astype(np.float64))))
            _GRID_TABLES[self.gpus] = cached
        return cached[0]

    def nearest_grid(self, log2_sizes: Sequence[float]) -> tuple[int, int, int]:
        """The allowed grid nearest (Euclidean in log2 sizes) to ``log2_sizes`` (ties: lexicographically first)."""
        self.grid_table()
        grids, tree = _GRID_TABLES[self.gpus]
        _, idx = tree.query(np.asarray(log2_sizes, dtype=np.float64))
        return tuple(int(a) for a in grids[int(idx)])

    def nearest_grids(self, log2_sizes: Sequence[float], k: int) -> np.ndarray:
        """The ``k`` allowed grids nearest to ``log2_sizes`` (nearest first), (k, 3) int64."""
        grids = self.grid_table()
        tree = _GRID_TABLES[self.gpus][1]
        k = max(1, min(int(k), len(grids)))
        _, idx = tree.query(np.asarray(log2_sizes, dtype=np.float64), k=k)
        return grids[np.atleast_1d(idx)]

    @property
    def max_log2_size(self) -> float:
        return math.log2(self.gpus[-1])

    def suggest(self, trial) -> Config:
        """Sample a configuration with static distributions (see the module docstring)."""
        params = {}
        if self.encoding == "sizes":
            hi = max(self.max_log2_size, 1e-9)
            for name in SIZE_PARAMS:
                params[name] = trial.suggest_float(name, 0.0, hi)
        else:
            if len(self.gpus) > 1:
                params["gpus_log2"] = trial.suggest_float("gpus_log2", math.log2(self.gpus[0]), math.log2(self.gpus[-1]))
            params["u"] = trial.suggest_float("u", 0.0, 1.0)
            params["v"] = trial.suggest_float("v", 0.0, 1.0)
        if self.block_rows_range is not None:
            lo, hi = self.block_rows_range
            params["blocked"] = trial.suggest_categorical("blocked", [False, True])
            params["block_rows_log2"] = trial.suggest_float("block_rows_log2", math.log2(lo), math.log2(hi))
        return self.config_of_params(params)

    def params_of(self, config: Config) -> dict:
        """Trial parameters that :meth:`suggest` decodes to ``config`` (for ``enqueue_trial``)."""
        if self.encoding == "sizes":
            params = {name: math.log2(size) for name, size in zip(SIZE_PARAMS, config.grid)}
        else:
            u, v = encode_grid(config.grid)
            params = {"u": u, "v": v}
            if len(self.gpus) > 1:
                params["gpus_log2"] = math.log2(config.gpus)
        if self.block_rows_range is not None:
            params["blocked"] = config.block_rows is not None
            lo, hi = self.block_rows_range
            b = config.block_rows if config.block_rows is not None else lo
            params["block_rows_log2"] = min(max(math.log2(b), math.log2(lo)), math.log2(hi))
        return params

    def config_of_params(self, params: dict) -> Config | None:
        """The configuration that :meth:`suggest` decodes from ``params`` (None if incomplete)."""
        try:
            if self.encoding == "sizes":
                gx, gy, gz = self.nearest_grid([params[name] for name in SIZE_PARAMS])
            else:
                g = snap_gpus(self.gpus, params["gpus_log2"]) if len(self.gpus) > 1 else self.gpus[0]
                gx, gy, gz = decode_grid(g, params["u"], params["v"])
            block = None
            if self.block_rows_range is not None and params.get("blocked"):
                lo, hi = self.block_rows_range
                block = int(min(max(2 ** round(params["block_rows_log2"]), lo), hi))
        except (KeyError, TypeError, ValueError):
            return None
        return Config(gx, gy, gz, block)

    def configs(self, enumerate_grids: Callable[[int], np.ndarray] = enumerate_grids, block_sizes: Iterable[int] | None = None):
        """Every configuration (block sizes: powers of two in the range, plus unblocked)."""
        blocks: list[int | None] = [None]
        if self.block_rows_range is not None:
            if block_sizes is None:
                lo, hi = self.block_rows_range
                block_sizes = [2**k for k in range(math.ceil(math.log2(lo)), math.floor(math.log2(hi)) + 1)]
            blocks += list(block_sizes)
        for g in self.gpus:
            for gx, gy, gz in np.asarray(enumerate_grids(g)).tolist():
                for b in blocks:
                    yield Config(int(gx), int(gy), int(gz), b)
