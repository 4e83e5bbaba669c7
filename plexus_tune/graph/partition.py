"""Graph partitions and the boundary exchange of a partitioned GCN (docs/model.md, SuperGCN).

A partition assigns every node to one of P parts (:func:`partition_graph`, METIS through
``pymetis`` on the symmetrized pattern, seeded). With the orientation of
:mod:`plexus_tune.graph.core` (row v of A lists the in-neighbours u of v), a *cut edge*
is an off-diagonal nonzero A[v, u] with part(u) = p != q = part(v): the aggregation
A F at v needs a contribution of F_u, which lives on p.

For the ordered pair (p, q) the cut edges form a bipartite graph between the sources
U_pq (nodes of p with an edge into q) and the destinations V_pq (nodes of q with an
in-neighbour in p). Part p sends q, per aggregation of width D, one row of D values per
element of a set S_pq that covers every cut edge of the pair:

    post    S_pq = U_pq          every source sent as it is, aggregated at q
    pre     S_pq = V_pq          a partial sum per destination, aggregated at p
    hybrid  S_pq = a minimum vertex cover of (U_pq, V_pq, E_pq); a source in the cover
            is sent as it is, an edge whose source is not in the cover is summed at p
            into its destination's partial row

so hybrid <= min(pre, post) rows (König: |cover| = |maximum matching|). The backward
aggregation A^T dH runs the same edges the other way: q sends p the same number of rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.graph.cache import partition_file, pattern_hash, read_partition, store_partition
from plexus_tune.graph.permute import with_self_loops_pattern

#: Aggregation modes of a partitioned exchange.
AGGREGATION_MODES = ("pre", "post", "hybrid")


def check_aggregation(mode: str) -> str:
    """``mode`` if it is one of :data:`AGGREGATION_MODES`, else UserError."""
    name = str(mode).strip().lower()
    if name not in AGGREGATION_MODES:
        raise UserError(f"unknown aggregation mode {mode!r}; choose one of {', '.join(AGGREGATION_MODES)}")
    return name


def _pattern(adjacency) -> sp.csr_matrix:
    import scipy.sparse as sp
    csr = sp.csr_matrix(adjacency)
    if csr.shape[0] != csr.shape[1]:
        raise UserError(f"a partition needs a square adjacency, got {csr.shape[0]} x {csr.shape[1]}")
    coo = csr.tocoo()
    keep = (coo.row != coo.col) & (coo.data != 0)
    n = csr.shape[0]
    out = sp.csr_matrix((np.ones(int(keep.sum()), dtype=np.int8), (coo.row[keep], coo.col[keep])), shape=(n, n))
    out.sum_duplicates()
    return out


def partition_graph(adjacency, parts: int, *, seed: int = 0, cache: bool = True) -> np.ndarray:
    """Part (0..parts-1) of every node: METIS k-way on the symmetrized off-diagonal pattern.

    Deterministic for a given graph, ``parts`` and ``seed``. ``parts`` must be between 1
    and the number of nodes; METIS may leave a part empty when parts are few nodes each.
    K-way partitioning, with recursive bisection where k-way fails. ``cache``: read and
    keep the partition in the structure cache, keyed by the pattern's hash, parts and
    seed (:func:`plexus_tune.graph.cache.partition_file`; a corrupt entry is ignored with
    one warning and rewritten).
    """
    parts = int(parts)
    n = int(adjacency.shape[0])
    if parts < 1 or parts > n:
        raise UserError(f"cannot cut a graph of {n} nodes into {parts} parts; choose 1 to {n} parts")
    if parts == 1:
        return np.zeros(n, dtype=np.int64)
    import scipy.sparse as sp

    csr = sp.csr_matrix(adjacency)
    # explicit zeros leave the partitioned pattern but not the hashed one: such a graph is not cached
    cacheable = cache and np.count_nonzero(csr.data) == csr.data.size
    path = partition_file(pattern_hash(csr), parts, seed) if cacheable else None
    if path is not None:
        known = read_partition(path, n, parts)
        if known is not None:
            return known
    out = _metis(csr, parts, seed)
    if path is not None:
        store_partition(path, out)
    return out


def _metis(adjacency, parts: int, seed: int) -> np.ndarray:
    """METIS k-way (recursive bisection where k-way fails) of the symmetrized off-diagonal pattern."""
    import pymetis

    pattern = _pattern(adjacency)
    n = pattern.shape[0]
    sym = (pattern + pattern.T).tocsr()
    sym.sum_duplicates()
    options = pymetis.Options(seed=int(seed))
    graph = pymetis.CSRAdjacency(adj_starts=sym.indptr.astype(np.int64), adjacent=sym.indices.astype(np.int64))
    try:
        _, membership = pymetis.part_graph(parts, adjacency=graph, options=options)
    except RuntimeError:  # METIS k-way gives up on some inputs; recursive bisection is the fallback
        try:
            _, membership = pymetis.part_graph(parts, adjacency=graph, options=options, recursive=True)
        except RuntimeError as exc:
            raise UserError(f"METIS could not cut the graph of {n} nodes into {parts} parts ({exc}); "
                            "try fewer parts") from None
    out = np.asarray(membership, dtype=np.int64)
    if out.shape != (n,) or out.min() < 0 or out.max() >= parts:
        raise RuntimeError("METIS returned an invalid partition")
    return out


def minimum_vertex_cover(biadjacency) -> tuple[np.ndarray, np.ndarray]:
    """A minimum vertex cover of a bipartite graph given by its (L x R) biadjacency.

    König's construction: a maximum matching (scipy's Hopcroft-Karp), Z the vertices
    reachable from unmatched left vertices by alternating paths; the cover is
    (L minus Z) plus (R within Z). Returns boolean masks (left, right); their total count
    equals the matching size.
    """
    import scipy.sparse as sp
    from scipy.sparse.csgraph import maximum_bipartite_matching

    b = sp.csr_matrix(biadjacency, dtype=np.int8)
    n_left, n_right = b.shape
    if b.nnz == 0:
        return np.zeros(n_left, dtype=bool), np.zeros(n_right, dtype=bool)
    match_left = maximum_bipartite_matching(b, perm_type="column")  # right partner of each left vertex
    match_right = np.full(n_right, -1, dtype=np.int64)
    matched = match_left >= 0
    match_right[match_left[matched]] = np.nonzero(matched)[0]
    seen_left = ~matched
    seen_right = np.zeros(n_right, dtype=bool)
    frontier = seen_left.copy()
    bt = b.T.tocsr()
    while frontier.any():
        reach = np.asarray(bt @ frontier.astype(np.int8)).ravel() > 0
        new_right = reach & ~seen_right
        if not new_right.any():
            break
        seen_right |= new_right
        partners = match_right[new_right]
        partners = partners[partners >= 0]
        frontier = np.zeros(n_left, dtype=bool)
        frontier[partners] = True
        frontier &= ~seen_left
        seen_left |= frontier
    return ~seen_left, seen_right


@dataclass(frozen=True)
class ExchangePlan:
    """The boundary exchange of a partition (module docstring).

    ``part``: part of every node; ``src``, ``dst``: the cut edges u -> v (A[v, u] != 0,
    parts differ); ``rows[mode]``: (P, P) rows part p sends part q in the forward
    aggregation; ``post_edge``: for hybrid, True where the edge's source is sent as it
    is (in the cover), False where the edge is summed at p into v's partial row.
    ``local_nnz``: nonzeros of A + I in the rows of each part (self-loops included);
    ``nodes``: nodes per part.
    """

    parts: int
    part: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    rows: dict
    post_edge: np.ndarray
    local_nnz: np.ndarray
    nodes: np.ndarray

    def forward_rows(self, mode: str) -> np.ndarray:
        """(P, P) rows p sends q in a forward aggregation under ``mode``."""
        return self.rows[check_aggregation(mode)]

    def sent_rows(self, mode: str) -> tuple[np.ndarray, np.ndarray]:
        """Rows each rank sends per aggregation: (forward, backward), arrays of P."""
        rows = self.forward_rows(mode)
        return rows.sum(axis=1), rows.sum(axis=0)

    def total_rows(self, mode: str) -> int:
        return int(self.forward_rows(mode).sum())

    def spmm_parts(self, mode: str) -> dict[str, np.ndarray]:
        """The local SpMM operands of each part in a forward aggregation under ``mode``
        (the partitioned trainer's matrices, docs/model.md "SuperGCN"):

        - ``local_nnz`` (P,): A + I restricted to the part's rows and columns;
        - ``pre_edges``, ``pre_rows`` (P, P): cut edges p -> q summed at p, and the partial
          rows they make (p's pre-aggregation matrix: pre_rows x n_p, pre_edges nonzeros);
        - ``post_edges``, ``post_rows`` (P, P): cut edges p -> q whose source row p sends as
          it is, and those rows; q's scatter of p's message is n_q x (post_rows + pre_rows)
          with post_edges + pre_rows nonzeros.
        """
        mode = check_aggregation(mode)
        post = {"post": np.ones(self.src.size, dtype=bool), "pre": np.zeros(self.src.size, dtype=bool),
                "hybrid": self.post_edge}[mode]
        p, q = self.part[self.src], self.part[self.dst]
        edges = np.zeros((2, self.parts, self.parts), dtype=np.int64)
        np.add.at(edges, (post.astype(np.int64), p, q), 1)
        cut_in = np.bincount(q, minlength=self.parts)
        return {"local_nnz": self.local_nnz - cut_in,
                "pre_edges": edges[0], "pre_rows": _pair_counts(self.parts, p[~post], q[~post], self.dst[~post]),
                "post_edges": edges[1], "post_rows": _pair_counts(self.parts, p[post], q[post], self.src[post])}


def _pair_counts(parts: int, p: np.ndarray, q: np.ndarray, node: np.ndarray) -> np.ndarray:
    """(P, P) count of distinct nodes per ordered pair."""
    counts = np.zeros((parts, parts), dtype=np.int64)
    if node.size == 0:
        return counts
    keys = np.unique((p * parts + q) * (int(node.max()) + 1) + node)
    pair = keys // (int(node.max()) + 1)
    np.add.at(counts, (pair // parts, pair % parts), 1)
    return counts


def exchange_plan(adjacency, part, parts: int | None = None) -> ExchangePlan:
    """The :class:`ExchangePlan` of the nonzero pattern of ``adjacency`` (row v: in-neighbours of v)
    under the node-to-part map ``part`` into ``parts`` parts (default: the largest part + 1;
    give it when a part may be empty)."""
    import scipy.sparse as sp
    csr = sp.csr_matrix(adjacency)
    n = csr.shape[0]
    part = np.asarray(part, dtype=np.int64)
    if part.shape != (n,):
        raise UserError(f"a partition must give a part for each of the {n} nodes, got shape {part.shape}")
    if n and part.min() < 0:
        raise UserError("parts must be non-negative")
    used = int(part.max()) + 1 if n else 1
    if parts is None:
        parts = used
    elif used > int(parts):
        raise UserError(f"the partition names part {used - 1} but has only {parts} parts")
    parts = int(parts)
    coo = csr.tocoo()
    nonzero = coo.data != 0
    dst_all, src_all = coo.row[nonzero].astype(np.int64), coo.col[nonzero].astype(np.int64)
    cut = part[src_all] != part[dst_all]
    src, dst = src_all[cut], dst_all[cut]
    order = np.lexsort((src, dst, part[dst], part[src]))
    src, dst = src[order], dst[order]
    p, q = part[src], part[dst]
    post = _pair_counts(parts, p, q, src)
    pre = _pair_counts(parts, p, q, dst)
    # one bipartite graph for all pairs: left (u, q), right (v, p); its components stay within a pair
    left_keys, left = np.unique(src * parts + q, return_inverse=True)
    right_keys, right = np.unique(dst * parts + p, return_inverse=True)
    b = sp.csr_matrix((np.ones(src.size, dtype=np.int8), (left, right)), shape=(left_keys.size, right_keys.size))
    b.sum_duplicates()
    cover_left, cover_right = minimum_vertex_cover(b)
    hybrid = np.zeros((parts, parts), dtype=np.int64)
    lu, lq = left_keys // parts, left_keys % parts
    np.add.at(hybrid, (part[lu[cover_left]], lq[cover_left]), 1)
    rv, rp = right_keys // parts, right_keys % parts
    np.add.at(hybrid, (rp[cover_right], part[rv[cover_right]]), 1)
    post_edge = cover_left[left] if src.size else np.zeros(0, dtype=bool)
    # local SpMM rows: A + I restricted to each part's rows (self-loops added where missing)
    diag_missing = np.ones(n, dtype=np.int64)
    loops = src_all == dst_all
    diag_missing[dst_all[loops]] = 0
    row_nnz = np.bincount(dst_all, minlength=n) + diag_missing
    local_nnz = np.bincount(part, weights=row_nnz, minlength=parts).astype(np.int64)
    nodes = np.bincount(part, minlength=parts).astype(np.int64)
    return ExchangePlan(parts=parts, part=part, src=src, dst=dst,
                        rows={"pre": pre, "post": post, "hybrid": hybrid}, post_edge=np.asarray(post_edge, dtype=bool),
                        local_nnz=local_nnz, nodes=nodes)


def partition_exchange(adjacency, parts: int, *, seed: int = 0) -> ExchangePlan:
    """:func:`exchange_plan` of the METIS partition of ``adjacency`` into ``parts`` parts."""
    return exchange_plan(adjacency, partition_graph(adjacency, parts, seed=seed), parts)


def split3d_positions(n_pad: int, pr: int, pl: int) -> np.ndarray:
    """Inner (column) position of every padded node in split-3D SUMMA on Pr x Pc x Pl ranks.

    Output rows keep the node order: rank (i, j, k) ends a layer with the rows
    [i rb + k rf, i rb + (k+1) rf) (rb = N'/Pr, rf = rb/Pl). It starts the next layer
    owning the inner positions [k N'/Pl + i rf, k N'/Pl + (i+1) rf) of mesh layer k's
    slab, so node i rb + k rf + t sits at position k N'/Pl + i rf + t and the
    layer's output is the next layer's input without communication (docs/algorithms.md).
    """
    n_pad, pr, pl = int(n_pad), int(pr), int(pl)
    rb = n_pad // pr
    rf = rb // pl
    v = np.arange(n_pad, dtype=np.int64)
    i, k, t = v // rb, (v % rb) // rf, v % rf
    return k * (n_pad // pl) + i * rf + t


class PiecePattern:
    """The nonzero pattern of A + I (what GCN normalization stores), kept to count the
    SUMMA pieces of many grids (:meth:`pieces`) without rebuilding it."""

    def __init__(self, adjacency):
        coo = with_self_loops_pattern(adjacency).tocoo()
        self.nodes = int(coo.shape[0])
        self.rows = coo.row.astype(np.int64)
        self.cols = coo.col.astype(np.int64)

    def pieces(self, pr: int, pc: int, pl: int = 1, *, transpose: bool = False) -> np.ndarray:
        """Nonzeros in every SUMMA piece, shape (Pl, Pr, q) (:func:`summa_piece_nnz`)."""
        pr, pc, pl = int(pr), int(pc), int(pl)
        q = math.lcm(pr, pc)
        n_pad = pl * q * -(-self.nodes // (pl * q))
        rb, piece = n_pad // pr, n_pad // (pl * q)
        rows, cols = (self.cols, self.rows) if transpose else (self.rows, self.cols)
        if pl > 1:
            cols = split3d_positions(n_pad, pr, pl)[cols]
        counts = np.bincount((rows // rb) * (pl * q) + cols // piece, minlength=pr * pl * q)
        return counts.reshape(pr, pl, q).transpose(1, 0, 2).copy()


def summa_piece_nnz(adjacency, pr: int, pc: int, pl: int = 1, *, transpose: bool = False) -> np.ndarray:
    """Nonzeros of A + I (or its transpose) in every SUMMA piece, shape (Pl, Pr, q).

    q = lcm(Pr, Pc), N' = Pl q ceil(N / (Pl q)): block row i holds rows [i N'/Pr, (i+1) N'/Pr),
    piece s of mesh layer k the columns [(k q + s) p, (k q + s + 1) p) with p = N' / (Pl q)
    (:func:`plexus_tune.model.volumes.summa_sizes`); rows and columns past N are padding.
    For Pl >= 2 the columns are in split-3D order (:func:`split3d_positions`).
    ``adjacency`` may be a :class:`PiecePattern`.
    """
    pattern = adjacency if isinstance(adjacency, PiecePattern) else PiecePattern(adjacency)
    return pattern.pieces(pr, pc, pl, transpose=transpose)


#: SuperGCN's Table 5 (ogb-lsc-mag240M, 2048 processes, one GCN layer): communication
#: volume in GB of pre, post and hybrid (pre-post) aggregation.
PUBLISHED_TABLE5_GB = {"pre": 1934.8559, "post": 1934.8559, "hybrid": 1269.5784}


def exchange_summary(plan: ExchangePlan, width: int = 1, bytes_per_element: int = 4) -> dict:
    """Totals of a plan: cut edges, rows per mode (all pairs), bytes of one forward
    aggregation of ``width`` columns, the busiest sender's rows, and pre/hybrid, post/hybrid."""
    out = {"parts": plan.parts, "cut_edges": int(plan.src.size)}
    for mode in AGGREGATION_MODES:
        rows = plan.forward_rows(mode)
        out[f"{mode}_rows"] = int(rows.sum())
        out[f"{mode}_bytes"] = int(rows.sum()) * int(width) * int(bytes_per_element)
        out[f"{mode}_max_rank_rows"] = int(rows.sum(axis=1).max()) if plan.parts > 1 else 0
    hybrid = out["hybrid_rows"]
    out["pre_over_hybrid"] = out["pre_rows"] / hybrid if hybrid else float("nan")
    out["post_over_hybrid"] = out["post_rows"] / hybrid if hybrid else float("nan")
    return out
