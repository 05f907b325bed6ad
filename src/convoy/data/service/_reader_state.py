"""One consumer's reading of one iteration, as a state machine: events in, instructions out.

The tasks come from the dispatcher's heartbeat views. Reader threads ask which task to read
next (:class:`NextRead`): tasks are read round robin with at most one request in flight each,
as in TensorFlow's client, so each worker's elements arrive in the order it produced them. A
task whose worker could not be reached is left alone for a while. The iteration is done when
the dispatcher says it has finished and every task has ended with no request in flight (a
reply still in flight on an ended task may hold elements).

No threads, locks, clocks or sockets: time enters as the ``now`` of the events that need it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from convoy.errors import ConvoyError, InvalidArgumentError


@dataclass
class TaskState:
    task_id: int
    worker_address: str
    ended: bool = False  # read to its end, or no longer listed by the dispatcher
    in_flight: bool = False
    retry_at: float = 0.0  # not read before this time: its worker could not be reached


# ----- events ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HeartbeatView:
    """The dispatcher's answer to a heartbeat: the unfinished tasks as (task id, worker
    address), and whether the iteration has finished."""

    tasks: tuple[tuple[int, str], ...]
    iteration_finished: bool


@dataclass(frozen=True)
class NextRead:
    """A reader thread asks what to do; the answer is :class:`Read`, :class:`Wait` or
    :class:`StopReading`."""

    now: float


@dataclass(frozen=True)
class ElementsArrived:
    """A task's worker answered with ``count`` elements (0: none ready yet)."""

    task_id: int
    count: int


@dataclass(frozen=True)
class EndOfSequence:
    """A task's worker says the task has no more elements."""

    task_id: int


@dataclass(frozen=True)
class WorkerUnreachable:
    task_id: int
    now: float


@dataclass(frozen=True)
class ReadFailed:
    task_id: int
    error: ConvoyError


@dataclass(frozen=True)
class HeartbeatFailed:
    error: ConvoyError


@dataclass(frozen=True)
class Close:
    """The consumer stops reading."""


# ----- instructions and answers ------------------------------------------------------------------
@dataclass(frozen=True)
class Read:
    """Ask this task's worker for elements, then report what came of it."""

    task_id: int
    worker_address: str


@dataclass(frozen=True)
class Wait:
    """Nothing to read now: ask again after the next event, or at ``until`` at the latest
    (None: only after an event)."""

    until: float | None


@dataclass(frozen=True)
class StopReading:
    """The reading is over (done, failed or closed)."""


@dataclass(frozen=True)
class HeartbeatNow:
    """Every known task has ended: ask the dispatcher now whether the iteration has too."""


@dataclass(frozen=True)
class EndResults:
    """The iteration is done: the consumer gets what is buffered, then the end."""


@dataclass(frozen=True)
class FailResults:
    """The consumer gets what is buffered, then ``error``."""

    error: ConvoyError


@dataclass(frozen=True)
class CancelResults:
    """The consumer has gone: drop what is buffered."""


class ReaderState:
    """What one consumer knows of its iteration. Mutate it only through :meth:`apply`."""

    def __init__(self, backoff_s: float) -> None:
        self.backoff_s = backoff_s  # how long a task whose worker was unreachable is left alone
        self.tasks: dict[int, TaskState] = {}
        self.iteration_finished = False  # as of the latest heartbeat view
        self.closed = False
        self.outcome: EndResults | FailResults | None = None  # given once
        self._turn = 0  # where in the task list the next read starts looking

    @property
    def done(self) -> bool:
        """The dispatcher said the iteration finished; every task ended, none in flight."""
        return self.iteration_finished and all(t.ended and not t.in_flight
                                               for t in self.tasks.values())

    @property
    def over(self) -> bool:
        """Nothing more to read: done, failed or closed."""
        return self.closed or self.outcome is not None

    @property
    def error(self) -> ConvoyError | None:
        return self.outcome.error if isinstance(self.outcome, FailResults) else None

    def apply(self, event: Any) -> Any:
        """Apply one event; returns its answer (:class:`NextRead`) or the instruction it
        calls for, if any."""
        handler = getattr(self, "_on_" + type(event).__name__, None)
        if handler is None:
            raise InvalidArgumentError(f"unknown reader event {type(event).__name__}")
        return handler(event)

    # ----- the dispatcher's side ------------------------------------------------------------------
    def _on_HeartbeatView(self, event: HeartbeatView) -> EndResults | None:
        for task_id, address in event.tasks:
            if task_id not in self.tasks:
                self.tasks[task_id] = TaskState(task_id, address)
        # A task no longer listed has finished (its end of sequence may have been lost with
        # its worker) or its worker was lost.
        listed = {task_id for task_id, _ in event.tasks}
        for task in self.tasks.values():
            if task.task_id not in listed:
                task.ended = True
        self.iteration_finished = event.iteration_finished
        return self._end_if_done()

    def _on_HeartbeatFailed(self, event: HeartbeatFailed) -> FailResults | None:
        return self._fail(event.error)

    # ----- the workers' side ----------------------------------------------------------------------
    def _on_NextRead(self, event: NextRead) -> Read | Wait | StopReading:
        if self.over:
            return StopReading()
        tasks = list(self.tasks.values())  # in the order they became known
        waiting = []
        for offset in range(len(tasks)):
            position = (self._turn + offset) % len(tasks)
            task = tasks[position]
            if task.ended or task.in_flight:
                continue
            if task.retry_at <= event.now:
                self._turn = position + 1
                task.in_flight = True
                return Read(task.task_id, task.worker_address)
            waiting.append(task.retry_at)
        return Wait(min(waiting, default=None))

    def _on_ElementsArrived(self, event: ElementsArrived) -> EndResults | None:
        self._answered(event.task_id)
        return self._end_if_done()

    def _on_EndOfSequence(self, event: EndOfSequence) -> EndResults | HeartbeatNow | None:
        self._answered(event.task_id).ended = True
        end = self._end_if_done()
        if end is None and not self.over and all(t.ended for t in self.tasks.values()):
            return HeartbeatNow()
        return end

    def _on_WorkerUnreachable(self, event: WorkerUnreachable) -> EndResults | None:
        self._answered(event.task_id).retry_at = event.now + self.backoff_s
        return self._end_if_done()

    def _on_ReadFailed(self, event: ReadFailed) -> FailResults | None:
        task = self._answered(event.task_id)
        error = event.error
        return self._fail(type(error)(
            f"Failed to get elements from worker {task.worker_address}: {error}"))

    # ----- the consumer's side --------------------------------------------------------------------
    def _on_Close(self, event: Close) -> CancelResults | None:
        if self.closed:
            return None
        self.closed = True
        return CancelResults()

    # ----- helpers --------------------------------------------------------------------------------
    def _answered(self, task_id: int) -> TaskState:
        """The task whose request has been answered, now free to be read again."""
        task = self.tasks.get(task_id)
        if task is None or not task.in_flight:
            raise InvalidArgumentError(f"task {task_id} has no request in flight")
        task.in_flight = False
        return task

    def _end_if_done(self) -> EndResults | None:
        if self.over or not self.done:
            return None
        self.outcome = EndResults()
        return self.outcome

    def _fail(self, error: ConvoyError) -> FailResults | None:
        if self.over:
            return None
        self.outcome = FailResults(error)
        return self.outcome
