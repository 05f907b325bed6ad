"""The trainer's side: register_dataset, distribute, from_dataset_id, and the reading iterator.

A distributed dataset is a source op (:class:`DataServiceOp`) in the trainer's local graph,
so transformations applied after ``distribute`` run locally. Each iterator over it is one
repetition: it joins (or creates) the job and the iteration ``(job, repetition)``, then reader
threads pull batches of elements from the workers' tasks while a heartbeat thread keeps the
task list fresh and learns when the iteration has finished.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import cloudpickle

from convoy import _check as check
from convoy import _rpc
from convoy.codec import decode, validate_compression
from convoy.data._dataset import Dataset
from convoy.data._op import INFINITE_CARDINALITY, UNKNOWN_CARDINALITY, Node, Op
from convoy.data._split import source_units, split_units
from convoy.data.service import service_pb2 as pb
from convoy.data.service._config import ShardingPolicy, sharding_policy
from convoy.data.service._protocol import (
    DISPATCHER,
    DISPATCHER_METHODS,
    ELEMENTS,
    END_OF_SEQUENCE,
    WORKER,
    WORKER_METHODS,
)
from convoy.errors import (
    ConvoyError,
    InvalidArgumentError,
    UnavailableError,
    UnimplementedError,
)

log = logging.getLogger(__name__)

#: How long trainers retry an unreachable dispatcher before raising UnavailableError.
DEFAULT_DISPATCHER_TIMEOUT_MS = 60_000
#: How often an iterator asks the dispatcher for its task list.
HEARTBEAT_INTERVAL_S = 0.2
#: Requests in flight per iterator when max_outstanding_requests is None.
DEFAULT_OUTSTANDING = 4
#: Elements and bytes asked for per GetElements call.
ELEMENTS_PER_CALL = 2048
BYTES_PER_CALL = 16 << 20
#: How long a worker that could not be reached is left alone.
UNREACHABLE_BACKOFF_S = 0.5

_TARGET_WORKERS = ("AUTO", "ANY", "LOCAL")


class CrossTrainerCache:
    """Lets trainers with different ``trainer_id`` share the elements of one job (accepted and
    validated now; served by a later version)."""

    def __init__(self, trainer_id: str) -> None:
        if not isinstance(trainer_id, str) or not trainer_id:
            raise InvalidArgumentError(
                "convoy data service cross-trainer cache requires a non-empty trainer ID, "
                f"got {trainer_id!r}"
            )
        self.trainer_id = trainer_id


def _target(service: Any) -> Any:
    """``service`` as a ``"protocol://address"`` string: TensorFlow also takes a
    ``(protocol, address)`` tuple. Anything else is left for :func:`_rpc.parse_target` to judge."""
    if isinstance(service, tuple) and len(service) == 2 and all(isinstance(part, str)
                                                                 for part in service):
        return f"{service[0]}://{service[1]}"
    return service


def _dispatcher(service: str | tuple[str, str]) -> _rpc.Client:
    _, address = _rpc.parse_target(_target(service), "service")
    return _rpc.Client(address, DISPATCHER, DISPATCHER_METHODS)


def _pickle_dataset(dataset: Dataset) -> bytes:
    try:
        return cloudpickle.dumps(dataset._op)
    except Exception as error:
        raise InvalidArgumentError(
            f"the dataset cannot be sent to the data service: {_unpicklable(dataset._op)}: "
            f"{error}"
        ) from None


def _unpicklable(op: Op) -> str:
    """Names the first part of the graph that does not pickle, for the error message."""
    for upstream in op.inputs:
        found = _unpicklable(upstream)
        if found:
            return found
    for name, value in vars(op).items():
        if name == "inputs":
            continue
        try:
            cloudpickle.dumps(value)
        except Exception:
            where = f"{type(op).__name__[:-2]} transformation's {name!r}"
            for captured_name, captured in _captured(value):
                try:
                    cloudpickle.dumps(captured)
                except Exception:
                    return (f"{where} ({getattr(value, '__qualname__', value)}) captures "
                            f"{captured_name!r} = {captured!r:.80}, which cannot be pickled")
            return f"{where} ({value!r:.80}) cannot be pickled"
    return ""


def _captured(function: Any) -> list[tuple[str, Any]]:
    """The variables a function uses from its closure and from its module's globals."""
    code = getattr(function, "__code__", None)
    if code is None:
        return []
    captured = []
    for name, cell in zip(code.co_freevars, getattr(function, "__closure__", None) or ()):
        try:
            captured.append((name, cell.cell_contents))
        except ValueError:  # an empty cell
            pass
    module_globals = getattr(function, "__globals__", {})
    return captured + [(name, module_globals[name]) for name in code.co_names
                       if name in module_globals]


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
        payload = _pickle_dataset(dataset)
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
        return response.dataset_id


def _timeout_s(dispatcher_timeout_ms: Any) -> float:
    ms = check.optional_integer("dispatcher_timeout_ms", dispatcher_timeout_ms, 1)
    return (ms or DEFAULT_DISPATCHER_TIMEOUT_MS) / 1000


def register_dataset(service: str | tuple[str, str], dataset: Dataset,
                     compression: str | None = "AUTO", dataset_id: str | None = None, *,
                     dispatcher_timeout_ms: int | None = None) -> str:
    """Register ``dataset`` with the dispatcher at ``service``; returns its dataset id.

    Registering an equal dataset again returns the same id; a chosen ``dataset_id`` is kept.
    """
    if dataset_id is not None:
        check.string("dataset_id", dataset_id)
    registration = _Registration.of(dataset, compression, with_spec=True)
    dispatcher = _dispatcher(service)
    try:
        return registration.register(dispatcher, dataset_id or "",
                                     _timeout_s(dispatcher_timeout_ms))
    finally:
        dispatcher.close()


@dataclass(frozen=True)
class _ReadOptions:
    """How a trainer reads a job: checked once by distribute / from_dataset_id."""

    service: str
    processing_mode: ShardingPolicy
    job_name: str
    consumer_index: int | None
    num_consumers: int | None
    max_outstanding_requests: int
    target_workers: str
    trainer_id: str
    timeout_s: float

    @classmethod
    def check(cls, processing_mode: Any, service: Any, job_name: Any, consumer_index: Any,
              num_consumers: Any, max_outstanding_requests: Any, data_transfer_protocol: Any,
              target_workers: Any, cross_trainer_cache: Any,
              dispatcher_timeout_ms: Any) -> _ReadOptions:
        mode = sharding_policy(processing_mode)
        service = _target(service)
        _rpc.parse_target(service, "service")
        if job_name is not None:
            if not isinstance(job_name, str):
                raise InvalidArgumentError(
                    f"`job_name` must be a string, but `job_name` was of type "
                    f"{type(job_name).__name__}"
                )
            if not job_name:
                raise InvalidArgumentError("`job_name` must not be empty")
        if (consumer_index is None) != (num_consumers is None):
            raise InvalidArgumentError(
                "Must either set both `consumer_index` and `num_consumers`, or neither; got "
                f"consumer_index={consumer_index!r}, num_consumers={num_consumers!r}"
            )
        if num_consumers is not None:
            num_consumers = check.integer("num_consumers", num_consumers, 1)
            consumer_index = check.integer("consumer_index", consumer_index, 0)
            if consumer_index >= num_consumers:
                raise InvalidArgumentError(
                    f"consumer_index must be in [0, num_consumers={num_consumers}), got "
                    f"{consumer_index}"
                )
            if job_name is None:
                raise InvalidArgumentError(
                    f"`job_name` must be set when setting `num_consumers`. num_consumers was "
                    f"set to {num_consumers}."
                )
        outstanding = check.optional_integer("max_outstanding_requests",
                                             max_outstanding_requests, 1, allowed=(-1,))
        if data_transfer_protocol not in (None, "grpc"):
            raise InvalidArgumentError(
                f"data_transfer_protocol must be None or 'grpc', got {data_transfer_protocol!r}"
            )
        if not isinstance(target_workers, str) or target_workers.upper() not in _TARGET_WORKERS:
            raise InvalidArgumentError(
                f"target_workers must be one of {list(_TARGET_WORKERS)}, got {target_workers!r}"
            )
        if cross_trainer_cache is not None and not isinstance(cross_trainer_cache,
                                                              CrossTrainerCache):
            raise InvalidArgumentError(
                "cross_trainer_cache must be a CrossTrainerCache or None, got "
                f"{type(cross_trainer_cache).__name__}"
            )
        return cls(service, mode, job_name or "", consumer_index, num_consumers,
                   DEFAULT_OUTSTANDING if outstanding in (None, -1) else outstanding,
                   target_workers.upper(),
                   cross_trainer_cache.trainer_id if cross_trainer_cache else "",
                   _timeout_s(dispatcher_timeout_ms))

    def refuse_unavailable(self) -> None:
        """Raise for the options this version accepts but cannot serve yet."""
        if self.processing_mode not in (ShardingPolicy.OFF, ShardingPolicy.DYNAMIC):
            raise UnimplementedError(
                f"sharding policy {self.processing_mode.name} is not available yet; use OFF "
                "or DYNAMIC"
            )
        if self.num_consumers is not None:
            raise UnimplementedError("coordinated reads (num_consumers) are not available yet")
        if self.trainer_id:
            raise UnimplementedError("the cross-trainer cache is not available yet")
        if self.target_workers == "LOCAL":
            raise UnimplementedError("target_workers='LOCAL' is not available yet")

    def job_options(self) -> pb.JobOptions:
        return pb.JobOptions(processing_mode=self.processing_mode.name,
                             num_consumers=self.num_consumers or 0,
                             target_workers=self.target_workers,
                             cross_trainer_cache=self.trainer_id)


def distribute(processing_mode: Any, service: str | tuple[str, str], job_name: str | None = None,
               consumer_index: int | None = None, num_consumers: int | None = None,
               max_outstanding_requests: int | None = None,
               data_transfer_protocol: str | None = None, compression: str | None = "AUTO",
               target_workers: str = "AUTO",
               cross_trainer_cache: CrossTrainerCache | None = None, *,
               dispatcher_timeout_ms: int | None = None) -> Callable[[Dataset], Dataset]:
    """A transformation (for ``Dataset.apply``) that moves the pipeline so far onto the data
    service at ``service``; what follows it runs locally."""
    options = _ReadOptions.check(processing_mode, service, job_name, consumer_index,
                                 num_consumers, max_outstanding_requests,
                                 data_transfer_protocol, target_workers, cross_trainer_cache,
                                 dispatcher_timeout_ms)
    validate_compression(compression)
    options.refuse_unavailable()

    def apply(dataset: Dataset) -> Dataset:
        registration = _Registration.of(dataset, compression, with_spec=False)
        if options.processing_mode is ShardingPolicy.DYNAMIC:
            split_units(dataset._op)  # refuses what it cannot split, naming the op
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
                    dispatcher_timeout_ms: int | None = None) -> Dataset:
    """A dataset reading the registered dataset ``dataset_id`` from the data service.

    Job names are scoped to the dataset id, so equal names on different datasets never share.
    Without ``element_spec`` it is fetched from the dispatcher.
    """
    options = _ReadOptions.check(processing_mode, service, job_name, consumer_index,
                                 num_consumers, max_outstanding_requests,
                                 data_transfer_protocol, target_workers, cross_trainer_cache,
                                 dispatcher_timeout_ms)
    check.string("dataset_id", dataset_id)
    options.refuse_unavailable()
    dispatcher = _dispatcher(service)
    try:
        info = _rpc.retry(
            lambda: dispatcher.call("GetDatasetInfo", pb.GetDatasetInfoRequest(
                dataset_id=dataset_id)),
            options.timeout_s, f"looking up dataset {dataset_id} at {service}")
    finally:
        dispatcher.close()
    if element_spec is None and info.element_spec:
        element_spec = pickle.loads(info.element_spec)
    if job_name is not None:
        options = _scoped(options, f"dataset_id={dataset_id}/{job_name}")
    return Dataset(DataServiceOp(options, None, dataset_id, element_spec, info.cardinality))


def _scoped(options: _ReadOptions, job_name: str) -> _ReadOptions:
    return _ReadOptions(**{**vars(options), "job_name": job_name})


class DataServiceOp(Op):
    """A source op reading from the data service; each new iterator is the next repetition.

    It is ``remote``: ``repeat()`` keeps going through an empty repetition (another consumer
    of a shared job may have read all of it).

    After ``distribute`` the element spec is that of ``input_op`` (the distributed pipeline),
    worked out only when asked for.
    """

    remote = True

    def __init__(self, options: _ReadOptions, registration: _Registration | None,
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
        n = self.input_cardinality
        if n in (0, INFINITE_CARDINALITY):
            return n
        return UNKNOWN_CARDINALITY

    def static_spec(self) -> Any:
        if self.element_spec is None and self.input_op is not None:
            self.element_spec = self.input_op.static_spec()
        return self.element_spec

    def iterator(self, state: Any, key: int) -> Node:
        if state is not None:
            raise UnimplementedError("data service iterators cannot be restored from a "
                                     "checkpoint yet")
        with self._lock:
            repetition = self.repetitions
            self.repetitions += 1
        return _ServiceNode(_Reader.open(self, repetition))

    def ensure_registered(self, dispatcher: _rpc.Client) -> str:
        with self._lock:
            if not self.dataset_id:
                assert self.registration is not None
                self.dataset_id = self.registration.register(dispatcher, "",
                                                             self.options.timeout_s)
            return self.dataset_id


class _ServiceNode(Node):
    __slots__ = ("_reader", "__weakref__")

    def __init__(self, reader: _Reader) -> None:
        self._reader = reader
        self.gen = reader.elements()
        weakref.finalize(self, reader.close)

    def state_dict(self) -> Any:
        raise UnimplementedError("data service iterators cannot be saved yet")

    def close(self) -> None:
        self._reader.close()


class _TaskState:
    __slots__ = ("task_id", "worker", "ended", "busy", "retry_at")

    def __init__(self, task_id: int, worker: _rpc.Client) -> None:
        self.task_id = task_id
        self.worker = worker
        self.ended = False
        self.busy = 0
        self.retry_at = 0.0


class _Reader:
    """One consumer's reading of one iteration. ``cond`` guards every field below it."""

    def __init__(self, op: DataServiceOp, dispatcher: _rpc.Client, client_id: int) -> None:
        self.options = op.options
        self.dispatcher = dispatcher
        self.client_id = client_id
        self.cond = threading.Condition()
        self.tasks: dict[int, _TaskState] = {}
        self.workers: dict[str, _rpc.Client] = {}
        self.results: deque[list[Any]] = deque()
        self.finished = False  # the dispatcher says the iteration has ended
        self.error: BaseException | None = None
        self.closed = False
        self.next_task = 0
        self.wake = threading.Event()  # set to heartbeat now rather than at the next interval

    @classmethod
    def open(cls, op: DataServiceOp, repetition: int) -> _Reader:
        options = op.options
        dispatcher = _dispatcher(options.service)

        def call(method: str, request: Any) -> Any:
            return _rpc.retry(lambda: dispatcher.call(method, request), options.timeout_s,
                              f"{method} at dispatcher {dispatcher.address}")

        dataset_id = op.ensure_registered(dispatcher)
        job = call("GetOrCreateJob", pb.GetOrCreateJobRequest(
            dataset_id=dataset_id, job_name=options.job_name, options=options.job_options()))
        iteration = call("GetOrCreateIteration", pb.GetOrCreateIterationRequest(
            job_id=job.job_id, repetition=repetition))
        reader = cls(op, dispatcher, iteration.client_id)
        reader._heartbeat()
        threading.Thread(target=reader._heartbeat_loop, daemon=True,
                         name="convoy-client-heartbeat").start()
        for _ in range(options.max_outstanding_requests):
            threading.Thread(target=reader._read_loop, daemon=True,
                             name="convoy-client-reader").start()
        return reader

    # ----- the consumer's side ----------------------------------------------------------------
    def elements(self) -> Iterator[Any]:
        while True:
            batch = self._take()
            if batch is None:
                return
            yield from batch

    def _take(self) -> list[Any] | None:
        with self.cond:
            while True:
                if self.results:
                    batch = self.results.popleft()
                    self.cond.notify_all()
                    return batch
                if self.error is not None:
                    raise self.error
                if self._done():
                    return None
                self.cond.wait()

    def _done(self) -> bool:
        # ``busy``: a reply still in flight on an ended task (readers share tasks) may hold
        # elements taken before another reader saw the end.
        return self.finished and all(t.ended and not t.busy for t in self.tasks.values())

    # ----- the dispatcher's side ---------------------------------------------------------------
    def _heartbeat(self) -> None:
        request = pb.ClientHeartbeatRequest(client_id=self.client_id)
        response = _rpc.retry(lambda: self.dispatcher.call("ClientHeartbeat", request),
                              self.options.timeout_s,
                              f"heartbeat to dispatcher {self.dispatcher.address}",
                              lambda: self.closed)
        with self.cond:
            for info in response.tasks:
                if info.task_id not in self.tasks:
                    worker = self.workers.get(info.worker_address)
                    if worker is None:
                        worker = _rpc.Client(info.worker_address, WORKER, WORKER_METHODS)
                        self.workers[info.worker_address] = worker
                    self.tasks[info.task_id] = _TaskState(info.task_id, worker)
            # The dispatcher lists the unfinished tasks: one no longer listed has finished
            # (its end of sequence may have been lost with its worker) or its worker was lost.
            listed = {info.task_id for info in response.tasks}
            for task in self.tasks.values():
                if task.task_id not in listed:
                    task.ended = True
            self.finished = response.iteration_finished
            self.cond.notify_all()

    def _heartbeat_loop(self) -> None:
        while True:
            self.wake.wait(HEARTBEAT_INTERVAL_S)
            self.wake.clear()
            with self.cond:
                if self.closed or self._done() or self.error is not None:
                    return
            try:
                self._heartbeat()
            except ConvoyError as error:
                self._fail(error)
                return

    def _fail(self, error: BaseException) -> None:
        with self.cond:
            if self.error is None and not self.closed:
                self.error = error
            self.cond.notify_all()

    # ----- the workers' side -------------------------------------------------------------------
    def _pick_task(self) -> _TaskState | None:
        """The next task to read in round-robin order, waiting while none is ready.

        A task has at most one request in flight, as in TensorFlow's client: each worker's
        elements then arrive in the order it produced them.
        """
        while True:
            with self.cond:
                if self.closed or self.error is not None or self._done():
                    return None
                room = len(self.results) < 2 * self.options.max_outstanding_requests
                now = time.monotonic()
                ready = [t for t in self.tasks.values()
                         if not t.ended and t.busy == 0 and t.retry_at <= now]
                if room and ready:
                    task = ready[self.next_task % len(ready)]
                    self.next_task += 1
                    task.busy += 1
                    return task
                self.cond.wait(0.05)

    def _read_loop(self) -> None:
        request = pb.GetElementsRequest(consumer_index=-1, max_elements=ELEMENTS_PER_CALL,
                                        max_bytes=BYTES_PER_CALL)
        while True:
            task = self._pick_task()
            if task is None:
                return
            request.task_id = task.task_id
            try:
                reply = task.worker.call("GetElements", request, timeout=None)
            except UnavailableError:
                with self.cond:
                    task.busy -= 1
                    task.retry_at = time.monotonic() + UNREACHABLE_BACKOFF_S
                continue
            except ConvoyError as error:
                self._fail(type(error)(
                    f"Failed to get elements from worker {task.worker.address}: {error}"))
                return
            self._deliver(task, reply)

    def _deliver(self, task: _TaskState, reply: bytes) -> None:
        kind = reply[:1]
        elements = decode(memoryview(reply)[1:]) if kind == ELEMENTS else None
        with self.cond:
            task.busy -= 1
            if elements:
                self.results.append(elements)
            elif kind == END_OF_SEQUENCE:
                task.ended = True
                if all(t.ended for t in self.tasks.values()):
                    self.wake.set()  # ask the dispatcher whether the iteration has ended
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            if self.closed:
                return
            self.closed = True
            self.cond.notify_all()
        self.wake.set()
        try:
            self.dispatcher.call("ReleaseClient",
                                 pb.ReleaseClientRequest(client_id=self.client_id), timeout=2)
        except ConvoyError:
            pass  # the dispatcher forgets silent clients by itself
