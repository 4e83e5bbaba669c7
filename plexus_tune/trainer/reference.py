"""The serial PyTorch Geometric GCN that the 3D-parallel trainer must equal.

Model: trainable input features X (a parameter initialized to the graph's features),
``GCNConv(D_i, D_{i+1})`` layers (PyG defaults: self-loops added, symmetric
normalization, bias), ReLU between layers and none after the last; loss
``cross_entropy(logits, labels)`` over the training nodes of the split (the trainer's
default: :func:`plexus_tune.graph.splits.random_split` with the run's seed); optionally ``layer_norm`` (no scale and shift) on each layer's input;
AdamW on every parameter. The weights
start at :func:`plexus_tune.trainer.tensors.glorot_weights` (the same draw as every
rank of the sharded model) and the biases at zero, as GCNConv initializes them.
"""

from __future__ import annotations

import numpy as np

from plexus_tune.graph.splits import random_split
from plexus_tune.model.workload import model_widths


def reference_train(graph, *, layers: int, hidden: int, epochs: int, lr: float, weight_decay: float,
                    seed: int, dtype: str = "float32", split=None, layer_norm: bool = False) -> dict:
    """Train serially; returns {"losses": [...], "outputs": (N, C) logits of the last epoch, "epoch_ms": [...],
    "accuracy": {"train", "valid", "test": [every epoch's accuracy]}}.

    ``split``: codes of :mod:`plexus_tune.graph.splits` per node (None: the seeded
    random split the trainer uses for a graph without split files).
    It runs with the process's thread count and allocator settings
    (:func:`plexus_tune.allocator.configure_compute_process` at the entry point).
    """
    import time

    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import GCNConv

    from plexus_tune.trainer.tensors import glorot_weights

    tdtype = torch.float64 if dtype == "float64" else torch.float32
    adj = graph.adjacency.tocoo()
    # row v holds v's in-neighbours u: edge u -> v is (source u, target v)
    edge_index = torch.from_numpy(np.vstack([adj.col, adj.row]).astype(np.int64))
    edge_weight = torch.from_numpy(adj.data.astype(np.float64)).to(tdtype)
    widths = model_widths(graph.features.shape[1], graph.num_classes, layers, hidden)
    convs = torch.nn.ModuleList()
    for i, w in enumerate(glorot_weights(widths, seed)):
        conv = GCNConv(widths[i], widths[i + 1]).to(tdtype)
        with torch.no_grad():
            conv.lin.weight.copy_(torch.from_numpy(w.T.copy()).to(tdtype))
            conv.bias.zero_()
        convs.append(conv)
    # a copy: the optimizer updates the features in place and must not touch the graph's array
    features = torch.nn.Parameter(torch.tensor(np.asarray(graph.features, dtype=np.float32), dtype=tdtype))
    labels = torch.from_numpy(np.array(graph.labels, dtype=np.int64))
    params = [features] + list(convs.parameters())
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if split is None:
        split = random_split(labels.shape[0], seed)
    codes = torch.as_tensor(np.asarray(split))
    train = codes == 0
    losses, epoch_ms, logits = [], [], None
    accuracy = {"train": [], "valid": [], "test": []}
    for _ in range(int(epochs)):
        t0 = time.perf_counter()
        optimizer.zero_grad()
        x = features
        for i, conv in enumerate(convs):
            if layer_norm:
                x = F.layer_norm(x, (x.shape[1],))
            x = conv(x, edge_index, edge_weight)
            if i < len(convs) - 1:
                x = torch.relu(x)
        loss = F.cross_entropy(x[train], labels[train])
        loss.backward()
        optimizer.step()
        epoch_ms.append((time.perf_counter() - t0) * 1e3)
        losses.append(float(loss.detach()))
        logits = x.detach()
        correct = logits.argmax(dim=1) == labels
        for code, part in enumerate(accuracy):
            mask = codes == code
            accuracy[part].append(float(correct[mask].double().mean()) if bool(mask.any()) else float("nan"))
    return {"losses": losses, "outputs": logits.numpy(), "epoch_ms": epoch_ms, "accuracy": accuracy}


def max_relative_difference(a, b, *, normwise: bool = False) -> float:
    """Largest relative difference of ``a`` from the reference ``b``.

    Elementwise: max_k |a_k - b_k| / |b_k| (for losses, which are far from zero).
    Normwise: max_k |a_k - b_k| / max_k |b_k| (for logits, where single entries can sit
    near zero and an elementwise ratio would measure rounding, not disagreement).
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}")
    if a.size == 0:
        return 0.0
    tiny = np.finfo(np.float64).tiny
    if normwise:
        return float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(b))), tiny))
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), tiny)))


#: (dtype, device kind) -> (losses, outputs): the largest relative differences from the
#: serial reference that ``train --check`` passes (docs/trainer.md, "What --check
#: compares"). In float32 the outputs get the looser bound: rounding differences of the
#: summation order (grid splits, GPU kernels) in gradients near zero are turned into
#: whole learning-rate steps of those elements by AdamW's per-element normalisation, so
#: the logits drift apart by up to a few 1e-3 of their largest value over ten epochs
#: while the losses still agree to about 1e-6. float64 leaves no such rounding noise
#: above AdamW's epsilon.
CHECK_TOLERANCES = {
    ("float32", "cpu"): (1e-4, 2e-2),
    ("float32", "cuda"): (1e-4, 2e-2),
    ("float64", "cpu"): (1e-8, 1e-6),
    ("float64", "cuda"): (1e-8, 1e-6),
}


def check_verdict(loss_rel_diff: float, output_rel_diff: float, *, dtype: str = "float32",
                  device: str = "cpu") -> dict:
    """Pass or fail of a ``--check``: both differences within :data:`CHECK_TOLERANCES` of
    (``dtype``, ``device``: ``"cpu"`` or a CUDA device name). Returns passed, the two tolerances
    and the device kind."""
    kind = "cpu" if str(device).lower() == "cpu" else "cuda"
    loss_tol, output_tol = CHECK_TOLERANCES[(dtype, kind)]
    passed = bool(loss_rel_diff <= loss_tol and output_rel_diff <= output_tol)
    return {"passed": passed, "loss_tolerance": loss_tol, "output_tolerance": output_tol, "device_kind": kind,
            "dtype": dtype}
