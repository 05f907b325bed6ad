"""Read-ahead of a scheduled function's whole-variable reads: the decisions of
:class:`ReadAhead` alone, then a real parameter server process answering a read sent ahead."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from convoy.distribute._operations import (
    Assign,
    AssignAdd,
    AssignSub,
    Create,
    Gather,
    Read,
    ScatterSub,
    Slots,
)
from convoy.distribute._readahead import ReadAhead, plan_of, remember, whole_read
from convoy.distribute._store_clients import RemoteStore
from convoy.distribute._worker_calls import RunningCall, enter_call
from convoy.testing import TrainingCluster

A, B = "store-a", "store-b"  # stores only serve as keys here
GATHER = [Gather("table", np.array([1, 2]))]


def test_whole_read_is_one_read_of_a_named_variable():
    assert whole_read([Read("w")]) == "w"
    assert whole_read([Read("w"), Read("b")]) is None
    assert whole_read([Gather("w", [0])]) is None
    assert whole_read([Read(3)]) is None
    assert whole_read([("read", "w")]) is None  # a tuple of the old layout, no operation
    assert whole_read([]) is None


def test_reads_of_every_read_only_kind_keep_the_plan_and_an_update_ends_it():
    reads = ReadAhead(((A, "w"),))
    assert reads.on_operations(A, [Slots("t"), Gather("t", [0])]) == (None, [(A, "w")])
    reads.prefetched((A, "w"), "answer")
    assert reads.on_operations(B, [Read("b"), ("read", "c")]) == (None, [])  # not read-only
    assert reads.on_operations(A, [Read("w")]) == (None, [])  # dropped at that "update"


def test_the_first_read_sends_the_plan_once():
    reads = ReadAhead(((A, "w"), (B, "b")))
    assert reads.on_operations(A, GATHER) == (None, [(A, "w"), (B, "b")])
    assert reads.on_operations(B, GATHER) == (None, [])  # sent once only


def test_a_first_read_in_the_plan_is_not_sent_twice():
    reads = ReadAhead(((A, "w"), (B, "b")))
    assert reads.on_operations(A, [Read("w")]) == (None, [(B, "b")])


def test_a_read_sent_ahead_is_answered_once():
    reads = ReadAhead(((A, "w"),))
    reads.on_operations(A, GATHER)
    reads.prefetched((A, "w"), "answer")
    assert reads.on_operations(A, [Read("w")]) == ("answer", [])
    assert reads.on_operations(A, [Read("w")]) == (None, [])  # a second read goes out
    assert reads.on_operations(B, [Read("w")]) == (None, [])  # another store's w


def test_an_update_drops_the_reads_sent_ahead_and_ends_the_plan():
    reads = ReadAhead(((A, "w"),))
    reads.on_operations(A, GATHER)
    reads.prefetched((A, "w"), "answer")
    assert reads.on_operations(B, [AssignSub("b", 1.0)]) == (None, [])
    assert reads.on_operations(A, [Read("w")]) == (None, [])
    assert reads.reads == []  # reads after an update are not read ahead next time


def test_an_update_before_the_first_read_sends_no_plan():
    reads = ReadAhead(((A, "w"),))
    assert reads.on_operations(A, [ScatterSub("table", [0], [[1.0]])]) == (None, [])
    assert reads.on_operations(A, GATHER) == (None, [])


def test_the_next_plan_is_the_whole_reads_before_the_first_update_once_each():
    reads = ReadAhead()
    reads.on_operations(A, GATHER)
    for store, key in [(A, "w"), (B, "b"), (A, "w")]:
        reads.on_operations(store, [Read(key)])
    reads.on_operations(A, [Assign("w", 0.0)])
    reads.on_operations(B, [Read("c")])
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
        remote.execute([Create("w", np.zeros(3)), Create("table", np.zeros((4, 2)))])
        yield remote


def _assign_elsewhere(store: RemoteStore, value: float) -> None:
    """Assign w from a thread outside the running call, waiting until it is applied."""
    thread = threading.Thread(target=store.execute, args=([Assign("w", np.full(3, value))],))
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive()


@pytest.mark.timeout(120)
def test_a_read_sent_ahead_answers_with_the_value_when_it_was_sent(store):
    _assign_elsewhere(store, 1.0)
    enter_call(RunningCall(ReadAhead(((store, "w"),))))
    try:
        store.execute([Gather("table", np.array([0]))])  # w is read along with it
        _assign_elsewhere(store, 2.0)  # a concurrent writer: either answer is allowed
        np.testing.assert_array_equal(store.execute([Read("w")])[0], np.ones(3))
        store.execute([AssignAdd("w", np.ones(3))])  # its own update...
        np.testing.assert_array_equal(store.execute([Read("w")])[0], np.full(3, 3.0))
    finally:
        enter_call(None)
    np.testing.assert_array_equal(store.execute([Read("w")])[0], np.full(3, 3.0))
