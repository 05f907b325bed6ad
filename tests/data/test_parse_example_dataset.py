"""Tests for cv.data.experimental.parse_example_dataset, ported from TensorFlow's
tensorflow/python/data/experimental/kernel_tests/parse_example_dataset_test.py (each test
names its source)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import convoy as cv
from convoy.errors import InvalidArgumentError
from convoy.testing import assert_equal

io = cv.io
parse_example_dataset = cv.data.experimental.parse_example_dataset


def example(**features: Any) -> bytes:
    return io.Example(features=io.Features(feature=features)).SerializeToString()


def ints(values: Any) -> io.Feature:
    return io.Feature(int64_list=io.Int64List(value=values))


def floats(values: Any) -> io.Feature:
    return io.Feature(float_list=io.FloatList(value=values))


def strings(values: Any) -> io.Feature:
    return io.Feature(bytes_list=io.BytesList(value=values))


def parsed(serialized: list[bytes], features: dict[str, Any], **options: Any) -> list[Any]:
    """The elements of from_tensors(serialized) with parse_example_dataset applied."""
    records = np.empty(len(serialized), object)
    records[:] = serialized
    dataset = cv.data.Dataset.from_tensors(records).apply(
        parse_example_dataset(features, **options))
    return list(dataset)


def test_empty_serialized_with_all_defaults() -> None:
    """testEmptySerializedWithAllDefaults, iterated twice."""
    b_default = np.array([[b"x", b"y", b"z"]] * 3, object)
    c_default = np.array([0.5, 0.25], np.float32)
    features = {
        "st_a": io.VarLenFeature(np.int64),
        "a": io.FixedLenFeature((1, 3), np.int64, default_value=[0, 42, 0]),
        "b": io.FixedLenFeature((3, 3), bytes, default_value=b_default),
        "c:has_a_tricky_name": io.FixedLenFeature((2,), np.float32, default_value=c_default),
    }
    records = np.array([b"", b""], object)
    dataset = cv.data.Dataset.from_tensors(records).apply(parse_example_dataset(features))
    for _ in range(2):
        (element,) = list(dataset)
        assert_equal(element["st_a"], cv.SparseTensor(np.zeros((0, 2), np.int64),
                                                      np.zeros(0, np.int64), [2, 0]))
        assert_equal(element["a"], np.array(2 * [[[0, 42, 0]]], np.int64))
        assert_equal(element["b"], np.stack([b_default, b_default]))
        assert_equal(element["c:has_a_tricky_name"], np.stack([c_default, c_default]))


def test_empty_serialized_without_defaults_should_fail() -> None:
    """testEmptySerializedWithoutDefaultsShouldFail: an empty Feature and a missing key."""
    features = {"st_a": io.VarLenFeature(np.int64),
                "a": io.FixedLenFeature((1, 3), np.int64, default_value=[0, 42, 0]),
                "c": io.FixedLenFeature((2,), np.float32)}
    for serialized in ([example(c=io.Feature())], [b"", b""]):
        with pytest.raises(InvalidArgumentError,
                           match=r"Feature: c \(data type: float\) is required"):
            parsed(serialized, features)


def test_serialized_containing_sparse_feature() -> None:
    """testSerializedContainingSparseFeature."""
    serialized = [example(val=floats([3, 4]), idx=ints([5, 10])),
                  example(val=floats([]), idx=ints([])),
                  example(val=io.Feature()),
                  example(val=floats([1, 2, -1]), idx=ints([0, 9, 3]))]
    (element,) = parsed(serialized, {"sp": io.SparseFeature(["idx"], "val", np.float32, [13])})
    assert_equal(element["sp"], cv.SparseTensor(
        np.array([[0, 5], [0, 10], [3, 0], [3, 3], [3, 9]], np.int64),
        np.array([3.0, 4.0, 1.0, -1.0, 2.0], np.float32), [4, 13]))


def test_serialized_containing_dense_with_concat() -> None:
    """testSerializedContainingDenseWithConcat: two serialized Examples concatenated merge
    as protobuf merges them, a feature appearing twice taking its last value."""
    serialized = [example(a=floats([10, 10])) + example(a=floats([1, 1]), b=strings([b"b0"])),
                  example(b=strings([b"b100"])) + example(a=floats([-1, -1]), b=strings([b"b1"]))]
    (element,) = parsed(serialized, {
        "a": io.FixedLenFeature((1, 2, 1), np.float32),
        "b": io.FixedLenFeature((1, 1, 1, 1), bytes)})
    assert_equal(element["a"], np.array([[1, 1], [-1, -1]], np.float32).reshape(2, 1, 2, 1))
    assert_equal(element["b"], np.array([b"b0", b"b1"], object).reshape(2, 1, 1, 1, 1))


@pytest.mark.parametrize("batch_size", [1, 10, 20, 100, 256])
def test_serialized_containing_var_len_dense_larger_batch(batch_size: int) -> None:
    """testSerializedContainingVarLenDenseLargerBatch: records alike apart from dropped
    values, padded per feature."""
    rng = np.random.default_rng(3456)
    truth_int = list(range(batch_size))
    truth_str = [[b"foo%d" % i, b"bar%d" % i] for i in range(batch_size)]
    expected_str = [list(row) for row in truth_str]
    for i in range(batch_size):
        column = 1
        if rng.random() < 0.25:
            expected_str[i][column] = b"default"
            column -= 1
            truth_str[i].pop()
        if rng.random() < 0.25:
            expected_str[i][column] = b"default"
            truth_str[i].pop()
    serialized = [example(a=ints([truth_int[i]]), b=strings(truth_str[i]))
                  for i in range(batch_size)]
    (element,) = parsed(serialized, {
        "a": io.FixedLenSequenceFeature((), np.int64, allow_missing=True, default_value=-1),
        "b": io.FixedLenSequenceFeature([], bytes, allow_missing=True,
                                        default_value=b"default")})
    assert_equal(element["a"], np.array(truth_int, np.int64).reshape(batch_size, 1))
    assert_equal(element["b"], np.array(expected_str, object).reshape(batch_size, 2))


def test_arguments_are_checked() -> None:
    """parse_example_dataset's checks (TensorFlow raises for features=None and for input
    elements that are not vectors of strings)."""
    with pytest.raises(InvalidArgumentError, match="features"):
        parse_example_dataset(None)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="dtype"):
        parse_example_dataset({"a": io.FixedLenFeature([], np.int32)})
    with pytest.raises(InvalidArgumentError, match="vectors of strings"):
        cv.data.Dataset.range(4).batch(2).apply(
            parse_example_dataset({"a": io.VarLenFeature(np.int64)}))
    with pytest.raises(InvalidArgumentError, match="vectors of strings"):
        cv.data.Dataset.from_tensor_slices(np.array([b"", b""], object)).apply(
            parse_example_dataset({"a": io.VarLenFeature(np.int64)}))


@pytest.mark.parametrize("options", [{}, {"num_parallel_calls": 2, "deterministic": True}])
def test_tfrecord_batches_parse_as_parse_example(tmp_path: Path, options: Any) -> None:
    """TFRecordDataset(f).batch(n).apply(parse_example_dataset(...)) gives what
    parse_example gives for each batch, in order."""
    path = tmp_path / "examples.tfrecord"
    with cv.data.TFRecordWriter(path) as writer:
        for i in range(50):
            writer.write(example(id=ints([i]), ids=ints(list(range(i % 4))),
                                 name=strings([b"n%d" % i])))
    features = {"id": io.FixedLenFeature([], np.int64), "ids": io.VarLenFeature(np.int64),
                "name": io.FixedLenFeature([], bytes)}
    got = list(cv.data.TFRecordDataset(path).batch(16).apply(
        parse_example_dataset(features, **options)))
    batches = list(cv.data.TFRecordDataset(path).batch(16))
    assert len(got) == len(batches) == 4
    for element, batch in zip(got, batches):
        assert_equal(element, io.parse_example(batch, features))
    assert np.concatenate([e["id"] for e in got]).tolist() == list(range(50))
