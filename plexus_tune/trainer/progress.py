"""Per-epoch progress of a training run on stderr, shown by rank 0 only.

On a terminal: a rich progress bar (epoch, last epoch time, loss). Otherwise: one plain
line per epoch, so that a log file or a pipe shows where a long run is.
"""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)


class EpochProgress:
    """``update(epoch, epoch_ms, loss)`` after each epoch; ``close()`` at the end."""

    def __init__(self, epochs: int, warmup: int = 0, *, stream=None):
        self.epochs = int(epochs)
        self.warmup = int(warmup)
        self.stream = stream if stream is not None else sys.stderr
        self.bar = None
        if getattr(self.stream, "isatty", lambda: False)():
            self.bar = Progress(TextColumn("training"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                                TimeElapsedColumn(), console=Console(file=self.stream), transient=True)
            self.task = self.bar.add_task("", total=self.epochs)
            self.bar.start()

    def update(self, epoch: int, epoch_ms: float, loss: float) -> None:
        done = epoch + 1
        note = " (warm-up)" if epoch < self.warmup else ""
        if self.bar is not None:
            self.bar.update(self.task, completed=done, description=f"epoch {epoch_ms:.1f} ms on rank 0{note}, loss {loss:.4f}")
            return
        # rank 0's own time: the summary's epoch is the slowest rank's (the two differ by the imbalance)
        print(f"train: epoch {done}/{self.epochs}: {epoch_ms:.2f} ms on rank 0{note}, loss {loss:.6f}", file=self.stream,
              flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
