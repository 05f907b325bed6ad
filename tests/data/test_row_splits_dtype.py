"""Ragged row splits of int32, as TensorFlow's ``row_splits_dtype`` (scenarios after
tensorflow/python/data/experimental/kernel_tests/dense_to_ragged_batch_test.py and
tensorflow/python/kernel_tests/io_ops/parse_single_example_op_test.py's RaggedFeature cases):
``ragged_batch``, ``RaggedFeature`` and ``RaggedTensor`` keep the dtype asked for, and a save
keeps it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import convoy as cv
from convoy.data import Dataset
from convoy.errors import InvalidArgumentError


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_ragged_batch_row_splits_dtype(dtype: type, tmp_path: Path) -> None:
    ds = Dataset.range(1, 6).map(lambda i: np.arange(i)).ragged_batch(2, row_splits_dtype=dtype)
    assert ds.element_spec.row_splits_dtype == dtype
    batches = list(ds)
    assert all(b.row_splits.dtype == dtype for b in batches)
    assert [b.to_list() for b in batches] == [[[0], [0, 1]], [[0, 1, 2], [0, 1, 2, 3]],
                                              [[0, 1, 2, 3, 4]]]
    ds.save(tmp_path)
    loaded = Dataset.load(tmp_path)
    assert loaded.element_spec.row_splits_dtype == dtype
    assert all(b.row_splits.dtype == dtype for b in loaded)
    assert [b.to_list() for b in loaded] == [b.to_list() for b in batches]


def test_ragged_batch_keeps_ragged_inputs_splits() -> None:
    """Only the components that were dense take the asked dtype, as TensorFlow's."""
    ragged = cv.RaggedTensor.from_row_lengths(np.arange(3), [1, 2])
    ds = Dataset.from_tensors((ragged, np.arange(2))).repeat(2)
    batch = next(iter(ds.ragged_batch(2, row_splits_dtype=np.int32)))
    assert batch[0].row_splits.dtype == np.int64
    assert batch[1].row_splits.dtype == np.int32


def test_ragged_feature_row_splits_dtype() -> None:
    example = cv.io.Example(features=cv.io.Features(feature={
        "v": cv.io.Feature(int64_list=cv.io.Int64List(value=[1, 2, 3])),
        "lengths": cv.io.Feature(int64_list=cv.io.Int64List(value=[2, 1])),
    })).SerializeToString()
    feature = cv.io.RaggedFeature(np.int64, partitions=[
        cv.io.RaggedFeature.RowLengths("lengths")], row_splits_dtype=np.int32)
    parsed = cv.io.parse_example([example, example], {"v": feature})["v"]
    assert [s.dtype for s in parsed.nested_row_splits] == [np.int32, np.int32]
    assert parsed.to_list() == [[[1, 2], [3]], [[1, 2], [3]]]
    single = cv.io.parse_single_example(example, {"v": feature})["v"]
    assert single.row_splits.dtype == np.int32 and single.to_list() == [[1, 2], [3]]
    with pytest.raises(InvalidArgumentError, match="row_splits_dtype"):
        cv.io.parse_example([example], {"v": cv.io.RaggedFeature(np.int64,
                                                                 row_splits_dtype=np.int16)})


def test_ragged_tensor_row_splits_dtype() -> None:
    rt = cv.RaggedTensor.from_row_splits(np.arange(3), np.array([0, 1, 3], np.int32))
    assert rt.row_splits_dtype == np.int32
    assert rt.with_row_splits_dtype(np.int64).row_splits.dtype == np.int64
    assert cv.nest.spec_from_value(rt).row_splits_dtype == np.int32
    with pytest.raises(InvalidArgumentError, match="dtype"):
        rt.with_row_splits_dtype(np.float32)
