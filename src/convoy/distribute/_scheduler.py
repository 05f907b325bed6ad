"""The coordinator's threads: they carry the scheduling state machine's instructions out.

One thread per lane of a worker (a Run in flight on a stream of its own), one for each probe
or rebuild of a lost worker, one for each grace period of a cancellation, and a keeper that
does what finalizers ask (they may not take locks). Nothing here refers to the
ClusterCoordinator, so it can be collected; then the keeper closes the scheduler and every
thread ends.
"""

from __future__ import annotations

import itertools
import logging
import queue
import random
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from convoy import monitoring
from convoy._base import threads as _threads
from convoy._transport import rpc as _rpc
from convoy._transport.rpc import Outcome
from convoy._values import nest
from convoy.distribute import _schedule_messages as msg
from convoy.distribute._coordinator_calls import (
    Lane,
    WorkerLink,
    call_message,
    send_without_waiting,
)
from convoy.distribute._schedule_state import ScheduleState
from convoy.distribute._values import PerWorkerValues, RemoteValue
from convoy.distribute._wire import Call, WorkerReplacedError
from convoy.distribute._worker_context import build_resource
from convoy.errors import FailedPreconditionError, UnavailableError

log = logging.getLogger(__name__)

#: Lanes (threads) per worker, each with one Run in flight carrying up to pipelining / lanes
#: functions. At pipelining 1 the worker runs its lanes' Runs one at a time: the second is
#: sent ahead (see :mod:`convoy.distribute._schedule_state`).
LANES_PER_WORKER = 2
#: Instructions the thread that applied the event carries out (it asked for them).
_FOR_THE_CALLER = msg.Run | msg.Build | msg.RaiseError
#: Instructions that may block, carried out on threads of their own.
_ON_THREADS = msg.Probe | msg.Rebuild | msg.CancelRunning
#: How often a lost worker is probed.
PROBE_INTERVAL_S = 0.5
#: How long a function cancelled on its worker (because another failed) has to stop before
#: the coordinator stops waiting for it.
CANCEL_GRACE_S = 2.0
#: How long a thread waits before it looks again whether it should stop.
_WAIT_S = 1.0

# Closure and resource ids: unique across the coordinators of this process and, from a random
# start, across chief processes (a worker may serve several, or a restarted one).
_ids = itertools.count(random.SystemRandom().randrange(1 << 40) << 20)


class Closure:
    """A scheduled function and its arguments."""

    __slots__ = ("closure_id", "function", "args", "kwargs", "per_worker", "result")

    def __init__(self, function: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                 per_worker: bool) -> None:
        self.closure_id = next(_ids)
        self.function, self.args, self.kwargs = function, args, kwargs
        self.per_worker = per_worker  # some argument is a PerWorkerValues
        self.result = RemoteValue()

    def call(self, worker_index: int) -> Call:
        """The call as the worker ``worker_index`` runs it (per-worker values resolved)."""
        args, kwargs = self.args, self.kwargs
        if self.per_worker:
            def resolve(value: Any) -> Any:
                return value._values[worker_index] if isinstance(value, PerWorkerValues) else value
            args, kwargs = nest.map_structure(resolve, (tuple(args), kwargs))
        return call_message(self.function, tuple(args), kwargs, self.closure_id)


def _counts() -> tuple[int, int]:
    """Functions queued and running, over the schedulers of this process."""
    queued = running = 0
    for scheduler in list(_LIVE):
        state = scheduler._state
        if not state.closed:
            queued += len(state.queue)
            running += state.in_flight
    return queued, running


class Scheduler:
    """Runs closures on the workers at ``addresses``, ``pipelining`` at once per worker."""

    def __init__(self, addresses: Sequence[str], pipelining: int, name: str) -> None:
        monitoring.export("coordinator")
        self._workers = [WorkerLink(i, address) for i, address in enumerate(addresses)]
        # Several functions share a Run: on a busy cluster per-call costs dominate small steps.
        send_ahead = pipelining == 1
        lanes = LANES_PER_WORKER if send_ahead else min(pipelining, LANES_PER_WORKER)
        self._state = ScheduleState(len(self._workers), -(-pipelining // lanes), send_ahead)
        self._lock = threading.Lock()  # guards _state and _closures
        self._progress = threading.Condition(self._lock)  # settled, or an error pending
        self._lanes = {(w.index, i): Lane(w, i, threading.Condition(self._lock), send_ahead)
                       for w in self._workers for i in range(lanes)}
        self._closures: dict[int, Closure] = {}
        self._resource_calls: dict[int, Call] = {}
        self._chores: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._name = name
        for lane in self._lanes.values():
            self._thread(self._serve, lane, f"w{lane.worker.index}-{lane.index}")
        self._thread(self._keep, None, "keeper")
        _LIVE.add(self)
        self._apply(msg.Start(tuple(self._ping(worker) for worker in self._workers)))

    @property
    def closed(self) -> bool:
        return self._state.closed

    # ----- what the coordinator asks --------------------------------------------------------
    def schedule(self, closure: Closure) -> None:
        with self._lock:
            self._raise_error()
            self._closures[closure.closure_id] = closure
            try:
                self._apply_locked(msg.Scheduled(closure.closure_id))
            except FailedPreconditionError:  # shut down
                del self._closures[closure.closure_id]
                raise

    def join(self) -> None:
        with self._lock:
            while not self._state.settled:
                self._progress.wait(_WAIT_S)
            self._raise_error()

    def done(self) -> bool:
        with self._lock:
            self._raise_error()
            return self._state.settled

    def create_resource(self, make: Callable[[], Any], what: str, for_dataset: bool) -> int:
        """Build ``make()`` on every worker (and again on a new process of one); its id."""
        resource_id = next(_ids)
        call = self._resource_calls[resource_id] = call_message(
            build_resource, (resource_id, make, for_dataset), {})
        try:
            builds = self._apply(msg.ResourceAdded(resource_id, what))
        except FailedPreconditionError:  # shut down
            del self._resource_calls[resource_id]
            raise
        errors: list[BaseException] = []
        for build in builds:
            assert isinstance(build, msg.Build)
            try:
                outcome = self._workers[build.worker].run(call)
            except UnavailableError:  # built when the worker is back
                self._apply(msg.WorkerLost(build.worker))
                continue
            if outcome.error is None:
                self._apply(msg.Built(build.worker, resource_id))
            else:
                errors.append(outcome.error)
        if errors:
            self.drop_resource(resource_id)
            raise errors[0]
        return resource_id

    def drop_resource(self, resource_id: int) -> None:
        """Free the resource on the workers (soon: this may be called from a finalizer)."""
        self._chores.put(resource_id)

    def close_soon(self) -> None:
        """:meth:`close`, from the keeper thread (for a finalizer)."""
        self._chores.put(None)

    def close(self) -> None:
        """Cancel what is queued and running, free the resources, end the threads."""
        self._apply(msg.Closed())
        self._chores.put(None)  # the keeper ends

    # ----- applying events ------------------------------------------------------------------
    def _apply(self, event: msg.Event) -> list[msg.Instruction]:
        """Apply ``event`` and carry out its instructions; returns those for the caller."""
        with self._lock:
            instructions = self._apply_locked(event)
        for_caller: list[msg.Instruction] = []
        for instruction in instructions:
            if isinstance(instruction, msg.Probe):
                self._thread(self._probe, instruction, f"probe-w{instruction.worker}")
            elif isinstance(instruction, msg.Rebuild):
                self._thread(self._rebuild, instruction, f"rebuild-w{instruction.worker}")
            elif isinstance(instruction, msg.CancelRunning):
                self._thread(self._cancel, instruction, f"cancel-w{instruction.worker}")
            elif isinstance(instruction, _FOR_THE_CALLER):
                for_caller.append(instruction)
            else:
                raise TypeError(instruction)
        return for_caller

    def _apply_locked(self, event: msg.Event) -> list[msg.Instruction]:
        """Apply ``event`` (lock held) and carry out the instructions that do not block;
        returns the others."""
        others: list[msg.Instruction] = []
        for instruction in self._state.apply(event):
            if isinstance(instruction, msg.Resolve):
                self._closures.pop(instruction.closure_id).result._set(instruction.outcome)
                (monitoring.COORDINATOR_FUNCTIONS_DONE if instruction.outcome.error is None
                 else monitoring.COORDINATOR_FUNCTIONS_FAILED).inc()
            elif isinstance(instruction, msg.Wake):
                self._lanes[(instruction.worker, instruction.lane)].wakeup.notify()
            elif isinstance(instruction, msg.Abandon):
                lane = self._lanes[(instruction.worker, instruction.lane)]
                lane.abandon(instruction.closure_ids)
                send_without_waiting(lane.worker.client, "Cancel", instruction.closure_ids)
            elif isinstance(instruction, msg.Withdraw):
                send_without_waiting(self._workers[instruction.worker].client, "Withdraw",
                                     instruction.closure_ids)
            elif isinstance(instruction, msg.Free):
                send_without_waiting(self._workers[instruction.worker].client, "Free",
                                      instruction.resource_ids)
            elif isinstance(instruction, _FOR_THE_CALLER | _ON_THREADS):
                others.append(instruction)
            else:
                raise TypeError(instruction)
        if self._state.settled or self._state.error is not None:
            self._progress.notify_all()
        return others

    def _raise_error(self) -> None:
        """Raise (once) the first error of a scheduled function, after the functions still
        running have finished or been abandoned. Call with the lock held."""
        if self._state.error is None:
            return
        while self._state.in_flight:
            self._progress.wait(_WAIT_S)
        [raise_error] = self._apply_locked(msg.ErrorTaken())
        assert isinstance(raise_error, msg.RaiseError)
        raise raise_error.error

    def _thread(self, target: Callable[[Any], None], argument: Any, what: str) -> None:
        """Run ``target(argument)`` on thread ``what``: its failure (a bug) would leave the
        closures it runs hanging, so it ends the process (the keeper restarts instead)."""
        try:
            _threads.start(f"{self._name}-{what}", target, argument,
                           restart=target == self._keep)
        except RuntimeError:  # at interpreter exit
            log.debug("no thread for %s: the interpreter is exiting", what)

    # ----- the threads ----------------------------------------------------------------------
    def _serve(self, lane: Lane) -> None:
        take = msg.Take(lane.worker.index, lane.index)
        while True:
            with self._lock:  # Take only ever answers a Run
                while not (runs := self._apply_locked(take)):
                    if self._state.closed:
                        lane.close()
                        return
                    lane.wakeup.wait(_WAIT_S)
                run = runs[0]
                assert isinstance(run, msg.Run)
                lane.begin(run.closure_ids)
                closures = [self._closures[i] for i in run.closure_ids]
            outcomes = self._run(lane, closures, run.followed)
            # Held while the lane waits, the closures would keep their arguments (per-worker
            # iterators the chief dropped) alive until the lane's next Run.
            del closures, run
            self._apply(msg.WorkerLost(lane.worker.index, lane.index) if outcomes is None
                        else msg.Finished(lane.worker.index, lane.index, outcomes))
            del outcomes

    def _run(self, lane: Lane, closures: list[Closure], followed: bool
             ) -> tuple[Outcome, ...] | None:
        """The closures' outcomes on the lane's worker (``followed``: more closures were
        queued); None if it cannot be reached."""
        outcomes: list[Outcome | None] = []
        calls = []
        for closure in closures:
            try:
                calls.append(closure.call(lane.worker.index))
            except Exception as error:  # e.g. arguments that do not pickle
                outcomes.append(Outcome(error=error))
            else:
                outcomes.append(None)
        if calls:
            try:
                answers = lane.run(calls, followed)
            except UnavailableError:
                return None
            except Exception as error:
                answers = [Outcome(error=error)] * len(calls)
            if any(isinstance(answer.error, WorkerReplacedError) for answer in answers):
                return None  # probed, rebuilt and run again as for a lost worker
            answered = iter(answers)
            outcomes = [next(answered) if outcome is None else outcome for outcome in outcomes]
        return tuple(outcome for outcome in outcomes if outcome is not None)

    def _cancel(self, cancel: msg.CancelRunning) -> None:
        """Ask the worker to stop the closures; past the grace period, give their Run up."""
        lane = self._lanes[(cancel.worker, cancel.lane)]
        send_without_waiting(lane.worker.client, "Cancel", cancel.closure_ids)
        time.sleep(CANCEL_GRACE_S)
        self._apply(msg.GraceOver(cancel.worker, cancel.lane, cancel.closure_ids))
        # A call cut short just as its stream opens goes on: cut it again until it ends.
        for _ in range(40):
            if not lane.abandon(cancel.closure_ids):
                return
            time.sleep(_WAIT_S / 4)
        log.warning("worker %d: a cancelled Run did not end", cancel.worker)

    def _keep(self, _: None) -> None:
        """Free the resources finalizers drop; close when the coordinator is collected."""
        while (resource_id := self._chores.get()) is not None:
            self._apply(msg.ResourceDropped(resource_id))
            self._resource_calls.pop(resource_id, None)
        if not self._state.closed:
            self.close()

    @staticmethod
    def _ping(worker: WorkerLink) -> str | None:
        try:
            return worker.ping()
        except _rpc.RETRYABLE:
            return None

    def _probe(self, probe: msg.Probe) -> None:
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
                    self._apply(msg.WorkerBack(worker.index, incarnation))
                    return
            time.sleep(PROBE_INTERVAL_S)

    def _rebuild(self, rebuild: msg.Rebuild) -> None:
        """Build the resources a new worker process lacks, in the order they were created."""
        worker = self._workers[rebuild.worker]
        for resource_id in rebuild.resource_ids:
            call = self._resource_calls.get(resource_id)
            if call is None:
                continue  # dropped meanwhile
            try:
                outcome = worker.run(call)
            except UnavailableError as error:
                self._apply(msg.RebuildFailed(worker.index, resource_id, error, True))
                return
            except Exception as error:
                outcome = Outcome(error=error)
            if outcome.error is not None:
                log.warning("worker %d could not rebuild per-worker resource %d: %r",
                            worker.index, resource_id, outcome.error)
                self._apply(msg.RebuildFailed(worker.index, resource_id, outcome.error))
                return
        self._apply(msg.Rebuilt(worker.index, rebuild.resource_ids))


#: The schedulers of this process, whose functions the coordinator's gauges count.
_LIVE: weakref.WeakSet[Scheduler] = weakref.WeakSet()
monitoring.COORDINATOR_FUNCTIONS_QUEUED.set_function(lambda: float(_counts()[0]))
monitoring.COORDINATOR_FUNCTIONS_RUNNING.set_function(lambda: float(_counts()[1]))
