"""SpMM and GEMM microbenchmarks with the operands built on the timing device (CUDA or CPU).

The sparse operands are made by torch on the device itself (random indices, sort,
row counts; a graph's shard is cut from the permuted adjacency held on the device as
COO), so that the shards of a products-size graph at G = 64 take about a minute on one
GPU. Every call is timed by :func:`plexus_tune.measure.device.time_on_device` (CUDA
events after warm-up, several samples; min in ``time_ms``, median in
``time_median_ms``), and every record carries the device, driver, CUDA, torch and PyG
versions (``machine_info``). Record fields are those of the host-built benchmarks of
:mod:`plexus_tune.measure.spmm` (docs/records.md) plus, for each timed shard, its
structure statistics (``structure``: ``row_length_cv``, ``top1pct_column_share``,
``touched_column_fraction``).
"""

from __future__ import annotations

import warnings

import numpy as np

from plexus_tune.graph.permute import grid_parts, permutations_for
from plexus_tune.graph.structure import operand_structure
from plexus_tune.measure.device import device_info, statistic_text, time_on_device
from plexus_tune.measure.spmm import check_shard_memory, check_sweep_memory, structured_positions
from plexus_tune.measure.store import GEMM_SCHEMA, SPMM_SCHEMA, environment_info, now_utc
from plexus_tune.model.grid import enumerate_grids, format_grid
from plexus_tune.model.shapes import layer_shapes


def _csr(torch, rows_idx, cols_idx, values, shape):
    """CSR (int32 indices, as the trainer stores its shards) from COO indices sorted by (row, column)."""
    rows, cols = int(shape[0]), int(shape[1])
    crow = torch.zeros(rows + 1, dtype=torch.int64, device=values.device)
    crow[1:] = torch.cumsum(torch.bincount(rows_idx, minlength=rows), 0)
    index = torch.int32 if max(rows, cols, int(values.numel())) < 2**31 - 1 else torch.int64
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "sparse CSR support is in beta" and invariant-check notes
        return torch.sparse_csr_tensor(crow.to(index), cols_idx.to(index), values, size=(rows, cols))


def random_csr_on(device, rows: int, common: int, nnz: int, generator):
    """Uniform random CSR built on ``device``: ``nnz`` draws of (row, column), duplicates merged."""
    import torch

    r = torch.randint(0, rows, (nnz,), device=device, generator=generator)
    c = torch.randint(0, common, (nnz,), device=device, generator=generator)
    key = torch.unique(r * common + c)  # sorted by (row, column)
    values = torch.rand(key.numel(), device=device, generator=generator)
    return _csr(torch, key // common, key % common, values, (rows, common))


def _info(device) -> dict:
    return {**environment_info(), **device_info(device)}


def _kernel(info) -> str:
    return f"torch.sparse.mm(csr int32, dense) on {info['device']}"


def device_spmm_sweep(shapes, device, *, seed: int = 0, min_samples: int = 10, min_time_s: float = 0.2,
                      progress=None) -> list[dict]:
    """Time torch.sparse.mm on random CSR matrices of ``shapes`` built on ``device``; spmm records.

    A shape with ``structure`` parameters (:func:`plexus_tune.measure.spmm.sweep_shapes`)
    gets the positions of :func:`plexus_tune.measure.spmm.structured_positions` (drawn on the
    host, repeated positions kept as the host sweep keeps them); the rest are uniform.
    """
    import torch

    check_sweep_memory(shapes, device)
    info = _info(device)
    gen = torch.Generator(device=device).manual_seed(int(seed))
    records = []
    for i, shape in enumerate(shapes):
        dims = shape.get("structure") or {"generator": "uniform"}
        if dims.get("generator", "uniform") == "uniform":
            A = random_csr_on(device, shape["rows"], shape["common"], shape["nnz"], gen)
        else:  # positions drawn as the host sweep draws them (same seed, same matrix), sorted and built on the device
            nnz = int(min(shape["nnz"], shape["rows"] * shape["common"]))
            r, c = structured_positions(shape["rows"], shape["common"], nnz, dims, np.random.default_rng([seed, i]))
            r, c = torch.from_numpy(r).to(device), torch.from_numpy(c).to(device)
            order = torch.argsort(r * shape["common"] + c)
            A = _csr(torch, r[order], c[order], torch.rand(nnz, device=device, generator=gen), (shape["rows"], shape["common"]))
            del r, c, order
        B = torch.rand(shape["common"], shape["dense_cols"], device=device, generator=gen)
        t_min, t_med, n = time_on_device(lambda: torch.sparse.mm(A, B), device, min_samples=min_samples, min_time_s=min_time_s)
        crow = A.crow_indices().to(torch.int64)
        structure = {**dims, **operand_structure((crow[1:] - crow[:-1]).cpu().numpy(),
                                                 torch.bincount(A.col_indices().to(torch.int64), minlength=shape["common"]).cpu().numpy())}
        records.append({"schema": SPMM_SCHEMA, "source": "sweep", "statistic": statistic_text(device, n), "structure": structure,
                        "nnz": int(A.values().numel()), "rows": shape["rows"], "common": shape["common"],
                        "dense_cols": shape["dense_cols"], "time_ms": t_min, "time_min_ms": t_min, "time_median_ms": t_med,
                        "repeats": n, "passes": 1, "threads": torch.get_num_threads(), "kernel": _kernel(info),
                        "measured_at": now_utc(), "machine_info": info})
        del A, B
        if progress is not None:
            progress()
    return records


def _structures(torch, rows_idx, cols_idx, rows: int, cols: int) -> tuple[dict, dict]:
    """The operand structure (:func:`plexus_tune.graph.structure.operand_structure`) of a shard
    and of its transpose, from row and column counts taken on the device."""
    row_counts = torch.bincount(rows_idx, minlength=rows).cpu().numpy()
    col_counts = torch.bincount(cols_idx, minlength=cols).cpu().numpy()
    return operand_structure(row_counts, col_counts), operand_structure(col_counts, row_counts)


def layout_on(matrix, device):
    """(row, column, value) tensors on ``device`` of a sparse matrix, sorted by (row, column)."""
    import torch

    csr = matrix.tocsr()
    csr.sort_indices()
    coo = csr.tocoo()
    return tuple(torch.from_numpy(np.asarray(a, dtype=dt)).to(device)
                 for a, dt in ((coo.row, np.int64), (coo.col, np.int64), (coo.data, np.float32)))


def permuted_layouts_on(adjacency, row_perm, col_perm, device):
    """The two layouts of a permuted adjacency, permuted and sorted on ``device``.

    B = A[row_perm][:, col_perm] (:mod:`plexus_tune.graph.permute`): the nonzero (r, c) of A
    is B[inv_row[r], inv_col[c]] and B^T[inv_col[c], inv_row[r]]. Returns the (row, column,
    value) tensors of B and of B^T, each sorted by (row, column) as :func:`layout_on` gives them.
    """
    import torch

    csr = adjacency.tocsr()
    n_rows, n_cols = csr.shape
    counts = torch.from_numpy(np.diff(csr.indptr).astype(np.int64)).to(device)
    rows = torch.repeat_interleave(torch.arange(n_rows, device=device), counts)
    cols = torch.from_numpy(np.asarray(csr.indices, dtype=np.int64)).to(device)
    vals = torch.from_numpy(np.asarray(csr.data, dtype=np.float32)).to(device)
    inv_row = torch.empty(n_rows, dtype=torch.int64, device=device)
    inv_row[torch.from_numpy(np.asarray(row_perm, dtype=np.int64)).to(device)] = torch.arange(n_rows, device=device)
    inv_col = torch.empty(n_cols, dtype=torch.int64, device=device)
    inv_col[torch.from_numpy(np.asarray(col_perm, dtype=np.int64)).to(device)] = torch.arange(n_cols, device=device)
    new_rows, new_cols = inv_row[rows], inv_col[cols]
    del rows, cols
    layouts = []
    for r, c, width in ((new_rows, new_cols, n_cols), (new_cols, new_rows, n_rows)):
        order = torch.argsort(r * width + c)
        layouts.append((r[order], c[order], vals[order]))
        del order
    return layouts


def largest_shard_on(layout, r_d: int, r_o: int, g_d: int, g_o: int):
    """The shard with the most nonzeros of a layout cut into r_d x r_o blocks (g_d x g_o of them):
    (A and A^T as CSR on the layout's device, nonzeros per block, (depth, outer) of the shard,
    (its local rows, columns))."""
    import torch

    row, col, val = layout
    block = (row // r_d) * g_o + col // r_o
    counts = torch.bincount(block, minlength=g_d * g_o)
    best = int(torch.argmax(counts))
    mask = block == best
    a, b = divmod(best, g_o)
    rr, cc, vv = row[mask] - a * r_d, col[mask] - b * r_o, val[mask]  # still sorted by (row, column)
    A = _csr(torch, rr, cc, vv, (r_d, r_o))
    order = torch.argsort(cc * r_d + rr)
    At = _csr(torch, cc[order], rr[order], vv[order], (r_o, r_d))
    return A, At, counts, (a, b), (rr, cc)


def device_graph_shards(adjacency, widths, gpus: int, device, *, grids=None, seed: int = 0, permute: str = "double",
                        graph_name: str = "graph", min_samples: int = 10, min_time_s: float = 0.2, progress=None) -> list[dict]:
    """Time the largest shard's SpMMs (forward A F, backward A^T dH) and the GEMMs of every grid and layer on ``device``.

    As :func:`plexus_tune.measure.spmm.calibrate_graph_shards` (layer i uses the
    permuted layout for even i, its transpose layout for odd i; shard sizes from
    :func:`plexus_tune.model.shapes.layer_shapes`), with the adjacency permuted on the
    device (:func:`permuted_layouts_on`; ``permute`` a mode of
    :func:`plexus_tune.graph.permute.permutations_for`, ``local`` with the part counts of
    every grid timed) and each distinct (layout, g_d, g_o) shard cut, built and timed
    once; GEMMs are timed once per distinct shape.
    """
    import torch

    grids = enumerate_grids(gpus) if grids is None else np.asarray(grids, dtype=np.int64).reshape(-1, 3)
    parts = sorted({p for grid in grids for p in grid_parts(grid)})
    n = adjacency.shape[0]
    check_shard_memory(n, widths, grids, device)
    row_perm, col_perm = permutations_for(permute, n, seed, parts=parts)
    layouts = permuted_layouts_on(adjacency, row_perm, col_perm, device)
    info = _info(device)
    stamp = now_utc()
    timing = dict(min_samples=min_samples, min_time_s=min_time_s)
    shard_cache: dict = {}
    gemm_cache: dict = {}
    records: list[dict] = []
    for grid in grids:
        grid = tuple(int(v) for v in grid)
        for s in layer_shapes(n, widths, grid):
            r_d, r_o, c_i, c_o, g_d, g_o = (int(v) for v in (s.r_d, s.r_o, s.c_i, s.c_o, s.g_d, s.g_o))
            key = (s.layer % 2, g_d, g_o, c_i)
            if key not in shard_cache:
                A, At, counts, (a, b), (rr, cc) = largest_shard_on(layouts[s.layer % 2], r_d, r_o, g_d, g_o)
                F = torch.rand(r_o, c_i, device=device)
                dH = torch.rand(r_d, c_i, device=device)
                fwd = time_on_device(lambda: torch.sparse.mm(A, F), device, **timing)
                bwd = time_on_device(lambda: torch.sparse.mm(At, dH), device, **timing)
                imbalance = float(counts.max()) / max(float(counts.double().mean()), 1e-12)
                shard_cache[key] = (int(rr.numel()), [a, b], imbalance, fwd, bwd, _structures(torch, rr, cc, r_d, r_o))
                del A, At, F, dH, rr, cc
            nnz, shard, imbalance, fwd, bwd, (structure, structure_t) = shard_cache[key]
            base = {"graph": graph_name, "graph_nodes": n, "grid": format_grid(grid), "gx": grid[0], "gy": grid[1], "gz": grid[2],
                    "gpus": int(gpus), "layer": s.layer, "threads": torch.get_num_threads(), "measured_at": stamp,
                    "machine_info": info}
            common = {**base, "source": "graph", "kernel": _kernel(info), "shard": shard, "nnz_imbalance": imbalance,
                      "permute": permute}
            for direction, (t_min, t_med, k), dims, st in (("forward", fwd, (r_d, r_o), structure),
                                                           ("backward", bwd, (r_o, r_d), structure_t)):
                records.append({"schema": SPMM_SCHEMA, **common, "structure": st, "direction": direction, "nnz": nnz, "rows": dims[0],
                                "common": dims[1], "dense_cols": c_i, "time_ms": t_min, "time_min_ms": t_min,
                                "time_median_ms": t_med, "repeats": k, "statistic": statistic_text(device, k)})
            gkey = (r_d, c_i, c_o)
            if gkey not in gemm_cache:
                H, W, dQ = (torch.rand(*shape, device=device) for shape in ((r_d, c_i), (c_i, c_o), (r_d, c_o)))
                gemm_cache[gkey] = [time_on_device(fn, device, **timing) for fn in (lambda: H @ W, lambda: H.T @ dQ, lambda: dQ @ W.T)]
                del H, W, dQ
            for name, (t_min, t_med, k), dims in zip(("forward H W", "backward H^T dQ", "backward dQ W^T"), gemm_cache[gkey],
                                                     ((r_d, c_i, c_o), (c_i, r_d, c_o), (r_d, c_o, c_i))):
                records.append({"schema": GEMM_SCHEMA, **base, "product": name, "rows": dims[0], "inner": dims[1], "cols": dims[2],
                                "time_ms": t_min, "time_min_ms": t_min, "time_median_ms": t_med, "repeats": k,
                                "statistic": statistic_text(device, k)})
            if progress is not None:
                progress()
    return records
