"""The ``other`` part of an epoch: elementwise passes, the optimizer and synchronisation.

Everything in an epoch that is neither SpMM, GEMM nor communication, from the bytes it
must move at measured bandwidths (docs/model.md, "Other: the rest of the epoch"). For
one rank, u the element size, with the local shapes of
:func:`plexus_tune.model.shapes.layer_shapes` (r_d rows and c_o columns of Q_i, w rows of
W_i, f rows of the input features)::

    elementwise_bytes = u sum_i r_d c_o ([i < L-1] HIDDEN + [i = L-1] (LAST + LOSS)) + u P GRADIENT
    optimizer_bytes   = u P ACCESSES[optimizer]
    P = f c_0 + sum_i (w c_o + c_o)          trainable elements: input features, W_i, b_i

    other_ms = elementwise_bytes / elementwise_gbps + optimizer_bytes / optimizer_gbps
             + SYNCS_PER_EPOCH sync_us / 1000

The pass counts (:data:`TRAINER_PASSES`) are array accesses (one read or one write of a
whole array) of what the bundled trainer runs; they are the one place that says so, and
change with it. :data:`LEGACY_PASSES` describe the earlier trainer, whose runs the fits
still read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from plexus_tune.errors import UserError

#: Array accesses per trainable element of one optimizer step (reads + writes of param,
#: grad and moments). Fused AdamW: read param, grad, m, v; write param, m, v. The
#: multi-tensor (foreach) and per-tensor (for-loop) AdamW of torch run the step as ten
#: separate elementwise ops (decay, lerp, mul, addcmul, sqrt, div, add, addcdiv): 20.
OPTIMIZER_ACCESSES = {"adamw-fused": 7, "adamw-foreach": 20, "adamw-for-loop": 20}

#: The optimizer the bundled trainer builds on each device type.
TRAINER_OPTIMIZERS = {"cuda": "adamw-fused", "cpu": "adamw-fused"}

#: The optimizer of trainer runs logged without an ``optimizer`` field (torch's default AdamW).
LEGACY_OPTIMIZERS = {"cuda": "adamw-foreach", "cpu": "adamw-for-loop"}

@dataclass(frozen=True)
class ElementwisePasses:
    """Array accesses of a trainer's elementwise work (docs/trainer.md, One epoch).

    ``hidden``: per element of a hidden layer's r_d x c_o output (bias add, activation
    forward, its backward and the bias gradient); ``last``: the same for the last layer
    (the logits); ``loss``: the loss forward and backward on the logits; ``gradient``:
    per trainable element (zeroing and accumulating gradients).
    """

    hidden: int
    last: int
    loss: int
    gradient: int


#: What the bundled trainer runs: the bias enters the GEMM (addmm), ReLU in place (2),
#: the masked backward (read dQ and Q, write: 3) and the bias gradient (1); the last
#: layer only its bias gradient (1); the loss: row max (1), exp(z - max) (2), row sums
#: (1), one backward pass (2); gradients released after each step, so none is cleared
#: or accumulated.
TRAINER_PASSES = ElementwisePasses(hidden=6, last=1, loss=6, gradient=0)
#: The earlier trainer (run records without an ``optimizer`` field): a separate bias add
#: (2), ReLU out of place (2) and its backward (3) per hidden layer; the bias add on the
#: logits (2); an unfused loss (forward 8, backward 6); gradients zeroed (1) and
#: accumulated (3) every step.
LEGACY_PASSES = ElementwisePasses(hidden=7, last=2, loss=14, gradient=4)

#: Device synchronisations per epoch of the trainer (its phase times are read once, at
#: the end of the epoch).
SYNCS_PER_EPOCH = 1

#: Parts of ``other_ms`` in the prediction (they add up to it).
OTHER_PARTS = ("other_elementwise_ms", "other_optimizer_ms", "other_sync_ms")


def check_optimizer(name: str) -> str:
    """``name`` if it is a known optimizer of :data:`OPTIMIZER_ACCESSES`, else a UserError naming them."""
    if name not in OPTIMIZER_ACCESSES:
        raise UserError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZER_ACCESSES)}")
    return name


def trainer_optimizer(device_type: str) -> str:
    """The optimizer the trainer uses on ``device_type`` ('cuda' or 'cpu')."""
    return TRAINER_OPTIMIZERS["cuda" if str(device_type).startswith("cuda") else "cpu"]


def trainable_elements(shapes, fixed_features: bool = False) -> np.ndarray:
    """P per rank: input-feature rows f c_0 of layer 0 (unless the features are fixed), plus w c_o
    weights and c_o biases per layer."""
    total = 0.0
    for s in shapes:
        total = total + np.asarray(s.w_rows, dtype=np.float64) * s.c_o + np.asarray(s.c_o, dtype=np.float64)
        if s.layer == 0 and not fixed_features:
            total = total + np.asarray(s.feature_rows, dtype=np.float64) * s.c_i
    return np.asarray(total, dtype=np.float64)


def elementwise_bytes(shapes, u: float, passes: ElementwisePasses = TRAINER_PASSES,
                      fixed_features: bool = False) -> np.ndarray:
    """Bytes of the elementwise passes of one epoch on one rank (module docstring)."""
    last = len(shapes) - 1
    total = 0.0
    for s in shapes:
        out = np.asarray(s.r_d, dtype=np.float64) * s.c_o
        total = total + (passes.last + passes.loss if s.layer == last else passes.hidden) * out
    return u * (np.asarray(total, dtype=np.float64) + passes.gradient * trainable_elements(shapes, fixed_features))


def optimizer_bytes(shapes, u: float, optimizer: str, fixed_features: bool = False) -> np.ndarray:
    """Bytes one optimizer step moves on one rank: u P accesses."""
    return u * OPTIMIZER_ACCESSES[check_optimizer(optimizer)] * trainable_elements(shapes, fixed_features)


def other_ms(shapes, u: float, *, elementwise_gbps, optimizer_gbps=None, sync_us: float = 0.0,
             optimizer: str = "adamw-fused", passes: ElementwisePasses = TRAINER_PASSES,
             fixed_features: bool = False) -> dict[str, np.ndarray]:
    """The parts of ``other_ms`` (:data:`OTHER_PARTS`) and their sum ``other_ms``, per grid.

    Without ``elementwise_gbps`` the elementwise and optimizer parts are 0 (not modelled);
    ``optimizer_gbps`` defaults to ``elementwise_gbps``; ``fixed_features``: the input
    features are not trained (no gradient bookkeeping or optimizer step for them).
    """
    elem = elementwise_bytes(shapes, u, passes, fixed_features)
    zeros = np.zeros_like(elem)
    if elementwise_gbps:
        elementwise = elem / (float(elementwise_gbps) * 1e9) * 1e3
        rate = float(optimizer_gbps or elementwise_gbps)
        opt = optimizer_bytes(shapes, u, optimizer, fixed_features) / (rate * 1e9) * 1e3
    else:
        elementwise, opt = zeros, zeros.copy()
    sync = zeros + SYNCS_PER_EPOCH * float(sync_us or 0.0) / 1e3
    parts = {"other_elementwise_ms": elementwise, "other_optimizer_ms": opt, "other_sync_ms": sync}
    parts["other_ms"] = elementwise + opt + sync
    return parts
