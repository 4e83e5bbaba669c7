"""Sparsity structure of SpMM operands and graph shards, and the structure-boosted SpMM kind.

References: brute force over scipy blocks of the permuted normalized adjacency, hand
counts on small matrices, simulation of uniformly random nonzeros.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from plexus_tune.fit.spmm_kinds import fit_kind
from plexus_tune.errors import UserError
from plexus_tune.graph import gcn_normalize, generate, permutations_for, permute_matrix
from plexus_tune.graph.permute import grid_parts
from plexus_tune.graph.structure import PermutedPattern, normalized_nnz, operand_structure
from plexus_tune.model.grid import enumerate_grids, layer_roles
from plexus_tune.model.sparsity import SHARE_POINTS, check_structure, graph_sparsity, share_at, uniform_structure
from plexus_tune.model.spmm import StructureBoosted, predict_spmm_ms, spmm_model_from_dict


def test_operand_structure_by_hand():
    # rows hold 3, 1, 0 nonzeros; columns 0..3 hold 2, 1, 1, 0
    s = operand_structure(np.array([3, 1, 0]), np.array([2, 1, 1, 0]))
    mean = 4 / 3
    assert s["row_length_cv"] == pytest.approx(np.sqrt(((3 - mean) ** 2 + (1 - mean) ** 2 + mean**2) / 3) / mean)
    assert s["top1pct_column_share"] == pytest.approx(2 / 4)  # max(1, 4 // 100) = 1 column
    assert s["touched_column_fraction"] == pytest.approx(3 / 4)
    assert s["column_share"][:3] == pytest.approx([0.5, 0.75, 1.0])
    assert len(s["column_share"]) == SHARE_POINTS and s["column_share"][-1] == 1.0


def test_uniform_structure_matches_simulation():
    rng = np.random.default_rng(0)
    for nnz, rows, common in ((200_000, 5_000, 300_000), (1_000_000, 20_000, 50_000)):
        cols = rng.multinomial(nnz, np.full(common, 1 / common))
        row_counts = rng.multinomial(nnz, np.full(rows, 1 / rows))
        simulated = operand_structure(row_counts, cols)
        expected = uniform_structure(nnz, rows, common)
        for key in ("row_length_cv", "top1pct_column_share", "touched_column_fraction"):
            assert expected[key] == pytest.approx(simulated[key], rel=0.03), key
        assert np.max(np.abs(np.array(expected["column_share"]) - simulated["column_share"])) < 0.01


def test_share_at_interpolates_in_log2():
    curve = np.linspace(0.0, 1.0, SHARE_POINTS)[None, :]
    assert share_at(curve, 4.0)[0] == pytest.approx(curve[0, 2])
    assert share_at(curve, 2 ** 2.5)[0] == pytest.approx((curve[0, 2] + curve[0, 3]) / 2)


def test_check_structure_rejects_bad_curves():
    good = uniform_structure(1000, 100, 100)
    assert check_structure(good)["column_share"] == good["column_share"]
    with pytest.raises(UserError, match="column_share"):
        check_structure({**good, "column_share": [0.5] * 3})
    with pytest.raises(UserError, match="row_length_cv"):
        check_structure({**good, "row_length_cv": float("nan")})


@pytest.mark.parametrize("mode", ["double", "single", "none", "local"])
def test_graph_sparsity_largest_shard_by_brute_force(mode):
    g = generate("rmat", nodes=1500, edges=9000, seed=3)
    a_hat = gcn_normalize(g.adjacency)
    n = g.num_nodes
    grids = enumerate_grids(4)
    sparsity = graph_sparsity(g, grids, 3, permute=mode, seed=2)
    for grid in grids.tolist():
        parts = grid_parts(grid) if mode == "local" else None
        row_perm, col_perm = permutations_for(mode, n, 2, parts=parts) if parts else permutations_for(mode, n, 2)
        layouts = [permute_matrix(a_hat, row_perm, col_perm), permute_matrix(a_hat, col_perm, row_perm)
                   if mode in ("double", "local") else permute_matrix(a_hat, row_perm, col_perm)]
        for i in range(3):
            o, _, d = layer_roles(i)
            g_d, g_o = grid[d], grid[o]
            b = layouts[i % 2]
            br, bc = -(-n // g_d), -(-n // g_o)
            blocks = {(r, c): b[r * br:(r + 1) * br, c * bc:(c + 1) * bc] for r in range(g_d) for c in range(g_o)}
            nnz, forward, backward = sparsity.layer(i, [g_d], [g_o])
            assert nnz[0] == max(blk.nnz for blk in blocks.values())
            # the largest block (first in row-major order among equals, as argmax picks)
            best = max(blocks, key=lambda rc: (blocks[rc].nnz, -rc[0], -rc[1]))
            blk = blocks[best]
            rows = np.diff(blk.indptr)
            cols = np.bincount(blk.indices, minlength=blk.shape[1])
            assert forward["row_length_cv"][0] == pytest.approx(rows.std() / rows.mean())
            assert backward["row_length_cv"][0] == pytest.approx(cols.std() / cols.mean())
            assert forward["touched_column_fraction"][0] == pytest.approx((cols > 0).mean())
            assert backward["touched_column_fraction"][0] == pytest.approx((rows > 0).mean())


def test_permuted_pattern_counts_self_loops_like_gcn_normalize():
    adj = sp.csr_matrix(np.array([[0, 1, 0], [1, 1, 0], [0, 0, 0]], dtype=np.float32))  # row 1 has its diagonal
    assert normalized_nnz(adj) == gcn_normalize(adj).nnz == 5
    pattern = PermutedPattern(adj, np.array([2, 0, 1]), np.array([1, 2, 0]))
    assert pattern.nnz == 5
    assert pattern.block_counts(1, 1)[0, 0] == 5


def _synthetic_timings(n_rows: int, seed: int = 0):
    """Times of a known law: gathers of popular columns cost 1/4 of the others."""
    rng = np.random.default_rng(seed)
    nnz = np.exp(rng.uniform(np.log(1e4), np.log(1e7), n_rows)).round()
    rows = np.exp(rng.uniform(np.log(1e3), np.log(1e6), n_rows)).round()
    common = np.exp(rng.uniform(np.log(1e4), np.log(4e6), n_rows)).round()
    k = np.exp(rng.uniform(0, np.log(256), n_rows)).round().clip(1, 256)
    skew = rng.uniform(0, 1, n_rows)
    curves = np.array([uniform_structure(a, b, c)["column_share"] for a, b, c in zip(nnz, rows, common)])
    curves = np.maximum(curves, np.minimum(1.0, skew[:, None] * (np.arange(SHARE_POINTS) + 1) / 16))
    structure = {"row_length_cv": rng.uniform(0, 3, n_rows), "touched_column_fraction": np.full(n_rows, 0.5),
                 "column_share": curves}
    granule = 32 * np.ceil(4 * k / 32)
    hit = share_at(curves, 32 * 2**20 / granule)
    time_ms = 0.01 + nnz * granule * (1 - 0.75 * hit) / 2e9 + 4 * rows * k / 2e9
    return (nnz, rows, common, k), structure, time_ms


def test_structure_boosted_learns_cache_hits_and_round_trips():
    shapes, structure, y = _synthetic_timings(400)
    model = fit_kind("structure-boosted", shapes, y, structure)
    pred = model.predict(*shapes, structure)
    assert np.median(np.abs(pred / y - 1)) < 0.05
    # where few columns fit in cache, the same shapes with uniformly random columns are
    # slower (hand-derived: (1 - 0.75 h_uniform) / (1 - 0.75 h) of the gather term)
    nnz, rows, common, k = shapes
    granule = 32 * np.ceil(4 * k / 32)
    uniform_hit = share_at(np.array([uniform_structure(a, b, c)["column_share"] for a, b, c in zip(nnz, rows, common)]),
                           32 * 2**20 / granule)
    skewed_hit = share_at(structure["column_share"], 32 * 2**20 / granule)
    gathers = (nnz * granule / 2e9) / y > 0.5  # the gathers dominate
    spread = gathers & (skewed_hit - uniform_hit > 0.2)
    assert spread.sum() >= 10
    assert np.median(model.predict(*shapes)[spread] / pred[spread]) > 1.2
    again = spmm_model_from_dict(model.to_dict())
    assert np.allclose(again.predict(*shapes, structure), pred)
    assert np.allclose(predict_spmm_ms(model.to_dict(), *shapes, structure), pred)
    assert np.allclose(model.scaled(2.0).predict(*shapes, structure), 2 * pred)


def test_structure_boosted_rejects_bad_profiles():
    shapes, structure, y = _synthetic_timings(200)
    data = fit_kind("structure-boosted", shapes, y, structure).to_dict()
    with pytest.raises(UserError, match="coefficients"):
        spmm_model_from_dict({**data, "coefficients": [-1.0] * len(data["coefficients"])})
    with pytest.raises(UserError, match="cache_bytes"):
        spmm_model_from_dict({**data, "cache_bytes": 0})
    with pytest.raises(UserError, match="z_min"):
        spmm_model_from_dict({**data, "z_min": [0.0]})


def test_fit_reads_structure_from_records(tmp_path):
    import json

    from plexus_tune.fit.spmm import fit_spmm, spmm_structure
    from plexus_tune.fit.tables import load_table

    shapes, structure, y = _synthetic_timings(160, seed=4)
    path = tmp_path / "spmm.jsonl"
    with open(path, "w") as fh:
        for i in range(len(y)):
            rec = {"schema": "plexus-tune/spmm-v2", "source": "sweep", "nnz": int(shapes[0][i]), "rows": int(shapes[1][i]),
                   "common": int(shapes[2][i]), "dense_cols": int(shapes[3][i]), "time_ms": float(y[i])}
            if i % 2:  # every other record carries its structure; the rest are uniform random
                rec["structure"] = {"row_length_cv": float(structure["row_length_cv"][i]),
                                    "top1pct_column_share": 0.1, "touched_column_fraction": 0.5,
                                    "column_share": structure["column_share"][i].tolist()}
            fh.write(json.dumps(rec) + "\n")
    df = load_table(path, schema="spmm")
    arrays = spmm_structure(df)
    assert np.allclose(arrays["column_share"][1], structure["column_share"][1])
    uniform = uniform_structure(shapes[0][0], shapes[1][0], shapes[2][0])
    assert np.allclose(arrays["column_share"][0], uniform["column_share"])
    assert arrays["row_length_cv"][0] == pytest.approx(uniform["row_length_cv"])
    fitted = fit_spmm(df, "structure-boosted", n_splits=0)
    assert fitted.model.name == "structure-boosted"
    assert np.allclose(fitted.predict(df), fitted.model.predict(*shapes, arrays))
    # a structure without its curve is refused for this kind, and auto leaves the kind out
    lines = path.read_text().splitlines()
    bad = json.loads(lines[1])
    del bad["structure"]["column_share"]
    lines[1] = json.dumps(bad)
    path.write_text("\n".join(lines) + "\n")
    df = load_table(path, schema="spmm")
    with pytest.raises(UserError, match="line 2: its structure has no 'column_share'"):
        fit_spmm(df, "structure-boosted", n_splits=0)
    assert fit_spmm(df, "auto", n_splits=2, kinds=["roofline", "structure-boosted"]).kind == "roofline"


def test_predict_graph_uses_the_largest_shards(run_cli, tmp_path):
    """predict --graph: same fields as without a graph; the SpMM of each grid is that of its
    largest shards under a structure profile, and --permute changes them."""
    import json

    from plexus_tune.graph import save_graph
    from plexus_tune.model.machine import load_machine
    from plexus_tune.model.prediction import predict_run_grids
    from plexus_tune.model.workload import Workload

    g = generate("rmat", nodes=4000, edges=30000, features=16, classes=4, seed=5)
    path = tmp_path / "g"
    save_graph(g, path)
    shapes, structure, y = _synthetic_timings(200)
    profile = load_machine("h100-80gb-fitted").raw
    profile = {**profile, "name": "structure-test", "spmm": fit_kind("structure-boosted", shapes, y, structure).to_dict()}
    machine_path = tmp_path / "m.json"
    machine_path.write_text(json.dumps(profile))
    base = ["predict", "--graph", str(path), "--gpus", "4", "-m", str(machine_path), "--format", "json", "--top", "0"]
    code, out, err = run_cli(base)
    assert code == 0, err
    records = {r["grid"]: r for r in json.loads(out)}
    code, plain, _ = run_cli(["predict", "--nodes", "4000", "--nnz", str(normalized_nnz(g.adjacency)), "--features", "16",
                              "--classes", "4", "--gpus", "4", "-m", str(machine_path), "--format", "json", "--top", "0"])
    assert set(json.loads(plain)[0]) == set(next(iter(records.values())))
    # the library with the graph's own sparsity gives the same numbers (independent path: brute-force shards above)
    workload = Workload.from_graph_stats(g.name, 4000, normalized_nnz(g.adjacency), 16, 4)
    grids = enumerate_grids(4)
    pred = predict_run_grids(workload, load_machine(str(machine_path)), grids,
                             options={"sparsity": graph_sparsity(g, grids, 3, permute="double")})
    for i, grid in enumerate(grids.tolist()):
        assert records["x".join(map(str, grid))]["spmm_ms"] == pytest.approx(pred["spmm_ms"][i])
    code, local, _ = run_cli(base + ["--permute", "none"])
    assert code == 0
    assert any(r["spmm_ms"] != pytest.approx(records[r["grid"]]["spmm_ms"]) for r in json.loads(local))
    code, _, err = run_cli(["predict", "--dataset", "ogbn-products", "--gpus", "4", "-m", str(machine_path), "--permute", "local"])
    assert code == 2 and "--permute needs --graph" in err


def test_predict_graph_reads_a_shard_directory(run_cli, tmp_path):
    import json

    from plexus_tune.graph import write_shards

    g = generate("rmat", nodes=3000, edges=20000, features=8, classes=4, seed=6)
    write_shards(g, tmp_path / "shards", blocks=(2, 2), mode="double", seed=0)
    code, out, err = run_cli(["predict", "--graph", str(tmp_path / "shards"), "--gpus", "4", "-m", "h100-80gb-fitted",
                              "--format", "json", "--top", "0"])
    assert code == 0, err
    from_dir = {r["grid"]: r["spmm_ms"] for r in json.loads(out)}
    code, out, _ = run_cli(["predict", "--graph", _saved(g, tmp_path), "--gpus", "4", "-m", "h100-80gb-fitted",
                            "--format", "json", "--top", "0"])
    # the directory holds the double-permuted matrix with seed 0: the same shards as permuting the graph
    assert {r["grid"]: r["spmm_ms"] for r in json.loads(out)} == pytest.approx(from_dir)
    code, _, err = run_cli(["predict", "--graph", str(tmp_path / "shards"), "--gpus", "4", "-m", "h100-80gb-fitted",
                            "--permute", "none"])
    assert code == 2 and "was cut after the double permutation" in err


def _saved(graph, tmp_path) -> str:
    from plexus_tune.graph import save_graph

    path = tmp_path / "graph"
    save_graph(graph, path)
    return str(path)
