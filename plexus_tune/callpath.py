"""The modules a run's configuration visits, in call order (docs/architecture.md, "Run identity").

:func:`trace` runs a callable (``plexus_tune.cli.main`` with a command's arguments) under
``sys.setprofile`` in this process (ranks started in other processes are not traced). A
call is on the configuration's path when one of its arguments is the run's configuration:
a ``TrainConfig``, a ``RunSpec``, a ``RunIdentity``, a ``Campaign`` or a run record (a dict
with a ``plexus-tune/run-*`` schema), or a list or tuple of them (the configuration's own
methods aside), and a constructor of the configuration. An *entry* is such a call into a
``plexus_tune`` module from another module; a *climb* is an entry into a module the path
entered before (:func:`climbs`). The path visits each module once when every module has one
entry and there are no climbs. Stage-free: it imports no stage.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple

PACKAGE = "plexus_tune"
#: The types of the run's configuration.
CONFIG_TYPES = ("TrainConfig", "RunSpec", "RunIdentity", "Campaign")
#: Functions whose calls are counted wherever they happen.
COUNTED = ("normalize_config", "parse_comm_precision")


class Entry(NamedTuple):
    """A call on the configuration's path: the caller's module, the callee's module, the function."""

    caller: str
    module: str
    function: str


class Trace(NamedTuple):
    """What :func:`trace` saw: the path's ``entries`` (across modules), every path ``call``, the
    ``counts`` of :data:`COUNTED` and the callable's ``result``."""

    entries: list[Entry]
    calls: list[Entry]
    counts: Counter
    result: object


def is_configuration(value, depth: int = 0) -> bool:
    """Whether ``value`` is the run's configuration (or a short list or tuple holding it)."""
    if type(value).__name__ in CONFIG_TYPES:
        return True
    if isinstance(value, dict):
        return str(value.get("schema", "")).startswith("plexus-tune/run-")
    if isinstance(value, (list, tuple)) and depth == 0 and len(value) < 64:
        return any(is_configuration(v, 1) for v in value)
    return False


def carries_configuration(frame) -> bool:
    """Whether the call of ``frame`` takes the configuration (its own methods aside; its constructors count)."""
    code = frame.f_code
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
    if names[:1] == ("self",) and is_configuration(frame.f_locals.get("self")):
        return False  # the configuration's own methods (its constructor, world_size) are no room of the path
    if names[:1] == ("cls",) and getattr(frame.f_locals.get("cls"), "__name__", "") in CONFIG_TYPES:
        return True  # a constructor of the configuration (RunSpec.from_args) in its own module
    return any(is_configuration(frame.f_locals.get(n)) for n in names)


def trace(fn: Callable, *args, **kwargs) -> Trace:
    """``fn(*args, **kwargs)`` with the configuration's path recorded (module docstring)."""
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
        calls.append(Entry(caller, module, name))
        if caller != module:
            entries.append(Entry(caller, module, name))

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        result = fn(*args, **kwargs)
    finally:
        sys.setprofile(previous)
    return Trace(entries, calls, counts, result)


def short(module: str) -> str:
    """``plexus_tune.measure.identity`` as ``measure/identity``."""
    return module.removeprefix(PACKAGE + ".").replace(".", "/")


def until(entries: list[Entry], function: str) -> list[Entry]:
    """The entries up to and with the first call of ``function`` (all where it is never entered)."""
    return next((entries[: k + 1] for k, e in enumerate(entries) if e.function == function), list(entries))


def module_order(entries: list[Entry]) -> list[str]:
    """The modules entered, in call order, a module listed again where the path comes back to it."""
    return [short(e.module) for k, e in enumerate(entries) if k == 0 or entries[k - 1].module != e.module]


def climbs(entries: list[Entry]) -> list[Entry]:
    """The entries into a module the path entered before."""
    seen, out = set(), []
    for e in entries:
        if e.module in seen:
            out.append(e)
        seen.add(e.module)
    return out


def report_lines(title: str, entries: list[Entry]) -> list[str]:
    """The entries in call order (climbs marked), per module, the module order and the totals."""
    lines, seen = [f"== {title}: modules in call order (entries of the configuration's path)"], set()
    for k, e in enumerate(entries, 1):
        mark = "   (climb)" if e.module in seen else ""
        seen.add(e.module)
        lines.append(f"{k:3d}. {short(e.module):24s} {e.function:28s} from {short(e.caller) or '-'}{mark}")
    per_module = Counter(e.module for e in entries)
    lines.append("entries per module: " + ", ".join(f"{short(m)} {n}" for m, n in per_module.most_common()))
    lines.append("in order: " + " -> ".join(module_order(entries)))
    lines.append(f"modules {len(per_module)}, entries {len(entries)}, climbs {len(climbs(entries))}")
    return lines
