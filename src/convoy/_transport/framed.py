"""The framed transport: one streamed method's requests and answers as length-prefixed frames
on a plain TCP socket, for traffic where gRPC's cost per message is most of the cost (a
training step's operations sent to a parameter server).

It keeps what every gRPC call of convoy has (see :mod:`convoy._transport.security`): TLS
with the same certificates when the settings have them, and the shared secret checked once
per connection as a gRPC stream is checked once per stream: the client opens with ``b"CVF"``
and a version, then a HELLO frame carrying
:meth:`~convoy._transport.security.Authenticator.sign`'s signature for the method's path; the
server checks it with the same
:meth:`~convoy._transport.security.Authenticator.verify` before it reads anything else, and its
WELCOME frame carries the proof the client checks before it decodes any answer. Then each
REQUEST frame gets one ANSWER frame (the handler's bytes) or one ERROR frame (a status code name and
message, raised on the client as the same :mod:`convoy.errors` class, as a gRPC status is).
While a request runs, the server sends ALIVE frames, so a client tells a slow answer from a
server that stopped (no frame for :data:`SILENCE_S`: :class:`~convoy.errors.UnavailableError`,
as gRPC's keepalive pings fail a stream).

A frame is its kind (u8), its body's length (u64, little-endian) and the body. Answers are
received into one buffer each and handed over as a read-only view on it, so arrays decoded
from them are not copied.
"""

from __future__ import annotations

import functools
import logging
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from convoy import errors, monitoring
from convoy._base import threads as _threads
from convoy._transport.rpc import KEEPALIVE_MS
from convoy._transport.security import Security

log = logging.getLogger(__name__)

MAGIC = b"CVF\x01"
_HEADER = struct.Struct("<BQ")
HELLO, WELCOME, REQUEST, ANSWER, ERROR, ALIVE = range(1, 7)
#: How long a connection may take to open (TCP, TLS and the signed hello), on either side.
HANDSHAKE_TIMEOUT_S = 10.0
#: How long the rest of a frame may take to arrive once its first byte did.
FRAME_TIMEOUT_S = 60.0
#: A server that sends nothing for this long while it owes an answer is taken for gone.
SILENCE_S = 2 * KEEPALIVE_MS / 1000
#: The largest HELLO body a server reads (a signature is about 100 bytes).
MAX_HELLO_BYTES = 4096
#: Connections a server keeps open at once (one per client process is the usual).
MAX_CONNECTIONS = 1024
#: Bodies up to this size leave in one write with their header (one copy, one system call).
_JOIN_MAX = 64 * 1024


class _Closed(Exception):
    """The peer closed the connection."""


def _send(sock: socket.socket, kind: int, body: bytes | memoryview = b"") -> None:
    header = _HEADER.pack(kind, len(body))
    if len(body) <= _JOIN_MAX:
        sock.sendall(header + body)
    else:
        sock.sendall(header)
        sock.sendall(body)


def _read_into(sock: socket.socket, view: memoryview) -> None:
    while view.nbytes:
        received = sock.recv_into(view)
        if received == 0:
            raise _Closed
        view = view[received:]


def _read_exactly(sock: socket.socket, size: int) -> bytearray:
    buffer = bytearray(size)
    _read_into(sock, memoryview(buffer))
    return buffer


def _pairs(metadata: Any) -> bytes:
    """Call metadata (``(key, value)`` pairs) as a frame body."""
    return "".join(f"{key}\t{value}\n" for key, value in metadata).encode()


def _parse_pairs(body: bytes | bytearray | memoryview) -> list[tuple[str, str]]:
    """The pairs of :func:`_pairs`; malformed lines are left out (and so fail the check)."""
    try:
        text = bytes(body).decode("ascii")
    except UnicodeDecodeError:
        return []
    return [(key, value) for line in text.splitlines()
            for key, _, value in [line.partition("\t")] if key]


def _error_body(error: BaseException) -> bytes:
    return f"{errors.grpc_code_name(error)}\n{error}".encode()


def _error_of(body: bytes | memoryview, where: str) -> errors.ConvoyError:
    code, _, message = bytes(body).decode("utf-8", "replace").partition("\n")
    if code in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "UNAUTHENTICATED") and \
            not message.startswith(where):
        message = f"{where}: {message}"
    return errors.from_grpc_code(code, message)


class FramedStream:
    """Requests and their answers, one at a time, on a framed connection to a server at
    ``host`` (the port is given to :meth:`connect`). ``where`` names the method and server in
    errors; ``path`` is what the connection is signed for.

    Not thread-safe: one thread makes the calls. A transport failure (the server gone,
    silent, or answering garbage) closes the connection and raises; connect again to go on.
    """

    def __init__(self, host: str, where: str, path: str, security: Security) -> None:
        self.host = host.strip("[]")
        self._where = where
        self._path = path
        self._auth = security.authenticator()
        self._tls = security.client_ssl_context()
        self._socket: socket.socket | None = None
        self.port: int | None = None

    @property
    def connected(self) -> bool:
        return self._socket is not None

    def connect(self, port: int, timeout: float = HANDSHAKE_TIMEOUT_S) -> None:
        """Open the connection to ``port`` and prove, both ways, the shared secret."""
        self.close()
        self.port = port
        deadline = time.monotonic() + min(timeout, HANDSHAKE_TIMEOUT_S)
        try:
            sock = socket.create_connection((self.host, port), timeout=HANDSHAKE_TIMEOUT_S)
        except OSError as error:
            raise errors.UnavailableError(
                f"{self._where}: cannot connect to its framed port {port}: {error}") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                sock = self._tls.wrap_socket(sock, server_hostname=self.host)
            metadata, reply = self._auth.sign(self._path) if self._auth else ((), "")
            sock.sendall(MAGIC)
            _send(sock, HELLO, _pairs(metadata))
            kind, body = self._read_frame(sock, deadline, "the handshake", HANDSHAKE_TIMEOUT_S,
                                          MAX_HELLO_BYTES)
            if kind == ERROR:
                raise _error_of(body, self._where)
            if kind != WELCOME:
                raise errors.DataLossError(f"{self._where}: a handshake answer of kind {kind}")
            if self._auth is not None:
                self._auth.check_reply(_parse_pairs(body), reply, self._where)
        except BaseException as error:
            sock.close()
            if isinstance(error, ssl.SSLError | ssl.CertificateError):
                raise errors.UnavailableError(
                    f"{self._where}: TLS handshake on its framed port {port} failed: "
                    f"{error}") from None
            if isinstance(error, OSError) and not isinstance(error, errors.ConvoyError):
                raise errors.UnavailableError(
                    f"{self._where}: {error} during the handshake") from None
            raise
        self._socket = sock

    def call(self, request: bytes | memoryview, timeout: float) -> memoryview:
        """Send ``request``; its answer (a read-only view), within ``timeout`` seconds (else
        :class:`~convoy.errors.DeadlineExceededError`). An error the server answered is
        raised as itself, and the connection stays open."""
        self.send(request)
        return self.receive(timeout)

    def send(self, request: bytes | memoryview) -> None:
        """Send ``request`` (the first half of :meth:`call`; :meth:`receive` its answer)."""
        sock = self._socket
        if sock is None:
            raise errors.UnavailableError(f"{self._where}: not connected")
        if _ended(sock):
            self.close()
            raise errors.UnavailableError(
                f"{self._where}: the connection had ended before this request (the server "
                f"stopped, or was restarted); the request was not sent")
        try:
            _send(sock, REQUEST, request)
        except BaseException as error:  # the framing is lost (KeyboardInterrupt mid-frame too)
            self.close()
            if isinstance(error, OSError) and not isinstance(error, errors.ConvoyError):
                raise errors.UnavailableError(f"{self._where}: {error} while sending a "
                                              "request") from None
            raise

    def receive(self, timeout: float) -> memoryview:
        """The answer to the request :meth:`send` sent, as :meth:`call` returns it."""
        sock = self._socket
        if sock is None:
            raise errors.UnavailableError(f"{self._where}: not connected")
        deadline = time.monotonic() + timeout
        try:
            while True:
                kind, body = self._read_frame(sock, deadline, "its answer", timeout)
                if kind in (ANSWER, ERROR):
                    break
                if kind != ALIVE:
                    raise errors.DataLossError(f"{self._where}: an answer of kind {kind}")
        except BaseException as error:  # the framing is lost
            self.close()
            if isinstance(error, OSError) and not isinstance(error, errors.ConvoyError):
                raise errors.UnavailableError(f"{self._where}: {error} while waiting for an "
                                              "answer") from None
            raise
        if kind == ERROR:
            raise _error_of(body, self._where)
        return body

    def _read_frame(self, sock: socket.socket, deadline: float, what: str, timeout: float,
                    limit: int | None = None) -> tuple[int, memoryview]:
        """The next frame's kind and body (of at most ``limit`` bytes); waits for it until
        ``deadline``, and for a server that says nothing at most :data:`SILENCE_S`."""
        header = bytearray(_HEADER.size)
        try:
            self._wait(sock, deadline)
            _read_into(sock, memoryview(header))
            kind, length = _HEADER.unpack(header)
            if limit is not None and length > limit:
                raise errors.DataLossError(f"{self._where}: a frame of {length:,} bytes while "
                                           f"this process waited for {what}")
            body = bytearray(length)
            self._wait(sock, deadline)
            _read_into(sock, memoryview(body))
        except TimeoutError:
            if time.monotonic() >= deadline:
                raise errors.DeadlineExceededError(
                    f"{self._where}: no answer within {timeout:g} s (waiting for {what})"
                ) from None
            raise errors.UnavailableError(
                f"{self._where}: the server sent nothing for {SILENCE_S:g} s while this "
                f"process waited for {what}: it is stopped, hung or unreachable") from None
        except _Closed:
            raise errors.UnavailableError(
                f"{self._where}: the server closed the connection while this process waited "
                f"for {what}") from None
        return kind, memoryview(body).toreadonly()

    @staticmethod
    def _wait(sock: socket.socket, deadline: float) -> None:
        sock.settimeout(max(0.001, min(SILENCE_S, deadline - time.monotonic())))

    def abort(self) -> None:
        """Make a call waiting in another thread raise UnavailableError (the connection ends;
        the next call needs :meth:`connect`)."""
        sock = self._socket
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        if self._socket is not None:
            try:
                self._socket.close()
            finally:
                self._socket = None


class _Connection:
    """A server's connection: its socket, and whether a request is being answered."""

    def __init__(self, sock: socket.socket) -> None:
        self.socket = sock
        self.lock = threading.Lock()  # the connection's thread and the ALIVE beats write
        self.busy_since: float | None = None


class FramedServer:
    """Serves ``method`` of ``service`` with framed connections on ``host`` and ``port`` (0:
    an ephemeral one): each request's answer is ``handler(request)`` (a read-only view, kept
    by nobody after the call), and an exception it raises travels as an ERROR frame."""

    def __init__(self, service: str, method: str,
                 handler: Callable[[memoryview], bytes], security: Security,
                 host: str | None = None, port: int = 0) -> None:
        self._service = service
        self._path = f"/{service}/{method}"
        self._handler = handler
        self._security = security
        self._auth = security.authenticator()
        self._tls = security.server_ssl_context()
        self._seconds = monitoring.timer(service, method)
        address = security.bind_address(f"{service} (framed)", host, port)
        bare = address.rpartition(":")[0].strip("[]")
        family = socket.AF_INET6 if ":" in bare else socket.AF_INET
        try:
            self._listener = socket.create_server((bare, port), family=family, backlog=128)
        except OSError as error:
            raise errors.UnavailableError(
                f"could not bind the framed port {port} of {service} on {bare}: "
                f"{error}") from None
        self.port: int = self._listener.getsockname()[1]
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._connections: set[_Connection] = set()
        _threads.start(f"convoy-framed-{self.port}", self._accept, restart=True)
        _threads.start(f"convoy-framed-{self.port}-alive", self._beat, restart=True)

    def stop(self) -> None:
        """Stop accepting and close every connection (a request being answered ends)."""
        self._stopped.set()
        try:  # wakes the accepting thread (closing alone would leave it listening)
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.socket.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError:
                if self._stopped.is_set():
                    return
                time.sleep(0.01)  # e.g. out of file descriptors: do not spin
                continue
            with self._lock:
                if len(self._connections) >= MAX_CONNECTIONS:
                    log.warning("%s: refusing a framed connection beyond %d", self._service,
                                MAX_CONNECTIONS)
                    sock.close()
                    continue
                connection = _Connection(sock)
                self._connections.add(connection)
            _threads.start("convoy-framed-connection", self._serve, connection,
                           on_error=functools.partial(self._dropped, connection))

    def _beat(self) -> None:
        """Send ALIVE on each connection whose request runs long, so its client waits on."""
        while not self._stopped.wait(SILENCE_S / 8):
            now = time.monotonic()
            with self._lock:
                connections = list(self._connections)
            for connection in connections:
                with connection.lock:
                    since = connection.busy_since
                    if since is not None and now - since > SILENCE_S / 4:
                        try:
                            _send(connection.socket, ALIVE)
                        except OSError:
                            pass

    def _serve(self, connection: _Connection) -> None:
        try:
            connection.socket = self._handshake(connection.socket)
            while True:
                request = self._next_request(connection.socket)
                self._answer(connection, request)
        except (OSError, _Closed) as error:
            log.debug("%s: a framed connection ended: %r", self._service, error)
        except _Refused as refusal:
            log.warning("%s: refused a framed connection: %s", self._service, refusal)
        finally:
            self._drop(connection)

    def _dropped(self, connection: _Connection, error: BaseException) -> None:
        """Its serving thread failed: ``connection`` ends (its client sees it closed)."""
        self._drop(connection)

    def _drop(self, connection: _Connection) -> None:
        """Forget ``connection`` and close it."""
        with self._lock:
            self._connections.discard(connection)
        connection.socket.close()

    def _handshake(self, sock: socket.socket) -> socket.socket:
        """TLS, then the magic and the signed hello; the socket to serve on."""
        sock.settimeout(HANDSHAKE_TIMEOUT_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if self._tls is not None:
            try:
                sock = self._tls.wrap_socket(sock, server_side=True)
            except (ssl.SSLError, ssl.CertificateError) as error:
                raise _Refused(f"TLS handshake failed: {error}") from None
        if bytes(_read_exactly(sock, len(MAGIC))) != MAGIC:
            raise _Refused("it did not start with the framed transport's magic")
        kind, length = _HEADER.unpack(_read_exactly(sock, _HEADER.size))
        if kind != HELLO or length > MAX_HELLO_BYTES:
            raise _Refused(f"a first frame of kind {kind} and {length} bytes, not a hello")
        metadata = _parse_pairs(_read_exactly(sock, length))
        try:
            reply = () if self._auth is None else self._auth.verify(self._path, metadata)
        except errors.UnauthenticatedError as error:  # counted and logged, summarised
            _send(sock, ERROR, _error_body(error))
            raise _Closed(str(error)) from None
        _send(sock, WELCOME, _pairs(reply))
        sock.settimeout(FRAME_TIMEOUT_S)
        return sock

    def _next_request(self, sock: socket.socket) -> memoryview:
        """The next request's body; waits for its first byte as long as the client keeps
        the connection (TCP keepalive finds a dead peer), for the rest FRAME_TIMEOUT_S (the
        socket's timeout from the handshake on: changing it per request costs system
        calls)."""
        header = bytearray(_HEADER.size)
        while True:
            try:
                received = sock.recv_into(header)
                break
            except TimeoutError:  # an idle client
                continue
        if received == 0:
            raise _Closed
        _read_into(sock, memoryview(header)[received:])
        kind, length = _HEADER.unpack(header)
        if kind != REQUEST:
            raise _Refused(f"a frame of kind {kind} where a request was due")
        limit = self._security.max_request_bytes
        if length > limit:
            _send(sock, ERROR, _error_body(errors.ResourceExhaustedError(
                f"a request of {length:,} bytes is larger than max_request_bytes "
                f"({limit:,})")))
            raise _Refused(f"a request of {length:,} bytes (at most {limit:,})")
        return memoryview(_read_exactly(sock, length)).toreadonly()

    def _answer(self, connection: _Connection, request: memoryview) -> None:
        with connection.lock:
            connection.busy_since = time.monotonic()
        started = time.perf_counter()
        code = "OK"
        try:
            kind, body = ANSWER, self._handler(request)
        except errors.ConvoyError as error:
            kind, body = ERROR, _error_body(error)
            code = errors.grpc_code_name(error)
        except Exception as error:
            log.exception("%s failed", self._path)
            kind, body = ERROR, _error_body(errors.UnknownError(
                f"{type(error).__name__}: {error}"))
            code = "UNKNOWN"
        finally:
            self._seconds(code).observe(time.perf_counter() - started)
        del request
        with connection.lock:
            connection.busy_since = None
            _send(connection.socket, kind, body)


def _ended(sock: socket.socket) -> bool:
    """Whether a connection between calls has ended (the server stopped or restarted): nothing
    is due on it then, so anything to read is its end or out of protocol (TLS's own records,
    such as a session ticket, are neither)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    if not poller.poll(0):
        return False
    timeout = sock.gettimeout()
    sock.settimeout(0)
    try:
        sock.recv(1)
    except (ssl.SSLWantReadError, BlockingIOError):
        return False
    except OSError:
        return True
    finally:
        sock.settimeout(timeout)
    return True


class _Refused(Exception):
    """A connection the server closes without serving it (said why, in the log)."""
