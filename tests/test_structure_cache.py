"""The structure cache: read instead of recomputed, invalidated by a changed graph, corrupt entries ignored.

References: graph_sparsity without a cache (the statistics computed afresh), the scan
replaced by one that fails (proof that nothing is recomputed), hand-edited files.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from plexus_tune.errors import CorruptCacheWarning
from plexus_tune.graph import generate, load_graph, save_graph
from plexus_tune.graph import cache as cache_module
from plexus_tune.graph.cache import StructureCache, cache_listing
from plexus_tune.graph.structure import normalized_nnz
from plexus_tune.model import sparsity as sparsity_module
from plexus_tune.model.grid import enumerate_grids
from plexus_tune.model.sparsity import graph_sparsity, graph_summary


def _saved(tmp_path, seed=1):
    path = tmp_path / "g"
    save_graph(generate("rmat", nodes=900, edges=5000, features=8, classes=3, seed=seed), path, overwrite=True)
    return path


def _no_scan(*args, **kwargs):
    raise AssertionError("the cache should have answered")


@pytest.mark.parametrize("mode", ["double", "local"])
def test_second_call_reads_the_cache_and_equals_a_fresh_computation(tmp_path, monkeypatch, mode):
    graph = load_graph(_saved(tmp_path))
    grids = enumerate_grids(8)
    root = tmp_path / "cache"
    fresh = graph_sparsity(graph, grids, 3, permute=mode)
    first = graph_sparsity(graph, grids, 3, permute=mode, cache=StructureCache(graph, root))
    counted = graph_summary(graph, StructureCache(graph, root))
    monkeypatch.setattr(sparsity_module, "split_statistics", _no_scan)
    monkeypatch.setattr(sparsity_module, "diagonal_rows", _no_scan)
    monkeypatch.setattr(cache_module, "pattern_hash", _no_scan)  # unchanged files: the remembered hash
    again = graph_sparsity(graph, grids, 3, permute=mode, cache=StructureCache(graph, root))
    assert fresh.entries == first.entries == again.entries
    summary = graph_summary(graph, StructureCache(graph, root))
    assert summary == counted and summary["normalized_nnz"] == normalized_nnz(graph.adjacency) and summary["nodes"] == 900


def test_a_changed_graph_gets_a_new_key(tmp_path):
    path = _saved(tmp_path, seed=1)
    root = tmp_path / "cache"
    before = StructureCache(load_graph(path), root)
    graph_sparsity(load_graph(path), enumerate_grids(4), 3, cache=before)
    path = _saved(tmp_path, seed=2)  # same path, other edges
    after = StructureCache(load_graph(path), root)
    assert after.key != before.key
    assert after.splits("double-seed0") == {}
    keys = {entry["key"] for entry in cache_listing(root)}
    assert before.key in keys


def test_a_corrupt_entry_is_ignored_with_one_warning_and_rewritten(tmp_path):
    graph = load_graph(_saved(tmp_path))
    root = tmp_path / "cache"
    grids = enumerate_grids(4)
    good = graph_sparsity(graph, grids, 3, cache=StructureCache(graph, root))
    cache = StructureCache(graph, root)
    entry = cache.directory / "double-seed0.json"
    for damage in ("{not json", json.dumps({"version": 1, "splits": {"pattern:2x2": {"nnz_max": 1}}})):
        entry.write_text(damage)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            again = graph_sparsity(graph, grids, 3, cache=StructureCache(graph, root))
        assert again.entries == good.entries
        assert [w.category for w in seen] == [CorruptCacheWarning]
        assert str(entry) in str(seen[0].message) and "\n" not in str(seen[0].message)
        assert len(json.loads(entry.read_text())["splits"]) > 0  # rewritten


def test_predict_graph_twice_and_the_cache_listing(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("PLEXUS_TUNE_DATA", str(tmp_path / "data"))
    path = _saved(tmp_path)
    argv = ["predict", "--graph", str(path), "--gpus", "8", "--machine", "h100-80gb-fitted", "--format", "json"]
    code, cold, _ = run_cli(argv)
    assert code == 0
    code, listing, _ = run_cli(["graph", "cache", "--format", "json"])
    graphs = json.loads(listing)["graphs"]
    assert code == 0 and len(graphs) == 1 and graphs[0]["nodes"] == 900 and graphs[0]["entries"]["double-seed0"] > 0
    monkeypatch.setattr(sparsity_module, "split_statistics", _no_scan)
    code, warm, _ = run_cli(argv)
    assert code == 0 and json.loads(warm) == json.loads(cold)
    code, text, _ = run_cli(["graph", "cache"])
    assert code == 0 and graphs[0]["key"] in text and "double-seed0" in text
    code, text, _ = run_cli(["graph", "cache", "--clear"])
    assert code == 0 and "removed 1" in text and cache_listing(tmp_path / "data" / "structure-cache") == []


@pytest.mark.slow
def test_bench_predict_graph_runs_on_a_tiny_graph(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "runners" / "benchmarks" / "bench_predict.py"), "--graph",
                           "rmat:nodes=2000,edges=16000", "--gpus", "8", "--data", str(tmp_path / "graphs")],
                          capture_output=True, text=True, timeout=600, cwd=root)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for label in ("one pass", "cold (empty cache)", "warm (cached)", "predict without the graph"):
        row = next(line for line in lines if label in line)
        wall = float(row.split("wall")[1].split()[0])
        rss = float(row.split("peak RSS")[1].split()[0])
        assert wall > 0 and rss > 0
    assert "warm recommends what cold does: yes" in lines


def test_unchanged_graph_files_are_not_checked_again(tmp_path, monkeypatch):
    from plexus_tune.errors import UserError
    from plexus_tune.graph import checks

    monkeypatch.setenv("PLEXUS_TUNE_DATA", str(tmp_path / "data"))
    path = _saved(tmp_path)
    load_graph(path)  # checked, and remembered as valid

    def fails(*args, **kwargs):
        raise AssertionError("unchanged files were checked again")

    monkeypatch.setattr(checks, "check_csr", fails)
    assert load_graph(path).num_nodes == 900
    monkeypatch.undo()
    monkeypatch.setenv("PLEXUS_TUNE_DATA", str(tmp_path / "data"))
    labels = np.load(path / "labels.npy")
    labels[0] = 10**6  # out of range: the changed file is checked and refused
    np.save(path / "labels.npy", labels)
    with pytest.raises(UserError, match="label"):
        load_graph(path)


def test_a_pattern_read_checks_the_pattern_alone(tmp_path, monkeypatch):
    """predict reads the pattern: bad features pass a pattern read and fail a full one; a bad column index fails both."""
    from plexus_tune.errors import UserError

    monkeypatch.setenv("PLEXUS_TUNE_DATA", str(tmp_path / "data"))
    path = _saved(tmp_path)
    features = np.load(path / "features.npy")
    features[3, 1] = np.nan
    np.save(path / "features.npy", features)
    assert load_graph(path, pattern_only=True).num_features == 8
    with pytest.raises(UserError, match="NaN"):
        load_graph(path)
    indices = np.load(path / "indices.npy")
    indices[7] = 900  # one past the last node
    np.save(path / "indices.npy", indices)
    with pytest.raises(UserError, match="out of range"):
        load_graph(path, pattern_only=True)


def test_a_metis_partition_is_cached_by_graph_parts_and_seed(tmp_path, monkeypatch):
    """The second partition_graph reads the cache (METIS replaced by a failure); another seed,
    part count or graph computes afresh; a corrupt file is ignored with one warning and rewritten."""
    import pymetis

    from plexus_tune.graph import partition
    from plexus_tune.graph.cache import cache_listing, partition_file, pattern_hash

    monkeypatch.setenv("PLEXUS_TUNE_DATA", str(tmp_path / "data"))
    graph = generate("rmat", nodes=600, edges=4000, seed=3)
    fresh = partition.partition_graph(graph.adjacency, 4, seed=1, cache=False)
    first = partition.partition_graph(graph.adjacency, 4, seed=1)
    assert np.array_equal(first, fresh)
    path = partition_file(pattern_hash(graph.adjacency), 4, 1)
    assert path.is_file()
    calls = []
    real = pymetis.part_graph
    monkeypatch.setattr(pymetis, "part_graph", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert np.array_equal(partition.partition_graph(graph.adjacency, 4, seed=1), fresh) and not calls
    partition.partition_graph(graph.adjacency, 4, seed=2)
    partition.partition_graph(graph.adjacency, 3, seed=1)
    partition.partition_graph(generate("rmat", nodes=600, edges=4000, seed=4).adjacency, 4, seed=1)
    assert len(calls) == 3  # another seed, part count, graph: each cut afresh
    listed = {entry for g in cache_listing(tmp_path / "data" / "structure-cache") for entry in g["entries"]}
    assert path.stem in listed
    path.write_bytes(b"not a numpy file")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = partition.partition_graph(graph.adjacency, 4, seed=1)
    assert np.array_equal(again, fresh) and len(calls) == 4
    assert [str(w.message).count("\n") for w in caught if issubclass(w.category, CorruptCacheWarning)] == [0]
    assert np.array_equal(np.load(path), fresh)  # rewritten
