"""Checks of a graph's contents, one home for every reader (docs/cli.md, "Graphs").

Every array a reader returns is checked here before any rank starts: dtype, range,
finiteness, and shapes agreeing with the node count and the metadata. A refusal is one
:class:`~plexus_tune.errors.UserError` naming the file and the first bad entry.

Arrays are read in chunks of :data:`CHUNK` entries, so a memory-mapped graph is checked
with bounded memory (one pass over each array; `benchmarks` of the readers time it).

- :func:`check_ids`: node ids of an edge list or ``edge_index`` (whole, not negative, below N);
- :func:`check_csr`: ``indptr``/``indices``/``data`` of an adjacency;
- :func:`check_features`: (N, F) with F >= 1, finite;
- :func:`check_labels`: one class per node in [-1, C), C >= 1, at least one labelled node;
- :func:`check_permutation`: a permutation of 0..N-1;
- :func:`check_graph`: all of them on a :class:`~plexus_tune.graph.core.Graph`.
"""

from __future__ import annotations

import numpy as np

from plexus_tune.errors import UserError

#: entries read at a time
CHUNK = 1 << 22


def _chunks(size: int, chunk: int = CHUNK):
    for start in range(0, int(size), chunk):
        yield start, min(start + chunk, int(size))


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(np.ravel(mask))[0])


def _numeric(arr, where: str, what: str) -> None:
    kind = np.asarray(arr[:0]).dtype.kind if hasattr(arr, "dtype") else "O"
    if kind not in "biuf":
        raise UserError(f"{where}: {what} must be numbers, got dtype {getattr(arr, 'dtype', type(arr).__name__)}")


def check_ids(values, num_nodes: int, where: str, what: str = "node id") -> None:
    """UserError unless every entry of ``values`` is a whole number in ``[0, num_nodes)``."""
    values = np.asarray(values) if not hasattr(values, "dtype") else values
    _numeric(values, where, f"{what}s")
    flat = values.reshape(-1)
    whole = flat.dtype.kind in "biu"
    for lo, hi in _chunks(flat.size):
        part = flat[lo:hi]
        if whole and part.size and part.min() >= 0 and part.max() < num_nodes:
            continue
        if not whole:
            bad = ~np.isfinite(part) | (part != np.floor(part))
            if bad.any():
                i = lo + _first(bad)
                raise UserError(f"{where}: {what} {flat[i].item()!r} at entry {i} is not a whole number; node ids are 0..N-1")
        bad = (part < 0) | (part >= num_nodes)
        if bad.any():
            i = lo + _first(bad)
            raise UserError(f"{where}: {what} {flat[i]:.0f} at entry {i} is out of range for {num_nodes:,} nodes "
                            f"(ids must be 0..{num_nodes - 1})")


def check_finite(values, where: str, what: str) -> None:
    """UserError at the first NaN or infinite entry of ``values`` (any shape; rows for 2-D)."""
    _numeric(values, where, what)
    if values.dtype.kind != "f":
        return
    rows = values.shape[0] if values.ndim else 1
    step = max(1, CHUNK // max(1, int(np.prod(values.shape[1:])) if values.ndim > 1 else 1))
    for lo, hi in _chunks(rows, step):
        bad = ~np.isfinite(values[lo:hi])
        if bad.any():
            if values.ndim > 1:
                row = lo + _first(bad.reshape(bad.shape[0], -1).any(axis=1))
                raise UserError(f"{where}: {what} of node {row} (and {int(bad.sum()) - 1} more values) are NaN or "
                                f"infinite; clean them (training on them gives a NaN loss)")
            i = lo + _first(bad)
            raise UserError(f"{where}: {what} {values[i].item()!r} at entry {i} is NaN or infinite; give finite values")


def check_csr(indptr, indices, data, num_nodes: int, *, where: str, num_cols: int | None = None,
              files: dict | None = None, values: bool = True, ids: bool = True) -> None:
    """UserError unless ``indptr`` (N+1, from 0, not decreasing, ending at nnz), ``indices`` (whole,
    in [0, columns)) and ``data`` (finite, nnz entries) form a CSR matrix of ``num_nodes`` rows
    (``values=False``: data's entries are not read, for a caller of the pattern alone;
    ``ids=False``: nor the indices, for a caller that checks the entries it samples)."""
    files = files or {}
    cols = num_nodes if num_cols is None else num_cols
    w_ptr, w_idx, w_dat = (files.get(k, where) for k in ("indptr", "indices", "data"))
    _numeric(indptr, w_ptr, "indptr")
    if indptr.ndim != 1 or indptr.shape[0] != num_nodes + 1:
        raise UserError(f"{w_ptr}: indptr has shape {tuple(indptr.shape)}, {num_nodes + 1} entries expected "
                        f"for {num_nodes:,} rows")
    if indices.ndim != 1 or data.ndim != 1 or indices.shape[0] != data.shape[0]:
        raise UserError(f"{where}: indices {tuple(indices.shape)} and data {tuple(data.shape)} must be two arrays "
                        "of one entry per nonzero")
    if indptr[0] != 0 or indptr[-1] != indices.shape[0]:
        raise UserError(f"{w_ptr}: indptr runs from {indptr[0]} to {indptr[-1]}, 0 to {indices.shape[0]:,} "
                        "(the nonzeros) expected")
    for lo, hi in _chunks(indptr.shape[0] - 1):
        step = np.diff(np.asarray(indptr[lo:hi + 1]))
        if (step < 0).any():
            i = lo + _first(step < 0)
            raise UserError(f"{w_ptr}: indptr decreases at row {i} ({indptr[i]} -> {indptr[i + 1]}); "
                            "it must not decrease")
    if ids:
        check_ids(indices, cols, w_idx, "column index")
    if values:
        check_finite(data, w_dat, "edge weight")


def check_features(features, num_nodes: int, where: str) -> None:
    """UserError unless ``features`` is (N, F) with F >= 1 and every value finite."""
    _numeric(features, where, "features")
    if features.ndim != 2 or features.shape[0] != num_nodes:
        raise UserError(f"{where}: features have shape {tuple(features.shape)}, ({num_nodes:,}, F) expected")
    if features.shape[1] < 1:
        raise UserError(f"{where}: features have width 0; give at least one feature per node "
                        "(or make random ones of a chosen width with plexus-tune graph convert)")
    check_finite(features, where, "features")


def check_labels(labels, num_nodes: int, num_classes, where: str) -> None:
    """UserError unless ``num_classes`` >= 1, ``labels`` holds one whole class per node in
    [-1, num_classes) (-1: unlabelled), and at least one node is labelled."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
        raise UserError(f"{where}: the class count must be a whole number >= 1, got {num_classes!r}")
    _numeric(labels, where, "labels")
    if labels.shape != (num_nodes,):
        raise UserError(f"{where}: labels have shape {tuple(labels.shape)}, one per node ({num_nodes:,}) expected")
    whole = labels.dtype.kind in "biu"
    labelled = False
    for lo, hi in _chunks(num_nodes):
        part = labels[lo:hi]
        if not whole:
            bad = ~np.isfinite(part) | (part != np.floor(part))
            if bad.any():
                i = lo + _first(bad)
                raise UserError(f"{where}: label {labels[i].item()!r} of node {i} is not a whole number")
        bad = (part < -1) | (part >= num_classes)
        if bad.any():
            i = lo + _first(bad)
            raise UserError(f"{where}: label {labels[i]:.0f} of node {i} is outside 0..{num_classes - 1} "
                            f"({num_classes} classes; -1 marks an unlabelled node)")
        labelled = labelled or bool((part >= 0).any())
    if not labelled:
        raise UserError(f"{where}: no node is labelled (every label is -1); label at least one node")


def check_permutation(perm, num_nodes: int, where: str) -> None:
    """UserError unless ``perm`` holds each of 0..N-1 exactly once."""
    if perm.ndim != 1 or perm.shape[0] != num_nodes:
        raise UserError(f"{where}: shape {tuple(perm.shape)}, a permutation of {num_nodes:,} nodes expected; "
                        "re-create the shards")
    check_ids(perm, num_nodes, where, "permutation entry")
    seen = np.zeros(num_nodes, dtype=bool)
    for lo, hi in _chunks(num_nodes):
        part = np.asarray(perm[lo:hi], dtype=np.int64)
        order = np.argsort(part, kind="stable")
        repeats = order[1:][part[order][1:] == part[order][:-1]]  # later occurrences inside the chunk
        earlier = np.flatnonzero(seen[part])
        if repeats.size or earlier.size:
            i = lo + int(min(repeats.min() if repeats.size else hi, earlier[0] if earlier.size else hi))
            raise UserError(f"{where}: entry {i} repeats node {int(perm[i])}; not a permutation, re-create the shards")
        seen[part] = True


def check_graph(graph, where: str, *, files: dict | None = None) -> None:
    """Every array of ``graph`` (:func:`check_csr`, :func:`check_features`, :func:`check_labels`);
    ``files`` names the file of an array (``indptr``, ``indices``, ``data``, ``features``,
    ``labels``) where it has one, else ``where`` is named."""
    files = files or {}
    adj = graph.adjacency
    n = int(adj.shape[0])
    if n < 1:
        raise UserError(f"{where}: the graph has no nodes (empty input?)")
    check_csr(adj.indptr, adj.indices, adj.data, n, where=where, files=files)
    check_features(graph.features, n, files.get("features", where))
    check_labels(graph.labels, n, graph.num_classes, files.get("labels", where))
