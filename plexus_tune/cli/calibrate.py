"""``plexus-tune calibrate``: microbenchmarks of collectives and SpMM/GEMM, logged as JSON Lines."""

from __future__ import annotations

from plexus_tune.cli.options import count, real
from plexus_tune.allocator import configure_compute_process
from plexus_tune.cli.launching import add_launcher_arguments, launcher_from_args, submits
from plexus_tune.cli.output import ProgressReporter, check_log, make_console
from plexus_tune.cluster.spec import parse_cluster
from plexus_tune.model.comm_precision import check_backend, parse_precision
from plexus_tune.model.precision_choice import parse_allowed
from plexus_tune.errors import UserError
from plexus_tune.numbers import parse_count
from plexus_tune.resources import check_local_ranks
from plexus_tune.measure.bandwidth import bandwidth_benchmark
from plexus_tune.measure.device import check_backend_devices, resolve_device
from plexus_tune.measure.campaign import load_graph_source
from plexus_tune.measure.codec import run_quant_benchmark
from plexus_tune.measure.collectives import COLLECTIVE_MODES, calibrate_collectives, collective_shapes, parse_sizes
from plexus_tune.measure.spmm import SWEEP_STRUCTURES, calibrate_graph_shards, family_pieces, spmm_sweep, sweep_shapes
from plexus_tune.measure.spmm_device import device_graph_shards, device_spmm_sweep
from plexus_tune.measure.store import BANDWIDTH_LOG, COLLECTIVE_LOG, QUANT_LOG, SAMPLING_LOG, SPMM_LOG, append_records, environment_info, record_type
from plexus_tune.measure.sampling import run_sampling_benchmark
from plexus_tune.graph.sampling import check_batch_size
from plexus_tune.model.other import OPTIMIZER_ACCESSES
from plexus_tune.model.collectives import ALL_OPS
from plexus_tune.model.grid import enumerate_grids
from plexus_tune.model.workload import check_layers, model_widths


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "calibrate",
        help="time collectives and SpMM/GEMM on this machine and log them",
        description="Microbenchmarks for a machine profile. Results are appended to a JSON Lines "
        "measurement log (--out); fit them with 'plexus-tune fit'.",
    )
    sub = parser.add_subparsers(dest="what", metavar="WHAT", parser_class=type(parser))
    sub.required = True

    _register_collectives(sub)

    _register_spmm(sub)

    _register_bandwidth(sub)

    _register_quant(sub)

    _register_sampling(sub)


def _register_sampling(sub) -> None:
    sampling = sub.add_parser(
        "sampling",
        help="ScaleGNN's communication-free sampling: a step's sample and A_S, A_S^T cut on every rank of a grid",
        description="Time the scalegnn-4d trainer's sampling kernel (draw the step's B vertices, cut A_S and "
        "A_S^T from each layer layout's shard) on every rank of each 3D grid, in one process or --processes "
        "copies at once (the ranks of an oversubscribed host sample at once). 'plexus-tune fit' turns the "
        "records into the profile's sampling entry (docs/model.md, ScaleGNN).",
    )
    sampling.add_argument("--graph", required=True, metavar="GRAPH", help="graph file or synthetic spec, e.g. "
                          "rmat:nodes=16384,edges=131072,features=32,classes=8,seed=5")
    sampling.add_argument("--gpus", type=count(1), default=8, help="ranks of a group: every 3D grid of it (default 8)")
    sampling.add_argument("--batch-sizes", default="512,2048", metavar="B[,B...]",
                          help="vertices sampled per step (default 512,2048)")
    sampling.add_argument("--layers", type=count(1), default=3, help="GCN layers (at most 3 layouts; default 3)")
    sampling.add_argument("--repeats", type=count(1), default=5, help="timed steps per rank (default 5)")
    sampling.add_argument("--processes", type=count(1), default=1,
                          help="copies of the sweep run at once (default 1; the ranks per host of the runs to model)")
    sampling.add_argument("--out", required=True, metavar="FILE", help="JSON Lines log to append to")
    sampling.set_defaults(handler=run_sampling)


def run_sampling(args) -> int:
    batches = [parse_count(v.strip(), "--batch-sizes") for v in str(args.batch_sizes).split(",") if v.strip()]
    if not batches:
        raise UserError(f"--batch-sizes: expected vertex counts such as 512,2048, got {args.batch_sizes!r}")
    _positive(args.gpus, "--gpus")
    _positive(args.repeats, "--repeats")
    _positive(args.processes, "--processes")
    check_local_ranks(args.processes, where="this host (--processes)")
    check_layers(args.layers)
    check_log("--out", args.out, kinds=SAMPLING_LOG)
    graph = load_graph_source(args.graph)
    for b in batches:
        try:
            check_batch_size(b, graph.num_nodes)
        except UserError as exc:
            raise UserError(f"--batch-sizes: {exc}") from None
    grids = [tuple(int(g) for g in grid) for grid in enumerate_grids(args.gpus).tolist()]
    records = run_sampling_benchmark(args.out, args.graph, grids=grids, batches=batches, layers=args.layers,
                                     repeats=args.repeats, processes=args.processes)
    for rec in records:
        print(f"{rec['grid']:>7} B {rec['batch_size']:>6,} {rec['layouts']} layouts {rec['work_bytes'] / 1e6:8.2f} MB "
              f"{rec['time_ms']:8.2f} ms")
    print(f"{len(records)} records appended to {args.out}")
    return 0


def _register_collectives(sub) -> None:
    coll = sub.add_parser(
        "collectives",
        help="all-reduce, all-gather, reduce-scatter for every group shape of G ranks",
        description="Start G ranks (local processes, or on the nodes of --launcher/--cluster) and time "
        "all-reduce, all-gather and reduce-scatter for every (group size, stride) an axis of some grid "
        "of G has (contiguous and strided groups), over message sizes (full buffer) from 1 KiB to 64 MiB, "
        "on all groups of the shape at once and, across nodes, on one group alone (--modes). Median of "
        "--repeats calls after --warmup calls; algbw and busbw follow nccl-tests.",
    )
    coll.add_argument("--gpus", type=count(1), default=None, metavar="G", help="ranks to start (G; default: the ranks of --cluster)")
    coll.add_argument("--gpus-per-node", type=count(1), default=None, metavar="N", help="ranks per node, to record how many nodes a group spans "
                      "(default: the launcher's ranks per node, else G: one node)")
    coll.add_argument("--modes", default="auto", help="concurrent (all groups of a shape at once), alone (one group), both "
                      "comma-separated, or auto (default: both when the ranks span several nodes)")
    coll.add_argument("--sizes", default="1K:64M", help="message sizes: LOW:HIGH[:xFACTOR] (default 1K:64M, factor 4) or a list 4K,1M")
    coll.add_argument("--ops", default=",".join(ALL_OPS),
                      help="comma-separated ops (default: all_reduce, all_gather, reduce_scatter and the families' "
                           "broadcast and point_to_point)")
    coll.add_argument("--warmup", type=count(0), default=2, help="untimed calls per size (default 2)")
    coll.add_argument("--repeats", type=count(1), default=5, help="timed calls per size (default 5)")
    coll.add_argument("--comm-precision", default="fp32", metavar="LIST",
                      help="precisions to time, comma-separated (default fp32): fp32 is the backend's collective, the "
                      "others the trainer's reduced-precision scheme with its quantize steps (docs/comm-precision.md)")
    coll.add_argument("--cols", type=count(1), default=64, help="columns of the FP32 buffer a reduced precision encodes per row (default 64)")
    coll.add_argument("--backend", choices=("gloo", "nccl"), default=None, help="default: nccl with enough GPUs, else gloo")
    coll.add_argument("--timeout", type=real(above=0), default=1800.0, metavar="S", help="stop all ranks after S seconds (default 1800)")
    coll.add_argument("--out", required=True, metavar="FILE", help="JSON Lines log to append to")
    add_launcher_arguments(coll)
    coll.set_defaults(handler=run_collectives)


def _register_spmm(sub) -> None:
    spmm = sub.add_parser(
        "spmm",
        help="time SpMM (and GEMM) on synthetic shard shapes or a graph's real shards",
        description="--sweep: time torch.sparse.mm on random CSR shard shapes (nnz, rows, common, "
        "dense columns). --graph: on this one device, time the real shard SpMMs (forward A F, "
        "backward A^T dH) and GEMMs of every grid of --gpus and every layer.",
    )
    mode = spmm.add_mutually_exclusive_group(required=True)
    mode.add_argument("--sweep", action="store_true", help="random shard shapes")
    mode.add_argument("--graph", metavar="GRAPH", help="graph file or synthetic spec (e.g. rmat:nodes=16384,edges=262144,features=64,classes=8)")
    spmm.add_argument("--gpus", type=count(1), metavar="G", help="with --graph: time the shards of every grid of G")
    spmm.add_argument("--count", type=count(1), default=500, help="with --sweep: number of shapes (default 500)")
    spmm.add_argument("--max-rows", type=count(1), default=65536, help="with --sweep: largest rows/common (default 65536)")
    spmm.add_argument("--max-cols", type=count(1), default=256, help="with --sweep: largest dense columns (default 256)")
    spmm.add_argument("--max-nnz", type=count(1), default=4_000_000, help="with --sweep: largest nnz (default 4e6)")
    spmm.add_argument("--structure", choices=SWEEP_STRUCTURES, default="uniform",
                      help="with --sweep: sparsity structure of the operands: uniform random positions (default), zipf "
                      "(power-law column popularity, lognormal row lengths), rmat (R-MAT-like positions of random skew) "
                      "or mixed; every record holds its structure statistics (docs/records.md)")
    spmm.add_argument("--layers", type=count(1), default=3, help="with --graph: GCN layers (default 3)")
    spmm.add_argument("--hidden", type=count(1), default=128, help="with --graph: hidden width (default 128)")
    spmm.add_argument("--all-shards", action="store_true", help="with --graph: time every distinct shard, not only the largest")
    spmm.add_argument("--family-pieces", action="store_true",
                      help="with --graph: also time the local SpMM shapes that CAGNET's and SuperGCN's models price on "
                           "the graph at every configuration of G (block rows, stage chunks, SUMMA and partition "
                           "pieces; random operands of each shape, at most --count of them)")
    spmm.add_argument("--threads", type=count(1), default=1, help="torch CPU threads (default 1, as one rank of a local run)")
    spmm.add_argument("--repeats", type=count(1), default=5, help="timed samples (of >= 2 ms) per shape and pass; the minimum is kept (default 5)")
    spmm.add_argument("--passes", type=count(1), default=1, help="with --sweep: interleaved passes over all shapes, each in a fresh random order (default 1; 10 or more on a host whose speed drifts)")
    spmm.add_argument("--statistic", choices=("min", "median"), default="min", help="with --sweep: a shape's time_ms over its passes (both are recorded; default min)")
    spmm.add_argument("--seed", type=count(0), default=0, help="random seed (shapes, matrices, permutation)")
    spmm.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]: on a GPU the operands are built on the device "
                      "and each call is timed with CUDA events (min and median of >= 10 samples after 2 warm-ups)")
    spmm.add_argument("--out", required=True, metavar="FILE", help="JSON Lines log to append to")
    spmm.set_defaults(handler=run_spmm)


def _register_bandwidth(sub) -> None:
    bandwidth = sub.add_parser(
        "bandwidth",
        help="elementwise passes, the optimizer step and a synchronisation: the epoch's other part",
        description="Time the memory-bound steps of an epoch on one device: copy, bias add, ReLU forward and "
        "backward, one step of each AdamW form over one parameter, and a device synchronisation; each record "
        "has the bytes the step must move. 'plexus-tune fit --bandwidth' turns them into elementwise_gbps, "
        "optimizer_gbps and sync_us (docs/model.md, Other).",
    )
    bandwidth.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N] (CUDA events)")
    bandwidth.add_argument("--sizes", default="1M,64M", help="elements per array, comma-separated (default 1M,64M; "
                           "the largest gives the profile's rates)")
    bandwidth.add_argument("--optimizers", default=",".join(OPTIMIZER_ACCESSES), help="AdamW forms to step (default all)")
    bandwidth.add_argument("--threads", type=count(1), default=1, help="torch CPU threads (default 1, as one rank)")
    bandwidth.add_argument("--out", required=True, metavar="FILE", help="JSON Lines log to append to")
    bandwidth.set_defaults(handler=run_bandwidth)


def _register_quant(sub) -> None:
    quant = sub.add_parser(
        "quant",
        help="quantize/dequantize and 16-bit casts of the communication precisions",
        description="Time the encode (cast, or per-row stochastic quantization and packing) and decode of "
        "FP32 tensors at each reduced communication precision on one process; 'plexus-tune fit' turns "
        "them into the profile's quant rates (docs/comm-precision.md).",
    )
    quant.add_argument("--precisions", default="bf16,fp16,int8,int4,int2", help="precisions to time (default all but fp32)")
    quant.add_argument("--rows", default="4096,16384", help="tensor rows (default 4096,16384)")
    quant.add_argument("--cols", default="32,128", help="tensor columns (default 32,128)")
    quant.add_argument("--repeats", type=count(1), default=5, help="timed calls of each (default 5)")
    quant.add_argument("--threads", type=count(1), default=1, help="torch threads (default 1, as one rank)")
    quant.add_argument("--processes", type=count(1), default=1,
                       help="processes timing the codec at once, as the ranks sharing a host's cores do in training "
                       "(default 1); each record holds the median process's mean time per call")
    quant.add_argument("--out", required=True, metavar="FILE", help="JSON Lines log to append to")
    quant.set_defaults(handler=run_quant)


def _device(name: str):
    """The torch device of --device; one line and exit 2 when it is not there."""
    try:
        return resolve_device(name)
    except UserError as exc:
        raise UserError(f"--device: {exc}") from None


def run_bandwidth(args) -> int:
    sizes = [parse_count(v, "--sizes") for v in args.sizes.split(",") if v.strip()]
    if not sizes or min(sizes) < 1:
        raise UserError(f"--sizes: expected positive element counts such as 1M,64M, got {args.sizes!r}")
    optimizers = [o.strip() for o in args.optimizers.split(",") if o.strip()]
    for name in optimizers or [args.optimizers]:
        if name not in OPTIMIZER_ACCESSES:
            raise UserError(f"--optimizers: unknown optimizer {name!r}; choose from {', '.join(OPTIMIZER_ACCESSES)}")
    check_log("--out", args.out, kinds=BANDWIDTH_LOG)
    device = _device(args.device)
    _quiet_torch_warnings()
    progress = ProgressReporter(command="calibrate bandwidth")
    total = len(sizes) * (4 + len(optimizers)) + 1
    try:
        records = bandwidth_benchmark(device, sizes=sizes, optimizers=optimizers, threads=args.threads,
                                      progress=_counter(progress, "bandwidth", total))
    finally:
        progress.close()
    append_records(args.out, records)
    for r in records:
        what = r["op"] + (f" {r['optimizer']}" if r.get("optimizer") else "")
        if r["op"] == "sync":
            print(f"{what:<24} {r['time_ms'] * 1e3:10.2f} us")
        else:
            print(f"{what:<24} {r['elements']:>11,} elements {r['time_ms']:9.4f} ms {r['gbps']:9.1f} GB/s")
    print(f"{len(records)} records appended to {args.out}")
    return 0


def run_quant(args) -> int:
    try:
        precisions = [parse_precision(p) for p in args.precisions.split(",") if p.strip()]
    except UserError as exc:
        raise UserError(f"--precisions: {exc}") from None
    if "fp32" in precisions or not precisions:
        raise UserError("--precisions: give reduced precisions (bf16, fp16, int8, int4, int2); fp32 has no codec")
    sizes = {}
    for flag, text in (("--rows", args.rows), ("--cols", args.cols)):
        sizes[flag] = [parse_count(v, flag) for v in text.split(",") if v.strip()]
        if not sizes[flag] or min(sizes[flag]) < 1:
            raise UserError(f"{flag}: expected positive integers, got {text!r}")
    _positive(args.repeats, "--repeats")
    _positive(args.threads, "--threads")
    _positive(args.processes, "--processes")
    check_log("--out", args.out, kinds=QUANT_LOG)
    records = run_quant_benchmark(args.out, precisions=precisions, rows=sizes["--rows"], cols=sizes["--cols"],
                                  repeats=args.repeats, threads=args.threads, processes=args.processes)
    for rec in records:
        mb = rec["fp32_bytes"] / 1e6
        print(f"{rec['precision']:>5} {rec['rows']:>7} x {rec['cols']:<5} encode {rec['encode_ms']:8.3f} ms "
              f"({mb / rec['encode_ms']:.2f} GB/s), decode {rec['decode_ms']:8.3f} ms ({mb / rec['decode_ms']:.2f} GB/s)")
    print(f"{len(records)} records appended to {args.out}")
    return 0


def _positive(value, flag: str) -> int:
    if value is None or int(value) < 1:
        raise UserError(f"{flag} must be a positive integer, got {value!r}")
    return int(value)


def _quiet_torch_warnings() -> None:
    import warnings

    warnings.filterwarnings("ignore", message=".*[Ss]parse.*")
    warnings.filterwarnings("ignore", category=FutureWarning)


def _cluster_world(args):
    """G of --gpus, else the ranks of --cluster (None when neither says)."""
    if args.gpus is not None:
        return args.gpus
    if args.cluster:
        try:
            return parse_cluster(args.cluster).world_size
        except UserError as exc:
            raise UserError(f"--launcher/--cluster: {exc}") from None
    return None


def run_collectives(args) -> int:
    _quiet_torch_warnings()
    gpus = _cluster_world(args)
    if gpus is None:
        raise UserError("calibrate collectives needs --gpus G (or a --cluster that sets nodes and ranks_per_node)")
    gpus = _positive(gpus, "--gpus")
    if gpus < 2:
        raise UserError(f"--gpus must be at least 2 to time collectives, got {gpus}")
    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        raise UserError("GPUs per node must be at least 1", parameter="gpus_per_node")  # the library's check, before the header
    settings = _collective_settings(args)
    check_log("--out", args.out, kinds=COLLECTIVE_LOG)
    launcher = launcher_from_args(args, [gpus])
    if submits(launcher):
        raise UserError("calibrate runs its ranks as one job step inside a Slurm allocation: run it under salloc or "
                        "sbatch, e.g. salloc -N 2 --ntasks-per-node=4 plexus-tune calibrate collectives --launcher slurm ...")
    per_node = launcher.ranks_per_node_for(gpus)
    if args.gpus_per_node is not None and per_node is not None and args.gpus_per_node != per_node:
        raise UserError(f"--gpus-per-node {args.gpus_per_node} disagrees with the {per_node} ranks per node of "
                        "--launcher/--cluster; leave it out")
    console = make_console(stderr=True)
    shapes = collective_shapes(gpus)
    console.print(
        f"timing {len(settings['ops'])} collective(s) x {len(settings['sizes'])} sizes x {len(shapes)} group shapes "
        f"{', '.join(f'g={g}/p={p}' for g, p in shapes)} on {gpus} ranks ({launcher.name}) ..."
    )
    with launcher:
        records = calibrate_collectives(gpus, gpus_per_node=args.gpus_per_node, warmup=args.warmup,
                                        repeats=args.repeats, backend=args.backend, timeout_s=args.timeout,
                                        launcher=launcher, cols=args.cols, **settings)
    append_records(args.out, records)
    make_console().print(_collective_table(records, gpus, launcher.name))
    console.print(f"appended {len(records)} records to {args.out}")
    return 0


def _collective_settings(args) -> dict:
    """sizes, ops, precisions and modes of --sizes, --ops, --comm-precision and --modes, checked."""
    sizes = parse_sizes(args.sizes)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in ALL_OPS]
    if bad or not ops:
        raise UserError(f"--ops: unknown collective {(bad or [args.ops])[0]!r}; choose from {', '.join(ALL_OPS)}")
    _positive(args.repeats, "--repeats")
    _positive(args.cols, "--cols")
    try:
        precisions = parse_allowed(args.comm_precision)
    except UserError as exc:
        raise UserError(f"--comm-precision: {exc}") from None
    if args.backend:
        for precision in precisions:
            check_backend(args.backend, precision)
        check_backend_devices(args.backend)
    if args.timeout <= 0:
        raise UserError(f"--timeout must be positive, got {args.timeout}")
    modes = None if args.modes.strip() == "auto" else [m.strip() for m in args.modes.split(",") if m.strip()]
    if modes is not None and (not modes or any(m not in COLLECTIVE_MODES for m in modes)):
        raise UserError(f"--modes must be auto or a comma-separated list of {', '.join(COLLECTIVE_MODES)}, got {args.modes!r}")
    return {"sizes": sizes, "ops": ops, "precisions": precisions, "modes": modes}


def _collective_table(records, gpus: int, launcher_name: str):
    """Median time and busbw of each (precision, op, group shape) at the smallest and largest message."""
    from rich.table import Table

    small, large = min(r["message_bytes"] for r in records), max(r["message_bytes"] for r in records)
    table = Table(title=f"collectives on {gpus} ranks ({records[0]['backend']}, {launcher_name}): median time and busbw "
                        f"at the smallest ({_size(small)}) and largest ({_size(large)}) message")
    for col in ("precision", "op", "group", "stride", "nodes", "groups", f"ms at {_size(small)}", f"ms at {_size(large)}",
                f"busbw GB/s at {_size(large)}"):
        table.add_column(col, justify="right" if col not in ("precision", "op") else "left", no_wrap=True)
    keyed = {}
    for r in records:
        keyed.setdefault((r["comm_precision"], r["op"], r["group_size"], r["stride"], r["groups"]), []).append(r)
    for (precision, op, g, p, groups), rows in keyed.items():
        rows.sort(key=lambda r: r["message_bytes"])
        table.add_row(precision, op, str(g), str(p), str(rows[-1]["nodes_spanned"]), str(groups), f"{rows[0]['time_ms']:.3f}",
                      f"{rows[-1]['time_ms']:.2f}", f"{rows[-1]['busbw_gbps']:.3f}")
    return table


def _size(nbytes: int) -> str:
    """A message size as the --sizes option writes it (1K, 64M)."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes} B"


def _counter(reporter, stage: str, total: int):
    """A no-argument ``advance()`` that reports ``stage`` done/total to ``reporter``."""
    done = [0]

    def advance():
        done[0] += 1
        reporter(stage, done[0], total)

    return advance


def run_spmm(args) -> int:
    _quiet_torch_warnings()
    repeats = _positive(args.repeats, "--repeats")
    threads = _positive(args.threads, "--threads")
    if args.sweep:
        settings = {"count": _positive(args.count, "--count"), "passes": _positive(args.passes, "--passes"),
                    **{flag: _positive(value, flag) for flag, value in
                       (("--max-rows", args.max_rows), ("--max-cols", args.max_cols), ("--max-nnz", args.max_nnz))}}
    else:
        if args.gpus is None:
            raise UserError("calibrate spmm --graph needs --gpus G (the grids to time)")
        settings = {"gpus": _positive(args.gpus, "--gpus"), "layers": check_layers(_positive(args.layers, "--layers")),
                    "hidden": _positive(args.hidden, "--hidden")}
    if args.structure != "uniform" and not args.sweep:
        raise UserError("--structure shapes the sweep; a graph's shards have the graph's own structure: leave it out with --graph")
    if args.all_shards and args.device.strip().lower() != "cpu":
        raise UserError("--all-shards is timed on the CPU only; leave it out with --device cuda")
    if args.family_pieces and (args.sweep or args.device.strip().lower() != "cpu"):
        raise UserError("--family-pieces times a graph's pieces on the CPU: give it with --graph, without --device cuda")
    if args.family_pieces:
        settings["pieces"] = _positive(args.count, "--count")
    check_log("--out", args.out, kinds=SPMM_LOG, inputs=[args.graph])
    device = _device(args.device)
    configure_compute_process(threads)
    env = environment_info()
    progress = ProgressReporter(command="calibrate spmm")
    try:
        timed = _spmm_sweep if args.sweep else _graph_shards
        records = timed(args, device, repeats, progress, **settings)
    finally:
        progress.close()
    for r in records:
        r["machine_info"] = {**env, **r.get("machine_info", {})}
    append_records(args.out, records)
    spmm = [r for r in records if record_type(r) == "spmm"]
    gemm = len(records) - len(spmm)
    total = sum(r["time_ms"] for r in spmm)
    make_console().print(f"appended {len(spmm)} SpMM and {gemm} GEMM records to {args.out} (SpMM time {total:.1f} ms in all)")
    return 0


def _spmm_sweep(args, device, repeats, progress, *, count, passes, **limits) -> list[dict]:
    """The records of --sweep: random shard shapes, on the CPU or the device."""
    shapes = sweep_shapes(count, seed=args.seed, rows=(min(256, args.max_rows), limits["--max-rows"]),
                          common=(min(256, args.max_rows), args.max_rows), dense_cols=(1, limits["--max-cols"]),
                          max_nnz=limits["--max-nnz"], structure=args.structure)
    what = f"SpMM sweep of {len(shapes)} shapes"
    if device.type != "cpu":
        return device_spmm_sweep(shapes, device, seed=args.seed, min_samples=max(10, repeats),
                                 progress=_counter(progress, what, len(shapes)))
    return spmm_sweep(shapes, seed=args.seed, repeats=repeats, passes=passes, statistic=args.statistic,
                      progress=_counter(progress, what, len(shapes) * passes))


def _graph_shards(args, device, repeats, progress, *, gpus, layers, hidden, pieces=0) -> list[dict]:
    """The records of --graph: the shards of every grid of G and every layer, on the CPU or the device;
    with ``pieces``, up to that many of the other families' piece shapes after them."""
    graph = load_graph_source(args.graph)
    widths = model_widths(graph.num_features, graph.num_classes, layers, hidden)
    grids = enumerate_grids(gpus)
    counter = _counter(progress, f"shards of {len(grids)} grids x {layers} layers", len(grids) * layers)
    if device.type != "cpu":
        return device_graph_shards(graph.normalized_adjacency(), widths, gpus, device, grids=grids, seed=args.seed,
                                   graph_name=graph.name, min_samples=max(10, repeats), progress=counter)
    records = calibrate_graph_shards(graph.normalized_adjacency(), widths, gpus, grids=grids, seed=args.seed,
                                     repeats=repeats, all_shards=args.all_shards, graph_name=graph.name, progress=counter)
    if pieces:
        records += family_pieces(graph, widths, gpus, limit=pieces, seed=args.seed, repeats=repeats,
                                 progress=lambda total: _counter(progress, f"{total} family piece shapes", total))
    return records
