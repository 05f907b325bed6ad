"""Server: one task of a training cluster. A ``ps`` task hosts a variable store; a ``worker``
task runs the functions a coordinator schedules and keeps per-worker resources (datasets,
iterators) between them."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from convoy import monitoring
from convoy._base import check
from convoy._transport import rpc as _rpc
from convoy._transport.framed import FramedServer
from convoy._transport.security import MAX_REQUEST_BYTES, Security
from convoy.distribute._limits import MAX_FUNCTION_BYTES
from convoy.distribute._store import VariableStore, serve_operations
from convoy.distribute._wire import (
    PS_METHODS,
    PS_SERVICE,
    STATUS,
    WORKER_METHODS,
    WORKER_SERVICE,
    encode,
    ps_transport,
)
from convoy.distribute._worker_calls import CallRunner
from convoy.distribute._worker_context import WorkerContext, become_worker
from convoy.distribute.cluster import ClusterSpec, validate_task
from convoy.errors import InvalidArgumentError

__all__ = ["STREAMS", "Server"]

log = logging.getLogger(__name__)

#: Streams a task serves at once: Execute streams (one per process using a ps) and Run
#: streams (one per coordinator thread using a worker).
STREAMS = 1024


class Server(_rpc.ServerBase):
    """Serves one task (``job_name``, ``task_index``) of ``cluster_spec`` at its address.

    It binds the host of that address, or ``host``. The security settings are those of
    :class:`~convoy.data.service.WorkerConfig`; a worker also refuses functions that pickle
    to more than ``max_function_bytes``. A ps serves ``Execute``, a worker ``Run``, framed on
    ``framed_port`` of the same host too (0: an ephemeral port; see
    :data:`~convoy.distribute._wire.PS_TRANSPORT_ENV`).
    """

    # A thread for each open stream (a process's Execute, a coordinator thread's Run).
    max_workers = STREAMS
    lends_settings = True  # the functions it runs reach the parameter servers

    def __init__(self, cluster_spec: Any, job_name: str, task_index: int,
                 protocol: str = "grpc", start: bool = True, *, auth_token: str | None = None,
                 auth_token_file: str | None = None, certificate: str | None = None,
                 key: str | None = None, ca: str | None = None, host: str | None = None,
                 insecure: bool = False, max_request_bytes: int = MAX_REQUEST_BYTES,
                 max_function_bytes: int = MAX_FUNCTION_BYTES, framed_port: int = 0) -> None:
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
        validate_task(self.cluster_spec, job_name, task_index)
        self.address = self.cluster_spec.task_address(job_name, task_index)
        spec_host, _, port = self.address.rpartition(":")
        security = Security.load(auth_token, auth_token_file, certificate=certificate, key=key,
                                 ca=ca, host=host or spec_host, insecure=insecure,
                                 max_request_bytes=max_request_bytes)
        super().__init__(int(port), security=security)
        self.max_function_bytes = check.integer("max_function_bytes", max_function_bytes, 1)
        self.framed_port = check.integer("framed_port", framed_port, 0)
        if self.framed_port > 65535:
            raise InvalidArgumentError(f"framed_port must be a port (0 to 65535), got "
                                       f"{self.framed_port}")
        self.service = PS_SERVICE if job_name == "ps" else WORKER_SERVICE
        self.incarnation = uuid.uuid4().hex
        self._pool: ThreadPoolExecutor | None = None  # a worker's extra calls of one Run
        self._store: VariableStore | None = None  # a ps's
        self._calls: CallRunner | None = None  # a worker's
        self._framed: FramedServer | None = None  # a ps's framed Execute, a worker's Run
        self.context = (WorkerContext(task_index, self.cluster_spec.num_tasks("worker"))
                        if job_name == "worker" else None)
        if start:
            self.start()

    def start(self) -> None:
        """Bind and serve; a worker task makes this process that worker first (the first
        call may come as soon as the port is bound)."""
        if self.context is not None and not self.started:
            become_worker(self.context)
        super().start()

    def _methods(self) -> Mapping[_rpc.Method, Callable[[bytes], bytes]]:
        if self.context is None:
            store = self._store = VariableStore()

            def execute(request: bytes | memoryview) -> bytes:
                return serve_operations(store, request)

            if ps_transport() == "framed":  # before the gRPC port: FramedPort may come at once
                self._framed = FramedServer(PS_SERVICE, "Execute", execute, self._security,
                                            self._host, self.framed_port)
            framed_port = None if self._framed is None else self._framed.port
            execute_method, framed_port_method = PS_METHODS
            return {execute_method: execute,
                    framed_port_method: lambda _: encode(framed_port),
                    STATUS: lambda _: encode(self.status())}
        self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="convoy-call")
        calls = self._calls = CallRunner(self._pool, self.max_function_bytes, self.incarnation)
        if ps_transport() == "framed":
            self._framed = FramedServer(WORKER_SERVICE, "Run", calls.run, self._security,
                                        self._host, self.framed_port)
        run_port = None if self._framed is None else self._framed.port
        handlers: dict[str, Callable[[bytes], bytes]] = {
            "Run": calls.run,
            "Ping": lambda _: encode(self.incarnation),
            "Cancel": calls.cancel,
            "Withdraw": calls.withdraw,
            "Free": self.context.free,
            "FramedPort": lambda _: encode(run_port),
        }
        methods = {method: handlers[method.name] for method in WORKER_METHODS}
        methods[STATUS] = lambda _: encode(self.status())
        return methods

    def status(self) -> dict[str, Any]:
        """What ``convoy status`` shows of this task: a ps's variables (name, shape, dtype,
        bytes, its slots' bytes) and dynamic tables (rows, evictions, bytes), a worker's
        functions running and done."""
        status: dict[str, Any] = {"job": self.job_name, "index": self.task_index,
                                  "address": self.address, "incarnation": self.incarnation}
        if self._store is not None:
            status["variables"] = self._store.sizes()
            status["tables"] = self._store.table_sizes()
        if self._calls is not None:
            status.update(functions_running=self._calls.running,
                          functions_done=self._calls.done)
        return status

    def _on_start(self) -> None:
        if self._store is not None:
            monitoring.export("ps")
        log.info("%s task %d serving at %s", self.job_name, self.task_index, self.address)

    def _on_stop(self) -> None:
        if self._framed is not None:
            self._framed.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
