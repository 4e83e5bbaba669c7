"""``--algorithm`` of predict and search: parse, call the planner, print its ranking."""

from __future__ import annotations

import json
import sys

from plexus_tune.cli.output import check_log, format_ms, make_console
from plexus_tune.model.comm_precision import parse_comm_precision
from plexus_tune.model.precision_choice import accuracy_evidence, parse_allowed
from plexus_tune.errors import UserError
from plexus_tune.numbers import whole_number
from plexus_tune.measure.campaign import load_graph_source
from plexus_tune.model.machine import GIB
from plexus_tune.model.family import ALL, DEFAULT_FAMILY, families_choosing, families_with, family_names, parse_families
from plexus_tune.model.planner import check_choices, joint_ranking
from plexus_tune.cli.launching import launcher_from_args
from plexus_tune.measure.store import RUN_LOG
from plexus_tune.model.comm_precision import check_backend
from plexus_tune.paths import default_run_log
from plexus_tune.search.joint import measured_joint_search, search_ranking
from plexus_tune.search.space import objective_unit
from plexus_tune.model.breakdown import TOTAL_PARTS, labelled

ALGORITHM_HELP = (f"algorithm family: {', '.join(family_names(None))}, or {ALL} (one ranking over every family, "
                  f"configuration and communication precision; default {DEFAULT_FAMILY}; docs/model.md, Planner)")
#: The planner's family choices and their flags.
CHOICE_FLAGS = {"replication": "--replication", "aggregation": "--aggregation", "schedule": "--schedule"}
#: Mark after a family whose partition-dependent figures are estimated (no graph given).
ESTIMATE_MARK = "~"
#: Columns of the ranking: total, then its parts.
COLUMNS = labelled(("total_ms", *TOTAL_PARTS))


def add_algorithm_argument(parser) -> None:
    """``--algorithm`` and the families' own filters ``--replication``, ``--aggregation``."""
    parser.add_argument("--algorithm", default=DEFAULT_FAMILY, metavar="NAME", help=ALGORITHM_HELP)
    parser.add_argument("--replication", metavar="C",
                        help=f"{', '.join(families_choosing('replication'))}: only the replication factor C "
                             "(C divides G, C*C <= G; 1 is cagnet-1d)")
    parser.add_argument("--fixed-features", action="store_true",
                        help="the input features are not trained: no layer-0 feature gradient, backward SpMM "
                             "and collectives, nor the features' optimizer state (default: trained, as the "
                             "Plexus paper trains; docs/model.md, Fixed features)")
    parser.add_argument("--schedule", metavar="NAME",
                        help=f"{', '.join(families_choosing('schedule'))}: the communication schedule priced, "
                             "bundled (the bundled trainers', default) or paper (CAGNET's own: log_softmax "
                             "all-gathers, dense SUMMA for the weight gradient; docs/model.md, CAGNET schedules)")
    parser.add_argument("--aggregation", metavar="MODE",
                        help=f"{', '.join(families_choosing('aggregation'))}: only the aggregation mode pre, post "
                             "or hybrid (default: all three)")


def family_filters(args, algorithms) -> dict:
    """The planner's ``replication`` and ``aggregation`` from the flags (UserError naming the flag)."""
    out = {}
    for option, flag in CHOICE_FLAGS.items():
        value = getattr(args, option, None)
        if value is None:
            continue
        takers = families_choosing(option)
        if not set(takers) & set(algorithms):
            raise UserError(f"{flag} applies to --algorithm {' or '.join(takers)} (or all)")
        out[option] = whole_number(value, flag, minimum=1) if option == "replication" else str(value)
    return out


def selected_algorithms(args) -> tuple[str, ...]:
    """The families ``--algorithm`` names (UserError naming the flag; also when a family's
    own flag is given for a family that does not take it)."""
    try:
        algorithms = parse_families(getattr(args, "algorithm", None))
    except UserError as exc:
        raise UserError(f"--algorithm: {exc}") from None
    family_filters(args, algorithms)
    return algorithms


def family_precisions(args, algorithms) -> list[str]:
    """Precisions the planner ranks: --comm-precision, or with ``auto`` (and for ``all`` when
    --comm-precision is not given) every precision of --allow-precisions."""
    text = getattr(args, "comm_precision", None)
    try:
        if text is None or str(text).strip().lower() == "auto":
            if text is None and len(algorithms) == 1:
                return ["fp32"]
            return list(parse_allowed(args.allow_precisions))
        return [str(parse_comm_precision(text))]
    except UserError as exc:
        flag = "--comm-precision" if text is not None and str(text).strip().lower() != "auto" else "--allow-precisions"
        raise UserError(f"{flag}: {exc}") from None


def print_codec_note(console, machine, precisions) -> None:
    """One line on the codec time of reduced precisions the profile has no measured rates for."""
    used = {p for text in precisions for p in parse_comm_precision(text).as_dict().values() if p != "fp32"}
    estimated = sorted(used & set(machine.quant_estimated))
    if estimated:
        bandwidth = machine.codec_estimate_gbps
        console.print(f"quant (estimated): {machine.name} has no measured codec rates for {', '.join(estimated)}; "
                      f"their codec time is estimated as passes over the bytes at {bandwidth:g} GB/s "
                      "(docs/comm-precision.md, Estimated codec)", highlight=False)
    missing = sorted(p for p in used if p not in machine.quant)
    if missing:
        console.print(f"{machine.name} has no quant rates and no memory bandwidth: the codec time of "
                      f"{', '.join(missing)} is not counted (quant 0); give the profile memory_bandwidth_gbps",
                      highlight=False)


def _label(rec) -> str:
    return rec["algorithm"] + (ESTIMATE_MARK if rec["estimated"] else "")


def print_ranking(ranking, workload, machine, *, top: int | None, fmt: str = "table", graph_name: str | None = None,
                  objective: str = "epoch") -> int:
    """Print the planner's ranking (table, json or csv); UserError when nothing fits."""
    records = ranking.records
    shown = records[:top] if top else records
    if fmt == "json":
        json.dump({"ranking": shown, "best_per_family": ranking.best_per_family(), "configurations": len(records),
                   "feasible": len(ranking.feasible), "seconds": ranking.seconds,
                   "precisions": list(ranking.precisions), "estimated": list(ranking.estimated_families)},
                  sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif fmt == "csv":
        import csv

        writer = csv.DictWriter(sys.stdout, fieldnames=list(shown[0].keys()), lineterminator="\n")
        writer.writeheader()
        writer.writerows(shown)
    else:
        _print_joint_tables(ranking, workload, machine, shown, graph_name, objective)
    if not ranking.feasible:
        smallest = min(records, key=lambda r: r["memory_bytes"])
        raise UserError(f"no configuration of {_gpu_counts(ranking)} GPUs fits: the smallest estimate is "
                        f"{smallest['memory_gib']:.1f} GiB per GPU ({smallest['algorithm']} {smallest['config']}) but "
                        f"{machine.name} offers {machine.usable_memory_bytes / GIB:.1f} GiB; use more GPUs or a machine "
                        "with more device memory")
    if fmt == "table":
        _print_recommendation(ranking.feasible[0], several=isinstance(ranking.gpus, tuple))
    return 0


def _gpu_counts(ranking) -> str:
    return ",".join(str(g) for g in ranking.gpus) if isinstance(ranking.gpus, tuple) else str(ranking.gpus)


def _print_joint_tables(ranking, workload, machine, shown, graph_name, objective) -> None:
    console = make_console()
    widths = "-".join(str(w) for w in workload.widths)
    console.print(f"{workload.name}: N={workload.nodes:,} NNZ={workload.nnz:,} widths {widths}\n"
                  f"{_gpu_counts(ranking)} GPUs on {machine.name}: {len(ranking.records)} configurations "
                  f"({', '.join(ranking.algorithms)} x precision {', '.join(ranking.precisions)}), "
                  f"{len(ranking.feasible)} fit in memory; evaluated exactly in {ranking.seconds:.2f} s", highlight=False)
    console.print(_ranking_table(shown, isinstance(ranking.gpus, tuple), objective))
    console.print(_family_table(ranking))
    console.print("times are ms per epoch; total = SpMM + GEMM + comm + quant + other + overhead; mem GiB per GPU",
                  style="dim")
    print_codec_note(console, machine, ranking.precisions)
    if ranking.estimated_families:
        console.print(f"{ESTIMATE_MARK} estimated: {', '.join(ranking.estimated_families)} "
                      "figures use the documented estimates (SuperGCN boundary rows of a random assignment, "
                      "SUMMA pieces of evenly spread nonzeros; docs/model.md, Planner); give --graph for the "
                      "figures of the graph's own partition and pieces", highlight=False)
    elif graph_name:
        console.print(f"partition-dependent figures from graph {graph_name}", highlight=False)


def _ranking_table(shown, several: bool, objective: str):
    from rich.table import Table

    table = Table(title="joint ranking")
    lead = ("rank",) + (("GPUs",) if several else ()) + ("algorithm", "configuration", "precision")
    for name in lead:
        table.add_column(name, justify="right" if name in ("rank", "GPUs") else "left")
    if objective != "epoch":
        table.add_column(objective_unit(objective), justify="right")
    for _, label in COLUMNS:
        table.add_column(label, justify="right")
    table.add_column("mem GiB", justify="right")
    table.add_column("fits")
    for rec in shown:
        cells = [str(rec["rank"])] + ([str(rec["gpus"])] if several else [])
        cells += [_label(rec), rec["config"], rec["comm_precision"]]
        if objective != "epoch":
            cells.append(f"{rec['objective_value']:.4g}")
        table.add_row(*cells, *(format_ms(rec[key]) + (" (estimated)" if key == "quant_ms" and rec.get("quant_estimated")
                                                        else "") for key, _ in COLUMNS), f"{rec['memory_gib']:.2f}",
                      "yes" if rec["feasible"] else "NO (memory)", style=None if rec["feasible"] else "red")
    return table


def _family_table(ranking):
    from rich.table import Table

    several, best = isinstance(ranking.gpus, tuple), ranking.best_per_family()
    fam = Table(title="best of each family")
    for name in ("algorithm",) + (("GPUs",) if several else ()) + ("configuration", "precision", "total ms",
                                                                    "mem GiB", "joint rank"):
        fam.add_column(name, justify="right" if name in ("GPUs", "total ms", "mem GiB", "joint rank") else "left")
    for family in ranking.algorithms:
        rec = best[family]
        if rec is None:
            smallest = min((r for r in ranking.records if r["algorithm"] == family), key=lambda r: r["memory_bytes"],
                           default=None)
            need = f"{smallest['memory_gib']:.2f}" if smallest else "-"
            fam.add_row(family, *(["-"] if several else []), "none fits", "-", "-", need, "-", style="red")
        else:
            fam.add_row(_label(rec), *([str(rec["gpus"])] if several else []), rec["config"], rec["comm_precision"],
                        format_ms(rec["total_ms"]), f"{rec['memory_gib']:.2f}", str(rec["rank"]))
    return fam


def _print_recommendation(first, *, several: bool) -> None:
    print(f"Recommended: {first['algorithm']} {first['config']}" + (f" on {first['gpus']} GPUs" if several else "")
          + f" at {first['comm_precision']} "
          f"({first['total_ms']:.1f} ms/epoch: SpMM {first['spmm_ms']:.1f}, comm {first['comm_ms']:.1f}, "
          f"GEMM {first['gemm_ms']:.1f}; {first['memory_gib']:.2f} GiB per GPU)")
    if first["comm_precision"] != "fp32":
        print(f"accuracy evidence for {first['comm_precision']}: "
              f"{accuracy_evidence(first['comm_precision'])}")


def load_graph_argument(text):
    """The Graph of a --graph file or synthetic spec (None without one)."""
    if not text:
        return None
    return load_graph_source(str(text))


def predict_families(args, workload, machine, gpus: int, algorithms, *, top: int | None, graph=None,
                     optimizer: str | None = None, plexus_options=None) -> int:
    """``predict --algorithm NAME|all``: the planner's ranking of the families on G GPUs."""
    if getattr(args, "block_rows", None):
        raise UserError(f"--block-rows applies to {' and '.join(families_with('takes_block_rows'))} only; "
                        "leave it out with --algorithm " + getattr(args, "algorithm", ALL))
    for flag in ("powers_of_two", "max_x", "max_y", "max_z"):
        if getattr(args, flag, None):
            raise UserError(f"--{flag.replace('_', '-')} filters {DEFAULT_FAMILY} grids only; leave it out with "
                            "--algorithm " + getattr(args, "algorithm", ALL))
    precisions = family_precisions(args, algorithms)
    filters = family_filters(args, algorithms)
    for key, value in filters.items():
        try:
            check_choices(gpus, algorithms, {key: value})
        except UserError as exc:
            raise UserError(f"{CHOICE_FLAGS[key]}: {exc}") from None
    ranking = joint_ranking(workload, machine, gpus, algorithms=algorithms, precisions=precisions, graph=graph,
                            optimizer=optimizer, plexus_options=plexus_options,
                            fixed_features=bool(getattr(args, "fixed_features", False)), **filters)
    return print_ranking(ranking, workload, machine, top=top, fmt=getattr(args, "format", "table"),
                         graph_name=getattr(graph, "name", None))


def search_families(args, workload, machine, gpus_counts, algorithms, *, graph=None) -> int:
    """``search --algorithm NAME|all`` (model-driven): the exact joint ranking over the GPU counts."""
    if getattr(args, "block_rows", None):
        raise UserError(f"--block-rows applies to {' and '.join(families_with('takes_block_rows'))} only; "
                        "leave it out with --algorithm " + args.algorithm)
    precisions = family_precisions(args, algorithms)
    filters = family_filters(args, algorithms)
    measured = getattr(args, "measured", False)
    if measured:
        if args.graph is None:
            raise UserError("--measured trains real runs: give --graph FILE|SPEC (catalog datasets have statistics only)")
        if not 0 <= args.warmup < args.epochs:
            raise UserError(f"need 0 <= --warmup < --epochs, got warmup {args.warmup}, epochs {args.epochs}")
        for precision in precisions:  # the trainer must be able to send each one on this backend
            try:
                check_backend(args.backend, precision)
            except UserError as exc:
                raise UserError(f"--comm-precision/--backend: {exc}") from None
        args.log = str(check_log("--log", args.log or default_run_log(), kinds=RUN_LOG, inputs=[args.graph]))
    elif args.launcher or args.cluster or args.hosts:
        raise UserError("--launcher/--cluster/--hosts say where measured runs start: add --measured")
    launcher = launcher_from_args(args, gpus_counts) if measured else None
    ranking = search_ranking(workload, machine, gpus_counts, objective=args.objective, algorithms=algorithms,
                             precisions=precisions, graph=graph, seed=getattr(args, "seed", 0),
                             fixed_features=bool(getattr(args, "fixed_features", False)), **filters)
    if not measured:
        return print_ranking(ranking, workload, machine, top=args.top, graph_name=getattr(graph, "name", None),
                             objective=args.objective)
    return print_measured(ranking, args, launcher)


def print_measured(ranking, args, launcher) -> int:
    """``search --measured --algorithm NAME|all``: train the model's best configurations and print
    them with their observed epoch time (:func:`plexus_tune.search.joint.measured_joint_search`)."""
    from rich.table import Table

    console = make_console()
    count = args.trials or 10
    console.print(f"measuring the model's {count} best configurations of {', '.join(ranking.algorithms)} "
                  f"({launcher.name if launcher is not None else 'local'}); runs logged to {args.log}", highlight=False)
    with launcher:
        rows = measured_joint_search(ranking, args.graph, log=args.log, count=count, epochs=args.epochs,
                                     warmup=args.warmup, layers=args.layers, hidden=args.hidden, launcher=launcher,
                                     timeout_s=args.timeout)
    table = Table(title="measured configurations (model order; epoch ms)")
    for col in ("model rank", "algorithm", "configuration", "precision", "GPUs", "predicted ms", "observed ms"):
        table.add_column(col, justify="left" if col in ("algorithm", "configuration", "precision") else "right")
    for r in rows:
        table.add_row(str(r["rank"]), r["algorithm"], r["config"], r["comm_precision"], str(r["gpus"]),
                      format_ms(r["total_ms"]),
                      "failed" if r["trials_ok"] == 0 else format_ms(r["epoch_ms"]))
    console.print(table)
    ok = [r for r in rows if r["trials_ok"]]
    if not ok:
        raise UserError("no measured configuration ran successfully; see the run log for the failures")
    best = min(ok, key=lambda r: r["epoch_ms"])
    console.print(f"measured best: {best['algorithm']} {best['config']} {best['comm_precision']} on {best['gpus']} GPUs, "
                  f"{format_ms(best['epoch_ms'])} ms per epoch (model rank {best['rank']})", highlight=False)
    return 0
