"""Training on parameter servers: optimizers applied next to the variables, checkpoints; and
the ``Example`` messages of training data (as in ``tf.train``)."""

from convoy.io import (
    BytesList,
    Example,
    Feature,
    FeatureList,
    FeatureLists,
    Features,
    FloatList,
    Int64List,
    SequenceExample,
)
from convoy.train import optimizers
from convoy.train.checkpoint import Checkpoint, CheckpointManager, latest_checkpoint

__all__ = [
    "BytesList",
    "Checkpoint",
    "CheckpointManager",
    "Example",
    "Feature",
    "FeatureList",
    "FeatureLists",
    "Features",
    "FloatList",
    "Int64List",
    "SequenceExample",
    "latest_checkpoint",
    "optimizers",
]
