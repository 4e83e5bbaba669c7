"""Degree distributions of the project's generator families at any size, without generating the graph
(docs/model.md, "Structure descriptors").

A degree shape is ``[[degree / mean degree, share of the nodes], ...]`` over log-spaced classes
of the normalized degree (a self-loop per node included), the form a catalog dataset's
structure descriptor takes.

R-MAT (:func:`plexus_tune.graph.generators.rmat_adjacency`, k = ceil(log2 N) levels, quadrant
probabilities a, b, c, d): a sample is the ordered pair (v, u) with probability
``p(v, u) = a^n00 b^n01 c^n10 d^n11`` (n_xy: levels where v's bit is x and u's is y); pairs with
an id >= N and self-loops are rejected and each unordered pair is kept once. After S samples
the pair {v, u} is present with probability ``1 - exp(-S (p(v, u) + p(u, v)))``, so a vertex
with j one-bits has on average

    lambda_j(S) = rho sum_{i0, i1} C(k - j, i0) C(j, i1) (1 - exp(-S (p + p')))

distinct neighbours (i0 of the partner's one-bits where v has zeros, i1 where v has ones;
rho = N / 2^k, the share of partner ids below N), S fixed by sum_j n_j lambda_j = 2E (n_j:
the ids below N with j one-bits). The degree of such a vertex, a sum of independent pair
indicators, is taken Poisson (lambda_j <= 50) or normal with their variance.

grid2d (:func:`plexus_tune.graph.generators.grid2d_adjacency`): an inner node keeps each of
its 4 lattice links with probability 1 - drop and gains Poisson(2 long lattice / N) long
edges, lattice ~ 2N.
"""

from __future__ import annotations

import math

import numpy as np

#: Graph500's R-MAT quadrant probabilities (a, b, c, d).
GRAPH500_SKEW = (0.57, 0.19, 0.19, 0.05)
#: Degree classes per doubling of the normalized degree in a shape.
CLASSES_PER_DOUBLING = 2


def _ids_by_ones(nodes: int, levels: int) -> np.ndarray:
    """n_j: how many ids in [0, nodes) have j one-bits, j = 0..levels."""
    out = np.zeros(levels + 1, dtype=np.float64)
    ones = 0
    for bit in range(levels - 1, -1, -1):
        if (nodes >> bit) & 1:  # ids with this bit 0 and the higher bits as nodes': the lower bits free
            for j in range(bit + 1):
                out[ones + j] += math.comb(bit, j)
            ones += 1
    return out


def _rmat_pairs(levels: int, skew) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each j: (partner counts, p + p') over the partner classes (i0, i1), the self pair left out."""
    a, b, c, d = (float(v) for v in skew)
    out = []
    for j in range(levels + 1):
        i0 = np.arange(levels - j + 1)[:, None]
        i1 = np.arange(j + 1)[None, :]
        count = np.array([[math.comb(levels - j, x) * math.comb(j, y) for y in range(j + 1)]
                          for x in range(levels - j + 1)], dtype=np.float64)
        zeros_v = levels - j
        p = a ** (zeros_v - i0) * b ** i0 * c ** (j - i1) * d ** i1
        q = a ** (zeros_v - i0) * c ** i0 * b ** (j - i1) * d ** i1
        count[0, j] -= 1  # u = v: a self-loop, rejected
        out.append((count.ravel(), (p + q).ravel()))
    return out


def rmat_degrees(nodes: int, edges: int, skew=GRAPH500_SKEW) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(n_j, mean, variance of the distinct-neighbour count) of the ids with j one-bits, j = 0..k."""
    nodes, edges = int(nodes), int(edges)
    levels = max(1, math.ceil(math.log2(nodes)))
    counts = _ids_by_ones(nodes, levels)
    rho = nodes / 2 ** levels
    pairs = _rmat_pairs(levels, skew)

    def moments(samples: float):
        mean = np.array([rho * float(cnt @ -np.expm1(-samples * pq)) for cnt, pq in pairs])
        var = np.array([rho * float(cnt @ (-np.expm1(-samples * pq) * np.exp(-samples * pq))) for cnt, pq in pairs])
        return mean, var

    lo, hi = 0.0, float(edges)
    while float(counts @ moments(hi)[0]) < 2 * edges:
        hi *= 2
        if hi > 1e9 * edges:
            raise ValueError(f"an R-MAT of {nodes} nodes cannot hold {edges} distinct edges")
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if float(counts @ moments(mid)[0]) < 2 * edges:
            lo = mid
        else:
            hi = mid
    mean, var = moments(hi)
    return counts, mean, var


def _class_points(mean: float, var: float) -> tuple[np.ndarray, np.ndarray]:
    """(degrees, probabilities) of one class: Poisson(mean) up to mean 50, else normal(mean, var) discretized."""
    if mean <= 50:
        top = int(mean + 12 * math.sqrt(mean) + 12)
        k = np.arange(top + 1)
        logp = k * math.log(max(mean, 1e-300)) - mean - np.array([math.lgamma(v + 1) for v in k])
        prob = np.exp(logp) if mean > 0 else (k == 0).astype(np.float64)
        return k.astype(np.float64), prob / prob.sum()
    sd = math.sqrt(max(var, 1e-12))
    z = np.linspace(-4, 4, 33)
    prob = np.exp(-0.5 * z * z)
    return np.maximum(mean + sd * z, 0.0), prob / prob.sum()


def log_binned_shape(degrees: np.ndarray, mass: np.ndarray) -> list[list[float]]:
    """``[[mean degree of the class / mean degree, share], ...]`` of normalized degrees (>= 1) with
    the given masses, classes CLASSES_PER_DOUBLING per doubling."""
    degrees = np.asarray(degrees, dtype=np.float64)
    mass = np.asarray(mass, dtype=np.float64)
    keep = mass > 0
    degrees, mass = degrees[keep], mass[keep] / mass[keep].sum()
    mean = float(mass @ degrees)
    cls = np.floor(np.log2(np.maximum(degrees, 1.0)) * CLASSES_PER_DOUBLING + 1e-9).astype(np.int64)
    share = np.bincount(cls, weights=mass)
    held = np.bincount(cls, weights=mass * degrees)
    out = [[round(float(h / s / mean), 6), float(f"{s:.6g}")] for s, h in zip(share, held) if s > 1e-9]
    return out


def rmat_degree_shape(nodes: int, edges: int, skew=GRAPH500_SKEW) -> list[list[float]]:
    """The normalized degree shape of an R-MAT of ``nodes`` and ``edges`` undirected edges (module docstring)."""
    counts, mean, var = rmat_degrees(nodes, edges, skew)
    degrees, mass = [], []
    for n_j, m, v in zip(counts, mean, var):
        if n_j <= 0:
            continue
        k, prob = _class_points(float(m), float(v))
        degrees.append(k + 1)  # the self-loop
        mass.append(prob * n_j)
    return log_binned_shape(np.concatenate(degrees), np.concatenate(mass))


def grid2d_degree_shape(nodes: int, *, drop: float = 0.1, long_edges: float = 0.01) -> list[list[float]]:
    """The normalized degree shape of the 4-neighbour road-like lattice (module docstring; borders neglected)."""
    keep = 1.0 - float(drop)
    lattice = np.array([math.comb(4, i) * keep ** i * (1 - keep) ** (4 - i) for i in range(5)])
    rate = 2 * float(long_edges) * 2.0  # long edges per node: 2 endpoints of long_edges x ~2N lattice links / N
    extra = np.array([math.exp(-rate) * rate ** i / math.factorial(i) for i in range(8)])
    degree = np.convolve(lattice, extra)
    _ = nodes
    return log_binned_shape(np.arange(degree.size) + 1.0, degree)
