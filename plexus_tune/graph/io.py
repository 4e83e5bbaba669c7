"""Loading and saving graphs in the formats people have, plus the project's own format.

Formats (chosen by :func:`detect_format` from the path):

| format | path | content |
|---|---|---|
| ``plexus`` | directory with ``metadata.json`` | own format: ``indptr.npy``, ``indices.npy``, ``data.npy``, ``features.npy``, ``labels.npy``; loaded memory-mapped |
| ``npz`` | ``*.npz`` | either ``scipy.sparse.save_npz`` output (adjacency only) or arrays ``edge_index`` (2, E) or ``indptr``/``indices``[/``data``], optional ``weights``, ``features``, ``labels``, ``num_nodes``, ``num_classes`` |
| ``mtx`` | ``*.mtx``, ``*.mtx.gz`` | Matrix Market (adjacency only) |
| ``edgelist`` | ``*.txt``, ``*.csv``, ``*.tsv``, ``*.edges``, ``*.el`` (+ ``.gz``) | one edge ``src dst [weight]`` per line, whitespace or comma separated, ``#``/``%`` comments, optional header line |
| ``ogb`` | directory with ``raw/edge.csv.gz`` (or that ``raw`` directory) | OGB node-property layout: ``edge.csv.gz``, ``num-node-list.csv.gz``, optional ``node-feat.csv.gz``, ``node-label.csv.gz``, ``edge-feat``-free |
| ``pyg`` | ``*.pt``, ``*.pth`` | a ``torch_geometric.data.Data`` (or dict) saved with ``torch.save`` |

Orientation: an edge ``u -> v`` (edge lists, OGB, ``edge_index``, PyG) is the entry
``A[v, u]`` (row = target). Matrices (scipy ``.npz``, ``.mtx``, CSR arrays) are taken as
they are: row i aggregates from the columns of row i. Edge lists and OGB edges are
treated as undirected unless ``directed=True`` (each pair once, mirrored, duplicates
dropped); PyG ``Data`` and ``edge_index`` arrays keep their direction, as PyG does.

Matrix-only formats carry no features or labels: random features of width
``features`` and degree-derived labels of ``classes`` classes are made (seeded).

PyG files are read with ``torch.load(weights_only=False)``, which can run code stored
in the file: load only ``.pt`` files you trust. Every other format is plain data.
"""

from __future__ import annotations

import gzip
import json
import zipfile
import zlib
from pathlib import Path

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.jsonfile import read_json
from plexus_tune.graph import checks
from plexus_tune.graph.cache import known_valid, remember_valid
from plexus_tune.graph.atomic import atomic_directory, atomic_file
from plexus_tune.graph.core import Graph, as_csr, edge_index_to_adjacency, is_symmetric
from plexus_tune.graph.generators import DEFAULT_CLASSES, DEFAULT_FEATURES, degree_labels, random_features, synthetic

FORMATS = ("plexus", "npz", "mtx", "edgelist", "ogb", "pyg")
PLEXUS_FORMAT = "plexus-graph"
PLEXUS_VERSION = 1
_EDGELIST_SUFFIXES = (".txt", ".csv", ".tsv", ".edges", ".el")
_ARRAY = {"type": "object", "required": ["shape", "dtype"],
          "properties": {"shape": {"type": "array", "items": {"type": "integer", "minimum": 0}, "maxItems": 2},
                         "dtype": {"type": "string"}}}
#: schema of a plexus graph's metadata.json (plexus_tune.jsonfile)
METADATA_SCHEMA = {
    "type": "object",
    "required": ["format", "version", "num_nodes", "num_classes", "arrays"],
    "properties": {
        "format": {"type": "string"}, "version": {"type": "integer"}, "name": {"type": "string"},
        "num_nodes": {"type": "integer", "minimum": 1}, "nnz": {"type": "integer", "minimum": 0},
        "num_features": {"type": "integer", "minimum": 1}, "num_classes": {"type": "integer", "minimum": 1},
        "symmetric": {"type": "boolean"}, "meta": {"type": "object"},
        "arrays": {"type": "object", "required": ["indptr", "indices", "data", "features", "labels"],
                   "properties": {k: _ARRAY for k in ("indptr", "indices", "data", "features", "labels")}},
    },
}
_READ_ERRORS = (OSError, ValueError, EOFError, KeyError, IndexError, TypeError, zlib.error,
                zipfile.BadZipFile, json.JSONDecodeError, UnicodeDecodeError)


def _bare_suffix(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return suffixes[-1] if suffixes else ""


def detect_format(path) -> str:
    """The format name of ``path`` (see the module table); UserError when unknown."""
    path = Path(path)
    if path.is_dir():
        if (path / "metadata.json").is_file():
            return "plexus"
        if (path / "raw" / "edge.csv.gz").is_file() or (path / "edge.csv.gz").is_file():
            return "ogb"
        if (path / "manifest.json").is_file():
            raise UserError(f"{path} is a shard directory; load one rank's block with load_shard, "
                            "or convert the original graph instead")
        raise UserError(f"{path} is a directory but neither a plexus graph (metadata.json) nor an "
                        "OGB dataset (raw/edge.csv.gz)")
    fmt = _file_format_of_suffix(_bare_suffix(path))
    if fmt is not None:
        return fmt
    raise UserError(f"unknown graph format for {path.name!r}; known: directory (plexus, OGB), "
                    ".npz, .mtx, .txt/.csv/.tsv/.edges/.el edge lists, .pt/.pth (PyG Data)")


# --- helpers -----------------------------------------------------------------------

def _undirected(src: np.ndarray, dst: np.ndarray, weights, num_nodes: int) -> sp.csr_matrix:
    """Each unordered pair once (first occurrence's weight), mirrored; self-loops once."""
    import scipy.sparse as sp
    lo = np.minimum(src, dst)
    hi = np.maximum(src, dst)
    keys = lo * num_nodes + hi
    _, first = _first_index(keys)
    lo, hi = lo[first], hi[first]
    w = np.ones(first.size, dtype=np.float32) if weights is None else np.asarray(weights, np.float32)[first]
    off = lo != hi
    rows = np.concatenate([lo, hi[off]])
    cols = np.concatenate([hi, lo[off]])
    data = np.concatenate([w, w[off]])
    adj = sp.coo_matrix((data, (rows, cols)), shape=(num_nodes, num_nodes)).tocsr()
    adj.sum_duplicates()
    return adj


def _first_index(keys: np.ndarray):
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    keep = np.empty(keys.size, dtype=bool)
    keep[:1] = True
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=keep[1:])
    return sorted_keys[keep], order[keep]


def _edges_to_adjacency(src, dst, weights, num_nodes: int, directed: bool, where: str) -> sp.csr_matrix:
    checks.check_ids(np.asarray(src), num_nodes, where, "edge source")
    checks.check_ids(np.asarray(dst), num_nodes, where, "edge target")
    if weights is not None:
        weights = np.asarray(weights)
        if weights.shape != np.shape(src):
            raise UserError(f"{where}: {weights.shape} edge weights for {np.shape(src)[0]:,} edges")
        checks.check_finite(weights, where, "edge weight")
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if directed:
        return edge_index_to_adjacency(np.vstack([src, dst]), num_nodes, weights)
    return _undirected(src, dst, weights, num_nodes)


def check_finite_features(features, name: str) -> None:
    """UserError if any feature is NaN or infinite (:func:`plexus_tune.graph.checks.check_finite`)."""
    checks.check_finite(features, name, "features")


def _finish(adj, features, labels, num_classes, name, meta, *, features_width, classes, seed) -> Graph:
    adj = as_csr(adj)
    n = adj.shape[0]
    where = str(meta.get("source", name))  # the file a refusal names
    if n == 0:
        raise UserError(f"{where}: the graph has no nodes (empty input?)")
    meta = dict(meta)
    if features is None:
        features = random_features(n, features_width or DEFAULT_FEATURES, seed)
        meta["features"] = f"random normal, width {features.shape[1]}, seed {seed}"
    else:
        features = np.asarray(features)
        if features.ndim == 1:
            features = features[:, None]
        if features.shape[0] != n:
            raise UserError(f"{where}: {features.shape[0]} feature rows for {n} nodes")
        checks.check_features(features, n, where)
        if features.dtype != np.float32:
            features = features.astype(np.float32)
    if labels is None:
        num_classes = classes or DEFAULT_CLASSES
        if classes is not None and classes > n:
            raise UserError(f"{where}: {classes} classes for {n} nodes: some classes would have no node; use at most {n}")
        labels = degree_labels(adj, num_classes, seed)
        meta["labels"] = f"degree classes, {num_classes}, seed {seed}"
    else:
        labels = np.asarray(labels)
        if labels.ndim == 2 and labels.shape[1] == 1:
            labels = labels[:, 0]
        if labels.ndim != 1:
            raise UserError(f"{where}: labels must be one class per node, got shape {labels.shape}")
        if labels.shape[0] != n:
            raise UserError(f"{where}: {labels.shape[0]} labels for {n} nodes")
        if labels.dtype.kind == "f":
            labels = np.where(np.isnan(labels), -1, labels)  # NaN: unlabelled
        if num_classes is None:
            top = labels.max()
            num_classes = int(top) + 1 if np.isfinite(top) and top >= 0 else 1
        checks.check_labels(labels, n, num_classes, where)
        labels = labels.astype(np.int64)
    graph = Graph(adj, features, labels, int(num_classes), name=name, meta=meta)
    checks.check_graph(graph, where)
    meta.setdefault("symmetric", bool(is_symmetric(adj)))
    return graph


# --- readers -----------------------------------------------------------------------

def _read_plexus(path: Path, mmap: bool = True, pattern_only: bool | str = False, **_) -> Graph:
    import scipy.sparse as sp
    info = read_json(path / "metadata.json", METADATA_SCHEMA, fix="the graph is corrupt: convert it again")
    if info["format"] != PLEXUS_FORMAT:
        raise UserError(f"{path}/metadata.json is not a plexus graph (format {info['format']!r})")
    if info["version"] != PLEXUS_VERSION:
        raise UserError(f"{path}: plexus graph version {info['version']} is not supported "
                        f"(this plexus-tune reads {PLEXUS_VERSION})")
    mode = "r" if mmap else None
    arrays = {}
    for key in ("indptr", "indices", "data", "features", "labels"):
        spec = info["arrays"][key]
        file = path / f"{key}.npy"
        if not file.is_file():
            raise UserError(f"{path}: missing {file.name}; the graph is incomplete")
        try:
            arr = np.load(file, mmap_mode=mode, allow_pickle=False)
        except ValueError as exc:
            raise UserError(f"{file}: truncated or corrupt ({exc})") from None
        if list(arr.shape) != spec["shape"] or str(arr.dtype) != spec["dtype"]:
            raise UserError(f"{file}: shape {arr.shape} {arr.dtype} does not match metadata "
                            f"{tuple(spec['shape'])} {spec['dtype']}; the graph is corrupt")
        arrays[key] = arr
    n = int(info["num_nodes"])
    files = {key: str(path / f"{key}.npy") for key in arrays}
    read = [path / "metadata.json", *files.values()]
    pattern = [path / "metadata.json", path / "indptr.npy", path / "indices.npy"]
    if pattern_only == "rows":  # indptr alone: the caller checks the indices it samples
        if known_valid(read) is None and known_valid(pattern) is None:
            checks.check_csr(arrays["indptr"], arrays["indices"], arrays["data"], n, where=str(path), files=files,
                             values=False, ids=False)
    elif pattern_only:  # the pattern's arrays alone (their shapes and dtypes checked above)
        if known_valid(read) is None and known_valid(pattern) is None:
            checks.check_csr(arrays["indptr"], arrays["indices"], arrays["data"], n, where=str(path), files=files,
                             values=False)
            remember_valid(pattern)
    elif known_valid(read) is None:  # files changed since they last passed: check them (graph/cache)
        checks.check_csr(arrays["indptr"], arrays["indices"], arrays["data"], n, where=str(path), files=files)
        checks.check_features(arrays["features"], n, files["features"])
        checks.check_labels(arrays["labels"], n, int(info["num_classes"]), files["labels"])
        remember_valid(read)
    adj = sp.csr_matrix((arrays["data"], arrays["indices"], arrays["indptr"]), shape=(n, n), copy=False)
    adj.has_sorted_indices = True
    meta = dict(info.get("meta", {}))
    meta["symmetric"] = bool(info.get("symmetric", False))
    meta["source"] = str(path)
    return Graph(adj, arrays["features"], arrays["labels"], int(info["num_classes"]),
                 name=info.get("name", path.stem), meta=meta)


def _read_npz(path: Path, *, directed: bool, **opts) -> Graph:
    import scipy.sparse as sp
    if not zipfile.is_zipfile(path):
        raise UserError(f"{path} is not an .npz (zip) archive; is the file truncated or corrupt?")
    with np.load(path, allow_pickle=False) as z:
        keys = set(z.files)
        name = path.name.removesuffix(".npz")
        if "format" in keys and "shape" in keys:  # scipy.sparse.save_npz
            adj = sp.load_npz(path)
            if adj.shape[0] != adj.shape[1]:
                raise UserError(f"{path}: adjacency must be square, got {adj.shape[0]} x {adj.shape[1]}")
            return _finish(adj, None, None, None, name, {"source": str(path), "format": "scipy-npz"}, **opts)
        features = z["features"] if "features" in keys else None
        labels = z["labels"] if "labels" in keys else None
        num_classes = int(z["num_classes"]) if "num_classes" in keys else None
        if "num_nodes" in keys:
            n = int(z["num_nodes"])
        elif features is not None:
            n = features.shape[0]
        elif labels is not None:
            n = labels.shape[0]
        else:
            n = None
        if "edge_index" in keys:
            ei = z["edge_index"]
            if ei.ndim != 2 or ei.shape[0] != 2:
                raise UserError(f"{path}: edge_index must have shape (2, E), got {ei.shape}")
            if n is None:
                n = int(ei.max()) + 1 if ei.size else 0
            w = z["weights"] if "weights" in keys else None
            adj = _edges_to_adjacency(ei[0], ei[1], w, n, True, str(path))
        elif "indptr" in keys and "indices" in keys:
            indptr, indices = z["indptr"], z["indices"]
            n = indptr.shape[0] - 1 if n is None else n
            data = z["data"] if "data" in keys else np.ones(indices.shape[0], dtype=np.float32)
            checks.check_csr(indptr, indices, data, n, where=str(path))
            adj = sp.csr_matrix((data, indices, indptr), shape=(n, n))
        else:
            raise UserError(f"{path}: an .npz graph needs scipy save_npz arrays, edge_index, or "
                            f"indptr+indices; found {', '.join(sorted(keys)) or 'nothing'}")
        if features is None and opts.get("features_width") is None:
            raise UserError(f"{path} has no 'features' array: add one, or make random ones of a chosen width "
                            f"with plexus-tune graph convert")
        return _finish(adj, features, labels, num_classes, name, {"source": str(path), "format": "npz"}, **opts)


def _read_mtx(path: Path, **opts) -> Graph:
    import scipy.sparse as sp
    import scipy.io

    opts.pop("directed", None)
    matrix = scipy.io.mmread(str(path))
    if not sp.issparse(matrix):
        matrix = sp.csr_matrix(matrix)
    if matrix.shape[0] != matrix.shape[1]:
        raise UserError(f"{path}: adjacency must be square, got {matrix.shape[0]} x {matrix.shape[1]}")
    name = path.name.split(".mtx")[0]
    return _finish(matrix, None, None, None, name, {"source": str(path), "format": "mtx"}, **opts)


def _edgelist_layout(path: Path):
    """(rows to skip, has header, comment char, separator) from the first lines."""
    opener = gzip.open if path.suffix.lower() == ".gz" else open
    skip = 0
    comment = "#"
    with opener(path, "rt") as fh:
        for line in fh:
            stripped = line.strip()
            if not stripped or stripped[0] in "#%":
                if stripped:
                    comment = stripped[0]
                skip += 1
                continue
            sep = "," if "," in stripped else r"\s+"
            tokens = [t for t in stripped.replace(",", " ").split()]
            try:
                [float(t) for t in tokens]
                header = False
            except ValueError:
                header = True
            return skip, header, comment, sep
    return skip, False, comment, r"\s+"


def _read_edgelist(path: Path, *, directed: bool, num_nodes=None, **opts) -> Graph:
    import pandas as pd

    skip, header, comment, sep = _edgelist_layout(path)
    try:
        frame = pd.read_csv(path, sep=sep, header=None, skiprows=skip + int(header), comment=comment,
                            engine="c", skip_blank_lines=True)
    except pd.errors.EmptyDataError:
        frame = pd.DataFrame(np.zeros((0, 2), dtype=np.int64))
    except pd.errors.ParserError as exc:
        raise UserError(f"{path}: cannot parse the edge list ({str(exc).strip().splitlines()[-1]})") from None
    if frame.shape[1] not in (2, 3):
        raise UserError(f"{path}: expected 2 or 3 columns (src dst [weight]), found {frame.shape[1]}")
    ids = frame.iloc[:, :2]
    if ids.isna().any().any():
        raise UserError(f"{path}: some lines lack a source or destination")
    values = ids.to_numpy()
    if values.dtype.kind not in "iu":
        if values.dtype.kind != "f" or np.any(values != np.round(values)):
            raise UserError(f"{path}: node ids must be whole numbers")
        values = values.astype(np.int64)
    weights = None
    if frame.shape[1] == 3:
        col = frame.iloc[:, 2]
        if col.dtype.kind not in "iuf" or col.isna().any():
            raise UserError(f"{path}: the third column (weight) must be numeric on every line")
        weights = col.to_numpy(dtype=np.float32)
    src, dst = values[:, 0].astype(np.int64), values[:, 1].astype(np.int64)
    if num_nodes is None:
        if src.size and min(src.min(), dst.min()) < 0:
            raise UserError(f"{path}: negative node id {min(src.min(), dst.min())}")
        num_nodes = int(max(src.max(), dst.max())) + 1 if src.size else 0
    adj = _edges_to_adjacency(src, dst, weights, int(num_nodes), directed, str(path))
    name = path.name.split(".")[0]
    meta = {"source": str(path), "format": "edgelist", "directed_input": bool(directed)}
    return _finish(adj, None, None, None, name, meta, **opts)


def _read_ogb(path: Path, *, directed: bool, **opts) -> Graph:
    import pandas as pd

    raw = path / "raw" if (path / "raw" / "edge.csv.gz").is_file() else path
    num_nodes_file = raw / "num-node-list.csv.gz"
    if not num_nodes_file.is_file():
        raise UserError(f"{raw}: missing num-node-list.csv.gz; not a complete OGB node-property dataset")
    counts = pd.read_csv(num_nodes_file, header=None).to_numpy().ravel()
    if counts.size != 1:
        raise UserError(f"{num_nodes_file}: expected one graph, found {counts.size} (graph-level datasets "
                        "are not node-property datasets)")
    n = int(counts[0])
    edges = pd.read_csv(raw / "edge.csv.gz", header=None, dtype=np.int64).to_numpy()
    if edges.ndim != 2 or (edges.size and edges.shape[1] != 2):
        raise UserError(f"{raw}/edge.csv.gz: expected 2 columns (src,dst)")
    edges = edges.reshape(-1, 2)
    adj = _edges_to_adjacency(edges[:, 0], edges[:, 1], None, n, directed, f"{raw}/edge.csv.gz")
    features = labels = None
    if (raw / "node-feat.csv.gz").is_file():
        features = pd.read_csv(raw / "node-feat.csv.gz", header=None, dtype=np.float32).to_numpy()
    if (raw / "node-label.csv.gz").is_file():
        labels = pd.read_csv(raw / "node-label.csv.gz", header=None).to_numpy()
    name = path.resolve().parent.name if path.name == "raw" else path.resolve().name
    meta = {"source": str(path), "format": "ogb", "directed_input": bool(directed)}
    return _finish(adj, features, labels, None, name, meta, **opts)


def _read_pyg(path: Path, **opts) -> Graph:
    import torch

    opts.pop("directed", None)
    # PyG Data objects are pickled Python objects: weights_only=False is needed, and it
    # runs code from the file, so this format is only for files the user trusts.
    obj = torch.load(path, map_location="cpu", weights_only=False)
    get = obj.get if isinstance(obj, dict) else (lambda k, d=None: getattr(obj, k, d))
    edge_index = get("edge_index")
    if edge_index is None:
        raise UserError(f"{path}: the saved object has no edge_index (expected a PyG Data or a dict)")
    ei = torch.as_tensor(edge_index).cpu().numpy()
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise UserError(f"{path}: edge_index must have shape (2, E), got {tuple(ei.shape)}")
    x = get("x")
    y = get("y")
    n = get("num_nodes")
    if n is None:
        n = int(ei.max()) + 1 if ei.size else 0
    w = get("edge_weight")
    if w is None and get("edge_attr") is not None and torch.as_tensor(get("edge_attr")).dim() == 1:
        w = get("edge_attr")
    w = None if w is None else torch.as_tensor(w).cpu().numpy()
    adj = _edges_to_adjacency(ei[0], ei[1], w, int(n), True, str(path))
    features = None if x is None else torch.as_tensor(x).cpu().numpy()
    labels = None if y is None else torch.as_tensor(y).cpu().numpy()
    name = path.name.split(".")[0]
    return _finish(adj, features, labels, None, name, {"source": str(path), "format": "pyg"}, **opts)


_READERS = {"plexus": _read_plexus, "npz": _read_npz, "mtx": _read_mtx, "edgelist": _read_edgelist,
            "ogb": _read_ogb, "pyg": _read_pyg}


def load_graph(path, *, format: str | None = None, directed: bool = False, features: int | None = None,
               classes: int | None = None, seed: int = 0, mmap: bool = True, pattern_only: bool | str = False) -> Graph:
    """Load a graph from any supported format (see the module docstring).

    ``directed`` keeps edge-list/OGB edges one-way; ``features``/``classes``/``seed`` make
    random features and degree labels for formats without them; ``mmap`` memory-maps the
    arrays of the own format. Errors (missing, truncated or corrupt files, edge ids out of
    range, unknown formats) raise :class:`UserError`. ``pattern_only``: the caller reads the
    adjacency's pattern and the arrays' shapes alone (``predict``), so of the own format only
    indptr and indices are checked entry by entry (values, features and labels are not read);
    ``"rows"``: indptr alone, for a caller that checks the indices it samples.
    """
    path = Path(path)
    if not path.exists():
        raise UserError(f"no such file or directory: {path}")
    fmt = format or detect_format(path)
    if fmt not in _READERS:
        raise UserError(f"unknown graph format {fmt!r}; known: {', '.join(FORMATS)}")
    opts = {"features_width": features, "classes": classes, "seed": seed}
    try:
        if fmt == "plexus":
            return _read_plexus(path, mmap=mmap, pattern_only=pattern_only)
        return _READERS[fmt](path, directed=directed, **opts)
    except UserError:
        raise
    except MemoryError:
        raise UserError(f"{path}: not enough memory to load this graph") from None
    except _READ_ERRORS as exc:
        detail = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise UserError(f"cannot read {path} as {fmt}: {detail} (is the file truncated or corrupt?)") from None
    except Exception as exc:  # unpickling and parser errors of third-party readers
        kind = type(exc).__name__
        if fmt in ("pyg", "npz", "mtx", "edgelist", "ogb") and kind in (
            "UnpicklingError", "ParserError", "RuntimeError", "AttributeError", "BadGzipFile"
        ):
            raise UserError(f"cannot read {path} as {fmt}: {kind}: {exc} (is the file truncated or corrupt?)") from None
        raise


def resolve_graph(source, *, pattern_only: bool | str = False) -> Graph:
    """A Graph from a Graph, a file path, or ("synthetic", spec) (``pattern_only``: :func:`load_graph`)."""
    if isinstance(source, Graph):
        return source
    if isinstance(source, tuple) and source[0] == "synthetic":
        return synthetic(source[1])
    return load_graph(str(source), pattern_only=pattern_only)


# --- writers -----------------------------------------------------------------------

def _index_dtype(n: int, nnz: int):
    return np.int32 if n < 2**31 and nnz < 2**31 else np.int64


def _write_plexus(graph: Graph, tmp: Path) -> None:
    adj = as_csr(graph.adjacency)
    n = adj.shape[0]
    idx = _index_dtype(n, adj.nnz)
    arrays = {
        "indptr": np.asarray(adj.indptr, dtype=idx),
        "indices": np.asarray(adj.indices, dtype=idx),
        "data": np.asarray(adj.data, dtype=np.float32),
        "features": np.asarray(graph.features, dtype=np.float32),
        "labels": np.asarray(graph.labels, dtype=np.int64),
    }
    spec = {}
    for key, arr in arrays.items():
        np.save(tmp / f"{key}.npy", arr, allow_pickle=False)
        spec[key] = {"shape": list(arr.shape), "dtype": str(arr.dtype)}
    meta = {k: v for k, v in graph.meta.items() if k != "symmetric"}
    info = {
        "format": PLEXUS_FORMAT,
        "version": PLEXUS_VERSION,
        "name": graph.name,
        "num_nodes": n,
        "nnz": int(adj.nnz),
        "num_features": int(arrays["features"].shape[1]),
        "num_classes": int(graph.num_classes),
        "symmetric": bool(graph.meta.get("symmetric", is_symmetric(adj))),
        "orientation": "row v holds the in-neighbours of v (edge u->v is A[v, u])",
        "arrays": spec,
        "meta": json.loads(json.dumps(meta, default=str)),
    }
    (tmp / "metadata.json").write_text(json.dumps(info, indent=1) + "\n")


def _file_format_of_suffix(suffix: str) -> str | None:
    """Single-file graph format named by a (compression-stripped) suffix, or None."""
    if suffix in (".npz", ".mtx"):
        return suffix[1:]
    if suffix in _EDGELIST_SUFFIXES:
        return "edgelist"
    if suffix in (".pt", ".pth"):
        return "pyg"
    return None


def save_format_for(path) -> str:
    """Format written for an output path: by suffix, else the own directory format."""
    path = Path(path)
    suffix = _bare_suffix(path)
    fmt = _file_format_of_suffix(suffix)
    if fmt is not None:
        return fmt
    if suffix in ("", ".plexus", ".graph"):
        return "plexus"
    raise UserError(f"cannot write {path.name!r}: use a directory name (own format), .npz, .mtx, "
                    ".txt/.csv edge list or .pt")


def save_graph(graph: Graph, path, *, overwrite: bool = False) -> str:
    """Write ``graph`` atomically; the format follows the suffix (:func:`save_format_for`).

    ``.npz`` stores CSR arrays + features + labels; ``.mtx`` and edge lists store only the
    adjacency; ``.pt`` a PyG ``Data``; anything else the own memory-mappable directory.
    Returns the format name.
    """
    fmt = save_format_for(path)
    path = Path(path)
    if fmt == "plexus":
        with atomic_directory(path, overwrite=overwrite) as tmp:
            _write_plexus(graph, tmp)
        return fmt
    adj = as_csr(graph.adjacency)
    with atomic_file(path, overwrite=overwrite) as tmp:
        if fmt == "npz":
            with open(tmp, "wb") as fh:
                np.savez(fh, indptr=adj.indptr, indices=adj.indices, data=adj.data.astype(np.float32),
                         features=np.asarray(graph.features, np.float32),
                         labels=np.asarray(graph.labels, np.int64),
                         num_classes=np.int64(graph.num_classes), num_nodes=np.int64(adj.shape[0]))
        elif fmt == "mtx":
            import scipy.io

            opener = gzip.open if path.suffix.lower() == ".gz" else open
            with opener(tmp, "wb") as fh:
                scipy.io.mmwrite(fh, adj, comment="row v holds the in-neighbours of v")
        elif fmt == "edgelist":
            coo = adj.tocoo()
            sep = "," if _bare_suffix(path) == ".csv" else " "
            opener = gzip.open if path.suffix.lower() == ".gz" else open
            with opener(tmp, "wt") as fh:
                fh.write(f"# {graph.name}: {adj.shape[0]} nodes; one directed edge src{sep}dst{sep}weight per line\n")
                if np.all(coo.data == 1):
                    np.savetxt(fh, np.column_stack([coo.col, coo.row]), fmt="%d", delimiter=sep)
                else:
                    table = np.column_stack([coo.col, coo.row, coo.data.astype(np.float64)])
                    np.savetxt(fh, table, fmt=["%d", "%d", "%.9g"], delimiter=sep)
        elif fmt == "pyg":
            import torch
            from torch_geometric.data import Data

            coo = adj.tocoo()
            ei = torch.from_numpy(np.vstack([coo.col, coo.row]).astype(np.int64))
            data = Data(x=torch.from_numpy(np.array(graph.features, dtype=np.float32)), edge_index=ei,
                        y=torch.from_numpy(np.array(graph.labels, dtype=np.int64)), num_nodes=adj.shape[0])
            if not np.all(coo.data == 1):
                data.edge_weight = torch.from_numpy(coo.data.astype(np.float32))
            torch.save(data, tmp)
    return fmt
