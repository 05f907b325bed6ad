"""Local input pipelines with tf.data's semantics: ``Dataset``, its sources and readers.

``convoy.data.service`` runs the same pipelines on a fleet of worker processes.

The package is laid out by role, each room importing only the rooms listed before it:

- ``_core/``: the op and node base classes, row streams, composite values, options;
- ``_sources/``: ops without an input, the file formats' readers among them (the TFRecord
  format itself is the public leaf module ``tfrecord``);
- ``_ops/``: the transformations (batch, map, shuffle, grouping, interleave, ...);
- ``_persistence/``: save/load, snapshot and the distributed snapshot's layout;
- ``_sharding/``: split providers and the static rewrite the data service shards with;
- the faces: ``Dataset`` (``_dataset``), its iterator, the file datasets and the public
  module ``experimental``; ``service/`` builds on all of them.

Ops that hand datasets to user functions (``window``, ``load``'s ``reader_func``) wrap them
through :func:`convoy.data._core._op.as_dataset`, which the face registers at import.
``tests/test_layers.py`` holds the layers to this order.
"""

from convoy._values.nest import RaggedTensorSpec, SparseTensorSpec, TensorSpec
from convoy.data._core._op import AUTOTUNE, INFINITE_CARDINALITY, SHARD_HINT, UNKNOWN_CARDINALITY
from convoy.data._dataset import Dataset, Options
from convoy.data._file_datasets import FixedLengthRecordDataset, TextLineDataset, TFRecordDataset
from convoy.data._iterator import DatasetIterator
from convoy.data._ops._grouping import DatasetSpec
from convoy.data.tfrecord import TFRecordWriter

__all__ = [
    "AUTOTUNE",
    "INFINITE_CARDINALITY",
    "SHARD_HINT",
    "UNKNOWN_CARDINALITY",
    "Dataset",
    "DatasetSpec",
    "DatasetIterator",
    "FixedLengthRecordDataset",
    "Options",
    "RaggedTensorSpec",
    "SparseTensorSpec",
    "TFRecordDataset",
    "TFRecordWriter",
    "TensorSpec",
    "TextLineDataset",
]

from convoy.data import experimental, service  # noqa: E402  (after the names they build on)

__all__ += ["experimental", "service"]
