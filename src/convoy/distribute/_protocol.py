"""The parameter-server and worker RPCs, and the stores variables talk to.

Both services carry codec messages (pickle protocol 5, arrays out of band): a parameter
server's ``Execute`` takes a list of variable operations and answers their results; a
worker's ``Run`` takes a cloudpickled function call and answers ``("ok", value)`` or
``("error", exception)``, so a function's own failure is told apart from the worker's.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import cloudpickle
import grpc

from convoy import _rpc
from convoy.codec import Encoder, decode
from convoy.distribute._store import VariableStore

PS_SERVICE = "convoy.distribute.ParameterServer"
WORKER_SERVICE = "convoy.distribute.Worker"
PS_METHODS = [_rpc.Method("Execute", None, None)]
WORKER_METHODS = [_rpc.Method("Run", None, None), _rpc.Method("Ping", None, None)]

_encoder = Encoder(None)


def encode(value: Any) -> bytes:
    return _encoder.encode([value])


def decode_one(payload: bytes) -> Any:
    return decode(payload)[0]


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
        data = cloudpickle.dumps(function)
        cached = (hashlib.sha1(data).digest(), data)
        with _cache_lock:
            try:
                _pickled[function] = cached
            except TypeError:
                pass
    return cached


def call_payload(function: Callable[..., Any], args: tuple, kwargs: dict) -> bytes:
    """A worker ``Run`` request for ``function(*args, **kwargs)``."""
    digest, data = _pickle_function(function)
    return encode((digest, data, cloudpickle.dumps((args, kwargs))))


def load_call(payload: bytes) -> tuple[Callable[..., Any], tuple, dict]:
    """The function and arguments of a ``Run`` request (the function unpickled once)."""
    digest, data, arguments = decode_one(payload)
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
    """Run each ``(store, operations)`` call, all at once; returns their results in order.

    The last call runs in this thread and only the others as futures: a gRPC future costs a
    thread hand-off that a blocking call does not.
    """
    if not calls:
        return []
    futures = [store.execute_async(operations) for store, operations in calls[:-1]]
    last_store, last_operations = calls[-1]
    last = last_store.execute(last_operations)
    return [future.result() for future in futures] + [last]


def remote_store(address: str, task_index: int) -> RemoteStore:
    """This process's handle on the store at ``address`` (a module-level function, so pickles
    name it instead of carrying its code)."""
    return RemoteStore.get(address, task_index)


class RemoteStore:
    """The store of the parameter server at ``address``; one per address per process."""

    _instances: dict[str, RemoteStore] = {}
    _lock = threading.Lock()

    def __init__(self, address: str, task_index: int) -> None:
        self.address = address
        self.task_index = task_index
        self.device = f"/job:ps/replica:0/task:{task_index}/device:CPU:0"
        self._client = _rpc.Client(address, PS_SERVICE, PS_METHODS)

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
        """Run ``operations`` on the parameter server in one RPC."""
        return decode_one(self._client.call("Execute", encode(operations), timeout=60))

    def execute_async(self, operations: list[tuple[Any, ...]]) -> Future[list[Any]]:
        """Start :meth:`execute`; the future's result is the list of results."""
        call = self._client.future("Execute", encode(operations), timeout=60)
        result: Future[list[Any]] = Future()

        def done(call: Any) -> None:
            try:
                result.set_result(decode_one(call.result()))
            except grpc.RpcError as error:
                result.set_exception(_rpc.translate(error, f"Execute at ps {self.address}"))
            except Exception as error:
                result.set_exception(error)

        call.add_done_callback(done)
        return result
