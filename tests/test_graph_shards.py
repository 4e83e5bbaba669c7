import json
import os

import numpy as np
import pytest
import scipy.sparse as sp

from plexus_tune.errors import UserError
from plexus_tune.graph import gcn_normalize, permutations_for, synthetic
from plexus_tune.graph.shards import (
    load_node_rows,
    load_permutations,
    load_shard,
    load_shard_range,
    read_manifest,
    write_shards,
)


def grids_of(g):
    """(row_blocks, col_blocks) pairs a rank's adjacency shard can have on G GPUs: the
    depth and outer axis sizes of some Gx x Gy x Gz = G."""
    divisors = [d for d in range(1, g + 1) if g % d == 0]
    return sorted({(a, b) for a in divisors for b in divisors if g % (a * b) == 0})


@pytest.fixture(scope="module")
def graph():
    # 101 nodes: not a multiple of any grid size, so padding is exercised
    return synthetic("rmat:nodes=101,edges=400,features=5,classes=3,seed=2")


def expected_padded(graph, mode, seed, n_pad):
    rp, cp = permutations_for(mode, graph.num_nodes, seed)
    dense = gcn_normalize(graph.adjacency).toarray()[rp][:, cp]
    out = np.zeros((n_pad, n_pad), dtype=np.float32)
    out[: graph.num_nodes, : graph.num_nodes] = dense
    return out


@pytest.mark.parametrize("file_grid,gpus", [((8, 8), (1, 2, 4, 8)), ((6, 6), (6,))])
def test_every_rank_shard_equals_slice_of_whole_permuted_matrix(tmp_path, graph, file_grid, gpus):
    out = tmp_path / "shards"
    manifest = write_shards(graph, out, file_grid, mode="double", seed=5)
    n_pad = manifest["num_nodes_padded"]
    assert n_pad % file_grid[0] == 0 and n_pad >= graph.num_nodes and n_pad - graph.num_nodes < file_grid[0]
    whole = expected_padded(graph, "double", 5, n_pad)
    assert manifest["nnz"] == np.count_nonzero(whole)
    assert sum(map(sum, manifest["block_nnz"])) == manifest["nnz"]
    for g in gpus:
        for rb, cb in grids_of(g):
            h, w = n_pad // rb, n_pad // cb
            reassembled = np.zeros_like(whole)
            for i in range(rb):
                for j in range(cb):
                    shard = load_shard(out, i, j, rb, cb)
                    assert shard.shape == (h, w) and shard.dtype == np.float32
                    assert shard.has_sorted_indices
                    np.testing.assert_array_equal(shard.toarray(), whole[i * h:(i + 1) * h, j * w:(j + 1) * w])
                    reassembled[i * h:(i + 1) * h, j * w:(j + 1) * w] = shard.toarray()
            np.testing.assert_array_equal(reassembled, whole)


def test_loader_reads_only_covering_files(tmp_path, graph, monkeypatch):
    out = tmp_path / "s"
    write_shards(graph, out, (4, 4), mode="single", seed=1)
    opened = []
    real_load = np.load

    def spy(path, *args, **kwargs):
        opened.append(os.path.basename(str(path)))
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(np, "load", spy)
    load_shard(out, 1, 0, 2, 4)
    assert sorted(opened) == ["block_r2_c0.npz", "block_r3_c0.npz"]


def test_transpose_and_ranges_and_node_rows(tmp_path, graph):
    out = tmp_path / "s"
    manifest = write_shards(graph, out, (4, 4), mode="double", seed=3)
    n_pad = manifest["num_nodes_padded"]
    whole = expected_padded(graph, "double", 3, n_pad)
    h = n_pad // 2
    np.testing.assert_array_equal(load_shard(out, 0, 1, 2, 4, transpose=True).toarray(),
                                  whole.T[0:h, n_pad // 4:n_pad // 2])
    np.testing.assert_array_equal(load_shard_range(out, (7, 60), (13, 95)).toarray(), whole[7:60, 13:95])
    rp, cp = load_permutations(out)
    assert np.array_equal(rp, permutations_for("double", graph.num_nodes, 3)[0])
    feats, labels = load_node_rows(out, 96, n_pad, perm="col")
    np.testing.assert_array_equal(feats[: graph.num_nodes - 96], graph.features[cp[96:]])
    assert np.all(feats[graph.num_nodes - 96:] == 0) and np.all(labels[graph.num_nodes - 96:] == -1)
    np.testing.assert_array_equal(labels[: graph.num_nodes - 96], graph.labels[cp[96:]])
    feats, labels = load_node_rows(out, 10, 30, perm="row")
    np.testing.assert_array_equal(feats, graph.features[rp[10:30]])
    np.testing.assert_array_equal(labels, graph.labels[rp[10:30]])


def test_shard_errors(tmp_path, graph):
    out = tmp_path / "s"
    write_shards(graph, out, (4, 4))
    with pytest.raises(UserError, match="does not divide"):
        load_shard(out, 0, 0, 3, 1)
    with pytest.raises(UserError, match="outside"):
        load_shard(out, 2, 0, 2, 2)
    with pytest.raises(UserError, match="not a shard directory"):
        load_shard(tmp_path, 0, 0, 1, 1)
    with pytest.raises(UserError, match="already exists"):
        write_shards(graph, out, (4, 4))
    block = out / "block_r0_c0.npz"
    block.write_bytes(block.read_bytes()[:-20])
    with pytest.raises(UserError, match="checksum"):
        load_shard(out, 0, 0, 4, 4)
    with pytest.raises(UserError, match="cannot read"):
        load_shard(out, 0, 0, 4, 4, verify=False)
    (out / "block_r1_c1.npz").unlink()
    with pytest.raises(UserError, match="missing"):
        load_shard(out, 1, 1, 4, 4)
    (out / "manifest.json").write_text("{broken")
    with pytest.raises(UserError, match="corrupt"):
        read_manifest(out)


def test_manifest_contents(tmp_path, graph):
    manifest = write_shards(graph, tmp_path / "s", (2, 3), mode="none")
    on_disk = json.loads((tmp_path / "s" / "manifest.json").read_text())
    assert on_disk == manifest
    assert manifest["num_nodes_padded"] == 102  # next multiple of lcm(2, 3) = 6
    assert (manifest["block_rows"], manifest["block_cols"]) == (51, 34)
    assert len(manifest["files"]) == 6 and all(len(f["sha256"]) == 64 for f in manifest["files"])
    whole = sp.csr_matrix(expected_padded(graph, "none", 0, 102))
    assert manifest["block_nnz"][1][2] == whole[51:102, 68:102].nnz
    assert sorted(os.listdir(tmp_path)) == ["s"]
