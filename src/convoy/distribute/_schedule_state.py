"""The coordinator's scheduling as a state machine: events in, instructions out.

Every decision of the ClusterCoordinator lives here: which closures wait, which a worker runs,
what becomes of them when their worker is lost or one fails, and when a worker that answers
again takes work (once its resources are rebuilt). The coordinator's threads carry the
instructions out. Ids name closures and resources; the coordinator maps them to objects.

Each worker has ``lanes``: threads of the coordinator with one Run in flight each, carrying up
to ``batch`` closures. A worker is ``up`` (it takes work), ``down`` (lost: probed until it
answers), ``rebuilding`` (it answered as a new process and its resources are being built
again) or ``failed`` (a rebuild failed: probed until it answers as yet another process). Every
worker starts ``down``; :class:`Start` brings up those that answered a first ping.

The first error (a function's, or a failed rebuild) is kept until :class:`ErrorTaken`, which
is applied once nothing runs. It cancels the queued closures and those a lost worker gives
back, and asks for the running ones to be cancelled (:class:`CancelRunning`); a running
closure resolves with whatever its worker answers, so one that finished keeps its result.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from convoy._rpc import Outcome
from convoy.errors import CancelledError, FailedPreconditionError, InvalidArgumentError

UP, DOWN, REBUILDING, FAILED = "up", "down", "rebuilding", "failed"

_message = dataclass(frozen=True, slots=True)


@dataclass
class WorkerRecord:
    status: str = DOWN
    incarnation: str | None = None  # the process that last answered a probe
    built: set[int] = field(default_factory=set)  # resources that process holds


# ----- events ------------------------------------------------------------------------------------
@_message
class Start:
    """The coordinator starts: each worker's answer to a first ping (None: it is probed)."""
    incarnations: tuple[str | None, ...]


@_message
class Scheduled:
    closure_id: int


@_message
class Take:
    """A lane is free: it runs the :class:`Run` returned, or waits for a :class:`Wake`."""
    worker: int
    lane: int


@_message
class Finished:
    """A lane's Run answered: one outcome per closure, in the Run's order."""
    worker: int
    lane: int
    outcomes: tuple[Outcome, ...]


@_message
class WorkerLost:
    """A call found the worker unreachable: the Run of ``lane``, or another (``lane`` None)."""
    worker: int
    lane: int | None = None


@_message
class WorkerBack:
    """A probed worker answered, as the process ``incarnation``."""
    worker: int
    incarnation: str


@_message
class Rebuilt:
    worker: int
    resource_ids: tuple[int, ...]


@_message
class RebuildFailed:
    """Rebuilding ``resource_id`` raised ``error``, or found the worker ``unreachable``."""
    worker: int
    resource_id: int
    error: BaseException
    unreachable: bool = False


@_message
class ResourceAdded:
    """A per-worker resource was created; ``what`` names it in errors ("per-worker dataset")."""
    resource_id: int
    what: str


@_message
class Built:
    """A :class:`Build` succeeded."""
    worker: int
    resource_id: int


@_message
class ResourceDropped:
    """Creating the resource failed: it is not rebuilt anywhere."""
    resource_id: int


@_message
class ErrorTaken:
    """``join``, ``done`` or ``schedule`` takes the pending error; only once nothing runs."""


@_message
class Closed:
    """The coordinator shuts down: queued closures are cancelled, waiting lanes woken."""


# ----- instructions ------------------------------------------------------------------------------
@_message
class Run:
    worker: int
    lane: int
    closure_ids: tuple[int, ...]


@_message
class Resolve:
    """Set the closure's RemoteValue."""
    closure_id: int
    outcome: Outcome


@_message
class Wake:
    """The lane has work: it should :class:`Take` again."""
    worker: int
    lane: int


@_message
class CancelRunning:
    """Another closure failed: stop these if the worker can (they resolve with its answer)."""
    worker: int
    closure_ids: tuple[int, ...]


@_message
class Probe:
    """Ping the worker until it answers as a process other than ``unless``."""
    worker: int
    unless: str | None = None


@_message
class Rebuild:
    """Build these resources on the worker, in order; :class:`Rebuilt` or RebuildFailed."""
    worker: int
    resource_ids: tuple[int, ...]


@_message
class Build:
    """Build a new resource on the worker; :class:`Built` or WorkerLost."""
    worker: int
    resource_id: int


@_message
class RaiseError:
    error: BaseException


Instruction = Run | Resolve | Wake | CancelRunning | Probe | Rebuild | Build | RaiseError


class ScheduleState:
    """What the coordinator knows of its closures and workers. Mutate only via :meth:`apply`."""

    def __init__(self, num_workers: int, batch: int) -> None:
        self.batch = batch  # closures per Run at most
        self.workers = [WorkerRecord() for _ in range(num_workers)]
        self.queue: deque[int] = deque()
        self.running: dict[tuple[int, int], tuple[int, ...]] = {}  # (worker, lane) -> closures
        self.in_flight = 0  # closures in ``running``
        self.idle: dict[tuple[int, int], None] = {}  # lanes waiting for a Wake, oldest first
        self.woken: set[tuple[int, int]] = set()  # lanes woken that have not taken yet
        self.resources: dict[int, str] = {}  # id -> what it is
        self.error: BaseException | None = None
        self.closed = False

    @property
    def settled(self) -> bool:
        """Nothing queued and nothing running: ``join`` returns, or raises the error."""
        return not self.queue and not self.in_flight

    def apply(self, event: Any) -> list[Instruction]:
        """Apply one event; its instructions. Raises a convoy error for an event that does not
        fit the state (a bug of the caller), leaving the state unchanged."""
        handler = getattr(self, "_on_" + type(event).__name__, None)
        if handler is None:
            raise InvalidArgumentError(f"unknown scheduling event {type(event).__name__}")
        return handler(event)

    # ----- closures ---------------------------------------------------------------------------
    def _on_Start(self, event: Start) -> list[Instruction]:
        if len(event.incarnations) != len(self.workers):
            raise InvalidArgumentError(f"{len(self.workers)} workers got "
                                       f"{len(event.incarnations)} incarnations")
        instructions: list[Instruction] = []
        for worker, incarnation in enumerate(event.incarnations):
            if incarnation is None:
                instructions.append(Probe(worker))
            else:
                instructions += self._on_WorkerBack(WorkerBack(worker, incarnation))
        return instructions

    def _on_Scheduled(self, event: Scheduled) -> list[Instruction]:
        if self.closed:
            raise FailedPreconditionError("the coordinator was shut down: it runs nothing more")
        if self.error is not None:
            raise FailedPreconditionError("an error is pending: it is raised before anything "
                                          "more is scheduled")
        self.queue.append(event.closure_id)
        return self._wakes()

    def _on_Take(self, event: Take) -> list[Instruction]:
        lane = (event.worker, event.lane)
        if lane in self.running:
            raise InvalidArgumentError(f"lane {lane} already has a Run in flight")
        self.woken.discard(lane)
        if not self.queue or self.workers[event.worker].status != UP:
            if not self.closed:
                self.idle[lane] = None
            return []
        self.idle.pop(lane, None)
        up = sum(record.status == UP for record in self.workers)
        # Leave the other workers that are up their share of a short queue.
        count = min(self.batch, max(1, len(self.queue) // up))
        ids = tuple(self.queue.popleft() for _ in range(count))
        self.running[lane] = ids
        self.in_flight += count
        return [Run(event.worker, event.lane, ids)]

    def _on_Finished(self, event: Finished) -> list[Instruction]:
        ids = self.running.get((event.worker, event.lane))
        if ids is None or len(ids) != len(event.outcomes):
            raise InvalidArgumentError(f"lane {(event.worker, event.lane)} did not run "
                                       f"{len(event.outcomes)} closures")
        self._release(event.worker, event.lane)
        instructions: list[Instruction] = [
            Resolve(closure_id, outcome) for closure_id, outcome in zip(ids, event.outcomes)]
        if self.error is None:
            for outcome in event.outcomes:
                if outcome.error is not None:
                    instructions += self._fail(outcome.error)
                    break
        return instructions

    def _on_WorkerLost(self, event: WorkerLost) -> list[Instruction]:
        if event.lane is not None and (event.worker, event.lane) not in self.running:
            raise InvalidArgumentError(f"lane {(event.worker, event.lane)} has no Run in flight")
        ids = self._release(event.worker, event.lane) if event.lane is not None else ()
        instructions: list[Instruction] = []
        if self.error is not None or self.closed:
            instructions += [Resolve(closure_id, self._cancelled()) for closure_id in ids]
        else:  # to the head of the queue, for another worker: a function runs at least once
            self.queue.extendleft(reversed(ids))
        record = self.workers[event.worker]
        if record.status == UP and not self.closed:  # otherwise its recovery is under way
            record.status = DOWN
            instructions.append(Probe(event.worker))
        return instructions + self._wakes()

    def _release(self, worker: int, lane: int) -> tuple[int, ...]:
        ids = self.running.pop((worker, lane))
        self.in_flight -= len(ids)
        return ids

    def _fail(self, error: BaseException) -> list[Instruction]:
        """Keep the first error: cancel what is queued, ask to cancel what runs."""
        self.error = error
        instructions: list[Instruction] = [
            Resolve(closure_id, self._cancelled()) for closure_id in self.queue]
        self.queue.clear()
        instructions += [CancelRunning(worker, ids) for (worker, _), ids in self.running.items()]
        return instructions

    def _cancelled(self) -> Outcome:
        why = ("the coordinator was shut down" if self.closed else
               f"cancelled because an earlier function failed: {self.error!r:.200}")
        return Outcome(error=CancelledError(why))

    def _on_ErrorTaken(self, event: ErrorTaken) -> list[Instruction]:
        if self.in_flight:
            raise FailedPreconditionError("the error is taken once nothing runs")
        error, self.error = self.error, None
        return [] if error is None else [RaiseError(error)]

    def _on_Closed(self, event: Closed) -> list[Instruction]:
        self.closed = True
        instructions: list[Instruction] = [
            Resolve(closure_id, self._cancelled()) for closure_id in self.queue]
        self.queue.clear()
        instructions += [Wake(worker, lane) for worker, lane in self.idle]  # to end
        self.idle.clear()
        return instructions

    def _wakes(self) -> list[Instruction]:
        """Wake idle lanes of workers up: with those woken already, one per queued closure."""
        wakes: list[Instruction] = []
        if not self.idle or not self.queue:
            return wakes
        wanted = len(self.queue) - sum(self.workers[w].status == UP for w, _ in self.woken)
        for worker, lane in list(self.idle):
            if len(wakes) >= wanted:
                break
            if self.workers[worker].status == UP:
                del self.idle[(worker, lane)]
                self.woken.add((worker, lane))
                wakes.append(Wake(worker, lane))
        return wakes

    # ----- workers and their resources --------------------------------------------------------
    def _on_WorkerBack(self, event: WorkerBack) -> list[Instruction]:
        record = self.workers[event.worker]
        if record.status not in (DOWN, FAILED):
            raise InvalidArgumentError(f"worker {event.worker} is {record.status}, not probed")
        if self.closed:
            return []
        if record.status == FAILED and event.incarnation == record.incarnation:
            return [Probe(event.worker, unless=record.incarnation)]
        if event.incarnation != record.incarnation:  # a new process: it holds no resources
            record.incarnation = event.incarnation
            record.built = set()
        return self._rebuild_or_up(event.worker)

    def _rebuild_or_up(self, worker: int) -> list[Instruction]:
        record = self.workers[worker]
        missing = tuple(r for r in self.resources if r not in record.built)
        if missing:
            record.status = REBUILDING
            return [Rebuild(worker, missing)]
        record.status = UP
        return self._wakes()

    def _expect_rebuilding(self, worker: int) -> WorkerRecord:
        record = self.workers[worker]
        if record.status != REBUILDING:
            raise InvalidArgumentError(f"worker {worker} is {record.status}, not rebuilding")
        return record

    def _on_Rebuilt(self, event: Rebuilt) -> list[Instruction]:
        record = self._expect_rebuilding(event.worker)
        record.built.update(event.resource_ids)
        if self.closed:
            return []
        return self._rebuild_or_up(event.worker)  # with resources added meanwhile

    def _on_RebuildFailed(self, event: RebuildFailed) -> list[Instruction]:
        record = self._expect_rebuilding(event.worker)
        if event.unreachable:  # lost again
            record.status = DOWN
            return [] if self.closed else [Probe(event.worker)]
        record.status = FAILED
        instructions: list[Instruction] = [] if self.closed else [
            Probe(event.worker, unless=record.incarnation)]
        if self.error is None:
            what = self.resources.get(event.resource_id, "per-worker resource")
            error = FailedPreconditionError(
                f"worker {event.worker} could not rebuild its {what} (resource "
                f"{event.resource_id}) as a new process: {type(event.error).__name__}: "
                f"{event.error}; it runs no functions until it restarts")
            error.__cause__ = event.error
            instructions += self._fail(error)
        return instructions

    def _on_ResourceAdded(self, event: ResourceAdded) -> list[Instruction]:
        self.resources[event.resource_id] = event.what
        return [Build(worker, event.resource_id)
                for worker, record in enumerate(self.workers) if record.status == UP]

    def _on_Built(self, event: Built) -> list[Instruction]:
        if event.resource_id in self.resources:
            self.workers[event.worker].built.add(event.resource_id)
        return []

    def _on_ResourceDropped(self, event: ResourceDropped) -> list[Instruction]:
        self.resources.pop(event.resource_id, None)
        for record in self.workers:
            record.built.discard(event.resource_id)
        return []
