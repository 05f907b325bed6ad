"""convoy.torch.IterableDataset over sparse and ragged values: a cv.SparseTensor becomes a
sparse COO tensor, a cv.RaggedTensor a nested tensor (jagged layout) of its rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import convoy as cv

#: Loader workers start from a fork server (see conftest.py)
LOADER_CONTEXT = "forkserver"

pytestmark = pytest.mark.timeout(60)

Dataset = cv.data.Dataset


def _one(value):
    (got,) = list(cv.torch.IterableDataset(Dataset.from_tensors(value)))
    return got


def _ragged(rows, dtype=np.int64):
    return cv.RaggedTensor.from_row_lengths(
        np.array([v for row in rows for v in row], dtype), [len(row) for row in rows])


def test_sparse_becomes_a_sparse_coo_tensor():
    st = cv.SparseTensor(indices=[[0, 1], [2, 3]], values=np.array([1.5, -2.0], np.float32),
                         dense_shape=[3, 4])
    got = _one(st)
    assert got.layout == torch.sparse_coo and got.dtype == torch.float32
    assert tuple(got.shape) == (3, 4)
    np.testing.assert_array_equal(got.to_dense().numpy(), st.to_dense())
    assert got.is_coalesced()  # its entries are in order: values() and indices() can be read
    got.values().mul_(2)  # writable, as every converted tensor
    assert got.values().tolist() == [3.0, -4.0]
    unordered = _one(cv.SparseTensor([[2], [0]], np.array([1, 2]), [3]))
    assert not unordered.is_coalesced()
    assert unordered.to_dense().tolist() == [2, 0, 1]


def test_sparse_batches_and_empty_ones():
    """A batch of sparse tensors (one sparse tensor with a batch dimension) and one without
    entries convert too."""
    ds = Dataset.range(4).map(
        lambda i: cv.SparseTensor(indices=np.arange(i)[:, None], values=np.full(i, i),
                                  dense_shape=[i])).batch(4)
    (got,) = list(cv.torch.IterableDataset(ds))
    assert tuple(got.shape) == (4, 3)
    assert got.to_dense().tolist() == [[0, 0, 0], [1, 0, 0], [2, 2, 0], [3, 3, 3]]
    empty = _one(cv.SparseTensor(np.zeros((0, 2), np.int64), np.zeros(0, np.int32), [2, 5]))
    assert empty.to_dense().tolist() == [[0] * 5] * 2 and empty.dtype == torch.int32


def test_ragged_becomes_a_nested_tensor_of_its_rows():
    rt = _ragged([[1, 2], [], [3, 4, 5]], np.int32)
    got = _one(rt)
    assert got.is_nested and got.layout == torch.jagged and got.dtype == torch.int32
    assert [row.tolist() for row in got.unbind()] == [[1, 2], [], [3, 4, 5]]
    wide = cv.RaggedTensor.from_row_lengths(np.arange(12, dtype=np.float32).reshape(6, 2),
                                            [4, 2])
    rows = _one(wide).unbind()
    assert [tuple(r.shape) for r in rows] == [(4, 2), (2, 2)]
    np.testing.assert_array_equal(rows[1].numpy(), [[8, 9], [10, 11]])


def test_deeper_ragged_is_a_list_of_nested_rows():
    rt = cv.RaggedTensor.from_row_lengths(_ragged([[1], [2, 3], [], [4]]), [3, 1])
    got = _one(rt)
    assert isinstance(got, list) and all(row.is_nested for row in got)
    assert [[r.tolist() for r in row.unbind()] for row in got] == [[[1], [2, 3], []], [[4]]]


def test_byte_strings_stay_as_python_values():
    words = cv.RaggedTensor.from_row_lengths(np.array([b"a", b"bc", b"d"], object), [2, 1])
    assert _one(words) == [[b"a", b"bc"], [b"d"]]
    sparse = cv.SparseTensor([[1]], np.array([b"x"], object), [3])
    assert isinstance(_one(sparse), cv.SparseTensor)


def test_through_loader_worker_processes():
    """Sparse and nested tensors cross from loader workers to the trainer."""
    ds = Dataset.range(6).map(lambda i: (
        cv.SparseTensor(indices=[[0]], values=[i], dense_shape=[2]),
        _ragged([list(range(i)), [i]])))
    face = cv.torch.IterableDataset(ds)
    got = list(DataLoader(face, batch_size=None, num_workers=2,
                          multiprocessing_context=LOADER_CONTEXT))
    assert sorted(int(s.to_dense()[0]) for s, _ in got) == list(range(6))
    assert sorted(tuple(r.unbind()[1].tolist()) for _, r in got) == [(i,) for i in range(6)]
