"""Errors that the command line reports as one line with exit code 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user: the message says what is wrong and how to fix it.

    The message speaks of the library's own terms, never of command-line flags.
    ``parameter`` names the input at fault as the library calls it (a keyword argument
    or configuration field such as ``"gpus"``, or a tuple of them); the command line
    adds the flag that sets it (``plexus_tune.cli.main``).
    """

    parameter: str | tuple[str, ...] | None = None

    def __init__(self, *args, parameter: str | tuple[str, ...] | None = None):
        super().__init__(*args)
        if parameter is not None:
            self.parameter = parameter


EXIT_USER_ERROR = 2


class CorruptCacheWarning(UserWarning):
    """A cache entry could not be read: it is ignored and recomputed (shown as one line)."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a command, saying what was kept (``kept``); the command line prints it
    after "interrupted" and exits 130 (docs/cli.md, "Ending a command")."""

    def __init__(self, kept: str):
        super().__init__(kept)
        self.kept = kept


class SkippedLinesWarning(UserWarning):
    """Lines of an input file that were skipped (e.g. malformed lines of a measurement log).

    The command line prints each one as a single plain line on stderr, once.
    """
