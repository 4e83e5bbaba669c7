"""What one trainer run does: the graph, the grid, the model and the options."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from plexus_tune.model.comm_precision import CommPrecision

PERMUTE_CHOICES = ("double", "single", "none", "local")
DTYPE_CHOICES = ("float32", "float64")
BACKEND_CHOICES = ("gloo", "nccl")


@dataclass
class TrainConfig:
    """One run of the 3D-parallel trainer.

    The graph comes from exactly one of ``graph`` (a file path, or an in-memory
    :class:`plexus_tune.graph.Graph`) and ``synthetic`` (a generator spec such as
    ``"rmat:nodes=4096,edges=65536,features=32,classes=8,seed=0"``). ``grid`` is
    (Gx, Gy, Gz); ``gpus`` (if given) must equal its product. Widths are
    ``[features] + [hidden] * (layers - 1) + [classes]``. ``epochs`` includes the
    ``warmup`` epochs, which are trained but left out of the timing averages.
    ``comm_precision`` is the precision of the 3D layer's collectives, one for all
    classes or per class (``"bf16"``, ``"aggregation=int8,gather=bf16"``;
    docs/comm-precision.md), as text or parsed (a ``CommPrecision``). ``layer_norm`` normalizes each layer's input rows (no
    scale and shift) with FP32 statistics. ``fixed_features`` keeps the input features
    fixed (not trained): no feature gradient, no layer-0 backward SpMM or its collectives,
    no optimizer state for them (docs/trainer.md, "Fixed features"). The loss is the mean over the training
    nodes of the graph's split (graph/splits: OGB split files, else a seeded random one).
    ``algorithm`` picks the family (:mod:`plexus_tune.trainer.algorithms`; ``grid`` is
    then its process grid), ``replication`` is cagnet-1.5d's c and ``aggregation``
    supergcn's pre, post or hybrid; ``dp`` (data-parallel groups, each on ``grid``) and
    ``batch_size`` (vertices sampled per step and group) are scalegnn-4d's, whose
    components ``extra["minibatch"]`` may switch (rmsnorm, residual: bool; dropout: rate);
    with ``prefetch`` (scalegnn-4d, default) the sampling of step t + 1 runs on a background
    thread during step t.
    """

    grid: tuple[int, int, int] = (1, 1, 1)
    graph: Any = None
    synthetic: str | None = None
    gpus: int | None = None
    layers: int = 3
    hidden: int = 128
    epochs: int = 10
    warmup: int = 2
    lr: float = 0.01
    weight_decay: float = 0.01
    seed: int = 0
    permute: str = "double"
    block_rows: int | None = None
    overlap: bool = False
    backend: str = "gloo"
    dtype: str = "float32"
    comm_precision: str | CommPrecision = "fp32"
    layer_norm: bool = False
    fixed_features: bool = False
    check: bool = False
    collect_outputs: bool = False
    log: str | None = None
    machine: str | None = None
    timeout_s: float = 1800.0
    threads_per_rank: int | None = None
    launcher: str = "local"
    cluster: dict | None = None
    algorithm: str = "plexus-3d"
    replication: int | None = None
    aggregation: str | None = None
    dp: int = 1
    batch_size: int | None = None
    prefetch: bool = True
    extra: dict = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        """Ranks of the run: ``dp`` data-parallel groups of prod(grid) ranks (``dp`` is 1 but for scalegnn-4d)."""
        return int(self.dp or 1) * int(self.grid[0]) * int(self.grid[1]) * int(self.grid[2])

    def options(self) -> dict:
        """The JSON-friendly options of the run (everything but the graph object)."""
        out = asdict(self)
        out.pop("graph")
        out.pop("extra")
        out["grid"] = list(self.grid)
        return out
