"""``plexus-tune measure``: train a graph on many grids, log each run, show predicted beside observed."""

from __future__ import annotations

import numpy as np

from plexus_tune.cli.options import count, real
from plexus_tune.cli.launching import add_launcher_arguments, command_argv, launcher_from_args, submits
from plexus_tune.cli.output import check_log, make_console
from plexus_tune.measure.store import RUN_LOG
from plexus_tune.errors import UserError
from plexus_tune.launch import dispatch, slurm
from plexus_tune.measure.campaign import (
    campaign_config,
    choose_grids,
    config_identity,
    config_settings,
    job_failure_record,
    launcher_options,
    load_stats,
    log_campaign_run,
    logged_trials,
    pending_runs,
    run_campaign,
    workload_of,
)
from plexus_tune.measure.identity import run_setting
from plexus_tune.measure.table import runs_table
from plexus_tune.measure.store import read_runs
from plexus_tune.model.grid import format_grid
from plexus_tune.model.machine import load_machine
from plexus_tune.cli.train import add_algorithm_arguments, add_comm_precision_argument, comm_precision_of, check_batch_flag, family_train_options
from plexus_tune.model.comm_precision import check_backend
from plexus_tune.trainer.algorithms import check_algorithm, some_grid
from plexus_tune.trainer.run import check_training_memory


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "measure",
        help="run the trainer on many grids and log every run (resumable)",
        description="Train GRAPH on G ranks for each chosen grid, TRIALS times, appending one record per "
        "trial to --log (failed runs too). Runs already in the log are skipped unless --redo. "
        "With --machine, the predicted epoch time is logged and shown beside the observed one.",
    )
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--graph", help="graph file, or a synthetic spec such as rmat:nodes=16384,edges=262144,features=64,classes=8")
    src.add_argument("--synthetic", metavar="SPEC", help="synthetic graph spec (same as --graph SPEC)")
    parser.add_argument("--gpus", type=count(1), required=True, metavar="G", help="ranks per run")
    parser.add_argument("--grids", default="all", help="all (default), top:K (best K predicted by --machine) or a list 2x2x2,1x4x2 "
                        "(process grids of --algorithm: every configuration of the family with all)")
    add_algorithm_arguments(parser)
    parser.add_argument("--trials", type=count(1), default=3, help="runs per grid (default 3)")
    parser.add_argument("--epochs", type=count(1), default=10, help="epochs per run, warm-up included (default 10)")
    parser.add_argument("--warmup", type=count(0), default=2, help="warm-up epochs left out of the timing (default 2)")
    parser.add_argument("--layers", type=count(1), default=3, help="GCN layers (default 3)")
    parser.add_argument("--hidden", type=count(1), default=128, help="hidden width (default 128)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="default gloo")
    parser.add_argument("--permute", choices=("double", "single", "none", "local"), default="double",
                        help="random permutation of the adjacency for load balance: double (default; rows and columns), "
                             "single, none, or local (double kept in node order inside each block of the grid)")
    parser.add_argument("--block-rows", type=count(1), default=None, help="blocked aggregation: rows per SpMM block")
    parser.add_argument("--fixed-features", action="store_true",
                        help="train with the input features fixed (no layer-0 feature gradient); logged and "
                             "predicted as such (docs/model.md, Fixed features)")
    add_comm_precision_argument(parser)
    parser.add_argument("--timeout", type=real(above=0), default=1800.0, metavar="S", help="stop a run after S seconds (logged as timeout)")
    parser.add_argument("--machine", default=None, help="profile for the predictions (name or JSON path)")
    parser.add_argument("--log", required=True, metavar="FILE", help="JSON Lines run log to append to")
    add_launcher_arguments(parser)
    parser.add_argument("--batch", type=count(1), default=1, metavar="K", help="runs per process set (default 1: fresh processes per run; K > 1 saves start-up)")
    again = parser.add_mutually_exclusive_group()
    again.add_argument("--redo", action="store_true", help="run again what the log already holds")
    again.add_argument("--retry-failed", action="store_true", help="run again the logged failures (not with --redo, "
                       "which runs everything again)")
    parser.set_defaults(handler=run)


def run(args) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    graph = args.graph or args.synthetic
    comm_precision = comm_precision_of(args)
    check_backend(args.backend, comm_precision)
    if not args.warmup < args.epochs:  # argparse checked each number; this pair, before any work
        raise UserError(f"need 0 <= --warmup < --epochs, got warmup {args.warmup}, epochs {args.epochs}")
    machine = None
    if args.machine:
        machine = load_machine(args.machine)
    check_log("--log", args.log, kinds=RUN_LOG, inputs=[graph, args.machine])
    # the graph is read once here: a missing, truncated or corrupt file fails before any rank starts
    stats = load_stats(graph)
    workload = workload_of(stats, args.layers, args.hidden) if machine is not None else None
    algorithm = check_algorithm(args.algorithm)
    family_options = family_train_options(args, algorithm)
    if family_options:
        check_batch_flag(family_options["batch_size"], stats.nodes)
        if args.gpus % family_options["dp"]:
            raise UserError(f"--dp {family_options['dp']} does not divide --gpus {args.gpus}")
    options = {"backend": args.backend, "permute": args.permute, "block_rows": args.block_rows, "timeout_s": args.timeout,
               "comm_precision": comm_precision, "algorithm": algorithm,
               "aggregation": args.aggregation, "fixed_features": bool(args.fixed_features), **family_options}
    settings = config_settings(campaign_config(graph, some_grid(options["algorithm"], args.gpus), layers=args.layers, hidden=args.hidden,
                                               epochs=args.epochs, warmup=args.warmup, options=options))
    grids = choose_grids(args.gpus, args.grids, workload=workload, machine=machine, settings=settings,
                         replication=args.replication)
    console = make_console()
    err = make_console(stderr=True)
    total = len(grids) * args.trials
    launcher = launcher_from_args(args, sorted({int(np.prod(g)) * int(family_options.get("dp", 1)) for g in grids}))
    check_training_memory(campaign_config(graph, grids[0], layers=args.layers, hidden=args.hidden, epochs=args.epochs,
                                          warmup=args.warmup, options=options), launcher)
    if submits(launcher):
        return _submit(args, launcher, graph, grids, options, machine, stats, console, err)
    rows = []
    with launcher, Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err) as progress:
        task = progress.add_task(f"measuring {len(grids)} grids x {args.trials} trials", total=total)

        def on_skip(grid, trial):
            progress.advance(task)
            progress.console.print(f"{'x'.join(map(str, grid)):>9} trial {trial}: already in {args.log} (a logged run with "
                                   f"these settings, from measure, train or run, counts as this trial; --redo runs it again)",
                                   highlight=False)

        def on_result(record, grid):
            progress.advance(task)
            name = format_grid(grid)
            pred = record.get("predicted", {}).get("total_ms")
            if record.get("status") == "ok":
                obs = record["epoch_ms"]
                extra = (f"  predicted {pred:9.2f} ms ({(pred - obs) / obs:+.0%} of the observed)" if pred is not None else "")
                progress.console.print(f"{name:>9} trial {record['trial']}: observed {obs:9.2f} ms{extra}")
            else:
                progress.console.print(f"{name:>9} trial {record['trial']}: {record.get('status')} - {record.get('reason')}")
            rows.append(record)

        run_campaign(
            graph,
            args.gpus,
            grids,
            log=args.log,
            trials=args.trials,
            epochs=args.epochs,
            warmup=args.warmup,
            layers=args.layers,
            hidden=args.hidden,
            machine=machine,
            stats=stats,
            redo=args.redo,
            retry_failed=args.retry_failed,
            train_options=options,
            on_result=on_result,
            on_skip=on_skip,
            batch=args.batch,
            launcher=launcher,
            on_start=dispatch.mark_running,
        )
    _summary(console, args.log, campaign_config(graph, grids[0], layers=args.layers, hidden=args.hidden, epochs=args.epochs,
                                                warmup=args.warmup, options=launcher_options(options, launcher)), args.gpus)
    failed = sum(1 for r in rows if r.get("status") != "ok")
    err.print(f"{len(rows)} new run(s), {failed} failed; log: {args.log}")
    return 0


def _submit(args, launcher, graph, grids, options, machine, stats, console, err) -> int:
    """Outside a Slurm allocation: one batch job runs the campaign; wait for it, resume it."""

    reporter = dispatch.Reporter()
    world_sizes = sorted({int(np.prod(g)) for g in grids})
    settings = dict(log=args.log, trials=args.trials, epochs=args.epochs, warmup=args.warmup, layers=args.layers,
                    hidden=args.hidden, redo=False, retry_failed=args.retry_failed)
    workload = workload_of(stats, args.layers, args.hidden) if stats is not None and machine is not None else None
    failed_jobs, new = [], []

    def collect(states):
        """Log the run each unfinished job had in flight, with the job's Slurm state."""
        train_options = launcher_options(options, launcher)
        for state in states:
            if state.state == "COMPLETED":
                continue
            failed_jobs.append(state)
            running = dispatch.in_flight(args.log, state.key)
            tail = dispatch.job_output_tail(args.log, state)
            if running is None:
                reporter.line(f"job {state.key} ended {state.state} before any run started" + (f":\n{tail}" if tail else ""))
                continue
            grid = tuple(int(v) for v in running["grid"].split("x"))
            config = campaign_config(graph, grid, layers=args.layers, hidden=args.hidden, epochs=args.epochs,
                                     warmup=args.warmup, options=train_options)
            if logged_trials(args.log).get((config_identity(config), int(running["trial"]))) not in (None, "cancelled"):
                continue  # the run was logged before the job ended
            record = log_campaign_run(args.log, job_failure_record(config, state, launcher=launcher.name),
                                      trial=int(running["trial"]), gpus=args.gpus, trials=args.trials, grids=grids,
                                      machine=machine, workload=workload)
            new.append(record)
            reporter.line(dispatch.describe_run(record))

    def finish(states, signum):
        collect(states)
        dispatch.mark_collected(args.log, [s.job_id for s in states])
        _summary(console, args.log, campaign_config(graph, grids[0], layers=args.layers, hidden=args.hidden,
                                                    epochs=args.epochs, warmup=args.warmup,
                                                    options=launcher_options(options, launcher)), args.gpus)
        failed = sum(1 for r in new if r.get("status") != "ok")
        left = len(pending_runs(graph, grids, **settings, train_options=options, launcher=launcher))
        err.print(f"{len(new)} new run(s), {failed} failed; {left} still to run; log: {args.log}", highlight=False)
        if signum is not None:
            return 128 + signum
        return 1 if failed_jobs else 0

    ids = dispatch.parse_job_ids(args.resume) if args.resume else dispatch.uncollected(args.log)
    if ids:
        states = slurm.job_states(ids)
        live = [s for s in states if not (s.done or s.state == "UNKNOWN")]
        if not live:
            collect(states)
            dispatch.mark_collected(args.log, ids)
        else:
            reporter.line(f"job(s) {', '.join(ids)} of this log are still queued or running: waiting for them "
                          f"(nothing is submitted)")
            if args.no_wait:
                return 0
            states, signum = dispatch.wait(ids, args.log, reporter, on_record=new.append)
            return finish(states, signum)
    pending = pending_runs(graph, grids, **settings, train_options=options, launcher=launcher)
    if not pending:
        reporter.line(f"all {len(grids) * args.trials} runs are in {args.log}: nothing to submit")
        return finish([], None)
    job = dispatch.submit(command_argv(args), args.log, launcher, world_sizes, job_name="plexus-tune-measure",
                          reporter=reporter)
    reporter.line(f"job {job}: {len(pending)} run(s) of {len(grids)} grid(s) on {max(world_sizes)} ranks; "
                  f"output in {dispatch.state_dir(args.log)}")
    if args.no_wait:
        return 0
    states, signum = dispatch.wait([job], args.log, reporter, on_record=new.append)
    return finish(states, signum)


def _summary(console, log, config, gpus) -> None:
    """Table of the runs on G with this campaign's setting (any grid): the runs table's rows, best first."""
    import math

    from rich.table import Table

    setting = run_setting(config_identity(config))
    table = runs_table(read_runs(log, warn=False), include_failed=True)
    mine = table[[run_setting(i) == setting for i in table["identity"]]]
    mine = mine[mine["gpus"] == gpus].sort_values("obs_epoch_ms", na_position="last")
    out = Table(title=f"{setting[0]} on {gpus} ranks")
    for col in ("grid", "runs", "failed", "observed median ms", "min..max", "predicted ms"):
        out.add_column(col, justify="left" if col == "grid" else "right")
    for _, row in mine.iterrows():
        ok = int(row["trials"]) > 0
        pred = row["pred_total_ms"]
        out.add_row(
            row["grid"],
            str(int(row["trials"]) + int(row["failed"])),
            str(int(row["failed"])),
            f"{row['obs_epoch_ms']:.2f}" if ok else "-",
            f"{row['obs_epoch_ms_min']:.1f}..{row['obs_epoch_ms_max']:.1f}" if ok else "-",
            f"{pred:.2f}" if isinstance(pred, float) and not math.isnan(pred) else "-",
        )
    console.print(out)
