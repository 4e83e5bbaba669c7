"""The modules a run's configuration visits in ``plexus-tune measure``, in call order.

    python runners/benchmarks/call_path.py            # a tiny local campaign: 2 ranks, one grid, one trial
    python runners/benchmarks/call_path.py --calls    # also every traced call

Runs ``plexus-tune measure`` on a small synthetic graph (2 local ranks, grid 1x2x1, one
trial, 2 epochs, a shipped CPU profile so the prediction is logged too) under
:func:`plexus_tune.callpath.trace` in the command's own process (the ranks' processes are
not traced; what counts as the configuration's path, an entry and a climb is said there).
Prints, up to the run's record being appended to the log and for the whole command, the
modules in call order (each entry), the entries per module and the climbs; then how often
``normalize_config`` and ``parse_comm_precision`` ran. tests/test_call_path.py asserts the
path up to the record on a one-rank campaign.
"""

from __future__ import annotations

import argparse
import os
import tempfile

from plexus_tune.callpath import COUNTED, report_lines, short, trace, until
from plexus_tune.cli import main as cli_main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", action="store_true", help="also print every traced call")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "runs.jsonl")
        argv = ["measure", "--graph", "rmat:nodes=128,edges=1024,features=8,classes=4,seed=0", "--gpus", "2",
                "--grids", "1x2x1", "--trials", "1", "--epochs", "2", "--warmup", "1", "--layers", "2",
                "--hidden", "8", "--machine", "cpu-gloo-2core", "--launcher", "local", "--log", log]
        seen = trace(cli_main, argv)
    if seen.result != 0:
        raise SystemExit(f"plexus-tune {' '.join(argv)} exited with {seen.result}")
    print(f"plexus-tune {' '.join(argv[:-1])} LOG")
    for title, entries in (("from measure to the trainer and back to the logged record", until(seen.entries, "append_records")),
                           ("the whole command (the summary reads the log back)", seen.entries)):
        print()
        print("\n".join(report_lines(title, entries)))
    for name in COUNTED:
        print(f"{name} ran {seen.counts[name]} time(s)")
    if args.calls:
        print("\nevery traced call:")
        for caller, module, name in seen.calls:
            print(f"  {short(caller):24s} -> {short(module)}.{name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
