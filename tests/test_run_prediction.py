"""A logged prediction is what ``predict`` gives for the same settings, in every command.

Runs are trained and logged (``measure`` and ``run``) at communication precisions and
block sizes; ``measure``'s log, ``run``'s log and printout, ``validate``'s per-run figures
and ``plot``'s points must all equal the row of ``plexus-tune predict --format json`` for
the run's grid, precision and block rows. The profile has codec rates, so that a
reduced precision changes both the wire time and ``quant_ms``.
"""

import json

import pytest

from plexus_tune.cli import build_parser, main
from plexus_tune.cli.plot import make_figure
from plexus_tune.model.comm_precision import COMM_PRECISIONS
from plexus_tune.measure.identity import RunSpec, predict_record
from plexus_tune.measure.table import runs_table
from plexus_tune.measure.store import read_runs
from plexus_tune.model.breakdown import BREAKDOWN_KEYS, TOTAL_PARTS
from plexus_tune.model.grid import format_grid
from plexus_tune.model.machine import load_machine
from plexus_tune.model.prediction import predict_run

GRAPH = "rmat:nodes=256,edges=2048,features=8,classes=4,seed=3"
SHAPE = ["--layers", "2", "--hidden", "8", "--epochs", "2", "--warmup", "1"]
BLOCK_ROWS = (None, 48)
EVERY_SETTING = [(p, b) for p in COMM_PRECISIONS for b in BLOCK_ROWS]
#: a few settings that still tell every parameter apart (fast feedback)
SOME_SETTINGS = [("fp32", None), ("int8", 48)]


def profile_with_codec(tmp_path) -> str:
    """cpu-gloo-2core with codec rates and a per-call time for every reduced precision."""
    data = json.loads(open(load_machine("cpu-gloo-2core").path).read())
    data["name"] = "codec-test"
    data["quant"] = {p: {"encode_gbps": 0.5 + i, "decode_gbps": 1.0 + i, "call_ms": 0.05 * (i + 1)}
                     for i, p in enumerate(COMM_PRECISIONS[1:])}
    path = tmp_path / "codec-test.json"
    path.write_text(json.dumps(data))
    return str(path)


def flags(precision, block_rows):
    return ["--comm-precision", precision] + ([] if block_rows is None else ["--block-rows", str(block_rows)])


def predict_cli(capsys, record, machine, precision, block_rows) -> dict:
    """``plexus-tune predict --format json`` for the run's workload and settings: the row of its grid."""
    argv = ["predict", "--nodes", str(record["graph_nodes"]), "--nnz", str(record["nnz"]),
            "--features", str(record["features"]), "--classes", str(record["classes"]), "--layers", "2",
            "--hidden", "8", "--gpus", str(record["gpus"]), "--machine", machine, "--format", "json", "--top", "0",
            *flags(precision, block_rows)]
    capsys.readouterr()
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    return next(r for r in rows if r["grid"] == record["grid"])


def same_prediction(logged: dict, predicted: dict) -> None:
    for key in (*BREAKDOWN_KEYS, "overhead_ms", "total_ms"):
        assert logged[key] == pytest.approx(predicted[key], rel=1e-12, abs=1e-12), key
    assert logged["feasible"] == predicted["feasible"]


def log_and_check(tmp_path, capsys, settings, grids=("1x2x1", "2x1x1")):
    machine = profile_with_codec(tmp_path)
    log = str(tmp_path / "runs.jsonl")
    for precision, block_rows in settings:
        assert main(["measure", "--graph", GRAPH, "--gpus", "2", "--grids", ",".join(grids), "--trials", "1",
                     "--machine", machine, "--log", log, "--batch", "2", *SHAPE, *flags(precision, block_rows)]) == 0
        capsys.readouterr()
    # run: the grid given, so that it trains the same identity; its printout carries the prediction
    precision, block_rows = settings[-1]
    assert main(["run", "--graph", GRAPH, "--gpus", "2", "--grid", "1x2x1", "--machine", machine, "--log", log,
                 *SHAPE, *flags(precision, block_rows)]) == 0
    run_out = capsys.readouterr().out

    records = [json.loads(line) for line in open(log)]
    assert len(records) == len(grids) * len(settings) + 1 and all(r["status"] == "ok" for r in records)
    by_setting = {}
    for rec in records:
        setting = (rec["comm_precision"], rec["options"]["block_rows"])
        assert setting in settings
        expected = predict_cli(capsys, rec, machine, *setting)
        same_prediction(rec["predicted"], expected)  # measure and run log what predict says
        assert rec["predicted"]["machine"] == "codec-test"
        by_setting.setdefault(setting, {})[rec["grid"]] = expected
    # the settings matter: every setting predicts a different 1x2x1 epoch
    totals = [by_setting[s]["1x2x1"]["total_ms"] for s in settings]
    assert len(set(totals)) == len(totals)
    assert any(by_setting[s]["1x2x1"]["quant_ms"] > 0 for s in settings if s[0] != "fp32")
    # run's comparison table and last line print the same total
    assert f"{by_setting[settings[-1]]['1x2x1']['total_ms']:.2f} ms predicted" in run_out

    # validate: the profile's prediction of every run (profile_total_ms; as is, total_ms too)
    out = tmp_path / "validate.json"
    assert main(["validate", "--machine", machine, "--runs", log, "--no-refit", "--json", str(out)]) == 0
    capsys.readouterr()
    runs = json.loads(out.read_text())["runs"]
    assert len(runs) == len(grids) * len(settings)
    for r in runs:
        expected = by_setting[(r["comm_precision"], r["block_rows"] or None)][r["grid"]]["total_ms"]
        assert r["profile_total_ms"] == pytest.approx(expected, rel=1e-12) and r["total_ms"] == pytest.approx(expected, rel=1e-12)

    # plot: the points of pred-vs-obs, predicted again (--machine) and as logged
    want = sorted(e["total_ms"] for grids in by_setting.values() for e in grids.values())
    for extra in (["--machine", machine], []):
        fig, _ = make_figure(build_parser().parse_args(["plot", "pred-vs-obs", "--log", log, "--gpus", "2", *extra]))
        xs = sorted(float(x) for x in fig.axes[0].collections[0].get_offsets()[:, 0])
        assert xs == pytest.approx(want, rel=1e-12)

    # a runs-table row: its spec holds the settings the runs were given above, and its prediction is
    # predict's for them, with parts derived by hand (no prediction made by the code under test)
    table = runs_table(read_runs(log, warn=False))
    # 1x2x1: each rank multiplies 128 of the 256 rows; per layer three GEMMs (Q = H W, dW, dH) of
    # 2 r c_i c_o flops, widths 8 -> 8 -> 4, at the profile's 0.05 TFLOP/s
    gemm_ms = 3 * 2 * 128 * (8 * 8 + 8 * 4) / 0.05e12 * 1e3
    assert len(table) == len(grids) * len(settings)
    for _, row in table.iterrows():
        spec = RunSpec.from_row(row)
        assert (spec.nodes, spec.widths, spec.layers, spec.hidden) == (256, (8, 8, 4), 2, 8)
        assert (str(spec.comm_precision), spec.block_rows) in settings and format_grid(spec.grid) in grids
        one = spec.predict(machine)
        assert sum(one[k] for k in TOTAL_PARTS) == pytest.approx(one["total_ms"])
        same_prediction(one, by_setting[(str(spec.comm_precision), spec.block_rows)][format_grid(spec.grid)])
        if spec.grid == (1, 2, 1):
            assert one["gemm_ms"] == pytest.approx(gemm_ms, rel=1e-12)
        assert (one["quant_ms"] > 0) == (str(spec.comm_precision) != "fp32") and one["overhead_ms"] == 0


def test_logged_validated_plotted_and_run_predictions_equal_predict(tmp_path, capsys):
    log_and_check(tmp_path, capsys, SOME_SETTINGS, grids=("1x2x1",))


@pytest.mark.slow
def test_every_precision_and_block_setting_reports_the_predict_prediction(tmp_path, capsys):
    log_and_check(tmp_path, capsys, EVERY_SETTING)


def test_logged_prediction_follows_the_settings_not_the_grid_alone():
    """ogbn-products on perlmutter, 2x4x2: int8 and block rows change the prediction of the run's record."""
    from plexus_tune.model.costs import predict_grids
    from plexus_tune.model.workload import workload_from_dataset

    w = workload_from_dataset("ogbn-products")
    fp32 = predict_run(w, "perlmutter", (2, 4, 2))
    int8 = predict_run(w, "perlmutter", (2, 4, 2), comm_precision="int8")
    blocked = predict_run(w, "perlmutter", (2, 4, 2), block_rows=4096)
    # int8 sends a quarter of the bytes (plus a zero point and scale per row): the wire time falls
    # below half; blocking adds a message per block to the aggregation all-reduces
    assert int8["comm_ms"] < 0.5 * fp32["comm_ms"] and blocked["comm_ms"] > fp32["comm_ms"]
    for one, kw in ((int8, {"comm_precision": "int8"}), (blocked, {"block_rows": 4096})):
        row = predict_grids(w, "perlmutter", [[2, 4, 2]], **kw)
        assert one["total_ms"] == float(row["total_ms"][0])
    # the record of such a run predicts the same, not the FP32 unblocked figure
    record = {"graph_nodes": w.nodes, "nnz": w.nnz, "widths": list(w.widths), "gx": 2, "gy": 4, "gz": 2,
              "comm_precision": "int8", "options": {"block_rows": None}}
    assert predict_record(record, "perlmutter")["total_ms"] == int8["total_ms"] != fp32["total_ms"]
    record["options"]["block_rows"] = 4096
    record["comm_precision"] = "fp32"
    assert predict_record(record, "perlmutter")["total_ms"] == blocked["total_ms"]


def test_rank_grids_keeps_the_precision_whose_best_fitting_grid_is_fastest_one_grid_at_a_time():
    """model/planner.rank_grids against predict_run called on every grid alone: the kept
    precision, its best grid, the grid order and the no-fit error."""
    import pytest

    from plexus_tune.errors import UserError
    from plexus_tune.model.grid import enumerate_grids, format_grid
    from plexus_tune.model.machine import load_machine
    from plexus_tune.model.planner import GridRanking, rank_grids
    from plexus_tune.model.prediction import predict_run, predict_run_grids
    from plexus_tune.model.workload import workload_from_dataset

    machine = load_machine("perlmutter")
    workload = workload_from_dataset("ogbn-products")
    grids = enumerate_grids(16)
    ranking = rank_grids(workload, machine, grids, ["fp32", "bf16", "int8"], block_rows=None)
    one = {p: [predict_run(workload, machine, tuple(int(v) for v in g), comm_precision=p) for g in grids]
           for p in ("fp32", "bf16", "int8")}
    best = {p: min(r["total_ms"] for r in runs if r["feasible"]) for p, runs in one.items()}
    assert ranking.precision == min(best, key=best.get)
    assert ranking.best_of == pytest.approx(best, rel=1e-9)
    totals = [one[ranking.precision][i]["total_ms"] for i in ranking.order]
    assert totals == sorted(totals) and ranking.n_feasible == len(grids)  # all fit on 16 GPUs
    first = ranking.records(3)[0]
    assert first["grid"] == format_grid(grids[ranking.best_feasible()])
    assert first["total_ms"] == pytest.approx(best[ranking.precision], rel=1e-9)
    assert ranking.index(grids[5]) == 5 and ranking.spmm_note(machine) is None
    with pytest.raises(UserError, match="not one of the"):
        ranking.index((3, 3, 3))
    tight = GridRanking.of(predict_run_grids(workload_from_dataset("ogbn-papers100M"), machine, enumerate_grids(2)),
                           enumerate_grids(2))
    assert tight.best_feasible() is None
    with pytest.raises(UserError, match="no grid of 2 GPUs fits"):
        tight.check_fits(2, machine)


def test_a_family_run_is_predicted_from_its_graph_as_it_was_logged(tmp_path, capsys):
    """A SuperGCN run's logged prediction prices its partition of the graph; the runs table that ``fit``,
    ``validate`` and ``plot`` predict again reads the same graph from the run's graph source, and
    without it falls back to the N/NNZ estimate, which differs."""
    from plexus_tune.measure.table import predict_runs

    machine = profile_with_codec(tmp_path)
    log = str(tmp_path / "runs.jsonl")
    assert main(["measure", "--graph", GRAPH, "--gpus", "2", "--algorithm", "supergcn", "--aggregation", "pre",
                 "--trials", "1", "--machine", machine, "--log", log, *SHAPE]) == 0
    capsys.readouterr()
    (record,) = [json.loads(line) for line in open(log)]
    assert record["status"] == "ok" and record["graph_source"] == f"synthetic:{GRAPH}"
    table = runs_table(read_runs(log, warn=False))
    assert list(table["graph"]) == [f"synthetic:{GRAPH}"]  # the run's graph source, its identity
    with_graph = predict_runs(table, machine).iloc[0]
    estimate = predict_runs(table, machine, graphs=False).iloc[0]
    for key in (*BREAKDOWN_KEYS, "total_ms"):
        assert with_graph[f"pred_{key}"] == pytest.approx(record["predicted"][key], rel=1e-12, abs=1e-12), key
    assert estimate["pred_point_to_point_ms"] != pytest.approx(with_graph["pred_point_to_point_ms"], rel=1e-3)
