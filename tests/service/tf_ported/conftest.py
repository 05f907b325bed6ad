"""Clusters for the tests ported from TensorFlow's own data-service tests.

The ported files are TensorFlow's data_service_ops, dynamic_sharding, distributed_epoch,
fault_tolerance, multi_process_cluster, shared_dataset, auto_shard (static sharding),
cross_trainer_cache (with its _ft_test), local_workers, data_transfer, coordinated_read
(with coordinated_read_ft), metadata, and distributed save (distributed_save_test,
distributed_save_load_test in test_distributed_save.py; distributed_save_ft_test and
distributed_save_load_ft_test in test_distributed_save_ft.py; part of distributed_save_test
is in tests/data/test_distributed_save_layout.py) tests (each module names its source and lists the
scenarios it leaves out). snapshot_ft_test is an older version of distributed_save_ft_test
and is covered by its port. The other files of that folder test features convoy does not
have and are not ported: worker tags (worker_tags_test) and devices (gpu_test,
multi_device_test).

TensorFlow's tests build a ``TestCluster`` per test (in-process dispatcher and workers, 100 ms
worker heartbeats, optionally a work directory and fault tolerance) and restart or stop its
servers. :class:`TFCluster` is convoy's equivalent on top of ``InProcessCluster``. Tests that
leave the cluster as it was share the session-scoped ``cluster1`` / ``cluster2`` /
``cluster3``, each under names of its own (the ``name`` fixture); tests that stop, restart or
configure servers take a fresh one from ``make_cluster``.

TensorFlow's worker stop lets the calls it is serving finish (its gRPC server shuts down
without a deadline). A convoy worker stopped in-process answers them "unavailable" (its
consumers read elsewhere and come back later) and stops its server once no call has come for
a moment, so servers are stopped and restarted under reading consumers as in TensorFlow.

TensorFlow's test cluster declares a worker lost after 200 ms of silence. Here the worker
timeout stays at convoy's default unless a test asks: in-process workers share the GIL with
a busy consumer, and a 200 ms pause would declare a healthy worker lost.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from convoy.data.service import DispatcherConfig, DispatchServer, WorkerConfig, WorkerServer
from convoy.testing import InProcessCluster


class TFCluster(InProcessCluster):
    """A InProcessCluster with the server controls of TensorFlow's TestCluster."""

    def restart_dispatcher(self) -> None:
        """Stop the dispatcher and start a new one on the same port with the same config (the
        work directory, hence the journal, carries over)."""
        if not self.dispatcher._config.fault_tolerant_mode:
            raise ValueError("restarting a dispatcher without fault tolerance loses its state")
        config = dataclasses.replace(self.dispatcher._config, port=self.dispatcher._port)
        self.dispatcher.stop()
        self.dispatcher = DispatchServer(config)

    def stop_workers(self, indices: list[int]) -> None:
        """Stop the workers at ``indices``."""
        for index in indices:
            self.workers[index].stop()

    def restart_worker(self, index: int, use_same_port: bool = True) -> WorkerServer:
        """Stop worker ``index`` (as stop_workers) and start a new one, on its port or on a
        new one."""
        old = self.workers[index]
        self.stop_workers([index])
        self.workers[index] = WorkerServer(WorkerConfig(
            dispatcher_address=self.address, port=old._port if use_same_port else 0,
            heartbeat_interval_ms=self.heartbeat_interval_ms))
        return self.workers[index]

    def num_tasks_on_workers(self) -> int:
        return sum(worker._num_tasks() for worker in self.workers)


@pytest.fixture
def make_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., TFCluster]]:
    """``make_cluster(num_workers, work_dir=False, fault_tolerant_mode=False, **config)``: a
    fresh cluster, stopped after the test; ``config`` goes to the DispatcherConfig."""
    clusters: list[TFCluster] = []

    def make(num_workers: int = 1, work_dir: bool = False, fault_tolerant_mode: bool = False,
             **config: Any) -> TFCluster:
        directory = str(tmp_path_factory.mktemp("work_dir")) if work_dir else None
        cluster = TFCluster(num_workers, dispatcher_config=DispatcherConfig(
            work_dir=directory, fault_tolerant_mode=fault_tolerant_mode, **config))
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop()


def _shared(num_workers: int) -> Iterator[TFCluster]:
    with TFCluster(num_workers) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def cluster1() -> Iterator[TFCluster]:
    yield from _shared(1)


@pytest.fixture(scope="session")
def cluster2() -> Iterator[TFCluster]:
    yield from _shared(2)


@pytest.fixture(scope="session")
def cluster3() -> Iterator[TFCluster]:
    yield from _shared(3)


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A name no other test uses, for job names and dataset ids on the shared clusters."""
    return request.node.name


def take(source: Any, timeout_s: float, count: int | None = None) -> list[Any]:
    """The next ``count`` elements of ``iter(source)`` (all of them if None). The reading,
    starting the iterator included, runs on a daemon thread, so a read that hangs fails the
    test after ``timeout_s`` instead of stalling the run."""
    elements: list[Any] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            iterator = iter(source)
            while count is None or len(elements) < count:
                elements.append(next(iterator))
        except StopIteration:
            if count is not None:
                errors.append(AssertionError(
                    f"the input ended after {len(elements)} of {count} elements"))
        except BaseException as error:  # re-raised in the test's thread
            errors.append(error)

    thread = threading.Thread(target=read, daemon=True, name="tf-ported-reader")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        wanted = "the end" if count is None else f"{count} elements"
        raise AssertionError(f"{len(elements)} elements and not {wanted} within {timeout_s} s")
    if errors:
        raise errors[0]
    return elements


@pytest.fixture
def read_within() -> Callable[..., list[Any]]:
    """:func:`take` (test modules cannot import this conftest)."""
    return take

