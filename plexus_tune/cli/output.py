"""What every command prints through: consoles with one wrapping policy, flags named in errors.

Wrapping policy: on a terminal, rich wraps text and fits tables to the terminal's width.
When the stream is not a terminal (a pipe, a file, a test), nothing is wrapped: paths,
records and messages stay on one line each, and tables take the width their content
needs.
"""

from __future__ import annotations

import contextlib
import sys
import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

from plexus_tune import paths
from plexus_tune.errors import UserError
from plexus_tune.measure import store

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
        raise UserError(f"{name} {exc}", parameter=exc.parameter) from None


def check_output_file(name: str, path, **kwargs):
    """:func:`plexus_tune.paths.check_output_file`, its error naming the flag ``name``."""
    with flag(name):
        return paths.check_output_file(path, **kwargs)


def check_output_dir(name: str, path, **kwargs):
    """:func:`plexus_tune.paths.check_output_dir`, its error naming the flag ``name``."""
    with flag(name):
        return paths.check_output_dir(path, **kwargs)


def check_log(name: str, path, **kwargs):
    """:func:`plexus_tune.measure.store.check_log` (a log to append to: ``kinds``, ``inputs``), its error naming ``name``."""
    with flag(name):
        return store.check_log(path, **kwargs)


class ProgressReporter:
    """``progress(stage, done, total)`` of a long step (e.g. :func:`plexus_tune.fit.profile.fit_profile`), on stderr.

    On a terminal: a rich progress bar per stage. Otherwise: one plain line when a stage
    ends and at most one every ``interval_s`` seconds while it runs.
    """

    def __init__(self, stream=None, interval_s: float = 10.0, *, command: str = "fit"):
        self.command = command
        self.stream = stream or sys.stderr
        self.interval_s = interval_s
        self.clock = time.monotonic
        self.started = self.last = self.clock()
        self.stage_started: dict = {}
        self.bar = None
        self.tasks: dict = {}
        if getattr(self.stream, "isatty", lambda: False)():
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                console=Console(file=self.stream), transient=False)
            self.bar.start()

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = self.clock()
        self.stage_started.setdefault(stage, now)
        if self.bar is not None:
            if stage not in self.tasks:
                self.tasks[stage] = self.bar.add_task(stage, total=total)
            self.bar.update(self.tasks[stage], completed=done, total=total)
            return
        finished = done >= total
        if finished or now - self.last >= self.interval_s:
            self.last = now
            what = "done" if finished else "running"
            print(f"{self.command}: {stage}: {done}/{total} {what} ({now - self.stage_started[stage]:.1f} s; {now - self.started:.1f} s in all)",
                  file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def format_ms(value: float) -> str:
    """A time in a table: 0, then 1 decimal from 100 (thousands separated), 2 from 1, else 3 significant digits."""
    if value == 0:
        return "0"
    if abs(value) >= 100:
        return f"{value:,.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"
