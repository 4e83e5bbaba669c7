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


def test_the_spec_is_the_trainer_configuration_s_single_source():
    from plexus_tune.model.memory import training_floor_bytes

    for config in (TrainConfig(synthetic=SPEC, grid=(1, 2, 1), layers=2, hidden=16, block_rows=8, overlap=True,
                               comm_precision="bf16", lr=0.5, seed=3, timeout_s=9.0),
                   TrainConfig(synthetic=SPEC, gpus=4, algorithm="cagnet-1.5d", replication=2, layers=2, hidden=16),
                   TrainConfig(graph="g.npz", gpus=2, algorithm="supergcn", aggregation="pre", layers=2, hidden=16),
                   TrainConfig(synthetic=SPEC, grid=(1, 1, 2), algorithm="scalegnn-4d", dp=2, batch_size=16,
                               extra={"minibatch": {"dropout": 0.1}})):
        spec = RunSpec.from_config(config)
        trained = spec.train_config(config)
        # the spec's fields, the configuration's training settings; nothing left to fill in
        assert RunSpec.from_config(trained, normalized=True) == spec == RunSpec.from_config(trained)
        assert (trained.lr, trained.seed, trained.timeout_s, trained.extra) == (config.lr, config.seed, config.timeout_s,
                                                                                config.extra)
        assert (trained.graph, trained.synthetic) == (config.graph, config.synthetic)
    # a campaign's other grid: cagnet-1.5d's replication c is the grid's Gy, as normalizing its configuration gives
    spec = RunSpec.from_config(TrainConfig(synthetic=SPEC, gpus=8, algorithm="cagnet-1.5d", replication=2))
    assert spec.grid == (4, 2, 1) and spec.replication == 2
    assert spec.with_grid((4, 2, 1)) == spec
    # hand-derived floor: 16 (L - 1) h^2 + 4 L N h with L = 3, h = 128, N = 1000
    assert training_floor_bytes(3, 128, 1000) == 16 * 2 * 128 * 128 + 4 * 3 * 1000 * 128 == 2_060_288


def test_a_campaign_runs_the_command_line_s_spec_on_each_grid():
    """A campaign given the command line's spec makes the runs (identities, trainer configurations) it
    makes from its own fields, on every grid of the family, with the launcher's name and cluster."""
    from plexus_tune.cli import build_parser
    from plexus_tune.launch.launchers import Launcher
    from plexus_tune.measure.campaign import Campaign, pending_runs

    class Emulated(Launcher):
        name, oversubscribe = "emulated", True

        def cluster(self):
            return {"nodes": 2, "ranks_per_node": 2}

    parser = build_parser()
    grids = {"plexus-3d": [(1, 1, 4), (2, 2, 1)], "cagnet-1.5d": [(8, 2, 1), (4, 4, 1)], "supergcn": [(4, 1, 1)],
             "scalegnn-4d": [(1, 1, 2), (2, 1, 1)]}
    for algorithm, extra in (("plexus-3d", ["--block-rows", "8"]), ("cagnet-1.5d", []), ("supergcn", []),
                             ("scalegnn-4d", ["--batch-size", "16", "--dp", "2"])):
        gpus = 16 if algorithm == "cagnet-1.5d" else 4  # two replication factors, c = 2 and 4
        args = parser.parse_args(["measure", "--graph", SPEC, "--gpus", str(gpus), "--algorithm", algorithm, "--layers", "2",
                                  "--hidden", "8", "--epochs", "3", "--warmup", "1", "--log", "x.jsonl", *extra])
        options = {"algorithm": algorithm, "block_rows": args.block_rows, "timeout_s": 7.0}
        if algorithm == "scalegnn-4d":
            options.update(dp=2, batch_size=16)
        spec = RunSpec.from_args(args, **options)
        family = grids[algorithm]
        common = dict(trials=2, epochs=3, warmup=1, layers=2, hidden=8, train_options=options)
        given = pending_runs(Campaign(SPEC, gpus, family, spec=spec, **common), launcher=Emulated())
        built = pending_runs(Campaign(SPEC, gpus, family, **common), launcher=Emulated())
        assert len(given) == len(built) == 2 * len(family)
        for (grid, trial, config, run), (grid2, trial2, config2, run2) in zip(given, built):
            assert (grid, trial, run.identity()) == (grid2, trial2, run2.identity())
            assert run.grid == grid and run.launcher == "emulated" and run.cluster == '{"nodes":2,"ranks_per_node":2}'
            assert config == config2 and config.timeout_s == 7.0
            assert run.replication == (grid[1] if algorithm == "cagnet-1.5d" else None)
