"""A streamed method's calls, one request and its response at a time, with deadlines.

A stream has no per-message deadline of its own, so one watchdog thread per process cancels
the call that waits past its ``timeout``.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from convoy import errors
from convoy._base import threads as _threads
from convoy._transport.security import Authenticator


def _identity(data: bytes) -> bytes:
    return data


class Stream:
    """Requests and their responses, one at a time, over one stream of a streamed method.

    Not thread-safe: one thread makes the calls. A failure ends the stream (the call raises
    the matching :mod:`convoy.errors` exception); the next call opens a new one. With an
    ``authenticator``, each stream is signed for ``path`` and its answers are ``parse``-d
    once the server proved it has the secret.
    """

    _END = object()

    def __init__(self, stub: Any, where: str, authenticator: Authenticator | None = None,
                 path: str = "", parse: Callable[[bytes], Any] = _identity) -> None:
        self._stub = stub
        self._where = where
        self._auth = authenticator
        self._path = path
        self._parse = parse
        self._reply: str | None = None  # the proof the server owes for the open stream
        self._requests: queue.SimpleQueue[Any] | None = None
        self._responses: Any = None
        self._lock = threading.Lock()  # with the deadline watchdog
        self._calls = 0  # calls made; the watchdog names the one it expires by this count
        self._waiting: int | None = None  # the call waiting for its response
        self._expired = False  # the watchdog cancelled the waiting call

    def call(self, request: Any, timeout: float | None = None) -> Any:
        """Send ``request`` and wait for its response, for at most ``timeout`` seconds (then
        :class:`~convoy.errors.DeadlineExceededError`)."""
        if self._responses is None or self._expired:
            self.close()
            self._requests = queue.SimpleQueue()
            requests = iter(self._requests.get, self._END)
            if self._auth is None:
                self._responses = self._stub(requests)
            else:
                metadata, self._reply = self._auth.sign(self._path)
                self._responses = self._stub(requests, metadata=metadata)
        assert self._requests is not None
        with self._lock:
            self._calls += 1
            self._waiting = serial = self._calls
        if timeout is not None:
            _watchdog.watch(self, serial, time.monotonic() + timeout)
        self._requests.put(request)
        try:
            response = next(self._responses)
            if self._reply is not None:
                assert self._auth is not None
                self._auth.check_reply(self._responses.initial_metadata(), self._reply,
                                       self._where)
                self._reply = None
            return self._parse(response)
        except grpc.RpcError as error:
            expired = self._expired
            self.close()
            if expired:
                raise errors.DeadlineExceededError(
                    f"{self._where}: no answer within {timeout} s") from None
            raise errors.from_rpc_error(error, self._where) from None
        except StopIteration:
            self.close()
            raise errors.UnavailableError(f"{self._where}: the server ended the stream") from None
        except BaseException:  # e.g. KeyboardInterrupt: grpc leaves the call unusable
            self.close()
            raise
        finally:
            with self._lock:
                self._waiting = None
            if timeout is not None:
                _watchdog.unwatch(self)

    def _expire(self, serial: int) -> None:
        with self._lock:
            if self._waiting != serial:
                return  # answered meanwhile
            self._expired = True
            responses = self._responses
        responses.cancel()

    def close(self) -> None:
        if self._responses is not None:
            self._requests.put(self._END)  # type: ignore[union-attr]
            self._responses.cancel()
            self._requests = self._responses = None
        self._expired = False


class _Watchdog:
    """Cancels stream calls past their deadline (a stream has no per-message deadline)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._deadlines: dict[Stream, tuple[int, float]] = {}
        self._thread: threading.Thread | None = None

    def watch(self, stream: Stream, serial: int, deadline: float) -> None:
        with self._lock:
            self._deadlines[stream] = (serial, deadline)
            if self._thread is None:
                self._thread = _threads.start("convoy-stream-deadlines", self._run,
                                              restart=True)

    def unwatch(self, stream: Stream) -> None:
        with self._lock:
            self._deadlines.pop(stream, None)

    def _run(self) -> None:
        while True:
            time.sleep(0.25)
            now = time.monotonic()
            with self._lock:
                expired = [(s, serial) for s, (serial, deadline) in self._deadlines.items()
                           if deadline <= now]
                for stream, _ in expired:
                    del self._deadlines[stream]
            for stream, serial in expired:
                stream._expire(serial)


_watchdog = _Watchdog()
