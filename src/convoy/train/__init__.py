"""Training on parameter servers: optimizers applied next to the variables, checkpoints."""

from convoy.train import optimizers
from convoy.train.checkpoint import Checkpoint, CheckpointManager, latest_checkpoint

__all__ = ["Checkpoint", "CheckpointManager", "latest_checkpoint", "optimizers"]
