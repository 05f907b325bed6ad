"""Tests for cv.io.parse_example and friends, ported from TensorFlow's
tensorflow/python/kernel_tests/io_ops/parsing_ops_test.py (each test names its source)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import convoy as cv
from convoy import io
from convoy.errors import InvalidArgumentError
from convoy.testing import assert_equal


def example(**features: Any) -> bytes:
    return io.Example(features=io.Features(feature=features)).SerializeToString()


def ints(values: Any) -> io.Feature:
    return io.Feature(int64_list=io.Int64List(value=values))


def floats(values: Any) -> io.Feature:
    return io.Feature(float_list=io.FloatList(value=values))


def strings(values: Any) -> io.Feature:
    return io.Feature(bytes_list=io.BytesList(value=values))


def sparse(indices: Any, values: Any, shape: Any) -> cv.SparseTensor:
    return cv.SparseTensor(np.array(indices, np.int64).reshape(-1, len(shape)), values, shape)


def test_empty_serialized_with_all_defaults() -> None:  # testEmptySerializedWithAllDefaults
    b_default = np.array([[b"a", b"b", b"c"]] * 3, dtype=object)
    c_default = np.array([0.5, 0.25], np.float32)
    out = io.parse_example([b"", b""], {
        "st_a": io.VarLenFeature(np.int64),
        "a": io.FixedLenFeature((1, 3), np.int64, default_value=[0, 42, 0]),
        "b": io.FixedLenFeature((3, 3), bytes, default_value=b_default),
        "c:has_a_tricky_name": io.FixedLenFeature((2,), np.float32, default_value=c_default),
    })
    assert_equal(out["st_a"], sparse([], np.zeros(0, np.int64), [2, 0]))
    assert_equal(out["a"], np.array([[[0, 42, 0]]] * 2))
    assert_equal(out["b"], np.array([b_default] * 2))
    assert_equal(out["c:has_a_tricky_name"], np.array([c_default] * 2))


def test_empty_serialized_without_defaults_should_fail() -> None:
    # testEmptySerializedWithoutDefaultsShouldFail
    features = {"st_a": io.VarLenFeature(np.int64),
                "a": io.FixedLenFeature((1, 3), np.int64, default_value=[0, 42, 0]),
                "c": io.FixedLenFeature((2,), np.float32)}
    with pytest.raises(InvalidArgumentError,
                       match=r"Name: in1, Feature: c \(data type: float\) is required"):
        io.parse_example([example(c=io.Feature())], features, example_names=["in1"])
    with pytest.raises(InvalidArgumentError,
                       match=r"Name: in1, Feature: c \(data type: float\) is required"):
        io.parse_example([b"", b""], features, example_names=["in1", "in2"])


def test_dense_not_matching_shape_should_fail() -> None:  # testDenseNotMatchingShapeShouldFail
    records = [example(a=floats([1, 1, 3])), example(a=floats([-1, -1]))]
    with pytest.raises(InvalidArgumentError,
                       match="Name: failing, Key: a, Index: 1.  Number of float val"):
        io.parse_example(records, {"a": io.FixedLenFeature((1, 3), np.float32)},
                         example_names=["passing", "failing"])


def test_dense_default_no_shape_should_fail() -> None:  # testDenseDefaultNoShapeShouldFail
    with pytest.raises(InvalidArgumentError, match="Missing shape for feature a"):
        io.parse_example([example(a=floats([1, 1, 3]))],
                         {"a": io.FixedLenFeature(None, np.float32)})


def test_serialized_containing_sparse() -> None:  # testSerializedContainingSparse
    records = [example(st_c=floats([3, 4])), example(st_c=floats([])),
               example(st_d=io.Feature()), example(st_c=floats([1, 2, -1]),
                                                   st_d=strings([b"hi"]))]
    out = io.parse_example(records, {"st_c": io.VarLenFeature(np.float32),
                                     "st_d": io.VarLenFeature(bytes)})
    assert_equal(out["st_c"], sparse([[0, 0], [0, 1], [3, 0], [3, 1], [3, 2]],
                                     np.array([3, 4, 1, 2, -1], np.float32), [4, 3]))
    assert_equal(out["st_d"], sparse([[3, 0]], np.array([b"hi"], object), [4, 1]))


def test_serialized_containing_sparse_feature() -> None:  # testSerializedContainingSparseFeature
    records = [example(val=floats([3, 4]), idx=ints([5, 10])),
               example(val=floats([]), idx=ints([])),
               example(val=io.Feature()),
               example(val=floats([1, 2, -1]), idx=ints([0, 9, 3]))]
    out = io.parse_example(records, {"sp": io.SparseFeature(["idx"], "val", np.float32, [13])})
    assert_equal(out["sp"], sparse([[0, 5], [0, 10], [3, 0], [3, 3], [3, 9]],
                                   np.array([3, 4, 1, -1, 2], np.float32), [4, 13]))


def test_serialized_containing_sparse_feature_reuse() -> None:
    # testSerializedContainingSparseFeatureReuse
    records = [example(val1=floats([3, 4]), val2=floats([5, 6]), idx=ints([5, 10])),
               example(val1=floats([]), idx=ints([]))]
    out = io.parse_example(records, {
        "sp1": io.SparseFeature("idx", "val1", np.float32, 13),
        "sp2": io.SparseFeature("idx", "val2", np.float32, size=7, already_sorted=True)})
    assert_equal(out["sp1"], sparse([[0, 5], [0, 10]], np.array([3, 4], np.float32), [2, 13]))
    assert_equal(out["sp2"], sparse([[0, 5], [0, 10]], np.array([5, 6], np.float32), [2, 7]))


def test_serialized_containing_3d_sparse_feature() -> None:
    # testSerializedContaining3DSparseFeature
    records = [example(val=floats([3, 4]), idx0=ints([5, 10]), idx1=ints([0, 2])),
               example(val=floats([]), idx0=ints([]), idx1=ints([])),
               example(val=io.Feature()),
               example(val=floats([1, 2, -1]), idx0=ints([0, 9, 3]), idx1=ints([1, 0, 2]))]
    out = io.parse_example(records, {
        "sp": io.SparseFeature(["idx0", "idx1"], "val", np.float32, [13, 3])})
    assert_equal(out["sp"], sparse([[0, 5, 0], [0, 10, 2], [3, 0, 1], [3, 3, 2], [3, 9, 0]],
                                   np.array([3, 4, 1, -1, 2], np.float32), [4, 13, 3]))


def test_serialized_containing_dense() -> None:  # testSerializedContainingDense
    records = [example(a=floats([1, 1]), **{"b*has+a:tricky_name": strings([b"b0_str"])}),
               example(a=floats([-1, -1]), **{"b*has+a:tricky_name": strings([b""])})]
    out = io.parse_example(records, {
        "a": io.FixedLenFeature((1, 2), np.float32),
        "b*has+a:tricky_name": io.FixedLenFeature((1, 1), bytes)})
    assert_equal(out["a"], np.array([[[1, 1]], [[-1, -1]]], np.float32))
    assert_equal(out["b*has+a:tricky_name"],
                 np.array([[[b"b0_str"]], [[b""]]], dtype=object))


def test_serialized_containing_dense_with_defaults() -> None:
    # testSerializedContainingDenseWithDefaults
    records = [example(a=floats([1, 1])), example(b=strings([b"b1"])),
               example(b=io.Feature())]
    out = io.parse_example(records, {
        "a": io.FixedLenFeature((1, 2), np.float32, default_value=[3.0, -3.0]),
        "b": io.FixedLenFeature((1, 1), bytes, default_value=b"tmp_str")})
    assert_equal(out["a"], np.array([[[1, 1]], [[3, -3]], [[3, -3]]], np.float32))
    assert_equal(out["b"], np.array([[[b"tmp_str"]], [[b"b1"]], [[b"tmp_str"]]], object))


def test_serialized_containing_dense_scalar() -> None:  # testSerializedContainingDenseScalar
    out = io.parse_example([example(a=floats([1])), example()],
                           {"a": io.FixedLenFeature((1,), np.float32, default_value=-1)})
    assert_equal(out["a"], np.array([[1], [-1]], np.float32))


def test_type_mismatch_names_the_key() -> None:
    # testSerializedContainingBytes / the type check of testSerializedContainingSparse
    with pytest.raises(InvalidArgumentError,
                       match="Key: a, Index: 1.  Data types don't match. Data type: int64 "
                             "Expected type: float"):
        io.parse_example([example(a=floats([1])), example(a=ints([1]))],
                         {"a": io.FixedLenFeature([1], np.float32)})


def test_serialized_containing_var_len_dense() -> None:  # testSerializedContainingVarLenDense
    records = [example(), example(a=floats([-1, -1]), b=ints([5]), c=strings([b"x", b"y"])),
               example(a=floats([1, 2, 3, 4, 5, 6]), b=ints([])),
               example(c=strings([b"z"]))]
    out = io.parse_example(records, {
        "a": io.FixedLenSequenceFeature((2,), np.float32, allow_missing=True),
        "b": io.FixedLenSequenceFeature((), np.int64, allow_missing=True, default_value=-7),
        "c": io.FixedLenSequenceFeature((1,), bytes, allow_missing=True, default_value=b"d")})
    a = np.zeros((4, 3, 2), np.float32)
    a[1, 0] = [-1, -1]
    a[2] = [[1, 2], [3, 4], [5, 6]]
    assert_equal(out["a"], a)
    assert_equal(out["b"], np.array([[-7], [5], [-7], [-7]]))
    assert_equal(out["c"], np.array([[[b"d"], [b"d"]], [[b"x"], [b"y"]], [[b"d"], [b"d"]],
                                     [[b"z"], [b"d"]]], object))
    with pytest.raises(InvalidArgumentError, match="allow_missing"):
        io.parse_example(records, {"a": io.FixedLenSequenceFeature((2,), np.float32)})
    with pytest.raises(InvalidArgumentError, match="Key: a, Index: 1.  Number of float "
                                                   "values is not a multiple"):
        io.parse_example(records, {"a": io.FixedLenSequenceFeature((4,), np.float32,
                                                                    allow_missing=True)})


def test_serialized_containing_ragged_feature() -> None:  # testSerializedContainingRaggedFeature
    records = [example(rt_c=floats([3, 4, 5, 6, 7, 8])), example(rt_c=floats([])),
               example(rt_d=io.Feature()), example(rt_c=floats([1, 2, -1]),
                                                   rt_d=strings([b"hi"]))]
    out = io.parse_example(records, {"rt_c": io.RaggedFeature(np.float32),
                                     "rt_d": io.RaggedFeature(bytes, row_splits_dtype=np.int64)})
    assert out["rt_c"].to_list() == [[3, 4, 5, 6, 7, 8], [], [], [1, 2, -1]]
    assert out["rt_d"].to_list() == [[], [], [], [b"hi"]]
    single = io.parse_single_example(records[0], {"rt_c": io.RaggedFeature(np.float32)})
    assert_equal(single["rt_c"], np.array([3, 4, 5, 6, 7, 8], np.float32))


@pytest.mark.parametrize("partition, given, expected", [
    (io.RaggedFeature.RowSplits("p"), [0, 2, 2, 5], [[1, 2], [], [3, 4, 5]]),
    (io.RaggedFeature.RowLengths("p"), [2, 0, 3], [[1, 2], [], [3, 4, 5]]),
    (io.RaggedFeature.RowStarts("p"), [0, 2, 2], [[1, 2], [], [3, 4, 5]]),
    (io.RaggedFeature.RowLimits("p"), [2, 2, 5], [[1, 2], [], [3, 4, 5]]),
    (io.RaggedFeature.ValueRowIds("p"), [0, 0, 2, 2, 2], [[1, 2], [], [3, 4, 5]]),
])
def test_ragged_feature_partitions(partition: Any, given: list[int],
                                   expected: list[Any]) -> None:
    # testSerializedContainingRaggedFeatureWithPartitions (one kind of partition at a time)
    record = example(v=ints([1, 2, 3, 4, 5]), p=ints(given))
    out = io.parse_example([record, record], {
        "r": io.RaggedFeature(np.int64, value_key="v", partitions=[partition])})
    assert out["r"].to_list() == [expected, expected]
    assert out["r"].ragged_rank == 2


def test_ragged_feature_uniform_row_length() -> None:
    record = example(v=ints([1, 2, 3, 4, 5, 6]))
    out = io.parse_example([record], {
        "r": io.RaggedFeature(np.int64, value_key="v",
                              partitions=[io.RaggedFeature.UniformRowLength(2)])})
    assert out["r"].shape == (1, None, 2)
    assert out["r"].to_list() == [[[1, 2], [3, 4], [5, 6]]]


def test_parse_single_example_of_var_len_and_dense() -> None:
    # ParseSingleExampleTest.testSingleExampleWithSparseAndSparseFeatureAndDense (in part)
    record = example(st_c=floats([3, 4]), a=floats([1, 1]))
    out = io.parse_single_example(record, {"st_c": io.VarLenFeature(np.float32),
                                           "a": io.FixedLenFeature([1, 2], np.float32),
                                           "b": io.FixedLenFeature([], np.int64,
                                                                   default_value=7)},
                                  example_names="in1")
    assert_equal(out["st_c"], sparse([[0], [1]], np.array([3, 4], np.float32), [2]))
    assert_equal(out["a"], np.array([[1, 1]], np.float32))
    assert out["b"] == 7


def sequence_example(context: dict[str, io.Feature],
                     lists: dict[str, list[io.Feature]]) -> bytes:
    return io.SequenceExample(
        context=io.Features(feature=context),
        feature_lists=io.FeatureLists(feature_list={
            key: io.FeatureList(feature=value) for key, value in lists.items()}),
    ).SerializeToString()


def test_sequence_example_with_sparse_and_dense() -> None:
    # ParseSequenceExampleTest.testSequenceExampleWithSparseAndDenseContext and
    # testSequenceExampleWithMultipleSizeFeatureLists, batched
    record = sequence_example(
        {"c": floats([3, 4]), "st_a": floats([3.0, 4.0])},
        {"a": [ints([-1, 0, 1]), ints([2, 3, 4]), ints([5, 6, 7]), ints([8, 9, 10])],
         "b": [strings([b"r00", b"r01", b"r10", b"r11"])],
         "d": [floats([1]), floats([]), floats([2, 3])]})
    context, lists, lengths = io.parse_sequence_example(
        [record, sequence_example({"c": floats([5, 6])}, {"a": [ints([1, 2, 3])]})],
        context_features={"c": io.FixedLenFeature([2], np.float32),
                          "st_a": io.VarLenFeature(np.float32)},
        sequence_features={"a": io.FixedLenSequenceFeature([1, 3], np.int64),
                           "b": io.FixedLenSequenceFeature([2, 2], bytes, allow_missing=True),
                           "d": io.VarLenFeature(np.float32)})
    assert_equal(context["c"], np.array([[3, 4], [5, 6]], np.float32))
    assert_equal(context["st_a"], sparse([[0, 0], [0, 1]], np.array([3, 4], np.float32),
                                         [2, 2]))
    assert lists["a"].shape == (2, 4, 1, 3)
    assert lists["a"][1].tolist() == [[[1, 2, 3]], [[0, 0, 0]], [[0, 0, 0]], [[0, 0, 0]]]
    assert lists["b"].shape == (2, 1, 2, 2) and lists["b"][1, 0, 0, 0] == b""
    assert_equal(lengths, {"a": np.array([4, 1]), "b": np.array([1, 0])})
    assert_equal(lists["d"], sparse([[0, 0, 0], [0, 2, 0], [0, 2, 1]],
                                    np.array([1, 2, 3], np.float32), [2, 3, 2]))


def test_sequence_example_missing_required_list() -> None:
    # testSequenceExampleWithoutDebugName / testSequenceExampleListWithWrongShapeFails
    record = sequence_example({}, {"a": [ints([2, 3]), ints([4])]})
    with pytest.raises(InvalidArgumentError, match="Feature list 'b' is required"):
        io.parse_sequence_example([record], sequence_features={
            "b": io.FixedLenSequenceFeature([2], np.int64)}, example_names=["in1"])
    with pytest.raises(InvalidArgumentError, match="Key: a, Index: 0.  Number of int64 values"):
        io.parse_single_sequence_example(record, sequence_features={
            "a": io.FixedLenSequenceFeature([2], np.int64)})


def test_single_sequence_example_ragged() -> None:
    # testSequenceExampleWithRaggedFeature (single example)
    record = sequence_example({}, {"r": [ints([1, 2]), ints([]), ints([3])]})
    _, lists = io.parse_single_sequence_example(record, sequence_features={
        "r": io.RaggedFeature(np.int64)})
    assert lists["r"].to_list() == [[1, 2], [], [3]]


def test_bad_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match="dtype"):
        io.parse_example([b""], {"a": io.FixedLenFeature([], np.int32)})
    with pytest.raises(InvalidArgumentError, match="1-D list or array"):
        io.parse_example(b"", {"a": io.VarLenFeature(np.int64)})
    with pytest.raises(InvalidArgumentError, match=r"serialized\[1\] must be bytes"):
        io.parse_example([b"", 3], {"a": io.VarLenFeature(np.int64)})


def test_malformed_records_are_data_loss() -> None:
    good = example(a=ints([1, 2, 3]))
    with pytest.raises(cv.errors.DataLossError):
        io.parse_example([good[:-2]], {"a": io.VarLenFeature(np.int64)})


def test_duplicate_keys_and_field_order() -> None:
    """Records written field by field in another order, with unpacked lists and a repeated
    key, parse as protobuf reads them (the last entry of a key wins)."""
    entry_a1 = b"\x0a\x01a\x12\x05\x1a\x03\x0a\x01\x07"  # key, then packed [7]
    entry_a2 = b"\x12\x06\x1a\x04\x08\x05\x08\x06\x0a\x01a"  # value first, unpacked [5, 6]
    features = b"\x0a" + bytes([len(entry_a1)]) + entry_a1 + b"\x0a" + \
        bytes([len(entry_a2)]) + entry_a2
    record = b"\x0a" + bytes([len(features)]) + features
    parsed = io.Example.FromString(record)
    assert list(parsed.features.feature["a"].int64_list.value) == [5, 6]
    out = io.parse_example([record, example(a=ints([1]))], {"a": io.VarLenFeature(np.int64)})
    assert out["a"].values.tolist() == [5, 6, 1]
    assert out["a"].indices.tolist() == [[0, 0], [0, 1], [1, 0]]
