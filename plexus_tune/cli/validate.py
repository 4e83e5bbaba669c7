"""``plexus-tune validate``: leave-one-(graph, G)-out check of a profile on logged runs."""

from __future__ import annotations

from plexus_tune.cli.output import check_output_file, make_console
from plexus_tune.report.validation import leave_one_group_out
from plexus_tune.measure.table import runs_table
from plexus_tune.measure.store import read_runs
from plexus_tune.model.machine import load_machine
from plexus_tune.paths import json_with_keys, make_parent


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="score a machine profile's grid choice on logged trainer runs",
        description="For each (graph, G) in the run log held out in turn, refit the epoch-level "
        "coefficients on the other runs and report the Spearman correlation of predicted and "
        "observed epoch times, the regret of the recommended grid (observed time of the predicted "
        "best / observed best) and the MAPE.",
    )
    parser.add_argument("--machine", required=True, help="profile name or JSON path")
    parser.add_argument("--runs", required=True, nargs="+", metavar="FILE", help="trainer run log(s) (JSON Lines)")
    parser.add_argument("--no-refit", action="store_true", help="score the profile as it is (no leave-one-out refit)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON (never over an input; another "
                        "command's file only with --force)")
    parser.add_argument("--force", action="store_true", help="let --json replace a file that is not a validation JSON")
    parser.set_defaults(handler=run)


def _spearman(value) -> str:
    """A Spearman cell: "-" where the group has no ranking (one grid)."""
    return "-" if value != value else f"{value:.3f}"


def run(args) -> int:
    if args.json:
        check_output_file("--json", args.json, inputs=[*args.runs, args.machine], force=args.force,
                          is_own=lambda path: json_with_keys(path, ("machine", "groups", "mean")), own_kind="a validation JSON")
    machine = load_machine(args.machine)
    df = runs_table(read_runs(args.runs))
    result = leave_one_group_out(df, machine, refit=not args.no_refit)
    refitted = sum(g["how"].startswith("refitted") for g in result["groups"])
    console = make_console()
    console.print(_groups_table(result, machine, _mode(refitted, len(result["groups"]), args.no_refit)))
    m = result["mean"]
    console.print(f"worst regret {m['max_regret']:.3f} over {m['groups']} (graph, G) groups; MAPE and regret are means over "
                  f"all {m['groups']} groups, Spearman over the {m.get('spearman_groups', m['groups'])} with two or more grids "
                  "(one grid has no ranking: -)")
    parts = result.get("parts") or {}
    shown = [k for k in parts if k != "overhead_share"]
    if shown:
        console.print("the profile's parts against the observed parts, every run: " + ", ".join(
            f"{k[:-3]} MAPE {parts[k]['mape']:.0f}% (median predicted/observed {parts[k]['ratio']:.2f})" for k in shown)
            + (f"; the fixed per-epoch overhead is {parts['overhead_share']:.0%} of the predicted total on average"
               if parts.get("overhead_share") else ""))
    if args.json:
        _write_json(args.json, {"machine": machine.name, "refit": not args.no_refit, "refitted_groups": refitted, **result})
    return 0


def _mode(refitted: int, groups: int, no_refit: bool) -> str:
    if no_refit:
        return "as is"
    if refitted == groups:
        return "refitted"
    if refitted == 0:
        return "as is: too few other runs to refit"
    return f"refitted in {refitted} of {groups} groups, the others as is"


def _groups_table(result, machine, mode: str):
    from rich.table import Table

    table = Table(title=f"{machine.name}: leave-one-(graph, G)-out validation ({mode})")
    for col in ("graph", "G", "grids", "Spearman", "regret", "MAPE %", "predicted best", "observed best"):
        table.add_column(col, justify="left" if col == "graph" else "right")
    for g in result["groups"]:
        table.add_row(g["graph"] + (f" ({g['setting']})" if g["setting"] else ""), str(g["gpus"]), str(g["grids"]), _spearman(g["spearman"]), f"{g['regret']:.3f}", f"{g['mape']:.1f}", g["predicted_best"], g["observed_best"])
    m = result["mean"]
    table.add_row("mean", "", "", _spearman(m["spearman"]), f"{m['regret']:.3f}", f"{m['mape']:.1f}", "", "", style="bold")
    return table


def _write_json(path, data) -> None:
    import json
    import os

    make_parent(path)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=2)
    os.replace(tmp, path)
