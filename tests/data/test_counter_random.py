"""counter and random, the infinite sources. Scenarios ported from TensorFlow's
tensorflow/python/data/kernel_tests/counter_test.py and random_test.py in our own words."""

from __future__ import annotations

import itertools

import cloudpickle
import numpy as np
import pytest

from convoy.data import INFINITE_CARDINALITY, Dataset

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("start, step, dtype", [(3, 4, np.int64), (0, -1, np.int32),
                                                (10, 2, np.float32)])
def test_counter(start, step, dtype):
    """testCounter: start, step and dtype."""
    ds = Dataset.counter(start, step, dtype)
    assert ds.cardinality() == INFINITE_CARDINALITY
    got = list(ds.take(5))
    assert [float(x) for x in got] == [start + i * step for i in range(5)]
    assert all(x.dtype == np.dtype(dtype) for x in got)


def _head(ds, n=10):
    return [int(x) for x in itertools.islice(ds, n)]


def test_random_same_seed_same_sequence():
    """testDeterminism: a seed fixes the sequence, another seed gives another."""
    assert _head(Dataset.random(seed=42)) == _head(Dataset.random(seed=42))
    assert _head(Dataset.random(seed=42)) != _head(Dataset.random(seed=43))
    values = _head(Dataset.random(seed=42), 1000)
    assert all(0 <= v < 2 ** 32 for v in values)
    assert len(set(values)) > 990
    assert next(iter(Dataset.random(seed=1))).dtype == np.int64


@pytest.mark.parametrize("rerandomize", [None, False, True])
def test_rerandomize_each_iteration(rerandomize):
    """testRerandomizeEachIteration: repeated epochs differ only when asked to."""
    epochs = np.reshape(_head(Dataset.random(seed=7, rerandomize_each_iteration=rerandomize)
                              .take(5).repeat(3), 15), (3, 5)).tolist()
    if rerandomize:
        assert epochs[0] != epochs[1] != epochs[2]
    else:
        assert epochs[0] == epochs[1] == epochs[2]


def test_random_without_seed():
    """Our words: without a seed each dataset draws its own; a pickled copy of a seeded one
    gives the same sequence (so every data service worker does)."""
    assert _head(Dataset.random()) != _head(Dataset.random())
    ds = Dataset.random(seed=5)
    assert _head(cloudpickle.loads(cloudpickle.dumps(ds))) == _head(ds)


def test_random_uniformity():
    """testRandomDataset... (our words): values spread evenly over [0, 2**32)."""
    values = np.array(_head(Dataset.random(seed=3), 20000))
    counts = np.bincount(values // 2 ** 29, minlength=8)
    assert counts.min() > 2200 and counts.max() < 2800
