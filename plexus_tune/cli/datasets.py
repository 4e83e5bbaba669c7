"""``plexus-tune datasets``: list the built-in dataset catalog."""

from __future__ import annotations

from plexus_tune.cli.output import make_console
from plexus_tune.model.workload import list_datasets

FORMATS = ("table", "json", "csv")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "datasets",
        help="list the built-in dataset catalog",
        description="List the datasets whose statistics are built in (usable as --dataset NAME).",
    )
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    parser.set_defaults(handler=run)


def run(args) -> int:
    import dataclasses
    import json
    import sys

    infos = list_datasets()
    rows = [dataclasses.asdict(info) for info in infos]
    if args.format == "json":
        json.dump(rows, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    if args.format == "csv":
        import csv

        writer = csv.DictWriter(sys.stdout, fieldnames=list(rows[0].keys()), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return 0
    from rich.table import Table

    table = Table(title="Built-in datasets (nonzeros include self-loops)", title_justify="left")
    for name, justify in (("name", "left"), ("nodes", "right"), ("edges", "right"), ("nonzeros", "right"),
                          ("features", "right"), ("classes", "right"), ("source", "left")):
        table.add_column(name, justify=justify, overflow="fold")
    for info in infos:
        table.add_row(info.name, f"{info.nodes:,}", f"{info.edges:,}", f"{info.nnz:,}", str(info.features),
                      str(info.classes), info.source)
    make_console().print(table)
    return 0
