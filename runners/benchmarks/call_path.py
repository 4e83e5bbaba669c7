"""The modules a run's configuration visits in ``plexus-tune measure``, in call order.

    python runners/benchmarks/call_path.py            # a tiny local campaign: 2 ranks, one grid, one trial
    python runners/benchmarks/call_path.py --calls    # also every traced call

Runs ``plexus-tune measure`` on a small synthetic graph (2 local ranks, grid 1x2x1, one
trial, 2 epochs, a shipped CPU profile so the prediction is logged too) under
``sys.setprofile`` in the command's own process (the ranks' processes are not traced).
A call is on the configuration's path when one of its arguments is the run's
configuration: a ``TrainConfig``, a ``RunSpec``, a ``RunIdentity``, a ``Campaign`` or a
run record (a dict with a ``plexus-tune/run-*`` schema), or a list or tuple of them (the
configuration's own methods aside), and a ``RunSpec`` constructor. An *entry* is
such a call into a ``plexus_tune`` module from another module; a *climb* is an entry
into a module the path entered before. Prints, up to the run's record being appended
to the log and for the whole command, the modules in call order (each entry), the
entries per module and the climbs; then how often ``normalize_config`` and
``parse_comm_precision`` ran. The path visits each module once when every module has
one entry and there are no climbs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter

PACKAGE = "plexus_tune"
CONFIG_TYPES = ("TrainConfig", "RunSpec", "RunIdentity", "Campaign")
COUNTED = ("normalize_config", "parse_comm_precision")


def is_configuration(value, depth: int = 0) -> bool:
    if type(value).__name__ in CONFIG_TYPES:
        return True
    if isinstance(value, dict):
        return str(value.get("schema", "")).startswith("plexus-tune/run-")
    if isinstance(value, (list, tuple)) and depth == 0 and len(value) < 64:
        return any(is_configuration(v, 1) for v in value)
    return False


def carries_configuration(frame) -> bool:
    code = frame.f_code
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    if names[:1] == ("self",) and is_configuration(frame.f_locals.get("self")):
        return False  # the configuration's own methods (its constructor, world_size) are no room of the path
    if names[:1] == ("cls",) and getattr(frame.f_locals.get("cls"), "__name__", "") in CONFIG_TYPES:
        return True  # a constructor of the configuration (RunSpec.from_args) in its own module
    return any(is_configuration(frame.f_locals.get(n)) for n in names)


def trace(argv: list[str]):
    """(entries, calls, counts): the path's module entries (caller module, callee module,
    function), every traced call and the calls of :data:`COUNTED`."""
    entries, calls, counts = [], [], Counter()

    def profile(frame, event, arg):
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(PACKAGE + "."):
            return
        name = frame.f_code.co_name
        if name in COUNTED:
            counts[name] += 1
        if name.startswith(("<", "__")) or not carries_configuration(frame):
            return
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back is not None else ""
        calls.append((caller, module, name))
        if caller != module:
            entries.append((caller, module, name))

    from plexus_tune.cli import main

    sys.setprofile(profile)
    try:
        code = main(argv)
    finally:
        sys.setprofile(None)
    if code != 0:
        raise SystemExit(f"plexus-tune {' '.join(argv)} exited with {code}")
    return entries, calls, counts


def short(module: str) -> str:
    return module.removeprefix(PACKAGE + ".").replace(".", "/")


def report(title: str, entries) -> None:
    """The entries in call order (climbs marked), per module, the module order and the totals."""
    seen, climbs = set(), 0
    print(f"\n== {title}: modules in call order (entries of the configuration's path)")
    for k, (caller, module, name) in enumerate(entries, 1):
        climb = module in seen
        climbs += climb
        seen.add(module)
        print(f"{k:3d}. {short(module):24s} {name:28s} from {short(caller) or '-'}{'   (climb)' if climb else ''}")
    per_module = Counter(module for _, module, _ in entries)
    print("entries per module: " + ", ".join(f"{short(m)} {n}" for m, n in per_module.most_common()))
    order = [short(m) for k, (_, m, _) in enumerate(entries) if k == 0 or entries[k - 1][1] != m]
    print("in order: " + " -> ".join(order))
    print(f"modules {len(per_module)}, entries {len(entries)}, climbs {climbs}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", action="store_true", help="also print every traced call")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "runs.jsonl")
        argv = ["measure", "--graph", "rmat:nodes=128,edges=1024,features=8,classes=4,seed=0", "--gpus", "2",
                "--grids", "1x2x1", "--trials", "1", "--epochs", "2", "--warmup", "1", "--layers", "2",
                "--hidden", "8", "--machine", "cpu-gloo-2core", "--launcher", "local", "--log", log]
        entries, calls, counts = trace(argv)
    print(f"plexus-tune {' '.join(argv[:-1])} LOG")
    logged = next((k + 1 for k, (_, m, n) in enumerate(entries) if n == "append_records"), len(entries))
    report("from measure to the trainer and back to the logged record", entries[:logged])
    report("the whole command (the summary reads the log back)", entries)
    for name in COUNTED:
        print(f"{name} ran {counts[name]} time(s)")
    if args.calls:
        print("\nevery traced call:")
        for caller, module, name in calls:
            print(f"  {short(caller):24s} -> {short(module)}.{name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
