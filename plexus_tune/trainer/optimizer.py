"""The trainer's optimizer, built by name (names and byte counts: :mod:`plexus_tune.model.other`)."""

from __future__ import annotations

import torch

from plexus_tune.model.other import check_optimizer


def build_optimizer(name: str, params, *, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW over ``params`` as ``name`` says: adamw-fused (one kernel per step), adamw-foreach
    (multi-tensor elementwise ops) or adamw-for-loop (per-tensor elementwise ops)."""
    check_optimizer(name)
    params = list(params)
    if name == "adamw-fused":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=name == "adamw-foreach")
