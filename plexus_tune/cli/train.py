"""``plexus-tune train``: run a bundled parallel GCN trainer on one configuration."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import numpy as np

from plexus_tune.cli.options import count, real
from plexus_tune.allocator import configure_compute_process
from plexus_tune.cli.launching import add_launcher_arguments, launcher_from_args
from plexus_tune.cli.output import check_log
from plexus_tune.measure.store import RUN_LOG
from plexus_tune.measure.campaign import check_graph, load_graph_source
from plexus_tune.graph.sampling import check_batch_size
from plexus_tune.model.comm_precision import CommPrecision, check_backend, parse_comm_precision
from plexus_tune.errors import UserError
from plexus_tune.graph.generators import EXAMPLE_SPEC, parse_spec
from plexus_tune.trainer.reference import check_verdict
from plexus_tune.launch import detect_environment
from plexus_tune.model.breakdown import BREAKDOWN_KEYS, EPOCH_PARTS, FAMILY_COMM_OP_KEYS
from plexus_tune.model.grid import parse_grid
from plexus_tune.trainer import TrainConfig
from plexus_tune.measure.identity import RunSpec
from plexus_tune.measure.training import TrainingFailed, run_training
from plexus_tune.trainer.algorithms import (
    AGGREGATION_MODES,
    TRAINED_ALGORITHMS,
    check_algorithm,
    family_of,
    normalize_config,
    process_grid,
)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a GCN with a bundled parallel trainer (Plexus 3D grid, CAGNET, partitioned) and log the run",
        description=(
            "Train a GCN with a bundled parallel trainer: the 3D-parallel (Plexus) grid by default, CAGNET's "
            "1D, 1.5D and 2D algorithms or the partitioned (SuperGCN) one with --algorithm. Run by hand it starts one "
            "local process per grid rank; under torchrun or srun it joins their process set. "
            "Prints the epoch time, its breakdown and the losses; --log appends one JSON record."
        ),
    )
    _add_source_arguments(parser)
    _add_training_arguments(parser)
    parser.add_argument("--threads", type=count(1), metavar="N", help="CPU threads per rank (default cores // ranks)")
    parser.add_argument("--timeout", type=real(above=0), default=1800.0, metavar="S",
                        help="stop the whole run after S seconds (default 1800)")
    parser.add_argument("--machine", help="machine name for the log (default: host name)")
    parser.add_argument("--log", "--run-log", dest="log", metavar="FILE",
                        help="append the run record (JSON Lines) to FILE (--run-log: the same, for torchrun command lines)")
    parser.add_argument("--check", action="store_true",
                        help="also train serially with PyTorch Geometric and report the largest relative differences")
    parser.add_argument("--json", action="store_true", help="print the record as JSON instead of a summary")
    add_launcher_arguments(parser)
    parser.set_defaults(handler=run)


def _add_source_arguments(parser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--graph", metavar="PATH", help="graph file (any format 'plexus-tune graph' reads), or a directory of 2D shard files "
                             "(each rank reads only the files it needs; their permutation is used)")
    source.add_argument("--synthetic", metavar="SPEC",
                        help="generated graph, e.g. rmat:nodes=4096,edges=65536,features=32,classes=8,seed=0 "
                             f"(without --graph or --synthetic: the built-in example {EXAMPLE_SPEC})")
    parser.add_argument("--grid", metavar="GXxGYxGZ",
                        help="process grid, e.g. 2x2x2 (plexus-3d), PrxPcx1 (cagnet-2d); the other families "
                             "follow from --gpus")
    parser.add_argument("--gpus", type=count(1), help="number of ranks; must equal the grid's product")
    add_algorithm_arguments(parser)


def _add_training_arguments(parser) -> None:
    parser.add_argument("--layers", type=count(1), default=3, help="GCN layers (default 3)")
    parser.add_argument("--hidden", type=count(1), default=128, help="hidden width (default 128)")
    parser.add_argument("--epochs", type=count(1), default=10, help="epochs, warm-up included (default 10)")
    parser.add_argument("--warmup", type=count(0), default=2, help="epochs left out of the timing (default 2)")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="gloo (CPU) or nccl (CUDA)")
    parser.add_argument("--block-rows", type=count(1), metavar="N", help="aggregate in blocks of N rows, each with its own all-reduce")
    parser.add_argument("--overlap", action="store_true", help="overlap each block's all-reduce with the next block's SpMM")
    parser.add_argument("--permute", choices=("double", "single", "none", "local"), default="double",
                        help="node permutation for load balance (default double; local: the double one "
                             "kept in node order inside each block, the same balance with the gathers' locality)")
    parser.add_argument("--lr", type=real(above=0), default=0.01, help="AdamW learning rate (default 0.01)")
    parser.add_argument("--weight-decay", type=real(minimum=0), default=0.01, help="AdamW weight decay (default 0.01)")
    parser.add_argument("--seed", type=count(0), default=0, help="seed of the weights and permutations")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="floating-point type of the adjacency, features and weights, hence of the "
                             "communicated blocks (default float32)")
    add_comm_precision_argument(parser)
    parser.add_argument("--layer-norm", action="store_true",
                        help="LayerNorm (no scale and shift, FP32 statistics) on the input of every layer")
    add_features_argument(parser)


def add_features_argument(parser) -> None:
    """``--fixed-features``: the input features are fixed, not trained (train, measure, predict, search)."""
    parser.add_argument("--fixed-features", action="store_true",
                        help="keep the input features fixed (not trained): no layer-0 feature gradient, backward "
                             "SpMM or its collectives, no optimizer state for them (default: trained, as Plexus "
                             "trains)")


def add_algorithm_arguments(parser) -> None:
    """``--algorithm``, ``--replication`` and ``--aggregation`` (train, measure, run)."""
    parser.add_argument("--algorithm", default="plexus-3d", metavar="NAME",
                        help=f"parallel algorithm: {', '.join(TRAINED_ALGORITHMS)} (default plexus-3d; "
                             "docs/algorithms.md)")
    parser.add_argument("--replication", type=count(1), metavar="C",
                        help="cagnet-1.5d: replication factor c of the block rows (c divides G, c*c <= G)")
    parser.add_argument("--aggregation", metavar="MODE",
                        help=f"supergcn: aggregation of the cut edges, one of {', '.join(AGGREGATION_MODES)} "
                             "(default hybrid)")
    parser.add_argument("--dp", type=count(1), default=None, metavar="GD",
                        help="scalegnn-4d: data-parallel groups, each on --grid (Gd x Gx x Gy x Gz ranks; default 1)")
    parser.add_argument("--batch-size", type=count(2), metavar="B",
                        help="scalegnn-4d: vertices each group samples per step (an epoch is ceil(N / (B Gd)) steps)")
    parser.add_argument("--dropout", type=real(minimum=0), default=None, metavar="P",
                        help="scalegnn-4d: dropout rate after each layer's ReLU (default 0)")
    parser.add_argument("--no-rmsnorm", action="store_true", help="scalegnn-4d: leave out each layer's RMSNorm")
    parser.add_argument("--no-residual", action="store_true", help="scalegnn-4d: leave out each layer's residual")
    parser.add_argument("--prefetch", action=argparse.BooleanOptionalAction, default=None,
                        help="scalegnn-4d: draw step t + 1's sample on a background thread during step t (default "
                             "on); --no-prefetch draws it at the start of its step")


def family_train_options(args, algorithm: str) -> dict:
    """TrainConfig fields of the mini-batch family's flags (dp, batch_size, its components in
    ``extra``) for measure and run; {} for the other families (UserError if a flag is misused)."""
    if "batch_size" not in family_of(algorithm).options:
        if args.dp not in (None, 1) or args.batch_size is not None or args.dropout is not None or args.no_rmsnorm \
                or args.no_residual or args.prefetch is not None:
            raise UserError(f"--dp, --batch-size, --dropout, --no-rmsnorm, --no-residual and --prefetch are options of "
                            f"--algorithm scalegnn-4d, not of {algorithm}")
        return {}
    if args.batch_size is None:
        raise UserError(f"{algorithm} samples B vertices per step: give --batch-size")
    return {"dp": args.dp or 1, "batch_size": args.batch_size, "prefetch": args.prefetch is not False,
            "extra": {"minibatch": minibatch_options(args)}}


def minibatch_options(args) -> dict:
    """scalegnn-4d's switchable components from the flags (TrainConfig.extra["minibatch"])."""
    if args.dropout is not None and not args.dropout < 1:
        raise UserError(f"--dropout must be below 1, got {args.dropout}")
    return {"rmsnorm": not args.no_rmsnorm, "residual": not args.no_residual, "dropout": float(args.dropout or 0.0)}


def add_comm_precision_argument(parser) -> None:
    """``--comm-precision``: the precision of the 3D layer's collectives (train, measure, run)."""
    parser.add_argument("--comm-precision", default="fp32", metavar="P",
                        help="precision of the aggregation and combination all-reduces and the feature and weight "
                             "gathers: fp32 (default), bf16, fp16, int8, int4 or int2, or per class, e.g. "
                             "aggregation=int8,gather=bf16 (unnamed classes fp32); loss and norm statistics stay "
                             "FP32 (docs/comm-precision.md)")


def comm_precision_of(args: argparse.Namespace) -> CommPrecision:
    """``--comm-precision``, parsed once into the typed value the trainer, the records and the model take
    (UserError naming the flag if it is bad)."""
    try:
        return parse_comm_precision(args.comm_precision)
    except UserError as exc:
        raise UserError(f"--comm-precision: {exc}") from None


def _config(args: argparse.Namespace):
    algorithm = check_algorithm(args.algorithm)
    grid = process_grid(algorithm, grid=parse_grid(args.grid) if args.grid else None, gpus=args.gpus,
                        replication=args.replication)
    comm_precision = comm_precision_of(args)
    check_backend(args.backend, comm_precision)
    config = TrainConfig(
        grid=grid, graph=args.graph, synthetic=args.synthetic or (None if args.graph else EXAMPLE_SPEC), gpus=args.gpus,
        layers=args.layers,
        hidden=args.hidden, epochs=args.epochs, warmup=args.warmup, lr=args.lr, weight_decay=args.weight_decay,
        seed=args.seed, permute=args.permute, block_rows=args.block_rows, overlap=args.overlap,
        backend=args.backend, dtype=args.dtype, comm_precision=comm_precision, layer_norm=args.layer_norm,
        fixed_features=bool(getattr(args, "fixed_features", False)), check=args.check, log=args.log, machine=args.machine,
        timeout_s=args.timeout, threads_per_rank=args.threads, algorithm=algorithm, replication=args.replication,
        aggregation=args.aggregation, dp=args.dp or 1, batch_size=args.batch_size, prefetch=args.prefetch is not False,
    )
    if "batch_size" in family_of(algorithm).options:  # the mini-batch family's switchable components
        config.extra["minibatch"] = minibatch_options(args)
    elif args.dropout is not None or args.no_rmsnorm or args.no_residual or args.prefetch is not None:
        raise UserError(f"--dropout, --no-rmsnorm, --no-residual and --prefetch are options of --algorithm "
                        f"scalegnn-4d, not of {algorithm}")
    return normalize_config(config)


def _mib(value: float) -> str:
    return f"{value / 2**20:.1f} MiB"


def _algorithm_text(record: dict) -> str:
    """The algorithm and its family option, e.g. ``cagnet-1.5d (c = 2)`` or ``supergcn (hybrid)``."""
    options = record.get("options") or {}
    text = record.get("algorithm", "plexus-3d")
    if (options.get("dp") or 1) > 1 or options.get("batch_size"):
        text += f" (Gd = {options.get('dp') or 1}, B = {options.get('batch_size')})"
    if options.get("replication"):
        text += f" (c = {options['replication']})"
    if options.get("aggregation"):
        text += f" ({options['aggregation']})"
    return text


def breakdown_lines(record: dict, keys) -> list[str]:
    """The epoch's partition (docs/records.md, Observed breakdown: the critical rank's local phases,
    the collective time no rank avoided, and the wait), which adds up to the epoch; then each
    phase's maximum over ranks, labelled as maxima (they overlap, so they add up to more)."""
    lines = []
    parts = record.get("breakdown_ms")
    if parts:
        names = [k for k in EPOCH_PARTS if k in parts] + ["wait_ms"]
        total = sum(parts[k] for k in names)
        lines.append("breakdown of the epoch (ms; adds up): " + " + ".join(f"{k[:-3]} {parts[k]:.2f}" for k in names)
                     + f" = {total:.2f}")
    lines.append("largest per rank (ms; maxima of different ranks, they do not add up): "
                 + ", ".join(f"{k[:-3]} {record[k]:.2f}" for k in keys))
    return lines


def summary_lines(record: dict) -> list[str]:
    keys = [k for k in BREAKDOWN_KEYS if k not in FAMILY_COMM_OP_KEYS or record.get(k)]
    lines = [
        f"graph {record['graph']}: {record['graph_nodes']:,} nodes, {record['nnz']:,} nonzeros (self-loops included), "
        f"widths {record['widths']}",
        f"{_algorithm_text(record)} grid {record['grid']} ({record['gpus']} ranks, {record['backend']}, "
        f"{record['device']}), "
        f"permute {record['options']['permute']}, block rows {record['options']['block_rows']}, "
        f"overlap {record['options']['overlap']}, communication {record.get('comm_precision', 'fp32')}, "
        f"features {'fixed' if record['options'].get('fixed_features') else 'trained'}",
        f"epoch {record['epoch_ms']:.2f} ms +- {record['epoch_ms_std']:.2f} (the slowest rank's, mean of epochs "
        f"{record['warmup'] + 1}..{record['epochs']}; the per-epoch lines are rank 0's), "
        f"imbalance {record['imbalance']['epoch_ms']:.3f} (slowest / mean rank)",
        *breakdown_lines(record, keys),
        f"loss {record['losses'][0]:.6f} -> {record['losses'][-1]:.6f}",
        *(["bytes sent per epoch (all ranks): " + ", ".join(f"{k} {v:,}" for k, v in record["comm_bytes"].items())]
          if record.get("comm_bytes") else []),
        f"peak memory per rank {_mib(record['peak_memory_bytes'])} ({record['memory_source']}), "
        f"peak RSS {_mib(max(record['peak_rss_bytes_per_rank']))}",
    ]
    final = record.get("final_accuracy")
    if final:
        lines.append(f"accuracy after the last epoch ({record.get('split')}): "
                     + ", ".join(f"{k} {v:.4f}" for k, v in final.items()))
    if "check_loss_rel_diff" in record:
        lines += _check_lines(record, final)
    return lines


def _check_lines(record: dict, final) -> list[str]:
    """The lines of --check: the trainer against serial PyG."""
    lines = []
    ref = record.get("reference_accuracy") or {}
    verdict = check_result(record)
    if verdict is not None:
        grad = record.get("check_grad_rel_diff")
        if grad is not None:
            lines.append(f"one step against serial PyG on the same samples: gradients after the data-parallel "
                         f"average differ by {grad:.2e} (normwise, largest over the parameters)")
        lines.append(f"check against serial PyG ({verdict['dtype']} on {verdict['device_kind']}): max relative "
                     f"difference of losses {record['check_loss_rel_diff']:.2e} (tolerance {verdict['loss_tolerance']:.0e}), "
                     f"of outputs {record['check_output_rel_diff']:.2e} (normwise, tolerance {verdict['output_tolerance']:.0e}): "
                     f"{'PASSED' if verdict['passed'] else 'FAILED'}"
                     + (f"; PyG epoch {record['reference_epoch_ms']:.2f} ms" if record.get("reference_epoch_ms") else ""))
    else:
        lines.append(f"{record['comm_precision']} against serial PyG at FP32 (not expected to agree to rounding, so no "
                     f"pass/fail: compare the accuracies): losses differ by up to {record['check_loss_rel_diff']:.2e}, "
                     f"outputs by {record['check_output_rel_diff']:.2e}")
    if ref and final:
        lines.append("accuracy against serial PyG: " + ", ".join(
            f"{k} {final[k]:.4f} vs {ref[k]:.4f} ({final[k] - ref[k]:+.4f})" for k in ref if k in final))
    return lines


def check_result(record: dict) -> dict | None:
    """The pass/fail of a run's ``--check`` (:func:`plexus_tune.trainer.reference.check_verdict`); None
    without a check or at a reduced communication precision (not expected to agree to rounding)."""
    if "check_loss_rel_diff" not in record or record.get("comm_precision", "fp32") != "fp32":
        return None
    dtype = record.get("dtype") or (record.get("options") or {}).get("dtype") or "float32"
    output = max(record["check_output_rel_diff"], record.get("check_grad_rel_diff") or 0.0)
    return check_verdict(record["check_loss_rel_diff"], output, dtype=dtype,
                         device=record.get("device", "cpu"))


def check_batch_flag(batch: int, nodes: int) -> None:
    try:
        check_batch_size(batch, nodes)
    except UserError as exc:
        raise UserError(f"--batch-size: {exc}") from None


def run(args: argparse.Namespace) -> int:
    config = _config(args)
    if config.check:
        configure_compute_process()  # the serial reference runs in this process, as the ranks do

    environment = detect_environment()
    if args.log:
        check_log("--log", args.log, kinds=RUN_LOG, inputs=[args.graph])
    launcher = _launcher(args, config) if environment is None else None
    try:
        with launcher or contextlib.nullcontext():  # the run's spec, built once (its family's settings are config's)
            spec = RunSpec.from_config(config, normalized=True, launcher=launcher)
            record = run_training(config, launcher=launcher, spec=spec)
    except TrainingFailed as exc:
        print(f"plexus-tune: error: {exc}", file=sys.stderr)
        if args.log:
            print(f"plexus-tune: the failed run was appended to {args.log}", file=sys.stderr)
        return 1
    if record is None:  # a non-zero rank under torchrun/srun
        return 0
    return _report(args, record)


def _launcher(args, config):
    """Started by hand (no torchrun or srun around it): the launcher, the graph checked once here."""
    if config.synthetic:  # a bad or too large spec fails here, not in every rank
        parse_spec(config.synthetic)
        if not args.synthetic:
            print(f"plexus-tune train: no --graph or --synthetic given: training on the built-in example {config.synthetic}",
                  file=sys.stderr)
    launcher = launcher_from_args(args, [config.world_size])
    if args.graph and os.path.exists(args.graph):  # read once here: a truncated or corrupt file fails before any rank starts
        if config.batch_size is not None:
            check_batch_flag(config.batch_size, load_graph_source(args.graph).num_nodes)
        else:
            check_graph(args.graph)
    elif config.batch_size is not None:
        check_batch_flag(config.batch_size, int(parse_spec(config.synthetic)[1]["nodes"]))
    config.extra["progress"] = True
    return launcher


def _report(args, record) -> int:
    import json

    verdict = check_result(record)
    if args.json:
        print(json.dumps({**record, **({"check": verdict} if verdict else {})}, default=str))
    else:
        for line in summary_lines(record):
            print(line)
        if args.log:
            print(f"record appended to {args.log}")
    if verdict is not None and not verdict["passed"]:
        print("plexus-tune: error: the check against serial PyG failed: the trainer and the reference differ beyond "
              "the tolerance of this dtype and device (docs/trainer.md)", file=sys.stderr)
        return 1
    return 0
