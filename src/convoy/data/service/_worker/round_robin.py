"""A worker's side of a coordinated read: one task's elements dealt out in rounds.

Each consumer asks for the rounds ``[start, start + count)``. Rounds are formed only once
every one of the ``num_consumers`` consumers has asked for the same first round; then the task's
next ``k * num_consumers`` elements make rounds ``start .. start + k - 1`` (``k`` at most the
smallest count asked for, and what the task has ready), consumer ``i`` taking element ``i`` of
each. Every consumer then gets the same rounds, so the next requests line up again.

A consumer's share stays until it asks for a later round: a request sent again by the same
reader (its answer was lost) gets the same elements. A request for a round already formed is
refused (a consumer restarted under the same job name, as another reader). A worker process
that died while answering may have given some consumers their share of a round and not
others: before the new process forms its first round, a consumer behind the others gets
rounds of its own to catch up (fresh elements, one per round), so the consumers stay in step.
A request still waiting for the other consumers after its ``timeout_s`` fails, naming the
consumers that have not asked.

:class:`RoundRobinState` holds the decisions (no threads or clocks: time comes as ``now``);
:class:`RoundRobinTask` is its threaded shell over a running :class:`~.task.Task`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from convoy.data.service._common.coordinated import end_of_sequence_error
from convoy.data.service._worker.task import Task
from convoy.errors import FailedPreconditionError, InvalidArgumentError

#: While waiting, a request checks this often whether the other consumers have gone quiet.
STALL_CHECK_S = 0.1
#: Bytes of elements taken from the task per fill, about.
FILL_BYTES = 64 << 20


# ----- events ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ask:
    """Consumer ``consumer`` asks for up to ``count`` rounds from round ``start``."""

    consumer: int
    start: int
    count: int
    timeout_s: float
    now: float
    reader: int = 0  # the consumer's client id (0: unknown)


@dataclass(frozen=True)
class Filled:
    """The task's next elements (perhaps fewer than asked for; none if none came in time)."""

    elements: list[Any]


@dataclass(frozen=True)
class Failed:
    """The task ended or its pipeline failed: every request from now on fails with ``error``."""

    error: BaseException


# ----- answers -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rounds:
    """The consumer's elements of the rounds from its ``start``, one per round."""

    elements: list[Any]


@dataclass(frozen=True)
class Fill:
    """Take up to ``count`` elements from the task, then apply :class:`Filled`."""

    count: int


@dataclass(frozen=True)
class Wait:
    """Nothing to hand out yet: ask again after a change, or after a moment."""


@dataclass(frozen=True)
class Refuse:
    error: BaseException


@dataclass
class _Request:
    start: int
    stop: int
    since: float  # when this consumer first asked for ``start``
    reader: int = 0


@dataclass(frozen=True)
class _Share:
    """A consumer's elements of the rounds from ``start``, as handed to ``reader``."""

    start: int
    elements: list[Any]
    reader: int

    def asked_again(self, start: int, reader: int) -> bool:
        """Whether a request for ``start`` by ``reader`` is this one's, sent again."""
        return self.start == start and (self.reader == reader or not self.reader or not reader)


class RoundRobinState:
    """The rounds of one task. Mutate it only through :meth:`apply`."""

    def __init__(self, task_id: int, num_consumers: int) -> None:
        self.task_id = task_id
        self.num_consumers = num_consumers
        self.next_round: int | None = None  # the first round not formed yet
        self.asked: dict[int, _Request] = {}
        self.shares: dict[int, _Share] = {}  # by consumer
        self.carry: list[Any] = []  # taken from the task, not yet part of a round
        self.filling = False  # a Fill is out
        self.error: BaseException | None = None

    def apply(self, event: Ask | Filled | Failed) -> Rounds | Fill | Wait | Refuse | None:
        if isinstance(event, Filled):
            self.carry.extend(event.elements)
            self.filling = False
            return None
        if isinstance(event, Failed):
            self.error = self.error or event.error
            self.filling = False
            return None
        return self._ask(event)

    def _ask(self, event: Ask) -> Rounds | Fill | Wait | Refuse:
        consumer, start = event.consumer, event.start
        if not 0 <= consumer < self.num_consumers:
            return Refuse(InvalidArgumentError(
                f"consumer_index {consumer} is out of range for task {self.task_id}, read by "
                f"num_consumers={self.num_consumers} consumers"))
        share = self.shares.get(consumer)
        if share is not None and share.asked_again(start, event.reader):
            return Rounds(share.elements)  # asked again: its answer was lost
        if self.next_round is not None and start < self.next_round:
            return Refuse(FailedPreconditionError(
                f"Consumer {consumer} requested data for round {start}, but the current round "
                f"has already reached {self.next_round}. This may indicate that the consumer "
                f"was restarted with the same job name."))
        if self.error is not None:
            return Refuse(self.error)
        self.shares.pop(consumer, None)
        request = self.asked.get(consumer)
        if request is None or request.start != start:
            request = self.asked[consumer] = _Request(start, start, event.now, event.reader)
        request.stop = start + max(1, event.count)
        if self.next_round is None:  # nothing formed yet: a new task, or a new process
            ahead = max(r.start for r in self.asked.values())
            if start < ahead:
                return self._catch_up(consumer, start, min(request.stop, ahead))
        if len(self.asked) == self.num_consumers and all(
                r.start == start for r in self.asked.values()):
            return self._form(consumer, start)
        return self._stalled(consumer, request, event)

    def _catch_up(self, consumer: int, start: int, stop: int) -> Rounds | Fill | Wait:
        """Rounds ``[start, stop)`` for this consumer alone: the process that formed them
        died before this consumer's share left (the others got theirs). It gets fresh
        elements for them, so it stays in step with the others from then on."""
        ready = min(stop - start, len(self.carry))
        if ready == 0:
            if self.filling:
                return Wait()
            self.filling = True
            return Fill(stop - start)
        elements, self.carry = self.carry[:ready], self.carry[ready:]
        self.shares[consumer] = _Share(start, elements, self.asked.pop(consumer).reader)
        return Rounds(elements)

    def _form(self, consumer: int, start: int) -> Rounds | Fill | Wait:
        """Deal out the rounds all consumers asked for, as far as elements are at hand."""
        rounds = min(r.stop for r in self.asked.values()) - start
        ready = min(rounds, len(self.carry) // self.num_consumers)
        if ready == 0:
            if self.filling:
                return Wait()
            self.filling = True
            return Fill(rounds * self.num_consumers - len(self.carry))
        taken = ready * self.num_consumers
        elements, self.carry = self.carry[:taken], self.carry[taken:]
        for index in range(self.num_consumers):
            self.shares[index] = _Share(start, elements[index::self.num_consumers],
                                        self.asked[index].reader)
        self.asked.clear()
        self.next_round = start + ready
        return Rounds(self.shares[consumer].elements)

    def _stalled(self, consumer: int, request: _Request, event: Ask) -> Wait | Refuse:
        """Wait for the other consumers, or fail once they have been awaited too long."""
        waited = event.now - request.since
        if waited < event.timeout_s:
            return Wait()
        missing = [i for i in range(self.num_consumers) if i != consumer
                   and (i not in self.asked or self.asked[i].start != request.start)]
        return Refuse(FailedPreconditionError(
            f"Coordinated read stalled: consumer {consumer} waited {waited:.1f} s for round "
            f"{request.start} of task {self.task_id}, but consumer_index "
            f"{', '.join(map(str, missing))} of num_consumers={self.num_consumers} did not ask "
            f"for it; every consumer of a coordinated read must keep reading"))


class RoundRobinTask:
    """Serves one coordinated task's rounds to its consumers' calls."""

    def __init__(self, task: Task, num_consumers: int) -> None:
        self.task = task
        self._state = RoundRobinState(task.task_id, num_consumers)
        self._cond = threading.Condition()

    def rounds(self, consumer: int, start: int, count: int, timeout_s: float,
               deadline: float, reader: int = 0) -> list[Any]:
        """The consumer's elements of up to ``count`` rounds from ``start``; ``[]`` if they
        are not ready by ``deadline``. Raises what the state refuses with."""
        with self._cond:
            while True:
                now = time.monotonic()
                answer = self._state.apply(Ask(consumer, start, count, timeout_s, now, reader))
                if isinstance(answer, Rounds):
                    self._cond.notify_all()
                    return answer.elements
                if isinstance(answer, Refuse):
                    raise answer.error
                if isinstance(answer, Fill):
                    if now >= deadline:
                        self._state.apply(Filled([]))
                        return []
                    self._fill(answer.count, deadline)
                    continue
                if now >= deadline:
                    return []
                self._cond.wait(min(deadline - now, STALL_CHECK_S))

    def _fill(self, count: int, deadline: float) -> None:
        """Take up to ``count`` elements from the task (without holding the lock)."""
        self._cond.release()
        try:
            event: Filled | Failed
            try:
                elements = self.task.take(count, FILL_BYTES,
                                          max(0.0, deadline - time.monotonic()))
                event = Filled(elements) if elements is not None else Failed(
                    end_of_sequence_error())
            except BaseException as error:  # the pipeline's: every consumer gets it
                event = Failed(error)
        finally:
            self._cond.acquire()
        self._state.apply(event)
        self._cond.notify_all()
