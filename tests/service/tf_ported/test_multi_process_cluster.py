"""The scenario of TensorFlow's ``multi_process_cluster_test.py`` (tensorflow/python/data/
experimental/kernel_tests/service/), ported to convoy: a dispatcher with workers in this
process ("local") and workers in processes of their own ("remote", ``python -m convoy
worker``), all producing data for one job.

TensorFlow's grid includes no workers at all, where its test returns at once; that case is
left out.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator

import pytest

import convoy as cv
from convoy.testing import ServerProcess

service = cv.data.service

GRID = [(local, remote) for local, remote in itertools.product([0, 1, 3], [0, 1, 3])
        if local + remote > 0]


def start_remote_workers(dispatcher_address: str, count: int) -> list[ServerProcess]:
    """``count`` worker processes, started side by side."""
    workers = [ServerProcess("worker", ["--dispatcher", dispatcher_address, "--port", "0",
                                        "--heartbeat-ms", "100"]) for _ in range(count)]
    errors: list[BaseException] = []

    def start(worker: ServerProcess) -> None:
        try:
            worker.start()
        except BaseException as error:  # re-raised below
            errors.append(error)

    threads = [threading.Thread(target=start, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        for worker in workers:
            worker.kill()
        raise errors[0]
    return workers


@pytest.fixture
def multi_process_cluster(make_cluster, request) -> Iterator[object]:
    num_local_workers, num_remote_workers = request.param
    cluster = make_cluster(num_local_workers)
    remote = start_remote_workers(cluster.address, num_remote_workers)
    try:
        yield cluster
    finally:
        for worker in remote:
            worker.kill()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("multi_process_cluster, num_workers",
                         [((local, remote), local + remote) for local, remote in GRID],
                         ids=[f"local{local}-remote{remote}" for local, remote in GRID],
                         indirect=["multi_process_cluster"])
def test_cluster(multi_process_cluster, num_workers):
    """MultiProcessClusterTest.testCluster: every worker, local or remote, produces the
    range (OFF)."""
    dataset = cv.data.Dataset.range(10).apply(
        service.distribute("parallel_epochs", multi_process_cluster.target))
    assert sorted(int(x) for x in dataset) == sorted(list(range(10)) * num_workers)
