"""A minimal rank function for checking a launcher: every rank joins one all-reduce."""

from __future__ import annotations


def all_reduce_ranks(rank: int, world_size: int, fail_rank: int | None = None) -> dict:
    """All-reduce of the rank numbers; every rank returns the sum, world_size (world_size - 1) / 2.

    ``fail_rank`` raises on that rank before the all-reduce (for failure handling checks).
    """
    if rank == fail_rank:
        raise RuntimeError(f"rank {rank} was asked to fail")
    import torch
    import torch.distributed as dist

    value = torch.tensor([float(rank)])
    dist.all_reduce(value)
    return {"rank": rank, "world_size": world_size, "sum": float(value.item())}
