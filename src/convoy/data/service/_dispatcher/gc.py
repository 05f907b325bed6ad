"""Garbage collection of the dispatcher's state: silent clients, lost workers, idle iterations.

A part of :class:`~.state.DispatcherState` (which it is mixed into), kept apart
to keep each module short: what the ``CollectGarbage`` event does, and the queries the
dispatcher asks before it, to name whom the event forgets.
"""

from __future__ import annotations

from typing import Any

from convoy.data.service._common.config import ShardingPolicy
from convoy.data.service._dispatcher import events as ev


class GarbageCollection:
    """The ``CollectGarbage`` event of :class:`~.state.DispatcherState`."""

    # the state's records and indexes (see DispatcherState)
    clients: dict[int, ev.ClientRecord]
    workers: dict[str, ev.WorkerRecord]
    jobs: dict[int, ev.JobRecord]
    iterations: dict[int, ev.IterationRecord]
    iteration_keys: dict[tuple[int, int], int]
    tasks: dict[int, ev.TaskRecord]
    _worker_tasks: dict[str, dict[int, ev.TaskRecord]]
    _lost_tasks: dict[int, list[int]]
    _unfinished: dict[int, int]
    _waiting: dict[int, ev.TaskRecord]
    iteration_finished: Any
    _finish: Any
    _forget_client: Any
    _adopt: Any
    _unindex_runner: Any

    def silent_clients(self, now: float, timeout: float, since: float = 0.0
                       ) -> tuple[int, ...]:
        """The clients not seen for ``timeout`` by ``now``, counting ``since`` as seen."""
        return tuple(client_id for client_id, client in self.clients.items()
                     if now - max(client.last_seen, since) > timeout)

    def silent_workers(self, now: float, timeout: float, since: float = 0.0
                       ) -> tuple[str, ...]:
        """The workers not seen for ``timeout`` by ``now``, counting ``since`` as seen."""
        return tuple(address for address, worker in self.workers.items()
                     if now - max(worker.last_seen, since) > timeout)

    def _on_CollectGarbage(self, event: ev.CollectGarbage) -> list[str]:
        """Returns the addresses of workers declared lost."""
        silent = (event.clients if event.clients is not None
                  else self.silent_clients(event.now, event.client_timeout))
        for client_id in silent:
            self._forget_client(client_id)
        named = (event.workers if event.workers is not None
                 else self.silent_workers(event.now, event.worker_timeout))
        lost = [address for address in dict.fromkeys(named) if address in self.workers]
        for address in lost:
            del self.workers[address]
        self._release_tasks_of(lost, event.adopt)
        if event.iteration_timeout is not None:
            self._forget_idle_iterations(event.now, event.iteration_timeout, event.keep_dynamic)
        return lost

    def _release_tasks_of(self, lost: list[str], adopt: bool) -> None:
        """With ``adopt``, a lost worker's unfinished DYNAMIC tasks are adopted by other
        workers, which run them again. Its other tasks are over: they leave their unfinished
        iterations, which can end without them. Back again, it is a new worker. Finished
        iterations are left alone."""
        tasks = [task for address in lost for task in self._worker_tasks.get(address, {}).values()]
        running = {task.iteration_id for task in tasks
                   if not self.iteration_finished(self.iterations[task.iteration_id])}
        for task in tasks:
            if adopt and task.iteration_id in running and task.incarnation and not task.finished:
                self._adopt(task)
            elif task.iteration_id in running:
                del self.iterations[task.iteration_id].tasks[task.worker_address]
                self._unindex_runner(task)
                self._lost_tasks.setdefault(task.iteration_id, []).append(task.task_id)
                self._finish(task)

    def _forget_idle_iterations(self, now: float, timeout: float, keep_dynamic: bool
                                ) -> None:
        """Drop iterations that have had no client for ``timeout`` (workers then get their
        tasks deleted by their next heartbeat); keeps the dispatcher's state bounded. With
        ``keep_dynamic``, an unfinished iteration of a named DYNAMIC job is kept, as in
        TensorFlow: a consumer that joins the job again must not be handed its splits a
        second time (an anonymous job cannot be joined again, so its iteration goes)."""
        attached = {client.iteration_id for client in self.clients.values()}
        for iteration_id, iteration in list(self.iterations.items()):
            if iteration_id in attached or (keep_dynamic and self._visits_once(iteration)):
                iteration.idle_since = None
                continue
            if iteration.idle_since is None:
                iteration.idle_since = now
            if now - iteration.idle_since >= timeout:
                self._forget(iteration)

    def _visits_once(self, iteration: ev.IterationRecord) -> bool:
        """Whether forgetting ``iteration`` could hand its splits out again."""
        job = self.jobs[iteration.job_id]
        return (bool(job.name) and job.options.processing_mode is ShardingPolicy.DYNAMIC
                and not self.iteration_finished(iteration))

    def _forget(self, iteration: ev.IterationRecord) -> None:
        """Drop ``iteration`` and its tasks; costs what it drops, not what is held."""
        del self.iterations[iteration.iteration_id]
        del self.iteration_keys[(iteration.job_id, iteration.repetition)]
        tasks, worker_tasks = self.tasks, self._worker_tasks
        for address, task_id in iteration.tasks.items():  # _unindex_runner, inlined: hot
            runner = tasks.pop(task_id).runner
            if runner is None:
                runner = address
            elif not runner:
                del self._waiting[task_id]
                continue
            held = worker_tasks[runner]
            del held[task_id]
            if not held:
                del worker_tasks[runner]
        for task_id in self._lost_tasks.pop(iteration.iteration_id, ()):
            del self.tasks[task_id]
        del self._unfinished[iteration.iteration_id]
