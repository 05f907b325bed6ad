"""Batching rows of ``from_tensor_slices`` without a Python step per element (row streams).

Every pipeline here is run twice: as built, where batch and padded_batch gather their rows
from the source's arrays through repeat, take, skip, shuffle and unbatch, and on the
element path (row streams switched off at the source), where every element is made and
stacked one by one. Both must give the same batches: values, dtypes, shapes, types, order.
"""

from __future__ import annotations

import contextlib
import itertools
import pickle
from collections import namedtuple
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convoy import nest
from convoy.data import Dataset
from convoy.data._sources._basic import TensorSlicesOp
from convoy.errors import InvalidArgumentError


@contextlib.contextmanager
def element_path() -> Iterator[None]:
    """Pipelines built and iterated inside take every element one by one."""
    with mock.patch.object(TensorSlicesOp, "row_source", lambda self: None):
        yield


def takes_row_path(ds: Dataset) -> bool:
    node = ds._op.iterator(None, 0)
    try:
        return type(node).__name__ == "_RowBatchNode"
    finally:
        node.close()


def first(ds: Dataset, n: int) -> list[Any]:
    return list(itertools.islice(iter(ds), n))


def assert_same(got: list[Any], expected: list[Any]) -> None:
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert type(a) is type(b), f"element {i}"
        flat_a, flat_b = nest.flatten(a), nest.flatten(b)
        if isinstance(a, dict):
            assert list(a) == list(b)
        assert len(flat_a) == len(flat_b)
        for x, y in zip(flat_a, flat_b):
            assert type(x) is type(y), f"element {i}"
            assert x.dtype == y.dtype and x.shape == y.shape, f"element {i}: {x!r} vs {y!r}"
            np.testing.assert_array_equal(x, y)
            if x.dtype == object:
                assert [type(v) for v in x.ravel()] == [type(v) for v in y.ravel()]


def both_paths(make: Callable[[], Dataset], n: int) -> list[Any]:
    """The first ``n`` elements of ``make()``, checked equal on both paths."""
    fast = make()
    assert takes_row_path(fast)
    got = first(fast, n)
    with element_path():
        slow = make()
        assert not takes_row_path(slow)
        expected = first(slow, n)
    assert_same(got, expected)
    return got


# ----- examples ------------------------------------------------------------------------------
def features(n: int = 20) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.integers(0, 1000, (n, 8)), rng.random(n).astype(np.float32)


@pytest.mark.parametrize("drop", [False, True])
def test_repeat_then_batch_spans_epochs_as_the_element_path_does(drop: bool) -> None:
    batches = both_paths(lambda: Dataset.from_tensor_slices(features()).repeat(3)
                         .batch(7, drop_remainder=drop), 100)
    assert len(batches) == (8 if drop else 9)
    ids = np.concatenate([b[0] for b in batches])
    np.testing.assert_array_equal(ids, np.tile(features()[0], (3, 1))[:len(ids)])


def test_the_bench_pipeline_and_batch_then_repeat_give_the_same_rows() -> None:
    ids, labels = features(16)
    a = first(Dataset.from_tensor_slices((ids, labels)).repeat().batch(4), 8)
    b = first(Dataset.from_tensor_slices((ids, labels)).batch(4).repeat(), 8)
    assert_same(a, b)


def test_structures_keep_their_types() -> None:
    ids, labels = features()
    Pair = namedtuple("Pair", "ids label")
    both_paths(lambda: Dataset.from_tensor_slices({"b": labels, "a": ids}).repeat().batch(6), 9)
    both_paths(lambda: Dataset.from_tensor_slices(Pair(ids, labels)).repeat().batch(6), 9)
    both_paths(lambda: Dataset.from_tensor_slices((ids, {"l": labels})).repeat().batch(6), 9)
    both_paths(lambda: Dataset.from_tensor_slices(labels).shuffle(4, seed=1).batch(6), 9)


def test_text_columns_batch_to_object_arrays_as_elements_do() -> None:
    words = np.array(["a", "bb", "ccc", "d", "ee"])
    raw = np.array([b"x", b"yy", b"z"])
    batches = both_paths(lambda: Dataset.from_tensor_slices((words, words.reshape(5, 1)))
                         .repeat().batch(3), 6)
    # strings are elements as bytes in object arrays (as TensorFlow's .numpy()), whatever the rank
    assert batches[0][0].dtype == object and batches[0][1].dtype == object
    assert batches[0][1][2, 0] == b"ccc"
    both_paths(lambda: Dataset.from_tensor_slices(raw).repeat().shuffle(2, seed=3).batch(2), 6)


def test_object_columns_of_other_values_take_the_element_path() -> None:
    objects = np.array([b"a", "bc", b"d"], dtype=object)
    ds = Dataset.from_tensor_slices(objects).repeat().batch(2)
    assert not takes_row_path(ds)


def test_object_columns_of_bytes_take_the_row_path() -> None:
    objects = np.array([b"a", b"bc", b"d"], dtype=object)
    both_paths(lambda: Dataset.from_tensor_slices(objects).repeat().batch(2), 4)


def test_columns_of_foreign_byte_order_take_the_element_path() -> None:
    swapped = np.arange(6, dtype=">i4")
    ds = Dataset.from_tensor_slices(swapped).repeat().batch(4)
    assert not takes_row_path(ds)
    assert first(ds, 1)[0].dtype == np.dtype("int32")


def test_map_between_source_and_batch_takes_the_element_path() -> None:
    source = Dataset.from_tensor_slices(features())
    assert not takes_row_path(source.repeat().map(lambda i, label: (i, label)).batch(4))
    assert not takes_row_path(source.map(lambda i, label: (i, label)).repeat().batch(4))


def test_padded_batch_pads_to_given_shapes_and_values() -> None:
    ids, labels = features()
    batches = both_paths(lambda: Dataset.from_tensor_slices((ids, labels)).repeat()
                         .padded_batch(6, padded_shapes=([10], []), padding_values=(-1, 0.5)),
                         5)
    assert batches[0][0].shape == (6, 10) and (batches[0][0][:, 8:] == -1).all()
    both_paths(lambda: Dataset.from_tensor_slices(ids).repeat(2).padded_batch(7), 9)
    both_paths(lambda: Dataset.from_tensor_slices(ids.reshape(20, 2, 4)).repeat()
               .padded_batch(3, padded_shapes=[-1, 6], drop_remainder=True), 9)


@pytest.mark.parametrize("shapes", [([4], []), ([9, 1], [])])
def test_padded_batch_refuses_what_the_element_path_refuses(shapes: Any) -> None:
    ids, labels = features()
    messages = []
    for path in (contextlib.nullcontext, element_path):
        with path(), pytest.raises(InvalidArgumentError) as error:
            first(Dataset.from_tensor_slices((ids, labels)).repeat()
                  .padded_batch(3, padded_shapes=shapes), 1)
        messages.append(str(error.value))
    assert messages[0] == messages[1]


def test_unbatch_then_batch_rebatches_rows() -> None:
    ids, labels = features()
    grid = ids.reshape(20, 2, 4)
    batches = both_paths(lambda: Dataset.from_tensor_slices((grid, ids.reshape(20, 2, 4)))
                         .repeat().unbatch().batch(3), 30)
    np.testing.assert_array_equal(batches[0][0], ids.reshape(40, 4)[:3])
    both_paths(lambda: Dataset.from_tensor_slices(grid).unbatch().shuffle(5, seed=2)
               .repeat(2).batch(7), 30)


def test_unbatch_of_components_of_different_lengths_fails_on_both_paths() -> None:
    ids, labels = features()
    ds = Dataset.from_tensor_slices((ids.reshape(20, 2, 4), ids.reshape(20, 4, 2))).unbatch()
    assert not takes_row_path(ds.batch(2))
    with pytest.raises(InvalidArgumentError, match="different batch sizes"):
        first(ds.batch(2), 1)


def test_empty_sources_repeated_forever_are_empty() -> None:
    empty = np.zeros((0, 3), np.int64)
    assert both_paths(lambda: Dataset.from_tensor_slices(empty).repeat().batch(2), 5) == []
    assert both_paths(lambda: Dataset.from_tensor_slices(features()).take(0).repeat()
                      .shuffle(3, seed=1).batch(2), 5) == []


def test_batches_are_new_arrays() -> None:
    ids, labels = features()
    batch = first(Dataset.from_tensor_slices((ids, labels)).repeat().batch(4), 1)[0]
    batch[0][:] = -1
    assert (ids >= 0).all()


# ----- properties ----------------------------------------------------------------------------
@st.composite
def pipelines(draw: st.DrawFn) -> tuple[Callable[[], Dataset], int]:
    """A random pipeline of row-stream ops from random arrays to a batch, and how many of
    its elements to read."""
    rows = draw(st.integers(0, 24))
    width = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    ids = rng.integers(-50, 50, (rows, width, 2))
    labels = rng.random((rows, width)).astype(np.float32)
    flags = (rng.random((rows, width)) < 0.5)
    structure = draw(st.sampled_from(["tuple", "single", "dict"]))
    tensors: Any = {"tuple": (ids, labels), "single": labels,
                    "dict": {"ids": ids, "flag": flags}}[structure]
    steps: list[Any] = draw(st.lists(st.one_of(
        st.tuples(st.just("repeat"), st.sampled_from([None, 0, 1, 2, 3])),
        st.tuples(st.just("shuffle"), st.integers(1, 30), st.integers(0, 99),
                  st.booleans()),
        st.tuples(st.just("take"), st.integers(-1, 40)),
        st.tuples(st.just("skip"), st.integers(0, 40)),
        st.tuples(st.just("unbatch")),
    ), max_size=5))
    size = draw(st.integers(1, 12))
    drop = draw(st.booleans())
    padded = draw(st.booleans())

    def make() -> Dataset:
        ds = Dataset.from_tensor_slices(tensors)
        unbatched = False
        for step in steps:
            if step[0] == "repeat":
                ds = ds.repeat(step[1])
            elif step[0] == "shuffle":
                ds = ds.shuffle(step[1], seed=step[2], reshuffle_each_iteration=step[3])
            elif step[0] == "take":
                ds = ds.take(step[1])
            elif step[0] == "skip":
                ds = ds.skip(step[1])
            elif not unbatched:
                ds, unbatched = ds.unbatch(), True
        if padded:  # one more in the last dimension, or each batch's longest
            shapes = None if unbatched or structure == "dict" else nest.map_structure(
                lambda a: [-1] * (a.ndim - 2) + [a.shape[-1] + 1], tensors)
            return ds.padded_batch(size, padded_shapes=shapes, drop_remainder=drop)
        return ds.batch(size, drop_remainder=drop)

    return make, draw(st.integers(0, 25))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pipelines())
def test_row_path_gives_the_element_paths_batches(pipeline: tuple[Any, int]) -> None:
    make, n = pipeline
    both_paths(make, n)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pipelines(), st.integers(0, 25))
def test_a_checkpoint_restores_the_same_continuation(pipeline: tuple[Any, int],
                                                     at: int) -> None:
    make, n = pipeline
    expected = both_paths(make, at + n)
    ds = make()
    iterator = iter(ds)
    head = list(itertools.islice(iterator, at))
    state = pickle.loads(pickle.dumps(iterator.state_dict()))
    restored = iter(make())
    restored.load_state_dict(state)
    assert_same(head + list(itertools.islice(restored, n)), expected[:at + n])
    assert_same(list(itertools.islice(iterator, n)), expected[at:at + n])
