"""The trainer's epoch against its hardware floor, part by part (docs/trainer.md, Floor report).

Each part of a measured epoch (the critical rank's, mean over the measured epochs) is
set beside the time its compulsory work needs at the device's measured ceilings: the
copy rate B (bytes read + written per second, ``y.copy_(x)``) and the FP32 GEMM rate R
(a square GEMM). With u the element size, ib the index size, and the local shapes of
:func:`plexus_tune.model.shapes.layer_shapes` (r_d, r_o, c_i, c_o, w, f; z the shard's
nonzeros, C the local logit columns of the last layer)::

    spmm        sum_i traffic(z, r_d, r_o, c_i) + traffic(z, r_o, r_d, c_i)   / B  (model.spmm.spmm_traffic_bytes)
    gemm        sum_i max(6 r_d c_i c_o / R, u r_d (3 c_i + 3 c_o) / B)        (Q = H W, dW = H^T dQ, dH = dQ W^T)
    comm        bytes handed to the process groups / B                         (one host: the copy through memory)
    loss        u r_d C LOSS_PASSES / B
    optimizer   u P OPTIMIZER_PASSES / B, P = f c_0 + sum_i (w c_o + c_o)
    elementwise u sum_i r_d c_o (hidden layers: ACT_PASSES, last: DB_PASSES) / B
    sync        0: the rest of other_ms (framework overhead, idle device time)

The pass counts are those of the passes the trainer runs, from their one home
(:data:`plexus_tune.model.other.TRAINER_PASSES`: ACT_PASSES = hidden, DB_PASSES = last,
LOSS_PASSES = loss; OPTIMIZER_PASSES = accesses of the fused AdamW; docs/trainer.md).
"""

from __future__ import annotations

import numpy as np

from plexus_tune.measure.device import time_on_device
from plexus_tune.model.other import OPTIMIZER_ACCESSES, TRAINER_PASSES
from plexus_tune.model.spmm import spmm_traffic_bytes

#: Parts of the floor report, in print order.
FLOOR_PARTS = ("spmm", "gemm", "comm", "loss", "optimizer", "elementwise", "sync")
LOSS_PASSES = TRAINER_PASSES.loss
OPTIMIZER_PASSES = OPTIMIZER_ACCESSES["adamw-fused"]
ACT_PASSES = TRAINER_PASSES.hidden
DB_PASSES = TRAINER_PASSES.last


def measure_ceilings(device="cpu", *, copy_elements: int = 1 << 25, gemm_size: int = 2048,
                     gather_rows: int = 1 << 20, gather_cols: int = 64, min_time_s: float = 0.3) -> dict:
    """Copy rate (GB/s, bytes read + written), FP32 GEMM rate (GFLOP/s) and the rate of
    gathering rows of ``gather_cols`` floats in random order from a ``gather_rows``-row
    matrix (GB/s, rows read + written, ``index_select``), minimum time over samples
    (:func:`plexus_tune.measure.device.time_on_device`)."""
    import torch

    dev = torch.device(device)
    x = torch.rand(int(copy_elements), device=dev)
    y = torch.empty_like(x)
    t_copy, med_copy, _ = time_on_device(lambda: y.copy_(x), dev, min_samples=5, min_time_s=min_time_s)
    del x, y
    n = int(gemm_size)
    a = torch.rand(n, n, device=dev)
    b = torch.rand(n, n, device=dev)
    t_gemm, med_gemm, _ = time_on_device(lambda: a @ b, dev, min_samples=3, min_time_s=min_time_s)
    del a, b
    src = torch.rand(int(gather_rows), int(gather_cols), device=dev)
    idx = torch.randperm(int(gather_rows), device=dev)
    dst = torch.empty_like(src)
    t_gather, _, _ = time_on_device(lambda: torch.index_select(src, 0, idx, out=dst), dev, min_samples=3,
                                    min_time_s=min_time_s)
    return {
        "gather_gbps": 2.0 * 4 * src.numel() / (t_gather * 1e-3) / 1e9,
        "gather_cols": int(gather_cols),
        "copy_gbps": 8.0 * copy_elements / (t_copy * 1e-3) / 1e9,
        "copy_gbps_median": 8.0 * copy_elements / (med_copy * 1e-3) / 1e9,
        "gemm_gflops": 2.0 * n ** 3 / (t_gemm * 1e-3) / 1e9,
        "gemm_gflops_median": 2.0 * n ** 3 / (med_gemm * 1e-3) / 1e9,
        "copy_elements": int(copy_elements),
        "gemm_size": n,
    }


def floor_work(shapes, shard_nnz, *, classes_local: int, element_bytes: int = 4, index_bytes: int = 4,
               comm_bytes: float = 0.0, optimizer_passes: int = OPTIMIZER_PASSES) -> dict:
    """Per part: ``{"bytes": ..., "flops": ...}`` of one rank's epoch (module docstring).

    ``shapes``: the rank's :class:`LayerShapes` on one grid (scalars), ``shard_nnz``: its
    nonzeros per layer, ``classes_local``: C, ``comm_bytes``: bytes per epoch it hands to
    the process groups, ``optimizer_passes``: accesses per parameter of the optimizer run."""
    u = float(element_bytes)
    spmm = gemm_bytes = gemm_flops = elementwise = 0.0
    last = len(shapes) - 1
    params = 0.0
    for i, s in enumerate(shapes):
        z = float(shard_nnz[i])
        r_d, r_o, c_i, c_o = (float(v) for v in (s.r_d, s.r_o, s.c_i, s.c_o))
        spmm += float(spmm_traffic_bytes(z, r_d, r_o, c_i, u, index_bytes))
        spmm += float(spmm_traffic_bytes(z, r_o, r_d, c_i, u, index_bytes))
        gemm_flops += 6.0 * r_d * c_i * c_o
        gemm_bytes += u * r_d * (3.0 * c_i + 3.0 * c_o)
        elementwise += u * r_d * c_o * (ACT_PASSES if i < last else DB_PASSES)
        params += float(s.w_rows) * c_o + c_o
        if i == 0:
            params += float(s.feature_rows) * c_i
    r_last = float(shapes[-1].r_d)
    return {
        "spmm": {"bytes": spmm, "flops": 0.0},
        "gemm": {"bytes": gemm_bytes, "flops": gemm_flops},
        "comm": {"bytes": float(comm_bytes), "flops": 0.0},
        "loss": {"bytes": u * r_last * classes_local * LOSS_PASSES, "flops": 0.0},
        "optimizer": {"bytes": u * params * optimizer_passes, "flops": 0.0},
        "elementwise": {"bytes": elementwise, "flops": 0.0},
        "sync": {"bytes": 0.0, "flops": 0.0},
    }


def measured_parts(rows) -> dict:
    """Mean over epoch rows (one rank's timer rows, warm-up removed) of each part (ms);
    the parts add up to ``epoch_ms`` (``sync`` is the rest of ``other_ms``)."""
    def mean(key):
        return float(np.mean([r.get(key, 0.0) for r in rows]))

    out = {
        "spmm": mean("spmm_ms"),
        "gemm": mean("gemm_ms"),
        "comm": mean("comm_ms") + mean("quant_ms"),
        "loss": mean("loss_ms"),
        "optimizer": mean("optimizer_ms"),
        "elementwise": mean("elementwise_ms"),
    }
    out["sync"] = mean("other_ms") - out["loss"] - out["optimizer"] - out["elementwise"]
    out["epoch"] = mean("epoch_ms")
    return out


def floor_table(parts: dict, work: dict, ceilings: dict) -> list[dict]:
    """Rows ``{part, ms, floor_ms, ratio, basis}``: floor = max(bytes / B, flops / R)."""
    bw = ceilings["copy_gbps"] * 1e9
    rate = ceilings["gemm_gflops"] * 1e9
    rows = []
    for part in FLOOR_PARTS:
        w = work[part]
        t_bytes = w["bytes"] / bw * 1e3
        t_flops = w["flops"] / rate * 1e3 if w["flops"] else 0.0
        floor_ms = max(t_bytes, t_flops)
        basis = "flops" if t_flops > t_bytes else ("bytes" if w["bytes"] else "-")
        ms = parts[part]
        rows.append({"part": part, "ms": ms, "floor_ms": floor_ms, "bytes": w["bytes"], "flops": w["flops"],
                     "ratio": ms / floor_ms if floor_ms > 0 else float("nan"), "basis": basis})
    return rows
