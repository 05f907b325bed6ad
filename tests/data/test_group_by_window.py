"""group_by_window and bucket_by_sequence_length.

Scenarios ported from TensorFlow's tensorflow/python/data/kernel_tests/group_by_window_test.py
and tensorflow/python/data/experimental/kernel_tests/bucket_by_sequence_length_test.py, in
our own words; each test names its source.
"""

from __future__ import annotations

import numpy as np
import pytest

from convoy.data import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Dataset, TensorSpec
from convoy.errors import InvalidArgumentError

pytestmark = pytest.mark.timeout(30)


def test_simple_groups_share_a_key():
    """testSimple: batches of 4 squares, each batch of one parity, every element once."""
    values = np.random.default_rng(0).integers(100, size=200).astype(np.int64)
    ds = Dataset.from_tensor_slices(values).map(lambda x: x * x).group_by_window(
        key_func=lambda x: x % 2, reduce_func=lambda _, xs: xs.batch(4), window_size=4)
    batches = list(ds)
    assert sum(len(b) for b in batches) == 200
    for batch in batches:
        assert len(set((batch % 2).tolist())) == 1
    assert [len(b) for b in batches].count(4) >= len(batches) - 2
    assert sorted(np.concatenate(batches).tolist()) == sorted((values * values).tolist())


def test_immediate_output():
    """testImmediateOutput: a group is yielded as soon as it is full."""
    components = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0], dtype=np.int64)
    ds = Dataset.from_tensor_slices(components).repeat(-1).group_by_window(
        key_func=lambda x: x % 3, reduce_func=lambda _, xs: xs.batch(4), window_size=4)
    got = [b.tolist() for b in ds.take(12)]
    assert got[:4] == [[0] * 4, [1] * 4, [2] * 4, [0] * 4]


def test_small_groups_flushed_at_end():
    """testSmallGroups: leftover groups smaller than the window come out at the end."""
    components = np.array([1, 1, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1], dtype=np.int64)
    ds = Dataset.from_tensor_slices(components).group_by_window(
        key_func=lambda x: x, reduce_func=lambda _, xs: xs.batch(4), window_size=4)
    assert [b.tolist() for b in ds] == [[1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1], [1, 1]]


def test_end_flush_in_increasing_key_order():
    """The end-of-input flush of GroupByWindowDatasetOp (tensorflow/core/kernels/data/
    experimental/group_by_window_dataset_op.cc) takes groups from an ordered map: the
    smallest key first, whatever order the keys arrived in."""
    ds = Dataset.from_tensor_slices(np.array([5, 3, 9, 1, 3], dtype=np.int64)).group_by_window(
        key_func=lambda x: x, reduce_func=lambda _, xs: xs.batch(10), window_size=10)
    assert [b.tolist() for b in ds] == [[1], [3, 3], [5], [9]]


def test_window_size_zero():
    """testEmpty: a window size of 0 is an error when the first key arrives."""
    ds = Dataset.range(4).group_by_window(key_func=lambda _: 0,
                                          reduce_func=lambda _, xs: xs, window_size=0)
    with pytest.raises(InvalidArgumentError,
                       match=r"Window size must be greater than zero, but got 0\."):
        list(ds)


def test_window_size_and_func_are_exclusive():
    """group_by_window_op.py's check: exactly one of window_size and window_size_func."""
    with pytest.raises(InvalidArgumentError, match="Either the `window_size` argument or"):
        Dataset.range(4).group_by_window(lambda x: x, lambda _, xs: xs)
    with pytest.raises(InvalidArgumentError, match="Either the `window_size` argument or"):
        Dataset.range(4).group_by_window(lambda x: x, lambda _, xs: xs, window_size=2,
                                         window_size_func=lambda k: 2)


def test_key_func_must_return_a_scalar_integer():
    """testKeyFuncReturnsWrongType (our own words: the key must be a scalar int64)."""
    ds = Dataset.range(4).group_by_window(lambda x: np.array([x]), lambda _, xs: xs, 2)
    with pytest.raises(InvalidArgumentError, match="`key_func` must return a scalar int64"):
        list(ds)


def test_reduce_func_must_return_a_dataset():
    """testReduceFuncError: reduce_func returning something else than a dataset."""
    ds = Dataset.range(4).group_by_window(lambda x: x % 2, lambda _, xs: 3, 2)
    with pytest.raises(InvalidArgumentError, match="reduce_func"):
        list(ds)


def test_window_size_func_per_key():
    """testWindowSizeFunc (group_by_window_test.py): the size depends on the key, asked
    once per key."""
    calls = []

    def size(key):
        calls.append(int(key))
        return key + 1

    ds = Dataset.from_tensor_slices(np.array([0, 1, 1, 2, 2, 2, 0, 1], dtype=np.int64))
    got = [b.tolist() for b in ds.group_by_window(
        lambda x: x, lambda _, xs: xs.batch(5), window_size_func=size)]
    assert got == [[0], [1, 1], [2, 2, 2], [0], [1]]
    assert calls == [0, 1, 2]


def test_consume_window_dataset_more_than_once():
    """testConsumeWindowDatasetMoreThanOnce: the group's dataset can be read twice."""
    def reduce(key, window):
        return Dataset.zip((window.padded_batch(4), window.padded_batch(4)))

    ds = Dataset.range(1, 9).map(lambda x: np.full(x, x)).group_by_window(
        lambda x: np.int64(len(x) % 2), reduce, window_size=4)
    for a, b in ds:
        np.testing.assert_array_equal(a, b)


def test_reduce_func_gets_the_key():
    """testGroupByWindowKey (our own words): the key passed is the group's key."""
    ds = Dataset.range(10).group_by_window(
        lambda x: x % 3, lambda key, xs: xs.map(lambda x: (key, x)), window_size=2)
    for key, x in ds:
        assert key == x % 3


def test_cardinality():
    """testGroupByWindowCardinality (cardinality_test.py): unknown, or infinite when the
    input is."""
    reduce = lambda _, xs: xs  # noqa: E731
    assert Dataset.range(10).group_by_window(lambda x: x, reduce, 2).cardinality() == \
        UNKNOWN_CARDINALITY
    assert Dataset.range(10).repeat().group_by_window(lambda x: x, reduce, 2) \
        .cardinality() == INFINITE_CARDINALITY


# ----- bucket_by_sequence_length -------------------------------------------------------------

def _sequences(lengths):
    return Dataset.from_generator(lambda: (np.full(n, n, np.int64) for n in lengths),
                                  output_signature=TensorSpec((None,), np.int64))


def test_bucket_padded_to_batch_max():
    """testBucketDropReminder/testBucket (bucket_by_sequence_length_test.py): elements go
    to the bucket of their length and are padded to the longest in the batch."""
    ds = _sequences([1, 2, 3, 4, 5, 6, 7, 8]).bucket_by_sequence_length(
        element_length_func=len, bucket_boundaries=[3, 6], bucket_batch_sizes=[2, 2, 2])
    batches = [b.tolist() for b in ds]
    assert batches == [[[1, 0], [2, 2]], [[3, 3, 3, 0], [4, 4, 4, 4]],
                       [[6, 6, 6, 6, 6, 6, 0], [7] * 7], [[5] * 5],
                       [[8] * 8]]


def test_bucket_pad_to_boundary():
    """testPadToBoundary: sizes padded to the bucket's boundary minus one."""
    ds = _sequences([1, 2, 4, 5]).bucket_by_sequence_length(
        len, [3, 6], [2, 2, 2], pad_to_bucket_boundary=True)
    assert [b.shape for b in ds] == [(2, 2), (2, 5)]


def test_bucket_pad_to_boundary_rejects_last_bucket():
    """testPadToBoundaryNoExtraneousPadding's error case: a length past the last boundary."""
    ds = _sequences([9]).bucket_by_sequence_length(len, [3, 6], [2, 2, 2],
                                                   pad_to_bucket_boundary=True)
    with pytest.raises(InvalidArgumentError, match="pad_to_bucket_boundary=True"):
        list(ds)


def test_bucket_no_padding():
    """testNoPadding... (our words): no_padding batches elements as they are."""
    ds = Dataset.range(10).bucket_by_sequence_length(lambda x: x, [5], [2, 3],
                                                     no_padding=True)
    assert [b.tolist() for b in ds] == [[0, 1], [2, 3], [5, 6, 7], [4], [8, 9]]


def test_bucket_drop_remainder():
    """testBucketDropReminder: incomplete batches are dropped."""
    ds = Dataset.range(10).bucket_by_sequence_length(lambda x: x, [5], [2, 3],
                                                     no_padding=True, drop_remainder=True)
    assert [b.tolist() for b in ds] == [[0, 1], [2, 3], [5, 6, 7]]


def test_bucket_sizes_must_match_boundaries():
    """testBucketSizesMismatch (our words): one batch size per bucket."""
    with pytest.raises(InvalidArgumentError, match=r"`len\(bucket_batch_sizes\)` must equal"):
        Dataset.range(3).bucket_by_sequence_length(len, [3], [1])


def test_bucket_tuple_elements_and_padding_values():
    """testTupleElements: the length function gets the unpacked tuple; padding_values."""
    ds = Dataset.range(1, 5).map(lambda n: (np.full(n, n), np.int64(n)))
    ds = ds.bucket_by_sequence_length(lambda seq, n: n, [3], [2, 2],
                                      padding_values=(np.int64(-1), np.int64(0)))
    got = [(a.tolist(), b.tolist()) for a, b in ds]
    assert got == [([[1, -1], [2, 2]], [1, 2]), ([[3, 3, 3, -1], [4, 4, 4, 4]], [3, 4])]
