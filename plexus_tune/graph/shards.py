"""Offline 2D shard files of the permuted normalized adjacency, and per-rank loading.

:func:`write_shards` stores ``B = A_hat[row_perm][:, col_perm]`` where ``A_hat`` is the
GCN-normalized adjacency (:func:`plexus_tune.graph.gcn_normalize`, float32) and the
permutations come from :func:`plexus_tune.graph.permutations_for` (mode and seed are in
the manifest, the permutations themselves in ``row_perm.npy`` / ``col_perm.npy``; the
``local`` mode keeps the balance of the file grid's splits, ``parts = (R, C)``).

The node count is padded to ``N_pad``, the next multiple of ``lcm(R, C)`` for a file grid
R x C, so file block (r, c) covers rows ``[r*N_pad/R, (r+1)*N_pad/R)`` and columns
``[c*N_pad/C, (c+1)*N_pad/C)`` of the zero-padded B. A rank whose target grid is
``row_blocks x col_blocks`` with ``row_blocks | R`` and ``col_blocks | C`` owns a union of
whole file blocks; :func:`load_shard` reads and merges only those files.

Directory layout::

    manifest.json              sizes, grid, permutation, nnz and sha256 per file
    block_r{r}_c{c}.npz        local CSR: indptr (N_pad/R + 1), indices (local columns), data
    row_perm.npy col_perm.npy  int64 permutations
    features_col.npy           features[col_perm] (optional node data)
    labels_row.npy labels_col.npy   labels[row_perm], labels[col_perm]
"""

from __future__ import annotations

import hashlib
import json
import math
import zipfile
from pathlib import Path

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.jsonfile import read_json
from plexus_tune.graph import checks
from plexus_tune.graph.atomic import atomic_directory
from plexus_tune.graph.core import Graph, gcn_normalize, is_symmetric
from plexus_tune.graph.permute import invert_permutation, permutations_for, permute_matrix

SHARD_FORMAT = "plexus-shards"
SHARD_VERSION = 1
_COUNT = {"type": "integer", "minimum": 0}
_SIZE = {"type": "integer", "minimum": 1}
#: schema of a shard directory's manifest.json (plexus_tune.jsonfile); the fields' agreement
#: (padding, block sizes, files, nonzeros) is checked by :func:`read_manifest`
MANIFEST_SCHEMA = {
    "type": "object",
    "required": ["format", "version", "num_nodes", "num_nodes_padded", "nnz", "blocks", "block_rows", "block_cols",
                 "permutation", "block_nnz", "files"],
    "properties": {
        "format": {"type": "string"}, "version": {"type": "integer"}, "name": {"type": "string"},
        "num_nodes": _SIZE, "num_nodes_padded": _SIZE, "nnz": _COUNT,
        "blocks": {"type": "array", "items": _SIZE, "minItems": 2, "maxItems": 2},
        "block_rows": _SIZE, "block_cols": _SIZE, "symmetric": {"type": "boolean"},
        "permutation": {"type": "object", "required": ["mode", "row_file", "col_file"],
                        "properties": {"mode": {"type": "string"}, "seed": {"type": "integer"},
                                       "row_file": {"type": "string"}, "col_file": {"type": "string"}}},
        "block_nnz": {"type": "array", "items": {"type": "array", "items": _COUNT}},
        "files": {"type": "array", "items": {
            "type": "object", "required": ["row", "col", "file", "nnz"],
            "properties": {"row": _COUNT, "col": _COUNT, "file": {"type": "string"}, "nnz": _COUNT,
                           "bytes": _COUNT, "sha256": {"type": "string"}}}},
        "node_data": {"type": "object", "properties": {
            "features_col": {"type": "string"}, "labels_row": {"type": "string"}, "labels_col": {"type": "string"},
            "num_features": _SIZE, "num_classes": _SIZE}},
    },
}
_NODE_DATA = ("features_col", "labels_row", "labels_col", "num_features", "num_classes")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def block_file(r: int, c: int) -> str:
    return f"block_r{r}_c{c}.npz"


def padded_size(n: int, row_blocks: int, col_blocks: int) -> int:
    """Smallest multiple of ``lcm(row_blocks, col_blocks)`` that is >= n."""
    step = math.lcm(int(row_blocks), int(col_blocks))
    return -(-int(n) // step) * step


def write_shards(graph, out_dir, blocks=(8, 8), *, mode: str = "double", seed: int = 0,
                 include_node_data: bool = True, overwrite: bool = False, progress=None) -> dict:
    """Write the R x C shard files of the permuted normalized adjacency; returns the manifest.

    ``graph`` is a :class:`Graph` or a raw square adjacency. Written atomically: the
    directory appears complete or not at all. ``progress(done, total)`` is called per block.
    """
    import scipy.sparse as sp
    rb, cb = (int(x) for x in blocks)
    if rb < 1 or cb < 1:
        raise UserError(f"bad block grid {rb}x{cb}; both sizes must be >= 1")
    adj = graph.adjacency if isinstance(graph, Graph) else graph
    n = adj.shape[0]
    if adj.shape != (n, n):
        raise UserError(f"adjacency must be square, got {adj.shape}")
    if max(rb, cb) > n:
        raise UserError(f"a {rb}x{cb} file grid cuts {n} nodes into blocks with no row or column ({rb * cb:,} files); "
                        f"use at most {n} blocks per side")
    n_pad = padded_size(n, rb, cb)
    br, bc = n_pad // rb, n_pad // cb
    row_perm, col_perm = permutations_for(mode, n, seed, parts=(rb, cb))
    permuted = permute_matrix(gcn_normalize(adj), row_perm, col_perm)
    index_dtype = np.int32 if max(br, bc) < 2**31 else np.int64
    files = []
    counts = np.zeros((rb, cb), dtype=np.int64)
    with atomic_directory(out_dir, overwrite=overwrite) as tmp:
        for r in range(rb):
            lo, hi = min(r * br, n), min((r + 1) * br, n)
            rows = permuted[lo:hi]
            # pad to br local rows: empty rows past N
            indptr_full = np.full(br + 1, rows.indptr[-1], dtype=np.int64)
            indptr_full[: hi - lo + 1] = rows.indptr
            rows_padded = sp.csr_matrix((rows.data, rows.indices, indptr_full), shape=(br, n_pad))
            for c in range(cb):
                block = rows_padded[:, c * bc:(c + 1) * bc]
                block.sort_indices()
                name = block_file(r, c)
                with open(tmp / name, "wb") as fh:
                    np.savez(fh, indptr=block.indptr.astype(np.int64), indices=block.indices.astype(index_dtype),
                             data=block.data.astype(np.float32))
                counts[r, c] = block.nnz
                files.append({"row": r, "col": c, "file": name, "nnz": int(block.nnz),
                              "bytes": (tmp / name).stat().st_size, "sha256": _sha256(tmp / name)})
                if progress is not None:
                    progress(r * cb + c + 1, rb * cb)
        np.save(tmp / "row_perm.npy", row_perm)
        np.save(tmp / "col_perm.npy", col_perm)
        node_data = {}
        if include_node_data and isinstance(graph, Graph):
            # stored in permuted order so that a rank reads one contiguous slice
            feats = np.asarray(graph.features, dtype=np.float32)
            labels = np.asarray(graph.labels, dtype=np.int64)
            np.save(tmp / "features_col.npy", feats[col_perm])
            np.save(tmp / "labels_row.npy", labels[row_perm])
            np.save(tmp / "labels_col.npy", labels[col_perm])
            node_data = {"features_col": "features_col.npy", "labels_row": "labels_row.npy",
                         "labels_col": "labels_col.npy",
                         "num_features": int(feats.shape[1]), "num_classes": int(graph.num_classes)}
        manifest = {
            "format": SHARD_FORMAT,
            "version": SHARD_VERSION,
            "name": graph.name if isinstance(graph, Graph) else "adjacency",
            "num_nodes": int(n),
            "num_nodes_padded": int(n_pad),
            "nnz": int(permuted.nnz),
            "blocks": [rb, cb],
            "block_rows": int(br),
            "block_cols": int(bc),
            "matrix": "B = A_hat[row_perm][:, col_perm], A_hat = D^-1/2 (A + I) D^-1/2 (float32), "
                      "row v of A holds the in-neighbours of v; rows/columns >= num_nodes are zero padding",
            "normalized": True,
            "symmetric": bool(is_symmetric(adj)),
            "permutation": {"mode": mode, "seed": int(seed), "row_file": "row_perm.npy", "col_file": "col_perm.npy"},
            "block_nnz": counts.tolist(),
            "files": files,
            "node_data": node_data,
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def read_manifest(shard_dir) -> dict:
    """The checked manifest of a shard directory: its schema (:data:`MANIFEST_SCHEMA`) and the
    agreement of its fields (UserError naming the file and the field otherwise)."""
    shard_dir = Path(shard_dir)
    path = shard_dir / "manifest.json"
    if not path.is_file():
        raise UserError(f"{shard_dir} is not a shard directory (no manifest.json); create one with "
                        "plexus-tune graph shard")
    fix = "re-create the shards"
    manifest = read_json(path, MANIFEST_SCHEMA, fix=fix)
    if manifest.get("format") != SHARD_FORMAT or manifest.get("version") != SHARD_VERSION:
        raise UserError(f"{path}: not a version-{SHARD_VERSION} plexus shard manifest")
    n, n_pad, (rb, cb) = manifest["num_nodes"], manifest["num_nodes_padded"], manifest["blocks"]
    expected = {"num_nodes_padded": padded_size(n, rb, cb) if max(rb, cb) <= n else None}
    if expected["num_nodes_padded"] is not None:
        expected.update(block_rows=n_pad // rb, block_cols=n_pad // cb)
    for key, value in expected.items():
        if manifest[key] != value:
            raise UserError(f"{path}: field {key} is {manifest[key]}, {value} agrees with num_nodes {n:,} "
                            f"and blocks {rb}x{cb}; {fix}")
    counts = manifest["block_nnz"]
    if len(counts) != rb or any(len(row) != cb for row in counts):
        raise UserError(f"{path}: field block_nnz is not {rb} rows of {cb} counts (blocks {rb}x{cb}); {fix}")
    if sum(map(sum, counts)) != manifest["nnz"]:
        raise UserError(f"{path}: field nnz is {manifest['nnz']:,}, the blocks hold {sum(map(sum, counts)):,}; {fix}")
    seen = set()
    for i, entry in enumerate(manifest["files"]):
        r, c = entry["row"], entry["col"]
        if r >= rb or c >= cb or (r, c) in seen:
            raise UserError(f"{path}: field files[{i}] is block ({r}, {c}), "
                            + ("again" if (r, c) in seen else f"outside the {rb}x{cb} blocks") + f"; {fix}")
        seen.add((r, c))
        if entry["nnz"] != counts[r][c]:
            raise UserError(f"{path}: field files[{i}].nnz is {entry['nnz']:,}, block_nnz[{r}][{c}] is "
                            f"{counts[r][c]:,}; {fix}")
        if Path(entry["file"]).name != entry["file"]:
            raise UserError(f"{path}: field files[{i}].file {entry['file']!r} is not a file name of the directory; {fix}")
    if len(seen) != rb * cb:
        raise UserError(f"{path}: field files lists {len(seen)} blocks, the {rb}x{cb} grid has {rb * cb}; {fix}")
    node_data = manifest.get("node_data") or {}
    missing = [key for key in _NODE_DATA if key not in node_data]
    if node_data and missing:
        raise UserError(f"{path}: field node_data lacks {missing[0]!r}; {fix}")
    return manifest


def check_shard_files(shard_dir, manifest: dict | None = None) -> dict:
    """The manifest of a shard directory whose contents are usable, checked before any rank starts:
    every block file present with its recorded size and a valid block (:func:`_read_block`), the
    permutations permutations of the nodes, node data of the recorded shapes, finite features and
    labels below the class count (:mod:`plexus_tune.graph.checks`); checksums are left to the ranks."""
    shard_dir = Path(shard_dir)
    manifest = manifest or read_manifest(shard_dir)
    for entry in manifest["files"]:
        path = shard_dir / entry["file"]
        if not path.is_file():
            raise UserError(f"{shard_dir}: shard file {entry['file']} is missing; re-create the shards")
        if "bytes" in entry and path.stat().st_size != int(entry["bytes"]):
            raise UserError(f"{path}: {path.stat().st_size} bytes, the manifest says {entry['bytes']} "
                            "(truncated or corrupt); re-create the shards")
    for entry in manifest["files"]:
        _read_block(shard_dir, entry, manifest["block_rows"], manifest["block_cols"], verify=False)
    n = manifest["num_nodes"]
    for key, perm in zip(("row_file", "col_file"), load_permutations(shard_dir, manifest)):
        checks.check_permutation(perm, n, str(shard_dir / manifest["permutation"][key]))
    node_data = manifest.get("node_data")
    if node_data:
        feats, labels = _node_arrays(shard_dir, node_data, "col")
        checks.check_features(feats, n, str(shard_dir / node_data["features_col"]))
        if feats.shape[1] != node_data["num_features"]:
            raise UserError(f"{shard_dir / node_data['features_col']}: {feats.shape[1]} features per node, the "
                            f"manifest says {node_data['num_features']}; re-create the shards")
        for perm in ("row", "col"):
            labels = _node_arrays(shard_dir, node_data, perm)[1]
            checks.check_labels(labels, n, node_data["num_classes"], str(shard_dir / node_data[f"labels_{perm}"]))
    return manifest


def _read_block(shard_dir: Path, entry: dict, br: int, bc: int, verify: bool) -> sp.csr_matrix:
    import scipy.sparse as sp
    path = shard_dir / entry["file"]
    if not path.is_file():
        raise UserError(f"{shard_dir}: shard file {entry['file']} is missing; re-create the shards")
    if verify and _sha256(path) != entry.get("sha256"):
        raise UserError(f"{path}: checksum mismatch (truncated or corrupt); re-create the shards")
    try:
        with np.load(path, allow_pickle=False) as z:
            indptr, indices, data = z["indptr"], z["indices"], z["data"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        raise UserError(f"{path}: cannot read shard file ({exc}); re-create the shards") from None
    checks.check_csr(indptr, indices, data, br, num_cols=bc, where=str(path))
    if indices.shape[0] != entry["nnz"]:
        raise UserError(f"{path}: {indices.shape[0]:,} nonzeros, the manifest says {entry['nnz']:,}; re-create the shards")
    return sp.csr_matrix((data, indices, indptr), shape=(br, bc))


def load_shard_range(shard_dir, rows, cols, *, manifest: dict | None = None, verify: bool = True) -> sp.csr_matrix:
    """Rows ``[i0, i1)`` x columns ``[j0, j1)`` of the padded permuted matrix B, reading
    only the shard files that intersect that range."""
    import scipy.sparse as sp
    shard_dir = Path(shard_dir)
    manifest = manifest or read_manifest(shard_dir)
    n_pad, br, bc = manifest["num_nodes_padded"], manifest["block_rows"], manifest["block_cols"]
    (i0, i1), (j0, j1) = (int(x) for x in rows), (int(x) for x in cols)
    if not (0 <= i0 <= i1 <= n_pad and 0 <= j0 <= j1 <= n_pad):
        raise UserError(f"range rows [{i0},{i1}) x cols [{j0},{j1}) is outside the {n_pad} x {n_pad} "
                        "padded matrix")
    entries = {(f["row"], f["col"]): f for f in manifest["files"]}
    if i1 == i0 or j1 == j0:
        return sp.csr_matrix((i1 - i0, j1 - j0), dtype=np.float32)
    row_groups = []
    for r in range(i0 // br, (i1 - 1) // br + 1):
        parts = []
        for c in range(j0 // bc, (j1 - 1) // bc + 1):
            block = _read_block(shard_dir, entries[(r, c)], br, bc, verify)
            r_lo, r_hi = max(i0 - r * br, 0), min(i1 - r * br, br)
            c_lo, c_hi = max(j0 - c * bc, 0), min(j1 - c * bc, bc)
            if (r_lo, r_hi, c_lo, c_hi) != (0, br, 0, bc):
                block = block[r_lo:r_hi, c_lo:c_hi]
            parts.append(block)
        row_groups.append(parts[0] if len(parts) == 1 else sp.hstack(parts, format="csr"))
    out = row_groups[0] if len(row_groups) == 1 else sp.vstack(row_groups, format="csr")
    out = sp.csr_matrix(out, dtype=np.float32)
    out.sort_indices()
    return out


def shard_bounds(manifest: dict, row_block: int, col_block: int, row_blocks: int, col_blocks: int):
    """``((i0, i1), (j0, j1))`` of target block (row_block, col_block) of a
    ``row_blocks x col_blocks`` grid; UserError unless the grid divides the file grid."""
    fr, fc = manifest["blocks"]
    if row_blocks < 1 or col_blocks < 1 or fr % row_blocks or fc % col_blocks:
        raise UserError(f"block grid {row_blocks}x{col_blocks} does not divide the {fr}x{fc} shard files; "
                        f"use sizes dividing {fr} and {fc}, or re-shard with a grid they divide")
    if not (0 <= row_block < row_blocks and 0 <= col_block < col_blocks):
        raise UserError(f"block ({row_block}, {col_block}) is outside the {row_blocks}x{col_blocks} grid")
    n_pad = manifest["num_nodes_padded"]
    h, w = n_pad // row_blocks, n_pad // col_blocks
    return (row_block * h, (row_block + 1) * h), (col_block * w, (col_block + 1) * w)


def load_shard(shard_dir, row_block: int, col_block: int, row_blocks: int, col_blocks: int, *,
               transpose: bool = False, verify: bool = True) -> sp.csr_matrix:
    """One rank's block of B: ``(N_pad/row_blocks) x (N_pad/col_blocks)`` CSR float32.

    ``row_blocks`` must divide the file grid's R and ``col_blocks`` its C; only the
    ``(R/row_blocks) * (C/col_blocks)`` covering files are read. With ``transpose`` the
    block (row_block, col_block) of ``B^T`` is returned (read from B's block
    (col_block, row_block) of the transposed grid): ``B^T = A_hat^T[col_perm][:, row_perm]``,
    the backward operator, which for a symmetric graph (manifest ``symmetric``) is also the
    alternate layout ``A_hat[col_perm][:, row_perm]`` of the next layer.

    Block bounds use the manifest's ``N_pad`` (a multiple of lcm(R, C)); a trainer that pads
    N differently reads its own bounds with :func:`load_shard_range`.
    """
    manifest = read_manifest(shard_dir)
    if transpose:
        rows, cols = shard_bounds(manifest, col_block, row_block, col_blocks, row_blocks)
        return load_shard_range(shard_dir, rows, cols, manifest=manifest, verify=verify).T.tocsr()
    rows, cols = shard_bounds(manifest, row_block, col_block, row_blocks, col_blocks)
    return load_shard_range(shard_dir, rows, cols, manifest=manifest, verify=verify)


def load_permutations(shard_dir, manifest: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(row_perm, col_perm)`` stored with the shards."""
    shard_dir = Path(shard_dir)
    manifest = manifest or read_manifest(shard_dir)
    try:
        return (np.load(shard_dir / manifest["permutation"]["row_file"], allow_pickle=False),
                np.load(shard_dir / manifest["permutation"]["col_file"], allow_pickle=False))
    except (OSError, ValueError) as exc:
        raise UserError(f"{shard_dir}: cannot read the permutations ({exc}); re-create the shards") from None


def _node_arrays(shard_dir: Path, node_data: dict, perm: str):
    """Memory-mapped ``features_col`` and ``labels_<perm>`` of a shard directory."""
    try:
        return (np.load(shard_dir / node_data["features_col"], mmap_mode="r", allow_pickle=False),
                np.load(shard_dir / node_data[f"labels_{perm}"], mmap_mode="r", allow_pickle=False))
    except (OSError, ValueError) as exc:
        raise UserError(f"{shard_dir}: cannot read node data ({exc}); re-create the shards") from None


def load_node_rows(shard_dir, start: int, stop: int, *, perm: str = "col"):
    """Features and labels of permuted positions ``[start, stop)``: ``features[perm[i]]``
    (zeros past N) and ``labels[perm[i]]`` (-1 past N), with ``perm`` the ``"row"`` or
    ``"col"`` permutation. Features are stored in column-permuted order (the layer-0
    input ``X[col_perm]``) and labels in both orders, so ``perm="col"`` reads contiguous
    memory-mapped slices; ``perm="row"`` gathers the feature rows."""
    shard_dir = Path(shard_dir)
    manifest = read_manifest(shard_dir)
    node_data = manifest.get("node_data")
    if not node_data:
        raise UserError(f"{shard_dir}: these shards were written without features and labels")
    if perm not in ("row", "col"):
        raise UserError(f"perm must be 'row' or 'col', got {perm!r}")
    n = manifest["num_nodes"]
    start, stop = int(start), int(stop)
    if not 0 <= start <= stop:
        raise UserError(f"bad node range [{start}, {stop})")
    lo, hi = min(start, n), min(stop, n)
    feats, labels = _node_arrays(shard_dir, node_data, perm)
    out_f = np.zeros((stop - start, feats.shape[1]), dtype=np.float32)
    out_l = np.full(stop - start, -1, dtype=np.int64)
    if perm == "col":
        out_f[: hi - lo] = feats[lo:hi]
    else:
        row_perm, col_perm = load_permutations(shard_dir)
        out_f[: hi - lo] = feats[invert_permutation(col_perm)[row_perm[lo:hi]]]
    out_l[: hi - lo] = labels[lo:hi]
    return out_f, out_l

