"""A process's handles on variable stores: a parameter server's (:class:`RemoteStore`) or one
in this process (:class:`LocalStore`), and sending operation lists to several at once.

In a scheduled function on a worker (see :mod:`convoy.distribute._worker_calls`), updates are
queued without waiting, whole-variable reads may be read ahead, and a cancelled function's
next operation raises CancelledError.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from typing import Any, Protocol

from convoy._base import threads as _threads
from convoy._transport import rpc as _rpc
from convoy._transport import security as _security
from convoy.distribute._operations import Operation, Read
from convoy.distribute._outbox import Outbox
from convoy.distribute._store import VariableStore
from convoy.distribute._transport import MethodStream
from convoy.distribute._wire import PS_METHODS, PS_SERVICE, encode, load_execute_answer
from convoy.distribute._worker_calls import current_call, raise_if_cancelled
from convoy.errors import DataLossError, InvalidArgumentError


class Store(Protocol):
    """A handle on a variable store: :class:`RemoteStore` or :class:`LocalStore`."""

    device: str

    def execute(self, operations: Sequence[Operation]) -> list[Any]: ...

    def execute_async(self, operations: Sequence[Operation]) -> Future[list[Any]]: ...


def send_updates(calls: Sequence[tuple[Store, Sequence[Operation]]]) -> None:
    """Apply ``(store, operations)`` calls. In a scheduled function they are only queued: the
    function counts as done once they are applied, and fails if one fails. Elsewhere this
    waits for them. (Later operations of this process on the same store see them: each
    store's calls leave in order.)

    A scheduled function's updates to a parameter server wait for this process's next message
    to it (the next step's reads, as a rule), to travel with it; the function sends what is
    still waiting once its body has returned (see :meth:`RemoteStore.execute_later`)."""
    call = current_call()
    if call is None:
        execute_all(calls)
        return
    for store, operations in calls:
        if isinstance(store, RemoteStore):
            call.updates.append(store.execute_later(operations))
            if store not in call.held:
                call.held.append(store)
        else:
            call.updates.append(store.execute_async(operations))


class LocalStore:
    """A store in this process (for variables created outside a strategy's scope)."""

    device = "/job:localhost/replica:0/task:0/device:CPU:0"

    def __init__(self) -> None:
        self.store = VariableStore()

    def execute(self, operations: Sequence[Operation]) -> list[Any]:
        return self.store.execute(operations)

    def execute_async(self, operations: Sequence[Operation]) -> Future[list[Any]]:
        future: Future[list[Any]] = Future()
        try:
            future.set_result(self.execute(operations))
        except Exception as error:
            future.set_exception(error)
        return future


def execute_all(calls: Sequence[tuple[Store, Sequence[Operation]]]) -> list[list[Any]]:
    """Run each ``(store, operations)`` call, all at once; returns their results in order.
    A parameter server with no message on its way gets its call from this thread (with the
    lists queued before it), with no hand-over to its sender thread: all are sent, then their
    answers read."""
    started: list[tuple[Future[list[Any]], Callable[[], None] | None]] = []
    try:
        for store, operations in calls:
            started.append(store.begin(operations) if isinstance(store, RemoteStore)
                           else (store.execute_async(operations), None))
    finally:
        for _, finish in started:
            if finish is not None:
                finish()
    futures = [future for future, _ in started]
    if len(futures) > 1:  # woken once, by the last answer, not once per answer still due
        wait(futures)
    return [future.result() for future in futures]


def remote_store(address: str, task_index: int) -> RemoteStore:
    """This process's handle on the store at ``address`` (a module-level function, so pickles
    name it instead of carrying its code)."""
    return RemoteStore.get(address, task_index)


#: How long a parameter server may take to answer one Execute message.
EXECUTE_TIMEOUT_S = 60.0
#: Operation lists one Execute message carries at most.
MAX_LISTS_PER_MESSAGE = 1024

_Pending = tuple[list[Operation], Future[list[Any]]]


class RemoteStore:
    """The store of the parameter server at ``address``; one per address per process.

    Operation lists from all threads of the process travel on one ``Execute`` stream, one
    message in flight at a time, carrying every list queued meanwhile. Under load, concurrent
    training steps so share messages, and the per-message cost is paid once for all of them.
    A caller waiting for its answers (:func:`execute_all`) sends its message itself when no
    message is on its way, carrying the lists queued before its own (a finished step's
    updates, queued :meth:`execute_later`), sparing two hand-overs between threads.
    :attr:`lists_sent` counts the lists.
    """

    _instances: dict[str, RemoteStore] = {}
    _lock = threading.Lock()

    def __init__(self, address: str, task_index: int) -> None:
        self.address = address
        self.task_index = task_index
        self.device = f"/job:ps/replica:0/task:{task_index}/device:CPU:0"
        security = _security.for_clients()
        self._client = _rpc.Client(address, PS_SERVICE, PS_METHODS, security)
        self._stream = MethodStream(self._client, PS_SERVICE, "Execute",
                                    security)  # the sender thread's only
        self._pending: Outbox[_Pending] = Outbox()
        self._sender: threading.Thread | None = None
        self._talking = threading.Lock()  # held while a message is on its way, by its sender
        self._lists_sent = 0
        self._counting = threading.Lock()

    @property
    def transport(self) -> str:
        """How the last ``Execute`` message travelled: ``framed`` or ``grpc``."""
        return self._stream.transport

    @property
    def lists_sent(self) -> int:
        """How many operation lists (each one atomic ``execute``) this process has sent to
        this parameter server so far, from all its threads; a list counts once queued."""
        return self._lists_sent

    @classmethod
    def get(cls, address: str, task_index: int) -> RemoteStore:
        with cls._lock:
            store = cls._instances.get(address)
            if store is None:
                store = cls._instances[address] = cls(address, task_index)
            return store

    def __reduce__(self) -> Any:
        return (remote_store, (self.address, self.task_index))

    def execute(self, operations: Sequence[Operation]) -> list[Any]:
        """Run ``operations`` on the parameter server, atomically; their results."""
        return self.execute_async(operations).result()

    def execute_async(self, operations: Sequence[Operation]) -> Future[list[Any]]:
        """Queue ``operations`` for the next message; the future's result is their results.
        Their arrays are read when the message is sent: leave them unchanged until then. In a
        scheduled function, a read may take an answer read ahead, and the first read sends
        the function's plan along (see :mod:`convoy.distribute._readahead`)."""
        future, finish = self._lists(operations, inline=False)
        assert finish is None
        return future

    def execute_later(self, operations: Sequence[Operation]) -> Future[list[Any]]:
        """As :meth:`execute_async`, but they leave with this process's next message to this
        ps if one goes within :data:`~convoy.distribute._outbox.CARRY_S` (else on their
        own), or with :meth:`flush`."""
        future, finish = self._lists(operations, inline=False, later=True)
        assert finish is None
        return future

    def flush(self) -> None:
        """Send everything queued for this ps from this thread, and read the answers (waiting
        for a message on its way first): the lists queued before this call are settled when
        it returns."""
        with self._talking:
            while batch := self._pending.take_first(MAX_LISTS_PER_MESSAGE):
                self._send_batch(batch)

    def begin(self, operations: Sequence[Operation]
              ) -> tuple[Future[list[Any]], Callable[[], None] | None]:
        """As :meth:`execute_async`, but when no message to this store is on its way, the
        message leaves from this thread, now, with the lists queued before it; then the
        function returned with the future must be called (soon: the store's other callers
        wait for it), and reads the answer into the futures."""
        return self._lists(operations, inline=True)

    def read_ahead(self, key: str) -> Future[list[Any]]:
        """Queue a read of variable ``key`` made ahead of a scheduled function's own (which
        then takes its answer): sent as is, past the function's read-ahead."""
        future: Future[list[Any]] = Future()
        self._queue([([Read(key)], future)])
        return future

    def _lists(self, operations: Sequence[Operation], inline: bool, later: bool = False
               ) -> tuple[Future[list[Any]], Callable[[], None] | None]:
        raise_if_cancelled()
        future: Future[list[Any]] = Future()
        batch: list[_Pending] = [(list(operations), future)]
        call = current_call()
        ahead: list[tuple[Any, str]] = []
        if call is not None:
            answer, ahead = call.reads.on_operations(self, batch[0][0])
            if answer is not None:
                return answer, None
            for store, key in ahead:  # this store's reads ahead go in the same message
                if store is self:
                    read: Future[list[Any]] = Future()
                    batch.append(([Read(key)], read))
                    call.reads.prefetched((store, key), read)
        finish = self._send_now(batch) if inline else None
        if finish is None and not future.done():
            self._queue(batch, later)
        if call is not None:
            for store, key in ahead:
                if store is not self:
                    call.reads.prefetched((store, key), store.read_ahead(key))
        return future, finish

    def _send_now(self, batch: list[_Pending]) -> Callable[[], None] | None:
        """Send ``batch`` from this thread, after the lists queued before it (in one message),
        if no message is on its way and they fit; the function that reads the answer (None:
        not sent, or settled already)."""
        if not self._talking.acquire(blocking=False):
            return None
        try:
            queued = self._pending.take(MAX_LISTS_PER_MESSAGE - len(batch))
            if queued is None:  # more than one message's worth: they go first, as queued
                self._talking.release()
                return None
            self._count(len(batch))
            finish = self._start(queued + batch)
        except BaseException:
            self._talking.release()
            raise
        if finish is None:
            self._talking.release()
            return None

        def finish_and_release() -> None:
            try:
                finish()
            finally:
                self._talking.release()

        return finish_and_release

    def _queue(self, batch: list[_Pending], later: bool = False) -> None:
        self._count(len(batch))
        self._pending.put(batch, later)
        if self._sender is None:
            self._start_sender()

    def _count(self, lists: int) -> None:
        with self._counting:
            self._lists_sent += lists

    def _start_sender(self) -> None:
        with self._lock:
            if self._sender is None:
                # each pass takes from the queue afresh: a failed one loses no list
                self._sender = _threads.start(f"convoy-ps{self.task_index}-sender",
                                              self._send_forever, restart=True)

    def _send_forever(self) -> None:
        while True:
            if not self._pending.wait_until_due(timeout=EXECUTE_TIMEOUT_S):
                continue
            # Lists are taken only while talking: a list sent from a caller's thread never
            # passes one queued before it.
            with self._talking:
                batch = self._pending.take_first(MAX_LISTS_PER_MESSAGE)
                if batch:
                    self._send_batch(batch)

    def _send_batch(self, batch: list[_Pending]) -> None:
        """Send ``batch`` and read its answer into the futures (holding :attr:`_talking`)."""
        try:
            finish = self._start(batch)
            if finish is not None:
                finish()
        except Exception as error:  # e.g. an answer of the wrong shape: no caller hangs
            _fail(batch, DataLossError(f"Execute at {self.address}: {error}"))

    def _start(self, batch: list[_Pending]) -> Callable[[], None] | None:
        """Send ``batch``'s message; the function that reads its answer into the futures
        (None: they are settled already, the message not sent)."""
        try:
            request = encode([operations for operations, _ in batch])
        except InvalidArgumentError:  # somebody's operations do not pickle: fail only theirs
            if len(batch) > 1:
                for one in batch:
                    alone = self._start([one])
                    if alone is not None:
                        alone()
                return None
            batch[0][1].set_exception(_unpicklable(batch[0][0]))
            return None
        try:
            receive = self._stream.begin(request, timeout=EXECUTE_TIMEOUT_S)
        except Exception as error:
            _fail(batch, error)
            return None

        def finish() -> None:
            try:
                outcomes = load_execute_answer(receive(), len(batch), self.address)
            except Exception as error:
                _fail(batch, error)
                return
            for (_, future), outcome in zip(batch, outcomes, strict=True):
                if outcome.ok:
                    future.set_result(outcome.value)
                else:
                    future.set_exception(outcome.error)

        return finish


def _fail(batch: list[_Pending], error: BaseException) -> None:
    for _, future in batch:
        if not future.done():
            future.set_exception(error)


def _unpicklable(operations: list[Operation]) -> InvalidArgumentError:
    try:
        encode(operations)
    except InvalidArgumentError as error:
        return InvalidArgumentError(f"a variable operation cannot be sent to its parameter "
                                    f"server: {error}")
    return InvalidArgumentError("a variable operation cannot be sent to its parameter server")
