"""One consumer's coordinated read of an iteration, as a state machine (events in,
instructions out), in the vocabulary of :mod:`.reader_events`.

The consumer reads rounds in order, one request in flight: the rounds from ``next_round`` up
to the end of the current turn (see :mod:`convoy.data.service._common.coordinated`), from the
task whose turn it is, at
most half its window at a time (so the next request can fly while the consumer works through
the last answer). The task list is fixed by the first heartbeat view that lists tasks: every
consumer of the iteration sees the same one. A task that leaves the list later (its worker was
declared lost) or stays unreachable past the timeout fails the reading, naming its worker: the
rounds of its turns cannot be served by anyone else.

A coordinated read never ends by itself: its dataset is infinite. A restored one starts at the
saved round (``first_round``); the dispatcher fails it if its consumers restored different
rounds.
"""

from __future__ import annotations

from dataclasses import dataclass

from convoy._transport.events import Handlers
from convoy.data.service._client import reader_events as ev
from convoy.data.service._client.reader_state import (
    Instructions,
    ReaderConfig,
    ReaderState,
    TaskState,
)
from convoy.data.service._common.coordinated import (
    ROUNDS_PER_TURN,
    end_of_sequence_error,
    turn_end,
    turn_of,
)
from convoy.errors import FailedPreconditionError, UnavailableError

#: Rounds asked for per request when the consumer's window does not bound them.
ROUNDS_PER_CALL = ROUNDS_PER_TURN


@dataclass(frozen=True)
class ReadRounds(ev.Read):
    """Ask the task's worker for this consumer's elements of up to ``max_elements`` rounds
    from ``round_index``."""

    round_index: int = 0


def coordinated_config(window: int | None, unreachable_timeout_s: float) -> ReaderConfig:
    """The reader config of a coordinated read: no worker can be skipped."""
    return ReaderConfig(window=window, outstanding=2, elements_per_call=ROUNDS_PER_CALL,
                        unreachable_timeout_s=unreachable_timeout_s, can_skip=False)


class CoordinatedReaderState(ReaderState):
    """What one consumer knows of its coordinated read. Mutate it only through
    :meth:`apply`."""

    def __init__(self, config: ReaderConfig, first_round: int = 0) -> None:
        super().__init__(config)
        self.order: list[TaskState] = []  # the fixed task list, in task id order
        self.first_round = first_round  # where the reading started (a restored one: later)
        self.next_round = first_round

    @property
    def done(self) -> bool:
        return False

    def _on_HeartbeatView(self, event: ev.HeartbeatView) -> Instructions:
        if event.failure:
            return self._fail(FailedPreconditionError(event.failure))
        if not self.order:
            for task_id, address, *_ in sorted(event.tasks):
                self.tasks[task_id] = TaskState(task_id, address)
            self.order = list(self.tasks.values())
            return ()
        listed = {listed_task.task_id for listed_task in event.tasks}
        for task in self.order:
            if task.task_id not in listed:
                return self._fail(UnavailableError(
                    f"worker {task.worker_address} (task {task.task_id}) has left the "
                    f"coordinated read (the dispatcher lost it); the rounds of its turns cannot "
                    f"be served by another worker"))
        return ()

    def _on_NextRead(self, event: ev.NextRead) -> Instructions:
        if self.over:
            return (ev.StopReading(),)
        if not self.order or any(task.in_flight for task in self.order):
            return (ev.Wait(None),)
        count = min(self.config.per_call, turn_end(self.next_round) - self.next_round)
        if self.config.window is not None:
            count = min(count, self.config.window - self.unreturned)
            if count <= 0:
                return (ev.Wait(None),)  # until the consumer returns some
        task = self.order[turn_of(self.next_round, len(self.order))]
        if task.retry_at > event.now:
            return (ev.Wait(task.retry_at),)
        task.in_flight, task.asked = True, count
        return (ReadRounds(task.task_id, task.worker_address, count,
                           round_index=self.next_round),)

    def _on_ElementsArrived(self, event: ev.ElementsArrived) -> Instructions:
        self._reached(self._answered(event.task_id))
        self.next_round += event.count
        self.unreturned += event.count
        return ()

    def _on_EndOfSequence(self, event: ev.EndOfSequence) -> Instructions:
        self._answered(event.task_id)
        return self._fail(end_of_sequence_error())


CoordinatedReaderState.handlers = Handlers(CoordinatedReaderState, ev.Event)
