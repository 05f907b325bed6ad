"""rejection_resample. Scenarios ported from TensorFlow's tensorflow/python/data/
kernel_tests/rejection_resample_test.py in our own words: TensorFlow's distributions, not
its values."""

from __future__ import annotations

import numpy as np
import pytest

from convoy.data import Dataset, experimental

pytestmark = pytest.mark.timeout(60)


def _classes(n, initial, seed=0):
    return np.random.default_rng(seed).choice(len(initial), size=n, p=initial).astype(np.int64)


@pytest.mark.parametrize("initial_known", [False, True])
def test_distribution(initial_known):
    """testDistribution: the resampled classes follow the target distribution."""
    init_dist = [0.25, 0.25, 0.25, 0.25]
    target_dist = [0.0, 0.0, 0.0, 1.0]
    classes = _classes(1000, init_dist)
    ds = Dataset.from_tensor_slices(classes).shuffle(200, seed=21).map(
        lambda c: (c, f"hi {c}".encode()))
    ds = ds.rejection_resample(class_func=lambda c, _: c, target_dist=target_dist,
                               initial_dist=init_dist if initial_known else None, seed=27)
    pairs = list(ds.take(100))
    assert all(int(c) == 3 for c, _ in pairs)
    assert all(element[1] == f"hi {element[0]}".encode() for _, element in pairs)


@pytest.mark.parametrize("only_initial_dist", [True, False])
def test_edge_cases_sample_from_initial_data_only(only_initial_dist):
    """testEdgeCasesSampleFromInitialDataset: when the target is the initial distribution
    (or a mix), every element comes out once with its class."""
    init_dist = [0.5, 0.5]
    target_dist = [0.5, 0.5] if only_initial_dist else [0.0, 1.0]
    ds = Dataset.range(8).rejection_resample(lambda x: x % 2, target_dist, init_dist, seed=3)
    got = [(int(c), int(x)) for c, x in ds]
    assert all(c == x % 2 for c, x in got)
    if only_initial_dist:
        assert [x for _, x in got] == list(range(8))
    else:
        assert {c for c, _ in got} == {1}


def test_converges_from_estimate():
    """testRandomClasses: with the initial distribution estimated on the fly, the output
    still approaches the target."""
    classes = _classes(20000, [0.9, 0.1], seed=1)
    ds = Dataset.from_tensor_slices(classes).rejection_resample(
        lambda c: c, [0.5, 0.5], seed=11)
    counts = np.bincount([int(c) for c, _ in ds.take(2000)], minlength=2) / 2000
    assert abs(counts[1] - 0.5) < 0.06


def test_reproducible_for_a_seed():
    """Our words: the same seed gives the same output; the experimental form matches."""
    def make(seed):
        return Dataset.range(300).apply(experimental.rejection_resample(
            lambda x: x % 3, [0.6, 0.2, 0.2], seed=seed))
    first = [(int(c), int(x)) for c, x in make(5)]
    assert first == [(int(c), int(x)) for c, x in make(5)]
    assert first != [(int(c), int(x)) for c, x in make(6)]
