"""The parameter-server and worker RPCs, and the stores variables talk to.

Both services carry codec messages (pickle protocol 5, arrays out of band): a parameter
server's ``Execute`` takes lists of variable operations, runs each list atomically and answers
each list's :class:`~convoy._rpc.Outcome` (its results or its error); a worker's ``Run``
takes cloudpickled function calls, runs them at once and answers each one's Outcome, so a
function's own failure is told apart from the worker's (the call's status). Both carry several
callers' work per call when there is a queue: the fixed cost of a call would otherwise dominate
small training steps.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

import cloudpickle

from convoy import _pickling, _rpc
from convoy._channel import Channel
from convoy._rpc import Outcome
from convoy.codec import Encoder, decode
from convoy.distribute._limits import oversize_function
from convoy.distribute._store import VariableStore
from convoy.errors import ConvoyError, DataLossError, InvalidArgumentError, UnknownError

log = logging.getLogger(__name__)

PS_SERVICE = "convoy.distribute.ParameterServer"
WORKER_SERVICE = "convoy.distribute.Worker"
PS_METHODS = [_rpc.Method("Execute", None, None, streamed=True)]
WORKER_METHODS = [_rpc.Method("Run", None, None, streamed=True), _rpc.Method("Ping", None, None)]

_encoder = Encoder(None)


def encode(value: Any) -> bytes:
    return _encoder.encode([value])


def decode_one(payload: bytes) -> Any:
    elements = decode(payload)
    if len(elements) != 1:
        raise DataLossError(f"expected a message of one element, got {len(elements)}")
    return elements[0]


# ----- function calls: a function is pickled once per coordinator, unpickled once per worker ---
_pickled: weakref.WeakKeyDictionary[Any, tuple[bytes, bytes]] = weakref.WeakKeyDictionary()
_unpickled: OrderedDict[bytes, Callable[..., Any]] = OrderedDict()
_cache_lock = threading.Lock()
_UNPICKLED_KEPT = 1024


def _pickle_function(function: Callable[..., Any]) -> tuple[bytes, bytes]:
    """(digest, pickled) for ``function``, pickled on its first use only: like a traced
    function, what it captures is fixed when it is first scheduled."""
    with _cache_lock:
        try:
            cached = _pickled.get(function)
        except TypeError:  # not weak-referenceable: pickle every time
            cached = None
    if cached is None:
        data = _pickling.dumps(function, "the scheduled function cannot be sent to the workers")
        cached = (hashlib.sha1(data).digest(), data)
        with _cache_lock:
            try:
                _pickled[function] = cached
            except TypeError:
                pass
    return cached


Call = tuple[bytes, bytes, bytes]


def call_message(function: Callable[..., Any], args: tuple, kwargs: dict) -> Call:
    """``function(*args, **kwargs)`` as one call of a worker's ``Run`` request."""
    digest, data = _pickle_function(function)
    return digest, data, _pickling.dumps(
        (args, kwargs), "the arguments of a scheduled function cannot be sent to the workers")


def load_call(call: Any) -> tuple[Callable[..., Any], tuple, dict]:
    """The function and arguments of one call (the function unpickled once per worker)."""
    if type(call) is not tuple or len(call) != 3 or not all(type(p) is bytes for p in call):
        raise InvalidArgumentError("a call must be a (digest, function, arguments) tuple of "
                                   "bytes")
    digest, data, arguments = call
    with _cache_lock:
        function = _unpickled.get(digest)
    if function is None:
        function = cloudpickle.loads(data)
        with _cache_lock:
            _unpickled[digest] = function
            while len(_unpickled) > _UNPICKLED_KEPT:
                _unpickled.popitem(last=False)
    args, kwargs = cloudpickle.loads(arguments)
    return function, args, kwargs


def run_request(calls: list[Call]) -> bytes:
    """A worker ``Run`` request: calls the worker runs at once."""
    return encode(calls)


def run_calls(request: bytes, pool: Executor, max_function_bytes: int | None = None) -> bytes:
    """A worker's ``Run``: the request's calls, the first in this thread and the others on
    ``pool``, all at once; answers each one's pickled :class:`Outcome` (a refusal for a
    function that pickles to more than ``max_function_bytes``)."""
    calls = decode_one(request)
    if type(calls) is not list or not calls:
        raise InvalidArgumentError(f"Run takes a non-empty list of calls, got "
                                   f"{type(calls).__name__}")
    others = [pool.submit(_pickled_outcome, call, max_function_bytes) for call in calls[1:]]
    return encode([_pickled_outcome(calls[0], max_function_bytes),
                   *(future.result() for future in others)])


_queued_updates = threading.local()  # .futures: the updates the running call has queued


def send_updates(calls: list[tuple[Any, list[tuple[Any, ...]]]]) -> None:
    """Apply ``(store, operations)`` calls. In a scheduled function they are only queued: the
    function counts as done once they are applied, and fails if one fails. Elsewhere this
    waits for them. (Later operations of this process on the same store see them: each
    store's calls leave in order.)"""
    queued = getattr(_queued_updates, "futures", None)
    if queued is None:
        execute_all(calls)
        return
    queued.extend(store.execute_async(operations) for store, operations in calls)


def _pickled_outcome(call: Any, max_function_bytes: int | None = None) -> bytes:
    outcome = oversize_function(call, max_function_bytes) or _run_call(call)
    try:
        return cloudpickle.dumps(outcome)
    except Exception as error:  # the result or exception does not pickle
        what = outcome.value if outcome.ok else outcome.error
        return cloudpickle.dumps(Outcome(error=UnknownError(
            f"{type(what).__name__} from a scheduled function could not be sent back: "
            f"{error}; it was: {what!r:.200}")))


def _run_call(call: Any) -> Outcome:
    """The outcome of one call, once the updates it queued have landed."""
    _queued_updates.futures = queued = []
    try:
        outcome = Outcome.of(_call, call)
    finally:
        _queued_updates.futures = None
    for future in queued:  # all of them, even after an error: nothing is left in flight
        try:
            future.result()
        except Exception as error:
            if outcome.ok:
                outcome = Outcome(error=error)
    return outcome


def _call(call: Any) -> Any:
    function, args, kwargs = load_call(call)
    return function(*args, **kwargs)


def load_outcomes(response: bytes) -> list[Outcome]:
    """The :class:`Outcome` of each call of a ``Run`` response."""
    outcomes = []
    for pickled in decode_one(response):
        try:
            outcome = cloudpickle.loads(pickled)
        except Exception as error:  # e.g. an exception class this process cannot import
            outcome = Outcome(error=UnknownError(
                f"a scheduled function's result could not be unpickled here: "
                f"{type(error).__name__}: {error}"))
        if type(outcome) is not Outcome:
            raise DataLossError(f"a Run answer holds {outcome!r:.100}, not an Outcome")
        outcomes.append(outcome)
    return outcomes


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


def serve_operations(store: VariableStore, request: bytes) -> bytes:
    """A parameter server's ``Execute``: run each operation list of the request atomically,
    in order, and answer each one's :class:`Outcome` (its results, or its error)."""
    batch = decode_one(request)
    if type(batch) is not list:
        raise InvalidArgumentError(f"Execute takes a list of operation lists, got "
                                   f"{type(batch).__name__}")
    return encode([_execute(store, operations) for operations in batch])


def _execute(store: VariableStore, operations: Any) -> Outcome:
    try:
        if type(operations) is not list:
            raise InvalidArgumentError(f"operations must be a list, got "
                                       f"{type(operations).__name__}")
        return Outcome(store.execute(operations))
    except ConvoyError as error:
        return Outcome(error=error)
    except Exception as error:
        log.exception("a variable operation failed")
        return Outcome(error=UnknownError(f"{type(error).__name__}: {error}"))


#: How long a parameter server may take to answer one Execute message.
EXECUTE_TIMEOUT_S = 60.0
#: Operation lists one Execute message carries at most.
MAX_LISTS_PER_MESSAGE = 1024

_Pending = tuple[list[tuple[Any, ...]], Future]


class RemoteStore:
    """The store of the parameter server at ``address``; one per address per process.

    Operation lists from all threads of the process travel on one ``Execute`` stream, one
    message in flight at a time, carrying every list queued meanwhile. Under load, concurrent
    training steps so share messages, and the per-message cost is paid once for all of them.
    """

    _instances: dict[str, RemoteStore] = {}
    _lock = threading.Lock()

    def __init__(self, address: str, task_index: int) -> None:
        self.address = address
        self.task_index = task_index
        self.device = f"/job:ps/replica:0/task:{task_index}/device:CPU:0"
        self._client = _rpc.Client(address, PS_SERVICE, PS_METHODS)
        self._stream = self._client.stream("Execute")  # used by the sender thread only
        self._pending: Channel[_Pending] = Channel(f"operation lists for the ps at {address}")
        self._sender: threading.Thread | None = None

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
        Their arrays are read when the message is sent: leave them unchanged until then."""
        future: Future[list[Any]] = Future()
        self._pending.put((list(operations), future))
        if self._sender is None:
            self._start_sender()
        return future

    def _start_sender(self) -> None:
        with self._lock:
            if self._sender is None:
                self._sender = threading.Thread(target=self._send_forever, daemon=True,
                                                name=f"convoy-ps{self.task_index}-sender")
                self._sender.start()

    def _send_forever(self) -> None:
        while True:
            batch = self._pending.get_many(MAX_LISTS_PER_MESSAGE, timeout=EXECUTE_TIMEOUT_S)
            if not batch:
                continue
            try:
                self._send(batch)
            except Exception as error:  # e.g. an answer of the wrong shape: no caller hangs
                failure = DataLossError(f"Execute at {self.address}: a bad answer: {error}")
                for _, future in batch:
                    if not future.done():
                        future.set_exception(failure)

    def _send(self, batch: list[_Pending]) -> None:
        try:
            request = encode([operations for operations, _ in batch])
        except InvalidArgumentError:  # somebody's operations do not pickle: fail only theirs
            if len(batch) > 1:
                for one in batch:
                    self._send([one])
                return
            batch[0][1].set_exception(_unpicklable(batch[0][0]))
            return
        try:
            outcomes = decode_one(self._stream.call(request, timeout=EXECUTE_TIMEOUT_S))
            if (type(outcomes) is not list or len(outcomes) != len(batch)
                    or not all(type(outcome) is Outcome for outcome in outcomes)):
                raise DataLossError(f"Execute at {self.address}: {len(batch)} operation lists "
                                    f"got an answer that is not {len(batch)} outcomes")
        except Exception as error:
            for _, future in batch:
                future.set_exception(error)
            return
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            if outcome.ok:
                future.set_result(outcome.value)
            else:
                future.set_exception(outcome.error)


def _unpicklable(operations: list[tuple[Any, ...]]) -> InvalidArgumentError:
    try:
        encode(operations)
    except InvalidArgumentError as error:
        return InvalidArgumentError(f"a variable operation cannot be sent to its parameter "
                                    f"server: {error}")
    return InvalidArgumentError("a variable operation cannot be sent to its parameter server")
