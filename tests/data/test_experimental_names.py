"""The names of ``tf.data.experimental`` and ``tf.io`` a port reaches for: TensorFlow's
functional forms of Dataset methods (scenarios after TensorFlow's
tensorflow/python/data/experimental/kernel_tests/bucket_by_sequence_length_test.py,
sample_from_datasets_test.py and make_batched_features_dataset_test.py), the data service under
its experimental name, and TFRecordWriter/TFRecordOptions under ``convoy.io``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import convoy as cv
from convoy.data import Dataset
from convoy.data import experimental as exp
from convoy.errors import InvalidArgumentError


def test_service_is_the_same_module() -> None:
    assert exp.service is cv.data.service
    assert exp.service.DispatchServer is cv.data.service.DispatchServer
    assert "service" in exp.__all__


def test_bucket_by_sequence_length_is_the_method() -> None:
    lengths = [1, 3, 2, 5, 4, 1]
    ds = Dataset.from_generator(lambda: (np.ones(n, np.int64) for n in lengths),
                                output_signature=cv.data.TensorSpec([None], np.int64))
    ours = ds.apply(exp.bucket_by_sequence_length(lambda x: len(x), [3], [2, 2]))
    theirs = ds.bucket_by_sequence_length(lambda x: len(x), [3], [2, 2])
    assert [b.tolist() for b in ours] == [b.tolist() for b in theirs]


def test_sample_and_choose_from_datasets() -> None:
    datasets = [Dataset.from_tensors(np.int64(i)).repeat(3) for i in range(2)]
    chosen = exp.choose_from_datasets(datasets, Dataset.from_tensor_slices(
        np.array([0, 1, 1, 0], np.int64)))
    assert list(chosen) == [0, 1, 1, 0]
    sampled = exp.sample_from_datasets(datasets, [0.5, 0.5], seed=3)
    assert sorted(sampled) == [0, 0, 0, 1, 1, 1]
    assert list(exp.sample_from_datasets(datasets, [0.5, 0.5], seed=3)) == \
        list(Dataset.sample_from_datasets(datasets, [0.5, 0.5], seed=3))
    with pytest.raises(InvalidArgumentError, match="weights"):
        exp.sample_from_datasets(datasets, [1.0])


def write_examples(directory: Path, num_files: int, per_file: int) -> str:
    for f in range(num_files):
        with cv.io.TFRecordWriter(str(directory / f"ex.{f}.tfrecord")) as writer:
            for r in range(per_file):
                example = cv.io.Example(features=cv.io.Features(feature={
                    "file": cv.io.Feature(int64_list=cv.io.Int64List(value=[f])),
                    "record": cv.io.Feature(int64_list=cv.io.Int64List(value=[r])),
                    "keywords": cv.io.Feature(bytes_list=cv.io.BytesList(
                        value=[b"a"] * (r % 3))),
                }))
                writer.write(example.SerializeToString())
    return str(directory / "ex.*.tfrecord")


FEATURES = {"file": cv.io.FixedLenFeature([], np.int64),
            "record": cv.io.FixedLenFeature([], np.int64),
            "keywords": cv.io.VarLenFeature(np.bytes_)}


def test_make_batched_features_dataset(tmp_path: Path) -> None:
    pattern = write_examples(tmp_path, 2, 5)
    ds = exp.make_batched_features_dataset(pattern, 4, FEATURES, label_key="record",
                                           num_epochs=1, shuffle=False)
    batches = list(ds)
    assert [len(label) for _, label in batches] == [4, 4, 2]
    labels = np.concatenate([label for _, label in batches]).tolist()
    files = np.concatenate([features["file"] for features, _ in batches]).tolist()
    assert list(zip(files, labels)) == [(f, r) for f in range(2) for r in range(5)]
    assert isinstance(batches[0][0]["keywords"], cv.SparseTensor)
    assert "record" not in batches[0][0]
    forever = exp.make_batched_features_dataset(pattern, 3, FEATURES, shuffle_seed=1)
    assert all(len(b["file"]) == 3 for b in forever.take(7))  # num_epochs None: full batches
    with pytest.raises(InvalidArgumentError, match="label_key"):
        exp.make_batched_features_dataset(pattern, 4, FEATURES, label_key="nope")


def test_auto_shard_policy_and_option_classes() -> None:
    assert exp.AutoShardPolicy.DATA.name == "DATA"
    options = cv.data.Options()
    assert isinstance(options.threading, exp.ThreadingOptions)
    assert isinstance(options.experimental_distribute, exp.DistributeOptions)
    assert isinstance(options.experimental_optimization, exp.OptimizationOptions)
    assert isinstance(options.autotune, exp.AutotuneOptions)


def test_tfrecord_writer_and_options_in_io(tmp_path: Path) -> None:
    assert cv.io.TFRecordWriter is cv.data.TFRecordWriter
    options = cv.io.TFRecordOptions(compression_type="GZIP", compression_level=9)
    assert cv.io.TFRecordOptions.get_compression_type_string(options) == "GZIP"
    assert cv.io.TFRecordOptions.get_compression_type_string(None) == ""
    path = str(tmp_path / "r.tfrecord.gz")
    with cv.io.TFRecordWriter(path, options) as writer:
        writer.write(b"one")
        writer.write(b"two")
    assert list(cv.data.TFRecordDataset(path, compression_type="GZIP")) == [b"one", b"two"]
    with pytest.raises(InvalidArgumentError, match="compression_type"):
        cv.io.TFRecordOptions(compression_type="LZMA")
