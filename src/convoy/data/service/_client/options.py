"""How a trainer reads from the data service: the options of distribute and from_dataset_id,
checked once by :func:`read_options`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from convoy._base import check
from convoy._transport import rpc as _rpc
from convoy.data.service import service_pb2 as pb
from convoy.data.service._common.config import (
    TARGET_WORKERS,
    ShardingPolicy,
    policy_name,
    sharding_policy,
)
from convoy.data.service._common.coordinated import check_coordinated_options
from convoy.data.service._common.host import host_identity
from convoy.data.service._common.server_config import DEFAULT_CONSUMER_TIMEOUT_MS
from convoy.data.service._common.wire import DISPATCHER, DISPATCHER_METHODS
from convoy.errors import InvalidArgumentError, UnimplementedError

#: How long trainers retry an unreachable dispatcher, or a task's worker, before raising
#: UnavailableError: longer than the dispatcher takes to declare a silent worker lost.
DEFAULT_DISPATCHER_TIMEOUT_MS = DEFAULT_CONSUMER_TIMEOUT_MS
#: How elements travel: None (shared memory from the workers on this host, gRPC from the
#: others), "grpc" (always gRPC) or "local" (shared memory, for target_workers="LOCAL").
DATA_TRANSFER_PROTOCOLS = (None, "grpc", "local")
#: Requests in flight per iterator when max_outstanding_requests is None.
DEFAULT_OUTSTANDING = 4
#: The most elements a consumer of a named job holds beyond those it has returned, when
#: max_buffered_elements is None.
DEFAULT_SHARED_BUFFER = 64


class CrossTrainerCache:
    """Lets trainers with different ``trainer_id`` read the same elements of one job: each
    worker keeps a sliding window of its task's latest elements (bounded by the worker's
    ``cross_trainer_cache_size_bytes``), and each trainer id reads it from its own position.
    A trainer that falls out of the window skips ahead. Readers with the same id share one
    position, so they never get the same element twice. The job must be named and its
    dataset endless."""

    def __init__(self, trainer_id: str) -> None:
        if not isinstance(trainer_id, str) or not trainer_id:
            raise InvalidArgumentError(
                "convoy data service cross-trainer cache requires a non-empty trainer ID, "
                f"got {trainer_id!r}"
            )
        self.trainer_id = trainer_id


def service_target(service: Any) -> Any:
    """``service`` as a ``"protocol://address"`` string: TensorFlow also takes a
    ``(protocol, address)`` tuple. Anything else is left for :func:`_rpc.parse_target` to judge."""
    if isinstance(service, tuple) and len(service) == 2 and all(isinstance(part, str)
                                                                 for part in service):
        return f"{service[0]}://{service[1]}"
    return service


def dispatcher_client(service: str | tuple[str, str]) -> _rpc.Client:
    """A client of the dispatcher at ``service``."""
    _, address = _rpc.parse_target(service_target(service), "service")
    return _rpc.Client(address, DISPATCHER, DISPATCHER_METHODS)


def timeout_s(dispatcher_timeout_ms: Any) -> float:
    """The checked ``dispatcher_timeout_ms`` in seconds (None: the default)."""
    ms = check.optional_integer("dispatcher_timeout_ms", dispatcher_timeout_ms, 1)
    return (ms or DEFAULT_DISPATCHER_TIMEOUT_MS) / 1000


@dataclass(frozen=True)
class ReadOptions:
    """How a trainer reads a job."""

    service: str
    processing_mode: ShardingPolicy
    job_name: str
    consumer_index: int | None
    num_consumers: int | None
    max_outstanding_requests: int
    target_workers: str
    trainer_id: str
    timeout_s: float
    window: int | None  # elements held beyond those returned, at most (None: no bound)
    shared_memory: bool = False  # same-host workers answer in shared memory

    def check_cache_input(self, cardinality: int) -> None:
        """Refuse a dataset known to be finite for the cross-trainer cache (one of unknown
        length is refused by the worker if it ends)."""
        if self.trainer_id and cardinality >= 0:
            raise InvalidArgumentError(
                "Cross-trainer caching requires the input dataset to be infinite. Got input "
                f"with cardinality {cardinality}")

    def check_cache_repetition(self, repetition: int) -> None:
        """Refuse a second iterator over a dataset read through the cross-trainer cache: it
        would be a new iteration, whose caches the other trainers do not read."""
        if self.trainer_id and repetition > 0:
            raise InvalidArgumentError(
                "Cross-trainer caching requires infinite datasets and disallows multiple "
                f"repetitions of the same dataset. Got repetition {repetition}")

    def job_options(self) -> pb.JobOptions:
        return pb.JobOptions(processing_mode=policy_name(self.processing_mode),
                             num_consumers=self.num_consumers or 0,
                             target_workers=self.target_workers,
                             cross_trainer_cache=self.trainer_id)

    def scoped(self, job_name: str) -> ReadOptions:
        """These options with another (scoped) job name."""
        return dataclasses.replace(self, job_name=job_name)

    def named(self, job_name: str) -> ReadOptions:
        """These options reading the job ``job_name``, with a named job's window."""
        return dataclasses.replace(self, job_name=job_name,
                                   window=_window(self.window, job_name))


def _window(window: int | None, job_name: str | None) -> int | None:
    """``window``, or when None the bound every named job's consumers read with."""
    return DEFAULT_SHARED_BUFFER if window is None and job_name is not None else window


def read_options(*, processing_mode: Any, service: Any, job_name: Any = None,
                 consumer_index: Any = None, num_consumers: Any = None,
                 max_outstanding_requests: Any = None, data_transfer_protocol: Any = None,
                 target_workers: Any = "AUTO", cross_trainer_cache: Any = None,
                 dispatcher_timeout_ms: Any = None,
                 max_buffered_elements: Any = None) -> ReadOptions:
    """The read options from the arguments of distribute or from_dataset_id, each checked."""
    mode = sharding_policy(processing_mode)
    service = service_target(service)
    _rpc.parse_target(service, "service")
    _check_job_name(job_name)
    consumer_index, num_consumers = _consumers(consumer_index, num_consumers, job_name)
    outstanding = check.optional_integer("max_outstanding_requests", max_outstanding_requests,
                                         1, allowed=(-1,))
    target_workers = _target_workers(target_workers)
    shared_memory = _shared_memory(data_transfer_protocol, target_workers, num_consumers)
    window = _window(check.optional_integer("max_buffered_elements", max_buffered_elements, 1),
                     job_name)
    trainer_id = _trainer_id(cross_trainer_cache, job_name, num_consumers)
    check_coordinated_options(num_consumers, mode, target_workers, trainer_id)
    return ReadOptions(service, mode, job_name or "", consumer_index, num_consumers,
                       DEFAULT_OUTSTANDING if outstanding in (None, -1) else outstanding,
                       target_workers, trainer_id, timeout_s(dispatcher_timeout_ms), window,
                       shared_memory)


def _check_job_name(job_name: Any) -> None:
    if job_name is None:
        return
    if not isinstance(job_name, str):
        raise InvalidArgumentError(
            f"`job_name` must be a string, but `job_name` was of type {type(job_name).__name__}"
        )
    if not job_name:
        raise InvalidArgumentError("`job_name` must not be empty")


def _consumers(consumer_index: Any, num_consumers: Any, job_name: Any
               ) -> tuple[int | None, int | None]:
    """The checked ``(consumer_index, num_consumers)`` of a coordinated read, or neither."""
    if (consumer_index is None) != (num_consumers is None):
        raise InvalidArgumentError(
            "Must either set both `consumer_index` and `num_consumers`, or neither; got "
            f"consumer_index={consumer_index!r}, num_consumers={num_consumers!r}"
        )
    if num_consumers is None:
        return None, None
    num_consumers = check.integer("num_consumers", num_consumers, 1)
    consumer_index = check.integer("consumer_index", consumer_index, 0)
    if consumer_index >= num_consumers:
        raise InvalidArgumentError(
            f"consumer_index must be in [0, num_consumers={num_consumers}), got {consumer_index}"
        )
    if job_name is None:
        raise InvalidArgumentError(
            f"`job_name` must be set when setting `num_consumers`. num_consumers was set to "
            f"{num_consumers}."
        )
    return consumer_index, num_consumers


def _target_workers(target_workers: Any) -> str:
    if not isinstance(target_workers, str) or target_workers.upper() not in TARGET_WORKERS:
        raise InvalidArgumentError(
            f"target_workers must be one of {list(TARGET_WORKERS)}, got {target_workers!r}"
        )
    return target_workers.upper()


def _shared_memory(protocol: Any, target_workers: str, num_consumers: int | None) -> bool:
    """Whether same-host workers are read through shared memory: by default for "AUTO" and
    "LOCAL" (which needs it), never with ``data_transfer_protocol="grpc"`` or for "ANY"."""
    if protocol not in DATA_TRANSFER_PROTOCOLS:
        raise InvalidArgumentError(
            f"data_transfer_protocol must be None, 'grpc' or 'local', got {protocol!r}")
    if target_workers != "LOCAL":
        if protocol == "local":
            raise InvalidArgumentError(
                f"data_transfer_protocol 'local' (shared memory) reads only the workers on "
                f"this host: use it with target_workers='LOCAL', got {target_workers!r}")
        return protocol is None and target_workers == "AUTO" and bool(host_identity())
    if protocol == "grpc":
        raise InvalidArgumentError(
            "target_workers='LOCAL' reads through shared memory; data_transfer_protocol "
            "'grpc' cannot be used with it (use target_workers 'AUTO' or 'ANY')")
    if num_consumers is not None:
        raise InvalidArgumentError(
            "Coordinated reads require non-local workers: num_consumers cannot be used with "
            "target_workers='LOCAL'")
    if not host_identity():
        raise UnimplementedError(
            "target_workers='LOCAL' needs POSIX shared memory (/dev/shm, Linux), which this "
            "host does not have")
    return True


def _trainer_id(cross_trainer_cache: Any, job_name: str | None,
                num_consumers: int | None) -> str:
    if cross_trainer_cache is None:
        return ""
    if not isinstance(cross_trainer_cache, CrossTrainerCache):
        raise InvalidArgumentError(
            "cross_trainer_cache must be a CrossTrainerCache or None, got "
            f"{type(cross_trainer_cache).__name__}"
        )
    if job_name is None:
        raise InvalidArgumentError(
            "Cross-trainer caching requires named jobs. Got empty `job_name`.")
    if num_consumers is not None:
        raise InvalidArgumentError("Cross-trainer caching does not support coordinated reads.")
    return cross_trainer_cache.trainer_id
