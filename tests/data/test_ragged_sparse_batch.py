"""ragged_batch and sparse_batch (and their experimental forms). Scenarios ported from
TensorFlow's tensorflow/python/data/kernel_tests/ragged_batch_test.py, sparse_batch_test.py
and experimental/kernel_tests/dense_to_ragged_batch_test.py, dense_to_sparse_batch_test.py
in our own words."""

from __future__ import annotations

import numpy as np
import pytest

import convoy as cv
from convoy.data import Dataset, experimental
from convoy.errors import InvalidArgumentError

pytestmark = pytest.mark.timeout(30)


def _lengths(n):
    return Dataset.range(n).map(lambda x: np.arange(x, dtype=np.int64))


@pytest.mark.parametrize("batch_size, drop_remainder", [(3, False), (3, True), (7, False)])
def test_ragged_batch(batch_size, drop_remainder):
    """testBasic (ragged_batch_test.py): rows of varying length batch into ragged tensors."""
    ds = _lengths(8).ragged_batch(batch_size, drop_remainder=drop_remainder)
    rows = [list(range(n)) for n in range(8)]
    expected = [rows[i:i + batch_size] for i in range(0, 8, batch_size)]
    if drop_remainder and len(expected[-1]) < batch_size:
        expected.pop()
    got = list(ds)
    assert all(isinstance(b, cv.RaggedTensor) for b in got)
    assert [b.to_list() for b in got] == expected


def test_ragged_batch_scalars_stay_dense():
    """testScalar... (our words): scalar components stack into dense vectors."""
    ds = Dataset.range(4).map(lambda x: (x, np.arange(x))).ragged_batch(2)
    (n, ragged), _ = list(ds)
    assert isinstance(n, np.ndarray) and n.tolist() == [0, 1]
    assert ragged.to_list() == [[], [0]]


def test_ragged_batch_of_ragged():
    """testNestedRagged (dense_to_ragged_batch_test.py, our words): ragged rows batch into
    a tensor with one more ragged dimension."""
    ds = _lengths(6).ragged_batch(2).apply(experimental.dense_to_ragged_batch(2))
    assert [b.to_list() for b in ds] == [[[[], [0]], [[0, 1], [0, 1, 2]]],
                                         [[[0, 1, 2, 3], [0, 1, 2, 3, 4]]]]


def test_ragged_batch_inner_dims_must_agree():
    """A rank-2 element may vary only in its first dimension."""
    ds = Dataset.from_generator(lambda: iter([np.zeros((1, 2)), np.zeros((1, 3))]),
                                output_types=np.float64, output_shapes=[None, None])
    with pytest.raises(InvalidArgumentError, match="after the first must agree"):
        list(ds.ragged_batch(2))


def test_sparse_batch_documented_example():
    """The example of dense_to_sparse_batch's docs (sparse_batch_test.py testBasic)."""
    words = [[b"a", b"b", b"c"], [b"a", b"b"], [b"a", b"b", b"c", b"d"]]
    ds = Dataset.from_generator(lambda: (np.array(w, dtype=object) for w in words),
                                output_types=bytes, output_shapes=[None]).sparse_batch(2, [6])
    first, second = list(ds)
    assert first.indices.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1]]
    assert first.values.tolist() == [b"a", b"b", b"c", b"a", b"b"]
    assert first.dense_shape.tolist() == [2, 6]
    assert second.indices.tolist() == [[0, 0], [0, 1], [0, 2], [0, 3]]
    assert second.dense_shape.tolist() == [1, 6]


def test_sparse_batch_unknown_row_shape():
    """testWithUnknownShape: -1 sizes take the batch's largest."""
    ds = Dataset.range(1, 5).map(lambda x: np.full((x, x), x)).apply(
        experimental.dense_to_sparse_batch(4, [-1, -1]))
    batch = next(iter(ds))
    assert batch.dense_shape.tolist() == [4, 4, 4]
    dense = batch.to_dense()
    assert dense[2].tolist()[:3] == [[3, 3, 3, 0]] * 3


def test_sparse_batch_too_large_element():
    """testWithInvalidShape: an element larger than row_shape is an error."""
    ds = Dataset.range(1, 5).map(lambda x: np.arange(x)).sparse_batch(4, [2])
    with pytest.raises(InvalidArgumentError,
                       match=r"Input element had shape \(3\) that is incompatible with the "
                             r"row shape \(2\)\."):
        list(ds)
