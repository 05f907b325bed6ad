"""Splits under DYNAMIC: the ``GetSplits`` event of the dispatcher's state.

A part of :class:`~.state.DispatcherState`, over its :class:`~.records.Records`. Splits are
handed out from a cursor per iteration and repetition, several per request, in fair shares when
few are left. A request names its task, its run of the task and a number: every answer is kept
with the task, so the same request sent again (its answer was lost when the dispatcher died)
gets the same splits, and so does a later run's request of that number (:mod:`.runs`). Requests
of older workers (run 0) keep only the task's latest answer, per worker process.
"""

from __future__ import annotations

from convoy.data.service._common.config import ShardingPolicy, policy_name
from convoy.data.service._dispatcher import events as ev
from convoy.data.service._dispatcher.events import RESTART_HINT
from convoy.data.service._dispatcher.records import Records
from convoy.errors import FailedPreconditionError, InvalidArgumentError, NotFoundError

#: Split requests hand out this many source units per split at most ...
MAX_SPLIT_SIZE = 4096
#: ... aiming at about this many splits per pass, so work spreads evenly over workers.
SPLITS_PER_PASS = 1024


class Splits:
    """The ``GetSplits`` event of :class:`~.state.DispatcherState`: hands out splits and keeps
    every answer with its task."""

    def __init__(self, records: Records) -> None:
        self._records = records

    def get_splits(self, event: ev.GetSplits) -> tuple[list[tuple[int, int]], bool]:
        settled = self.settled(event)
        if settled is not None:
            return settled
        splits, end = self._hand_out(event)
        self._records.count("handed_out", len(splits))
        if event.incarnation:
            self._records.tasks[event.task_id].split_log.append(ev.SplitsAnswer(
                event.worker_uid, event.request_number, event.repetition, splits, end))
        elif event.task_id:
            self._records.tasks[event.task_id].last_splits = ev.SplitsAnswer(
                event.worker_uid, event.request_number, event.repetition, splits, end)
        return splits, end

    def _hand_out(self, event: ev.GetSplits) -> tuple[list[tuple[int, int]], bool]:
        iteration = self._records.iterations[event.iteration_id]
        if event.repetition < iteration.split_repetition:
            return [], True
        if event.repetition > iteration.split_repetition:
            iteration.split_repetition, iteration.split_cursor = event.repetition, 0
        units = self._records.units(iteration)
        # Fair shares when few splits are left (say 8 files): no worker takes them all.
        remaining = -(-(units - iteration.split_cursor) // iteration.split_size)
        share = max(1, -(-remaining // (2 * max(1, len(iteration.tasks)))))
        splits: list[tuple[int, int]] = []
        while len(splits) < min(event.max_splits, share) and iteration.split_cursor < units:
            start = iteration.split_cursor
            iteration.split_cursor = min(units, start + iteration.split_size)
            splits.append((start, iteration.split_cursor))
        return splits, iteration.split_cursor >= units

    def settled(self, event: ev.GetSplits) -> tuple[list[tuple[int, int]], bool] | None:
        """The answer to ``event`` if the state holds it already, changing nothing: a request
        sent again, or one for a repetition that is over (a later one has begun, or no split
        of it is left; neither can change). None if the request hands out splits. Raises for
        a request that cannot be answered."""
        iteration = self._records.iterations.get(event.iteration_id)
        if iteration is None:
            raise NotFoundError(f"Iteration {event.iteration_id} not found{RESTART_HINT}")
        job = self._records.jobs[iteration.job_id]
        if job.options.processing_mode is not ShardingPolicy.DYNAMIC:
            raise FailedPreconditionError(
                f"Cannot get splits for iteration {event.iteration_id}: its job uses "
                f"{policy_name(job.options.processing_mode)}, not DYNAMIC sharding"
            )
        if event.incarnation:
            return self._logged_splits(event)
        if event.task_id:
            last = self._split_task(event).last_splits
            if (last is not None and last.worker_uid == event.worker_uid
                    and last.request_number == event.request_number):
                if last.repetition != event.repetition:
                    raise InvalidArgumentError(
                        f"split request {event.request_number} of task {event.task_id} was "
                        f"for repetition {last.repetition}, not {event.repetition}")
                return list(last.splits), last.end_of_splits
        if event.repetition < iteration.split_repetition or (
                event.repetition == iteration.split_repetition
                and iteration.split_cursor >= self._records.units(iteration)):
            return [], True
        return None

    def _logged_splits(self, event: ev.GetSplits) -> tuple[list[tuple[int, int]], bool] | None:
        """The logged answer to the request of ``event``'s number (any run of its task asked
        it), or None for the next request."""
        task = self._split_task(event)
        if event.incarnation != task.incarnation or task.awaiting:
            raise FailedPreconditionError(
                f"Task {event.task_id} is in its run {task.incarnation}"
                f"{' (waiting for its clients)' if task.awaiting else ''}, not "
                f"{event.incarnation}: its worker process was replaced")
        log = task.split_log
        if event.request_number <= len(log):
            answer = log[event.request_number - 1]
            if answer.repetition != event.repetition:
                raise InvalidArgumentError(
                    f"split request {event.request_number} of task {event.task_id} was for "
                    f"repetition {answer.repetition}, not {event.repetition}")
            return list(answer.splits), answer.end_of_splits
        if event.request_number > len(log) + 1:
            raise InvalidArgumentError(
                f"split request {event.request_number} of task {event.task_id} skips a "
                f"number: {len(log)} were answered")
        return None

    def _split_task(self, event: ev.GetSplits) -> ev.TaskRecord:
        task = self._records.known_task(event.task_id)
        if task.iteration_id != event.iteration_id:
            raise InvalidArgumentError(
                f"Task {event.task_id} belongs to iteration {task.iteration_id}, not "
                f"{event.iteration_id}")
        if task.finished:  # its end was found, or its worker was declared lost
            raise FailedPreconditionError(
                f"Task {event.task_id} has finished: no more splits for it")
        return task
