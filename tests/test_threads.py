"""Supervised threads: a failure is logged with its traceback, then the thread restarts, its
owner fails what it served, or the process turns not-live and exits non-zero."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from convoy import _stream, _threads, monitoring
from convoy.data import Dataset
from convoy.data.service import DispatcherConfig, distribute
from convoy.errors import ConvoyError
from convoy.testing import InProcessCluster

pytestmark = pytest.mark.timeout(60)


def wait_for(condition: Any, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")
        time.sleep(0.02)


def failed_lines(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.getMessage().startswith(f"thread {name}") and r.exc_info is not None]


@pytest.fixture
def inject(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``inject(name)``: the next thread named ``name...`` in this process fails as it
    starts."""
    monkeypatch.setattr(_threads, "_injected", set())

    def injected(name: str) -> None:
        monkeypatch.setenv(_threads.FAULT_ENV, name)
    return injected


def test_a_restarted_thread_runs_again_after_a_backoff(caplog):
    runs: list[float] = []
    done = threading.Event()

    def flaky() -> None:
        runs.append(time.monotonic())
        if len(runs) < 3:
            raise ValueError(f"failure {len(runs)}")
        done.set()

    _threads.start("test-flaky", flaky, restart=True)
    assert done.wait(5)
    assert runs[2] - runs[1] >= 2 * _threads.FIRST_BACKOFF_S * 0.9  # the backoff doubled
    failures = failed_lines(caplog, "test-flaky")
    assert [r.exc_info[1].args[0] for r in failures] == ["failure 1", "failure 2"]


def test_an_owner_hears_its_threads_failure(caplog):
    heard: list[BaseException] = []
    thread = _threads.start("test-owned", lambda: 1 / 0, on_error=heard.append)
    thread.join(5)
    assert len(heard) == 1 and isinstance(heard[0], ZeroDivisionError)
    assert failed_lines(caplog, "test-owned")


def test_a_thread_no_one_can_take_over_makes_the_process_not_live(monkeypatch, caplog):
    exits: list[int] = []
    monkeypatch.setattr(_threads.os, "_exit", exits.append)
    monkeypatch.setattr(_threads, "_dead", [])
    server = monitoring.serve(0)
    try:
        _threads.start("test-fatal", lambda: 1 / 0).join(5)
        assert exits == [_threads.EXIT_THREAD_FAILED]
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5)
        assert answer.value.code == 503
        assert b"test-fatal" in answer.value.read()
    finally:
        server.close()


def test_the_process_exits_non_zero_with_the_traceback() -> None:
    script = ("import time; from convoy import _threads\n"
              "_threads.start('convoy-test', lambda: 1 / 0)\ntime.sleep(10)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == _threads.EXIT_THREAD_FAILED
    assert "ZeroDivisionError" in done.stderr and "Traceback" in done.stderr, done.stderr


def read(cluster: InProcessCluster, prefetch: bool = False) -> list[int]:
    dataset = Dataset.range(50)
    if prefetch:
        dataset = dataset.prefetch(2)
    return sorted(int(x) for x in dataset.apply(distribute("dynamic", cluster.target)))


#: Threads that restart: the cluster goes on, and the thread runs again.
RESTARTED = ["convoy-dispatcher-gc", "convoy-worker-snapshots", "convoy-metrics"]
#: Threads whose failure only costs what they would have done (memory given back).
IGNORED = ["convoy-worker-trim"]
#: Threads whose owner fails: the read raises the injected failure.
OWNED = ["convoy-client-heartbeat", "convoy-client-reader", "convoy-task-", "convoy-prefetch"]


@pytest.mark.parametrize("name", RESTARTED)
def test_a_restarted_thread_goes_on(name, inject, caplog):
    inject(name)
    config = DispatcherConfig(job_gc_check_interval_ms=50,
                              metrics_port=0 if name == "convoy-metrics" else None)
    with InProcessCluster(dispatcher_config=config) as cluster:
        wait_for(lambda: failed_lines(caplog, name), f"{name} to fail")
        wait_for(lambda: any(t.name == name and t.is_alive() for t in threading.enumerate()),
                 f"{name} to run again")
        assert read(cluster) == list(range(50))
    assert any(f"thread {name} restarts" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("name", OWNED)
def test_a_failed_thread_fails_what_it_served(name, inject, caplog):
    with InProcessCluster() as cluster:
        inject(name)
        with pytest.raises((ConvoyError, _threads.InjectedFault), match="injected"):
            read(cluster, prefetch=name == "convoy-prefetch")
    assert failed_lines(caplog, name)


def test_a_failed_control_thread_stops_the_worker(inject, caplog):
    with InProcessCluster(num_workers=0) as cluster:
        inject("convoy-worker-control")
        worker = cluster.add_worker()
        wait_for(lambda: worker.error is not None, "the worker to stop")
        assert isinstance(worker.error, _threads.InjectedFault)
    assert failed_lines(caplog, "convoy-worker-control")


@pytest.mark.parametrize("name", IGNORED)
def test_a_thread_whose_work_may_be_skipped_is_only_logged(name, inject, caplog):
    with InProcessCluster() as cluster:
        inject(name)
        assert read(cluster) == list(range(50))  # its tasks stop once it is over
        wait_for(lambda: failed_lines(caplog, name), f"{name} to fail")
        assert read(cluster) == list(range(50))


def test_the_stream_watchdog_restarts(inject, caplog):
    # the process's watchdog may run already: a watchdog of the test's own
    inject("convoy-stream-deadlines")
    watchdog = _stream._Watchdog()
    watchdog.watch(object(), 1, time.monotonic() + 60)  # type: ignore[arg-type]
    wait_for(lambda: failed_lines(caplog, "convoy-stream-deadlines"), "the watchdog to fail")
    assert watchdog._thread is not None
    wait_for(lambda: any("convoy-stream-deadlines restarts" in r.getMessage()
                         for r in caplog.records), "the watchdog to restart")
    assert watchdog._thread.is_alive()
