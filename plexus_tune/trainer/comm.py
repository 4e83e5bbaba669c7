"""Process groups of a grid, timed collectives and the per-rank phase timer.

The collectives of the 3D layer name their class (``aggregation``, ``combination``,
``gather``; :data:`plexus_tune.model.comm_precision.COMM_CLASSES`) and are sent at
that class's precision (docs/comm-precision.md); a collective without a class (the
loss's row maximum and sums, accuracy counts) is always a plain FP32 collective.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict

from plexus_tune.model.comm_precision import CommPrecision, parse_comm_precision
from plexus_tune.model.breakdown import BREAKDOWN_KEYS, EPOCH_PARTS, PART_SPLITS
from plexus_tune.model.grid import AXIS_NAMES, coords_of, rank_of

#: What every rank's timer accumulates (ms per epoch): the shared breakdown keys
#: (:data:`plexus_tune.model.breakdown.BREAKDOWN_KEYS`; ``quant_ms`` is the local work of
#: reduced-precision collectives, kept out of ``comm_ms``) and the epoch.
TIMER_KEYS = (*BREAKDOWN_KEYS, "epoch_ms")
#: Extra per-epoch phases recorded beside the shared keys.
PHASE_KEYS = ("fwd_ms", "bwd_ms", "loss_ms", "optimizer_ms")
#: Exclusive phases that make up a rank's epoch: ``other_ms`` is the epoch less the others
#: (docs/records.md, Observed breakdown). A new timed phase that excludes the others joins
#: :data:`plexus_tune.model.breakdown.EPOCH_PARTS`.
PARTITION_KEYS = EPOCH_PARTS
#: Partition phases in which a rank can block on other ranks (collectives).
WAITING_KEYS = ("comm_ms",)
#: Splits of a partition phase: keys that add up to it on every rank.
PARTITION_SPLITS = PART_SPLITS


class PhaseTimer:
    """Per-phase time (ms) of each epoch, without stalling a GPU.

    On CPU the clock is the host's (``time.perf_counter``). On CUDA every phase is a pair
    of CUDA events recorded on the current stream; nothing waits for them during the
    epoch. An epoch's events are read by :meth:`resolve` once its end event has passed
    (one host synchronisation when asked to wait, none otherwise), so the host keeps
    queueing work. ``comm(op, axis)`` adds one collective to ``comm_ms``,
    ``comm_<axis>_ms`` and ``<op>_ms``; ``other_ms`` is the epoch less the other
    :data:`PARTITION_KEYS` (at least 0), so the parts add up to the epoch
    (docs/records.md, Observed breakdown). ``host_syncs`` counts the synchronisations
    the timer made. ``event_factory`` (tests) replaces ``torch.cuda.Event``.
    """

    def __init__(self, cuda: bool = False, event_factory=None):
        self.cuda = bool(cuda)
        if event_factory is None and self.cuda:
            import torch

            def event_factory():
                return torch.cuda.Event(enable_timing=True)
        self._event = event_factory
        self.current: dict[str, float] = defaultdict(float)  # ms known on the host, this epoch
        self._intervals: list = []  # (start event, end event, keys) of this epoch
        self._pending: list = []  # finished epochs whose events are not read yet
        self._epochs: list[dict[str, float]] = []
        self.host_syncs = 0

    @property
    def uses_events(self) -> bool:
        return self._event is not None

    def now(self):
        """A start mark: the host clock (s), or a recorded event on CUDA."""
        if self._event is None:
            return time.perf_counter()
        mark = self._event()
        mark.record()
        return mark

    def add(self, t0, *keys: str) -> None:
        """Add the time since the mark ``t0`` to every key (on CUDA once the events are read)."""
        if self._event is None:
            dt = (time.perf_counter() - t0) * 1e3
            for key in keys:
                self.current[key] += dt
            return
        end = self._event()
        end.record()
        self._intervals.append((t0, end, keys))

    def add_ms(self, ms: float, *keys: str) -> None:
        """Add a duration measured on the host (see :meth:`host_clock`)."""
        for key in keys:
            self.current[key] += float(ms)

    def host_clock(self) -> float:
        """The host clock after the device has finished its queued work, for work timed on
        the host (the reduced-precision collectives): on CUDA one synchronisation."""
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            self.host_syncs += 1
        return time.perf_counter()

    def add_comm(self, t0, op: str, axis: int) -> None:
        self.add(t0, "comm_ms", f"comm_{AXIS_NAMES[axis]}_ms", f"{op}_ms")

    def end_epoch(self, t_epoch) -> None:
        """Close the epoch that started at the mark ``t_epoch``."""
        if self._event is None:
            self._epochs.append(self._row(self.current, (time.perf_counter() - t_epoch) * 1e3))
        else:
            end = self._event()
            end.record()
            self._pending.append((t_epoch, end, self._intervals, self.current))
        self._intervals, self.current = [], defaultdict(float)

    def resolve(self, wait: bool = False) -> list[dict[str, float]]:
        """Read the finished epochs' events; ``wait``: all of them (one synchronisation),
        else only those already passed. Returns the rows read now, oldest first."""
        rows = []
        while self._pending:
            start, end, intervals, host = self._pending[0]
            if not wait and not end.query():
                break
            if wait and not end.query():
                end.synchronize()
                self.host_syncs += 1
            values = defaultdict(float, host)
            for a, b, keys in intervals:
                dt = a.elapsed_time(b)
                for key in keys:
                    values[key] += dt
            rows.append(self._row(values, start.elapsed_time(end)))
            self._pending.pop(0)
        self._epochs.extend(rows)
        return rows

    @property
    def epochs(self) -> list[dict[str, float]]:
        """Every closed epoch's row (reads pending events, waiting for them)."""
        self.resolve(wait=True)
        return self._epochs

    @staticmethod
    def _row(values, epoch_ms: float) -> dict[str, float]:
        row = {key: float(values.get(key, 0.0)) for key in TIMER_KEYS + PHASE_KEYS}
        row.update({key: float(v) for key, v in values.items() if key not in row})  # per-layer SpMMs
        row["epoch_ms"] = float(epoch_ms)
        timed = sum(row.get(key, 0.0) for key in PARTITION_KEYS if key != "other_ms")
        row["other_ms"] = max(0.0, epoch_ms - timed)
        return row


def axis_groups(grid, offset: int = 0) -> list[tuple[int, list[int]]]:
    """(axis, member ranks) of every process group along every axis of size > 1 of ``grid``,
    in the order every rank must create them (axis, then the other coordinates); ranks are
    :func:`plexus_tune.model.grid.rank_of` plus ``offset``."""
    out = []
    for axis in range(3):
        size = int(grid[axis])
        if size == 1:
            continue
        others = [range(int(grid[a])) for a in range(3) if a != axis]
        for fixed in itertools.product(*others):
            members = []
            for k in range(size):
                c = list(fixed)
                c.insert(axis, k)
                members.append(offset + int(rank_of(c[0], c[1], c[2], grid)))
            out.append((axis, members))
    return out


class GridComm:
    """The process groups of one grid (one per line along each axis) and timed collectives.

    Every rank creates every group in the same order (X lines, then Y, then Z), as
    ``torch.distributed.new_group`` requires; groups of size 1 are not created and
    their collectives are skipped. Group members are ordered by their coordinate on
    the axis, so a rank's index in its group equals its coordinate.

    ``precision`` (a :class:`CommPrecision` or its text) sets the precision of each
    collective class; ``counter`` (:class:`plexus_tune.trainer.precision.CommCounter`)
    collects the bytes each class hands to the process groups for other ranks, at
    every precision (FP32 by the ring convention of docs/comm-precision.md).
    Rounding noise comes from a generator seeded by ``seed`` and the rank.
    """

    #: defaults for instances built without ``__init__`` (test stand-ins)
    precision = CommPrecision()
    counter = None
    generator = None

    def __init__(self, grid, rank: int, timer: PhaseTimer, backend: str | None = None,
                 precision=None, seed: int = 0):
        import torch
        import torch.distributed as dist

        from plexus_tune.trainer.precision import CommCounter

        self.dist = dist
        self.grid = tuple(int(g) for g in grid)
        self.rank = rank
        self.timer = timer
        if precision is not None:
            self.precision = precision if isinstance(precision, CommPrecision) else parse_comm_precision(precision)
        self.counter = CommCounter()
        self.generator = torch.Generator().manual_seed(1_000_003 * int(seed) + int(rank))
        self.coords = tuple(int(c) for c in coords_of(rank, self.grid))
        self.groups = [None, None, None]
        self.max_gathered_bytes = 0
        self._created = []
        for axis, members in axis_groups(self.grid):
            group = dist.new_group(members, backend=backend)
            self._created.append(group)
            if rank in members:
                self.groups[axis] = group

    def size(self, axis: int) -> int:
        return self.grid[axis]

    def close(self) -> None:
        for group in self._created:
            try:
                self.dist.destroy_process_group(group)
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass
        self._created = []

    # -- precision ------------------------------------------------------------------
    def _precision_of(self, comm_class: str | None) -> str:
        return "fp32" if comm_class is None else self.precision.of(comm_class)

    def _count(self, comm_class: str | None, nbytes: int) -> None:
        if comm_class is not None and self.counter is not None:
            self.counter.add(comm_class, nbytes)

    def _reduced(self, fn, tensor, axis: int, op: str, comm_class: str, **kwargs):
        """Run a reduced-precision collective of :mod:`plexus_tune.trainer.precision`;
        its local work goes to ``quant_ms``, the rest to the collective's time."""
        from plexus_tune.trainer import precision as prec

        counter = self.counter if self.counter is not None else prec.CommCounter()
        quant_before = counter.quant_ms
        t0 = self.timer.host_clock()  # its codec is timed on the host
        out = fn(tensor, self.groups[axis], self._precision_of(comm_class), generator=self.generator,
                 counter=counter, comm_class=comm_class, **kwargs)
        total_ms = (self.timer.host_clock() - t0) * 1e3
        quant_ms = min(counter.quant_ms - quant_before, total_ms)
        self.timer.add_ms(total_ms - quant_ms, "comm_ms", f"comm_{AXIS_NAMES[axis]}_ms", f"{op}_ms")
        self.timer.add_ms(quant_ms, "quant_ms")
        return out

    # -- collectives (in place or returning new tensors), timed -----------------------
    def all_reduce(self, tensor, axis: int, op: str = "sum", comm_class: str | None = None):
        """Sum (or max) over the axis group in place; a ``comm_class`` sends at its precision."""
        size = self.grid[axis]
        if size == 1:
            return tensor
        if op == "sum" and self._precision_of(comm_class) != "fp32":
            from plexus_tune.trainer import precision as prec

            return self._reduced(prec.all_reduce, tensor, axis, "all_reduce", comm_class)
        t0 = self.timer.now()
        red = self.dist.ReduceOp.MAX if op == "max" else self.dist.ReduceOp.SUM
        self.dist.all_reduce(tensor, op=red, group=self.groups[axis])
        self.timer.add_comm(t0, "all_reduce", axis)
        self._count(comm_class, 2 * (size - 1) * (-(-tensor.numel() // size)) * tensor.element_size())
        return tensor

    def all_reduce_async(self, tensor, axis: int, comm_class: str | None = None):
        """Start an all-reduce; returns a handle for :meth:`wait` (None if nothing to do).

        A reduced-precision all-reduce is two process-group calls with local work
        between them, so it runs to completion here and returns None."""
        size = self.grid[axis]
        if size == 1:
            return None
        if self._precision_of(comm_class) != "fp32":
            self.all_reduce(tensor, axis, comm_class=comm_class)
            return None
        t0 = self.timer.now()
        work = self.dist.all_reduce(tensor, group=self.groups[axis], async_op=True)
        self.timer.add_comm(t0, "all_reduce", axis)
        self._count(comm_class, 2 * (size - 1) * (-(-tensor.numel() // size)) * tensor.element_size())
        return work

    def wait(self, work, axis: int) -> None:
        if work is None:
            return
        t0 = self.timer.now()
        work.wait()
        self.timer.add_comm(t0, "all_reduce", axis)

    def all_gather(self, tensor, axis: int, comm_class: str | None = None):
        """Concatenate the group's tensors along dim 0, in coordinate order."""
        size = self.grid[axis]
        if size == 1:
            return tensor
        import torch

        tensor = tensor.contiguous()
        gathered_bytes = size * tensor.numel() * tensor.element_size()
        self.max_gathered_bytes = max(self.max_gathered_bytes, gathered_bytes)
        if self._precision_of(comm_class) != "fp32":
            from plexus_tune.trainer import precision as prec

            return self._reduced(prec.all_gather, tensor, axis, "all_gather", comm_class)
        out = torch.empty((size * tensor.shape[0],) + tuple(tensor.shape[1:]), dtype=tensor.dtype,
                          device=tensor.device)
        t0 = self.timer.now()
        gather = getattr(self.dist, "all_gather_single", None) or self.dist.all_gather_into_tensor
        gather(out, tensor, group=self.groups[axis])
        self.timer.add_comm(t0, "all_gather", axis)
        self._count(comm_class, (size - 1) * tensor.numel() * tensor.element_size())
        return out

    def reduce_scatter(self, tensor, axis: int, comm_class: str | None = None):
        """Sum over the group, keep this rank's dim-0 block (coordinate order)."""
        size = self.grid[axis]
        if size == 1:
            return tensor
        import torch

        tensor = tensor.contiguous()
        if self._precision_of(comm_class) != "fp32":
            from plexus_tune.trainer import precision as prec

            return self._reduced(prec.reduce_scatter, tensor, axis, "reduce_scatter", comm_class)
        out = torch.empty((tensor.shape[0] // size,) + tuple(tensor.shape[1:]), dtype=tensor.dtype,
                          device=tensor.device)
        t0 = self.timer.now()
        scatter = getattr(self.dist, "reduce_scatter_single", None) or self.dist.reduce_scatter_tensor
        scatter(out, tensor, group=self.groups[axis])
        self.timer.add_comm(t0, "reduce_scatter", axis)
        self._count(comm_class, (size - 1) * out.numel() * out.element_size())
        return out
