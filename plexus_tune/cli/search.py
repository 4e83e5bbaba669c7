"""``plexus-tune search``: Optuna search over grids, GPU counts and blocking."""

from __future__ import annotations

import argparse
import functools
from typing import NamedTuple

from plexus_tune.cli.options import count, real
from plexus_tune.cli.launching import add_launcher_arguments, command_argv, launcher_from_args, submits
from plexus_tune.cli.output import ProgressReporter, check_log, make_console
from plexus_tune.measure.store import RUN_LOG
from plexus_tune.cli import minibatch
from plexus_tune.cli.algorithms import add_algorithm_argument, load_graph_argument, search_families, selected_algorithms
from plexus_tune.cli.predict import add_precision_arguments, precision_choices
from plexus_tune.model.comm_precision import check_backend
from plexus_tune.model.precision_choice import accuracy_evidence, pick_precision
from plexus_tune.errors import UserError
from plexus_tune.launch import dispatch
from plexus_tune.model.family import DEFAULT_FAMILY
from plexus_tune.model.prediction import predict_run_grids
from plexus_tune.model.machine import load_machine
from plexus_tune.model.workload import workload_from_dataset
from plexus_tune.paths import default_run_log
from plexus_tune.search import driver
from plexus_tune.search.evaluate import EXACT_BUDGET_S, exhaustive_search, plan_search
from plexus_tune.search import (
    MeasuredEvaluator,
    ModelEvaluator,
    SearchSpace,
    best_configs,
    check_objective,
    default_storage_url,
    finished_trials,
    graph_workload,
    objective_unit,
    open_storage,
    open_study,
    parse_gpus,
)

HELP = "search grids (and GPU counts, blocking) with Optuna, model-driven or measured"

EPILOG = """\
objectives: epoch (ms per epoch) or gpu-hours (GPU-hours per 100 epochs = epoch_ms * G * 100 / 3.6e6).
A model-driven search enumerates every configuration when that is estimated to take at most
--exact-budget seconds (default 5; the estimate times the model on a probe of the space), and
then returns the exact optimum without a study; larger spaces, and --measured, use Optuna's TPE.
The output says which method ran.
--trials is the total for the study: running the same command again resumes it and runs
only the trials still missing (finished trials are kept). Studies live in studies.db in
the data directory ($PLEXUS_TUNE_DATA, else $XDG_DATA_HOME/plexus-tune, else
~/.local/share/plexus-tune) unless --storage names another database (any SQLAlchemy
URL, e.g. postgresql://user@host/db for several workers); measured runs go to runs.jsonl
there unless --log names another file.

--measured with --algorithm all (or a family other than plexus-3d): the model ranks the joint
space exactly, then the --trials (default 10) best configurations of families the trainer
runs are trained, model order first, through the launcher (docs/algorithms.md).

Several workers: run the same command in several processes (or on several hosts) with one
--storage; a configuration one worker measures is not measured by another (a worker that
samples it waits for the result). With --launcher slurm outside an allocation, --workers K
submits a job array of K tasks, one worker each, every run an srun step of its task.
"""


#: trials of a study when --trials is not given
DEFAULT_TRIALS = 60

def register(subparsers) -> None:
    p = subparsers.add_parser("search", help=HELP, description=HELP, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_argument_group("what to train")
    src.add_argument("--dataset", help="catalog dataset (see plexus-tune datasets)")
    src.add_argument("--graph", help="a graph file or synthetic spec (rmat:nodes=...,edges=...); required with --measured")
    src.add_argument("--layers", type=count(1), default=3, help="GCN layers (default 3)")
    src.add_argument("--hidden", type=count(1), default=128, help="hidden width (default 128)")
    p.add_argument("--machine", default="perlmutter", help="machine profile name or JSON path (default perlmutter)")
    p.add_argument("--gpus", required=True, help="G, a range A..B (every count; A..B:pow2 for powers of two) or a list 8,16,64")
    p.add_argument("--objective", default="epoch", help="epoch (default) or gpu-hours")
    p.add_argument("--block-rows", metavar="A..B", help="also search blocked aggregation with block sizes in A..B rows")
    p.add_argument("--trials", type=count(1), default=None, help="total trials of the study (default 60); given, a "
                   "model-driven search runs a TPE study of that many trials instead of enumerating")
    p.add_argument("--seed", type=count(0), default=0, help="sampler seed (default 0)")
    p.add_argument("--storage", help="study database URL (default: studies.db in the data directory, see below)")
    p.add_argument("--study", help="study name (default derived from the inputs); an existing study is resumed")
    p.add_argument("--snap", type=count(1), default=128, metavar="K",
                   help="model-driven: each trial is the best predicted of the K allowed grids nearest the sampled point (default 128; 1 = nearest only)")
    p.add_argument("--starts", type=count(0), default=5, metavar="N",
                   help="model-driven: enqueue the most cubic grid of N GPU counts spread over the range first (default 5)")
    p.add_argument("--top", type=count(1), default=5, help="rows of the final table (default 5)")
    p.add_argument("--exact-budget", type=real(minimum=0), default=None, metavar="SECONDS",
                   help="model-driven: enumerate the whole space when estimated to take at most this long "
                   "(default 5 s; 0 = always TPE)")
    m = p.add_argument_group("measured search")
    m.add_argument("--measured", action="store_true", help="train every new configuration with the bundled trainer")
    m.add_argument("--warm-start", type=count(0), default=3, metavar="K", help="enqueue the model's K best configurations first (default 3)")
    m.add_argument("--log", metavar="FILE", help="run log to read known runs from and append to (default: runs.jsonl in the data directory)")
    m.add_argument("--epochs", type=count(1), default=10, help="epochs per measured run (default 10; the first 2 are warm-up)")
    m.add_argument("--warmup", type=count(0), default=2, help="epochs left out of the timing (default 2)")
    m.add_argument("--backend", default="gloo", help="torch.distributed backend for measured runs (default gloo)")
    m.add_argument("--timeout", type=real(above=0), default=600.0, help="seconds per measured run before it counts as failed")
    m.add_argument("--workers", type=count(1), default=1, metavar="K",
                   help="with --launcher slurm outside an allocation: K search workers, one per task of a job array, "
                        "sharing the study (default 1)")
    add_launcher_arguments(p)
    add_precision_arguments(p)
    add_algorithm_argument(p)
    p.set_defaults(handler=run)


def parse_block_range(text):
    if text is None:
        return None
    try:
        values = parse_gpus(text)
    except UserError:
        raise UserError(f"cannot read block sizes {text!r}; write a range such as 1024..65536") from None
    return (values[0], values[-1])


class SearchInputs(NamedTuple):
    """What a search runs on: the workload's name, the workload, the profile, the graph
    (--graph; None for a catalog dataset) and its statistics, and the search space."""

    name: str
    workload: object
    machine: object
    graph: str | None
    stats: object
    space: SearchSpace


def build_inputs(args) -> SearchInputs:
    """Workload, machine, graph and search space from the common arguments."""
    check_objective(args.objective)
    gpus = parse_gpus(args.gpus)
    if (args.dataset is None) == (args.graph is None):
        raise UserError("give exactly one of --dataset NAME or --graph FILE|SPEC")
    machine = load_machine(args.machine)
    graph = stats = None
    if args.dataset is not None:
        workload = workload_from_dataset(args.dataset, layers=args.layers, hidden=args.hidden)
        name = workload.name
    else:
        graph = args.graph
        stats, workload = graph_workload(graph, layers=args.layers, hidden=args.hidden)
        name = stats.name
    return SearchInputs(name, workload, machine, graph, stats, SearchSpace(gpus, parse_block_range(args.block_rows)))


def run(args) -> int:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the command's process: no log line per trial
    driver.check_study_name(args.study)
    precisions, auto = precision_choices(args)
    if minibatch.only(args):
        raise UserError(f"search ranks full-graph epochs; rank {args.algorithm}'s Gd, grids and batch sizes with "
                        f"'plexus-tune predict --algorithm {args.algorithm} --batch-size B[,B...]'")
    algorithms = selected_algorithms(args)
    inputs = build_inputs(args)
    name, workload, machine, graph, _, space = inputs
    if algorithms != (DEFAULT_FAMILY,) or getattr(args, "fixed_features", False):  # the exact planner
        return search_families(args, workload, machine, space.gpus, algorithms, graph=load_graph_argument(graph))
    _check_measured(args, precisions, graph)
    launcher = launcher_from_args(args, space.gpus) if args.measured else None
    if args.workers > 1 and not submits(launcher):
        raise UserError("--workers submits a job array (--launcher slurm outside an allocation); elsewhere run the "
                        "command in several processes with one --storage")
    budget = _exact_budget(args)
    console = make_console()
    storage_url = args.storage or default_storage_url()
    storage = None
    results = {}
    for precision in precisions:
        model = ModelEvaluator(workload, machine, predict=functools.partial(predict_run_grids, comm_precision=precision))
        plan = None if args.measured else plan_search(space, model, budget)
        if plan is not None and plan.method == "exhaustive":
            results[precision] = run_exhaustive(args, name, machine, space, model, plan, console, precision)
            continue
        if storage is None:
            storage = open_storage(storage_url)
            if submits(launcher):
                return _submit(args, launcher, inputs, storage)
            console.print(f"machine profile {machine.name} ({machine.path or 'given as data'}); study storage {storage_url}"
                          + (f"; runs logged to {args.log}" if args.measured else ""), highlight=False)
        results[precision] = _search_one(args, inputs, storage, console, precision, model, plan, launcher)
    if auto or precisions != ["fp32"]:
        _print_precision_pick(console, results, auto, args.objective)
    return 0


def _check_measured(args, precisions, graph) -> None:
    """--measured's arguments checked before any study opens (and the run log's path settled);
    without it, no launcher flags."""
    if args.measured and graph is None:
        raise UserError("--measured trains real runs: give --graph FILE|SPEC (catalog datasets have statistics only)")
    if args.measured:
        for precision in precisions:  # the trainer must be able to send each one on this backend
            try:
                check_backend(args.backend, precision)
            except UserError as exc:
                raise UserError(f"--comm-precision/--backend: {exc}") from None
        if not 0 <= args.warmup < args.epochs:
            raise UserError(f"need 0 <= --warmup < --epochs, got warmup {args.warmup}, epochs {args.epochs}")
        args.log = str(check_log("--log", args.log or default_run_log(), kinds=RUN_LOG, inputs=[args.graph]))
    if not args.measured and (args.launcher or args.cluster or args.hosts):
        raise UserError("--launcher/--cluster/--hosts say where measured runs start: add --measured")


def _exact_budget(args) -> float:
    """Seconds a model-driven search may enumerate for; --trials given alone asks for a study (0).
    Sets the study's trials (default DEFAULT_TRIALS)."""
    if args.trials is not None and args.exact_budget is None:
        budget = 0.0  # --trials asks for a study of that many trials: honoured, not ignored
    else:
        budget = EXACT_BUDGET_S if args.exact_budget is None else args.exact_budget
    args.trials = DEFAULT_TRIALS if args.trials is None else args.trials
    if budget != budget or budget < 0:
        raise UserError(f"--exact-budget must be a number of seconds >= 0, got {args.exact_budget}")
    return budget


def _print_precision_pick(console, results, auto: bool, objective: str) -> None:
    pick, ranked = pick_precision(results)
    if pick is None:
        console.print("no feasible configuration at any allowed precision")
        return
    if auto:
        ranked_text = ", ".join(f"{p} {v:.4g}" for p, v in ranked)
        console.print(f"Picked precision: {pick} (best {objective} per precision: {ranked_text})", highlight=False)
    console.print(f"accuracy evidence for {pick}: {accuracy_evidence(pick)}", highlight=False)


def _search_one(args, inputs: SearchInputs, storage, console, precision, model, plan, launcher):
    """One study at one communication precision (search.driver.run_study); prints it and returns its best value."""
    name, machine, space = inputs.name, inputs.machine, inputs.space
    study_name = driver.study_name(name, machine.name, space, args.objective, measured=args.measured,
                                   precision=precision, name=args.study)
    gpus_attr = list(space.gpus) if len(space.gpus) <= 4096 else f"{space.gpus[0]}..{space.gpus[-1]}"
    attrs = {"dataset": name, "machine": machine.name, "gpus": gpus_attr, "measured": bool(args.measured),
             "comm_precision": precision}
    measured = None
    if args.measured:
        measured = MeasuredEvaluator(model, inputs.graph, stats=inputs.stats, layers=args.layers, hidden=args.hidden,
                                     epochs=args.epochs, warmup=args.warmup, backend=args.backend,
                                     timeout_s=args.timeout, log_path=args.log, launcher=launcher,
                                     train_options={"comm_precision": precision})
    progress = None if launcher is not None else ProgressReporter(command="search")
    callbacks = None if progress is None else [
        lambda study_, trial: progress("TPE trials", len(finished_trials(study_)), args.trials)]
    try:
        options = driver.StudyOptions(study_name, args.objective, args.trials, seed=args.seed, attrs=attrs,
                                      warm_start_k=args.warm_start, snap_neighbours=args.snap, starts=args.starts,
                                      show_progress=launcher is not None and console.is_terminal)
        outcome = driver.run_study(options, storage, space, model, measured=measured, launcher=launcher,
                                   callbacks=callbacks)
    finally:
        if progress is not None:
            progress.close()
    console.print("method: " + ("TPE on measured runs" if args.measured else plan.describe()), highlight=False)
    console.print(
        f"study [bold]{study_name}[/bold]: {len(finished_trials(outcome.study))} trials ({outcome.ran} run now, "
        f"{outcome.before} before), "
        + (f"{outcome.evaluations} new measurements" if args.measured else f"{outcome.evaluations} model evaluations")
    )
    print_best_table(outcome.study, args.objective, args.top, console, measured=args.measured)
    return outcome.best_value


def _submit(args, launcher, inputs: SearchInputs, storage) -> int:
    """Outside a Slurm allocation: a job array of --workers tasks runs the search, one worker each,
    sharing the study; wait for it (or for the one already submitted for this log)."""
    argv = command_argv(args)
    if args.storage is None:  # the workers must open the same database, wherever they start
        argv += ["--storage", default_storage_url()]
    space = inputs.space
    job = dispatch.BatchJob(argv, args.log, launcher, space.gpus, "plexus-tune-search",
                            array=args.workers if args.workers > 1 else None, resume=args.resume, wait=not args.no_wait)
    outcome = dispatch.dispatch(job, dispatch.Reporter(), describe=lambda job_id, _: (
        f"job {job_id}: {args.workers} search worker(s), {args.trials} trials in all, runs on up to "
        f"{max(space.gpus)} ranks; output in {dispatch.state_dir(args.log)}"))
    if outcome.detached or outcome.signum is not None:
        return outcome.exit_code()
    study_name = driver.study_name(inputs.name, inputs.machine.name, space, args.objective, measured=True, name=args.study)
    study = open_study(study_name, storage, objective=args.objective, seed=args.seed)
    console = make_console()
    console.print(f"study [bold]{study_name}[/bold]: {len(finished_trials(study))} trials")
    print_best_table(study, args.objective, args.top, console, measured=True)
    return outcome.exit_code()


def run_exhaustive(args, name, machine, space, model, plan, console, precision: str = "fp32") -> float:
    """Enumerate every configuration of the space with the model, print the best (no study) and return its objective value."""
    import time

    from rich.table import Table

    console.print(f"machine profile {machine.name} ({machine.path or 'given as data'})"
                  + (f"; communication precision {precision}" if precision != "fp32" else ""), highlight=False)
    start = time.perf_counter()
    frame = exhaustive_search(space, model, args.objective)
    took = time.perf_counter() - start
    console.print(f"method: {plan.describe()}; took {took:.2f} s", highlight=False)
    console.print(f"{name} on {machine.name}, G in {space.gpus[0]}..{space.gpus[-1]} ({len(space.gpus)} GPU counts)",
                  highlight=False)
    best = frame[frame["feasible"]].head(max(1, args.top))
    if best.empty:
        raise UserError("no configuration fits in device memory; allow more GPUs")
    table = Table(title=f"best configurations ({args.objective}, {objective_unit(args.objective)})")
    for col in ("rank", "config", "G", "predicted ms", "memory GiB", args.objective):
        table.add_column(col, justify="left" if col == "config" else "right")
    for _, row in best.iterrows():
        table.add_row(str(int(row["rank"])), str(row["config"]), str(int(row["gpus"])), f"{row['total_ms']:.2f}",
                      f"{row['memory_gib']:.2f}", f"{row['value']:.4g}")
    console.print(table)
    if args.storage or args.study:
        console.print("no study is written by an exact search: --storage and --study apply to TPE (--exact-budget 0)",
                      style="dim")
    return float(best["value"].iloc[0])


def print_best_table(study, objective: str, top: int, console, *, measured: bool) -> None:
    from rich.table import Table

    best = best_configs(study, top)
    if best.empty:
        console.print("no feasible trial finished")
        return
    table = Table(title=f"best configurations ({objective}, {objective_unit(objective)})")
    for col in ("rank", "config", "G", "predicted ms") + (("observed ms",) if measured else ()) + ("memory GiB", objective, "trial"):
        table.add_column(col, justify="left" if col == "config" else "right")
    for i, row in best.iterrows():
        cells = [str(i + 1), str(row["config"]), str(int(row["gpus"])), f"{row['total_ms']:.2f}"]
        if measured:
            obs = row.get("epoch_ms")
            cells.append("-" if obs is None or obs != obs else f"{obs:.2f}")
        cells += [f"{row['memory_gib']:.2f}", f"{row['value']:.4g}", str(int(row["number"]))]
        table.add_row(*cells)
    console.print(table)
