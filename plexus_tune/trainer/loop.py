"""The epoch loop every family trainer runs, the optimizer and the memory accounting.

A family trainer (:mod:`plexus_tune.trainer.plexus3d`, :mod:`plexus_tune.trainer.cagnet`,
:mod:`plexus_tune.trainer.partitioned`) is a :class:`RankTrainer` whose constructor lays
out the graph its own way (its shards, parameters, ``loss_shard``, ``comm`` and
``timer``) and whose ``forward`` runs its layers; :meth:`RankTrainer.train` zeroes the
gradients, runs the forward pass, the sharded loss and the backward pass, steps the
optimizer, and reads the timers, the byte counter and the accuracy.
"""

from __future__ import annotations

import os
import resource
import signal

import numpy as np
import torch

from plexus_tune.model.other import trainer_optimizer
from plexus_tune.trainer.loss import ShardedCrossEntropy, accuracy_counts, accuracy_from_counts
from plexus_tune.trainer.optimizer import build_optimizer
from plexus_tune.trainer.progress import EpochProgress

FAIL_ENV = "PLEXUS_TUNE_INJECT_FAILURE"  # "rank:epoch:mode", mode in raise|kill|oom

def _peak_rss_bytes() -> int:
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _current_rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _maybe_fail(rank: int, epoch: int) -> None:
    """Failure injection for tests of the failure path: ``PLEXUS_TUNE_INJECT_FAILURE=rank:epoch:mode``."""
    spec = os.environ.get(FAIL_ENV)
    if not spec:
        return
    want_rank, want_epoch, mode = spec.split(":")
    if int(want_rank) != rank or int(want_epoch) != epoch:
        return
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "oom":
        torch.empty(2**50, dtype=torch.uint8)  # raises: cannot allocate
    raise RuntimeError(f"injected failure on rank {rank} at epoch {epoch}")


def make_adamw(params, *, lr: float, weight_decay: float, device_type: str = "cpu"):
    """The trainer's AdamW (:func:`plexus_tune.model.other.trainer_optimizer`: fused on CUDA
    and CPU, one pass that reads the parameter, gradient and both moments and writes the
    parameter and both moments) and its name; ``adamw-foreach`` where this torch or
    device lacks the fused kernel (docs/trainer.md)."""
    name = trainer_optimizer(device_type)
    params = list(params)
    try:
        return build_optimizer(name, params, lr=lr, weight_decay=weight_decay), name
    except (RuntimeError, TypeError, ValueError):
        return build_optimizer("adamw-foreach", params, lr=lr, weight_decay=weight_decay), "adamw-foreach"


class RankTrainer:
    """One rank of a family's trainer: the epoch loop (module docstring). Subclasses set
    ``config``, ``rank``, ``device``, ``timer``, ``comm``, ``shards`` (each with a
    ``saved_bytes`` list), ``loss_shard``, ``optimizer``, ``persistent_bytes`` and
    ``shard_nnz``, and define ``forward``, ``output_block`` and ``record_shapes``."""

    def input_features(self, array) -> torch.Tensor:
        """This rank's block of the input features: a parameter, or with ``config.fixed_features``
        a plain tensor (no gradient, so no layer-0 feature gradient and no optimizer state)."""
        t = torch.tensor(np.asarray(array), dtype=self.dtype, device=self.device)
        return t if getattr(self.config, "fixed_features", False) else torch.nn.Parameter(t)

    def place_optimizer(self, tensors) -> None:
        """The optimizer over the trained ``tensors`` and their persistent bytes: a trained tensor
        with its gradient and two AdamW moments (4 copies), a fixed one once."""
        tensors = list(tensors)
        trained = [t for t in tensors if t.requires_grad]
        self.optimizer, self.optimizer_name = make_adamw(trained, lr=self.config.lr,
                                                         weight_decay=self.config.weight_decay,
                                                         device_type=self.device.type)
        self.persistent_bytes += sum((4 if t.requires_grad else 1) * t.numel() * t.element_size() for t in tensors)

    def train(self, epochs: int):
        """Train ``epochs`` epochs; returns the losses (host floats).

        Losses and accuracy counts stay on the device during an epoch; they are summed
        over the row axis and read on the host every ``config.extra["stats_every"]``
        epochs (default 1; 0: once, after the last epoch), together with the phase timers
        (:class:`PhaseTimer`). With the progress display they are read every epoch."""
        self.comm_epochs = []  # per epoch: bytes sent to other ranks per collective class
        self.accuracy = {"train": [], "valid": [], "test": []}  # per epoch, of the epoch's forward pass
        self.losses = []
        self.peak_tracked_bytes = self.persistent_bytes
        self.peak_rss_delta = 0
        rss_start = _current_rss_bytes()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        progress = None
        if self.rank == 0 and self.config.extra.get("progress"):
            progress = EpochProgress(epochs, self.config.warmup)
        try:
            self._train_epochs(epochs, rss_start, progress)
            return self.losses
        finally:
            if progress is not None:
                progress.close()

    def _read_stats(self, losses, count_list, progress) -> None:
        """Sum the epochs' accuracy counts over the row axis (one collective) and read them,
        with the losses and the timers, on the host (one synchronisation on CUDA); empties
        both lists."""
        if not losses:
            return
        shard = self.loss_shard
        counts = torch.stack(count_list)
        dist = self.comm.dist
        shard.sum_rows(counts, lambda t, group: dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group))
        host = torch.cat([torch.stack(losses).to(torch.float64).reshape(-1, 1), counts.to(torch.float64)], dim=1)
        host = host.cpu().tolist()
        self.timer.resolve(wait=True)
        for row in host:
            self.losses.append(float(row[0]))
            for part, value in accuracy_from_counts(row[1:]).items():
                self.accuracy[part].append(value)
            if progress is not None:
                epoch = len(self.losses) - 1
                progress.update(epoch, self.timer._epochs[epoch]["epoch_ms"], self.losses[-1])
        losses.clear()
        count_list.clear()

    def _train_epochs(self, epochs, rss_start, progress):
        # the same cadence on every rank: the row-axis sum is a collective
        every = 1 if self.config.extra.get("progress") else int(self.config.extra.get("stats_every", 1))
        pending_losses, pending_counts = [], []
        last_logits = None
        for epoch in range(epochs):
            _maybe_fail(self.rank, epoch)
            if self.comm.counter is not None:
                self.comm.counter.reset()
            for shard in self.shards:
                shard.saved_bytes.clear()
            t_epoch = self.timer.now()
            t0 = self.timer.now()
            self.optimizer.zero_grad(set_to_none=True)
            self.timer.add(t0, "optimizer_ms")
            logits = self.forward()
            self.timer.add(t_epoch, "fwd_ms")
            rss_mid_epoch = _current_rss_bytes()  # activations saved for backward are all alive here
            loss = ShardedCrossEntropy.apply(logits, self.loss_shard)  # times its own loss_ms
            t0 = self.timer.now()
            loss.backward()
            self.timer.add(t0, "bwd_ms")
            t0 = self.timer.now()
            self.optimizer.step()
            self.timer.add(t0, "optimizer_ms")
            self.timer.end_epoch(t_epoch)
            if self.comm.counter is not None:
                self.comm_epochs.append(dict(self.comm.counter.bytes))
            last_logits = logits.detach()
            pending_losses.append(loss.detach())
            pending_counts.append(accuracy_counts(last_logits, self.loss_shard))
            if every > 0 and len(pending_losses) >= every:
                self._read_stats(pending_losses, pending_counts, progress)
            saved = sum(sum(s.saved_bytes) for s in self.shards)
            # saved H and Q of every layer, their gradients, and the largest gathered buffer
            tracked = self.persistent_bytes + 2 * saved + self.comm.max_gathered_bytes
            self.peak_tracked_bytes = max(self.peak_tracked_bytes, tracked)
            self.peak_rss_delta = max(self.peak_rss_delta, rss_mid_epoch - rss_start)
        self._read_stats(pending_losses, pending_counts, progress)
        self.last_logits = last_logits

    def memory(self) -> dict:
        out = {"tracked_bytes": int(self.peak_tracked_bytes), "rss_bytes": _peak_rss_bytes(),
               "rss_delta_bytes": int(self.peak_rss_delta), "persistent_bytes": int(self.persistent_bytes)}
        if self.device.type == "cuda":
            out["cuda_max_allocated_bytes"] = int(torch.cuda.max_memory_allocated(self.device))
        return out

    def close(self) -> None:
        self.comm.close()

