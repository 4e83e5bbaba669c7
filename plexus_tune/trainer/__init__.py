"""The bundled 3D-parallel GCN trainer (Plexus algorithm) on torch.distributed.

``run_training(TrainConfig(...)) -> record`` trains one grid configuration (local
processes, torchrun or srun) and returns its measurement record; the serial PyTorch
Geometric reference is in :mod:`plexus_tune.trainer.reference`.
"""

from plexus_tune.model.workload import model_widths
from plexus_tune.trainer.config import TrainConfig
from plexus_tune.trainer.run import TrainingFailed, run_training

__all__ = ["TrainConfig", "TrainingFailed", "model_widths", "run_training"]
