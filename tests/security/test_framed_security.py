"""The framed transport of a ps's ``Execute`` keeps the guarantees of every gRPC call: a
caller without the shared secret is refused before anything of it is decoded, hostile or
malformed frames cost the ps a connection and nothing of its state, and with certificates
the connection is TLS (mutual TLS with a CA), refusing plaintext and strangers.
"""

from __future__ import annotations

import pathlib
import socket
import struct
import sys
from collections.abc import Iterator

import cloudpickle
import numpy as np
import pytest

import convoy as cv
from convoy._transport import framed as _framed
from convoy._transport import rpc as _rpc
from convoy._transport.security import CA_ENV, CERTIFICATE_ENV, KEY_ENV, TOKEN_ENV, Security
from convoy.distribute._operations import Create, Read
from convoy.distribute._store_clients import remote_store
from convoy.distribute._wire import PS_METHODS, PS_SERVICE, decode_one, encode
from convoy.errors import (
    DataLossError,
    InvalidArgumentError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
)
from convoy.testing import TrainingCluster

cloudpickle.register_pickle_by_value(sys.modules[__name__])

PATH = f"/{PS_SERVICE}/Execute"
WRONG = "a-wrong-secret-of-enough-characters"
HEADER = struct.Struct("<BQ")


def framed_port(address: str, security: Security) -> int:
    client = _rpc.Client(address, PS_SERVICE, PS_METHODS, security)
    try:
        return decode_one(client.call("FramedPort", encode(None), timeout=30))
    finally:
        client.close()


def framed(address: str, security: Security) -> _framed.FramedStream:
    """A framed connection to the ps at ``address``, opened with ``security``."""
    stream = _framed.FramedStream("localhost", f"Execute at {address}", PATH, security)
    stream.connect(framed_port(address, security))
    return stream


def raw_exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` on a plain socket; everything the server sends until it closes."""
    with socket.create_connection(("localhost", port), timeout=15) as sock:
        sock.sendall(data)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:  # closed with what was sent unread
            pass
        return received


@pytest.fixture(scope="module")
def guarded(secret: str) -> Iterator[tuple[TrainingCluster, str]]:
    """A ps that has the secret, and a variable on it that an acknowledged call created."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(TOKEN_ENV, secret)
        with TrainingCluster(num_workers=1, num_ps=1) as cluster:
            address = cluster.cluster["ps"][0]
            store = remote_store(address, 0)
            store.execute([Create("kept", np.arange(4.0))])
            assert store.transport == "framed"
            yield cluster, address


def assert_state_kept(address: str) -> None:
    store = remote_store(address, 0)
    np.testing.assert_array_equal(store.execute([Read("kept")])[0], np.arange(4.0))
    assert store.transport == "framed"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("caller", [Security(), Security(token=WRONG)],
                         ids=["no secret", "a wrong secret"])
def test_a_framed_caller_without_the_secret_is_refused(guarded, secret, caller):
    _, address = guarded
    port = framed_port(address, Security(token=secret))
    stream = _framed.FramedStream("localhost", f"Execute at {address}", PATH, caller)
    with pytest.raises(UnauthenticatedError, match="call not signed|wrong call signature"):
        stream.connect(port)
    assert not stream.connected
    assert_state_kept(address)


@pytest.mark.timeout(60)
def test_a_ps_without_the_secret_is_not_believed(secret):
    # The other way round: this process has the secret, the ps does not prove it.
    with TrainingCluster(num_workers=1, num_ps=1, env={TOKEN_ENV: None}) as cluster:
        address = cluster.cluster["ps"][0]
        stream = _framed.FramedStream("localhost", f"Execute at {address}", PATH,
                                      Security(token=secret))
        with pytest.raises(UnauthenticatedError, match="did not prove it knows the shared"):
            stream.connect(framed_port(address, Security()))


HOSTILE = {
    "garbage": b"GET / HTTP/1.1\r\nHost: ps\r\n\r\n",
    "no magic": HEADER.pack(_framed.HELLO, 0),
    "a request before the hello": _framed.MAGIC + HEADER.pack(_framed.REQUEST, 3) + b"abc",
    "an endless hello": _framed.MAGIC + HEADER.pack(_framed.HELLO, 2**63),
    "an unsigned hello": _framed.MAGIC + HEADER.pack(_framed.HELLO, 0),
    "a hello signed with garbage": (_framed.MAGIC + HEADER.pack(_framed.HELLO, 20)
                                    + b"convoy-auth\t1.2.3\n\xff\xfe"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("data", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_frames_cost_a_connection_and_nothing_else(guarded, secret, data):
    _, address = guarded
    answer = raw_exchange(framed_port(address, Security(token=secret)), data)
    if answer:  # at most a refusal, naming why
        kind, length = HEADER.unpack_from(answer)
        assert kind == _framed.ERROR and answer[HEADER.size:].startswith(b"UNAUTHENTICATED\n")
    assert_state_kept(address)


@pytest.mark.timeout(60)
def test_malformed_requests_after_the_handshake_are_answered_as_errors(guarded, secret):
    _, address = guarded
    stream = framed(address, Security(token=secret))
    with pytest.raises(DataLossError, match="not a convoy element message"):
        stream.call(b"\x00" * 100, timeout=10)
    with pytest.raises(InvalidArgumentError, match="Execute takes a list of operation lists"):
        stream.call(encode("not a list"), timeout=10)
    outcomes = decode_one(stream.call(encode([[Read("kept")], "nonsense"]), timeout=10))
    np.testing.assert_array_equal(outcomes[0].unwrap()[0], np.arange(4.0))
    with pytest.raises(InvalidArgumentError, match="operations must be a list"):
        outcomes[1].unwrap()
    assert stream.connected  # answered errors: the framing held
    assert_state_kept(address)


@pytest.mark.timeout(60)
def test_a_request_over_the_size_limit_is_refused_without_reading_it(guarded, secret):
    _, address = guarded
    stream = framed(address, Security(token=secret))
    sock = stream._socket
    sock.sendall(HEADER.pack(_framed.REQUEST, 2**40))  # a terabyte announced, none sent
    sock.settimeout(15)
    refusal = b""
    while chunk := sock.recv(65536):  # the refusal, then the end of the connection
        refusal += chunk
    kind, length = HEADER.unpack_from(refusal)
    assert kind == _framed.ERROR and len(refusal) == HEADER.size + length
    with pytest.raises(ResourceExhaustedError, match="larger than max_request_bytes"):
        raise _framed._error_of(refusal[HEADER.size:], "")
    stream.close()
    assert_state_kept(address)


def identity(folder: pathlib.Path, name: str) -> list[str]:
    return ["--certificate", str(folder / f"{name}.pem"), "--key", str(folder / f"{name}.key")]


@pytest.fixture(scope="module")
def mutual_tls(certificates: pathlib.Path, secret: str) -> Iterator[TrainingCluster]:
    """A training cluster whose tasks show certificates of the test CA and ask every caller
    for one (and the secret); this process shows the client certificate."""
    args = [*identity(certificates, "server"), "--ca", str(certificates / "ca.pem")]
    with pytest.MonkeyPatch.context() as patch:
        for name, value in ((TOKEN_ENV, secret), (CA_ENV, "ca.pem"),
                            (CERTIFICATE_ENV, "client.pem"), (KEY_ENV, "client.key")):
            patch.setenv(name, value if name == TOKEN_ENV else str(certificates / value))
        with TrainingCluster(num_workers=1, num_ps=1, server_args=args,
                             env={CERTIFICATE_ENV: None, KEY_ENV: None, CA_ENV: None}
                             ) as cluster:
            yield cluster


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_mutual_tls_training_steps_travel_framed(mutual_tls):
    strategy = cv.distribute.ParameterServerStrategy(mutual_tls.resolver())
    coordinator = cv.distribute.ClusterCoordinator(strategy)
    try:
        with strategy.scope():
            counter = cv.Variable(0, name="counter")

        ps_address = mutual_tls.cluster["ps"][0]

        def step():
            counter.assign_add(1)
            counter.numpy()  # waits for the ps (updates alone are only queued)
            return remote_store(ps_address, 0).transport

        assert {coordinator.schedule(step).fetch() for _ in range(5)} == {"framed"}
        assert int(counter.numpy()) == 5
        assert remote_store(mutual_tls.cluster["ps"][0], 0).transport == "framed"
        lanes = coordinator._scheduler._lanes.values()  # and the chief's Runs to the worker
        assert {lane.transport for lane in lanes} - {None} == {"framed"}
    finally:
        coordinator.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("who", ["plaintext", "a stranger's certificate", "no certificate"])
def test_mutual_tls_framed_port_refuses_plaintext_and_strangers(mutual_tls, certificates,
                                                                 secret, who):
    address = mutual_tls.cluster["ps"][0]
    port = framed_port(address, Security(token=secret, ca=str(certificates / "ca.pem"),
                                         certificate=str(certificates / "client.pem"),
                                         key=str(certificates / "client.key")))
    caller = {
        "plaintext": Security(token=secret),
        "a stranger's certificate": Security(token=secret, ca=str(certificates / "ca.pem"),
                                             certificate=str(certificates / "stranger.pem"),
                                             key=str(certificates / "stranger.key")),
        "no certificate": Security(token=secret, ca=str(certificates / "ca.pem")),
    }[who]
    stream = _framed.FramedStream("localhost", f"Execute at {address}", PATH, caller)
    with pytest.raises(UnavailableError, match=f"Execute at {address}"):
        stream.connect(port)
    assert not stream.connected
