"""``plexus-tune fit``: a machine profile from calibration logs and trainer runs."""

from __future__ import annotations



def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "fit",
        help="fit a machine profile from SpMM, collective and trainer-run logs",
        description="Fit the SpMM model (every kind scored on repeated random 70/30 splits; --kind auto "
        "keeps the lowest held-out MAPE), the collective network model (every form scored on the same "
        "splits and by leaving each message size out; auto keeps the lowest leave-sizes-out MAPE), GEMM throughput, and, from trainer runs, the epoch-level "
        "scale factors and overhead; write the profile with provenance and scores.",
    )
    parser.add_argument("--spmm", required=True, nargs="+", metavar="FILE", help="SpMM logs (calibrate spmm) or CSV with nnz,rows,common,dense_cols,time_ms")
    parser.add_argument("--collectives", required=True, nargs="+", metavar="FILE", help="collective logs (calibrate collectives) or CSV with op,group_size,nodes,message_bytes,time_ms")
    parser.add_argument("--runs", nargs="+", metavar="FILE", help="trainer run logs (measure) for the epoch-level fit")
    parser.add_argument("--gemm", nargs="+", metavar="FILE", help="GEMM logs (default: GEMM records found in the --spmm logs)")
    parser.add_argument("--machine-name", required=True, help="name of the profile")
    parser.add_argument("--out", required=True, metavar="FILE", help="profile JSON to write (e.g. models/NAME.json)")
    parser.add_argument("--kind", default="auto", choices=("auto", "paper", "roofline", "learned", "learned-roofline", "learned-boosted"), help="SpMM model kind (default auto)")
    parser.add_argument("--splits", type=int, default=1000, help="random 70/30 splits for the scores (default 1000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-table", action="store_true", help="no per-(op, stride, group) bandwidth table")
    parser.add_argument("--collective-form", default="auto", choices=("auto", "two-tier", "per-span", "hierarchical"),
                        help="collective network model form (default auto: the lowest leave-sizes-out MAPE)")
    parser.add_argument("--host-cores", type=int, default=None, help="CPU cores the ranks of a node share (default: the CPU count of "
                        "gloo collective logs; none for NCCL); 0: do not model time-sharing. Collective timings are divided by the "
                        "oversubscription they ran under and predictions multiply it back")
    parser.add_argument("--gpus-per-node", type=int, default=None, help="default: the largest gpus_per_node (else world size) of the collective logs")
    parser.add_argument("--device-memory-gib", type=float, default=None, help="default: host memory / gpus per node")
    parser.add_argument("--gemm-tflops", type=float, default=None, help="GEMM rate when no GEMM measurements are given")
    parser.add_argument("--elementwise-gbps", type=float, default=10.0, help="starting elementwise rate, rescaled by the run fit (default 10)")
    parser.add_argument("--description", default=None)
    parser.set_defaults(handler=run)


def _load(paths, schema):
    import pandas as pd

    from plexus_tune.fit import load_table

    frames = [load_table(p, schema=schema) for p in paths]
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame()
    if len(frames) == 1:
        return frames[0]
    out = pd.concat(frames, ignore_index=True)
    out.attrs["source"] = ", ".join(map(str, paths))
    return out


def _file_info(path) -> dict:
    import hashlib
    from pathlib import Path

    data = Path(path).read_bytes()
    return {"path": str(path), "sha256": hashlib.sha256(data).hexdigest()[:16], "lines": data.count(b"\n")}


def _fmt(v, pct=False):
    if v is None:
        return "-"
    return f"{v:.1f}" if pct else (f"{v:.4f}" if abs(v) < 100 else f"{v:.1f}")


def run(args) -> int:
    import os
    import warnings

    import numpy as np
    from rich.console import Console
    from rich.table import Table

    from plexus_tune import fit as fitting
    from plexus_tune.errors import UserError
    from plexus_tune.model.machine import Machine
    from plexus_tune.measure.store import environment_info, now_utc

    console = Console(width=max(Console().width, 110))
    if args.splits < 0:
        raise UserError("--splits must be >= 0")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        spmm_df = _load(args.spmm, "spmm")
        coll_df = _load(args.collectives, "collective")
        gemm_df = _load(args.gemm or args.spmm, "gemm")
    if not len(spmm_df):
        raise UserError(f"no SpMM measurements in {', '.join(args.spmm)}")
    if not len(coll_df):
        raise UserError(f"no collective measurements in {', '.join(args.collectives)}")

    # SpMM: every kind on the same splits
    spmm = fitting.fit_spmm(spmm_df, args.kind, n_splits=args.splits, seed=args.seed)
    if args.kind != "auto":
        others = [k for k in fitting.SPMM_KINDS if k != args.kind and len(spmm_df) >= fitting.min_rows(fitting.SPMM_PARAMETERS[k])]
        for k in others:
            spmm.all_scores[k] = fitting.fit_spmm(spmm_df, k, n_splits=args.splits, seed=args.seed).scores
    table = Table(title=f"SpMM models on {len(spmm_df)} measurements, {args.splits} random 70/30 splits (means; * chosen)")
    for col in ("kind", "train R^2", "test R^2", "train RMSE ms", "test RMSE ms", "train MAPE %", "test MAPE %"):
        table.add_column(col, justify="left" if col == "kind" else "right")
    for row in fitting.scores_table_rows(spmm.all_scores):
        mark = " *" if row["kind"] == spmm.kind else ""
        table.add_row(row["kind"] + mark, _fmt(row["train_r2"]), _fmt(row["test_r2"]), _fmt(row["train_rmse_ms"]), _fmt(row["test_rmse_ms"]), _fmt(row["train_mape"], True), _fmt(row["test_mape"], True))
    console.print(table)

    # time-sharing of CPU cores by the ranks of one node (gloo on a CPU host)
    if args.host_cores is not None and args.host_cores < 0:
        raise UserError("--host-cores must be >= 0 (0: no time-sharing model)")
    if args.host_cores is not None:
        host_cores = args.host_cores or None
        cores_from = "--host-cores"
    elif "backend" in coll_df and (coll_df["backend"].astype(str) == "gloo").all() and "machine_info.cpu_count" in coll_df:
        host_cores = int(np.nanmax(fitting.pd_numeric(coll_df["machine_info.cpu_count"], np.nan)))
        cores_from = "CPU count recorded in the gloo collective logs"
    else:
        host_cores, cores_from = None, None
    stretch = fitting.collective_time_sharing(coll_df, host_cores)
    if np.any(stretch > 1):
        coll_df = coll_df.copy()
        coll_df["time_ms"] = np.asarray(coll_df["time_ms"], dtype=np.float64) / stretch
        console.print(f"collective timings divided by the oversubscription they ran under ({host_cores} cores): x{stretch.min():.3g} to x{stretch.max():.3g}")

    # collectives: every form scored; the profile's network model is the chosen one
    world = int(np.nanmax(coll_df["world_size"])) if "world_size" in coll_df else int(np.nanmax(coll_df["group_size"]))
    logged_gpn = np.nanmax(fitting.pd_numeric(coll_df["gpus_per_node"], np.nan)) if "gpus_per_node" in coll_df else np.nan
    gpn = int(args.gpus_per_node or (logged_gpn if np.isfinite(logged_gpn) else world))
    coll = fitting.fit_collectives(coll_df, n_splits=args.splits, seed=args.seed, form=args.collective_form,
                                   table=not args.no_table and "stride" in coll_df, gpus_per_node=gpn)
    ctable = Table(title=f"collective models on {coll.n_samples} measurements: {args.splits} random 70/30 splits and each "
                   f"message size left out (means; * chosen)")
    for col in ("model", "test R^2", "test MAPE %", "sizes-out MAPE %", "worst size MAPE %"):
        ctable.add_column(col, justify="left" if col == "model" else "right")
    for name, sc in coll.all_scores.items():
        ctable.add_row(name + (" *" if name == coll.name else ""), _fmt(sc.get("test_r2")), _fmt(sc.get("test_mape"), True),
                       _fmt(sc.get("sizes_out_mape"), True), _fmt(sc.get("sizes_out_worst_mape"), True))
    console.print(ctable)
    net = coll.network
    console.print(f"collectives: {coll.name}; alpha {net.alpha_intra_us:.4g} / {net.alpha_inter_us:.4g} us, beta "
                  f"{net.beta_intra_gbps:.4g} / {net.beta_inter_gbps:.4g} GB/s (intra / inter)"
                  + (f"; {len(coll.table)} table entries" if coll.table else "")
                  + (f"; {len(net.entries)} per-span entries" if coll.form == "per-span" else ""))
    if coll.placement_mismatches:
        console.print(f"warning: {coll.placement_mismatches} collective timings span other node counts than groups of their "
                      f"stride on nodes of {gpn} GPUs; the model places them as predictions do")

    # GEMM
    gemm = None
    if len(gemm_df):
        gemm = fitting.fit_gemm(gemm_df, n_splits=args.splits, seed=args.seed)
        gemm_tflops = gemm.tflops
        console.print(f"GEMM: {gemm.tflops:.4f} TFLOP/s + {gemm.overhead_ms:.4f} ms per call on {len(gemm_df)} measurements (test MAPE {gemm.scores.get('test_mape', float('nan')):.1f} %)")
    elif args.gemm_tflops:
        gemm_tflops = float(args.gemm_tflops)
    else:
        raise UserError("no GEMM measurements found; run 'plexus-tune calibrate spmm --graph ...' or give --gemm-tflops")

    if args.device_memory_gib:
        mem = float(args.device_memory_gib)
    else:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 / gpn
    env = environment_info()
    stamp = now_utc()
    profile = {
        "schema": "plexus-tune/machine/1",
        "name": args.machine_name,
        "description": args.description or f"fitted on {env.get('host', 'this host')} ({env.get('processor', '')}, {env.get('cpu_count')} CPUs, {coll_df['backend'].iloc[0] if 'backend' in coll_df else 'gloo'}) on {stamp[:10]}",
        "gpus_per_node": gpn,
        "device_memory_gib": round(mem, 3),
        "gemm_tflops": gemm_tflops,
        "elementwise_gbps": float(args.elementwise_gbps),
        "spmm": spmm.to_dict(),
        "collectives": coll.to_dict(),
    }
    if host_cores:
        profile["host_cores"] = int(host_cores)
        profile["threads_per_rank"] = 1
    provenance = {
        "gpus_per_node": "--gpus-per-node" if args.gpus_per_node else (f"largest gpus_per_node in the collective logs ({gpn})" if np.isfinite(logged_gpn) else f"largest world size in the collective logs ({world})"),
        "device_memory_gib": "--device-memory-gib" if args.device_memory_gib else "host memory / gpus_per_node",
        "gemm_tflops": f"fit_gemm on {len(gemm_df)} GEMM timings" if gemm else "--gemm-tflops",
        "elementwise_gbps": f"starting value {args.elementwise_gbps} GB/s",
        "spmm": f"fit_spmm kind {spmm.kind} (chosen {'by lowest held-out MAPE' if args.kind == 'auto' else 'by --kind'}) on {len(spmm_df)} SpMM timings",
        "collectives": f"fit_collectives form {coll.name} ("
        + (f"lowest {coll.selected_by} of {len(coll.all_scores)} candidates" if coll.selected_by else "--collective-form")
        + f"; relative least squares) on {coll.n_samples} timings"
        + (f"; bandwidth_table: one bus bandwidth per (op, stride, group size), {len(coll.table)} entries" if coll.table else "")
        + ("; times divided by the oversubscription of each calibration run" if np.any(stretch > 1) else ""),
    }
    if host_cores:
        provenance["host_cores"] = cores_from
        provenance["threads_per_rank"] = "1, as the trainer runs each rank when ranks outnumber cores"
    fit_info = {
        "date": stamp,
        "environment": env,
        "inputs": {
            "spmm": [_file_info(p) for p in args.spmm],
            "collectives": [_file_info(p) for p in args.collectives],
            "runs": [_file_info(p) for p in (args.runs or [])],
            "gemm": [_file_info(p) for p in (args.gemm or [])],
        },
        "splits": args.splits,
        "seed": args.seed,
        "spmm": {"chosen": spmm.kind, "samples": len(spmm_df), "scores": spmm.all_scores},
        "collectives": {"chosen": coll.name, "form": coll.form, "selected_by": coll.selected_by, "tiers": coll.tiers, "scores": coll.all_scores,
                        "same_as": coll.same_as, "placement_mismatches": coll.placement_mismatches,
                        "table_rule": "a bandwidth table replaces the plain formula only if neither held-out R^2 nor MAPE is worse"},
        "gemm": {"tflops": gemm.tflops, "overhead_ms": gemm.overhead_ms, "scores": gemm.scores} if gemm else None,
    }
    Machine.from_dict(profile, source=args.out)  # validates before any epoch fit

    if args.runs:
        from plexus_tune.fit.validation import predict_runs
        from plexus_tune.measure.records import runs_table
        from plexus_tune.measure.store import read_runs

        runs = predict_runs(runs_table(read_runs(args.runs)), profile)
        raw_mape = float(100 * np.mean(np.abs(runs["pred_epoch_ms"] - runs["obs_epoch_ms"]) / runs["obs_epoch_ms"]))
        epoch = fitting.fit_epoch(runs, n_splits=args.splits, seed=args.seed)
        profile = fitting.apply_epoch_fit(profile, epoch)
        provenance["epoch_overhead_ms"] = f"fit_epoch ({epoch.method} method) on {len(runs)} trainer configurations (median over trials)"
        for key, comp in (("spmm", "spmm_ms"), ("gemm_tflops", "gemm_ms"), ("collectives", "comm_ms"), ("elementwise_gbps", "other_ms")):
            provenance[key] += f"; rescaled by the run fit (x{epoch.scales.get(comp, 1.0):.3g} on {comp})"
        fit_info["epoch"] = {"method": epoch.method, "scales": epoch.scales, "overhead_ms": epoch.overhead_ms, "configurations": len(runs), "mape_before_run_fit": raw_mape, "scores": epoch.scores}
        s = epoch.scores
        console.print(
            f"epoch fit ({epoch.method}) on {len(runs)} configurations: scales "
            + ", ".join(f"{k} x{v:.3g}" for k, v in epoch.scales.items())
            + f", overhead {epoch.overhead_ms:.2f} ms; MAPE {raw_mape:.1f} % before, test R^2 {s.get('test_r2', float('nan')):.3f}, test MAPE {s.get('test_mape', float('nan')):.1f} % after"
        )
    profile["provenance"] = provenance
    profile["fit"] = fit_info
    Machine.from_dict(profile, source=args.out)
    tmp = f"{args.out}.tmp{os.getpid()}"
    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    with open(tmp, "w") as fh:
        fh.write(fitting.profile_json_text(profile))
    os.replace(tmp, args.out)
    console.print(f"wrote {args.out}")
    return 0


def _no_worse(scores: dict, baseline: dict) -> bool:
    """Held-out R^2 no lower and held-out MAPE no higher than the baseline's (the bandwidth table rule)."""
    from plexus_tune.fit.collectives import no_worse

    return no_worse(scores, baseline)
