"""The coordinator's side of scheduled calls: a function pickled into a call, and the links
to the workers that run them (runs of one call, lanes: a Run in flight on a stream that another
thread can cut short, and calls sent without waiting for the answer)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from convoy._transport import rpc as _rpc
from convoy._transport import security as _security
from convoy._transport.rpc import Outcome
from convoy._values import pickling as _pickling
from convoy.distribute._transport import MethodStream
from convoy.distribute._wire import (
    WORKER_METHODS,
    WORKER_SERVICE,
    Call,
    decode_one,
    encode,
    load_outcomes,
    run_request,
)
from convoy.errors import CancelledError, DataLossError

log = logging.getLogger(__name__)

# A function is pickled once per coordinator process: like a traced function, what it
# captures is fixed when it is first scheduled.
_pickled = _pickling.PickleCache()
_pickling.keep_sent_pickles_in(_pickled)


def call_message(function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                 call_id: int | None = None) -> Call:
    """``function(*args, **kwargs)`` as one call of a worker's ``Run`` request."""
    digest, data = _pickled.get(function, "the scheduled function cannot be sent to the workers")
    return digest, data, _pickling.dumps(
        (args, kwargs), "the arguments of a scheduled function cannot be sent to the workers"
    ), call_id


_unanswered: dict[Any, _rpc.Client] = {}  # calls sent without waiting, until they answer


def send_without_waiting(client: _rpc.Client, method: str, ids: Sequence[int]) -> None:
    """Call ``method`` with ``ids``, best effort (a worker gone has lost what they name)."""
    try:
        future = client.future(method, encode(list(ids)), timeout=10)
    except Exception as error:  # e.g. at interpreter exit
        log.debug("%s at %s not sent: %r", method, client.address, error)
        return
    _unanswered[future] = client  # a gRPC future dropped (or its channel) cancels its call

    def answered(done: Any) -> None:
        _unanswered.pop(done, None)
        try:
            done.result()
        except Exception as error:
            log.debug("%s at %s failed: %r", method, client.address, error)

    future.add_done_callback(answered)


class WorkerLink:
    """The coordinator's connection to one worker task."""

    def __init__(self, index: int, address: str) -> None:
        self.index = index
        self.security = _security.for_clients()
        self.client = _rpc.Client(address, WORKER_SERVICE, WORKER_METHODS, self.security)
        #: the worker process last seen answering (None: not yet): a lane's Runs are for it
        self.incarnation: str | None = None

    def run_stream(self) -> MethodStream:
        """A stream of ``Run`` calls of its own (framed where the worker has a port)."""
        return MethodStream(self.client, WORKER_SERVICE, "Run", self.security)

    def run(self, call: Call) -> Outcome:
        """Run one call on a stream of its own; raises UnavailableError if the worker cannot
        be reached."""
        stream = self.client.stream("Run")
        try:
            return self.outcomes([call], stream.call(run_request([call])))[0]
        finally:
            stream.close()

    def outcomes(self, calls: list[Call], answer: bytes | memoryview) -> list[Outcome]:
        """The outcomes of ``calls`` in this worker's ``answer`` to their Run."""
        outcomes = load_outcomes(answer)
        if len(outcomes) != len(calls):
            raise DataLossError(f"{len(calls)} calls got {len(outcomes)} outcomes from worker "
                                f"{self.index}")
        return outcomes

    def ping(self) -> str:
        """The worker's incarnation (which process answers)."""
        incarnation = decode_one(self.client.call("Ping", encode(None), timeout=5))
        if type(incarnation) is not str:
            raise DataLossError(f"worker {self.index} answered Ping with {incarnation!r:.100}")
        self.incarnation = incarnation
        return incarnation


class Lane:
    """One lane of a worker: a Run in flight at a time, on a stream that :meth:`abandon` can
    cut short from another thread; ``one_at_a_time``: its Runs wait on the worker for those of
    the worker's other lanes (see :func:`~convoy.distribute._wire.run_request`)."""

    def __init__(self, worker: WorkerLink, index: int, wakeup: threading.Condition,
                 one_at_a_time: bool = False) -> None:
        self.worker, self.index, self.wakeup = worker, index, wakeup
        self.one_at_a_time = one_at_a_time
        self._lock = threading.Lock()
        self._stream: MethodStream | None = None  # None: the next Run opens one
        self._calling: MethodStream | None = None  # the stream of the Run in its call
        self._ids: tuple[int, ...] = ()  # the closures of the lane's Run
        self._abandoned = False

    @property
    def transport(self) -> str | None:
        """How the lane's Runs travel (``framed`` or ``grpc``); None before its first."""
        stream = self._stream
        return None if stream is None else stream.transport

    def begin(self, closure_ids: tuple[int, ...]) -> None:
        with self._lock:
            self._ids, self._abandoned = closure_ids, False

    def run(self, calls: list[Call], followed: bool = False) -> list[Outcome]:
        """Run ``calls`` at once on the lane's stream (``followed``: more Runs are due);
        raises UnavailableError if the worker cannot be reached."""
        request = run_request(calls, self.one_at_a_time, self.worker.incarnation, followed)
        return self.worker.outcomes(calls, self._call(request))

    def _call(self, request: bytes) -> bytes | memoryview:
        with self._lock:
            if self._abandoned:
                raise CancelledError("the Run was abandoned before it was sent")
            if self._stream is None:
                self._stream = self.worker.run_stream()
            stream = self._calling = self._stream
        try:
            return stream.call(request, timeout=None)
        except Exception as error:
            with self._lock:
                abandoned = self._abandoned and self._stream is not stream
            if abandoned and not isinstance(error, CancelledError):  # cut short, not lost
                raise CancelledError(f"Run at {self.worker.client.address}: abandoned "
                                     f"({error})") from None
            raise
        finally:
            with self._lock:
                self._calling = None
                dropped = self._stream is not stream  # abandoned: the lane opens another
            if dropped:
                stream.close()

    def abandon(self, closure_ids: tuple[int, ...]) -> bool:
        """Cut the Run of ``closure_ids`` short; whether it was still in its call."""
        with self._lock:
            if self._ids != closure_ids:
                return False
            self._abandoned = True
            stream = self._calling
            if stream is None:
                return False
            if self._stream is stream:
                self._stream = None  # the lane's next Run opens another
        try:
            stream.abort()  # the waiting call raises
        except Exception:  # a call failing at the same moment closes it too
            pass
        return True

    def close(self) -> None:
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

