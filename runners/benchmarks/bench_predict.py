"""Benchmark ``plexus-tune predict``: wall time for G = 720720 and G = 64, and CLI cold start.

Each figure is the median (and min, max) over --repeat runs of a fresh process:

- ``predict G=720720``: every ordered factorization of 720720 (7,290 grids), table output;
- ``predict G=64``: the 28 grids of 64 GPUs;
- ``cli --version``: the command line starting and exiting (imports every sub-command's
  module, which must stay light);
- ``import numpy, pandas``: the reference cold start of a Python data tool.

The in-process time of the model alone for G = 720720 is reported too. Run from the
repository root::

    python runners/benchmarks/bench_predict.py [--repeat 5]

With ``--graph PATH|SPEC`` it instead times ``predict --graph`` on one graph, each figure
one fresh process with its wall time and peak RSS (``wait4``), in this order:

- ``one pass``: indptr and indices loaded and a bincount of the columns (the baseline);
- ``cold``: ``predict --graph`` with an empty structure cache;
- ``warm``: the same again, the shard statistics read from the cache;
- ``no graph``: ``predict`` of the same N and NNZ without the graph;
- ``sampled``: ``predict --graph-sample F`` for each of ``--fractions`` (default 10 %, 1 %,
  0.1 %), and for each the agreement with the exact figures: the best grid, the Spearman
  correlation of the predicted epochs of every grid, the largest-shard nonzeros' worst
  relative difference.

With ``--scaling DIR,DIR,...`` it shows that a sample's cost does not grow with the graph:
for each graph (R-MATs of several sizes), ``predict --graph-sample`` at the fraction that
reads ``--sample-entries`` stored entries (a sample of one size), with wall time, CPU time and
peak RSS of a fresh process (the first call, which stores the permutations, and a second,
which reads them), the sampled estimate's own time in process, and for contrast the
one-pass baseline, which grows with the graph::

    python runners/benchmarks/bench_predict.py --scaling /data/rmat-612k,/data/rmat-1224k,/data/rmat-2449k

With ``--descriptor NAME=DIR`` it compares, on the H100 profile at 1x1x1, catalog dataset NAME's
prediction from its structure descriptor (and from the shape computed for its generator
family) with ``predict --graph DIR``, DIR a graph of the same size generated with the
descriptor's skew, and with the uniformly random shards (target: the descriptor within 20 %)::

    python runners/benchmarks/bench_predict.py --descriptor ogbn-products=/data/rmat-products

A spec (``rmat:nodes=2449029,edges=61859012``, a ``graph generate`` kind and its options)
is generated once into ``--data`` (default /tmp/plexus-bench-graphs) in the memory-mapped
format. Targets: cold <= 3 x one pass, warm <= 2 s above no graph, peak RSS <= 1.5 x the
graph's arrays::

    python runners/benchmarks/bench_predict.py --graph rmat:nodes=2449029,edges=61859012 --gpus 64
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def timed(cmd: list[str], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        times.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr}")
    return times


def describe(label: str, times: list[float]) -> str:
    return (f"{label:<34} median {statistics.median(times) * 1e3:8.1f} ms   "
            f"min {min(times) * 1e3:8.1f}   max {max(times) * 1e3:8.1f}   (n={len(times)})")


class RusagePopen(subprocess.Popen):
    """Popen that keeps the child's resource usage (``rusage``) when it is reaped."""

    rusage = None

    def _try_wait(self, wait_flags):
        try:
            pid, status, usage = os.wait4(self.pid, wait_flags)
        except ChildProcessError:
            return self.pid, 0
        if pid == self.pid:
            self.rusage = usage
        return pid, status


def measured(cmd: list[str], env: dict | None = None) -> tuple[float, float, float, str]:
    """(wall s, CPU s (user + system), peak RSS GiB, stdout) of one fresh process."""
    start = time.perf_counter()
    proc = RusagePopen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{err}")
    usage = proc.rusage
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 2**20, out


def graph_directory(spec: str, data: str) -> str:
    """The plexus directory of a graph path, or of a spec generated once into ``data``."""
    if os.path.isdir(spec) or os.path.isfile(spec):
        return spec
    kind, _, options = spec.partition(":")
    params = dict(item.split("=", 1) for item in options.split(",") if item)
    name = kind + "-" + "-".join(f"{k}{v}" for k, v in sorted(params.items()))
    out = os.path.join(data, name)
    if not os.path.isdir(out):
        os.makedirs(data, exist_ok=True)
        cmd = [sys.executable, "-m", "plexus_tune", "graph", "generate", kind, "--out", out]
        for key, value in params.items():
            cmd += [f"--{key}", value] if key in ("nodes", "edges", "features", "classes", "seed") else ["--param", f"{key}={value}"]
        print(f"generating {spec} into {out} ...", flush=True)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out


ONE_PASS = """
import sys, numpy as np
d = sys.argv[1]
indptr = np.load(d + "/indptr.npy"); indices = np.load(d + "/indices.npy")
print(int(np.bincount(indices, minlength=indptr.size - 1).max()))
"""


def bench_graph(args) -> int:
    import json
    import tempfile

    path = graph_directory(args.graph, args.data)
    meta = json.loads(open(os.path.join(path, "metadata.json")).read())
    sizes = {key: os.path.getsize(os.path.join(path, f"{key}.npy")) for key in meta["arrays"]}
    adjacency_gib = sum(sizes[k] for k in ("indptr", "indices", "data")) / 2**30
    all_gib = sum(sizes.values()) / 2**30
    py = sys.executable
    cache_dir = tempfile.mkdtemp(prefix="plexus-bench-cache-")
    env = {**os.environ, "PLEXUS_TUNE_DATA": cache_dir}
    predict = [py, "-m", "plexus_tune", "predict", "--gpus", str(args.gpus), "--hidden", str(args.hidden),
               "--machine", args.machine, "--top", "3"]
    load_before = os.getloadavg()[0]
    rows = [("one pass (load indptr, indices; bincount)", *measured([py, "-c", ONE_PASS, path], env)[:3])]
    cold = measured(predict + ["--graph", path], env)
    rows.append(("predict --graph, cold (empty cache)", *cold[:3]))
    warm = measured(predict + ["--graph", path], env)
    rows.append(("predict --graph, warm (cached)", *warm[:3]))
    header = next(line for line in cold[3].splitlines() if "NNZ=" in line)
    nnz = int(header.split("NNZ=")[1].split()[0].replace(",", ""))
    rows.append(("predict without the graph (same N, NNZ)",
                 *measured(predict + ["--nodes", str(meta["num_nodes"]), "--nnz", str(nnz), "--features",
                                      str(sizes["features"] // 4 // meta["num_nodes"]), "--classes", str(meta["num_classes"])], env)[:3]))
    print(f"graph {path}: N={meta['num_nodes']:,}, NNZ (normalized) {nnz:,}; arrays {all_gib:.2f} GiB "
          f"(adjacency {adjacency_gib:.2f} GiB)")
    print(f"python {sys.version.split()[0]}; cpus {os.cpu_count()}; load average {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")
    for label, wall, cpu, rss in rows:
        print(f"{label:<44} wall {wall:8.2f} s   CPU {cpu:8.2f} s   peak RSS {rss:6.2f} GiB ({rss / all_gib:.2f} x the arrays)")
    (base, base_cpu), (cold_s, cold_cpu), (warm_s, warm_cpu), (none_s, none_cpu) = ((r[1], r[2]) for r in rows)
    print(f"cold / one pass: wall {cold_s / base:.2f}, CPU {cold_cpu / base_cpu:.2f} (target <= 3); warm - no graph: wall "
          f"{warm_s - none_s:+.2f} s, CPU {warm_cpu - none_cpu:+.2f} s (target <= 2 s); peak RSS of cold "
          f"{rows[1][3] / all_gib:.2f} x the arrays (target <= 1.5)")
    print("(on a shared host the CPU figures are the fair ones: wall time waits for other processes)")
    same = [line for line in cold[3].splitlines() if line.startswith("Recommended")] == \
        [line for line in warm[3].splitlines() if line.startswith("Recommended")]
    print(f"warm recommends what cold does: {'yes' if same else 'NO'}")
    sampled_figures(args, path, predict, env, all_gib)
    return 0


def sampled_figures(args, path: str, predict: list[str], env: dict, all_gib: float) -> None:
    """Sampled predict at each fraction (wall, CPU, peak RSS), and its agreement with the exact figures."""
    import json

    from scipy.stats import spearmanr

    print(f"sampled estimates (--graph-sample; load average {os.getloadavg()[0]:.2f}):")
    outputs = {}
    for fraction in args.fractions:
        wall, cpu, rss, out = measured(predict + ["--graph", path, "--graph-sample", str(fraction)], env)
        line = next((x for x in out.splitlines() if x.startswith("shard statistics estimated")), "(no sample line)")
        print(f"  sampled at {100 * fraction:6.2f} %{'':<22} wall {wall:8.2f} s   CPU {cpu:8.2f} s   peak RSS {rss:6.2f} GiB "
              f"({rss / all_gib:.2f} x the arrays)")
        print(f"    {line}")
        outputs[fraction] = out
    # agreement with the exact figures of every grid: the exact ones from the cache the cold run filled
    every = ["--top", "0", "--format", "json"]
    exact = {r["grid"]: r["total_ms"] for r in json.loads(measured(predict + ["--graph", path] + every, env)[3])}
    from plexus_tune.graph import load_graph
    from plexus_tune.graph.cache import StructureCache
    from plexus_tune.model.grid import enumerate_grids
    from plexus_tune.model.sparsity import graph_sparsity

    os.environ["PLEXUS_TUNE_DATA"] = env["PLEXUS_TUNE_DATA"]
    graph = load_graph(path, pattern_only=True)
    grids = enumerate_grids(args.gpus)
    exact_nnz = graph_sparsity(graph, grids, 3, cache=StructureCache(graph)).entries
    for fraction in args.fractions:
        records = json.loads(measured(predict + ["--graph", path, "--graph-sample", str(fraction)] + every, env)[3])
        sampled = {r["grid"]: r["total_ms"] for r in records}
        keys = sorted(exact)
        rho = spearmanr([exact[k] for k in keys], [sampled[k] for k in keys]).statistic
        best_exact = min(exact, key=exact.get)
        best_sampled = records[0]["grid"]
        estimate = graph_sparsity(graph, grids, 3, sample=fraction).entries
        worst = max(abs(estimate[k]["nnz_max"] / exact_nnz[k]["nnz_max"] - 1) for k in exact_nnz)
        print(f"  at {100 * fraction:6.2f} %: best grid {best_sampled} (exact {best_exact}: "
              f"{'same' if best_sampled == best_exact else 'DIFFERENT'}), Spearman {rho:.4f} of the predicted epochs "
              f"of {len(keys)} grids (target >= 0.99), largest-shard nonzeros within {100 * worst:.2f} % of exact on "
              f"every split (target <= 2 %)")


IN_PROCESS = """
import sys, time, json
from plexus_tune.graph import load_graph
from plexus_tune.model.grid import enumerate_grids
from plexus_tune.model.sparsity import graph_sparsity
import plexus_tune.graph.structure_sample as structure_sample
graph = load_graph(sys.argv[1], pattern_only="rows")
grids = enumerate_grids(int(sys.argv[3]))
# compiled loops loaded, the permutations stored (as the first predict does)
graph_sparsity(graph, grids[:1], 3, sample=float(sys.argv[2]), seed=1, store_permutations=True)
structure_sample._LAST_SAMPLE[:] = [None, None, None]  # the sample read again
start = time.perf_counter()
result = graph_sparsity(graph, grids, 3, sample=float(sys.argv[2]), seed=1, store_permutations=True)
print(json.dumps({"seconds": time.perf_counter() - start, **result.sample}))
"""


def scaling_figures(args) -> int:
    """One sample size on graphs of several sizes: the sampled predict's cost against the graph's."""
    import json

    import tempfile

    py = sys.executable
    env = {**os.environ, "PLEXUS_TUNE_DATA": tempfile.mkdtemp(prefix="plexus-bench-data-")}
    predict = [py, "-m", "plexus_tune", "predict", "--gpus", str(args.gpus), "--hidden", str(args.hidden),
               "--machine", args.machine, "--top", "3"]
    print(f"a sample of about {args.sample_entries:,} stored entries on each graph; python {sys.version.split()[0]}; "
          f"cpus {os.cpu_count()}; load average {open('/proc/loadavg').read().split()[0]} before")
    print(f"{'':<58}{'first predict (makes perms)':<30}{'predict again':<30}")
    print(f"{'graph':<16} {'N':>10} {'stored nnz':>12} {'fraction':>9} {'entries':>8} "
          f"{'wall s':>7} {'CPU s':>6} {'RSS GiB':>7} {'':>6} {'wall s':>7} {'CPU s':>6} {'RSS GiB':>7} "
          f"{'in-proc s':>9} | {'one pass s':>10} {'RSS GiB':>7}")
    for path in args.scaling:
        meta = json.loads(open(os.path.join(path, "metadata.json")).read())
        fraction = min(1.0, args.sample_entries / int(meta["nnz"]))
        first = measured(predict + ["--graph", path, "--graph-sample", f"{fraction:.6g}"], env)
        again = measured(predict + ["--graph", path, "--graph-sample", f"{fraction:.6g}"], env)
        inner = json.loads(measured([py, "-c", IN_PROCESS, path, f"{fraction:.6g}", str(args.gpus)], env)[3])
        base = measured([py, "-c", ONE_PASS, path], env)
        print(f"{os.path.basename(path.rstrip('/')):<16} {meta['num_nodes']:>10,} {int(meta['nnz']):>12,} {fraction:>9.5f} "
              f"{inner['entries']:>8,} {first[0]:>7.2f} {first[1]:>6.2f} {first[2]:>7.3f} {'':>6} {again[0]:>7.2f} "
              f"{again[1]:>6.2f} {again[2]:>7.3f} {inner['seconds']:>9.2f} | {base[0]:>10.2f} {base[2]:>7.3f}", flush=True)
    none = measured(predict + ["--nodes", "2449029", "--nnz", "126167053", "--features", "100", "--classes", "47"], env)
    print(f"predict without a graph: wall {none[0]:.2f} s, CPU {none[1]:.2f} s, peak RSS {none[2]:.3f} GiB")
    print(f"load average {open('/proc/loadavg').read().split()[0]} after "
          "(in-proc s: graph_sparsity's sampled estimate for every grid of G, double permutation, stored permutations, "
          "timed in process)")
    return 0


def descriptor_figures(args) -> int:
    """A catalog dataset's descriptor against --graph on a same-size graph of its skew, at 1x1x1 on the H100 profile."""
    import numpy as np

    from plexus_tune.graph import load_graph
    from plexus_tune.graph.degrees import rmat_degree_shape
    from plexus_tune.model.costs import predict_grids
    from plexus_tune.model.machine import load_machine
    from plexus_tune.model.sparsity import DescriptorSparsity, descriptor_sparsity, graph_sparsity
    from plexus_tune.model.workload import get_dataset, workload_from_dataset

    name, _, path = args.descriptor.partition("=")
    info = get_dataset(name)
    workload = workload_from_dataset(info.name)
    machine = load_machine(args.machine)
    grids = np.array([[1, 1, 1]])
    start = time.perf_counter()
    graph = load_graph(path, pattern_only=True)
    exact = predict_grids(workload, machine, grids, sparsity=graph_sparsity(graph, grids, workload.layers))
    scan_s = time.perf_counter() - start
    rows = [("predict --graph (the graph's shards)", exact)]
    rows.append(("descriptor (" + ("measured shape" if "degree_shape" in info.structure else "computed shape") + ")",
                 predict_grids(workload, machine, grids, sparsity=descriptor_sparsity(info, workload, grids))))
    if info.structure.get("generator") == "rmat":
        computed = {**info.structure, "degree_shape": rmat_degree_shape(info.nodes, (info.nnz - info.nodes) // 2,
                                                                        info.structure["skew"])}
        rows.append(("computed R-MAT shape of its size", predict_grids(
            workload, machine, grids, sparsity=DescriptorSparsity(computed, workload.nodes, workload.nnz, name=name))))
    rows.append(("uniformly random shards (no descriptor)", predict_grids(workload, machine, grids)))
    print(f"{info.name} at 1x1x1 on {machine.name}; graph {path} (N={graph.num_nodes:,}, stored {graph.adjacency.nnz:,}; "
          f"scan {scan_s:.1f} s); load average {open('/proc/loadavg').read().split()[0]}")
    want = float(exact["total_ms"][0])
    for label, pred in rows:
        total, spmm = float(pred["total_ms"][0]), float(pred["spmm_ms"][0])
        print(f"  {label:<42} epoch {total:9.2f} ms ({100 * (total / want - 1):+6.1f} %)   SpMM {spmm:9.2f} ms")
    print("target: the descriptor's epoch within 20 % of predict --graph")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dataset", default="ogbn-products")
    parser.add_argument("--machine", default="perlmutter-paper")
    parser.add_argument("--graph", help="time predict --graph on this graph directory or generated spec instead")
    parser.add_argument("--gpus", type=int, default=64, help="with --graph: G (default 64)")
    parser.add_argument("--hidden", type=int, default=128, help="with --graph: hidden width (default 128)")
    parser.add_argument("--data", default="/tmp/plexus-bench-graphs", help="with a --graph spec: where it is generated")
    parser.add_argument("--fractions", default="0.1,0.01,0.001",
                        help="with --graph: the --graph-sample fractions timed and compared with the exact figures")
    parser.add_argument("--scaling", help="graph directories, comma-separated: one sample size on each "
                        "(--sample-entries), its cost against the graph's size")
    parser.add_argument("--sample-entries", type=int, default=1_237_180,
                        help="with --scaling: stored entries the sample reads (default 1 %% of the products-size R-MAT)")
    parser.add_argument("--descriptor", metavar="NAME=DIR",
                        help="catalog dataset NAME's descriptor against predict --graph DIR at 1x1x1")
    args = parser.parse_args()
    if args.descriptor:
        if args.machine == "perlmutter-paper":
            args.machine = "h100-80gb-fitted"
        return descriptor_figures(args)
    args.fractions = [float(v) for v in args.fractions.split(",") if v]
    if args.scaling:
        args.scaling = [v for v in args.scaling.split(",") if v]
        if args.machine == "perlmutter-paper":
            args.machine = "h100-80gb-fitted"
        return scaling_figures(args)
    if args.graph:
        if args.machine == "perlmutter-paper":
            args.machine = "h100-80gb-fitted"
        return bench_graph(args)

    from plexus_tune.model.costs import predict_grids, rank_order
    from plexus_tune.model.grid import enumerate_grids
    from plexus_tune.model.workload import workload_from_dataset

    grids = enumerate_grids(720720)
    print(f"G=720720 enumerates {len(grids)} grids (expected 7290): {'ok' if len(grids) == 7290 else 'WRONG'}")
    workload = workload_from_dataset(args.dataset)
    model_times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        pred = predict_grids(workload, args.machine, grids)
        rank_order(pred)
        model_times.append(time.perf_counter() - start)

    py = sys.executable
    cli = [py, "-m", "plexus_tune"]
    predict = cli + ["predict", "--dataset", args.dataset, "--machine", args.machine]
    rows = [
        ("model only, G=720720 (in process)", model_times),
        ("plexus-tune predict G=720720", timed(predict + ["--gpus", "720720"], args.repeat)),
        ("plexus-tune predict G=64", timed(predict + ["--gpus", "64"], args.repeat)),
        ("plexus-tune --version", timed(cli + ["--version"], args.repeat)),
        ('python -c "import numpy, pandas"', timed([py, "-c", "import numpy, pandas"], args.repeat)),
        ('python -c "pass"', timed([py, "-c", "pass"], args.repeat)),
    ]
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    print(f"python {sys.version.split()[0]}; cpus {os.cpu_count()}; load average {load[0]:.2f}")
    for label, times in rows:
        print(describe(label, times))
    return 0


if __name__ == "__main__":
    sys.exit(main())
