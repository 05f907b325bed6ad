"""WorkerServer: the gRPC shell around :class:`~convoy.data.service._worker.state.WorkerState`.

The worker runs the tasks the dispatcher assigns and serves their elements. Handlers turn
requests into events, apply them under one lock and carry out the instructions: task threads
start and stop at once; heartbeats (which also report tasks' ends) go to the dispatcher from
the worker's control thread, GetSplits calls from the threads of DYNAMIC tasks. A consumer's
GetElements call never waits for a dispatcher RPC longer than it waits for elements.

GetSplits calls are numbered per task: a call whose answer was lost (the dispatcher died
before answering) is sent again with its number, and the dispatcher answers it with the same
splits. A stopping worker answers the calls it is serving ("unavailable": the consumer reads
elsewhere and comes back) before its server shuts down.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import itertools
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from convoy import monitoring
from convoy._base import threads as _threads
from convoy._base.log_summary import RepeatedFailures
from convoy._transport import rpc as _rpc
from convoy._transport.security import LOOPBACK
from convoy._values.codec import decode
from convoy.data.service import service_pb2 as pb
from convoy.data.service._common.config import ShardingPolicy, policy_from_name
from convoy.data.service._common.server_config import WorkerConfig
from convoy.data.service._common.wire import (
    DISPATCHER,
    DISPATCHER_METHODS,
    DRAINING,
    ELEMENT_WAIT_S,
    ELEMENTS,
    END_OF_SEQUENCE,
    NOT_READY,
    WORKER,
    WORKER_METHODS,
)
from convoy.data.service._shm.worker_end import SegmentServer
from convoy.data.service._worker import state as ws
from convoy.data.service._worker.served import ServedTask
from convoy.data.service._worker.task import BufferBudget
from convoy.data.service._worker.trainer_cache import DEFAULT_CACHE_BYTES
from convoy.data.service._worker.trainer_window import WindowStats
from convoy.data.service._worker_save import SaveStreams
from convoy.errors import (
    ConvoyError,
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
    UnavailableError,
)

log = logging.getLogger(__name__)


def _load_malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError, TypeError):  # not glibc
        return None
    return trim


_MALLOC_TRIM = _load_malloc_trim()


def _give_memory_back() -> None:
    """Return the freed pages of a stopped task's buffers to the system (glibc keeps them
    otherwise, and the worker's RSS stays at its highest)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)

#: Splits asked of the dispatcher per GetSplits call.
SPLITS_PER_REQUEST = 8
#: A GetElements call never carries more than this many elements ...
MAX_ELEMENTS_PER_CALL = 65_536
#: A heartbeat call waits this long for its answer at most.
CALL_TIMEOUT_S = 30.0
#: A stopping worker answers "unavailable" until no call has come for this long ...
STOP_QUIET_S = 0.2
#: ... or for this long at most, then stops its server ...
STOP_WAIT_S = 3.0
#: ... giving its last answers this long to leave.
STOP_GRACE_S = 1.0
#: A draining worker (SIGTERM) lets its consumers take what it buffered for this long at most.
DRAIN_TIMEOUT_S = 10.0


class WorkerServer(_rpc.ServerBase):
    """A data service worker: it heartbeats to the dispatcher, runs the tasks it is given and
    answers consumers' GetElements calls."""

    service = WORKER
    lends_settings = True  # a pipeline may read from a data service itself

    def __init__(self, config: WorkerConfig, start: bool = True) -> None:
        if not isinstance(config, WorkerConfig):
            raise InvalidArgumentError(
                f"config must be a WorkerConfig, got {type(config).__name__}"
            )
        security = config.security()
        super().__init__(config.port, security=security)
        self._config = config
        self._uid = uuid.uuid4().hex
        self._dispatcher = _rpc.Client(config.dispatcher_address, DISPATCHER,
                                       DISPATCHER_METHODS, security)
        self._lock = threading.Lock()  # guards everything below
        self._wake = threading.Condition(self._lock)  # for the control thread
        self._answered = threading.Condition(self._lock)  # a heartbeat was answered
        self._state: ws.WorkerState | None = None  # made once the port is bound
        self._running: dict[int, ServedTask] = {}  # the running tasks
        self._outbox: list[ws.SendHeartbeat] = []  # calls for the control thread to make
        self._serving = 0  # GetElements calls being answered
        self._served = threading.Condition(self._lock)  # one was answered
        self._last_call = float("-inf")  # when the latest GetElements call came
        self._stopping = False
        self._draining = False  # takes no more splits; its consumers take what is buffered
        self._control: threading.Thread | None = None
        self._segments = SegmentServer(config.data_transfer_protocol != "grpc")
        self._budget = BufferBudget(config.max_buffered_bytes)
        self.error: BaseException | None = None
        self._metrics: monitoring.MetricsServer | None = None
        self._registered = False
        if start:
            self.start()

    @property
    def _address(self) -> str:
        """What the worker advertises: its ``worker_address``, else what it binds (bound to
        the default loopback, ``localhost:PORT``, TensorFlow's default worker address)."""
        if self._config.worker_address:
            return self._config.worker_address.replace("%port%", str(self.port))
        if self.bound_address == f"127.0.0.1:{self.port}":
            return f"localhost:{self.port}"
        return self.bound_address

    def _methods(self) -> Mapping[_rpc.Method, Callable[[Any], Any]]:
        handlers = {"GetElements": self._get_elements, "PingWorker": self._ping,
                    "GiveBack": self._give_back}
        return {method: handlers[method.name] for method in WORKER_METHODS}

    def _ping(self, request: pb.PingWorkerRequest) -> pb.PingWorkerResponse:
        """The dispatcher checks that this process is alive (a consumer could not reach it)."""
        return pb.PingWorkerResponse(worker_uid=self._uid)

    def _give_back(self, request: pb.GiveBackRequest) -> pb.Empty:
        """Elements a leaving consumer of a shared job had not returned: they go back in
        front of their task's buffer, for the next consumer."""
        served = self._running.get(request.task_id)
        if served is None or served.cached is not None or served.coordinated:
            raise FailedPreconditionError(
                f"worker {self._address} cannot take elements back for task "
                f"{request.task_id}: it does not run it, or reads it in rounds or through the "
                f"cross-trainer cache")
        task = served.task
        if request.incarnation != task.incarnation:
            raise FailedPreconditionError(
                f"worker {self._address} runs task {task.task_id} in its run "
                f"{task.incarnation}, not {request.incarnation}")
        try:
            elements = decode(request.elements)
        except DataLossError as error:  # the caller's bytes, not our data: a bad argument
            raise InvalidArgumentError(
                f"GiveBack's elements are not an encoded list of elements: {error}") from None
        if not task.give_back(elements, list(request.numbers)):
            raise FailedPreconditionError(f"task {task.task_id} has ended")
        return pb.Empty()

    def _on_start(self) -> None:
        # Registered before returning, as TensorFlow's worker: jobs created next see it.
        config = self._config
        _LIVE.add(self)
        monitoring.add_readiness_check(self._check_name, self._not_ready)
        monitoring.export("worker")
        if config.metrics_port is not None:
            self._metrics = monitoring.serve(config.metrics_port, config.host or LOOPBACK)
        with self._lock:
            self._state = ws.WorkerState(self._address, config.heartbeat_interval_s,
                                         config.dispatcher_timeout_s, time.monotonic())
            self._apply(ws.Tick(time.monotonic()))
            (heartbeat,) = self._outbox
            self._outbox.clear()
        assert isinstance(heartbeat, ws.SendHeartbeat)
        waiting = RepeatedFailures(
            log, f"worker {self._address} waiting for dispatcher at "
                 f"{config.dispatcher_address}: registering", level=logging.INFO)

        def failed(error: BaseException) -> None:
            monitoring.HEARTBEATS.labels("failed").inc()
            waiting.failed(error)

        response = _rpc.retry(
            lambda: self._call("WorkerHeartbeat", self._heartbeat_request(heartbeat)),
            config.dispatcher_timeout_s, f"worker {self._address} registering with dispatcher "
            f"{config.dispatcher_address}", lambda: self._stopping, failed)
        waiting.succeeded()
        monitoring.HEARTBEATS.labels("sent").inc()
        self._registered = True
        self._heartbeat_answered(heartbeat, response)
        self._control = _threads.start("convoy-worker-control", self._control_loop,
                                       on_error=self._control_failed)
        saves = SaveStreams(self._call, self._address, self._uid,
                            config.dispatcher_timeout_s, lambda: self._stopping)
        _threads.start("convoy-worker-snapshots", saves.loop, restart=True)
        log.info("worker serving at %s", self._address)

    # ----- the state and its instructions -------------------------------------------------------
    def _apply(self, event: Any) -> ws.Result:
        """Apply ``event`` (holding the lock) and carry out its instructions: tasks start and
        stop here; calls to the dispatcher go to the control thread."""
        assert self._state is not None
        result = self._state.apply(event)
        stopped = False
        for instruction in result.instructions:
            if isinstance(instruction, ws.StartTask):
                self._start_task(instruction.definition)
            elif isinstance(instruction, ws.StopTask):
                served = self._running.pop(instruction.task_id, None)
                if served is not None:
                    served.stop()
                    stopped = True
            elif isinstance(instruction, ws.Shutdown):
                log.error("worker %s stops: %s", self._address, instruction.reason)
                self.error = UnavailableError(instruction.reason)
                self._stopping = True
            elif isinstance(instruction, ws.WaitingForDispatcher):
                log.log(logging.INFO if instruction.recovered else logging.WARNING, "%s",
                        instruction.message)
            elif isinstance(instruction, ws.SendHeartbeat):
                self._outbox.append(instruction)
            elif not isinstance(instruction, ws.HeartbeatNow):  # that one: the wake-up below
                raise TypeError(f"worker {self._address}: no handler for the instruction "
                                f"{instruction!r}")
        if result.instructions:
            self._wake.notify()
        if stopped:  # off the lock: trimming a large heap takes a while
            # memory not given back is only memory kept
            _threads.start("convoy-worker-trim", _give_memory_back, on_error=lambda _: None)
        return result

    def _start_task(self, definition: ws.TaskDefinition) -> None:
        splits = None
        if definition.processing_mode is ShardingPolicy.DYNAMIC:
            splits = functools.partial(self._splits, definition.task_id,
                                       definition.iteration_id, definition.incarnation,
                                       itertools.count(1), threading.Lock())
        served = self._running[definition.task_id] = ServedTask.of(
            definition, splits,
            self._config.cross_trainer_cache_size_bytes or DEFAULT_CACHE_BYTES, self._address,
            self._budget)
        served.start()  # once listed: its splits are asked for only while it is
        if self._draining:
            served.drain()

    # ----- the control thread: all calls to the dispatcher but GetSplits -----------------------
    def _control_loop(self) -> None:
        while (calls := self._next_calls()) is not None:
            for call in calls:
                self._send_heartbeat(call)
        if self.error is not None:
            self.stop()

    def _control_failed(self, error: BaseException) -> None:
        """The control thread failed (a bug): the worker stops, with that error."""
        log.error("worker %s stops: its control thread failed", self._address)
        self.error = error
        self.stop()

    def _next_calls(self) -> list[ws.SendHeartbeat] | None:
        """The calls to make now, waiting until some are due; None once stopping."""
        with self._lock:
            assert self._state is not None
            while not self._stopping:
                now = time.monotonic()
                self._apply(ws.Tick(now))
                if self._outbox:
                    calls, self._outbox = self._outbox, []
                    return calls
                self._wake.wait(max(0.0, self._state.next_heartbeat() - now))
            return None

    def _send_heartbeat(self, heartbeat: ws.SendHeartbeat) -> None:
        try:
            response = self._call("WorkerHeartbeat", self._heartbeat_request(heartbeat))
        except ConvoyError as error:
            monitoring.HEARTBEATS.labels("failed").inc()
            # said every 10 s, summed up (WaitingForDispatcher)
            log.debug("worker %s heartbeat failed: %s", self._address, error)
            with self._lock:
                self._apply(ws.HeartbeatFailed(heartbeat.seq, str(error), time.monotonic()))
            return
        monitoring.HEARTBEATS.labels("sent").inc()
        self._heartbeat_answered(heartbeat, response)

    def _heartbeat_request(self, heartbeat: ws.SendHeartbeat) -> pb.WorkerHeartbeatRequest:
        elements, size = self.buffered()
        return pb.WorkerHeartbeatRequest(worker_address=self._address, worker_uid=self._uid,
                                         current_tasks=heartbeat.current_tasks,
                                         finished_tasks=heartbeat.finished_tasks,
                                         buffered_elements=elements, buffered_bytes=size,
                                         processing=self._processing())

    def _processing(self) -> list[pb.TaskProcessing]:
        """Its running tasks' pipeline time per element since the last heartbeat."""
        with self._lock:
            served = list(self._running.items())
        times = [(task_id, s.task.pace.report()) for task_id, s in served]
        return [pb.TaskProcessing(task_id=t, seconds_per_element=per)
                for t, per in times if per > 0]

    def buffered(self) -> tuple[int, int]:
        """The elements its running tasks buffer for their consumers, and their bytes."""
        with self._lock:
            served = list(self._running.values())
        counts = [task.task.buffered for task in served]
        return sum(n for n, _ in counts), sum(size for _, size in counts)

    def _heartbeat_answered(self, heartbeat: ws.SendHeartbeat,
                            response: pb.WorkerHeartbeatResponse) -> None:
        event = ws.HeartbeatAnswered(heartbeat.seq,
                                     tuple(_definition(t) for t in response.new_tasks),
                                     tuple(response.tasks_to_delete), time.monotonic())
        paused = set(response.paused_tasks)
        with self._lock:
            self._apply(event)
            for task_id, served in self._running.items():  # no consumer: produce no more
                served.task.paused = task_id in paused
            self._answered.notify_all()

    def _call(self, method: str, request: Any) -> Any:
        timeout = min(CALL_TIMEOUT_S, self._config.dispatcher_timeout_s)
        return self._dispatcher.call(method, request, timeout=timeout)

    # ----- task threads: the splits of DYNAMIC tasks -------------------------------------------
    def _splits(self, task_id: int, iteration_id: int, incarnation: int, numbers: Iterator[int],
                one_at_a_time: threading.Lock, repetition: int) -> Iterator[tuple[int, int]]:
        """The splits of one repetition of a task. ``numbers`` and ``one_at_a_time`` belong to
        the task: request ``n`` of any run of a task gets the same answer, so a run that
        replaces another replays its splits before it gets new ones."""
        # read without the lock: one dict lookup is atomic
        def stopped() -> bool:
            return self._stopping or self._draining or task_id not in self._running

        while True:
            with one_at_a_time:
                if stopped():  # a pass may be empty: without this, repeat() would spin
                    raise UnavailableError(f"task {task_id} was stopped on worker "
                                           f"{self._address}")
                request = pb.GetSplitsRequest(
                    iteration_id=iteration_id, repetition=repetition,
                    max_splits=SPLITS_PER_REQUEST, task_id=task_id, worker_uid=self._uid,
                    request_number=next(numbers), incarnation=incarnation)
                response = _rpc.retry(
                    functools.partial(self._dispatcher.call, "GetSplits", request),
                    self._config.dispatcher_timeout_s,
                    f"worker {self._address} asking for splits of task {task_id}", stopped)
            for split in response.splits:
                yield split.start, split.stop
            if response.end_of_splits:
                return

    # ----- consumers ---------------------------------------------------------------------------
    def _get_elements(self, request: pb.GetElementsRequest) -> bytes:
        self._segments.requested(request)  # whatever becomes of the call
        if request.max_elements <= 0 or request.max_bytes <= 0:
            raise InvalidArgumentError(
                f"GetElements needs max_elements > 0 and max_bytes > 0, got "
                f"{request.max_elements} and {request.max_bytes}"
            )
        with self._lock:
            self._last_call = time.monotonic()
            self._check_serving()
            self._serving += 1
        try:
            return self._serve(request)
        finally:
            with self._lock:
                self._serving -= 1
                self._served.notify_all()

    def _serve(self, request: pb.GetElementsRequest) -> bytes:
        deadline = time.monotonic() + ELEMENT_WAIT_S
        answer, served = self._answer(ws.ElementsRequested, request.task_id, deadline)
        if served is not None and (request.consumer_index >= 0 or served.coordinated):
            return self._serve_rounds(served, request, deadline)
        if served is not None:
            task = served.task
            if request.incarnation and request.incarnation != task.incarnation:
                raise UnavailableError(
                    f"worker {self._address} runs task {task.task_id} in its run "
                    f"{task.incarnation}, not {request.incarnation}")
            taken = self._take(served, request, max(0.0, deadline - time.monotonic()))
            if taken:
                numbers, elements = task.numbered(taken)
                monitoring.ELEMENTS_SERVED.inc(len(elements))
                if self._segments.serves(request):
                    return self._segments.answer(request, elements, numbers)
                message = b"".join([numbers, ELEMENTS, *task.encoder.encode_parts(elements)])
                monitoring.BYTES_SERVED.inc(len(message))
                return message
            if taken is not None:
                return NOT_READY
            # the end, if the worker is not stopping: wait for the dispatcher to know it
            answer, _ = self._answer(ws.TaskEnded, task.task_id,
                                     time.monotonic() + ELEMENT_WAIT_S)
        if isinstance(answer, (ws.EndOfSequence, ws.Finishing)):  # Finishing: waited enough
            return END_OF_SEQUENCE
        if isinstance(answer, ws.NotReady):
            return NOT_READY
        assert isinstance(answer, ws.Refused)
        raise answer.error

    def _take(self, served: ServedTask, request: pb.GetElementsRequest, wait_s: float
              ) -> list[Any] | None:
        """Elements of ``served`` for ``request`` (as :meth:`ServedTask.take`)."""
        if not self._still_served(served):
            return None  # stopped since it was found: the caller says why
        return served.take(request.trainer_id, min(request.max_elements, MAX_ELEMENTS_PER_CALL),
                           request.max_bytes, wait_s)

    def _still_served(self, served: ServedTask) -> bool:
        return self._running.get(served.task_id) is served  # one dict lookup: atomic

    def cross_trainer_cache_stats(self) -> dict[int, WindowStats]:
        """The cross-trainer caches of the running tasks, by task id: elements produced into
        each, what it holds, and the elements each trainer skipped by falling behind it."""
        with self._lock:
            served = list(self._running.values())
        return {task.task_id: stats for task in served
                if (stats := task.cache_stats()) is not None}

    def _serve_rounds(self, served: ServedTask, request: pb.GetElementsRequest,
                      deadline: float) -> bytes:
        """Answer a coordinated read: the consumer's elements of the rounds it asks for."""
        if not self._still_served(served):  # stopped since it was found
            raise InvalidArgumentError(
                f"task {served.task_id} is not a coordinated read, but the request has "
                f"consumer_index {request.consumer_index}")
        try:
            elements = served.rounds(request.consumer_index, request.round_index,
                                     min(request.max_elements, MAX_ELEMENTS_PER_CALL),
                                     request.round_timeout_ms / 1000, deadline,
                                     request.reader_id)
        except ConvoyError:
            with self._lock:
                self._check_serving()  # a stopped task ends its rounds: say stopping instead
            raise
        if not elements:
            return NOT_READY
        answer = ELEMENTS + served.task.encoder.encode(elements)
        monitoring.ELEMENTS_SERVED.inc(len(elements))
        monitoring.BYTES_SERVED.inc(len(answer))
        return answer

    def _answer(self, asked: type, task_id: int, deadline: float
                ) -> tuple[ws.Answer | None, ServedTask | None]:
        """The state's answer to ``asked`` (ElementsRequested or TaskEnded) and the task to
        serve from, if running. While the answer waits for a heartbeat (a task not known yet,
        an end not acknowledged yet), waits for it until ``deadline``."""
        with self._lock:
            self._check_serving()
            answer = self._apply(asked(task_id, time.monotonic())).answer
            while (isinstance(answer, (ws.NotReady, ws.Finishing)) and not self._stopping
                   and self._answered.wait(max(0.0, deadline - time.monotonic()))):
                answer = self._apply(ws.ElementsRequested(task_id, time.monotonic())).answer
            self._check_serving()
            if isinstance(answer, ws.Serve):
                return answer, self._running[task_id]
            return answer, None

    def _check_serving(self) -> None:
        if self._stopping and self._draining:
            raise UnavailableError(f"worker {self._address} {DRAINING}: it leaves, and its "
                                   "tasks go on elsewhere")
        if self._stopping or self._state is None:
            raise UnavailableError(f"worker {self._address} is "
                                   f"{'stopping' if self._stopping else 'starting'}")

    # ----- lifecycle ---------------------------------------------------------------------------
    def drain(self, timeout_s: float = DRAIN_TIMEOUT_S) -> bool:
        """Leave gracefully (what SIGTERM does): take no more splits and stop producing; let
        the consumers take what is buffered for ``timeout_s`` at most (a task that is not
        DYNAMIC then ends where it stopped); deregister, so that the dispatcher has the
        unfinished DYNAMIC tasks run again elsewhere at once, exactly once (the next run
        replays their splits and skips what the consumers received); then :meth:`stop`.
        Returns whether the consumers took everything in time."""
        with self._lock:
            self._draining = True
            served = list(self._running.values())
        log.info("worker %s draining: its consumers take what it buffered (for %.1f s at "
                 "most)", self._address, timeout_s)
        for task in served:
            task.drain()
        deadline = time.monotonic() + timeout_s
        while not (drained := self._drained()) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not drained:
            log.warning("worker %s leaves after %.1f s of draining with elements still "
                        "buffered: its DYNAMIC tasks make them again elsewhere", self._address,
                        timeout_s)
        self.stop(deregister=True)
        return drained

    def _drained(self) -> bool:
        """Whether every task is drained and, unless DYNAMIC, its end acknowledged."""
        with self._lock:
            assert self._state is not None
            return all(  # consumers' calls keep coming: the ones in flight end with stop()
                served.task.drained and (served.task.incarnation or task_id in self._state.ended)
                for task_id, served in self._running.items())

    def _deregister(self) -> None:
        """Tell the dispatcher this worker leaves, once no heartbeat can follow (one would
        register it again)."""
        if self._control is not None:
            self._control.join(CALL_TIMEOUT_S)
        try:
            self._call("DeregisterWorker", pb.DeregisterWorkerRequest(
                worker_address=self._address, worker_uid=self._uid))
        except ConvoyError as error:
            log.warning("worker %s could not deregister (the dispatcher declares it lost "
                        "once it finds it gone): %s", self._address, error)

    def stop(self, grace: float | None = None, deregister: bool = False) -> None:
        """Stop producing and answer GetElements calls "unavailable" (their consumers read
        elsewhere and come back later) until none is being served and none has come for
        ``STOP_QUIET_S``; then stop the server. Its last answers get ``grace`` seconds to
        leave (by default the config's shutdown quiet period, at least ``STOP_GRACE_S``).
        Stopping the server while calls arrive would cancel them. With ``deregister`` (as
        :meth:`drain` does) it first tells the dispatcher that it leaves."""
        with self._lock:
            self._stopping = True
            self._wake.notify_all()
            self._answered.notify_all()
        if deregister:
            self._deregister()
        self._on_stop()  # stopping the tasks wakes the calls waiting for their elements
        self._quiesce()
        if grace is None:
            grace = max(self._config.shutdown_quiet_period_ms / 1000, STOP_GRACE_S)
        super().stop(grace)

    def _quiesce(self) -> None:
        """Wait (``STOP_WAIT_S`` at most) until no call is being served or has come lately."""
        deadline = time.monotonic() + STOP_WAIT_S
        with self._lock:
            while (now := time.monotonic()) < deadline:
                quiet_for = now - self._last_call
                if not self._serving and quiet_for >= STOP_QUIET_S:
                    return
                self._served.wait(min(deadline - now, max(STOP_QUIET_S - quiet_for, 0.01)))
            log.warning("worker %s stops while consumers still call it (%d being answered)",
                        self._address, self._serving)

    def _on_stop(self) -> None:
        """Stop every task (again after :meth:`stop`: then there is none left)."""
        with self._lock:
            served, self._running = list(self._running.values()), {}
        for task in served:
            task.stop()
        self._segments.close()
        _LIVE.discard(self)
        monitoring.remove_readiness_check(self._check_name)
        if self._metrics is not None:
            self._metrics.close()

    @property
    def _check_name(self) -> str:
        return f"data worker {id(self):x}"

    def _not_ready(self) -> str | None:
        """Why this worker is not ready (None: it is registered and serving)."""
        if self._stopping:
            return "stopping"
        return None if self._registered else "not registered with its dispatcher yet"

    def _num_tasks(self) -> int:
        """How many tasks run here (for tests and introspection)."""
        with self._lock:
            return len(self._running)

    def join(self) -> None:
        """Block until the server stops; raises the error that stopped it, if any."""
        super().join()
        if self.error is not None:
            raise self.error


#: The workers running in this process, whose buffers the BUFFERED_BYTES gauge adds up.
_LIVE: weakref.WeakSet[WorkerServer] = weakref.WeakSet()
monitoring.BUFFERED_BYTES.set_function(
    lambda: float(sum(worker.buffered()[1] for worker in list(_LIVE))))
monitoring.MAX_BUFFERED_BYTES.set_function(
    lambda: float(sum(worker._config.max_buffered_bytes for worker in list(_LIVE))))


def _definition(task: pb.TaskDef) -> ws.TaskDefinition:
    return ws.TaskDefinition(task.task_id, task.iteration_id, task.dataset,
                             policy_from_name(task.processing_mode), task.compression,
                             task.worker_index, task.num_workers, task.incarnation,
                             tuple((s.start, s.stop) for s in task.skip),
                             task.cross_trainer_cache, task.num_consumers, task.seed,
                             task.skip_count)
