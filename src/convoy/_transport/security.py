"""Who may talk to a convoy server, and how: the shared secret, TLS, where to bind, limits.

Every server runs its callers' code (pickled datasets and functions), so only callers that
know the cluster's shared secret get a request decoded. The secret never travels: a client
signs each call (each stream) with half of an HMAC-SHA256 of the method, a fresh nonce and a
timestamp; the server checks it before any request body is read, refuses stale timestamps
and replayed nonces, and answers with the other half, which the client checks before it
decodes the answer (so a rogue server cannot make it unpickle anything). TLS, mutual TLS
when the server has a CA, encrypts the channel and protects the bodies; the signature alone
does not keep a network attacker from reading or changing them.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import ipaddress
import logging
import os
import ssl
import stat
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from convoy import errors, monitoring

log = logging.getLogger(__name__)

#: The environment variable the secret is read from when no config or file gives one.
TOKEN_ENV = "CONVOY_AUTH_TOKEN"
#: The environment variables of the TLS paths, read when no config or flag gives them (so
#: clients made without settings, such as the trainer's, find them too).
CERTIFICATE_ENV, KEY_ENV, CA_ENV = "CONVOY_TLS_CERTIFICATE", "CONVOY_TLS_KEY", "CONVOY_TLS_CA"
MIN_TOKEN_CHARS = 16
LOOPBACK = "127.0.0.1"
#: The default limit on one request: large enough for a registered dataset with its data.
MAX_REQUEST_BYTES = 256 * 2**20
#: How far a call's timestamp may be from the server's clock (so, how long nonces are kept).
WINDOW_S = 60.0

#: Where gRPC finds its default roots when a client names no CA (plain sockets use it too).
_GRPC_ROOTS_ENV = "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"

_CALL_KEY = "convoy-auth"
_REPLY_KEY = "convoy-auth-reply"
_HOW_TO_SET = (f"set the same secret of at least {MIN_TOKEN_CHARS} characters on every "
               f"server and client (auth_token=..., --auth-token-file PATH or ${TOKEN_ENV}; "
               "e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')")


@dataclass(frozen=True, repr=False)
class Security:
    """How one process's servers and clients protect their calls.

    ``token``: the cluster's shared secret (see :meth:`load`). ``certificate``/``key``: PEM
    paths of this side's TLS identity; ``ca``: PEM path of the CA that signs the other side
    (a server with a CA requires client certificates: mutual TLS). ``host``: what servers bind
    (loopback by default); binding any other host needs a secret or mutual TLS unless
    ``insecure``. ``max_request_bytes``: the largest request a server accepts.
    """

    token: str | None = None
    certificate: str | None = None
    key: str | None = None
    ca: str | None = None
    host: str = LOOPBACK
    insecure: bool = False
    max_request_bytes: int = MAX_REQUEST_BYTES

    def __post_init__(self) -> None:
        if self.token is not None:
            _check_token(self.token, "`token`")
        if (self.certificate is None) != (self.key is None):
            raise errors.InvalidArgumentError(
                "`certificate` and `key` go together: give both PEM paths or neither")
        for name in ("certificate", "key", "ca"):
            path = getattr(self, name)
            if path is not None and not os.path.isfile(path):
                raise errors.InvalidArgumentError(f"`{name}`: no such file: {path!r}")
        if not isinstance(self.host, str) or not self.host.strip("[]"):
            raise errors.InvalidArgumentError(f"`host` must be a host name or IP, got "
                                              f"{self.host!r}")
        if (not isinstance(self.max_request_bytes, int)
                or not 0 < self.max_request_bytes < 2**31):
            raise errors.InvalidArgumentError(
                f"`max_request_bytes` must be an int in [1, 2**31), got "
                f"{self.max_request_bytes!r}")

    def __repr__(self) -> str:
        token = None if self.token is None else "<hidden>"
        return (f"Security(token={token}, certificate={self.certificate!r}, key={self.key!r}, "
                f"ca={self.ca!r}, host={self.host!r}, insecure={self.insecure}, "
                f"max_request_bytes={self.max_request_bytes})")

    @classmethod
    def load(cls, token: str | None = None, token_file: str | os.PathLike[str] | None = None,
             environ: Mapping[str, str] | None = None, **settings: Any) -> Security:
        """Settings whose secret is ``token`` if given, else the content of ``token_file``,
        else the environment variable ``CONVOY_AUTH_TOKEN`` (else none). The TLS paths not
        given (None) come from ``CONVOY_TLS_CERTIFICATE`` and ``CONVOY_TLS_KEY`` (as a pair)
        and ``CONVOY_TLS_CA``; a ``host`` of None means loopback."""
        environ = os.environ if environ is None else environ
        if token is None and token_file is not None:
            token = _read_token_file(token_file)
        if token is None:
            token = environ.get(TOKEN_ENV)
            if token is not None:
                _check_token(token, f"${TOKEN_ENV}")
        if settings.get("certificate") is None and settings.get("key") is None:
            settings["certificate"] = environ.get(CERTIFICATE_ENV) or None
            settings["key"] = environ.get(KEY_ENV) or None
        if settings.get("ca") is None:
            settings["ca"] = environ.get(CA_ENV) or None
        if settings.get("host") is None:
            settings.pop("host", None)
        return cls(token=token, **settings)

    @property
    def tls(self) -> bool:
        return self.certificate is not None or self.ca is not None

    def authenticator(self) -> Authenticator | None:
        """A signer/checker for the secret, or ``None`` without one."""
        return None if self.token is None else Authenticator(self.token)

    def bind_address(self, service: str, host: str | None, port: int) -> str:
        """``host:port`` for a server to bind (``host`` defaults to :attr:`host`); refuses a
        host other than loopback that no secret or mutual TLS protects, unless insecure."""
        host = self.host if host is None else host
        protected = self.token is not None or (self.certificate is not None and
                                               self.ca is not None)
        if not (protected or self.insecure or is_loopback(host)):
            raise errors.FailedPreconditionError(
                f"refusing to serve {service} on {host!r}, which is not a loopback address, "
                f"without a shared secret: anyone who reaches it could run code on this "
                f"machine. To fix, {_HOW_TO_SET}; or use mutual TLS; or pass insecure=True "
                "(--insecure) if every machine that can reach it is trusted")
        return join_host_port(host, port)

    def server_options(self, options: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
        """``options`` with this server's request size limit."""
        limit = "grpc.max_receive_message_length"
        return [*(o for o in options if o[0] != limit), (limit, self.max_request_bytes)]

    def server_interceptors(self) -> list[grpc.ServerInterceptor]:
        """The interceptor that checks every call's signature, if there is a secret."""
        authenticator = self.authenticator()
        return [] if authenticator is None else [_Gate(authenticator)]

    def add_port(self, server: grpc.Server, address: str) -> int:
        """Bind ``server`` to ``address`` (with TLS, requiring client certificates if there
        is a CA); the bound port, or 0."""
        if not self.tls:
            return int(server.add_insecure_port(address))
        if self.certificate is None or self.key is None:
            raise errors.InvalidArgumentError(
                "a TLS server needs `certificate` and `key`; `ca` alone checks clients only")
        credentials = grpc.ssl_server_credentials(
            [(_read(self.key), _read(self.certificate))],
            root_certificates=None if self.ca is None else _read(self.ca),
            require_client_auth=self.ca is not None)
        return int(server.add_secure_port(address, credentials))

    def channel(self, address: str, options: Sequence[tuple[str, Any]]) -> grpc.Channel:
        """A channel to ``address``: TLS if there is a CA or a certificate (presented to the
        server, for mutual TLS)."""
        if not self.tls:
            return grpc.insecure_channel(address, options=options)
        credentials = grpc.ssl_channel_credentials(
            root_certificates=None if self.ca is None else _read(self.ca),
            private_key=None if self.key is None else _read(self.key),
            certificate_chain=None if self.certificate is None else _read(self.certificate))
        return grpc.secure_channel(address, credentials, options=options)

    def server_ssl_context(self) -> ssl.SSLContext | None:
        """The TLS settings of :meth:`add_port` for a plain socket server (None without TLS):
        this side's certificate, and with a CA, client certificates it signed required."""
        if not self.tls:
            return None
        if self.certificate is None or self.key is None:
            raise errors.InvalidArgumentError(
                "a TLS server needs `certificate` and `key`; `ca` alone checks clients only")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.certificate, self.key)
        if self.ca is not None:
            context.load_verify_locations(self.ca)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def client_ssl_context(self) -> ssl.SSLContext | None:
        """The TLS settings of :meth:`channel` for a plain socket (None without TLS): the
        server's certificate checked against the CA (else the roots gRPC trusts), with its
        host name; this side's certificate shown if there is one."""
        if not self.tls:
            return None
        context = ssl.create_default_context(
            cafile=self.ca or os.environ.get(_GRPC_ROOTS_ENV) or None)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.certificate is not None and self.key is not None:
            context.load_cert_chain(self.certificate, self.key)
        return context


_for_clients: Security | None = None


def use_for_clients(security: Security | None) -> None:
    """Make ``security`` what this process's clients use when made without settings: those
    of a server that runs code making calls of its own (a training worker's functions reach
    the parameter servers); ``None`` goes back to :meth:`Security.load`."""
    global _for_clients
    _for_clients = security


def drop_for_clients(security: Security) -> None:
    """Stop :func:`use_for_clients` of ``security``, if it is still in use."""
    global _for_clients
    if _for_clients is security:
        _for_clients = None


def for_clients() -> Security:
    """The settings of a client made without any: see :func:`use_for_clients`."""
    return Security.load() if _for_clients is None else _for_clients


def join_host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets."""
    bare = host.strip("[]")
    return f"[{bare}]:{port}" if ":" in bare else f"{bare}:{port}"


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost``, ``127.x.y.z``, ``::1``)."""
    bare = host.strip("[]").lower()
    if bare == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


def _check_token(token: Any, source: str) -> None:
    if not isinstance(token, str) or len(token) < MIN_TOKEN_CHARS or not token.isprintable():
        raise errors.InvalidArgumentError(
            f"the shared secret from {source} is not usable (too short, not a string, or "
            f"with unprintable characters): {_HOW_TO_SET}")


def _read_token_file(path: str | os.PathLike[str]) -> str:
    try:
        with open(path, encoding="utf-8") as file:
            token = file.read().strip()
            mode = os.fstat(file.fileno()).st_mode
    except (OSError, UnicodeDecodeError) as error:
        raise errors.InvalidArgumentError(
            f"could not read the auth token file {os.fspath(path)!r}: "
            f"{type(error).__name__}") from None
    _check_token(token, f"the file {os.fspath(path)!r}")
    _warn_if_readable_by_others(os.fspath(path), mode)
    return token


_warned_files: set[str] = set()


def _warn_if_readable_by_others(path: str, mode: int) -> None:
    """Warn (once per file) if every user of the machine may read the secret in ``path``."""
    if mode & stat.S_IROTH and path not in _warned_files:
        _warned_files.add(path)
        log.warning("the auth token file %r is readable by every user of this machine (mode "
                    "%s): anyone who reads it can run code on the cluster; make it private "
                    "with chmod o-r (or chmod 600)", path, oct(stat.S_IMODE(mode)))


def _read(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


class Authenticator:
    """Signs calls and checks their answers (client side); checks calls and signs the
    answers (server side, remembering the nonces of the replay window)."""

    def __init__(self, token: str, window_s: float = WINDOW_S) -> None:
        self._base = hmac.new(token.encode(), digestmod=hashlib.sha256)
        self.window_s = window_s
        self._nonces = _Nonces(keep_s=2 * window_s)

    def _tags(self, method: str, nonce: str, stamp: str) -> tuple[str, str]:
        """The call's signature and the server's reply: the halves of one HMAC-SHA256 of the
        call, so each side computes one (an eavesdropper sees the first half only)."""
        mac = self._base.copy()
        mac.update(f"{method}\n{nonce}\n{stamp}".encode())
        tags = mac.hexdigest()
        return tags[:32], tags[32:]

    def sign(self, method: str, now: float | None = None
             ) -> tuple[Sequence[tuple[str, str]], str]:
        """Metadata for a call to ``method`` (its full path, ``/service/Name``), and the
        reply the server must send for it."""
        nonce = os.urandom(16).hex()
        stamp = str(int((time.time() if now is None else now) * 1000))
        signature, reply = self._tags(method, nonce, stamp)
        return ((_CALL_KEY, f"{stamp}.{nonce}.{signature}"),), reply

    def check_reply(self, metadata: Sequence[tuple[str, Any]] | None, expected: str,
                    where: str) -> None:
        """Raise :class:`UnauthenticatedError` unless ``metadata`` carries ``expected``."""
        reply = next((v for k, v in metadata or () if k == _REPLY_KEY), "")
        if not (isinstance(reply, str) and reply.isascii()
                and hmac.compare_digest(reply, expected)):
            raise errors.UnauthenticatedError(
                f"{where}: the server did not prove it knows the shared secret, so its answer "
                "was not decoded; check that it is the server you meant and has the secret")

    def verify(self, method: str, metadata: Sequence[tuple[str, Any]] | None,
               now: float | None = None) -> Sequence[tuple[str, str]]:
        """The answer's metadata for a call signed by :meth:`sign`; raises
        :class:`UnauthenticatedError` saying why the call is refused otherwise."""
        value = next((v for k, v in metadata or () if k == _CALL_KEY), None)
        if not isinstance(value, str):
            raise _refuse("missing", method, f"call not signed: {_HOW_TO_SET}")
        stamp, _, rest = value.partition(".")
        nonce, _, signature = rest.partition(".")
        if not (value.isascii() and stamp.isdigit() and len(stamp) < 16 and len(nonce) == 32
                and signature):
            raise _refuse("malformed", method, "malformed call signature")
        now = time.time() if now is None else now
        skew = int(stamp) / 1000 - now
        if abs(skew) > self.window_s:
            raise _refuse(
                "stale", method, f"stale call: the caller's clock is {abs(skew):.0f} s "
                f"{'ahead of' if skew > 0 else 'behind'} the server's (at most "
                f"{self.window_s:.0f} s allowed): synchronise the clocks")
        expected, reply = self._tags(method, nonce, stamp)
        if not hmac.compare_digest(signature, expected):
            raise _refuse("wrong", method, f"wrong call signature: {_HOW_TO_SET}")
        if not self._nonces.add(nonce, now):
            raise _refuse("replayed", method, "replayed call (its nonce was seen before)")
        return ((_REPLY_KEY, reply),)


def _refuse(reason: str, method: str, message: str) -> errors.UnauthenticatedError:
    """Count and log (summarised) a call refused for ``reason``; the error refusing it."""
    monitoring.REFUSALS.refused(reason, method, message)
    return errors.UnauthenticatedError(message)


class _Nonces:
    """The nonces accepted in the last ``keep_s`` seconds: a nonce stays acceptable while its
    timestamp is within the window, which ends at most two windows after it arrived."""

    def __init__(self, keep_s: float) -> None:
        self._keep_s = keep_s
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self._arrivals: collections.deque[tuple[float, str]] = collections.deque()

    def add(self, nonce: str, now: float) -> bool:
        """Remember ``nonce``; False if it was seen already."""
        with self._lock:
            arrivals = self._arrivals
            while arrivals and arrivals[0][0] < now - self._keep_s:
                self._seen.discard(arrivals.popleft()[1])
            if nonce in self._seen:
                return False
            self._seen.add(nonce)
            arrivals.append((now, nonce))
            return True

    def __len__(self) -> int:
        return len(self._seen)


class _Gate(grpc.ServerInterceptor):
    """Refuses unsigned calls before their requests are read; signs the answers of others."""

    def __init__(self, authenticator: Authenticator) -> None:
        self._authenticator = authenticator

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        try:
            reply = self._authenticator.verify(details.method, details.invocation_metadata)
        except errors.UnauthenticatedError as error:
            return _refusal(str(error))
        handler = continuation(details)
        return None if handler is None else _answering(handler, reply)


def _refusal(message: str) -> grpc.RpcMethodHandler:
    # Streamed whatever the method: the behaviour runs before any request is read, and
    # without a deserializer nothing of the caller's would be parsed anyway.
    def refuse(requests: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return grpc.stream_stream_rpc_method_handler(refuse)


#: (request streamed, response streamed) -> the handler's behaviour and how to make one.
_KINDS = {
    (False, False): ("unary_unary", grpc.unary_unary_rpc_method_handler),
    (False, True): ("unary_stream", grpc.unary_stream_rpc_method_handler),
    (True, False): ("stream_unary", grpc.stream_unary_rpc_method_handler),
    (True, True): ("stream_stream", grpc.stream_stream_rpc_method_handler),
}


def _answering(handler: Any, reply: Sequence[tuple[str, str]]) -> grpc.RpcMethodHandler:
    """``handler`` sending ``reply`` with its answer: in the initial metadata of a stream
    (before its first response), in the trailing metadata of a single answer (sent with it,
    where initial metadata would cost a message of its own)."""
    kind, make = _KINDS[handler.request_streaming, handler.response_streaming]
    behavior = getattr(handler, kind)
    attach = ("send_initial_metadata" if handler.response_streaming
              else "set_trailing_metadata")

    def answer(request: Any, context: grpc.ServicerContext) -> Any:
        getattr(context, attach)(reply)
        return behavior(request, context)

    return make(answer, handler.request_deserializer, handler.response_serializer)
