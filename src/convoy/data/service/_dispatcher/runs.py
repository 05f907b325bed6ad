"""Runs of a DYNAMIC task: how the dispatcher runs a task again, exactly once, when the worker
process running it is replaced or lost.

A part of :class:`~.state.DispatcherState` (which it is mixed into), kept apart to
keep each module short. A DYNAMIC task counts its runs from 1 (``incarnation``). A run ends
when its process is replaced (a new process at the address) or lost (silent past the worker
timeout: then another worker adopts the task, the one with the fewest tasks). The next run
starts once every client of the iteration has reported the sequence numbers it received
(``awaiting`` empties): it replays the task's split answers by request number and skips the
numbers in ``delivered``.

``runner`` says who runs a task: None, the worker of its address (its slot in the
iteration); an address, the worker that adopted it; ``""``, nobody yet (no worker was alive
when it lost its own): the next worker to register adopts it.
"""

from __future__ import annotations

from convoy.data.service._common import ranges as _ranges
from convoy.data.service._dispatcher import events as ev

#: ``runner`` of a task that waits for a worker to adopt it.
NOBODY = ""


class TaskRuns:
    """Runs of DYNAMIC tasks in :class:`~.state.DispatcherState`."""

    # the state's records and indexes (see DispatcherState)
    clients: dict[int, ev.ClientRecord]
    workers: dict[str, ev.WorkerRecord]
    tasks: dict[int, ev.TaskRecord]
    _worker_tasks: dict[str, dict[int, ev.TaskRecord]]
    _waiting: dict[int, ev.TaskRecord]  # tasks whose runner is NOBODY

    @staticmethod
    def runner(task: ev.TaskRecord) -> str:
        """The address of the worker that runs ``task`` (``NOBODY``: none yet)."""
        return task.worker_address if task.runner is None else task.runner

    def _index_runner(self, task: ev.TaskRecord) -> None:
        runner = self.runner(task)
        if runner == NOBODY:
            self._waiting[task.task_id] = task
        else:
            self._worker_tasks.setdefault(runner, {})[task.task_id] = task

    def _unindex_runner(self, task: ev.TaskRecord) -> None:
        runner = self.runner(task)
        if runner == NOBODY:
            del self._waiting[task.task_id]
            return
        held = self._worker_tasks[runner]
        del held[task.task_id]
        if not held:
            del self._worker_tasks[runner]

    # ----- clients' reports ---------------------------------------------------------------------
    def _settled_tasks(self, event: ev.ClientHeartbeat) -> list[ev.TaskRecord]:
        """The tasks whose current run ``event`` settles for its client."""
        return [task for task_id, incarnation in event.settled
                if (task := self.tasks.get(task_id)) is not None
                and incarnation >= task.incarnation]

    def _settle(self, task: ev.TaskRecord, client_id: int) -> None:
        if client_id in task.awaiting:
            task.awaiting.remove(client_id)

    def _record_received(self, iteration_id: int,
                         received: tuple[tuple[int, int, int], ...]) -> None:
        """Note what a client of ``iteration_id`` received (of that iteration's tasks only)."""
        for task_id, start, stop in received:
            task = self.tasks.get(task_id)
            if task is not None and task.incarnation and task.iteration_id == iteration_id:
                _ranges.add(task.delivered, start, stop)

    # ----- new runs -----------------------------------------------------------------------------
    def _run_again(self, task: ev.TaskRecord) -> None:
        """``task``'s run is over (its process was replaced or lost): the next one starts once
        every client of its iteration has reported what it received of this one."""
        task.incarnation += 1
        task.awaiting = sorted(c.client_id for c in self.clients.values()
                               if c.iteration_id == task.iteration_id)

    def _adopt(self, task: ev.TaskRecord) -> None:
        """``task``'s runner was lost: the live worker with the fewest tasks runs it again
        (nobody, until a worker registers, if none is alive)."""
        self._unindex_runner(task)
        task.runner = min(self.workers, default=NOBODY,
                          key=lambda a: (len(self._worker_tasks.get(a, ())), a))
        self._index_runner(task)
        self._run_again(task)

    def _adopt_waiting(self, address: str) -> None:
        """A worker registered at ``address``: it adopts the tasks waiting for one."""
        for task in list(self._waiting.values()):
            self._unindex_runner(task)
            task.runner = address
            self._index_runner(task)

    def _held(self, task: ev.TaskRecord) -> bool:
        """Whether ``task``'s run cannot start yet (clients to hear from, or no worker)."""
        return bool(task.awaiting) or self.runner(task) == NOBODY
