"""The serial PyTorch Geometric GCN that the 3D-parallel trainer must equal.

Model: trainable input features X (a parameter initialized to the graph's features;
with ``fixed_features`` a plain tensor of them, neither trained nor in the optimizer),
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

from plexus_tune.graph import gcn_normalize
from plexus_tune.graph.sampling import sampled_subgraph
from plexus_tune.graph.splits import random_split
from plexus_tune.model.workload import model_widths


def reference_train(graph, *, layers: int, hidden: int, epochs: int, lr: float, weight_decay: float,
                    seed: int, dtype: str = "float32", split=None, layer_norm: bool = False,
                    fixed_features: bool = False) -> dict:
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
    features = torch.tensor(np.asarray(graph.features, dtype=np.float32), dtype=tdtype)
    if not fixed_features:
        features = torch.nn.Parameter(features)
    labels = torch.from_numpy(np.array(graph.labels, dtype=np.int64))
    params = ([] if fixed_features else [features]) + list(convs.parameters())
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


def reference_minibatch_step(graph, samples, *, layers: int, hidden: int, seed: int, dtype: str = "float32",
                             split=None, rmsnorm: bool = True, residual: bool = True, dropout: float = 0.0,
                             step: int = 0, fixed_features: bool = False) -> dict:
    """One step of ScaleGNN's model, serially with PyTorch Geometric, on each group's sample.

    ``samples``: the sorted vertices of each data-parallel group at ``step``. Per group:
    A_S rescaled as the trainer samples it (:func:`plexus_tune.graph.sampling.sampled_subgraph`
    of the GCN-normalized adjacency), ``GCNConv(h, h, bias=False, normalize=False,
    add_self_loops=False)`` with A_S as edge weights, X_S W_in, RMSNorm
    (``torch.nn.functional.rms_norm``), ReLU, the trainer's dropout mask, the residual, the
    head, cross-entropy over the sample's training vertices. Returns each group's loss,
    group 0's (B, C) logits and the gradients averaged over the groups (``w_in``, ``w_<i>``,
    ``gamma_<i>``, ``w_out``, and unless ``fixed_features`` ``x``: the (N, D_0) input features').
    """
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import GCNConv

    from plexus_tune.trainer.scalegnn import RMS_EPS, dropout_mask, minibatch_weights

    tdtype = torch.float64 if dtype == "float64" else torch.float32
    adjacency = gcn_normalize(graph.adjacency)
    n = adjacency.shape[0]
    features = np.asarray(graph.features, dtype=np.float64)
    labels = np.asarray(graph.labels, dtype=np.int64)
    codes = random_split(n, seed) if split is None else np.asarray(split)
    weights = minibatch_weights(features.shape[1], hidden, int(graph.num_classes), layers, seed)
    losses, logits0, grads = [], None, None
    for group, sample in enumerate(samples):
        x_all = torch.tensor(features, dtype=tdtype, requires_grad=not fixed_features)
        w_in = torch.nn.Parameter(torch.tensor(weights[0], dtype=tdtype))
        convs = []
        for i in range(layers):
            conv = GCNConv(hidden, hidden, bias=False, normalize=False, add_self_loops=False).to(tdtype)
            with torch.no_grad():
                conv.lin.weight.copy_(torch.tensor(weights[i + 1].T, dtype=tdtype))
            convs.append(conv)
        gammas = [torch.nn.Parameter(torch.ones(hidden, dtype=tdtype)) for _ in range(layers)]
        w_out = torch.nn.Parameter(torch.tensor(weights[-1], dtype=tdtype))
        a_s = sampled_subgraph(adjacency, sample).tocoo()
        edge_index = torch.from_numpy(np.vstack([a_s.col, a_s.row]).astype(np.int64))
        edge_weight = torch.tensor(a_s.data, dtype=tdtype)
        x = x_all[torch.from_numpy(np.asarray(sample, dtype=np.int64))] @ w_in
        for i, conv in enumerate(convs):
            q = conv(x, edge_index, edge_weight)
            if rmsnorm:
                q = F.rms_norm(q, (hidden,), weight=gammas[i], eps=RMS_EPS)
            q = torch.relu(q)
            if dropout > 0:
                q = q * torch.tensor(dropout_mask(len(sample), hidden, dropout, seed, step, i, group), dtype=tdtype)
            x = q + x if residual else q
        out = x @ w_out
        train = torch.from_numpy(codes[sample] == 0)
        target = torch.from_numpy(labels[sample])
        loss = F.cross_entropy(out[train], target[train]) if bool(train.any()) else out.sum() * 0.0
        loss.backward()
        named = {"w_in": w_in, **{f"w_{i}": c.lin.weight for i, c in enumerate(convs)}, "w_out": w_out}
        if rmsnorm:
            named.update({f"gamma_{i}": g for i, g in enumerate(gammas)})
        if not fixed_features:
            named["x"] = x_all
        mine = {k: (p.grad.detach().numpy().T if k.startswith("w_") and k not in ("w_in", "w_out")
                    else p.grad.detach().numpy()).astype(np.float64) for k, p in named.items()}
        grads = mine if grads is None else {k: grads[k] + mine[k] for k in grads}
        losses.append(float(loss.detach()))
        if group == 0:
            logits0 = out.detach().numpy().astype(np.float64)
    return {"losses": losses, "logits": logits0, "grads": {k: v / len(samples) for k, v in grads.items()}}
