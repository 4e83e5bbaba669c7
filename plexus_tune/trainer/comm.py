"""Process groups of a grid, timed collectives and the per-rank phase timer."""

from __future__ import annotations

import itertools
import time
from collections import defaultdict

from plexus_tune.model.grid import AXIS_NAMES, coords_of, rank_of

#: Shared breakdown keys (ms per epoch) that every rank accumulates.
BREAKDOWN_KEYS = ("spmm_ms", "gemm_ms", "comm_ms", "comm_x_ms", "comm_y_ms", "comm_z_ms",
                  "all_reduce_ms", "all_gather_ms", "reduce_scatter_ms", "other_ms", "epoch_ms")
#: Extra per-epoch phases recorded beside the shared keys.
PHASE_KEYS = ("fwd_ms", "bwd_ms", "loss_ms", "optimizer_ms")
#: Exclusive phases that make up a rank's epoch: ``other_ms`` is the epoch less the others
#: (docs/records.md, Observed breakdown). A new timed phase that excludes the others joins here.
PARTITION_KEYS = ("spmm_ms", "gemm_ms", "comm_ms", "other_ms")
#: Partition phases in which a rank can block on other ranks (collectives).
WAITING_KEYS = ("comm_ms",)
#: Splits of a partition phase: keys that add up to it on every rank.
PARTITION_SPLITS = {"comm_ms": (("comm_x_ms", "comm_y_ms", "comm_z_ms"),
                                ("all_reduce_ms", "all_gather_ms", "reduce_scatter_ms"))}


class PhaseTimer:
    """Accumulates wall time (ms) per phase; on CUDA it synchronizes around every phase.

    ``comm(op, axis)`` adds one collective to ``comm_ms``, ``comm_<axis>_ms`` and
    ``<op>_ms``; ``other_ms`` is derived at the end of an epoch as ``epoch_ms`` less
    the other :data:`PARTITION_KEYS` (at least 0).
    """

    def __init__(self, cuda: bool = False):
        self.cuda = cuda
        self.current: dict[str, float] = defaultdict(float)
        self.epochs: list[dict[str, float]] = []

    def now(self) -> float:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        return time.perf_counter()

    def add(self, t0: float, *keys: str) -> float:
        dt = (self.now() - t0) * 1e3
        for key in keys:
            self.current[key] += dt
        return dt

    def add_comm(self, t0: float, op: str, axis: int) -> None:
        self.add(t0, "comm_ms", f"comm_{AXIS_NAMES[axis]}_ms", f"{op}_ms")

    def end_epoch(self, epoch_ms: float) -> dict[str, float]:
        row = {key: float(self.current.get(key, 0.0)) for key in BREAKDOWN_KEYS + PHASE_KEYS}
        row.update({key: float(v) for key, v in self.current.items() if key not in row})  # per-layer SpMMs
        row["epoch_ms"] = float(epoch_ms)
        timed = sum(row.get(key, 0.0) for key in PARTITION_KEYS if key != "other_ms")
        row["other_ms"] = max(0.0, epoch_ms - timed)
        self.epochs.append(row)
        self.current = defaultdict(float)
        return row


class GridComm:
    """The process groups of one grid (one per line along each axis) and timed collectives.

    Every rank creates every group in the same order (X lines, then Y, then Z), as
    ``torch.distributed.new_group`` requires; groups of size 1 are not created and
    their collectives are skipped. Group members are ordered by their coordinate on
    the axis, so a rank's index in its group equals its coordinate.
    """

    def __init__(self, grid, rank: int, timer: PhaseTimer, backend: str | None = None):
        import torch.distributed as dist

        self.dist = dist
        self.grid = tuple(int(g) for g in grid)
        self.rank = rank
        self.timer = timer
        self.coords = tuple(int(c) for c in coords_of(rank, self.grid))
        self.groups = [None, None, None]
        self.max_gathered_bytes = 0
        self._created = []
        for axis in range(3):
            size = self.grid[axis]
            if size == 1:
                continue
            others = [range(self.grid[a]) for a in range(3) if a != axis]
            for fixed in itertools.product(*others):
                members = []
                for k in range(size):
                    c = list(fixed)
                    c.insert(axis, k)
                    members.append(int(rank_of(c[0], c[1], c[2], self.grid)))
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

    # -- collectives (in place or returning new tensors), timed -----------------------
    def all_reduce(self, tensor, axis: int, op: str = "sum"):
        if self.grid[axis] == 1:
            return tensor
        t0 = self.timer.now()
        red = self.dist.ReduceOp.MAX if op == "max" else self.dist.ReduceOp.SUM
        self.dist.all_reduce(tensor, op=red, group=self.groups[axis])
        self.timer.add_comm(t0, "all_reduce", axis)
        return tensor

    def all_reduce_async(self, tensor, axis: int):
        """Start an all-reduce; returns a handle for :meth:`wait` (None if nothing to do)."""
        if self.grid[axis] == 1:
            return None
        t0 = self.timer.now()
        work = self.dist.all_reduce(tensor, group=self.groups[axis], async_op=True)
        self.timer.add_comm(t0, "all_reduce", axis)
        return work

    def wait(self, work, axis: int) -> None:
        if work is None:
            return
        t0 = self.timer.now()
        work.wait()
        self.timer.add_comm(t0, "all_reduce", axis)

    def all_gather(self, tensor, axis: int):
        """Concatenate the group's tensors along dim 0, in coordinate order."""
        size = self.grid[axis]
        if size == 1:
            return tensor
        import torch

        tensor = tensor.contiguous()
        out = torch.empty((size * tensor.shape[0],) + tuple(tensor.shape[1:]), dtype=tensor.dtype,
                          device=tensor.device)
        t0 = self.timer.now()
        self.max_gathered_bytes = max(self.max_gathered_bytes, out.numel() * out.element_size())
        gather = getattr(self.dist, "all_gather_single", None) or self.dist.all_gather_into_tensor
        gather(out, tensor, group=self.groups[axis])
        self.timer.add_comm(t0, "all_gather", axis)
        return out

    def reduce_scatter(self, tensor, axis: int):
        """Sum over the group, keep this rank's dim-0 block (coordinate order)."""
        size = self.grid[axis]
        if size == 1:
            return tensor
        import torch

        tensor = tensor.contiguous()
        out = torch.empty((tensor.shape[0] // size,) + tuple(tensor.shape[1:]), dtype=tensor.dtype,
                          device=tensor.device)
        t0 = self.timer.now()
        scatter = getattr(self.dist, "reduce_scatter_single", None) or self.dist.reduce_scatter_tensor
        scatter(out, tensor, group=self.groups[axis])
        self.timer.add_comm(t0, "reduce_scatter", axis)
        return out
