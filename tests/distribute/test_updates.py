"""The optimizer arithmetic run on parameter servers, without a network: sparse rows with and
without repeats sum like ``np.add.at``."""

from __future__ import annotations

import numpy as np
import pytest

from convoy._values.slices import IndexedSlices, combine_rows, put_rows, take_rows
from convoy.distribute._operations import Apply
from convoy.distribute._store import gather_rows
from convoy.distribute._updates import _unique_rows, add_rows, apply_update
from convoy.errors import InvalidArgumentError


@pytest.mark.parametrize("count, rows", [(0, 10), (1, 10), (2, 1), (1024, 50_000), (1024, 100),
                                         (300, 300), (65, 2), (5, 5)])
def test_unique_rows_sum_repeats_like_add_at(count, rows):
    rng = np.random.default_rng(count + rows)
    variable = np.zeros((rows, 3), np.float32)
    indices = rng.integers(0, rows, count)
    values = rng.normal(size=(count, 3)).astype(np.float32)
    unique, summed = _unique_rows(variable, IndexedSlices(values, indices))
    assert len(set(unique.tolist())) == unique.size
    expected = np.zeros_like(variable)
    np.add.at(expected, indices, values)
    got = np.zeros_like(variable)
    got[unique] = summed
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


def test_sparse_sgd_with_repeated_rows_matches_dense():
    variable = np.ones((6, 2))
    gradient = IndexedSlices(np.arange(8.0).reshape(4, 2), np.array([5, 1, 5, 5]))
    dense = np.zeros_like(variable)
    np.add.at(dense, gradient.indices, gradient.values)
    expected = variable - 0.5 * dense
    apply_update({"name": "SGD", "learning_rate": 0.5}, variable, gradient, None)
    np.testing.assert_allclose(variable, expected)



@pytest.mark.parametrize("indices", [[3, 0, 2], [3, 0, 3]])  # without repeats, and with
def test_sparse_sgd_leaves_the_callers_gradient_unchanged(indices):
    # a store in this process gets the caller's arrays themselves
    values = np.arange(6.0).reshape(3, 2)
    variable = np.zeros((4, 2))
    apply_update({"name": "SGD", "learning_rate": 0.5}, variable,
                 IndexedSlices(values, np.array(indices)), None)
    np.testing.assert_array_equal(values, np.arange(6.0).reshape(3, 2))
    expected = np.zeros((4, 2))
    np.add.at(expected, indices, -0.5 * values)
    np.testing.assert_array_equal(variable, expected)

@pytest.mark.parametrize("config, problem", [
    ({"name": "Nope"}, "unknown optimizer"),
    ({"name": "SGD"}, r"numbers for \['learning_rate'\]"),
    ({"name": "Adam", "learning_rate": 0.1, "beta_1": "x", "beta_2": 0.9, "epsilon": 1.0},
     r"numbers for \['beta_1'\]"),
    ({"name": "SGD", "learning_rate": True}, "learning_rate"),
    ({"name": "SGD", "learning_rate": 0.1, "weight_decay": "0.1"}, r"\['weight_decay'\]"),
    ({"name": "RMSprop", "learning_rate": 0.1, "rho": 0.9, "epsilon": 1e-7},
     r"\['momentum'\]"),
    ({"name": "SGD", "learning_rate": lambda step: float("nan")}, "gave nan at step 0"),
    ({"name": "Ftrl", "learning_rate": lambda step: 0.0, "learning_rate_power": -0.5,
      "initial_accumulator_value": 0.1, "l1_regularization_strength": 0.0,
      "l2_regularization_strength": 0.0, "l2_shrinkage_regularization_strength": 0.0,
      "beta": 0.0}, "Ftrl needs a positive learning rate, got 0.0 at step 0"),
])
def test_bad_optimizer_configs(config, problem):
    slots = {}

    def slot(name, like, initial):
        return slots.setdefault(name, np.full_like(like, initial))

    with pytest.raises(InvalidArgumentError, match=problem):
        apply_update(config, np.zeros(2), np.zeros(2), slot)


def test_a_schedule_reads_the_variables_own_count_of_updates():
    # the count lives in the slot "iterations", saved with the other slots
    from convoy.train.schedules import PiecewiseConstantDecay
    config = {"name": "SGD", "learning_rate": PiecewiseConstantDecay([0, 1], [1.0, 0.5, 0.25])}
    variable, slots = np.zeros(2), {}

    def slot(name, like, initial):
        return slots.setdefault(name, np.full_like(like, initial))

    for _ in range(4):
        apply_update(config, variable, np.ones(2), slot)
    np.testing.assert_allclose(variable, [-2.0, -2.0])  # 1 + 0.5 + 0.25 + 0.25
    assert int(slots["iterations"]) == 4


def test_rows_out_of_range():
    with pytest.raises(InvalidArgumentError, match=r"\[0, 4\)"):
        _unique_rows(np.zeros((4, 2)), IndexedSlices(np.zeros((1, 2)), np.array([4])))


@pytest.mark.parametrize("shape, dtype, order", [
    ((10,), np.float32, "C"), ((10, 4), np.float32, "C"), ((10, 2, 3), np.int64, "C"),
    ((10, 4), np.float64, "F"), ((10, 0), np.float32, "C"), ((10, 3), np.bool_, "C"),
])
@pytest.mark.parametrize("rows, index_dtype", [
    ([], np.int64), ([3], np.int64), (3, np.int64), ([9, 0, 4], np.int64), ([2, 5, 2], np.int32),
    ([9, 0, 4], np.uint64), ([[1, 2], [3, 1]], np.int64),
])
def test_take_gather_and_put_rows_are_fancy_indexing(shape, dtype, order, rows, index_dtype):
    rng = np.random.default_rng(0)
    array = np.asarray(rng.integers(0, 100, shape), dtype=dtype, order=order)
    rows = np.array(rows, dtype=index_dtype)
    np.testing.assert_array_equal(take_rows(array, rows), array[rows])
    np.testing.assert_array_equal(gather_rows(array, rows), array[rows])  # the store's
    values = np.asarray(rng.integers(0, 100, (*rows.shape, *shape[1:])), dtype=dtype)
    expected = array.copy()
    expected[rows.astype(np.intp)] = values  # a repeated row keeps its last value
    put_rows(array, rows, values)
    np.testing.assert_array_equal(array, expected)


@pytest.mark.parametrize("shape, dtype, order", [
    ((10,), np.float32, "C"), ((10, 4), np.float32, "C"), ((10, 2, 3), np.int64, "C"),
    ((10, 4), np.float64, "F"), ((10, 0), np.float32, "C"),
])
@pytest.mark.parametrize("rows", [[], [3], 3, [9, 0, 4], [2, 5, 2, 2, 7, 5], [[1, 2], [3, 1]]])
@pytest.mark.parametrize("combine", [np.add, np.subtract, np.multiply, np.minimum, np.maximum,
                                     np.divide])
def test_combine_rows_is_ufunc_at(shape, dtype, order, rows, combine):
    # the same numbers to the bit: a repeated row takes its values one by one, in order
    if combine is np.divide and dtype is np.int64:
        pytest.skip("integer division is the store's own (TensorFlow's truncation)")
    rng = np.random.default_rng(1)
    array = np.asarray(rng.normal(1, 3, shape), dtype=dtype, order=order)
    rows = np.array(rows, np.int64)
    values = np.asarray(rng.normal(1, 3, (*rows.shape, *shape[1:])), dtype=dtype)
    expected = array.copy()
    combine.at(expected, rows, values)
    combine_rows(combine, array, rows, values)
    np.testing.assert_array_equal(array, expected)


@pytest.mark.parametrize("shape, dtype", [((10,), np.float32), ((10, 4), np.float32),
                                          ((10, 2, 3), np.float64), ((10, 0), np.float32)])
@pytest.mark.parametrize("rows", [[], [3], [9, 0, 4], [2, 5, 2, 2, 7, 5], [[1, 2], [3, 1]]])
@pytest.mark.parametrize("scale", [1.0, -1.0, -0.1])
def test_add_rows_is_add_at_of_the_scaled_rows(shape, dtype, rows, scale):
    # the same numbers to the bit: each value is scaled, then added, one by one in order
    rng = np.random.default_rng(2)
    array = np.asarray(rng.normal(1, 3, shape), dtype=dtype)
    rows = np.array(rows, np.int64)
    values = np.asarray(rng.normal(1, 3, (*rows.shape, *shape[1:])), dtype=dtype)
    expected = array.copy()
    np.add.at(expected, rows, values * dtype(scale))
    assert add_rows(array, rows, values, scale)
    np.testing.assert_array_equal(array, expected)


def test_add_rows_declines_what_it_cannot_add_and_refuses_rows_out_of_range():
    rows, values = np.array([1]), np.ones((1, 2))
    for target in (np.zeros((3, 2), np.int64), np.zeros((2, 3)).T):  # numpy adds these
        before = target.copy()
        assert not add_rows(target, rows, values, 1.0)
        np.testing.assert_array_equal(target, before)
    assert not add_rows(np.zeros((3, 2)), np.array([1.0]), values, 1.0)  # float row numbers
    target = np.zeros((3, 2))
    with pytest.raises(IndexError, match=r"row 3 is out of range \[0, 3\)"):
        add_rows(target, np.array([0, 3]), np.ones((2, 2)), 1.0)
    np.testing.assert_array_equal(target, 0)  # all rows are checked before any is added
    with pytest.raises(InvalidArgumentError, match=r"\[0, 3\), got -1 to 1"):
        apply_update({"name": "SGD", "learning_rate": 1.0}, target,
                     IndexedSlices(np.ones((2, 2)), np.array([1, -1])), None)
    np.testing.assert_array_equal(target, 0)


def test_put_rows_on_a_single_row_with_unusual_strides():
    array = np.zeros((1, 6), np.float32)[:, ::1]
    weird = np.lib.stride_tricks.as_strided(array, shape=(1, 6), strides=(4, 4))  # C-contiguous
    put_rows(weird, np.array([0]), np.ones((1, 6)))
    np.testing.assert_array_equal(array, np.ones((1, 6)))


def test_sparse_update_with_unsigned_ids():
    variable = np.zeros((4, 2))
    gradient = IndexedSlices(np.ones((3, 2)), np.array([3, 0, 3], np.uint64))
    apply_update({"name": "SGD", "learning_rate": 1.0}, variable, gradient, None)
    np.testing.assert_array_equal(variable, [[-1, -1], [0, 0], [0, 0], [-2, -2]])


def test_apply_gradients_sends_arrays_of_its_own(monkeypatch):
    # In a scheduled function the updates leave after apply_gradients returns: the caller
    # may reuse its gradient buffers at once (as zero_grad does).
    import convoy as cv
    from convoy.train import optimizers

    sent = []
    monkeypatch.setattr(optimizers, "send_updates", sent.extend)
    dense_variable = cv.Variable(np.zeros(3, np.float32))
    table = cv.Variable(np.zeros((4, 2), np.float32))
    sharded = cv.distribute.ShardedVariable([cv.Variable(np.zeros((2, 2), np.float32)),
                                             cv.Variable(np.zeros((2, 2), np.float32))])
    dense, rows, ids = np.ones(3, np.float32), np.ones((2, 2), np.float32), np.array([0, 3])
    whole = np.ones((4, 2), np.float32)
    cv.optimizers.SGD(0.1).apply_gradients([
        (dense, dense_variable), (cv.IndexedSlices(rows, ids), table),
        (cv.IndexedSlices(rows, ids), sharded), (whole, sharded)])
    arrays = [array for _, operations in sent for operation in operations
              if isinstance(operation, Apply) for _, gradient in operation.updates
              for array in (gradient if isinstance(gradient, IndexedSlices) else [gradient])
              if isinstance(array, np.ndarray)]
    assert len(arrays) == 1 + 2 + 4 + 2
    for caller_array in (dense, rows, ids, whole):
        assert not any(np.shares_memory(caller_array, a) for a in arrays)
