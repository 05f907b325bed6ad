"""The threads of one consumer's reading of one iteration.

:meth:`Reader.open` joins (or creates) the job and the iteration ``(job, repetition)``; then
a heartbeat thread keeps the task list fresh and learns when the iteration has finished, and
reader threads pull batches of elements from the workers' tasks into a bounded channel the
consumer takes them from. What to do next is decided by :class:`ReaderState`; these threads
only carry its instructions out.

The module is longer than most because it is one concept, the shell of one reading: its
decisions, events and resume positions already live in the client wing (``_client/``), and
the dispatcher's and the workers' sides share the reader's lock, state and channel.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

from convoy import monitoring
from convoy._base import threads as _threads
from convoy._transport import rpc as _rpc
from convoy._transport.channel import Channel, Closed
from convoy._values.codec import Encoder, decode
from convoy.data.service import service_pb2 as pb
from convoy.data.service._client.coordinated_reader_state import (
    CoordinatedReaderState,
    ReadRounds,
    coordinated_config,
)
from convoy.data.service._client.local_tasks import LocalTasks
from convoy.data.service._client.options import ReadOptions
from convoy.data.service._client.reader_events import (
    CancelResults,
    Close,
    ElementsArrived,
    ElementsReturned,
    EndOfSequence,
    EndResults,
    FailResults,
    GivenBack,
    HeartbeatFailed,
    HeartbeatNow,
    HeartbeatView,
    ListedTask,
    NextRead,
    Read,
    ReadFailed,
    ReportUnreachable,
    StopReading,
    Warn,
    WorkerUnreachable,
)
from convoy.data.service._client.reader_state import ReaderConfig, ReaderState
from convoy.data.service._client.resume import Returned
from convoy.data.service._common.config import ShardingPolicy
from convoy.data.service._common.pace import ConsumerPace
from convoy.data.service._common.ranges import runs
from convoy.data.service._common.static_policy import is_static, reads_local_workers
from convoy.data.service._common.wire import (
    ELEMENT_WAIT_S,
    ELEMENTS,
    END_OF_SEQUENCE,
    NOT_READY,
    NUMBERED,
    SHARED_MEMORY,
    WORKER,
    WORKER_METHODS,
    read_numbers,
)
from convoy.data.service._shm.consumer_end import SegmentReader, free_orphans, reader_identity
from convoy.errors import (
    AbortedError,
    CancelledError,
    ConvoyError,
    DataLossError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    UnavailableError,
)

log = logging.getLogger(__name__)

#: How often an iterator asks the dispatcher for its task list.
HEARTBEAT_INTERVAL_S = 0.2
#: Bytes asked for per GetElements call.
BYTES_PER_CALL = 16 << 20
#: A GetElements call that has no answer by then counts as its worker being unreachable: the
#: worker answers within ELEMENT_WAIT_S; the rest is room for a large reply on a busy machine.
GET_ELEMENTS_DEADLINE_S = ELEMENT_WAIT_S + 10.0
#: How long a report of an unreachable worker waits for the dispatcher's own check.
REPORT_TIMEOUT_S = 15.0
#: How long a reading at its end waits for its last position (see Reader._keep_final).
FINAL_POSITION_TIMEOUT_S = 5.0
#: What a GetElements call fails with when its worker is away (gone, stopping, not answering),
#: as TensorFlow's client sees it: the worker is retried, not the reading failed.
WORKER_AWAY = (UnavailableError, DeadlineExceededError, CancelledError, AbortedError)


#: The (job, repetition) pairs found finished so far in this process: each is warned once.
_WARNED_FINISHED: set[tuple[str, int]] = set()


def _warn_finished(job: str, repetition: int) -> None:
    """Say, once per process, that a finished iteration was opened again (it reads nothing)."""
    if (job, repetition) in _WARNED_FINISHED:
        return
    _WARNED_FINISHED.add((job, repetition))
    warnings.warn(
        f"Repetition {repetition} of job {job!r} has already been read to its end: it yields "
        f"nothing. To read the dataset again, call set_epoch(n) with a new epoch (convoy.torch), "
        f"or use a new job_name or repetition.", RuntimeWarning, stacklevel=4)


class Reader:
    """One consumer's reading of one iteration. ``_cond`` guards ``_state`` and ``_workers``."""

    def __init__(self, options: ReadOptions, dispatcher: _rpc.Client, client_id: int,
                 first_round: int = 0) -> None:
        self._options = options
        self._dispatcher = dispatcher
        self._client_id = client_id
        self._pid = os.getpid()
        self._cond = threading.Condition()
        if options.num_consumers is None:
            self._state = ReaderState(ReaderConfig(
                window=options.window, outstanding=options.max_outstanding_requests,
                unreachable_timeout_s=options.timeout_s,
                can_skip=not is_static(options.processing_mode)))
        else:
            self._state = CoordinatedReaderState(
                coordinated_config(options.window, options.timeout_s), first_round)
        self._workers: dict[str, _rpc.Client] = {}
        self._wake = threading.Event()  # set to heartbeat now rather than at the next interval
        policy = options.processing_mode
        self._local = (LocalTasks(policy, options.target_workers)
                       if reads_local_workers(policy, options.target_workers) else None)
        # set: same-host workers answer in shared memory
        self._shared_memory = reader_identity() if options.shared_memory else None
        self._segments = SegmentReader()
        self.returned = Returned()  # what the consumer has returned (for saving its position)
        self._batch: _Batch | None = None  # being returned
        self._taken = 0  # elements of it returned so far
        self._ended = False  # the consumer has taken the last element
        # A consumer of a shared job gives back what it fetched but had not returned.
        self._gives_back = bool(options.job_name and options.num_consumers is None
                                and not options.trainer_id)
        self._left: list[_Batch] = []  # batches not returned, once closed
        #: a shared job read to its end: its position then (the others resume with it)
        self.final: tuple[pb.GetResumePointResponse, Returned] | None = None
        self._last_heard = time.monotonic()  # the latest answer of the dispatcher or a worker
        self._pace = ConsumerPace()  # the consumer's pace, for the dispatcher's estimate
        #: Batches of elements as (task id, their numbers, elements), in the order they arrived.
        self.results: Channel[_Batch] = Channel(
            "elements read from the data service",
            max_items=2 * options.max_outstanding_requests)

    @classmethod
    def open(cls, dispatcher: _rpc.Client, options: ReadOptions, dataset_id: str,
             repetition: int, resume: pb.ResumePoint | None = None) -> Reader:
        """Join the iteration ``repetition`` of the job reading ``dataset_id``; start reading
        (where a saved reading stopped, given its ``resume`` point: then the job is new).
        The reader owns ``dispatcher`` from then on (it is closed if opening fails)."""

        try:
            job, iteration = _join_iteration(dispatcher, options, dataset_id, repetition,
                                             resume)
        except BaseException:
            dispatcher.close()
            raise
        if iteration.iteration_finished:
            _warn_finished(options.job_name or str(job.job_id), repetition)
        first_round = resume.round_index if resume is not None else 0
        reader = cls(options, dispatcher, iteration.client_id, first_round)
        monitoring.export("consumer")
        try:
            reader._heartbeat()
        except BaseException:
            reader.close()
            raise
        _threads.start("convoy-client-heartbeat", reader._heartbeat_loop,
                       on_error=reader._thread_failed)
        # a coordinated read has one request in flight at a time: one thread makes them
        threads = 1 if options.num_consumers is not None else options.max_outstanding_requests
        for _ in range(threads):
            _threads.start("convoy-client-reader", reader._read_loop,
                           on_error=reader._thread_failed)
        return reader

    @staticmethod
    def join_at_end(dispatcher: _rpc.Client, options: ReadOptions, dataset_id: str,
                    resume: pb.ResumePoint) -> pb.GetResumePointResponse:
        """Join the resumed iteration of a shared job as a consumer saved at the job's end,
        and leave at once: the iteration waits for every consumer that saved the job. Its
        position in that iteration; ``dispatcher`` is closed."""
        try:
            _, iteration = _join_iteration(dispatcher, options, dataset_id, 0, resume)
            request = pb.GetResumePointRequest(client_id=iteration.client_id)
            point: pb.GetResumePointResponse = _rpc.retry(
                lambda: dispatcher.call("GetResumePoint", request), options.timeout_s,
                f"GetResumePoint at dispatcher {dispatcher.address}")
            try:
                dispatcher.call("ReleaseClient", pb.ReleaseClientRequest(
                    client_id=iteration.client_id), timeout=2)
            except ConvoyError:
                pass  # the dispatcher forgets silent clients by itself
            return point
        finally:
            dispatcher.close()

    def elements(self) -> Iterator[Any]:
        """The iteration's elements, for the consumer; raises the error that ended it. The
        reader closes once they end."""
        wait = monitoring.CONSUMER_WAIT_SECONDS
        try:
            while True:
                started = time.perf_counter()
                self._pace.wait_started()
                try:
                    task_id, numbers, batch = self._next_batch()
                except Closed:
                    break
                wait.observe(time.perf_counter() - started)
                self._pace.wait_ended()
                self._batch = (task_id, numbers, batch)
                self._taken = 0
                for element in batch:
                    self._taken += 1
                    self._pace.took()
                    if self._taken == len(batch):
                        # Counted as returned as its last element is handed out, not at the
                        # consumer's next call: a coordinated consumer one request ahead of
                        # another (whose answer was lost with its worker) must have room in
                        # its window to ask the new process for its next rounds while the
                        # consumer waits on the other one, or neither moves.
                        self._apply(ElementsReturned(len(batch)))
                    yield element
                self._batch = None
                self.returned.commit(task_id, numbers, len(batch))
            self._ended = True
            self._keep_final()
        finally:
            self.close()

    def _keep_final(self) -> None:
        """Keep the position of a shared job's reading at its end, while the dispatcher still
        knows this consumer: a state saved from it joins the job's resumed iteration, which
        waits for every consumer of the saved job. Without it (the dispatcher did not answer
        at once), such a state resumes alone."""
        if not (self._gives_back and self._options.processing_mode is ShardingPolicy.DYNAMIC):
            return
        try:
            point = self._dispatcher.call("GetResumePoint", pb.GetResumePointRequest(
                client_id=self._client_id), timeout=FINAL_POSITION_TIMEOUT_S)
        except ConvoyError as error:
            log.warning("Could not keep the position of job %s at its end: %s (a state saved "
                        "now resumes without joining the job's other consumers)",
                        self._options.job_name, error)
            return
        self.final = point, self.returned

    def _next_batch(self) -> _Batch:
        """The next batch for the consumer. Its wait is as long as the reading moves: every
        call of the reader's threads has a deadline and the reader state bounds how long a
        worker or the dispatcher may stay away, so a pipeline that is merely slow is waited
        for (and warned about every ``dispatcher_timeout_ms``). Once nothing at all has come
        back (no heartbeat answer, no worker answer) for twice that, longer than any call and
        retry of the reader may take, the reading can no longer move: the wait fails, naming
        what it waited for."""
        timeout = self._options.timeout_s
        while True:
            try:
                return self.results.get(timeout=timeout)
            except TimeoutError:
                pass
            with self._cond:
                silent = time.monotonic() - self._last_heard
                tasks = ", ".join(f"{t.task_id} on {t.worker_address}"
                                  for t in self._state.tasks.values() if not t.ended) or "none"
            waiting = (f"elements of job {self._options.job_name or '(anonymous)'} from the "
                       f"data service (tasks: {tasks})")
            if silent >= 2 * timeout:
                raise DeadlineExceededError(
                    f"No answer from the dispatcher at {self._dispatcher.address} nor from any "
                    f"worker for {silent:.1f} s (twice dispatcher_timeout_ms) while waiting "
                    f"for {waiting}")
            log.warning("Still waiting for %s: none for %.0f s (the service answers; its "
                        "pipeline may be slow)", waiting, timeout)

    @property
    def finished(self) -> bool:
        """Whether the consumer has taken every element (the reading ended normally)."""
        with self._cond:
            return isinstance(self._state.outcome, EndResults) and self._ended

    def position(self) -> tuple[pb.GetResumePointResponse, Returned]:
        """What saving this reading needs: the iteration's split cursor and tasks (from the
        dispatcher) and what the consumer has returned, up to the element it has now."""
        if self._state.closed:
            raise FailedPreconditionError("cannot save a data service iterator after close()")
        point = _rpc.retry(
            lambda: self._dispatcher.call("GetResumePoint", pb.GetResumePointRequest(
                client_id=self._client_id)), self._options.timeout_s,
            f"GetResumePoint at dispatcher {self._dispatcher.address}")
        returned = Returned({t: list(r) for t, r in self.returned.ranges.items()},
                            dict(self.returned.counts))
        if self._batch is not None:
            returned.commit(self._batch[0], self._batch[1], self._taken)
        return point, returned

    def rounds(self) -> tuple[int, list[int]]:
        """A coordinated read's first round and its task list (task ids, in turn order)."""
        with self._cond:
            assert isinstance(self._state, CoordinatedReaderState)
            return self._state.first_round, [task.task_id for task in self._state.order]

    def close(self) -> None:
        """Stop reading, tell the dispatcher this consumer has gone, close the clients."""
        if os.getpid() != self._pid:
            return  # a forked child's copy: the reading is its parent's
        if not self._apply(Close()):
            return  # already closed
        self._wake.set()
        if self._gives_back:
            self._give_back()
        with self._cond:
            received = _task_ranges(self._state.all_received())
        try:
            self._dispatcher.call("ReleaseClient", pb.ReleaseClientRequest(
                client_id=self._client_id, received=received), timeout=2)
        except ConvoyError:
            pass  # the dispatcher forgets silent clients by itself
        with self._cond:  # no reader thread opens a client once closed
            clients = [self._dispatcher, *self._workers.values()]
            self._workers.clear()
        for client in clients:
            client.close()  # calls still in flight fail, and their answers are moot
        self._segments.close()
        if self._shared_memory is not None:
            free_orphans()

    def _give_back(self) -> None:
        """Give the elements fetched but not returned back to their tasks, once no request
        is in flight (an answer arriving after the close is given back too)."""
        with self._cond:
            self._cond.wait_for(lambda: not any(t.in_flight for t in self._state.tasks.values()),
                                timeout=ELEMENT_WAIT_S + 2.0)
            left, self._left = self._left, []
            if self._batch is not None:  # the rest of the batch being returned
                task_id, numbers, batch = self._batch
                left.insert(0, (task_id, _after(numbers, self._taken), batch[self._taken:]))
                self._batch = None
            tasks = {t: (task.worker_address, task.incarnation)
                     for t, task in self._state.tasks.items()}
        by_task: dict[int, tuple[list[int], list[Any]]] = {}
        for task_id, numbers, batch in left:
            if batch:
                task_numbers, elements = by_task.setdefault(task_id, ([], []))
                task_numbers.extend(n for start, stop in numbers for n in range(start, stop))
                elements.extend(batch)
        encoder = Encoder(None)
        for task_id, (task_numbers, elements) in by_task.items():
            address, incarnation = tasks[task_id]
            try:
                with self._cond:
                    worker = self._worker(address)
                worker.call("GiveBack", pb.GiveBackRequest(
                    task_id=task_id, incarnation=incarnation if task_numbers else 0,
                    elements=encoder.encode(elements), numbers=task_numbers), timeout=5)
            except ConvoyError as error:
                log.warning("Could not give %d elements of task %d back to worker %s as this "
                            "consumer left: %s", len(elements), task_id, address, error)
                continue
            self._apply(GivenBack(task_id, tuple(runs(task_numbers))))

    def _apply(self, event: Any) -> tuple[Any, ...]:
        """Apply ``event`` and carry out the instructions it calls for."""
        with self._cond:
            if isinstance(event, _ANSWERS):
                self._last_heard = time.monotonic()
            instructions = self._state.apply(event)
            self._cond.notify_all()
            for instruction in instructions:
                if isinstance(instruction, EndResults):
                    self.results.close()
                elif isinstance(instruction, FailResults):
                    self.results.fail(instruction.error)
                elif isinstance(instruction, CancelResults):
                    if self._gives_back:
                        self._left.extend(self.results.drain())
                    else:
                        self.results.cancel()
                elif isinstance(instruction, HeartbeatNow):
                    self._wake.set()
                elif isinstance(instruction, Warn):
                    log.log(logging.INFO if instruction.info else logging.WARNING, "%s",
                            instruction.message)
                elif isinstance(instruction, ReportUnreachable):
                    # a report lost is a worker found lost later, by its timeout
                    _threads.start("convoy-client-report", self._report_unreachable,
                                   instruction, on_error=lambda _: None)
            return instructions

    # ----- the dispatcher's side ------------------------------------------------------------------
    def _heartbeat(self) -> None:
        with self._cond:
            settled, received = self._state.reports()
        target, waited, elapsed = self._pace.report()
        request = pb.ClientHeartbeatRequest(
            client_id=self._client_id, received=_task_ranges(received),
            settled=[pb.TaskRun(task_id=t, incarnation=i) for t, i in settled],
            target_processing_time_s=target, waited_s=waited, elapsed_s=elapsed)
        response = _rpc.retry(lambda: self._dispatcher.call("ClientHeartbeat", request),
                              self._options.timeout_s,
                              f"heartbeat to dispatcher {self._dispatcher.address}",
                              lambda: self._state.closed)
        tasks = tuple(ListedTask(info.task_id, info.worker_address, info.incarnation, info.held,
                                 info.held_for) for info in response.tasks)
        finished = response.iteration_finished
        if self._local is not None:  # static sharding: this host's workers only
            tasks, finished = self._local.view(tasks, finished)
        self._apply(HeartbeatView(tasks, finished, settled, received, time.monotonic(),
                                  response.iteration_failed))

    def _thread_failed(self, error: BaseException) -> None:
        """A thread of the reader failed: so does the reading, with its error."""
        if not isinstance(error, ConvoyError):
            error = InternalError(f"a thread of the data service reader failed: "
                                  f"{type(error).__name__}: {error}")
        self._apply(HeartbeatFailed(error))

    def _report_unreachable(self, report: ReportUnreachable) -> None:
        """Tell the dispatcher; once it declares the worker lost, the next heartbeat lists the
        task's next run."""
        request = pb.ReportUnreachableWorkerRequest(
            worker_address=report.worker_address, task_id=report.task_id,
            client_id=self._client_id)
        try:
            answer = self._dispatcher.call("ReportUnreachableWorker", request,
                                           timeout=REPORT_TIMEOUT_S)
        except ConvoyError as error:  # the heartbeats say what became of the dispatcher
            log.debug("reporting worker %s unreachable failed: %s", report.worker_address, error)
            return
        if answer.declared_lost:
            self._wake.set()

    def _heartbeat_loop(self) -> None:
        while True:
            self._wake.wait(HEARTBEAT_INTERVAL_S)
            self._wake.clear()
            with self._cond:
                if self._state.over:
                    return
            try:
                self._heartbeat()
            except ConvoyError as error:
                self._apply(HeartbeatFailed(error))
                return

    # ----- the workers' side ----------------------------------------------------------------------
    def _read_loop(self) -> None:
        consumer_index = self._options.consumer_index
        request = pb.GetElementsRequest(
            consumer_index=-1 if consumer_index is None else consumer_index,
            max_bytes=BYTES_PER_CALL, round_timeout_ms=int(self._options.timeout_s * 1000),
            trainer_id=self._options.trainer_id, shared_memory=self._shared_memory,
            reader_id=self._client_id)
        while True:
            with self._cond:
                read = self._next_read()
                if read is None:
                    return
                worker = self._worker(read.worker_address)
            request.task_id, request.max_elements = read.task_id, read.max_elements
            request.incarnation = read.incarnation
            if isinstance(read, ReadRounds):
                request.round_index = read.round_index
            self._apply(self._read(read.task_id, worker, request))

    def _next_read(self) -> Read | None:
        """The next task to read, waiting (holding ``_cond``) while none is ready."""
        while True:
            now = time.monotonic()
            (step,) = self._state.apply(NextRead(now))
            if isinstance(step, Read):
                return step
            if isinstance(step, StopReading):
                return None
            wait = HEARTBEAT_INTERVAL_S if step.until is None else step.until - now
            self._cond.wait(min(wait, HEARTBEAT_INTERVAL_S))

    def _worker(self, address: str) -> _rpc.Client:
        worker = self._workers.get(address)
        if worker is None:
            worker = self._workers[address] = _rpc.Client(address, WORKER, WORKER_METHODS)
        return worker

    def _read(self, task_id: int, worker: _rpc.Client, request: pb.GetElementsRequest) -> Any:
        """One GetElements call; what came of it, as an event (its elements are in
        ``results`` by then, so a task's elements keep their order)."""
        numbers: list[tuple[int, int]] = []
        releases = self._segments.released(worker.address)
        request.ClearField("released_segments")
        request.released_segments.extend(releases)
        try:
            reply = worker.call("GetElements", request, timeout=GET_ELEMENTS_DEADLINE_S)
            status, message = reply[:1], memoryview(reply)[1:]
            if status == END_OF_SEQUENCE:
                return EndOfSequence(task_id)
            if status == NUMBERED:
                numbers, inner = read_numbers(message)
                status, message = inner[:1].tobytes(), inner[1:]
            elements = answer_elements(self._segments, worker.address, status, message)
        except ConvoyError as error:
            self._segments.unreported(worker.address, releases)
            if not isinstance(error, WORKER_AWAY):
                return ReadFailed(task_id, error)
            if self._shared_memory is not None:
                free_orphans()  # the worker may have died, leaving segments behind
            return WorkerUnreachable(task_id, error, time.monotonic())
        numbered = tuple(numbers)
        if elements and not self.results.put((task_id, numbered, elements)):
            with self._cond:  # refused: the consumer has gone
                if self._gives_back:
                    self._left.append((task_id, numbered, elements))
        return ElementsArrived(task_id, len(elements), numbered)


def _join_iteration(dispatcher: _rpc.Client, options: ReadOptions, dataset_id: str,
                    repetition: int, resume: pb.ResumePoint | None) -> tuple[Any, Any]:
    """Get (or create) the job reading ``dataset_id`` and its iteration ``repetition``: the
    dispatcher's answers to both."""

    def call(method: str, request: Any) -> Any:
        return _rpc.retry(lambda: dispatcher.call(method, request), options.timeout_s,
                          f"{method} at dispatcher {dispatcher.address}")

    job = call("GetOrCreateJob", pb.GetOrCreateJobRequest(
        dataset_id=dataset_id, job_name=options.job_name, options=options.job_options()))
    iteration = call("GetOrCreateIteration", pb.GetOrCreateIterationRequest(
        job_id=job.job_id, repetition=repetition, resume=resume))
    return job, iteration


def answer_elements(segments: SegmentReader, worker: str, status: bytes,
                    message: memoryview) -> list[Any]:
    """The elements of a GetElements answer from ``worker``, given its status byte and what
    follows it (none for NOT_READY); DataLossError for a status this consumer does not know,
    rather than taking it for an empty answer."""
    if status == ELEMENTS:
        return decode(message)
    if status == SHARED_MEMORY:
        return segments.elements(worker, message)
    if status == NOT_READY:
        return []
    raise DataLossError(f"worker {worker} answered GetElements with status {bytes(status)!r}, "
                        f"which this consumer does not know (another convoy version?)")


#: The events that say the dispatcher or a worker answered a call (a failure to reach a worker
#: counts: the reader state bounds how long it may last).
_ANSWERS = (HeartbeatView, ElementsArrived, EndOfSequence, WorkerUnreachable, ReadFailed)

#: A batch of elements of one task: (task id, their numbers as ranges, the elements).
_Batch = tuple[int, tuple[tuple[int, int], ...], list[Any]]


def _after(numbers: tuple[tuple[int, int], ...], count: int) -> tuple[tuple[int, int], ...]:
    """The number ranges ``numbers`` without their first ``count`` numbers."""
    rest = []
    for start, stop in numbers:
        skipped = min(count, stop - start)
        count -= skipped
        if start + skipped < stop:
            rest.append((start + skipped, stop))
    return tuple(rest)


def _task_ranges(received: tuple[tuple[int, int, int], ...]) -> list[pb.TaskRange]:
    return [pb.TaskRange(task_id=t, start=a, stop=b) for t, a, b in received]
