"""Runs of a DYNAMIC task: how the dispatcher runs a task again, exactly once, when the worker
process running it is replaced or lost.

A part of :class:`~.state.DispatcherState`, over its :class:`~.records.Records`. A DYNAMIC task
counts its runs from 1 (``incarnation``). A run ends when its process is replaced (a new
process at the address) or lost (silent past the worker timeout: then another worker adopts the
task, the one with the fewest tasks). The next run starts once every client of the iteration
has reported the sequence numbers it received (``awaiting`` empties): it replays the task's
split answers by request number and skips the numbers in ``delivered``.

``runner`` says who runs a task: None, the worker of its address (its slot in the iteration);
an address, the worker that adopted it; ``""``, nobody yet (no worker was alive when it lost
its own): the next worker to register adopts it.
"""

from __future__ import annotations

from convoy.data.service._common import ranges as _ranges
from convoy.data.service._dispatcher import events as ev
from convoy.data.service._dispatcher.records import NOBODY, Records


class TaskRuns:
    """Runs of DYNAMIC tasks in :class:`~.state.DispatcherState`."""

    def __init__(self, records: Records) -> None:
        self._records = records

    # ----- clients' reports ---------------------------------------------------------------------
    def settled_tasks(self, event: ev.ClientHeartbeat) -> list[ev.TaskRecord]:
        """The tasks whose current run ``event`` settles for its client."""
        return [task for task_id, incarnation in event.settled
                if (task := self._records.tasks.get(task_id)) is not None
                and incarnation >= task.incarnation]

    def settle(self, task: ev.TaskRecord, client_id: int) -> None:
        if client_id in task.awaiting:
            task.awaiting.remove(client_id)

    def record_received(self, iteration_id: int,
                        received: tuple[tuple[int, int, int], ...]) -> None:
        """Note what a client of ``iteration_id`` received (of that iteration's tasks only)."""
        for task_id, start, stop in received:
            task = self._records.tasks.get(task_id)
            if task is not None and task.incarnation and task.iteration_id == iteration_id:
                _ranges.add(task.delivered, start, stop)

    def forget_client(self, client_id: int) -> None:
        """Drop client ``client_id`` (released or silent): no run waits for it any more."""
        records = self._records
        client = records.drop_client(client_id)
        if client is None or client.iteration_id not in records.iterations:
            return
        for task_id in records.iterations[client.iteration_id].tasks.values():
            self.settle(records.tasks[task_id], client_id)

    # ----- new runs -----------------------------------------------------------------------------
    def run_again(self, task: ev.TaskRecord) -> None:
        """``task``'s run is over (its process was replaced or lost): the next one starts once
        every client of its iteration has reported what it received of this one."""
        task.incarnation += 1
        task.awaiting = sorted(c.client_id for c in self._records.clients.values()
                               if c.iteration_id == task.iteration_id)

    def adopt(self, task: ev.TaskRecord) -> None:
        """``task``'s runner was lost: the live worker with the fewest tasks runs it again
        (nobody, until a worker registers, if none is alive)."""
        self._records.unindex_runner(task)
        task.runner = min(self._records.workers, default=NOBODY,
                          key=lambda a: (len(self._records.worker_tasks.get(a, ())), a))
        self._records.index_runner(task)
        self.run_again(task)

    def adopt_waiting(self, address: str) -> None:
        """A worker registered at ``address``: it adopts the tasks waiting for one."""
        for task in list(self._records.waiting.values()):
            self._records.unindex_runner(task)
            task.runner = address
            self._records.index_runner(task)

    def held(self, task: ev.TaskRecord) -> bool:
        """Whether ``task``'s run cannot start yet (clients to hear from, or no worker)."""
        return bool(self.held_for(task))

    def held_for(self, task: ev.TaskRecord) -> str:
        """What ``task``'s run waits for, in words ("": it may start)."""
        iteration = self._records.iterations[task.iteration_id]
        if iteration.resume_awaiting > 0:
            return awaited_consumers(iteration)
        if task.awaiting:
            return (f"the reports of the iteration's clients {_listed(task.awaiting)} (what they "
                    f"received of its run {task.incarnation - 1})")
        if self._records.runner(task) == NOBODY:
            return "a worker to run it (none is alive)"
        return ""


def awaited_consumers(iteration: ev.IterationRecord) -> str:
    """The consumers a resumed iteration of a shared job still waits for, in words."""
    joined, missing = iteration.resume_joined, iteration.resume_awaiting
    return (f"{missing} more of the {joined + missing} consumers that saved the shared job "
            f"(resumed by {joined} so far): each must resume with its own saved state")


def _listed(client_ids: list[int]) -> str:
    shown = ", ".join(map(str, client_ids[:5]))
    return shown if len(client_ids) <= 5 else f"{shown} and {len(client_ids) - 5} more"
