"""Seeded synthetic graphs: R-MAT (Graph500 parameters) and a road-like 2D lattice.

Both generators return an undirected simple graph as a symmetric CSR matrix with unit
weights, no duplicate edges and no self-loops (GCN normalization adds the self-loops).
``edges`` always counts undirected edges, so the raw adjacency stores ``2 * edges``
nonzeros and the normalized one ``2 * edges + nodes`` (the paper's "nonzeros").

Labels are derived from the degree distribution (equal-frequency classes of degree
rank), features are standard-normal float32; everything is reproducible from one seed.
"""

from __future__ import annotations

import math
import re

import numpy as np

from plexus_tune.resources import check_memory
from plexus_tune.errors import UserError
from plexus_tune.numbers import parse_count
from plexus_tune.graph.core import Graph

GRAPH500_PROBS = (0.57, 0.19, 0.19, 0.05)
DEFAULT_FEATURES = 128
DEFAULT_CLASSES = 32

_MAX_ROUNDS = 64


def _seed_streams(seed: int, count: int) -> list[np.random.Generator]:
    return [np.random.default_rng(s) for s in np.random.SeedSequence(int(seed)).spawn(count)]


def unique_sorted(keys: np.ndarray) -> np.ndarray:
    """Sorted distinct values of an int array (sort + neighbour compare; faster than
    ``np.unique`` on tens of millions of int64 keys)."""
    keys = np.sort(keys)
    if keys.size < 2:
        return keys
    keep = np.empty(keys.size, dtype=bool)
    keep[0] = True
    np.not_equal(keys[1:], keys[:-1], out=keep[1:])
    return keys[keep]


def _symmetric_from_pairs(lo: np.ndarray, hi: np.ndarray, nodes: int) -> sp.csr_matrix:
    """Symmetric unit-weight CSR from distinct undirected pairs (lo < hi).

    Both directions are encoded as sorted keys ``row * nodes + col``, which is directly
    the CSR order: ``indptr`` from per-row counts, ``indices = key % nodes``.
    """
    import scipy.sparse as sp
    keys = np.concatenate([lo * nodes + hi, hi * nodes + lo])
    keys.sort()
    rows = keys // nodes
    counts = np.bincount(rows, minlength=nodes)
    del rows
    idx_dtype = np.int32 if nodes < 2**31 and keys.size < 2**31 else np.int64
    indices = (keys % nodes).astype(idx_dtype)
    del keys
    indptr = np.zeros(nodes + 1, dtype=idx_dtype)
    np.cumsum(counts, out=indptr[1:])
    data = np.ones(indices.size, dtype=np.float32)
    adj = sp.csr_matrix((data, indices, indptr), shape=(nodes, nodes))
    adj.has_sorted_indices = True
    adj.has_canonical_format = True
    return adj


def _rmat_sample(scale: int, count: int, probs, noise: float, rng: np.random.Generator):
    """``count`` R-MAT edge samples on ``2**scale`` vertices: one quadrant choice per level.

    At each level a uniform 16-bit r picks quadrant (0,0) if r < a, (0,1) if r < a+b,
    (1,0) if r < a+b+c, else (1,1) (thresholds scaled by 65536, so probabilities are
    resolved to 1/65536); the row and column bits are appended to the ids. With
    ``noise > 0`` every level uses its own (a, b, c, d), each multiplied by a factor
    uniform in [1 - noise, 1 + noise] and renormalized.
    """
    id_dtype = np.uint32 if scale <= 32 else np.uint64
    u = np.zeros(count, dtype=id_dtype)
    v = np.zeros(count, dtype=id_dtype)
    base = np.asarray(probs, dtype=np.float64)
    row_bit = np.empty(count, dtype=bool)
    col_bit = np.empty(count, dtype=bool)
    for _ in range(scale):
        p = base
        if noise > 0:
            p = base * rng.uniform(1.0 - noise, 1.0 + noise, size=4)
            p = p / p.sum()
        cum = np.cumsum(p)[:3]
        t_a, t_ab, t_abc = (int(min(round(x * 65536), 65536)) for x in cum)
        r = rng.integers(0, 65536, size=count, dtype=np.uint16)
        # r >= 65536 never holds: compare in a wider type so that threshold 65536 works
        t_a, t_ab, t_abc = (np.uint32(t) for t in (t_a, t_ab, t_abc))
        np.greater_equal(r, t_ab, out=row_bit)
        np.greater_equal(r, t_a, out=col_bit)
        np.logical_xor(col_bit, row_bit, out=col_bit)
        col_bit |= r >= t_abc
        np.left_shift(u, 1, out=u)
        np.left_shift(v, 1, out=v)
        np.bitwise_or(u, row_bit, out=u)
        np.bitwise_or(v, col_bit, out=v)
    return u.astype(np.int64), v.astype(np.int64)


def _check_rmat(nodes: int, edges: int, probs, noise: float) -> None:
    if nodes < 2:
        raise UserError(f"rmat needs at least 2 nodes, got {nodes}")
    if edges < 1:
        raise UserError(f"rmat needs at least 1 edge, got {edges}")
    max_edges = nodes * (nodes - 1) // 2
    if edges > max_edges // 2:
        raise UserError(
            f"rmat: {edges} edges is too dense for {nodes} nodes (at most {max_edges // 2}, half the "
            "complete graph); ask for fewer edges or more nodes"
        )
    if len(probs) != 4 or min(probs) < 0 or abs(sum(probs) - 1.0) > 1e-6:
        raise UserError(f"rmat probabilities a,b,c,d must be >= 0 and sum to 1, got {probs}")
    if not 0 <= noise < 1:
        raise UserError(f"rmat noise must be in [0, 1), got {noise}")


def _check_grid2d(nodes: int, neighbors: int, drop: float, long_edges: float) -> None:
    if nodes < 2:
        raise UserError(f"grid2d needs at least 2 nodes, got {nodes}")
    if neighbors not in (4, 8):
        raise UserError(f"grid2d neighbors must be 4 or 8, got {neighbors}")
    if not 0 <= drop < 1:
        raise UserError(f"grid2d drop must be in [0, 1), got {drop}")
    if not 0 <= long_edges <= 1:
        raise UserError(f"grid2d long must be in [0, 1], got {long_edges}")


def rmat_adjacency(
    nodes: int,
    edges: int,
    *,
    probs=GRAPH500_PROBS,
    noise: float = 0.0,
    scramble: bool = True,
    seed: int = 0,
    progress=None,
) -> sp.csr_matrix:
    """Symmetric R-MAT adjacency with exactly ``edges`` distinct undirected edges.

    Samples are drawn on ``2**ceil(log2 nodes)`` vertices; samples with an endpoint
    ``>= nodes`` and self-loops are rejected, each pair is canonicalized to (min, max) and
    deduplicated via int64 keys ``lo * nodes + hi``. Rounds of sampling repeat until at
    least ``edges`` distinct pairs exist; a seeded random subset of exactly ``edges`` is
    kept. With ``scramble`` the vertex ids are randomly relabelled afterwards (as Graph500
    does), otherwise the hubs sit at the lowest ids.
    """
    nodes = int(nodes)
    edges = int(edges)
    probs = tuple(float(x) for x in probs)
    _check_rmat(nodes, edges, probs, noise)
    sample_rng, subset_rng, label_rng = _seed_streams(seed, 3)
    scale = max(1, math.ceil(math.log2(nodes)))
    keys = np.empty(0, dtype=np.int64)
    accept = 0.7  # distinct new pairs per sample; refined after every round
    for _ in range(_MAX_ROUNDS):
        need = edges - keys.size
        if need <= 0:
            break
        batch = int(need / max(accept, 0.02) * 1.05) + 64
        u, v = _rmat_sample(scale, batch, probs, noise, sample_rng)
        lo = np.minimum(u, v)
        np.maximum(u, v, out=v)
        del u
        ok = (lo != v) & (v < nodes)
        new = lo[ok] * nodes + v[ok]
        del lo, v, ok
        before = keys.size
        keys = unique_sorted(np.concatenate([keys, new]))
        del new
        accept = max((keys.size - before) / batch, 1e-3)
        if progress is not None:
            progress(min(keys.size, edges), edges)
    else:
        raise UserError(
            f"rmat: could not draw {edges} distinct edges on {nodes} nodes with these probabilities; "
            "ask for fewer edges"
        )
    if keys.size > edges:
        keep = subset_rng.choice(keys.size, size=edges, replace=False)
        keep.sort()
        keys = keys[keep]
    lo = keys // nodes
    hi = keys - lo * nodes
    del keys
    if scramble:
        relabel = label_rng.permutation(nodes)
        lo = relabel[lo]
        hi = relabel[hi]
    return _symmetric_from_pairs(lo, hi, nodes)


def grid2d_adjacency(
    nodes: int,
    *,
    neighbors: int = 4,
    drop: float = 0.1,
    long_edges: float = 0.01,
    seed: int = 0,
) -> sp.csr_matrix:
    """Road-like lattice: nodes on a ``rows x cols`` grid in row-major order.

    ``cols = ceil(sqrt(nodes))``; node i sits at (i // cols, i % cols) and links to its
    right and lower neighbours (``neighbors=8`` adds both lower diagonals). A seeded
    fraction ``drop`` of lattice edges is removed, and ``long_edges * lattice edges``
    uniformly random pairs are added. In natural order every lattice edge lies within
    ``cols + 1`` of the diagonal, which is what makes a plain 2D block split imbalanced.
    """
    nodes = int(nodes)
    _check_grid2d(nodes, neighbors, drop, long_edges)
    drop_rng, long_rng = _seed_streams(seed, 2)
    cols = math.ceil(math.sqrt(nodes))
    ids = np.arange(nodes, dtype=np.int64)
    col = ids % cols
    parts_lo = []
    parts_hi = []
    right = ids[(col < cols - 1) & (ids + 1 < nodes)]
    parts_lo.append(right)
    parts_hi.append(right + 1)
    down = ids[ids + cols < nodes]
    parts_lo.append(down)
    parts_hi.append(down + cols)
    if neighbors == 8:
        diag_r = ids[(col < cols - 1) & (ids + cols + 1 < nodes)]
        parts_lo.append(diag_r)
        parts_hi.append(diag_r + cols + 1)
        diag_l = ids[(col > 0) & (ids + cols - 1 < nodes)]
        parts_lo.append(diag_l)
        parts_hi.append(diag_l + cols - 1)
    lo = np.concatenate(parts_lo)
    hi = np.concatenate(parts_hi)
    lattice = lo.size
    if drop > 0:
        keep = drop_rng.random(lattice) >= drop
        lo, hi = lo[keep], hi[keep]
    extra = int(round(long_edges * lattice))
    if extra:
        a = long_rng.integers(0, nodes, size=extra, dtype=np.int64)
        b = long_rng.integers(0, nodes, size=extra, dtype=np.int64)
        ok = a != b
        lo = np.concatenate([lo, np.minimum(a, b)[ok]])
        hi = np.concatenate([hi, np.maximum(a, b)[ok]])
    keys = unique_sorted(lo * nodes + hi)
    lo = keys // nodes
    return _symmetric_from_pairs(lo, keys - lo * nodes, nodes)


def degree_labels(adj, num_classes: int, seed: int = 0) -> np.ndarray:
    """Classes from the degree distribution: equal-frequency bins of degree rank.

    Nodes are sorted by in-degree (row nonzeros), ties broken by a seeded random key;
    the node of rank k gets class ``k * num_classes // N``, so class c holds the c-th
    ``1/num_classes`` quantile of degrees and every class has N/C nodes (+-1).
    """
    import scipy.sparse as sp
    n = adj.shape[0]
    if num_classes < 1:
        raise UserError(f"classes must be >= 1, got {num_classes}")
    degree = np.diff(sp.csr_matrix(adj).indptr)
    tie = np.random.default_rng(np.random.SeedSequence([int(seed), 1])).random(n)
    order = np.lexsort((tie, degree))
    labels = np.empty(n, dtype=np.int64)
    labels[order] = np.arange(n, dtype=np.int64) * num_classes // max(n, 1)
    return labels


def random_features(n: int, width: int, seed: int = 0) -> np.ndarray:
    """Standard-normal float32 features of shape (n, width)."""
    if width < 1:
        raise UserError(f"features must be >= 1, got {width}")
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 2]))
    return rng.standard_normal((int(n), int(width)), dtype=np.float32)


# --- spec strings ------------------------------------------------------------------

_INT_KEYS = {"nodes", "edges", "features", "classes", "seed", "neighbors"}
_FLOAT_KEYS = {"a", "b", "c", "d", "noise", "drop", "long"}
_BOOL_KEYS = {"scramble"}
_KIND_KEYS = {
    "rmat": {"nodes", "edges", "features", "classes", "seed", "a", "b", "c", "d", "noise", "scramble"},
    "grid2d": {"nodes", "features", "classes", "seed", "neighbors", "drop", "long"},
}
GENERATORS = tuple(_KIND_KEYS)
#: The graph ``train`` generates when given neither a file nor a spec: small enough for several
#: CPU ranks, large enough that every rank of a grid of 8 holds nonzeros.
EXAMPLE_SPEC = "rmat:nodes=4096,edges=32768,features=32,classes=8,seed=0"


def parse_spec(spec: str) -> tuple[str, dict]:
    """``"rmat:nodes=4096,edges=65536"`` -> ``("rmat", {"nodes": 4096, "edges": 65536})``; nodes is required."""
    match = re.fullmatch(r"\s*([A-Za-z0-9_]+)\s*(?::(.*))?", spec or "")
    if not match:
        raise UserError(f"bad graph spec {spec!r}; expected KIND:key=value,... e.g. rmat:nodes=4096,edges=65536")
    kind = match.group(1).lower()
    if kind not in _KIND_KEYS:
        raise UserError(f"unknown graph generator {kind!r}; known: {', '.join(GENERATORS)}")
    params: dict = {}
    body = (match.group(2) or "").strip()
    for item in filter(None, (x.strip() for x in body.split(","))):
        if "=" not in item:
            raise UserError(f"bad item {item!r} in graph spec {spec!r}; expected key=value")
        key, value = (x.strip() for x in item.split("=", 1))
        key = key.lower()
        if key not in _KIND_KEYS[kind]:
            raise UserError(f"{kind} does not take {key!r}; it takes {', '.join(sorted(_KIND_KEYS[kind]))}")
        if key in _INT_KEYS:
            params[key] = parse_count(value, key)
        elif key in _FLOAT_KEYS:
            try:
                params[key] = float(value)
            except ValueError:
                raise UserError(f"{key} must be a number, got {value!r}") from None
        elif key in _BOOL_KEYS:
            if value.lower() not in ("0", "1", "true", "false", "yes", "no"):
                raise UserError(f"{key} must be true or false, got {value!r}")
            params[key] = value.lower() in ("1", "true", "yes")
    if "nodes" not in params:
        raise UserError(f"graph spec {spec!r} needs nodes=N, e.g. {kind}:nodes=4096")
    check_params(kind, params)
    return kind, params


def check_params(kind: str, params: dict) -> None:
    """The checks :func:`generate` makes of its parameters, without generating (UserError)."""
    nodes = int(params["nodes"])
    if kind == "rmat":
        _check_rmat(nodes, int(params.get("edges", 16 * nodes)),
                    tuple(float(params.get(k, d)) for k, d in zip("abcd", GRAPH500_PROBS)), float(params.get("noise", 0.0)))
    else:
        _check_grid2d(nodes, int(params.get("neighbors", 4)), float(params.get("drop", 0.1)), float(params.get("long", 0.01)))
    for key, default in (("features", DEFAULT_FEATURES), ("classes", DEFAULT_CLASSES)):
        if int(params.get(key, default)) < 1:
            raise UserError(f"{key} must be >= 1, got {params[key]}")
    check_memory(generation_bytes(kind, nodes, int(params.get("edges", 16 * nodes)),
                                  int(params.get("features", DEFAULT_FEATURES)), int(params.get("neighbors", 4))),
                 f"a {kind} graph of {nodes:,} nodes")
    if int(params.get("classes", DEFAULT_CLASSES)) > nodes:
        raise UserError(f"classes {int(params.get('classes', DEFAULT_CLASSES))} exceeds the {nodes} nodes: some classes "
                        f"would have no node; use at most {nodes} classes")


#: peak bytes per edge of generation (samples, keys, both directions, CSR) and per node
#: besides the features (labels, degrees, permutation): an upper estimate
_BYTES_PER_EDGE = 64
_BYTES_PER_NODE = 48


def generation_bytes(kind: str, nodes: int, edges: int, features: int, neighbors: int = 4) -> int:
    """Estimated peak memory of :func:`generate`: features (float32) + nodes x 48 + edges x 64 bytes."""
    if kind != "rmat":
        edges = nodes * neighbors // 2
    return 4 * nodes * features + _BYTES_PER_NODE * nodes + _BYTES_PER_EDGE * edges


def generate(kind: str, *, progress=None, **params) -> Graph:
    """Build a synthetic :class:`Graph` (see :func:`synthetic` for the parameters)."""
    kind = kind.lower()
    if kind not in _KIND_KEYS:
        raise UserError(f"unknown graph generator {kind!r}; known: {', '.join(GENERATORS)}")
    unknown = set(params) - _KIND_KEYS[kind]
    if unknown:
        raise UserError(f"{kind} does not take {', '.join(sorted(unknown))}")
    if "nodes" not in params:
        raise UserError(f"{kind} needs nodes=N")
    nodes = int(params["nodes"])
    seed = int(params.get("seed", 0))
    features = int(params.get("features", DEFAULT_FEATURES))
    classes = int(params.get("classes", DEFAULT_CLASSES))
    check_memory(generation_bytes(kind, nodes, int(params.get("edges", 16 * nodes)), features,
                                  int(params.get("neighbors", 4))), f"a {kind} graph of {nodes:,} nodes")
    if kind == "rmat":
        edges = int(params.get("edges", 16 * nodes))
        probs = tuple(params.get(k, d) for k, d in zip("abcd", GRAPH500_PROBS))
        adj = rmat_adjacency(
            nodes, edges, probs=probs, noise=float(params.get("noise", 0.0)),
            scramble=bool(params.get("scramble", True)), seed=seed, progress=progress,
        )
        name = f"rmat-n{nodes}-e{edges}-s{seed}"
    else:
        adj = grid2d_adjacency(
            nodes, neighbors=int(params.get("neighbors", 4)), drop=float(params.get("drop", 0.1)),
            long_edges=float(params.get("long", 0.01)), seed=seed,
        )
        name = f"grid2d-n{nodes}-s{seed}"
    labels = degree_labels(adj, classes, seed)
    feats = random_features(nodes, features, seed)
    meta = {"generator": kind, "params": dict(params, seed=seed, features=features, classes=classes),
            "symmetric": True}
    return Graph(adj, feats, labels, classes, name=name, meta=meta)


def synthetic(spec: str, *, progress=None) -> Graph:
    """Synthetic graph from a spec string.

    ``rmat:nodes=N,edges=E[,a=,b=,c=,d=,noise=,scramble=]`` (E undirected edges, default
    16 N; Graph500 a=.57 b=.19 c=.19 d=.05) or ``grid2d:nodes=N[,neighbors=4|8,drop=0.1,
    long=0.01]``; both take ``features`` (default 128), ``classes`` (default 32) and
    ``seed`` (default 0). Counts accept 1e6 / 16M / 4k.
    """
    kind, params = parse_spec(spec)
    return generate(kind, progress=progress, **params)
