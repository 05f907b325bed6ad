"""Start in any order: processes of a cluster started in reverse order still come together.

A training cluster whose chief starts first (then its workers, then its parameter servers
seconds later) trains; a data worker started before its dispatcher says it waits, joins when
the dispatcher comes up and serves.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time

import cloudpickle
import numpy as np
import pytest

import convoy as cv
from convoy._transport.security import TOKEN_ENV
from convoy.distribute.cluster import ClusterSpec
from convoy.distribute.cluster_resolver import SimpleClusterResolver
from convoy.errors import UnavailableError
from convoy.testing import ServerProcess, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

# Functions defined here run on the workers, which cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

NO_SECRET = {TOKEN_ENV: None}


def _server(cluster: dict[str, list[str]], job: str, index: int) -> ServerProcess:
    return ServerProcess("server", ["--job", job, "--index", str(index),
                                    "--cluster", json.dumps(cluster)], env=NO_SECRET)


def test_a_training_cluster_started_in_reverse_order_trains(monkeypatch, caplog):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    cluster = {"chief": [f"localhost:{free_port()}"],
               "ps": [f"localhost:{free_port()}" for _ in range(2)],
               "worker": [f"localhost:{free_port()}" for _ in range(2)]}
    resolver = SimpleClusterResolver(ClusterSpec(cluster), task_type="chief", task_id=0)
    made: list[object] = []
    failed: list[BaseException] = []

    def chief() -> None:  # first: the chief
        try:
            made.append(cv.distribute.ParameterServerStrategy(resolver))
        except BaseException as error:
            failed.append(error)

    servers: list[ServerProcess] = []
    caplog.set_level(logging.INFO, logger="convoy.distribute._cluster_wait")
    thread = threading.Thread(target=chief)
    thread.start()
    try:
        time.sleep(1.0)
        assert not made and not failed  # waiting for its cluster
        servers += [_server(cluster, "worker", i).start() for i in (1, 0)]  # then workers
        time.sleep(2.0)
        assert not made and not failed
        servers += [_server(cluster, "ps", i).start() for i in (1, 0)]  # then the ps
        thread.join(60)
        assert not failed, failed
        (strategy,) = made
        assert any("waiting for" in r.getMessage() and "ps:0" in r.getMessage()
                   for r in caplog.records), [r.getMessage() for r in caplog.records]
        coordinator = cv.distribute.ClusterCoordinator(strategy)
        try:
            with strategy.scope():
                total = cv.Variable(np.zeros(3, np.float32), name="total")

            def step() -> int:
                total.assign_add(np.ones(3, np.float32))
                return 1

            results = [coordinator.schedule(step) for _ in range(6)]
            coordinator.join()
            assert [r.fetch() for r in results] == [1] * 6
            np.testing.assert_array_equal(total.numpy(), np.full(3, 6, np.float32))
        finally:
            coordinator.shutdown()
    finally:
        thread.join(60)
        for server in servers:
            server.kill()


def test_a_chief_whose_cluster_never_comes_up_names_the_missing_tasks(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    cluster = {"chief": [f"localhost:{free_port()}"], "ps": [f"localhost:{free_port()}"],
               "worker": [f"localhost:{free_port()}"]}
    resolver = SimpleClusterResolver(ClusterSpec(cluster), task_type="chief", task_id=0)
    with pytest.raises(UnavailableError, match=r"ps:0 at .*worker:0 at .*never answered"):
        cv.distribute.ParameterServerStrategy(resolver, cluster_start_timeout_s=1.0)


def test_a_data_worker_started_before_its_dispatcher_joins_and_serves(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    port = free_port()
    worker = ServerProcess("worker", ["--dispatcher", f"127.0.0.1:{port}",
                                      "--heartbeat-ms", "100"], env=NO_SECRET)
    started: list[BaseException | None] = []

    def start_worker() -> None:
        try:
            worker.start(timeout_s=60)
            started.append(None)
        except BaseException as error:
            started.append(error)

    thread = threading.Thread(target=start_worker)
    thread.start()
    dispatcher = None
    try:
        deadline = time.monotonic() + 30
        while not any("waiting for dispatcher" in line for line in worker.log):
            assert time.monotonic() < deadline, worker.log
            time.sleep(0.1)
        dispatcher = ServerProcess("dispatcher", ["--port", str(port)], env=NO_SECRET).start()
        thread.join(60)
        assert started == [None], started
        service = cv.data.service
        dataset = cv.data.Dataset.range(200).apply(service.distribute(
            service.ShardingPolicy.DYNAMIC, f"grpc://127.0.0.1:{port}"))
        assert sorted(int(x) for x in dataset) == list(range(200))
    finally:
        thread.join(60)
        worker.kill()
        if dispatcher is not None:
            dispatcher.kill()
