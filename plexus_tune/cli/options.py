"""Types of numeric options: every number is checked where argparse parses it.

``type=count(1)`` reads a count as :func:`plexus_tune.numbers.parse_count` does (``1e3``,
``16M``) and wants at least the minimum; ``type=real(above=0)`` wants a finite float in
the bound. A bad value is an argparse usage error: one line naming the flag and the
value, exit code 2, before any work starts.
"""

from __future__ import annotations

import argparse

from plexus_tune.errors import UserError
from plexus_tune.numbers import MAX_COUNT, CountTooLarge, real_number, whole_number


def count(minimum: int = 1):
    """An argparse type: a whole number >= ``minimum`` (``1e3`` and ``16M`` accepted)."""

    def parse(text):
        try:
            return whole_number(text, "the value", minimum=minimum)
        except CountTooLarge:
            raise argparse.ArgumentTypeError(f"{text!r} is too large (at most 2^63 - 1 = {MAX_COUNT:,})") from None
        except UserError:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {minimum}, got {text!r}") from None

    parse.__name__ = f"count>={minimum}"
    return parse


def real(*, minimum: float | None = None, above: float | None = None):
    """An argparse type: a finite number, >= ``minimum`` and > ``above`` when given (no nan, no inf)."""

    def parse(text):
        try:
            return real_number(text, "the value", minimum=minimum, above=above)
        except UserError as exc:
            raise argparse.ArgumentTypeError(str(exc).replace("the value ", "", 1)) from None

    parse.__name__ = "real"
    return parse
