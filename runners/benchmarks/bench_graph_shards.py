"""Benchmark: peak memory of one rank reading its shard from 2D files vs loading the whole graph.

    python runners/benchmarks/bench_graph_shards.py [--kind rmat --nodes 1M --edges 3M] [--files 8x8]
        [--rank-grids 8x8,4x4,2x2] [--features 32]

Writes the graph in the project's own format and as 2D shard files (temporary directory),
then measures each way of getting one rank's adjacency block (and its feature rows) in a
fresh subprocess, reporting its peak resident memory (``VmHWM`` of /proc/self/status, else ``ru_maxrss``)
and wall time:

- ``whole``: what a rank does without shard files: load the whole graph into memory,
  normalize, permute, slice its block and its feature rows;
- ``shard``: ``load_shard`` reads and merges only the covering files, and the feature
  rows are gathered from the memory-mapped features.

``baseline`` is a subprocess that only imports the same modules; the "extra" column is
peak minus baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
import numpy as np, scipy.sparse as sp
from plexus_tune.graph import (gcn_normalize, load_graph, load_node_rows, load_shard, permutations_for,
                               permute_matrix, read_manifest)
mode, graph_dir, shard_dir, rb, cb, i, j = sys.argv[1:8]
rb, cb, i, j = int(rb), int(cb), int(i), int(j)
start = time.perf_counter()
nnz = 0
if mode == "whole":
    g = load_graph(graph_dir, mmap=False)
    manifest = read_manifest(shard_dir)
    n, n_pad = g.num_nodes, manifest["num_nodes_padded"]
    rp, cp = permutations_for(manifest["permutation"]["mode"], n, manifest["permutation"]["seed"])
    b = permute_matrix(gcn_normalize(g.adjacency), rp, cp)
    h, w = n_pad // rb, n_pad // cb
    block = b[i * h:min((i + 1) * h, n)][:, j * w:min((j + 1) * w, n)]
    feats = np.asarray(g.features)[cp[j * w:min((j + 1) * w, n)]]
    nnz = block.nnz
elif mode == "shard":
    manifest = read_manifest(shard_dir)
    n_pad = manifest["num_nodes_padded"]
    block = load_shard(shard_dir, i, j, rb, cb)
    w = n_pad // cb
    feats, labels = load_node_rows(shard_dir, j * w, (j + 1) * w, perm="col")
    nnz = block.nnz
elapsed = time.perf_counter() - start
def high_water_bytes():
    # VmHWM belongs to this process's own address space; ru_maxrss would also count the
    # parent's resident set inherited at fork/exec
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
peak = high_water_bytes()
print(json.dumps({"mode": mode, "peak_bytes": peak, "seconds": elapsed, "nnz": int(nnz)}))
"""


def measure(mode, graph_dir, shard_dir, rb, cb, i, j):
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(graph_dir), str(shard_dir), str(rb), str(cb),
                          str(i), str(j)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    from plexus_tune.graph import generate, parse_blocks, save_graph, write_shards
    from plexus_tune.numbers import parse_count

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="rmat", choices=("rmat", "grid2d"))
    parser.add_argument("--nodes", default="1M")
    parser.add_argument("--edges", default="3M", help="rmat undirected edges")
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--files", default="8x8", help="shard file grid")
    parser.add_argument("--rank-grids", default="8x8,4x4,2x2", help="target grids of the measured rank, comma "
                        "separated (each divides --files)")
    parser.add_argument("--block", default="0,0", help="the rank's block i,j")
    parser.add_argument("--tmp", default=None, help="scratch directory (default: system temp)")
    args = parser.parse_args()
    nodes = parse_count(args.nodes, "nodes")
    params = {"nodes": nodes, "features": args.features, "classes": 32, "seed": 0}
    if args.kind == "rmat":
        params["edges"] = parse_count(args.edges, "edges")
    files = parse_blocks(args.files)
    rank_grids = [parse_blocks(t) for t in args.rank_grids.split(",")]
    bi, bj = (int(x) for x in args.block.split(","))
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus")
    with tempfile.TemporaryDirectory(dir=args.tmp) as scratch:
        scratch = Path(scratch)
        t = time.perf_counter()
        graph = generate(args.kind, **params)
        save_graph(graph, scratch / "graph")
        t_shard = time.perf_counter()
        manifest = write_shards(graph, scratch / "shards", files, mode="double", seed=0)
        t_done = time.perf_counter()
        print(f"{graph.name}: {graph.num_nodes} nodes, {manifest['nnz']} nonzeros of the normalized adjacency, "
              f"{args.features} features; generated+saved in {t_shard - t:.1f} s, "
              f"{files[0]}x{files[1]} shard files written in {t_done - t_shard:.1f} s")
        del graph
        base = measure("baseline", scratch / "graph", scratch / "shards", 1, 1, 0, 0)
        results = []
        for rb, cb in rank_grids:
            for mode in ("whole", "shard"):
                results.append(((rb, cb), measure(mode, scratch / "graph", scratch / "shards", rb, cb, bi, bj)))
    print(f"rank block ({bi},{bj}); baseline (imports only) {base['peak_bytes'] / 2**20:.0f} MiB; "
          "extra = peak - baseline")
    print(f"{'rank grid':>9} {'method':>8} {'peak MiB':>9} {'extra MiB':>10} {'seconds':>8} {'block nnz':>10}")
    for (rb, cb), r in results:
        print(f"{f'{rb}x{cb}':>9} {r['mode']:>8} {r['peak_bytes'] / 2**20:9.0f} "
              f"{(r['peak_bytes'] - base['peak_bytes']) / 2**20:10.0f} {r['seconds']:8.2f} {r['nnz']:10d}")
    for k in range(0, len(results), 2):
        if results[k][1]["nnz"] != results[k + 1][1]["nnz"]:
            raise SystemExit("block nonzeros differ between the two methods")


if __name__ == "__main__":
    main()
