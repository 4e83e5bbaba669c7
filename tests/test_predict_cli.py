import csv
import io
import json
import subprocess
import sys

import pytest

from plexus_tune.model.machine import load_machine

BASE = ["predict", "--dataset", "ogbn-products", "--gpus", "64", "--machine", "perlmutter-paper"]



def test_table_and_recommendation(run_cli):
    code, out, err = run_cli(BASE + ["--top", "5"])
    assert code == 0, err
    assert "Recommended grid: " in out
    lines = [ln for ln in out.splitlines() if ln.startswith("│")]
    assert len(lines) == 5
    recommended = out.split("Recommended grid: ")[1].split()[0]
    assert recommended in lines[0]


def test_json_records(run_cli):
    code, out, _ = run_cli(BASE + ["--format", "json", "--top", "0"])
    assert code == 0
    records = json.loads(out)
    assert len(records) == 28  # every ordered factorization of 64
    for key in ("gx", "gy", "gz", "spmm_ms", "comm_ms", "gemm_ms", "total_ms", "memory_gib", "feasible"):
        assert key in records[0]
    totals = [r["total_ms"] for r in records]
    assert totals == sorted(totals)
    for r in records:
        assert r["gx"] * r["gy"] * r["gz"] == 64
        assert r["total_ms"] == pytest.approx(r["spmm_ms"] + r["gemm_ms"] + r["comm_ms"] + r["other_ms"])
        assert r["comm_ms"] == pytest.approx(r["comm_x_ms"] + r["comm_y_ms"] + r["comm_z_ms"])


def test_csv_explicit_workload_and_filters(run_cli):
    argv = ["predict", "--nodes", "1000", "--nnz", "8000", "--features", "16", "--classes", "4",
            "--hidden", "8", "--layers", "2", "--gpus", "12", "--machine", "perlmutter", "--format", "csv",
            "--max-z", "2", "--block-rows", "64"]
    code, out, err = run_cli(argv)
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 10  # default --top
    assert all(int(r["gz"]) <= 2 for r in rows)
    code, out, _ = run_cli(BASE + ["--powers-of-two", "--format", "json", "--top", "0"])
    assert len(json.loads(out)) == 28


def test_no_feasible_grid_exits_2(run_cli):
    code, out, err = run_cli(["predict", "--dataset", "ogbn-papers100M", "--gpus", "2", "--machine",
                              "perlmutter-paper", "--format", "json"])
    assert code == 2
    assert "no grid of 2 GPUs fits" in err and "more GPUs" in err
    assert all(not r["feasible"] for r in json.loads(out))


@pytest.mark.parametrize("argv, needle", [
    (["predict", "--dataset", "nope", "--gpus", "8", "--machine", "perlmutter-paper"], "unknown dataset"),
    (["predict", "--dataset", "reddit", "--gpus", "8", "--machine", "nope"], "unknown machine"),
    (["predict", "--dataset", "reddit", "--gpus", "0", "--machine", "perlmutter-paper"], "at least 1"),
    (["predict", "--dataset", "reddit", "--gpus", "-3", "--machine", "perlmutter-paper"], "at least 1"),
    (["predict", "--dataset", "reddit", "--gpus", "4.5", "--machine", "perlmutter-paper"], "positive integer"),
    (["predict", "--dataset", "reddit", "--gpus", "many", "--machine", "perlmutter-paper"], "positive integer"),
    (["predict", "--dataset", "reddit", "--gpus", "8", "--machine", "perlmutter-paper", "--hidden", "0"], "--hidden"),
    (["predict", "--dataset", "reddit", "--gpus", "8", "--machine", "perlmutter-paper", "--layers", "-1"], "--layers"),
    (["predict", "--nodes", "10", "--nnz", "20", "--features", "0", "--classes", "2", "--gpus", "8",
      "--machine", "perlmutter-paper"], "--features"),
    (["predict", "--nodes", "10", "--gpus", "8", "--machine", "perlmutter-paper"], "missing --nnz"),
    (["predict", "--dataset", "reddit", "--gpus", "7", "--machine", "perlmutter-paper", "--powers-of-two"], "filters"),
])
def test_bad_input_is_one_line_exit_2(argv, needle, run_cli):
    code, _, err = run_cli(argv)
    assert code == 2
    assert err.strip().count("\n") == 0 and "Traceback" not in err
    assert needle in err


def test_bad_machine_files(tmp_path, run_cli):
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"name": "x",')
    with open(load_machine("perlmutter-paper").path) as fh:
        profile = json.load(fh)
    del profile["collectives"]["alpha_inter_us"]
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps(profile))
    for path, needle in ((bad_json, "not valid JSON"), (missing, "collectives.alpha_inter_us")):
        code, _, err = run_cli(["predict", "--dataset", "reddit", "--gpus", "8", "--machine", str(path)])
        assert code == 2 and needle in err and err.strip().count("\n") == 0


def test_subprocess_error_has_no_traceback_and_no_torch():
    proc = subprocess.run([sys.executable, "-m", "plexus_tune", "predict", "--dataset", "reddit", "--gpus", "x",
                           "--machine", "perlmutter-paper"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    code = ("import sys; from plexus_tune.cli import main; "
            "rc = main(['predict', '--dataset', 'ogbn-products', '--gpus', '64', '--machine', 'perlmutter-paper']); "
            "heavy = [m for m in ('torch', 'torch_geometric', 'sklearn', 'optuna', 'matplotlib') if m in sys.modules]; "
            "print('HEAVY', heavy); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout


def test_datasets_and_machines_listings(run_cli):
    code, out, _ = run_cli(["datasets", "--format", "json"])
    assert code == 0 and {"ogbn-products", "UK-2007-05"} <= {d["name"] for d in json.loads(out)}
    code, out, _ = run_cli(["machines", "--format", "json"])
    names = {m["name"] for m in json.loads(out)}
    assert {"perlmutter-paper", "perlmutter", "frontier", "cpu-gloo-2core"} <= names
    code, out, _ = run_cli(["machines", "perlmutter-paper"])
    assert code == 0 and "beta_intra_gbps" in out and "200" in out
    # a fitted profile's boosted SpMM model is described, not dumped; collectives carry their provenance
    code, out, _ = run_cli(["machines", "cpu-gloo-2core-fitted"])
    assert code == 0 and "trees" in out and '"threshold"' not in out and "fit_collectives" in out
    from plexus_tune.model.machine import load_machine
    from plexus_tune.model.spmm import describe_spmm_model

    text = describe_spmm_model(load_machine("cpu-gloo-2core-fitted").spmm)
    assert text.startswith("learned-boosted: 150 trees of depth 5 on log-shape-footprints; correcting learned-roofline: ridge on ")
    assert "; correcting roofline: const " in text
    code, out, _ = run_cli(["machines", "--fields"])
    assert code == 0 and "bandwidth_table" in out
    code, _, err = run_cli(["machines", "nope"])
    assert code == 2 and "unknown machine" in err


def test_predict_keeps_no_state_on_its_arguments(capsys, tmp_path):
    """The command parses, calls the library and prints: the graph it reads comes back from the
    library (measure/graph_input), nothing is stashed on the parsed arguments."""
    from plexus_tune.cli import build_parser
    from plexus_tune.cli.predict import run
    from plexus_tune.measure.graph_input import read_graph_input

    spec = "rmat:nodes=1024,edges=8192,features=16,classes=4,seed=0"
    for extra in ([], ["--algorithm", "all"], ["--graph-sample", "0.5"]):
        args = build_parser().parse_args(["predict", "--graph", spec, "--gpus", "4", "--machine", "perlmutter",
                                          "--no-cache", "--format", "json", *extra])
        before = dict(vars(args))
        assert run(args) == 0
        assert vars(args) == before
        capsys.readouterr()
    source = read_graph_input(spec, cache=False, sample=None, layers=3, hidden=16)
    # hand-checked: N of the spec, the widths D_0 = 16, hidden 16, 4 classes; a graph read whole, not stored
    assert source.workload.nodes == 1024 and tuple(source.workload.widths) == (16, 16, 16, 4)
    assert source.stored is None and source.fraction is None and source.graph is not None
