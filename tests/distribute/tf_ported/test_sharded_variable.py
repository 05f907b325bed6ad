"""Scenarios of TensorFlow's ``tensorflow/python/distribute/sharded_variable_test.py``, ported.

Each test names the TensorFlow test it comes from. The shards are variables of this process
(as in TensorFlow's test, which needs no cluster), so these tests start no servers; the
parameter-server versions of the same operations are covered by ``test_training.py``.

Scenarios that cannot apply, and why:

- ``test_control_dep_on_assign``, ``test_as_function_input``, the ``tf.function`` halves of
  ``test_scatter_*``, ``test_batch_scatter_update``, ``test_sparse_read`` and
  ``test_slicing``: there are no graphs, traces or control dependencies; every operation runs
  when it is called.
- ``test_save_graph_def``, ``test_load_raises_error`` and ``ShardedVariableSaveLoadTest``:
  SavedModel does not exist in convoy.
- ``test_tf_module`` and ``test_shards_have_container_set``: ``tf.Module`` variable tracking
  and a private back-reference have no counterpart.
- ``test_flatten`` with ``expand_composites=True``: ShardedVariable is not a composite
  tensor; the plain ``flatten`` half is ported.
- ``test_delayed_restore`` and ``test_delayed_restore_4_to_2_partitions``: a convoy
  checkpoint restores the variables that exist when ``restore`` is called; restoring into
  variables created afterwards ("delayed restoration") is not implemented.
- ``test_embedding_lookup``'s ``embedding_lookup_sparse`` and ``safe_embedding_lookup_sparse``
  (no SparseTensor) and its count of ``ResourceGather`` graph ops; the dense lookup is ported.
- ``test_slicing`` with tensors as indices (a TypeError in TensorFlow): numpy integers are
  ordinary indices here.
- ``test_validation_errors``' ``SaveSliceInfo`` case: variables carry no save-slice info.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import convoy as cv
from convoy.distribute import ShardedVariable
from convoy.distribute.partitioners import (
    FixedShardsPartitioner,
    MaxSizePartitioner,
    MinSizePartitioner,
)

V = cv.Variable


def sharded(*parts, dtype=None):
    return ShardedVariable([V(np.asarray(p, dtype)) for p in parts])


# ----- PartitionerTest ---------------------------------------------------------------------------

def test_fixed_shards_partitioner():  # PartitionerTest.test_fixed_shards_partitioner
    assert FixedShardsPartitioner(num_shards=2)([10, 3], np.float32) == [2, 1]


def test_min_size_partitioner():  # PartitionerTest.test_min_size_partitioner
    assert MinSizePartitioner(min_shard_bytes=4, max_shards=2)([6, 1], np.float32) == [2, 1]
    assert MinSizePartitioner(min_shard_bytes=4, max_shards=10)([6, 1], np.float32) == [6, 1]


def test_max_size_partitioner():  # PartitionerTest.test_max_size_partitioner
    assert MaxSizePartitioner(max_shard_bytes=4)([6, 1], np.float32) == [6, 1]
    assert MaxSizePartitioner(max_shard_bytes=4, max_shards=2)([6, 1], np.float32) == [2, 1]
    assert MaxSizePartitioner(max_shard_bytes=1024)([6, 1], np.float32) == [1, 1]


# ----- ShardedVariableTest -----------------------------------------------------------------------

def test_sharded_variable_simple():  # ShardedVariableTest.test_sharded_variable_simple
    v0, v1 = V([0]), V([1])
    s = ShardedVariable([v0, v1], name="s")
    assert s.variables[0] is v0 and s.variables[1] is v1
    assert list(s.shape) == [2]
    assert s.dtype == v0.dtype
    assert s.name == "s"


@pytest.mark.parametrize("method, argument, expected", [
    ("assign", [[4, 4], [5, 5], [6, 6], [7, 7]], [[[4, 4]], [[5, 5], [6, 6]], [[7, 7]]]),
    ("assign_add", [[1, 1], [1, 1], [2, 2], [2, 2]], [[[1, 1]], [[2, 2], [4, 4]], [[5, 5]]]),
    ("assign_sub", [[0, 0], [1, 1], [1, 1], [3, 3]], [[[0, 0]], [[0, 0], [1, 1]], [[0, 0]]]),
])
def test_assign(method, argument, expected):
    # ShardedVariableTest.test_assign, test_assign_add, test_assign_sub
    s = sharded([[0, 0]], [[1, 1], [2, 2]], [[3, 3]])
    returned = getattr(s, method)(argument)
    assert [v.numpy().tolist() for v in s.variables] == expected
    assert returned is s


def test_scatter_add_uneven_partition():
    # ShardedVariableTest.test_scatter_add_uneven_partition (twice, as eager then traced)
    v = V(np.zeros((32, 1), np.float32))
    delta = cv.IndexedSlices(np.array([[0.], [1.], [2.], [3.], [4.], [5.]], np.float32),
                             np.array([0, 10, 11, 12, 30, 31]))
    sv = ShardedVariable([V(np.zeros((n, 1), np.float32)) for n in (11, 11, 10)])
    for _ in range(2):
        v.scatter_add(delta)
        sv.scatter_add(delta)
        np.testing.assert_array_equal(v.numpy(), np.asarray(sv))


@pytest.mark.parametrize("op", ["scatter_add", "scatter_div", "scatter_max", "scatter_min",
                                "scatter_mul", "scatter_sub", "scatter_update"])
def test_scatter_ops_even_partition(op):  # ShardedVariableTest.test_scatter_ops_even_partition
    v = V(np.zeros((30, 1), np.float32))
    # no 0 in the values, for scatter_div
    delta = cv.IndexedSlices(np.array([[1.], [2.], [3.], [4.], [5.]], np.float32),
                             np.array([0, 10, 12, 21, 22]))
    sv = ShardedVariable([V(np.zeros((10, 1), np.float32)) for _ in range(3)])
    for _ in range(2):
        assert getattr(v, op)(delta, name="scatter_v") is v
        assert getattr(sv, op)(delta, name="scatter_sv") is sv
        np.testing.assert_array_equal(v.numpy(), np.asarray(sv))


def test_batch_scatter_update():  # ShardedVariableTest.test_batch_scatter_update
    v = V(np.zeros((32, 1), np.float32))
    delta = cv.IndexedSlices(np.array([[0.], [1.], [2.], [3.], [4.], [5.]], np.float32),
                             np.array([10, 11, 12, 13, 14, 15]))
    sv = ShardedVariable([V(np.zeros((n, 1), np.float32)) for n in (11, 11, 10)])
    v.batch_scatter_update(delta)
    sv.batch_scatter_update(delta)
    np.testing.assert_array_equal(v.numpy(), np.asarray(sv))
    assert v.numpy()[10:16, 0].tolist() == [0, 1, 2, 3, 4, 5]


def test_sparse_read():  # ShardedVariableTest.test_sparse_read
    v = V(np.arange(30, dtype=np.float32).reshape(30, 1))
    sv = ShardedVariable([V(np.arange(10 * i, 10 * i + 10, dtype=np.float32).reshape(10, 1))
                          for i in range(3)])
    indices = np.array([0, 10, 12, 21, 22])
    np.testing.assert_array_equal(v.sparse_read(indices), sv.sparse_read(indices))


def test_convert_to_tensor():  # ShardedVariableTest.test_convert_to_tensor
    s = sharded([[0, 0]], [[1, 1], [2, 2]], [[3, 3]])
    assert np.asarray(s).tolist() == [[0, 0], [1, 1], [2, 2], [3, 3]]


def test_save_restore(tmp_path):  # ShardedVariableTest.test_save_restore
    fname = tmp_path / "checkpoint"
    s = ShardedVariable([V([0]), V([1]), V([2]), V([3])], name="s")
    cp = cv.train.Checkpoint(s=s)
    assert s.variables[0].numpy().tolist() == [0]
    cp.write(fname)
    s.variables[0].assign([4])
    assert s.variables[0].numpy().tolist() == [4]
    cp.restore(fname)
    assert s.variables[0].numpy().tolist() == [0]


def test_save_restore_different_partitions(tmp_path):
    # ShardedVariableTest.test_save_restore_different_partitions
    fname = tmp_path / "checkpoint"
    s = ShardedVariable([V([0]), V([1]), V([2]), V([3])], name="s")
    cp = cv.train.Checkpoint(s=s)
    cp.write(fname)
    s2 = ShardedVariable([V([0, 0, 0, 0])], name="s")
    cp2 = cv.train.Checkpoint(s=s2)
    cp2.restore(fname)  # 4 partitions into 1
    assert s2.variables[0].numpy().tolist() == [0, 1, 2, 3]
    s2.variables[0].assign([5, 10, 15, 20])
    cp2.write(fname)
    cp.restore(fname)  # 1 partition into 4
    assert [v.numpy().tolist() for v in s.variables] == [[5], [10], [15], [20]]


def test_save_restore_4_to_2_partitions(tmp_path):
    # ShardedVariableTest.test_save_restore_4_to_2_partitions
    fname = tmp_path / "checkpoint"
    cv.train.Checkpoint(s=ShardedVariable([V([0]), V([1]), V([2]), V([3])])).write(fname)
    s2 = ShardedVariable([V([0, 0]), V([0, 0])])
    cv.train.Checkpoint(s=s2).restore(fname)
    assert len(s2.variables) == 2
    assert [v.numpy().tolist() for v in s2.variables] == [[0, 1], [2, 3]]


def test_validation_errors():  # ShardedVariableTest.test_validation_errors
    with pytest.raises(TypeError, match="should be a non-empty list of"):
        ShardedVariable(None)
    with pytest.raises(TypeError, match="should be a non-empty list of"):
        ShardedVariable([V([0]), "not-a-variable"])
    with pytest.raises(TypeError, match="should be a non-empty list of"):
        ShardedVariable([])
    with pytest.raises(ValueError, match="must have the same dtype"):
        ShardedVariable([V(np.array([0], np.int64)), V(np.array([1], np.int32))])
    with pytest.raises(ValueError, match="the same shapes except"):
        ShardedVariable([V(np.ones((5, 10))), V(np.ones((5, 20)))])


def test_flatten():  # ShardedVariableTest.test_flatten (without expand_composites)
    s = ShardedVariable([V([0]), V([1])])
    got = cv.nest.flatten(s)
    assert len(got) == 1 and got[0] is s


def test_embedding_lookup():  # ShardedVariableTest.test_embedding_lookup (dense lookup)
    sv = ShardedVariable([V([[1., 2.], [3., 4.]]), V([[5., 6.], [7., 8.]]), V([[9., 10.]])])
    assert cv.nn.embedding_lookup(sv, np.array([0, 3, 4])).tolist() == [
        [1., 2.], [7., 8.], [9., 10.]]


def test_slicing():  # ShardedVariableTest.test_slicing
    parts = [[[1, 2], [3, 4], [5, 6]], [[7, 8], [9, 10], [11, 12]], [[13, 14], [15, 16]]]
    sv = sharded(*parts)
    whole = np.concatenate([np.asarray(p) for p in parts])
    empty = np.zeros((0, 2), whole.dtype)

    def check(got, expected):
        np.testing.assert_array_equal(got, expected)
        assert np.shape(got) == np.shape(expected)

    # positive step
    check(sv[:], whole)
    check(sv[:2], [[1, 2], [3, 4]])
    check(sv[-8:2], [[1, 2], [3, 4]])
    check(sv[-10:2], [[1, 2], [3, 4]])
    check(sv[5:], [[11, 12], [13, 14], [15, 16]])
    check(sv[5:-1], [[11, 12], [13, 14]])
    check(sv[::3], [[1, 2], [7, 8], [13, 14]])
    check(sv[::5], [[1, 2], [11, 12]])
    check(sv[1::6], [[3, 4], [15, 16]])
    check(sv[1:5:6], [[3, 4]])
    check(sv[1::7], [[3, 4]])
    check(sv[2:7], [[5, 6], [7, 8], [9, 10], [11, 12], [13, 14]])
    check(sv[2:7:2], [[5, 6], [9, 10], [13, 14]])
    check(sv[2:7:3], [[5, 6], [11, 12]])
    # negative step
    check(sv[::-1], whole[::-1])
    check(sv[2::-1], [[5, 6], [3, 4], [1, 2]])
    check(sv[2:-8:-1], [[5, 6], [3, 4]])
    check(sv[2:-10:-1], [[5, 6], [3, 4], [1, 2]])
    check(sv[4::-1], [[9, 10], [7, 8], [5, 6], [3, 4], [1, 2]])
    check(sv[-1:-3:-1], [[15, 16], [13, 14]])
    check(sv[::-5], [[15, 16], [5, 6]])
    check(sv[6::-6], [[13, 14], [1, 2]])
    check(sv[6:5:-6], [[13, 14]])
    check(sv[6::-7], [[13, 14]])
    check(sv[7:1:-1], [[15, 16], [13, 14], [11, 12], [9, 10], [7, 8], [5, 6]])
    check(sv[7:1:-2], [[15, 16], [11, 12], [7, 8]])
    check(sv[7:1:-4], [[15, 16], [7, 8]])
    # empty slices
    for key in (slice(0, 0), slice(5, 3), slice(3, 5, -1), slice(-1, 0), slice(2, -1, -1)):
        check(sv[key], empty)
    # other dimensions
    check(sv[:, 0], [1, 3, 5, 7, 9, 11, 13, 15])
    check(sv[:, 0:1], [[1], [3], [5], [7], [9], [11], [13], [15]])
    # plain indexing
    check(sv[2], [5, 6])
    check(sv[6], [13, 14])
    check(sv[2, 1], 6)
    check(sv[-2], [13, 14])
    with pytest.raises(IndexError, match="out of bounds"):
        sv[100]
    with pytest.raises(IndexError, match="out of bounds"):
        sv[-100]
    # Ellipsis, newaxis, boolean masks
    check(sv[...], whole)
    check(sv[..., 0], [1, 3, 5, 7, 9, 11, 13, 15])
    check(sv[0:1, ...], [[1, 2]])
    check(sv[np.newaxis, ...], whole[np.newaxis])
    check(sv[np.asarray(sv) > 10], [11, 12, 13, 14, 15, 16])


def test_operator_overload():  # ShardedVariableTest.test_operator_overload
    sv1 = sharded([1.], [2.])
    sv2 = sharded([1.], [2.])
    assert (sv1 == sv2).tolist() == [True, True]
    assert (sv1 + sv2).tolist() == [2.0, 4.0]


def test_numpy():  # ShardedVariableTest.test_numpy
    sv1_np = sharded([1.], [2.]).numpy()
    assert isinstance(sv1_np, np.ndarray)
    assert sv1_np.tolist() == [1., 2.]


# ----- beyond TensorFlow's cases: any slice, and integer scatter_div ------------------------------

@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 4), min_size=1, max_size=4),
       start=st.none() | st.integers(-12, 12), stop=st.none() | st.integers(-12, 12),
       step=st.none() | st.integers(-5, 5).filter(bool))
def test_any_row_slice_reads_as_numpy(sizes, start, stop, step):
    whole = np.arange(sum(sizes) * 2).reshape(-1, 2)
    offsets = np.cumsum([0, *sizes])
    sv = ShardedVariable([V(whole[a:b]) for a, b in zip(offsets[:-1], offsets[1:])])
    key = slice(start, stop, step)
    np.testing.assert_array_equal(sv[key], whole[key])
    np.testing.assert_array_equal(sv[key, 1], whole[key, 1])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(-7, 7).filter(bool)), max_size=12),
       st.sampled_from([np.int32, np.int64]))
def test_integer_scatter_div_truncates_each_division_in_turn(updates, dtype):
    # TensorFlow's ScatterDiv on integers divides as C++ does, toward zero, for each update
    start = np.arange(-30, 30, 10, dtype=dtype)
    expected = start.copy()
    for row, divisor in updates:
        expected[row] = int(expected[row] / divisor)
    v = V(start)
    indices = np.array([row for row, _ in updates], np.int64)
    v.scatter_div(cv.IndexedSlices(np.array([d for _, d in updates], dtype), indices))
    np.testing.assert_array_equal(v.numpy(), expected)


def test_integer_scatter_div_by_zero_fails():
    v = V(np.array([4, 5]))
    with pytest.raises(ValueError, match="division by zero"):
        v.scatter_div(cv.IndexedSlices(np.array([0]), np.array([1])))
    assert v.numpy().tolist() == [4, 5]
