"""ClusterCoordinator: schedules Python functions on the workers of a ParameterServerStrategy.

``schedule`` queues a function and returns a :class:`RemoteValue` at once. Each worker runs up
to ``pipelining`` functions at once, taken from the shared queue a few per call, so many small
steps flow without waiting for each other. A worker that cannot be reached has its functions
put back at the head of the queue for another worker (so a function runs at least once); the
worker is probed until it answers again, its per-worker resources (datasets, iterators) are
rebuilt if it is a new process, and it takes work again.

The first error a function raises is raised by the next ``schedule``, ``join`` or ``done``
(then cleared), once the functions still running have finished; the functions queued behind
it are cancelled.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from convoy import _rpc, nest
from convoy.distribute._protocol import (
    WORKER_METHODS,
    WORKER_SERVICE,
    Call,
    call_message,
    decode_one,
    encode,
    load_outcomes,
    run_request,
)
from convoy.distribute.server import ResourceRef, worker_context
from convoy.errors import (
    CancelledError,
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
    UnavailableError,
)

log = logging.getLogger(__name__)

#: Functions in flight per worker.
DEFAULT_PIPELINING = 4
#: Threads per worker, each with one Run in flight carrying up to pipelining / threads functions.
_THREADS_PER_WORKER = 2
#: How often a lost worker is probed.
PROBE_INTERVAL_S = 0.5


class RemoteValue:
    """The future result of a scheduled function."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None

    def _set(self, value: Any = None, error: BaseException | None = None) -> None:
        self._value, self._error = value, error
        self._done.set()

    def fetch(self) -> Any:
        """Wait for the function and return its result; raise its error if it failed (or a
        CancelledError if an earlier failure cancelled it)."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._value

    def get(self) -> Any:
        return self.fetch()


class PerWorkerValues:
    """One value per worker; passed to ``schedule``, the function sees its worker's value."""

    def __init__(self, values: tuple[Any, ...]) -> None:
        self._values = values


class PerWorkerIterator(PerWorkerValues):
    """Per-worker iterators: pass to ``schedule``; the function calls ``next`` on its own."""

    def __iter__(self) -> PerWorkerIterator:
        return self

    def __next__(self) -> Any:
        raise InvalidArgumentError(
            "a per-worker iterator is read inside scheduled functions: pass it to "
            "coordinator.schedule(fn, args=(iterator,)) and call next() in fn"
        )


class _Closure:
    __slots__ = ("function", "args", "kwargs", "result")

    def __init__(self, function: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        self.function, self.args, self.kwargs = function, args, kwargs
        self.result = RemoteValue()

    def call(self, worker_index: int) -> Call:
        """The call as the worker ``worker_index`` runs it (per-worker values resolved)."""
        def resolve(value: Any) -> Any:
            return value._values[worker_index] if isinstance(value, PerWorkerValues) else value
        args = nest.map_structure(resolve, self.args) if self.args else ()
        kwargs = nest.map_structure(resolve, self.kwargs) if self.kwargs else {}
        return call_message(self.function, tuple(args), kwargs)


class _Worker:
    """The coordinator's view of one worker task."""

    def __init__(self, index: int, address: str) -> None:
        self.index = index
        self.client = _rpc.Client(address, WORKER_SERVICE, WORKER_METHODS)
        self.incarnation: str | None = None
        self.up = threading.Event()
        self.up.set()
        self.recovering = threading.Lock()
        self._streams_lock = threading.Lock()
        self._idle_streams: list[_rpc.Stream] = []  # Run streams no thread is using
        self._closed = False

    def run_all(self, calls: list[Call]) -> list[tuple[str, Any]]:
        """Run calls at once; their ``(status, value)`` outcomes. Raises UnavailableError if
        the worker cannot be reached."""
        with self._streams_lock:
            stream = self._idle_streams.pop() if self._idle_streams else self.client.stream("Run")
        try:
            outcomes = load_outcomes(stream.call(run_request(calls)))
        except BaseException:
            stream.close()  # not back to the pool: it may be unusable
            raise
        with self._streams_lock:
            if self._closed:
                stream.close()
            else:
                self._idle_streams.append(stream)
        if len(outcomes) != len(calls):
            raise DataLossError(f"{len(calls)} calls got {len(outcomes)} outcomes from worker "
                                f"{self.index}")
        return outcomes

    def close(self) -> None:
        """End the Run streams (one still in use ends when its call returns)."""
        with self._streams_lock:
            self._closed = True
            idle, self._idle_streams = self._idle_streams, []
        for stream in idle:
            stream.close()

    def run(self, call: Call) -> Any:
        """Run one call; its value, or its error raised as a :class:`_FunctionError`."""
        [(status, value)] = self.run_all([call])
        if status == "error":
            raise _FunctionError(value)
        return value

    def ping(self) -> str:
        return decode_one(self.client.call("Ping", encode(None), timeout=5))


class _FunctionError(Exception):
    """Carries an exception raised by a scheduled function (not by the transport)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


def _create_resource(resource_id: int, make: Callable[[], Any], for_dataset: bool) -> None:
    context = worker_context()
    if context is None:
        raise FailedPreconditionError("per-worker resources can only be created on workers")
    context.creating_dataset = for_dataset
    try:
        context.resources[resource_id] = make()
    finally:
        context.creating_dataset = False


class ClusterCoordinator:
    """Runs functions on the workers of ``strategy``'s cluster, asynchronously."""

    def __init__(self, strategy: Any, pipelining: int = DEFAULT_PIPELINING) -> None:
        if isinstance(pipelining, bool) or not isinstance(pipelining, int) or pipelining < 1:
            raise InvalidArgumentError(f"pipelining must be an int >= 1 (functions in flight "
                                       f"per worker), got {pipelining!r}")
        self.strategy = strategy
        spec = strategy.cluster_spec
        self._workers = [_Worker(i, spec.task_address("worker", i))
                         for i in range(spec.num_tasks("worker"))]
        lock = threading.Lock()  # guards everything below
        self._cond = threading.Condition(lock)  # progress: functions finished or failed
        self._work = threading.Condition(lock)  # functions queued, or a worker back
        self._queue: deque[_Closure] = deque()
        self._in_flight = 0
        self._error: BaseException | None = None
        self._resources: list[tuple[int, Callable[[], Any], bool]] = []
        self._resource_ids = itertools.count(1)
        self._closed = False
        # Several functions share a Run: on a busy cluster per-call costs dominate small steps.
        threads = min(pipelining, _THREADS_PER_WORKER)
        self._batch = -(-pipelining // threads)
        for worker in self._workers:
            worker.incarnation = self._probe(worker, wait=False)
            for _ in range(threads):
                threading.Thread(target=self._serve, args=(worker,), daemon=True,
                                 name=f"convoy-coordinator-w{worker.index}").start()

    # ----- the public API -------------------------------------------------------------------------
    def schedule(self, fn: Callable[..., Any], args: tuple = (),
                 kwargs: dict | None = None) -> RemoteValue:
        """Queue ``fn(*args, **kwargs)`` to run on some worker; returns at once."""
        if not callable(fn):
            raise InvalidArgumentError(f"fn must be callable, got {type(fn).__name__}")
        closure = _Closure(fn, tuple(args), dict(kwargs or {}))
        with self._cond:
            self._raise_error()
            self._queue.append(closure)
            self._work.notify()
        return closure.result

    def join(self) -> None:
        """Wait until every scheduled function has finished; raise the first error."""
        with self._cond:
            while (self._queue or self._in_flight) and self._error is None:
                self._cond.wait()
            self._raise_error()

    def done(self) -> bool:
        """Whether every scheduled function has finished; raises the first error."""
        with self._cond:
            self._raise_error()
            return not self._queue and not self._in_flight

    def fetch(self, val: Any) -> Any:
        """The results of a structure of RemoteValues (other leaves pass through)."""
        return nest.map_structure(
            lambda v: v.fetch() if isinstance(v, RemoteValue) else v, val)

    def create_per_worker_dataset(self, dataset_fn: Callable[[], Any]) -> PerWorkerDataset:
        """A dataset built on every worker by ``dataset_fn`` (rebuilt if a worker restarts)."""
        return PerWorkerDataset(self, self._create_resource(dataset_fn, for_dataset=True))

    # ----- resources ----------------------------------------------------------------------------
    def _create_resource(self, make: Callable[[], Any], for_dataset: bool = False,
                         kind: type[PerWorkerValues] = PerWorkerValues) -> PerWorkerValues:
        resource_id = next(self._resource_ids)
        with self._cond:
            self._resources.append((resource_id, make, for_dataset))
        call = call_message(_create_resource, (resource_id, make, for_dataset), {})
        errors = []
        for worker in self._workers:
            try:
                worker.run(call)
            except _FunctionError as error:
                errors.append(error.error)
            except UnavailableError:
                pass  # rebuilt when the worker comes back
        if errors:
            raise errors[0]
        return kind(tuple(ResourceRef(resource_id) for _ in self._workers))

    def _rebuild_resources(self, worker: _Worker) -> None:
        with self._cond:
            resources = list(self._resources)
        for resource_id, make, for_dataset in resources:
            worker.run(call_message(_create_resource, (resource_id, make, for_dataset), {}))

    # ----- the worker threads --------------------------------------------------------------------
    def _take(self, worker: _Worker) -> list[_Closure] | None:
        """Up to ``_batch`` queued closures for ``worker``, leaving the other workers that are
        up their share of a short queue; None once shut down."""
        with self._cond:
            while not self._queue or not worker.up.is_set():
                if self._closed:
                    return None
                self._work.wait(0.5)
            up = max(1, sum(w.up.is_set() for w in self._workers))  # _recover races this
            count = min(self._batch, max(1, len(self._queue) // up))
            self._in_flight += count
            return [self._queue.popleft() for _ in range(count)]

    def _serve(self, worker: _Worker) -> None:
        while (taken := self._take(worker)) is not None:
            closures, calls = self._calls(taken, worker.index)
            if not closures:
                continue
            try:
                outcomes = worker.run_all(calls)
            except UnavailableError:
                self._put_back(closures)
                self._recover(worker)
                continue
            except Exception as error:
                for closure in closures:
                    self._fail(closure, error)
                continue
            finished = 0
            for closure, (status, value) in zip(closures, outcomes, strict=True):
                if status == "error":
                    self._fail(closure, value)
                else:
                    closure.result._set(value)
                    finished += 1
            with self._cond:
                self._in_flight -= finished
                self._cond.notify_all()

    def _calls(self, closures: list[_Closure], worker_index: int
               ) -> tuple[list[_Closure], list[Call]]:
        """The closures whose calls could be made, and their calls; the others fail."""
        kept, calls = [], []
        for closure in closures:
            try:
                calls.append(closure.call(worker_index))
            except Exception as error:  # e.g. arguments that do not pickle
                self._fail(closure, error)
                continue
            kept.append(closure)
        return kept, calls

    def _put_back(self, closures: list[_Closure]) -> None:
        """Return closures a lost worker took to the head of the queue, for another worker
        (so a function runs at least once), or cancel them after an earlier failure."""
        with self._cond:
            self._in_flight -= len(closures)
            if self._error is None:
                self._queue.extendleft(reversed(closures))
            else:  # an earlier failure cancelled everything that had not run
                for closure in closures:
                    closure.result._set(error=CancelledError(
                        f"cancelled because an earlier function failed: "
                        f"{self._error!r:.200}"))
            self._work.notify_all()
            self._cond.notify_all()

    def _fail(self, closure: _Closure, error: BaseException) -> None:
        closure.result._set(error=error)
        with self._cond:
            self._in_flight -= 1
            if self._error is None:
                self._error = error
                for pending in self._queue:
                    pending.result._set(error=CancelledError(
                        f"cancelled because an earlier function failed: {error!r:.200}"))
                self._queue.clear()
            self._cond.notify_all()

    def _raise_error(self) -> None:
        """Raise (once) the first error of a scheduled function, after the functions still
        running have finished (nothing runs once it is raised). Call with ``_cond`` held."""
        while self._error is not None and self._in_flight:
            self._cond.wait()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _probe(self, worker: _Worker, wait: bool = True) -> str | None:
        while not self._closed:
            try:
                return worker.ping()
            except UnavailableError:
                if not wait:
                    return None
                time.sleep(PROBE_INTERVAL_S)
        return None

    def _recover(self, worker: _Worker) -> None:
        """Keep ``worker`` out of rotation until it answers; rebuild its resources if it is a
        new process."""
        with worker.recovering:
            if not worker.up.is_set():
                return
            worker.up.clear()
        log.warning("worker %d (%s) is unreachable; its functions go to the others",
                    worker.index, worker.client.address)
        threading.Thread(target=self._bring_back, args=(worker,), daemon=True).start()

    def _bring_back(self, worker: _Worker) -> None:
        while not self._closed:
            incarnation = self._probe(worker)
            if incarnation is None:
                return
            try:
                if incarnation != worker.incarnation:
                    self._rebuild_resources(worker)
                    worker.incarnation = incarnation
            except UnavailableError:
                continue
            log.warning("worker %d is back", worker.index)
            worker.up.set()
            with self._work:
                self._work.notify_all()
            return

    def shutdown(self) -> None:
        """Stop the coordinator's threads (queued functions are abandoned)."""
        with self._cond:
            self._closed = True
            self._work.notify_all()
            self._cond.notify_all()
        for worker in self._workers:
            worker.close()


class PerWorkerDataset:
    """A dataset created on every worker; ``iter()`` gives per-worker iterators."""

    def __init__(self, coordinator: ClusterCoordinator, datasets: PerWorkerValues) -> None:
        self._coordinator = coordinator
        self._datasets = datasets

    def __iter__(self) -> PerWorkerValues:
        # Every worker has its dataset under the same id; unpickled there, the reference
        # becomes that worker's dataset.
        dataset = self._datasets._values[0]
        return self._coordinator._create_resource(lambda: _SharedIterator(iter(dataset)),
                                                  kind=PerWorkerIterator)


class _SharedIterator:
    """An iterator that several functions running at once on one worker can share."""

    def __init__(self, iterator: Any) -> None:
        self._iterator = iterator
        self._lock = threading.Lock()

    def __iter__(self) -> _SharedIterator:
        return self

    def __next__(self) -> Any:
        with self._lock:
            return next(self._iterator)

    def get_next(self) -> Any:
        with self._lock:
            return self._iterator.get_next()
