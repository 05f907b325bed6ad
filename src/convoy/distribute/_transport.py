"""How a training cluster's streamed calls travel: a process's ``Execute`` messages to a ps
and the chief's ``Run`` messages to a worker go on the server's framed port (see
:mod:`convoy._transport.framed`) when it has one and this process allows it (see
:data:`~convoy.distribute._wire.PS_TRANSPORT_ENV`), else on the method's gRPC stream.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from convoy._transport import rpc as _rpc
from convoy._transport.framed import FramedStream
from convoy._transport.security import Security
from convoy.distribute._wire import decode_one, encode, ps_transport
from convoy.errors import ConvoyError, DataLossError, UnimplementedError


class MethodStream:
    """The calls of ``method`` (streamed) of the server ``client`` reaches, one at a time.
    The server's ``FramedPort`` names its framed port; after a failure, the next call asks
    again (the server may be a new process).

    Not thread-safe: one thread makes the calls; :meth:`abort` may come from another.
    """

    def __init__(self, client: _rpc.Client, service: str, method: str,
                 security: Security) -> None:
        self._client = client
        self._grpc = client.stream(method)
        where = self._where = f"{method} at {client.address}"
        self._framed = (FramedStream(client.address.rpartition(":")[0], where,
                                     f"/{service}/{method}", security)
                        if ps_transport() == "framed" else None)
        self._asked = False  # whether the server was asked for its framed port since a failure

    @property
    def transport(self) -> str:
        """How the last call travelled: ``framed`` or ``grpc``."""
        return "framed" if self._framed is not None and self._framed.connected else "grpc"

    def call(self, request: bytes, timeout: float | None) -> bytes | memoryview:
        """Send one request; its answer (within ``timeout`` seconds; None: no limit)."""
        return self.begin(request, timeout)()

    def begin(self, request: bytes, timeout: float | None) -> Callable[[], bytes | memoryview]:
        """Send one request; the function that waits for its answer (within ``timeout``
        seconds of its call) and returns it. Call it before the next ``begin``: in between,
        this thread may send requests to other servers, so that they answer at once."""
        try:
            framed = self._framed
            if framed is not None and not framed.connected and not self._asked:
                self._asked = True
                port = self._framed_port()
                if port is not None:
                    framed.connect(port)
            if framed is not None and framed.connected:
                framed.send(request)
                return functools.partial(self._receive, framed,
                                         float("inf") if timeout is None else timeout)
            answer: bytes = self._grpc.call(request, timeout=timeout)
            return lambda: answer
        except Exception:
            self._asked = False
            raise

    def _receive(self, framed: FramedStream, timeout: float) -> memoryview:
        try:
            return framed.receive(timeout)
        except Exception:
            self._asked = False
            raise

    def abort(self) -> None:
        """Make a call waiting in another thread raise (its connection or stream closes)."""
        if self._framed is not None:
            self._framed.abort()
        self._grpc.close()

    def close(self) -> None:
        if self._framed is not None:
            self._framed.close()
        self._grpc.close()

    def _framed_port(self) -> int | None:
        try:
            port = decode_one(self._client.call("FramedPort", encode(None), timeout=30))
        except UnimplementedError:  # a server of a convoy without the framed transport
            return None
        except ConvoyError as error:  # named as the call it is part of
            raise type(error)(f"{self._where}: asking for its framed port: {error}") from None
        if port is not None and type(port) is not int:
            raise DataLossError(f"FramedPort at {self._client.address} answered {port!r:.50}")
        return port
