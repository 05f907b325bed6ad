"""A process's handles on parameter servers, against a real ``convoy server`` process:
operation lists from many threads share ``Execute`` messages yet each gets its own results or
error, and a ps that cannot be reached or stops answering fails every queued caller.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from convoy._transport import rpc as _rpc
from convoy.distribute import _outbox
from convoy.distribute._operations import Create, Gather, Read, ScatterAdd
from convoy.distribute._store_clients import execute_all, remote_store
from convoy.errors import InvalidArgumentError, NotFoundError, UnavailableError
from convoy.testing import TrainingCluster, free_port, stop_process

ROWS, WIDTH = 64, 4  # the shape of the ``table`` fixture's variable


def counting_calls(store):
    """Wrap the store's Execute stream so the number of messages sent can be read."""
    counted = {"calls": 0}
    begin = store._stream.begin

    def counting(*args, **kwargs):
        counted["calls"] += 1
        return begin(*args, **kwargs)

    store._stream.begin = counting
    return counted, lambda: delattr(store._stream, "begin")


@pytest.mark.timeout(60)
def test_operation_lists_from_many_threads_each_get_their_results(table):
    store, name = table
    threads, per_thread = 8, 40
    failures = []
    sent = store.lists_sent

    def work(thread):
        try:
            for i in range(per_thread):
                row = (thread * per_thread + i) % ROWS
                gathered, _ = store.execute([
                    Gather(name, np.array([row])),
                    ScatterAdd(name, np.array([row]), np.ones((1, WIDTH))),
                ])
                assert gathered.shape == (1, WIDTH)
        except Exception as error:  # reported below, not lost in the thread
            failures.append(error)

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert not failures
    assert store.lists_sent - sent == threads * per_thread  # counted without losing any
    expected = np.bincount(np.arange(threads * per_thread) % ROWS, minlength=ROWS)
    np.testing.assert_array_equal(store.execute([Read(name)])[0],
                                  np.repeat(expected[:, None], WIDTH, axis=1))


@pytest.mark.timeout(60)
def test_queued_operation_lists_share_calls(table):
    store, name = table
    counted, restore = counting_calls(store)
    try:
        futures = [store.execute_async([ScatterAdd(name, np.array([i % ROWS]),
                                         np.ones((1, WIDTH)))]) for i in range(200)]
        assert [f.result(timeout=30) for f in futures] == [[None]] * 200
    finally:
        restore()
    assert 0 < counted["calls"] < 100, "queued operation lists were not sent together"
    assert store.execute([Read(name)])[0].sum() == 200 * WIDTH


@pytest.mark.timeout(60)
def test_a_caller_sends_from_its_own_thread_with_what_is_queued_before_it(table):
    """execute_all sends from the calling thread when the store is idle (no hand-over to the
    sender thread), carrying the lists queued before it in the same message, and never ahead
    of one: a read after this thread's queued updates sees them all."""
    store, name = table
    senders = []
    begin = store._stream.begin

    def noting(*args, **kwargs):
        senders.append(threading.current_thread())
        return begin(*args, **kwargs)

    store._stream.begin = noting
    try:
        before = store.execute([Read(name)])[0].sum()
        senders.clear()
        assert execute_all([(store, [Read(name)])])[0][0].sum() == before
        assert senders == [threading.current_thread()]  # idle: sent from here
        for round_ in range(20):
            for i in range(10):  # queued: the sender thread or the read below sends them
                store.execute_async([ScatterAdd(name, np.array([i]), np.ones((1, WIDTH)))])
            total = execute_all([(store, [Read(name)])])[0][0].sum()
            assert total == before + (round_ + 1) * 10 * WIDTH  # all queued before, applied
    finally:
        del store._stream.begin


@pytest.mark.timeout(60)
def test_updates_queued_for_later_travel_with_the_next_message_or_on_their_own(
        table, monkeypatch):
    """execute_later's lists leave with the process's next message to the ps (one message for
    both), or with flush(), or on their own once CARRY_S has passed."""
    store, name = table
    before = store.execute([Read(name)])[0].sum()
    counted, restore = counting_calls(store)
    one_row = np.ones((1, WIDTH))
    try:
        monkeypatch.setattr(_outbox, "CARRY_S", 30.0)
        later = [store.execute_later([ScatterAdd(name, np.array([i]), one_row)])
                 for i in range(3)]
        time.sleep(0.2)
        assert counted["calls"] == 0 and not any(future.done() for future in later)
        [[total]] = execute_all([(store, [Read(name)])])
        assert total.sum() == before + 3 * WIDTH  # applied first, in the same message
        assert counted["calls"] == 1 and all(future.done() for future in later)

        waiting = store.execute_later([ScatterAdd(name, np.array([0]), one_row)])
        store.flush()
        assert waiting.result(timeout=0) == [None] and counted["calls"] == 2
        store.flush()  # nothing queued: nothing sent
        assert counted["calls"] == 2

        monkeypatch.setattr(_outbox, "CARRY_S", 0.05)
        alone = store.execute_later([ScatterAdd(name, np.array([0]), one_row)])
        assert alone.result(timeout=10) == [None] and counted["calls"] == 3
    finally:
        restore()


@pytest.mark.timeout(60)
def test_a_failing_operation_list_fails_only_its_caller(table):
    store, name = table
    one = np.ones((1, WIDTH))
    futures = [
        store.execute_async([ScatterAdd(name, np.array([0]), one)]),
        store.execute_async([ScatterAdd("no-such-variable", np.array([0]), one)]),
        store.execute_async([ScatterAdd(name, np.array([ROWS]), one)]),
        store.execute_async([Gather(name, lambda: 0)]),  # does not pickle
        store.execute_async([("scatter_add", name)]),  # a tuple, no operation
        store.execute_async([ScatterAdd(name, np.array([1]), one)]),
    ]
    assert futures[0].result(timeout=30) == [None]
    with pytest.raises(NotFoundError, match="no-such-variable"):
        futures[1].result(timeout=30)
    with pytest.raises(InvalidArgumentError, match=rf"\[0, {ROWS}\)"):
        futures[2].result(timeout=30)
    with pytest.raises(InvalidArgumentError, match="cannot be sent to its parameter server"):
        futures[3].result(timeout=30)
    with pytest.raises(InvalidArgumentError, match=r"unknown variable operation \('scatter_add'"):
        futures[4].result(timeout=30)
    assert futures[5].result(timeout=30) == [None]
    value = store.execute([Read(name)])[0]
    assert value[:2].tolist() == [[1.0] * WIDTH] * 2 and value[2:].sum() == 0


def test_transport_failures_reach_every_queued_caller():
    store = remote_store(f"localhost:{free_port()}", 0)
    futures = [store.execute_async([Read("x")]) for _ in range(5)]
    for future in futures:
        with pytest.raises(Exception) as raised:
            future.result(timeout=90)
        assert "Execute at" in str(raised.value)


@pytest.mark.timeout(120)
def test_a_stopped_ps_fails_calls_instead_of_hanging():
    # SIGSTOP: the process is there but never answers. Its stream has no deadline; keepalive
    # pings unanswered for about 2 x KEEPALIVE_MS fail it, and it serves again after SIGCONT.
    with TrainingCluster(num_workers=1, num_ps=1) as stopped_cluster:
        store = remote_store(stopped_cluster.cluster["ps"][0], 0)
        store.execute([Create("v", np.arange(3.0))])
        pid = stopped_cluster.servers[("ps", 0)].process.pid
        stop_process(pid)
        started = time.monotonic()
        try:
            with pytest.raises(UnavailableError, match="Execute at"):
                store.execute([Read("v")])
            assert time.monotonic() - started < 4 * _rpc.KEEPALIVE_MS / 1000
        finally:
            os.kill(pid, signal.SIGCONT)
        np.testing.assert_array_equal(store.execute([Read("v")])[0], np.arange(3.0))
