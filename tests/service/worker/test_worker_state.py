"""Unit tests of the worker's state machine: events in, answers and instructions out, no
network."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from convoy.data.service._common.config import ShardingPolicy
from convoy.data.service._worker import state as ws
from convoy.errors import UnavailableError

ADDRESS = "localhost:7000"
INTERVAL = 1.0
DISPATCHER_TIMEOUT = 30.0

# ----- helpers -----------------------------------------------------------------------------------


def definition(task_id: int) -> ws.TaskDefinition:
    return ws.TaskDefinition(task_id, 100 + task_id, b"dataset", ShardingPolicy.OFF, "")


@pytest.fixture
def state() -> ws.WorkerState:
    """A worker that has registered (its first heartbeat answered at time 0)."""
    state = ws.WorkerState(ADDRESS, INTERVAL, DISPATCHER_TIMEOUT, now=0.0)
    answer(state, tick(state, 0.0))
    return state


def tick(state: ws.WorkerState, now: float) -> ws.SendHeartbeat:
    """The heartbeat due at ``now`` (the test fails if none is)."""
    heartbeats = [i for i in state.apply(ws.Tick(now)).instructions
                  if isinstance(i, ws.SendHeartbeat)]
    assert len(heartbeats) == 1, f"no heartbeat due at {now}"
    return heartbeats[0]


def answer(state: ws.WorkerState, heartbeat: ws.SendHeartbeat, new: tuple[int, ...] = (),
           delete: tuple[int, ...] = (), now: float = 0.0) -> tuple[ws.Instruction, ...]:
    return state.apply(ws.HeartbeatAnswered(
        heartbeat.seq, tuple(definition(t) for t in new), delete, now)).instructions


def ask(state: ws.WorkerState, task_id: int, now: float = 0.0) -> ws.Result:
    return state.apply(ws.ElementsRequested(task_id, now))


def assign(state: ws.WorkerState, *task_ids: int, now: float = 0.0) -> None:
    state.heartbeat_requested = True  # test shortcut: the next tick sends a heartbeat
    answer(state, tick(state, now), new=task_ids, now=now)


def refusal(result: ws.Result) -> str:
    assert isinstance(result.answer, ws.Refused), result
    assert isinstance(result.answer.error, UnavailableError)
    return str(result.answer.error)


# ----- heartbeats and assignments ----------------------------------------------------------------


def test_heartbeats_are_due_every_interval_and_list_the_tasks(state: ws.WorkerState) -> None:
    assert state.apply(ws.Tick(0.5)).instructions == ()
    assert state.next_heartbeat() == INTERVAL
    heartbeat = tick(state, 1.0)
    assert heartbeat == ws.SendHeartbeat(2, ())
    assert state.apply(ws.Tick(5.0)).instructions == ()  # one heartbeat at a time
    assert answer(state, heartbeat, new=(7, 3), now=5.0) == (
        ws.StartTask(definition(7)), ws.StartTask(definition(3)))
    assert tick(state, 6.0).current_tasks == (3, 7)


def test_a_task_is_never_started_twice(state: ws.WorkerState) -> None:
    assign(state, 7)
    state.heartbeat_requested = True
    assert answer(state, tick(state, 0.0), new=(7,)) == ()
    assert ask(state, 7).answer == ws.Serve(7)


def test_a_deleted_task_stops_and_is_refused_by_name(state: ws.WorkerState) -> None:
    assign(state, 7)
    state.heartbeat_requested = True
    assert answer(state, tick(state, 0.0), delete=(7, 99)) == (ws.StopTask(7),)
    message = refusal(ask(state, 7))
    assert "task 7" in message and ADDRESS in message and "deleted" in message
    state.heartbeat_requested = True
    assert answer(state, tick(state, 0.0), new=(7,)) == ()  # not started again


def test_a_failed_heartbeat_is_retried_soon_and_a_silent_dispatcher_stops_the_worker(
        state: ws.WorkerState) -> None:
    heartbeat = tick(state, 1.0)
    (said,) = state.apply(ws.HeartbeatFailed(heartbeat.seq, "refused", 1.0)).instructions
    assert isinstance(said, ws.WaitingForDispatcher)  # the first failure, said at once
    assert state.next_heartbeat() == 1.0 + ws.RETRY_S
    heartbeat = tick(state, 1.0 + ws.RETRY_S)
    result = state.apply(ws.HeartbeatFailed(heartbeat.seq, "refused", DISPATCHER_TIMEOUT))
    (shutdown,) = result.instructions
    assert isinstance(shutdown, ws.Shutdown)
    assert ADDRESS in shutdown.reason and "refused" in shutdown.reason


def test_a_worker_waiting_for_its_dispatcher_says_so_every_ten_seconds(
        state: ws.WorkerState) -> None:
    """Never silent for up to dispatcher_timeout_ms (an hour by default): the first failure
    at once, then one summed-up line every WAITING_LOG_EVERY_S while heartbeats fail, one
    when one is answered again."""
    said = []
    now = 1.0
    while now < 25.0:
        heartbeat = tick(state, now)
        for instruction in state.apply(ws.HeartbeatFailed(heartbeat.seq, "refused",
                                                          now)).instructions:
            assert isinstance(instruction, ws.WaitingForDispatcher)
            said.append((now, instruction.message))
        now += ws.RETRY_S
    assert [when for when, _ in said] == [1.0, 11.0, 21.0]
    assert ADDRESS in said[0][1] and "cannot reach its dispatcher" in said[0][1]
    assert "refused" in said[1][1] and "heartbeats failed in the last 10 s" in said[1][1]
    back = [i for i in answer(state, tick(state, now), now=now)
            if isinstance(i, ws.WaitingForDispatcher)]
    assert len(back) == 1 and back[0].recovered and "again after 24" in back[0].message
    heartbeat = tick(state, now + INTERVAL)
    (again,) = state.apply(ws.HeartbeatFailed(heartbeat.seq, "refused", now + 5)).instructions
    assert "cannot reach its dispatcher" in again.message


# ----- consumers asking for tasks the worker does not know ---------------------------------------


def test_an_unknown_task_is_not_ready_until_a_heartbeat_brings_it(state: ws.WorkerState) -> None:
    first = ask(state, 7, now=0.1)
    assert first == ws.Result(ws.NotReady(), (ws.HeartbeatNow(),))
    assert ask(state, 7, now=0.2) == ws.Result(ws.NotReady())  # one heartbeat is enough
    assert state.next_heartbeat() == float("-inf")
    heartbeat = tick(state, 0.2)  # at once, not at the interval
    assert answer(state, heartbeat, new=(7,), now=0.3) == (ws.StartTask(definition(7)),)
    assert ask(state, 7, now=0.3).answer == ws.Serve(7)


def test_an_unknown_task_is_refused_once_a_later_heartbeat_did_not_bring_it(
        state: ws.WorkerState) -> None:
    in_flight = tick(state, 1.0)  # sent before the consumer asked: it proves nothing
    assert ask(state, 7, now=1.1).answer == ws.NotReady()
    answer(state, in_flight, now=1.2)
    assert ask(state, 7, now=1.2).answer == ws.NotReady()
    answer(state, tick(state, 1.2), now=1.3)
    message = refusal(ask(state, 7, now=1.3))
    assert "task 7 is not known to worker " + ADDRESS in message


def test_an_unknown_task_is_refused_after_a_bounded_time_without_heartbeats(
        state: ws.WorkerState) -> None:
    assert ask(state, 7, now=1.0).answer == ws.NotReady()
    heartbeat = tick(state, 1.0)
    state.apply(ws.HeartbeatFailed(heartbeat.seq, "unreachable", 1.5))
    assert ask(state, 7, now=1.0 + ws.UNKNOWN_TASK_TIMEOUT_S - 0.1).answer == ws.NotReady()
    assert "task 7" in refusal(ask(state, 7, now=1.0 + ws.UNKNOWN_TASK_TIMEOUT_S))


def test_a_consumer_that_keeps_asking_is_refused_even_when_heartbeats_are_slow(
        state: ws.WorkerState) -> None:
    slow = tick(state, 1.0)
    timeout = ws.UNKNOWN_TASK_TIMEOUT_S
    assert ask(state, 7, now=1.0).answer == ws.NotReady()
    assert ask(state, 7, now=1.0 + timeout - 1).answer == ws.NotReady()
    answer(state, slow, now=1.0 + timeout + 0.5)  # sent before the asks: proves nothing
    assert "task 7" in refusal(ask(state, 7, now=1.0 + timeout + 0.6))


def test_a_task_asked_for_long_ago_is_forgotten(state: ws.WorkerState) -> None:
    ask(state, 7, now=1.0)
    answer(state, tick(state, 1.0), now=2.0 + ws.UNKNOWN_TASK_TIMEOUT_S)
    assert state.unknown == {}


# ----- the end of a task ------------------------------------------------------------------------


def test_an_ended_task_is_reported_at_once_and_until_acknowledged(
        state: ws.WorkerState) -> None:
    assign(state, 7, 8, now=0.5)
    ended = state.apply(ws.TaskEnded(7, 0.6))
    assert ended == ws.Result(ws.Finishing(), (ws.StopTask(7), ws.HeartbeatNow()))
    assert ask(state, 7, now=0.6).answer == ws.Finishing()  # not yet known to the dispatcher
    assert state.apply(ws.TaskEnded(7, 0.6)) == ws.Result(ws.Finishing())  # ended once
    assert state.next_heartbeat() == float("-inf")  # due at once, not at the interval
    heartbeat = tick(state, 0.6)
    assert heartbeat == ws.SendHeartbeat(3, (7, 8), (7,))
    state.apply(ws.HeartbeatFailed(heartbeat.seq, "unreachable", 0.7))
    heartbeat = tick(state, 0.7 + ws.RETRY_S)  # reported again, until acknowledged
    assert heartbeat.finished_tasks == (7,)
    answer(state, heartbeat, delete=(7,), now=1.0)  # the acknowledgement
    assert ask(state, 7, now=1.0).answer == ws.EndOfSequence()
    assert set(state.tasks) == {8} and tick(state, 2.0).finished_tasks == ()
    answer(state, ws.SendHeartbeat(3, (7, 8)), new=(7,), now=2.0)  # a stale answer
    assert ask(state, 7).answer == ws.EndOfSequence()
    assert 7 not in state.tasks


def test_an_end_found_while_a_heartbeat_is_in_flight_goes_in_the_next(
        state: ws.WorkerState) -> None:
    assign(state, 7)
    in_flight = tick(state, 1.0)
    state.apply(ws.TaskEnded(7, 1.1))
    assert state.apply(ws.Tick(1.1)).instructions == ()  # one heartbeat at a time
    answer(state, in_flight, now=1.2)  # sent before the end: no acknowledgement
    assert ask(state, 7, now=1.2).answer == ws.Finishing()
    assert tick(state, 1.2).finished_tasks == (7,)  # at once, not at the interval


def test_deleting_an_ended_task_acknowledges_it(state: ws.WorkerState) -> None:
    assign(state, 7)
    state.apply(ws.TaskEnded(7, 0.0))
    state.heartbeat_requested = True
    assert answer(state, tick(state, 0.0), delete=(7,)) == ()
    assert state.tasks == {}
    assert ask(state, 7).answer == ws.EndOfSequence()


def test_an_unknown_event_is_a_programming_error(state: ws.WorkerState) -> None:
    with pytest.raises(TypeError, match="WorkerState has no handler for str"):
        state.apply("Tick")


# ----- property: random interleavings against a model dispatcher ---------------------------------


class ModelDispatcher:
    """The dispatcher's rules for one worker: it sends the unfinished tasks a heartbeat does
    not list and deletes the listed ones it has forgotten or holds finished."""

    def __init__(self) -> None:
        self.finished: dict[int, bool] = {}  # assigned task -> finished
        self.ever_assigned: set[int] = set()  # task ids are never used twice

    def heartbeat(self, current: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        new = tuple(t for t, done in self.finished.items() if t not in current and not done)
        delete = tuple(t for t in current if self.finished.get(t, True))
        return new, delete

    def unfinished(self, task_id: int) -> bool:
        return self.finished.get(task_id) is False


STEPS = hs.one_of(
    hs.tuples(hs.just("assign"), hs.integers(0, 9)),
    hs.tuples(hs.just("finish"), hs.integers(0, 9)),  # the dispatcher lost the worker
    hs.tuples(hs.just("forget"), hs.integers(0, 9)),  # the iteration was collected
    hs.tuples(hs.just("ask"), hs.integers(0, 12)),
    hs.tuples(hs.just("end"), hs.integers(0, 9)),
    hs.tuples(hs.just("tick"), hs.sampled_from(["ok", "fail", "answer lost"])),
    hs.tuples(hs.just("wait"), hs.sampled_from([0.1, 0.5, 2.0])),
)


class Run:
    """Drives a WorkerState with steps and checks its promises after each."""

    def __init__(self) -> None:
        self.now = 0.0
        self.dispatcher = ModelDispatcher()
        self.state = ws.WorkerState(ADDRESS, INTERVAL, 1e9, self.now)
        self.started: list[int] = []
        self.ended: set[int] = set()  # a consumer got END_OF_SEQUENCE
        self.not_ready_since: dict[int, float] = {}  # of a consumer that keeps asking
        self.last_asked: dict[int, float] = {}
        self.outbox: list[ws.Instruction] = []  # calls for the next tick, as the shell's

    def apply(self, event: Any) -> ws.Result:
        result = self.state.apply(event)
        for instruction in result.instructions:
            if isinstance(instruction, ws.StartTask):
                self.started.append(instruction.definition.task_id)
            elif isinstance(instruction, ws.SendHeartbeat):
                self.outbox.append(instruction)
        return result

    def step(self, kind: str, value: Any) -> None:
        getattr(self, "_" + kind)(value)

    def _assign(self, task_id: int) -> None:
        if task_id not in self.dispatcher.ever_assigned:
            self.dispatcher.ever_assigned.add(task_id)
            self.dispatcher.finished[task_id] = False

    def _finish(self, task_id: int) -> None:
        if task_id in self.dispatcher.finished:
            self.dispatcher.finished[task_id] = True

    def _forget(self, task_id: int) -> None:
        self.dispatcher.finished.pop(task_id, None)

    def _wait(self, seconds: float) -> None:
        self.now += seconds

    def _tick(self, outcome: str) -> None:
        self.apply(ws.Tick(self.now))
        calls, self.outbox = self.outbox, []
        for heartbeat in calls:
            assert isinstance(heartbeat, ws.SendHeartbeat)
            for task_id in self.ended:  # reported with every heartbeat until acknowledged
                if task_id in self.state.tasks:
                    assert task_id in heartbeat.finished_tasks, task_id
            assert set(heartbeat.finished_tasks) <= set(heartbeat.current_tasks)
            self._heartbeat(heartbeat, outcome)

    def _heartbeat(self, heartbeat: ws.SendHeartbeat, outcome: str) -> None:
        for task_id in self.started:  # else the dispatcher would send it again
            if self.dispatcher.unfinished(task_id) and task_id not in self.state.deleted:
                assert task_id in heartbeat.current_tasks, (task_id, heartbeat)
        assert set(heartbeat.finished_tasks) <= self.ended
        if outcome == "fail":
            self.apply(ws.HeartbeatFailed(heartbeat.seq, "unreachable", self.now))
            return
        for task_id in heartbeat.finished_tasks:
            self._finish(task_id)
        new, delete = self.dispatcher.heartbeat(heartbeat.current_tasks)
        if outcome == "answer lost":
            self.apply(ws.HeartbeatFailed(heartbeat.seq, "answer lost", self.now))
            return
        self.apply(ws.HeartbeatAnswered(heartbeat.seq, tuple(definition(t) for t in new),
                                        delete, self.now))

    def _ask(self, task_id: int) -> None:
        self.check_answer(task_id, self.apply(ws.ElementsRequested(task_id, self.now)))

    def _end(self, task_id: int) -> None:
        result = self.apply(ws.ElementsRequested(task_id, self.now))
        if isinstance(result.answer, ws.Serve):
            result = self.apply(ws.TaskEnded(task_id, self.now))
            assert result.answer == ws.Finishing()
            assert ws.StopTask(task_id) in result.instructions
            assert self.state.next_heartbeat() == float("-inf")
            self.ended.add(task_id)
        self.check_answer(task_id, result)

    def check_answer(self, task_id: int, result: ws.Result) -> None:
        answer = result.answer
        assert isinstance(answer, (ws.Serve, ws.EndOfSequence, ws.NotReady, ws.Finishing,
                                   ws.Refused))
        if task_id in self.ended:  # the end, once the dispatcher knows it
            known = self.dispatcher.finished.get(task_id, True)
            assert answer == (ws.EndOfSequence() if task_id not in self.state.tasks
                              else ws.Finishing())
            assert isinstance(answer, ws.Finishing) or known
        if isinstance(answer, ws.Refused):
            assert f"task {task_id}" in str(answer.error) and ADDRESS in str(answer.error)
        if self.now - self.last_asked.get(task_id, self.now) > ws.UNKNOWN_TASK_TIMEOUT_S:
            self.not_ready_since.pop(task_id, None)  # it stopped asking for a while
        self.last_asked[task_id] = self.now
        if isinstance(answer, ws.NotReady):
            since = self.not_ready_since.setdefault(task_id, self.now)
            assert self.now - since < ws.UNKNOWN_TASK_TIMEOUT_S
            assert self.state.next_heartbeat() <= self.now + INTERVAL  # one that may bring it
        else:
            self.not_ready_since.pop(task_id, None)

    def settle(self) -> None:
        """A healthy dispatcher for a while: every ended task gets acknowledged."""
        for _ in range(3):
            self._wait(INTERVAL)
            self._tick("ok")
        assert not any(record.finished for record in self.state.tasks.values())
        for task_id in self.ended:
            assert self.state.apply(ws.ElementsRequested(task_id, self.now)).answer == (
                ws.EndOfSequence())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hs.lists(STEPS, max_size=80))
def test_random_interleavings_keep_the_workers_promises(steps: list[tuple[str, Any]]) -> None:
    run = Run()
    for kind, value in steps:
        run.step(kind, value)
        assert len(run.started) == len(set(run.started)), f"a task started twice: {run.started}"
    run.settle()
    assert len(run.started) == len(set(run.started))


def test_validate_names_a_broken_invariant() -> None:
    state = ws.WorkerState("w:1", heartbeat_interval=1.0, dispatcher_timeout=60.0, now=0.0)
    state.validate()
    state.ended.add(7)
    state.deleted.add(7)
    with pytest.raises(AssertionError, match="both ended and deleted"):
        state.validate()
