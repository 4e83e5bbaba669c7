"""Microbenchmarks of the epoch's ``other`` part: elementwise passes, the optimizer step, a synchronisation.

Each op is timed on the device (:func:`plexus_tune.measure.device.time_on_device`) on
FP32 arrays of ``elements`` entries and logged as a bandwidth record with the bytes it
must move (element size x array accesses x elements, the counts of
:mod:`plexus_tune.model.other`)::

    copy            y.copy_(x)                          2 accesses
    relu            x.relu_() (in place, as the trainer) 2
    relu_backward   torch.where(x > 0, g, 0)            3
    column_sum      g.sum(dim=0) (the bias gradient)    1
    optimizer       one step of the trainer's optimizer over one parameter of
                    ``elements`` entries with its gradient set: ACCESSES[optimizer]
    sync            a one-element kernel and a device synchronisation (0 bytes)

``plexus-tune fit`` turns them into the profile's ``elementwise_gbps`` (median over the
elementwise ops at the largest size), ``optimizer_gbps`` and ``sync_us``.
"""

from __future__ import annotations

from plexus_tune.measure.device import device_info, statistic_text, synchronize, time_on_device
from plexus_tune.measure.records import BandwidthRecord
from plexus_tune.measure.store import environment_info, now_utc
from plexus_tune.model.other import OPTIMIZER_ACCESSES
from plexus_tune.resources import check_device_memory

#: The elementwise ops (those of docs/trainer.md, One epoch) and their array accesses per element.
ELEMENTWISE_OPS = {"copy": 2, "relu": 2, "relu_backward": 3, "column_sum": 1}
#: Every op :func:`bandwidth_benchmark` can time.
BANDWIDTH_OPS = (*ELEMENTWISE_OPS, "optimizer", "sync")
#: Columns of the arrays (the bias has one entry per column).
COLUMNS = 128


def _elementwise_call(torch, op: str, elements: int, device):
    rows = max(1, elements // COLUMNS)
    x = torch.rand(rows, COLUMNS, device=device) - 0.5
    y = torch.empty_like(x)
    if op == "copy":
        return lambda: y.copy_(x), x.numel()
    if op == "relu":
        return lambda: y.relu_(), x.numel()  # y holds no negative value after the first call: the pass still reads and writes
    g = torch.rand_like(x)
    if op == "relu_backward":
        return lambda: torch.where(x > 0, g, 0.0), x.numel()
    return lambda: g.sum(dim=0), x.numel()


def _optimizer_call(torch, name: str, elements: int, device):
    from plexus_tune.trainer.optimizer import build_optimizer

    param = torch.nn.Parameter(torch.rand(max(1, elements // COLUMNS), COLUMNS, device=device))
    param.grad = torch.rand_like(param)
    opt = build_optimizer(name, [param], lr=0.01, weight_decay=0.01)
    return opt.step, param.numel()


def _sync_call(torch, device):
    x = torch.zeros(1, device=device)

    def call():
        x.add_(1.0)
        synchronize(device)

    return call


def bandwidth_benchmark(device, *, sizes=(1 << 20, 1 << 24), ops=BANDWIDTH_OPS, optimizers=None, threads: int | None = None,
                        min_samples: int = 10, min_time_s: float = 0.2, progress=None) -> list[dict]:
    """Time every op of ``ops`` at every size (elements per array) on ``device``; bandwidth records.

    ``optimizers`` (default: every name of :data:`OPTIMIZER_ACCESSES`) are stepped for op
    optimizer; sync is timed once. ``progress()`` is called after each timing.
    """
    check_device_memory(4 * 4 * max(int(e) for e in sizes),  # at most 4 float32 arrays (an optimizer step)
                        f"timing {max(int(e) for e in sizes):,} elements per array (4 float32 arrays)", device)
    import torch

    if threads:
        torch.set_num_threads(int(threads))
    info = {**environment_info(), **device_info(device)}
    stamp = now_utc()
    records = []

    def record(op, elements, accesses, timing, optimizer=None):
        t_min, t_med, n = timing
        nbytes = 4 * accesses * elements
        records.append(BandwidthRecord(op=op, optimizer=optimizer, elements=int(elements), accesses=int(accesses),
                                       bytes=int(nbytes), time_ms=t_min, time_min_ms=t_min, time_median_ms=t_med,
                                       gbps=nbytes / (t_min * 1e-3) / 1e9 if nbytes else 0.0, repeats=n,
                                       statistic=statistic_text(device, n), device=info["device"],
                                       threads=torch.get_num_threads(), measured_at=stamp, machine_info=info).to_dict())
        if progress is not None:
            progress()

    timing = dict(min_samples=min_samples, min_time_s=min_time_s)
    for elements in sizes:
        for op in ops:
            if op in ELEMENTWISE_OPS:
                call, n = _elementwise_call(torch, op, int(elements), device)
                record(op, n, ELEMENTWISE_OPS[op], time_on_device(call, device, **timing))
            elif op == "optimizer":
                for name in optimizers or OPTIMIZER_ACCESSES:
                    call, n = _optimizer_call(torch, name, int(elements), device)
                    record(op, n, OPTIMIZER_ACCESSES[name], time_on_device(call, device, **timing), optimizer=name)
    if "sync" in ops:
        record("sync", 0, 0, time_on_device(_sync_call(torch, device), device, **timing))
    return records
