"""Metrics where work happened: a dispatcher, two data workers, a ps and a training worker
as real processes (``--metrics-port``), and a trainer and a chief in this process
(``cv.monitoring.serve``): each scrape carries the names with non-zero values."""

from __future__ import annotations

import sys
import time
import urllib.request

import cloudpickle
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import convoy as cv
from convoy import monitoring
from convoy._transport.security import TOKEN_ENV
from convoy.testing import ServerProcess, TrainingCluster, free_ports

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

# Functions defined here run on the workers, which cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

NO_SECRET = {TOKEN_ENV: None}


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            found[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return found


def eventually(port: int, names: list[str], timeout_s: float = 20.0) -> dict[str, float]:
    """A scrape of ``port`` in which every one of ``names`` is above 0 (waits for it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = scrape(port)
        zero = [name for name in names if samples.get(name, 0) <= 0]
        if not zero:
            return samples
        assert time.monotonic() < deadline, f"still 0 or missing: {zero}"
        time.sleep(0.2)


def test_each_kind_of_process_counts_its_work(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    dispatcher_port, worker0_port, worker1_port, here_port = free_ports(4)
    dispatcher = ServerProcess("dispatcher", ["--metrics-port", str(dispatcher_port)],
                               env=NO_SECRET).start()
    workers = [ServerProcess("worker", ["--dispatcher", dispatcher.address, "--heartbeat-ms",
                                        "100", "--metrics-port", str(port)],
                             env=NO_SECRET).start() for port in (worker0_port, worker1_port)]
    here = monitoring.serve(here_port)  # the trainer and the chief: this process
    try:
        service = cv.data.service
        dataset = cv.data.Dataset.range(5000).map(lambda x: np.full(16, x)).apply(
            service.distribute(service.ShardingPolicy.DYNAMIC,
                               f"grpc://{dispatcher.address}")).batch(100)
        total = sum(int(batch.shape[0]) for batch in dataset)
        assert total == 5000
        eventually(dispatcher_port, [
            'convoy_data_heartbeats_total{event="received"}',
            'convoy_data_splits_total{event="handed_out"}',
            'convoy_data_splits_total{event="acknowledged"}'])
        served = 0.0
        for port in (worker0_port, worker1_port):
            samples = eventually(port, ['convoy_data_heartbeats_total{event="sent"}'])
            assert "convoy_data_buffered_bytes" in samples
            served += samples["convoy_data_elements_served_total"]
            assert (samples["convoy_data_elements_produced_total"]
                    >= samples["convoy_data_elements_served_total"])
        assert served == 5000
        eventually(here_port, ["convoy_data_consumer_wait_seconds_count"])

        with TrainingCluster(num_workers=1, num_ps=1,
                             server_args=["--metrics-port", "0"], env=NO_SECRET) as cluster:
            strategy = cv.distribute.ParameterServerStrategy(cluster.resolver())
            coordinator = cv.distribute.ClusterCoordinator(strategy)
            try:
                with strategy.scope():
                    v = cv.Variable(np.zeros(4, np.float32), name="v")

                def step():
                    v.assign_add(np.ones(4, np.float32))
                    return 1

                for _ in range(5):
                    coordinator.schedule(step)
                coordinator.join()
                here_samples = eventually(here_port, [
                    "convoy_coordinator_functions_done_total"])
                assert here_samples["convoy_coordinator_functions_done_total"] >= 5
                ps_port = _metrics_port(cluster.servers[("ps", 0)])
                eventually(ps_port, ['convoy_ps_operations_total{operation="create"}',
                                     'convoy_ps_bytes_total{direction="received"}',
                                     'convoy_ps_bytes_total{direction="sent"}'])
            finally:
                coordinator.shutdown()
    finally:
        here.close()
        for server in [*workers, dispatcher]:
            server.kill()


def _metrics_port(server: ServerProcess) -> int:
    """The metrics port a ``--metrics-port 0`` process logged."""
    for line in server.log:
        if "metrics on http://" in line:
            return int(line.split("metrics on http://", 1)[1].split("/", 1)[0].rsplit(":")[1])
    raise AssertionError(f"no metrics line in {server.log}")
