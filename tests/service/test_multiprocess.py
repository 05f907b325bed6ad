"""The data service with real processes: ``python -m convoy dispatcher`` and ``python -m convoy
worker`` children (convoy.testing.ProcessCluster), and consumers in this process or in their
own subprocesses."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import cloudpickle
import numpy as np
import pytest

import convoy as cv
from convoy.errors import InvalidArgumentError, NotFoundError, UnavailableError
from convoy.testing import ProcessCluster, free_port

# Pipelines defined here run on worker processes, which cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

service = cv.data.service
OFF = service.ShardingPolicy.OFF
DYNAMIC = service.ShardingPolicy.DYNAMIC


@pytest.fixture(scope="module")
def cluster3() -> Iterator[ProcessCluster]:
    """Three worker processes, shared by the tests that do not change the cluster (each uses
    its own job names)."""
    with ProcessCluster(num_workers=3) as cluster:
        yield cluster


def ints(dataset: Any) -> list[int]:
    return [int(x) for x in dataset]


def distributed(n: int, target: str, mode: Any = DYNAMIC, **kwargs: Any) -> cv.data.Dataset:
    return cv.data.Dataset.range(n).apply(service.distribute(mode, target, **kwargs))


@pytest.mark.timeout(120)
def test_off_two_workers_each_element_twice():
    with ProcessCluster(num_workers=2) as cluster:
        counts = collections.Counter(ints(distributed(50, cluster.target, OFF)))
    assert counts == {x: 2 for x in range(50)}


@pytest.mark.timeout(120)
def test_dynamic_three_workers_each_element_once(cluster3):
    elements = ints(distributed(10_000, cluster3.target, DYNAMIC))
    assert len(elements) == 10_000
    assert sorted(elements) == list(range(10_000))


CONSUMER = """
import json, sys
import convoy as cv
dataset = cv.data.Dataset.range(2000).apply(cv.data.service.distribute(
    cv.data.service.ShardingPolicy.DYNAMIC, sys.argv[1], job_name="shared"))
print(json.dumps([int(x) for x in dataset]))
"""


@pytest.mark.timeout(120)
def test_two_consumer_processes_share_a_named_job(cluster3):
    consumers = [subprocess.Popen([sys.executable, "-c", CONSUMER, cluster3.target],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
    outputs = []
    for consumer in consumers:
        out, err = consumer.communicate(timeout=60)
        assert consumer.returncode == 0, err[-2000:]
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    # First come first served: any split between the two, each element once in total.
    assert sorted(outputs[0] + outputs[1]) == list(range(2000))


@pytest.mark.timeout(120)
def test_worker_added_mid_job_gets_work():
    with ProcessCluster(num_workers=1) as cluster:
        def slow(x: Any) -> tuple[Any, int]:
            time.sleep(0.01)
            return x, os.getpid()

        dataset = cv.data.Dataset.range(400).map(slow).apply(
            service.distribute(DYNAMIC, cluster.target))
        iterator = iter(dataset)
        first = [next(iterator) for _ in range(50)]
        new_worker = cluster.add_worker()
        rest = list(iterator)
    elements = [(int(x), int(pid)) for x, pid in first + rest]
    assert sorted(x for x, _ in elements) == list(range(400))
    pids = collections.Counter(pid for _, pid in elements)
    assert set(pids) <= {cluster.workers[0].process.pid, new_worker.process.pid}
    assert pids[new_worker.process.pid] > 0, pids


@pytest.mark.timeout(120)
def test_map_with_a_closure_over_a_numpy_array(cluster3):
    table = np.arange(300, dtype=np.int64) ** 2 - 7
    offset = 11

    def lookup(x: Any) -> Any:
        return table[x] * 3 + offset

    local = sorted(int(x) for x in cv.data.Dataset.range(300).map(lookup))
    remote = cv.data.Dataset.range(300).map(lookup).apply(
        service.distribute(DYNAMIC, cluster3.target))
    assert sorted(int(x) for x in remote) == local == sorted(int(table[x] * 3 + offset)
                                                            for x in range(300))


@pytest.mark.timeout(120)
def test_named_job_read_to_the_end_gives_a_later_consumer_end_of_input(cluster3):
    assert sorted(ints(distributed(100, cluster3.target, job_name="drained"))) == list(
        range(100))
    assert ints(distributed(100, cluster3.target, job_name="drained")) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("job_name", [None, "repeated"])
def test_repeat_after_distribute_gives_three_repetitions(cluster3, job_name):
    dataset = distributed(30, cluster3.target, job_name=job_name).repeat(3)
    assert sorted(ints(dataset)) == sorted(list(range(30)) * 3)


@pytest.mark.timeout(120)
def test_from_dataset_id_job_names_are_scoped_to_the_dataset_id(cluster3):
    dataset = cv.data.Dataset.range(40)
    dataset_id = service.register_dataset(cluster3.target, dataset)

    def reader(which: str) -> cv.data.Dataset:
        return service.from_dataset_id(DYNAMIC, cluster3.target, which, job_name="scoped")

    # Same dataset id and job name: one job; once read to its end, nothing is left.
    assert sorted(ints(reader(dataset_id))) == list(range(40))
    assert ints(reader(dataset_id)) == []
    # Read concurrently, two readers of one job split it.
    other_id = service.register_dataset(cluster3.target, dataset, dataset_id="scoped-other")
    readers = [service.from_dataset_id(DYNAMIC, cluster3.target, other_id, job_name="both")
               for _ in range(2)]
    results: list[list[int]] = [[], []]
    threads = [threading.Thread(target=lambda i=i: results[i].extend(ints(readers[i])))
               for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(results[0] + results[1]) == list(range(40))
    # The same job name on two different dataset ids: two jobs, each with all the data.
    third_id = service.register_dataset(cluster3.target, dataset, dataset_id="scoped-third")
    assert third_id != dataset_id
    assert sorted(ints(service.from_dataset_id(DYNAMIC, cluster3.target, third_id,
                                               job_name="scoped"))) == list(range(40))


@pytest.mark.timeout(120)
def test_unknown_dataset_id_is_not_found(cluster3):
    with pytest.raises(NotFoundError, match="no-such-dataset"):
        service.from_dataset_id(DYNAMIC, cluster3.target, "no-such-dataset")


@pytest.mark.timeout(120)
def test_job_name_reused_with_another_processing_mode(cluster3):
    assert len(ints(distributed(10, cluster3.target, OFF, job_name="mode-clash"))) == 30
    dataset = distributed(10, cluster3.target, DYNAMIC, job_name="mode-clash")
    with pytest.raises(InvalidArgumentError, match="mode-clash") as raised:
        ints(dataset)
    message = str(raised.value)
    assert "OFF" in message and "DYNAMIC" in message


@pytest.mark.timeout(120)
def test_servers_exit_cleanly_on_sigterm():
    cluster = ProcessCluster(num_workers=1)
    try:
        assert ints(distributed(20, cluster.target, OFF)) == list(range(20))
        assert cluster.workers[0].terminate() == 0
        assert cluster.dispatcher.terminate() == 0
    finally:
        cluster.stop()


@pytest.mark.timeout(120)
def test_unreachable_dispatcher_raises_unavailable():
    # A port nothing listens on: below the kernel's ephemeral range, so no server on port 0
    # (of this test process or another) is given it meanwhile.
    closed = f"grpc://localhost:{free_port()}"
    dataset = cv.data.Dataset.range(5).apply(
        service.distribute(DYNAMIC, closed, dispatcher_timeout_ms=1500))
    start = time.monotonic()
    with pytest.raises(UnavailableError):
        list(dataset)
    assert time.monotonic() - start < 10
    start = time.monotonic()
    with pytest.raises(UnavailableError):
        service.from_dataset_id(DYNAMIC, closed, "1000", dispatcher_timeout_ms=1500)
    assert time.monotonic() - start < 10
