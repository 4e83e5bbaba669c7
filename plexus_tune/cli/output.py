"""What every command prints through: consoles with one wrapping policy, flags named in errors.

Wrapping policy: on a terminal, rich wraps text and fits tables to the terminal's width.
When the stream is not a terminal (a pipe, a file, a test), nothing is wrapped: paths,
records and messages stay on one line each, and tables take the width their content
needs.
"""

from __future__ import annotations

import contextlib
import sys

from rich.console import Console

from plexus_tune.errors import UserError
from plexus_tune.measure import store
from plexus_tune import paths

#: width a console assumes when its stream is not a terminal: wide enough that no table
#: or line of this project is cut or wrapped
UNWRAPPED_WIDTH = 1000


def make_console(*, stderr: bool = False, file=None):
    """A rich Console on stdout (or stderr, or ``file``) that follows the wrapping policy."""
    stream = file if file is not None else (sys.stderr if stderr else sys.stdout)
    if getattr(stream, "isatty", lambda: False)():
        return Console(file=stream)
    return Console(file=stream, width=UNWRAPPED_WIDTH, soft_wrap=True)


@contextlib.contextmanager
def flag(name: str):
    """Name the command-line flag in a library UserError raised inside the block."""
    try:
        yield
    except UserError as exc:
        raise UserError(f"{name} {exc}") from None


def check_output_file(name: str, path, **kwargs):
    """:func:`plexus_tune.paths.check_output_file`, its error naming the flag ``name``."""
    with flag(name):
        return paths.check_output_file(path, **kwargs)


def check_output_dir(name: str, path):
    """:func:`plexus_tune.paths.check_output_dir`, its error naming the flag ``name``."""
    with flag(name):
        return paths.check_output_dir(path)


def check_log(name: str, path):
    """:func:`plexus_tune.measure.store.check_log` (a log to append to), its error naming ``name``."""
    with flag(name):
        return store.check_log(path)
