"""RunSpec: one typed run, built from a record of any version, a runs-table row, a trainer
configuration or an identity; its identity, prediction settings and prediction."""

import dataclasses

import pytest

from plexus_tune.errors import UserError
from plexus_tune.measure.identity import RunSpec, run_identity
from plexus_tune.measure.table import runs_table
from plexus_tune.model.comm_precision import CommPrecision
from plexus_tune.model.prediction import predict_run
from plexus_tune.model.workload import Workload
from plexus_tune.trainer import TrainConfig

SPEC = "rmat:nodes=64,edges=256,features=8,classes=4,seed=0"


def v1_record(**extra):
    """A run record as plexus-tune wrote it before v2: no schema, ``nodes``, and the prediction
    profile's name as ``machine`` (v2 logs the host it ran on)."""
    return {"graph_source": f"synthetic:{SPEC}", "graph": "rmat", "nodes": 64, "nnz": 300, "features": 8,
            "classes": 4, "layers": 2, "hidden": 16, "grid": "1x2x1", "epochs": 4, "warmup": 1,
            "machine": "perlmutter", "predicted": {"machine": "perlmutter", "total_ms": 1.0},
            "environment": {"host": "node7"}, "comm_precision": "aggregation=bf16",
            "options": {"block_rows": 16, "dtype": "float64"}, "epoch_ms": 3.0, **extra}


def test_a_v1_record_reads_as_the_run_it_was():
    spec = RunSpec.from_record(v1_record())
    # hand-read from the record: the grid from its text, the host from its environment (v1 -> v2),
    # N from the v1 name, the widths from features, hidden and classes, the defaults of later fields
    assert spec.grid == (1, 2, 1) and spec.machine == "node7" and spec.nodes == 64 and spec.nnz == 300
    assert spec.widths == (8, 16, 4) and spec.block_rows == 16 and spec.dtype == "float64"
    assert spec.comm_precision == CommPrecision(aggregation="bf16")
    assert (spec.algorithm, spec.launcher, spec.cluster, spec.dp, spec.replication) == ("plexus-3d", "local", "", 1, None)
    ident = spec.identity()
    assert (ident.gx, ident.gy, ident.gz, ident.block_rows, ident.replication, ident.aggregation) == (1, 2, 1, 16, 0, "")
    # the precision in its canonical text (as the trainer logs it), whatever the record's spelling
    assert ident.comm_precision == "aggregation=bf16,combination=fp32,gather=fp32" and ident.machine == "node7"
    assert run_identity(v1_record()) == ident


def test_the_identity_round_trips_and_unset_options_are_none():
    ident = RunSpec.from_record(v1_record(algorithm="cagnet-1.5d", options={"replication": 2})).identity()
    spec = RunSpec.from_identity(ident)
    assert spec.identity() == ident and spec.replication == 2 and spec.block_rows is None and spec.batch_size is None
    assert RunSpec.from_identity(spec.identity(), nodes=64) == dataclasses.replace(spec, nodes=64)


def test_the_precision_is_parsed_once_into_a_typed_value():
    spec = RunSpec(comm_precision="combination=int8,bf16")
    assert isinstance(spec.comm_precision, CommPrecision)
    assert spec.comm_precision == CommPrecision(aggregation="bf16", combination="int8", gather="bf16")
    assert spec.identity().comm_precision == "aggregation=bf16,combination=int8,gather=bf16"
    assert RunSpec(comm_precision=spec.comm_precision).comm_precision is spec.comm_precision
    with pytest.raises(UserError, match="int7"):
        RunSpec(comm_precision="int7")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.overlap = True


def test_a_trainer_configuration_gets_its_family_settings():
    config = TrainConfig(synthetic=SPEC, gpus=2, layers=2, hidden=16, epochs=3, warmup=1, algorithm="supergcn",
                         comm_precision="bf16", machine="box", cluster={"nodes": 2, "kind": "emulated"})
    spec = RunSpec.from_config(config)
    # supergcn: its one grid of 2 GPUs, the graph's own order, the default aggregation
    assert spec.grid == (2, 1, 1) and spec.permute == "none" and spec.aggregation == "hybrid"
    assert spec.graph == f"synthetic:{SPEC}" and spec.machine == "box" and spec.cluster == '{"kind":"emulated","nodes":2}'
    assert spec.comm_precision == CommPrecision("bf16", "bf16", "bf16") and spec.widths is None
    assert spec.prediction_settings() == {"block_rows": None, "overlap": False, "fixed_features": False,
                                          "comm_precision": CommPrecision("bf16", "bf16", "bf16"),
                                          "algorithm": "supergcn", "options": {"aggregation": "hybrid"}}


def test_a_runs_table_row_is_the_spec_of_its_records():
    records = [v1_record(trial=t, epoch_ms=2.0 + t, gx=1, gy=2, gz=1) for t in range(3)]
    table = runs_table(records)
    assert len(table) == 1
    row_spec = RunSpec.from_row(table.iloc[0])
    assert row_spec == RunSpec.from_record(records[0]) and row_spec.graph_name == "rmat"


def test_prediction_settings_and_prediction_follow_the_family_and_the_settings():
    paper = RunSpec.from_record({"graph_source": "g", "gx": 2, "gy": 2, "gz": 1, "algorithm": "cagnet-2d",
                                 "options": {"schedule": "paper", "fixed_features": True}})
    assert paper.prediction_settings()["options"] == {"schedule": "paper"}
    assert paper.prediction_settings()["fixed_features"] is True
    spec = RunSpec.from_record(v1_record())
    with pytest.raises(UserError, match="lacks 'graph_nodes'"):
        dataclasses.replace(spec, nodes=None).predict("perlmutter")
    # the workload as logged, 8-byte elements of float64, at the record's grid, precision and block rows
    by_hand = predict_run(Workload("rmat", 64, 300, (8, 16, 4), bytes_per_element=8), "perlmutter", (1, 2, 1),
                          block_rows=16, comm_precision="aggregation=bf16")
    assert spec.predict("perlmutter") == by_hand


def test_command_line_arguments_make_the_spec_their_run_records():
    from plexus_tune.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["train", "--synthetic", SPEC, "--grid", "1x2x1", "--layers", "2", "--hidden", "16",
                              "--comm-precision", "aggregation=int8,bf16", "--block-rows", "8", "--overlap",
                              "--dtype", "float64", "--threads", "3", "--machine", "box"])
    spec = RunSpec.from_args(args)
    assert (spec.graph, spec.grid, spec.layers, spec.hidden) == (f"synthetic:{SPEC}", (1, 2, 1), 2, 16)
    assert spec.comm_precision == CommPrecision(aggregation="int8", combination="bf16", gather="bf16")
    assert (spec.block_rows, spec.overlap, spec.dtype, spec.threads_per_rank, spec.permute) == (8, True, "float64", 3, "double")
    # measure: no grid; a family naming its grid takes its first configuration, the others follow from G
    for algorithm, extra, want in (("plexus-3d", [], (1, 1, 4)), ("cagnet-1.5d", ["--replication", "2"], (2, 2, 1)),
                                   ("supergcn", [], (4, 1, 1))):
        args = parser.parse_args(["measure", "--graph", SPEC, "--gpus", "4", "--algorithm", algorithm, "--log", "x.jsonl",
                                  "--machine", "perlmutter", *extra])
        spec = RunSpec.from_args(args)
        assert spec.grid == want and spec.graph == f"synthetic:{SPEC}" and spec.machine != "perlmutter"
    assert spec.aggregation == "hybrid" and spec.permute == "none"
    with pytest.raises(UserError, match="no-such"):
        RunSpec.from_args(parser.parse_args(["measure", "--graph", SPEC, "--gpus", "2", "--algorithm", "no-such",
                                             "--log", "x.jsonl"]))
