"""The structure cache: a graph's shard statistics kept between calls (docs/model.md, "Structure cache").

Statistics that take a scan over a graph's entries (the normalized nonzeros, whether the
pattern is symmetric, the largest block of every split and its structure) are stored
under ``<data dir>/structure-cache/<key>/``, where the key is the XXH3 (128-bit) hash of the
adjacency's pattern (N, indptr, indices; the values do not enter any statistic):

    graph.json                   name, nodes, stored and normalized nonzeros, rows storing
                                 their diagonal, symmetry
    <permutation>.json           ``{"splits": {"<layout>:<R>x<C>": entry}}`` for one
                                 permutation mode, seed (and the part counts of ``local``)
    metis-v1-kway-parts<P>-seed<S>.npy
                                 the METIS partition into P parts with seed S (one part
                                 per node), :func:`plexus_tune.graph.partition.partition_graph`

A changed graph hashes to another key, so its old entries are never read. The hash of
a graph file is remembered with the files' size, modification time and inode
(``hashes.json``): a graph whose files are unchanged is not hashed again, and a plexus graph whose files are unchanged since a read passed the
reader's checks is not checked again (``validated.json``). An entry that cannot be read
is ignored with one :class:`CorruptCacheWarning` and rewritten.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from pathlib import Path

import numpy as np

from plexus_tune.errors import CorruptCacheWarning
from plexus_tune.paths import data_dir

CACHE_DIRNAME = "structure-cache"
CACHE_VERSION = 1
#: Bytes hashed at a time.
_HASH_CHUNK_BYTES = 1 << 24


def cache_root(root=None) -> Path:
    """The structure cache's directory (``<data dir>/structure-cache`` unless given)."""
    return Path(root) if root is not None else data_dir() / CACHE_DIRNAME


def _hash_array(h, array) -> None:
    flat = np.asarray(array).reshape(-1)
    step = max(1, _HASH_CHUNK_BYTES // max(flat.itemsize, 1))
    h.update(str(flat.dtype).encode())
    for lo in range(0, flat.size, step):
        h.update(np.ascontiguousarray(flat[lo:lo + step]).data)


def pattern_hash(adjacency) -> str:
    """XXH3 (128-bit, hex) of a square CSR pattern: N, indptr and indices, not the values."""
    import xxhash

    h = xxhash.xxh3_128()
    h.update(f"csr-pattern-v2:{adjacency.shape[0]}:".encode())
    _hash_array(h, adjacency.indptr)
    _hash_array(h, adjacency.indices)
    return h.hexdigest()


def _source_files(graph) -> list[Path]:
    """The files a graph was read from, where the graph is a plexus directory or one file."""
    source = getattr(graph, "meta", {}).get("source") if hasattr(graph, "meta") else None
    if not source:
        return []
    path = Path(source)
    if path.is_dir():
        return [path / "metadata.json", path / "indptr.npy", path / "indices.npy"]
    return [path] if path.is_file() else []


def _stat_key(files: list[Path]) -> list | None:
    try:
        return [[str(f.resolve()), st.st_size, st.st_mtime_ns, st.st_ino] for f in files for st in (f.stat(),)]
    except OSError:
        return None


def _write_json(path: Path, data) -> None:
    """Write JSON atomically (a temporary file renamed over ``path``); a failure leaves no file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _read_json(path: Path):
    """The JSON of ``path``; None when missing; None with one warning when unreadable."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        warnings.warn(CorruptCacheWarning(f"{path}: structure cache entry unreadable ({exc.strerror}); ignored"), stacklevel=3)
        return None
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
            raise ValueError(f"not a version-{CACHE_VERSION} entry")
        return data
    except ValueError as exc:
        warnings.warn(CorruptCacheWarning(f"{path}: corrupt structure cache entry ignored and recomputed "
                                          f"({str(exc).splitlines()[0]})"), stacklevel=3)
        return None


def known_valid(files) -> list | None:
    """The stat key of ``files`` if a read of exactly these files (same size, modification
    time and inode) already passed the graph reader's checks, else None."""
    stat = _stat_key([Path(f) for f in files])
    if stat is None:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CorruptCacheWarning)
        memo = _read_json(cache_root() / "validated.json")
    entries = memo.get("files") if isinstance(memo, dict) else None
    return stat if isinstance(entries, dict) and entries.get(_files_key(stat)) == stat else None


def _files_key(stat: list) -> str:
    """The memo key of a set of files: their resolved paths."""
    return "|".join(entry[0] for entry in stat)


def remember_valid(files) -> None:
    """Record that ``files`` passed the graph reader's checks (skipped on a read-only data directory)."""
    stat = _stat_key([Path(f) for f in files])
    if stat is None:
        return
    path = cache_root() / "validated.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CorruptCacheWarning)
        memo = _read_json(path) or {"version": CACHE_VERSION, "files": {}}
    if not isinstance(memo.get("files"), dict):
        memo["files"] = {}
    memo["files"][_files_key(stat)] = stat
    with contextlib.suppress(OSError):
        _write_json(path, memo)


class StructureCache:
    """The cached statistics of one graph (see the module docstring).

    ``key`` is the pattern hash; :meth:`summary` and :meth:`splits` read, :meth:`store_summary`
    and :meth:`store_splits` write. Writes that fail (a read-only data directory) are skipped.
    """

    def __init__(self, graph, root=None):
        self.root = cache_root(root)
        adjacency = getattr(graph, "adjacency", graph)
        self.key = self._key(graph, adjacency)
        self.directory = self.root / self.key

    def _key(self, graph, adjacency) -> str:
        files = _source_files(graph)
        stat = _stat_key(files) if files else None
        memo_path = self.root / "hashes.json"
        memo = None
        if stat is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", CorruptCacheWarning)  # a bad memo only costs a hash
                memo = _read_json(memo_path) or {"version": CACHE_VERSION, "files": {}}
            known = memo["files"].get(stat[0][0]) if isinstance(memo.get("files"), dict) else None
            if isinstance(known, dict) and known.get("stat") == stat and isinstance(known.get("hash"), str):
                return known["hash"]
        key = pattern_hash(adjacency)
        if stat is not None and memo is not None:
            memo.setdefault("files", {})[stat[0][0]] = {"stat": stat, "hash": key}
            with contextlib.suppress(OSError):
                _write_json(memo_path, memo)
        return key

    # ----------------------------------------------------------------- graph summary
    def summary(self) -> dict | None:
        """``{"name", "nodes", "nnz", "normalized_nnz", "diagonal_rows", "symmetric_pattern"}`` or None."""
        data = _read_json(self.directory / "graph.json")
        if data is None:
            return None
        try:
            return {"name": str(data["name"]), "nodes": int(data["nodes"]), "nnz": int(data["nnz"]),
                    "normalized_nnz": int(data["normalized_nnz"]), "diagonal_rows": int(data["diagonal_rows"]),
                    "symmetric_pattern": data["symmetric_pattern"]}
        except (KeyError, TypeError, ValueError) as exc:
            warnings.warn(CorruptCacheWarning(f"{self.directory / 'graph.json'}: corrupt structure cache entry ignored "
                                              f"({type(exc).__name__}: {exc})"), stacklevel=2)
            return None

    def store_summary(self, summary: dict) -> None:
        with contextlib.suppress(OSError):
            _write_json(self.directory / "graph.json", {"version": CACHE_VERSION, **summary})

    # ----------------------------------------------------------------- split statistics
    @staticmethod
    def entry_name(permute: str, seed: int, parts=None, stored: bool = False) -> str:
        """File stem of one permutation's splits: ``double-seed0``, ``local-seed0-parts2x4x8``, ``stored``."""
        if stored:
            return "stored"
        name = f"{permute}-seed{int(seed)}"
        return name + ("-parts" + "x".join(str(int(p)) for p in parts) if parts else "")

    def splits(self, name: str) -> dict:
        """``{(layout, R, C): entry}`` cached for one permutation (empty when none)."""
        path = self.directory / f"{name}.json"
        data = _read_json(path)
        if data is None:
            return {}
        out = {}
        try:
            for key, entry in data["splits"].items():
                layout, split = key.split(":")
                r, c = (int(v) for v in split.split("x"))
                out[(layout, r, c)] = {"nnz_max": int(entry["nnz_max"]), "nnz_mean": float(entry["nnz_mean"]),
                                       "block": tuple(int(v) for v in entry["block"]),
                                       "forward": dict(entry["forward"]), "transpose": dict(entry["transpose"])}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            warnings.warn(CorruptCacheWarning(f"{path}: corrupt structure cache entry ignored and recomputed "
                                              f"({type(exc).__name__}: {exc})"), stacklevel=2)
            return {}
        return out

    def store_splits(self, name: str, entries: dict) -> None:
        """Write one permutation's cached splits, ``{(layout, R, C): entry}`` (those read, with those added)."""
        known = entries
        data = {"version": CACHE_VERSION,
                "splits": {f"{layout}:{r}x{c}": {**entry, "block": list(entry["block"])}
                           for (layout, r, c), entry in sorted(known.items())}}
        with contextlib.suppress(OSError):
            _write_json(self.directory / f"{name}.json", data)


#: Version of a cached partition's file name (changes when the partitioner's call changes).
PARTITION_VERSION = 1


def partition_file(key: str, parts: int, seed: int, root=None) -> Path:
    """Where the METIS partition of the graph of pattern hash ``key`` into ``parts`` parts with ``seed`` is kept."""
    return cache_root(root) / key / f"metis-v{PARTITION_VERSION}-kway-parts{int(parts)}-seed{int(seed)}.npy"


def _read_array(path: Path, check, what: str, *, mmap: bool = False) -> np.ndarray | None:
    """The array stored at ``path``, None when missing; None with one :class:`CorruptCacheWarning`
    (naming ``what``) when unreadable or when ``check(array)`` raises ValueError."""
    if not path.is_file():
        return None
    try:
        array = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
        check(array)
        return array
    except (OSError, ValueError, EOFError) as exc:
        warnings.warn(CorruptCacheWarning(f"{path}: corrupt {what} "
                                          f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})"),
                      stacklevel=4)
        return None


def _store_array(path: Path, array: np.ndarray) -> bool:
    """Write ``array`` to ``path`` atomically (a temporary file, then a rename); False where the
    data directory is read-only."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npy")
        try:
            np.save(tmp, array, allow_pickle=False)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    except OSError:
        return False
    return True


def read_partition(path: Path, nodes: int, parts: int) -> np.ndarray | None:
    """A cached partition (one part in [0, parts) per node), None when missing; None with one
    :class:`CorruptCacheWarning` when unreadable or not such a partition."""
    def check(part):
        if part.shape != (nodes,) or part.dtype.kind not in "iu" or (nodes and (part.min() < 0 or part.max() >= parts)):
            raise ValueError(f"not a partition of {nodes} nodes into {parts} parts")

    part = _read_array(path, check, "cached partition ignored and recomputed")
    return None if part is None else part.astype(np.int64, copy=False)


def store_partition(path: Path, part: np.ndarray) -> None:
    """Write a partition atomically (skipped on a read-only data directory)."""
    _store_array(path, np.asarray(part, dtype=np.int32 if part.size and part.max() < 2**31 else np.int64))


#: Directory (under the cache root) of the stored inverse permutations.
PERMUTATIONS_DIRNAME = "permutations"


def permutation_file(name: str, nodes: int, side: str, root=None) -> Path:
    """Where the inverse of one permutation of ``nodes`` ids is kept: ``permutations/<name>-n<nodes>-
    numpy<version>-<side>.npy`` (``name``: :meth:`StructureCache.entry_name`; numpy's version, whose
    generator made it, is part of the key). A permutation depends on N, the mode and the seed
    alone, not on any graph's content."""
    return cache_root(root) / PERMUTATIONS_DIRNAME / f"{name}-n{int(nodes)}-numpy{np.__version__}-{side}.npy"


def read_permutation(path: Path, nodes: int) -> np.ndarray | None:
    """A stored inverse permutation, memory-mapped; None when missing; None with one
    :class:`CorruptCacheWarning` when unreadable or not of ``nodes`` integer ids."""
    def check(inv):
        if inv.shape != (int(nodes),) or inv.dtype.kind not in "iu":
            raise ValueError(f"not a permutation of {nodes} ids")

    return _read_array(path, check, "stored permutation ignored and made again", mmap=True)


def store_permutation(path: Path, inv: np.ndarray) -> bool:
    """Write an inverse permutation atomically; False where the data directory is read-only."""
    return _store_array(path, np.asarray(inv))


def permutation_listing(root=None) -> list[dict]:
    """Every stored inverse permutation: ``{"name", "bytes"}`` (:func:`permutation_file`)."""
    base = cache_root(root) / PERMUTATIONS_DIRNAME
    if not base.is_dir():
        return []
    return [{"name": f.stem, "bytes": f.stat().st_size} for f in sorted(base.glob("*.npy"))]


def cache_listing(root=None) -> list[dict]:
    """Every cached graph: ``{"key", "name", "nodes", "nnz", "entries": {name: splits}, "bytes"}``."""
    base = cache_root(root)
    out = []
    if not base.is_dir():
        return out
    for directory in sorted(p for p in base.iterdir() if p.is_dir() and p.name != PERMUTATIONS_DIRNAME):
        graph = _read_json(directory / "graph.json") or {}
        entries = {}
        size = 0
        for file in sorted(directory.glob("*.json")):
            size += file.stat().st_size
            if file.name == "graph.json":
                continue
            data = _read_json(file)
            entries[file.stem] = len(data.get("splits", {})) if isinstance(data, dict) else None
        for file in sorted(directory.glob("metis-*.npy")):
            size += file.stat().st_size
            entries[file.stem] = "partition"
        out.append({"key": directory.name, "name": graph.get("name"), "nodes": graph.get("nodes"),
                    "nnz": graph.get("normalized_nnz"), "entries": entries, "bytes": size})
    return out
