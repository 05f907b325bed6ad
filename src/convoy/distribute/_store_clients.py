"""A process's handles on variable stores: a parameter server's (:class:`RemoteStore`) or one
in this process (:class:`LocalStore`), and sending operation lists to several at once.

In a scheduled function on a worker (see :mod:`convoy.distribute._worker_calls`), updates are
queued without waiting, whole-variable reads may be read ahead, and a cancelled function's
next operation raises CancelledError.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

from convoy import _rpc
from convoy.distribute._store import VariableStore
from convoy.distribute._wire import (
    PS_METHODS,
    PS_SERVICE,
    encode,
    load_execute_answer,
)
from convoy.distribute._worker_calls import current_call, raise_if_cancelled
from convoy.errors import CancelledError, ConvoyError, DataLossError, InvalidArgumentError


def send_updates(calls: list[tuple[Any, list[tuple[Any, ...]]]]) -> None:
    """Apply ``(store, operations)`` calls. In a scheduled function they are only queued: the
    function counts as done once they are applied, and fails if one fails. Elsewhere this
    waits for them. (Later operations of this process on the same store see them: each
    store's calls leave in order.)"""
    call = current_call()
    if call is None:
        execute_all(calls)
        return
    call.updates.extend(store.execute_async(operations) for store, operations in calls)


class LocalStore:
    """A store in this process (for variables created outside a strategy's scope)."""

    device = "/job:localhost/replica:0/task:0/device:CPU:0"

    def __init__(self) -> None:
        self.store = VariableStore()

    def execute(self, operations: list[tuple[Any, ...]]) -> list[Any]:
        return self.store.execute(operations)

    def execute_async(self, operations: list[tuple[Any, ...]]) -> Future[list[Any]]:
        future: Future[list[Any]] = Future()
        try:
            future.set_result(self.execute(operations))
        except Exception as error:
            future.set_exception(error)
        return future


def execute_all(calls: list[tuple[Any, list[tuple[Any, ...]]]]) -> list[list[Any]]:
    """Run each ``(store, operations)`` call, all at once; returns their results in order."""
    futures = [store.execute_async(operations) for store, operations in calls]
    return [future.result() for future in futures]


def remote_store(address: str, task_index: int) -> RemoteStore:
    """This process's handle on the store at ``address`` (a module-level function, so pickles
    name it instead of carrying its code)."""
    return RemoteStore.get(address, task_index)


#: How long a parameter server may take to answer one Execute message.
EXECUTE_TIMEOUT_S = 60.0
#: Operation lists one Execute message carries at most.
MAX_LISTS_PER_MESSAGE = 1024

_Pending = tuple[list[tuple[Any, ...]], "_Answer"]


class _Answer(Future[list[Any]]):
    """The results of one operation list sent to a :class:`RemoteStore`. Waiting for them
    reads the store's answers in the waiting thread: no other thread relays them."""

    def __init__(self, store: RemoteStore) -> None:
        super().__init__()
        self._store = store

    def result(self, timeout: float | None = None) -> list[Any]:
        self._store._wait_for(self, timeout)
        return super().result(0)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self._store._wait_for(self, timeout)
        return super().exception(0)


class RemoteStore:
    """The store of the parameter server at ``address``; one per address per process.

    Operation lists from all threads of the process travel on one ``Execute`` stream, one
    message in flight at a time, carrying every list queued meanwhile. Under load, concurrent
    training steps so share messages, and the per-message cost is paid once for all of them.

    There is no thread of its own: the thread that queues a list when nothing is in flight
    sends it, and a thread that waits for a result reads the answer in flight (setting the
    results of every list it carried) and sends the lists queued meanwhile.
    """

    _instances: dict[str, RemoteStore] = {}
    _lock = threading.Lock()

    def __init__(self, address: str, task_index: int) -> None:
        self.address = address
        self.task_index = task_index
        self.device = f"/job:ps/replica:0/task:{task_index}/device:CPU:0"
        self._client = _rpc.Client(address, PS_SERVICE, PS_METHODS)
        self._stream = self._client.stream("Execute")
        self._state = threading.Condition(threading.Lock())  # guards what follows
        self._pending: list[_Pending] = []  # not sent yet; then something is in flight
        self._in_flight: list[_Pending] | None = None  # sent (or being sent), not answered
        self._sent = False  # the request of _in_flight has left
        self._receiving = False  # a thread reads the answer to _in_flight

    @classmethod
    def get(cls, address: str, task_index: int) -> RemoteStore:
        with cls._lock:
            store = cls._instances.get(address)
            if store is None:
                store = cls._instances[address] = cls(address, task_index)
            return store

    def __reduce__(self) -> Any:
        return (remote_store, (self.address, self.task_index))

    def execute(self, operations: list[tuple[Any, ...]]) -> list[Any]:
        """Run ``operations`` on the parameter server, atomically; their results."""
        return self.execute_async(operations).result()

    def execute_async(self, operations: list[tuple[Any, ...]]) -> Future[list[Any]]:
        """Queue ``operations`` for the next message; the future's result is their results.
        Their arrays are read when the message is sent: leave them unchanged until then. In a
        scheduled function, a read may take an answer read ahead, and the first read sends
        the function's plan along (see :mod:`convoy.distribute._readahead`)."""
        raise_if_cancelled()
        operations = list(operations)
        call = current_call()
        if call is None:
            return self._queue(operations)
        answer, ahead = call.reads.on_operations(self, operations)
        if answer is not None:
            return answer
        future = self._queue(operations)
        for read in ahead:
            call.reads.prefetched(read, read[0]._queue([("read", read[1])]))
        return future

    def _queue(self, operations: list[tuple[Any, ...]]) -> Future[list[Any]]:
        answer = _Answer(self)
        with self._state:
            self._pending.append((operations, answer))
            if self._in_flight is not None:  # it leaves once the answer in flight is read
                return answer
            batch = self._take_pending()
        self._send(batch)
        return answer

    def _take_pending(self) -> list[_Pending]:
        """The lists to send next, which become the ones in flight (call with _state held)."""
        batch = self._pending[:MAX_LISTS_PER_MESSAGE]
        del self._pending[:MAX_LISTS_PER_MESSAGE]
        self._in_flight, self._sent = batch or None, False
        return batch

    def _send(self, batch: list[_Pending]) -> None:
        """Send ``batch`` (the lists in flight); lists that cannot be sent fail, and if none
        went, the next ones are sent instead."""
        while batch:
            batch, request = self._request(batch)
            if request is not None:
                try:
                    self._stream.send(request, timeout=EXECUTE_TIMEOUT_S)
                except Exception as error:
                    _settle(batch, None, error)
                    request = None
            with self._state:
                if request is not None:
                    self._in_flight, self._sent = batch, True
                    self._state.notify_all()
                    return
                batch = self._take_pending()
                self._state.notify_all()

    def _request(self, batch: list[_Pending]) -> tuple[list[_Pending], bytes | None]:
        """The Execute request of ``batch``, less the lists that do not pickle (failed)."""
        try:
            return batch, encode([operations for operations, _ in batch])
        except InvalidArgumentError:  # somebody's operations do not pickle: fail only theirs
            pass
        sendable = []
        for operations, answer in batch:
            try:
                encode(operations)
                sendable.append((operations, answer))
            except InvalidArgumentError:
                answer.set_exception(_unpicklable(operations))
        if not sendable:
            return [], None
        return sendable, encode([operations for operations, _ in sendable])

    def _wait_for(self, answer: _Answer, timeout: float | None) -> None:
        """Wait until ``answer`` is done, reading answers meanwhile if no thread does."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._state:
                while not answer.done() and (self._receiving or not self._sent):
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise TimeoutError(f"Execute at {self.address}: no answer within "
                                           f"{timeout} s")
                    self._state.wait(remaining)
                if answer.done():
                    return
                self._receiving = True
                batch = self._in_flight
            assert batch is not None
            self._receive(batch)

    def _receive(self, batch: list[_Pending]) -> None:
        """Read the answer to ``batch`` (in flight) and settle its lists; send the next."""
        outcomes: list[Any] | None = None
        error: BaseException = CancelledError(f"Execute at {self.address}: interrupted")
        try:
            outcomes = load_execute_answer(self._stream.receive(), len(batch), self.address)
        except ConvoyError as failure:  # the transport's, or an answer of the wrong shape
            error = failure
        except Exception as failure:
            error = DataLossError(f"Execute at {self.address}: a bad answer: {failure}")
        finally:  # even on KeyboardInterrupt: nobody may wait for this thread
            with self._state:
                following = self._take_pending()
            _settle(batch, outcomes, error)
            try:
                self._send(following)
            finally:
                with self._state:
                    self._receiving = False
                    self._state.notify_all()


def _settle(batch: list[_Pending], outcomes: list[Any] | None, error: BaseException) -> None:
    """Set each list's results from ``outcomes``, or ``error`` for all without them."""
    if outcomes is None:
        for _, answer in batch:
            answer.set_exception(error)
        return
    for (_, answer), outcome in zip(batch, outcomes, strict=True):
        if outcome.ok:
            answer.set_result(outcome.value)
        else:
            answer.set_exception(outcome.error)


def _unpicklable(operations: list[tuple[Any, ...]]) -> InvalidArgumentError:
    try:
        encode(operations)
    except InvalidArgumentError as error:
        return InvalidArgumentError(f"a variable operation cannot be sent to its parameter "
                                    f"server: {error}")
    return InvalidArgumentError("a variable operation cannot be sent to its parameter server")
