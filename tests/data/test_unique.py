"""unique. Scenarios ported from TensorFlow's tensorflow/python/data/kernel_tests/
unique_test.py in our own words; each test names its source."""

from __future__ import annotations

import numpy as np
import pytest

from convoy.data import Dataset, experimental
from convoy.errors import InvalidArgumentError

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_simple_int(dtype):
    """testSimpleInt: first appearances, in order."""
    cases = [([], []), ([1], [1]), ([1, 1, 1, 1, 1, 1, 1], [1]), ([1, 1, 1, 1, 0], [1, 0]),
             ([1, 2, 3, 4], [1, 2, 3, 4]), ([1, 2, 4, 3, 2, 1, 2, 3, 4], [1, 2, 4, 3]),
             ([[1], [1, 1], [1, 1, 1]], [[1], [1, 1], [1, 1, 1]]),
             ([[1, 1], [1, 1], [2, 2], [3, 3], [1, 1]], [[1, 1], [2, 2], [3, 3]])]
    for values, expected in cases:
        ds = Dataset.from_generator(lambda v=values: iter(v), output_types=dtype,
                                    output_shapes=[None]) if values and isinstance(
                                        values[0], list) else Dataset.from_tensor_slices(
                                            np.array(values, dtype=dtype))
        got = [np.asarray(x).tolist() for x in ds.unique()]
        assert got == expected


def test_simple_string():
    """testSimpleString."""
    values = np.array([b"hello", b"world", b"hello", b"!", b"world"], dtype=object)
    assert list(Dataset.from_tensor_slices(values).unique()) == [b"hello", b"world", b"!"]


def test_unsupported_types():
    """testUnsupportedTypes: floats and booleans are refused."""
    for values in (np.array([1.0]), np.array([True])):
        with pytest.raises(InvalidArgumentError, match="does not support type"):
            Dataset.from_tensor_slices(values).unique()


def test_several_components_refused():
    """testUnsupportedComponents (our words): one component only."""
    with pytest.raises(InvalidArgumentError, match="more than one component"):
        Dataset.from_tensor_slices((np.arange(3), np.arange(3))).unique()


def test_experimental_form():
    """tf.data.experimental.unique."""
    ds = Dataset.from_tensor_slices(np.array([3, 3, 1])).apply(experimental.unique())
    assert [int(x) for x in ds] == [3, 1]
