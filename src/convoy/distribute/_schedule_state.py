"""The coordinator's scheduling as a state machine: events in, instructions out.

Every decision of the ClusterCoordinator lives here: which closures wait, which a worker runs,
what becomes of them when their worker is lost or one fails, and when a worker that answers
again takes work (once its resources are rebuilt). The coordinator's threads carry the
instructions out. Ids name closures and resources; the coordinator maps them to objects. The
events and instructions are in :mod:`convoy.distribute._schedule_messages`.

Each worker has ``lanes``: threads of the coordinator with one Run in flight each, carrying up
to ``batch`` closures. A worker is ``up`` (it takes work), ``down`` (lost: probed until it
answers), ``rebuilding`` (it answered as a new process and its resources are being built
again) or ``failed`` (a rebuild failed: probed until it answers as yet another process). Every
worker starts ``down``; :class:`Start` brings up those that answered a first ping.

The first error (a function's, or a failed rebuild) is kept until :class:`ErrorTaken`, which
is applied once nothing runs. It cancels the queued closures and those a lost worker gives
back, and asks for the running ones to be cancelled (:class:`CancelRunning`). A running
closure resolves with whatever its worker answers (its result if it finished, its
CancelledError if it stopped), unless the grace period passes first (:class:`GraceOver`):
then its Run is abandoned, its closures resolve as cancelled, and the lane's answer, whenever
it comes, is dropped. Shutting down abandons every Run at once.

Per-worker resources (datasets, iterators) are built on every worker that is up, rebuilt on a
new process of a worker before it takes work, and freed on the workers once dropped.

With ``send_ahead`` (one function per worker at a time, as TensorFlow), each worker has two
lanes whose Runs the worker runs one after the other: the second is sent while the first runs,
so the worker starts it without waiting for the coordinator's round trip. A lane sends ahead
only while every worker that is up has a Run in flight (queued work goes to an idle worker
first), and a worker that finds nothing queued has a Run sent ahead to another withdrawn
(:class:`Withdraw`): unless it started meanwhile, it comes back as withdrawn and is queued
again, at the head.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from convoy._transport.events import Handlers
from convoy._transport.rpc import Outcome
from convoy.distribute import _schedule_messages as msg
from convoy.distribute._wire import WithdrawnError
from convoy.errors import CancelledError, FailedPreconditionError, InvalidArgumentError

UP, DOWN, REBUILDING, FAILED = "up", "down", "rebuilding", "failed"

Lane = tuple[int, int]  # (worker, lane)


@dataclass
class WorkerRecord:
    status: str = DOWN
    incarnation: str | None = None  # the process that last answered a probe
    built: set[int] = field(default_factory=set)  # resources that process holds


class ScheduleState:
    """What the coordinator knows of its closures and workers. Mutate only via :meth:`apply`."""

    def __init__(self, num_workers: int, batch: int, send_ahead: bool = False) -> None:
        self.batch = batch  # closures per Run at most
        self.send_ahead = send_ahead
        self.runs_of = [0] * num_workers  # Runs in ``running`` per worker
        self.ahead: dict[int, Lane] = {}  # worker -> its lane whose Run was sent ahead
        self.withdrawing: set[Lane] = set()  # lanes asked to give their Run back
        self.workers = [WorkerRecord() for _ in range(num_workers)]
        self.queue: deque[int] = deque()
        self.running: dict[Lane, tuple[int, ...]] = {}  # lane -> closures
        self.in_flight = 0  # closures in ``running``
        self.abandoned: set[Lane] = set()  # lanes whose Run is given up but not answered yet
        self.idle: dict[Lane, None] = {}  # lanes waiting for a Wake, oldest first
        self.woken: set[Lane] = set()  # lanes woken that have not taken yet
        self.resources: dict[int, str] = {}  # id -> what it is
        self.error: BaseException | None = None
        self.closed = False

    @property
    def settled(self) -> bool:
        """Nothing queued and nothing running: ``join`` returns, or raises the error."""
        return not self.queue and not self.in_flight

    def apply(self, event: msg.Event) -> list[msg.Instruction]:
        """Apply one event; its instructions. Raises a convoy error for an event that does not
        fit the state (a bug of the caller), leaving the state unchanged; TypeError for an
        object that is no scheduling event."""
        return _HANDLERS(self, event)

    # ----- closures ---------------------------------------------------------------------------
    def _on_Start(self, event: msg.Start) -> list[msg.Instruction]:
        if len(event.incarnations) != len(self.workers):
            raise InvalidArgumentError(f"{len(self.workers)} workers got "
                                       f"{len(event.incarnations)} incarnations")
        instructions: list[msg.Instruction] = []
        for worker, incarnation in enumerate(event.incarnations):
            if incarnation is None:
                instructions.append(msg.Probe(worker))
            else:
                instructions += self._on_WorkerBack(msg.WorkerBack(worker, incarnation))
        return instructions

    def _on_Scheduled(self, event: msg.Scheduled) -> list[msg.Instruction]:
        if self.closed:
            raise FailedPreconditionError("the coordinator was shut down: it runs nothing more")
        if self.error is not None:
            raise FailedPreconditionError("an error is pending: it is raised before anything "
                                          "more is scheduled")
        self.queue.append(event.closure_id)
        return self._wakes()

    def _on_Take(self, event: msg.Take) -> list[msg.Instruction]:
        lane = (event.worker, event.lane)
        if lane in self.running or lane in self.abandoned:
            raise InvalidArgumentError(f"lane {lane} already has a Run in flight")
        self.woken.discard(lane)
        if not self.queue or not self._may_take(event.worker):
            if not self.closed:
                self.idle[lane] = None
            return [] if self.queue else self._withdraw_for(event.worker)
        self.idle.pop(lane, None)
        up = sum(record.status == UP for record in self.workers)
        # Leave the other workers that are up their share of a short queue.
        count = min(self.batch, max(1, len(self.queue) // up))
        ids = tuple(self.queue.popleft() for _ in range(count))
        self.running[lane] = ids
        self.in_flight += count
        if self.runs_of[event.worker]:
            self.ahead[event.worker] = lane
        self.runs_of[event.worker] += 1
        run: list[msg.Instruction] = [msg.Run(event.worker, event.lane, ids, bool(self.queue))]
        # one more worker busy: lanes of the others may send ahead now
        return run + self._wakes() if self.send_ahead else run

    def _may_take(self, worker: int) -> bool:
        """Whether a free lane of ``worker`` takes queued work now."""
        if self.workers[worker].status != UP:
            return False
        if not self.send_ahead or not self.runs_of[worker]:
            return True
        return all(self.runs_of[w] for w, record in enumerate(self.workers)
                   if record.status == UP)

    def _withdraw_for(self, worker: int) -> list[msg.Instruction]:
        """``worker`` found nothing queued: ask for a Run sent ahead to another back."""
        if (not self.send_ahead or self.runs_of[worker] or self.error is not None
                or self.closed or self.workers[worker].status != UP):
            return []
        for lane in self.ahead.values():
            if lane not in self.withdrawing:
                self.withdrawing.add(lane)
                return [msg.Withdraw(*lane, self.running[lane])]
        return []

    def _on_Finished(self, event: msg.Finished) -> list[msg.Instruction]:
        lane = (event.worker, event.lane)
        if lane in self.abandoned:  # its closures are resolved already
            self.abandoned.discard(lane)
            return []
        ids = self.running.get(lane)
        if ids is None or len(ids) != len(event.outcomes):
            raise InvalidArgumentError(f"lane {lane} did not run {len(event.outcomes)} "
                                       f"closures")
        self._release(lane)
        back = [closure_id for closure_id, outcome in zip(ids, event.outcomes)
                if type(outcome.error) is WithdrawnError]
        instructions: list[msg.Instruction]
        if back:
            if self.error is not None or self.closed:
                instructions = [msg.Resolve(closure_id, self._cancelled()) for closure_id in back]
            else:
                self.queue.extendleft(reversed(back))
                instructions = self._wakes()
            pairs = [(closure_id, outcome) for closure_id, outcome in zip(ids, event.outcomes)
                     if type(outcome.error) is not WithdrawnError]
        else:
            instructions, pairs = [], list(zip(ids, event.outcomes))
        instructions += [msg.Resolve(closure_id, outcome) for closure_id, outcome in pairs]
        errors = [outcome.error for _, outcome in pairs if outcome.error is not None]
        if errors and self.error is None:
            # the first failure, before the cancellations it caused among its Run-mates
            instructions += self._fail(next(
                (e for e in errors if not isinstance(e, CancelledError)), errors[0]))
        return instructions

    def _on_WorkerLost(self, event: msg.WorkerLost) -> list[msg.Instruction]:
        lane = None if event.lane is None else (event.worker, event.lane)
        ids: tuple[int, ...] = ()
        if lane is not None and lane in self.abandoned:
            self.abandoned.discard(lane)  # its closures are resolved already
        elif lane is not None:
            if lane not in self.running:
                raise InvalidArgumentError(f"lane {lane} has no Run in flight")
            ids = self._release(lane)
        instructions: list[msg.Instruction] = []
        if self.error is not None or self.closed:
            instructions += [msg.Resolve(closure_id, self._cancelled()) for closure_id in ids]
        else:  # to the head of the queue, for another worker: a function runs at least once
            self.queue.extendleft(reversed(ids))
        record = self.workers[event.worker]
        if record.status == UP and not self.closed:  # otherwise its recovery is under way
            record.status = DOWN
            instructions.append(msg.Probe(event.worker))
        return instructions + self._wakes()

    def _on_GraceOver(self, event: msg.GraceOver) -> list[msg.Instruction]:
        lane = (event.worker, event.lane)
        if self.running.get(lane) != event.closure_ids:
            return []  # answered meanwhile
        return self._abandon(lane)

    def _release(self, lane: Lane) -> tuple[int, ...]:
        ids = self.running.pop(lane)
        self.in_flight -= len(ids)
        self.runs_of[lane[0]] -= 1
        self.ahead.pop(lane[0], None)  # it was this lane's Run, or it runs now
        self.withdrawing.discard(lane)
        return ids

    def _abandon(self, lane: Lane) -> list[msg.Instruction]:
        ids = self._release(lane)
        self.abandoned.add(lane)
        return [*(msg.Resolve(closure_id, self._cancelled()) for closure_id in ids),
                msg.Abandon(*lane, ids)]

    def _fail(self, error: BaseException) -> list[msg.Instruction]:
        """Keep the first error: cancel what is queued, ask to cancel what runs."""
        self.error = error
        instructions: list[msg.Instruction] = [
            msg.Resolve(closure_id, self._cancelled()) for closure_id in self.queue]
        self.queue.clear()
        instructions += [msg.CancelRunning(worker, lane, ids)
                         for (worker, lane), ids in self.running.items()]
        return instructions

    def _cancelled(self) -> Outcome:
        why = ("the coordinator was shut down" if self.closed else
               f"cancelled because an earlier function failed: {self.error!r:.200}")
        return Outcome(error=CancelledError(why))

    def _on_ErrorTaken(self, event: msg.ErrorTaken) -> list[msg.Instruction]:
        if self.in_flight:
            raise FailedPreconditionError("the error is taken once nothing runs")
        error, self.error = self.error, None
        return [] if error is None else [msg.RaiseError(error)]

    def _on_Closed(self, event: msg.Closed) -> list[msg.Instruction]:
        self.closed = True
        instructions: list[msg.Instruction] = [
            msg.Resolve(closure_id, self._cancelled()) for closure_id in self.queue]
        self.queue.clear()
        for lane in list(self.running):
            instructions += self._abandon(lane)
        instructions += [msg.Wake(worker, lane) for worker, lane in self.idle]  # to end
        self.idle.clear()
        self.resources.clear()
        for worker, record in enumerate(self.workers):
            if record.built:
                instructions.append(msg.Free(worker, tuple(sorted(record.built))))
                record.built = set()
        return instructions

    def _wakes(self) -> list[msg.Instruction]:
        """Wake idle lanes of workers up: with those woken already, one per queued closure."""
        wakes: list[msg.Instruction] = []
        if not self.idle or not self.queue:
            return wakes
        wanted = len(self.queue) - sum(self.workers[w].status == UP for w, _ in self.woken)
        for worker, lane in list(self.idle):
            if len(wakes) >= wanted:
                break
            if self._may_take(worker):
                del self.idle[(worker, lane)]
                self.woken.add((worker, lane))
                wakes.append(msg.Wake(worker, lane))
        return wakes

    # ----- workers and their resources --------------------------------------------------------
    def _on_WorkerBack(self, event: msg.WorkerBack) -> list[msg.Instruction]:
        record = self.workers[event.worker]
        if record.status not in (DOWN, FAILED):
            raise InvalidArgumentError(f"worker {event.worker} is {record.status}, not probed")
        if self.closed:
            return []
        if record.status == FAILED and event.incarnation == record.incarnation:
            return [msg.Probe(event.worker, unless=record.incarnation)]
        if event.incarnation != record.incarnation:  # a new process: it holds no resources
            record.incarnation = event.incarnation
            record.built = set()
        return self._rebuild_or_up(event.worker)

    def _rebuild_or_up(self, worker: int) -> list[msg.Instruction]:
        record = self.workers[worker]
        missing = tuple(r for r in self.resources if r not in record.built)
        if missing:
            record.status = REBUILDING
            return [msg.Rebuild(worker, missing)]
        record.status = UP
        return self._wakes()

    def _expect_rebuilding(self, worker: int) -> WorkerRecord:
        record = self.workers[worker]
        if record.status != REBUILDING:
            raise InvalidArgumentError(f"worker {worker} is {record.status}, not rebuilding")
        return record

    def _on_Rebuilt(self, event: msg.Rebuilt) -> list[msg.Instruction]:
        self._expect_rebuilding(event.worker)
        instructions = self._keep_built(event.worker, event.resource_ids)
        if self.closed:
            return instructions
        return instructions + self._rebuild_or_up(event.worker)  # with resources added since

    def _keep_built(self, worker: int, resource_ids: tuple[int, ...]) -> list[msg.Instruction]:
        """Record what the worker built; free there what was dropped meanwhile."""
        kept = [r for r in resource_ids if r in self.resources]
        self.workers[worker].built.update(kept)
        dropped = tuple(r for r in resource_ids if r not in self.resources)
        return [msg.Free(worker, dropped)] if dropped else []

    def _on_RebuildFailed(self, event: msg.RebuildFailed) -> list[msg.Instruction]:
        record = self._expect_rebuilding(event.worker)
        if event.unreachable:  # lost again
            record.status = DOWN
            return [] if self.closed else [msg.Probe(event.worker)]
        record.status = FAILED
        instructions: list[msg.Instruction] = [] if self.closed else [
            msg.Probe(event.worker, unless=record.incarnation)]
        if self.error is None:
            what = self.resources.get(event.resource_id, "per-worker resource")
            error = FailedPreconditionError(
                f"worker {event.worker} could not rebuild its {what} (resource "
                f"{event.resource_id}) as a new process: {type(event.error).__name__}: "
                f"{event.error}; it runs no functions until it restarts")
            error.__cause__ = event.error
            instructions += self._fail(error)
        return instructions

    def _on_ResourceAdded(self, event: msg.ResourceAdded) -> list[msg.Instruction]:
        if self.closed:
            raise FailedPreconditionError("the coordinator was shut down: it creates no more "
                                          "per-worker resources")
        self.resources[event.resource_id] = event.what
        return [msg.Build(worker, event.resource_id)
                for worker, record in enumerate(self.workers) if record.status == UP]

    def _on_Built(self, event: msg.Built) -> list[msg.Instruction]:
        return self._keep_built(event.worker, (event.resource_id,))

    def _on_ResourceDropped(self, event: msg.ResourceDropped) -> list[msg.Instruction]:
        self.resources.pop(event.resource_id, None)
        instructions: list[msg.Instruction] = []
        for worker, record in enumerate(self.workers):
            if event.resource_id in record.built:
                record.built.discard(event.resource_id)
                instructions.append(msg.Free(worker, (event.resource_id,)))
        return instructions


_HANDLERS: Handlers[ScheduleState, list[msg.Instruction]] = Handlers(ScheduleState,
                                                                    msg.Event)
