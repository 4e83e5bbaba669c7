"""``plexus-tune measure``: train a graph on many grids, log each run, show predicted beside observed."""

from __future__ import annotations

import dataclasses

import numpy as np

from plexus_tune.cli.options import count, real
from plexus_tune.cli.launching import add_launcher_arguments, command_argv, launcher_from_args, submits
from plexus_tune.cli.output import check_log, make_console
from plexus_tune.measure.store import RUN_LOG
from plexus_tune.errors import UserError
from plexus_tune.launch import dispatch
from plexus_tune.measure.campaign import (
    Campaign,
    campaign_rows,
    choose_grids,
    load_stats,
    log_unfinished,
    pending_runs,
    run_campaign,
    workload_of,
)
from plexus_tune.measure.identity import RunSpec
from plexus_tune.model.grid import format_grid
from plexus_tune.model.machine import load_machine
from plexus_tune.cli.train import add_algorithm_arguments, add_comm_precision_argument, comm_precision_of, check_batch_flag, family_train_options
from plexus_tune.model.comm_precision import check_backend
from plexus_tune.trainer.algorithms import check_algorithm


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
    campaign, machine, stats = _campaign(args)
    dp = int(campaign.train_options.get("dp", 1))
    launcher = launcher_from_args(args, sorted({int(np.prod(g)) * dp for g in campaign.grids}))
    campaign.spec.check_memory(launcher)
    if submits(launcher):
        return _submit(args, campaign, launcher, machine, stats)
    err = make_console(stderr=True)
    with launcher, _Progress(campaign, err) as progress:
        run_campaign(campaign, machine=machine, stats=stats, launcher=launcher, on_result=progress.on_result,
                     on_skip=progress.on_skip, on_start=dispatch.mark_running)
    _summary(make_console(), campaign, launcher)
    failed = sum(1 for r in progress.rows if r.get("status") != "ok")
    err.print(f"{len(progress.rows)} new run(s), {failed} failed; log: {campaign.log}")
    return 0


def _campaign(args) -> tuple[Campaign, object, object]:
    """The campaign the arguments ask for, the profile predicting it and the graph's statistics,
    each checked before any work starts."""
    graph = args.graph or args.synthetic
    comm_precision = comm_precision_of(args)
    check_backend(args.backend, comm_precision)
    if not args.warmup < args.epochs:  # argparse checked each number; this pair, before any work
        raise UserError(f"need 0 <= --warmup < --epochs, got warmup {args.warmup}, epochs {args.epochs}")
    machine = load_machine(args.machine) if args.machine else None
    check_log("--log", args.log, kinds=RUN_LOG, inputs=[graph, args.machine])
    stats = load_stats(graph)  # read once here: a missing, truncated or corrupt file fails before any rank starts
    algorithm = check_algorithm(args.algorithm)
    family_options = family_train_options(args, algorithm)
    if family_options:
        check_batch_flag(family_options["batch_size"], stats.nodes)
        if args.gpus % family_options["dp"]:
            raise UserError(f"--dp {family_options['dp']} does not divide --gpus {args.gpus}")
    options = {"backend": args.backend, "permute": args.permute, "block_rows": args.block_rows, "timeout_s": args.timeout,
               "comm_precision": comm_precision, "algorithm": algorithm,
               "aggregation": args.aggregation, "fixed_features": bool(args.fixed_features), **family_options}
    spec = RunSpec.from_args(args, **options)  # the runs' spec, built once: the campaign runs it on each grid
    workload = workload_of(stats, args.layers, args.hidden) if machine is not None else None
    grids = choose_grids(args.gpus, args.grids, workload=workload, machine=machine,
                         settings=spec.ranking_settings(stats.context), replication=args.replication)
    return Campaign(graph, args.gpus, grids, log=args.log, trials=args.trials, epochs=args.epochs,
                    warmup=args.warmup, layers=args.layers, hidden=args.hidden, train_options=options,
                    redo=args.redo, retry_failed=args.retry_failed, batch=args.batch, spec=spec), machine, stats


class _Progress:
    """A progress bar over a local campaign's runs and one line per run; ``rows``: the new records."""

    def __init__(self, campaign: Campaign, console):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.campaign, self.rows = campaign, []
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=console)

    def __enter__(self):
        self.bar.__enter__()
        self.task = self.bar.add_task(f"measuring {len(self.campaign.grids)} grids x {self.campaign.trials} trials",
                                      total=self.campaign.runs())
        return self

    def __exit__(self, *exc):
        return self.bar.__exit__(*exc)

    def on_skip(self, grid, trial) -> None:
        self.bar.advance(self.task)
        self.bar.console.print(f"{format_grid(grid):>9} trial {trial}: already in {self.campaign.log} (a logged run "
                               f"with these settings, from measure, train or run, counts as this trial; --redo runs "
                               f"it again)", highlight=False)

    def on_result(self, record, grid) -> None:
        self.bar.advance(self.task)
        name, pred = format_grid(grid), record.get("predicted", {}).get("total_ms")
        if record.get("status") == "ok":
            obs = record["epoch_ms"]
            extra = (f"  predicted {pred:9.2f} ms ({(pred - obs) / obs:+.0%} of the observed)" if pred is not None else "")
            self.bar.console.print(f"{name:>9} trial {record['trial']}: observed {obs:9.2f} ms{extra}")
        else:
            self.bar.console.print(f"{name:>9} trial {record['trial']}: {record.get('status')} - {record.get('reason')}")
        self.rows.append(record)


def _submit(args, campaign: Campaign, launcher, machine, stats) -> int:
    """Outside a Slurm allocation: one batch job runs the campaign; wait for it, resume it
    (:func:`plexus_tune.launch.dispatch.dispatch`)."""
    workload = workload_of(stats, campaign.layers, campaign.hidden) if machine is not None else None
    unlogged = dataclasses.replace(campaign, redo=False)  # what the log still lacks
    world_sizes = sorted({int(np.prod(g)) for g in campaign.grids})
    job = dispatch.BatchJob(command_argv(args), campaign.log, launcher, world_sizes, "plexus-tune-measure",
                            resume=args.resume, wait=not args.no_wait,
                            nothing_to_do=f"all {campaign.runs()} runs are in {campaign.log}: nothing to submit")
    outcome = dispatch.dispatch(
        job, dispatch.Reporter(),
        describe=lambda job_id, left: (f"job {job_id}: {left} run(s) of {len(campaign.grids)} grid(s) on "
                                       f"{max(world_sizes)} ranks; output in {dispatch.state_dir(campaign.log)}"),
        pending=lambda: len(pending_runs(unlogged, launcher=launcher)),
        collect=lambda states: log_unfinished(campaign, states, launcher=launcher, machine=machine, workload=workload,
                                              graph=stats.context))
    if outcome.detached:
        return 0
    _summary(make_console(), campaign, launcher)
    failed = sum(1 for r in outcome.records if r.get("status") != "ok")
    left = len(pending_runs(unlogged, launcher=launcher))
    make_console(stderr=True).print(f"{len(outcome.records)} new run(s), {failed} failed; {left} still to run; "
                                    f"log: {campaign.log}", highlight=False)
    return outcome.exit_code(ok=all(s.state == "COMPLETED" for s in outcome.collected))


def _summary(console, campaign: Campaign, launcher) -> None:
    """Table of the runs on G with this campaign's setting (any grid): the runs table's rows, best first."""
    import math

    from rich.table import Table

    setting, mine = campaign_rows(campaign, launcher)
    out = Table(title=f"{setting[0]} on {campaign.gpus} ranks")
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
