"""Graph contents and metadata that every reader refuses, checked in one place
(plexus_tune.graph.checks, plexus_tune.jsonfile) before any rank starts.

One table of (input, the file the refusal must name, a substring of the message) over every
reader: npz (edge_index and CSR arrays), PyG .pt, edge list, the memory-mapped directory and
the shard directory. The library refuses each with a UserError naming the file and the
first bad entry; representatives of each reader go through the commands that read graphs
(train, predict --graph, graph convert, graph stats, calibrate spmm --graph, measure) and must
be one line, exit 2, nothing printed before, nothing written.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from plexus_tune.cli import main
from plexus_tune.errors import UserError
from plexus_tune.graph import load_graph
from plexus_tune.graph.shards import check_shard_files


def _save_npz(path, **arrays):
    np.savez(path, **arrays)


def _edit_npy(directory: Path, name: str, edit) -> None:
    arr = np.load(directory / name)
    edit(arr)
    np.save(directory / name, arr)


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    path.write_text(json.dumps(edit(data)))


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    d = tmp_path_factory.mktemp("contents")
    assert main(["graph", "generate", "grid2d", "--nodes", "64", "--features", "4", "--classes", "4",
                 "--out", str(d / "g.npz")]) == 0
    a = dict(np.load(d / "g.npz"))
    n = int(a["num_nodes"])
    rows = np.repeat(np.arange(n), np.diff(a["indptr"]))
    ei = np.vstack([a["indices"], rows]).astype(np.float64)
    base = {"features": a["features"], "labels": a["labels"], "num_classes": a["num_classes"], "num_nodes": a["num_nodes"]}
    frac = ei.copy()
    frac[1, 5] = 2.5
    _save_npz(d / "frac.npz", edge_index=frac, **base)
    _save_npz(d / "infw.npz", edge_index=ei.astype(np.int64), weights=np.where(np.arange(ei.shape[1]) == 7, np.inf, 1.0),
              **base)
    nanw = a["data"].copy()
    nanw[3] = np.nan
    _save_npz(d / "nanw.npz", **{**a, "data": nanw})
    neg = a["indices"].copy()
    neg[2] = -1
    _save_npz(d / "negidx.npz", **{**a, "indices": neg})
    _save_npz(d / "zerowidth.npz", **{**a, "features": np.zeros((n, 0), np.float32)})
    _save_npz(d / "nolabel.npz", **{**a, "labels": np.full(n, -1)})
    _save_npz(d / "bigl.npz", **{**a, "labels": np.where(np.arange(n) == 9, 4, a["labels"])})
    _save_npz(d / "zerocls.npz", **{**a, "num_classes": np.int64(0)})
    x = torch.from_numpy(a["features"])
    torch.save({"edge_index": torch.from_numpy(frac), "x": x, "y": torch.from_numpy(a["labels"])}, d / "frac.pt")
    nanx = a["features"].copy()
    nanx[11, 2] = np.nan
    torch.save({"edge_index": torch.from_numpy(ei.astype(np.int64)), "x": torch.from_numpy(nanx),
                "y": torch.from_numpy(a["labels"])}, d / "nanx.pt")
    torch.save({"edge_index": torch.from_numpy(ei.astype(np.int64)), "x": x, "y": torch.full((n,), -1)}, d / "nolabel.pt")
    torch.save({"edge_index": torch.from_numpy(ei.astype(np.int64)), "x": x, "y": torch.from_numpy(a["labels"]),
                "edge_weight": torch.full((ei.shape[1],), float("nan"))}, d / "nanw.pt")
    (d / "frac.txt").write_text("0 1\n1 2.5\n2 3\n")
    (d / "nanw.txt").write_text("0 1 1.0\n1 2 nan\n2 3 1.0\n")
    (d / "infw.txt").write_text("0 1 1.0\n1 2 inf\n2 3 1.0\n")
    # the memory-mapped directory
    assert main(["graph", "convert", str(d / "g.npz"), str(d / "dir")]) == 0
    for name, edit in {
        "dir_nanx": lambda p: _edit_npy(p, "features.npy", lambda f: f.__setitem__((5, 1), np.nan)),
        "dir_bigl": lambda p: _edit_npy(p, "labels.npy", lambda f: f.__setitem__(6, 9)),
        "dir_nolabel": lambda p: _edit_npy(p, "labels.npy", lambda f: f.__setitem__(slice(None), -1)),
        "dir_negidx": lambda p: _edit_npy(p, "indices.npy", lambda f: f.__setitem__(4, -3)),
        "dir_oobidx": lambda p: _edit_npy(p, "indices.npy", lambda f: f.__setitem__(4, 64)),
        "dir_indptr": lambda p: _edit_npy(p, "indptr.npy", lambda f: f.__setitem__(10, f[12])),
        "dir_nanw": lambda p: _edit_npy(p, "data.npy", lambda f: f.__setitem__(8, np.inf)),
        "dir_zerocls": lambda p: _edit_json(p / "metadata.json", lambda m: {**m, "num_classes": 0}),
        "dir_list": lambda p: _edit_json(p / "metadata.json", lambda m: [m]),
        "dir_type": lambda p: _edit_json(p / "metadata.json", lambda m: {**m, "num_nodes": "64"}),
        "dir_arrays": lambda p: _edit_json(p / "metadata.json", lambda m: {**m, "arrays": list(m["arrays"])}),
    }.items():
        shutil.copytree(d / "dir", d / name)
        edit(d / name)
    # the shard directory
    assert main(["graph", "shard", str(d / "g.npz"), "--blocks", "2x2", "--out", str(d / "sh")]) == 0
    for name, edit in {
        "sh_perm": lambda p: _edit_npy(p, "row_perm.npy", lambda f: f.__setitem__(3, f[2])),
        "sh_nanx": lambda p: _edit_npy(p, "features_col.npy", lambda f: f.__setitem__((7, 0), np.nan)),
        "sh_bigl": lambda p: _edit_npy(p, "labels_row.npy", lambda f: f.__setitem__(1, 4)),
        "sh_zerocls": lambda p: _edit_json(p / "manifest.json",
                                           lambda m: {**m, "node_data": {**m["node_data"], "num_classes": 0}}),
        "sh_list": lambda p: _edit_json(p / "manifest.json", lambda m: [m]),
        "sh_nodes": lambda p: _edit_json(p / "manifest.json", lambda m: {**m, "num_nodes": 70}),
        "sh_nnz": lambda p: _edit_json(p / "manifest.json", lambda m: {**m, "nnz": m["nnz"] + 1}),
        "sh_files": lambda p: _edit_json(p / "manifest.json", lambda m: {**m, "files": m["files"][:3]}),
    }.items():
        shutil.copytree(d / "sh", d / name)
        edit(d / name)
    return d


# (input, the file the message names, a substring of the message)
CASES = [
    # npz, edge_index and CSR arrays
    ("frac.npz", "frac.npz", "edge target 2.5 at entry 5 is not a whole number"),
    ("infw.npz", "infw.npz", "edge weight inf at entry 7 is NaN or infinite"),
    ("nanw.npz", "nanw.npz", "edge weight nan at entry 3"),
    ("negidx.npz", "negidx.npz", "column index -1 at entry 2 is out of range"),
    ("zerowidth.npz", "zerowidth.npz", "features have width 0"),
    ("nolabel.npz", "nolabel.npz", "no node is labelled"),
    ("bigl.npz", "bigl.npz", "label 4 of node 9 is outside 0..3"),
    ("zerocls.npz", "zerocls.npz", "class count must be a whole number >= 1, got 0"),
    # PyG
    ("frac.pt", "frac.pt", "edge target 2.5 at entry 5"),
    ("nanx.pt", "nanx.pt", "features of node 11"),
    ("nolabel.pt", "nolabel.pt", "no node is labelled"),
    ("nanw.pt", "nanw.pt", "edge weight nan at entry 0"),
    # edge lists
    ("frac.txt", "frac.txt", "node ids must be whole numbers"),
    ("infw.txt", "infw.txt", "edge weight inf at entry 1"),
    ("nanw.txt", "nanw.txt", "weight"),
    # the memory-mapped directory
    ("dir_nanx", "dir_nanx/features.npy", "features of node 5"),
    ("dir_bigl", "dir_bigl/labels.npy", "label 9 of node 6 is outside 0..3"),
    ("dir_nolabel", "dir_nolabel/labels.npy", "no node is labelled"),
    ("dir_negidx", "dir_negidx/indices.npy", "column index -3 at entry 4 is out of range"),
    ("dir_oobidx", "dir_oobidx/indices.npy", "column index 64 at entry 4 is out of range for 64 nodes"),
    ("dir_indptr", "dir_indptr/indptr.npy", "indptr decreases at row 10"),
    ("dir_nanw", "dir_nanw/data.npy", "edge weight inf at entry 8"),
    ("dir_zerocls", "dir_zerocls/metadata.json", "field num_classes: 0 is less than the minimum of 1"),
    ("dir_list", "dir_list/metadata.json", "field (top level) is a list, object expected"),
    ("dir_type", "dir_type/metadata.json", "field num_nodes is the string '64', integer expected"),
    ("dir_arrays", "dir_arrays/metadata.json", "field arrays is a list, object expected"),
    # the shard directory
    ("sh_perm", "sh_perm/row_perm.npy", "entry 3 repeats node"),
    ("sh_nanx", "sh_nanx/features_col.npy", "features of node 7"),
    ("sh_bigl", "sh_bigl/labels_row.npy", "label 4 of node 1 is outside 0..3"),
    ("sh_zerocls", "sh_zerocls/manifest.json", "field node_data.num_classes: 0 is less than the minimum of 1"),
    ("sh_list", "sh_list/manifest.json", "field (top level) is a list, object expected"),
    ("sh_nodes", "sh_nodes/manifest.json", "field num_nodes_padded is 64, 70 agrees with num_nodes 70"),
    ("sh_nnz", "sh_nnz/manifest.json", "field nnz is"),
    ("sh_files", "sh_files/manifest.json", "field files lists 3 blocks, the 2x2 grid has 4"),
]


def _load(path: Path):
    if path.name.startswith("sh"):
        return check_shard_files(path)
    return load_graph(path)


def test_every_reader_and_mechanism_is_covered():
    kinds = {name.split(".")[-1] if "." in name else name.split("_")[0] for name, _, _ in CASES}
    assert kinds == {"npz", "pt", "txt", "dir", "sh"}
    assert len(CASES) >= 30


@pytest.mark.parametrize("name, file, expected", CASES, ids=[c[0] for c in CASES])
def test_the_library_refuses_naming_the_file_and_entry(d, name, file, expected):
    with pytest.raises(UserError) as err:
        _load(d / name)
    message = str(err.value)
    assert "\n" not in message
    assert str(d / file) in message, message
    assert expected in message, message


def test_good_inputs_pass(d):
    """The unedited graph in each format loads: the checks refuse only what is wrong."""
    assert load_graph(d / "g.npz").num_nodes == 64
    assert load_graph(d / "dir").num_nodes == 64
    assert check_shard_files(d / "sh")["num_nodes"] == 64


def _snapshot(root: Path) -> dict:
    return {str(p): None if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))}


TRAIN = ["--grid", "2x1x1", "--epochs", "2", "--warmup", "1"]
# (command line, the input, the message's substring): each reader through the commands that read graphs
COMMANDS = [
    (["train", "--graph", "{d}/frac.npz", *TRAIN], "frac.npz", "is not a whole number"),
    (["train", "--graph", "{d}/nanx.pt", *TRAIN], "nanx.pt", "features of node 11"),
    (["train", "--graph", "{d}/infw.txt", *TRAIN], "infw.txt", "NaN or infinite"),
    (["train", "--graph", "{d}/dir_bigl", *TRAIN], "dir_bigl/labels.npy", "outside 0..3"),
    (["train", "--graph", "{d}/sh_nanx", "--grid", "2x2x1", "--epochs", "2", "--warmup", "1"], "sh_nanx/features_col.npy",
     "NaN or infinite"),
    (["train", "--graph", "{d}/sh_perm", "--grid", "2x2x1", "--epochs", "2", "--warmup", "1"], "sh_perm/row_perm.npy",
     "not a permutation"),
    (["predict", "--graph", "{d}/dir_negidx", "--gpus", "4", "--machine", "perlmutter"], "dir_negidx/indices.npy",
     "out of range"),
    (["predict", "--graph", "{d}/sh_list", "--gpus", "4", "--machine", "perlmutter"], "sh_list/manifest.json",
     "is a list, object expected"),
    (["predict", "--graph", "{d}/dir_list", "--gpus", "4", "--machine", "perlmutter"], "dir_list/metadata.json",
     "is a list, object expected"),
    (["graph", "convert", "{d}/zerowidth.npz", "{d}/out.npz"], "zerowidth.npz", "width 0"),
    (["graph", "stats", "{d}/sh_nodes"], "sh_nodes/manifest.json", "agrees with num_nodes"),
    (["calibrate", "spmm", "--graph", "{d}/dir_nolabel", "--gpus", "2", "--out", "{d}/new.jsonl"],
     "dir_nolabel/labels.npy", "no node is labelled"),
    (["measure", "--graph", "{d}/dir_bigl", "--gpus", "4", "--log", "{d}/new.jsonl"], "dir_bigl/labels.npy", "outside"),
]


@pytest.mark.parametrize("argv, file, expected", COMMANDS, ids=[f"{a[0]} {a[2].split('/')[-1]}" for a, _, _ in COMMANDS])
def test_commands_refuse_before_any_work(d, tmp_path, monkeypatch, capsys, argv, file, expected):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PLEXUS_TUNE_DATA", str(tmp_path / "data"))
    before = _snapshot(d), _snapshot(tmp_path)
    code = main([a.replace("{d}", str(d)) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert str(d / file) in err and expected in err, err
    assert (_snapshot(d), _snapshot(tmp_path)) == before
