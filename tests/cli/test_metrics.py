"""``--metrics-port`` on each kind of real server process: its metrics are scraped over HTTP,
and its probes say alive at once and ready only once it serves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from convoy._security import TOKEN_ENV
from convoy.testing import ServerProcess, free_port, free_ports

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

NO_SECRET = {TOKEN_ENV: None}


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def scrape(port: int) -> dict[str, float]:
    """Each sample by name and labels, e.g. ``name{method="X",service="Y"}``."""
    found = {}
    for family in text_string_to_metric_families(get(port, "/metrics")[1]):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            found[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return found


def assert_serves_probes_and_metrics(port: int) -> dict[str, float]:
    assert get(port, "/healthz") == (200, "ok\n")
    assert get(port, "/readyz") == (200, "ready\n")
    samples = scrape(port)
    assert all(name.startswith("convoy_") for name in samples), sorted(samples)
    for name in ("convoy_process_cpu_seconds_total", "convoy_data_elements_served_total",
                 "convoy_coordinator_functions_queued"):
        assert name in samples
    return samples


def wait_for(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_dispatcher_and_a_worker_serve_their_metrics():
    dispatcher_metrics, worker_metrics = free_ports(2)
    dispatcher = ServerProcess("dispatcher", ["--metrics-port", str(dispatcher_metrics)],
                               env=NO_SECRET).start()
    worker = ServerProcess("worker", ["--dispatcher", dispatcher.address, "--heartbeat-ms",
                                      "100", "--metrics-port", str(worker_metrics)],
                           env=NO_SECRET).start()
    try:
        assert_serves_probes_and_metrics(worker_metrics)
        heartbeats = ('convoy_rpc_duration_seconds_count{method="WorkerHeartbeat",'
                      'service="convoy.data.service.Dispatcher"}')
        first = assert_serves_probes_and_metrics(dispatcher_metrics)[heartbeats]
        assert first >= 1  # the worker registered
        wait_for(lambda: scrape(dispatcher_metrics)[heartbeats] > first)  # and heartbeats
    finally:
        worker.kill(), dispatcher.kill()


def test_a_parameter_server_serves_its_metrics():
    metrics = free_port()
    cluster = json.dumps({"ps": [f"localhost:{free_port()}"]})
    ps = ServerProcess("server", ["--job", "ps", "--index", "0", "--cluster", cluster,
                                  "--metrics-port", str(metrics)], env=NO_SECRET).start()
    try:
        samples = assert_serves_probes_and_metrics(metrics)
        assert samples['convoy_ps_bytes_total{direction="received"}'] == 0
    finally:
        ps.kill()


def test_a_worker_waiting_for_its_dispatcher_is_alive_but_not_ready():
    metrics, nowhere = free_ports(2)
    environ = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    worker = subprocess.Popen(
        [sys.executable, "-m", "convoy", "worker", "--dispatcher", f"127.0.0.1:{nowhere}",
         "--metrics-port", str(metrics)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=environ)
    try:
        wait_for(lambda: _answers(metrics))
        assert get(metrics, "/healthz") == (200, "ok\n")
        status, body = get(metrics, "/readyz")
        assert status == 503 and body.startswith("not ready: server: starting"), body
        # once its server is up, it says what it waits for
        wait_for(lambda: "not registered with its dispatcher yet" in get(metrics, "/readyz")[1])
        assert get(metrics, "/readyz")[0] == 503
    finally:
        worker.kill()
        worker.wait(10)


def _answers(port: int) -> bool:
    try:
        get(port, "/healthz")
    except OSError:
        return False
    return True
