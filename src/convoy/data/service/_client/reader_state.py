"""One consumer's reading of one iteration, as a state machine: events in, instructions out.

The tasks come from the dispatcher's heartbeat views. Reader threads ask which task to read
next (:class:`NextRead`): tasks are read round robin with at most one request in flight each,
as in TensorFlow's client, so each worker's elements arrive in the order it produced them.

With a window (named jobs), the consumer holds at most that many elements, buffered or asked
for, beyond those it has returned: consumers sharing a job take its elements first come,
first served, and none holds a pile while another starves.

A worker that cannot be reached is retried with a growing backoff and named in warnings.
Under DYNAMIC the reader also reports it to the dispatcher (:class:`ReportUnreachable`), which
checks for itself and, if the worker is gone, has its task adopted: the reader waits for the
task's next run and never skips it (after the timeout the reading fails, naming it). Under OFF,
after the timeout the task is skipped if another worker has been reached (that one delivers
its own copy); else the reading fails.

Done: every task ended with no request in flight (a reply in flight may hold elements), and
the dispatcher said the iteration finished, or a task was skipped (then it never will).

Under DYNAMIC, the reader keeps the sequence numbers it received of each task. When a task's
worker process is replaced, the dispatcher lists the task's next run as held: the reader stops
reading it and, once no request to the earlier run is in flight, reports what it received
(:meth:`ReaderState.reports`); the new run skips what the job's consumers have.

No threads, locks, clocks or sockets: time enters as the ``now`` of the events that need it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from convoy._transport.events import Handlers
from convoy.data.service._client import reader_events as ev
from convoy.data.service._common import ranges as _ranges
from convoy.data.service._common.wire import DRAINING
from convoy.errors import ConvoyError, InvalidArgumentError, UnavailableError

Instructions = tuple[Any, ...]


@dataclass(frozen=True)
class ReaderConfig:
    """How a consumer reads. Times are in seconds."""

    window: int | None = None  # elements held beyond those returned, at most (None: no bound)
    outstanding: int = 4  # requests in flight at most; each asks for a share of the window
    elements_per_call: int = 2048  # asked for per request, at most
    unreachable_timeout_s: float = 60.0  # an unreachable worker is retried this long
    can_skip: bool = True  # the other workers can finish a job without one worker's task
    first_backoff_s: float = 0.1  # after a first failure to reach a worker; then doubled ...
    max_backoff_s: float = 2.0  # ... up to this
    warn_every_s: float = 10.0  # while a worker stays unreachable
    report_every_s: float = 2.0  # a DYNAMIC task's unreachable worker is reported this often
    #: Received sequence numbers are reported (and then forgotten) once they take more ranges
    #: than this: consumers sharing a job hold interleaved ranges, one per read.
    max_ranges: int = 64

    @property
    def per_call(self) -> int:
        """Elements asked for per request."""
        if self.window is None:
            return self.elements_per_call
        return max(1, min(self.elements_per_call, self.window // self.outstanding))


@dataclass
class TaskState:
    task_id: int
    worker_address: str
    ended: bool = False  # read to its end, skipped, or no longer listed by the dispatcher
    skipped: bool = False  # given up on: its worker stayed unreachable
    in_flight: bool = False
    asked: int = 0  # elements asked for by the request in flight
    reached: bool = False  # its worker has answered, and was not unreachable since
    unreachable_since: float | None = None  # of the current run of failures to reach it
    backoff_s: float = 0.0
    retry_at: float = 0.0  # not read before this time
    warned_at: float = 0.0
    reported_unreachable_at: float | None = None  # of the current run of failures
    incarnation: int = 0  # the run the dispatcher lists (DYNAMIC)
    held: bool = False  # the run waits for its clients' reports (or for a worker)
    held_since: float | None = None  # when it was first listed held, this time
    held_for: str = ""  # what the held run waits for, as the dispatcher says
    flight_incarnation: int = 0  # the run the request in flight went to
    reported: int = 0  # the latest run whose report the dispatcher has
    received: list[ev.Range] = field(default_factory=list)  # sequence numbers received


class ReaderState:
    """What one consumer knows of its iteration. Mutate it only through :meth:`apply`."""

    def __init__(self, config: ReaderConfig) -> None:
        self.config = config
        self.tasks: dict[int, TaskState] = {}
        self.iteration_finished = False  # as of the latest heartbeat view
        self.unreturned = 0  # received, not yet returned (briefly < 0: see ElementsReturned)
        self.closed = False
        self.outcome: ev.EndResults | ev.FailResults | None = None  # given once
        self._turn = 0  # where in the task list the next read starts looking

    @property
    def held(self) -> int:
        """Elements buffered or asked for, beyond those returned."""
        return self.unreturned + sum(task.asked for task in self.tasks.values())

    @property
    def done(self) -> bool:
        """Every task ended with none in flight; the dispatcher said the iteration finished,
        or a task was skipped."""
        tasks = self.tasks.values()
        return (all(t.ended and not t.in_flight for t in tasks)
                and (self.iteration_finished or any(t.skipped for t in tasks)))

    @property
    def over(self) -> bool:
        """Nothing more to read: done, failed or closed."""
        return self.closed or self.outcome is not None

    @property
    def error(self) -> ConvoyError | None:
        return self.outcome.error if isinstance(self.outcome, ev.FailResults) else None

    #: The handlers of the events, by type (each subclass has its own).
    handlers: ClassVar[Handlers[Any, Instructions]]

    def apply(self, event: ev.Event) -> Instructions:
        """Apply one event; returns the instructions it calls for (for :class:`NextRead`,
        its one answer)."""
        return self.handlers(self, event)

    # ----- the dispatcher's side ------------------------------------------------------------------
    def _on_HeartbeatView(self, event: ev.HeartbeatView) -> Instructions:
        for task_id, incarnation in event.settled:
            if (task := self.tasks.get(task_id)) is not None:
                task.reported = max(task.reported, incarnation)
        for task_id, start, stop in event.received:  # the dispatcher has them now
            if (task := self.tasks.get(task_id)) is not None:
                _ranges.remove(task.received, start, stop)
        for listed_task in event.tasks:
            task = self.tasks.get(listed_task.task_id)
            if task is None:
                task = self.tasks[listed_task.task_id] = TaskState(
                    listed_task.task_id, listed_task.worker_address)
            if listed_task.incarnation > task.incarnation:  # a new process: reach it afresh
                task.incarnation = listed_task.incarnation
                task.worker_address = listed_task.worker_address  # another, if adopted
                self._reached(task)
                task.reached = False
            elif listed_task.incarnation < task.incarnation:
                self._follow_earlier_run(task, listed_task.incarnation,
                                         listed_task.worker_address)
            task.held, task.held_for = listed_task.held, listed_task.held_for
            if not task.held:
                task.held_since = None
            elif task.held_since is None:
                task.held_since = event.now
        return (*self._finish_view(event), *self._give_up_held(event.now))

    def _follow_earlier_run(self, task: TaskState, incarnation: int, address: str) -> None:
        """The dispatcher lists an earlier run of ``task`` than this reader heard of: it
        restarted without the later one (made while its journal could not be written). The
        reader follows it, and reports again when that run is made anew."""
        task.incarnation, task.worker_address = incarnation, address
        task.reported = min(task.reported, incarnation)
        self._reached(task)
        task.reached = False

    def _give_up_held(self, now: float | None) -> Instructions:
        """Give up on runs held longer than the timeout (their clients or a worker to run
        them never came), as on an unreachable worker."""
        instructions: list[Any] = []
        for task in self.tasks.values():
            if self.over or now is None or task.ended or task.held_since is None:
                continue
            held_for = now - task.held_since
            if held_for >= self.config.unreachable_timeout_s:
                waited_for = task.held_for or "its consumers' reports or a worker to run it"
                instructions.extend(self._give_up(task, (
                    f"task {task.task_id}, whose run {task.incarnation} waited {held_for:.1f} s "
                    f"for {waited_for}")))
        return tuple(instructions)

    def _finish_view(self, event: ev.HeartbeatView) -> Instructions:
        # A task no longer listed has finished (its end of sequence may have been lost with
        # its worker) or its worker was lost.
        listed = {listed_task.task_id for listed_task in event.tasks}
        for task in self.tasks.values():
            if task.task_id not in listed:
                task.ended = True
        self.iteration_finished = event.iteration_finished
        return self._end_if_done()

    def _on_HeartbeatFailed(self, event: ev.HeartbeatFailed) -> Instructions:
        return self._fail(event.error)

    # ----- the workers' side ----------------------------------------------------------------------
    def _on_NextRead(self, event: ev.NextRead) -> Instructions:
        if self.over:
            return (ev.StopReading(),)
        per_call = self.config.per_call
        window = self.config.window
        if window is not None and self.held + per_call > window:
            return (ev.Wait(None),)  # until the consumer returns some
        tasks = list(self.tasks.values())  # in the order they became known
        waiting = []
        for offset in range(len(tasks)):
            position = (self._turn + offset) % len(tasks)
            task = tasks[position]
            if task.ended or task.in_flight or task.held:
                continue
            if task.retry_at <= event.now:
                self._turn = position + 1
                task.in_flight, task.asked = True, per_call
                task.flight_incarnation = task.incarnation
                return (ev.Read(task.task_id, task.worker_address, per_call, task.incarnation),)
            waiting.append(task.retry_at)
        return (ev.Wait(min(waiting, default=None)),)

    def _on_ElementsArrived(self, event: ev.ElementsArrived) -> Instructions:
        task = self._answered(event.task_id)
        self._reached(task)
        for start, stop in event.numbers:
            _ranges.add(task.received, start, stop)
        self.unreturned += event.count
        return self._end_if_done()

    def _on_EndOfSequence(self, event: ev.EndOfSequence) -> Instructions:
        task = self._answered(event.task_id)
        self._reached(task)
        task.ended = True
        end = self._end_if_done()
        if not end and not self.over and all(t.ended for t in self.tasks.values()):
            return (ev.HeartbeatNow(),)
        return end

    def _on_WorkerUnreachable(self, event: ev.WorkerUnreachable) -> Instructions:
        task = self._answered(event.task_id)
        if self.over or task.ended:  # the dispatcher dropped it meanwhile
            return self._end_if_done()
        config, now, address = self.config, event.now, task.worker_address
        warnings: list[ev.Warn | ev.ReportUnreachable] = []
        task.reached = False
        if task.unreachable_since is None:
            task.unreachable_since = task.warned_at = now
            task.reported_unreachable_at = None
            task.backoff_s = config.first_backoff_s
            if DRAINING in str(event.error):
                warnings.append(ev.Warn(f"Data service worker {address} leaves (task "
                                        f"{task.task_id}): {event.error}", info=True))
            else:
                warnings.append(ev.Warn(
                    f"Cannot reach data service worker {address} (task {task.task_id}): "
                    f"{event.error}; retrying for up to {config.unreachable_timeout_s:g} s"))
        else:
            task.backoff_s = min(2 * task.backoff_s, config.max_backoff_s)
        if task.incarnation and (task.reported_unreachable_at is None
                                 or now - task.reported_unreachable_at >= config.report_every_s):
            task.reported_unreachable_at = now  # the dispatcher adopts the task if it is gone
            warnings.append(ev.ReportUnreachable(task.task_id, address))
        task.retry_at = now + task.backoff_s
        unreachable_for = now - task.unreachable_since
        if unreachable_for >= config.unreachable_timeout_s:
            return self._give_up(task, f"worker {task.worker_address} (task {task.task_id}) "
                                       f"unreachable for {unreachable_for:.1f} s: {event.error}")
        if now - task.warned_at >= config.warn_every_s:
            task.warned_at = now
            warnings.append(ev.Warn(
                f"Still waiting on task {task.task_id}: nothing from it for "
                f"{unreachable_for:.0f} s, its worker {address} unreachable: {event.error}"))
        return tuple(warnings)

    def _on_ReadFailed(self, event: ev.ReadFailed) -> Instructions:
        task = self._answered(event.task_id)
        error = event.error
        return self._fail(type(error)(
            f"Failed to get elements from worker {task.worker_address}: {error}"))

    # ----- the consumer's side --------------------------------------------------------------------
    def _on_ElementsReturned(self, event: ev.ElementsReturned) -> Instructions:
        # May come before the ElementsArrived of its elements (the consumer can take them
        # as soon as they are buffered); they were counted as asked for until then.
        self.unreturned -= event.count
        return ()

    def _on_Close(self, event: ev.Close) -> Instructions:
        if self.closed:
            return ()
        self.closed = True
        return (ev.CancelResults(),)

    def _on_GivenBack(self, event: ev.GivenBack) -> Instructions:
        task = self.tasks.get(event.task_id)
        if task is not None:
            for start, stop in event.numbers:
                _ranges.remove(task.received, start, stop)
        return ()

    # ----- queries --------------------------------------------------------------------------------
    def reports(self) -> tuple[tuple[ev.Range, ...], tuple[ev.TaskRange, ...]]:
        """What the next heartbeat reports: the held runs this reader is done with (none of
        its requests to an earlier run is in flight) as (task id, run), and the sequence
        numbers received of those tasks as (task id, start, stop); of every task, once they
        take more than ``max_ranges`` ranges."""
        settled = tuple((t.task_id, t.incarnation) for t in self.tasks.values()
                        if t.held and t.incarnation > t.reported
                        and not (t.in_flight and t.flight_incarnation < t.incarnation))
        held = sum(len(t.received) for t in self.tasks.values())
        if held > self.config.max_ranges:
            return settled, self.all_received()
        return settled, self._received(task_id for task_id, _ in settled)

    def all_received(self) -> tuple[ev.TaskRange, ...]:
        """The sequence numbers received of every task (reported when the reader leaves)."""
        return self._received(self.tasks)

    def _received(self, task_ids: Any) -> tuple[ev.TaskRange, ...]:
        return tuple((task_id, start, stop) for task_id in task_ids
                     for start, stop in self.tasks[task_id].received)

    # ----- helpers --------------------------------------------------------------------------------
    def _answered(self, task_id: int) -> TaskState:
        """The task whose request has been answered, now free to be read again."""
        task = self.tasks.get(task_id)
        if task is None or not task.in_flight:
            raise InvalidArgumentError(f"task {task_id} has no request in flight")
        task.in_flight, task.asked = False, 0
        return task

    @staticmethod
    def _reached(task: TaskState) -> None:
        task.reached = True
        task.unreachable_since = None
        task.backoff_s = task.retry_at = 0.0

    def _give_up(self, task: TaskState, what: str) -> Instructions:
        """Skip ``task`` if the other workers can finish the job without it; else fail.
        ``what`` says what became of it. A DYNAMIC task (one with runs) is never skipped: the
        dispatcher runs it again elsewhere once its worker is declared lost, so skipping it
        would lose its elements."""
        others = [t for t in self.tasks.values()
                  if t.reached and t.worker_address != task.worker_address]
        if task.incarnation:
            return self._fail(UnavailableError(
                f"Failed to get elements from {what}; a DYNAMIC task is not skipped (its "
                "elements would be lost), and the dispatcher did not have it run elsewhere in "
                "time (is its worker alive but unreachable from here?)"))
        if not (self.config.can_skip and others):
            return self._fail(UnavailableError(f"Failed to get elements from {what}"))
        task.ended = task.skipped = True
        warning = ev.Warn(f"Reading on without {what}; the other workers finish the job "
                       "(its elements not yet read are skipped)")
        return (warning, *self._end_if_done())

    def _end_if_done(self) -> Instructions:
        if self.over or not self.done:
            return ()
        self.outcome = ev.EndResults()
        return (self.outcome,)

    def _fail(self, error: ConvoyError) -> Instructions:
        if self.over:
            return ()
        self.outcome = ev.FailResults(error)
        return (self.outcome,)


ReaderState.handlers = Handlers(ReaderState, ev.Event)
