"""Communication schedules and exact per-rank volumes of the CAGNET and SuperGCN families
(docs/model.md, "Other algorithm families").

A schedule is the list of :class:`CommCall` an epoch runs (forward and backward of every
layer; layer 0 included, since the input features are trained). The byte convention is
that of :mod:`plexus_tune.model.comm_precision`: the bytes a rank hands to its process
groups for *other* ranks, FP32, padded shapes as allocated:

    all-reduce of n elements on g ranks   2 (g-1) ceil(n / g) elements
    all-gather, reduce-scatter            g-1 blocks
    broadcast of an M-byte message        the root counts (g-1) M, the others 0
    point-to-point                        every message once, by its sender

Classes: ``aggregation`` (dense rows moved for an SpMM), ``combination`` (dense rows moved
for the product with W and its backward), ``gather`` (the weight-gradient
reduction: dW and db as one buffer of (D_l + 1) x D_{l+1} columns owned) and
``adjacency`` (sparse pieces, CSR with u-byte values and int32 indices:
nnz (u + 4) + (rows + 1) 4 bytes; sent as they are at every precision).

Families and their process grids (rank = z Gx Gy + x Gy + y, as for Plexus):

``cagnet-1.5d`` (Gx, Gy, 1) = (R, c, 1), P = R c, c c <= P; ``cagnet-1d`` is c = 1.
    b = ceil(N / R) rows per block row. Process column j (the R ranks with y = j,
    stride c) runs the stages k of chunk_j = [floor(j R / c), floor((j+1) R / c)): rank
    (k, j) broadcasts its b x D_l block. Per layer, forward and backward (A^T, dH)::

        aggregation(x, y) = [x in chunk_y] (R-1) b D_l u + 2 (c-1) ceil(b D_l / c) u
        gather            = 2 (R-1) ceil((D_l+1) D_{l+1} / R) u        (backward only)

``cagnet-2d`` (Pr, Pc, 1): SUMMA. q = lcm(Pr, Pc), N' = q ceil(N / q), rb = N' / Pr,
    d_l = ceil(D_l / Pc). The inner dimension runs in q stages of N'/q rows: the A
    piece (rb x N'/q) is broadcast along the process row (Pc ranks, stride 1) by its
    owner, the dense piece (N'/q x d_l) along the process column (Pr ranks, stride Pc).
    Per layer::

        forward   aggregation (Pr-1) rb d_l u; adjacency (Pc-1) sum of the rank's q/Pc A pieces;
                  combination: all-gather of T (rb x d_l blocks) over the row, (Pc-1) rb d_l u
                  (a rank keeps the columns W[:, block y] and b[block y], replicated down the
                  column, so Q = T W needs nothing more; the loss is sharded over the class
                  columns: :func:`loss_calls`)
        backward  gather: all-reduce of (D_l+1) d_{l+1} over the column, 2 (Pr-1) ceil(./Pr) u;
                  combination: reduce-scatter of dT over the row, (Pc-1) rb d_l u;
                  aggregation and adjacency as forward, with A^T pieces

``cagnet-3d`` (Pr, Pc, Pl), Pl >= 2: split-3D SUMMA. q = lcm(Pr, Pc),
    N' = Pl q ceil(N / (Pl q)), rb = N' / Pr, rf = rb / Pl, piece N' / (Pl q). Each of
    the Pl layers of the mesh runs the 2D SUMMA on its slab of the inner dimension (in
    the split-3D column order, :func:`plexus_tune.graph.partition.split3d_positions`),
    then a reduce-scatter over the fibre (Pl ranks, stride Pr Pc). The backward is its
    transpose: dT all-gathered over the fibre, the transposes of the same A pieces (stored
    by their owners, piece rows each) broadcast along the row, each rank's partial A^T dT
    of its slab reduce-scattered over the column. Per layer::

        forward   aggregation (Pr-1) rf d_l u + (Pl-1) rf d_l u; adjacency (Pc-1) sum of pieces;
                  combination (Pc-1) rf d_l u
        backward  gather 2 (Pr-1) ceil(X / Pr) u + 2 (Pl-1) ceil(X / Pl) u, X = (D_l+1) d_{l+1};
                  combination (Pc-1) rf d_l u; aggregation (Pl-1) rf d_l u (all-gather) +
                  (Pr-1) rf d_l u (reduce-scatter of Pr rf rows); adjacency (Pc-1) sum of
                  the transposed pieces (N'/(Pl q) + 1 index entries each)

``supergcn`` (P, 1, 1): a partition (:mod:`plexus_tune.graph.partition`); rows[p, q]
    boundary rows p sends q per aggregation (pre, post or hybrid). Per layer::

        forward   aggregation: p sends q rows[p, q] D_l u
        backward  aggregation: q sends p rows[p, q] D_l u
                  gather 2 (P-1) ceil((D_l+1) D_{l+1} / P) u (all-reduce over all ranks)

The sharded loss (every family's trainer, :func:`loss_calls`) adds per epoch, in FP32 and
outside the volumes (the trainers count only the classes above): over the axis that
splits the classes, when it is split, all-reduces of the row maxima (r elements, r the
rank's logit rows) and of the row sums (2 r); over each axis that splits the rows, an
all-reduce of the rank's loss sum (1 element).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.model.shapes import ceil_div

#: Volume classes: the three precision classes and the sparse pieces.
VOLUME_CLASSES = ("aggregation", "combination", "gather", "adjacency")
#: Class of the sharded loss's reductions (:func:`loss_calls`): always FP32, left out of the volumes.
LOSS_CLASS = "loss"
#: Classes sent in FP32 at every communication precision.
FP32_CLASSES = ("adjacency", LOSS_CLASS)
#: Operations of a schedule.
SCHEDULE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "point_to_point")
#: Bytes of a CSR index (int32).
INDEX_BYTES = 4


@dataclass(frozen=True)
class CommCall:
    """One kind of communication of an epoch.

    ``op`` on groups of ``group_size`` ranks at ``stride`` along grid ``axis`` (0 X, 1 Y,
    2 Z), ``calls`` sequential calls per epoch on the busiest group, each of
    ``message_bytes`` (the collective's full buffer; a broadcast's message) made of
    ``rows`` rows (in ``messages`` sends); ``sent_bytes``: what each rank sends in the epoch (P,), by the module's
    convention. A point-to-point exchange gives ``pair_rows``, the rows p sends q (a (P, P)
    array or a :class:`UniformExchange`), each of ``row_bytes``. ``direction`` is forward
    or backward.
    """

    name: str
    op: str
    comm_class: str
    direction: str
    axis: int
    group_size: int
    stride: int
    message_bytes: float
    rows: float
    calls: float
    sent_bytes: np.ndarray
    pair_rows: object = field(default=None, repr=False)
    row_bytes: float = 0.0
    #: sends per call (latency each, bytes once): 3 for a CSR piece (row pointers, columns, values)
    messages: float = 1.0


@dataclass(frozen=True)
class UniformExchange:
    """An exchange where every rank sends every other rank ``rows`` rows (an estimate)."""

    parts: int
    rows: float

    @property
    def T(self) -> "UniformExchange":  # noqa: N802 - mirrors ndarray.T
        return self

    def sent(self) -> np.ndarray:
        return np.full(self.parts, self.rows * (self.parts - 1), dtype=np.float64)


def _allreduce_sent(elements, g) -> int:
    return 2 * (g - 1) * ceil_div(int(elements), g) if g > 1 else 0


def loss_calls(rows, class_group, row_groups, gpus: int, bytes_per_element: int = 4) -> list[CommCall]:
    """The sharded cross-entropy's reductions of an epoch (``trainer/loss.py``; module docstring).

    ``rows``: the rank's logit rows; ``class_group``: (axis, ranks, stride) of the axis that
    splits the classes; ``row_groups``: the same for each axis that splits the rows. Per
    split class axis, all-reduces of ``rows`` (row maxima) and ``2 rows`` (row sums)
    elements; per split row axis, one of 1 element (the loss sum). Class :data:`LOSS_CLASS`.
    """
    u = int(bytes_per_element)
    rows = float(rows)
    full = lambda elements, g: np.full(int(gpus), float(_allreduce_sent(elements, g) * u))  # noqa: E731
    calls: list[CommCall] = []
    axis, g, stride = (int(v) for v in class_group)
    if g > 1:
        for what, elements in (("row maxima", rows), ("row sums", 2 * rows)):
            calls.append(CommCall(f"loss all-reduce {what}", "all_reduce", LOSS_CLASS, "forward", axis, g, stride,
                                  elements * u, rows, 1, full(elements, g)))
    for axis, g, stride in row_groups:
        if int(g) > 1:
            calls.append(CommCall("loss all-reduce of the loss sum", "all_reduce", LOSS_CLASS, "forward", int(axis),
                                  int(g), int(stride), float(u), 1, 1, full(1, int(g))))
    return calls


def csr_piece_bytes(nnz, rows, value_bytes: int) -> np.ndarray:
    """Bytes of a sparse piece as sent: nnz (u + 4) + (rows + 1) 4."""
    return np.asarray(nnz, dtype=np.float64) * (value_bytes + INDEX_BYTES) + (np.asarray(rows, dtype=np.float64) + 1) * INDEX_BYTES


# ----------------------------------------------------------------------------- CAGNET 1.5D


def check_replication(gpus: int, c: int) -> int:
    """c if it divides G and c c <= G, else UserError."""
    gpus, c = int(gpus), int(c)
    if c < 1 or gpus % c:
        raise UserError(f"replication factor c={c} must divide the GPU count {gpus}; choose a divisor of {gpus}")
    if c * c > gpus:
        raise UserError(f"replication factor c={c} needs c*c <= G = {gpus} (every replica column runs a stage); "
                        f"choose c <= {math.isqrt(gpus)}")
    return c


def stage_chunks(block_rows: int, c: int) -> list[range]:
    """The stages (block rows k) of each process column j: [floor(j R / c), floor((j+1) R / c))."""
    return [range(j * block_rows // c, (j + 1) * block_rows // c) for j in range(c)]


def cagnet_15d_schedule(nodes: int, widths, gpus: int, c: int, bytes_per_element: int = 4) -> list[CommCall]:
    """The epoch's communication of CAGNET 1.5D on (G/c) x c ranks (module docstring)."""
    c = check_replication(gpus, c)
    r = gpus // c
    b = ceil_div(nodes, r)
    u = int(bytes_per_element)
    chunks = stage_chunks(r, c)
    root = np.zeros(gpus, dtype=bool)
    for j, chunk in enumerate(chunks):
        for k in chunk:
            root[k * c + j] = True
    stages = max(len(ch) for ch in chunks)
    calls: list[CommCall] = []
    for layer in range(len(widths) - 1):
        d_in, d_out = int(widths[layer]), int(widths[layer + 1])
        for direction, what in (("forward", "F"), ("backward", "dH")):
            if r > 1:
                m = b * d_in * u
                calls.append(CommCall(f"layer {layer} broadcast {what} blocks", "broadcast", "aggregation", direction,
                                      0, r, c, m, b, stages, np.where(root, (r - 1) * m, 0).astype(np.float64)))
            if c > 1:
                calls.append(CommCall(f"layer {layer} all-reduce partial {'A F' if what == 'F' else 'A^T dH'}",
                                      "all_reduce", "aggregation", direction, 1, c, 1, b * d_in * u, b, 1,
                                      np.full(gpus, _allreduce_sent(b * d_in, c) * u, dtype=np.float64)))
        if r > 1:
            x = (d_in + 1) * d_out
            calls.append(CommCall(f"layer {layer} all-reduce dW, db", "all_reduce", "gather", "backward", 0, r, c,
                                  x * u, d_in + 1, 1, np.full(gpus, _allreduce_sent(x, r) * u, dtype=np.float64)))
    return calls


# ----------------------------------------------------------------------------- CAGNET 2D / 3D


def summa_sizes(nodes: int, pr: int, pc: int, pl: int = 1) -> dict:
    """Padded sizes of (split-3D) SUMMA: q = lcm(Pr, Pc), N' = Pl q ceil(N / (Pl q)), rb = N'/Pr,
    rf = rb / Pl (rows a rank owns), piece = N' / (Pl q) (inner rows per stage)."""
    q = math.lcm(int(pr), int(pc))
    n_pad = pl * q * ceil_div(nodes, pl * q)
    rb = n_pad // pr
    return {"q": q, "n_pad": n_pad, "rb": rb, "rf": rb // pl, "piece": n_pad // (pl * q)}


def summa_piece_shape(sizes: dict, pl: int, backward: bool) -> tuple[int, int]:
    """(rows, common) of the piece a rank multiplies at one SUMMA stage (``sizes``: :func:`summa_sizes`):
    rb x piece; split-3D's backward multiplies the stored transposes, piece x rb."""
    rb, piece = sizes["rb"], sizes["piece"]
    return (piece, rb) if backward and pl > 1 else (rb, piece)


def uniform_pieces(nnz: int, pr: int, pc: int, pl: int = 1) -> float:
    """Nonzeros of every A piece when they are spread evenly: NNZ / (Pr Pl q)."""
    q = math.lcm(int(pr), int(pc))
    return float(nnz) / (pr * pl * q)


def _check_pieces(pieces, pr, pc, pl):
    q = math.lcm(int(pr), int(pc))
    arr = np.asarray(pieces, dtype=np.float64)
    if arr.ndim == 0:
        return float(arr)
    if arr.ndim == 2:
        arr = arr.reshape(1, *arr.shape)
    if arr.shape != (pl, pr, q):
        raise UserError(f"A pieces must have shape (Pl, Pr, q) = ({pl}, {pr}, {q}), got {arr.shape}")
    return arr


def _summa_calls(layer, direction, what, gpus, pr, pc, pl, sizes, d_cols, u, pieces):
    """The in-layer SUMMA broadcasts of one SpMM: dense pieces along columns, A pieces along rows."""
    calls = []
    q, rb, piece = sizes["q"], sizes["rb"], sizes["piece"]
    rows_owned = rb // pl
    if pr > 1 and pl > 1 and direction == "backward":  # the transpose of the forward's broadcasts
        m = pr * rows_owned * d_cols * u
        calls.append(CommCall(f"layer {layer} reduce-scatter partial A^T dT over the column", "reduce_scatter",
                              "aggregation", direction, 0, pr, pc, m, pr * rows_owned, 1,
                              np.full(gpus, (pr - 1) * rows_owned * d_cols * u, dtype=np.float64)))
    elif pr > 1:
        m = piece * d_cols * u
        calls.append(CommCall(f"layer {layer} broadcast {what} pieces", "broadcast", "aggregation", direction, 0, pr, pc,
                              m, piece, q, np.full(gpus, (pr - 1) * rows_owned * d_cols * u, dtype=np.float64)))
    if pc > 1:
        per_col = q // pc
        # split-3D's backward sends the transposes M_is^T: piece rows each (module docstring)
        csr_rows = summa_piece_shape(sizes, pl, direction == "backward")[0]
        if isinstance(pieces, float):  # every piece holds the same nonzeros
            piece_bytes = float(csr_piece_bytes(pieces, csr_rows, u))
            sent = np.full(gpus, (pc - 1) * per_col * piece_bytes)
            busiest_row = q * piece_bytes
        else:
            piece_bytes = csr_piece_bytes(pieces, csr_rows, u)  # (pl, pr, q)
            own = piece_bytes.reshape(pl, pr, pc, per_col).sum(axis=3)  # (pl, pr, pc)
            sent = ((pc - 1) * own).reshape(-1)  # rank = k Pr Pc + i Pc + j
            busiest_row = float(piece_bytes.sum(axis=2).max())
        calls.append(CommCall(f"layer {layer} broadcast {'A' if what == 'F' else 'A^T'} pieces", "broadcast",
                              "adjacency", direction, 1, pc, 1, busiest_row / q, 0, q, np.asarray(sent, dtype=np.float64),
                              messages=3.0))
    return calls


#: CAGNET schedules: the bundled trainers' and CAGNET's own as its paper counts it.
CAGNET_SCHEDULES = ("bundled", "paper")


def check_schedule(schedule) -> str:
    """``schedule`` if it is one of :data:`CAGNET_SCHEDULES`, else UserError."""
    text = str(schedule if schedule is not None else "bundled").strip().lower()
    if text not in CAGNET_SCHEDULES:
        raise UserError(f"unknown CAGNET schedule {schedule!r}; choose one of {', '.join(CAGNET_SCHEDULES)}")
    return text


def _paper_extra_calls(layer, direction, gpus, pr, pc, pl, rf, d_in, d_out, widths, u) -> list[CommCall]:
    """What CAGNET's own schedule adds to the bundled one for one layer and direction
    (docs/model.md, "CAGNET schedules"): the log_softmax all-gather of Z (forward) and of
    sigma'(Z) (backward) over the process row, the second half of the partial dense
    product over the fibre (3D), and the weight gradient as a dense SUMMA of H and A G
    (a broadcast of each block along its row and its column) whose f x f result is
    all-gathered on all ranks (it replaces the bundled all-reduce of dW)."""
    full = lambda value: np.full(gpus, float(value), dtype=np.float64)  # noqa: E731
    forward = direction == "forward"
    row_what, row_width = ("Z over the row (log_softmax)", d_out) if forward else ("sigma'(Z) over the row", d_in)
    calls = []
    if pc > 1:
        calls.append(CommCall(f"layer {layer} all-gather {row_what}", "all_gather", "combination", direction, 1, pc,
                              1, pc * rf * row_width * u, pc * rf, 1, full((pc - 1) * rf * row_width * u)))
    if pl > 1:
        calls.append(CommCall(f"layer {layer} all-gather {'T' if forward else 'dT'} over the fibre (partial 3D product)",
                              "all_gather", "combination", direction, 2, pl, pr * pc, pl * rf * d_in * u, pl * rf, 1,
                              full((pl - 1) * rf * d_in * u)))
    if forward:
        return calls
    if pc > 1:
        calls.append(CommCall(f"layer {layer} broadcast H blocks along the row (dense SUMMA of dW)", "broadcast",
                              "gather", direction, 1, pc, 1, rf * d_in * u, rf, pc, full((pc - 1) * rf * d_in * u)))
    if pr > 1:
        calls.append(CommCall(f"layer {layer} broadcast A G blocks along the column (dense SUMMA of dW)", "broadcast",
                              "gather", direction, 0, pr, pc, rf * d_out * u, rf, pr, full((pr - 1) * rf * d_out * u)))
    if gpus > 1:
        y = (int(widths[layer]) + 1) * int(widths[layer + 1])
        calls.append(CommCall(f"layer {layer} all-gather dW, db on all ranks", "all_gather", "gather", direction, 0,
                              gpus, 1, y * u, int(widths[layer]) + 1, 1, full((gpus - 1) * ceil_div(y, gpus) * u)))
    return calls


def cagnet_summa_schedule(nodes: int, widths, pr: int, pc: int, pl: int = 1, *, bytes_per_element: int = 4,
                          a_pieces=None, at_pieces=None, nnz: int | None = None,
                          schedule: str = "bundled") -> list[CommCall]:
    """The epoch's communication of CAGNET 2D (``pl`` = 1) or split-3D on Pr x Pc x Pl ranks.

    ``schedule``: ``bundled`` (the bundled trainers', module docstring) or ``paper``
    (CAGNET's own as its paper counts it: :func:`_paper_extra_calls` added, the dW
    all-reduce replaced; docs/model.md, "CAGNET schedules").

    ``a_pieces`` / ``at_pieces``: nonzeros of every piece of A and A^T, shape (Pl, Pr, q)
    (``at_pieces`` serves 2D only: split-3D's backward sends the transposes of A's pieces)
    (:func:`plexus_tune.graph.partition.summa_piece_nnz`), or one number for every piece;
    without them ``nnz`` spread evenly (:func:`uniform_pieces`).
    """
    pr, pc, pl = int(pr), int(pc), int(pl)
    schedule = check_schedule(schedule)
    gpus = pr * pc * pl
    u = int(bytes_per_element)
    sizes = summa_sizes(nodes, pr, pc, pl)
    if a_pieces is None:
        if nnz is None:
            raise UserError("the SUMMA schedule needs the A pieces or the number of nonzeros")
        a_pieces = uniform_pieces(nnz, pr, pc, pl)
    a_pieces = _check_pieces(a_pieces, pr, pc, pl)
    at_pieces = a_pieces if at_pieces is None else _check_pieces(at_pieces, pr, pc, pl)
    rb, rf = sizes["rb"], sizes["rf"]
    layers = len(widths) - 1
    calls: list[CommCall] = []
    full = lambda value: np.full(gpus, float(value), dtype=np.float64)  # noqa: E731
    for layer in range(layers):
        d_in = ceil_div(int(widths[layer]), pc)
        d_out = ceil_div(int(widths[layer + 1]), pc)
        # split-3D multiplies by the transposes of the forward's pieces (module docstring)
        for direction, what, pieces in (("forward", "F", a_pieces), ("backward", "dT", at_pieces if pl == 1 else a_pieces)):
            if schedule == "paper":
                calls.extend(_paper_extra_calls(layer, direction, gpus, pr, pc, pl, rf, d_in, d_out, widths, u))
            if direction == "backward" and schedule == "bundled":
                if pr > 1 or pl > 1:
                    x = (int(widths[layer]) + 1) * d_out
                    if pr > 1:
                        calls.append(CommCall(f"layer {layer} all-reduce dW, db over the column", "all_reduce", "gather",
                                              direction, 0, pr, pc, x * u, int(widths[layer]) + 1, 1,
                                              full(_allreduce_sent(x, pr) * u)))
                    if pl > 1:
                        calls.append(CommCall(f"layer {layer} all-reduce dW, db over the fibre", "all_reduce", "gather",
                                              direction, 2, pl, pr * pc, x * u, int(widths[layer]) + 1, 1,
                                              full(_allreduce_sent(x, pl) * u)))
            if direction == "backward":
                if pc > 1:
                    calls.append(CommCall(f"layer {layer} reduce-scatter dT over the row", "reduce_scatter",
                                          "combination", direction, 1, pc, 1, pc * rf * d_in * u, pc * rf, 1,
                                          full((pc - 1) * rf * d_in * u)))
                if pl > 1:
                    calls.append(CommCall(f"layer {layer} all-gather dT over the fibre", "all_gather", "aggregation",
                                          direction, 2, pl, pr * pc, rb * d_in * u, rb, 1,
                                          full((pl - 1) * rf * d_in * u)))
            calls.extend(_summa_calls(layer, direction, what, gpus, pr, pc, pl, sizes, d_in, u, pieces))
            if direction == "forward":
                if pl > 1:
                    calls.append(CommCall(f"layer {layer} reduce-scatter partial A F over the fibre", "reduce_scatter",
                                          "aggregation", direction, 2, pl, pr * pc, rb * d_in * u, rb, 1,
                                          full((pl - 1) * rf * d_in * u)))
                if pc > 1:
                    calls.append(CommCall(f"layer {layer} all-gather T over the row", "all_gather", "combination",
                                          direction, 1, pc, 1, pc * rf * d_in * u, pc * rf, 1,
                                          full((pc - 1) * rf * d_in * u)))
    return calls


# ----------------------------------------------------------------------------- SuperGCN


def supergcn_schedule(widths, rows, bytes_per_element: int = 4) -> list[CommCall]:
    """The epoch's communication of the partitioned GCN: ``rows`` (P, P) boundary rows p sends q
    per forward aggregation (:meth:`plexus_tune.graph.partition.ExchangePlan.forward_rows`),
    or a :class:`UniformExchange`."""
    if isinstance(rows, UniformExchange):
        gpus = rows.parts
        fwd, bwd = rows, rows
        fwd_sent = bwd_sent = rows.sent()
        busiest_rows = float(fwd_sent.max()) if gpus > 1 else 0.0
    else:
        rows = np.asarray(rows, dtype=np.float64)
        if rows.ndim != 2 or rows.shape[0] != rows.shape[1]:
            raise UserError(f"boundary rows must be a square (P, P) matrix, got shape {rows.shape}")
        if np.any(rows < 0) or not np.all(np.isfinite(rows)):
            raise UserError("boundary rows must be finite and not negative")
        gpus = rows.shape[0]
        fwd = rows.copy()
        np.fill_diagonal(fwd, 0.0)
        bwd = fwd.T
        fwd_sent, bwd_sent = fwd.sum(axis=1), bwd.sum(axis=1)
        busiest_rows = float(max(fwd_sent.max(), bwd_sent.max())) if gpus > 1 else 0.0
    u = int(bytes_per_element)
    calls: list[CommCall] = []
    for layer in range(len(widths) - 1):
        d_in, d_out = int(widths[layer]), int(widths[layer + 1])
        for direction, mat, sent in (("forward", fwd, fwd_sent), ("backward", bwd, bwd_sent)):
            calls.append(CommCall(f"layer {layer} boundary exchange", "point_to_point", "aggregation", direction, 0,
                                  gpus, 1, busiest_rows * d_in * u, busiest_rows, 1, sent * d_in * u,
                                  pair_rows=mat, row_bytes=float(d_in * u)))
        if gpus > 1:
            x = (d_in + 1) * d_out
            calls.append(CommCall(f"layer {layer} all-reduce dW, db", "all_reduce", "gather", "backward", 0, gpus, 1,
                                  x * u, d_in + 1, 1, np.full(gpus, _allreduce_sent(x, gpus) * u, dtype=np.float64)))
    return calls


# ----------------------------------------------------------------------------- volumes


def rank_volumes(calls, gpus: int, *, direction: str | None = None) -> dict[str, np.ndarray]:
    """Bytes each rank sends per epoch, by class (:data:`VOLUME_CLASSES`, arrays of G);
    ``direction`` forward or backward keeps only that half."""
    out = {name: np.zeros(int(gpus), dtype=np.float64) for name in VOLUME_CLASSES}
    for call in calls:
        if (direction is None or call.direction == direction) and call.comm_class in out:
            out[call.comm_class] += call.sent_bytes
    return out


def total_volume_bytes(calls) -> float:
    """Bytes all ranks send in an epoch (the volume classes; the loss's reductions left out)."""
    return float(sum(np.sum(call.sent_bytes) for call in calls if call.comm_class in VOLUME_CLASSES))
