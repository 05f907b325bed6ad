from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RegisterDatasetRequest(_message.Message):
    __slots__ = ("dataset", "dataset_id", "fingerprint", "compression", "element_spec", "cardinality", "num_split_units")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    ELEMENT_SPEC_FIELD_NUMBER: _ClassVar[int]
    CARDINALITY_FIELD_NUMBER: _ClassVar[int]
    NUM_SPLIT_UNITS_FIELD_NUMBER: _ClassVar[int]
    dataset: bytes
    dataset_id: str
    fingerprint: str
    compression: str
    element_spec: bytes
    cardinality: int
    num_split_units: int
    def __init__(self, dataset: _Optional[bytes] = ..., dataset_id: _Optional[str] = ..., fingerprint: _Optional[str] = ..., compression: _Optional[str] = ..., element_spec: _Optional[bytes] = ..., cardinality: _Optional[int] = ..., num_split_units: _Optional[int] = ...) -> None: ...

class RegisterDatasetResponse(_message.Message):
    __slots__ = ("dataset_id",)
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    def __init__(self, dataset_id: _Optional[str] = ...) -> None: ...

class GetDatasetInfoRequest(_message.Message):
    __slots__ = ("dataset_id",)
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    def __init__(self, dataset_id: _Optional[str] = ...) -> None: ...

class GetDatasetInfoResponse(_message.Message):
    __slots__ = ("element_spec", "compression", "cardinality")
    ELEMENT_SPEC_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    CARDINALITY_FIELD_NUMBER: _ClassVar[int]
    element_spec: bytes
    compression: str
    cardinality: int
    def __init__(self, element_spec: _Optional[bytes] = ..., compression: _Optional[str] = ..., cardinality: _Optional[int] = ...) -> None: ...

class JobOptions(_message.Message):
    __slots__ = ("processing_mode", "num_consumers", "target_workers", "cross_trainer_cache")
    PROCESSING_MODE_FIELD_NUMBER: _ClassVar[int]
    NUM_CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    TARGET_WORKERS_FIELD_NUMBER: _ClassVar[int]
    CROSS_TRAINER_CACHE_FIELD_NUMBER: _ClassVar[int]
    processing_mode: str
    num_consumers: int
    target_workers: str
    cross_trainer_cache: str
    def __init__(self, processing_mode: _Optional[str] = ..., num_consumers: _Optional[int] = ..., target_workers: _Optional[str] = ..., cross_trainer_cache: _Optional[str] = ...) -> None: ...

class GetOrCreateJobRequest(_message.Message):
    __slots__ = ("dataset_id", "job_name", "options")
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    job_name: str
    options: JobOptions
    def __init__(self, dataset_id: _Optional[str] = ..., job_name: _Optional[str] = ..., options: _Optional[_Union[JobOptions, _Mapping]] = ...) -> None: ...

class GetOrCreateJobResponse(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    def __init__(self, job_id: _Optional[int] = ...) -> None: ...

class GetOrCreateIterationRequest(_message.Message):
    __slots__ = ("job_id", "repetition", "resume")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REPETITION_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    repetition: int
    resume: ResumePoint
    def __init__(self, job_id: _Optional[int] = ..., repetition: _Optional[int] = ..., resume: _Optional[_Union[ResumePoint, _Mapping]] = ...) -> None: ...

class GetOrCreateIterationResponse(_message.Message):
    __slots__ = ("iteration_id", "client_id", "iteration_finished")
    ITERATION_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FINISHED_FIELD_NUMBER: _ClassVar[int]
    iteration_id: int
    client_id: int
    iteration_finished: bool
    def __init__(self, iteration_id: _Optional[int] = ..., client_id: _Optional[int] = ..., iteration_finished: _Optional[bool] = ...) -> None: ...

class TaskInfo(_message.Message):
    __slots__ = ("task_id", "worker_address", "incarnation", "held", "held_for")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    HELD_FOR_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    worker_address: str
    incarnation: int
    held: bool
    held_for: str
    def __init__(self, task_id: _Optional[int] = ..., worker_address: _Optional[str] = ..., incarnation: _Optional[int] = ..., held: _Optional[bool] = ..., held_for: _Optional[str] = ...) -> None: ...

class TaskRun(_message.Message):
    __slots__ = ("task_id", "incarnation")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    incarnation: int
    def __init__(self, task_id: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class TaskRange(_message.Message):
    __slots__ = ("task_id", "start", "stop")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    start: int
    stop: int
    def __init__(self, task_id: _Optional[int] = ..., start: _Optional[int] = ..., stop: _Optional[int] = ...) -> None: ...

class ClientHeartbeatRequest(_message.Message):
    __slots__ = ("client_id", "settled", "received", "target_processing_time_s", "waited_s", "elapsed_s")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SETTLED_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    TARGET_PROCESSING_TIME_S_FIELD_NUMBER: _ClassVar[int]
    WAITED_S_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    client_id: int
    settled: _containers.RepeatedCompositeFieldContainer[TaskRun]
    received: _containers.RepeatedCompositeFieldContainer[TaskRange]
    target_processing_time_s: float
    waited_s: float
    elapsed_s: float
    def __init__(self, client_id: _Optional[int] = ..., settled: _Optional[_Iterable[_Union[TaskRun, _Mapping]]] = ..., received: _Optional[_Iterable[_Union[TaskRange, _Mapping]]] = ..., target_processing_time_s: _Optional[float] = ..., waited_s: _Optional[float] = ..., elapsed_s: _Optional[float] = ...) -> None: ...

class ClientHeartbeatResponse(_message.Message):
    __slots__ = ("tasks", "iteration_finished", "iteration_failed")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FINISHED_FIELD_NUMBER: _ClassVar[int]
    ITERATION_FAILED_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskInfo]
    iteration_finished: bool
    iteration_failed: str
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskInfo, _Mapping]]] = ..., iteration_finished: _Optional[bool] = ..., iteration_failed: _Optional[str] = ...) -> None: ...

class SplitAnswer(_message.Message):
    __slots__ = ("repetition", "splits", "end_of_splits")
    REPETITION_FIELD_NUMBER: _ClassVar[int]
    SPLITS_FIELD_NUMBER: _ClassVar[int]
    END_OF_SPLITS_FIELD_NUMBER: _ClassVar[int]
    repetition: int
    splits: _containers.RepeatedCompositeFieldContainer[Split]
    end_of_splits: bool
    def __init__(self, repetition: _Optional[int] = ..., splits: _Optional[_Iterable[_Union[Split, _Mapping]]] = ..., end_of_splits: _Optional[bool] = ...) -> None: ...

class ResumeTask(_message.Message):
    __slots__ = ("seed", "worker_address", "splits", "skip", "skip_count")
    SEED_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SPLITS_FIELD_NUMBER: _ClassVar[int]
    SKIP_FIELD_NUMBER: _ClassVar[int]
    SKIP_COUNT_FIELD_NUMBER: _ClassVar[int]
    seed: int
    worker_address: str
    splits: _containers.RepeatedCompositeFieldContainer[SplitAnswer]
    skip: _containers.RepeatedCompositeFieldContainer[Split]
    skip_count: int
    def __init__(self, seed: _Optional[int] = ..., worker_address: _Optional[str] = ..., splits: _Optional[_Iterable[_Union[SplitAnswer, _Mapping]]] = ..., skip: _Optional[_Iterable[_Union[Split, _Mapping]]] = ..., skip_count: _Optional[int] = ...) -> None: ...

class ResumePoint(_message.Message):
    __slots__ = ("split_repetition", "split_cursor", "split_size", "tasks", "consumers", "round_index")
    SPLIT_REPETITION_FIELD_NUMBER: _ClassVar[int]
    SPLIT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    SPLIT_SIZE_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    ROUND_INDEX_FIELD_NUMBER: _ClassVar[int]
    split_repetition: int
    split_cursor: int
    split_size: int
    tasks: _containers.RepeatedCompositeFieldContainer[ResumeTask]
    consumers: int
    round_index: int
    def __init__(self, split_repetition: _Optional[int] = ..., split_cursor: _Optional[int] = ..., split_size: _Optional[int] = ..., tasks: _Optional[_Iterable[_Union[ResumeTask, _Mapping]]] = ..., consumers: _Optional[int] = ..., round_index: _Optional[int] = ...) -> None: ...

class GetResumePointRequest(_message.Message):
    __slots__ = ("client_id",)
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    client_id: int
    def __init__(self, client_id: _Optional[int] = ...) -> None: ...

class ResumeTaskInfo(_message.Message):
    __slots__ = ("task_id", "task")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    task: ResumeTask
    def __init__(self, task_id: _Optional[int] = ..., task: _Optional[_Union[ResumeTask, _Mapping]] = ...) -> None: ...

class GetResumePointResponse(_message.Message):
    __slots__ = ("split_repetition", "split_cursor", "split_size", "tasks", "consumers", "iteration_id")
    SPLIT_REPETITION_FIELD_NUMBER: _ClassVar[int]
    SPLIT_CURSOR_FIELD_NUMBER: _ClassVar[int]
    SPLIT_SIZE_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    ITERATION_ID_FIELD_NUMBER: _ClassVar[int]
    split_repetition: int
    split_cursor: int
    split_size: int
    tasks: _containers.RepeatedCompositeFieldContainer[ResumeTaskInfo]
    consumers: int
    iteration_id: int
    def __init__(self, split_repetition: _Optional[int] = ..., split_cursor: _Optional[int] = ..., split_size: _Optional[int] = ..., tasks: _Optional[_Iterable[_Union[ResumeTaskInfo, _Mapping]]] = ..., consumers: _Optional[int] = ..., iteration_id: _Optional[int] = ...) -> None: ...

class ReleaseClientRequest(_message.Message):
    __slots__ = ("client_id", "received")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    client_id: int
    received: _containers.RepeatedCompositeFieldContainer[TaskRange]
    def __init__(self, client_id: _Optional[int] = ..., received: _Optional[_Iterable[_Union[TaskRange, _Mapping]]] = ...) -> None: ...

class TaskDef(_message.Message):
    __slots__ = ("task_id", "iteration_id", "dataset_id", "dataset", "processing_mode", "compression", "worker_index", "num_workers", "num_consumers", "cross_trainer_cache", "incarnation", "skip", "seed", "skip_count")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ITERATION_ID_FIELD_NUMBER: _ClassVar[int]
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    PROCESSING_MODE_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    WORKER_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    NUM_CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    CROSS_TRAINER_CACHE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SKIP_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SKIP_COUNT_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    iteration_id: int
    dataset_id: str
    dataset: bytes
    processing_mode: str
    compression: str
    worker_index: int
    num_workers: int
    num_consumers: int
    cross_trainer_cache: bool
    incarnation: int
    skip: _containers.RepeatedCompositeFieldContainer[Split]
    seed: int
    skip_count: int
    def __init__(self, task_id: _Optional[int] = ..., iteration_id: _Optional[int] = ..., dataset_id: _Optional[str] = ..., dataset: _Optional[bytes] = ..., processing_mode: _Optional[str] = ..., compression: _Optional[str] = ..., worker_index: _Optional[int] = ..., num_workers: _Optional[int] = ..., num_consumers: _Optional[int] = ..., cross_trainer_cache: _Optional[bool] = ..., incarnation: _Optional[int] = ..., skip: _Optional[_Iterable[_Union[Split, _Mapping]]] = ..., seed: _Optional[int] = ..., skip_count: _Optional[int] = ...) -> None: ...

class WorkerHeartbeatRequest(_message.Message):
    __slots__ = ("worker_address", "worker_uid", "current_tasks", "finished_tasks", "buffered_elements", "buffered_bytes", "processing")
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WORKER_UID_FIELD_NUMBER: _ClassVar[int]
    CURRENT_TASKS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_TASKS_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROCESSING_FIELD_NUMBER: _ClassVar[int]
    worker_address: str
    worker_uid: str
    current_tasks: _containers.RepeatedScalarFieldContainer[int]
    finished_tasks: _containers.RepeatedScalarFieldContainer[int]
    buffered_elements: int
    buffered_bytes: int
    processing: _containers.RepeatedCompositeFieldContainer[TaskProcessing]
    def __init__(self, worker_address: _Optional[str] = ..., worker_uid: _Optional[str] = ..., current_tasks: _Optional[_Iterable[int]] = ..., finished_tasks: _Optional[_Iterable[int]] = ..., buffered_elements: _Optional[int] = ..., buffered_bytes: _Optional[int] = ..., processing: _Optional[_Iterable[_Union[TaskProcessing, _Mapping]]] = ...) -> None: ...

class TaskProcessing(_message.Message):
    __slots__ = ("task_id", "seconds_per_element")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SECONDS_PER_ELEMENT_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    seconds_per_element: float
    def __init__(self, task_id: _Optional[int] = ..., seconds_per_element: _Optional[float] = ...) -> None: ...

class WorkerHeartbeatResponse(_message.Message):
    __slots__ = ("new_tasks", "tasks_to_delete", "paused_tasks")
    NEW_TASKS_FIELD_NUMBER: _ClassVar[int]
    TASKS_TO_DELETE_FIELD_NUMBER: _ClassVar[int]
    PAUSED_TASKS_FIELD_NUMBER: _ClassVar[int]
    new_tasks: _containers.RepeatedCompositeFieldContainer[TaskDef]
    tasks_to_delete: _containers.RepeatedScalarFieldContainer[int]
    paused_tasks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, new_tasks: _Optional[_Iterable[_Union[TaskDef, _Mapping]]] = ..., tasks_to_delete: _Optional[_Iterable[int]] = ..., paused_tasks: _Optional[_Iterable[int]] = ...) -> None: ...

class Split(_message.Message):
    __slots__ = ("start", "stop")
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    start: int
    stop: int
    def __init__(self, start: _Optional[int] = ..., stop: _Optional[int] = ...) -> None: ...

class GetSplitsRequest(_message.Message):
    __slots__ = ("iteration_id", "repetition", "max_splits", "task_id", "worker_uid", "request_number", "incarnation")
    ITERATION_ID_FIELD_NUMBER: _ClassVar[int]
    REPETITION_FIELD_NUMBER: _ClassVar[int]
    MAX_SPLITS_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_UID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_NUMBER_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    iteration_id: int
    repetition: int
    max_splits: int
    task_id: int
    worker_uid: str
    request_number: int
    incarnation: int
    def __init__(self, iteration_id: _Optional[int] = ..., repetition: _Optional[int] = ..., max_splits: _Optional[int] = ..., task_id: _Optional[int] = ..., worker_uid: _Optional[str] = ..., request_number: _Optional[int] = ..., incarnation: _Optional[int] = ...) -> None: ...

class GetSplitsResponse(_message.Message):
    __slots__ = ("splits", "end_of_splits")
    SPLITS_FIELD_NUMBER: _ClassVar[int]
    END_OF_SPLITS_FIELD_NUMBER: _ClassVar[int]
    splits: _containers.RepeatedCompositeFieldContainer[Split]
    end_of_splits: bool
    def __init__(self, splits: _Optional[_Iterable[_Union[Split, _Mapping]]] = ..., end_of_splits: _Optional[bool] = ...) -> None: ...

class SharedMemoryReader(_message.Message):
    __slots__ = ("host", "pid", "pid_start", "reader_id")
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    PID_START_FIELD_NUMBER: _ClassVar[int]
    READER_ID_FIELD_NUMBER: _ClassVar[int]
    host: str
    pid: int
    pid_start: int
    reader_id: str
    def __init__(self, host: _Optional[str] = ..., pid: _Optional[int] = ..., pid_start: _Optional[int] = ..., reader_id: _Optional[str] = ...) -> None: ...

class GetElementsRequest(_message.Message):
    __slots__ = ("task_id", "consumer_index", "max_elements", "max_bytes", "round_index", "round_timeout_ms", "reader_id", "trainer_id", "incarnation", "shared_memory", "released_segments")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_INDEX_FIELD_NUMBER: _ClassVar[int]
    MAX_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    ROUND_INDEX_FIELD_NUMBER: _ClassVar[int]
    ROUND_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    READER_ID_FIELD_NUMBER: _ClassVar[int]
    TRAINER_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SHARED_MEMORY_FIELD_NUMBER: _ClassVar[int]
    RELEASED_SEGMENTS_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    consumer_index: int
    max_elements: int
    max_bytes: int
    round_index: int
    round_timeout_ms: int
    reader_id: int
    trainer_id: str
    incarnation: int
    shared_memory: SharedMemoryReader
    released_segments: _containers.RepeatedCompositeFieldContainer[ReleasedSegment]
    def __init__(self, task_id: _Optional[int] = ..., consumer_index: _Optional[int] = ..., max_elements: _Optional[int] = ..., max_bytes: _Optional[int] = ..., round_index: _Optional[int] = ..., round_timeout_ms: _Optional[int] = ..., reader_id: _Optional[int] = ..., trainer_id: _Optional[str] = ..., incarnation: _Optional[int] = ..., shared_memory: _Optional[_Union[SharedMemoryReader, _Mapping]] = ..., released_segments: _Optional[_Iterable[_Union[ReleasedSegment, _Mapping]]] = ...) -> None: ...

class GiveBackRequest(_message.Message):
    __slots__ = ("task_id", "incarnation", "elements", "numbers")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    NUMBERS_FIELD_NUMBER: _ClassVar[int]
    task_id: int
    incarnation: int
    elements: bytes
    numbers: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, task_id: _Optional[int] = ..., incarnation: _Optional[int] = ..., elements: _Optional[bytes] = ..., numbers: _Optional[_Iterable[int]] = ...) -> None: ...

class ReleasedSegment(_message.Message):
    __slots__ = ("name", "handout")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HANDOUT_FIELD_NUMBER: _ClassVar[int]
    name: str
    handout: int
    def __init__(self, name: _Optional[str] = ..., handout: _Optional[int] = ...) -> None: ...

class ShareRequest(_message.Message):
    __slots__ = ("key", "world_size", "rank", "workers", "worker", "pad", "fetched", "yielded", "wants", "exhausted", "given", "given_start", "received", "done", "first", "timeout_ms", "full", "error", "reader", "generation", "allowed", "settled", "mixed", "discarded", "candidates", "frozen", "total", "share", "claims", "gifts", "firsts")
    KEY_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    PAD_FIELD_NUMBER: _ClassVar[int]
    FETCHED_FIELD_NUMBER: _ClassVar[int]
    YIELDED_FIELD_NUMBER: _ClassVar[int]
    WANTS_FIELD_NUMBER: _ClassVar[int]
    EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    GIVEN_FIELD_NUMBER: _ClassVar[int]
    GIVEN_START_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    FIRST_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    READER_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    SETTLED_FIELD_NUMBER: _ClassVar[int]
    MIXED_FIELD_NUMBER: _ClassVar[int]
    DISCARDED_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    FROZEN_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    CLAIMS_FIELD_NUMBER: _ClassVar[int]
    GIFTS_FIELD_NUMBER: _ClassVar[int]
    FIRSTS_FIELD_NUMBER: _ClassVar[int]
    key: str
    world_size: int
    rank: int
    workers: int
    worker: int
    pad: bool
    fetched: int
    yielded: int
    wants: bool
    exhausted: bool
    given: _containers.RepeatedScalarFieldContainer[bytes]
    given_start: int
    received: int
    done: bool
    first: bool
    timeout_ms: int
    full: bool
    error: str
    reader: int
    generation: int
    allowed: int
    settled: bool
    mixed: bool
    discarded: _containers.RepeatedScalarFieldContainer[bytes]
    candidates: _containers.RepeatedScalarFieldContainer[bytes]
    frozen: bool
    total: int
    share: int
    claims: _containers.RepeatedScalarFieldContainer[bytes]
    gifts: _containers.RepeatedScalarFieldContainer[bytes]
    firsts: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, key: _Optional[str] = ..., world_size: _Optional[int] = ..., rank: _Optional[int] = ..., workers: _Optional[int] = ..., worker: _Optional[int] = ..., pad: _Optional[bool] = ..., fetched: _Optional[int] = ..., yielded: _Optional[int] = ..., wants: _Optional[bool] = ..., exhausted: _Optional[bool] = ..., given: _Optional[_Iterable[bytes]] = ..., given_start: _Optional[int] = ..., received: _Optional[int] = ..., done: _Optional[bool] = ..., first: _Optional[bool] = ..., timeout_ms: _Optional[int] = ..., full: _Optional[bool] = ..., error: _Optional[str] = ..., reader: _Optional[int] = ..., generation: _Optional[int] = ..., allowed: _Optional[int] = ..., settled: _Optional[bool] = ..., mixed: _Optional[bool] = ..., discarded: _Optional[_Iterable[bytes]] = ..., candidates: _Optional[_Iterable[bytes]] = ..., frozen: _Optional[bool] = ..., total: _Optional[int] = ..., share: _Optional[int] = ..., claims: _Optional[_Iterable[bytes]] = ..., gifts: _Optional[_Iterable[bytes]] = ..., firsts: _Optional[_Iterable[bytes]] = ...) -> None: ...

class ShareResponse(_message.Message):
    __slots__ = ("allowed", "settled", "give", "pad", "receive", "elements", "more", "share", "padded", "ready", "claims", "discard")
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    SETTLED_FIELD_NUMBER: _ClassVar[int]
    GIVE_FIELD_NUMBER: _ClassVar[int]
    PAD_FIELD_NUMBER: _ClassVar[int]
    RECEIVE_FIELD_NUMBER: _ClassVar[int]
    ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    PADDED_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    CLAIMS_FIELD_NUMBER: _ClassVar[int]
    DISCARD_FIELD_NUMBER: _ClassVar[int]
    allowed: int
    settled: bool
    give: int
    pad: int
    receive: int
    elements: _containers.RepeatedScalarFieldContainer[bytes]
    more: bool
    share: int
    padded: _containers.RepeatedScalarFieldContainer[bool]
    ready: bool
    claims: _containers.RepeatedScalarFieldContainer[bytes]
    discard: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, allowed: _Optional[int] = ..., settled: _Optional[bool] = ..., give: _Optional[int] = ..., pad: _Optional[int] = ..., receive: _Optional[int] = ..., elements: _Optional[_Iterable[bytes]] = ..., more: _Optional[bool] = ..., share: _Optional[int] = ..., padded: _Optional[_Iterable[bool]] = ..., ready: _Optional[bool] = ..., claims: _Optional[_Iterable[bytes]] = ..., discard: _Optional[_Iterable[bool]] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("address", "last_heartbeat_s", "tasks", "buffered_elements", "buffered_bytes")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_S_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_BYTES_FIELD_NUMBER: _ClassVar[int]
    address: str
    last_heartbeat_s: float
    tasks: _containers.RepeatedScalarFieldContainer[int]
    buffered_elements: int
    buffered_bytes: int
    def __init__(self, address: _Optional[str] = ..., last_heartbeat_s: _Optional[float] = ..., tasks: _Optional[_Iterable[int]] = ..., buffered_elements: _Optional[int] = ..., buffered_bytes: _Optional[int] = ...) -> None: ...

class DatasetStatus(_message.Message):
    __slots__ = ("dataset_id", "cardinality", "num_split_units", "compression")
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    CARDINALITY_FIELD_NUMBER: _ClassVar[int]
    NUM_SPLIT_UNITS_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    dataset_id: str
    cardinality: int
    num_split_units: int
    compression: str
    def __init__(self, dataset_id: _Optional[str] = ..., cardinality: _Optional[int] = ..., num_split_units: _Optional[int] = ..., compression: _Optional[str] = ...) -> None: ...

class IterationStatus(_message.Message):
    __slots__ = ("iteration_id", "repetition", "consumers", "tasks", "splits_handed_out", "splits_acknowledged", "elements_served", "finished")
    ITERATION_ID_FIELD_NUMBER: _ClassVar[int]
    REPETITION_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    SPLITS_HANDED_OUT_FIELD_NUMBER: _ClassVar[int]
    SPLITS_ACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    ELEMENTS_SERVED_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    iteration_id: int
    repetition: int
    consumers: int
    tasks: _containers.RepeatedScalarFieldContainer[int]
    splits_handed_out: int
    splits_acknowledged: int
    elements_served: int
    finished: bool
    def __init__(self, iteration_id: _Optional[int] = ..., repetition: _Optional[int] = ..., consumers: _Optional[int] = ..., tasks: _Optional[_Iterable[int]] = ..., splits_handed_out: _Optional[int] = ..., splits_acknowledged: _Optional[int] = ..., elements_served: _Optional[int] = ..., finished: _Optional[bool] = ...) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("job_id", "name", "dataset_id", "policy", "num_consumers", "iterations", "optimal_workers")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    NUM_CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    OPTIMAL_WORKERS_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    name: str
    dataset_id: str
    policy: str
    num_consumers: int
    iterations: _containers.RepeatedCompositeFieldContainer[IterationStatus]
    optimal_workers: int
    def __init__(self, job_id: _Optional[int] = ..., name: _Optional[str] = ..., dataset_id: _Optional[str] = ..., policy: _Optional[str] = ..., num_consumers: _Optional[int] = ..., iterations: _Optional[_Iterable[_Union[IterationStatus, _Mapping]]] = ..., optimal_workers: _Optional[int] = ...) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("workers", "datasets", "jobs", "uptime_s", "optimal_workers", "consumer_wait_fraction")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    DATASETS_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    OPTIMAL_WORKERS_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_WAIT_FRACTION_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    datasets: _containers.RepeatedCompositeFieldContainer[DatasetStatus]
    jobs: _containers.RepeatedCompositeFieldContainer[JobStatus]
    uptime_s: float
    optimal_workers: int
    consumer_wait_fraction: float
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ..., datasets: _Optional[_Iterable[_Union[DatasetStatus, _Mapping]]] = ..., jobs: _Optional[_Iterable[_Union[JobStatus, _Mapping]]] = ..., uptime_s: _Optional[float] = ..., optimal_workers: _Optional[int] = ..., consumer_wait_fraction: _Optional[float] = ...) -> None: ...

class ReportUnreachableWorkerRequest(_message.Message):
    __slots__ = ("worker_address", "task_id", "client_id")
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    worker_address: str
    task_id: int
    client_id: int
    def __init__(self, worker_address: _Optional[str] = ..., task_id: _Optional[int] = ..., client_id: _Optional[int] = ...) -> None: ...

class ReportUnreachableWorkerResponse(_message.Message):
    __slots__ = ("declared_lost",)
    DECLARED_LOST_FIELD_NUMBER: _ClassVar[int]
    declared_lost: bool
    def __init__(self, declared_lost: _Optional[bool] = ...) -> None: ...

class PingWorkerRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PingWorkerResponse(_message.Message):
    __slots__ = ("worker_uid",)
    WORKER_UID_FIELD_NUMBER: _ClassVar[int]
    worker_uid: str
    def __init__(self, worker_uid: _Optional[str] = ...) -> None: ...

class DeregisterWorkerRequest(_message.Message):
    __slots__ = ("worker_address", "worker_uid")
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WORKER_UID_FIELD_NUMBER: _ClassVar[int]
    worker_address: str
    worker_uid: str
    def __init__(self, worker_address: _Optional[str] = ..., worker_uid: _Optional[str] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ("path", "dataset_id", "compression")
    PATH_FIELD_NUMBER: _ClassVar[int]
    DATASET_ID_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    path: str
    dataset_id: str
    compression: str
    def __init__(self, path: _Optional[str] = ..., dataset_id: _Optional[str] = ..., compression: _Optional[str] = ...) -> None: ...

class GetSnapshotStreamRequest(_message.Message):
    __slots__ = ("worker_address", "worker_uid")
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WORKER_UID_FIELD_NUMBER: _ClassVar[int]
    worker_address: str
    worker_uid: str
    def __init__(self, worker_address: _Optional[str] = ..., worker_uid: _Optional[str] = ...) -> None: ...

class GetSnapshotStreamResponse(_message.Message):
    __slots__ = ("found", "path", "stream_index", "dataset", "compression", "seed")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    STREAM_INDEX_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    found: bool
    path: str
    stream_index: int
    dataset: bytes
    compression: str
    seed: int
    def __init__(self, found: _Optional[bool] = ..., path: _Optional[str] = ..., stream_index: _Optional[int] = ..., dataset: _Optional[bytes] = ..., compression: _Optional[str] = ..., seed: _Optional[int] = ...) -> None: ...

class GetSnapshotSplitRequest(_message.Message):
    __slots__ = ("path", "stream_index", "worker_address", "repetition", "request_number")
    PATH_FIELD_NUMBER: _ClassVar[int]
    STREAM_INDEX_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REPETITION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_NUMBER_FIELD_NUMBER: _ClassVar[int]
    path: str
    stream_index: int
    worker_address: str
    repetition: int
    request_number: int
    def __init__(self, path: _Optional[str] = ..., stream_index: _Optional[int] = ..., worker_address: _Optional[str] = ..., repetition: _Optional[int] = ..., request_number: _Optional[int] = ...) -> None: ...

class GetSnapshotSplitResponse(_message.Message):
    __slots__ = ("split", "end_of_splits")
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    END_OF_SPLITS_FIELD_NUMBER: _ClassVar[int]
    split: Split
    end_of_splits: bool
    def __init__(self, split: _Optional[_Union[Split, _Mapping]] = ..., end_of_splits: _Optional[bool] = ...) -> None: ...

class SnapshotStreamDoneRequest(_message.Message):
    __slots__ = ("path", "stream_index", "worker_address", "error")
    PATH_FIELD_NUMBER: _ClassVar[int]
    STREAM_INDEX_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    path: str
    stream_index: int
    worker_address: str
    error: str
    def __init__(self, path: _Optional[str] = ..., stream_index: _Optional[int] = ..., worker_address: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class SnapshotStreamDoneResponse(_message.Message):
    __slots__ = ("snapshot_done",)
    SNAPSHOT_DONE_FIELD_NUMBER: _ClassVar[int]
    snapshot_done: bool
    def __init__(self, snapshot_done: _Optional[bool] = ...) -> None: ...
