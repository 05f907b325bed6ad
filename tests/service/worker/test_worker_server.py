"""The worker's shell with real gRPC servers in this process: a task's end reaches the
dispatcher before any consumer hears of it, and a stopping worker answers the calls it is
serving instead of having them cancelled."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from convoy._transport import rpc as _rpc
from convoy.data import Dataset
from convoy.data.service import service_pb2 as pb
from convoy.data.service._common.wire import (
    DISPATCHER,
    DISPATCHER_METHODS,
    END_OF_SEQUENCE,
    WORKER,
    WORKER_METHODS,
)
from convoy.data.service._distribute import _Registration
from convoy.errors import UnavailableError
from convoy.testing import InProcessCluster

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def cluster() -> Iterator[InProcessCluster]:
    # heartbeats only when something happens: a periodic one cannot bring the news in time
    with InProcessCluster(num_workers=1, heartbeat_interval_ms=60_000) as local:
        yield local


def start_task(cluster: InProcessCluster, dataset: Dataset, mode: str) -> int:
    """Register ``dataset``, make an iteration of it; returns its task on the worker."""
    dispatcher = _rpc.Client(cluster.address, DISPATCHER, DISPATCHER_METHODS)
    registration = _Registration.of(dataset, None, with_spec=False)
    dataset_id = dispatcher.call("RegisterDataset", pb.RegisterDatasetRequest(
        dataset=registration.payload, fingerprint=registration.fingerprint,
        num_split_units=registration.num_split_units)).dataset_id
    job = dispatcher.call("GetOrCreateJob", pb.GetOrCreateJobRequest(
        dataset_id=dataset_id, options=pb.JobOptions(processing_mode=mode)))
    iteration = dispatcher.call("GetOrCreateIteration",
                                pb.GetOrCreateIterationRequest(job_id=job.job_id))
    view = dispatcher.call("ClientHeartbeat",
                           pb.ClientHeartbeatRequest(client_id=iteration.client_id))
    dispatcher.close()
    (task,) = view.tasks
    return task.task_id


def get_elements(cluster: InProcessCluster, task_id: int) -> Any:
    worker = _rpc.Client(cluster.workers[0]._address, WORKER, WORKER_METHODS)
    try:
        return worker.call("GetElements", pb.GetElementsRequest(
            task_id=task_id, consumer_index=-1, max_elements=1000, max_bytes=1 << 20))
    finally:
        worker.close()


@pytest.mark.parametrize("mode", ["OFF", "DYNAMIC"])
def test_a_consumer_hears_of_an_end_only_once_the_dispatcher_knows_it(
        cluster: InProcessCluster, mode: str) -> None:
    task_id = start_task(cluster, Dataset.range(10), mode)
    state = cluster.dispatcher._handlers.state
    started = time.monotonic()
    while (reply := get_elements(cluster, task_id))[:1] != END_OF_SEQUENCE:
        assert not state.tasks[task_id].finished
    # finished (kept while its consumer may still save a position that names it)
    assert task_id not in state.tasks or state.tasks[task_id].finished
    assert time.monotonic() - started < 5  # not a periodic heartbeat's doing
    assert reply == END_OF_SEQUENCE
    assert get_elements(cluster, task_id) == END_OF_SEQUENCE  # and for late consumers


def slow(x: Any) -> Any:
    time.sleep(0.05)
    return x


def test_a_stopping_worker_answers_the_calls_it_serves(cluster: InProcessCluster) -> None:
    task_id = start_task(cluster, Dataset.range(1000).map(slow).batch(1000), "OFF")
    outcome: list[Any] = []
    call = threading.Thread(target=lambda: outcome.append(_outcome(cluster, task_id)))
    call.start()
    time.sleep(0.2)  # the call waits for the first (slow) batch
    cluster.workers[0].stop()
    call.join(10)
    (error,) = outcome
    assert isinstance(error, UnavailableError), repr(error)  # not cancelled


def _outcome(cluster: InProcessCluster, task_id: int) -> Any:
    try:
        return get_elements(cluster, task_id)
    except UnavailableError as error:
        return error
