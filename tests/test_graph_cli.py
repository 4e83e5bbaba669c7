import json
import os
import subprocess
import sys

import numpy as np
import pytest

from plexus_tune.cli import main
from plexus_tune.graph import gcn_normalize, load_graph, load_shard, permutations_for



def test_generate_stats_shard_round_trip(tmp_path, run_cli):
    g = tmp_path / "g"
    code, out, err = run_cli(["graph", "generate", "grid2d", "--nodes", "900", "--features", "4", "--classes", "3",
                              "--seed", "1", "--out", str(g)])
    assert code == 0, err
    assert "900 nodes" in out
    graph = load_graph(g)
    assert graph.num_nodes == 900 and graph.num_features == 4 and graph.num_classes == 3

    code, out, err = run_cli(["graph", "stats", str(g), "--blocks", "4x4", "--format", "json"])
    assert code == 0, err
    stats = json.loads(out)
    assert stats["nodes"] == 900 and stats["nnz"] == graph.nnz
    assert stats["nnz_normalized"] == graph.nnz + 900
    assert stats["balance"]["none"]["max_over_mean"] > stats["balance"]["double"]["max_over_mean"]
    assert np.sum(stats["balance"]["double"]["block_nnz"]) == graph.nnz + 900

    shards = tmp_path / "sh"
    code, out, err = run_cli(["graph", "shard", str(g), "--blocks", "4x4", "--out", str(shards), "--seed", "2"])
    assert code == 0, err
    rp, cp = permutations_for("double", 900, 2)
    whole = gcn_normalize(graph.adjacency).toarray()[rp][:, cp]
    np.testing.assert_array_equal(load_shard(shards, 1, 0, 2, 2).toarray(), whole[450:900, 0:450])

    code, out, err = run_cli(["graph", "stats", str(shards), "--blocks", "2x4", "--format", "json"])
    assert code == 0, err
    info = json.loads(out)
    assert info["block_shape"] == [450, 225]
    assert info["block_nnz"][1][2] == np.count_nonzero(whole[450:900, 450:675])


def test_generate_rmat_and_convert(tmp_path, run_cli):
    code, out, err = run_cli(["graph", "generate", "rmat", "--nodes", "256", "--edges", "1k", "--features", "2",
                              "--classes", "2", "--param", "noise=0.1", "--out", str(tmp_path / "r.npz")])
    assert code == 0, err
    code, out, err = run_cli(["graph", "convert", str(tmp_path / "r.npz"), str(tmp_path / "r.mtx")])
    assert code == 0, err
    assert "not stored" in out
    a = load_graph(tmp_path / "r.npz")
    b = load_graph(tmp_path / "r.mtx", features=2)
    assert a.nnz == 2000 and (a.adjacency != b.adjacency).nnz == 0


@pytest.mark.parametrize("argv,message", [
    (["graph", "stats", "{tmp}/missing.npz"], "no such file"),
    (["graph", "convert", "{tmp}/bad.xyz", "{tmp}/out"], "unknown graph format"),
    (["graph", "convert", "{tmp}/oor.npz", "{tmp}/out"], "out of range"),
    (["graph", "convert", "{tmp}/trunc.npz", "{tmp}/out"], "truncated or corrupt"),
    (["graph", "convert", "{tmp}/e.txt", "{tmp}/out.weird"], "cannot write"),
    (["graph", "shard", "{tmp}/e.txt", "--blocks", "8x0", "--out", "{tmp}/out"], "block grid"),
    (["graph", "stats", "{tmp}/shards", "--blocks", "3x2"], "does not divide"),
    (["graph", "generate", "rmat", "--nodes", "10", "--edges", "40", "--out", "{tmp}/out"], "too dense"),
    (["graph", "generate", "grid2d", "--nodes", "x", "--out", "{tmp}/out"], "whole number"),
    (["graph", "generate", "grid2d", "--nodes", "100", "--param", "bogus=1", "--out", "{tmp}/out"], "does not take"),
    (["graph", "generate", "torus", "--nodes", "100", "--out", "{tmp}/out"], "invalid choice"),
])
def test_bad_input_is_one_line_exit_2_and_leaves_no_output(tmp_path, capsys, argv, message, run_cli):
    (tmp_path / "bad.xyz").write_text("0 1\n")
    (tmp_path / "e.txt").write_text("0 1\n1 2\n2 3\n3 4\n")  # 5 nodes: a 4x4 file grid has rows in every block
    np.savez(tmp_path / "oor.npz", edge_index=np.array([[0, 5], [1, 2]]), num_nodes=3)
    np.savez(tmp_path / "trunc.npz", edge_index=np.arange(2000).reshape(2, 1000))
    data = (tmp_path / "trunc.npz").read_bytes()
    (tmp_path / "trunc.npz").write_bytes(data[: len(data) // 2])
    assert main(["graph", "shard", str(tmp_path / "e.txt"), "--blocks", "4x4", "--out", str(tmp_path / "shards"),
                 "--make-features", "2"]) == 0
    capsys.readouterr()
    before = sorted(os.listdir(tmp_path))
    argv = [a.format(tmp=tmp_path) for a in argv]
    code, out, err = run_cli(argv)
    assert code == 2
    assert err.strip().count("\n") == 0 and "Traceback" not in err
    assert message in err
    assert sorted(os.listdir(tmp_path)) == before  # nothing written, no temporaries


def test_subprocess_error_has_no_traceback(tmp_path):
    (tmp_path / "g.csv").write_text("src,dst\n0,1\n1,oops\n")
    proc = subprocess.run([sys.executable, "-m", "plexus_tune", "graph", "convert", str(tmp_path / "g.csv"),
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("plexus-tune: error:") and proc.stderr.count("\n") == 1
    assert sorted(os.listdir(tmp_path)) == ["g.csv"]
