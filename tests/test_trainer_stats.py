"""Losses and accuracy read on the host every epoch, every few epochs or once: the same values."""

import numpy as np

from plexus_tune.launch import launch_local
from plexus_tune.trainer import TrainConfig
from plexus_tune.trainer.loop import make_adamw
from plexus_tune.trainer.rank import rank_main


def test_stats_cadence_does_not_change_the_numbers():
    from plexus_tune.graph import synthetic

    g = synthetic("rmat:nodes=40,edges=160,features=6,classes=4,seed=2")
    common = dict(grid=(1, 2, 1), layers=3, hidden=8, epochs=5, warmup=1, seed=1)
    configs = [TrainConfig(**common, extra={"stats_every": every}) for every in (1, 2, 0)]
    results = launch_local(rank_main, 2, args=(g, configs, "cpu"), timeout_s=300, threads_per_rank=1,
                           preload=("torch._dynamo", "plexus_tune.trainer.rank"))[0]
    first = results[0]
    assert first["optimizer"] == "adamw-fused"
    assert len(first["losses"]) == 5 and all(len(v) == 5 for v in first["accuracy"].values())
    assert all(0.0 <= a <= 1.0 for a in first["accuracy"]["train"])
    for other in results[1:]:
        assert other["losses"] == first["losses"]
        for part, values in first["accuracy"].items():
            np.testing.assert_array_equal(other["accuracy"][part], values)
        assert all(len(t) == 5 for t in other["timers"])


def test_adamw_is_fused_where_offered_and_steps_like_the_loop():
    import torch

    torch.manual_seed(0)
    ref = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(3))]
    mine = [torch.nn.Parameter(p.detach().clone()) for p in ref]
    loop = torch.optim.AdamW(ref, lr=0.01, weight_decay=0.01, foreach=False)
    opt, kind = make_adamw(mine, lr=0.01, weight_decay=0.01)
    assert kind == "adamw-fused"  # torch >= 2.4 fuses AdamW on CPU too
    for _ in range(3):
        for a, b in zip(ref, mine):
            g = torch.randn_like(a)
            a.grad, b.grad = g.clone(), g.clone()
        loop.step()
        opt.step()
    for a, b in zip(ref, mine):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
