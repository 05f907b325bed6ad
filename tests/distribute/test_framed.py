"""The framed transport of ``Execute`` (worker -> ps) and ``Run`` (chief -> worker): chosen by
default, gRPC when the task has no framed port or the process asks for gRPC, a fixed port, a
ps killed while it owes an answer, and the timeouts that end every wait (a server that stops,
a handshake that never comes, an answer past its deadline, and the ALIVE frames that keep a
slow answer from looking like either).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time

import cloudpickle
import numpy as np
import pytest

import convoy as cv
from convoy._transport import framed as _framed
from convoy._transport.rpc import Outcome
from convoy._transport.security import Security
from convoy.distribute._coordinator_calls import WorkerLink, call_message
from convoy.distribute._operations import AssignAdd, Create, Gather, Read, ScatterAdd
from convoy.distribute._store_clients import RemoteStore, remote_store
from convoy.distribute._wire import PS_TRANSPORT_ENV, run_request
from convoy.errors import (
    DeadlineExceededError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from convoy.testing import TrainingCluster, free_port, stop_process

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROWS, WIDTH = 64, 4  # the shape of the ``table`` fixture's variable


@pytest.mark.timeout(60)
def test_execute_travels_framed_and_answers_as_grpc_does(ps_and_worker, table, monkeypatch):
    store, name = table
    ids = np.array([1, 3, 3] + list(range(5, ROWS)))  # 2 KiB of rows: sent out of band
    store.execute([ScatterAdd(name, ids, np.ones((len(ids), WIDTH)))])
    assert store.transport == "framed"
    monkeypatch.setenv(PS_TRANSPORT_ENV, "grpc")
    over_grpc = RemoteStore(ps_and_worker.cluster["ps"][0], 0)  # not the process's handle
    framed_answer = store.execute([Gather(name, ids)])
    grpc_answer = over_grpc.execute([Gather(name, ids)])
    assert over_grpc.transport == "grpc"
    np.testing.assert_array_equal(framed_answer[0], grpc_answer[0])
    np.testing.assert_array_equal(framed_answer[0][:4], [[1.0] * WIDTH, [2.0] * WIDTH,
                                                         [2.0] * WIDTH, [1.0] * WIDTH])
    assert not framed_answer[0].flags.writeable  # a view on the received frame, as gRPC's
    for one in (store, over_grpc):  # an operation's error reaches its caller either way
        with pytest.raises(NotFoundError, match="no such variable"):
            one.execute([Read("no such variable")])
    assert store.transport == "framed"  # an answered error keeps the connection


def test_an_unknown_transport_is_refused(monkeypatch):
    monkeypatch.setenv(PS_TRANSPORT_ENV, "carrier-pigeon")
    with pytest.raises(InvalidArgumentError, match=PS_TRANSPORT_ENV):
        RemoteStore("localhost:1", 0)


@pytest.mark.timeout(90)
def test_a_ps_without_a_framed_port_is_reached_over_grpc():
    with TrainingCluster(num_workers=1, num_ps=1, env={PS_TRANSPORT_ENV: "grpc"}) as cluster:
        store = remote_store(cluster.cluster["ps"][0], 0)
        store.execute([Create("v", np.arange(3.0))])
        np.testing.assert_array_equal(store.execute([Read("v")])[0], np.arange(3.0))
        assert store.transport == "grpc"


@pytest.mark.timeout(90)
def test_a_ps_killed_while_it_owes_an_answer_fails_the_call_at_once():
    with TrainingCluster(num_workers=1, num_ps=1) as cluster:
        address = cluster.cluster["ps"][0]
        store = remote_store(address, 0)
        store.execute([Create("v", np.arange(3.0))])
        assert store.transport == "framed"
        process = cluster.servers[("ps", 0)].process
        stop_process(process.pid)  # the request arrives, and is never answered
        pending = store.execute_async([AssignAdd("v", np.ones(3))])
        time.sleep(0.3)
        assert not pending.done()
        started = time.monotonic()
        process.kill()
        with pytest.raises(UnavailableError, match=f"Execute at {address}: "):
            pending.result(timeout=30)
        assert time.monotonic() - started < _framed.SILENCE_S / 2  # not by the silence
        cluster.start_task("ps", 0)  # at the same address: the next call reconnects
        deadline = time.monotonic() + 30
        while True:  # the first calls may still find the old process gone
            try:
                store.execute([Create("v", np.zeros(2))])
                break
            except UnavailableError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        np.testing.assert_array_equal(store.execute([Read("v")])[0], np.zeros(2))
        assert store.transport == "framed"


@pytest.mark.timeout(120)
def test_a_ps_killed_mid_step_fails_join_with_unavailable_naming_it():
    with TrainingCluster(num_workers=2, num_ps=1) as cluster:
        strategy = cv.distribute.ParameterServerStrategy(cluster.resolver())
        coordinator = cv.distribute.ClusterCoordinator(strategy)
        try:
            with strategy.scope():
                counter = cv.Variable(0, name="counter")

            def step(seconds):
                ends = time.monotonic() + seconds
                while time.monotonic() < ends:  # until the ps is gone (or the test gave up)
                    counter.assign_add(1)
                    counter.numpy()

            coordinator.schedule(step, (0.1,))
            coordinator.join()
            for _ in range(4):
                coordinator.schedule(step, (60,))
            deadline = time.monotonic() + 30
            while int(counter.numpy()) < 100:  # steps in flight on both workers
                assert time.monotonic() < deadline
                time.sleep(0.05)
            cluster.kill_task("ps", 0)
            with pytest.raises(UnavailableError, match=cluster.cluster["ps"][0]):
                coordinator.join()
            # the workers were not taken for lost: they still run functions
            assert coordinator.schedule(lambda: 7).fetch() == 7
        finally:
            coordinator.shutdown()


@pytest.mark.timeout(60)
def test_a_stopped_ps_fails_the_call_after_the_silence_naming_it(monkeypatch):
    monkeypatch.setattr(_framed, "SILENCE_S", 1.0)  # this process's clients wait 1 s
    with TrainingCluster(num_workers=1, num_ps=1) as cluster:
        address = cluster.cluster["ps"][0]
        store = remote_store(address, 0)
        store.execute([Create("v", np.arange(3.0))])
        pid = cluster.servers[("ps", 0)].process.pid
        stop_process(pid)
        started = time.monotonic()
        try:
            with pytest.raises(UnavailableError, match=f"Execute at {address}: the server sent "
                                                       "nothing for 1 s while this process "
                                                       "waited for its answer"):
                store.execute([Read("v")])
            assert time.monotonic() - started < 10
        finally:
            os.kill(pid, signal.SIGCONT)
        np.testing.assert_array_equal(store.execute([Read("v")])[0], np.arange(3.0))


def framed_stream():
    return _framed.FramedStream("localhost", "Echo at localhost", "/test.Echo/Call", Security())


@pytest.mark.timeout(30)
def test_a_handshake_that_never_comes_times_out_naming_what_it_waited_for(monkeypatch):
    monkeypatch.setattr(_framed, "HANDSHAKE_TIMEOUT_S", 0.5)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (backlog), says nothing
        stream = framed_stream()
        with pytest.raises(DeadlineExceededError, match="Echo at localhost: no answer within "
                                                        r"0.5 s \(waiting for the handshake\)"):
            stream.connect(silent.getsockname()[1], timeout=0.5)
        assert not stream.connected


@pytest.fixture
def slow_echo():
    """An in-process framed server whose handler echoes its request after the delay the
    request names (in tenths of a second)."""

    def echo(request):
        time.sleep(request[0] / 10)
        return bytes(request)

    server = _framed.FramedServer("test.Echo", "Call", echo, Security())
    yield server
    server.stop()


@pytest.mark.timeout(30)
def test_an_answer_past_its_deadline_is_deadline_exceeded(slow_echo):
    stream = framed_stream()
    stream.connect(slow_echo.port)
    assert bytes(stream.call(b"\x00fast", timeout=5)) == b"\x00fast"
    with pytest.raises(DeadlineExceededError, match=r"no answer within 0.3 s \(waiting for "
                                                    r"its answer\)"):
        stream.call(b"\x0aslow", timeout=0.3)
    assert not stream.connected  # a late answer would be taken for the next call's


@pytest.mark.timeout(30)
def test_alive_frames_keep_a_slow_answer_from_looking_like_a_stopped_server(monkeypatch):
    monkeypatch.setattr(_framed, "SILENCE_S", 0.4)  # the server beats every 0.05 s past 0.1 s
    server = _framed.FramedServer("test.Echo", "Call", lambda request: (
        time.sleep(1.5), bytes(request))[1], Security())
    try:
        stream = framed_stream()
        stream.connect(server.port)
        assert bytes(stream.call(b"slow", timeout=10)) == b"slow"
        assert stream.connected
    finally:
        server.stop()


@pytest.mark.timeout(30)
def test_one_connection_serves_calls_in_turn_and_a_stopped_server_ends_them(slow_echo):
    stream = framed_stream()
    stream.connect(slow_echo.port)
    big = b"\x00" + bytes(range(256)) * 4096  # past the size sent in one write
    for _ in range(3):
        assert bytes(stream.call(big, timeout=5)) == big
    answered = threading.Event()
    failure = []

    def call():
        try:
            stream.call(b"\x14", timeout=10)
        except UnavailableError as error:
            failure.append(error)
        answered.set()

    threading.Thread(target=call).start()
    time.sleep(0.2)
    slow_echo.stop()
    assert answered.wait(5)
    assert failure and "closed the connection" in str(failure[0])


@pytest.mark.timeout(60)
def test_a_ps_serves_framed_on_the_port_it_is_given():
    framed_port = free_port()
    address = f"localhost:{free_port()}"
    server = cv.distribute.Server({"ps": [address], "worker": ["localhost:1"]}, "ps", 0,
                                  framed_port=framed_port)
    try:
        store = RemoteStore(address, 0)
        store.execute([Create("v", np.arange(3.0))])
        assert store.transport == "framed"
        assert store._stream._framed.port == framed_port
        taken = cv.distribute.Server({"ps": [f"localhost:{free_port()}"], "worker": ["w:1"]},
                                     "ps", 0, start=False, framed_port=framed_port)
        with pytest.raises(UnavailableError, match=f"framed port {framed_port}"):
            taken.start()  # the port is the first ps's
    finally:
        server.stop()


@pytest.mark.timeout(60)
def test_a_ps_replaced_at_its_address_fails_the_next_call_unsent_then_serves():
    # As Kubernetes restarts a pod: the same address, a new process (here a new server in this
    # one), its variables gone. The connection ended while no call waited on it: the next
    # request is not sent and fails saying why; the one after reaches the new server.
    address = f"localhost:{free_port()}"
    spec = {"ps": [address], "worker": ["localhost:1"]}
    server = cv.distribute.Server(spec, "ps", 0)
    store = RemoteStore(address, 0)
    try:
        store.execute([Create("v", np.arange(3.0))])
    finally:
        server.stop()
    server = cv.distribute.Server(spec, "ps", 0)
    try:
        deadline = time.monotonic() + 10  # the old server's close reaches this process
        while not _framed._ended(store._stream._framed._socket):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(UnavailableError, match="ended before this request.*not sent"):
            store.execute([Create("v", np.arange(4.0))])
        with pytest.raises(NotFoundError):  # a new process: v is gone with the old one
            store.execute([Read("v")])
        store.execute([Create("v", np.arange(4.0))])
        np.testing.assert_array_equal(store.execute([Read("v")])[0], np.arange(4.0))
        assert store.transport == "framed"
    finally:
        server.stop()


@pytest.mark.parametrize("port", [-1, 65536, 1.5, True])
def test_a_framed_port_that_is_no_port_is_refused(port):
    with pytest.raises(InvalidArgumentError, match="framed_port"):
        cv.distribute.Server({"ps": ["localhost:1"], "worker": ["localhost:2"]}, "ps", 0,
                             start=False, framed_port=port)


def run_once(link, function):
    """``function()`` run on ``link``'s worker in a Run of a stream of its own; (its outcome,
    how the Run travelled)."""
    stream = link.run_stream()
    try:
        calls = [call_message(function, (), {})]
        outcome = link.outcomes(calls, stream.call(run_request(calls), timeout=30))[0]
        return outcome, stream.transport
    finally:
        stream.close()


@pytest.mark.timeout(60)
def test_run_travels_framed_and_over_grpc_when_asked(ps_and_worker, monkeypatch):
    link = WorkerLink(0, ps_and_worker.cluster["worker"][0])
    assert run_once(link, lambda: 6 * 7) == (Outcome(42), "framed")
    outcome, transport = run_once(link, lambda: 1 / 0)  # a function's error, on either path
    assert isinstance(outcome.error, ZeroDivisionError) and transport == "framed"
    monkeypatch.setenv(PS_TRANSPORT_ENV, "grpc")
    assert run_once(WorkerLink(0, link.client.address), lambda: 6 * 7) == (Outcome(42), "grpc")


@pytest.mark.timeout(90)
def test_a_coordinator_runs_functions_on_workers_without_a_framed_port():
    with TrainingCluster(num_workers=2, num_ps=1, env={PS_TRANSPORT_ENV: "grpc"}) as cluster:
        strategy = cv.distribute.ParameterServerStrategy(cluster.resolver())
        with strategy.scope():
            total = cv.Variable(0, name="total")
        coordinator = cv.distribute.ClusterCoordinator(strategy)
        try:
            for _ in range(20):
                coordinator.schedule(lambda: total.assign_add(1))
            coordinator.join()
            assert int(total.numpy()) == 20
            link = WorkerLink(0, cluster.cluster["worker"][0])
            assert run_once(link, lambda: 1) == (Outcome(1), "grpc")
        finally:
            coordinator.shutdown()
