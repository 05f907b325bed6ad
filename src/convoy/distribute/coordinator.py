"""ClusterCoordinator: schedules Python functions on the workers of a ParameterServerStrategy.

``schedule`` queues a function and returns a :class:`RemoteValue` at once. Each worker runs up
to ``pipelining`` functions at once, taken from the shared queue a few per call, so many small
steps flow without waiting for each other. A worker that cannot be reached has its functions
put back at the head of the queue for another worker (so a function runs at least once); the
worker is probed until it answers again, its per-worker resources (datasets, iterators) are
rebuilt if it is a new process, and it takes work again. A worker whose resources cannot be
rebuilt takes no work until it restarts again, and its error is raised like a function's.

The first error a function raises is raised by the next ``schedule``, ``join`` or ``done``
(then cleared), once the functions still running have finished; the functions queued behind
it are cancelled.

Every decision is made by a state machine (:mod:`convoy.distribute._schedule_state`); the
threads here carry its instructions out: one thread per lane of a worker (a Run in flight),
and one for each probe or rebuild of a lost worker.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from convoy import _rpc, nest
from convoy._rpc import Outcome
from convoy.distribute import _schedule_state as state
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
from convoy.distribute._values import (
    PerWorkerIterator,
    PerWorkerValues,
    RemoteValue,
    SharedIterator,
)
from convoy.distribute.server import ResourceRef, worker_context
from convoy.errors import (
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
    UnavailableError,
)

log = logging.getLogger(__name__)

#: Functions in flight per worker.
DEFAULT_PIPELINING = 4
#: Lanes (threads) per worker, each with one Run in flight carrying up to pipelining / lanes
#: functions.
_LANES_PER_WORKER = 2
#: How often a lost worker is probed.
PROBE_INTERVAL_S = 0.5
#: How long a thread waits before it looks again whether it should stop.
_WAIT_S = 1.0


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
    """The coordinator's connection to one worker task."""

    def __init__(self, index: int, address: str) -> None:
        self.index = index
        self.client = _rpc.Client(address, WORKER_SERVICE, WORKER_METHODS)
        self._streams_lock = threading.Lock()
        self._idle_streams: list[_rpc.Stream] = []  # Run streams no thread is using
        self._closed = False

    def run_all(self, calls: list[Call]) -> list[Outcome]:
        """Run calls at once; their outcomes. Raises UnavailableError if the worker cannot be
        reached."""
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

    def run(self, call: Call) -> Outcome:
        return self.run_all([call])[0]

    def ping(self) -> str:
        """The worker's incarnation (which process answers)."""
        return decode_one(self.client.call("Ping", encode(None), timeout=5))

    def close(self) -> None:
        """End the Run streams (one still in use ends when its call returns)."""
        with self._streams_lock:
            self._closed = True
            idle, self._idle_streams = self._idle_streams, []
        for stream in idle:
            stream.close()


def _build_resource(resource_id: int, make: Callable[[], Any], for_dataset: bool) -> None:
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
        # Several functions share a Run: on a busy cluster per-call costs dominate small steps.
        lanes = min(pipelining, _LANES_PER_WORKER)
        self._state = state.ScheduleState(len(self._workers), -(-pipelining // lanes))
        self._lock = threading.Lock()  # guards _state and _closures
        self._progress = threading.Condition(self._lock)  # settled, or an error pending
        self._wakeups = {(w.index, lane): threading.Condition(self._lock)
                         for w in self._workers for lane in range(lanes)}
        self._closures: dict[int, _Closure] = {}
        self._closure_ids = itertools.count(1)
        self._resource_ids = itertools.count(1)
        self._resource_calls: dict[int, Call] = {}
        for (worker, lane) in self._wakeups:
            threading.Thread(target=self._serve, args=(self._workers[worker], lane),
                             daemon=True, name=f"convoy-coordinator-w{worker}-{lane}").start()
        self._apply(state.Start(tuple(self._ping(worker) for worker in self._workers)))

    # ----- the public API -------------------------------------------------------------------------
    def schedule(self, fn: Callable[..., Any], args: tuple = (),
                 kwargs: dict | None = None) -> RemoteValue:
        """Queue ``fn(*args, **kwargs)`` to run on some worker; returns at once."""
        if not callable(fn):
            raise InvalidArgumentError(f"fn must be callable, got {type(fn).__name__}")
        closure = _Closure(fn, tuple(args), dict(kwargs or {}))
        closure_id = next(self._closure_ids)
        with self._lock:
            self._raise_error()
            self._closures[closure_id] = closure
            try:
                self._apply_locked(state.Scheduled(closure_id))
            except FailedPreconditionError:  # shut down
                del self._closures[closure_id]
                raise
        return closure.result

    def join(self) -> None:
        """Wait until every scheduled function has finished; raise the first error."""
        with self._lock:
            while not self._state.settled:
                self._progress.wait(_WAIT_S)
            self._raise_error()

    def done(self) -> bool:
        """Whether every scheduled function has finished; raises the first error."""
        with self._lock:
            self._raise_error()
            return self._state.settled

    def fetch(self, val: Any) -> Any:
        """The results of a structure of RemoteValues (other leaves pass through)."""
        return nest.map_structure(
            lambda v: v.fetch() if isinstance(v, RemoteValue) else v, val)

    def create_per_worker_dataset(self, dataset_fn: Callable[[], Any]) -> PerWorkerDataset:
        """A dataset built on every worker by ``dataset_fn`` (rebuilt if a worker restarts)."""
        datasets = self._create_resource(dataset_fn, "per-worker dataset", for_dataset=True)
        return PerWorkerDataset(self, datasets)

    def shutdown(self) -> None:
        """Stop the coordinator's threads; queued functions are cancelled."""
        self._apply(state.Closed())
        for worker in self._workers:
            worker.close()

    # ----- applying events ----------------------------------------------------------------------
    def _apply(self, event: Any) -> list[state.Instruction]:
        """Apply ``event`` and carry out its instructions; returns those for the caller."""
        with self._lock:
            instructions = self._apply_locked(event)
        for_caller = []
        for instruction in instructions:
            if type(instruction) in (state.Probe, state.Rebuild):
                target = self._probe if type(instruction) is state.Probe else self._rebuild
                threading.Thread(target=target, args=(instruction,), daemon=True,
                                 name=f"convoy-coordinator-recover-w{instruction.worker}").start()
            else:
                for_caller.append(instruction)
        return for_caller

    def _apply_locked(self, event: Any) -> list[state.Instruction]:
        """Apply ``event`` (lock held) and carry out the instructions that do not block;
        returns the others."""
        others = []
        for instruction in self._state.apply(event):
            kind = type(instruction)
            if kind is state.Resolve:
                self._closures.pop(instruction.closure_id).result._set(instruction.outcome)
            elif kind is state.Wake:
                self._wakeups[(instruction.worker, instruction.lane)].notify()
            elif kind is state.CancelRunning:
                pass  # workers cannot stop a running function yet: join waits for it
            else:
                others.append(instruction)
        if self._state.settled or self._state.error is not None:
            self._progress.notify_all()
        return others

    def _raise_error(self) -> None:
        """Raise (once) the first error of a scheduled function, after the functions still
        running have finished. Call with the lock held."""
        if self._state.error is None:
            return
        while self._state.in_flight:
            self._progress.wait(_WAIT_S)
        [raise_error] = self._apply_locked(state.ErrorTaken())
        raise raise_error.error

    # ----- the lanes ------------------------------------------------------------------------------
    def _serve(self, worker: _Worker, lane: int) -> None:
        take = state.Take(worker.index, lane)
        wakeup = self._wakeups[(worker.index, lane)]
        while True:
            with self._lock:  # Take only ever answers a Run: nothing else to carry out
                while not (runs := self._state.apply(take)):
                    if self._state.closed:
                        return
                    wakeup.wait(_WAIT_S)
                closures = [self._closures[i] for i in runs[0].closure_ids]
            outcomes = self._run(worker, closures)
            self._apply(state.WorkerLost(worker.index, lane) if outcomes is None
                        else state.Finished(worker.index, lane, outcomes))

    def _run(self, worker: _Worker, closures: list[_Closure]) -> tuple[Outcome, ...] | None:
        """The closures' outcomes on ``worker``; None if it cannot be reached."""
        outcomes: list[Outcome | None] = []
        calls = []
        for closure in closures:
            try:
                calls.append(closure.call(worker.index))
            except Exception as error:  # e.g. arguments that do not pickle
                outcomes.append(Outcome(error=error))
            else:
                outcomes.append(None)
        if not calls:
            return tuple(outcomes)  # type: ignore[arg-type]
        try:
            answers = iter(worker.run_all(calls))
        except UnavailableError:
            return None
        except Exception as error:
            answers = itertools.repeat(Outcome(error=error))
        return tuple(next(answers) if outcome is None else outcome for outcome in outcomes)

    # ----- resources and recovery -----------------------------------------------------------------
    def _create_resource(self, make: Callable[[], Any], what: str, for_dataset: bool = False,
                         kind: type[PerWorkerValues] = PerWorkerValues) -> PerWorkerValues:
        resource_id = next(self._resource_ids)
        call = self._resource_calls[resource_id] = call_message(
            _build_resource, (resource_id, make, for_dataset), {})
        errors = []
        for build in self._apply(state.ResourceAdded(resource_id, what)):
            try:
                outcome = self._workers[build.worker].run(call)
            except UnavailableError:  # built when the worker is back
                self._apply(state.WorkerLost(build.worker))
                continue
            if outcome.ok:
                self._apply(state.Built(build.worker, resource_id))
            else:
                errors.append(outcome.error)
        if errors:
            self._apply(state.ResourceDropped(resource_id))
            raise errors[0]
        return kind(tuple(ResourceRef(resource_id) for _ in self._workers))

    @staticmethod
    def _ping(worker: _Worker) -> str | None:
        try:
            return worker.ping()
        except _rpc.RETRYABLE:
            return None

    def _probe(self, probe: state.Probe) -> None:
        """Ping until the worker answers as a process other than ``probe.unless``."""
        worker = self._workers[probe.worker]
        unreachable = False
        while not self._state.closed:
            try:
                incarnation = worker.ping()
            except _rpc.RETRYABLE as error:
                if not unreachable:
                    log.warning("worker %d (%s) is unreachable (%s); probing it every %.1f s",
                                worker.index, worker.client.address, error, PROBE_INTERVAL_S)
                unreachable = True
            except Exception:
                log.exception("probing worker %d failed", worker.index)
            else:
                if incarnation != probe.unless:
                    if unreachable:
                        log.warning("worker %d is back", worker.index)
                    self._apply(state.WorkerBack(worker.index, incarnation))
                    return
            time.sleep(PROBE_INTERVAL_S)

    def _rebuild(self, rebuild: state.Rebuild) -> None:
        """Build the resources a new worker process lacks, in the order they were created."""
        worker = self._workers[rebuild.worker]
        for resource_id in rebuild.resource_ids:
            try:
                outcome = worker.run(self._resource_calls[resource_id])
            except UnavailableError as error:
                self._apply(state.RebuildFailed(worker.index, resource_id, error, True))
                return
            except Exception as error:
                outcome = Outcome(error=error)
            if not outcome.ok:
                log.warning("worker %d could not rebuild per-worker resource %d: %r",
                            worker.index, resource_id, outcome.error)
                self._apply(state.RebuildFailed(worker.index, resource_id, outcome.error))
                return
        self._apply(state.Rebuilt(worker.index, rebuild.resource_ids))


class PerWorkerDataset:
    """A dataset created on every worker; ``iter()`` gives per-worker iterators."""

    def __init__(self, coordinator: ClusterCoordinator, datasets: PerWorkerValues) -> None:
        self._coordinator = coordinator
        self._datasets = datasets

    def __iter__(self) -> PerWorkerValues:
        # Every worker has its dataset under the same id; unpickled there, the reference
        # becomes that worker's dataset.
        dataset = self._datasets._values[0]
        return self._coordinator._create_resource(lambda: SharedIterator(iter(dataset)),
                                                  "per-worker iterator", kind=PerWorkerIterator)
