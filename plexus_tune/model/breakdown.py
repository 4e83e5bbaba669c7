"""The names of an epoch's time breakdown, shared by the model, the trainer, the records and the report.

Every part is milliseconds per epoch (docs/model.md, Epoch time; docs/records.md,
Observed breakdown). The model predicts, and the trainer times, the same parts:

- the exclusive parts :data:`EPOCH_PARTS`: SpMM, dense GEMM, collectives, the local work of
  reduced-precision collectives (``quant_ms``) and everything else (``other_ms``);
- two splits of ``comm_ms`` that each add up to it: by grid axis (:data:`COMM_AXIS_KEYS`)
  and by collective (:data:`COMM_OP_KEYS`).

The model adds a fixed ``overhead_ms`` per epoch; its parts :data:`TOTAL_PARTS` add up to
``total_ms``. The trainer's epoch is ``epoch_ms``.
"""

from __future__ import annotations

#: Collective time by grid axis (X, Y, Z); adds up to ``comm_ms``.
COMM_AXIS_KEYS = ("comm_x_ms", "comm_y_ms", "comm_z_ms")
#: Communication of the other algorithm families only (CAGNET's broadcasts, SuperGCN's
#: point-to-point exchange); 0 for the Plexus 3D grid.
FAMILY_COMM_OP_KEYS = ("broadcast_ms", "point_to_point_ms")
#: Communication time by operation; adds up to ``comm_ms``.
COMM_OP_KEYS = ("all_reduce_ms", "all_gather_ms", "reduce_scatter_ms", *FAMILY_COMM_OP_KEYS)
#: Exclusive parts of an epoch, predicted and timed alike.
EPOCH_PARTS = ("spmm_ms", "gemm_ms", "comm_ms", "quant_ms", "other_ms")
#: Every timed part of an epoch, in report order: the exclusive parts and comm's splits.
BREAKDOWN_KEYS = ("spmm_ms", "gemm_ms", "comm_ms", *COMM_AXIS_KEYS, *COMM_OP_KEYS, "quant_ms", "other_ms")
#: The parts of the model's ``total_ms``: the exclusive parts and the fixed per-epoch overhead.
TOTAL_PARTS = (*EPOCH_PARTS, "overhead_ms")
#: Splits of a part: key -> tuples of keys that each add up to it.
PART_SPLITS = {"comm_ms": (COMM_AXIS_KEYS, COMM_OP_KEYS)}
#: The label of each key in tables and figures: the one key-to-label table.
LABELS = {
    "total_ms": "total ms", "epoch_ms": "epoch", "spmm_ms": "SpMM", "gemm_ms": "GEMM", "comm_ms": "comm",
    "comm_x_ms": "comm X", "comm_y_ms": "comm Y", "comm_z_ms": "comm Z", "all_reduce_ms": "all-reduce",
    "all_gather_ms": "all-gather", "reduce_scatter_ms": "reduce-scatter", "broadcast_ms": "broadcast",
    "point_to_point_ms": "point-to-point", "quant_ms": "quant", "other_ms": "other", "overhead_ms": "overhead",
    "wait_ms": "imbalance/wait", "comm_dp_ms": "comm DP", "sampling_ms": "sampling", "sampling_hidden_ms": "hidden",
}
#: Longer labels where a legend has room to say what a part is.
LEGEND_LABELS = {**LABELS, "quant_ms": "quant (codec of reduced precision)", "overhead_ms": "overhead (fixed per epoch)"}


def labelled(keys) -> tuple[tuple[str, str], ...]:
    """``(key, label)`` of each key, for table columns."""
    return tuple((key, LABELS[key]) for key in keys)
