"""``plexus-tune plot KIND``: figures from run logs, the cost model and search studies (PNG + SVG)."""

from __future__ import annotations

from plexus_tune.cli.options import count
from plexus_tune.cli.output import check_output_dir
from plexus_tune.report import figures as plotting
from plexus_tune.errors import UserError
from plexus_tune.model.costs import rank_order
from plexus_tune.model.prediction import predict_run_grids
from plexus_tune.model.grid import enumerate_grids
from plexus_tune.model.machine import load_machine
from plexus_tune.model.workload import workload_from_dataset
from plexus_tune.report.figures import save_figure
from plexus_tune.search import objective_unit, parse_gpus, trials_frame
from plexus_tune.search.study import load_study


HELP = "plot predicted vs observed, breakdowns, strong scaling, search history or importances"
KINDS = ("pred-vs-obs", "breakdown", "scaling", "history", "importances")


def register(subparsers) -> None:
    parser = subparsers.add_parser("plot", help=HELP, description=HELP)
    sub = parser.add_subparsers(dest="plot_kind", metavar="KIND", parser_class=type(parser))

    def common(p):
        p.add_argument("--out", default="plots", help="output directory (default plots/)")
        p.add_argument("--format", default="png,svg", help="comma-separated formats (default png,svg)")
        p.set_defaults(handler=run)

    for kind, helptext, loghelp in (
            ("pred-vs-obs", "observed against predicted epoch time of every logged grid of a (graph, G)",
             "run log (JSON Lines) written by plexus-tune measure, train --log or run"),
            ("breakdown", "stacked time breakdown per grid, predicted and observed side by side",
             "run log (JSON Lines); breakdown without --log plots predictions of --dataset")):
        p = sub.add_parser(kind, help=helptext, description=helptext)
        p.add_argument("--log", help=loghelp)
        p.add_argument("--graph", help="graph name or source in the log (needed if the log holds several)")
        p.add_argument("--gpus", type=count(1), help="G (needed if the graph was run on several)")
        p.add_argument("--machine", help="predict with this profile (default: the predictions logged with the runs)")
        if kind == "breakdown":
            p.add_argument("--dataset", help="catalog dataset: predicted breakdown of every grid of --gpus (no log)")
            p.add_argument("--top", type=count(1), default=12, help="with --dataset: the K best predicted grids (default 12)")
        common(p)
    helptext = "predicted best epoch time against G per dataset, observed where logged"
    p = sub.add_parser("scaling", help=helptext,
                       description=f"{helptext}: for each catalog dataset and GPU count, the fastest grid that "
                       "fits in memory on --machine; runs from --log are overlaid by graph name.")
    p.add_argument("--datasets", required=True, help="comma-separated catalog datasets")
    p.add_argument("--machine", required=True, help="machine profile")
    p.add_argument("--gpus", default="4..1024:pow2", help="GPU counts (default 4..1024:pow2)")
    p.add_argument("--log", help="run log with observed runs to overlay (matched by graph name)")
    common(p)
    for kind, helptext in (("history", "objective per trial and best so far of a search study"),
                           ("importances", "fANOVA parameter importances of a search study")):
        p = sub.add_parser(kind, help=helptext, description=helptext)
        p.add_argument("--study", required=True, help="study name (see plexus-tune search)")
        p.add_argument("--storage", help="study database URL (default: studies.db in the data directory, as for plexus-tune search)")
        common(p)
    parser.set_defaults(handler=lambda args: _usage(parser))


def _usage(parser) -> int:
    parser.print_help()
    return 2


def _formats(text: str) -> list[str]:
    fmts = [f.strip().lower() for f in text.split(",") if f.strip()]
    bad = [f for f in fmts if f not in ("png", "svg", "pdf")]
    if not fmts or bad:
        raise UserError(f"unknown format(s) {', '.join(bad) or text!r}; use png, svg or pdf")
    return fmts


def make_figure(args):
    """(figure, file stem) for the parsed arguments."""
    kind = args.plot_kind
    machine = load_machine(args.machine) if getattr(args, "machine", None) else None
    if kind in ("pred-vs-obs", "breakdown"):
        return _runs_figure(args, kind, machine)
    if kind == "scaling":
        return _scaling_figure(args, machine)
    study = load_study(args.study, args.storage)
    if kind == "history":
        objective = study.user_attrs.get("objective", "value")
        if objective in ("epoch", "gpu-hours"):
            objective = f"{objective} ({objective_unit(objective)})"
        return plotting.plot_search_history(trials_frame(study), title=f"search history: {args.study}", objective=objective), f"history_{args.study}"
    return plotting.plot_param_importances(study, title=f"parameter importances: {args.study}"), f"importances_{args.study}"


def _runs_figure(args, kind: str, machine):
    """pred-vs-obs or breakdown of a run log's runs (a predicted-only breakdown without --log)."""
    if args.gpus is not None and args.gpus < 1:
        raise UserError(f"--gpus must be >= 1, got {args.gpus}")
    if kind == "breakdown" and args.log is None:
        if not args.dataset or not args.gpus or machine is None:
            raise UserError("breakdown needs --log, or --dataset with --gpus and --machine for a predicted-only plot")

        workload = workload_from_dataset(args.dataset)
        grids = enumerate_grids(args.gpus)
        pred = predict_run_grids(workload, machine, grids)
        frame = plotting.predicted_frame(pred, rank_order(pred)[: max(1, args.top)])
        fig = plotting.plot_breakdown(frame, title=f"{workload.name} on {args.gpus} GPUs of {machine.name}: predicted breakdown")
        return fig, f"breakdown_{workload.name}_G{args.gpus}_{machine.name}"
    if args.log is None:
        raise UserError(f"{kind} needs --log (a run log written by plexus-tune measure, train --log or run)")
    runs, graph, gpus = plotting.select_runs(plotting.runs_frame(args.log), args.graph, args.gpus)
    frame = plotting.pred_obs_frame(runs, machine)
    where = f"{graph}, G={gpus}" + (f", model {machine.name}" if machine else "")
    if kind == "pred-vs-obs":
        return plotting.plot_pred_vs_obs(frame, title=f"predicted vs observed epoch\n{where}"), f"pred-vs-obs_{graph}_G{gpus}"
    return plotting.plot_breakdown(frame, title=f"breakdown per grid\n{where}"), f"breakdown_{graph}_G{gpus}"


def _scaling_figure(args, machine):
    names = [d.strip() for d in args.datasets.split(",") if d.strip()]
    if not names:
        raise UserError("--datasets is empty; name one or more catalog datasets")
    pred = plotting.scaling_frame(names, machine, parse_gpus(args.gpus))
    observed = plotting.observed_scaling_frame(plotting.runs_frame(args.log)) if args.log else None
    if pred.empty and (observed is None or observed.empty):
        raise UserError("no dataset fits in memory at any of these GPU counts; widen --gpus")
    fig = plotting.plot_strong_scaling(pred, observed, machine=machine.name)
    return fig, f"scaling_{machine.name}_{'-'.join(pred['dataset'].unique()) or 'observed'}"


def run(args) -> int:
    import os

    formats = _formats(args.format)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UserError(f"--out {args.out} is a file; give a directory for the figures (default plots/)")
    check_output_dir("--out", args.out, inputs=[getattr(args, "log", None)])
    fig, stem = make_figure(args)
    for path in save_figure(fig, args.out, stem, formats):
        print(path)
    return 0
