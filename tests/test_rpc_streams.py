"""Streamed methods of the one RPC helper, on a real in-process gRPC server: responses in
order, a handler's error ends only its stream, a deadline turns a stuck server into
DeadlineExceededError, and a stream reopens after any failure."""

from __future__ import annotations

import random
import threading
import time

import pytest

from convoy._transport import rpc as _rpc
from convoy.errors import DeadlineExceededError, InvalidArgumentError, UnavailableError
from convoy.testing import free_port

ECHO = _rpc.Method("Echo", None, None, streamed=True)
PING = _rpc.Method("Ping", None, None)
release = threading.Event()


def echo(request: bytes) -> bytes:
    if request == b"bad":
        raise InvalidArgumentError("bad request")
    if request == b"stuck":
        release.wait(30)
    return request.upper()


@pytest.fixture(scope="module")
def client():
    server, port = _rpc.serve("test.Echo", {ECHO: echo, PING: echo}, free_port(),
                              host="localhost")
    client = _rpc.Client(f"localhost:{port}", "test.Echo", [ECHO, PING])
    yield client
    release.set()
    client.close()
    server.stop(None)


@pytest.mark.timeout(60)
def test_responses_in_order_and_errors_end_only_their_stream(client):
    stream = client.stream("Echo")
    assert [stream.call(r) for r in (b"a", b"b", b"c")] == [b"A", b"B", b"C"]
    with pytest.raises(InvalidArgumentError, match="bad request"):
        stream.call(b"bad")
    assert stream.call(b"again") == b"AGAIN"  # a new stream
    with pytest.raises(InvalidArgumentError, match="streamed"):
        client.call("Echo", b"x")


@pytest.mark.timeout(60)
def test_a_deadline_fails_a_stuck_call_and_the_stream_reopens(client):
    release.clear()
    stream = client.stream("Echo")
    started = time.monotonic()
    with pytest.raises(DeadlineExceededError, match="no answer within 0.5 s"):
        stream.call(b"stuck", timeout=0.5)
    assert time.monotonic() - started < 5
    release.set()
    assert stream.call(b"fine", timeout=10) == b"FINE"
    assert client.call("Ping", b"p") == b"P"


@pytest.mark.timeout(60)
def test_an_unreachable_server_is_unavailable():
    stream = _rpc.Client(f"localhost:{free_port()}", "test.Echo", [ECHO]).stream("Echo")
    with pytest.raises(UnavailableError, match="Echo at"):
        stream.call(b"x", timeout=30)


def test_retry_backs_off_then_gives_up_naming_what_failed_and_leaves_global_random_alone(
) -> None:
    """A program that seeds ``random`` gets the same numbers whatever convoy retries."""
    random.seed(5)
    expected = random.random()
    random.seed(5)
    failures = [UnavailableError("down"), UnavailableError("still down")]

    def attempt() -> str:
        if failures:
            raise failures.pop(0)
        return "up"

    assert _rpc.retry(attempt, 5.0, "calling the test server") == "up"
    assert random.random() == expected

    def never() -> str:
        raise UnavailableError("gone")

    with pytest.raises(UnavailableError, match=r"calling the test server: gave up after 0\.1 s"):
        _rpc.retry(never, 0.1, "calling the test server")


def test_test_processes_draw_ports_from_disjoint_slices(monkeypatch):
    # Under pytest-xdist, a port drawn in one test process is released before its server binds
    # it; another process drawing the same port meanwhile would share or steal its address.
    import convoy.testing as testing

    drawn = []
    for worker in range(3):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
        drawn.append(set(testing._below_ephemeral(200)))
    assert all(drawn)
    assert not (drawn[0] & drawn[1]) and not (drawn[1] & drawn[2]) and not (drawn[0] & drawn[2])
    assert max(drawn[0]) < min(drawn[1]) and max(drawn[1]) < min(drawn[2])


def test_a_server_refuses_a_port_in_use_on_any_address_of_its_host():
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(UnavailableError, match=f"localhost:{port}: the port is in use"):
            _rpc.serve("test.Echo", {PING: echo}, port, host="localhost")


def test_a_test_process_is_never_given_a_port_twice():
    # A process keeps handles per address (a ps's store, a worker's link); a new server at an
    # old server's address would be taken for that server restarted.
    from convoy.testing import free_ports

    first, second = free_ports(50), free_ports(50)
    assert len(set(first) | set(second)) == 100
