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


def whole_number(value, what: str, *, minimum: int = 1) -> int:
    """``value`` (an int or its text) as an int >= ``minimum``; a UserError saying ``what`` is wrong otherwise."""
    text = str(value).strip()
    try:
        number = int(text)
    except ValueError:
        raise UserError(f"{what} must be a whole number >= {minimum}, got {value!r}") from None
    if number < minimum:
        raise UserError(f"{what} must be a whole number >= {minimum}, got {number}")
    return number


class SkippedLinesWarning(UserWarning):
    """Lines of an input file that were skipped (e.g. malformed lines of a measurement log).

    The command line prints each one as a single plain line on stderr, once.
    """
