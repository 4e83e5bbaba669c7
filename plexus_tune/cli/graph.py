"""``plexus-tune graph``: generate, convert, inspect and shard graphs."""

from __future__ import annotations

from plexus_tune.cli.options import count
from plexus_tune.cli.output import make_console

import argparse
import contextlib

from plexus_tune.errors import UserError
from plexus_tune.graph import (
    GENERATORS,
    PERMUTE_MODES,
    generate,
    load_graph,
    parse_blocks,
    save_graph,
    synthetic,
    write_shards,
)
from plexus_tune.graph.atomic import check_output_path
from plexus_tune.graph.cache import PERMUTATIONS_DIRNAME, cache_listing, cache_root, permutation_listing
from plexus_tune.graph.stats import graph_statistics, shard_statistics
from plexus_tune.graph.generators import parse_spec
from plexus_tune.graph.io import save_format_for

GENERATOR_KINDS = ("rmat", "grid2d")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "graph",
        help="generate, convert, inspect and shard graphs",
        description="Graph data for training and calibration: synthetic graphs, format conversion, "
        "statistics with the 2D load-balance report, and offline 2D shard files.",
    )
    sub = parser.add_subparsers(dest="graph_command", metavar="ACTION", parser_class=type(parser))
    sub.required = True

    _register_generate(sub)

    _register_convert(sub)

    _register_stats(sub)

    _register_cache(sub)

    _register_shard(sub)


def _register_generate(sub) -> None:
    gen = sub.add_parser(
        "generate",
        help="make a seeded synthetic graph (R-MAT or road-like 2D lattice)",
        description="rmat: Graph500 R-MAT (a=.57 b=.19 c=.19 d=.05), EDGES distinct undirected edges, "
        "vertex ids scrambled. grid2d: nodes on a sqrt(N)-wide lattice in row-major order, 10% of "
        "lattice edges dropped and 1% random long edges added (a locality-heavy, road-like graph). "
        "Features are standard normal, labels are equal-frequency classes of node degree. "
        "The output format follows OUT's suffix (a directory name gives the own memory-mapped format).",
    )
    gen.add_argument("kind", choices=GENERATOR_KINDS, metavar="KIND", help="rmat or grid2d")
    gen.add_argument("--nodes", required=True, help="node count (4096, 1e6, 1M)")
    gen.add_argument("--edges", default=None, help="rmat: undirected edges (default 16 x nodes)")
    gen.add_argument("--features", default="128", help="feature width (default 128)")
    gen.add_argument("--classes", default="32", help="label classes (default 32)")
    gen.add_argument("--seed", type=count(0), default=0, help="random seed (default 0)")
    gen.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                     help="generator option: rmat a,b,c,d,noise,scramble; grid2d neighbors,drop,long (repeatable)")
    gen.add_argument("--out", required=True, metavar="PATH", help="output path (directory, .npz, .mtx, .txt, .csv, .pt)")
    gen.add_argument("--force", action="store_true", help="replace OUT if it exists")
    gen.set_defaults(handler=run_generate)


def _register_convert(sub) -> None:
    conv = sub.add_parser(
        "convert",
        help="convert a graph between formats",
        description="Read IN (plexus directory, OGB directory, .npz, .mtx, .txt/.csv edge list, .pt PyG Data) "
        "and write OUT in the format of its suffix. Edge lists and OGB edges are undirected unless "
        "--directed. Formats without features/labels get random features and degree labels.",
    )
    conv.add_argument("input", metavar="IN", help="graph to read (any format above)")
    conv.add_argument("output", metavar="OUT", help="path to write; its suffix chooses the format (a directory name: the own format)")
    _add_load_options(conv)
    conv.add_argument("--force", action="store_true", help="replace OUT if it exists")
    conv.set_defaults(handler=run_convert)


def _register_stats(sub) -> None:
    stats = sub.add_parser(
        "stats",
        help="sizes, degrees and the 2D load-balance report (max/mean nonzeros per block)",
        description="Statistics of a graph (file, directory or synthetic spec such as grid2d:nodes=65536) "
        "and max/mean nonzeros of A+I over an R x C block grid after no, one (single) or two (double) "
        "random permutations, or the double one kept in node order inside each block (local). On a shard directory: the per-block nonzeros of a target grid that "
        "divides the file grid.",
    )
    stats.add_argument("path", metavar="PATH", help="graph path, synthetic spec, or shard directory")
    stats.add_argument("--blocks", default="8x8", help="block grid RxC (default 8x8)")
    stats.add_argument("--permute", choices=PERMUTE_MODES + ("all",), default="all",
                       help="permutation(s) to report (default all)")
    stats.add_argument("--seed", type=count(0), default=0, help="permutation seed (default 0)")
    stats.add_argument("--format", choices=("table", "json"), default="table", help="output format")
    _add_load_options(stats)
    stats.set_defaults(handler=run_stats)


def _register_cache(sub) -> None:
    cache = sub.add_parser(
        "cache",
        help="list (or clear) the structure cache: shard statistics kept per graph for predict --graph",
        description="The structure cache holds, per graph (keyed by the hash of its adjacency pattern), its "
        "normalized nonzeros and the largest shard of every split predict --graph has read, per permutation. "
        "Lists each graph's entries; --clear removes them all.",
    )
    cache.add_argument("--clear", action="store_true", help="remove every entry")
    cache.add_argument("--format", choices=("table", "json"), default="table", help="output format")
    cache.set_defaults(handler=run_cache)


def _register_shard(sub) -> None:
    shard = sub.add_parser(
        "shard",
        help="write 2D shard files of the permuted normalized adjacency",
        description="Normalize (D^-1/2 (A+I) D^-1/2), permute (double by default) and cut the adjacency "
        "into R x C block files plus manifest.json (sizes, permutation, nnz and sha256 per block), "
        "the permutations and the node data. A rank of any grid whose sizes divide R and C reads only "
        "the files covering its block (plexus_tune.graph.load_shard).",
    )
    shard.add_argument("path", metavar="PATH", help="graph path or synthetic spec")
    shard.add_argument("--blocks", default="8x8", help="file grid RxC (default 8x8)")
    shard.add_argument("--out", required=True, metavar="DIR", help="output directory (must not exist)")
    shard.add_argument("--permute", choices=PERMUTE_MODES, default="double",
                       help="permutation (default double)")
    shard.add_argument("--seed", type=count(0), default=0, help="permutation seed (default 0)")
    shard.add_argument("--no-node-data", action="store_true", help="do not copy features and labels")
    shard.add_argument("--force", action="store_true", help="replace DIR if it exists")
    _add_load_options(shard)
    shard.set_defaults(handler=run_shard)


def _add_load_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("reading formats without features or labels")
    group.add_argument("--directed", action="store_true", help="keep edge-list/OGB edges one-way (src -> dst)")
    group.add_argument("--make-features", type=count(1), default=None, metavar="W",
                       help="width of random features when the input has none (default 128)")
    group.add_argument("--make-classes", type=count(1), default=None, metavar="C",
                       help="degree-label classes when the input has no labels (default 32)")


@contextlib.contextmanager
def _progress(description: str):
    """A rich progress bar on stderr; yields ``update(done, total)``."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task(description, total=None)

        def update(done, total):
            bar.update(task, completed=done, total=total)

        yield update


def _open_graph(text: str, args):
    import os

    if os.path.exists(text):
        return load_graph(text, directed=args.directed, features=args.make_features, classes=args.make_classes)
    kind = text.split(":", 1)[0].lower()
    if ":" in text and kind in GENERATORS:
        with _progress(f"generating {kind}") as update:
            return synthetic(text, progress=update)
    raise UserError(f"no such file or directory: {text} (nor a synthetic spec such as grid2d:nodes=65536)")


def run_generate(args) -> int:
    save_format_for(args.out)
    check_output_path(args.out, args.force)
    spec = [f"nodes={args.nodes}", f"features={args.features}", f"classes={args.classes}", f"seed={args.seed}"]
    if args.edges is not None:
        if args.kind != "rmat":
            raise UserError("--edges applies to rmat only; grid2d's edges follow from its lattice")
        spec.append(f"edges={args.edges}")
    for item in args.param:
        if "=" not in item:
            raise UserError(f"--param {item!r}: expected KEY=VALUE")
        spec.append(item)
    kind, params = parse_spec(f"{args.kind}:{','.join(spec)}")
    with _progress(f"generating {kind}") as update:
        graph = generate(kind, progress=update, **params)
    fmt = save_graph(graph, args.out, overwrite=args.force)
    print(f"wrote {args.out} ({fmt}): {graph.name}, {graph.num_nodes} nodes, {graph.num_edges} edges, "
          f"{graph.nnz} nonzeros (+{graph.num_nodes} self-loops when normalized), "
          f"{graph.num_features} features, {graph.num_classes} classes")
    return 0


def run_convert(args) -> int:
    import os

    fmt = save_format_for(args.output)
    if os.path.abspath(args.input) == os.path.abspath(args.output):
        raise UserError("IN and OUT are the same path; choose another output")
    check_output_path(args.output, args.force, inputs=[args.input])
    graph = load_graph(args.input, directed=args.directed, features=args.make_features, classes=args.make_classes)
    with _progress("writing"):
        save_graph(graph, args.output, overwrite=args.force)
    dropped = " (features and labels are not stored in this format)" if fmt in ("mtx", "edgelist") else ""
    print(f"wrote {args.output} ({fmt}): {graph.num_nodes} nodes, {graph.nnz} nonzeros{dropped}")
    return 0


def run_cache(args) -> int:
    import json
    import shutil

    root = cache_root()
    listing = cache_listing(root)
    permutations = permutation_listing(root)
    if args.clear:
        for entry in listing:
            shutil.rmtree(root / entry["key"], ignore_errors=True)
        shutil.rmtree(root / PERMUTATIONS_DIRNAME, ignore_errors=True)
        (root / "hashes.json").unlink(missing_ok=True)
        print(f"removed {len(listing)} cached graph(s) and {len(permutations)} stored permutation(s) from {root}")
        return 0
    if args.format == "json":
        print(json.dumps({"root": str(root), "graphs": listing, "permutations": permutations}, indent=1))
        return 0
    print(f"structure cache {root}: {len(listing)} graph(s)")
    if permutations:
        print(f"stored permutations (sampled estimates read them): {len(permutations)} file(s), "
              f"{sum(p['bytes'] for p in permutations):,} bytes")
    for entry in listing:
        nodes = f"{entry['nodes']:,}" if isinstance(entry["nodes"], int) else "?"
        nnz = f"{entry['nnz']:,}" if isinstance(entry["nnz"], int) else "?"
        splits = ", ".join(f"{name} ({'corrupt' if n is None else f'{n} splits'})" for name, n in entry["entries"].items())
        print(f"{entry['key']}  {entry['name'] or '?'}: N={nodes} NNZ={nnz}, {entry['bytes']:,} bytes; {splits or 'no splits'}")
    return 0


def run_stats(args) -> int:
    import json
    import os

    blocks = parse_blocks(args.blocks)
    if os.path.isdir(args.path) and os.path.isfile(os.path.join(args.path, "manifest.json")):
        stats = shard_statistics(args.path, blocks)
        if args.format == "json":
            print(json.dumps(stats, indent=1))
            return 0
        _print_shard_table(stats)
        return 0
    graph = _open_graph(args.path, args)
    modes = PERMUTE_MODES if args.permute == "all" else (args.permute,)
    with _progress("balance report"):
        stats = graph_statistics(graph, blocks, modes, args.seed)
    if args.format == "json":
        print(json.dumps(stats, indent=1))
        return 0
    _print_graph_table(stats)
    return 0


def _print_graph_table(stats: dict) -> None:
    from rich.table import Table

    table = Table(title=f"{stats['name']}", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    for key in ("nodes", "edges", "nnz", "nnz_normalized", "features", "classes", "symmetric",
                "degree_min", "degree_mean", "degree_max", "isolated_nodes"):
        value = stats[key]
        table.add_row(key, f"{value:.2f}" if isinstance(value, float) else str(value))
    balance = Table(title=f"nonzeros of A+I per block, {stats['blocks'][0]}x{stats['blocks'][1]} grid")
    for col in ("permutation", "max/mean", "max", "mean", "min"):
        balance.add_column(col, justify="right")
    for mode, rep in stats["balance"].items():
        balance.add_row(mode, f"{rep['max_over_mean']:.3f}", str(rep["max_nnz"]), f"{rep['mean_nnz']:.1f}",
                        str(rep["min_nnz"]))
    console = make_console()
    console.print(table)
    console.print(balance)


def _print_shard_table(stats: dict) -> None:
    from rich.table import Table

    table = Table(title=f"shards of {stats['name']}", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    perm = stats["permutation"]
    rows = [("nodes (padded)", f"{stats['nodes']} ({stats['nodes_padded']})"),
            ("nonzeros (normalized)", str(stats["nnz_normalized"])),
            ("file grid", "x".join(map(str, stats["file_blocks"]))),
            ("permutation", f"{perm['mode']}, seed {perm['seed']}"),
            ("rank grid", "x".join(map(str, stats["blocks"]))),
            ("rank block shape", "x".join(map(str, stats["block_shape"]))),
            ("max/mean nnz per rank block", f"{stats['max_over_mean']:.3f}")]
    for key, value in rows:
        table.add_row(key, value)
    make_console().print(table)


def run_shard(args) -> int:
    blocks = parse_blocks(args.blocks)
    check_output_path(args.out, args.force, inputs=[args.path])
    graph = _open_graph(args.path, args)
    with _progress(f"writing {blocks[0]}x{blocks[1]} shards") as update:
        manifest = write_shards(graph, args.out, blocks, mode=args.permute, seed=args.seed,
                                include_node_data=not args.no_node_data, overwrite=args.force, progress=update)
    counts = [n for row in manifest["block_nnz"] for n in row]
    mean = sum(counts) / len(counts)
    ratio = max(counts) / mean if mean else float("nan")
    print(f"wrote {args.out}: {len(counts)} blocks of {manifest['block_rows']}x{manifest['block_cols']} "
          f"(N={manifest['num_nodes']} padded to {manifest['num_nodes_padded']}), {manifest['nnz']} nonzeros, "
          f"{args.permute} permutation seed {args.seed}, max/mean nnz per block {ratio:.3f}")
    return 0
