"""The trainer against its floors and against a fair PyG baseline (docs/trainer.md,
"Floors"): :func:`floor_report` sets each part of the critical rank's epoch beside its
floor (:mod:`plexus_tune.measure.floor`), :func:`trainer_vs_pyg` the 1x1x1 epoch beside
PyG's, :func:`lattice_permutations` the SpMM phase per permutation. The benchmark
``runners/benchmarks/bench_trainer.py`` and ``runners/gpu_check.py`` print them.
"""

from __future__ import annotations

import time
import warnings

import numpy as np

from plexus_tune.allocator import configure_compute_process
from plexus_tune.graph import gcn_normalize
from plexus_tune.graph.splits import random_split
from plexus_tune.launch import default_threads_per_rank, launch_local
from plexus_tune.measure.floor import floor_table, floor_work, measure_ceilings, measured_parts
from plexus_tune.model.grid import format_grid
from plexus_tune.model.memory import memory_breakdown
from plexus_tune.model.other import OPTIMIZER_ACCESSES
from plexus_tune.model.shapes import layer_shapes
from plexus_tune.model.workload import Workload, model_widths
from plexus_tune.trainer import TrainConfig


def _launch(graph, configs, device: str, world: int):
    from plexus_tune.trainer.rank import rank_main

    backend = "nccl" if device == "cuda" else "gloo"
    return launch_local(rank_main, world, args=(graph, configs, device), backend=backend, timeout_s=3600,
                        preload=("torch._dynamo", "plexus_tune.trainer.rank"))[0]


def run_trainer(graph, grid=(1, 1, 1), *, hidden: int = 64, layers: int = 3, epochs: int = 6, warmup: int = 2,
                permute: str = "double", device: str = "cpu", extra: dict | None = None) -> dict:
    """One trainer run (rank 0's result of :func:`plexus_tune.trainer.rank.rank_main`)."""

    grid = tuple(int(g) for g in grid)
    config = TrainConfig(grid=grid, layers=layers, hidden=hidden, epochs=epochs, warmup=warmup, permute=permute,
                         backend="nccl" if device == "cuda" else "gloo", extra=dict(extra or {}))
    return _launch(graph, [config], device, grid[0] * grid[1] * grid[2])[0]


def floor_report(graph, grid=(1, 1, 1), *, hidden: int = 64, layers: int = 3, epochs: int = 6, warmup: int = 2,
                 permute: str = "double", device: str = "cpu", ceilings: dict | None = None) -> dict:
    """Each part of the critical rank's epoch beside its floor (:mod:`plexus_tune.measure.floor`).

    Returns {"rows": [{part, ms, floor_ms, ratio, basis, bytes, flops}], "parts": {part: ms},
    "ceilings": {...}, "result": the run's result, "rank": the critical rank}."""


    grid = tuple(int(g) for g in grid)
    result = run_trainer(graph, grid, hidden=hidden, layers=layers, epochs=epochs, warmup=warmup, permute=permute,
                         device=device)
    ceilings = ceilings or measure_ceilings(device)
    timers = result["timers"]
    rank = int(np.argmax([np.mean([r["epoch_ms"] for r in t[warmup:]]) for t in timers]))
    parts = measured_parts(timers[rank][warmup:])
    shapes = layer_shapes(result["nodes"], result["widths"], grid)
    comm = result["comm_bytes"][rank][warmup:]
    comm_bytes = float(np.mean([sum(e.values()) for e in comm])) if comm else 0.0

    work = floor_work(shapes, result["shard_nnz"][rank], classes_local=int(shapes[-1].c_o), comm_bytes=comm_bytes,
                      optimizer_passes=OPTIMIZER_ACCESSES[result.get("optimizer") or "adamw-fused"])
    return {"rows": floor_table(parts, work, ceilings), "parts": parts, "ceilings": ceilings, "result": result,
            "rank": rank, "grid": grid, "device": device, "memory": memory_against_model(result, grid, permute),
            # a dense row per nonzero (forward A F and backward A^T dH of every layer): no cache reuse
            "spmm_gather_bytes": sum(2.0 * 4 * z * float(s.c_i) for z, s in zip(result["shard_nnz"][rank], shapes))}


def memory_against_model(result: dict, grid, permute: str = "double") -> dict:
    """Each rank's peak memory beside the model's (:func:`plexus_tune.model.memory.memory_breakdown`):
    the CUDA allocator's peak on a GPU, else the tensor bytes the trainer tracks."""

    work = Workload(name="bench", nodes=result["nodes"], nnz=result["nnz"], widths=tuple(result["widths"]))
    model = float(memory_breakdown(work, [tuple(grid)], double_permutation=permute != "none")["total"][0])
    per_rank = [m.get("cuda_max_allocated_bytes", m["tracked_bytes"]) for m in result["memory"]]
    measured = float(max(per_rank))
    kind = "cuda_max_allocated_bytes" if "cuda_max_allocated_bytes" in result["memory"][0] else "tracked_bytes"
    return {"measured_bytes": measured, "model_bytes": model, "ratio": measured / model, "measured": kind}


def other_share(report: dict) -> float:
    """``other_ms`` (loss, optimizer, elementwise, the rest) as a share of the epoch."""
    p = report["parts"]
    return (p["loss"] + p["optimizer"] + p["elementwise"] + p["sync"]) / p["epoch"]


def pyg_fair_epoch(graph, *, hidden: int = 64, layers: int = 3, epochs: int = 6, warmup: int = 2,
                   device: str = "cpu", fused: bool = False, seed: int = 0) -> dict:
    """PyG GCNConv(normalize=False) on the normalized adjacency as a CSR ``adj_t``, ReLU
    between layers, trainable input features, cross-entropy over the training nodes,
    AdamW (torch's default implementation, or ``fused``). Epoch times (ms), the device
    synchronised at the end of each epoch."""
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import GCNConv



    warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
    dev = torch.device(device)
    a = gcn_normalize(graph.adjacency)
    adj_t = torch.sparse_csr_tensor(torch.from_numpy(a.indptr.astype(np.int64)),
                                    torch.from_numpy(a.indices.astype(np.int64)),
                                    torch.from_numpy(a.data.astype(np.float32)), size=a.shape).to(dev)
    widths = model_widths(graph.features.shape[1], graph.num_classes, layers, hidden)
    torch.manual_seed(seed)
    convs = torch.nn.ModuleList([GCNConv(widths[i], widths[i + 1], normalize=False) for i in range(layers)]).to(dev)
    x0 = torch.nn.Parameter(torch.tensor(np.asarray(graph.features, dtype=np.float32), device=dev))
    labels = torch.as_tensor(np.asarray(graph.labels, dtype=np.int64), device=dev)
    train = torch.as_tensor(random_split(labels.shape[0], seed) == 0, device=dev)
    opt = torch.optim.AdamW([x0, *convs.parameters()], lr=0.01, weight_decay=0.01, **({"fused": True} if fused else {}))
    times = []
    for _ in range(int(epochs)):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        opt.zero_grad()
        x = x0
        for i, conv in enumerate(convs):
            x = conv(x, adj_t)
            if i < layers - 1:
                x = torch.relu(x)
        loss = F.cross_entropy(x[train], labels[train])
        loss.backward()
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append((time.perf_counter() - t0) * 1e3)
    return {"epoch_ms": times, "mean_ms": float(np.mean(times[warmup:])), "fused": bool(fused)}


def trainer_vs_pyg(graph, *, hidden: int = 64, layers: int = 3, epochs: int = 6, warmup: int = 2,
                   device: str = "cpu", fused_pyg: bool = False) -> dict:
    """The 1x1x1 trainer's epoch over the fair PyG baseline's (goal on a GPU: 0.45 or less at products size)."""


    result = run_trainer(graph, (1, 1, 1), hidden=hidden, layers=layers, epochs=epochs, warmup=warmup, device=device)
    trainer_ms = float(np.mean([r["epoch_ms"] for r in result["timers"][0][warmup:]]))
    configure_compute_process(default_threads_per_rank(1))  # as the rank runs
    pyg = pyg_fair_epoch(graph, hidden=hidden, layers=layers, epochs=epochs, warmup=warmup, device=device,
                         fused=fused_pyg)
    return {"trainer_ms": trainer_ms, "pyg_ms": pyg["mean_ms"], "ratio": trainer_ms / pyg["mean_ms"],
            "pyg_fused": bool(fused_pyg), "losses": result["losses"]}


def lattice_permutations(graph, *, hidden: int = 64, layers: int = 3, epochs: int = 4, warmup: int = 1,
                         device: str = "cpu", split_grids=((8, 1, 1), (8, 8, 1)), rounds: int = 1) -> dict:
    """The trainer's SpMM phase at 1x1x1 per permutation, and its ratio to natural order:
    ``none``, ``double``, ``local`` (as 1x1x1 applies it: the identity) and
    ``local@<grid>`` for each of ``split_grids`` (the permutation a grid of those
    dimensions applies, trained at 1x1x1). ``rounds`` > 1 runs the variants in order,
    then in reverse order, and so on, and averages: a drift of the host load cancels."""


    common = dict(grid=(1, 1, 1), layers=layers, hidden=hidden, epochs=epochs, warmup=warmup,
                  backend="nccl" if device == "cuda" else "gloo")
    variants = {"none": TrainConfig(permute="none", **common), "double": TrainConfig(permute="double", **common),
                "local": TrainConfig(permute="local", **common)}
    for split in split_grids:
        name = "local@" + format_grid(split)
        variants[name] = TrainConfig(permute="local", extra={"permute_grid": tuple(int(g) for g in split)}, **common)
    names = list(variants)
    order = [n for r in range(max(1, int(rounds))) for n in (names if r % 2 == 0 else names[::-1])]
    results = _launch(graph, [variants[n] for n in order], device, 1)
    samples = {name: {"spmm_ms": [], "epoch_ms": []} for name in names}
    for name, res in zip(order, results):
        rows = res["timers"][0][warmup:]
        samples[name]["spmm_ms"].append(float(np.mean([r["spmm_ms"] for r in rows])))
        samples[name]["epoch_ms"].append(float(np.mean([r["epoch_ms"] for r in rows])))
    out = {name: {key: float(np.mean(v)) for key, v in samples[name].items()} for name in names}
    for name in out:
        out[name]["spmm_vs_none"] = out[name]["spmm_ms"] / out["none"]["spmm_ms"]
    return out
