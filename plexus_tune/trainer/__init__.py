"""The bundled 3D-parallel GCN trainer (Plexus algorithm) on torch.distributed.

:func:`plexus_tune.trainer.run.train` trains one configuration (local processes,
torchrun or srun) and returns the ranks' raw results; its measurement record is made by
:func:`plexus_tune.measure.training.run_training`. The serial PyTorch Geometric
reference is in :mod:`plexus_tune.trainer.reference`.
"""

from plexus_tune.model.workload import model_widths
from plexus_tune.trainer.config import TrainConfig

__all__ = ["TrainConfig", "model_widths"]
