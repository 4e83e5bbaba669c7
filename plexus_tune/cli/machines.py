"""``plexus-tune machines``: list machine profiles, or show one with its provenance."""

from __future__ import annotations

from plexus_tune.cli.output import make_console
from plexus_tune.model.machine import FIELDS, list_machines, load_machine
from plexus_tune.model.spmm import describe_spmm_model

FORMATS = ("table", "json")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "machines",
        help="list machine profiles, or show one",
        description="List the machine profiles found by name (PLEXUS_TUNE_MODELS, then the shipped models/ "
        "directory), or show one profile (name or path) with the provenance of its numbers.",
    )
    parser.add_argument("machine", nargs="?", help="profile name or path to show in full")
    parser.add_argument("--fields", action="store_true", help="describe every field of a profile and exit")
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default table)")
    parser.set_defaults(handler=run)


def _summary(machine) -> dict:
    coll = machine.collectives
    return {
        "name": machine.name,
        "gpus_per_node": machine.gpus_per_node,
        "host_cores": machine.host_cores,
        "threads_per_rank": machine.threads_per_rank,
        "device_memory_gib": machine.device_memory_bytes / 2**30,
        "gemm_tflops": machine.gemm_tflops,
        "spmm_kind": machine.spmm.get("kind"),
        "beta_intra_gbps": coll["beta_intra_gbps"],
        "beta_inter_gbps": coll["beta_inter_gbps"],
        "bandwidth_table": bool(coll.get("bandwidth_table")),
        "description": machine.description,
    }


def _digits(value) -> str:
    """A number to 4 significant digits, without an exponent below a million."""
    value = float(value)
    return f"{value:.0f}" if 1e4 <= abs(value) < 1e6 else f"{value:.4g}"


def _node_text(s: dict) -> tuple[str, str]:
    """(per node, memory) cells: GPUs and GiB per GPU, or for a CPU host (host_cores set)
    the ranks sharing its cores and GiB per rank."""
    memory = _digits(s["device_memory_gib"])
    if s["host_cores"] is None:
        return f"{s['gpus_per_node']} GPUs", f"{memory} per GPU"
    threads = f" x {s['threads_per_rank']} threads" if s["threads_per_rank"] > 1 else ""
    return f"{s['gpus_per_node']} ranks{threads}, {s['host_cores']} cores", f"{memory} per rank"


def run(args) -> int:
    if args.fields:
        return _print_fields(args.format)
    if args.machine:
        return _print_machine(load_machine(args.machine), args.format)
    return _print_list(list_machines(), args.format)


def _dump(data) -> int:
    import json
    import sys

    json.dump(data, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


def _print_fields(fmt: str) -> int:
    from rich.table import Table

    if fmt == "json":
        return _dump(FIELDS)
    table = Table(title="Machine profile fields (GB = 1e9 bytes, GiB = 2**30 bytes)", title_justify="left")
    table.add_column("field")
    table.add_column("meaning", overflow="fold")
    for key, text in FIELDS.items():
        table.add_row(key, text)
    make_console().print(table)
    return 0


def _machine_rows(machine) -> list[tuple[str, object]]:
    """(field, value) of the profile as shown, collectives spelled out."""
    rows = [
        ("gpus_per_node", machine.gpus_per_node),
        *([("host_cores", machine.host_cores), ("threads_per_rank", machine.threads_per_rank)]
          if machine.host_cores is not None else []),
        ("device_memory_gib", machine.raw.get("device_memory_gib")),
        ("memory_reserved_gib", machine.raw.get("memory_reserved_gib", 0)),
        ("gemm_tflops", machine.gemm_tflops),
        ("elementwise_gbps", machine.elementwise_gbps),
        ("optimizer", machine.optimizer),
        ("optimizer_gbps", machine.optimizer_gbps if machine.optimizer_gbps else "elementwise_gbps"),
        ("sync_us", machine.sync_us),
        ("epoch_overhead_ms", machine.epoch_overhead_ms),
        ("memory_bandwidth_gbps", machine.memory_bandwidth_gbps),
        ("spmm", _spmm_text(machine.spmm)),
    ]
    coll = machine.collectives
    rows.append(("collectives.form", f"{coll['form']}, {'NIC shared by min(n, stride) groups' if coll['sharing'] else 'no sharing'}"))
    for key in ("alpha_intra_us", "beta_intra_gbps", "alpha_inter_us", "beta_inter_gbps"):
        rows.append((f"collectives.{key}", coll[key]))
    if coll.get("per_span"):
        rows.append(("collectives.per_span", f"{len(coll['per_span'])} entries (alpha, beta per op, group size, nodes spanned"
                     + (", stride)" if any(e["stride"] is not None for e in coll["per_span"]) else ")")))
    table_raw = machine.raw["collectives"].get("bandwidth_table")
    if table_raw:
        rows.append(("collectives.bandwidth_table", "; ".join(
            f"stride {e['stride']} group {e['group']}: {e['beta_gbps']} GB/s" for e in table_raw)))
    return rows


def _print_machine(machine, fmt: str) -> int:
    from rich.table import Table

    if fmt == "json":
        return _dump(machine.raw)
    summary = _summary(machine)
    table = Table(title=f"Machine {machine.name} ({machine.path})", title_justify="left")
    table.add_column("field")
    table.add_column("value", overflow="fold")
    table.add_column("provenance", overflow="fold")
    provenance = machine.raw.get("provenance", {})
    shown_parent = set()
    for key, value in _machine_rows(machine):
        note = provenance.get(key)
        parent = key.split(".")[0]
        if note is None and parent != key and parent not in shown_parent:  # e.g. collectives.* -> collectives
            note = provenance.get(parent)
            shown_parent.add(parent)
        table.add_row(key, str(value), str(note or ""))
    console = make_console()
    console.print(table)
    if summary["description"]:
        console.print(summary["description"])
    return 0


def _print_list(entries, fmt: str) -> int:
    from rich.table import Table

    if fmt == "json":
        out = []
        for e in entries:
            item = {"name": e["name"], "path": e["path"], "problem": e["problem"]}
            if e["machine"] is not None:
                item.update(_summary(e["machine"]))
                item["name"] = e["name"]
            out.append(item)
        return _dump(out)
    table = Table(title="Machine profiles", title_justify="left")
    for col in ("name", "per node", "memory GiB", "GEMM TFLOP/s", "SpMM model", "beta intra/inter GB/s",
                "measured table", "description"):
        table.add_column(col, overflow="fold", no_wrap=col in ("name", "per node", "memory GiB"))
    for e in entries:
        m = e["machine"]
        if m is None:
            table.add_row(e["name"], "", "", "", "", "", "", f"[red]invalid: {e['problem']}[/red]")
            continue
        s = _summary(m)
        table.add_row(e["name"], *_node_text(s), _digits(s["gemm_tflops"]),
                      str(s["spmm_kind"]), f"{_digits(s['beta_intra_gbps'])} / {_digits(s['beta_inter_gbps'])}",
                      "yes" if s["bandwidth_table"] else "no", s["description"])
    make_console().print(table)
    return 0


def _spmm_text(spmm) -> str:
    """The SpMM entry as JSON when short, else a one-line description (--format json shows all)."""
    import json

    text = json.dumps(spmm)
    return text if len(text) <= 300 else describe_spmm_model(spmm) + " (full entry: --format json)"
