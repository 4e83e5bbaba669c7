"""Numbers given as text (counts such as ``16M`` or ``1e6``, bounded whole and real numbers),
read one way everywhere; bad input is a :class:`plexus_tune.errors.UserError` naming it."""

from __future__ import annotations

import math

from plexus_tune.errors import UserError

_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
#: the largest count (a signed 64-bit integer, as numpy and torch hold it)
MAX_COUNT = 2**63 - 1


class CountTooLarge(UserError):
    """A count beyond :data:`MAX_COUNT`."""


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
        value = int(number)
    if abs(value) > MAX_COUNT:
        raise CountTooLarge(f"{what} {text!r} is too large (at most 2^63 - 1 = {MAX_COUNT:,})")
    return value


def whole_number(value, what: str, *, minimum: int = 1) -> int:
    """``value`` (an int or its text, :func:`parse_count`) as an int >= ``minimum``; a UserError saying ``what`` is wrong otherwise."""
    try:
        number = parse_count(value, what)
    except CountTooLarge:
        raise
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
