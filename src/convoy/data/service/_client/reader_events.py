"""What goes in and out of a consumer's reader state machine (:mod:`.reader_state`).

Events report what happened (time enters as their ``now``); the state answers each with a
tuple of instructions for the threads that carry them out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from convoy.errors import ConvoyError

#: Sequence numbers ``[start, stop)`` of a task's elements ...
Range = tuple[int, int]
#: ... and of a given task: ``(task id, start, stop)``.
TaskRange = tuple[int, int, int]


class ListedTask(NamedTuple):
    """A task as the dispatcher lists it."""

    task_id: int
    worker_address: str
    incarnation: int = 0  # its run, under DYNAMIC (a replaced worker process runs it again)
    held: bool = False  # its run waits for its clients' reports: not to be read yet
    held_for: str = ""  # what it waits for, in the dispatcher's words


# ----- events: the dispatcher's side -------------------------------------------------------------
@dataclass(frozen=True)
class HeartbeatView:
    """The dispatcher's answer to a heartbeat: the unfinished tasks, and whether the iteration
    has finished. ``settled`` and ``received``: the reports of :meth:`ReaderState.reports`
    that the heartbeat carried (the dispatcher has them now)."""

    tasks: tuple[ListedTask, ...]
    iteration_finished: bool
    settled: tuple[tuple[int, int], ...] = ()
    received: tuple[TaskRange, ...] = ()
    now: float | None = None  # when it arrived (None: held runs are not timed)
    failure: str = ""  # the iteration cannot go on (a coordinated read restored out of step)


@dataclass(frozen=True)
class HeartbeatFailed:
    error: ConvoyError


# ----- events: the workers' side -----------------------------------------------------------------
@dataclass(frozen=True)
class NextRead:
    """A reader thread asks what to do; the answer is one :class:`Read`, :class:`Wait` or
    :class:`StopReading`."""

    now: float


@dataclass(frozen=True)
class ElementsArrived:
    """A task's worker answered with ``count`` elements (0: none ready yet), now in the
    consumer's buffer; ``numbers``: their sequence numbers, if the task numbers them."""

    task_id: int
    count: int
    numbers: tuple[Range, ...] = ()


@dataclass(frozen=True)
class EndOfSequence:
    """A task's worker says the task has no more elements."""

    task_id: int


@dataclass(frozen=True)
class WorkerUnreachable:
    """A task's worker could not be reached, did not answer within the call's deadline, or
    cancelled the call (it is stopping)."""

    task_id: int
    error: ConvoyError
    now: float


@dataclass(frozen=True)
class ReadFailed:
    task_id: int
    error: ConvoyError


# ----- events: the consumer's side ---------------------------------------------------------------
@dataclass(frozen=True)
class ElementsReturned:
    """The consumer's iterator has returned ``count`` more elements."""

    count: int


@dataclass(frozen=True)
class Close:
    """The consumer stops reading."""


@dataclass(frozen=True)
class GivenBack:
    """Elements of a task the consumer had received, numbered ``numbers`` (ranges), went back
    to their task as the consumer left: they are no longer the consumer's to report."""

    task_id: int
    numbers: tuple[Range, ...]


# ----- instructions and answers ------------------------------------------------------------------
Event = (HeartbeatView | HeartbeatFailed | NextRead | ElementsArrived | EndOfSequence
         | WorkerUnreachable | ReadFailed | ElementsReturned | Close | GivenBack)


@dataclass(frozen=True)
class Read:
    """Ask this task's worker for up to ``max_elements`` elements, then report what came of
    it."""

    task_id: int
    worker_address: str
    max_elements: int
    incarnation: int = 0


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
class ReportUnreachable:
    """Tell the dispatcher that this task's worker cannot be reached: it checks for itself
    and, if the worker is gone, has the task adopted (the reader waits for that run)."""

    task_id: int
    worker_address: str


@dataclass(frozen=True)
class Warn:
    """Tell the user (a logged warning; ``info``: a line at INFO, news that is no failure)."""

    message: str
    info: bool = False


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
