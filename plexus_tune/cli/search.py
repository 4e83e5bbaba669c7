"""``plexus-tune search``: Optuna search over grids, GPU counts and blocking."""

from __future__ import annotations

import argparse
import functools

from plexus_tune.cli.predict import add_precision_arguments, precision_choices
from plexus_tune.comm_precision_model import ACCURACY_EVIDENCE
from plexus_tune.errors import UserError
from plexus_tune.model.costs import predict_grids
from plexus_tune.model.machine import load_machine
from plexus_tune.model.workload import workload_from_dataset
from plexus_tune.search import (
    MeasuredEvaluator,
    ModelEvaluator,
    Objective,
    SearchSpace,
    best_configs,
    check_objective,
    default_study_name,
    finished_trials,
    graph_workload,
    objective_unit,
    open_storage,
    open_study,
    parse_gpus,
    run_search,
    spread_starts,
    warm_start,
)

HELP = "search grids (and GPU counts, blocking) with Optuna, model-driven or measured"

EPILOG = """\
objectives: epoch (ms per epoch) or gpu-hours (GPU-hours per 100 epochs = epoch_ms * G * 100 / 3.6e6).
--trials is the total for the study: running the same command again resumes it and runs
only the trials still missing (finished trials are kept). Studies live in
measurements/studies.db unless --storage names another database (any SQLAlchemy URL,
e.g. postgresql://user@host/db for several workers).
"""


def register(subparsers) -> None:
    p = subparsers.add_parser("search", help=HELP, description=HELP, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_argument_group("what to train")
    src.add_argument("--dataset", help="catalog dataset (see plexus-tune datasets)")
    src.add_argument("--graph", help="a graph file or synthetic spec (rmat:nodes=...,edges=...); required with --measured")
    src.add_argument("--layers", type=int, default=3, help="GCN layers (default 3)")
    src.add_argument("--hidden", type=int, default=128, help="hidden width (default 128)")
    p.add_argument("--machine", default="perlmutter", help="machine profile name or JSON path (default perlmutter)")
    p.add_argument("--gpus", required=True, help="G, a range A..B (every count; A..B:pow2 for powers of two) or a list 8,16,64")
    p.add_argument("--objective", default="epoch", help="epoch (default) or gpu-hours")
    p.add_argument("--block-rows", metavar="A..B", help="also search blocked aggregation with block sizes in A..B rows")
    p.add_argument("--trials", type=int, default=60, help="total trials of the study (default 60)")
    p.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    p.add_argument("--storage", help="study database URL (default sqlite:///measurements/studies.db)")
    p.add_argument("--study", help="study name (default derived from the inputs); an existing study is resumed")
    p.add_argument("--snap", type=int, default=128, metavar="K",
                   help="model-driven: each trial is the best predicted of the K allowed grids nearest the sampled point (default 128; 1 = nearest only)")
    p.add_argument("--starts", type=int, default=5, metavar="N",
                   help="model-driven: enqueue the most cubic grid of N GPU counts spread over the range first (default 5)")
    p.add_argument("--top", type=int, default=5, help="rows of the final table (default 5)")
    m = p.add_argument_group("measured search")
    m.add_argument("--measured", action="store_true", help="train every new configuration with the bundled trainer")
    m.add_argument("--warm-start", type=int, default=3, metavar="K", help="enqueue the model's K best configurations first (default 3)")
    m.add_argument("--log", default="measurements/runs.jsonl", help="run log to read known runs from and append to")
    m.add_argument("--epochs", type=int, default=10, help="epochs per measured run (default 10; the first 2 are warm-up)")
    m.add_argument("--warmup", type=int, default=2, help="epochs left out of the timing (default 2)")
    m.add_argument("--backend", default="gloo", help="torch.distributed backend for measured runs (default gloo)")
    m.add_argument("--timeout", type=float, default=600.0, help="seconds per measured run before it counts as failed")
    add_precision_arguments(p)
    p.set_defaults(handler=run)


def parse_block_range(text):
    if text is None:
        return None
    try:
        values = parse_gpus(text)
    except UserError:
        raise UserError(f"cannot read block sizes {text!r}; write a range such as 1024..65536") from None
    return (values[0], values[-1])


def build_inputs(args):
    """Workload, machine, search space and evaluator from the common arguments."""
    check_objective(args.objective)
    gpus = parse_gpus(args.gpus)
    if args.trials < 1:
        raise UserError(f"--trials must be at least 1, got {args.trials}")
    if (args.dataset is None) == (args.graph is None):
        raise UserError("give exactly one of --dataset NAME or --graph FILE|SPEC")
    machine = load_machine(args.machine)
    graph = None
    if args.dataset is not None:
        workload = workload_from_dataset(args.dataset, layers=args.layers, hidden=args.hidden)
        name = workload.name
    else:
        graph = args.graph
        stats, workload = graph_workload(graph, layers=args.layers, hidden=args.hidden)
        name = stats.name
        args._graph_stats = stats
    space = SearchSpace(gpus, parse_block_range(args.block_rows))
    return name, workload, machine, graph, space


def run(args) -> int:
    import optuna
    from rich.console import Console

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the command's process: no log line per trial
    precisions, auto = precision_choices(args)
    name, workload, machine, graph, space = build_inputs(args)
    if args.measured and graph is None:
        raise UserError("--measured trains real runs: give --graph FILE|SPEC (catalog datasets have statistics only)")
    if args.measured and precisions != ["fp32"]:
        raise UserError("--comm-precision: measured searches train at fp32; search the model with a precision, "
                        "or measure one with 'plexus-tune measure --comm-precision'")
    storage = open_storage(args.storage)
    console = Console()
    results = {}
    for precision in precisions:
        results[precision] = _search_one(args, name, workload, machine, graph, space, storage, console, precision,
                                         functools.partial(predict_grids, comm_precision=precision))
    if auto or precisions != ["fp32"]:
        found = {p: v for p, v in results.items() if v is not None}
        if not found:
            console.print("no feasible configuration at any allowed precision")
            return 0
        pick = min(found, key=lambda p: found[p])
        if auto:
            ranked = ", ".join(f"{p} {v:.4g}" for p, v in sorted(found.items(), key=lambda kv: kv[1]))
            console.print(f"Picked precision: {pick} (best {args.objective} per precision: {ranked})", highlight=False)
        console.print(f"accuracy evidence for {pick}: {ACCURACY_EVIDENCE.get(pick, 'none recorded')}", highlight=False)
    return 0


def _search_one(args, name, workload, machine, graph, space, storage, console, precision, predict):
    """One study at one communication precision; returns its best objective value (None if none)."""
    study_name = args.study or default_study_name(name, machine.name, space.gpus, args.objective, args.measured, space.block_rows_range)
    if precision != "fp32":
        study_name += f"-comm-{precision}"
    attrs = {"dataset": name, "machine": machine.name, "gpus": list(space.gpus), "measured": bool(args.measured),
             "comm_precision": precision}
    study = open_study(study_name, storage, objective=args.objective, seed=args.seed, attrs=attrs)
    model = ModelEvaluator(workload, machine, predict=predict)
    if args.measured:
        evaluator = MeasuredEvaluator(model, graph, stats=args._graph_stats, layers=args.layers, hidden=args.hidden,
                                      epochs=args.epochs, warmup=args.warmup, backend=args.backend,
                                      timeout_s=args.timeout, log_path=args.log)
        known = evaluator.known_runs()
        objective = Objective(space, evaluator, args.objective, study=study, known=known)
        if args.warm_start > 0:
            warm_start(study, space, model.top_k(space, args.warm_start, args.objective))
    else:
        objective = Objective(space, model, args.objective, study=study, snap_neighbours=args.snap)
        warm_start(study, space, spread_starts(space, args.starts))

    before = len(finished_trials(study))
    ran = run_search(study, objective, args.trials, show_progress=args.measured and console.is_terminal)
    console.print(
        f"study [bold]{study_name}[/bold]: {len(finished_trials(study))} trials ({ran} run now, {before} before), "
        + (f"{objective.evaluations} new measurements" if args.measured else f"{objective.evaluations + objective.model_evaluations} model evaluations")
    )
    print_best_table(study, args.objective, args.top, console, measured=args.measured)
    best = best_configs(study, 1)
    return None if best.empty else float(best["value"].iloc[0])


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
        cells = [str(i + 1), str(row["config"]), str(int(row["gpus"])), f"{row['predicted_ms']:.2f}"]
        if measured:
            obs = row.get("observed_ms")
            cells.append("-" if obs is None or obs != obs else f"{obs:.2f}")
        cells += [f"{row['memory_gib']:.2f}", f"{row['value']:.4g}", str(int(row["number"]))]
        table.add_row(*cells)
    console.print(table)
