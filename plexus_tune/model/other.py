"""The ``other`` part of an epoch: elementwise passes, the optimizer and synchronisation.

Everything in an epoch that is neither SpMM, GEMM nor communication, from the bytes it
must move at measured bandwidths (docs/model.md, "Other: the rest of the epoch"). For
one rank, u the element size, with the local shapes of
:func:`plexus_tune.model.shapes.layer_shapes` (r_d rows and c_o columns of Q_i, w rows of
W_i, f rows of the input features)::

    elementwise_bytes = u sum_i r_d c_o (BIAS + [i < L-1] (ACT_FWD + ACT_BWD) + [i = L-1] LOSS)
                      + u P GRAD
    optimizer_bytes   = u P ACCESSES[optimizer]
    P = f c_0 + sum_i (w c_o + c_o)          trainable elements: input features, W_i, b_i

    other_ms = elementwise_bytes / elementwise_gbps + optimizer_bytes / optimizer_gbps
             + SYNCS_PER_EPOCH sync_us / 1000

The pass counts are array accesses (one read or one write of a whole array) of what
the bundled trainer runs; they are the one place that says so, and change with it.
"""

from __future__ import annotations

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

#: Accesses of the r_d x c_o output of a layer: the bias add (read Q, write Q + b).
BIAS_ACCESSES = 2
#: The activation of a hidden layer: forward reads and writes, backward reads the
#: gradient and the output and writes the input gradient.
ACTIVATION_FORWARD_ACCESSES = 2
ACTIVATION_BACKWARD_ACCESSES = 3
#: The sharded softmax cross-entropy on the last layer's logits: forward (mask, row
#: max, shift, exp, row sum: 8), backward (normalize, mask, scale: 6).
LOSS_ACCESSES = 14
#: Gradient bookkeeping per trainable element: zeroing (1 write) and accumulating the
#: new gradient into it (read both, write one).
GRADIENT_ACCESSES = 4
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


def trainable_elements(shapes) -> np.ndarray:
    """P per rank: input-feature rows f c_0 of layer 0, plus w c_o weights and c_o biases per layer."""
    total = 0.0
    for s in shapes:
        total = total + np.asarray(s.w_rows, dtype=np.float64) * s.c_o + np.asarray(s.c_o, dtype=np.float64)
        if s.layer == 0:
            total = total + np.asarray(s.feature_rows, dtype=np.float64) * s.c_i
    return np.asarray(total, dtype=np.float64)


def elementwise_bytes(shapes, u: float) -> np.ndarray:
    """Bytes of the elementwise passes of one epoch on one rank (module docstring)."""
    last = len(shapes) - 1
    total = 0.0
    for s in shapes:
        out = np.asarray(s.r_d, dtype=np.float64) * s.c_o
        passes = BIAS_ACCESSES + (LOSS_ACCESSES if s.layer == last else ACTIVATION_FORWARD_ACCESSES + ACTIVATION_BACKWARD_ACCESSES)
        total = total + passes * out
    return u * (np.asarray(total, dtype=np.float64) + GRADIENT_ACCESSES * trainable_elements(shapes))


def optimizer_bytes(shapes, u: float, optimizer: str) -> np.ndarray:
    """Bytes one optimizer step moves on one rank: u P accesses."""
    return u * OPTIMIZER_ACCESSES[check_optimizer(optimizer)] * trainable_elements(shapes)


def other_ms(shapes, u: float, *, elementwise_gbps, optimizer_gbps=None, sync_us: float = 0.0,
             optimizer: str = "adamw-fused") -> dict[str, np.ndarray]:
    """The parts of ``other_ms`` (:data:`OTHER_PARTS`) and their sum ``other_ms``, per grid.

    Without ``elementwise_gbps`` the elementwise and optimizer parts are 0 (not modelled);
    ``optimizer_gbps`` defaults to ``elementwise_gbps``.
    """
    elem = elementwise_bytes(shapes, u)
    zeros = np.zeros_like(elem)
    if elementwise_gbps:
        elementwise = elem / (float(elementwise_gbps) * 1e9) * 1e3
        rate = float(optimizer_gbps or elementwise_gbps)
        opt = optimizer_bytes(shapes, u, optimizer) / (rate * 1e9) * 1e3
    else:
        elementwise, opt = zeros, zeros.copy()
    sync = zeros + SYNCS_PER_EPOCH * float(sync_us or 0.0) / 1e3
    parts = {"other_elementwise_ms": elementwise, "other_optimizer_ms": opt, "other_sync_ms": sync}
    parts["other_ms"] = elementwise + opt + sync
    return parts
