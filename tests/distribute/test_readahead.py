"""Read-ahead of a scheduled function's whole-variable reads: the decisions of
:class:`ReadAhead` alone, then a real parameter server process answering a read sent ahead."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from convoy.distribute._readahead import ReadAhead, plan_of, remember, whole_read
from convoy.distribute._store_clients import RemoteStore
from convoy.distribute._worker_calls import RunningCall, enter_call
from convoy.testing import TrainingCluster

A, B = "store-a", "store-b"  # stores only serve as keys here
GATHER = [("gather", "table", np.array([1, 2]))]


def test_whole_read_is_one_read_of_a_named_variable():
    assert whole_read([("read", "w")]) == "w"
    assert whole_read([("read", "w"), ("read", "b")]) is None
    assert whole_read([("gather", "w", [0])]) is None
    assert whole_read([("read", 3)]) is None
    assert whole_read([]) is None


def test_the_first_read_sends_the_plan_once():
    reads = ReadAhead(((A, "w"), (B, "b")))
    assert reads.on_operations(A, GATHER) == (None, [(A, "w"), (B, "b")])
    assert reads.on_operations(B, GATHER) == (None, [])  # sent once only


def test_a_first_read_in_the_plan_is_not_sent_twice():
    reads = ReadAhead(((A, "w"), (B, "b")))
    assert reads.on_operations(A, [("read", "w")]) == (None, [(B, "b")])


def test_a_read_sent_ahead_is_answered_once():
    reads = ReadAhead(((A, "w"),))
    reads.on_operations(A, GATHER)
    reads.prefetched((A, "w"), "answer")
    assert reads.on_operations(A, [("read", "w")]) == ("answer", [])
    assert reads.on_operations(A, [("read", "w")]) == (None, [])  # a second read goes out
    assert reads.on_operations(B, [("read", "w")]) == (None, [])  # another store's w


def test_an_update_drops_the_reads_sent_ahead_and_ends_the_plan():
    reads = ReadAhead(((A, "w"),))
    reads.on_operations(A, GATHER)
    reads.prefetched((A, "w"), "answer")
    assert reads.on_operations(B, [("assign_sub", "b", 1.0)]) == (None, [])
    assert reads.on_operations(A, [("read", "w")]) == (None, [])
    assert reads.reads == []  # reads after an update are not read ahead next time


def test_an_update_before_the_first_read_sends_no_plan():
    reads = ReadAhead(((A, "w"),))
    assert reads.on_operations(A, [("scatter_sub", "table", [0], [[1.0]])]) == (None, [])
    assert reads.on_operations(A, GATHER) == (None, [])


def test_the_next_plan_is_the_whole_reads_before_the_first_update_once_each():
    reads = ReadAhead()
    reads.on_operations(A, GATHER)
    for store, key in [(A, "w"), (B, "b"), (A, "w")]:
        reads.on_operations(store, [("read", key)])
    reads.on_operations(A, [("assign", "w", 0.0)])
    reads.on_operations(B, [("read", "c")])
    assert reads.reads == [(A, "w"), (B, "b")]


def test_plans_are_kept_per_function():
    remember(b"f", [(A, "w")])
    remember(b"g", [])
    assert plan_of(b"f") == ((A, "w"),)
    assert plan_of(b"g") == ()
    assert plan_of(b"never run") == ()


@pytest.fixture(scope="module")
def store():
    with TrainingCluster(num_workers=0, num_ps=1) as cluster:
        remote = RemoteStore(cluster.cluster["ps"][0], 0)
        remote.execute([("create", "w", np.zeros(3)), ("create", "table", np.zeros((4, 2)))])
        yield remote


def _assign_elsewhere(store: RemoteStore, value: float) -> None:
    """Assign w from a thread outside the running call, waiting until it is applied."""
    thread = threading.Thread(target=store.execute, args=([("assign", "w", np.full(3, value))],))
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()


@pytest.mark.timeout(120)
def test_a_read_sent_ahead_answers_with_the_value_when_it_was_sent(store):
    _assign_elsewhere(store, 1.0)
    enter_call(RunningCall(ReadAhead(((store, "w"),))))
    try:
        store.execute([("gather", "table", np.array([0]))])  # w is read along with it
        _assign_elsewhere(store, 2.0)  # a concurrent writer: either answer is allowed
        np.testing.assert_array_equal(store.execute([("read", "w")])[0], np.ones(3))
        store.execute([("assign_add", "w", np.ones(3))])  # its own update...
        np.testing.assert_array_equal(store.execute([("read", "w")])[0], np.full(3, 3.0))
    finally:
        enter_call(None)
    np.testing.assert_array_equal(store.execute([("read", "w")])[0], np.full(3, 3.0))
