"""``predict --algorithm scalegnn-4d`` (and its section under ``--algorithm all``): the ranked
(Gd, grid, B) of ScaleGNN's 4D mini-batch training (docs/model.md, "ScaleGNN")."""

from __future__ import annotations

import json
import sys

from plexus_tune.cli.output import format_ms, make_console
from plexus_tune.errors import UserError
from plexus_tune.numbers import whole_number
from plexus_tune.model.family import ALL, FAMILIES
from plexus_tune.model.machine import GIB
from plexus_tune.model.scalegnn import NAME, parse_epochs_to_accuracy, rank_minibatch, time_to_accuracy
from plexus_tune.model.breakdown import TOTAL_PARTS, labelled

#: Columns of the table: total, its parts, the data-parallel share of comm, sampling.
COLUMNS = labelled(("total_ms", *TOTAL_PARTS, "comm_dp_ms", "sampling_ms", "sampling_hidden_ms"))
NOT_COMPARABLE = ("a mini-batch epoch (N / (B Gd) steps on sampled subgraphs) is not a full-graph epoch: their "
                  "times compare only with the epochs each needs to reach the same accuracy "
                  "(--epochs-to-accuracy full=E1,minibatch=E2)")


def add_arguments(parser) -> None:
    """``--batch-size``, ``--dp``, ``--no-prefetch`` and ``--epochs-to-accuracy`` of predict."""
    parser.add_argument("--batch-size", metavar="B[,B...]",
                        help=f"{NAME}: vertices sampled per step and data-parallel group, one or a list "
                             "(default: powers of 4 from 1024 to 1048576, at most N)")
    parser.add_argument("--dp", metavar="GD", help=f"{NAME}: only this data-parallel degree (it divides G)")
    parser.add_argument("--no-prefetch", action="store_true",
                        help=f"{NAME}: sampling not overlapped with the previous step")
    parser.add_argument("--epochs-to-accuracy", metavar="full=E1,minibatch=E2",
                        help="with --algorithm all: the epochs full-graph and mini-batch training each need to reach "
                             "the target accuracy; compares their training times")


def only(args) -> bool:
    """Whether ``--algorithm`` names a family whose epoch is a mini-batch epoch (model/family)."""
    family = FAMILIES.get(str(getattr(args, "algorithm", "") or "").strip().lower())
    return family is not None and family.epoch == "mini-batch"


def requested(args) -> bool:
    """Whether ``--algorithm`` names the mini-batch family or all."""
    return only(args) or str(getattr(args, "algorithm", "") or "").strip().lower() == ALL


def check_flags(args) -> dict:
    """The family's settings from the flags (UserError naming the flag), checked before any work."""
    out = {"batch_sizes": None, "dp": None, "epochs": None}
    if not requested(args):
        for flag, value in (("--batch-size", args.batch_size), ("--dp", args.dp), ("--epochs-to-accuracy",
                                                                                     args.epochs_to_accuracy)):
            if value is not None:
                raise UserError(f"{flag} applies to --algorithm {NAME} (or all)")
        if args.no_prefetch:
            raise UserError(f"--no-prefetch applies to --algorithm {NAME} (or all)")
        return out
    if args.batch_size is not None:
        out["batch_sizes"] = [whole_number(part.strip(), "--batch-size", minimum=2)
                              for part in str(args.batch_size).split(",")]
    if args.dp is not None:
        out["dp"] = whole_number(args.dp, "--dp", minimum=1)
    if args.epochs_to_accuracy is not None:
        if only(args):
            raise UserError("--epochs-to-accuracy compares with the full-graph families: use --algorithm all")
        try:
            out["epochs"] = parse_epochs_to_accuracy(args.epochs_to_accuracy)
        except UserError as exc:
            raise UserError(f"--epochs-to-accuracy: {exc}") from None
    return out


def rank(args, settings, workload, machine, gpus, precision, optimizer, graph=None) -> list[dict]:
    """The library's ranking for these flags and the --graph read (UserError naming the flag)."""
    try:
        return rank_minibatch(workload, machine, gpus, batch_sizes=settings["batch_sizes"], dp=settings["dp"],
                              comm_precision=precision, optimizer=optimizer,
                              options={"prefetch": not args.no_prefetch,
                                       "fixed_features": bool(getattr(args, "fixed_features", False))},
                              graph=graph)
    except UserError as exc:
        flag = {"batch_size": "--batch-size", "dp": "--dp"}.get(getattr(exc, "parameter", None) or "", None)
        raise UserError(f"{flag}: {exc}" if flag else str(exc)) from None


def ranked(args, settings, workload, machine, gpus, precisions, optimizer, graph=None) -> list[dict]:
    """The rankings of every precision merged: feasible first, fastest first, numbered from 1."""
    records = [r for p in precisions for r in rank(args, settings, workload, machine, gpus, p, optimizer, graph)]
    records.sort(key=lambda r: (not r["feasible"], r["total_ms"]))
    for k, rec in enumerate(records, start=1):
        rec["rank"] = k
    return records


def print_ranking(records, workload, machine, gpus, top, fmt="table") -> None:
    shown = records[:top] if top else records
    if fmt == "json":
        json.dump(shown, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    if fmt == "csv":
        import csv

        writer = csv.DictWriter(sys.stdout, fieldnames=list(shown[0].keys()), lineterminator="\n")
        writer.writeheader()
        writer.writerows(shown)
        return
    _print_table(records, shown, workload, machine, gpus)
    best = next((r for r in records if r["feasible"]), None)
    if best is None:
        smallest = min(records, key=lambda r: r["memory_bytes"])
        raise UserError(f"no {NAME} configuration of {gpus} GPUs fits: the smallest estimate is "
                        f"{smallest['memory_gib']:.1f} GiB per GPU ({smallest['config']}, B {smallest['batch_size']:,}) "
                        f"but {machine.name} offers {machine.usable_memory_bytes / GIB:.1f} GiB; use more GPUs or a "
                        "smaller --batch-size")
    print(f"Recommended: Gd {best['gd']} x grid {best['grid']}, B {best['batch_size']:,} "
          f"({best['total_ms']:.1f} ms per mini-batch epoch of {int(best['steps']):,} steps, "
          f"{best['step_ms']:.2f} ms per step; {best['memory_gib']:.2f} GiB per GPU)")
    if len({r["batch_size"] for r in records}) > 1:
        print("note: a larger B means fewer steps per epoch, so epoch time favours it; fix --batch-size to "
              "what your accuracy needs")


def _print_table(records, shown, workload, machine, gpus) -> None:
    from rich.table import Table

    console = make_console()
    feasible = sum(r["feasible"] for r in records)
    batches = sorted({r["batch_size"] for r in records})
    console.print(f"{NAME} (mini-batch, ScaleGNN): {workload.name} N={workload.nodes:,} NNZ={workload.nnz:,}, "
                  f"{gpus} GPUs on {machine.name}: {len(records)} configurations (Gd x grid x B, B in "
                  f"{', '.join(f'{b:,}' for b in batches)}), {feasible} fit in memory", highlight=False)
    table = Table()
    for label in ("rank", "Gd x (GxxGyxGz)", "B", "steps"):
        table.add_column(label, justify="right")
    for _, label in COLUMNS:
        table.add_column(label, justify="right")
    table.add_column("mem GiB", justify="right")
    table.add_column("fits")
    for rec in shown:
        row = [str(rec["rank"]), rec["config"], f"{rec['batch_size']:,}", f"{int(rec['steps']):,}"]
        row += [format_ms(rec[key]) for key, _ in COLUMNS]
        row += [f"{rec['memory_gib']:.2f}", "yes" if rec["feasible"] else "NO (memory)"]
        table.add_row(*row, style=None if rec["feasible"] else "red")
    console.print(table)
    console.print("times are ms per mini-batch epoch (steps x step time); total = SpMM + GEMM + comm + quant + other "
                  "+ overhead; comm DP: the gradient all-reduce (and, with trained input features, the all-gather of their sampled rows' gradients) over the Gd groups (inside comm); sampling: the "
                  "sampling work, of which 'hidden' runs under the previous step (prefetch), the rest in other",
                  style="dim")


def print_comparison(full_best: dict | None, records, epochs) -> None:
    """The section's closing lines under --algorithm all: not comparable, or the times to accuracy."""
    print(NOT_COMPARABLE)
    best = next((r for r in records if r["feasible"]), None)
    if epochs is None or full_best is None or best is None:
        return
    times = time_to_accuracy(full_best["total_ms"], best["total_ms"], epochs)
    faster = "mini-batch" if times["minibatch_s"] < times["full_s"] else "full-graph"
    print(f"time to accuracy: full-graph {full_best['algorithm']} {full_best['config']} "
          f"{epochs['full']:g} epochs x {full_best['total_ms']:.1f} ms = {times['full_s']:.2f} s; "
          f"mini-batch {best['config']} B {best['batch_size']:,} {epochs['minibatch']:g} epochs x "
          f"{best['total_ms']:.1f} ms = {times['minibatch_s']:.2f} s: {faster} is faster")
