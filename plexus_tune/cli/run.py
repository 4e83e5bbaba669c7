"""``plexus-tune run``: predict every grid, train the best feasible one, log it, compare."""

from __future__ import annotations

import math

from plexus_tune.cli.options import count, real
from plexus_tune.cli.launching import add_launcher_arguments, command_argv, launcher_from_args, submits
from plexus_tune.cli.output import check_log, make_console
from plexus_tune.measure.store import RUN_LOG
from plexus_tune.errors import UserError
from plexus_tune.launch import dispatch
from plexus_tune.measure.campaign import campaign_config, choose_grids, log_run
from plexus_tune.measure.identity import RunSpec, run_identity, training_fields
from plexus_tune.measure.table import runs_table
from plexus_tune.measure.store import read_runs
from plexus_tune.report.validation import overhead_note
from plexus_tune.model.planner import GridRanking
from plexus_tune.model.prediction import predict_run_grids
from plexus_tune.model.grid import format_grid, parse_grid
from plexus_tune.model.machine import load_machine
from plexus_tune.paths import default_run_log
from plexus_tune.search import graph_workload
from plexus_tune.measure.training import run_training
from plexus_tune.trainer.algorithms import check_algorithm

HELP = "predict every grid of G, train the best feasible one with the bundled trainer, log it and compare"
from plexus_tune.cli.train import add_algorithm_arguments, add_comm_precision_argument, comm_precision_of, family_train_options, check_batch_flag
from plexus_tune.model.comm_precision import check_backend
from plexus_tune.model.breakdown import COMM_AXIS_KEYS, LABELS, TOTAL_PARTS, labelled


def register(subparsers) -> None:
    p = subparsers.add_parser("run", help=HELP, description=HELP)
    p.add_argument("--graph", required=True, help="graph file or synthetic spec (e.g. rmat:nodes=4096,edges=65536,features=32,classes=8)")
    p.add_argument("--gpus", required=True, type=count(1), help="number of ranks G")
    p.add_argument("--machine", default="perlmutter", help="profile of the machine the run happens on (default perlmutter)")
    p.add_argument("--grid", help="train this grid instead of the recommended one (still predicted and compared)")
    add_algorithm_arguments(p)
    p.add_argument("--layers", type=count(1), default=3, help="GCN layers (default 3)")
    p.add_argument("--hidden", type=count(1), default=128, help="hidden width (default 128)")
    p.add_argument("--epochs", type=count(1), default=10, help="epochs, warm-up included (default 10)")
    p.add_argument("--warmup", type=count(0), default=2, help="epochs left out of the timing (default 2)")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="gloo (CPU) or nccl (CUDA)")
    p.add_argument("--block-rows", type=count(1), metavar="N", help="blocked aggregation with N rows per block")
    add_comm_precision_argument(p)
    p.add_argument("--timeout", type=real(above=0), default=1800.0, metavar="S", help="seconds before the run counts as failed")
    add_launcher_arguments(p)
    p.add_argument("--log", metavar="FILE", help="run log to append to (default runs.jsonl in the data directory: "
                   "$PLEXUS_TUNE_DATA, else $XDG_DATA_HOME/plexus-tune, else ~/.local/share/plexus-tune)")
    p.add_argument("--top", type=count(1), default=5, help="predicted grids to list (default 5)")
    p.set_defaults(handler=run)


def _fmt(v) -> str:
    return "-" if v is None or v != v else f"{v:.2f}"


def run(args) -> int:
    options, grid = _options(args)
    log = str(check_log("--log", args.log if args.log else default_run_log(), kinds=RUN_LOG, inputs=[args.graph]))
    launcher = launcher_from_args(args, [args.gpus])
    machine = load_machine(args.machine)
    stats, workload = graph_workload(args.graph, layers=args.layers, hidden=args.hidden)
    if "batch_size" in options:
        check_batch_flag(options["batch_size"], stats.nodes)
    spec = RunSpec.from_config(campaign_config(args.graph, (args.gpus, 1, 1), layers=args.layers, hidden=args.hidden,
                                               epochs=args.epochs, warmup=args.warmup, options=options))
    settings = spec.ranking_settings(stats.context)  # the run's spec, built once: ranked here (on its graph, as
    # predict --graph ranks it), trained on the chosen grid
    grids = choose_grids(args.gpus, "all", settings=settings, replication=args.replication)
    if grid is not None and grid not in grids:
        raise UserError(f"grid {args.grid} is not a configuration of {options['algorithm']} on {args.gpus} GPUs; "
                        f"choose from {', '.join(format_grid(g) for g in grids)}")
    ranking = GridRanking.of(predict_run_grids(workload, machine, grids, **settings), grids)
    pick = ranking.index(grid) if grid is not None else ranking.best_feasible()
    if pick is None:
        raise UserError(f"no grid of {args.gpus} GPUs fits in memory on {machine.name}; use more GPUs")
    grid = tuple(int(v) for v in grids[pick])
    console = make_console()
    _print_predictions(console, args, machine, stats, workload, ranking, pick)
    if submits(launcher):
        return _submit(args, launcher, grid, log)
    console.print(f"training {format_grid(grid)} ({args.gpus} ranks, {args.backend}), {args.epochs} epochs ...")
    with launcher:
        run_spec = spec.with_grid(grid).with_launcher(launcher)
        record = run_training(run_spec.train_config(**training_fields(options)), raise_on_failure=False, launcher=launcher,
                              spec=run_spec)
    record = log_run(log, record, machine=machine, workload=workload, spec=run_spec, graph=stats.context)
    if record.get("status", "ok") != "ok":
        console.print(f"[red]run failed ({record.get('status')}): {record.get('reason', '')}[/red]  (logged to {log})")
        return 1
    _print_comparison(console, grid, record, log)
    return 0


def _options(args) -> tuple[dict, tuple | None]:
    """The runs' TrainConfig options and the grid of --grid (None: the recommended one), checked."""
    comm_precision = comm_precision_of(args)
    check_backend(args.backend, comm_precision)
    if not args.warmup < args.epochs:  # argparse checked each number; this pair, before any work
        raise UserError(f"need 0 <= warmup < epochs, got epochs={args.epochs} warmup={args.warmup}")
    algorithm = check_algorithm(args.algorithm)
    family_options = family_train_options(args, algorithm)
    ranks = args.gpus // int(family_options.get("dp", 1))
    if ranks * int(family_options.get("dp", 1)) != args.gpus:
        raise UserError(f"--dp {family_options['dp']} does not divide --gpus {args.gpus}")
    grid = None
    if args.grid:
        grid = tuple(int(v) for v in parse_grid(args.grid))
        if math.prod(grid) != ranks:
            raise UserError(f"grid {args.grid} has {math.prod(grid)} ranks, not {ranks}"
                            + (f" (--gpus {args.gpus} over --dp {args.gpus // ranks})" if ranks != args.gpus else ""))
    options = {"backend": args.backend, "block_rows": args.block_rows, "timeout_s": args.timeout,
               "comm_precision": comm_precision, "algorithm": algorithm,
               "aggregation": args.aggregation, **family_options}
    return options, grid


def _print_predictions(console, args, machine, stats, workload, ranking, pick: int) -> None:
    from rich.table import Table

    pred = ranking.pred
    console.print(f"machine profile {machine.name} ({machine.path or 'given as data'})", highlight=False)
    console.print(f"{stats.name}: {stats.nodes:,} nodes, {stats.nnz:,} nonzeros, widths {list(workload.widths)}; "
                  f"{len(ranking.grids)} grids of {args.gpus} on {machine.name}, {ranking.n_feasible} fit in memory")
    table = Table(title="predicted (ms per epoch)")
    for col in ("rank", "grid", "total", "spmm", "gemm", "comm", "quant", "other", "overhead", "memory GiB", "fits"):
        table.add_column(col, justify="left" if col == "grid" else "right")
    for rank, i in enumerate(ranking.order[: max(1, args.top)]):
        table.add_row(str(rank + 1), format_grid(ranking.grids[i]), _fmt(pred["total_ms"][i]),
                      *(_fmt(pred[key][i]) for key in TOTAL_PARTS), f"{pred['memory_gib'][i]:.2f}",
                      "yes" if pred["feasible"][i] else "no", style="bold" if i == pick else None)
    console.print(table)
    console.print("total = spmm + gemm + comm + quant + other + overhead (ms per epoch)", style="dim")


def _print_comparison(console, grid, record, log) -> None:
    from rich.table import Table

    predicted = record["predicted"]
    cmp = Table(title=f"{format_grid(grid)}: predicted vs observed (ms per epoch, observed = max over ranks)")
    for col in ("part", "predicted", "observed", "observed/predicted"):
        cmp.add_column(col, justify="left" if col == "part" else "right")
    for key, label in (*labelled(("spmm_ms", "gemm_ms", *COMM_AXIS_KEYS, "comm_ms", "quant_ms", "other_ms",
                                  "overhead_ms")), ("epoch", LABELS["epoch_ms"])):
        p = predicted["total_ms" if key == "epoch" else key]
        o = record.get("epoch_ms" if key == "epoch" else key)
        ratio = "-" if o is None or p <= 0 else f"{float(o) / p:.2f}"
        cmp.add_row(label, _fmt(p), _fmt(o), ratio)
    console.print(cmp)
    note = overhead_note(predicted, record.get("epoch_ms"))
    if note:
        console.print(note, highlight=False)
    console.print(f"epoch {record['epoch_ms']:.2f} ms +- {record.get('epoch_ms_std', float('nan')):.2f} observed, "
                  f"{predicted['total_ms']:.2f} ms predicted; logged to {log} (trial {record['trial']})")
    table = runs_table(read_runs(log, warn=False))
    mine = table[[ident == run_identity(record) for ident in table["identity"]]]
    if len(mine) and int(mine["trials"].iloc[0]) > 1:
        row = mine.iloc[0]
        console.print(f"median over the {int(row['trials'])} successful trials of this run in the log: "
                      f"{row['obs_epoch_ms']:.2f} ms (min {row['obs_epoch_ms_min']:.2f}, max {row['obs_epoch_ms_max']:.2f})"
                      + (f"; {int(row['failed'])} failed" if row["failed"] else ""))


def _submit(args, launcher, grid, log) -> int:
    """Outside a Slurm allocation: a batch job runs this command; wait for it (or for the one
    already submitted for this log) and report its run (:func:`plexus_tune.launch.dispatch.dispatch`)."""
    job = dispatch.BatchJob(command_argv(args), log, launcher, [args.gpus], "plexus-tune-run", resume=args.resume,
                            wait=not args.no_wait)
    outcome = dispatch.dispatch(job, dispatch.Reporter(), describe=lambda job_id, _: (
        f"job {job_id}: trains {format_grid(grid)} on {args.gpus} ranks; its output (tables) in {dispatch.state_dir(log)}"))
    if outcome.detached:
        return 0
    runs = outcome.records
    return outcome.exit_code(ok=bool(runs) and all(r.get("status", "ok") == "ok" for r in runs))
