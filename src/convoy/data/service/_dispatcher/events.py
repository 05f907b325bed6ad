"""The dispatcher's vocabulary: the records it keeps, the events that change them, the results.

Everything here is plain data: frozen dataclasses for events and results, mutable ones for
records. :data:`EVENTS` names each event kind as the journal writes it; those names are part of
the journal's format and must not change (add a kind instead).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from convoy.data.service._common.config import ShardingPolicy, policy_name

#: Added to "not found" errors for ids a client or worker got from a dispatcher.
RESTART_HINT = ("; the dispatcher may have restarted without fault_tolerant_mode, losing its "
                "jobs")


# ----- records -----------------------------------------------------------------------------------
@dataclass(slots=True)
class DatasetRecord:
    dataset_id: str
    fingerprint: str
    payload: bytes
    compression: str
    element_spec: bytes
    cardinality: int
    num_split_units: int


#: JobOptions.cross_trainer_cache of a job read through the cross-trainer cache.
CACHE_ENABLED = "enabled"


@dataclass(frozen=True, slots=True)
class JobOptions:
    processing_mode: ShardingPolicy
    num_consumers: int = 0
    target_workers: str = "AUTO"
    cross_trainer_cache: str = ""

    def describe(self) -> str:
        return (f"processing mode {policy_name(self.processing_mode)}, num_consumers "
                f"{self.num_consumers}, target_workers {self.target_workers}, cross-trainer cache "
                f"{'on' if self.cross_trainer_cache else 'off'}")


@dataclass(slots=True)
class JobRecord:
    job_id: int
    name: str
    dataset_id: str
    options: JobOptions
    worker_addresses: tuple[str, ...] = ()  # a static job's fixed workers, by index
    #: A coordinated read's: its iterations keep the workers they got first.
    fixed_workers: bool = False


@dataclass(frozen=True, slots=True)
class ResumeTask:
    """A task of a saved reading, to run again: with its seed, replaying its split answers
    (DYNAMIC) and skipping the element numbers ``skip``, or its first ``skip_count`` elements
    (OFF, on the worker at ``worker_address``)."""

    seed: int
    worker_address: str = ""
    splits: tuple[SplitsAnswer, ...] = ()
    skip: tuple[tuple[int, int], ...] = ()
    skip_count: int = 0


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """Where a saved reading stopped: the split cursor and the tasks to run again."""

    split_repetition: int = 0
    split_cursor: int = 0
    split_size: int = 1
    tasks: tuple[ResumeTask, ...] = ()
    consumers: int = 1  # of the shared job that saved it: the iteration waits for them all
    round_index: int = 0  # coordinated reads: the round every consumer resumes at


@dataclass(slots=True)
class IterationRecord:
    iteration_id: int
    job_id: int
    repetition: int
    tasks: dict[str, int] = field(default_factory=dict)  # worker address -> task id
    split_repetition: int = 0
    split_cursor: int = 0
    split_size: int = 1
    idle_since: float | None = None  # when garbage collection first saw it without clients
    #: Every task has ended: its tasks and splits are dropped, and what stays is this record
    #: (a tombstone: reopening the iteration reads nothing, as in TensorFlow).
    finished: bool = False
    #: OFF: the saved positions of the workers of a resumed reading, by worker address.
    resume_workers: list[ResumeTask] = field(default_factory=list)
    #: Consumers of a resumed shared job still to join with their states: it starts after.
    resume_awaiting: int = 0
    resume_joined: int = 0  # consumers that joined it with their states
    resume_round: int = 0  # coordinated reads: the round its consumers resume at
    #: Non-empty: the iteration cannot go on, and its consumers fail with this message.
    failure: str = ""


@dataclass(slots=True)
class SplitsAnswer:
    """The answer to a task's latest GetSplits request, kept to answer it again if sent
    again (the first answer may have been lost in flight)."""

    worker_uid: str
    request_number: int
    repetition: int
    splits: list[tuple[int, int]]
    end_of_splits: bool


@dataclass(slots=True)
class TaskRecord:
    task_id: int
    iteration_id: int
    worker_address: str
    finished: bool = False
    last_splits: SplitsAnswer | None = None  # tasks of older versions (incarnation 0) only
    #: DYNAMIC tasks count their runs from 1: a worker process restarted at the task's address
    #: runs it again, replaying ``split_log`` and skipping ``delivered`` (0: a task of an older
    #: version, run again without replay).
    incarnation: int = 0
    split_log: list[SplitsAnswer] = field(default_factory=list)  # every answer, in order
    #: Sequence numbers of the task's elements that its consumers have reported receiving.
    delivered: list[tuple[int, int]] = field(default_factory=list)
    #: Clients whose report is awaited before the current run may start (an empty list: it
    #: may): each may have received elements of the previous run that it has not reported.
    awaiting: list[int] = field(default_factory=list)
    #: Who runs it: None, the worker at ``worker_address``; else the address of the worker
    #: that adopted it when that one was lost ("": none yet).
    runner: str | None = None
    seed: int = 0  # the seed its ops draw (0: its id); a resumed task keeps the saved one
    skip_count: int = 0  # OFF: elements skipped at the start (a resumed position)
    resumed: list[tuple[int, int]] = field(default_factory=list)  # the skip it started with


@dataclass(slots=True)
class WorkerRecord:
    address: str
    uid: str
    last_seen: float


@dataclass(slots=True)
class ClientRecord:
    client_id: int
    iteration_id: int
    last_seen: float


@dataclass(slots=True)
class SaveAnswer:
    """The answer to one split request of a stream of a distributed save: the units
    ``[start, stop)`` of pass ``repetition``, or the end of that pass."""

    repetition: int
    start: int = 0
    stop: int = 0
    end_of_splits: bool = False


@dataclass(slots=True)
class SaveStream:
    index: int
    owner: str  # worker address
    owner_uid: str
    answers: list[SaveAnswer] = field(default_factory=list)  # by request number, from 1
    done: bool = False


@dataclass(slots=True)
class SaveRecord:
    """A ``distributed_save`` in progress or ended: its streams and the cursor of its
    splits."""

    path: str
    dataset_id: str
    compression: str
    units: int
    seed: int
    split_size: int
    streams: list[SaveStream] = field(default_factory=list)
    repetition: int = 0
    cursor: int = 0
    error: str = ""

    @property
    def done(self) -> bool:
        return bool(self.streams) and all(s.done for s in self.streams)


@dataclass
class SavedState:
    """Everything the dispatcher holds but its indexes, which are rebuilt from it."""

    next_id: int
    next_dataset_id: int
    datasets: list[DatasetRecord]
    jobs: list[JobRecord]
    iterations: list[IterationRecord]
    tasks: list[TaskRecord]
    workers: list[WorkerRecord]
    clients: list[ClientRecord]
    saves: list[SaveRecord] = field(default_factory=list)  # journals of older versions: none
    #: Records.counts (journals of older versions: none, counting from 0)
    counts: dict[str, int] = field(default_factory=dict)


# ----- events ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RegisterDataset:
    fingerprint: str
    payload: bytes
    compression: str
    element_spec: bytes
    cardinality: int
    num_split_units: int
    requested_id: str = ""


@dataclass(frozen=True)
class GetOrCreateJob:
    dataset_id: str
    job_name: str
    options: JobOptions
    #: The dispatcher's configured worker list, which a static job keeps.
    worker_addresses: tuple[str, ...] = ()
    #: Apply the rules of coordinated reads: refuse a finite dataset, keep each iteration's
    #: first workers. (Journals of older versions, which did not serve them, lack it: False.)
    coordinated_rules: bool = False


@dataclass(frozen=True)
class GetOrCreateIteration:
    job_id: int
    repetition: int
    now: float
    resume: ResumePoint | None = None  # a new iteration starts where a saved reading stopped


@dataclass(frozen=True)
class ClientHeartbeat:
    client_id: int
    now: float
    #: ``(task id, run)``: the client has no call in flight to an earlier run of the task,
    #: and ``received`` holds all it got from it.
    settled: tuple[tuple[int, int], ...] = ()
    #: ``(task id, start, stop)``: sequence numbers of elements the client received.
    received: tuple[tuple[int, int, int], ...] = ()
    #: The consumer's time per element when not waiting (0: unknown), and how long it waited
    #: of the ``elapsed_s`` seconds since its last report (for the worker estimate).
    target_time_s: float = 0.0
    waited_s: float = 0.0
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class ReleaseClient:
    client_id: int
    received: tuple[tuple[int, int, int], ...] = ()  # as in ClientHeartbeat


@dataclass(frozen=True)
class WorkerHeartbeat:
    address: str
    uid: str
    current_tasks: tuple[int, ...]
    now: float
    #: Tasks of this worker whose end a consumer has found.
    finished_tasks: tuple[int, ...] = ()
    #: ``(task id, nanoseconds per element)``: its pipelines' time per element when not
    #: blocked (integers: the journal's tuples hold one type).
    processing: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class TaskFinished:
    """A task's end, reported on its own (journals of older versions hold these; workers
    now report ends in :class:`WorkerHeartbeat`)."""

    address: str
    task_id: int


@dataclass(frozen=True)
class GetSplits:
    """A request for splits. With a ``task_id`` (0 in journals of older versions: no
    answer kept) it is answered once per ``(worker_uid, request_number)``: the same request
    again gets the same answer."""

    iteration_id: int
    repetition: int
    max_splits: int
    task_id: int = 0
    worker_uid: str = ""
    request_number: int = 0
    #: The asking run of the task (0: a worker of an older version; its task's latest answer
    #: only is kept, per worker process).
    incarnation: int = 0


@dataclass(frozen=True)
class CollectGarbage:
    """Forget silent clients and workers (a lost worker's tasks are over: what it held is
    lost): those named in ``clients`` and ``workers``, else those silent for
    ``client_timeout`` and ``worker_timeout``. Heartbeats that only move a last-seen time are
    not journaled, so the dispatcher names them (:meth:`DispatcherState.silent_clients`,
    ``silent_workers``) and replay drops exactly the same."""

    now: float
    client_timeout: float
    worker_timeout: float
    clients: tuple[int, ...] | None = None
    workers: tuple[str, ...] | None = None
    #: Forget iterations without clients for this long (None: never). A consumer asking for
    #: a forgotten iteration again gets a new one, as in TensorFlow.
    iteration_timeout: float | None = None
    #: Keep unfinished iterations of named DYNAMIC jobs however long they are idle (the
    #: dispatcher no longer asks for it: TensorFlow collects them, and reopening starts afresh).
    keep_dynamic: bool = False
    #: A lost worker's unfinished DYNAMIC tasks are adopted by other workers and run again
    #: (journals of older versions, whose lost tasks ended, lack it: False).
    adopt: bool = False


@dataclass(frozen=True)
class WorkerLost:
    """The worker process ``uid`` at ``address`` is gone before its timeout (a consumer could
    not reach it, and neither could the dispatcher), or left (it drained and deregistered):
    declared lost at once, as by :class:`CollectGarbage` with ``adopt``. Ignored if another
    process (or none) is registered at ``address`` by then."""

    address: str
    uid: str
    left: bool = False  # it drained and deregistered: counted apart from the lost


@dataclass(frozen=True)
class StartSave:
    """``distributed_save`` of dataset ``dataset_id`` to ``path`` starts."""

    path: str
    dataset_id: str
    compression: str
    seed: int


@dataclass(frozen=True)
class AssignSaveStream:
    """The worker process ``uid`` at ``address`` writes stream ``index`` of the save at
    ``path``: a new stream if ``index`` is the save's stream count, else one whose worker was
    lost (its owner is replaced)."""

    path: str
    index: int
    address: str
    uid: str


@dataclass(frozen=True)
class GetSaveSplit:
    """Request ``request_number`` (from 1) of stream ``index`` of the save at ``path``, for
    pass ``repetition``: answered again as before if asked again."""

    path: str
    index: int
    address: str
    repetition: int
    request_number: int


@dataclass(frozen=True)
class SaveStreamDone:
    """Stream ``index`` of the save at ``path`` wrote all its elements, or failed
    (``error``)."""

    path: str
    index: int
    address: str
    error: str = ""


#: Every event kind by the name the journal writes for it (spelled out: renaming a class
#: must not rename its records).
EVENTS: dict[str, type] = {
    "RegisterDataset": RegisterDataset,
    "GetOrCreateJob": GetOrCreateJob,
    "GetOrCreateIteration": GetOrCreateIteration,
    "ClientHeartbeat": ClientHeartbeat,
    "ReleaseClient": ReleaseClient,
    "WorkerHeartbeat": WorkerHeartbeat,
    "TaskFinished": TaskFinished,
    "GetSplits": GetSplits,
    "CollectGarbage": CollectGarbage,
    "WorkerLost": WorkerLost,
    "StartSave": StartSave,
    "AssignSaveStream": AssignSaveStream,
    "GetSaveSplit": GetSaveSplit,
    "SaveStreamDone": SaveStreamDone,
}


#: Any event of the dispatcher.
Event = (RegisterDataset | GetOrCreateJob | GetOrCreateIteration | ClientHeartbeat | ReleaseClient
         | WorkerHeartbeat | TaskFinished | GetSplits | CollectGarbage | WorkerLost
         | StartSave | AssignSaveStream | GetSaveSplit | SaveStreamDone)


# ----- results -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class TaskAssignment:
    task_id: int
    iteration_id: int
    dataset: DatasetRecord
    processing_mode: ShardingPolicy
    worker_index: int
    num_workers: int
    incarnation: int = 0
    skip: tuple[tuple[int, int], ...] = ()  # sequence numbers its consumers already have
    cross_trainer_cache: bool = False
    num_consumers: int = 0  # of a coordinated read
    seed: int = 0  # the seed its ops draw (0: the task id)
    skip_count: int = 0  # OFF: elements skipped at the start


@dataclass(frozen=True)
class WorkerInstructions:
    new_tasks: list[TaskAssignment]
    tasks_to_delete: list[int]
    #: The worker's running tasks whose iteration has no consumer: they produce nothing new
    #: (keeping what they buffered) until one joins.
    paused: tuple[int, ...] = ()


@dataclass(frozen=True)
class TaskView:
    task_id: int
    worker_address: str
    incarnation: int = 0
    held: bool = False  # run again soon: not to be read until the clients have reported
    #: What a held run waits for, in words (for the consumer's error); not part of the view's
    #: identity.
    held_for: str = field(default="", compare=False)


@dataclass(frozen=True)
class ClientView:
    tasks: list[TaskView]  # the unfinished tasks
    iteration_finished: bool
    failure: str = ""  # the iteration cannot go on: why
