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

from convoy import monitoring
from convoy._base import threads as _threads
from convoy._transport import stream as _stream
from convoy.data import Dataset
from convoy.data.service import DispatcherConfig, distribute
from convoy.errors import ConvoyError, UnavailableError
from convoy.testing import InProcessCluster, ServerProcess, free_port

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
    script = ("import time; from convoy._base import threads as _threads\n"
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


# ----- the framed transport's threads ---------------------------------------------------------
def framed_echo(port: int = 0) -> tuple[Any, Any]:
    """(an echo FramedServer on ``port``, a connected client stream)."""
    from convoy._transport import framed as _framed
    from convoy._transport.security import Security

    server = _framed.FramedServer("test.Echo", "Echo", lambda r: bytes(r)[::-1], Security(),
                                  "127.0.0.1", port)
    stream = _framed.FramedStream("127.0.0.1", "Echo at the test", "/test.Echo/Echo",
                                  Security())
    return server, stream


@pytest.mark.parametrize("which", ["accept", "alive"])
def test_the_framed_servers_threads_restart(which, inject, caplog):
    port = free_port()
    name = f"convoy-framed-{port}" + ("-alive" if which == "alive" else "")
    inject(name)
    server, stream = framed_echo(port)
    try:
        wait_for(lambda: failed_lines(caplog, name), f"{name} to fail")
        wait_for(lambda: any(f"thread {name} restarts" in r.getMessage()
                             for r in caplog.records), f"{name} to restart")
        wait_for(lambda: any(t.name == name and t.is_alive() for t in threading.enumerate()),
                 f"{name} to run again")
        stream.connect(server.port)  # accepted, and answered
        assert bytes(stream.call(b"abc", 5)) == b"cba"
    finally:
        stream.close()
        server.stop()


def test_a_failed_framed_connection_fails_its_call_and_the_next_one_is_served(inject, caplog):
    server, stream = framed_echo()
    try:
        inject("convoy-framed-connection")
        with pytest.raises(ConvoyError):  # the connection is dropped: its caller hears it
            stream.connect(server.port)
            stream.call(b"abc", 5)
        assert failed_lines(caplog, "convoy-framed-connection")
        stream.close()
        stream.connect(server.port)
        assert bytes(stream.call(b"abc", 5)) == b"cba"
    finally:
        stream.close()
        server.stop()


# ----- the test helper's output reader ----------------------------------------------------------
def test_a_failed_output_reader_fails_the_servers_start_at_once(inject, caplog):
    inject("convoy-testing-dispatcher-output")
    started = time.monotonic()
    with pytest.raises(UnavailableError, match="did not start"):
        ServerProcess("dispatcher", ["--port", "0"]).start(timeout_s=30)
    assert time.monotonic() - started < 20  # not after its timeout: the owner heard at once
    assert failed_lines(caplog, "convoy-testing-dispatcher-output")


# ----- the client's unreachable report ----------------------------------------------------------
@pytest.mark.timeout(90)
def test_a_lost_unreachable_report_leaves_the_worker_to_its_timeout(inject, caplog):
    """The report only hastens what the worker's timeout does: the read completes once."""
    config = DispatcherConfig(worker_timeout_ms=1000, job_gc_check_interval_ms=100)
    with InProcessCluster(num_workers=2, dispatcher_config=config) as cluster:
        inject("convoy-client-report")
        dataset = Dataset.range(400).map(_slowly).apply(distribute("dynamic", cluster.target))
        got: list[int] = []
        for x in dataset:
            got.append(int(x))
            if len(got) == 40:
                cluster.workers[0].stop()  # refuses connections from now on
        assert sorted(got) == list(range(400))
    assert failed_lines(caplog, "convoy-client-report")


def _slowly(x: Any) -> Any:
    time.sleep(0.002)
    return x


# ----- the parameter-server sender and the coordinator's scheduler ------------------------------
@pytest.mark.timeout(90)
def test_the_ps_sender_restarts_and_loses_no_list(inject, caplog):
    import numpy as np

    from convoy.distribute._operations import Create, Read
    from convoy.distribute._store_clients import RemoteStore
    from convoy.testing import TrainingCluster

    with TrainingCluster(num_workers=1, num_ps=1) as cluster:
        inject("convoy-ps0-sender")
        store = RemoteStore(cluster.cluster["ps"][0], 0)
        store.execute([Create("v", np.arange(3.0))])  # waits out the sender's restart
        np.testing.assert_array_equal(store.execute([Read("v")])[0], np.arange(3.0))
    assert failed_lines(caplog, "convoy-ps0-sender")
    assert any("thread convoy-ps0-sender restarts" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("what", ["keeper", "w0-0", "probe-w0"])
def test_the_schedulers_keeper_restarts_and_a_lane_ends_the_process(what, inject, caplog,
                                                                      monkeypatch):
    from convoy.distribute._scheduler import Scheduler

    exits: list[int] = []
    monkeypatch.setattr(_threads.os, "_exit", exits.append)
    monkeypatch.setattr(_threads, "_dead", [])
    name = f"test-scheduler-{what}"
    inject(name)
    scheduler = Scheduler([f"127.0.0.1:{free_port()}"], 1, "test-scheduler")
    try:
        wait_for(lambda: failed_lines(caplog, name), f"{name} to fail")
        if what == "keeper":
            wait_for(lambda: any(t.name == name and t.is_alive()
                                 for t in threading.enumerate()), f"{name} to run again")
            assert exits == [] and _threads.not_live() is None
        else:  # its closures would hang: the process turns not-live and exits 70
            wait_for(lambda: exits == [_threads.EXIT_THREAD_FAILED], "the exit")
            assert name in (_threads.not_live() or "")
    finally:
        scheduler.close()


# ----- the shared-memory sweeper -----------------------------------------------------------------
def test_the_shared_memory_sweeper_restarts_and_still_frees_segments(inject, caplog):
    import os

    import numpy as np

    from convoy.data.service import service_pb2 as pb
    from convoy.data.service._common.host import SHM_DIR
    from convoy.data.service._shm.consumer_end import reader_identity
    from convoy.data.service._shm.worker_end import SegmentServer

    identity = reader_identity()
    if identity is None:
        pytest.skip("no shared memory on this host")
    name = "convoy-worker-shm-sweeper"
    inject(name)
    server = SegmentServer(timeout_s=0.3, free_timeout_s=0.3)
    try:
        asking = pb.GetElementsRequest(task_id=1, max_elements=10, max_bytes=1 << 20,
                                       shared_memory=identity)
        answer = server.answer(asking, [np.arange(1 << 15, dtype=np.float64)])
        segment = os.path.join(SHM_DIR, answer[17:].decode())  # after length and handout
        assert os.path.exists(segment)
        wait_for(lambda: failed_lines(caplog, name), f"{name} to fail")
        # never released: the restarted sweeper frees it past its timeout
        wait_for(lambda: not os.path.exists(segment), "the segment to be freed")
        assert any(f"thread {name} restarts" in r.getMessage() for r in caplog.records)
    finally:
        server.close()


# ----- the equal shares' pump and talk threads ---------------------------------------------------
@pytest.mark.parametrize("name", ["convoy-share-pump", "convoy-share-talk"])
def test_a_failed_share_thread_fails_the_pass(name, inject, caplog):
    pytest.importorskip("torch")
    import convoy as cv

    with InProcessCluster() as cluster:
        dataset = Dataset.range(50).apply(distribute("dynamic", cluster.target,
                                                     job_name=f"shares-{name}"))
        face = cv.torch.IterableDataset(dataset, rank=0, world_size=1, equal_shares="pad")
        face.set_epoch(0)
        inject(name)
        with pytest.raises((ConvoyError, _threads.InjectedFault), match="injected"):
            list(face)
    assert failed_lines(caplog, name)
