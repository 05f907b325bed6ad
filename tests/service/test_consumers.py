"""A consumer's reading through real servers: consumers sharing a named job, workers it cannot
reach or that stop answering, and the clients a reader opens and closes."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest

import convoy as cv
from convoy.data.service import _client_reader as _reader
from convoy.data.service import _distribute as _client
from convoy.errors import UnavailableError
from convoy.testing import InProcessCluster, ProcessCluster, free_port, stop_process

cloudpickle.register_pickle_by_value(sys.modules[__name__])

service = cv.data.service
OFF = service.ShardingPolicy.OFF
DYNAMIC = service.ShardingPolicy.DYNAMIC
WINDOW = 64  # a named job's default


def distributed(n: int, target: str, mode: Any = DYNAMIC, **kwargs: Any) -> cv.data.Dataset:
    return cv.data.Dataset.range(n).apply(service.distribute(mode, target, **kwargs))


def alternate(first: Iterator[Any], second: Iterator[Any]) -> tuple[list[int], list[int], int]:
    """Read one element from each in turn until both end. Returns what each got, and how many
    elements the one that ended last returned after the other had ended."""
    iterators = [first, second]
    got: list[list[int]] = [[], []]
    live = [0, 1]
    survivor, count_at_first_end = 0, 0
    while live:
        for index in list(live):
            try:
                got[index].append(int(next(iterators[index])))
            except StopIteration:
                live.remove(index)
                if live:
                    survivor = live[0]
                    count_at_first_end = len(got[survivor])
    return got[0], got[1], len(got[survivor]) - count_at_first_end


@pytest.fixture
def cluster1() -> Iterator[InProcessCluster]:
    with InProcessCluster(num_workers=1) as cluster:
        yield cluster


# ----- consumers sharing a named job -------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [1, 2])
def test_two_consumers_of_a_named_job_both_get_elements(num_workers: int) -> None:
    with InProcessCluster(num_workers=num_workers) as cluster:
        first = iter(distributed(100, cluster.target, job_name="shared"))
        second = iter(distributed(100, cluster.target, job_name="shared"))
        a, b, left_after_end = alternate(first, second)
    assert a and b, (a, b)
    assert sorted(a + b) == list(range(100))
    assert left_after_end <= WINDOW


@pytest.mark.timeout(60)
def test_a_consumer_joining_a_finishing_job_still_gets_elements(cluster1: InProcessCluster) -> None:
    first = iter(distributed(300, cluster1.target, job_name="finishing"))
    early = [int(next(first)) for _ in range(200)]
    second = iter(distributed(300, cluster1.target, job_name="finishing"))
    a, b, left_after_end = alternate(first, second)
    assert b, len(a)  # the first consumer held no more than its window when the second came
    assert sorted(early + a + b) == list(range(300))
    assert left_after_end <= WINDOW


@pytest.mark.timeout(60)
def test_the_window_is_set_by_max_buffered_elements(cluster1: InProcessCluster) -> None:
    dataset_id = service.register_dataset(cluster1.target, cv.data.Dataset.range(200))

    def consumer() -> Iterator[Any]:
        return iter(service.from_dataset_id(DYNAMIC, cluster1.target, dataset_id,
                                            job_name="small", max_buffered_elements=8))

    a, b, left_after_end = alternate(consumer(), consumer())
    assert sorted(a + b) == list(range(200))
    assert min(len(a), len(b)) >= 90  # each holds at most 8 ahead of the other
    assert left_after_end <= 8


# ----- workers a consumer cannot reach -----------------------------------------------------------

def unreachable_worker(cluster: InProcessCluster) -> str:
    """Add a worker that advertises a port nobody listens on; returns that address."""
    address = f"localhost:{free_port()}"
    cluster.workers.append(service.WorkerServer(service.WorkerConfig(
        dispatcher_address=cluster.address, worker_address=address,
        heartbeat_interval_ms=100)))
    return address


@pytest.mark.timeout(60)
def test_an_unreachable_worker_fails_the_read_naming_it(caplog: Any) -> None:
    with InProcessCluster(num_workers=0) as cluster, caplog.at_level(logging.WARNING):
        address = unreachable_worker(cluster)
        start = time.monotonic()
        with pytest.raises(UnavailableError, match=f"worker {address} .*unreachable for"):
            list(distributed(10, cluster.target, OFF, dispatcher_timeout_ms=2000))
    assert time.monotonic() - start < 20
    assert f"Cannot reach data service worker {address} (task " in caplog.text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", [OFF, DYNAMIC])
def test_the_other_workers_finish_without_an_unreachable_one(mode: Any, caplog: Any) -> None:
    with InProcessCluster(num_workers=1) as cluster, caplog.at_level(logging.WARNING):
        address = unreachable_worker(cluster)
        got = [int(x) for x in distributed(1000, cluster.target, mode,
                                           dispatcher_timeout_ms=2000)]
    assert sorted(got) == list(range(1000))  # OFF: the reachable worker's copy
    if mode is OFF:
        assert f"Reading on without worker {address} (task " in caplog.text
    else:  # reported; the dispatcher cannot reach it either: its task runs elsewhere
        assert f"worker {address} refuses connections" in caplog.text
        assert "Reading on without" not in caplog.text


@pytest.mark.timeout(60)
def test_a_worker_that_dies_mid_read_is_named(caplog: Any) -> None:
    with InProcessCluster(num_workers=1) as cluster, caplog.at_level(logging.WARNING):
        worker = cluster.workers[0]
        address = f"localhost:{worker._port}"
        elements = iter(distributed(10**7, cluster.target, OFF, dispatcher_timeout_ms=2000))
        next(elements)
        worker.stop()
        with pytest.raises(UnavailableError, match=f"worker {address} .*unreachable for"):
            for _ in elements:
                pass
    assert f"Cannot reach data service worker {address} (task " in caplog.text


@pytest.mark.timeout(120)
def test_a_worker_that_stops_answering_is_a_deadline_not_a_hang(monkeypatch: Any) -> None:
    monkeypatch.setattr(_reader, "GET_ELEMENTS_DEADLINE_S", 1.0)
    with ProcessCluster(num_workers=1) as cluster:
        worker = cluster.workers[0]
        elements = iter(distributed(10**7, cluster.target, OFF, dispatcher_timeout_ms=2000))
        next(elements)
        assert worker.process is not None
        stop_process(worker.process.pid)  # alive, but answers nothing
        try:
            start = time.monotonic()
            with pytest.raises(UnavailableError,
                               match=f"worker \\S+:{worker.address.rsplit(':', 1)[1]} "
                                     ".*Deadline Exceeded"):
                for _ in elements:
                    pass
            assert time.monotonic() - start < 30
        finally:
            os.kill(worker.process.pid, signal.SIGCONT)


# ----- what a reader opens, it closes ------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("read_all", [True, False])
def test_a_reader_closes_its_clients(cluster1: InProcessCluster, read_all: bool) -> None:
    iterator = iter(distributed(5000, cluster1.target))
    reader = iterator._root._reader
    next(iterator)
    clients = [reader._dispatcher, *reader._workers.values()]
    assert len(clients) == 2 and not any(client._closed for client in clients)
    if read_all:
        assert len(list(iterator)) == 4999  # the reader closes once the elements end
    else:
        iterator.close()
    assert all(client._closed for client in clients)
    assert reader._workers == {}


@pytest.fixture
def dispatcher_clients(monkeypatch: Any) -> list[Any]:
    """The dispatcher clients data service iterators open from now on."""
    opened: list[Any] = []
    open_client = _client.dispatcher_client
    monkeypatch.setattr(_client, "dispatcher_client",
                        lambda target: opened.append(open_client(target)) or opened[-1])
    return opened


@pytest.mark.timeout(60)
def test_the_dispatcher_client_is_closed_when_registering_fails(
        dispatcher_clients: list[Any]) -> None:
    nobody = f"localhost:{free_port()}"
    with pytest.raises(UnavailableError, match="registering a dataset"):
        iter(distributed(5, nobody, dispatcher_timeout_ms=300))
    assert len(dispatcher_clients) == 1 and dispatcher_clients[0]._closed


@pytest.mark.timeout(60)
def test_the_dispatcher_client_is_closed_when_opening_fails(
        cluster1: InProcessCluster, dispatcher_clients: list[Any]) -> None:
    assert len(list(distributed(10, cluster1.target, DYNAMIC, job_name="mismatch"))) == 10
    with pytest.raises(cv.errors.InvalidArgumentError, match="with different parameters"):
        iter(distributed(10, cluster1.target, OFF, job_name="mismatch"))
    assert len(dispatcher_clients) == 2 and all(c._closed for c in dispatcher_clients)
