"""The worker's state machine: events in, answers and instructions out; no sockets, threads,
locks or clocks.

The worker's shell turns consumers' requests and the dispatcher's answers into events, applies
them one at a time with :meth:`WorkerState.apply` and carries out the instructions it gets
back: it starts and stops task threads at once, and its control thread sends the heartbeats.
Time enters only as the ``now`` field of events.

A task's life on a worker: *running* from the heartbeat answer that assigns it; *finished*
once a consumer has found its end: a heartbeat goes at once and reports it, again in every
heartbeat until the dispatcher acknowledges (by deleting the task), so the task is never sent
again. Consumers are told the end once it is acknowledged (:class:`Finishing` until then), so
a consumer that asks the dispatcher next finds the task finished there. Then the task is
forgotten, but remembered as ended so that late consumers still get END_OF_SEQUENCE. A task
id is started at most once in a worker's life.
"""

from __future__ import annotations

from dataclasses import dataclass

from convoy._transport.events import Handlers
from convoy.data.service._common import invariants
from convoy.data.service._common.config import ShardingPolicy
from convoy.errors import UnavailableError

#: A consumer asking for a task this worker does not know gets "not ready" until a heartbeat
#: sent after its first request is answered without the task, or for this long at most.
UNKNOWN_TASK_TIMEOUT_S = 5.0
#: A failed heartbeat is sent again this soon (or at the next interval, if shorter).
RETRY_S = 0.25
#: While its dispatcher does not answer, a worker says it is waiting this often.
WAITING_LOG_EVERY_S = 10.0


@dataclass(frozen=True)
class TaskDefinition:
    """What the dispatcher says about a task it assigns."""

    task_id: int
    iteration_id: int
    dataset: bytes
    processing_mode: ShardingPolicy
    compression: str
    worker_index: int = 0  # under a static policy, this worker's place in the fixed list
    num_workers: int = 0
    incarnation: int = 0  # DYNAMIC: the task's run (from 1); its elements are numbered
    skip: tuple[tuple[int, int], ...] = ()  # sequence numbers its consumers already have
    cross_trainer_cache: bool = False  # trainers with different ids share its elements
    num_consumers: int = 0  # of a coordinated read (0: consumers are served first come)
    seed: int = 0  # the seed its ops draw (0: the task id)
    skip_count: int = 0  # OFF: elements skipped at the start (a resumed position)


# ----- events ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Tick:
    """The control thread asks what it should send now."""

    now: float


@dataclass(frozen=True)
class HeartbeatAnswered:
    seq: int  # of the SendHeartbeat answered
    new_tasks: tuple[TaskDefinition, ...]
    tasks_to_delete: tuple[int, ...]
    now: float


@dataclass(frozen=True)
class HeartbeatFailed:
    seq: int
    error: str
    now: float


@dataclass(frozen=True)
class ElementsRequested:
    """A consumer's GetElements call."""

    task_id: int
    now: float


@dataclass(frozen=True)
class TaskEnded:
    """A consumer found a running task's elements all taken."""

    task_id: int
    now: float


Event = Tick | HeartbeatAnswered | HeartbeatFailed | ElementsRequested | TaskEnded


# ----- answers to a consumer ---------------------------------------------------------------------
@dataclass(frozen=True)
class Serve:
    """Take elements from the running task."""

    task_id: int


@dataclass(frozen=True)
class EndOfSequence:
    pass


@dataclass(frozen=True)
class NotReady:
    """The task is not known yet: a heartbeat that may bring it is on its way."""


@dataclass(frozen=True)
class Finishing:
    """The task has ended, and a heartbeat reporting it is on its way: ask again once it is
    answered (and answer END_OF_SEQUENCE anyway if that takes too long)."""


@dataclass(frozen=True)
class Refused:
    error: Exception


Answer = Serve | EndOfSequence | NotReady | Finishing | Refused


# ----- instructions ------------------------------------------------------------------------------
@dataclass(frozen=True)
class StartTask:
    definition: TaskDefinition


@dataclass(frozen=True)
class StopTask:
    task_id: int


@dataclass(frozen=True)
class HeartbeatNow:
    """Wake the control thread: a heartbeat is due at once."""


@dataclass(frozen=True)
class SendHeartbeat:
    seq: int
    current_tasks: tuple[int, ...]
    finished_tasks: tuple[int, ...] = ()  # ended, not acknowledged yet (listed in both)


@dataclass(frozen=True)
class Shutdown:
    reason: str


@dataclass(frozen=True)
class WaitingForDispatcher:
    """Tell the operator (a logged warning): the dispatcher does not answer; or (``recovered``,
    logged at info) it answers again."""

    message: str
    recovered: bool = False


Instruction = (StartTask | StopTask | HeartbeatNow | SendHeartbeat | Shutdown
               | WaitingForDispatcher)


@dataclass(frozen=True)
class Result:
    answer: Answer | None = None
    instructions: tuple[Instruction, ...] = ()


@dataclass
class TaskRecord:
    definition: TaskDefinition
    finished: bool = False  # a consumer found its end; not yet acknowledged


@dataclass
class _Unknown:
    first_asked: float
    heartbeats_sent: int  # by then: only a later heartbeat can tell
    last_asked: float


class WorkerState:
    """All a worker knows about its tasks and heartbeats. Mutate it only through
    :meth:`apply`."""

    def __init__(self, address: str, heartbeat_interval: float, dispatcher_timeout: float,
                 now: float, unknown_task_timeout: float = UNKNOWN_TASK_TIMEOUT_S) -> None:
        self.address = address
        self.heartbeat_interval = heartbeat_interval
        self.dispatcher_timeout = dispatcher_timeout
        self.unknown_task_timeout = unknown_task_timeout
        self.tasks: dict[int, TaskRecord] = {}  # running, or finished and not acknowledged
        self.ended: set[int] = set()  # finished and acknowledged
        self.deleted: set[int] = set()  # stopped by the dispatcher before their end
        self.unknown: dict[int, _Unknown] = {}  # asked for by consumers, not assigned yet
        self.heartbeats_sent = 0
        self.heartbeats_answered = 0  # the seq of the last one answered
        self.heartbeat_at = now  # the next periodic heartbeat (the first is due at once)
        self.heartbeat_requested = False  # due at once, for a consumer
        self.last_answer = now
        self.failed_heartbeats = 0  # since the last answer or the last waiting message
        self.waiting_said_at = now  # when the worker last said it waits for its dispatcher
        self.failing: tuple[float, int] | None = None  # since when heartbeats fail, how many

    def apply(self, event: Event) -> Result:
        """Apply one event; returns the answer to a consumer (if it asked) and what to do."""
        result = _HANDLERS(self, event)
        if invariants.ENABLED:
            self.validate()
        return result

    def validate(self) -> None:
        """Check the invariants between the records (AssertionError on the first broken)."""
        require = invariants.require
        for task_id, record in self.tasks.items():
            require(record.definition.task_id == task_id,
                    f"task {task_id} is filed under another id's definition")
        require(not (self.tasks.keys() & self.ended), "a task both running and ended")
        require(not (self.tasks.keys() & self.deleted), "a task both running and deleted")
        require(not (self.ended & self.deleted), "a task both ended and deleted")
        require(not (self.unknown.keys() & self.tasks.keys()),
                "a task both running and unknown")
        require(0 <= self.heartbeats_answered <= self.heartbeats_sent,
                f"heartbeats answered {self.heartbeats_answered} of {self.heartbeats_sent} sent")
        require(self.failed_heartbeats >= 0, "a negative count of failed heartbeats")

    # ----- the control thread -------------------------------------------------------------------
    def _on_Tick(self, event: Tick) -> Result:
        if self.heartbeat_at == float("inf") or (  # one in flight: one at a time
                not self.heartbeat_requested and event.now < self.heartbeat_at):
            return Result()
        self.heartbeats_sent += 1
        self.heartbeat_requested = False
        self.heartbeat_at = float("inf")  # until answered
        finished = tuple(t for t, record in sorted(self.tasks.items()) if record.finished)
        return Result(instructions=(
            SendHeartbeat(self.heartbeats_sent, tuple(sorted(self.tasks)), finished),))

    def _on_HeartbeatAnswered(self, event: HeartbeatAnswered) -> Result:
        self.heartbeats_answered = max(self.heartbeats_answered, event.seq)
        self.last_answer = self.waiting_said_at = event.now
        self.failed_heartbeats = 0
        self.heartbeat_at = event.now + self.heartbeat_interval
        instructions: list[Instruction] = []
        if self.failing is not None:
            since, failed = self.failing
            self.failing = None
            instructions.append(WaitingForDispatcher(
                f"worker {self.address} reaches its dispatcher again after "
                f"{event.now - since:.1f} s ({failed} heartbeat{'s' * (failed != 1)} failed)",
                recovered=True))
        for task_id in event.tasks_to_delete:
            record = self.tasks.pop(task_id, None)
            if record is None:
                continue
            if record.finished:  # the dispatcher knows it has ended: acknowledged
                self.ended.add(task_id)
            else:
                self.deleted.add(task_id)
                instructions.append(StopTask(task_id))
        for definition in event.new_tasks:
            task_id = definition.task_id
            if task_id in self.tasks or task_id in self.ended or task_id in self.deleted:
                continue  # never run a task twice
            self.tasks[task_id] = TaskRecord(definition)
            self.unknown.pop(task_id, None)
            instructions.append(StartTask(definition))
        # forget tasks no consumer asked for lately (a consumer that keeps asking is refused)
        self.unknown = {task_id: asked for task_id, asked in self.unknown.items()
                        if event.now - asked.last_asked <= self.unknown_task_timeout}
        return Result(instructions=tuple(instructions))

    def _on_HeartbeatFailed(self, event: HeartbeatFailed) -> Result:
        silent = event.now - self.last_answer
        if silent >= self.dispatcher_timeout:
            return Result(instructions=(Shutdown(
                f"worker {self.address} has had no answer from the dispatcher for "
                f"{silent:.1f} s (dispatcher_timeout_ms): {event.error}"),))
        self.heartbeat_at = event.now + min(self.heartbeat_interval, RETRY_S)
        if self.failing is None:  # the first failure is said at once, then summaries
            self.failing = (event.now, 1)
            self.waiting_said_at, self.failed_heartbeats = event.now, 0
            return Result(instructions=(WaitingForDispatcher(
                f"worker {self.address} cannot reach its dispatcher (retrying; gives up after "
                f"{self.dispatcher_timeout:.0f} s, dispatcher_timeout_ms): {event.error}"),))
        self.failing = (self.failing[0], self.failing[1] + 1)
        self.failed_heartbeats += 1
        if event.now - self.waiting_said_at < WAITING_LOG_EVERY_S:
            return Result()
        message = (f"worker {self.address} waits for its dispatcher: {self.failed_heartbeats} "
                   f"heartbeats failed in the last {event.now - self.waiting_said_at:.0f} s, "
                   f"no answer for {silent:.0f} s (gives up after "
                   f"{self.dispatcher_timeout:.0f} s, dispatcher_timeout_ms): {event.error}")
        self.waiting_said_at, self.failed_heartbeats = event.now, 0
        return Result(instructions=(WaitingForDispatcher(message),))

    # ----- consumers ----------------------------------------------------------------------------
    def _on_ElementsRequested(self, event: ElementsRequested) -> Result:
        task_id = event.task_id
        record = self.tasks.get(task_id)
        if record is not None:
            return Result(Finishing() if record.finished else Serve(task_id))
        if task_id in self.ended:
            return Result(EndOfSequence())
        if task_id in self.deleted:
            return Result(Refused(UnavailableError(
                f"task {task_id} was deleted from worker {self.address} by the dispatcher")))
        asked = self.unknown.get(task_id)
        if asked is None:
            self.unknown[task_id] = _Unknown(event.now, self.heartbeats_sent, event.now)
            return Result(NotReady(), self._request_heartbeat())
        asked.last_asked = event.now
        waited = event.now - asked.first_asked
        if self.heartbeats_answered > asked.heartbeats_sent or waited >= self.unknown_task_timeout:
            del self.unknown[task_id]
            return Result(Refused(UnavailableError(
                f"task {task_id} is not known to worker {self.address}: the dispatcher has "
                f"not assigned it here (asked {waited:.1f} s ago)")))
        return Result(NotReady())

    def _request_heartbeat(self) -> tuple[Instruction, ...]:
        if self.heartbeat_requested:
            return ()
        self.heartbeat_requested = True
        return (HeartbeatNow(),)

    def _on_TaskEnded(self, event: TaskEnded) -> Result:
        record = self.tasks.get(event.task_id)
        if record is None or record.finished:  # another consumer saw the end first
            return self._on_ElementsRequested(ElementsRequested(event.task_id, event.now))
        record.finished = True
        return Result(Finishing(), (StopTask(event.task_id), *self._request_heartbeat()))

    # ----- queries ------------------------------------------------------------------------------
    def next_heartbeat(self) -> float:
        """When the control thread should next ask (``-inf``: at once)."""
        if self.heartbeat_requested and self.heartbeat_at != float("inf"):
            return float("-inf")
        return self.heartbeat_at


_HANDLERS: Handlers[WorkerState, Result] = Handlers(WorkerState, Event)
