"""The shared secret, TLS, safe binding and request limits of the one RPC helper (``_rpc``),
on real gRPC servers on loopback (the servers built on it are tested in the other modules
here): unsigned or wrongly signed callers are refused before anything of theirs is parsed, a
rogue server's answer is never decoded, replays and stale calls are refused, TLS and mutual
TLS round trips work, oversize requests are refused while the server keeps serving, and
public addresses are not bound without a secret."""

from __future__ import annotations

import pathlib
import pickle
import statistics
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from convoy._transport import rpc as _rpc
from convoy._transport.security import (
    _CALL_KEY,
    _REPLY_KEY,
    Authenticator,
    Security,
    _Nonces,
    is_loopback,
)
from convoy.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
)

TOKEN = "correct-horse-battery-staple"
WRONG = "incorrect-horse-battery-staple"
SERVICE = "test.Secure"


class Unpickled:
    """A message type whose parsing unpickles, and records that it ran."""

    parsed: list[bytes] = []

    @staticmethod
    def SerializeToString(data: bytes) -> bytes:  # noqa: N802 (the protobuf interface)
        return data

    @classmethod
    def FromString(cls, data: bytes) -> bytes:  # noqa: N802
        cls.parsed.append(data)
        pickle.loads(data)
        return data


class Touch:
    """Pickles into a call that creates ``path`` when unpickled."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path

    def __reduce__(self) -> object:
        return (pathlib.Path.touch, (self.path,))


RUN = _rpc.Method("Run", Unpickled, None)
RUN_MANY = _rpc.Method("RunMany", Unpickled, None, streamed=True)
METHODS = [RUN, RUN_MANY]


def answer(request: object) -> bytes:
    return b"ran"


def serve(security: Security, **kwargs: object) -> tuple[grpc.Server, str]:
    server, port = _rpc.serve(SERVICE, {m: answer for m in METHODS}, 0, security=security,
                              **kwargs)
    return server, f"localhost:{port}"


def call(client: _rpc.Client, method: _rpc.Method, request: object) -> object:
    if not method.streamed:
        return client.call(method.name, request, timeout=20)
    stream = client.stream(method.name)
    try:
        return stream.call(request, timeout=20)
    finally:
        stream.close()


@pytest.fixture()
def secured() -> Iterator[str]:
    server, address = serve(Security(token=TOKEN))
    Unpickled.parsed.clear()
    yield address
    server.stop(None)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("caller", [Security(), Security(token=WRONG)], ids=["none", "wrong"])
@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_callers_without_the_secret_are_refused_before_their_request_is_parsed(
        secured, caller, method, tmp_path):
    client = _rpc.Client(secured, SERVICE, METHODS, security=caller)
    for _ in range(2):  # a refusal leaves the next call refused the same way
        with pytest.raises(UnauthenticatedError) as refused:
            call(client, method, pickle.dumps(Touch(tmp_path / "pwned")))
        assert TOKEN not in str(refused.value)
    assert Unpickled.parsed == []
    assert not (tmp_path / "pwned").exists()
    client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_callers_with_the_secret_are_served(secured, method, tmp_path):
    client = _rpc.Client(secured, SERVICE, METHODS, security=Security(token=TOKEN))
    assert call(client, method, pickle.dumps(Touch(tmp_path / "ran"))) == b"ran"
    assert (tmp_path / "ran").exists()  # so the refusals above did stop a working payload
    if not method.streamed:
        assert client.future(method.name, pickle.dumps(None)).result(20) == b"ran"
    else:
        stream = client.stream(method.name)
        assert [stream.call(pickle.dumps(i), timeout=20) for i in range(3)] == [b"ran"] * 3
        stream.close()
    client.close()


@pytest.mark.timeout(60)
def test_servers_and_clients_take_the_secret_from_the_environment_by_default(monkeypatch):
    monkeypatch.setenv("CONVOY_AUTH_TOKEN", TOKEN)
    server, port = _rpc.serve(SERVICE, {RUN: answer}, 0)
    address = f"127.0.0.1:{port}"
    assert _rpc.Client(address, SERVICE, [RUN]).call("Run", pickle.dumps(None)) == b"ran"
    with pytest.raises(UnauthenticatedError):
        _rpc.Client(address, SERVICE, [RUN], security=Security()).call("Run", b"")
    server.stop(None)


@pytest.mark.timeout(60)
def test_an_unsigned_call_to_an_unknown_method_is_unauthenticated_not_unimplemented(secured):
    ghost = [_rpc.Method("Ghost", None, None)]
    with pytest.raises(UnauthenticatedError):
        _rpc.Client(secured, SERVICE, ghost, security=Security()).call("Ghost", b"")
    with pytest.raises(NotImplementedError):
        _rpc.Client(secured, SERVICE, ghost, security=Security(token=TOKEN)).call("Ghost", b"")


def raw_call(address: str, method: str, metadata: object) -> grpc.RpcError | None:
    with grpc.insecure_channel(address) as channel:
        try:
            channel.unary_unary(f"/{SERVICE}/{method}")(pickle.dumps(None), timeout=20,
                                                        metadata=metadata)
        except grpc.RpcError as error:
            return error
    return None


@pytest.mark.timeout(60)
def test_replayed_stale_and_misdirected_signatures_are_refused(secured):
    signer = Authenticator(TOKEN)
    metadata, _ = signer.sign(f"/{SERVICE}/Run")
    assert raw_call(secured, "Run", metadata) is None
    refusals = {
        "replayed": raw_call(secured, "Run", metadata),
        "behind": raw_call(secured, "Run", signer.sign(f"/{SERVICE}/Run",
                                                       now=time.time() - 120)[0]),
        "ahead": raw_call(secured, "Run", signer.sign(f"/{SERVICE}/Run",
                                                      now=time.time() + 120)[0]),
        "wrong call signature": raw_call(secured, "Run", signer.sign(f"/{SERVICE}/Other")[0]),
        "malformed": raw_call(secured, "Run", ((_CALL_KEY, "1.2.3"),)),
        "malformed call": raw_call(secured, "Run", ((_CALL_KEY, "9" * 5000 + ".x.y"),)),
    }
    for reason, error in refusals.items():
        assert error is not None and error.code() == grpc.StatusCode.UNAUTHENTICATED, reason
        assert reason in error.details()
    assert Unpickled.parsed == [pickle.dumps(None)]  # the one good call only


def test_nonces_are_forgotten_after_two_windows():
    nonces = _Nonces(keep_s=120)
    assert nonces.add("a", now=0) and not nonces.add("a", now=100)
    assert nonces.add("b", now=121) and len(nonces) == 1
    assert nonces.add("a", now=122)


def test_a_signature_is_checked_in_the_server_window():
    signer, checker = Authenticator(TOKEN), Authenticator(TOKEN, window_s=5)
    metadata, reply = signer.sign("/s/M", now=1000.0)
    checker.verify("/s/M", metadata, now=1004.0)  # within the window
    with pytest.raises(UnauthenticatedError, match="replayed"):
        checker.verify("/s/M", metadata, now=1004.5)
    with pytest.raises(UnauthenticatedError, match="synchronise the clocks"):
        checker.verify("/s/M", signer.sign("/s/M", now=1000.0)[0], now=1006.0)
    with pytest.raises(UnauthenticatedError, match="not signed"):
        checker.verify("/s/M", (), now=1000.0)


class Rogue:
    """A server that knows no secret: it answers every call with a payload that would create
    a file when unpickled, with a forged proof (or none)."""

    def __init__(self, payload: bytes, proof: str | None) -> None:
        metadata = () if proof is None else ((_REPLY_KEY, proof),)

        def unary(request: bytes, context: grpc.ServicerContext) -> bytes:
            context.set_trailing_metadata(metadata)
            return payload

        def streamed(requests: Iterator[bytes], context: grpc.ServicerContext):
            context.send_initial_metadata(metadata)
            for _ in requests:
                yield payload

        self.server = grpc.server(_Pool(), options=_rpc.OPTIONS)
        handlers = {"Run": grpc.unary_unary_rpc_method_handler(unary),
                    "RunMany": grpc.stream_stream_rpc_method_handler(streamed)}
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, handlers),))
        self.address = f"localhost:{self.server.add_insecure_port('localhost:0')}"
        self.server.start()


class _Pool:
    """The least executor grpc.server needs: a thread per call."""

    def submit(self, function, *args, **kwargs):
        threading.Thread(target=function, args=args, kwargs=kwargs, daemon=True).start()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("proof", [None, "0" * 64], ids=["no-proof", "forged-proof"])
@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_a_rogue_servers_answer_is_never_decoded(proof, method, tmp_path):
    rogue = Rogue(pickle.dumps(Touch(tmp_path / "pwned")), proof)
    answers = [_rpc.Method(m.name, None, Unpickled, m.streamed) for m in METHODS]
    client = _rpc.Client(rogue.address, SERVICE, answers, security=Security(token=TOKEN))
    Unpickled.parsed.clear()
    with pytest.raises(UnauthenticatedError, match="did not prove it knows the shared secret"):
        call(client, method, b"hello")
    if not method.streamed:
        with pytest.raises(UnauthenticatedError):
            client.future(method.name, b"hello").result(20)
    assert Unpickled.parsed == []
    assert not (tmp_path / "pwned").exists()
    client.close()
    rogue.server.stop(None)


# TLS --------------------------------------------------------------------------------------


def _identity(folder: pathlib.Path, name: str, **settings: object) -> Security:
    return Security(certificate=str(folder / f"{name}.pem"), key=str(folder / f"{name}.key"),
                    **settings)


@pytest.mark.timeout(60)
def test_tls_round_trip_with_the_secret(certificates):
    ca = str(certificates / "ca.pem")
    server, address = serve(_identity(certificates, "server", token=TOKEN))
    client = _rpc.Client(address, SERVICE, METHODS, security=Security(ca=ca, token=TOKEN))
    assert [call(client, m, pickle.dumps(None)) for m in METHODS] == [b"ran", b"ran"]
    plain = _rpc.Client(address, SERVICE, METHODS, security=Security(token=TOKEN))
    with pytest.raises(UnavailableError):  # no TLS: the server does not answer it
        plain.call("Run", pickle.dumps(None), timeout=5)
    client.close(), plain.close(), server.stop(None)


@pytest.mark.timeout(60)
def test_mutual_tls_needs_a_client_certificate_from_the_ca(certificates):
    ca = str(certificates / "ca.pem")
    server, address = serve(_identity(certificates, "server", ca=ca))
    client = _rpc.Client(address, SERVICE, METHODS,
                         security=_identity(certificates, "client", ca=ca))
    assert [call(client, m, pickle.dumps(None)) for m in METHODS] == [b"ran", b"ran"]
    anonymous = _rpc.Client(address, SERVICE, METHODS, security=Security(ca=ca))
    with pytest.raises(UnavailableError):
        anonymous.call("Run", pickle.dumps(None), timeout=5)
    client.close(), anonymous.close(), server.stop(None)
    # A server that checks client certificates may listen beyond loopback without a secret.
    assert _identity(certificates, "server", ca=ca).bind_address("s", "0.0.0.0", 1)


# Limits and binding -----------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_an_oversize_request_is_refused_and_the_server_keeps_serving(method):
    server, address = serve(Security(token=TOKEN, max_request_bytes=2**20))
    client = _rpc.Client(address, SERVICE, METHODS, security=Security(token=TOKEN))
    with pytest.raises(ResourceExhaustedError):
        call(client, method, pickle.dumps(b"x" * 2 * 2**20))
    assert call(client, method, pickle.dumps(b"x" * 2**19)) == b"ran"
    client.close(), server.stop(None)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("host", ["0.0.0.0", "[::]", "::", "example.com", "10.1.2.3"])
def test_a_public_address_is_not_bound_without_a_secret(host):
    with pytest.raises(FailedPreconditionError, match="CONVOY_AUTH_TOKEN.*insecure=True"):
        _rpc.serve(SERVICE, {RUN: answer}, 0, host=host, security=Security())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("security", [Security(insecure=True), Security(token=TOKEN)],
                         ids=["insecure", "secret"])
def test_a_public_address_is_bound_with_a_secret_or_when_insecure(security):
    server, port = _rpc.serve(SERVICE, {RUN: answer}, 0, host="0.0.0.0", security=security)
    client = _rpc.Client(f"127.0.0.1:{port}", SERVICE, [RUN], security=security)
    assert client.call("Run", pickle.dumps(None)) == b"ran"
    client.close(), server.stop(None)


class Echo(_rpc.ServerBase):
    service = SERVICE

    def _methods(self):
        return {RUN: answer}


@pytest.mark.timeout(60)
def test_servers_bind_loopback_by_default_and_say_where():
    with Echo(security=Security()) as server:
        server.start()
        assert server.bound_address == f"127.0.0.1:{server.port}" and server.port > 0
        client = _rpc.Client(server.bound_address, SERVICE, [RUN], security=Security())
        assert client.call("Run", pickle.dumps(None)) == b"ran"
        client.close()
    assert Echo(host="::1", security=Security()).bound_address == "[::1]:0"


@pytest.mark.parametrize(("host", "loopback"), [
    ("localhost", True), ("127.0.0.1", True), ("127.8.9.1", True), ("::1", True),
    ("[::1]", True), ("0.0.0.0", False), ("[::]", False), ("example.com", False)])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


# The settings object ------------------------------------------------------------------------


def test_the_secret_never_shows(tmp_path):
    security = Security(token=TOKEN)
    assert TOKEN not in repr(security) and TOKEN not in str(security)
    assert "token=<hidden>" in repr(security)
    with pytest.raises(InvalidArgumentError) as short:
        Security(token="hunter2")
    assert "hunter2" not in str(short.value)
    with pytest.raises(InvalidArgumentError) as from_env:
        Security.load(environ={"CONVOY_AUTH_TOKEN": "hunter2"})
    assert "CONVOY_AUTH_TOKEN" in str(from_env.value) and "hunter2" not in str(from_env.value)


def test_the_secret_comes_from_the_value_then_the_file_then_the_environment(tmp_path):
    file = tmp_path / "token"
    file.write_text(WRONG + "\n")
    environ = {"CONVOY_AUTH_TOKEN": "from-the-environment"}
    assert Security.load(TOKEN, file, environ).token == TOKEN
    assert Security.load(None, file, environ).token == WRONG
    assert Security.load(None, None, environ).token == "from-the-environment"
    assert Security.load(None, None, {}).token is None
    assert Security.load(host="::1", environ={}).host == "::1"
    with pytest.raises(InvalidArgumentError, match="could not read the auth token file"):
        Security.load(token_file=tmp_path / "missing", environ={})


def test_bad_settings_are_named(tmp_path):
    with pytest.raises(InvalidArgumentError, match="`certificate` and `key` go together"):
        Security(certificate=__file__)
    with pytest.raises(InvalidArgumentError, match="`ca`: no such file"):
        Security(ca=str(tmp_path / "missing.pem"))
    with pytest.raises(InvalidArgumentError, match="max_request_bytes"):
        Security(max_request_bytes=0)


# Cost -------------------------------------------------------------------------------------


def _per_call_us(action, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        action()
    return (time.perf_counter() - started) / calls * 1e6


@pytest.mark.timeout(300)
def test_cost_of_the_secret(capsys):
    """Tiny unary calls and 256 KiB stream messages, with and without the secret, measured
    in alternating rounds (the medians are printed; the bound only catches gross costs)."""
    echo = _rpc.Method("Echo", None, None, streamed=True)
    ping = _rpc.Method("Ping", None, None)
    setups = {}
    for name, security in (("plain", Security()), ("secret", Security(token=TOKEN))):
        server, port = _rpc.serve(SERVICE, {echo: len_bytes, ping: len_bytes}, 0,
                                  security=security)
        client = _rpc.Client(f"127.0.0.1:{port}", SERVICE, [echo, ping], security=security)
        setups[name] = server, client, client.stream("Echo")
    big = b"x" * 256 * 1024
    rounds: dict[tuple[str, str], list[float]] = {}
    for _ in range(9):
        for name, (_, client, stream) in setups.items():
            rounds.setdefault((name, "unary"), []).append(
                _per_call_us(lambda c=client: c.call("Ping", b"hi"), 200))
            rounds.setdefault((name, "stream"), []).append(
                _per_call_us(lambda s=stream: s.call(big), 100))
    medians = {key: statistics.median(values) for key, values in rounds.items()}
    with capsys.disabled():
        for kind in ("unary", "stream"):
            plain, secret = medians["plain", kind], medians["secret", kind]
            print(f"\n{kind}: {plain:.0f} us without the secret, {secret:.0f} us with "
                  f"({(secret / plain - 1) * 100:+.0f}%)")
    for server, client, stream in setups.values():
        stream.close(), client.close(), server.stop(None)
    assert medians["secret", "unary"] < 1.5 * medians["plain", "unary"] + 200
    assert medians["secret", "stream"] < 1.5 * medians["plain", "stream"] + 200


def len_bytes(request: bytes) -> bytes:
    return str(len(request)).encode()
