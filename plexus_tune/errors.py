"""Errors that the command line reports as one line with exit code 2."""

from __future__ import annotations

import math


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


_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_count(text, what: str = "value") -> int:
    """A count written ``4096``, ``65_536``, ``1e6``, ``16M`` or ``4k`` (k/M/G/T are powers of
    ten) as an int; UserError naming ``what`` and the text otherwise. Every count of every
    command is read by this one function, so ``1e3`` means 1000 everywhere."""
    if isinstance(text, bool):
        raise UserError(f"{what} must be a whole number such as 4096, 1e6 or 16M, got {text!r}")
    if isinstance(text, int):
        return text
    t = str(text).strip().replace("_", "")
    if t and t[-1].lower() in _SUFFIX and t[:-1]:
        mult, t = _SUFFIX[t[-1].lower()], t[:-1]
    else:
        mult = 1
    try:
        value = int(t) * mult
    except ValueError:
        try:
            number = float(t) * mult
        except ValueError:
            raise UserError(f"{what} must be a whole number such as 4096, 1e6 or 16M, got {text!r}") from None
        if not math.isfinite(number) or number != int(number):
            raise UserError(f"{what} must be a whole number, got {text!r}") from None
        if abs(number) >= 2**63:
            raise UserError(f"{what} {text!r} is too large (at most 2^63 - 1)") from None
        value = int(number)
    return value


def whole_number(value, what: str, *, minimum: int = 1) -> int:
    """``value`` (an int or its text, :func:`parse_count`) as an int >= ``minimum``; a UserError saying ``what`` is wrong otherwise."""
    try:
        number = parse_count(value, what)
    except UserError:
        raise UserError(f"{what} must be a whole number >= {minimum}, got {value!r}") from None
    if number < minimum:
        raise UserError(f"{what} must be a whole number >= {minimum}, got {number}")
    return number


def real_number(value, what: str, *, minimum: float | None = None, above: float | None = None) -> float:
    """``value`` as a finite float, >= ``minimum`` and > ``above`` when given; UserError naming ``what`` and the value otherwise."""
    try:
        number = float(str(value).strip())
    except ValueError:
        raise UserError(f"{what} must be a number, got {value!r}") from None
    bound = (f" >= {minimum:g}" if minimum is not None else "") + (f" > {above:g}" if above is not None else "")
    if not math.isfinite(number) or (minimum is not None and number < minimum) or (above is not None and number <= above):
        raise UserError(f"{what} must be a finite number{bound}, got {value!r}")
    return number


class CorruptCacheWarning(UserWarning):
    """A cache entry could not be read: it is ignored and recomputed (shown as one line)."""


class SkippedLinesWarning(UserWarning):
    """Lines of an input file that were skipped (e.g. malformed lines of a measurement log).

    The command line prints each one as a single plain line on stderr, once.
    """
