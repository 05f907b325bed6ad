"""from_list, Optional and get_next_as_optional. Scenarios ported from TensorFlow's
tensorflow/python/data/experimental/kernel_tests/from_list_test.py and
tensorflow/python/data/kernel_tests/optional_test.py in our own words."""

from __future__ import annotations

import numpy as np
import pytest

from convoy.data import Dataset, TensorSpec, experimental
from convoy.errors import InvalidArgumentError

pytestmark = pytest.mark.timeout(30)


def test_from_list_elements_as_given():
    """testFromListTuple / testFromListDict: each element comes out as given."""
    elements = [(np.array([1, 2]), {"a": b"x"}), (np.array([3, 4]), {"a": b"y"})]
    ds = experimental.from_list(elements)
    got = [(a.tolist(), d) for a, d in ds]
    assert got == [([1, 2], {"a": b"x"}), ([3, 4], {"a": b"y"})]
    assert ds.cardinality() == 2


def test_from_list_ragged_shapes():
    """testFromListRagged... (our words): shapes may differ; the spec says None there."""
    ds = experimental.from_list([np.arange(2), np.arange(5)])
    assert ds.element_spec == TensorSpec((None,), np.int64)
    assert [x.tolist() for x in ds] == [[0, 1], [0, 1, 2, 3, 4]]


def test_from_list_errors():
    """testEmptyList / testInvalidStructure / testInvalidType."""
    with pytest.raises(InvalidArgumentError, match="`elements` should not be empty"):
        experimental.from_list([])
    with pytest.raises(InvalidArgumentError, match="`elements` must be a list"):
        experimental.from_list((1, 2))
    with pytest.raises(InvalidArgumentError, match="structures differ"):
        experimental.from_list([(1, 2), 3])
    with pytest.raises(InvalidArgumentError, match="same dtypes"):
        experimental.from_list([np.int32(1), np.float32(2)])


def test_optional_from_value_and_empty():
    """testFromValue / testEmpty."""
    full = experimental.Optional.from_value((np.int64(1), b"x"))
    assert full.has_value() and full.get_value() == (1, b"x")
    empty = experimental.Optional.empty(TensorSpec((), np.int64))
    assert not empty.has_value()
    assert empty.element_spec == TensorSpec((), np.int64)
    with pytest.raises(InvalidArgumentError, match="does not have a value"):
        empty.get_value()


def test_iterator_get_next_as_optional():
    """testIteratorGetNextAsOptional: values, then empty ones at the end."""
    iterator = iter(Dataset.range(3))
    values = []
    while (optional := iterator.get_next_as_optional()).has_value():
        values.append(optional.get_value())
    assert values == [0, 1, 2]
    assert not experimental.get_next_as_optional(iterator).has_value()
    assert optional.element_spec == TensorSpec((), np.int64)
