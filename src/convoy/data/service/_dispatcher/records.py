"""What the dispatcher holds: its records by id, and the indexes kept beside them.

:class:`Records` is shared by the parts of :class:`~.state.DispatcherState` (its splits, its
tasks' runs, its garbage collection); every index is changed here, next to the records it
indexes. Indexes of tasks by worker and by iteration keep each event's cost independent of how
much history is held: a task is "current" while its iteration's ``tasks`` names it; a lost
worker's leave their iterations but stay known (finished) until the iteration is forgotten.
"""

from __future__ import annotations

from convoy.data.service._dispatcher import events as ev
from convoy.data.service._dispatcher.events import RESTART_HINT
from convoy.errors import NotFoundError

#: ``runner`` of a task that waits for a worker to adopt it.
NOBODY = ""


class Records:
    """The dispatcher's records and indexes. Ids of jobs, iterations, clients and tasks count
    up from ``id_base`` (dataset ids from ``id_base - 1000``). A dispatcher started afresh
    draws a random base, so ids held by those of an earlier one never name its objects ("not
    found", not wrong data)."""

    def __init__(self, id_base: int = 2000) -> None:
        self.datasets: dict[str, ev.DatasetRecord] = {}
        self.jobs: dict[int, ev.JobRecord] = {}
        self.named_jobs: dict[str, int] = {}
        self.iterations: dict[int, ev.IterationRecord] = {}
        self.iteration_keys: dict[tuple[int, int], int] = {}  # (job id, repetition) -> id
        self.job_iterations: dict[int, set[int]] = {}  # job id -> its iterations' ids
        #: Named jobs at rest (a tombstone): every iteration they have is finished.
        self.tombstones: set[int] = set()
        self.tasks: dict[int, ev.TaskRecord] = {}
        self.workers: dict[str, ev.WorkerRecord] = {}
        self.clients: dict[int, ev.ClientRecord] = {}
        self.next_dataset_id = 1000 + id_base - 2000  # dataset ids move with the base too
        self.next_id = id_base
        self.worker_tasks: dict[str, dict[int, ev.TaskRecord]] = {}  # runner -> current tasks
        self.lost_tasks: dict[int, list[int]] = {}  # iteration id -> tasks of lost workers
        self.unfinished: dict[int, int] = {}  # iteration id -> its unfinished tasks
        self.waiting: dict[int, ev.TaskRecord] = {}  # current tasks whose runner is NOBODY
        self.consumers: dict[int, int] = {}  # iteration id -> its clients (if any)
        self.finished_now: list[int] = []  # iterations whose last task just ended
        #: What the dispatcher has counted since its journal began (its metrics): splits
        #: handed_out, acknowledged (their task done) and returned (by a worker lost or
        #: replaced, to run again), and workers_lost.
        self.counts: dict[str, int] = {}

    def count(self, what: str, n: int = 1) -> None:
        """Add ``n`` to :attr:`counts` ``[what]``."""
        self.counts[what] = self.counts.get(what, 0) + n

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    # ----- lookups ------------------------------------------------------------------------------
    def dataset(self, dataset_id: str) -> ev.DatasetRecord:
        record = self.datasets.get(dataset_id)
        if record is None:
            raise NotFoundError(f"Dataset id {dataset_id!r} not found")
        return record

    def known_task(self, task_id: int) -> ev.TaskRecord:
        """The task ``task_id``; NotFoundError if there is none."""
        task = self.tasks.get(task_id)
        if task is None:
            raise NotFoundError(f"Task {task_id} not found{RESTART_HINT}")
        return task

    def units(self, iteration: ev.IterationRecord) -> int:
        """How many splittable units the source of ``iteration``'s dataset has."""
        return self.datasets[self.jobs[iteration.job_id].dataset_id].num_split_units

    def iteration_finished(self, iteration: ev.IterationRecord) -> bool:
        return iteration.finished or (bool(iteration.tasks)
                                      and not self.unfinished[iteration.iteration_id])

    @staticmethod
    def runner(task: ev.TaskRecord) -> str:
        """The address of the worker that runs ``task`` (``NOBODY``: none yet)."""
        return task.worker_address if task.runner is None else task.runner

    # ----- indexes ------------------------------------------------------------------------------
    def add_iteration(self, iteration: ev.IterationRecord) -> None:
        self.iterations[iteration.iteration_id] = iteration
        self.iteration_keys[(iteration.job_id, iteration.repetition)] = iteration.iteration_id
        self.job_iterations.setdefault(iteration.job_id, set()).add(iteration.iteration_id)
        if not iteration.finished:
            self.unfinished[iteration.iteration_id] = 0
            self.tombstones.discard(iteration.job_id)

    def drop_iteration(self, iteration: ev.IterationRecord) -> None:
        """Forget ``iteration``'s record (its tasks are dropped apart)."""
        del self.iterations[iteration.iteration_id]
        del self.iteration_keys[(iteration.job_id, iteration.repetition)]
        of_job = self.job_iterations[iteration.job_id]
        of_job.discard(iteration.iteration_id)
        if not of_job:
            del self.job_iterations[iteration.job_id]

    def at_rest(self, job_id: int) -> bool:
        """Whether ``job_id`` is a named job whose iterations (one at least) have all
        finished: what stays of it is a tombstone."""
        job, iterations = self.jobs.get(job_id), self.job_iterations.get(job_id)
        return (job is not None and bool(job.name) and bool(iterations)
                and all(self.iterations[i].finished for i in iterations or ()))

    def add_client(self, client: ev.ClientRecord) -> None:
        self.clients[client.client_id] = client
        self.consumers[client.iteration_id] = self.consumers.get(client.iteration_id, 0) + 1

    def drop_client(self, client_id: int) -> ev.ClientRecord | None:
        client = self.clients.pop(client_id, None)
        if client is not None:
            left = self.consumers.pop(client.iteration_id) - 1
            if left:
                self.consumers[client.iteration_id] = left
        return client

    def index_task(self, task: ev.TaskRecord) -> None:
        self.tasks[task.task_id] = task
        if self.iterations[task.iteration_id].tasks.get(task.worker_address) == task.task_id:
            self.index_runner(task)
            self.unfinished[task.iteration_id] += not task.finished
        else:
            self.lost_tasks.setdefault(task.iteration_id, []).append(task.task_id)

    def index_runner(self, task: ev.TaskRecord) -> None:
        runner = self.runner(task)
        if runner == NOBODY:
            self.waiting[task.task_id] = task
        else:
            self.worker_tasks.setdefault(runner, {})[task.task_id] = task

    def unindex_runner(self, task: ev.TaskRecord) -> None:
        runner = self.runner(task)
        if runner == NOBODY:
            del self.waiting[task.task_id]
            return
        held = self.worker_tasks[runner]
        del held[task.task_id]
        if not held:
            del self.worker_tasks[runner]

    def finish(self, task: ev.TaskRecord) -> None:
        if not task.finished:  # only current tasks are unfinished
            task.finished = True
            self.unfinished[task.iteration_id] -= 1
            if not self.unfinished[task.iteration_id]:
                self.finished_now.append(task.iteration_id)


def splits_of(task: ev.TaskRecord) -> int:
    """How many splits ``task`` was handed (of an older worker's task: its latest answer's)."""
    if not task.split_log and task.last_splits is not None:
        return len(task.last_splits.splits)
    return sum(len(answer.splits) for answer in task.split_log)
