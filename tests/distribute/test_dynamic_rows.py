"""A dynamic table's rows on one store (DynamicRows): creation on first lookup, the seeded
initializer, growth, eviction at max_rows, optimizer slots per row, export and load."""

from __future__ import annotations

import numpy as np
import pytest

from convoy._values.slices import IndexedSlices
from convoy.distribute._dynamic_rows import DynamicRows, RowInitializer
from convoy.distribute._updates import apply_update
from convoy.errors import InvalidArgumentError


def test_a_row_is_made_on_first_lookup_and_found_after():
    table = DynamicRows(4, initializer=RowInitializer(seed=3))
    first = table.lookup(np.array([[7, 2**63 - 1], [7, 0]]))
    assert first.shape == (2, 2, 4) and table.size() == 3
    np.testing.assert_array_equal(first[0, 0], first[1, 0])
    np.testing.assert_array_equal(table.lookup(np.array([2**63 - 1]))[0], first[0, 1])
    assert sorted(table.keys()) == [0, 7, 2**63 - 1]


def test_the_initializer_depends_on_the_id_and_seed_alone():
    ids = np.array([5, 1 << 40, 2**63 - 1])
    one, other = DynamicRows(8, initializer=RowInitializer(seed=1)), \
        DynamicRows(8, initializer=RowInitializer(seed=1))
    other.lookup(np.arange(1000))  # other rows first, in another order
    np.testing.assert_array_equal(one.lookup(ids), other.lookup(ids[::-1])[::-1])
    assert not np.allclose(one.lookup(ids), DynamicRows(
        8, initializer=RowInitializer(seed=2)).lookup(ids))


def test_default_rows_are_standard_normal_like_nn_embedding():
    values = RowInitializer(seed=0)(np.arange(20000), 16)
    assert abs(values.mean()) < 0.01 and abs(values.std() - 1) < 0.01
    uniform = RowInitializer("uniform", -0.5, 0.5, seed=0)(np.arange(1000), 4)
    assert uniform.min() >= -0.5 and uniform.max() < 0.5


def test_many_rows_grow_the_storage_and_stay_distinct():
    table = DynamicRows(2, capacity=16)
    ids = np.random.default_rng(0).choice(2**62, 50000, replace=False)
    for part in np.array_split(ids, 37):
        table.lookup(part)
    assert table.size() == 50000
    np.testing.assert_array_equal(np.sort(table.keys()), np.sort(ids))
    np.testing.assert_array_equal(table.lookup(ids[:10]), table.lookup(ids[:10]))


def test_the_index_agrees_with_a_dict_through_evictions_and_rebuilds():
    """Many lookups that evict (tombstones in the index) and grow it (rebuilds): every id
    held is found at its row, with its own id, and no id is held twice."""
    rng = np.random.default_rng(7)
    table = DynamicRows(2, max_rows=300, eviction="lru", capacity=16)
    made: dict[int, np.ndarray] = {}
    for _ in range(200):
        ids = np.unique(rng.integers(0, 2_000, rng.integers(1, 60)))
        rows = table.lookup(ids)
        for id_, row in zip(ids.tolist(), rows, strict=True):
            if id_ in made and id_ in set(table.keys().tolist()):
                np.testing.assert_array_equal(made[id_], row)
            made[id_] = row
    keys = table.keys()
    assert keys.size == table.size() == np.unique(keys).size <= 300
    found = table.find(keys)
    np.testing.assert_array_equal(table.ids[found], keys)
    assert (table.find(np.setdiff1d(np.arange(2_000), keys)) == -1).all()


def test_the_compiled_index_refuses_bad_arrays():
    from convoy.distribute import _row_index

    index = np.full(16, -1, np.int32)
    keys, ids = np.zeros(4, np.int64), np.array([1, 2], np.int64)
    out = np.empty(2, np.int64), np.empty(2, np.int64)
    with pytest.raises(TypeError, match="ids"):
        _row_index.probe(index, keys, ids.astype(np.int32), *out)
    with pytest.raises(ValueError, match="power of two"):
        _row_index.probe(np.full(12, -1, np.int32), keys, ids, *out)
    with pytest.raises(ValueError, match="as long as ids"):
        _row_index.probe(index, keys, ids, np.empty(1, np.int64), out[1])
    index[:] = 9  # rows past the keys, and no empty entry to end a search
    with pytest.raises(RuntimeError, match="corrupt"):
        _row_index.probe(index, keys, ids, *out)
    with pytest.raises(RuntimeError, match="full"):
        _row_index.insert(np.full(16, 0, np.int32), ids, np.array([0, 1], np.int64))


@pytest.mark.parametrize("eviction", ["lru", "lfu"])
def test_eviction_keeps_max_rows_and_drops_the_least_used(eviction):
    table = DynamicRows(2, max_rows=10, eviction=eviction)
    table.lookup(np.arange(10))
    for _ in range(3):  # ids 0..4: recently and often used
        table.lookup(np.arange(5))
    table.lookup(np.arange(100, 105))
    assert table.size() == 10 and table.evictions == 5
    assert sorted(table.keys()) == [0, 1, 2, 3, 4, 100, 101, 102, 103, 104]


def test_an_evicted_id_comes_back_as_new_with_fresh_slots():
    table = DynamicRows(2, max_rows=2, eviction="lru", initializer=RowInitializer(seed=4))
    original = table.lookup(np.array([1]))
    apply_to(table, {"name": "Adagrad", "learning_rate": 0.1, "initial_accumulator_value": 0.1,
                     "epsilon": 1e-7}, [1], np.ones((1, 2)))
    table.lookup(np.array([2, 3]))  # evicts 1
    assert 1 not in set(table.keys())
    np.testing.assert_array_equal(table.lookup(np.array([1])), original)
    row = table.find(np.array([1]))[0]
    np.testing.assert_allclose(table.slots["accumulator"][row], [0.1, 0.1])


def test_without_eviction_a_full_table_refuses_new_ids():
    table = DynamicRows(2, max_rows=3)
    table.lookup(np.arange(3))
    with pytest.raises(InvalidArgumentError, match="max_rows 3 rows and has no eviction"):
        table.lookup(np.array([9]))
    with pytest.raises(InvalidArgumentError, match="more than the table's max_rows"):
        DynamicRows(2, max_rows=3, eviction="lru").lookup(np.arange(4))


def apply_to(table, config, ids, gradient):
    table.apply(lambda variable, grad, slot: apply_update(config, variable, grad, slot),
                IndexedSlices(np.asarray(gradient, np.float32), np.asarray(ids)))


@pytest.mark.parametrize("config, slots", [
    ({"name": "SGD", "learning_rate": 0.1, "momentum": 0.9}, {"momentum"}),
    ({"name": "Adagrad", "learning_rate": 0.1, "initial_accumulator_value": 0.1,
      "epsilon": 1e-7}, {"accumulator"}),
    ({"name": "Adam", "learning_rate": 0.1, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7},
     {"m", "v"}),
    ({"name": "RMSprop", "learning_rate": 0.1, "rho": 0.9, "momentum": 0.5, "epsilon": 1e-7,
      "centered": True}, {"velocity", "average_gradient", "rms_momentum"}),
    ({"name": "Ftrl", "learning_rate": 0.1, "learning_rate_power": -0.5,
      "initial_accumulator_value": 0.1, "l1_regularization_strength": 0.01,
      "l2_regularization_strength": 0.01, "l2_shrinkage_regularization_strength": 0.0,
      "beta": 0.0}, {"accumulator", "linear"}),
])
def test_each_optimizer_updates_rows_as_it_updates_a_fixed_table(config, slots):
    ids, gradient = np.array([9, 2**40, 9]), np.arange(6, dtype=np.float32).reshape(3, 2)
    table = DynamicRows(2, initializer=RowInitializer(seed=5))
    start = table.lookup(np.array([9, 2**40]))
    fixed, fixed_slots = start.copy(), {}

    def slot(name, like, initial):
        if like is not fixed:
            return fixed_slots.setdefault(name, np.full_like(like, initial))
        return fixed_slots.setdefault(name, np.full_like(fixed, initial))

    for _ in range(2):
        apply_to(table, config, ids, gradient)
        apply_update(config, fixed, IndexedSlices(gradient, np.array([0, 1, 0])), slot)
    np.testing.assert_allclose(table.lookup(np.array([9, 2**40])), fixed, rtol=1e-6)
    assert set(table.slots) == slots
    for name in slots:
        np.testing.assert_allclose(table.slots[name][table.find(np.array([9, 2**40]))],
                                   fixed_slots[name], rtol=1e-6)


def test_export_and_load_carry_rows_and_slots():
    table = DynamicRows(3)
    apply_to(table, {"name": "Adagrad", "learning_rate": 0.1, "initial_accumulator_value": 0.1,
                     "epsilon": 1e-7}, [4, 8], np.ones((2, 3)))
    state = table.export()
    copy = DynamicRows(3)
    copy.load(state["ids"], state["rows"], state["slots"], state["slot_initial"])
    np.testing.assert_array_equal(copy.lookup(np.array([4, 8])), table.lookup(np.array([4, 8])))
    np.testing.assert_array_equal(copy.export()["slots"]["accumulator"],
                                  state["slots"]["accumulator"])


@pytest.mark.parametrize("ids, message", [
    (np.array([3, -1]), "must be non-negative, got -1"),
    (np.array([1.5]), "must be integers in"),
    (np.array([2**64 - 1], np.uint64), "must be integers in"),
])
def test_bad_ids_are_refused(ids, message):
    with pytest.raises(InvalidArgumentError, match=message):
        DynamicRows(2).lookup(ids)


def test_bad_bounds_are_refused():
    with pytest.raises(InvalidArgumentError, match="eviction must be None, 'lru' or 'lfu'"):
        DynamicRows(2, max_rows=3, eviction="fifo")
    with pytest.raises(InvalidArgumentError, match="needs max_rows"):
        DynamicRows(2, eviction="lru")
    with pytest.raises(InvalidArgumentError, match="max_rows must be a positive int"):
        DynamicRows(2, max_rows=0)
