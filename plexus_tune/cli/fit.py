"""``plexus-tune fit``: a machine profile from calibration logs and trainer runs.

The work is :func:`plexus_tune.fit.profile.fit_profile`; this module parses the arguments,
shows progress on stderr, prints the scores and writes the profile.
"""

from __future__ import annotations

from plexus_tune.cli.options import count, real
from plexus_tune.fit import profile as fitting
from plexus_tune.fit.quant import CALL_TIERS
from plexus_tune.errors import Interrupted, UserError
from plexus_tune.model.other import check_optimizer
from plexus_tune.cli.output import ProgressReporter, check_output_file, make_console

#: flags of the arguments whose values the profile's provenance names
_GIVEN = {"gpus_per_node": "--gpus-per-node", "device_memory_gib": "--device-memory-gib", "gemm_tflops": "--gemm-tflops", "host_cores": "--host-cores"}


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "fit",
        help="fit a machine profile from SpMM, collective and trainer-run logs",
        description="Fit the SpMM model (every kind scored on the same random 70/30 splits; --kind auto "
        "keeps the lowest held-out MAPE), the collective network model (every form scored on the same "
        "splits and by leaving each message size out; auto keeps the lowest leave-sizes-out MAPE), GEMM throughput, and, from trainer runs, the epoch-level "
        "scale factors and overhead; write the profile with provenance and scores. Progress goes to stderr.",
    )
    _add_input_arguments(parser)
    parser.add_argument("--machine-name", required=True, help="name of the profile")
    parser.add_argument("--out", required=True, metavar="FILE", help="profile JSON to write (e.g. models/NAME.json); "
                        "never one of the input logs")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")
    _add_fit_arguments(parser)
    _add_profile_arguments(parser)
    parser.set_defaults(handler=run)


def _add_input_arguments(parser) -> None:
    parser.add_argument("--spmm", required=True, nargs="+", metavar="FILE", help="SpMM logs (calibrate spmm) or CSV with nnz,rows,common,dense_cols,time_ms")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--collectives", nargs="+", metavar="FILE", help="collective logs (calibrate collectives) or CSV with op,group_size,nodes,message_bytes,time_ms")
    source.add_argument("--collectives-from", metavar="PROFILE", help="copy the collectives (and gpus per node) of this profile instead "
                        "of fitting them, for a machine whose network was not measured; the provenance says so")
    parser.add_argument("--bandwidth", nargs="+", metavar="FILE", help="bandwidth logs (calibrate bandwidth): elementwise_gbps, "
                        "optimizer_gbps and sync_us of the epoch's other part")
    parser.add_argument("--optimizer-runs", nargs="+", metavar="FILE", help="trainer run logs whose optimizer phase gives optimizer_gbps "
                        "(when no bandwidth log times the optimizer) and whose other part, less its predicted bytes, gives the "
                        "per-epoch latency epoch_overhead_ms (without --runs); runs on the profile's kind of device only")
    parser.add_argument("--provenance", nargs="+", default=[], metavar="FIELD=TEXT", help="add TEXT to the provenance of a "
                        "profile field, e.g. where a given number was measured: elementwise_gbps='copy rate measured in env.json'")
    parser.add_argument("--optimizer", default=None, help="the optimizer the trainer runs on this machine (default: the trainer's, adamw-fused)")
    parser.add_argument("--runs", nargs="+", metavar="FILE", help="trainer run logs (measure) for the epoch-level fit")
    parser.add_argument("--gemm", nargs="+", metavar="FILE", help="GEMM logs (default: GEMM records found in the --spmm logs)")


def _add_fit_arguments(parser) -> None:
    parser.add_argument("--kind", default="auto", help="SpMM model kind to fit (default auto: the lowest held-out MAPE); every kind "
                        "the data supports is scored beside it, and an unknown name lists them")
    parser.add_argument("--splits", type=count(1), default=1000, help="at most this many random 70/30 splits for the scores (default 1000; at least 1)")
    parser.add_argument("--r2-sem", type=real(minimum=0), default=0.0025, help="stop scoring a model once the standard error of its mean held-out "
                        "R^2 is at most this (default 0.0025, checked every 10 splits from 10 on), and at the latest after 50 splits, where more "
                        "would shrink the score's standard error by at most 2.5 %% (docs/model.md, fitting protocol); 0: score all --splits")
    parser.add_argument("--jobs", type=count(0), default=0, help="worker processes scoring the SpMM kinds (default 0: one per CPU; "
                        "1: none); the scores do not depend on it")
    parser.add_argument("--seed", type=count(0), default=0, help="seed of the random splits and of the stochastic models (default 0)")
    parser.add_argument("--no-table", action="store_true", help="no per-(op, stride, group) bandwidth table")
    parser.add_argument("--collective-form", default="auto", choices=("auto", "two-tier", "per-span", "hierarchical"),
                        help="collective network model form (default auto: the lowest leave-sizes-out MAPE)")
    parser.add_argument("--collective-sharing", default="auto", choices=("auto", "on", "off"),
                        help="NIC sharing by concurrent groups across nodes (beta_inter / min(n, p)): auto (default) scores "
                             "each form with and without it, on or off fixes it")


def _add_profile_arguments(parser) -> None:
    parser.add_argument("--host-cores", type=count(0), default=None, help="CPU cores the ranks of a node share (default: the CPU count of "
                        "gloo collective logs; none for NCCL); 0: do not model time-sharing. Collective timings are divided by the "
                        "oversubscription they ran under and predictions multiply it back")
    parser.add_argument("--gpus-per-node", type=count(1), default=None, help="default: the largest gpus_per_node (else world size) of the collective logs")
    parser.add_argument("--device-memory-gib", type=real(above=0), default=None, help="default: host memory / gpus per node")
    parser.add_argument("--gemm-tflops", type=real(above=0), default=None, help="GEMM rate when no GEMM measurements are given")
    parser.add_argument("--memory-bandwidth-gbps", type=real(above=0), default=None,
                        help="device memory bandwidth, GB/s: the SpMM floor's rate (docs/profiles.md); default: none")
    parser.add_argument("--elementwise-gbps", type=real(above=0), default=10.0, help="starting elementwise rate, rescaled by the run fit (default 10)")
    parser.add_argument("--description", default=None, help="one-line description stored in the profile (default: the host, backend and date of the fit)")


def _fmt(v, pct=False):
    if v is None:
        return "-"
    return f"{v:.1f}" if pct else (f"{v:.4f}" if abs(v) < 100 else f"{v:.1f}")


def run(args) -> int:
    fitted = _fit(args, _check_arguments(args))
    console = make_console()
    _print_spmm(console, fitted, args.splits)
    _print_collectives(console, fitted.report, fitted.profile, args)
    _print_other_parts(console, fitted.report, fitted.profile)
    fitting.write_profile(fitted.profile, args.out)
    seconds = fitted.report["seconds"]
    console.print(f"wrote {args.out} (" + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()) + ")")
    return 0


def _check_arguments(args) -> dict[str, str]:
    """Every argument checked before any fit (numbers are checked where they are parsed,
    plexus_tune.cli.options); returns the --provenance notes."""
    if not args.machine_name.strip():
        raise UserError(f"--machine-name must name the profile, got {args.machine_name!r}")
    try:
        if args.optimizer is not None:
            check_optimizer(args.optimizer)
    except UserError as exc:
        raise UserError(f"--optimizer: {exc}") from None
    try:
        notes = fitting.provenance_notes(args.provenance)
    except UserError as exc:
        raise UserError(f"--provenance: {exc}") from None
    check_output_file("--out", args.out, overwrite=False, force=args.force,
                      inputs=[*args.spmm, *(args.collectives or ()), *(args.runs or ()), *(args.gemm or ()),
                              *(args.bandwidth or ()), *(args.optimizer_runs or ())])
    return notes


def _options(args) -> fitting.FitOptions:
    import os

    return fitting.FitOptions(
        spmm=args.spmm, collectives=args.collectives, gemm=args.gemm, runs=args.runs, name=args.machine_name,
        kind=args.kind, n_splits=args.splits, seed=args.seed, r2_sem=args.r2_sem or None,
        n_jobs=args.jobs or os.cpu_count() or 1, table=not args.no_table, collective_form=args.collective_form,
        collective_sharing={"auto": None, "on": True, "off": False}[args.collective_sharing],
        host_cores=args.host_cores, gpus_per_node=args.gpus_per_node, device_memory_gib=args.device_memory_gib,
        gemm_tflops=args.gemm_tflops, elementwise_gbps=args.elementwise_gbps,
        memory_bandwidth_gbps=args.memory_bandwidth_gbps, description=args.description, source=args.out,
        collectives_profile=args.collectives_from, bandwidth=args.bandwidth, optimizer_runs=args.optimizer_runs,
        optimizer=args.optimizer)


def _fit(args, notes: dict[str, str]):
    """The fitted profile, its provenance naming the flags that gave values and the --provenance notes."""
    import warnings

    progress = ProgressReporter(command="fit")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")  # every skipped input line is reported
            fitted = fitting.fit_profile(_options(args), progress=progress)
    except KeyboardInterrupt:
        raise Interrupted(f"no profile written ({args.out} unchanged)") from None
    except UserError as exc:
        flag = _GIVEN.get(getattr(exc, "parameter", None))
        if flag:
            raise UserError(f"{exc} ({flag})") from None
        raise
    finally:
        progress.close()
    fitting.annotate_provenance(fitted.profile, _GIVEN, notes)  # the library says "given": name the flag
    return fitted


def _print_spmm(console, fitted, splits: int) -> None:
    from rich.table import Table

    spmm = fitted.report["spmm"]
    table = Table(title=f"SpMM models on {spmm['samples']} measurements, up to {splits} random 70/30 splits (means; * chosen)")
    table.add_column("kind", no_wrap=True, min_width=max(len(row["kind"]) for row in spmm["rows"]) + 2)
    for col in ("splits", "train R^2", "test R^2", "train RMSE ms", "test RMSE ms", "train MAPE %", "test MAPE %"):
        table.add_column(col, justify="right")
    for row in spmm["rows"]:
        mark = " *" if row["kind"] == spmm["chosen"] else ""
        splits = fitted.spmm.all_scores.get(row["kind"], {}).get("splits")
        table.add_row(row["kind"] + mark, "-" if splits is None else str(splits), _fmt(row["train_r2"]), _fmt(row["test_r2"]),
                      _fmt(row["train_rmse_ms"]), _fmt(row["test_rmse_ms"]), _fmt(row["train_mape"], True), _fmt(row["test_mape"], True))
    console.print(table)


def _print_collectives(console, report, profile, args) -> None:
    sharing = report["time_sharing"]
    if sharing:
        console.print(f"collective timings divided by the oversubscription they ran under ({sharing['host_cores']} cores): x{sharing['min']:.3g} to x{sharing['max']:.3g}")
    coll = report["collectives"] or {}
    if not coll:
        console.print(f"collectives copied from {args.collectives_from} (not measured here)")
        return
    console.print(_collectives_table(coll, args.splits))
    if coll.get("selected_by"):
        console.print(f"collective form chosen by the lowest {coll['selected_by']}")
    alpha, beta = coll["alpha_us"], coll["beta_gbps"]
    console.print(f"collectives: {coll['chosen']}; alpha {alpha['intra']:.4g} / {alpha['inter']:.4g} us, beta "
                  f"{beta['intra']:.4g} / {beta['inter']:.4g} GB/s (intra / inter)"
                  + (f"; {coll['table_entries']} table entries" if coll["table_entries"] else "")
                  + (f"; {coll['per_span_entries']} per-span entries" if coll["per_span_entries"] else ""))
    if coll.get("placement_mismatches"):
        console.print(f"warning: {coll['placement_mismatches']} collective timings span other node counts than groups of their "
                      f"stride on nodes of {profile['gpus_per_node']} GPUs; the model places them as predictions do")


def _collectives_table(coll, splits: int):
    from rich.table import Table

    ctable = Table(title=f"collective models on {coll.get('samples')} measurements: up to {splits} random 70/30 splits and each "
                   f"message size left out (means; * chosen)")
    on_runs = coll.get("epoch_scores") or {}
    for col in ("model", "test R^2", "test MAPE %", "sizes-out MAPE %", "worst size MAPE %") + (("runs epoch-fit MAPE %",) if on_runs else ()):
        ctable.add_column(col, justify="left" if col == "model" else "right")
    for name, sc in (coll.get("scores") or {}).items():
        runs_cell = (_fmt(on_runs[name].get("test_mape"), True) if name in on_runs else "-",) if on_runs else ()
        ctable.add_row(name + (" *" if name == coll["chosen"] else ""), _fmt(sc.get("test_r2")), _fmt(sc.get("test_mape"), True),
                       _fmt(sc.get("sizes_out_mape"), True), _fmt(sc.get("sizes_out_worst_mape"), True), *runs_cell)
    return ctable


def _print_other_parts(console, report, profile) -> None:
    gemm = report["gemm"]
    if gemm:
        console.print(f"GEMM: {gemm['tflops']:.4f} TFLOP/s + {gemm['overhead_ms']:.4f} ms per call on {gemm['samples']} measurements (test MAPE {gemm['scores'].get('test_mape', float('nan')):.1f} %)")
    rates = profile["fit"].get("bandwidth") or {}
    console.print(f"other: elementwise {profile['elementwise_gbps']:.4g} GB/s, optimizer {profile['optimizer']} "
                  f"{profile.get('optimizer_gbps', profile['elementwise_gbps']):.4g} GB/s, sync {profile.get('sync_us', 0.0):.3g} us"
                  + (f" ({rates['samples']} bandwidth records)" if rates.get("samples") else ""))
    epoch = report["epoch"]
    if epoch:
        s = epoch["scores"]
        console.print(
            f"epoch fit ({epoch['method']}) on {epoch['configurations']} configurations: scales "
            + ", ".join(f"{k} x{v:.3g}" for k, v in epoch["scales"].items())
            + f", overhead {epoch['overhead_ms']:.2f} ms; MAPE {epoch['mape_before']:.1f} % before, test R^2 {s.get('test_r2', float('nan')):.3f}, test MAPE {s.get('test_mape', float('nan')):.1f} % after"
        )
    for precision, calls in (report.get("quant") or {}).items():
        for tier, key, where in CALL_TIERS:
            if key in calls:
                console.print(f"{precision} collectives {where}: {calls[key]:.3f} ms per process-group call beyond bytes "
                              f"and codec (median of {calls[tier + '_pairs']} pairs with FP32, quartiles "
                              f"{calls[tier + '_q1_ms']:.3f} .. {calls[tier + '_q3_ms']:.3f} ms)")
