"""The performance model: grids, workloads, shard shapes, collectives, SpMM kinds, memory,
machine profiles and the epoch-time cost model (see docs/model.md)."""
