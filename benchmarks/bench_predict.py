"""Benchmark ``plexus-tune predict``: wall time for G = 720720 and G = 64, and CLI cold start.

Each figure is the median (and min, max) over --repeat runs of a fresh process:

- ``predict G=720720``: every ordered factorization of 720720 (7,290 grids), table output;
- ``predict G=64``: the 28 grids of 64 GPUs;
- ``cli --version``: the command line starting and exiting (imports every sub-command's
  module, which must stay light);
- ``import numpy, pandas``: the reference cold start of a Python data tool.

The in-process time of the model alone for G = 720720 is reported too. Run from the
repository root::

    python benchmarks/bench_predict.py [--repeat 5]
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dataset", default="ogbn-products")
    parser.add_argument("--machine", default="perlmutter-paper")
    args = parser.parse_args()

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
