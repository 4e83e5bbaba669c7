"""The ``plexus-tune`` command line.

Each sub-command lives in its own module of this package and exposes
``register(subparsers)``; the module must stay cheap to import (torch, optuna,
matplotlib and pandas, and the internal modules that import them at module level,
are imported inside the handler), so that ``plexus-tune predict`` starts fast and
never imports them (tests/test_imports.py).

Handlers raise :class:`plexus_tune.errors.UserError` for bad input; ``main`` prints
it as one line on stderr and exits with code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
import warnings

from plexus_tune import __version__
from plexus_tune.errors import EXIT_USER_ERROR, CorruptCacheWarning, SkippedLinesWarning, UserError

# Sub-command modules, in the order ``--help`` lists them.
COMMAND_MODULES = (
    "predict",
    "datasets",
    "machines",
    "search",
    "run",
    "graph",
    "train",
    "measure",
    "calibrate",
    "fit",
    "validate",
    "plot",
)


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line and exit with code 2."""

    def error(self, message: str) -> None:  # noqa: D401 - argparse API
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="plexus-tune",
        description="Predict, search, measure and calibrate 3D-parallel (Plexus) GCN training grids.",
    )
    parser.add_argument("--version", action="version", version=f"plexus-tune {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"plexus_tune.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"plexus_tune.cli.{name}":
                continue
            raise
        module.register(subparsers)
    return parser


@contextlib.contextmanager
def plain_skipped_lines():
    """Show each :class:`SkippedLinesWarning` once, as one plain line on stderr (no source line)."""
    shown: set[str] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("always", SkippedLinesWarning)
        warnings.simplefilter("always", CorruptCacheWarning)
        previous = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if not issubclass(category, (SkippedLinesWarning, CorruptCacheWarning)):
                return previous(message, category, filename, lineno, file, line)
            text = " ".join(str(message).split())
            if text not in shown:
                shown.add(text)
                print(f"plexus-tune: warning: {text}", file=sys.stderr, flush=True)

        warnings.showwarning = show
        yield


class Terminated(BaseException):
    """SIGTERM arrived: raised in the main thread so that every ``finally`` runs (the ranks a
    command started are stopped there, :func:`plexus_tune.launch.local.launch_local`)."""


@contextlib.contextmanager
def terminate_as_exception():
    """While a command runs, SIGTERM raises :class:`Terminated` (as Ctrl-C raises KeyboardInterrupt)
    instead of ending the process at once and leaving its ranks behind."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def flag_hint(parser: argparse.ArgumentParser, args, parameter) -> str:
    """`` (--flag)`` for the input a UserError names (its ``parameter``), where the command has such an option.

    The option is found by its argparse ``dest`` in the parser of the command that ran
    (sub-commands included), so a library parameter ``block_rows`` becomes ``--block-rows``.
    """
    names = [parameter] if isinstance(parameter, str) else list(parameter or ())
    while True:  # the parser of the (sub-)command that ran
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, subs[0].dest, None) if subs else None
        if chosen not in (subs[0].choices if subs else ()):
            break
        parser = subs[0].choices[chosen]
    flags = []
    for name in names:
        for action in parser._actions:
            long = [o for o in action.option_strings if o.startswith("--")]
            if action.dest == name and long:
                flags.append(long[0])
                break
    return f" ({'/'.join(flags)})" if flags else ""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a usage error (exit code 2, its line already printed), --help or --version
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_USER_ERROR)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # a command submitted to Slurm runs it again
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return EXIT_USER_ERROR
    try:
        with plain_skipped_lines(), terminate_as_exception():
            code = args.handler(args)
    except Terminated:
        print("plexus-tune: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except UserError as exc:
        print(f"plexus-tune: error: {exc}{flag_hint(parser, args, exc.parameter)}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt as exc:
        kept = getattr(exc, "kept", None)
        print("plexus-tune: interrupted" + (f"; {kept}" if kept else ""), file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    return int(code or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
