"""SpMM and GEMM microbenchmarks that calibrate a machine profile's compute (``calibrate spmm``).

Time ``torch.sparse.mm`` of a CSR matrix by a dense matrix, the kernel the bundled
trainer uses, either on random shard shapes (:func:`spmm_sweep`: a sweep over nnz, rows,
common and dense columns) or on the real shards of a graph for every grid of G and every
layer (:func:`calibrate_graph_shards`: forward A F and backward A^T dH, plus the three
GEMMs of a layer) on one device: the compute cost of any G, measured without G devices.
Records: schemas spmm and gemm of :mod:`plexus_tune.measure.records` (docs/records.md).
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np

from plexus_tune.errors import UserError
from plexus_tune.graph import double_permute
from plexus_tune.graph.structure import operand_structure
from plexus_tune.measure.store import GEMM_SCHEMA, SPMM_SCHEMA, now_utc
from plexus_tune.measure.timing import time_call
from plexus_tune.model.family import FAMILIES, GraphContext, family_names
from plexus_tune.model.grid import enumerate_grids, format_grid
from plexus_tune.model.machine import load_machine
from plexus_tune.model.prediction import predict_run_grids
from plexus_tune.model.shapes import csr_index_dtype, layer_shapes
from plexus_tune.model.spmm import SpmmKind
from plexus_tune.model.workload import Workload
from plexus_tune.resources import check_device_memory, check_memory


#: Sparsity structures of the sweep (``calibrate spmm --sweep --structure``): uniform random
#: positions; Zipf column popularity with lognormal row lengths; R-MAT-like positions.
SWEEP_STRUCTURES = ("uniform", "zipf", "rmat", "mixed")
#: Row-length spreads (lognormal sigma) of the ``zipf`` sweep.
ROW_SIGMAS = (0.0, 0.5, 1.0, 1.5)
#: Largest column-popularity exponent of the ``zipf`` sweep (drawn uniformly from 0 to it).
MAX_ZIPF_S = 1.4


def structure_dimensions(kind: str, rng: np.random.Generator) -> dict:
    """The structure parameters of one sweep shape (docs/records.md, SpMM structure).

    ``uniform``: none. ``zipf``: ``zipf_s`` ~ U(0, 1.4), the exponent of a power law over
    the column ranks (columns placed at random), and ``row_sigma`` from
    :data:`ROW_SIGMAS`, the sigma of lognormal row weights. ``rmat``: R-MAT quadrant
    probabilities with a ~ U(0.25, 0.65), d = max(0.05, 0.25 - (a - 0.25) / 2),
    b = c = (1 - a - d) / 2 (a = 0.25: uniform; 0.57: near Graph500). ``mixed``: one
    of the three, equally likely.
    """
    if kind == "mixed":
        kind = SWEEP_STRUCTURES[int(rng.integers(0, 3))]
    if kind == "uniform":
        return {"generator": "uniform"}
    if kind == "zipf":
        return {"generator": "zipf", "zipf_s": float(rng.uniform(0.0, MAX_ZIPF_S)),
                "row_sigma": float(ROW_SIGMAS[int(rng.integers(0, len(ROW_SIGMAS)))])}
    if kind == "rmat":
        a = float(rng.uniform(0.25, 0.65))
        d = max(0.05, 0.25 - (a - 0.25) / 2)
        return {"generator": "rmat", "a": a, "b": (1 - a - d) / 2, "c": (1 - a - d) / 2, "d": d}
    raise UserError(f"unknown sweep structure {kind!r}; choose one of {', '.join(SWEEP_STRUCTURES)}")


def structured_positions(rows: int, common: int, nnz: int, dims: dict, rng: np.random.Generator):
    """(row, column) ids of nnz nonzeros with the structure ``dims`` (:func:`structure_dimensions`).

    zipf: column rank floor(x) - 1 with x a power law of exponent s on [1, common] (inverse
    CDF), ranks mapped to random columns; rows drawn with lognormal weights of sigma
    row_sigma (uniform for 0). rmat: one quadrant choice per bit of the next power of two
    of each dimension, ids outside the shape redrawn, rows and columns relabelled at
    random (as the trainer's permutation does). Repeated positions are kept (summed by CSR).
    """
    generator = dims.get("generator", "uniform")
    if generator == "zipf":
        u = rng.random(nnz)
        s = dims["zipf_s"]
        x = common ** u if abs(s - 1.0) < 1e-9 else ((float(common) ** (1 - s) - 1.0) * u + 1.0) ** (1.0 / (1 - s))
        cols = rng.permutation(common)[np.clip(np.floor(x).astype(np.int64) - 1, 0, common - 1)]
        if dims["row_sigma"] > 0:
            w = np.exp(dims["row_sigma"] * rng.standard_normal(rows))
            row_ids = np.repeat(np.arange(rows), rng.multinomial(nnz, w / w.sum()))
            rng.shuffle(row_ids)
        else:
            row_ids = rng.integers(0, rows, nnz)
        return row_ids.astype(np.int64), cols.astype(np.int64)
    if generator == "rmat":
        bits_r, bits_c = max(1, int(np.ceil(np.log2(rows)))), max(1, int(np.ceil(np.log2(common))))
        probs = np.array([dims["a"], dims["b"], dims["c"], dims["d"]])
        r_out, c_out, have = [], [], 0
        while have < nnz:
            want = int((nnz - have) * 1.3) + 16
            r = np.zeros(want, dtype=np.int64)
            c = np.zeros(want, dtype=np.int64)
            for level in range(max(bits_r, bits_c)):
                q = rng.choice(4, size=want, p=probs)
                if level < bits_r:
                    r = 2 * r + (q >= 2)
                if level < bits_c:
                    c = 2 * c + (q % 2)
            ok = (r < rows) & (c < common)
            r_out.append(r[ok])
            c_out.append(c[ok])
            have += int(ok.sum())
        r, c = np.concatenate(r_out)[:nnz], np.concatenate(c_out)[:nnz]
        return rng.permutation(rows)[r], rng.permutation(common)[c]
    return rng.integers(0, rows, nnz).astype(np.int64), rng.integers(0, common, nnz).astype(np.int64)


def structured_csr(rows: int, common: int, nnz: int, dims: dict, rng: np.random.Generator):
    """(torch CSR float32 matrix, structure record) with the structure ``dims``; the record holds
    ``dims`` and the statistics of the built matrix (:func:`plexus_tune.graph.structure.operand_structure`)."""
    nnz = int(min(nnz, rows * common))
    row_ids, cols = structured_positions(rows, common, nnz, dims, rng)
    order = np.lexsort((cols, row_ids))
    row_ids, cols = row_ids[order], cols[order]
    row_counts = np.bincount(row_ids, minlength=rows)
    indptr = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(row_counts, out=indptr[1:])
    vals = rng.random(nnz, dtype=np.float32)
    structure = {**dims, **operand_structure(row_counts, np.bincount(cols, minlength=common))}
    return _csr_tensor(indptr, cols, vals, (rows, common)), structure


def random_csr(rows: int, common: int, nnz: int, rng: np.random.Generator):
    """A torch CSR float32 matrix rows x common with about nnz nonzeros (uniform positions)."""

    nnz = int(min(nnz, rows * common))
    # row lengths: multinomial over rows, columns uniform without duplicates per row
    counts = np.minimum(rng.multinomial(nnz, np.full(rows, 1.0 / rows)), common)
    indptr = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    total = int(indptr[-1])
    cols = rng.integers(0, common, size=total, dtype=np.int64)
    vals = rng.random(total, dtype=np.float32)
    return _csr_tensor(indptr, cols, vals, (rows, common))


def _csr_tensor(indptr, indices, values, shape):
    import torch

    # int32 indices when they fit, as the trainer stores its shards
    index = csr_index_dtype(len(indices), *shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "sparse CSR support is in beta" and invariant-check notes
        return torch.sparse_csr_tensor(
            torch.from_numpy(np.asarray(indptr, dtype=index)),
            torch.from_numpy(np.asarray(indices, dtype=index)),
            torch.from_numpy(np.asarray(values, dtype=np.float32)),
            size=tuple(int(v) for v in shape),
        )


def spmm_ms(A, B, **kw) -> float:
    """ms of torch.sparse.mm(A, B) (see :func:`time_call`)."""
    import torch

    return time_call(lambda: torch.sparse.mm(A, B), **kw)


def sweep_shapes(count: int, *, seed: int = 0, rows=(256, 65536), common=(256, 65536), dense_cols=(1, 256), degree=(1.0, 64.0), max_nnz: int = 4_000_000,
                 structure: str = "uniform"):
    """Random log-uniform shard shapes: rows, common, dense_cols (powers of two and odd), nnz = rows * degree.

    ``structure`` other than uniform adds each shape's structure parameters under
    ``"structure"`` (:func:`structure_dimensions`, drawn from a generator of its own so
    that the shapes are those of the uniform sweep of the same seed).
    """
    rng = np.random.default_rng(seed)
    if structure not in SWEEP_STRUCTURES:
        raise UserError(f"unknown sweep structure {structure!r}; choose one of {', '.join(SWEEP_STRUCTURES)}")

    def log_uniform(lo, hi, n):
        return np.exp(rng.uniform(np.log(lo), np.log(hi), n))

    r = np.round(log_uniform(*rows, count)).astype(np.int64)
    c = np.round(log_uniform(*common, count)).astype(np.int64)
    k = np.maximum(1, np.round(log_uniform(*dense_cols, count))).astype(np.int64)
    nnz = np.round(r * log_uniform(*degree, count)).astype(np.int64)
    nnz = np.minimum(np.minimum(nnz, max_nnz), r * c)
    shapes = [dict(nnz=int(a), rows=int(b), common=int(d), dense_cols=int(e)) for a, b, d, e in zip(nnz, r, c, k)]
    if structure != "uniform":
        dims_rng = np.random.default_rng([seed, 7])
        for shape in shapes:
            shape["structure"] = structure_dimensions(structure, dims_rng)
    return shapes


SWEEP_STATISTICS = ("min", "median")


def _shape_bytes(shape) -> int:
    """Bytes of one sweep shape's operands: CSR (int32 index + fp32 value per nonzero) and dense B."""
    return 8 * int(shape["nnz"]) + 4 * (int(shape["rows"]) + 1) + 4 * int(shape["common"]) * int(shape["dense_cols"])


def check_sweep_memory(shapes, device="cpu") -> None:
    """UserError before any operand is built if the largest shape's operands and output (bytes of
    :func:`_shape_bytes` + 4 rows x dense columns) exceed ``device``'s free memory."""
    if len(shapes):
        big = max(shapes, key=lambda s: _shape_bytes(s) + 4 * int(s["rows"]) * int(s["dense_cols"]))
        need = _shape_bytes(big) + 4 * int(big["rows"]) * int(big["dense_cols"])
        check_device_memory(need, f"the SpMM shape of {int(big['rows']):,} x {int(big['common']):,} rows, "
                            f"{int(big['nnz']):,} nonzeros and {int(big['dense_cols']):,} dense columns", device)


def check_shard_memory(n: int, widths, grids, device="cpu") -> None:
    """UserError before any operand is built if one shard's dense operands (F and dH of the SpMMs,
    H, W and dQ of the GEMMs, 4 bytes each; :func:`plexus_tune.model.shapes.layer_shapes`) exceed
    ``device``'s free memory. Layers repeat with period 6 (roles mod 3, layouts mod 2), so the
    first six and the last decide."""
    widths = [int(w) for w in widths]
    kept = widths[:8] if len(widths) <= 8 else widths[:7] + widths[-2:]
    need = 0
    for s in layer_shapes(n, kept, np.asarray(grids, dtype=np.int64).reshape(-1, 3)):
        r_d, r_o, c_i, c_o = (np.asarray(v, dtype=np.float64) for v in (s.r_d, s.r_o, s.c_i, s.c_o))
        need = max(need, float(np.max(4 * (r_o * c_i + 2 * r_d * c_i + c_i * c_o + r_d * c_o))))
    check_device_memory(need, f"the dense operands of the widest shard (widths up to {max(widths):,})", device)


def spmm_sweep(shapes, *, seed: int = 0, repeats: int = 5, passes: int = 1,
               statistic: str = "min", cache_bytes: int = 4 * 2**30, progress=None) -> list[dict]:
    """Time torch.sparse.mm on random CSR matrices of the given shapes; spmm records.

    Interleaved passes: each of ``passes`` passes visits every shape once, in a fresh
    random order, and keeps the minimum over ``repeats`` samples of >= 2 ms. A shape's
    passes thus lie spread over the whole sweep, and every shape sees the same mix of
    host states (the speed of a shared host drifts over seconds to minutes, and
    neighbouring shapes in time err together). Per shape::

        time_min_ms    = min over passes      time_median_ms = median over passes
        time_ms        = the one named by ``statistic``

    Shape i's matrix comes from the generator seeded (seed, i); operands are kept in
    memory between passes while they fit ``cache_bytes`` in all, else rebuilt.
    """
    import torch

    if statistic not in SWEEP_STATISTICS:
        raise UserError(f"unknown sweep statistic {statistic!r}; choose from {', '.join(SWEEP_STATISTICS)}")
    check_sweep_memory(shapes)

    passes = max(1, int(passes))
    samples = [[] for _ in shapes]
    nnz = [0] * len(shapes)
    structures: list = [None] * len(shapes)
    keep = passes > 1 and sum(_shape_bytes(s) for s in shapes) <= cache_bytes
    cache: dict[int, tuple] = {}
    order_rng = np.random.default_rng([seed, len(shapes), passes])

    def operands(i):
        if i in cache:
            return cache[i]
        shape = shapes[i]
        A, structures[i] = structured_csr(shape["rows"], shape["common"], shape["nnz"],
                                          shape.get("structure", {"generator": "uniform"}), np.random.default_rng([seed, i]))
        B = torch.rand(shape["common"], shape["dense_cols"], generator=torch.Generator().manual_seed(seed * 1_000_003 + i))
        if keep:
            cache[i] = (A, B)
        return A, B

    for _ in range(passes):
        for i in order_rng.permutation(len(shapes)):
            A, B = operands(int(i))
            samples[i].append(spmm_ms(A, B, repeats=repeats, statistic="min"))
            nnz[i] = int(A._nnz())
            del A, B
            if progress is not None:
                progress()
    cache.clear()
    records = []
    for i, shape in enumerate(shapes):
        t_min, t_med = float(np.min(samples[i])), float(np.median(samples[i]))
        records.append(
            {
                "schema": SPMM_SCHEMA,
                "source": "sweep",
                "statistic": f"{statistic} over {passes} interleaved pass(es) of (min over {repeats} samples of >= 2 ms)",
                "nnz": nnz[i],
                "rows": shape["rows"],
                "common": shape["common"],
                "dense_cols": shape["dense_cols"],
                "time_ms": t_min if statistic == "min" else t_med,
                "time_min_ms": t_min,
                "time_median_ms": t_med,
                "threads": torch.get_num_threads(),
                "passes": passes,
                "repeats": repeats,
                "kernel": "torch.sparse.mm(csr int32, dense)",
                "structure": structures[i],
                "measured_at": now_utc(),
            }
        )
    return records


def shard(matrix, row_block: int, col_block: int, row_index: int, col_index: int):
    """Block (row_index, col_index) of a scipy CSR matrix cut into row_block x col_block tiles
    (zero padded to row_block x col_block past the matrix, as the trainer allocates)."""
    n_rows, n_cols = matrix.shape
    r0, c0 = row_index * row_block, col_index * col_block
    part = matrix[min(r0, n_rows) : min(r0 + row_block, n_rows), min(c0, n_cols) : min(c0 + col_block, n_cols)]
    import scipy.sparse as sp

    out = sp.csr_matrix((part.data, part.indices, part.indptr), shape=(part.shape[0], part.shape[1]))
    out.resize((row_block, col_block))
    return out


def _torch_csr(m):

    m = m.tocsr()
    return _csr_tensor(m.indptr, m.indices, m.data, m.shape)


def calibrate_graph_shards(
    adjacency,
    widths,
    gpus: int,
    *,
    grids=None,
    seed: int = 0,
    repeats: int = 5,
    all_shards: bool = False,
    graph_name: str = "graph",
    progress=None,
) -> list[dict]:
    """Time the real shard SpMMs (forward A F, backward A^T dH) and GEMMs of every grid and layer.

    ``adjacency`` is the GCN-normalized N x N CSR matrix; it is double-permuted, layer i
    uses P_r A P_c^T for even i and its transpose layout for odd i. The shard of a rank
    is rows ceil(N/g_d), columns ceil(N/g_o) of that layout at its (depth, outer)
    coordinates (:func:`plexus_tune.model.shapes.layer_shapes`, the trainer's shard
    shapes); shards are the same along the inner axis, so each distinct shard is
    timed once (``all_shards``; otherwise the one with the most nonzeros, which decides
    the epoch). Returns spmm and gemm records.
    """
    import torch

    n = adjacency.shape[0]
    perm, _, _ = double_permute(adjacency, seed=seed)
    layouts = [perm.tocsr(), perm.T.tocsr()]
    grids = enumerate_grids(gpus) if grids is None else np.asarray(grids, dtype=np.int64).reshape(-1, 3)
    widest = max(grids, key=lambda g: int(np.prod(sorted(int(v) for v in g)[1:])))
    longest = max(grids, key=lambda g: int(max(g)))
    if int(max(longest)) > n:
        raise UserError(f"grid {'x'.join(map(str, longest))} of G={gpus:,} has more ranks along an axis than the graph's "
                        f"{n:,} nodes: its shards would be empty; give a G whose grids fit the graph")
    check_memory(8 * int(np.prod(sorted(int(v) for v in widest)[1:])), f"the shard counts of grid {'x'.join(map(str, widest))}")
    check_shard_memory(n, widths, grids)
    stamp = now_utc()
    records: list[dict] = []
    for grid in grids:
        grid = tuple(int(v) for v in grid)
        for s in layer_shapes(n, widths, grid):
            layer, g_o, g_d = s.layer, s.g_o, s.g_d
            r_d, r_o, c_i, c_o = s.r_d, s.r_o, s.c_i, s.c_o
            layout = layouts[layer % 2]
            # nonzeros of every (depth, outer) shard, from one pass over the layout
            coo = layout.tocoo()
            counts = np.zeros((g_d, g_o), dtype=np.int64)
            np.add.at(counts, (coo.row // r_d, coo.col // r_o), 1)
            picks = [(a, b) for a in range(g_d) for b in range(g_o)] if all_shards else [np.unravel_index(int(np.argmax(counts)), counts.shape)]
            base = {
                "graph": graph_name,
                "graph_nodes": n,
                "grid": format_grid(grid),
                "gx": grid[0],
                "gy": grid[1],
                "gz": grid[2],
                "gpus": gpus,
                "layer": layer,
                "threads": torch.get_num_threads(),
                "measured_at": stamp,
            }
            imbalance = float(counts.max() / max(counts.mean(), 1e-12))
            for a, b in picks:
                A = shard(layout, r_d, r_o, int(a), int(b))
                At = A.T.tocsr()
                fwd = spmm_ms(_torch_csr(A), torch.rand(r_o, c_i), repeats=repeats, statistic="min")
                bwd = spmm_ms(_torch_csr(At), torch.rand(r_d, c_i), repeats=repeats, statistic="min")
                common = {**base, "statistic": "min over samples of >= 2 ms", "shard": [int(a), int(b)], "nnz_imbalance": imbalance, "source": "graph", "kernel": "torch.sparse.mm(csr int32, dense)"}
                row_counts, col_counts = np.diff(A.indptr), np.bincount(A.indices, minlength=r_o)
                records.append({"schema": SPMM_SCHEMA, **common, "direction": "forward", "nnz": int(A.nnz), "rows": r_d, "common": r_o, "dense_cols": c_i, "time_ms": fwd,
                                "structure": operand_structure(row_counts, col_counts)})
                records.append({"schema": SPMM_SCHEMA, **common, "direction": "backward", "nnz": int(A.nnz), "rows": r_o, "common": r_d, "dense_cols": c_i, "time_ms": bwd,
                                "structure": operand_structure(col_counts, row_counts)})
            H, W, dQ = torch.rand(r_d, c_i), torch.rand(c_i, c_o), torch.rand(r_d, c_o)
            for name, fn, shape in (
                ("forward H W", lambda: H @ W, (r_d, c_i, c_o)),
                ("backward H^T dQ", lambda: H.T @ dQ, (c_i, r_d, c_o)),
                ("backward dQ W^T", lambda: dQ @ W.T, (r_d, c_o, c_i)),
            ):
                t = time_call(fn, repeats=repeats, statistic="min")
                records.append({"schema": GEMM_SCHEMA, **base, "product": name, "rows": shape[0], "inner": shape[1], "cols": shape[2], "time_ms": t})
            if progress is not None:
                progress()
    return records


class _ShapeRecorder(SpmmKind):
    """An SpMM model that prices every SpMM at 1 ms and keeps the shapes it was asked for."""

    name = "shape-recorder"
    directional = True

    def __init__(self):
        self.shapes: list[tuple[np.ndarray, ...]] = []

    def predict(self, nnz, rows, common, dense_cols, structure=None, backward: bool = False):
        arrays = np.broadcast_arrays(*(np.asarray(a, dtype=np.float64) for a in (nnz, rows, common, dense_cols)))
        self.shapes.append(tuple(a.ravel() for a in arrays))
        return np.ones(arrays[0].shape)


def family_piece_shapes(graph, widths, gpus: int, *, limit: int = 300, seed: int = 0) -> list[dict]:
    """The distinct local SpMM shapes (nnz, rows, common, dense_cols) that the model of every full-graph
    family reading the graph (:attr:`~plexus_tune.model.family.Family.reads_graph`: CAGNET's block rows,
    stage chunks and SUMMA pieces, SuperGCN's partition pieces) prices on ``graph`` at each of its
    configurations and variants of G = ``gpus``; at most ``limit`` of them, drawn with ``seed`` where more.

    The shapes are the ones the families' predictions evaluate (a recording SpMM model stands in for the
    profile's), so a profile fitted on their timings covers the small pieces the 3D shards never reach."""
    recorder = _ShapeRecorder()
    machine = replace(load_machine("cpu-gloo-2core"), spmm=recorder, memory_bandwidth_gbps=None)
    context = GraphContext(graph)
    workload = Workload("pieces", int(graph.num_nodes), int(graph.normalized_adjacency().nnz), tuple(int(w) for w in widths))
    for name in family_names():
        family = FAMILIES[name]
        if not family.reads_graph:
            continue
        extra = family.graph_options(context, gpus)
        for variant in family.variants():
            grids = family.configurations(gpus, **{k: v for k, v in variant.items() if k in family.choices})
            for grid in grids:
                predict_run_grids(workload, machine, np.asarray([grid]), algorithm=name,
                                  options={**variant, **extra})
    if not recorder.shapes:
        return []
    table = np.rint(np.concatenate([np.stack(s, axis=1) for s in recorder.shapes])).astype(np.int64)
    table = table[(table[:, 0] > 1) & (table[:, 1] > 1) & (table[:, 2] > 1)]  # calls not made carry unit shapes
    table = np.unique(table, axis=0)
    if len(table) > limit:
        table = table[np.sort(np.random.default_rng(seed).choice(len(table), limit, replace=False))]
    return [dict(nnz=int(a), rows=int(b), common=int(c), dense_cols=int(d)) for a, b, c, d in table]


def family_pieces(graph, widths, gpus: int, *, limit: int = 500, seed: int = 0, repeats: int = 5,
                  progress=None) -> list[dict]:
    """SpMM records (``source`` ``family-pieces``) of random CSR operands of each of
    :func:`family_piece_shapes` (up to ``limit``): the kernel on the local shapes the CAGNET and
    SuperGCN models price. ``progress(total)`` returns the per-shape callback."""
    shapes = family_piece_shapes(graph, widths, gpus, limit=limit, seed=seed)
    records = spmm_sweep(shapes, seed=seed, repeats=repeats,
                         progress=progress(len(shapes)) if progress is not None and shapes else None)
    for r in records:
        r.update(source="family-pieces", graph=graph.name, graph_nodes=int(graph.num_nodes), gpus=int(gpus))
    return records
