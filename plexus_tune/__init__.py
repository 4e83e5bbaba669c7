"""plexus-tune: performance model, autotuner and trainer for 3D-parallel GCN training."""

__version__ = "0.1.0"
