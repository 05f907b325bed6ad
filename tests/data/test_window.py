"""window: nested datasets of consecutive elements.

Scenarios ported from TensorFlow's tensorflow/python/data/kernel_tests/window_test.py in our
own words; each test names its source.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from convoy.data import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Dataset, DatasetSpec, TensorSpec
from convoy.errors import InvalidArgumentError

pytestmark = pytest.mark.timeout(30)


def windows(ds):
    return [[int(x) for x in w] for w in ds]


def reference(n, size, shift, stride, drop_remainder):
    """What window_dataset_op.cc computes: windows start every `shift` elements, take every
    `stride`-th of the next (size - 1) * stride + 1 elements, partial ones at the end."""
    span = (size - 1) * stride + 1
    out = []
    for start in range(0, n, shift):
        chunk = list(range(start, min(start + span, n)))
        if drop_remainder and len(chunk) < span:
            break
        out.append(chunk[::stride])
    return out


@pytest.mark.parametrize("count, size, shift, stride, drop_remainder", [
    (20, 14, 7, 1, False), (20, 17, 9, 1, False), (20, 14, 14, 1, False), (20, 4, 2, 2, False),
    (20, 7, 3, 3, True), (20, 5, 5, 1, True), (7, 3, 2, 1, False), (7, 3, 2, 1, True),
    (10, 1, 3, 1, False), (5, 10, 1, 1, False), (0, 3, 1, 1, False), (20, 3, 8, 2, False)])
def test_window_dataset(count, size, shift, stride, drop_remainder):
    """testWindowDataset: windows of range(count) for many size/shift/stride/drop_remainder
    combinations, against a reference of the kernel's rule, with its cardinality."""
    ds = Dataset.range(count).window(size, shift, stride, drop_remainder)
    expected = reference(count, size, shift, stride, drop_remainder)
    assert windows(ds) == expected
    assert ds.cardinality() == len(expected)


def test_window_shift_defaults_to_size():
    """The documented example: range(7).window(3) is [0 1 2] [3 4 5] [6]."""
    assert windows(Dataset.range(7).window(3)) == [[0, 1, 2], [3, 4, 5], [6]]


@pytest.mark.parametrize("size, shift, stride, message", [
    (0, 1, 1, "Window size must be greater than zero."),
    (1, 0, 1, "Window shift must be greater than zero."),
    (1, 1, 0, "Window stride must be greater than zero."),
    (-1, 1, 1, "Window size must be greater than zero.")])
def test_window_dataset_invalid_arguments(size, shift, stride, message):
    """testWindowDatasetInvalid."""
    with pytest.raises(InvalidArgumentError, match=message):
        Dataset.range(10).window(size, shift, stride)


def test_window_structure_of_datasets():
    """testWindowDatasetFlatMap / testElementSpec: a tuple element gives a tuple of
    datasets; element_spec is a structure of DatasetSpec."""
    ds = Dataset.from_tensor_slices((np.arange(5), np.arange(5) * 10.0)).window(2)
    assert ds.element_spec == (DatasetSpec(TensorSpec((), np.int64)),
                               DatasetSpec(TensorSpec((), np.float64)))
    pairs = [([int(a) for a in xs], [float(b) for b in ys]) for xs, ys in ds]
    assert pairs == [([0, 1], [0.0, 10.0]), ([2, 3], [20.0, 30.0]), ([4], [40.0])]


def test_window_dict_and_flat_map_batch():
    """testWindowDatasetBatchDense: flattening windows with flat_map + batch."""
    ds = Dataset.from_tensor_slices({"a": np.arange(6), "b": np.arange(6) * 2}).window(
        3, drop_remainder=True).flat_map(
            lambda w: Dataset.zip({"a": w["a"].batch(3), "b": w["b"].batch(3)}))
    got = [{k: v.tolist() for k, v in e.items()} for e in ds]
    assert got == [{"a": [0, 1, 2], "b": [0, 2, 4]}, {"a": [3, 4, 5], "b": [6, 8, 10]}]


def test_window_padded_batch_of_variable_shapes():
    """testWindowDatasetPaddedBatchDense: variable-shape elements padded per window."""
    ds = Dataset.range(1, 6).map(lambda x: np.full(x, x)).window(2).flat_map(
        lambda w: w.padded_batch(2))
    assert [b.tolist() for b in ds] == [[[1, 0], [2, 2]], [[3, 3, 3, 0], [4, 4, 4, 4]],
                                       [[5, 5, 5, 5, 5]]]


def test_nested_window():
    """testNestedWindowDataset... (our words): a window of windows."""
    ds = Dataset.range(8).window(4).flat_map(lambda w: w.window(2).flat_map(
        lambda v: v.batch(2)))
    assert [b.tolist() for b in ds] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_window_of_infinite_and_unknown_inputs():
    """testWindowCardinality (cardinality_test.py): unknown and infinite pass through."""
    assert Dataset.range(5).repeat().window(2).cardinality() == INFINITE_CARDINALITY
    assert Dataset.range(5).filter(lambda x: True).window(2).cardinality() == \
        UNKNOWN_CARDINALITY
    first = next(iter(Dataset.range(5).repeat().window(3)))
    assert [int(x) for x in first] == [0, 1, 2]


def test_window_iterated_twice_each():
    """Each window dataset can be read several times, as TensorFlow's."""
    for w in itertools.islice(Dataset.range(6).window(3), 2):
        assert list(w) == list(w)
