"""Tests for cv.SparseTensor and cv.RaggedTensor: construction, conversions, immutability,
pickling, the codec and convoy.nest."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import convoy as cv
from convoy import nest
from convoy.codec import Encoder, decode
from convoy.errors import InvalidArgumentError
from convoy.testing import assert_equal


def sparse() -> cv.SparseTensor:
    return cv.SparseTensor(indices=[[0, 0], [1, 2]], values=[1.5, 2.5], dense_shape=[3, 4])


def ragged() -> cv.RaggedTensor:
    return cv.RaggedTensor.from_row_splits([3, 1, 4, 1, 5, 9, 2], [0, 4, 4, 7, 7])


# --- SparseTensor ------------------------------------------------------------------------------

def test_sparse_parts_and_dense() -> None:
    st = sparse()
    assert st.indices.dtype == np.int64 and st.indices.shape == (2, 2)
    assert st.dense_shape.dtype == np.int64
    assert st.shape == (3, 4) and st.dtype == np.float64 and st.rank == 2
    expected = np.zeros((3, 4))
    expected[0, 0], expected[1, 2] = 1.5, 2.5
    assert_equal(st.to_dense(), expected)
    assert st.to_dense(default_value=-1.0)[2, 3] == -1.0
    assert repr(st) == ("SparseTensor(indices=[[0, 0], [1, 2]], values=[1.5, 2.5], "
                        "dense_shape=[3, 4])")


def test_sparse_from_dense_round_trip() -> None:
    dense = np.array([[0, 7, 0], [0, 0, 0], [5, 0, 6]], np.int32)
    st = cv.SparseTensor.from_dense(dense)
    assert st.indices.tolist() == [[0, 1], [2, 0], [2, 2]]
    assert st.values.tolist() == [7, 5, 6] and st.values.dtype == np.int32
    assert_equal(st.to_dense(), dense)


def test_sparse_byte_strings_default_to_empty() -> None:
    st = cv.SparseTensor([[1]], np.array([b"x"], object), [3])
    assert st.to_dense().tolist() == [b"", b"x", b""]
    assert cv.SparseTensor.from_dense(np.array([b"", b"y"], object)).indices.tolist() == [[1]]


def test_sparse_empty() -> None:
    st = cv.SparseTensor(np.zeros((0, 2), np.int64), np.zeros(0, np.float32), [2, 0])
    assert st.to_dense().shape == (2, 0)
    assert cv.SparseTensor([], np.zeros(0), [4]).indices.shape == (0, 1)


@pytest.mark.parametrize("args, argument", [
    (([[0.5]], [1], [2]), "indices"),
    (([[0]], [[1]], [2]), "values"),
    (([[0]], [1, 2], [2]), "values"),
    (([[0, 0]], [1], [2]), "indices"),
    (([[0]], [1], [[2]]), "dense_shape"),
    (([[0]], [1], [-2]), "dense_shape"),
])
def test_sparse_validation_names_the_argument(args: tuple, argument: str) -> None:
    with pytest.raises(InvalidArgumentError, match=argument):
        cv.SparseTensor(*args)


def test_sparse_is_immutable_and_leaves_the_callers_arrays_alone() -> None:
    indices = np.array([[0]])
    st = cv.SparseTensor(indices, np.array([1.0]), [1])
    with pytest.raises(ValueError):
        st.values[0] = 2.0
    with pytest.raises(AttributeError):
        st.values = np.array([2.0])  # type: ignore[misc]
    indices[0, 0] = 0  # still writable for its owner
    assert st != sparse()  # no overloaded __eq__: identity


# --- RaggedTensor ------------------------------------------------------------------------------

def test_ragged_parts() -> None:
    rt = ragged()
    assert rt.to_list() == [[3, 1, 4, 1], [], [5, 9, 2], []]
    assert rt.row_splits.tolist() == [0, 4, 4, 7, 7]
    assert rt.row_lengths().tolist() == [4, 0, 3, 0]
    assert rt.value_rowids().tolist() == [0, 0, 0, 0, 2, 2, 2]
    assert rt.values.tolist() == [3, 1, 4, 1, 5, 9, 2]
    assert rt.shape == (4, None) and rt.ragged_rank == 1 and rt.dtype == np.int64
    assert len(rt) == 4
    assert rt[2].tolist() == [5, 9, 2] and rt[-4].tolist() == [3, 1, 4, 1]
    assert [row.tolist() for row in rt] == rt.to_list()
    assert rt[1:3].to_list() == [[], [5, 9, 2]]
    assert repr(rt) == "<RaggedTensor [[3, 1, 4, 1], [], [5, 9, 2], []]>"
    with pytest.raises(IndexError):
        rt[4]


def test_ragged_to_tensor_pads() -> None:
    assert ragged().to_tensor().tolist() == [[3, 1, 4, 1], [0] * 4, [5, 9, 2, 0], [0] * 4]
    assert ragged().to_tensor(default_value=-1)[2].tolist() == [5, 9, 2, -1]
    empty = cv.RaggedTensor.from_row_splits(np.zeros(0, np.float32), [0, 0, 0])
    assert empty.to_tensor().shape == (2, 0)


def test_ragged_constructors_agree() -> None:
    values = np.array([3, 1, 4, 1, 5, 9, 2])
    for rt in (cv.RaggedTensor.from_row_lengths(values, [4, 0, 3, 0]),
               cv.RaggedTensor.from_value_rowids(values, [0, 0, 0, 0, 2, 2, 2], nrows=4)):
        assert_equal(rt, ragged())
    assert cv.RaggedTensor.from_value_rowids(values, [0] * 7).to_list() == [values.tolist()]


def test_ragged_nested() -> None:
    rt = cv.RaggedTensor.from_nested_row_splits(
        np.arange(6, dtype=np.float32), [[0, 2, 3], [0, 1, 1, 6]])
    assert rt.to_list() == [[[0.0], []], [[1.0, 2.0, 3.0, 4.0, 5.0]]]
    assert rt.ragged_rank == 2 and rt.shape == (2, None, None)
    assert [s.tolist() for s in rt.nested_row_splits] == [[0, 2, 3], [0, 1, 1, 6]]
    assert rt.flat_values.tolist() == [0, 1, 2, 3, 4, 5]
    assert isinstance(rt.values, cv.RaggedTensor) and rt.values.to_list() == [
        [0.0], [], [1.0, 2.0, 3.0, 4.0, 5.0]]
    assert rt[1].to_list() == [[1.0, 2.0, 3.0, 4.0, 5.0]]
    assert rt[1].row_splits.tolist() == [0, 5]
    assert rt.to_tensor().shape == (2, 2, 5)
    assert rt.to_tensor()[0].tolist() == [[0, 0, 0, 0, 0], [0] * 5]
    again = cv.RaggedTensor.from_nested_row_lengths(np.arange(6, dtype=np.float32),
                                                    [[2, 1], [1, 0, 5]])
    assert_equal(again, rt)


def test_ragged_uniform_inner_dimensions() -> None:
    rt = cv.RaggedTensor.from_row_lengths(np.arange(6).reshape(3, 2), [1, 2])
    assert rt.shape == (2, None, 2)
    assert rt.to_tensor().tolist() == [[[0, 1], [0, 0]], [[2, 3], [4, 5]]]


def test_ragged_byte_strings() -> None:
    rt = cv.RaggedTensor.from_row_lengths([b"a", b"bc", b"d"], [2, 1])
    assert rt.dtype == object and rt.to_list() == [[b"a", b"bc"], [b"d"]]
    assert rt.to_tensor().tolist() == [[b"a", b"bc"], [b"d", b""]]


@pytest.mark.parametrize("values, splits, argument", [
    ([1, 2], [1, 2], "row_splits"),
    ([1, 2], [0, 2, 1], "row_splits"),
    ([1, 2], [0, 3], "row_splits"),
    ([1, 2], [[0, 2]], "row_splits"),
    (5, [0], "values"),
])
def test_ragged_validation_names_the_argument(values: object, splits: object,
                                              argument: str) -> None:
    with pytest.raises(InvalidArgumentError, match=argument):
        cv.RaggedTensor.from_row_splits(values, splits)
    with pytest.raises(InvalidArgumentError, match="row_lengths"):
        cv.RaggedTensor.from_row_lengths([1, 2], [3, -1])
    with pytest.raises(TypeError, match="from_row_splits"):
        cv.RaggedTensor([1], [0, 1])


def test_ragged_is_immutable() -> None:
    rt = ragged()
    with pytest.raises(ValueError):
        rt.row_splits[0] = 1
    with pytest.raises(ValueError):
        rt.flat_values[0] = 1


# --- pickle, codec, nest -----------------------------------------------------------------------

def nested_ragged() -> cv.RaggedTensor:
    return cv.RaggedTensor.from_nested_row_splits(np.arange(3000, dtype=np.float32),
                                                  [[0, 1, 3], [0, 1000, 2500, 3000]])


@pytest.mark.parametrize("value", [sparse, ragged, nested_ragged], ids=lambda f: f.__name__)
def test_pickle_round_trip(value: object) -> None:
    original = value()  # type: ignore[operator]
    assert_equal(pickle.loads(pickle.dumps(original, protocol=5)), original)


@pytest.mark.parametrize("compression", [None, "AUTO"])
def test_codec_carries_sparse_and_ragged_arrays_out_of_band(compression: str | None) -> None:
    big = cv.SparseTensor(np.arange(2000).reshape(1000, 2), np.arange(1000.0), [2000, 2000])
    elements = [{"s": big, "r": nested_ragged(), "x": np.int64(3)}, (sparse(), ragged())]
    message = Encoder(compression).encode(elements)
    decoded = decode(message)
    assert_equal(decoded[0], elements[0])
    assert_equal(decoded[1], elements[1])
    # The big arrays travel as out-of-band buffers: views on the message, not copies.
    assert not decoded[0]["s"].values.flags.owndata
    assert not decoded[0]["r"].flat_values.flags.owndata


def test_nest_treats_them_as_leaves() -> None:
    st, rt = sparse(), ragged()
    structure = {"a": st, "b": (rt, np.int64(1))}
    assert nest.flatten(structure) == [st, rt, np.int64(1)]
    assert not nest.is_nested(st) and not nest.is_nested(rt)
    mapped = nest.map_structure(lambda leaf: type(leaf).__name__, structure)
    assert mapped == {"a": "SparseTensor", "b": ("RaggedTensor", "int64")}
    assert nest.pack_sequence_as(structure, nest.flatten(structure))["a"] is st


def test_assert_equal_finds_differences() -> None:
    with pytest.raises(AssertionError, match="values"):
        assert_equal(cv.SparseTensor([[0, 0], [1, 2]], [1.5, 9.0], [3, 4]), sparse())
    with pytest.raises(AssertionError, match="row_splits"):
        assert_equal(cv.RaggedTensor.from_row_splits([3, 1, 4, 1, 5, 9, 2], [0, 3, 4, 7, 7]),
                     ragged())
    with pytest.raises(AssertionError, match="not a RaggedTensor"):
        assert_equal(np.array([1]), ragged())
