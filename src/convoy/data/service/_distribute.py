"""The trainer's side: register_dataset, distribute, from_dataset_id and their source op.

A distributed dataset is a source op (:class:`DataServiceOp`) in the trainer's local graph,
so transformations applied after ``distribute`` run locally. Each iterator over it is one
repetition, read by a :class:`~convoy.data.service._client_reader.Reader`.
"""

from __future__ import annotations

import copy
import hashlib
import pickle
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from convoy._base import check
from convoy._transport import rpc as _rpc
from convoy._values import pickling as _pickling
from convoy._values.codec import validate_compression
from convoy.data._core._op import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Node, Op, upstream
from convoy.data._dataset import Dataset
from convoy.data._ops._grouping import refuse_nested_datasets
from convoy.data._sharding._split import source_units, split_units
from convoy.data._sharding._static_shard import check_file_sources
from convoy.data._sources._basic import ListFilesOp
from convoy.data.service import service_pb2 as pb
from convoy.data.service._client.options import (
    CrossTrainerCache,
    ReadOptions,
    dispatcher_client,
    read_options,
    timeout_s,
)
from convoy.data.service._client.resume import (
    STATE_VERSION,
    Returned,
    coordinated_state,
    resume_point,
    saved_state,
)
from convoy.data.service._client_reader import Reader
from convoy.data.service._common.config import ShardingPolicy, policy_name
from convoy.errors import FailedPreconditionError, InvalidArgumentError, UnimplementedError


def _op_name(obj: Any) -> str:
    """How an error message names a part of a dataset graph: "Map transformation"."""
    if isinstance(obj, Op):
        return f"{type(obj).__name__.removesuffix('Op')} transformation"
    return type(obj).__name__


@dataclass(frozen=True)
class _Registration:
    """What registering a dataset sends: computed once, when distribute or register runs."""

    payload: bytes
    fingerprint: str
    compression: str
    element_spec: bytes
    cardinality: int
    num_split_units: int

    @classmethod
    def of(cls, dataset: Dataset, compression: Any, with_spec: bool) -> _Registration:
        """``with_spec``: also record the element spec, which may run the pipeline up to its
        first element (after a Python function); from_dataset_id readers need it."""
        if not isinstance(dataset, Dataset):
            raise InvalidArgumentError(
                f"dataset must be a convoy.data.Dataset, got {type(dataset).__name__}"
            )
        compression = validate_compression(compression)
        refuse_nested_datasets(dataset._op)  # window's datasets cannot travel as tensors
        payload = _pickling.dumps(dataset._op, "the dataset cannot be sent to the data service",
                                  _op_name)
        spec = dataset.element_spec if with_spec else None
        return cls(payload, hashlib.sha256(payload).hexdigest(), compression or "",
                   pickle.dumps(spec) if spec is not None else b"",
                   dataset.cardinality(), source_units(dataset._op))

    def register(self, dispatcher: _rpc.Client, dataset_id: str, timeout_s: float) -> str:
        request = pb.RegisterDatasetRequest(
            dataset=self.payload, dataset_id=dataset_id, fingerprint=self.fingerprint,
            compression=self.compression, element_spec=self.element_spec,
            cardinality=self.cardinality, num_split_units=self.num_split_units)
        response = _rpc.retry(lambda: dispatcher.call("RegisterDataset", request), timeout_s,
                              f"registering a dataset with dispatcher {dispatcher.address}")
        registered: str = response.dataset_id
        return registered


def register_dataset(service: str | tuple[str, str], dataset: Dataset,
                     compression: str | None = "AUTO", dataset_id: str | None = None, *,
                     dispatcher_timeout_ms: int | None = None) -> str:
    """Register ``dataset`` with the dispatcher at ``service``; returns its dataset id.

    Registering an equal dataset again returns the same id; a chosen ``dataset_id`` is kept.
    """
    if dataset_id is not None:
        check.string("dataset_id", dataset_id)
    registration = _Registration.of(dataset, compression, with_spec=True)
    dispatcher = dispatcher_client(service)
    try:
        return registration.register(dispatcher, dataset_id or "",
                                     timeout_s(dispatcher_timeout_ms))
    finally:
        dispatcher.close()


def distribute(processing_mode: Any, service: str | tuple[str, str], job_name: str | None = None,
               consumer_index: int | None = None, num_consumers: int | None = None,
               max_outstanding_requests: int | None = None,
               data_transfer_protocol: str | None = None, compression: str | None = "AUTO",
               target_workers: str = "AUTO",
               cross_trainer_cache: CrossTrainerCache | None = None, *,
               dispatcher_timeout_ms: int | None = None,
               max_buffered_elements: int | None = None) -> Callable[[Dataset], Dataset]:
    """A transformation (for ``Dataset.apply``) that moves the pipeline so far onto the data
    service at ``service``; what follows it runs locally.

    Beyond TensorFlow's arguments: ``dispatcher_timeout_ms``, how long a dispatcher or worker
    that cannot be reached is retried before UnavailableError (default 90 s: longer than the
    dispatcher takes to declare a silent worker lost and have its DYNAMIC task run elsewhere);
    ``max_buffered_elements``, the most elements a consumer holds (buffered or asked for)
    beyond those it has returned: by default 64 on a named job, so the consumers sharing it
    take elements first come, first served, and no bound but large batches otherwise.

    ``target_workers="LOCAL"`` reads only the workers on this host, through shared memory;
    "AUTO" reads every worker, those on this host through shared memory unless
    ``data_transfer_protocol="grpc"``. Arrays from shared memory are read-only views on it.
    """
    options = read_options(
        processing_mode=processing_mode, service=service, job_name=job_name,
        consumer_index=consumer_index, num_consumers=num_consumers,
        max_outstanding_requests=max_outstanding_requests,
        data_transfer_protocol=data_transfer_protocol, target_workers=target_workers,
        cross_trainer_cache=cross_trainer_cache, dispatcher_timeout_ms=dispatcher_timeout_ms,
        max_buffered_elements=max_buffered_elements)
    validate_compression(compression)

    def apply(dataset: Dataset) -> Dataset:
        registration = _Registration.of(dataset, compression, with_spec=False)
        options.check_cache_input(registration.cardinality)
        if options.processing_mode is ShardingPolicy.DYNAMIC:
            split_units(dataset._op)  # refuses what it cannot split, naming the op
        elif options.processing_mode is ShardingPolicy.FILE:
            check_file_sources(dataset._op)  # refuses a source that is not one of files
        return Dataset(DataServiceOp(options, registration, "", None, dataset.cardinality(),
                                     input_op=dataset._op))

    return apply


def from_dataset_id(processing_mode: Any, service: str | tuple[str, str], dataset_id: str,
                    element_spec: Any = None, job_name: str | None = None,
                    consumer_index: int | None = None, num_consumers: int | None = None,
                    max_outstanding_requests: int | None = None,
                    data_transfer_protocol: str | None = None,
                    target_workers: str = "AUTO",
                    cross_trainer_cache: CrossTrainerCache | None = None, *,
                    dispatcher_timeout_ms: int | None = None,
                    max_buffered_elements: int | None = None) -> Dataset:
    """A dataset reading the registered dataset ``dataset_id`` from the data service.

    Job names are scoped to the dataset id, so equal names on different datasets never share.
    Without ``element_spec`` it is fetched from the dispatcher. The keyword-only arguments
    are those of :func:`distribute`.
    """
    options = read_options(
        processing_mode=processing_mode, service=service, job_name=job_name,
        consumer_index=consumer_index, num_consumers=num_consumers,
        max_outstanding_requests=max_outstanding_requests,
        data_transfer_protocol=data_transfer_protocol, target_workers=target_workers,
        cross_trainer_cache=cross_trainer_cache, dispatcher_timeout_ms=dispatcher_timeout_ms,
        max_buffered_elements=max_buffered_elements)
    check.string("dataset_id", dataset_id)
    dispatcher = dispatcher_client(service)
    try:
        info = _rpc.retry(
            lambda: dispatcher.call("GetDatasetInfo", pb.GetDatasetInfoRequest(
                dataset_id=dataset_id)),
            options.timeout_s, f"looking up dataset {dataset_id} at {service}")
    finally:
        dispatcher.close()
    options.check_cache_input(info.cardinality)
    if element_spec is None and info.element_spec:
        element_spec = pickle.loads(info.element_spec)
    if job_name is not None:
        options = options.scoped(_by_id(dataset_id, job_name))
    return Dataset(DataServiceOp(options, None, dataset_id, element_spec, info.cardinality))


def _by_id(dataset_id: str, job_name: str) -> str:
    """``job_name`` scoped to a dataset read by id: equal names on different datasets never
    share a job."""
    return f"dataset_id={dataset_id}/{job_name}"


class DataServiceOp(Op):
    """A source op reading from the data service; each new iterator is the next repetition.

    It is ``remote``: ``repeat()`` keeps going through an empty repetition (another consumer
    of a shared job may have read all of it).

    After ``distribute`` the element spec is that of ``input_op`` (the distributed pipeline),
    worked out only when asked for.
    """

    remote = True

    def __init__(self, options: ReadOptions, registration: _Registration | None,
                 dataset_id: str, element_spec: Any, input_cardinality: int,
                 input_op: Op | None = None) -> None:
        self.options = options
        self.registration = registration
        self.dataset_id = dataset_id
        self.element_spec = element_spec
        self.input_cardinality = input_cardinality
        self.input_op = input_op
        self.repetitions = 0
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def cardinality(self) -> int:
        """0 or infinite as the input is (TensorFlow's answer); unknown otherwise, and for an
        infinite input that static sharding (FILE, FILE_OR_DATA, HINT) may leave empty."""
        n = self.input_cardinality
        if n == 0 or n == INFINITE_CARDINALITY and self.options.processing_mode in (
                ShardingPolicy.OFF, ShardingPolicy.DYNAMIC, ShardingPolicy.DATA):
            return n
        return UNKNOWN_CARDINALITY

    def static_spec(self) -> Any:
        if self.element_spec is None and self.input_op is not None:
            self.element_spec = self.input_op.static_spec()
        return self.element_spec

    def iterator(self, state: Any, key: int) -> Node:
        options, resume = self.options, None
        finished = isinstance(state, dict) and bool(state.get("finished"))
        if finished and not ("iteration" in state and options.job_name):
            return _EmptyNode(FINISHED)  # saved at its end, alone in its job
        if state is not None:  # a new job, started where the saved reading stopped
            self.check_resumable()
            resume = resume_point(state, self.fingerprint(), policy_name(
                options.processing_mode), shared=bool(options.job_name),
                consumer=self.coordinated_consumer())
            if options.job_name:  # the consumers of the saved job resume in a job together
                options = options.scoped(f"{options.job_name}/resumed-{state['iteration']}")
        with self._lock:
            repetition = 0 if resume is not None else self.repetitions
            if resume is None:
                self.options.check_cache_repetition(repetition)
                self.repetitions += 1
        dispatcher = dispatcher_client(options.service)
        try:
            dataset_id = self.ensure_registered(dispatcher)
        except BaseException:
            dispatcher.close()
            raise
        if finished:  # at the end of a shared job: the other consumers resume with it
            assert resume is not None
            point = Reader.join_at_end(dispatcher, options, dataset_id, resume)
            return _EmptyNode({**saved_state(self.fingerprint(), state["mode"], point,
                                             Returned()), "finished": True})
        return _ServiceNode(Reader.open(dispatcher, options, dataset_id, repetition, resume),
                            self)

    def fingerprint(self) -> str:
        """What identifies the distributed dataset in a saved state."""
        if self.registration is not None:
            return self.registration.fingerprint
        return f"dataset_id={self.dataset_id}"

    def coordinated_consumer(self) -> tuple[int, int] | None:
        """A coordinated read's consumer index and number of consumers (None: not one)."""
        options = self.options
        if options.num_consumers is None or options.consumer_index is None:
            return None
        return options.consumer_index, options.num_consumers

    def check_resumable(self) -> None:
        """Refuse, naming why, a reading whose position cannot be saved or restored."""
        options = self.options
        if options.trainer_id:
            raise UnimplementedError(
                "data service iterators read through the cross-trainer cache cannot be saved "
                "or restored")
        if options.processing_mode not in (ShardingPolicy.OFF, ShardingPolicy.DYNAMIC):
            raise UnimplementedError(
                f"data service iterators can be saved under OFF and DYNAMIC sharding, not "
                f"{policy_name(options.processing_mode)}")
        if self.input_op is not None:
            for op in upstream(self.input_op):
                unseeded = not getattr(op, "seed_given", True)
                if isinstance(op, ListFilesOp) and op.shuffle and unseeded:
                    raise FailedPreconditionError(
                        "cannot save a data service iterator whose split order is not "
                        "deterministic: list_files(shuffle=True) without a seed orders the "
                        "files differently in every process; pass seed=")

    def named(self, job_name: str) -> DataServiceOp:
        """A copy reading the job ``job_name`` (scoped to the dataset, as ``from_dataset_id``
        scopes it, when this op reads a dataset by id), with a named job's window."""
        clone = copy.copy(self)  # its own lock
        clone.options = self.options.named(
            job_name if self.registration is not None else _by_id(self.dataset_id, job_name))
        return clone

    def at_repetition(self, repetition: int) -> DataServiceOp:
        """A copy whose next iterator reads repetition ``repetition`` of the job."""
        clone = copy.copy(self)
        clone.repetitions = repetition
        return clone

    def dispatcher(self) -> _rpc.Client:
        """A new client of this op's dispatcher, for its caller to close."""
        return dispatcher_client(self.options.service)

    def ensure_registered(self, dispatcher: _rpc.Client) -> str:
        with self._lock:
            if not self.dataset_id:
                assert self.registration is not None
                self.dataset_id = self.registration.register(dispatcher, "",
                                                             self.options.timeout_s)
            return self.dataset_id


#: The state of a reading at its end that resumes alone (not one of a shared job).
FINISHED = {"version": STATE_VERSION, "finished": True}


class _EmptyNode(Node):
    """A reading restored at its end; ``state`` is where it is."""

    __slots__ = ("_state",)

    def __init__(self, state: dict[str, Any]) -> None:
        self.gen = iter(())
        self._state = state

    def state_dict(self) -> Any:
        return self._state


class _ServiceNode(Node):
    __slots__ = ("_reader", "_op", "__weakref__")

    def __init__(self, reader: Reader, op: DataServiceOp) -> None:
        self._reader = reader
        self._op = op
        self.gen = reader.elements()
        # Closed once nobody can read on: whoever holds `gen` (it may be held alone).
        weakref.finalize(self.gen, reader.close)

    def state_dict(self) -> Any:
        """This consumer's position as plain data (see :mod:`._client.resume`)."""
        self._op.check_resumable()
        mode = policy_name(self._op.options.processing_mode)
        if self._reader.finished:
            # a shared job's consumer keeps its last position: the job resumes with it
            final = self._reader.final
            return FINISHED if final is None else {
                **saved_state(self._op.fingerprint(), mode, *final), "finished": True}
        point, returned = self._reader.position()
        consumer = self._op.coordinated_consumer()
        if consumer is not None:
            return coordinated_state(self._op.fingerprint(), mode, point,
                                     self._reader.rounds(), returned, consumer)
        return saved_state(self._op.fingerprint(), mode, point, returned)

    def close(self) -> None:
        self._reader.close()
