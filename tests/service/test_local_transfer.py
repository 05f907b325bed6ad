"""Same-host transfer through shared memory (``target_workers="LOCAL"``, and ``"AUTO"`` with
workers on the consumer's host), with real worker processes: round trips, what is left in
``/dev/shm`` when a worker or a consumer is killed, and every refusal.

Workers "on other hosts" are in-process workers that advertise an address of TEST-NET-1
(192.0.2.0/24, never routed): the dispatcher lists them like any worker, and a LOCAL consumer
must leave them alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import cloudpickle
import numpy as np
import pytest

import convoy as cv
from convoy.data.service._common.host import host_identity
from convoy.data.service._shm import segments as _shm
from convoy.errors import InvalidArgumentError, UnavailableError
from convoy.testing import (
    InProcessCluster,
    ProcessCluster,
    ServerProcess,
    free_port,
    in_shared_memory,
)

# Pipelines defined here run on worker processes, which cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [pytest.mark.skipif(not host_identity(), reason="no POSIX shared memory"),
              pytest.mark.timeout(180)]

service = cv.data.service
OFF = service.ShardingPolicy.OFF
ELSEWHERE = "192.0.2.1"  # TEST-NET-1: an address on no host


@pytest.fixture(scope="module")
def cluster() -> Iterator[ProcessCluster]:
    """One worker process, for the tests that leave it running."""
    with ProcessCluster(num_workers=1) as cluster:
        yield cluster


def pid_of(server: ServerProcess) -> int:
    assert server.process is not None
    return server.process.pid


def segments_of(pid: int) -> list[str]:
    """The segments in /dev/shm written by process ``pid``."""
    return [name for name in _shm.segments(os.getuid()) if _shm.writer_of(name).pid == pid]


def wait_until_gone(pid: int, names: set[str], timeout_s: float = 30.0) -> None:
    """Wait until none of ``names``, segments of process ``pid``, is left."""
    deadline = time.monotonic() + timeout_s
    while left := names & set(segments_of(pid)):
        assert time.monotonic() < deadline, f"left in /dev/shm: {left}"
        time.sleep(0.05)


def images(n: int) -> cv.data.Dataset:
    """Elements of 256 KiB: every answer is large enough for a segment."""
    return cv.data.Dataset.range(n).map(
        lambda i: {"image": np.full((256, 256), i, np.float32), "label": i})


# ----- round trips -------------------------------------------------------------------------------
@pytest.mark.parametrize("target_workers", ["LOCAL", "AUTO", "local", "auto"])
def test_round_trip_through_shared_memory(cluster: ProcessCluster, target_workers: str) -> None:
    read = list(images(20).apply(service.distribute(OFF, cluster.target,
                                                    target_workers=target_workers)))
    assert sorted(int(e["label"]) for e in read) == list(range(20))
    for element in read:
        np.testing.assert_array_equal(element["image"],
                                      np.full((256, 256), element["label"], np.float32))
        assert in_shared_memory(element["image"])
        assert not element["image"].flags.writeable


def test_segments_let_go_of_are_written_again(cluster: ProcessCluster) -> None:
    """500 MiB in answers of at most 16 MiB, each element dropped once read: the worker
    writes into the few segments the consumer has let go of instead of making new ones."""
    worker = pid_of(cluster.workers[0])
    before = set(segments_of(worker))
    read = 0
    for element in images(2000).apply(service.distribute(OFF, cluster.target,
                                                         target_workers="LOCAL")):
        assert in_shared_memory(element["image"])
        assert element["image"][0, 0] == element["label"]
        read += 1
    assert read == 2000
    made = set(segments_of(worker)) - before
    assert len(made) <= 8, made
    del element
    # the reading is over and nothing maps them: the consumer unlinks those it held last,
    # and the worker those it kept for reuse (after 2 s unused)
    wait_until_gone(worker, made, timeout_s=10.0)


def test_local_with_data_transfer_protocol_local(cluster: ProcessCluster) -> None:
    read = list(images(5).apply(service.distribute(
        OFF, cluster.target, target_workers="LOCAL", data_transfer_protocol="local")))
    assert all(in_shared_memory(e["image"]) for e in read)


@pytest.mark.parametrize("options", [{"data_transfer_protocol": "grpc"},
                                     {"target_workers": "ANY"}])
def test_grpc_when_asked_or_for_any(cluster: ProcessCluster, options: dict[str, Any]) -> None:
    read = list(images(5).apply(service.distribute(OFF, cluster.target, **options)))
    assert sorted(int(e["label"]) for e in read) == list(range(5))
    assert not any(in_shared_memory(e["image"]) for e in read)


def test_small_answers_stay_on_the_wire(cluster: ProcessCluster) -> None:
    read = list(cv.data.Dataset.from_tensors(np.arange(1024, dtype=np.float32)).repeat(3)
                .apply(service.distribute(OFF, cluster.target, target_workers="LOCAL")))
    assert len(read) == 3 and not any(in_shared_memory(e) for e in read)


def test_large_elements_in_one_segment_each_call(cluster: ProcessCluster) -> None:
    tensor = np.random.default_rng(0).random((1024, 1024), np.float32)
    read = list(cv.data.Dataset.from_tensors(tensor).repeat(12).apply(
        service.distribute(OFF, cluster.target, target_workers="LOCAL", compression=None)))
    assert len(read) == 12
    for element in read:
        np.testing.assert_array_equal(element, tensor)
        assert in_shared_memory(element)


def test_a_reading_over_leaves_nothing_for_its_worker_to_free() -> None:
    """Once a reading is over and its arrays are gone, no segment it used is left, even if
    the worker is then SIGKILLed before its own timeouts (nobody sweeps here afterwards)."""
    with ProcessCluster(num_workers=1) as cluster:
        worker = pid_of(cluster.workers[0])
        used: set[str] = set()
        read = 0
        for element in images(1200).apply(service.distribute(OFF, cluster.target,
                                                             target_workers="LOCAL")):
            assert in_shared_memory(element["image"])  # each dropped as the next comes,
            used |= set(segments_of(worker))  # so released and written again meanwhile
            read += 1
        assert read == 1200 and used
        del element
        cluster.workers[0].kill()
        assert set(segments_of(worker)) & used == set()


# ----- processes that die ------------------------------------------------------------------------
# A consumer that reads (and claims) a few elements, then takes one answer it never claims, as
# if it died between the answer and its claim; it prints that segment's name and waits.
UNCLAIMING_CONSUMER = """
import itertools, sys, time
import convoy as cv
from convoy._transport import rpc as _rpc
from convoy.data.service import service_pb2 as pb
from convoy.data.service._client.options import dispatcher_client
from convoy.data.service._common.wire import SHARED_MEMORY, WORKER, WORKER_METHODS
from convoy.data.service._shm.consumer_end import reader_identity

target, dataset_id = sys.argv[1:3]
reading = iter(cv.data.service.from_dataset_id("parallel_epochs", target, dataset_id,
                                               target_workers="LOCAL"))
held = list(itertools.islice(reading, 3))
dispatcher = dispatcher_client(target)
job = dispatcher.call("GetOrCreateJob", pb.GetOrCreateJobRequest(
    dataset_id=dataset_id, options=pb.JobOptions(processing_mode="OFF",
                                                 target_workers="LOCAL")))
iteration = dispatcher.call("GetOrCreateIteration",
                            pb.GetOrCreateIterationRequest(job_id=job.job_id))
deadline = time.monotonic() + 60
while not (tasks := dispatcher.call("ClientHeartbeat", pb.ClientHeartbeatRequest(
        client_id=iteration.client_id)).tasks):
    assert time.monotonic() < deadline, "no task"
    time.sleep(0.05)
worker = _rpc.Client(tasks[0].worker_address, WORKER, WORKER_METHODS)
request = pb.GetElementsRequest(task_id=tasks[0].task_id, consumer_index=-1, max_elements=1,
                                max_bytes=1 << 20, shared_memory=reader_identity())
while (reply := worker.call("GetElements", request, timeout=30))[:1] != SHARED_MEMORY:
    assert time.monotonic() < deadline, "no answer"
print(reply[17:].decode(), flush=True)  # past the status, length and handout
sys.stdin.read()
"""


def start_unclaiming_consumer(target: str, dataset_id: str
                              ) -> tuple[subprocess.Popen[str], str]:
    consumer = subprocess.Popen([sys.executable, "-c", UNCLAIMING_CONSUMER, target, dataset_id],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    assert consumer.stdout is not None
    name = consumer.stdout.readline().strip()
    if not name:
        consumer.kill()
        raise AssertionError(f"the consumer failed: {consumer.communicate()[1][-3000:]}")
    return consumer, name


def endless() -> cv.data.Dataset:
    return cv.data.Dataset.from_tensors(np.arange(1 << 16, dtype=np.float32)).repeat()


def test_a_killed_consumer_leaves_no_segment(cluster: ProcessCluster) -> None:
    worker = pid_of(cluster.workers[0])
    before = set(segments_of(worker))
    dataset_id = service.register_dataset(cluster.target, endless())
    consumer, name = start_unclaiming_consumer(cluster.target, dataset_id)
    try:
        assert os.path.exists(os.path.join(_shm.SHM_DIR, name))
        assert _shm.writer_of(name).pid == worker
        handed = set(segments_of(worker)) - before  # the consumer holds all it was sent
        assert name in handed
    finally:
        consumer.kill()
        consumer.wait(30)
    wait_until_gone(worker, handed)  # the worker saw its consumer go


def test_a_killed_worker_leaves_no_segment() -> None:
    with ProcessCluster(num_workers=1) as cluster:
        worker = pid_of(cluster.workers[0])
        dataset_id = service.register_dataset(cluster.target, endless())
        reading = iter(service.from_dataset_id(OFF, cluster.target, dataset_id,
                                               target_workers="LOCAL",
                                               dispatcher_timeout_ms=3000))
        for _ in range(3):
            assert in_shared_memory(next(reading))
        consumer, name = start_unclaiming_consumer(cluster.target, dataset_id)
        try:
            cluster.workers[0].kill()
            assert name in segments_of(worker)  # orphaned: its writer is dead
            port = cluster.workers[0].address.rsplit(":", 1)[1]
            with pytest.raises(UnavailableError, match=f"from worker localhost:{port}"):
                for _ in reading:
                    pass
            assert segments_of(worker) == []  # the reader swept what the worker left
        finally:
            consumer.kill()
            consumer.wait(30)


# ----- which workers, and refusals ---------------------------------------------------------------
@pytest.fixture(scope="module")
def split_cluster() -> Iterator[InProcessCluster]:
    """One worker on this host and one that advertises an address elsewhere."""
    with InProcessCluster(num_workers=1) as cluster:
        cluster.workers.append(service.WorkerServer(service.WorkerConfig(
            dispatcher_address=cluster.address, heartbeat_interval_ms=100,
            worker_address=f"{ELSEWHERE}:%port%")))
        yield cluster


def test_local_reads_only_the_workers_of_this_host(split_cluster: InProcessCluster) -> None:
    read = cv.data.Dataset.range(10).apply(service.distribute(OFF, split_cluster.target,
                                                               target_workers="LOCAL"))
    assert sorted(int(x) for x in read) == list(range(10))  # one copy: the local worker's


def test_local_without_a_local_worker_is_refused() -> None:
    with InProcessCluster(num_workers=0) as cluster:
        cluster.workers.append(service.WorkerServer(service.WorkerConfig(
            dispatcher_address=cluster.address, worker_address=f"{ELSEWHERE}:%port%")))
        read = cv.data.Dataset.range(10).apply(service.distribute(OFF, cluster.target,
                                                                   target_workers="LOCAL"))
        with pytest.raises(InvalidArgumentError,
                           match=r"Local reads require local convoy data service workers, but "
                                 r"no local worker is found.*192\.0\.2\.1"):
            list(read)


def test_static_local_without_a_local_worker_is_refused() -> None:
    address = f"{ELSEWHERE}:{free_port()}"
    config = service.DispatcherConfig(worker_addresses=[address])
    with InProcessCluster(num_workers=0, dispatcher_config=config) as cluster:
        cluster.workers.append(service.WorkerServer(service.WorkerConfig(
            dispatcher_address=cluster.address, port=int(address.rsplit(":", 1)[1]),
            worker_address=address)))
        read = cv.data.Dataset.range(10).apply(service.distribute(
            service.ShardingPolicy.DATA, cluster.target, target_workers="LOCAL"))
        with pytest.raises(InvalidArgumentError,
                           match="Static sharding policy DATA requires local convoy data "
                                 "service workers, but no local worker is found"):
            list(read)


def test_a_worker_that_serves_grpc_only() -> None:
    with InProcessCluster(num_workers=0) as cluster:
        cluster.workers.append(service.WorkerServer(service.WorkerConfig(
            dispatcher_address=cluster.address, data_transfer_protocol="grpc")))
        read = list(images(3).apply(service.distribute(OFF, cluster.target)))
    assert not any(in_shared_memory(e["image"]) for e in read)


@pytest.mark.parametrize("options, message", [
    ({"target_workers": "LOCAL", "data_transfer_protocol": "grpc"},
     "target_workers='LOCAL' reads through shared memory; data_transfer_protocol 'grpc' "
     "cannot be used with it"),
    ({"data_transfer_protocol": "local"},
     "data_transfer_protocol 'local' \\(shared memory\\) reads only the workers on this host: "
     "use it with target_workers='LOCAL', got 'AUTO'"),
    ({"target_workers": "any", "data_transfer_protocol": "local"},
     "use it with target_workers='LOCAL', got 'ANY'"),
    ({"data_transfer_protocol": "shm"},
     "data_transfer_protocol must be None, 'grpc' or 'local', got 'shm'"),
    ({"target_workers": "LOCAL", "job_name": "j", "consumer_index": 0, "num_consumers": 2},
     "Coordinated reads require non-local workers"),
])
def test_refusals(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        cv.data.Dataset.range(3).apply(service.distribute(OFF, "grpc://localhost:1", **options))
