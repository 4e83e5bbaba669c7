"""Train / validation / test node splits: OGB split files or a seeded random split.

A split is an int8 array over the nodes in their original order: :data:`TRAIN` (0),
:data:`VALID` (1), :data:`TEST` (2), or :data:`UNUSED` (-1) for nodes in no part.

OGB node-property datasets keep their split as ``<dataset>/split/<kind>/train.csv.gz``,
``valid.csv.gz`` and ``test.csv.gz``, one node id a line (``kind`` is e.g.
``sales_ranking`` for ogbn-products, ``time`` for ogbn-arxiv). :func:`read_ogb_split`
reads it; :func:`write_ogb_split` writes one (for graphs given as OGB directories
without a split). Every other graph gets :func:`random_split`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from plexus_tune.errors import UserError

TRAIN, VALID, TEST, UNUSED = 0, 1, 2, -1
#: Part names, in code order, as the record and the OGB files name them.
SPLIT_PARTS = ("train", "valid", "test")
#: Fractions of the random split (the rest is the test part).
RANDOM_TRAIN, RANDOM_VALID = 0.6, 0.2


def random_split(nodes: int, seed: int, train: float = RANDOM_TRAIN, valid: float = RANDOM_VALID) -> np.ndarray:
    """A seeded random split: ``floor(train N)`` train nodes, ``floor(valid N)`` validation, the rest test.

    The nodes are shuffled by ``numpy.random.default_rng(seed)``; the same (N, seed)
    gives the same split on every rank and in the serial reference.
    """
    if not (0 < train and 0 <= valid and train + valid <= 1):
        raise ValueError("need 0 < train, 0 <= valid and train + valid <= 1")
    n = int(nodes)
    order = np.random.default_rng(int(seed)).permutation(n)
    codes = np.full(n, TEST, dtype=np.int8)
    n_train, n_valid = int(train * n), int(valid * n)
    codes[order[:n_train]] = TRAIN
    codes[order[n_train:n_train + n_valid]] = VALID
    return codes


def ogb_split_dir(path) -> Path | None:
    """The ``split/<kind>`` directory of an OGB dataset directory (or of its ``raw``), if any.

    With several kinds the first in name order is taken.
    """
    root = Path(path)
    if root.name == "raw":
        root = root.parent
    split = root / "split"
    if not split.is_dir():
        return None
    for kind in sorted(p for p in split.iterdir() if p.is_dir()):
        if all((kind / f"{part}.csv.gz").is_file() for part in SPLIT_PARTS):
            return kind
    return None


def read_ogb_split(path, nodes: int) -> np.ndarray | None:
    """The split of an OGB dataset directory (None if it has none); UserError on bad ids or overlaps."""
    import gzip

    kind = ogb_split_dir(path)
    if kind is None:
        return None
    codes = np.full(int(nodes), UNUSED, dtype=np.int8)
    for code, part in enumerate(SPLIT_PARTS):
        file = kind / f"{part}.csv.gz"
        with gzip.open(file, "rt") as fh:
            try:
                ids = np.array(fh.read().split(), dtype=np.int64)
            except ValueError:
                raise UserError(f"{file}: expected one node id a line") from None
        if ids.size and (ids.min() < 0 or ids.max() >= nodes):
            raise UserError(f"{file}: node id out of range [0, {nodes})")
        if (codes[ids] != UNUSED).any():
            raise UserError(f"{file}: nodes also in another part of the split")
        codes[ids] = code
    return codes


def write_ogb_split(path, codes, kind: str = "random") -> Path:
    """Write ``codes`` as ``<path>/split/<kind>/{train,valid,test}.csv.gz``; returns that directory."""
    out = Path(path) / "split" / kind
    out.mkdir(parents=True, exist_ok=True)
    codes = np.asarray(codes)
    for code, part in enumerate(SPLIT_PARTS):
        np.savetxt(out / f"{part}.csv.gz", np.flatnonzero(codes == code), fmt="%d")
    return out


def node_split(source, nodes: int, seed: int) -> tuple[np.ndarray, str]:
    """(codes, description) of a graph source: its OGB split if it is a directory that has one,
    else :func:`random_split` with ``seed``."""
    if isinstance(source, (str, Path)) and Path(source).is_dir():
        kind = ogb_split_dir(source)
        if kind is not None:
            return read_ogb_split(source, nodes), f"ogb:{kind.name}"
    return random_split(nodes, seed), f"random:train={RANDOM_TRAIN},valid={RANDOM_VALID},seed={int(seed)}"


def split_sizes(codes) -> dict[str, int]:
    """Nodes in each part."""
    codes = np.asarray(codes)
    return {part: int((codes == code).sum()) for code, part in enumerate(SPLIT_PARTS)}


def write_ogb_dataset(graph, path, split=None, kind: str = "random") -> Path:
    """Write ``graph`` as an OGB node-property directory (``raw/`` and ``split/<kind>/``).

    ``raw/edge.csv.gz`` lists each edge ``u, v`` with ``u <= v`` of the symmetric
    adjacency once (the OGB reader adds the reverse edges), ``num-node-list.csv.gz``,
    ``num-edge-list.csv.gz``, ``node-feat.csv.gz`` and ``node-label.csv.gz``. ``split``
    (codes as above) is written with :func:`write_ogb_split` if given. Returns ``path``.
    """
    import scipy.sparse as sp

    root = Path(path)
    raw = root / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    upper = sp.triu(sp.csr_matrix(graph.adjacency), format="coo")
    edges = np.stack([upper.row, upper.col], axis=1).astype(np.int64)
    np.savetxt(raw / "edge.csv.gz", edges, fmt="%d", delimiter=",")
    np.savetxt(raw / "num-node-list.csv.gz", [graph.num_nodes], fmt="%d")
    np.savetxt(raw / "num-edge-list.csv.gz", [edges.shape[0]], fmt="%d")
    np.savetxt(raw / "node-feat.csv.gz", np.asarray(graph.features, dtype=np.float32), fmt="%.9g", delimiter=",")
    np.savetxt(raw / "node-label.csv.gz", np.asarray(graph.labels, dtype=np.int64), fmt="%d")
    if split is not None:
        write_ogb_split(root, split, kind)
    return root
