"""The dispatcher's state machine: events in, results out; no sockets, threads or clocks.

Every change to the dispatcher's state is one event (:mod:`.events`) passed to
:meth:`DispatcherState.apply`, which returns the event's result. Given the same events in the
same order, two states end up equal, so the event log is the journal and restart is replay.
Time enters only as the ``now`` field of the events that need it; last-seen times are the only
state that replay need not restore (garbage collection names whom it forgets).

Objects and their ids: datasets (decimal strings), jobs, iterations (one per job and
repetition), iteration clients (one per consumer iterator), tasks (one per iteration and
worker; a static job's on its listed workers only), workers (by address; ``uid`` tells a
restarted process apart). They are held, with their indexes, in :class:`~.records.Records`,
which the state shares with its parts: its splits (:mod:`.splits`), its tasks' runs
(:mod:`.runs`) and its garbage collection (:mod:`.gc`).

Under DYNAMIC, splits are handed out from a cursor per iteration and repetition, and every
answer is kept with its task (:mod:`.splits`). That is how a task runs again
exactly once when its worker process is replaced or lost: the new run replays the task's
splits (seeded alike, the pipeline makes the same elements in the same order, numbered from
0) and skips the sequence numbers its consumers have received; it starts once every client of
the iteration has reported them (:mod:`.runs`).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from convoy._transport.events import Handlers
from convoy.data.service._common import invariants
from convoy.data.service._common import ranges as _ranges
from convoy.data.service._common.config import ShardingPolicy
from convoy.data.service._common.coordinated import adds_tasks, check_coordinated_job
from convoy.data.service._common.static_policy import check_static_job, is_static
from convoy.data.service._dispatcher import events as ev
from convoy.data.service._dispatcher.estimate import WorkerEstimate
from convoy.data.service._dispatcher.events import RESTART_HINT
from convoy.data.service._dispatcher.gc import GarbageCollection
from convoy.data.service._dispatcher.records import NOBODY, Records, splits_of
from convoy.data.service._dispatcher.runs import TaskRuns
from convoy.data.service._dispatcher.snapshots import Snapshots
from convoy.data.service._dispatcher.splits import MAX_SPLIT_SIZE, SPLITS_PER_PASS, Splits
from convoy.errors import (
    ConvoyError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    UnimplementedError,
)


def fresh_id_base() -> int:
    """A random starting point for the ids of a dispatcher that starts without history."""
    return 2000 + random.SystemRandom().randrange(1 << 40) * 1_000_000



#: The iteration slots (in place of worker addresses) of the tasks of a saved reading.
RESUMED_SLOT = "resumed-task-"

_RECORDS = ("datasets", "jobs", "iterations", "tasks", "workers", "clients")
#: Values ``_plain`` returns as they are: immutable, so ``dataclasses.asdict``'s copy is them.
_ATOMS = (str, int, float, bytes, type(None))


def _plain(value: Any) -> Any:
    """``dataclasses.asdict(value)``, several times faster on records of plain values (the
    tests snapshot the state after every event)."""
    if isinstance(value, _ATOMS):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if type(value) is tuple:
        return tuple(_plain(v) for v in value)
    return dataclasses.asdict(_Boxed(value))["value"]  # namedtuples, sets...: asdict's way


@dataclasses.dataclass
class _Boxed:
    value: Any


class DispatcherState:
    """All the dispatcher knows. Mutate it only through :meth:`apply`."""

    def __init__(self, id_base: int = 2000) -> None:
        self.records = Records(id_base)
        self.runs = TaskRuns(self.records)
        self.splits = Splits(self.records)
        self.gc = GarbageCollection(self.records, self.runs)
        self.snapshots = Snapshots()  # distributed_save's streams and splits
        self.estimate = WorkerEstimate()  # the workers the jobs need (not journaled)

    # the records, for queries (changed only by events)
    @property
    def datasets(self) -> dict[str, ev.DatasetRecord]:
        return self.records.datasets

    @property
    def jobs(self) -> dict[int, ev.JobRecord]:
        return self.records.jobs

    @property
    def named_jobs(self) -> dict[str, int]:
        return self.records.named_jobs

    @property
    def iterations(self) -> dict[int, ev.IterationRecord]:
        return self.records.iterations

    @property
    def iteration_keys(self) -> dict[tuple[int, int], int]:
        return self.records.iteration_keys

    @property
    def tasks(self) -> dict[int, ev.TaskRecord]:
        return self.records.tasks

    @property
    def workers(self) -> dict[str, ev.WorkerRecord]:
        return self.records.workers

    @property
    def clients(self) -> dict[int, ev.ClientRecord]:
        return self.records.clients

    @property
    def next_id(self) -> int:
        return self.records.next_id

    @property
    def next_dataset_id(self) -> int:
        return self.records.next_dataset_id

    def apply(self, event: ev.Event) -> Any:
        """Apply one event; returns its result. Raises a convoy error for a bad request,
        leaving the state unchanged (TypeError for an object that is no dispatcher event)."""
        result = _HANDLERS(self, event)
        if self.records.finished_now:
            self.gc.bury_finished()
        if invariants.ENABLED:
            self.validate()
        return result

    def validate(self) -> None:
        """Check the invariants that tie the records together (AssertionError on the first
        broken): names, keys and indexes point at the records they index."""
        require, records = invariants.require, self.records
        for name, job_id in records.named_jobs.items():
            job = records.jobs.get(job_id)
            require(job is not None and job.name == name, f"job name {name!r} -> {job_id}")
        for (job_id, repetition), iteration_id in records.iteration_keys.items():
            iteration = records.iterations.get(iteration_id)
            require(iteration is not None
                    and (iteration.job_id, iteration.repetition) == (job_id, repetition),
                    f"iteration key {(job_id, repetition)} -> {iteration_id}")
        for job_id, ids in records.job_iterations.items():
            for iteration_id in ids:
                iteration = records.iterations.get(iteration_id)
                require(iteration is not None and iteration.job_id == job_id,
                        f"iteration {iteration_id} filed under job {job_id}")
        for task_id, task in records.tasks.items():
            require(task.task_id == task_id, f"task {task_id} filed under another id")
            require(task.iteration_id in records.iterations,
                    f"task {task_id} of a missing iteration {task.iteration_id}")
        for runner, tasks in records.worker_tasks.items():
            for task_id, task in tasks.items():
                require(records.tasks.get(task_id) is task,
                        f"{runner}'s task {task_id} is not the task of that id")
        for client_id, client in records.clients.items():
            require(client.client_id == client_id, f"client {client_id} filed under another id")
        given = [*records.jobs, *records.iterations, *records.tasks, *records.clients]
        require(not given or max(given) <= records.next_id,
                f"an id above the next one to give ({records.next_id})")

    def is_durable(self, event: ev.Event) -> bool:
        """Whether ``event`` would change more than last-seen times (which a restart need not
        keep): heartbeats of known clients and workers that report no new end do not, nor
        split requests whose answer the state already holds."""
        if isinstance(event, ev.ClientHeartbeat):
            return bool(event.received) or any(
                event.client_id in task.awaiting for task in self.runs.settled_tasks(event))
        if isinstance(event, ev.WorkerHeartbeat):
            worker = self.workers.get(event.address)
            return (worker is None or worker.uid != event.uid
                    or any(not task.finished for task in self._reported_ends(event)))
        if isinstance(event, ev.GetSplits):
            try:
                return self.splits.settled(event) is None
            except ConvoyError:
                return False  # refused: apply raises the same error
        if isinstance(event, ev.GetSaveSplit):
            return not self.snapshots.answered(event.path, event.index, event.request_number)
        return True

    # ----- saving and restoring ---------------------------------------------------------------
    def saved(self) -> ev.SavedState:
        """The records (not the indexes, which :meth:`restore` rebuilds)."""
        records = self.records
        return ev.SavedState(
            self.next_id, self.next_dataset_id, list(records.datasets.values()),
            list(records.jobs.values()), list(records.iterations.values()),
            list(records.tasks.values()), list(records.workers.values()),
            list(records.clients.values()), list(self.snapshots.saves.values()),
            dict(records.counts))

    @classmethod
    def restore(cls, saved: ev.SavedState) -> DispatcherState:
        """The state whose records are ``saved``."""
        state = cls()
        records = state.records
        records.next_id, records.next_dataset_id = saved.next_id, saved.next_dataset_id
        records.datasets.update((d.dataset_id, d) for d in saved.datasets)
        records.jobs.update((j.job_id, j) for j in saved.jobs)
        records.named_jobs.update((j.name, j.job_id) for j in saved.jobs if j.name)
        for iteration in saved.iterations:
            records.add_iteration(iteration)
        for task in saved.tasks:
            records.index_task(task)
        records.workers.update((w.address, w) for w in saved.workers)
        for client in saved.clients:
            records.add_client(client)
        records.tombstones.update(j for j in records.job_iterations if records.at_rest(j))
        state.snapshots.saves.update((save.path, save) for save in saved.saves)
        records.counts.update(saved.counts)
        return state

    def snapshot(self) -> dict[str, Any]:
        """The whole state as plain data, records by id and indexes included (for tests)."""
        plain: dict[str, Any] = {name: {key: _plain(record)
                                        for key, record in getattr(self.records, name).items()}
                                 for name in _RECORDS}
        plain.update(named_jobs=dict(self.named_jobs), iteration_keys=dict(self.iteration_keys),
                     next_dataset_id=self.next_dataset_id, next_id=self.next_id,
                     worker_tasks={a: sorted(t) for a, t in self.records.worker_tasks.items()},
                     lost_tasks={i: sorted(t) for i, t in self.records.lost_tasks.items()},
                     unfinished=dict(self.records.unfinished),
                     consumers=dict(self.records.consumers),
                     waiting=sorted(self.records.waiting),
                     tombstones=sorted(self.records.tombstones))
        return plain

    # ----- datasets ---------------------------------------------------------------------------
    def _on_RegisterDataset(self, event: ev.RegisterDataset) -> str:
        if event.requested_id:
            existing = self.datasets.get(event.requested_id)
            if existing is not None:
                if existing.fingerprint != event.fingerprint:
                    raise InvalidArgumentError(
                        f"Datasets with the same ID should have the same structure: dataset "
                        f"id {event.requested_id!r} is already registered with another dataset"
                    )
                return existing.dataset_id
            dataset_id = event.requested_id
        else:
            for record in self.datasets.values():
                if record.fingerprint == event.fingerprint:
                    return record.dataset_id
            records = self.records
            while str(records.next_dataset_id) in records.datasets:
                records.next_dataset_id += 1
            dataset_id = str(records.next_dataset_id)
            records.next_dataset_id += 1
        self.datasets[dataset_id] = ev.DatasetRecord(
            dataset_id, event.fingerprint, event.payload, event.compression,
            event.element_spec, event.cardinality, event.num_split_units)
        return dataset_id

    def dataset(self, dataset_id: str) -> ev.DatasetRecord:
        return self.records.dataset(dataset_id)

    # ----- jobs and iterations ----------------------------------------------------------------
    def _on_GetOrCreateJob(self, event: ev.GetOrCreateJob) -> int:
        dataset = self.dataset(event.dataset_id)
        mode = event.options.processing_mode
        if event.job_name and event.job_name in self.named_jobs:
            job = self.jobs[self.named_jobs[event.job_name]]
            if job.options != event.options:
                raise InvalidArgumentError(
                    f"Tried to create job with name {event.job_name!r}, but found an existing "
                    f"job with different parameters: existing {job.options.describe()}; got "
                    f"{event.options.describe()}"
                )
            return job.job_id
        if mode is ShardingPolicy.DYNAMIC and dataset.num_split_units < 0:
            raise UnimplementedError(
                "DYNAMIC sharding needs a pipeline whose source can be split (range, "
                "from_tensor_slices, list_files, or a file reader over a list of files)"
            )
        check_static_job(mode, event.options.target_workers, event.worker_addresses)
        options = event.options
        if event.coordinated_rules:
            check_coordinated_job(options.num_consumers, dataset.cardinality, mode,
                                  options.target_workers, options.cross_trainer_cache)
        job = ev.JobRecord(self.records.new_id(), event.job_name, event.dataset_id, event.options,
                           event.worker_addresses if is_static(mode) else (),
                           event.coordinated_rules and options.num_consumers > 0)
        self.jobs[job.job_id] = job
        if event.job_name:
            self.named_jobs[event.job_name] = job.job_id
        return job.job_id

    def _on_GetOrCreateIteration(self, event: ev.GetOrCreateIteration) -> tuple[int, int]:
        job = self.jobs.get(event.job_id)
        if job is None:
            raise NotFoundError(f"Job id {event.job_id} not found{RESTART_HINT}")
        iteration_id = self.iteration_keys.get((event.job_id, event.repetition))
        if iteration_id is None:
            iteration_id = self.records.new_id()
            units = self.datasets[job.dataset_id].num_split_units
            split_size = max(1, min(MAX_SPLIT_SIZE, units // SPLITS_PER_PASS))
            iteration = ev.IterationRecord(iteration_id, job.job_id, event.repetition,
                                           split_size=split_size)
            self.records.add_iteration(iteration)
            if event.resume is not None:
                self._resume(iteration, event.resume)
                iteration.resume_joined = 1
                iteration.resume_awaiting = max(0, event.resume.consumers - 1)
                iteration.resume_round = event.resume.round_index
            for address in sorted(self.workers):
                self._create_task(iteration, address)
        elif event.resume is not None:
            iteration = self.iterations[iteration_id]
            if job.options.num_consumers and event.resume.round_index != iteration.resume_round:
                # every consumer fails: this one at once (no client), those already reading by
                # their heartbeats
                iteration.failure = iteration.failure or (
                    f"the consumers of coordinated job {job.name!r} restored states of different "
                    f"rounds: {iteration.resume_round} and {event.resume.round_index}; each must "
                    f"restore its own state saved at the same round as the others'")
            if iteration.failure:
                return iteration_id, 0
            if iteration.resume_awaiting > 0:  # another consumer of the saved shared job
                self._resume(iteration, event.resume)
                # states saved at different times may count different consumers: the most
                iteration.resume_joined += 1
                iteration.resume_awaiting = max(iteration.resume_awaiting - 1,
                                                event.resume.consumers - iteration.resume_joined)
        client = ev.ClientRecord(self.records.new_id(), iteration_id, event.now)
        self.records.add_client(client)
        return iteration_id, client.client_id

    def _create_task(self, iteration: ev.IterationRecord, address: str) -> None:
        listed = self.jobs[iteration.job_id].worker_addresses
        if listed and address not in listed:
            return  # a static job runs on its listed workers only
        options = self.jobs[iteration.job_id].options
        # DYNAMIC tasks are numbered and run again exactly once (coordinated reads, served
        # in rounds, are not: a restarted worker serves its rounds afresh)
        numbered = options.processing_mode is ShardingPolicy.DYNAMIC and not options.num_consumers
        task = ev.TaskRecord(self.records.new_id(), iteration.iteration_id, address,
                             incarnation=int(numbered))
        for saved in iteration.resume_workers:  # OFF: the worker's saved position
            if saved.worker_address == address:
                task.seed, task.skip_count = saved.seed, saved.skip_count
        iteration.tasks[address] = task.task_id
        self.records.index_task(task)

    def _resume(self, iteration: ev.IterationRecord, resume: ev.ResumePoint) -> None:
        """Start ``iteration`` where a saved reading stopped. DYNAMIC: the split cursor moves
        to the saved one, and each saved task runs again as a task of its own (adopted by the
        live worker with the fewest tasks), replaying its split answers with its seed and
        skipping what was consumed. OFF: each worker's task skips its saved position.
        Coordinated reads: under OFF as OFF; under DYNAMIC a fresh pass (their tasks are not
        numbered: which elements a round held cannot be told again)."""
        job = self.jobs[iteration.job_id]
        if job.options.processing_mode is not ShardingPolicy.DYNAMIC:
            iteration.resume_workers.extend(resume.tasks)
            return
        if job.options.num_consumers:
            return
        # consumers of a shared job saved at different times: the latest cursor, the longest
        # split answers of each task (both only grow), and what any of them consumed
        if ((resume.split_repetition, resume.split_cursor)
                > (iteration.split_repetition, iteration.split_cursor)):
            iteration.split_repetition = resume.split_repetition
            iteration.split_cursor = resume.split_cursor
        iteration.split_size = max(1, resume.split_size)
        resumed = {self.tasks[t].seed: self.tasks[t] for a, t in iteration.tasks.items()
                   if a.startswith(RESUMED_SLOT)}
        for saved in resume.tasks:
            task = resumed.get(saved.seed)
            if task is not None:
                if len(saved.splits) > len(task.split_log):
                    task.split_log = [
                        ev.SplitsAnswer("", number, answer.repetition, list(answer.splits),
                                        answer.end_of_splits)
                        for number, answer in enumerate(saved.splits, 1)]
                for start, stop in saved.skip:
                    _ranges.add(task.delivered, start, stop)
                    _ranges.add(task.resumed, start, stop)
                continue
            slot = f"{RESUMED_SLOT}{len(iteration.tasks)}"  # a slot of its own
            task = ev.TaskRecord(
                self.records.new_id(), iteration.iteration_id, slot, incarnation=1,
                split_log=[ev.SplitsAnswer("", number, answer.repetition, list(answer.splits),
                                           answer.end_of_splits)
                           for number, answer in enumerate(saved.splits, 1)],
                delivered=list(saved.skip), seed=saved.seed, resumed=list(saved.skip),
                runner=min(self.workers, default=NOBODY,
                           key=lambda a: (len(self.records.worker_tasks.get(a, ())), a)))
            iteration.tasks[slot] = task.task_id
            self.records.index_task(task)

    def resume_point(self, client_id: int) -> tuple[ev.IterationRecord,
                                                     list[ev.TaskRecord]]:
        """The iteration of client ``client_id`` and its tasks, for saving its reading."""
        client = self.clients.get(client_id)
        if client is None:
            raise NotFoundError(
                f"Unknown iteration client id {client_id}: it was released or timed out"
                f"{RESTART_HINT}")
        iteration = self.iterations[client.iteration_id]
        return iteration, [self.tasks[t] for t in sorted(iteration.tasks.values())]

    def iteration_finished(self, iteration: ev.IterationRecord) -> bool:
        return self.records.iteration_finished(iteration)

    def _on_ClientHeartbeat(self, event: ev.ClientHeartbeat) -> ev.ClientView:
        client = self.clients.get(event.client_id)
        if client is None:
            raise NotFoundError(
                f"Unknown iteration client id {event.client_id}: it was released or timed out"
                f"{RESTART_HINT}"
            )
        client.last_seen = event.now
        self.estimate.report_consumer(self.iterations[client.iteration_id].job_id,
                                      client.iteration_id, client.client_id,
                                      event.target_time_s, event.waited_s, event.elapsed_s,
                                      event.now)
        self.runs.record_received(client.iteration_id, event.received)
        for task in self.runs.settled_tasks(event):
            self.runs.settle(task, client.client_id)
        iteration = self.iterations[client.iteration_id]
        tasks = [self.tasks[t] for t in sorted(iteration.tasks.values())]
        views = []
        for t in tasks:
            if not t.finished:
                held_for = self.runs.held_for(t)
                views.append(ev.TaskView(t.task_id, self.records.runner(t) or t.worker_address,
                                         t.incarnation, bool(held_for), held_for))
        return ev.ClientView(views, self.iteration_finished(iteration), iteration.failure)

    def _on_ReleaseClient(self, event: ev.ReleaseClient) -> None:
        client = self.clients.get(event.client_id)
        if client is not None:
            self.runs.record_received(client.iteration_id, event.received)
        self.estimate.forget_consumer(event.client_id)
        self.gc.forget_client(event.client_id)

    # ----- workers ------------------------------------------------------------------------------
    def _on_WorkerHeartbeat(self, event: ev.WorkerHeartbeat) -> ev.WorkerInstructions:
        worker = self.workers.get(event.address)
        if worker is None or worker.uid != event.uid:
            # a new process at a known address: what the old one held is gone
            replaced = [] if worker is None else [
                task for task in self.records.worker_tasks.get(event.address, {}).values()
                if task.incarnation and not task.finished]
            self.workers[event.address] = ev.WorkerRecord(event.address, event.uid, event.now)
            self._assign_unfinished_iterations(event.address)
            self.runs.adopt_waiting(event.address)
            for task in replaced:
                self.runs.run_again(task)
                self.records.count("returned", splits_of(task))
            if worker is not None:
                self.records.count("workers_lost")
        else:
            worker.last_seen = event.now
        self._report_processing(event)
        for task in self._reported_ends(event):
            if not task.finished:
                self.records.count("acknowledged", splits_of(task))
            self.records.finish(task)
        # A new process at the address gets its unfinished tasks again (under OFF it streams
        # its copy afresh; under DYNAMIC it runs the task again, once its clients have
        # reported). A finished task stays finished: its elements were all handed out, and its
        # consumers have stopped reading it.
        assigned = self.records.worker_tasks.get(event.address, {})
        current = set(event.current_tasks)
        # a task starts once its iteration has a consumer, and pauses while it has none
        consumers = self.records.consumers
        new_tasks = [self._assignment(t) for t in assigned.values()
                     if t.task_id not in current and not t.finished and not self.runs.held(t)
                     and t.iteration_id in consumers]
        # finished tasks a worker still runs or reports (this acknowledges the report); tasks
        # it lost when declared lost and came back
        to_delete = sorted(t for t in current if t not in assigned or assigned[t].finished)
        paused = tuple(sorted(t for t in current if t in assigned and not assigned[t].finished
                              and assigned[t].iteration_id not in consumers))
        return ev.WorkerInstructions(new_tasks, to_delete, paused)

    def _report_processing(self, event: ev.WorkerHeartbeat) -> None:
        """Give the estimate the heartbeat's per-task processing times; a running task that
        made nothing since (blocked) keeps its last one."""
        times = dict.fromkeys(event.current_tasks, 0)
        times.update(event.processing)
        for task_id, nanoseconds in times.items():
            task = self.tasks.get(task_id)
            iteration = self.iterations.get(task.iteration_id) if task is not None else None
            if iteration is not None:
                self.estimate.report_task(iteration.job_id, iteration.iteration_id, task_id,
                                          nanoseconds / 1e9, event.now)

    def optimal_workers(self, now: float, job_id: int | None = None) -> int | None:
        """The workers ``job_id`` needs, or (None) the whole fleet; None while unknown."""
        if job_id is not None:
            return self.estimate.job_estimate(job_id, now)
        return self.estimate.fleet_estimate(len(self.workers), now)

    def _reported_ends(self, event: ev.WorkerHeartbeat) -> list[ev.TaskRecord]:
        """The current tasks of the heartbeat's worker that it reports finished (a report of
        any other task is stale: acknowledged, and ignored)."""
        assigned = self.records.worker_tasks.get(event.address, {})
        return [assigned[t] for t in event.finished_tasks if t in assigned]

    def _assign_unfinished_iterations(self, address: str) -> None:
        for iteration in self.iterations.values():
            if (not self.iteration_finished(iteration) and address not in iteration.tasks
                    and adds_tasks(self.jobs[iteration.job_id].fixed_workers,
                                   len(iteration.tasks))):
                self._create_task(iteration, address)

    def _assignment(self, task: ev.TaskRecord) -> ev.TaskAssignment:
        iteration = self.iterations[task.iteration_id]
        job = self.jobs[iteration.job_id]
        if job.worker_addresses:  # static: the worker's place in the fixed list
            index = job.worker_addresses.index(task.worker_address)
            count = len(job.worker_addresses)
        else:
            index = sum(address < task.worker_address for address in iteration.tasks)
            count = len(iteration.tasks)
        return ev.TaskAssignment(task.task_id, task.iteration_id, self.datasets[job.dataset_id],
                                 job.options.processing_mode, index, count, task.incarnation,
                                 tuple(task.delivered), bool(job.options.cross_trainer_cache),
                                 job.options.num_consumers, task.seed, task.skip_count)

    def _on_TaskFinished(self, event: ev.TaskFinished) -> None:
        task = self.known_task(event.task_id)
        if task.worker_address != event.address:
            raise FailedPreconditionError(
                f"Task {event.task_id} belongs to worker {task.worker_address}, not "
                f"{event.address}"
            )
        self.records.finish(task)

    def task_definition(self, task_id: int) -> ev.TaskAssignment:
        return self._assignment(self.known_task(task_id))

    def known_task(self, task_id: int) -> ev.TaskRecord:
        """The task ``task_id``; NotFoundError if the state has none."""
        return self.records.known_task(task_id)

    # ----- the parts' events --------------------------------------------------------------------
    def _on_GetSplits(self, event: ev.GetSplits) -> tuple[list[tuple[int, int]], bool]:
        return self.splits.get_splits(event)

    def _on_CollectGarbage(self, event: ev.CollectGarbage) -> list[str]:
        """Returns the addresses of workers declared lost."""
        return self.gc.collect(event)

    def _on_WorkerLost(self, event: ev.WorkerLost) -> bool:
        """Returns whether the worker was declared lost (it was still that process)."""
        return self.gc.declare_lost(event)

    def _on_StartSave(self, event: ev.StartSave) -> None:
        units = self.dataset(event.dataset_id).num_split_units
        self.snapshots.start(event.path, event.dataset_id, event.compression, units,
                             event.seed)

    def _on_AssignSaveStream(self, event: ev.AssignSaveStream) -> ev.SaveRecord:
        """Returns the save."""
        return self.snapshots.assign(event.path, event.index, event.address, event.uid)

    def _on_GetSaveSplit(self, event: ev.GetSaveSplit) -> tuple[tuple[int, int] | None, bool]:
        return self.snapshots.split(event.path, event.index, event.address, event.repetition,
                                    event.request_number)

    def _on_SaveStreamDone(self, event: ev.SaveStreamDone) -> bool:
        """Returns whether the save is done (and did not fail)."""
        return self.snapshots.stream_done(event.path, event.index, event.address, event.error)

    def silent_clients(self, now: float, timeout: float, since: float = 0.0
                       ) -> tuple[int, ...]:
        return self.gc.silent_clients(now, timeout, since)

    def silent_workers(self, now: float, timeout: float, since: float = 0.0
                       ) -> tuple[str, ...]:
        return self.gc.silent_workers(now, timeout, since)


_HANDLERS: Handlers[DispatcherState, Any] = Handlers(DispatcherState, ev.Event)
