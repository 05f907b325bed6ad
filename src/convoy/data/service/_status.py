"""The dispatcher's ``GetStatus`` answer: what ``convoy status`` shows, read from the state.

Read-only: it looks at the records of :class:`~._dispatcher.state.DispatcherState` (under the
dispatcher's lock) and at what workers last reported of their buffers, and changes nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from convoy.data.service import service_pb2 as pb
from convoy.data.service._common.config import ShardingPolicy, policy_name
from convoy.data.service._dispatcher import events as ev
from convoy.data.service._dispatcher.state import DispatcherState


def status(state: DispatcherState, now: float, buffered: Mapping[str, tuple[int, int]],
           uptime_s: float) -> pb.GetStatusResponse:
    """The status of ``state`` at ``now``; ``buffered`` maps a worker's address to the
    (elements, bytes) its last heartbeat reported."""
    records = state.records
    workers = [pb.WorkerStatus(address=w.address, last_heartbeat_s=max(0.0, now - w.last_seen),
                               tasks=sorted(records.worker_tasks.get(w.address, {})),
                               buffered_elements=buffered.get(w.address, (0, 0))[0],
                               buffered_bytes=buffered.get(w.address, (0, 0))[1])
               for w in sorted(state.workers.values(), key=lambda w: w.address)]
    datasets = [pb.DatasetStatus(dataset_id=d.dataset_id, cardinality=d.cardinality,
                                 num_split_units=d.num_split_units, compression=d.compression)
                for d in state.datasets.values()]
    consumers = Counter(client.iteration_id for client in state.clients.values())
    by_job: dict[int, list[pb.IterationStatus]] = {}
    for iteration in state.iterations.values():
        job = state.jobs[iteration.job_id]
        by_job.setdefault(job.job_id, []).append(
            _iteration(state, job, iteration, consumers[iteration.iteration_id]))
    jobs = [pb.JobStatus(job_id=job.job_id, name=job.name, dataset_id=job.dataset_id,
                         policy=policy_name(job.options.processing_mode),
                         num_consumers=job.options.num_consumers,
                         iterations=by_job.get(job.job_id, []),
                         optimal_workers=state.optimal_workers(now, job.job_id) or 0)
            for job in state.jobs.values()]
    waited = state.estimate.wait_fraction(now)
    return pb.GetStatusResponse(workers=workers, datasets=datasets, jobs=jobs,
                                uptime_s=uptime_s,
                                optimal_workers=state.optimal_workers(now) or 0,
                                consumer_wait_fraction=-1.0 if waited is None else waited)


def _iteration(state: DispatcherState, job: ev.JobRecord, iteration: ev.IterationRecord,
               consumers: int) -> pb.IterationStatus:
    current = [state.tasks[t] for t in iteration.tasks.values()]
    lost = [state.tasks[t] for t in state.records.lost_tasks.get(iteration.iteration_id, [])]
    handed_out = sum(task_splits(task) for task in current + lost)
    # a current task is finished once its end was acknowledged (a lost one, when lost)
    acknowledged = sum(task_splits(task) for task in current if task.finished)
    dynamic = job.options.processing_mode is ShardingPolicy.DYNAMIC
    served = (sum(stop - start for task in current for start, stop in task.delivered)
              if dynamic and any(task.incarnation for task in current) else -1)
    return pb.IterationStatus(iteration_id=iteration.iteration_id,
                              repetition=iteration.repetition, consumers=consumers,
                              tasks=sorted(iteration.tasks.values()),
                              splits_handed_out=handed_out, splits_acknowledged=acknowledged,
                              elements_served=served,
                              finished=state.iteration_finished(iteration))


def task_splits(task: ev.TaskRecord) -> int:
    """How many splits ``task`` was handed (of an older worker's task: its latest answer's)."""
    if not task.split_log and task.last_splits is not None:
        return len(task.last_splits.splits)
    return sum(len(answer.splits) for answer in task.split_log)
