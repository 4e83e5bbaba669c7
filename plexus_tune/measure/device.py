"""The device a microbenchmark runs on: choosing it, describing it, timing calls on it.

Timing convention (every ``calibrate`` microbenchmark on a device, docs/records.md):
``warmup`` untimed calls, then samples until at least ``min_samples`` were taken and
``min_time_s`` has passed (at most ``max_samples``). On CUDA each sample is one call
between two CUDA events (no host synchronisation inside the sample); on the CPU a sample
times a loop of calls lasting about ``sample_s`` with the wall clock, divided by the
calls. The records keep the minimum (``time_ms``, ``time_min_ms``) and the median
(``time_median_ms``) of the samples.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Callable

from plexus_tune.errors import UserError

DEVICE_KINDS = ("cpu", "cuda")


def resolve_device(name: str = "cpu"):
    """The torch device named ``name`` (cpu, cuda, cuda:N); a UserError when no such CUDA device is visible."""
    import torch

    text = str(name or "cpu").strip().lower()
    kind, _, index = text.partition(":")
    if kind not in DEVICE_KINDS or (index and (kind == "cpu" or not index.isdigit())):
        raise UserError(f"unknown device {name!r}; choose cpu, cuda or cuda:N", parameter="device")
    if kind == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserError(f"device {text}: no CUDA device is visible to torch (torch.cuda.is_available() is false); "
                        "run on a GPU node or time the CPU instead", parameter="device")
    if index and int(index) >= torch.cuda.device_count():
        raise UserError(f"device {text}: only {torch.cuda.device_count()} CUDA device(s) are visible", parameter="device")
    return torch.device(text)


def check_backend_devices(backend: str | None) -> None:
    """UserError, before any rank starts, if ``backend`` is nccl and torch sees no CUDA device."""
    if backend != "nccl":
        return
    import torch

    if not torch.cuda.is_available():
        raise UserError("the nccl backend needs CUDA GPUs, and torch sees none; use the gloo backend on CPUs",
                        parameter="backend")


def device_info(device) -> dict:
    """Name, driver, CUDA, torch and PyG versions of ``device`` (CPU: its name 'cpu' and the versions)."""
    import torch

    from importlib import metadata

    info = {"device": "cpu", "torch": torch.__version__}
    try:  # the installed version, without importing PyG (seconds)
        info["torch_geometric"] = metadata.version("torch_geometric")
    except metadata.PackageNotFoundError:
        info["torch_geometric"] = None
    if getattr(device, "type", str(device)) == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(device=torch.cuda.get_device_name(device), cuda=torch.version.cuda, sm_count=props.multi_processor_count,
                    device_memory_bytes=int(props.total_memory), driver=_driver_version())
    return info


def _driver_version() -> str | None:
    """The NVIDIA driver version from nvidia-smi (None where it cannot be asked)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def synchronize(device) -> None:
    """Wait for the work queued on ``device`` (nothing to do on the CPU)."""
    if getattr(device, "type", str(device)) == "cuda":
        import torch

        torch.cuda.synchronize(device)


def time_on_device(fn: Callable[[], object], device, *, warmup: int = 2, min_samples: int = 10, min_time_s: float = 0.2,
                   max_samples: int = 200, sample_s: float = 0.002) -> tuple[float, float, int]:
    """(min ms, median ms, samples) of one ``fn()`` call on ``device`` (module docstring)."""
    import torch

    cuda = getattr(device, "type", str(device)) == "cuda"
    t0 = time.perf_counter()
    for _ in range(max(1, warmup)):
        fn()
    synchronize(device)
    one = (time.perf_counter() - t0) / max(1, warmup)
    number = 1 if cuda else max(1, min(1000, int(sample_s / max(one, 1e-7))))
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < max_samples and (len(samples) < min_samples or time.perf_counter() - start < min_time_s):
        if cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(float(begin.elapsed_time(end)))
        else:
            t = time.perf_counter()
            for _ in range(number):
                fn()
            samples.append((time.perf_counter() - t) / number * 1e3)
    return float(min(samples)), float(statistics.median(samples)), len(samples)


def statistic_text(device, samples: int) -> str:
    """How time_ms was reduced, and with which timer."""
    timer = "CUDA-event" if getattr(device, "type", str(device)) == "cuda" else "wall-clock"
    return f"min over {samples} {timer} samples after warm-up (median in time_median_ms)"
