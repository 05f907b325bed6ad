"""A worker found gone is declared lost at once, and a draining worker leaves cleanly: real
servers in this process (the chaos suite kills real processes)."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import cloudpickle

from convoy._transport import rpc as _rpc
from convoy.data import Dataset
from convoy.data.service import distribute
from convoy.data.service import service_pb2 as pb
from convoy.data.service._common.wire import DISPATCHER, DISPATCHER_METHODS
from convoy.testing import InProcessCluster

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def report(cluster: InProcessCluster, address: str) -> bool:
    client = _rpc.Client(cluster.address, DISPATCHER, DISPATCHER_METHODS)
    try:
        answer = client.call("ReportUnreachableWorker", pb.ReportUnreachableWorkerRequest(
            worker_address=address, task_id=1, client_id=1), timeout=30)
    finally:
        client.close()
    return bool(answer.declared_lost)


def registered(cluster: InProcessCluster) -> set[str]:
    handlers = cluster.dispatcher._handlers
    with handlers.lock:
        return set(handlers.state.workers)


def test_a_reported_worker_is_declared_lost_only_if_the_dispatcher_cannot_reach_it() -> None:
    with InProcessCluster(num_workers=2, heartbeat_interval_ms=60_000) as cluster:
        alive, gone = cluster.workers
        assert not report(cluster, alive._address)  # it answers the dispatcher's ping
        assert not report(cluster, "localhost:1")  # no such worker: nothing to declare
        address = gone._address
        gone.stop()
        assert report(cluster, address)
        assert registered(cluster) == {alive._address}
        assert not report(cluster, address)  # already lost


def slow(x: Any) -> Any:
    time.sleep(0.0005)
    return x


def test_a_draining_worker_hands_its_dynamic_task_on_exactly_once() -> None:
    """drain(): the consumers take what the worker buffered, it deregisters (no wait for
    worker_timeout_ms), and the other worker runs the rest of its task: every element once."""
    count = 4000
    with InProcessCluster(num_workers=2) as cluster:
        received: list[int] = []
        errors: list[BaseException] = []

        def consume() -> None:
            try:
                received.extend(int(x) for x in Dataset.range(count).map(slow).apply(
                    distribute("distributed_epoch", cluster.target)))
            except BaseException as error:  # noqa: BLE001  # reported by the assertion
                errors.append(error)

        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        while len(received) < count // 4:
            assert consumer.is_alive(), errors
            time.sleep(0.01)
        leaving = cluster.workers[0]
        address = leaving._address
        assert leaving.drain(timeout_s=10.0)
        assert address not in registered(cluster)
        consumer.join(60)
        assert not consumer.is_alive() and not errors, errors
    assert sorted(received) == list(range(count))
