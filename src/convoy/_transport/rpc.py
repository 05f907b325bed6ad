"""The one way convoy speaks gRPC: addresses, servers, clients, error mapping and retries.

Services are declared as tables of :class:`Method` (name, request type, response type); the
same table builds the server's handlers and the client's stubs, so no generated ``_pb2_grpc``
code is needed. A response type of ``None`` means the handler returns raw ``bytes`` (the
element data path, which must not be copied into a protobuf). A ``streamed`` method answers
each request of one long-lived stream in turn (:class:`~convoy._transport.stream.Stream`): much
cheaper per message than a call each, for a client that sends many. Exceptions raised by
handlers travel as gRPC statuses and come back to the caller as the same :mod:`convoy.errors`
class.

Servers and clients take a :class:`~convoy._transport.security.Security` (by default:
loopback, and the shared secret of ``$CONVOY_AUTH_TOKEN`` if set): with a secret every call is
signed and checked before anything of it is decoded, on either side; with certificates,
channels use TLS.
"""

from __future__ import annotations

import errno
import logging
import random
import re
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from convoy import errors, monitoring
from convoy._transport import security as _security
from convoy._transport.security import Security, join_host_port
from convoy._transport.stream import Stream

log = logging.getLogger(__name__)

#: Options for every channel and server: no message size limit (elements can be large; a
#: server's requests are limited by its ``Security.max_request_bytes``); a
#: lost connection is retried at least every second, as :func:`retry` does (gRPC's default
#: backoff grows to 2 minutes, so a server back after a long outage went unseen for long);
#: while calls are open, a peer that stops answering pings for KEEPALIVE_MS fails them (a
#: stream has no deadline of its own), and servers accept those pings.
KEEPALIVE_MS = 10_000
OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.so_reuseport", 0),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", KEEPALIVE_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_MS),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_MS // 2),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_MS),
]

_ADDRESS = re.compile(r"^(?P<host>\[[0-9a-fA-F:.]+\]|[A-Za-z0-9._-]+):(?P<port>\d{1,5})$")


def parse_target(target: Any, argument: str = "service") -> tuple[str, str]:
    """Split ``"grpc://host:port"`` (or ``"host:port"``) into ``("grpc", "host:port")``."""
    if not isinstance(target, str):
        raise errors.InvalidArgumentError(
            f"`{argument}` must be a string like 'grpc://host:port', but was of type "
            f"{type(target).__name__}"
        )
    if not target:
        raise errors.InvalidArgumentError(f"`{argument}` must not be empty")
    if target.count("://") > 1:
        raise errors.InvalidArgumentError(
            f"Malformed `{argument}` string has multiple '://': {target}"
        )
    protocol, _, address = target.rpartition("://")
    protocol = protocol or "grpc"
    if protocol != "grpc":
        raise errors.NotFoundError(
            f"`{argument}` uses protocol {protocol!r}; the only protocol available is 'grpc'"
        )
    check_address(address, argument)
    return protocol, address


def check_address(address: str, argument: str) -> str:
    match = _ADDRESS.match(address)
    if not match or not 0 < int(match["port"]) < 65536:
        raise errors.InvalidArgumentError(
            f"`{argument}` must name a host and a port, like 'localhost:5050', got {address!r}"
        )
    return address


@dataclass(frozen=True)
class Method:
    """One RPC: its name and message types (``None``: raw bytes, passed through as is);
    ``streamed``: requests and their responses travel on one stream (see :class:`Stream`)."""

    name: str
    request: Any | None
    response: Any | None
    streamed: bool = False


def _identity(data: bytes) -> bytes:
    return data


def _parser(message_type: Any | None) -> Callable[[bytes], Any]:
    return _identity if message_type is None else message_type.FromString


def _serializer(message_type: Any | None) -> Callable[[Any], bytes]:
    return _identity if message_type is None else message_type.SerializeToString


def _status_of(error: BaseException) -> grpc.StatusCode:
    return grpc.StatusCode[errors.grpc_code_name(error)]


def _handler(service: str, method: Method,
             function: Callable[[Any], Any]) -> grpc.RpcMethodHandler:
    seconds = monitoring.timer(service, method.name)

    def handle(request: Any, context: grpc.ServicerContext) -> Any:
        start = time.perf_counter()
        code = "OK"
        try:
            return function(request)
        except errors.ConvoyError as error:
            code = _status_of(error).name
            context.abort(_status_of(error), str(error))
        except Exception as error:
            code = "UNKNOWN"
            log.exception("%s failed", method.name)
            context.abort(grpc.StatusCode.UNKNOWN, f"{type(error).__name__}: {error}")
        finally:
            seconds(code).observe(time.perf_counter() - start)

    def handle_stream(requests: Iterator[Any], context: grpc.ServicerContext) -> Iterator[Any]:
        for request in requests:  # a failure ends the stream with its status
            yield handle(request, context)

    make = (grpc.stream_stream_rpc_method_handler if method.streamed
            else grpc.unary_unary_rpc_method_handler)
    return make(handle_stream if method.streamed else handle,
                request_deserializer=_parser(method.request),
                response_serializer=_serializer(method.response))


def serve(service: str, methods: Mapping[Method, Callable[[Any], Any]], port: int,
          host: str | None = None, max_workers: int = 16,
          security: Security | None = None) -> tuple[grpc.Server, int]:
    """Start a gRPC server for ``service`` on ``host`` (default: ``security.host``); returns
    it and the port it is bound to. ``security`` defaults to :meth:`Security.load`."""
    security = Security.load() if security is None else security
    address = security.bind_address(service, host, port)
    _check_bindable(service, address)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers,
                                                    thread_name_prefix=f"convoy-{service}"),
                         options=security.server_options(OPTIONS),
                         interceptors=security.server_interceptors())
    handlers = {m.name: _handler(service, m, fn) for m, fn in methods.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),
                                     _OtherMethods(service)))
    try:
        bound = security.add_port(server, address)
    except RuntimeError:  # grpc's "Failed to bind", without saying why
        bound = 0
    if bound == 0:
        raise _unbindable(service, address, "the port is in use, or the host is not an "
                                            "address of this machine")
    server.start()
    log.info("%s listening on %s", service, join_host_port(address.rpartition(":")[0], bound))
    return server, bound


#: How a server starts the details of its answer to a method it does not have.
_NOT_HERE = "this is a "


class _OtherMethods(grpc.GenericRpcHandler):
    """Answers the calls of methods a ``service`` server does not have (a client of another
    service at the wrong address), saying what it is."""

    def __init__(self, service: str) -> None:
        self._service = service

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        def refuse(request: bytes, context: grpc.ServicerContext) -> None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED,
                          f"{_NOT_HERE}{self._service} server, without {details.method}")
        return grpc.unary_unary_rpc_method_handler(refuse)


def _wrong_server(error: grpc.RpcError, where: str, service: str) -> errors.ConvoyError:
    """The error of a call a server had no method for: it names what answered, and what was
    expected."""
    details = error.details() or ""
    answered = (details.removeprefix(_NOT_HERE).split(" server", 1)[0]
                if details.startswith(_NOT_HERE) else f"not a convoy server ({details})")
    return errors.UnimplementedError(
        f"{where}: a {service} server was expected, but what answered there is "
        f"{'a ' if details.startswith(_NOT_HERE) else ''}{answered}; check the address")


def _check_bindable(service: str, address: str) -> None:
    """Raise UnavailableError saying why ``address`` cannot be bound, if trial binds find out
    (gRPC only writes why to stderr). Like gRPC, one bindable address of the host will do,
    except that no address of it may be in use: a server bound to ``[::1]:port`` while another
    holds ``127.0.0.1:port`` would share "localhost:port" with it, and clients would reach
    whichever their resolver tries first."""
    host, _, port = address.rpartition(":")
    if port == "0":
        return
    try:
        resolved = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise _unbindable(service, address, f"the host does not resolve ({error})") from None
    failures: list[OSError] = []
    for family, _, _, _, where in resolved:
        with socket.socket(family, socket.SOCK_STREAM) as trial:
            trial.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
            try:
                trial.bind(where)
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    on = "" if where[0] == host.strip("[]") else f" on {where[0]}"
                    raise _unbindable(service, address, f"the port is in use{on}") from None
                failures.append(error)
    if len(failures) == len(resolved):
        raise _unbindable(service, address, failures[0].strerror or str(failures[0]))


def _unbindable(service: str, address: str, why: str) -> errors.UnavailableError:
    return errors.UnavailableError(
        f"could not bind {service} server to {address}: {why}; choose another port or host, "
        "or stop what holds the port")


class ServerBase:
    """A gRPC server for one method table: ``start``, ``stop``, ``join``, and a context manager.

    Subclasses name their ``service``, give their handlers in :meth:`_methods`, and add what
    they run beside it in :meth:`_on_start` (after the port is bound) and :meth:`_on_stop`.
    """

    service: str = ""
    max_workers: int = 16
    #: Whether the code it runs (datasets, functions) makes calls: those then use the
    #: server's settings (its secret, its TLS identity) while it serves.
    lends_settings: bool = False

    def __init__(self, port: int = 0, host: str | None = None,
                 security: Security | None = None) -> None:
        self._server: grpc.Server | None = None
        self._port = port
        self._security = Security.load() if security is None else security
        self._host = self._security.host if host is None else host

    @property
    def port(self) -> int:
        """The bound port (the requested one before :meth:`start`)."""
        return self._port

    @property
    def bound_address(self) -> str:
        """``host:port`` as bound (the requested port before :meth:`start`)."""
        return join_host_port(self._host, self._port)

    @property
    def started(self) -> bool:
        return self._server is not None

    def _methods(self) -> Mapping[Method, Callable[[Any], Any]]:
        raise NotImplementedError

    def _on_start(self) -> None:
        """Called once the port is bound; an exception stops the server and propagates."""

    def _on_stop(self) -> None:
        """Called after the server stopped answering (or failed to start)."""

    def start(self) -> None:
        """Bind and serve (no-op if already started)."""
        if self._server is not None:
            return
        methods = self._methods()
        if self.lends_settings:  # before binding: the first call may come at once
            _security.use_for_clients(self._security)
        try:  # a failure, even to bind, stops what _methods set up
            self._server, self._port = serve(self.service, methods, self._port, self._host,
                                             self.max_workers, self._security)
            self._on_start()
        except BaseException:
            self.stop()
            raise

    def stop(self, grace: float | None = None) -> None:
        """Stop answering (calls in flight get ``grace`` seconds), then :meth:`_on_stop`."""
        if self._server is not None:
            self._server.stop(grace=grace).wait()
        _security.drop_for_clients(self._security)
        self._on_stop()

    def join(self) -> None:
        """Block until the server stops."""
        if self._server is not None:
            self._server.wait_for_termination()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True, slots=True)
class Outcome:
    """One piece of work's result inside a message that carries several: its value, or the
    error it raised instead. (A failure of the whole call travels as the call's gRPC status.)
    """

    value: Any = None
    error: BaseException | None = None

    @classmethod
    def of(cls, function: Callable[..., Any], *args: Any) -> Outcome:
        """Run ``function(*args)``; its value, or the exception it raised."""
        try:
            return cls(function(*args))
        except Exception as error:
            return cls(error=error)

    @property
    def ok(self) -> bool:
        return self.error is None

    def unwrap(self) -> Any:
        """The value; raises the error instead if there is one."""
        if self.error is not None:
            raise self.error
        return self.value

    def __reduce__(self) -> Any:  # cheaper than the dataclass default
        return (Outcome, (self.value, self.error))


class Client:
    """Stubs for one service at one address: ``client.call("Method", request)``.

    ``security`` (default :func:`~convoy._transport.security.for_clients`) gives the channel's TLS
    credentials and the secret that signs every call; with a secret, answers arrive as bytes
    and are parsed only once the server proved it has the secret too.
    """

    def __init__(self, address: str, service: str, methods: list[Method],
                 security: Security | None = None) -> None:
        security = _security.for_clients() if security is None else security
        self.address = address
        self._channel = security.channel(address, OPTIONS)
        self._auth = security.authenticator()
        self._service = service
        self._paths = {m.name: f"/{service}/{m.name}" for m in methods}
        self._parsers = {m.name: _parser(m.response) for m in methods}
        self._stubs = {
            m.name: (self._channel.stream_stream if m.streamed else self._channel.unary_unary)(
                self._paths[m.name],
                request_serializer=_serializer(m.request),
                response_deserializer=_parser(None if self._auth else m.response),
            )
            for m in methods
        }
        self._streamed = {m.name for m in methods if m.streamed}
        self._closed = False

    def call(self, method: str, request: Any, timeout: float | None = 30.0) -> Any:
        """Call ``method``; failures raise the matching :mod:`convoy.errors` exception (a
        call on a closed client: :class:`~convoy.errors.CancelledError`)."""
        if method in self._streamed:
            raise errors.InvalidArgumentError(f"{method} is streamed: use Client.stream")
        try:
            if self._auth is None:
                return self._stubs[method](request, timeout=timeout)
            metadata, reply = self._auth.sign(self._paths[method])
            response, call = self._stubs[method].with_call(request, timeout=timeout,
                                                           metadata=metadata)
        except grpc.RpcError as error:
            where = f"{method} at {self.address}"
            if error.code() is grpc.StatusCode.CANCELLED and not self._closed:
                # Nobody here cancelled it: the server stopped while answering (a restart).
                raise errors.UnavailableError(f"{where}: the server stopped while answering "
                                              f"({error.details()})") from None
            if error.code() is grpc.StatusCode.UNIMPLEMENTED:
                raise _wrong_server(error, where, self._service) from None
            raise errors.from_rpc_error(error, where) from None
        except ValueError:
            if not self._closed:
                raise
            raise errors.CancelledError(f"{method} at {self.address}: the client is closed"
                                        ) from None
        return self._verified(method, call, reply, response)

    def _verified(self, method: str, call: grpc.Call, reply: str, response: bytes) -> Any:
        assert self._auth is not None
        self._auth.check_reply(call.trailing_metadata(), reply, f"{method} at {self.address}")
        return self._parsers[method](response)

    def future(self, method: str, request: Any, timeout: float | None = 30.0) -> Any:
        """Start ``method`` without waiting; ``.result()`` raises grpc errors untranslated."""
        if self._auth is None:
            return self._stubs[method].future(request, timeout=timeout)
        metadata, reply = self._auth.sign(self._paths[method])
        future = self._stubs[method].future(request, timeout=timeout, metadata=metadata)
        return _VerifiedFuture(future, lambda response: self._verified(method, future, reply,
                                                                        response))

    def stream(self, method: str) -> Stream:
        """A :class:`Stream` for the streamed ``method``."""
        return Stream(self._stubs[method], f"{method} at {self.address}", self._auth,
                      self._paths[method], self._parsers[method] if self._auth else _identity)

    def close(self) -> None:
        """Close the channel: calls in flight fail, and later calls raise CancelledError."""
        self._closed = True
        self._channel.close()


class _VerifiedFuture:
    """A call's future whose ``result`` is checked and parsed by ``verified``."""

    def __init__(self, future: Any, verified: Callable[[bytes], Any]) -> None:
        self._future = future
        self._verified = verified

    def result(self, timeout: float | None = None) -> Any:
        return self._verified(self._future.result(timeout))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._future, name)


T = TypeVar("T")

RETRYABLE = (errors.UnavailableError, errors.DeadlineExceededError)
#: The retries' jitter draws from its own generator: the global one is the user's (a program
#: that seeds it must get the same numbers whatever convoy's threads do meanwhile).
_JITTER = random.Random()


def retry(attempt: Callable[[], T], timeout_s: float, what: str,
          should_stop: Callable[[], bool] = lambda: False,
          on_failure: Callable[[BaseException], None] | None = None) -> T:
    """Call ``attempt`` until it succeeds, retrying unavailability with jittered exponential
    backoff; after ``timeout_s`` raise :class:`UnavailableError` saying what failed.
    ``on_failure`` hears of each failure that is retried (say, to log that it waits)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while True:
        try:
            return attempt()
        except RETRYABLE as error:
            if on_failure is not None:
                on_failure(error)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or should_stop():
                raise errors.UnavailableError(
                    f"{what}: gave up after {timeout_s:.1f} s: {error}"
                ) from None
            time.sleep(min(delay * (0.5 + _JITTER.random()), remaining))
            delay = min(delay * 2, 1.0)
