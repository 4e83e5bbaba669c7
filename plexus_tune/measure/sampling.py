"""Timings of ScaleGNN's communication-free sampling (``calibrate sampling``), logged as
sampling records (docs/model.md, "ScaleGNN", Sampling).

One record is one (graph, 3D grid, B): every rank of the grid draws the step's sample
and cuts its A_S and A_S^T from its shards, the trainer's own kernel
(:func:`plexus_tune.trainer.scalegnn.draw_sample`,
:func:`plexus_tune.trainer.scalegnn.cut_sampled_shards`); the record holds the mean over
the ranks of the median over ``repeats`` steps, beside the model's count of what that
work moves (:func:`plexus_tune.model.scalegnn.sampling_work`). With ``processes`` > 1
that many copies run the same sweep at once, as the ranks of an oversubscribed host
sample at once, and a record holds the median over the copies.
"""

from __future__ import annotations

import time

import numpy as np

from plexus_tune.graph.core import gcn_normalize
from plexus_tune.measure.campaign import load_graph_source
from plexus_tune.measure.records import SamplingRecord
from plexus_tune.measure.store import append_records, environment_info, now_utc
from plexus_tune.model.grid import coords_of
from plexus_tune.model.scalegnn import sampling_work
from plexus_tune.model.workload import Workload, model_widths


def time_sampling(adjacency, grid, batch: int, *, layers: int = 3, repeats: int = 5, seed: int = 0) -> float:
    """Mean over the ranks of ``grid`` of the median over ``repeats`` steps of one step's sampling (ms):
    the sample drawn and every layout's (A_S, A_S^T) cut from the rank's shards of the GCN-normalized
    ``adjacency`` (the trainer's kernel; one untimed step first)."""
    import torch

    from plexus_tune.trainer.scalegnn import cut_sampled_shards, draw_sample, graph_shards_of

    n = adjacency.shape[0]
    grid = tuple(int(g) for g in grid)
    per_rank = []
    for rank in range(int(np.prod(grid))):
        coords = coords_of(rank, grid)
        shards = graph_shards_of(adjacency, grid, coords, layers)
        times = []
        for step in range(int(repeats) + 1):
            t0 = time.perf_counter()
            sample = draw_sample(n, grid, batch, seed, step, 0)
            cut_sampled_shards(shards, coords, sample, n, torch.float32, "cpu")
            times.append((time.perf_counter() - t0) * 1e3)
        per_rank.append(float(np.median(times[1:])))
    return float(np.mean(per_rank))


def _sweep(args) -> list[float]:
    source, grids, batches, layers, repeats, seed = args
    graph = load_graph_source(source)
    adjacency = gcn_normalize(graph.adjacency).tocsr()
    return [time_sampling(adjacency, grid, batch, layers=layers, repeats=repeats, seed=seed)
            for grid in grids for batch in batches]


def run_sampling_benchmark(log, source: str, *, grids, batches, layers: int = 3, repeats: int = 5,
                           processes: int = 1, seed: int = 0) -> list[dict]:
    """Time every (grid, B) of graph ``source`` in ``processes`` copies at once; append sampling
    records to ``log`` (one per (grid, B): the median over the copies) and return them."""
    graph = load_graph_source(source)
    adjacency = gcn_normalize(graph.adjacency).tocsr()
    nodes, nnz = int(adjacency.shape[0]), int(adjacency.nnz)
    grids = [tuple(int(g) for g in grid) for grid in grids]
    batches = [int(b) for b in batches]
    job = (source, grids, batches, int(layers), int(repeats), int(seed))
    if int(processes) > 1:
        import multiprocessing

        with multiprocessing.get_context("spawn").Pool(int(processes)) as pool:
            copies = pool.map(_sweep, [job] * int(processes))
    else:
        copies = [_sweep(job)]
    times = np.median(np.asarray(copies, dtype=np.float64), axis=0)
    env = environment_info()
    workload = Workload(name=str(source), nodes=nodes, nnz=nnz,
                        widths=model_widths(int(graph.features.shape[1]), int(graph.num_classes), int(layers), 64),
                        bytes_per_element=4)
    out = []
    k = 0
    for grid in grids:
        for batch in batches:
            layouts, work_bytes = sampling_work(workload, grid, batch)
            out.append(SamplingRecord(graph_source=str(source), nodes=nodes, nnz=nnz, grid="x".join(map(str, grid)),
                                      batch_size=batch, layouts=layouts, work_bytes=float(work_bytes),
                                      time_ms=float(times[k]), repeats=int(repeats), processes=int(processes),
                                      measured_at=now_utc(), machine_info=env).to_dict())
            k += 1
    append_records(log, out)
    return out
