"""The coordinator's links to its workers: runs of one call, lanes (a Run in flight on a
stream that another thread can cut short), and calls sent without waiting for the answer."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from convoy import _rpc
from convoy._rpc import Outcome
from convoy.distribute._calls import Call, load_outcomes, run_request
from convoy.distribute._protocol import WORKER_METHODS, WORKER_SERVICE, decode_one, encode
from convoy.distribute.server import worker_context
from convoy.errors import CancelledError, DataLossError, FailedPreconditionError

log = logging.getLogger(__name__)

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
        self.client = _rpc.Client(address, WORKER_SERVICE, WORKER_METHODS)

    def run(self, call: Call) -> Outcome:
        """Run one call on a stream of its own; raises UnavailableError if the worker cannot
        be reached."""
        stream = self.client.stream("Run")
        try:
            outcomes = load_outcomes(stream.call(run_request([call])))
        finally:
            stream.close()
        if len(outcomes) != 1:
            raise DataLossError(f"one call got {len(outcomes)} outcomes from worker "
                                f"{self.index}")
        return outcomes[0]

    def ping(self) -> str:
        """The worker's incarnation (which process answers)."""
        return decode_one(self.client.call("Ping", encode(None), timeout=5))


class Lane:
    """One lane of a worker: a Run in flight at a time, on a stream that :meth:`abandon` can
    cut short from another thread."""

    def __init__(self, worker: WorkerLink, index: int, wakeup: threading.Condition) -> None:
        self.worker, self.index, self.wakeup = worker, index, wakeup
        self._lock = threading.Lock()
        self._stream: _rpc.Stream | None = None
        self._ids: tuple[int, ...] = ()  # the closures of the lane's Run
        self._in_call = False
        self._abandoned = False

    def begin(self, closure_ids: tuple[int, ...]) -> None:
        with self._lock:
            self._ids, self._abandoned = closure_ids, False

    def call(self, request: bytes) -> bytes:
        with self._lock:
            if self._abandoned:
                raise CancelledError("the Run was abandoned before it was sent")
            if self._stream is None:
                self._stream = self.worker.client.stream("Run")
            stream, self._in_call = self._stream, True
        try:
            return stream.call(request)
        finally:
            with self._lock:
                self._in_call = False

    def abandon(self, closure_ids: tuple[int, ...]) -> bool:
        """Cut the Run of ``closure_ids`` short; whether it was still in its call."""
        with self._lock:
            if self._ids != closure_ids:
                return False
            self._abandoned = True
            if not self._in_call:
                return False
            stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.close()  # the waiting call raises; the lane opens another stream
            except Exception:  # a call failing at the same moment closes it too
                pass
        return True

    def close(self) -> None:
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()


def build_resource(resource_id: int, make: Callable[[], Any], for_dataset: bool) -> None:
    context = worker_context()
    if context is None:
        raise FailedPreconditionError("per-worker resources can only be created on workers")
    context.creating_dataset = for_dataset
    try:
        context.resources[resource_id] = make()
    finally:
        context.creating_dataset = False
