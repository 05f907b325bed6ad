"""batch and unbatch of sparse and ragged values, and the specs that describe them.

Scenarios ported from TensorFlow's tensorflow/python/data/kernel_tests/batch_test.py and
unbatch_test.py in our own words; each names its source. A batch of sparse tensors is one
sparse tensor with a leading batch dimension, a batch of ragged tensors one ragged tensor with
one more ragged dimension, and unbatch is the inverse.
"""

from __future__ import annotations

import numpy as np
import pytest

import convoy as cv
from convoy.data import Dataset, RaggedTensorSpec, SparseTensorSpec, TensorSpec
from convoy.errors import InvalidArgumentError
from convoy.testing import assert_equal

pytestmark = pytest.mark.timeout(30)


def _sparse_of(i):
    return cv.SparseTensor(indices=[[0]], values=[i], dense_shape=[1])


def _ragged_of(i):
    """A ragged [[i]]: one row holding i (TensorFlow's RaggedTensor.from_tensor(i * [[1]]))."""
    return cv.RaggedTensor.from_row_splits(np.array([i]), [0, 1])


def _ragged(rows):
    """A ragged tensor of ragged_rank 1 from a list of lists of ints."""
    return cv.RaggedTensor.from_row_lengths(
        np.array([v for row in rows for v in row], np.int64), [len(row) for row in rows])


def _diagonal(n):
    return cv.SparseTensor(indices=[[i, i] for i in range(n)], values=np.arange(n),
                           dense_shape=[n, n])


def _nested_ragged(values):
    """[[[v]] for v in values]: ragged_rank 2, as tf.ragged.constant makes it."""
    n = len(values)
    return cv.RaggedTensor.from_nested_row_splits(np.asarray(values), [np.arange(n + 1),
                                                                       np.arange(n + 1)])


# ----- batch ---------------------------------------------------------------------------------

def test_batch_sparse():
    """testSparse (batch_test.py): the batch index leads each entry's index."""
    got = list(Dataset.range(10).map(_sparse_of).batch(5))
    assert len(got) == 2
    for i, batch in enumerate(got):
        assert_equal(batch, cv.SparseTensor(indices=[[j, 0] for j in range(5)],
                                            values=np.arange(i * 5, i * 5 + 5), dense_shape=[5, 1]))


def test_batch_sparse_with_different_dense_shapes():
    """testSparseWithDifferentDenseShapes: the batch's dense shape is the largest of each
    dimension."""
    def sparse(i):
        return cv.SparseTensor(indices=np.arange(i)[:, None], values=np.full(i, i),
                               dense_shape=[i])

    got = list(Dataset.range(10).map(sparse).batch(5))
    for i, batch in enumerate(got):
        indices = [[j, k] for j in range(5) for k in range(i * 5 + j)]
        values = [i * 5 + j for j in range(5) for _ in range(i * 5 + j)]
        assert_equal(batch, cv.SparseTensor(indices=indices, values=np.array(values),
                                            dense_shape=[5, (i + 1) * 5 - 1]))


def test_batch_sparse_nested():
    """testSparseNested: a batch of batches of sparse tensors has two leading dimensions."""
    (got,) = list(Dataset.range(10).map(_sparse_of).batch(5).batch(2))
    assert_equal(got, cv.SparseTensor(indices=[[i, j, 0] for i in range(2) for j in range(5)],
                                      values=np.arange(10), dense_shape=[2, 5, 1]))


def test_batch_ragged():
    """testRagged: ragged elements batch into a ragged tensor with one more ragged dimension."""
    got = list(Dataset.range(10).map(_ragged_of).batch(5))
    assert [b.to_list() for b in got] == [[[[i]] for i in range(5)], [[[i]] for i in range(5, 10)]]
    assert all(b.ragged_rank == 2 for b in got)


def test_batch_ragged_with_different_shapes():
    """testRaggedWithDifferentShapes: rows of different lengths batch (tf.ragged.range(i) is
    one row 0 .. i-1)."""
    got = list(Dataset.range(10).map(lambda i: _ragged([list(range(i))])).batch(5))
    assert [b.to_list() for b in got] == [[[list(range(i))] for i in range(5)],
                                          [[list(range(i))] for i in range(5, 10)]]


def test_batch_ragged_nested():
    """testRaggedNested: two batches deep, two more ragged dimensions."""
    (got,) = list(Dataset.range(10).map(_ragged_of).batch(5).batch(2))
    assert got.to_list() == [[[[i]] for i in range(5)], [[[i]] for i in range(5, 10)]]
    assert got.ragged_rank == 3


def test_batch_of_arrays_turned_ragged_keeps_dense_components_dense():
    """Our words: in a structure only the sparse and ragged components batch as such."""
    ds = Dataset.range(4).map(lambda i: (i, _sparse_of(i), _ragged_of(i))).batch(4)
    (dense, sparse, ragged), = list(ds)
    assert dense.tolist() == [0, 1, 2, 3]
    assert sparse.shape == (4, 1) and ragged.to_list() == [[[i]] for i in range(4)]


def test_batch_refuses_mixed_or_unequal_ranks():
    """Our words: a batch needs sparse tensors of one rank, and no dense value among them."""
    ranks = Dataset.from_tensor_slices(np.arange(2)).map(
        lambda i: _sparse_of(i) if i == 0 else _diagonal(2))
    with pytest.raises(InvalidArgumentError, match="different ranks"):
        list(ranks.batch(2))
    mixed = Dataset.from_tensor_slices(np.arange(2)).map(
        lambda i: _sparse_of(i) if i == 0 else _ragged_of(i))
    with pytest.raises(InvalidArgumentError, match="element 1 differs"):
        list(mixed.batch(2))


# ----- unbatch -------------------------------------------------------------------------------

def test_unbatch_sparse():
    """testUnbatchDatasetWithSparseTensor (unbatch_test.py): a row of a sparse tensor is a
    sparse tensor of one rank less, through unbatch, batch and unbatch again."""
    got = list(Dataset.from_tensors(_diagonal(10)).unbatch().batch(5).unbatch())
    assert len(got) == 10
    for i, row in enumerate(got):
        assert_equal(row, cv.SparseTensor(indices=[[i]], values=np.array([i]), dense_shape=[10]))


def test_unbatch_sparse_rows_without_entries():
    """Our words: a row with no entries is an empty sparse tensor, and entries out of row
    order come out in their rows."""
    st = cv.SparseTensor(indices=[[2, 1], [0, 0], [2, 0]], values=[5.0, 6.0, 7.0],
                         dense_shape=[3, 2])
    rows = list(Dataset.from_tensors(st).unbatch())
    assert [r.to_dense().tolist() for r in rows] == [[6.0, 0.0], [0.0, 0.0], [7.0, 5.0]]


def test_unbatch_dense_sparse_and_ragged():
    """testUnbatchDatasetWithDenseSparseAndRaggedTensor."""
    ds = Dataset.from_tensors((np.arange(10), _diagonal(10), _nested_ragged(np.arange(10))))
    got = list(ds.unbatch().batch(5).unbatch())
    assert len(got) == 10
    for i, (dense, sparse, ragged) in enumerate(got):
        assert int(dense) == i
        assert_equal(sparse, cv.SparseTensor(indices=[[i]], values=np.array([i]),
                                             dense_shape=[10]))
        assert ragged.to_list() == [[i]] and ragged.ragged_rank == 1


def test_unbatch_ragged():
    """testUnbatchDatasetWithRaggedTensor."""
    ds = Dataset.from_tensors(_nested_ragged(np.arange(10))).unbatch().batch(5).batch(2)
    got = list(ds.unbatch())
    assert [r.to_list() for r in got] == [[[[i]] for i in range(5)],
                                          [[[i]] for i in range(5, 10)]]


def test_unbatch_ragged_rank_one_gives_arrays():
    """Our words: the rows of a ragged tensor of ragged_rank 1 are numpy arrays."""
    rows = list(Dataset.from_tensors(_ragged([[1, 2], [], [3]])).unbatch())
    assert all(isinstance(r, np.ndarray) for r in rows)
    assert [r.tolist() for r in rows] == [[1, 2], [], [3]]


# ----- specs ---------------------------------------------------------------------------------

def test_element_spec_of_sparse_and_ragged_values():
    """Datasets of sparse and ragged values report tf.SparseTensorSpec / tf.RaggedTensorSpec
    as TensorFlow does, through batch and unbatch."""
    sparse = Dataset.from_tensors(_diagonal(10))
    assert sparse.element_spec == SparseTensorSpec([10, 10], np.int64)
    assert sparse.unbatch().element_spec == SparseTensorSpec([10], np.int64)
    assert sparse.unbatch().batch(5).element_spec == SparseTensorSpec([None, 10], np.int64)
    assert sparse.unbatch().batch(5, drop_remainder=True).element_spec == SparseTensorSpec(
        [5, 10], np.int64)
    ragged = Dataset.from_tensors(_nested_ragged(np.arange(10)))
    assert ragged.element_spec == RaggedTensorSpec([10, None, None], np.int64, 2)
    assert ragged.unbatch().element_spec == RaggedTensorSpec([None, None], np.int64, 1)
    assert ragged.unbatch().batch(5).batch(2).element_spec == RaggedTensorSpec(
        [None, None, None, None], np.int64, 3)
    flat = Dataset.from_tensors(_ragged([[1, 2], [3]])).unbatch()
    # its rows are arrays, of a RaggedTensorSpec of ragged_rank 0 (so they batch ragged)
    assert flat.element_spec == RaggedTensorSpec([None], np.int64, 0)
    assert flat.batch(2).element_spec == RaggedTensorSpec([None, None], np.int64, 1)


def test_element_spec_after_sparse_batch_and_ragged_batch():
    """sparse_batch and ragged_batch report the specs TensorFlow gives them."""
    rows = Dataset.range(5).map(lambda x: np.arange(x, dtype=np.int32))
    assert rows.sparse_batch(2, [-1]).element_spec == SparseTensorSpec([None, None], np.int32)
    assert rows.sparse_batch(2, [7]).element_spec == SparseTensorSpec([None, 7], np.int32)
    assert rows.ragged_batch(2).element_spec == RaggedTensorSpec([None, None], np.int32, 1)
    assert rows.ragged_batch(2, drop_remainder=True).element_spec == RaggedTensorSpec(
        [2, None], np.int32, 1)
    pairs = Dataset.range(4).map(lambda x: (x, np.zeros((x, 3)))).ragged_batch(2)
    assert pairs.element_spec == (TensorSpec([None], np.int64),
                                  RaggedTensorSpec([None, None, 3], np.float64, 1))
    assert list(rows.ragged_batch(2))[0].to_list() == [[], [0]]


def test_spec_classes():
    """tf.SparseTensorSpec / tf.RaggedTensorSpec: arguments, defaults, compatibility."""
    spec = SparseTensorSpec([None, 3], np.float32)
    assert spec.rank == 2 and spec.dtype == np.float32
    assert spec.is_compatible_with(cv.SparseTensor([[0, 1]], np.array([1.0], np.float32), [4, 3]))
    assert not spec.is_compatible_with(cv.SparseTensor([[1]], np.array([1.0], np.float32), [3]))
    assert not spec.is_compatible_with(TensorSpec([None, 3], np.float32))
    assert spec.most_specific_common(SparseTensorSpec([2, 3], np.float32)) == spec
    assert repr(spec) == "SparseTensorSpec(shape=[None, 3], dtype=float32)"
    assert SparseTensorSpec().shape is None and SparseTensorSpec().dtype == np.float32
    ragged = RaggedTensorSpec([2, None, 4], np.int64)
    assert ragged.ragged_rank == 2 and ragged.row_splits_dtype == np.int64
    value = cv.RaggedTensor.from_row_lengths(np.zeros((3, 4)), [1, 2])
    assert RaggedTensorSpec([None, None, 4], np.float64, 1).is_compatible_with(value)
    assert not RaggedTensorSpec([None, None, 4], np.float64, 2).is_compatible_with(value)
    assert cv.nest.spec_from_value(value) == RaggedTensorSpec([2, None, 4], np.float64, 1)
    assert repr(RaggedTensorSpec([None, None], np.int32, 1)) == (
        "RaggedTensorSpec(shape=[None, None], dtype=int32, ragged_rank=1, "
        "row_splits_dtype=int64)")
    assert cv.SparseTensorSpec is SparseTensorSpec and cv.RaggedTensorSpec is RaggedTensorSpec
    with pytest.raises(InvalidArgumentError, match="ragged_rank"):
        RaggedTensorSpec([None, None], np.int32, 2)
    with pytest.raises(InvalidArgumentError, match="ragged_rank"):
        RaggedTensorSpec(None, np.int32)
    with pytest.raises(InvalidArgumentError, match="row_splits_dtype"):
        RaggedTensorSpec([None, None], np.int32, 1, np.float32)


@pytest.mark.parametrize("make", [_sparse_of, _ragged_of], ids=["sparse", "ragged"])
def test_padded_batch_of_composites_is_refused_as_tensorflow_does(make) -> None:
    """TensorFlow's padded_batch raises TypeError when it is built on sparse or ragged
    elements (checked against TensorFlow 2.21): whether their spec is known when the
    dataset is built (from_tensor_slices of one) or comes from a function (map)."""
    built = Dataset.from_tensor_slices(np.arange(3)).map(make)
    with pytest.raises(TypeError, match="padded_batch.*not a subclass of TensorSpec"):
        list(built.padded_batch(2))
    sliced = Dataset.from_tensor_slices(
        cv.SparseTensor(indices=[[0, 0]], values=[1], dense_shape=[3, 1]))
    with pytest.raises(TypeError, match="padded_batch.*SparseTensorSpec"):
        sliced.padded_batch(2)
