"""``plexus-tune predict``: rank every grid of G GPUs by predicted epoch time."""

from __future__ import annotations

from plexus_tune.cli import minibatch
from plexus_tune.cli.algorithms import add_algorithm_argument, predict_families, print_codec_note, selected_algorithms
from plexus_tune.cli.output import format_ms, make_console

import argparse
import os
import sys


from plexus_tune.model.comm_precision import parse_comm_precision
from plexus_tune.model.precision_choice import accuracy_evidence, parse_allowed, pick_precision
from plexus_tune.errors import UserError
from plexus_tune.numbers import whole_number
from plexus_tune.graph.permute import PERMUTE_MODES
from plexus_tune.measure.graph_input import read_graph_input
from plexus_tune.model.family import DEFAULT_FAMILY, family_of
from plexus_tune.model.planner import joint_ranking, rank_grids
from plexus_tune.model.other import check_optimizer
from plexus_tune.model.grid import check_gpus, enumerate_grids, format_grid
from plexus_tune.model.machine import load_machine
from plexus_tune.model.sparsity import descriptor_sparsity
from plexus_tune.model.spmm import spmm_model_from_dict
from plexus_tune.model.workload import Workload, get_dataset
from plexus_tune.model.breakdown import COMM_AXIS_KEYS, TOTAL_PARTS, labelled

FORMATS = ("table", "json", "csv")
#: Table columns: total, then its parts (which add up to it), then the split of comm by axis.
TABLE_COLUMNS = labelled(("total_ms", *TOTAL_PARTS, *COMM_AXIS_KEYS))
#: Mark after a SpMM time floored at the memory-traffic bound (docs/model.md, SpMM floor).
FLOOR_MARK = "*"
#: Mark after a SpMM time whose shard structure comes from a catalog dataset's structure descriptor.
DESCRIPTOR_MARK = "†"


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """Options that describe a workload (shared with other sub-commands)."""
    group = parser.add_argument_group("workload (a catalog dataset, a graph, or explicit statistics)")
    group.add_argument("--dataset", help="catalog dataset name (see 'plexus-tune datasets'), case-insensitive")
    group.add_argument("--graph", help="a graph file, shard directory or synthetic spec (rmat:nodes=...,edges=...): "
                       "the workload's statistics, each grid's largest shard and its sparsity structure, and the "
                       "partition-dependent figures of the --algorithm families")
    group.add_argument("--nodes", help="explicit workload: number of graph nodes N")
    group.add_argument("--nnz", help="explicit workload: adjacency nonzeros NNZ, self-loops included")
    group.add_argument("--features", help="explicit workload (or override): input feature width D_0")
    group.add_argument("--classes", help="explicit workload (or override): number of classes D_L")
    group.add_argument("--layers", default="3", help="number of GCN layers (default 3)")
    group.add_argument("--hidden", default="128", help="hidden width (default 128)")
    group.add_argument("--bytes-per-element", default="4", help="bytes per matrix element (default 4, fp32)")


def _int_option(value, option: str, *, minimum: int = 1) -> int:
    return whole_number(value, option, minimum=minimum)


def workload_from_args(args):
    """(Workload, GraphInput or None): the workload an argparse namespace describes and, with --graph, the
    graph read for the model (:func:`plexus_tune.measure.graph_input.read_graph_input`); UserError on bad values."""
    layers = _int_option(args.layers, "--layers")
    hidden = _int_option(args.hidden, "--hidden")
    bpe = _int_option(args.bytes_per_element, "--bytes-per-element")
    features = None if args.features is None else _int_option(args.features, "--features")
    classes = None if args.classes is None else _int_option(args.classes, "--classes")
    sizes = dict(layers=layers, hidden=hidden, bytes_per_element=bpe)
    if getattr(args, "graph", None):
        if args.dataset or args.nodes is not None or args.nnz is not None:
            raise UserError("give one of --dataset, --graph or explicit --nodes/--nnz, not several")
        source = read_graph_input(args.graph, features=features, classes=classes,
                                  sample=getattr(args, "graph_sample", None), cache=not getattr(args, "no_cache", False),
                                  **sizes)
        return source.workload, source
    if args.dataset:
        if args.nodes is not None or args.nnz is not None:
            raise UserError("give either --dataset or explicit --nodes/--nnz, not both")
        info = get_dataset(args.dataset)
        return Workload.from_graph_stats(info.name, info.nodes, info.nnz, features or info.features,
                                         classes or info.classes, **sizes), None
    missing = [opt for opt, val in (("--nodes", args.nodes), ("--nnz", args.nnz), ("--features", features),
                                    ("--classes", classes)) if val is None]
    if missing:
        raise UserError(f"give --dataset NAME, --graph FILE|SPEC, or an explicit workload (missing {' '.join(missing)})")
    nodes = _int_option(args.nodes, "--nodes")
    nnz = _int_option(args.nnz, "--nnz")
    return Workload.from_graph_stats(f"custom(N={nodes},NNZ={nnz})", nodes, nnz, features, classes, **sizes), None


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "predict",
        help="rank every Gx x Gy x Gz grid of G GPUs by predicted epoch time",
        description="Predict the per-epoch time (SpMM, GEMM, communication per axis, memory) of every grid "
        "of G GPUs on a machine, rank them and recommend the fastest that fits in memory.",
    )
    add_workload_arguments(parser)
    parser.add_argument("--gpus", "-G", required=True, help="number of GPUs G (any positive integer)")
    parser.add_argument("--machine", "-m", required=True,
                        help="machine profile name (see 'plexus-tune machines') or path of a profile JSON file")
    parser.add_argument("--top", default="10", help="show the best K grids (default 10; 0 = all)")
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    parser.add_argument("--powers-of-two", action="store_true", help="only grids whose sizes are powers of two")
    parser.add_argument("--max-x", help="largest allowed Gx")
    parser.add_argument("--max-y", help="largest allowed Gy")
    parser.add_argument("--max-z", help="largest allowed Gz")
    parser.add_argument("--block-rows", help="blocked aggregation: rows per block of the aggregation all-reduce")
    parser.add_argument("--overlap", action="store_true",
                        help="with --block-rows: each block's all-reduce overlaps the next block's SpMM, as the "
                             "trainer's --overlap (docs/model.md, Overlap)")
    parser.add_argument("--permute", choices=PERMUTE_MODES, default=None,
                        help="with --graph: the trainer's permutation of the graph (default double; a shard "
                        "directory keeps its own): each grid's largest shard and its structure are taken after it")
    parser.add_argument("--graph-sample", default="auto", metavar="FRACTION|auto",
                        help="with --graph: estimate the shard statistics from a sample of rows reading this fraction "
                        "of the entries (e.g. 0.01; 1 reads them all), its error stated under the table; auto "
                        "(default) samples graphs of more than 400M stored nonzeros at 20M entries")
    parser.add_argument("--no-cache", action="store_true",
                        help="with --graph: neither read nor write the structure cache (statistics of the graph's shards "
                        "kept in the data directory; 'plexus-tune graph cache' lists it)")
    parser.add_argument("--optimizer", default=None, help="the optimizer of the trainer being predicted: adamw-fused, adamw-foreach or "
                        "adamw-for-loop (default: the machine's, the trainer's choice)")
    add_precision_arguments(parser)
    add_algorithm_argument(parser)
    minibatch.add_arguments(parser)
    parser.set_defaults(handler=run)


def add_precision_arguments(parser) -> None:
    """``--comm-precision`` (fixed, per class, or auto) and ``--allow-precisions`` (predict, search)."""
    parser.add_argument("--comm-precision", default=None, metavar="P",
                        help="precision of the layer's collectives: fp32 (default; with --algorithm all every "
                             "precision of --allow-precisions), bf16, fp16, int8, int4, int2, "
                             "per class (aggregation=int8,gather=bf16), or auto: the fastest of --allow-precisions "
                             "(docs/comm-precision.md)")
    parser.add_argument("--allow-precisions", default="fp32,bf16,int8", metavar="LIST",
                        help="with --comm-precision auto: the precisions to choose from (default fp32,bf16,int8)")


def precision_choices(args) -> tuple[list[str], bool]:
    """(precisions to evaluate, whether auto picks among them); UserError naming the flag."""
    text = str(args.comm_precision or "fp32").strip().lower()
    try:
        if text == "auto":
            return list(parse_allowed(args.allow_precisions)), True
        return [str(parse_comm_precision(args.comm_precision or "fp32"))], False
    except UserError as exc:
        flag = "--allow-precisions" if text == "auto" else "--comm-precision"
        raise UserError(f"{flag}: {exc}") from None


def _print_table(records, workload, machine, gpus, n_grids, n_feasible, block_rows, described=None) -> None:
    from rich.table import Table

    console = make_console()
    widths = "-".join(str(w) for w in workload.widths)
    summary = (f"{workload.name}: N={workload.nodes:,} NNZ={workload.nnz:,} widths {widths}\n"
               f"{gpus} GPUs on {machine.name}: {n_grids} grids, {n_feasible} fit in memory")
    if block_rows:
        summary += f"; aggregation blocked by {block_rows} rows"
    console.print(summary, highlight=False)
    table = Table()
    table.add_column("rank", justify="right")
    table.add_column("grid GxxGyxGz")
    for _, label in TABLE_COLUMNS:
        table.add_column(label, justify="right")
    table.add_column("mem GiB", justify="right")
    table.add_column("fits")
    for rec in records:
        style = None if rec["feasible"] else "red"
        row = [str(rec["rank"]), rec["grid"]]
        row += [format_ms(rec[key]) + (FLOOR_MARK if key == "spmm_ms" and rec["spmm_floored"] else "")
                + (DESCRIPTOR_MARK if key == "spmm_ms" and described is not None else "")
                + (" (estimated)" if key == "quant_ms" and rec.get("quant_estimated") else "") for key, _ in TABLE_COLUMNS]
        row += [f"{rec['memory_gib']:.2f}", "yes" if rec["feasible"] else "NO (memory)"]
        table.add_row(*row, style=style)
    console.print(table)
    starred = any(rec["spmm_floored"] for rec in records)
    console.print("times are ms per epoch; total = SpMM + GEMM + comm + quant (quantize/dequantize) + other + overhead "
                  "(fixed per epoch); comm X/Y/Z split the communication by grid axis"
                  + (f"; {FLOOR_MARK}: SpMM floored at its memory-traffic bound" if starred else ""), style="dim")
    _print_descriptor(described)


def _print_precision(pred, order, precision, auto, best_of, machine) -> None:
    """The precision's lines under the table: its communication and codec time, and what auto chose."""
    best = int(order[0])
    if precision != "fp32" or auto:
        line = (f"communication at {precision}: {pred['comm_ms'][best]:.2f} ms on the wire + "
                f"{pred['quant_ms'][best]:.2f} ms quantize/dequantize for the first grid")
        print(line)
        if precision != "fp32":
            print_codec_note(make_console(), machine, [precision])
    if auto:
        ranked = ", ".join(f"{p} {t:.1f} ms" for p, t in pick_precision(best_of)[1])
        print(f"Picked precision: {precision} (best feasible epoch per precision: {ranked})")
        print(f"accuracy evidence for {precision}: {accuracy_evidence(precision)}")


def graph_shards(args, source, grids, workload):
    """(GraphSparsity, permutation) of --graph (``source``, a GraphInput) on these grids, (None, None) without one."""
    if source is None:
        if args.permute is not None:
            raise UserError("--permute needs --graph: the permutation changes the shards of a graph the model reads")
        return None, None
    stored = source.stored_permutation
    if stored is not None and args.permute is not None and args.permute != stored:
        raise UserError(f"--permute {args.permute}: {args.graph} was cut after the {stored} permutation, which the "
                        "trainer keeps; leave --permute out or re-shard the graph")
    return source.shards(grids, workload.layers, args.permute)


def sample_line(sample: dict) -> str:
    """The line that says a prediction's shard statistics are estimated, and how well."""
    return (f"shard statistics estimated from a sample of rows reading {100 * sample['fraction']:.3g} % of the entries "
            f"({sample['rows']:,} rows, {sample['entries']:,} entries): largest-shard nonzeros "
            f"+/-{100 * sample['nnz_max_rse']:.2f} % (one standard error, worst split); --graph-sample 1 scans them all")


def _print_permutation(source, machine, pred, order, permute, block_rows, precision, optimizer) -> None:
    """The first grid's SpMM and total under the other permutations the trainer offers."""
    best = int(order[0])
    grid = (int(pred["gx"][best]), int(pred["gy"][best]), int(pred["gz"][best]))
    others = [m for m in ("double", "local") if m != permute]
    gains = source.permutation_gain(machine, grid, others, block_rows=block_rows, comm_precision=precision,
                                    optimizer=optimizer)
    if gains is None:
        print(f"shards as stored ({permute} permutation)")
        return
    text = ", ".join(f"{m} {g['spmm_ms']:.2f} ms (total {g['total_ms']:.2f} ms, "
                     f"{100 * (g['total_ms'] / pred['total_ms'][best] - 1):+.1f} %)" for m, g in gains.items())
    print(f"SpMM of {format_grid(grid)} after the {permute} permutation: {pred['spmm_ms'][best]:.2f} ms; "
          f"with --permute {text}")


def _predict_minibatch(args, mini, gpus, top, precisions, optimizer) -> int:
    """``predict --algorithm scalegnn-4d``: the ranked (Gd, grid, B) (cli/minibatch)."""
    for flag in ("block_rows", "powers_of_two", "max_x", "max_y", "max_z", "permute", "replication", "aggregation"):
        if getattr(args, flag, None):
            raise UserError(f"--{flag.replace('_', '-')} does not apply to --algorithm {minibatch.NAME}; leave it out")
    machine = load_machine(args.machine)
    workload, source = workload_from_args(args)  # last: --graph loads the graph
    if source is not None and source.stored is not None:
        raise UserError(f"--graph: {minibatch.NAME} samples the whole graph; give the graph file, not its shards")
    records = minibatch.ranked(args, mini, workload, machine, gpus, precisions, optimizer,
                               graph=None if source is None else source.graph)
    minibatch.print_ranking(records, workload, machine, gpus, top or None, fmt=args.format)
    return 0


def run(args) -> int:
    gpus = check_gpus(args.gpus)
    top = _int_option(args.top, "--top", minimum=0)
    block_rows = None if args.block_rows is None else _int_option(args.block_rows, "--block-rows")
    precisions, auto = precision_choices(args)
    optimizer = _optimizer(args)
    mini = minibatch.check_flags(args)
    if minibatch.only(args):
        return _predict_minibatch(args, mini, gpus, top, precisions, optimizer)
    algorithms = selected_algorithms(args)
    machine = load_machine(args.machine)
    workload, source = workload_from_args(args)  # last: --graph loads the graph
    if args.overlap and not block_rows:
        raise UserError("--overlap overlaps row blocks: give --block-rows too")
    if algorithms != (DEFAULT_FAMILY,):
        return _predict_families(args, source, mini, workload, machine, gpus, algorithms, top, precisions, optimizer)
    grids = enumerate_grids(gpus, powers_of_two=args.powers_of_two, **_grid_bounds(args))
    if len(grids) == 0:
        raise UserError(f"no grid of {gpus} GPUs passes the filters (--powers-of-two/--max-x/--max-y/--max-z); relax them")
    sparsity, permute = graph_shards(args, source, grids, workload)
    described = _described(args, sparsity, workload, grids, machine)
    shards = sparsity if described is None else described
    ranking = rank_grids(workload, machine, grids, precisions, block_rows=block_rows, overlap=bool(args.overlap),
                         fixed_features=bool(args.fixed_features), optimizer=optimizer,
                         options={"sparsity": shards} if shards is not None else None)
    records = ranking.records(top or None)
    if args.format == "table":
        _print_table(records, workload, machine, gpus, len(grids), ranking.n_feasible, block_rows, described)
        _print_precision(ranking.pred, ranking.order, ranking.precision, auto, ranking.best_of, machine)
        if sparsity is not None:
            _print_permutation(source, machine, ranking.pred, ranking.order, permute, block_rows,
                               ranking.precision, optimizer)
    else:
        _write_records(records, args.format)
    _print_notes(ranking, machine, sparsity, args.format)
    ranking.check_fits(gpus, machine)
    if args.format == "table":
        print(_recommendation(records[0], optimizer or machine.optimizer))
    return 0


def _described(args, sparsity, workload, grids, machine):
    """A catalog dataset's structure descriptor standing for its graph (None with --graph, without one,
    or where the machine's SpMM model reads no structure)."""
    if sparsity is not None or not args.dataset or not spmm_model_from_dict(machine.spmm).uses_structure:
        return None
    return descriptor_sparsity(get_dataset(args.dataset), workload, grids)


def _print_descriptor(described) -> None:
    """The note that names the descriptor whose structure the marked SpMM figures use."""
    if described is not None:
        print(f"{DESCRIPTOR_MARK}: SpMM from the shard structure of {described.name}'s structure descriptor, not "
              f"its graph ({described.descriptor['provenance']}); give --graph for the graph's own shards")


def _print_notes(ranking, machine, sparsity, fmt: str) -> None:
    """Under the ranking: how the shard statistics were estimated, and what the SpMM floor did."""
    if sparsity is not None and sparsity.sample is not None:
        print(sample_line(sparsity.sample), file=sys.stdout if fmt == "table" else sys.stderr)
    note = ranking.spmm_note(machine)
    if note:
        print(note, file=sys.stderr)


def _optimizer(args) -> str | None:
    try:
        return None if args.optimizer is None else check_optimizer(args.optimizer.strip())
    except UserError as exc:
        raise UserError(f"--optimizer: {exc}") from None


def _grid_bounds(args) -> dict:
    return {f"max_{a}": (None if getattr(args, f"max_{a}") is None else _int_option(getattr(args, f"max_{a}"), f"--max-{a}"))
            for a in "xyz"}


def _predict_families(args, source, mini, workload, machine, gpus, algorithms, top, precisions, optimizer) -> int:
    """``--algorithm`` other than plexus-3d alone: the joint ranking (cli/algorithms), and with
    ``--batch-size`` the mini-batch ranking beside it."""
    plexus_options = None
    if DEFAULT_FAMILY in algorithms:
        sparsity, _ = graph_shards(args, source, family_of(DEFAULT_FAMILY).configurations(gpus), workload)
        plexus_options = {"sparsity": sparsity} if sparsity is not None else None
    graph = None if source is None else source.graph
    code = predict_families(args, workload, machine, gpus, algorithms, top=top or None, graph=graph,
                            optimizer=optimizer, plexus_options=plexus_options)
    if minibatch.requested(args) and args.format == "table":
        records = minibatch.ranked(args, mini, workload, machine, gpus, precisions, optimizer, graph=graph)
        print()
        minibatch.print_ranking(records, workload, machine, gpus, top or None)
        full_best = None
        if mini["epochs"] is not None:
            feasible = joint_ranking(workload, machine, gpus, algorithms=algorithms, precisions=precisions,
                                     graph=graph, optimizer=optimizer, plexus_options=plexus_options).feasible
            full_best = feasible[0] if feasible else None
        minibatch.print_comparison(full_best, records, mini["epochs"])
    return code


def _write_records(records, fmt: str) -> None:
    import csv
    import json

    if fmt == "json":
        json.dump(records, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    writer = csv.DictWriter(sys.stdout, fieldnames=list(records[0].keys()), lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)



def _recommendation(best: dict, optimizer: str) -> str:
    return (
        f"Recommended grid: {best['grid']} ({best['total_ms']:.1f} ms/epoch: SpMM {best['spmm_ms']:.1f}, "
        f"comm {best['comm_ms']:.1f}, GEMM {best['gemm_ms']:.1f}, other {best['other_ms']:.1f}"
        + (f" (elementwise {best['other_elementwise_ms']:.1f}, optimizer {best['other_optimizer_ms']:.1f} "
           f"{optimizer}, sync {best['other_sync_ms']:.2f})" if best["other_ms"] else "")
        + (" (SpMM floored)" if best["spmm_floored"] else "")
        + (f", fixed overhead {best['overhead_ms']:.1f}" if best["overhead_ms"] else "")
        + "; "
        f"{best['memory_gib']:.2f} GiB per GPU)"
    )
