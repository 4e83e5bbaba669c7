"""Shard statistics estimated from a sample of rows, against brute force.

References: :func:`plexus_tune.graph.structure.split_structure` on the explicitly permuted
pattern (every block counted apart), the stated standard error, the sample's own size.
"""

from __future__ import annotations

import numpy as np
import pytest

from plexus_tune.graph import generate, inverse_permutations_for, permutations_for, save_graph
from plexus_tune.graph.structure import PermutedPattern, normalized_nnz, split_structure
from plexus_tune.graph.structure_sample import sample_rows, sampled_normalized_nnz, sampled_split_statistics

SPLITS = [(1, 1), (2, 3), (4, 4), (1, 8), (8, 2)]


def _graph(nodes=3000, edges=30000, seed=3):
    return generate("rmat", nodes=nodes, edges=edges, seed=seed).adjacency


def test_a_whole_sample_is_the_exact_count():
    adjacency = _graph()
    n = adjacency.shape[0]
    row_perm, col_perm = permutations_for("double", n, 2)
    pattern = PermutedPattern(adjacency, row_perm, col_perm)
    got, info = sampled_split_statistics(adjacency, SPLITS, row_perm, col_perm, 1.0)
    assert info["rows"] == n and info["entries"] == adjacency.nnz
    assert info["normalized_nnz"] == normalized_nnz(adjacency)
    for split in SPLITS:
        want = split_structure(pattern, *split)
        assert got[split]["block"] == want["block"] and got[split]["nnz_max"] == want["nnz_max"], split
        assert got[split]["nnz_max_rse"] == 0.0
        for side in ("forward", "transpose"):
            for key in ("row_length_cv", "top1pct_column_share", "touched_column_fraction"):
                assert got[split][side][key] == pytest.approx(want[side][key], rel=1e-9, abs=1e-12), (split, side, key)
            assert got[split][side]["column_share"] == pytest.approx(want[side]["column_share"], abs=2e-6)


def test_a_sample_reads_its_fraction_and_its_error_covers_the_truth():
    adjacency = _graph(nodes=6000, edges=90000, seed=5)
    n = adjacency.shape[0]
    rows, p = sample_rows(adjacency.indptr, 0.2, seed=1)
    lengths = np.diff(adjacency.indptr)
    read = int(lengths[rows].sum())
    assert 0.1 * adjacency.nnz < read < 0.3 * adjacency.nnz  # about the fraction asked for
    row_perm, col_perm = permutations_for("double", n, 4)
    pattern = PermutedPattern(adjacency, row_perm, col_perm)
    got, info = sampled_split_statistics(adjacency, SPLITS, row_perm, col_perm, 0.2, seed=1)
    assert info["entries"] == read
    for split in SPLITS:
        want = split_structure(pattern, *split)
        counts = pattern.block_counts(*split)
        chosen = counts[got[split]["block"]]  # the block the estimate chose, counted by hand
        error = max(got[split]["nnz_max_rse"], 1e-3)
        assert abs(got[split]["nnz_max"] / chosen - 1) <= 5 * error, split
        assert abs(got[split]["nnz_max"] / want["nnz_max"] - 1) <= 0.1, split
        assert got[split]["nnz_mean"] == pytest.approx(want["nnz_mean"], rel=0.02)
    total, rse = sampled_normalized_nnz(adjacency, 0.2, seed=1)
    assert abs(total / normalized_nnz(adjacency) - 1) <= max(5 * rse, 1e-9)


def test_predict_states_a_sampled_estimate_and_refuses_a_bad_fraction(run_cli, tmp_path):
    path = tmp_path / "g"
    save_graph(generate("rmat", nodes=2000, edges=16000, features=8, classes=3, seed=1), path, overwrite=True)
    base = ["predict", "--graph", str(path), "--gpus", "8", "--machine", "h100-80gb-fitted", "--top", "2"]
    code, out, err = run_cli(base + ["--graph-sample", "0.3"])
    assert code == 0, err
    assert "shard statistics estimated from a sample of rows reading 30 % of the entries" in out
    code, out, _ = run_cli(base)  # auto: a small graph is scanned whole
    assert code == 0 and "estimated from a sample" not in out
    code, out, err = run_cli(base + ["--graph-sample", "1.5"])
    assert code == 2 and err.strip().count("\n") == 0 and "graph sample 1.5" in err and "(--graph-sample)" in err


def test_a_degree_descriptor_gives_the_permuted_graphs_structure():
    """degree_structure from a graph's own degree classes against its counted structure (double permutation)."""
    from plexus_tune.graph.structure import split_statistics
    from plexus_tune.model.sparsity import degree_structure

    adjacency = generate("rmat", nodes=20000, edges=200000, seed=2).adjacency
    n = adjacency.shape[0]
    degree = np.diff(adjacency.indptr) + 1  # a self-loop per row (no stored diagonal)
    values, counts = np.unique(degree, return_counts=True)
    shape = [[v / degree.mean(), c / n] for v, c in zip(values.tolist(), counts.tolist())]
    row_perm, col_perm = permutations_for("double", n, 0)
    # the whole matrix: no largest block chosen among others (the model is an expectation over blocks)
    counted = split_statistics(adjacency, [(1, 1)], row_perm, col_perm)
    for (R, C), entry in counted.items():
        got = degree_structure(shape, degree.mean(), n, R, C)
        want = entry["forward"]
        assert got["row_length_cv"] == pytest.approx(want["row_length_cv"], rel=0.15), (R, C)  # an expectation: one realization
        assert got["top1pct_column_share"] == pytest.approx(want["top1pct_column_share"], rel=0.15), (R, C)
        assert got["touched_column_fraction"] == pytest.approx(want["touched_column_fraction"], abs=0.02), (R, C)
        assert got["column_share"][6] == pytest.approx(want["column_share"][6], rel=0.15), (R, C)


def test_catalog_predictions_mark_the_descriptors_figures(run_cli):
    code, out, err = run_cli(["predict", "--dataset", "ogbn-products", "--gpus", "4", "--machine", "h100-80gb-fitted"])
    assert code == 0, err
    rows = [line for line in out.splitlines() if "x" in line and "\u2502" in line and line.split("\u2502")[1].strip().isdigit()]
    assert rows and all("\u2020" in line.split("\u2502")[4] for line in rows)  # every SpMM cell marked
    assert "\u2020: SpMM from the shard structure of ogbn-products's structure descriptor" in out
    code, out, _ = run_cli(["predict", "--nodes", "232965", "--nnz", "114848857", "--features", "602", "--classes", "41",
                            "--gpus", "4", "--machine", "h100-80gb-fitted"])
    assert code == 0 and "\u2020" not in out  # no dataset, no descriptor: the uniform structure, unmarked


class _Recorded(np.ndarray):
    """An array that records the positions its fancy indexing reads (a stand-in for a file's pages)."""

    def __getitem__(self, key):
        if isinstance(key, np.ndarray) and key.dtype.kind in "iu":
            self.read.append(np.asarray(key).copy())
        return np.asarray(super().__getitem__(key))


def test_a_sample_reads_the_entries_of_its_rows_alone():
    import scipy.sparse as sp

    adjacency = _graph(nodes=5000, edges=60000, seed=7)
    indices = adjacency.indices.view(_Recorded)
    indices.read = []
    recorded = sp.csr_matrix((adjacency.data, indices, adjacency.indptr), shape=adjacency.shape, copy=False)
    recorded.indices = indices
    n = adjacency.shape[0]
    inv_row, inv_col = inverse_permutations_for("double", n, 3)
    got, info = sampled_split_statistics(recorded, SPLITS, inv_row, inv_col, 0.05, seed=9, inverse=True)
    rows, _ = sample_rows(adjacency.indptr, 0.05, seed=9)
    want = np.concatenate([np.arange(adjacency.indptr[m], adjacency.indptr[m + 1]) for m in rows])
    read = np.unique(np.concatenate(indices.read))
    assert np.array_equal(read, want) and info["entries"] == want.size < adjacency.nnz // 10
    # the same statistics as from the permutations themselves
    row_perm, col_perm = permutations_for("double", n, 3)
    again, _ = sampled_split_statistics(adjacency, SPLITS, row_perm, col_perm, 0.05, seed=9)
    assert again == got


def test_a_rows_draw_depends_on_its_id_alone():
    from scipy.stats import kstest

    from plexus_tune.graph.structure_sample import row_uniforms

    u = row_uniforms(np.arange(200_000), seed=4)
    assert kstest(u, "uniform").pvalue > 1e-3 and 0 <= u.min() and u.max() < 1
    assert np.array_equal(row_uniforms(np.arange(1000, 2000), seed=4), u[1000:2000])
    assert not np.array_equal(row_uniforms(np.arange(1000), seed=5), u[:1000])
    adjacency = _graph()
    whole = sample_rows(adjacency.indptr, 0.1, seed=2)
    chunked = sample_rows(adjacency.indptr, 0.1, seed=2, chunk_rows=97)  # any chunking: the same rows
    assert all(np.array_equal(a, b) for a, b in zip(whole, chunked))
    # the design: rows drawn about p_m of the time (the rows of middling p_m pooled)
    draws = np.zeros(adjacency.shape[0])
    probabilities = np.zeros(adjacency.shape[0])
    for seed in range(40):
        rows, p = sample_rows(adjacency.indptr, 0.1, seed=seed)
        draws[rows] += 1
        probabilities[rows] = p
    mid = (probabilities > 0.05) & (probabilities < 0.5)
    assert draws[mid].sum() / 40 == pytest.approx(probabilities[mid].sum(), rel=0.1)


def test_memory_mapped_arrays_are_read_at_their_positions(tmp_path):
    from plexus_tune.graph.structure_sample import gather, pointer_chunks

    values = np.random.default_rng(0).integers(0, 10**6, size=100_001).astype(np.int32)
    np.save(tmp_path / "a.npy", values)
    mapped = np.load(tmp_path / "a.npy", mmap_mode="r")
    positions = np.array([5, 0, 100_000, 77_777, 5])
    assert np.array_equal(gather(mapped, positions), values[positions])
    assert np.array_equal(gather(values, positions), values[positions])
    pieces = [(a, b, ptr) for a, b, ptr in pointer_chunks(mapped, chunk_rows=30_000)]
    assert [(a, b) for a, b, _ in pieces] == [(0, 30_000), (30_000, 60_000), (60_000, 90_000), (90_000, 100_000)]
    assert all(np.array_equal(ptr, values[a:b + 1]) and ptr.dtype == np.int64 for a, b, ptr in pieces)


@pytest.mark.parametrize("mode", ["none", "single", "double", "local"])
def test_inverse_permutations_are_those_of_the_trainers(mode):
    from plexus_tune.graph.permute import invert_permutation

    parts = (2, 4, 8) if mode == "local" else None
    rows, cols = permutations_for(mode, 10_007, 5, parts=parts)
    inv_row, inv_col = inverse_permutations_for(mode, 10_007, 5, parts=parts)
    assert inv_row.dtype == np.int32
    assert np.array_equal(inv_row, invert_permutation(rows)) and np.array_equal(inv_col, invert_permutation(cols))


def test_segments_are_looked_up_as_a_binary_search_finds_them():
    from plexus_tune.graph.structure_sample import _segment

    rng = np.random.default_rng(0)
    for n in (5, 1000, 100_003, 2_449_029):
        for parts in ([1], [2, 3], [1, 2, 4, 8, 16, 32, 64], [7, 999, 1000]):
            cuts = np.unique(np.concatenate([np.minimum(np.arange(g + 1) * -(-n // g), n) for g in parts]))
            ids = np.concatenate([rng.integers(0, n, 50_000), cuts[:-1], np.maximum(cuts[1:] - 1, 0)]).astype(np.int32)
            assert np.array_equal(_segment(cuts, ids), np.searchsorted(cuts, ids, side="right") - 1), (n, parts)


@pytest.mark.parametrize("mode", ["double", "local"])
def test_stored_permutations_are_made_once_and_read_where_needed(mode, tmp_path):
    import warnings

    from plexus_tune.errors import CorruptCacheWarning
    from plexus_tune.graph.permute import stored_inverse_permutations

    parts = (2, 4) if mode == "local" else None
    want = inverse_permutations_for(mode, 3001, 6, parts=parts)
    first = stored_inverse_permutations(mode, 3001, 6, parts=parts, root=tmp_path)
    files = sorted((tmp_path / "permutations").glob("*.npy"))
    assert len(files) == 2 and all(isinstance(v, np.memmap) for v in first)
    assert all(np.array_equal(a, b) for a, b in zip(first, want))
    stamp = [f.stat().st_mtime_ns for f in files]
    again = stored_inverse_permutations(mode, 3001, 6, parts=parts, root=tmp_path)
    assert [f.stat().st_mtime_ns for f in files] == stamp and all(np.array_equal(a, b) for a, b in zip(again, want))
    # statistics from the memory-mapped inverses are those from the arrays
    adjacency = _graph(nodes=3001, edges=20000, seed=8)
    splits = [(2, 4), (4, 2)] if mode == "local" else SPLITS
    mapped, _ = sampled_split_statistics(adjacency, splits, *again, 0.1, seed=3, inverse=True)
    held, _ = sampled_split_statistics(adjacency, splits, *want, 0.1, seed=3, inverse=True)
    assert mapped == held
    files[0].write_bytes(b"not a permutation")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        remade = stored_inverse_permutations(mode, 3001, 6, parts=parts, root=tmp_path)
    assert sum(isinstance(w.message, CorruptCacheWarning) for w in caught) == 1
    assert all(np.array_equal(a, b) for a, b in zip(remade, want))


def test_a_sampled_predict_keeps_its_permutations_and_graph_cache_lists_them(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("PLEXUS_TUNE_DATA", str(tmp_path / "data"))  # a data directory of its own
    path = tmp_path / "g"
    save_graph(generate("rmat", nodes=2000, edges=16000, features=8, classes=3, seed=1), path, overwrite=True)
    base = ["predict", "--graph", str(path), "--gpus", "4", "--machine", "h100-80gb-fitted", "--graph-sample", "0.3"]
    code, out, err = run_cli(base + ["--no-cache"])
    assert code == 0, err
    code, out, _ = run_cli(["graph", "cache"])
    assert code == 0 and "stored permutations" not in out  # --no-cache: nothing written
    code, out, err = run_cli(base)
    assert code == 0, err
    code, out, _ = run_cli(["graph", "cache"])
    assert code == 0 and "stored permutations (sampled estimates read them): 4 file(s)" in out  # double and local
    code, out, _ = run_cli(["graph", "cache", "--clear"])
    assert code == 0 and "4 stored permutation(s)" in out
    code, out, _ = run_cli(["graph", "cache"])
    assert "stored permutations" not in out
