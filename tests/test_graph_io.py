import gzip
import json
import mmap
import os

import numpy as np
import pandas as pd
import pytest
import scipy.io
import scipy.sparse as sp
import torch
from torch_geometric.data import Data

from plexus_tune.errors import UserError
from plexus_tune.graph import synthetic
from plexus_tune.graph.io import detect_format, load_graph, save_graph

# A small undirected graph written out by hand: edges 0-1, 0-2, 1-2, 2-3, node 4 isolated.
PAIRS = [(0, 1), (0, 2), (1, 2), (2, 3)]
DENSE = np.zeros((5, 5))
for u, v in PAIRS:
    DENSE[u, v] = DENSE[v, u] = 1


def file_backed(arr):
    """True if the array is a view of a memory-mapped file (no copy was made)."""
    while arr is not None:
        if isinstance(arr, mmap.mmap):
            return True
        arr = getattr(arr, "base", None)
    return False


def listing(directory):
    return sorted(os.listdir(directory))


def test_edge_list_whitespace_comments_header_and_undirected(tmp_path):
    path = tmp_path / "g.txt"
    path.write_text("% a comment\n# another\nsrc dst\n0 1\n1 0\n0\t2\n\n1 2  \n2 3\n4 4\n")
    g = load_graph(path, features=3, classes=2)
    dense = DENSE.copy()
    dense[4, 4] = 1  # the self-loop line is kept once
    np.testing.assert_array_equal(g.adjacency.toarray(), dense)
    assert g.meta["symmetric"] and g.features.shape == (5, 3) and g.num_classes == 2
    directed = load_graph(path, directed=True, features=3)
    assert directed.adjacency[1, 0] == 1 and directed.adjacency[0, 1] == 1 and directed.adjacency[2, 0] == 1
    assert directed.adjacency[0, 2] == 0  # only 0 -> 2 was listed: row 2 holds in-neighbour 0


def test_edge_list_csv_with_weights(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("source,target,weight\n0,1,0.5\n2,1,2.0\n")
    g = load_graph(path, directed=True, features=2)
    expected = np.zeros((3, 3))
    expected[1, 0] = 0.5
    expected[1, 2] = 2.0
    np.testing.assert_allclose(g.adjacency.toarray(), expected)


def test_scipy_npz_and_own_npz(tmp_path):
    sp.save_npz(tmp_path / "a.npz", sp.csr_matrix(DENSE))
    g = load_graph(tmp_path / "a.npz", features=4, classes=3)
    np.testing.assert_array_equal(g.adjacency.toarray(), DENSE)
    assert g.features.shape == (5, 4) and set(g.labels.tolist()) <= {0, 1, 2}
    feats = np.arange(10, dtype=np.float32).reshape(5, 2)
    labels = np.array([0, 1, 0, 1, 2])
    ei = np.array([[0, 1, 2], [1, 2, 3]])  # directed edges u -> v
    np.savez(tmp_path / "own.npz", edge_index=ei, features=feats, labels=labels)
    h = load_graph(tmp_path / "own.npz")
    assert h.num_nodes == 5 and h.num_classes == 3
    assert h.adjacency[1, 0] == 1 and h.adjacency[0, 1] == 0
    np.testing.assert_array_equal(h.features, feats)
    np.testing.assert_array_equal(h.labels, labels)


def test_matrix_market(tmp_path):
    scipy.io.mmwrite(str(tmp_path / "m.mtx"), sp.coo_matrix(DENSE))
    g = load_graph(tmp_path / "m.mtx", features=2)
    np.testing.assert_array_equal(g.adjacency.toarray(), DENSE)


def write_ogb(root, edges, n, feats=None, labels=None):
    raw = root / "raw"
    raw.mkdir(parents=True)
    pd.DataFrame(edges).to_csv(raw / "edge.csv.gz", header=False, index=False, compression="gzip")
    pd.DataFrame([n]).to_csv(raw / "num-node-list.csv.gz", header=False, index=False, compression="gzip")
    pd.DataFrame([len(edges)]).to_csv(raw / "num-edge-list.csv.gz", header=False, index=False, compression="gzip")
    if feats is not None:
        pd.DataFrame(feats).to_csv(raw / "node-feat.csv.gz", header=False, index=False, compression="gzip")
    if labels is not None:
        pd.DataFrame(labels).to_csv(raw / "node-label.csv.gz", header=False, index=False, compression="gzip")


def test_ogb_layout(tmp_path):
    feats = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    labels = np.array([[1], [0], [2], [1], [0]])
    write_ogb(tmp_path / "ogbn_tiny", PAIRS, 5, feats, labels)
    assert detect_format(tmp_path / "ogbn_tiny") == "ogb"
    g = load_graph(tmp_path / "ogbn_tiny")
    np.testing.assert_array_equal(g.adjacency.toarray(), DENSE)  # single direction stored, mirrored on load
    np.testing.assert_allclose(g.features, feats, rtol=1e-6)
    assert g.labels.tolist() == [1, 0, 2, 1, 0] and g.num_classes == 3 and g.name == "ogbn_tiny"
    one_way = load_graph(tmp_path / "ogbn_tiny" / "raw", directed=True)
    assert one_way.nnz == 4 and one_way.adjacency[1, 0] == 1


def test_pyg_data(tmp_path):
    x = torch.randn(5, 3)
    y = torch.tensor([0, 1, 1, 0, 2])
    ei = torch.tensor([[0, 1, 3], [1, 2, 2]])
    torch.save(Data(x=x, edge_index=ei, y=y, num_nodes=5), tmp_path / "d.pt")
    g = load_graph(tmp_path / "d.pt")
    expected = np.zeros((5, 5))
    expected[1, 0] = expected[2, 1] = expected[2, 3] = 1
    np.testing.assert_array_equal(g.adjacency.toarray(), expected)
    np.testing.assert_array_equal(g.features, x.numpy())
    assert g.labels.tolist() == y.tolist() and g.num_classes == 3


def test_own_format_round_trip_is_memory_mapped(tmp_path):
    g = synthetic("rmat:nodes=200,edges=800,features=6,classes=4,seed=1")
    assert save_graph(g, tmp_path / "g.plexus") == "plexus"
    assert listing(tmp_path) == ["g.plexus"]  # no temporary left
    assert sorted(os.listdir(tmp_path / "g.plexus")) == [
        "data.npy", "features.npy", "indices.npy", "indptr.npy", "labels.npy", "metadata.json"]
    h = load_graph(tmp_path / "g.plexus")
    assert (g.adjacency != h.adjacency).nnz == 0
    assert isinstance(h.features, np.memmap)
    for arr in (h.adjacency.indptr, h.adjacency.indices, h.adjacency.data, h.features, h.labels):
        assert file_backed(arr)
    np.testing.assert_array_equal(h.features, g.features)
    np.testing.assert_array_equal(h.labels, g.labels)
    assert h.num_classes == 4 and h.name == g.name and h.meta["symmetric"]
    with pytest.raises(UserError, match="already exists"):
        save_graph(g, tmp_path / "g.plexus")


@pytest.mark.parametrize("name", ["c.npz", "c.mtx", "c.txt", "c.csv.gz", "c.pt"])
def test_convert_round_trips(tmp_path, name):
    g = synthetic("rmat:nodes=64,edges=200,features=3,classes=2,seed=3")
    save_graph(g, tmp_path / name)
    assert listing(tmp_path) == [name]
    h = load_graph(tmp_path / name, features=3)
    np.testing.assert_array_equal(h.adjacency.toarray(), g.adjacency.toarray())
    if name in ("c.npz", "c.pt"):
        np.testing.assert_array_equal(h.features, g.features)
        np.testing.assert_array_equal(h.labels, g.labels)


def test_errors_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="no such file"):
        load_graph(tmp_path / "missing.txt")
    (tmp_path / "x.xyz").write_text("1 2\n")
    with pytest.raises(UserError, match="unknown graph format"):
        load_graph(tmp_path / "x.xyz")
    (tmp_path / "empty.csv").write_text("src,dst\n")
    with pytest.raises(UserError, match="no nodes"):
        load_graph(tmp_path / "empty.csv")
    (tmp_path / "junk.npz").write_bytes(b"not a zip archive")
    with pytest.raises(UserError, match="not an .npz"):
        load_graph(tmp_path / "junk.npz")
    torch.save(torch.zeros(3), tmp_path / "tensor.pt")
    with pytest.raises(UserError, match="no edge_index"):
        load_graph(tmp_path / "tensor.pt")
    (tmp_path / "bad.txt").write_text("0 1\n1 x\n")
    with pytest.raises(UserError):
        load_graph(tmp_path / "bad.txt")
    (tmp_path / "neg.txt").write_text("0 1\n-1 2\n")
    with pytest.raises(UserError, match="negative|out of range"):
        load_graph(tmp_path / "neg.txt")
    np.savez(tmp_path / "oor.npz", edge_index=np.array([[0, 7], [1, 2]]), num_nodes=5)
    with pytest.raises(UserError, match="out of range"):
        load_graph(tmp_path / "oor.npz")
    write_ogb(tmp_path / "ogb_bad", [(0, 1), (1, 9)], 5)
    with pytest.raises(UserError, match="out of range"):
        load_graph(tmp_path / "ogb_bad")
    # truncated files of each binary format
    g = synthetic("rmat:nodes=64,edges=200,features=3,classes=2")
    for name in ("t.npz", "t.pt", "t.csv.gz", "t.mtx"):
        save_graph(g, tmp_path / name)
        data = (tmp_path / name).read_bytes()
        (tmp_path / name).write_bytes(data[: len(data) // 2])
        with pytest.raises(UserError):
            load_graph(tmp_path / name)
    save_graph(g, tmp_path / "own")
    indices = tmp_path / "own" / "indices.npy"
    indices.write_bytes(indices.read_bytes()[:200])
    with pytest.raises(UserError, match="truncated or corrupt"):
        load_graph(tmp_path / "own")
    (tmp_path / "own2").mkdir()
    (tmp_path / "own2" / "metadata.json").write_text("{not json")
    with pytest.raises(UserError, match="JSON"):
        load_graph(tmp_path / "own2")
    with gzip.open(tmp_path / "gz.txt.gz", "wb") as fh:
        fh.write(b"0 1\n" * 1000)
    data = (tmp_path / "gz.txt.gz").read_bytes()
    (tmp_path / "gz.txt.gz").write_bytes(data[:-10])
    with pytest.raises(UserError):
        load_graph(tmp_path / "gz.txt.gz")


def test_failed_write_leaves_nothing(tmp_path):
    g = synthetic("rmat:nodes=64,edges=200,features=3,classes=2")
    g.meta["unserializable"] = json  # falls back to str(), still writes
    save_graph(g, tmp_path / "ok")
    assert json.loads((tmp_path / "ok" / "metadata.json").read_text())["num_nodes"] == 64

    bad = synthetic("rmat:nodes=64,edges=200,features=3,classes=2")
    bad.labels = None  # makes the writer fail halfway through
    with pytest.raises(Exception):
        save_graph(bad, tmp_path / "broken")
    assert listing(tmp_path) == ["ok"]
    with pytest.raises(Exception):
        save_graph(bad, tmp_path / "broken.npz")
    assert listing(tmp_path) == ["ok"]
