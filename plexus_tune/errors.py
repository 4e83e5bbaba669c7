"""Errors that the command line reports as one line with exit code 2, and Ctrl-C held across
steps that must finish together."""

from __future__ import annotations

import contextlib
import signal
import threading


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


class HeldSignals:
    """Signals held by :func:`signals_deferred`: ``pending`` (numbers, in arrival order) and the
    handlers in effect before the hold (``previous``)."""

    def __init__(self, previous: dict, pending: list[int]):
        self.previous = previous
        self.pending = pending

    @contextlib.contextmanager
    def released(self):
        """Inside the block the signals act as before the hold; any held so far are delivered first."""
        hold = {signum: signal.signal(signum, handler) for signum, handler in self.previous.items()}
        try:
            self.deliver()
            yield
        finally:
            for signum, handler in hold.items():
                signal.signal(signum, handler)

    def deliver(self) -> None:
        """Raise each held signal once, in arrival order, under the handlers in effect now."""
        pending = list(dict.fromkeys(self.pending))
        self.pending.clear()
        for signum in pending:
            signal.raise_signal(signum)

    def releasing(self, fn):
        """``fn`` that runs with the signals released (:meth:`released`)."""
        def call(*args, **kwargs):
            with self.released():
                return fn(*args, **kwargs)
        return call


@contextlib.contextmanager
def signals_deferred(signums=(signal.SIGINT, signal.SIGTERM)):
    """Hold ``signums`` (Ctrl-C, SIGTERM) in the block and deliver each once as it ends; yields
    the :class:`HeldSignals`, whose ``released()`` lets them through in a part of the block.

    For steps that must finish together (start a process and record it; a study's
    bookkeeping between trials). Off the main thread, or for a signal whose handler was not
    set from Python, nothing is held.
    """
    previous: dict = {}
    pending: list[int] = []
    if threading.current_thread() is threading.main_thread():
        for signum in signums:
            if signal.getsignal(signum) is not None:
                previous[signum] = signal.signal(signum, lambda number, _frame: pending.append(number))
    held = HeldSignals(previous, pending)
    try:
        yield held
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        held.deliver()


class SkippedLinesWarning(UserWarning):
    """Lines of an input file that were skipped (e.g. malformed lines of a measurement log).

    The command line prints each one as a single plain line on stderr, once.
    """
