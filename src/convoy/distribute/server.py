"""Server: one task of a training cluster. A ``ps`` task hosts a variable store; a ``worker``
task runs the functions a coordinator schedules and keeps per-worker resources (datasets,
iterators) between them."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from convoy import _check as check
from convoy import _rpc
from convoy._security import MAX_REQUEST_BYTES, Security
from convoy.distribute._calls import cancel_calls, run_calls
from convoy.distribute._limits import MAX_FUNCTION_BYTES
from convoy.distribute._protocol import (
    PS_METHODS,
    PS_SERVICE,
    WORKER_METHODS,
    WORKER_SERVICE,
    decode_one,
    encode,
    serve_operations,
)
from convoy.distribute._store import VariableStore
from convoy.distribute.cluster import ClusterSpec
from convoy.errors import InvalidArgumentError

log = logging.getLogger(__name__)

#: Streams a task serves at once: Execute streams (one per process using a ps) and Run
#: streams (one per coordinator thread using a worker).
STREAMS = 1024


class WorkerContext:
    """What a function running on a worker can know about where it runs."""

    def __init__(self, task_index: int, num_workers: int) -> None:
        self.task_index = task_index
        self.num_workers = num_workers
        self.resources: dict[int, Any] = {}
        self.creating_dataset = False


_context: WorkerContext | None = None


def worker_context() -> WorkerContext | None:
    """The context of this worker process, or None outside worker tasks."""
    return _context


def resolve_resource(resource_id: int) -> Any:
    """The worker-local object a :class:`ResourceRef` names (called when one is unpickled)."""
    if _context is None or resource_id not in _context.resources:
        raise InvalidArgumentError(
            f"resource {resource_id} does not exist on this worker (was it created with "
            f"ClusterCoordinator.create_per_worker_dataset?)"
        )
    return _context.resources[resource_id]


def free_resources(request: bytes) -> bytes:
    """A worker's ``Free``: delete these per-worker resources, closing those that can be (an
    iterator's background threads); answers how many resources this worker still holds."""
    resource_ids = decode_one(request)
    if type(resource_ids) is not list or not all(type(i) is int for i in resource_ids):
        raise InvalidArgumentError("Free takes a list of resource ids (ints)")
    resources = _context.resources if _context is not None else {}
    for resource_id in resource_ids:
        close = getattr(resources.pop(resource_id, None), "close", None)
        if callable(close):
            try:
                close()
            except Exception:
                log.exception("closing per-worker resource %d failed", resource_id)
    return encode(len(resources))


class ResourceRef:
    """Names a per-worker resource; unpickled on the worker, it becomes the resource."""

    def __init__(self, resource_id: int) -> None:
        self.resource_id = resource_id

    def __reduce__(self) -> Any:
        return (resolve_resource, (self.resource_id,))


class Server(_rpc.ServerBase):
    """Serves one task (``job_name``, ``task_index``) of ``cluster_spec`` at its address.

    It binds the host of that address, or ``host``. The security settings are those of
    :class:`~convoy.data.service.WorkerConfig`; a worker also refuses functions that pickle
    to more than ``max_function_bytes``.
    """

    # A thread for each open stream (a process's Execute, a coordinator thread's Run).
    max_workers = STREAMS
    lends_settings = True  # the functions it runs reach the parameter servers

    def __init__(self, cluster_spec: Any, job_name: str, task_index: int,
                 protocol: str = "grpc", start: bool = True, *, auth_token: str | None = None,
                 auth_token_file: str | None = None, certificate: str | None = None,
                 key: str | None = None, ca: str | None = None, host: str | None = None,
                 insecure: bool = False, max_request_bytes: int = MAX_REQUEST_BYTES,
                 max_function_bytes: int = MAX_FUNCTION_BYTES) -> None:
        if protocol != "grpc":
            raise InvalidArgumentError(f"protocol must be 'grpc', got {protocol!r}")
        self.cluster_spec = ClusterSpec(cluster_spec)
        if job_name not in ("ps", "worker"):
            raise InvalidArgumentError(
                f"job_name must be 'ps' or 'worker' (the chief runs the coordinator and "
                f"needs no server), got {job_name!r}"
            )
        self.job_name = job_name
        self.task_index = task_index
        self.address = self.cluster_spec.task_address(job_name, task_index)
        spec_host, _, port = self.address.rpartition(":")
        security = Security.load(auth_token, auth_token_file, certificate=certificate, key=key,
                                 ca=ca, host=host or spec_host, insecure=insecure,
                                 max_request_bytes=max_request_bytes)
        super().__init__(int(port), security=security)
        self.max_function_bytes = check.integer("max_function_bytes", max_function_bytes, 1)
        self.service = PS_SERVICE if job_name == "ps" else WORKER_SERVICE
        self.incarnation = uuid.uuid4().hex
        self._pool: ThreadPoolExecutor | None = None  # a worker's extra calls of one Run
        if start:
            self.start()

    def _methods(self) -> Mapping[_rpc.Method, Callable[[Any], Any]]:
        if self.job_name == "ps":
            store = VariableStore()
            return {PS_METHODS[0]: lambda request: serve_operations(store, request)}
        # Set before the port is bound: the first call may come at once.
        global _context
        _context = WorkerContext(self.task_index, self.cluster_spec.num_tasks("worker"))
        pool = self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="convoy-call")
        handlers: dict[str, Callable[[Any], Any]] = {
            "Run": lambda request: run_calls(request, pool, self.max_function_bytes),
            "Ping": lambda _: encode(self.incarnation),
            "Cancel": cancel_calls,
            "Free": free_resources,
        }
        return {method: handlers[method.name] for method in WORKER_METHODS}

    def _on_start(self) -> None:
        log.info("%s task %d serving at %s", self.job_name, self.task_index, self.address)

    def _on_stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
