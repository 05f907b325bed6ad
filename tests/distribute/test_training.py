"""Parameter-server training end to end on real ``convoy server`` processes: variables and
sharded variables on the ps, optimizers against a numpy reference, the coordinator's
scheduling and error protocol, worker and ps failures, checkpoints, PyTorch steps, bad input.

Tests that do not kill processes share one module cluster (2 ps, 2 workers); the fault
tolerance tests start clusters of their own.
"""

from __future__ import annotations

import json
import sys
import time

import cloudpickle
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

import convoy as cv
from convoy.distribute._worker_context import worker_context
from convoy.distribute.coordinator import DEFAULT_PIPELINING
from convoy.distribute.partitioners import FixedShardsPartitioner
from convoy.errors import (
    CancelledError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from convoy.testing import TrainingCluster

# Functions defined here run on the workers, which cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster():
    with TrainingCluster(num_workers=2, num_ps=2) as training_cluster:
        yield training_cluster


@pytest.fixture
def make():
    """``make(cluster, partitioner=None)`` -> (strategy, coordinator), shut down afterwards."""
    coordinators = []

    def build(cluster, partitioner=None):
        strategy = cv.distribute.ParameterServerStrategy(cluster.resolver(), partitioner)
        coordinator = cv.distribute.ClusterCoordinator(strategy)
        coordinators.append(coordinator)
        return strategy, coordinator

    yield build
    for coordinator in coordinators:
        coordinator.shutdown()


def ps_device(task):
    return f"/job:ps/replica:0/task:{task}/device:CPU:0"


def task_index():
    """Inside a scheduled function: the index of the worker running it."""
    return worker_context().task_index


def wait_until(condition, timeout_s=30.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


# ===== (a) variables ===========================================================================

@pytest.mark.timeout(120)
def test_round_robin_placement_over_two_ps(cluster, make):
    strategy, _ = make(cluster)
    with strategy.scope():
        variables = [cv.Variable(float(i), name=f"v{i}") for i in range(5)]
        default_named = [cv.Variable(0), cv.Variable(1)]
    assert [v.device for v in variables] == [ps_device(i % 2) for i in range(5)]
    assert [float(v.numpy()) for v in variables] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert [v.name for v in default_named] == ["Variable", "Variable_1"]
    assert [v.device for v in default_named] == [ps_device(1), ps_device(0)]


def apply_and_compare(variable, reference):
    """Every read and update on ``variable`` and on a numpy copy; they stay equal."""
    rng = np.random.default_rng(1)
    rows, rest = reference.shape[0], reference.shape[1:]

    def check():
        np.testing.assert_array_equal(variable.read_value(), reference)
        np.testing.assert_array_equal(variable.numpy(), reference)
        np.testing.assert_array_equal(np.asarray(variable), reference)
        assert np.asarray(variable).dtype == reference.dtype
        np.testing.assert_array_equal(np.asarray(variable, dtype=np.float64),
                                      reference.astype(np.float64))

    def random(*shape):
        return rng.integers(-5, 5, shape).astype(reference.dtype)

    check()
    new = random(rows, *rest)
    variable.assign(new)
    reference[...] = new
    check()
    delta = random(rows, *rest)
    variable.assign_add(delta)
    reference += delta
    check()
    delta = random(rows, *rest)
    variable.assign_sub(delta)
    reference -= delta
    check()
    ids = np.array([0, rows - 1, 3, 0, rows // 2, rows - 1, 0])  # repeats accumulate
    values = random(ids.size, *rest)
    variable.scatter_add(cv.IndexedSlices(values, ids))
    np.add.at(reference, ids, values)
    check()
    variable.scatter_sub(cv.IndexedSlices(values, ids))
    np.subtract.at(reference, ids, values)
    check()
    ids2d = np.array([[1, 2], [rows - 2, 1]])
    values2d = random(2, 2, *rest)
    variable.scatter_add(cv.IndexedSlices(values2d, ids2d))
    np.add.at(reference, ids2d, values2d)
    check()
    ids = np.array([rows - 1, 0, 4])
    values = random(ids.size, *rest)
    variable.scatter_update(cv.IndexedSlices(values, ids))
    reference[ids] = values
    check()
    for lookup in ([0], [rows - 1, 0, 0, 5], [[2, 3], [rows - 1, 0]], np.arange(rows)):
        np.testing.assert_array_equal(variable.sparse_read(lookup),
                                      reference[np.asarray(lookup)])
        np.testing.assert_array_equal(cv.nn.embedding_lookup(variable, lookup),
                                      reference[np.asarray(lookup)])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_every_operation_on_a_plain_variable(cluster, make, dtype):
    strategy, _ = make(cluster)
    initial = np.arange(13 * 3).reshape(13, 3).astype(dtype)
    with strategy.scope():
        v = cv.Variable(initial, name="plain")
    assert isinstance(v, cv.Variable) and v.shape == (13, 3) and v.dtype == dtype
    apply_and_compare(v, initial.copy())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_every_operation_on_a_sharded_variable(cluster, make, dtype):
    strategy, _ = make(cluster, FixedShardsPartitioner(5))
    initial = np.arange(13 * 3).reshape(13, 3).astype(dtype)
    with strategy.scope():
        v = cv.Variable(initial, name="sharded")
    assert isinstance(v, cv.distribute.ShardedVariable)
    assert v.shape == (13, 3) and v.dtype == dtype
    apply_and_compare(v, initial.copy())


@pytest.mark.timeout(120)
def test_sharded_layout_13_rows_over_5_shards_on_2_ps(cluster, make):
    strategy, _ = make(cluster, FixedShardsPartitioner(5))
    with strategy.scope():
        first = cv.Variable(np.arange(13), name="ids")
        second = cv.Variable(np.zeros((4, 2)), name="next")  # round-robin continues
    assert [s.shape for s in first.variables] == [(3,), (3,), (3,), (2,), (2,)]
    assert [s.numpy().tolist() for s in first.variables] == [
        [0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10], [11, 12]]
    assert [s.device for s in first.variables] == [ps_device(i % 2) for i in range(5)]
    assert [s.name for s in first.variables] == [f"ids/part_{i}" for i in range(5)]
    assert first.name == "ids"
    # 4 rows into at most 5 shards: one row each, placed after the 5 shards above
    assert [s.shape for s in second.variables] == [(1, 2)] * 4
    assert [s.device for s in second.variables] == [ps_device(1), ps_device(0),
                                                     ps_device(1), ps_device(0)]


@pytest.mark.timeout(120)
def test_partition_aware_initial_values_are_called_per_shard(cluster, make):
    strategy, _ = make(cluster, FixedShardsPartitioner(5))
    full = np.arange(13 * 2, dtype=np.float32).reshape(13, 2)
    calls = []

    def initializer(shard_info):
        calls.append(shard_info)
        start = shard_info.offset[0]
        return full[start:start + shard_info.shape[0]]

    whole_calls = []

    def whole():  # ignores partitioning: called per shard, the full value is sliced
        whole_calls.append(1)
        return full

    with strategy.scope():
        v = cv.Variable(initializer, shape=(13, 2), dtype=np.float32, name="lazy")
        w = cv.Variable(whole, shape=[13, 2], dtype="float32", name="whole")
    assert [(c.shape, c.offset) for c in calls] == [
        ((3, 2), (0, 0)), ((3, 2), (3, 0)), ((3, 2), (6, 0)), ((2, 2), (9, 0)),
        ((2, 2), (11, 0))]
    assert len(whole_calls) == 5
    for variable in (v, w):
        assert [s.shape for s in variable.variables] == [(3, 2)] * 3 + [(2, 2)] * 2
        np.testing.assert_array_equal(variable.numpy(), full)


@pytest.mark.timeout(120)
def test_embedding_lookup_with_2d_ids(cluster, make):
    strategy, _ = make(cluster, FixedShardsPartitioner(3))
    table = np.random.default_rng(0).standard_normal((11, 4)).astype(np.float32)
    with strategy.scope():
        embedding = cv.Variable(table, name="embedding")
    ids = np.array([[0, 10, 4], [4, 4, 7], [10, 0, 3]])
    np.testing.assert_array_equal(cv.nn.embedding_lookup(embedding, ids), table[ids])
    # the shards as a list of variables give the same rows
    np.testing.assert_array_equal(cv.nn.embedding_lookup(embedding.variables, ids),
                                  table[ids])
    assert cv.nn.embedding_lookup(embedding, np.zeros((0, 2), np.int64)).shape == (0, 2, 4)


@pytest.mark.timeout(120)
def test_variables_in_scheduled_functions_are_the_ps_variables(cluster, make):
    strategy, coordinator = make(cluster, FixedShardsPartitioner(2))
    with strategy.scope():
        counter = cv.Variable(np.zeros(()), name="counter")  # rank 0: never sharded
        table = cv.Variable(np.zeros((6, 2), np.float32), name="table")

    def step(i):
        counter.assign_add(1.0)
        table.scatter_add(cv.IndexedSlices(np.ones((2, 2), np.float32), [i % 6, 5]))
        return counter.device, [s.device for s in table.variables], task_index()

    results = [coordinator.schedule(step, args=(i,)) for i in range(12)]
    coordinator.join()
    for device, shard_devices, _ in coordinator.fetch(results):
        assert device == counter.device
        assert shard_devices == [s.device for s in table.variables]
    assert float(counter.numpy()) == 12.0
    expected = np.zeros((6, 2), np.float32)
    for i in range(12):
        np.add.at(expected, [i % 6, 5], 1.0)
    np.testing.assert_array_equal(table.numpy(), expected)


# ===== (b) optimizers against a numpy reference ================================================

class NumpyOptimizer:
    """The update formulas, written out in numpy, with one state dict per variable."""

    def __init__(self, name, **config):
        self.name, self.config, self.state = name, config, {}

    def apply(self, key, value, gradient):
        """Apply ``gradient`` (an array, or (values, indices)) to ``value`` in place."""
        state = self.state.setdefault(key, {})
        if isinstance(gradient, tuple):
            values, indices = gradient
            rows, inverse = np.unique(indices, return_inverse=True)
            g = np.zeros((rows.size, *value.shape[1:]), value.dtype)
            np.add.at(g, inverse, values)  # duplicate indices add up
        else:
            rows, g = np.arange(value.shape[0]), gradient.astype(value.dtype)
        c = self.config
        if self.name == "SGD":
            lr, momentum = c["learning_rate"], c.get("momentum", 0.0)
            if momentum:
                velocity = state.setdefault("velocity", np.zeros_like(value))
                velocity[rows] = momentum * velocity[rows] - lr * g
                if c.get("nesterov"):
                    value[rows] += momentum * velocity[rows] - lr * g
                else:
                    value[rows] += velocity[rows]
            else:
                value[rows] -= lr * g
        elif self.name == "Adagrad":
            lr, eps = c["learning_rate"], c.get("epsilon", 1e-7)
            accumulator = state.setdefault(
                "accumulator", np.full_like(value, c.get("initial_accumulator_value", 0.1)))
            accumulator[rows] += g * g
            value[rows] -= lr * g / (np.sqrt(accumulator[rows]) + eps)
        elif self.name == "Adam":
            lr, b1, b2 = c["learning_rate"], c.get("beta_1", 0.9), c.get("beta_2", 0.999)
            eps = c.get("epsilon", 1e-7)
            m = state.setdefault("m", np.zeros_like(value))
            v = state.setdefault("v", np.zeros_like(value))
            state["t"] = t = state.get("t", 0) + 1
            lr_t = lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
            m[rows] = b1 * m[rows] + (1 - b1) * g
            v[rows] = b2 * v[rows] + (1 - b2) * g * g
            value[rows] -= lr_t * m[rows] / (np.sqrt(v[rows]) + eps)
        else:
            raise AssertionError(self.name)


OPTIMIZERS = {
    "sgd": ("SGD", {"learning_rate": 0.1}),
    "momentum": ("SGD", {"learning_rate": 0.1, "momentum": 0.9}),
    "nesterov": ("SGD", {"learning_rate": 0.1, "momentum": 0.9, "nesterov": True}),
    "adagrad": ("Adagrad", {"learning_rate": 0.5, "initial_accumulator_value": 0.2}),
    "adam": ("Adam", {"learning_rate": 0.1, "beta_1": 0.8, "beta_2": 0.99}),
}

# 13 rows in 3 shards (5, 4, 4 rows): every step touches every shard, with repeated rows.
SPARSE_STEPS = [np.array([0, 12, 5, 0, 7, 12, 3]), np.array([9, 9, 9, 1, 6]),
                np.array([4, 8, 12, 4])]


def build_optimizer(key):
    name, config = OPTIMIZERS[key]
    return getattr(cv.optimizers, name)(**config), NumpyOptimizer(name, **config)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sharded", [False, True], ids=["plain", "sharded"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("key", list(OPTIMIZERS))
def test_optimizer_matches_numpy_reference(cluster, make, key, sparse, sharded):
    strategy, _ = make(cluster, FixedShardsPartitioner(3) if sharded else None)
    rng = np.random.default_rng(7)
    start = rng.standard_normal((13, 4)).astype(np.float32)
    bias_start = rng.standard_normal(4).astype(np.float32)
    with strategy.scope():
        table = cv.Variable(start, name="table")
        bias = cv.Variable(bias_start, name="bias")
    assert isinstance(table, cv.distribute.ShardedVariable) == sharded
    optimizer, reference = build_optimizer(key)
    expected, expected_bias = start.copy(), bias_start.copy()
    for ids in SPARSE_STEPS:
        bias_gradient = rng.standard_normal(4).astype(np.float32)
        if sparse:
            values = rng.standard_normal((ids.size, 4)).astype(np.float32)
            gradient = cv.IndexedSlices(values, ids)
            reference.apply("table", expected, (values, ids))
        else:
            gradient = rng.standard_normal((13, 4)).astype(np.float32)
            reference.apply("table", expected, gradient)
        optimizer.apply_gradients([(gradient, table), (bias_gradient, bias), (None, bias)])
        reference.apply("bias", expected_bias, bias_gradient)
        np.testing.assert_allclose(table.numpy(), expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(bias.numpy(), expected_bias, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("key", ["momentum", "adagrad", "adam"])
def test_sparse_updates_do_not_depend_on_sharding(cluster, make, key):
    # A step whose rows all fall in one shard must update the table as it would an unsharded
    # one (Adam's step count included).
    start = np.random.default_rng(3).standard_normal((12, 3)).astype(np.float32)
    steps = [np.array([0, 1, 1]), np.array([2, 11]), np.array([10, 0])]
    results = []
    for partitioner in (None, FixedShardsPartitioner(3)):
        strategy, _ = make(cluster, partitioner)
        with strategy.scope():
            table = cv.Variable(start, name="table")
        optimizer, _ = build_optimizer(key)
        for ids in steps:
            optimizer.apply_gradients([(cv.IndexedSlices(np.ones((ids.size, 3)), ids), table)])
        results.append(table.numpy())
    _, reference = build_optimizer(key)
    expected = start.copy()
    for ids in steps:
        reference.apply("table", expected, (np.ones((ids.size, 3), np.float32), ids))
    np.testing.assert_allclose(results[0], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(results[1], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(120)
def test_optimizer_applied_from_scheduled_functions(cluster, make):
    strategy, coordinator = make(cluster, FixedShardsPartitioner(3))
    start = np.ones((13, 4), np.float32)
    with strategy.scope():
        table = cv.Variable(start, name="table")
    optimizer, reference = build_optimizer("adam")
    expected = start.copy()

    def step(ids, values):
        optimizer.apply_gradients([(cv.IndexedSlices(values, ids), table)])

    for i, ids in enumerate(SPARSE_STEPS):
        values = np.full((ids.size, 4), i + 1.0, np.float32)
        coordinator.schedule(step, args=(ids, values))
        coordinator.join()  # one step at a time, so the order is the reference's
        reference.apply("table", expected, (values, ids))
    np.testing.assert_allclose(table.numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(120)
def test_updates_from_a_scheduled_function_land_before_it_counts_as_done(cluster, make):
    # In a scheduled function apply_gradients only queues its calls; the function still
    # reads its own updates, is done only once they are applied, and fails if one fails.
    strategy, coordinator = make(cluster, FixedShardsPartitioner(2))
    with strategy.scope():
        table = cv.Variable(np.zeros((6, 2), np.float32), name="table")
        scale = cv.Variable(np.ones(3, np.float32), name="scale")
    optimizer = cv.optimizers.SGD(1.0)

    def step(row):
        optimizer.apply_gradients([(cv.IndexedSlices(-np.ones((1, 2)), [row]), table)])
        return table.sparse_read([row]).tolist()

    results = [coordinator.schedule(step, args=(row % 6,)) for row in range(60)]
    coordinator.join()
    assert all(rows[0][0] >= 1 for rows in coordinator.fetch(results))  # read its own update
    np.testing.assert_array_equal(table.numpy(), np.full((6, 2), 10.0))

    def bad_step():
        optimizer.apply_gradients([(np.ones(4, np.float32), scale)])  # wrong shape: the ps says
        return "returned"

    failed = coordinator.schedule(bad_step)
    with pytest.raises(InvalidArgumentError, match=r"\[4\].*\[3\]"):
        coordinator.join()
    with pytest.raises(InvalidArgumentError):
        failed.fetch()
    np.testing.assert_array_equal(scale.numpy(), np.ones(3))


@pytest.mark.timeout(120)
def test_variable_writes_from_a_scheduled_function_land_before_it_counts_as_done(cluster,
                                                                                  make):
    # assign_*/scatter_* in a scheduled function do not wait either: the function reads its
    # own writes, the caller may reuse its arrays at once, and a failed write fails it.
    strategy, coordinator = make(cluster, FixedShardsPartitioner(2))
    with strategy.scope():
        table = cv.Variable(np.zeros((6, 2), np.float32), name="table")
        counts = cv.Variable(np.zeros((), np.int64), name="counts")
        single = cv.Variable(np.zeros((1, 2), np.float32), name="single")
    assert isinstance(single, cv.Variable)  # one row: not sharded

    def step(row):
        delta = np.ones((1, 2), np.float32)
        table.scatter_add(cv.IndexedSlices(delta, [row]))
        single.scatter_add(cv.IndexedSlices(delta, [0]))
        counts.assign_add(1)
        delta[...] = 100  # changed after the calls: what they sent is unchanged
        return table.sparse_read([row]).tolist(), int(counts.read_value())

    results = coordinator.fetch([coordinator.schedule(step, args=(row % 6,))
                                 for row in range(60)])
    assert all(rows[0][0] >= 1 and count >= 1 for rows, count in results)
    np.testing.assert_array_equal(table.numpy(), np.full((6, 2), 10.0))
    np.testing.assert_array_equal(single.numpy(), np.full((1, 2), 60.0))
    assert counts.numpy() == 60

    with strategy.scope():
        divided = cv.Variable(np.ones(3, np.int64), name="divided")

    def bad_step():
        divided.scatter_div(cv.IndexedSlices(np.zeros(1, np.int64), [0]))  # the ps refuses
        return "returned"

    failed = coordinator.schedule(bad_step)
    with pytest.raises(InvalidArgumentError, match="division by zero"):
        coordinator.join()
    with pytest.raises(InvalidArgumentError):
        failed.fetch()


@pytest.mark.timeout(120)
def test_reads_of_a_scheduled_function_see_every_earlier_write(cluster, make):
    # Whole-variable reads are read ahead from a function's previous run: still, each run
    # sees what the chief wrote before scheduling it, and its own writes.
    strategy, coordinator = make(cluster, FixedShardsPartitioner(2))
    with strategy.scope():
        table = cv.Variable(np.zeros((4, 2), np.float32), name="table")
        weights = cv.Variable(np.zeros(4, np.float32), name="weights")
        bias = cv.Variable(np.zeros((), np.float32), name="bias")

    def step(late):
        table.sparse_read([0, 3])
        seen = None if late else (weights.read_value().tolist(), float(bias.read_value()))
        weights.assign_add(np.ones(4, np.float32))  # after a plan of reading weights ahead
        return seen, weights.read_value().tolist(), float(bias.read_value())

    for i in range(12):
        weights.assign(np.full(4, i, np.float32))
        bias.assign(-i)
        late = i % 4 == 3
        seen, after, bias_after = coordinator.schedule(step, args=(late,)).fetch()
        assert seen == (None if late else ([float(i)] * 4, -i))
        assert after == [i + 1.0] * 4 and bias_after == -i


# ===== (c) the coordinator =====================================================================

@pytest.mark.timeout(120)
def test_schedule_join_done_fetch(cluster, make):
    _, coordinator = make(cluster)
    coordinator.join()  # nothing scheduled: returns at once
    assert coordinator.done()
    results = [coordinator.schedule(lambda x, y=0: (x * 2 + y, {"x": [x]}), args=(i,),
                                    kwargs={"y": 1}) for i in range(20)]
    coordinator.join()
    coordinator.join()
    assert coordinator.done()
    assert coordinator.fetch(results) == [(i * 2 + 1, {"x": [i]}) for i in range(20)]
    assert results[3].get() == (7, {"x": [3]})

    slow = coordinator.schedule(time.sleep, args=(0.3,))
    assert not coordinator.done()
    assert slow.fetch() is None
    wait_until(coordinator.done, what="done()")
    with pytest.raises(InvalidArgumentError, match="callable"):
        coordinator.schedule(42)
    for pipelining in (0, 1.5, True):
        with pytest.raises(InvalidArgumentError, match="pipelining"):
            cv.distribute.ClusterCoordinator(coordinator.strategy, pipelining=pipelining)


@pytest.mark.timeout(120)
def test_2000_tiny_functions_all_complete(cluster, make):
    strategy, coordinator = make(cluster)
    with strategy.scope():
        total = cv.Variable(0, name="total")
    results = [coordinator.schedule(lambda i: i, args=(i,)) for i in range(1990)]
    results += [coordinator.schedule(total.assign_add, args=(1,)) for _ in range(10)]
    coordinator.join()
    assert coordinator.done()
    assert coordinator.fetch(results[:1990]) == list(range(1990))
    assert int(total.numpy()) == 10


def failing_function():
    time.sleep(0.1)
    raise ValueError("boom from a scheduled function")


@pytest.mark.timeout(120)
def test_error_is_raised_by_join_once_and_queued_functions_are_cancelled(cluster, make):
    strategy, coordinator = make(cluster)
    with strategy.scope():
        finished = cv.Variable(0, name="finished")

    def slow():
        time.sleep(0.6)
        finished.assign_add(1)  # cancelled here, unless its Run answers with the failure's
        return "slow"

    slow_result = coordinator.schedule(slow)
    failed = coordinator.schedule(failing_function)
    behind = [coordinator.schedule(time.sleep, args=(0.2,)) for _ in range(40)]
    with pytest.raises(ValueError, match="boom"):
        coordinator.join()
    # "When join returns or raises, it guarantees that there is no function that is still
    # being executed": the slow function finished, or stopped at its variable operation.
    count = int(finished.numpy())
    try:
        assert slow_result.fetch() == "slow" and count == 1
    except CancelledError:
        assert count == 0
    time.sleep(0.7)
    assert int(finished.numpy()) == count
    with pytest.raises(ValueError, match="boom"):
        failed.fetch()
    cancelled = 0
    for result in behind:
        try:
            assert result.fetch() is None
        except CancelledError:
            cancelled += 1
    assert cancelled > 0
    # raised once, then cleared
    coordinator.join()
    assert coordinator.done()
    assert coordinator.schedule(lambda: 5).fetch() == 5


@pytest.mark.timeout(120)
def test_error_is_raised_by_done_and_by_schedule(cluster, make):
    _, coordinator = make(cluster)
    failed = coordinator.schedule(failing_function)
    with pytest.raises(ValueError):
        failed.fetch()
    with pytest.raises(ValueError, match="boom"):
        coordinator.done()
    assert coordinator.done()

    failed = coordinator.schedule(failing_function)
    with pytest.raises(ValueError):
        failed.fetch()
    with pytest.raises(ValueError, match="boom"):
        coordinator.schedule(lambda: 1)
    assert coordinator.schedule(lambda: 2).fetch() == 2
    coordinator.join()


@pytest.mark.timeout(120)
def test_per_worker_datasets_and_iterators(cluster, make):
    _, coordinator = make(cluster)
    dataset = coordinator.create_per_worker_dataset(
        lambda: cv.data.Dataset.range(100).map(lambda x: x * 10))
    iterator = iter(dataset)

    def read(it, count):
        return task_index(), [int(next(it)) for _ in range(count)]

    results = coordinator.fetch([coordinator.schedule(read, args=(iterator, 3))
                                 for _ in range(10)])
    by_worker = {}
    for index, values in results:
        by_worker.setdefault(index, []).extend(values)
    for values in by_worker.values():
        # each worker reads its own iterator: every element once, from the start
        assert sorted(values) == [10 * i for i in range(len(values))]
    # each iter() makes new iterators that start from the beginning
    fresh = iter(dataset)
    assert coordinator.schedule(lambda it: int(next(it)), args=(fresh,)).fetch() == 0
    with pytest.raises(InvalidArgumentError):
        next(fresh)


@pytest.mark.timeout(120)
def test_distribute_datasets_from_function_gives_each_worker_its_pipeline(cluster, make):
    strategy, coordinator = make(cluster)

    def dataset_fn():
        def pipeline(context):
            return cv.data.Dataset.from_tensors(
                (context.input_pipeline_id, context.num_input_pipelines)).repeat()
        return strategy.distribute_datasets_from_function(pipeline)

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    def read(it):
        time.sleep(0.05)  # long enough that both workers take functions
        pipeline_id, count = next(it)
        return task_index(), int(pipeline_id), int(count)

    results = coordinator.fetch([coordinator.schedule(read, args=(iterator,))
                                 for _ in range(24)])
    assert {index for index, _, _ in results} == {0, 1}
    assert all(index == pipeline_id and count == 2 for index, pipeline_id, count in results)

    with pytest.raises(FailedPreconditionError, match="create_per_worker_dataset"):
        strategy.distribute_datasets_from_function(lambda context: None)
    # inside a scheduled function that is not building a per-worker dataset: the same error
    misuse = coordinator.schedule(
        lambda: strategy.distribute_datasets_from_function(lambda context: None))
    with pytest.raises(FailedPreconditionError, match="create_per_worker_dataset"):
        coordinator.join()
    with pytest.raises(FailedPreconditionError):
        misuse.fetch()


# ===== (d) fault tolerance with real processes =================================================

@pytest.mark.timeout(120)
def test_worker_killed_mid_training_then_restarted(make):
    with TrainingCluster(num_workers=2, num_ps=1) as cluster:
        strategy, coordinator = make(cluster)
        with strategy.scope():
            count = cv.Variable(0, name="count")
        iterator = iter(coordinator.create_per_worker_dataset(
            lambda: cv.data.Dataset.range(10_000)))

        def step():
            count.assign_add(1)
            time.sleep(0.02)
            return task_index()

        results = [coordinator.schedule(step) for _ in range(300)]
        wait_until(lambda: int(count.numpy()) >= 40, what="the first steps")
        cluster.kill_task("worker", 0)
        coordinator.join()
        ran_on = coordinator.fetch(results)  # every RemoteValue resolves
        assert len(ran_on) == 300 and set(ran_on) <= {0, 1}
        assert ran_on.count(1) > 0
        # at least once: steps cut short on the killed worker ran again elsewhere
        assert 300 <= int(count.numpy()) <= 300 + DEFAULT_PIPELINING

        cluster.start_task("worker", 0)

        def read(it):
            time.sleep(0.02)
            return task_index(), int(next(it))

        seen = {}
        deadline = time.monotonic() + 60
        while 0 not in seen:
            assert time.monotonic() < deadline, "the restarted worker never got work"
            for index, value in coordinator.fetch(
                    [coordinator.schedule(read, args=(iterator,)) for _ in range(16)]):
                seen.setdefault(index, []).append(value)
        # the restarted worker's iterator was rebuilt: it reads from the start again
        assert sorted(seen[0]) == list(range(len(seen[0])))
        coordinator.join()


@pytest.mark.timeout(120)
def test_a_dataset_a_restarted_worker_cannot_rebuild_makes_join_raise(make, tmp_path):
    with TrainingCluster(num_workers=2, num_ps=1) as cluster:
        _, coordinator = make(cluster)
        gone = tmp_path / "gone"  # once it exists, a new worker process cannot build

        def dataset_fn():
            if gone.exists():
                raise OSError("the dataset's files are gone")
            return cv.data.Dataset.range(1_000_000)

        iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

        def step(it):
            time.sleep(0.02)
            return task_index(), int(next(it))

        coordinator.fetch([coordinator.schedule(step, args=(iterator,)) for _ in range(8)])
        cluster.kill_task("worker", 0)
        gone.touch()
        cluster.start_task("worker", 0)
        restarted = time.monotonic()
        with pytest.raises(FailedPreconditionError) as raised:
            while time.monotonic() - restarted < 60:  # until a Run finds worker 0 gone
                for _ in range(8):
                    coordinator.schedule(step, args=(iterator,))
                coordinator.join()
        assert time.monotonic() - restarted < 60
        message = str(raised.value)
        assert "worker 0" in message and "per-worker dataset" in message
        assert "files are gone" in message and isinstance(raised.value.__cause__, OSError)
        # the other worker keeps training; worker 0 takes nothing until it restarts again
        ran_on = coordinator.fetch([coordinator.schedule(step, args=(iterator,))
                                    for _ in range(8)])
        assert {index for index, _ in ran_on} == {1}


@pytest.mark.timeout(120)
def test_ps_killed_schedule_and_join_raise_unavailable(make):
    with TrainingCluster(num_workers=2, num_ps=2) as cluster:
        strategy, coordinator = make(cluster)
        with strategy.scope():
            on_ps0 = cv.Variable(0, name="a")
            on_ps1 = cv.Variable(0, name="b")
        assert on_ps1.device == ps_device(1)

        def step():
            on_ps0.assign_add(1)
            on_ps1.assign_add(1)

        for _ in range(10):
            coordinator.schedule(step)
        coordinator.join()
        assert int(on_ps1.numpy()) == 10

        cluster.kill_task("ps", 1)
        started = time.monotonic()
        with pytest.raises(UnavailableError):
            for _ in range(20):
                coordinator.schedule(step)
            coordinator.join()
        assert time.monotonic() - started < 30
        with pytest.raises(UnavailableError):
            on_ps1.numpy()

        started = time.monotonic()
        with pytest.raises(UnavailableError):
            while time.monotonic() - started < 30:
                coordinator.schedule(step)
                time.sleep(0.01)
        assert time.monotonic() - started < 30
        # the surviving ps still answers
        assert int(on_ps0.numpy()) >= 10


# ===== (e) checkpoints =========================================================================

def make_model(strategy, start):
    with strategy.scope():
        return {"embedding": cv.Variable(start, name="embedding"),
                "bias": cv.Variable(np.zeros(4, np.float32), name="bias")}


def train_step(optimizer, model, i):
    ids = np.array([0, 9, 5, 0, 2])  # rows in every shard for 2 and 3 shards
    optimizer.apply_gradients([
        (cv.IndexedSlices(np.full((5, 4), i + 1.0, np.float32), ids), model["embedding"]),
        (np.full(4, 0.5 * (i + 1), np.float32), model["bias"]),
    ])


@pytest.mark.timeout(120)
def test_checkpoint_restores_into_other_partitionings(cluster, make, tmp_path):
    start = np.random.default_rng(5).standard_normal((10, 4)).astype(np.float32)
    strategy, _ = make(cluster, FixedShardsPartitioner(2))
    model = make_model(strategy, start)
    assert len(model["embedding"].variables) == 2
    optimizer = cv.optimizers.Adam(learning_rate=0.1)
    checkpoint = cv.train.Checkpoint(model=model, optimizer=optimizer)
    manager = cv.train.CheckpointManager(checkpoint, tmp_path / "run", max_to_keep=2)
    assert manager.latest_checkpoint is None and manager.restore_or_initialize() is None
    paths = []
    for i in range(3):
        train_step(optimizer, model, i)
        paths.append(manager.save())
    # max_to_keep=2 deleted the first file
    assert not (tmp_path / "run" / "ckpt-1.safetensors").exists()
    assert manager.checkpoints == paths[1:]
    assert manager.latest_checkpoint == paths[2]
    assert json.loads((tmp_path / "run" / "checkpoint.json").read_text()) == {
        "latest": "ckpt-3.safetensors", "all": ["ckpt-2.safetensors", "ckpt-3.safetensors"]}

    saved = load_file(paths[2])  # a valid safetensors file
    assert set(saved) == {"model/bias", "model/embedding", "optimizer/iterations",
                          *(f"model/{v}/.slots/{s}" for v in ("bias", "embedding")
                            for s in ("m", "v", "iterations"))}
    assert int(saved["optimizer/iterations"]) == 3
    np.testing.assert_array_equal(saved["model/embedding"], model["embedding"].numpy())
    assert saved["model/embedding/.slots/iterations"].shape == ()
    assert int(saved["model/embedding/.slots/iterations"]) == 3

    restored = []
    for partitioner in (FixedShardsPartitioner(3), None):
        other_strategy, _ = make(cluster, partitioner)
        other = make_model(other_strategy, np.zeros((10, 4), np.float32))
        other_optimizer = cv.optimizers.Adam(learning_rate=0.1)
        cv.train.Checkpoint(model=other, optimizer=other_optimizer).restore(paths[2])
        np.testing.assert_array_equal(other["embedding"].numpy(), model["embedding"].numpy())
        np.testing.assert_array_equal(other["bias"].numpy(), model["bias"].numpy())
        # slots came back too: the re-saved checkpoint holds the same tensors
        again = load_file(cv.train.Checkpoint(model=other, optimizer=other_optimizer)
                          .write(tmp_path / f"again-{len(restored)}"))
        assert set(again) == set(saved)
        for key in saved:
            np.testing.assert_array_equal(again[key], saved[key], err_msg=key)
        restored.append((other, other_optimizer))
    assert len(restored[0][0]["embedding"].variables) == 3
    assert isinstance(restored[1][0]["embedding"], cv.Variable)

    # and training goes on identically (moments and step counts restored)
    train_step(optimizer, model, 3)
    for other, other_optimizer in restored:
        train_step(other_optimizer, other, 3)
        np.testing.assert_allclose(other["embedding"].numpy(), model["embedding"].numpy(),
                                   rtol=1e-6)
        np.testing.assert_allclose(other["bias"].numpy(), model["bias"].numpy(), rtol=1e-6)

    # restoring into a variable of another shape, or from a missing file, fails clearly
    bad_strategy, _ = make(cluster)
    with bad_strategy.scope():
        bad = {"embedding": cv.Variable(np.zeros((3, 4), np.float32)),
               "bias": cv.Variable(np.zeros(4, np.float32))}
    with pytest.raises(InvalidArgumentError, match="shape"):
        cv.train.Checkpoint(model=bad).restore(paths[2])
    with pytest.raises(NotFoundError):
        cv.train.Checkpoint(model=bad).restore(tmp_path / "missing")


# ===== (f) convoy.torch ========================================================================

@pytest.mark.timeout(120)
@pytest.mark.parametrize("key", ["sgd", "adagrad"])
def test_torch_step_equals_local_torch(cluster, make, key):
    strategy, coordinator = make(cluster, FixedShardsPartitioner(2))
    rng = np.random.default_rng(11)
    table0 = rng.standard_normal((10, 4)).astype(np.float32)
    w0 = rng.standard_normal((4, 1)).astype(np.float32)
    ids = np.array([[0, 9], [3, 3], [7, 0]])  # 2-D, repeated, both shards
    labels = rng.standard_normal((3, 1)).astype(np.float32)
    with strategy.scope():
        table = cv.Variable(table0, name="table")
        w = cv.Variable(w0, name="w")
    optimizer, _ = build_optimizer(key)

    def model(rows, weights):
        return rows.sum(dim=1) @ weights

    def step(ids, labels):
        with cv.torch.pull(dense=[w], rows={table: ids}) as pulled:
            loss = ((model(pulled[table], pulled[0]) - torch.from_numpy(labels)) ** 2).mean()
            loss.backward()
        optimizer.apply_gradients(pulled.gradients())
        return loss.item()

    remote_loss = coordinator.schedule(step, args=(ids, labels)).fetch()

    # the same step, locally, with the same optimizer written with torch tensors
    table_t = torch.tensor(table0, requires_grad=True)
    w_t = torch.tensor(w0, requires_grad=True)
    loss = ((model(table_t[torch.from_numpy(ids)], w_t) - torch.from_numpy(labels)) ** 2).mean()
    loss.backward()
    name, config = OPTIMIZERS[key]
    with torch.no_grad():
        for parameter in (table_t, w_t):
            g = parameter.grad
            if name == "SGD":
                parameter -= config["learning_rate"] * g
            else:
                accumulator = config["initial_accumulator_value"] + g * g
                # only the rows looked up have a (sparse) accumulator update; others get 0
                parameter -= config["learning_rate"] * g / (accumulator.sqrt() + 1e-7)
    assert remote_loss == pytest.approx(loss.item(), rel=1e-6)
    np.testing.assert_allclose(table.numpy(), table_t.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(w.numpy(), w_t.detach().numpy(), rtol=1e-5, atol=1e-6)


# ===== (g) bad input ===========================================================================

@pytest.mark.timeout(120)
def test_bad_variables_and_updates(cluster, make):
    strategy, _ = make(cluster)
    sharded_strategy, _ = make(cluster, FixedShardsPartitioner(2))
    with pytest.raises(InvalidArgumentError, match=r"shape \[3\].*shape=\[2\]"):
        cv.Variable([1, 2, 3], shape=(2,))
    with strategy.scope():
        with pytest.raises(InvalidArgumentError, match=r"shape \[3\].*shape=\[2\]"):
            cv.Variable([1, 2, 3], shape=(2,))
        with pytest.raises(InvalidArgumentError, match="dtype"):
            cv.Variable("abc", dtype=np.float32)
        plain = cv.Variable(np.zeros((4, 3), np.float32), name="plain")
    with sharded_strategy.scope():
        sharded = cv.Variable(np.zeros((4, 3), np.float32), name="sharded")
        with pytest.raises(InvalidArgumentError, match="initializer returned shape"):
            cv.Variable(lambda shard_info: np.zeros((1, 3)), shape=(4, 3), dtype=np.float32)
    for variable in (plain, sharded):
        with pytest.raises(InvalidArgumentError, match="integers"):
            variable.scatter_add(cv.IndexedSlices(np.ones((2, 3)), [0.0, 1.0]))
        with pytest.raises(InvalidArgumentError, match="integers"):
            variable.sparse_read([0.5])
        with pytest.raises(InvalidArgumentError, match=r"\[2, 4\]"):
            variable.scatter_add(cv.IndexedSlices(np.ones((2, 4)), [0, 1]))
        with pytest.raises(InvalidArgumentError, match=r"\[3, 3\]"):
            variable.scatter_update(cv.IndexedSlices(np.ones((3, 3)), [0, 1]))
        with pytest.raises(InvalidArgumentError, match="IndexedSlices"):
            variable.scatter_sub((np.ones((2, 3)), [0, 1]))
        with pytest.raises(InvalidArgumentError, match=r"\[0, 4\)"):
            variable.scatter_add(cv.IndexedSlices(np.ones((2, 3)), [0, 4]))
        with pytest.raises(InvalidArgumentError, match=r"\[0, 4\)"):
            variable.sparse_read([-1])
        for update in (variable.assign, variable.assign_add, variable.assign_sub):
            with pytest.raises(InvalidArgumentError, match=r"\[3, 3\]"):
                update(np.ones((3, 3)))
            with pytest.raises(InvalidArgumentError, match=r"\[3\]"):
                update(np.ones(3))  # no silent broadcasting
        optimizer = cv.optimizers.Adam()
        with pytest.raises(InvalidArgumentError, match=r"\[3, 3\]"):
            optimizer.apply_gradients([(np.ones((3, 3)), variable)])
        with pytest.raises(InvalidArgumentError, match=r"\[2, 4\]"):
            optimizer.apply_gradients([(cv.IndexedSlices(np.ones((2, 4)), [0, 1]), variable)])
        with pytest.raises(InvalidArgumentError, match="integers"):
            optimizer.apply_gradients([(cv.IndexedSlices(np.ones((2, 3)), [0.0, 1.0]),
                                        variable)])
        np.testing.assert_array_equal(variable.numpy(), np.zeros((4, 3)))  # untouched
    with pytest.raises(InvalidArgumentError, match="variable"):
        cv.optimizers.SGD().apply_gradients([(np.ones(3), np.ones(3))])
    with pytest.raises(InvalidArgumentError, match="learning_rate"):
        cv.optimizers.SGD(learning_rate=-1)


@pytest.mark.parametrize("answer, problem", [
    ([2, 2], "1 for every axis but the first"),
    ([0, 1], "first-axis count >= 1"),
    (None, "non-empty list"),
    ([], "non-empty list"),
    ([2], "one count per axis"),
    ((1.5, 1), "integer counts"),
])
@pytest.mark.timeout(120)
def test_partitioner_returning_a_bad_list(cluster, make, answer, problem):
    strategy, _ = make(cluster, lambda shape, dtype: answer)
    with strategy.scope(), pytest.raises(InvalidArgumentError, match=problem):
        cv.Variable(np.zeros((4, 3)), name="x")


def test_bad_cluster_and_server_arguments():
    spec = {"chief": ["localhost:1"], "ps": ["localhost:2"], "worker": ["localhost:3"]}
    with pytest.raises(InvalidArgumentError, match="'chief'"):
        cv.distribute.Server(spec, job_name="chief", task_index=0, start=False)
    with pytest.raises(InvalidArgumentError, match="protocol"):
        cv.distribute.Server(spec, job_name="ps", task_index=0, protocol="rdma", start=False)
    with pytest.raises(InvalidArgumentError,
                       match="The `task_id` 3 exceeds the maximum id of worker"):
        cv.distribute.Server(spec, job_name="worker", task_index=3, start=False)
    resolver = cv.distribute.cluster_resolver.SimpleClusterResolver
    no_ps = cv.distribute.ClusterSpec({"chief": ["localhost:1"], "worker": ["localhost:3"]})
    with pytest.raises(InvalidArgumentError, match="at least one 'ps'"):
        cv.distribute.ParameterServerStrategy(resolver(no_ps))
    with pytest.raises(InvalidArgumentError, match="callable"):
        cv.distribute.ParameterServerStrategy(resolver(cv.distribute.ClusterSpec(spec)),
                                              variable_partitioner=3)
    with pytest.raises(TypeError, match="non-empty list"):
        cv.distribute.ShardedVariable([])


@pytest.mark.timeout(120)
def test_variable_created_outside_the_scope_in_a_scheduled_function(cluster, make):
    _, coordinator = make(cluster)
    local = cv.Variable(1.0, name="local")
    result = coordinator.schedule(lambda: local.numpy())
    with pytest.raises(InvalidArgumentError, match="'local' was created outside strategy.scope"):
        coordinator.join()
    with pytest.raises(InvalidArgumentError):
        result.fetch()
    assert coordinator.schedule(lambda: 1).fetch() == 1
