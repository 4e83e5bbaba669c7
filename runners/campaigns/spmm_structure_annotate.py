"""Give SpMM records the full sparsity structure of their operands (docs/records.md, structure).

The structure-boosted SpMM model reads each operand's column popularity curve
(``structure.column_share``). Records timed before the curve was recorded get it here:

  shards  records of graph shards (``source: graph``, with gx, gy, gz, layer, direction):
          the graph is generated (or loaded) again, permuted as the records say
          (--permute, --seed), and each record's structure becomes that of the operand it
          timed: the layer's largest shard for ``forward``, its transpose for ``backward``.
          A record whose nonzeros differ from the recomputed shard's is refused: the
          graph is not the one that was timed.
  sweep   structured sweep records (``structure.zipf_s`` and ``structure.row_sigma``):
          the curve is the one of column counts drawn as the sweep drew them (a power law
          of exponent zipf_s over the ranks 1..common, nnz draws; seeded), marked
          ``column_share_from: simulation``; the recorded statistics are kept.

  python runners/campaigns/spmm_structure_annotate.py shards IN.jsonl OUT.jsonl --graph rmat:nodes=2449029,edges=61859012
  python runners/campaigns/spmm_structure_annotate.py sweep IN.jsonl OUT.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.graph.structure import operand_structure
from plexus_tune.measure.campaign import load_graph_source
from plexus_tune.model.grid import layer_roles
from plexus_tune.model.sparsity import graph_sparsity


def read_records(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None


def annotate_shards(records: list[dict], graph_spec: str, permute: str, seed: int, layers: int) -> list[dict]:
    graph = load_graph_source(graph_spec)
    grids = sorted({(int(r["gx"]), int(r["gy"]), int(r["gz"])) for r in records})
    started = time.perf_counter()
    sparsity = graph_sparsity(graph, grids, layers, permute=permute, seed=seed)
    print(f"{len(grids)} grids, {len(sparsity.entries)} shards in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    out = []
    for line, rec in enumerate(records, start=1):
        o, _, d = layer_roles(int(rec["layer"]))
        grid = (int(rec["gx"]), int(rec["gy"]), int(rec["gz"]))
        entry = sparsity.entries[(int(rec["layer"]) % 2, grid[d], grid[o])]
        if entry["nnz_max"] != int(rec["nnz"]):
            raise UserError(f"record {line}: {rec['nnz']} nonzeros timed, but the recomputed largest shard of "
                            f"{rec['grid']} layer {rec['layer']} holds {entry['nnz_max']}: not the timed graph")
        structure = entry["forward" if rec["direction"] == "forward" else "backward"]
        out.append({**rec, "structure": dict(structure), "structure_from": f"{graph_spec} permuted {permute} seed {seed}"})
    return out


def sweep_column_counts(common: int, nnz: int, zipf_s: float, rng: np.random.Generator) -> np.ndarray:
    """Column counts of nnz draws of rank floor(x) - 1, x a power law of exponent zipf_s on [1, common]."""
    edges = np.minimum(np.arange(2, common + 2, dtype=np.float64), common)
    lower = np.concatenate([[1.0], edges[:-1]])
    if abs(zipf_s - 1.0) < 1e-9:
        cdf = lambda x: np.log(x) / np.log(common)  # noqa: E731
    else:
        a = 1.0 - zipf_s
        cdf = lambda x: (x**a - 1.0) / (common**a - 1.0)  # noqa: E731
    p = np.maximum(cdf(edges) - cdf(lower), 0.0) if common > 1 else np.ones(1)
    return rng.multinomial(int(nnz), p / p.sum())


def annotate_sweep(records: list[dict], seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for line, rec in enumerate(records, start=1):
        st = rec.get("structure") or {}
        if "zipf_s" not in st or "row_sigma" not in st:
            raise UserError(f"record {line}: no structure.zipf_s / row_sigma; only structured sweep records are simulated")
        rows, common, nnz = int(rec["rows"]), int(rec["common"]), int(rec["nnz"])
        cols = sweep_column_counts(common, nnz, float(st["zipf_s"]), rng)
        if st["row_sigma"] > 0:
            w = np.exp(float(st["row_sigma"]) * rng.standard_normal(rows))
            row_counts = rng.multinomial(nnz, w / w.sum())
        else:
            row_counts = rng.multinomial(nnz, np.full(rows, 1.0 / rows))
        simulated = operand_structure(row_counts, cols)
        out.append({**rec, "structure": {**st, "column_share": simulated["column_share"],
                                         "column_share_from": "simulation"}})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("shards", "sweep"))
    ap.add_argument("input", type=Path)
    ap.add_argument("output", type=Path)
    ap.add_argument("--graph", help="shards: the graph file or synthetic spec that was timed")
    ap.add_argument("--permute", default="double", help="shards: the permutation of the timed shards (default double)")
    ap.add_argument("--seed", type=int, default=0, help="permutation seed (shards) or simulation seed (sweep); default 0")
    ap.add_argument("--layers", type=int, default=3, help="shards: GCN layers (default 3)")
    args = ap.parse_args(argv)
    try:
        if args.output.is_dir():
            raise UserError(f"{args.output} is a directory; give the output file")
        records = read_records(args.input)
        if args.what == "shards":
            if not args.graph:
                raise UserError("shards needs --graph: the graph that was timed")
            out = annotate_shards(records, args.graph, args.permute, args.seed, args.layers)
        else:
            out = annotate_sweep(records, args.seed)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("".join(json.dumps(r) + "\n" for r in out))
    print(f"wrote {len(out)} records to {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
