"""scan. Scenarios ported from TensorFlow's tensorflow/python/data/kernel_tests/scan_test.py
in our own words; each test names its source."""

from __future__ import annotations

import numpy as np
import pytest

from convoy.data import Dataset, experimental
from convoy.errors import InvalidArgumentError

pytestmark = pytest.mark.timeout(30)


def test_count():
    """testCount: a counter built from scan over an infinite input."""
    def make(start, step):
        return Dataset.from_tensors(0).repeat().scan(start, lambda state, _: (state + step,
                                                                               state))

    for start, step, take in [(0, 1, 10), (0, 1, 0), (10, 1, 10), (10, 2, 10), (10, -1, 10),
                              (10, -2, 10)]:
        got = [int(x) for x in make(start, step).take(take)]
        assert got == [start + i * step for i in range(take)]


def test_fibonacci():
    """testFibonacci."""
    ds = Dataset.from_tensors(1).repeat().scan((0, 1), lambda s, _: ((s[1], s[0] + s[1]),
                                                                      s[1]))
    assert [int(x) for x in ds.take(8)] == [1, 1, 2, 3, 5, 8, 13, 21]


def test_tensor_array_like_state():
    """testTensorArraySimple (our words): an array state that grows."""
    ds = Dataset.range(4).scan(np.zeros(0, np.int64),
                               lambda s, x: (np.append(s, x), np.append(s, x)))
    assert [x.tolist() for x in ds] == [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3]]


def test_dict_state_and_tuple_elements():
    """testSparseCount/testChangingStateShape (our words): structured state, and a tuple
    element passed whole as the second argument."""
    ds = Dataset.zip((Dataset.range(3), Dataset.range(10, 13))).scan(
        {"sum": 0}, lambda s, xy: ({"sum": s["sum"] + xy[0] + xy[1]}, s["sum"]))
    assert [int(x) for x in ds] == [0, 10, 22]


def test_incorrect_state_structure():
    """testIncorrectStateType / testIncorrectReturnType: the new state must have the
    initial state's structure, and the function must return a pair."""
    with pytest.raises(InvalidArgumentError, match="new state must match the initial state"):
        list(Dataset.range(3).scan((0, 0), lambda s, x: (s[0], x)))
    with pytest.raises(InvalidArgumentError, match="must return a pair"):
        list(Dataset.range(3).scan(0, lambda s, x: s))


def test_cardinality_and_experimental_form():
    """testScanCardinality (our words) and tf.data.experimental.scan."""
    ds = Dataset.range(5).apply(experimental.scan(0, lambda s, x: (s + x, s + x)))
    assert ds.cardinality() == 5
    assert [int(x) for x in ds] == [0, 1, 3, 6, 10]
