"""Local input pipelines with tf.data's semantics: ``Dataset``, its sources and readers.

``convoy.data.service`` runs the same pipelines on a fleet of worker processes.
"""

from convoy._values.nest import RaggedTensorSpec, SparseTensorSpec, TensorSpec
from convoy.data._dataset import Dataset, DatasetSpec, Options
from convoy.data._file_datasets import TextLineDataset, TFRecordDataset
from convoy.data._fixed_length import FixedLengthRecordDataset
from convoy.data._iterator import DatasetIterator
from convoy.data._op import AUTOTUNE, INFINITE_CARDINALITY, SHARD_HINT, UNKNOWN_CARDINALITY
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
