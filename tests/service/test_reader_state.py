"""Unit tests of a consumer's reader state machine: events in, instructions out, no network."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from convoy.data.service import _reader_state as rs
from convoy.errors import InvalidArgumentError, UnavailableError

BACKOFF = 0.5


def view(*task_ids: int, finished: bool = False) -> rs.HeartbeatView:
    return rs.HeartbeatView(tuple((t, f"w{t}:1") for t in task_ids), finished)


def reads(state: rs.ReaderState, count: int, now: float = 0.0) -> list[int]:
    """The tasks of ``count`` NextRead answers, which must all be reads."""
    answers = [state.apply(rs.NextRead(now)) for _ in range(count)]
    assert all(isinstance(a, rs.Read) for a in answers), answers
    return [a.task_id for a in answers]


@pytest.fixture
def state() -> rs.ReaderState:
    return rs.ReaderState(BACKOFF)


def test_tasks_are_read_round_robin_one_request_each(state: rs.ReaderState) -> None:
    state.apply(view(1, 2, 3))
    assert reads(state, 3) == [1, 2, 3]
    assert state.apply(rs.NextRead(0.0)) == rs.Wait(None)  # every task has a request out
    for task_id in (2, 1, 3):
        state.apply(rs.ElementsArrived(task_id, 10))
    assert sorted(reads(state, 3)) == [1, 2, 3]
    assert state.apply(rs.NextRead(0.0)) == rs.Wait(None)


def test_reads_rotate_over_the_ready_tasks(state: rs.ReaderState) -> None:
    state.apply(view(1, 2, 3))
    order = []
    for _ in range(7):
        task_id = reads(state, 1)[0]
        order.append(task_id)
        state.apply(rs.ElementsArrived(task_id, 0))  # nothing ready yet: ask again, later
    assert order == [1, 2, 3, 1, 2, 3, 1]


def test_a_new_task_joins_the_rotation(state: rs.ReaderState) -> None:
    state.apply(view(1, 2))
    assert reads(state, 2) == [1, 2]
    state.apply(view(1, 2, 3))
    assert reads(state, 1) == [3]


def test_read_names_the_tasks_worker(state: rs.ReaderState) -> None:
    state.apply(rs.HeartbeatView(((7, "host:5000"),), False))
    assert state.apply(rs.NextRead(0.0)) == rs.Read(7, "host:5000")


def test_no_tasks_yet_means_wait(state: rs.ReaderState) -> None:
    assert state.apply(rs.NextRead(0.0)) == rs.Wait(None)
    state.apply(view())
    assert state.apply(rs.NextRead(0.0)) == rs.Wait(None)


def test_an_unreachable_worker_is_left_alone_for_the_backoff(state: rs.ReaderState) -> None:
    state.apply(view(1))
    reads(state, 1, now=10.0)
    assert state.apply(rs.WorkerUnreachable(1, now=10.0)) is None
    assert state.apply(rs.NextRead(10.2)) == rs.Wait(10.0 + BACKOFF)
    assert state.apply(rs.NextRead(10.0 + BACKOFF)) == rs.Read(1, "w1:1")


def test_a_backing_off_task_does_not_hold_up_the_others(state: rs.ReaderState) -> None:
    state.apply(view(1, 2))
    assert reads(state, 2) == [1, 2]
    state.apply(rs.WorkerUnreachable(1, now=0.0))
    state.apply(rs.ElementsArrived(2, 3))
    assert reads(state, 1, now=0.1) == [2]


def test_the_end_of_every_task_asks_for_a_heartbeat(state: rs.ReaderState) -> None:
    state.apply(view(1, 2))
    reads(state, 2)
    assert state.apply(rs.EndOfSequence(1)) is None
    assert state.apply(rs.EndOfSequence(2)) == rs.HeartbeatNow()
    assert not state.done
    assert state.apply(rs.NextRead(0.0)) == rs.Wait(None)
    assert state.apply(view(finished=True)) == rs.EndResults()
    assert state.done and state.over
    assert state.apply(rs.NextRead(0.0)) == rs.StopReading()


def test_an_empty_finished_iteration_ends_at_once(state: rs.ReaderState) -> None:
    assert state.apply(view(finished=True)) == rs.EndResults()
    assert state.apply(rs.NextRead(0.0)) == rs.StopReading()


def test_done_waits_for_a_reply_in_flight_on_an_ended_task(state: rs.ReaderState) -> None:
    state.apply(view(1))
    reads(state, 1)
    # the dispatcher no longer lists the task and says the iteration finished, but the reply
    # in flight may hold elements
    assert state.apply(view(finished=True)) is None
    assert not state.done
    assert state.apply(rs.ElementsArrived(1, 5)) == rs.EndResults()


def test_a_task_the_dispatcher_dropped_is_never_read_again(state: rs.ReaderState) -> None:
    state.apply(view(1, 2))
    state.apply(view(2))
    assert reads(state, 1) == [2]
    state.apply(view(1, 2))  # listed again: still ended
    assert state.apply(rs.NextRead(0.0)) == rs.Wait(None)


def test_a_task_read_to_its_end_is_never_read_again(state: rs.ReaderState) -> None:
    state.apply(view(1, 2))
    reads(state, 2)
    state.apply(rs.EndOfSequence(1))
    state.apply(rs.ElementsArrived(2, 1))
    assert reads(state, 1) == [2]
    assert state.apply(rs.NextRead(0.0)) == rs.Wait(None)


def test_a_read_failure_names_the_worker_and_ends_the_results(state: rs.ReaderState) -> None:
    state.apply(view(1, 2))
    reads(state, 2)
    failed = state.apply(rs.ReadFailed(1, UnavailableError("connection reset")))
    assert isinstance(failed, rs.FailResults)
    assert type(failed.error) is UnavailableError
    assert str(failed.error) == "Failed to get elements from worker w1:1: connection reset"
    assert state.error is failed.error
    assert state.apply(rs.ReadFailed(2, UnavailableError("again"))) is None  # first error wins
    assert state.apply(rs.NextRead(0.0)) == rs.StopReading()


def test_a_heartbeat_failure_ends_the_results(state: rs.ReaderState) -> None:
    error = UnavailableError("dispatcher gone")
    assert state.apply(rs.HeartbeatFailed(error)) == rs.FailResults(error)
    assert state.over and state.apply(rs.NextRead(0.0)) == rs.StopReading()


def test_close_cancels_once_and_stops_reading(state: rs.ReaderState) -> None:
    state.apply(view(1))
    reads(state, 1)
    assert state.apply(rs.Close()) == rs.CancelResults()
    assert state.apply(rs.Close()) is None
    assert state.apply(rs.NextRead(0.0)) == rs.StopReading()
    # replies still in flight are taken, but change nothing the consumer sees
    assert state.apply(rs.EndOfSequence(1)) is None
    assert state.apply(view(finished=True)) is None
    assert state.apply(rs.HeartbeatFailed(UnavailableError("late"))) is None
    assert state.outcome is None


@pytest.mark.parametrize("event", [rs.ElementsArrived(1, 1), rs.EndOfSequence(1),
                                   rs.WorkerUnreachable(1, 0.0),
                                   rs.ReadFailed(1, UnavailableError("x")),
                                   rs.ElementsArrived(99, 1)])
def test_an_answer_without_a_request_is_refused(state: rs.ReaderState, event: Any) -> None:
    state.apply(view(1))
    with pytest.raises(InvalidArgumentError, match="has no request in flight"):
        state.apply(event)


def test_unknown_event(state: rs.ReaderState) -> None:
    with pytest.raises(InvalidArgumentError, match="unknown reader event str"):
        state.apply("tick")


# ----- any interleaving --------------------------------------------------------------------------

TASKS = range(1, 6)


class Model:
    """What a correct reader must make of the events the test sent, kept independently."""

    def __init__(self) -> None:
        self.known: set[int] = set()
        self.ended: set[int] = set()
        self.in_flight: set[int] = set()
        self.retry_at: dict[int, float] = {}
        self.finished = False
        self.outcome: Any = None
        self.closed = False
        self.now = 0.0

    @property
    def done(self) -> bool:
        return self.finished and self.known <= self.ended and not self.in_flight

    @property
    def over(self) -> bool:
        return self.closed or self.outcome is not None

    def ready(self) -> set[int]:
        return {t for t in self.known - self.ended - self.in_flight
                if self.retry_at.get(t, 0.0) <= self.now}

    def check_read(self, answer: Any) -> None:
        if isinstance(answer, rs.Read):
            assert not self.over
            assert answer.task_id in self.ready(), (answer, vars(self))
            assert answer.worker_address == f"w{answer.task_id}:1"
            self.in_flight.add(answer.task_id)
        elif isinstance(answer, rs.Wait):
            assert not self.over and not self.ready()
            waiting = self.known - self.ended - self.in_flight
            assert answer.until == min((self.retry_at.get(t, 0.0) for t in waiting),
                                       default=None)
        else:
            assert answer == rs.StopReading() and self.over

    def check_instruction(self, event: Any, instruction: Any) -> None:
        """``instruction`` must be what ``event`` (already applied to the model) calls for."""
        expected: Any = None
        if self.over:
            pass  # the consumer's results have ended: nothing more for them
        elif isinstance(event, (rs.ReadFailed, rs.HeartbeatFailed)):
            assert isinstance(instruction, rs.FailResults)
            assert type(instruction.error) is type(event.error)
            assert str(event.error) in str(instruction.error)
            expected = instruction
        elif self.done:
            expected = rs.EndResults()
        elif isinstance(event, rs.EndOfSequence) and self.known <= self.ended:
            expected = rs.HeartbeatNow()
        assert instruction == expected, (event, vars(self))
        if isinstance(expected, (rs.EndResults, rs.FailResults)):
            self.outcome = expected


def draw_event(draw: Any, model: Model) -> Any:
    # weights by repetition: events that end the reading are rare, so runs go on
    kinds = ["next"] * 4 + ["view"] * 2 + ["tick"] * 2 + ["answer"] * 6 * bool(model.in_flight)
    kind = draw(hs.sampled_from([*kinds, "close", "heartbeat_failed"]))
    if kind == "view":
        listed = draw(hs.sets(hs.sampled_from(TASKS)))
        return view(*sorted(listed), finished=draw(hs.booleans()))
    if kind == "next":
        return rs.NextRead(model.now)
    if kind == "tick":
        return draw(hs.sampled_from([0.1, BACKOFF]))
    if kind == "close":
        return rs.Close()
    if kind == "heartbeat_failed":
        return rs.HeartbeatFailed(UnavailableError("dispatcher gone"))
    task_id = draw(hs.sampled_from(sorted(model.in_flight)))
    answers = [rs.ElementsArrived(task_id, 3)] * 3 + [
        rs.ElementsArrived(task_id, 0), rs.EndOfSequence(task_id), rs.EndOfSequence(task_id),
        rs.WorkerUnreachable(task_id, model.now), rs.WorkerUnreachable(task_id, model.now),
        rs.ReadFailed(task_id, UnavailableError("reset"))]
    return draw(hs.sampled_from(answers))


def step(state: rs.ReaderState, model: Model, event: Any) -> None:
    """Apply ``event`` to the state and the model; check the state's answer against both."""
    if isinstance(event, float):  # time passes
        model.now += event
        return
    result = state.apply(event)
    if isinstance(event, rs.NextRead):
        model.check_read(result)
        return
    if isinstance(event, rs.HeartbeatView):
        listed = {t for t, _ in event.tasks}
        model.ended |= model.known - listed
        model.known |= listed
        model.finished = event.iteration_finished
    elif isinstance(event, rs.Close):
        assert result == (None if model.closed else rs.CancelResults())
        model.closed = True
        return
    elif not isinstance(event, rs.HeartbeatFailed):
        model.in_flight.remove(event.task_id)
        if isinstance(event, rs.EndOfSequence):
            model.ended.add(event.task_id)
        elif isinstance(event, rs.WorkerUnreachable):
            model.retry_at[event.task_id] = event.now + BACKOFF
    model.check_instruction(event, result)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hs.data(), hs.integers(min_value=0, max_value=80))
def test_any_interleaving_keeps_the_readers_promises(data: Any, length: int) -> None:
    """At most one request in flight per task, never a read of an ended or backing-off task,
    done exactly when the dispatcher said finished and every task ended with nothing in
    flight, and one end of the results at most."""
    state, model = rs.ReaderState(BACKOFF), Model()
    for _ in range(length):
        step(state, model, draw_event(data.draw, model))
        assert state.done == model.done
        assert {t.task_id for t in state.tasks.values() if t.in_flight} == model.in_flight
    # once nothing new happens, answering every read ends the iteration
    step(state, model, view(finished=True))
    for task_id in sorted(model.in_flight):
        step(state, model, rs.EndOfSequence(task_id))
    assert state.over
    assert state.apply(rs.NextRead(model.now)) == rs.StopReading()
