"""from_tensor_slices and from_tensors of sparse and ragged values.

Scenarios ported from TensorFlow's tensorflow/python/data/kernel_tests/
from_tensor_slices_test.py and from_tensors_test.py in our own words; each names its source.
A sparse tensor's slices are sparse tensors of one rank less; a ragged tensor's are its rows
(arrays for ragged_rank 1, whose spec is a RaggedTensorSpec of ragged_rank 0 so that batch
makes them ragged again, as TensorFlow does).
"""

from __future__ import annotations

import numpy as np
import pytest

import convoy as cv
from convoy.data import Dataset, RaggedTensorSpec, SparseTensorSpec, TensorSpec
from convoy.errors import InvalidArgumentError
from convoy.testing import assert_equal

pytestmark = pytest.mark.timeout(30)


def _column():
    """TensorFlow's first sparse component: a 3x1 column of zeros, every entry set."""
    return cv.SparseTensor(indices=[[0, 0], [1, 0], [2, 0]], values=np.array([0, 0, 0]),
                           dense_shape=[3, 1])


def _diagonal():
    return cv.SparseTensor(indices=[[0, 0], [1, 1], [2, 2]], values=np.array([1, 2, 3]),
                           dense_shape=[3, 3])


def _sparse_rows():
    """The slices of (_column(), _diagonal()), as TensorFlow gives them."""
    return [(cv.SparseTensor([[0]], np.array([0]), [1]),
             cv.SparseTensor([[i]], np.array([i + 1]), [3])) for i in range(3)]


def _nested(values):
    """[[[v]] for v in values]: ragged_rank 2, as tf.ragged.constant makes it."""
    n = len(values)
    return cv.RaggedTensor.from_nested_row_splits(np.asarray(values),
                                                  [np.arange(n + 1), np.arange(n + 1)])


def _one_row(value):
    """[[value]]: a ragged tensor of one row of one value."""
    return cv.RaggedTensor.from_row_splits(np.array([value]), [0, 1])


def _ragged(rows, dtype=np.int64):
    return cv.RaggedTensor.from_row_lengths(
        np.array([v for row in rows for v in row], dtype), [len(row) for row in rows])


def test_from_tensor_slices_sparse():
    """testFromTensorSlicesSparse: each slice of a sparse tensor is a sparse tensor of the
    dense shape's other sizes, holding that row's entries."""
    ds = Dataset.from_tensor_slices((_column(), _diagonal()))
    assert ds.element_spec == (SparseTensorSpec([1], np.int64), SparseTensorSpec([3], np.int64))
    assert ds.cardinality() == 3
    assert_equal(list(ds), _sparse_rows())


def test_from_tensor_slices_mixed():
    """testFromTensorSlicesMixed: dense and sparse components slice side by side."""
    dense = (np.tile(np.array([[1], [2], [3]]), 20), np.tile(np.array([[12], [13], [14]]), 22),
             np.array([37.0, 38.0, 39.0]))
    ds = Dataset.from_tensor_slices(dense + (_column(), _diagonal()))
    assert ds.element_spec == (TensorSpec([20], np.int64), TensorSpec([22], np.int64),
                               TensorSpec([], np.float64), SparseTensorSpec([1], np.int64),
                               SparseTensorSpec([3], np.int64))
    got = list(ds)
    assert len(got) == 3
    for i, element in enumerate(got):
        assert_equal(element, tuple(c[i] for c in dense) + _sparse_rows()[i])


def test_from_tensor_slices_ragged():
    """testFromTensorSlicesRagged: each slice of a ragged tensor is one of its rows."""
    ds = Dataset.from_tensor_slices((_nested([0, 1, 2]), _nested([3, 4, 5])))
    assert ds.element_spec == (RaggedTensorSpec([None, None], np.int64, 1),) * 2
    assert ds.cardinality() == 3
    assert_equal(list(ds), [(_one_row(i), _one_row(i + 3)) for i in range(3)])


def test_from_tensor_slices_mixed_ragged():
    """testFromTensorSlicesMixedRagged: dense, sparse and ragged components together."""
    dense = (np.tile(np.array([[1], [2], [3]]), 20), np.array([37.0, 38.0, 39.0]))
    ds = Dataset.from_tensor_slices(dense + (_column(), _diagonal(), _nested([0, 1, 2])))
    for i, element in enumerate(ds):
        assert_equal(element, tuple(c[i] for c in dense) + _sparse_rows()[i] + (_one_row(i),))


def test_ragged_rows_of_ragged_rank_one_are_arrays_that_batch_ragged():
    """Our words, checked against TensorFlow 2.21: the rows of a ragged tensor of ragged_rank 1
    come out as arrays with a RaggedTensorSpec of ragged_rank 0, and batch, unbatch and batch
    again make ragged tensors of them."""
    rows = [[1], [2, 3], [], [4, 5, 6]]
    ds = Dataset.from_tensor_slices(_ragged(rows))
    assert ds.element_spec == RaggedTensorSpec([None], np.int64, 0)
    assert [r.tolist() for r in ds] == rows
    batched = ds.batch(2)
    assert batched.element_spec == RaggedTensorSpec([None, None], np.int64, 1)
    assert_equal(list(batched), [_ragged(rows[:2]), _ragged(rows[2:])])
    again = batched.unbatch()
    assert again.element_spec == RaggedTensorSpec([None], np.int64, 0)
    assert_equal(list(again.batch(3)), [_ragged(rows[:3]), _ragged(rows[3:])])
    assert batched.unbatch().batch(4, drop_remainder=True).element_spec == RaggedTensorSpec(
        [4, None], np.int64, 1)
    # through the ops that only choose or reorder elements
    assert_equal(list(ds.skip(1).take(2).repeat(2).batch(4)), [_ragged(rows[1:3] * 2)])
    (shuffled,) = ds.shuffle(4, seed=3).batch(4)
    assert sorted(shuffled.to_list()) == sorted(rows)
    # a function's result is what it returns: arrays, as in TensorFlow
    assert isinstance(ds.map(lambda x: x).element_spec, TensorSpec)


def test_sparse_rows_batch_to_the_dense_shape():
    """Our words, checked against TensorFlow 2.21: a batch of sparse slices has the slices'
    dense shape, including rows without entries."""
    st = cv.SparseTensor(indices=[[0, 0], [1, 1], [1, 2], [3, 0]], values=[1, 2, 3, 4],
                         dense_shape=[4, 5])
    ds = Dataset.from_tensor_slices(st)
    assert ds.element_spec == SparseTensorSpec([5], np.int64)
    assert_equal(list(ds)[2], cv.SparseTensor(np.zeros((0, 1), np.int64),
                                              np.zeros(0, np.int64), [5]))
    assert ds.batch(3).element_spec == SparseTensorSpec([None, 5], np.int64)
    first, second = ds.batch(3)
    assert_equal(first, cv.SparseTensor([[0, 0], [1, 1], [1, 2]], [1, 2, 3], [3, 5]))
    assert_equal(second, cv.SparseTensor([[0, 0]], [4], [1, 5]))
    assert_equal(list(ds.batch(4).unbatch()), list(ds))


def test_sparse_entries_out_of_row_order():
    """Our words: entries listed out of row order still slice into their rows (TensorFlow
    asks for sorted indices; convoy sorts them by row, keeping each row's order)."""
    st = cv.SparseTensor(indices=[[2, 1], [0, 0], [2, 0]], values=[5.0, 6.0, 7.0],
                         dense_shape=[3, 2])
    got = list(Dataset.from_tensor_slices(st))
    assert [g.to_dense().tolist() for g in got] == st.to_dense().tolist()


def test_from_tensor_slices_checkpoint_with_composites():
    """Our words: an iterator over sparse and ragged slices restores where it was."""
    ds = Dataset.from_tensor_slices((_ragged([[1], [2, 3], [], [4]]), cv.SparseTensor(
        [[0, 0], [1, 1], [2, 0], [3, 3]], [1, 2, 3, 4], [4, 4])))
    it = iter(ds)
    next(it)
    state = it.state_dict()
    rest = list(it)
    restored = iter(ds)
    restored.load_state_dict(state)
    assert_equal(list(restored), rest)


def test_from_tensor_slices_refusals():
    """Sizes must agree; a sparse tensor must have rank >= 2 (TensorFlow's own refusal:
    "Rank of input SparseTensor should be > 1")."""
    with pytest.raises(InvalidArgumentError, match="same size in their first dimension"):
        Dataset.from_tensor_slices((_ragged([[1], [2]]), np.arange(3)))
    with pytest.raises(InvalidArgumentError, match="same size in their first dimension"):
        Dataset.from_tensor_slices((_diagonal(), np.arange(2)))
    with pytest.raises(InvalidArgumentError, match="rank >= 2"):
        Dataset.from_tensor_slices(cv.SparseTensor([[0], [2]], [1, 2], [3]))


def test_from_tensors_sparse():
    """testFromTensorsSparse (from_tensors_test.py): one element, the sparse tensors as
    given, with their dense shapes as the spec's shapes."""
    components = (cv.SparseTensor([[0]], np.array([0]), [1]),
                  cv.SparseTensor([[0, 0], [1, 1]], np.array([-1, 1]), [2, 2]))
    ds = Dataset.from_tensors(components)
    assert ds.element_spec == (SparseTensorSpec([1], np.int64), SparseTensorSpec([2, 2],
                                                                                 np.int64))
    assert ds.cardinality() == 1
    assert_equal(list(ds), [components])


def test_from_tensors_mixed():
    """testFromTensorsMixed: dense and sparse components in one element."""
    components = (np.array(1), np.array([1, 2, 3]), np.array(37.0),
                  cv.SparseTensor([[0]], np.array([0]), [1]),
                  cv.SparseTensor([[0, 0], [1, 1]], np.array([-1, 1]), [2, 2]))
    ds = Dataset.from_tensors(components)
    assert [s.shape for s in ds.element_spec] == [(), (3,), (), (1,), (2, 2)]
    assert_equal(list(ds), [components])


def test_from_tensors_ragged_and_mixed_ragged():
    """testFromTensorsRagged and testFromTensorsMixedRagged: ragged components are kept
    whole, with their row counts in the spec."""
    ragged = _nested([0, 1])
    ds = Dataset.from_tensors((ragged, _nested([2, 3])))
    assert ds.element_spec == (RaggedTensorSpec([2, None, None], np.int64, 2),) * 2
    assert_equal(list(ds), [(ragged, _nested([2, 3]))])
    mixed = (np.array(1), cv.SparseTensor([[0]], np.array([0]), [1]), ragged)
    ds = Dataset.from_tensors(mixed)
    assert ds.element_spec == (TensorSpec([], np.int64), SparseTensorSpec([1], np.int64),
                               RaggedTensorSpec([2, None, None], np.int64, 2))
    assert_equal(list(ds), [mixed])
    # and its rows come back through unbatch
    assert_equal(list(ds.map(lambda a, b, c: c).unbatch()), [_one_row(0), _one_row(1)])
