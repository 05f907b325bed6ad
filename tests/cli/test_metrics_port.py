"""``--metrics-port`` on each kind of real server process: its metrics are scraped over HTTP,
and its probes say alive at once and ready only once it serves; each exports the families of
its role only; a dispatcher counts workers, jobs, splits and its journal, and a restarted one
goes on counting from its journal; refused calls are counted by reason and logged
summarised."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
from prometheus_client.parser import text_string_to_metric_families

from convoy._transport import rpc as _rpc
from convoy._transport.security import TOKEN_ENV, Security
from convoy.data import Dataset
from convoy.data.service import distribute
from convoy.data.service import service_pb2 as pb
from convoy.data.service._common.wire import DISPATCHER, DISPATCHER_METHODS
from convoy.errors import UnauthenticatedError
from convoy.testing import ProcessCluster, ServerProcess, free_port, free_ports

# The pipeline's function runs on the workers, which cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

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


#: A family each role exports, and families of other roles that it must not.
ROLE_FAMILIES = {
    "dispatcher": ("convoy_data_workers", "convoy_data_splits_total"),
    "worker": ("convoy_data_elements_served_total", "convoy_data_buffered_bytes",
               "convoy_data_max_buffered_bytes"),
    "ps": ("convoy_ps_bytes_total",),
}
OTHERS = ("convoy_coordinator_", "convoy_data_consumer_wait_")


def assert_serves_probes_and_metrics(port: int, role: str) -> dict[str, float]:
    """The scrape of a server of ``role``: its probes answer, and it carries the common
    families and its role's only."""
    assert get(port, "/healthz") == (200, "ok\n")
    assert get(port, "/readyz") == (200, "ready\n")
    samples = scrape(port)
    assert all(name.startswith("convoy_") for name in samples), sorted(samples)
    assert "convoy_process_cpu_seconds_total" in samples
    assert 'convoy_refused_calls_total{reason="wrong"}' in samples
    for other, families in ROLE_FAMILIES.items():
        for family in families:
            assert any(name.split("{")[0] == family for name in samples) == (other == role), (
                role, family)
    assert not [name for name in samples if name.startswith(OTHERS)], role
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
        assert_serves_probes_and_metrics(worker_metrics, "worker")
        heartbeats = ('convoy_rpc_duration_seconds_count{code="OK",method="WorkerHeartbeat",'
                      'service="convoy.data.service.Dispatcher"}')
        first = assert_serves_probes_and_metrics(dispatcher_metrics, "dispatcher")[heartbeats]
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
        samples = assert_serves_probes_and_metrics(metrics, "ps")
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


N = 6_000


def slow(x: Any) -> Any:
    time.sleep(0.0002)
    return x


def dispatcher_args(metrics: int, work_dir: Path) -> list[str]:
    return ["--metrics-port", str(metrics), "--fault-tolerant", "--work-dir", str(work_dir)]


def counted(samples: dict[str, float]) -> dict[str, float]:
    """What a dispatcher's journal keeps: its split events and its lost workers."""
    keys = [f'convoy_data_splits_total{{event="{event}"}}'
            for event in ("handed_out", "acknowledged", "returned")]
    return {key: samples[key] for key in [*keys, "convoy_data_workers_lost_total"]}


@pytest.mark.timeout(180)
def test_a_dispatcher_counts_workers_splits_and_its_journal_and_a_restart_goes_on(tmp_path):
    """DYNAMIC over 2 worker processes, one SIGKILLed mid-read: the dispatcher's gauges and
    counters say so (the lost worker's splits returned), its journal's size and writes are
    shown, and a restarted dispatcher shows the same counts, read from its journal."""
    metrics = free_port()
    with ProcessCluster(num_workers=2, dispatcher_args=dispatcher_args(metrics, tmp_path),
                        env=NO_SECRET) as cluster:
        wait_for(lambda: scrape(metrics)["convoy_data_workers"] == 2)
        dataset = Dataset.range(N).map(slow).apply(
            distribute("distributed_epoch", cluster.target))
        received = 0
        for received, _ in enumerate(dataset, 1):
            if received == N // 4:
                reading = scrape(metrics)
                assert (reading["convoy_data_jobs"], reading["convoy_data_iterations"],
                        reading["convoy_data_clients"]) == (1, 1, 1)
                cluster.workers[0].kill()
        assert received == N
        wait_for(lambda: scrape(metrics)["convoy_data_workers_lost_total"] == 1)
        samples = scrape(metrics)
        assert samples["convoy_data_workers"] == 1
        assert samples['convoy_data_splits_total{event="returned"}'] > 0
        assert samples['convoy_data_splits_total{event="handed_out"}'] >= samples[
            'convoy_data_splits_total{event="acknowledged"}'] > 0
        assert samples["convoy_data_journal_bytes"] > 0
        assert samples["convoy_data_journal_segments"] >= 1
        assert samples["convoy_data_journal_write_seconds_count"] > 0
        assert samples["convoy_data_journal_write_failures_total"] == 0
        wait_for(lambda: scrape(metrics)["convoy_data_clients"] == 0)
        before = counted(scrape(metrics))

        port = cluster.dispatcher.address.rsplit(":", 1)[1]
        cluster.dispatcher.kill()
        cluster.dispatcher = ServerProcess(
            "dispatcher", ["--port", port, *dispatcher_args(metrics, tmp_path)],
            env=NO_SECRET).start()
        after = counted(scrape(metrics))
        assert after == before, (before, after)


def test_each_server_exports_only_the_families_of_its_role():
    """The dispatcher and the worker of one cluster, and a ps (see the other tests): no
    parameter-server or coordinator series on a data server, and the reverse."""
    dispatcher_metrics, worker_metrics = free_ports(2)
    with ProcessCluster(num_workers=1, dispatcher_args=["--metrics-port",
                                                        str(dispatcher_metrics)],
                        worker_args=["--metrics-port", str(worker_metrics)],
                        env=NO_SECRET):
        wait_for(lambda: get(worker_metrics, "/readyz")[0] == 200)
        dispatcher = assert_serves_probes_and_metrics(dispatcher_metrics, "dispatcher")
        assert not [name for name in dispatcher if name.startswith("convoy_ps_")]
        worker = assert_serves_probes_and_metrics(worker_metrics, "worker")
        assert not [name for name in worker if "journal" in name]
        assert worker["convoy_data_max_buffered_bytes"] == 1 << 30  # the default bound


SECRET = "s" * 40


def call_status(address: str, token: str | None) -> None:
    client = _rpc.Client(address, DISPATCHER, DISPATCHER_METHODS, Security(token=token))
    try:
        client.call("GetStatus", pb.GetStatusRequest(), timeout=10)
    finally:
        client.close()


def test_refused_calls_are_counted_by_reason_and_logged_once_summarised():
    metrics = free_port()
    dispatcher = ServerProcess("dispatcher", ["--metrics-port", str(metrics)],
                               env={TOKEN_ENV: SECRET}).start()
    try:
        call_status(dispatcher.address, SECRET)  # the right secret is answered
        for token in ["w" * 40] * 3 + [None] * 2:
            with pytest.raises(UnauthenticatedError):
                call_status(dispatcher.address, token)
        samples = scrape(metrics)
        assert samples['convoy_refused_calls_total{reason="wrong"}'] == 3
        assert samples['convoy_refused_calls_total{reason="missing"}'] == 2
        assert samples['convoy_rpc_duration_seconds_count{code="OK",method="GetStatus",'
                       'service="convoy.data.service.Dispatcher"}'] == 1
        wait_for(lambda: any("refused a call to" in line for line in dispatcher.log))
        time.sleep(0.5)
        refusals = [line for line in dispatcher.log if "refused" in line]
        assert len(refusals) == 1, refusals  # the first at once; the rest summed up later
        assert "wrong call signature" in refusals[0]
    finally:
        dispatcher.kill()
