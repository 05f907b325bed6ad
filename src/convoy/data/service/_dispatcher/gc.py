"""Garbage collection of the dispatcher's state: silent clients, lost workers, idle,
abandoned and finished iterations.

The jobs' lifecycle (TensorFlow's rules, and one of convoy's): an iteration that no one can
join again (of an anonymous job) is forgotten, with its job, as soon as its last client goes;
a named one without clients is forgotten after the iteration timeout, and reopening it starts
afresh; a finished one drops its tasks and splits at once, and a named job's finished
iteration stays as its record alone (a tombstone), so that reopening it reads nothing.

A part of :class:`~.state.DispatcherState`, over its :class:`~.records.Records`: what the
``CollectGarbage`` event does, and the queries the dispatcher asks before it, to name whom the
event forgets.
"""

from __future__ import annotations

from convoy.data.service._common.config import ShardingPolicy
from convoy.data.service._dispatcher import events as ev
from convoy.data.service._dispatcher.records import Records, splits_of
from convoy.data.service._dispatcher.runs import TaskRuns

#: Finished named jobs remembered at most (their tombstones, well under 1 KB each); beyond,
#: the oldest one no consumer reads is forgotten, and reopening it then reads afresh.
MAX_TOMBSTONES = 10_000


class GarbageCollection:
    """The ``CollectGarbage`` event of :class:`~.state.DispatcherState`."""

    def __init__(self, records: Records, runs: TaskRuns,
                 max_tombstones: int = MAX_TOMBSTONES) -> None:
        self._records = records
        self._runs = runs
        self.max_tombstones = max_tombstones

    def silent_clients(self, now: float, timeout: float, since: float = 0.0
                       ) -> tuple[int, ...]:
        """The clients not seen for ``timeout`` by ``now``, counting ``since`` as seen."""
        return tuple(client_id for client_id, client in self._records.clients.items()
                     if now - max(client.last_seen, since) > timeout)

    def silent_workers(self, now: float, timeout: float, since: float = 0.0
                       ) -> tuple[str, ...]:
        """The workers not seen for ``timeout`` by ``now``, counting ``since`` as seen."""
        return tuple(address for address, worker in self._records.workers.items()
                     if now - max(worker.last_seen, since) > timeout)

    def collect(self, event: ev.CollectGarbage) -> list[str]:
        """Returns the addresses of workers declared lost."""
        silent = (event.clients if event.clients is not None
                  else self.silent_clients(event.now, event.client_timeout))
        for client_id in silent:
            self.forget_client(client_id)
        named = (event.workers if event.workers is not None
                 else self.silent_workers(event.now, event.worker_timeout))
        lost = [address for address in dict.fromkeys(named) if address in self._records.workers]
        for address in lost:
            del self._records.workers[address]
        self._records.count("workers_lost", len(lost))
        self._release_tasks_of(lost, event.adopt)
        if event.iteration_timeout is not None:
            self._forget_idle_iterations(event.now, event.iteration_timeout, event.keep_dynamic)
        return lost

    def declare_lost(self, event: ev.WorkerLost) -> bool:
        """Declare the worker of ``event`` lost now, if it is still that process; returns
        whether it was."""
        worker = self._records.workers.get(event.address)
        if worker is None or worker.uid != event.uid:
            return False
        del self._records.workers[event.address]
        self._records.count("workers_left" if event.left else "workers_lost")
        self._release_tasks_of([event.address], adopt=True)
        return True

    def forget_client(self, client_id: int) -> None:
        """Drop client ``client_id`` (released or silent); its iteration goes with it if no
        one can join it again."""
        client = self._records.clients.get(client_id)
        self._runs.forget_client(client_id)
        if client is not None:
            self._bury(client.iteration_id)
            self._drop_if_abandoned(client.iteration_id)

    def _drop_if_abandoned(self, iteration_id: int) -> None:
        """Forget ``iteration_id`` and its job if the job is anonymous (no one can join it
        again) and no client is left: its workers drop its tasks at their next heartbeat."""
        records = self._records
        iteration = records.iterations.get(iteration_id)
        if (iteration is None or records.consumers.get(iteration_id)
                or records.jobs[iteration.job_id].name):
            return
        self._forget(iteration)
        job_id = iteration.job_id
        if job_id not in records.job_iterations:
            del records.jobs[job_id]

    def bury_finished(self) -> None:
        """Drop the tasks and splits of iterations that have just finished, once their
        consumers have left; what stays is their record (a tombstone), and of an anonymous
        job's, nothing."""
        records = self._records
        finished, records.finished_now = records.finished_now, []
        for iteration_id in finished:
            self._bury(iteration_id)

    def _bury(self, iteration_id: int) -> None:
        """Drop the tasks and splits of ``iteration_id`` once every task has ended and no
        consumer reads it any more: a consumer still reading may save its position, which
        names its tasks (their seeds, workers and split answers)."""
        records = self._records
        iteration = records.iterations.get(iteration_id)
        if (iteration is None or iteration.finished or records.consumers.get(iteration_id)
                or not records.iteration_finished(iteration)):
            return  # forgotten or buried already, still read, or not finished
        self._drop_tasks(iteration)
        iteration.finished = True
        self._drop_if_abandoned(iteration_id)
        self._rest_if_finished(iteration.job_id)

    def _rest_if_finished(self, job_id: int) -> None:
        """Count ``job_id`` among the tombstones if it is at rest, and forget the oldest
        tombstones (lowest job ids) beyond ``max_tombstones``, but for those still opened by
        a consumer."""
        records = self._records
        if not records.at_rest(job_id):
            records.tombstones.discard(job_id)
            return
        records.tombstones.add(job_id)
        if len(records.tombstones) <= self.max_tombstones:
            return
        consumers = records.consumers
        unread = sorted(j for j in records.tombstones
                        if not any(i in consumers for i in records.job_iterations[j]))
        for oldest in unread[:len(records.tombstones) - self.max_tombstones]:
            self._forget_job(oldest)

    def _forget_job(self, job_id: int) -> None:
        """Drop a tombstone: the job's (finished) iterations and its record."""
        records = self._records
        for iteration_id in sorted(records.job_iterations[job_id]):
            self._forget(records.iterations[iteration_id], rest=False)
        job = records.jobs.pop(job_id)
        del records.named_jobs[job.name]
        records.tombstones.discard(job_id)

    def _release_tasks_of(self, lost: list[str], adopt: bool) -> None:
        """With ``adopt``, a lost worker's unfinished DYNAMIC tasks are adopted by other
        workers, which run them again. Its other tasks are over: they leave their unfinished
        iterations, which can end without them. Back again, it is a new worker. Finished
        iterations are left alone."""
        records = self._records
        tasks = [task for address in lost
                 for task in records.worker_tasks.get(address, {}).values()]
        running = {task.iteration_id for task in tasks
                   if not records.iteration_finished(records.iterations[task.iteration_id])}
        for task in tasks:
            if adopt and task.iteration_id in running and task.incarnation and not task.finished:
                self._runs.adopt(task)
                records.count("returned", splits_of(task))
            elif task.iteration_id in running:
                del records.iterations[task.iteration_id].tasks[task.worker_address]
                records.unindex_runner(task)
                records.lost_tasks.setdefault(task.iteration_id, []).append(task.task_id)
                records.finish(task)

    def _forget_idle_iterations(self, now: float, timeout: float, keep_dynamic: bool
                                ) -> None:
        """Drop iterations that have had no client for ``timeout`` (workers then get their
        tasks deleted by their next heartbeat); keeps the dispatcher's state bounded. With
        ``keep_dynamic``, an unfinished iteration of a named DYNAMIC job is kept, as in
        TensorFlow: a consumer that joins the job again must not be handed its splits a
        second time (an anonymous job cannot be joined again, so its iteration goes)."""
        attached = self._records.consumers
        for iteration_id, iteration in list(self._records.iterations.items()):
            if (iteration_id in attached or iteration.finished
                    or (keep_dynamic and self._visits_once(iteration))):
                iteration.idle_since = None
                continue
            if iteration.idle_since is None:
                iteration.idle_since = now
            if now - iteration.idle_since >= timeout:
                self._forget(iteration)

    def _visits_once(self, iteration: ev.IterationRecord) -> bool:
        """Whether forgetting ``iteration`` could hand its splits out again."""
        job = self._records.jobs[iteration.job_id]
        return (bool(job.name) and job.options.processing_mode is ShardingPolicy.DYNAMIC
                and not self._records.iteration_finished(iteration))

    def _forget(self, iteration: ev.IterationRecord, rest: bool = True) -> None:
        """Drop ``iteration`` and its tasks; costs what it drops, not what is held. With
        ``rest``, its job becomes a tombstone if its other iterations have finished."""
        records = self._records
        records.drop_iteration(iteration)
        self._drop_tasks(iteration)
        if rest:
            self._rest_if_finished(iteration.job_id)

    def _drop_tasks(self, iteration: ev.IterationRecord) -> None:
        records = self._records
        tasks, worker_tasks = records.tasks, records.worker_tasks
        for address, task_id in iteration.tasks.items():  # Records.unindex_runner, inlined: hot
            runner = tasks.pop(task_id).runner
            if runner is None:
                runner = address
            elif not runner:
                del records.waiting[task_id]
                continue
            held = worker_tasks[runner]
            del held[task_id]
            if not held:
                del worker_tasks[runner]
        for task_id in records.lost_tasks.pop(iteration.iteration_id, ()):
            del tasks[task_id]
        iteration.tasks = {}
        records.unfinished.pop(iteration.iteration_id, None)
