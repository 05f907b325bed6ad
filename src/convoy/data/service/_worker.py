"""WorkerServer: runs tasks the dispatcher assigns and serves their elements over gRPC."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator
from typing import Any

from convoy import _rpc
from convoy.data.service import service_pb2 as pb
from convoy.data.service._config import ShardingPolicy, WorkerConfig
from convoy.data.service._protocol import (
    DISPATCHER,
    DISPATCHER_METHODS,
    ELEMENTS,
    END_OF_SEQUENCE,
    NOT_READY,
    WORKER,
    WORKER_METHODS,
)
from convoy.data.service._task import Task
from convoy.errors import InvalidArgumentError, UnavailableError

log = logging.getLogger(__name__)

#: How long a GetElements call waits for a first element before answering "not ready".
ELEMENT_WAIT_S = 0.5
#: Splits asked of the dispatcher per GetSplits call.
SPLITS_PER_REQUEST = 8
#: A GetElements call never carries more than this many elements ...
MAX_ELEMENTS_PER_CALL = 65_536


class WorkerServer:
    """A data service worker: it heartbeats to the dispatcher, runs the tasks it is given and
    answers consumers' GetElements calls."""

    def __init__(self, config: WorkerConfig, start: bool = True) -> None:
        if not isinstance(config, WorkerConfig):
            raise InvalidArgumentError(
                f"config must be a WorkerConfig, got {type(config).__name__}"
            )
        self._config = config
        self._uid = uuid.uuid4().hex
        self._dispatcher = _rpc.Client(config.dispatcher_address, DISPATCHER,
                                       DISPATCHER_METHODS)
        self._lock = threading.Lock()  # guards _tasks and _finished
        self._tasks: dict[int, Task] = {}
        self._finished: set[int] = set()
        self._heartbeat_lock = threading.Lock()
        self._stopped = threading.Event()
        self._server: Any = None
        self._port = config.port
        self.error: BaseException | None = None
        if start:
            self.start()

    @property
    def _address(self) -> str:
        if self._config.worker_address:
            return self._config.worker_address.replace("%port%", str(self._port))
        return f"localhost:{self._port}"

    def start(self) -> None:
        """Start serving and register with the dispatcher (no-op if already started)."""
        if self._server is not None:
            return
        self._server, self._port = _rpc.serve(
            WORKER, {WORKER_METHODS[0]: self._get_elements}, self._config.port)
        try:  # registered before returning, as TensorFlow's worker: jobs created next see it
            self._heartbeat(self._config.dispatcher_timeout_s)
        except BaseException:
            self.stop()
            raise
        threading.Thread(target=self._heartbeat_loop, name="convoy-worker-heartbeat",
                         daemon=True).start()
        log.info("worker serving at %s", self._address)

    # ----- control plane --------------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        interval = self._config.heartbeat_interval_s
        while not self._stopped.is_set():
            try:
                self._heartbeat(self._config.dispatcher_timeout_s)
            except UnavailableError as error:
                log.error("worker %s stops: %s", self._address, error)
                self.error = error
                self.stop()
                return
            except Exception:
                log.exception("worker heartbeat failed")
            self._stopped.wait(interval)

    def _heartbeat(self, timeout_s: float) -> None:
        with self._heartbeat_lock:
            with self._lock:
                current = list(self._tasks)
            request = pb.WorkerHeartbeatRequest(worker_address=self._address,
                                                worker_uid=self._uid, current_tasks=current)
            response = _rpc.retry(lambda: self._dispatcher.call("WorkerHeartbeat", request),
                                  timeout_s, f"worker {self._address} heartbeat to dispatcher "
                                  f"{self._config.dispatcher_address}", self._stopped.is_set)
            for task_def in response.new_tasks:
                self._add_task(task_def)
            for task_id in response.tasks_to_delete:
                self._remove_task(task_id)

    def _add_task(self, task_def: pb.TaskDef) -> None:
        with self._lock:
            if task_def.task_id in self._tasks:
                return
            self._finished.discard(task_def.task_id)
        splits = None
        if task_def.processing_mode == ShardingPolicy.DYNAMIC.name:
            iteration_id = task_def.iteration_id
            splits = lambda repetition: self._splits(iteration_id, repetition)  # noqa: E731
        task = Task(task_def.task_id, task_def.dataset, task_def.compression, splits)
        with self._lock:
            self._tasks[task_def.task_id] = task

    def _remove_task(self, task_id: int) -> None:
        with self._lock:
            task = self._tasks.pop(task_id, None)
        if task is not None:
            task.stop()

    def _splits(self, iteration_id: int, repetition: int) -> Iterator[tuple[int, int]]:
        request = pb.GetSplitsRequest(iteration_id=iteration_id, repetition=repetition,
                                      max_splits=SPLITS_PER_REQUEST)
        while True:
            response = _rpc.retry(lambda: self._dispatcher.call("GetSplits", request),
                                  self._config.dispatcher_timeout_s,
                                  f"worker {self._address} asking for splits")
            for split in response.splits:
                yield split.start, split.stop
            if response.end_of_splits:
                return

    # ----- data plane -------------------------------------------------------------------------
    def _task(self, task_id: int) -> Task | None:
        with self._lock:
            task = self._tasks.get(task_id)
            if task is not None or task_id in self._finished:
                return task
        self._heartbeat(timeout_s=5.0)  # a task this worker has not heard of yet
        with self._lock:
            task = self._tasks.get(task_id)
        if task is None and task_id not in self._finished:
            raise UnavailableError(f"task {task_id} is not (yet) known to worker {self._address}")
        return task

    def _get_elements(self, request: pb.GetElementsRequest) -> bytes:
        if request.max_elements <= 0 or request.max_bytes <= 0:
            raise InvalidArgumentError(
                f"GetElements needs max_elements > 0 and max_bytes > 0, got "
                f"{request.max_elements} and {request.max_bytes}"
            )
        task = self._task(request.task_id)
        if task is None:
            return END_OF_SEQUENCE
        elements, ended = task.take(min(request.max_elements, MAX_ELEMENTS_PER_CALL),
                                    request.max_bytes, ELEMENT_WAIT_S)
        if elements:
            return ELEMENTS + task.encoder.encode(elements)
        if not ended:
            return NOT_READY
        self._finish(task)
        return END_OF_SEQUENCE

    def _finish(self, task: Task) -> None:
        with self._lock:
            if task.task_id in self._finished:
                return
        # Tell the dispatcher before forgetting the task: a heartbeat that no longer lists a
        # task the dispatcher still thinks unfinished would get it back and run it again.
        request = pb.TaskFinishedRequest(worker_address=self._address, task_id=task.task_id)
        _rpc.retry(lambda: self._dispatcher.call("TaskFinished", request),
                   self._config.dispatcher_timeout_s, f"worker {self._address} reporting "
                   f"task {task.task_id} finished", self._stopped.is_set)
        with self._lock:
            self._finished.add(task.task_id)
            self._tasks.pop(task.task_id, None)

    # ----- lifecycle ---------------------------------------------------------------------------
    def join(self) -> None:
        """Block until the server stops; raises the error that stopped it, if any."""
        if self._server is not None:
            self._server.wait_for_termination()
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """Stop serving and drop all tasks."""
        self._stopped.set()
        if self._server is not None:
            self._server.stop(grace=self._config.shutdown_quiet_period_ms / 1000 or None)
        with self._lock:
            tasks, self._tasks = list(self._tasks.values()), {}
        for task in tasks:
            task.stop()

    def _num_tasks(self) -> int:
        with self._lock:
            return len(self._tasks)

    def __enter__(self) -> WorkerServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


