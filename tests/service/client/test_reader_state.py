"""Unit tests of a consumer's reader state machine: events in, instructions out, no network."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from convoy.data.service._client import reader_events as ev
from convoy.data.service._client.reader_state import ReaderConfig, ReaderState
from convoy.errors import DeadlineExceededError, InvalidArgumentError, UnavailableError

ANONYMOUS = ReaderConfig(unreachable_timeout_s=10.0, first_backoff_s=0.5, max_backoff_s=2.0,
                         warn_every_s=4.0)
NAMED = ReaderConfig(window=64, outstanding=4, unreachable_timeout_s=10.0,
                     first_backoff_s=0.5, max_backoff_s=2.0, warn_every_s=4.0)
REFUSED = UnavailableError("connection refused")


def view(*task_ids: int, finished: bool = False) -> ev.HeartbeatView:
    return ev.HeartbeatView(tuple(ev.ListedTask(t, f"w{t}:1") for t in task_ids), finished)


def reads(state: ReaderState, count: int, now: float = 0.0) -> list[int]:
    """The tasks of ``count`` NextRead answers, which must all be reads."""
    answers = [answer for _ in range(count) for answer in state.apply(ev.NextRead(now))]
    assert all(isinstance(a, ev.Read) for a in answers), answers
    return [a.task_id for a in answers]


def next_read(state: ReaderState, now: float = 0.0) -> Any:
    (answer,) = state.apply(ev.NextRead(now))
    return answer


def unreachable(state: ReaderState, task_id: int, now: float) -> tuple[Any, ...]:
    """Read ``task_id`` at ``now`` and find its worker unreachable."""
    assert next_read(state, now) == ev.Read(task_id, f"w{task_id}:1",
                                            state.config.per_call)
    return state.apply(ev.WorkerUnreachable(task_id, REFUSED, now))


def warnings(instructions: tuple[Any, ...]) -> list[str]:
    return [i.message for i in instructions if isinstance(i, ev.Warn)]


@pytest.fixture
def state() -> ReaderState:
    return ReaderState(ANONYMOUS)


# ----- reading -----------------------------------------------------------------------------------

def test_tasks_are_read_round_robin_one_request_each(state: ReaderState) -> None:
    state.apply(view(1, 2, 3))
    assert reads(state, 3) == [1, 2, 3]
    assert next_read(state) == ev.Wait(None)  # every task has a request out
    for task_id in (2, 1, 3):
        assert state.apply(ev.ElementsArrived(task_id, 10)) == ()
    assert sorted(reads(state, 3)) == [1, 2, 3]
    assert next_read(state) == ev.Wait(None)


def test_reads_rotate_over_the_ready_tasks(state: ReaderState) -> None:
    state.apply(view(1, 2, 3))
    order = []
    for _ in range(7):
        task_id = reads(state, 1)[0]
        order.append(task_id)
        state.apply(ev.ElementsArrived(task_id, 0))  # nothing ready yet: ask again, later
    assert order == [1, 2, 3, 1, 2, 3, 1]


def test_a_new_task_joins_the_rotation(state: ReaderState) -> None:
    state.apply(view(1, 2))
    assert reads(state, 2) == [1, 2]
    state.apply(view(1, 2, 3))
    assert reads(state, 1) == [3]


def test_read_names_the_tasks_worker_and_asks_for_a_large_batch(state: ReaderState) -> None:
    state.apply(ev.HeartbeatView((ev.ListedTask(7, "host:5000"),), False))
    assert next_read(state) == ev.Read(7, "host:5000", 2048)


def test_no_tasks_yet_means_wait(state: ReaderState) -> None:
    assert next_read(state) == ev.Wait(None)
    state.apply(view())
    assert next_read(state) == ev.Wait(None)


# ----- the window of a shared job ----------------------------------------------------------------

def test_a_windowed_read_asks_for_a_share_of_the_window() -> None:
    assert ReaderConfig(window=64, outstanding=4).per_call == 16
    assert ReaderConfig(window=3, outstanding=4).per_call == 1
    assert ReaderConfig(window=10**6, outstanding=1).per_call == 2048
    assert ReaderConfig(window=None).per_call == 2048


def test_a_consumer_holds_no_more_than_the_window() -> None:
    state = ReaderState(NAMED)
    state.apply(view(*range(1, 7)))
    assert reads(state, 4) == [1, 2, 3, 4]  # 4 x 16 asked for: the window is full
    assert state.held == 64
    assert next_read(state) == ev.Wait(None)
    state.apply(ev.ElementsArrived(1, 16))
    assert next_read(state) == ev.Wait(None)  # received, but not yet returned
    state.apply(ev.ElementsReturned(16))
    assert reads(state, 1) == [5]
    assert state.held == 64


def test_a_short_reply_gives_back_what_it_did_not_fill() -> None:
    state = ReaderState(NAMED)
    state.apply(view(1, 2, 3, 4, 5))
    reads(state, 4)
    state.apply(ev.ElementsArrived(2, 3))  # 13 of the 16 asked for did not come
    assert state.held == 51
    state.apply(ev.EndOfSequence(3))
    state.apply(ev.WorkerUnreachable(4, REFUSED, 0.0))
    assert state.held == 3 + 16
    assert reads(state, 2) == [5, 2]


def test_elements_returned_before_their_arrival_is_reported_count_as_held() -> None:
    state = ReaderState(NAMED)
    state.apply(view(1))
    reads(state, 1)
    state.apply(ev.ElementsReturned(10))  # the consumer was quicker than the reader thread
    assert state.held == 6  # not less than what the consumer really holds
    state.apply(ev.ElementsArrived(1, 10))
    assert state.held == 0


def test_an_anonymous_job_has_no_window(state: ReaderState) -> None:
    state.apply(view(1))
    for _ in range(20):
        reads(state, 1)
        state.apply(ev.ElementsArrived(1, 2048))
    assert state.held == 20 * 2048


# ----- unreachable workers -----------------------------------------------------------------------

def test_an_unreachable_worker_is_retried_with_a_growing_backoff(state: ReaderState) -> None:
    state.apply(view(1))
    assert warnings(unreachable(state, 1, now=10.0)) == [
        "Cannot reach data service worker w1:1 (task 1): connection refused; retrying for up "
        "to 10 s"]
    assert next_read(state, 10.2) == ev.Wait(10.5)
    retries = [10.5]
    for expected_wait in (1.0, 2.0, 2.0):
        assert unreachable(state, 1, now=retries[-1]) == ()
        retries.append(retries[-1] + expected_wait)
        assert next_read(state, retries[-1] - 0.01) == ev.Wait(retries[-1])
    assert next_read(state, retries[-1]) == ev.Read(1, "w1:1", 2048)


def test_a_backing_off_task_does_not_hold_up_the_others(state: ReaderState) -> None:
    state.apply(view(1, 2))
    assert reads(state, 2) == [1, 2]
    state.apply(ev.WorkerUnreachable(1, REFUSED, now=0.0))
    state.apply(ev.ElementsArrived(2, 3))
    assert reads(state, 1, now=0.1) == [2]


def test_a_worker_that_stays_unreachable_fails_the_read_naming_it(state: ReaderState) -> None:
    state.apply(view(1))
    attempts = []
    now = 0.0
    while state.outcome is None:
        attempts.append(now)
        last = unreachable(state, 1, now)
        wait = next_read(state, now)
        if isinstance(wait, ev.Wait):
            now = wait.until
    assert attempts == [0.0, 0.5, 1.5, 3.5, 5.5, 7.5, 9.5, 11.5]  # backoff doubled, capped
    (failed,) = last
    assert isinstance(failed, ev.FailResults) and type(failed.error) is UnavailableError
    assert str(failed.error) == ("Failed to get elements from worker w1:1 (task 1) unreachable "
                                 "for 11.5 s: connection refused")
    assert next_read(state, 20.0) == ev.StopReading()


def test_a_deadline_counts_as_unreachable(state: ReaderState) -> None:
    state.apply(view(1))
    reads(state, 1)
    late = DeadlineExceededError("GetElements at w1:1: no answer")
    assert "no answer" in warnings(state.apply(ev.WorkerUnreachable(1, late, 0.0)))[0]
    assert next_read(state, 0.0) == ev.Wait(0.5)


def test_a_waiting_consumer_says_so_naming_task_and_worker(state: ReaderState) -> None:
    state.apply(view(1))
    unreachable(state, 1, now=0.0)
    said = [(now, warnings(unreachable(state, 1, now))) for now in (2.0, 4.0, 6.0, 8.5)]
    assert said == [(2.0, []),
                    (4.0, ["Still waiting on task 1: nothing from it for 4 s, its worker w1:1 "
                           "unreachable: connection refused"]),
                    (6.0, []),
                    (8.5, ["Still waiting on task 1: nothing from it for 8 s, its worker w1:1 "
                           "unreachable: connection refused"])]


def test_an_answer_resets_the_count(state: ReaderState) -> None:
    state.apply(view(1))
    unreachable(state, 1, now=0.0)
    unreachable(state, 1, now=9.0)
    reads(state, 1, now=12.0)
    state.apply(ev.ElementsArrived(1, 0))
    assert warnings(unreachable(state, 1, now=13.0))[0].startswith("Cannot reach")  # anew
    unreachable(state, 1, now=22.9)  # timed from 13.0
    assert next_read(state, 30.0) == ev.Read(1, "w1:1", 2048)


def reached_and_busy(state: ReaderState) -> None:
    """Task 1's worker has answered and has a request out again; task 2's worker could not
    be reached at 0.0."""
    assert reads(state, 2) == [1, 2]
    state.apply(ev.ElementsArrived(1, 5))
    state.apply(ev.WorkerUnreachable(2, REFUSED, 0.0))
    assert reads(state, 1) == [1]


def test_other_workers_finish_the_job_without_an_unreachable_one(state: ReaderState) -> None:
    state.apply(view(1, 2))
    reached_and_busy(state)
    (warning,) = unreachable(state, 2, now=10.0)
    assert warning == ev.Warn("Reading on without worker w2:1 (task 2) unreachable for 10.0 s: "
                              "connection refused; the other workers finish the job (its "
                              "elements not yet read are skipped)")
    assert state.outcome is None
    for _ in range(3):  # the others go on; the skipped task is never read again
        state.apply(ev.ElementsArrived(1, 5))
        assert reads(state, 1, now=20.0) == [1]
    # the dispatcher never says the iteration finished: task 2 stays unfinished
    assert state.apply(ev.HeartbeatView((ev.ListedTask(1, "w1:1"), ev.ListedTask(2, "w2:1")),
                                        False)) == ()
    assert state.apply(ev.EndOfSequence(1)) == (ev.EndResults(),)
    assert next_read(state, 30.0) == ev.StopReading()


def test_skipping_the_last_task_ends_the_reading_at_once(state: ReaderState) -> None:
    state.apply(view(1, 2))
    reads(state, 1)
    state.apply(ev.EndOfSequence(1))
    unreachable(state, 2, now=0.0)
    assert unreachable(state, 2, now=10.0)[1:] == (ev.EndResults(),)


def test_no_skip_when_no_other_worker_was_reached(state: ReaderState) -> None:
    state.apply(view(1, 2))
    unreachable(state, 1, now=0.0)
    unreachable(state, 2, now=0.0)
    (failed,) = unreachable(state, 1, now=10.0)
    assert isinstance(failed, ev.FailResults) and "w1:1" in str(failed.error)


def test_no_skip_when_the_job_cannot_finish_without_the_task() -> None:
    state = ReaderState(ReaderConfig(unreachable_timeout_s=10.0, can_skip=False))
    state.apply(view(1, 2))
    reached_and_busy(state)
    (failed,) = unreachable(state, 2, now=10.0)
    assert isinstance(failed, ev.FailResults) and "w2:1" in str(failed.error)


def dynamic_task_unreachable(state: ReaderState, now: float) -> tuple[Any, ...]:
    """Read task 2 (run 1) at ``now`` and find its worker unreachable."""
    assert next_read(state, now) == ev.Read(2, "w2:1", state.config.per_call, 1)
    return state.apply(ev.WorkerUnreachable(2, REFUSED, now))


def reports(instructions: tuple[Any, ...]) -> list[Any]:
    return [i for i in instructions if isinstance(i, ev.ReportUnreachable)]


def test_a_dynamic_tasks_unreachable_worker_is_reported_and_never_skipped(
        state: ReaderState) -> None:
    """A task with runs (DYNAMIC): its unreachable worker is reported to the dispatcher (which
    has the task adopted if the worker is gone), again every report_every_s while it stays
    so; the task is waited for, not skipped (another worker was reached): after the timeout
    the reading fails."""
    state.apply(ev.HeartbeatView((ev.ListedTask(1, "w1:1", 1), ev.ListedTask(2, "w2:1", 1)),
                                 False))
    assert reads(state, 2) == [1, 2]
    state.apply(ev.ElementsArrived(1, 5))
    first = state.apply(ev.WorkerUnreachable(2, REFUSED, 0.0))
    assert reports(first) == [ev.ReportUnreachable(2, "w2:1")]
    assert reads(state, 1) == [1]  # task 1 stays busy from here on
    assert reports(dynamic_task_unreachable(state, 0.5)) == []
    assert reports(dynamic_task_unreachable(state, 2.5)) == [ev.ReportUnreachable(2, "w2:1")]
    *_, failed = dynamic_task_unreachable(state, 10.0)
    assert isinstance(failed, ev.FailResults), failed
    assert "w2:1" in str(failed.error) and "run elsewhere" in str(failed.error)


def test_a_dynamic_tasks_adopted_run_is_read_where_it_runs(state: ReaderState) -> None:
    """Once the dispatcher lists the task's next run on its adopter, the reader reads it
    there (once the held run is released)."""
    state.apply(ev.HeartbeatView((ev.ListedTask(1, "w1:1", 1), ev.ListedTask(2, "w2:1", 1)),
                                 False))
    assert reads(state, 2) == [1, 2]
    state.apply(ev.WorkerUnreachable(2, REFUSED, 0.0))
    state.apply(ev.HeartbeatView((ev.ListedTask(1, "w1:1", 1),
                                  ev.ListedTask(2, "w1:1", 2, held=True)), False, now=0.2))
    assert state.reports()[0] == ((2, 2),)
    state.apply(ev.HeartbeatView((ev.ListedTask(1, "w1:1", 1), ev.ListedTask(2, "w1:1", 2)),
                                 False, ((2, 2),), now=0.4))
    assert next_read(state, 0.5) == ev.Read(2, "w1:1", state.config.per_call, 2)


def test_a_run_held_too_long_fails_saying_what_it_waited_for(state: ReaderState) -> None:
    waits = "2 more of the 3 consumers that saved the shared job (resumed by 1 so far)"
    held = (ev.ListedTask(1, "w1:1", 1, held=True, held_for=waits),)
    state.apply(ev.HeartbeatView(held, False, now=0.0))
    (failed,) = state.apply(ev.HeartbeatView(held, False, now=10.0))
    assert isinstance(failed, ev.FailResults), failed
    assert f"task 1, whose run 1 waited 10.0 s for {waits}" in str(failed.error)


# ----- the end -----------------------------------------------------------------------------------

def test_the_end_of_every_task_asks_for_a_heartbeat(state: ReaderState) -> None:
    state.apply(view(1, 2))
    reads(state, 2)
    assert state.apply(ev.EndOfSequence(1)) == ()
    assert state.apply(ev.EndOfSequence(2)) == (ev.HeartbeatNow(),)
    assert not state.done
    assert next_read(state) == ev.Wait(None)
    assert state.apply(view(finished=True)) == (ev.EndResults(),)
    assert state.done and state.over
    assert next_read(state) == ev.StopReading()


def test_an_empty_finished_iteration_ends_at_once(state: ReaderState) -> None:
    assert state.apply(view(finished=True)) == (ev.EndResults(),)
    assert next_read(state) == ev.StopReading()


def test_done_waits_for_a_reply_in_flight_on_an_ended_task(state: ReaderState) -> None:
    state.apply(view(1))
    reads(state, 1)
    # the dispatcher no longer lists the task and says the iteration finished, but the reply
    # in flight may hold elements
    assert state.apply(view(finished=True)) == ()
    assert not state.done
    assert state.apply(ev.ElementsArrived(1, 5)) == (ev.EndResults(),)


def test_a_task_the_dispatcher_dropped_is_never_read_again(state: ReaderState) -> None:
    state.apply(view(1, 2))
    state.apply(view(2))
    assert reads(state, 1) == [2]
    state.apply(view(1, 2))  # listed again: still ended
    assert next_read(state) == ev.Wait(None)


def test_a_task_read_to_its_end_is_never_read_again(state: ReaderState) -> None:
    state.apply(view(1, 2))
    reads(state, 2)
    state.apply(ev.EndOfSequence(1))
    state.apply(ev.ElementsArrived(2, 1))
    assert reads(state, 1) == [2]
    assert next_read(state) == ev.Wait(None)


def test_a_read_failure_names_the_worker_and_ends_the_results(state: ReaderState) -> None:
    state.apply(view(1, 2))
    reads(state, 2)
    (failed,) = state.apply(ev.ReadFailed(1, InvalidArgumentError("bad pipeline")))
    assert isinstance(failed, ev.FailResults)
    assert type(failed.error) is InvalidArgumentError
    assert str(failed.error) == "Failed to get elements from worker w1:1: bad pipeline"
    assert state.error is failed.error
    assert state.apply(ev.ReadFailed(2, UnavailableError("again"))) == ()  # first error wins
    assert next_read(state) == ev.StopReading()


def test_a_heartbeat_failure_ends_the_results(state: ReaderState) -> None:
    error = UnavailableError("dispatcher gone")
    assert state.apply(ev.HeartbeatFailed(error)) == (ev.FailResults(error),)
    assert state.over and next_read(state) == ev.StopReading()


def test_close_cancels_once_and_stops_reading(state: ReaderState) -> None:
    state.apply(view(1, 2))
    reads(state, 2)
    assert state.apply(ev.Close()) == (ev.CancelResults(),)
    assert state.apply(ev.Close()) == ()
    assert next_read(state) == ev.StopReading()
    # replies still in flight are taken, but change nothing the consumer sees
    assert state.apply(ev.EndOfSequence(1)) == ()
    assert state.apply(ev.WorkerUnreachable(2, REFUSED, 100.0)) == ()
    assert state.apply(view(finished=True)) == ()
    assert state.apply(ev.HeartbeatFailed(UnavailableError("late"))) == ()
    assert state.outcome is None


@pytest.mark.parametrize("event", [ev.ElementsArrived(1, 1), ev.EndOfSequence(1),
                                   ev.WorkerUnreachable(1, REFUSED, 0.0),
                                   ev.ReadFailed(1, UnavailableError("x")),
                                   ev.ElementsArrived(99, 1)])
def test_an_answer_without_a_request_is_refused(state: ReaderState, event: Any) -> None:
    state.apply(view(1))
    with pytest.raises(InvalidArgumentError, match="has no request in flight"):
        state.apply(event)


def test_an_unknown_event_is_a_programming_error(state: ReaderState) -> None:
    with pytest.raises(TypeError, match="ReaderState has no handler for str"):
        state.apply("tick")


# ----- any interleaving --------------------------------------------------------------------------

TASKS = range(1, 6)
QUICK = ReaderConfig(window=5, outstanding=2, unreachable_timeout_s=3.0, first_backoff_s=0.5,
                     max_backoff_s=1.0, warn_every_s=1.0)
CONFIGS = [ANONYMOUS, NAMED, QUICK, dataclasses.replace(QUICK, window=None, can_skip=False)]


class Model:
    """What a correct reader must make of the events the test sent, kept independently."""

    def __init__(self, config: ReaderConfig) -> None:
        self.config = config
        self.known: set[int] = set()
        self.ended: set[int] = set()
        self.skipped: set[int] = set()
        self.asked: dict[int, int] = {}  # the requests in flight
        self.reached: set[int] = set()
        self.retry_at: dict[int, float] = {}
        self.backoff: dict[int, float] = {}
        self.failing_since: dict[int, float] = {}  # unreachable since, for those that are
        self.warned_at: dict[int, float] = {}
        self.unreturned = 0
        self.finished = False
        self.outcome: Any = None
        self.closed = False
        self.now = 0.0

    @property
    def done(self) -> bool:
        return (self.known <= self.ended and not self.asked
                and (self.finished or bool(self.skipped)))

    @property
    def over(self) -> bool:
        return self.closed or self.outcome is not None

    @property
    def held(self) -> int:
        return self.unreturned + sum(self.asked.values())

    def ready(self) -> set[int]:
        return {t for t in self.known - self.ended - set(self.asked)
                if self.retry_at.get(t, 0.0) <= self.now}

    def check_read(self, answer: Any) -> None:
        window, per_call = self.config.window, self.config.per_call
        room = window is None or self.held + per_call <= window
        if isinstance(answer, ev.Read):
            assert not self.over and room
            assert answer.task_id in self.ready(), (answer, vars(self))
            assert answer.worker_address == f"w{answer.task_id}:1"
            assert answer.max_elements == per_call
            self.asked[answer.task_id] = per_call
        elif isinstance(answer, ev.Wait):
            assert not self.over
            assert not room or not self.ready()
            waiting = self.known - self.ended - set(self.asked)
            expected = min((self.retry_at.get(t, 0.0) for t in waiting), default=None)
            assert answer.until == (expected if room else None)
        else:
            assert answer == ev.StopReading() and self.over

    def unreachable(self, task_id: int) -> tuple[list[str], str | None]:
        """The warnings a failure to reach ``task_id`` calls for, and whether it then gives
        up on the task ("skip" or "fail")."""
        config, now = self.config, self.now
        self.reached.discard(task_id)
        expected = []
        if task_id not in self.failing_since:
            self.failing_since[task_id] = self.warned_at[task_id] = now
            self.backoff[task_id] = config.first_backoff_s
            expected.append("Cannot reach")
        else:
            self.backoff[task_id] = min(2 * self.backoff[task_id], config.max_backoff_s)
        self.retry_at[task_id] = now + self.backoff[task_id]
        if now - self.failing_since[task_id] >= config.unreachable_timeout_s:
            if config.can_skip and self.reached - {task_id}:
                self.ended.add(task_id)
                self.skipped.add(task_id)
                return ["Reading on without"], "skip"
            return [], "fail"
        if now - self.warned_at[task_id] >= config.warn_every_s:
            self.warned_at[task_id] = now
            expected.append("Still waiting")
        return expected, None

    def check_instruction(self, event: Any, instructions: tuple[Any, ...],
                          expected_warnings: list[str], give_up: str | None) -> None:
        """``instructions`` must be what ``event`` (already applied to the model) calls
        for."""
        said = warnings(instructions)
        assert [w.split(" ")[0:2] for w in said] == [w.split(" ")[0:2]
                                                      for w in expected_warnings]
        rest = tuple(i for i in instructions if not isinstance(i, ev.Warn))
        expected: Any = ()
        if isinstance(event, (ev.ReadFailed, ev.HeartbeatFailed)) or give_up == "fail":
            (failed,) = rest
            assert isinstance(failed, ev.FailResults)
            assert str(event.error) in str(failed.error)
            expected = rest
        elif self.done:
            expected = (ev.EndResults(),)
        elif isinstance(event, ev.EndOfSequence) and self.known <= self.ended:
            expected = (ev.HeartbeatNow(),)
        assert rest == expected, (event, vars(self))
        if expected and isinstance(expected[0], (ev.EndResults, ev.FailResults)):
            self.outcome = expected[0]


@functools.cache
def event_kinds(asked: bool, unreturned: bool) -> Any:
    """What kind of event comes next: weights by repetition, so that the events that end the
    reading are rare and runs go on (one strategy for each case, built once: hypothesis
    spends more time building a strategy of 600 choices than drawing from it)."""
    kinds = (["next"] * 8 + ["view"] * 3 + ["tick"] * 4 + ["answer"] * 12 * asked
             + ["returned"] * 4 * unreturned)
    return hs.sampled_from([*kinds * 20, "close", "heartbeat_failed"])


TASK_SETS = hs.sets(hs.sampled_from(TASKS))
TICKS = hs.sampled_from([0.1, 0.5, 2.0, 5.0])
ONE_IN_20 = hs.sampled_from(range(20))


def draw_event(draw: Any, model: Model) -> Any:
    kind = draw(event_kinds(bool(model.asked), model.unreturned > 0))
    if kind == "view":  # mostly the tasks known so far, and maybe new ones
        listed = draw(TASK_SETS)
        if draw(hs.integers(0, 3)):
            listed |= model.known - model.ended
        return view(*sorted(listed), finished=not draw(hs.integers(0, 5)))
    if kind == "next":
        return ev.NextRead(model.now)
    if kind == "tick":
        return draw(TICKS)
    if kind == "returned":
        return ev.ElementsReturned(draw(hs.integers(1, model.unreturned)))
    if kind == "close":
        return ev.Close()
    if kind == "heartbeat_failed":
        return ev.HeartbeatFailed(UnavailableError("dispatcher gone"))
    task_id = draw(hs.sampled_from(sorted(model.asked)))
    count = draw(hs.integers(0, model.asked[task_id]))
    answers = ([ev.ElementsArrived(task_id, count)] * 4 + [ev.EndOfSequence(task_id)] * 2
               + [ev.WorkerUnreachable(task_id, REFUSED, model.now)] * 6)
    if not draw(ONE_IN_20):  # ends the reading: rare
        return ev.ReadFailed(task_id, UnavailableError("reset"))
    return draw(hs.sampled_from(answers))


def step(state: ReaderState, model: Model, event: Any) -> None:
    """Apply ``event`` to the state and the model; check the state's answer against both."""
    if isinstance(event, float):  # time passes
        model.now += event
        return
    result = state.apply(event)
    if isinstance(event, ev.NextRead):
        (answer,) = result
        model.check_read(answer)
        return
    expected_warnings: list[str] = []
    give_up = None
    if isinstance(event, ev.HeartbeatView):
        listed = {t.task_id for t in event.tasks}
        model.ended |= model.known - listed
        model.known |= listed
        model.finished = event.iteration_finished
    elif isinstance(event, ev.Close):
        assert result == (() if model.closed else (ev.CancelResults(),))
        model.closed = True
        return
    elif isinstance(event, ev.ElementsReturned):
        model.unreturned -= event.count
    elif not isinstance(event, ev.HeartbeatFailed):
        del model.asked[event.task_id]
        if isinstance(event, (ev.ElementsArrived, ev.EndOfSequence)):
            model.reached.add(event.task_id)
            model.failing_since.pop(event.task_id, None)
            model.retry_at.pop(event.task_id, None)
        if isinstance(event, ev.ElementsArrived):
            model.unreturned += event.count
        elif isinstance(event, ev.EndOfSequence):
            model.ended.add(event.task_id)
        elif (isinstance(event, ev.WorkerUnreachable) and not model.over
              and event.task_id not in model.ended):
            expected_warnings, give_up = model.unreachable(event.task_id)
    if model.over:
        assert result == ()  # the consumer's results have ended: nothing more for them
        return
    model.check_instruction(event, result, expected_warnings, give_up)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hs.data(), hs.sampled_from(CONFIGS), hs.integers(min_value=0, max_value=120))
def test_any_interleaving_keeps_the_readers_promises(data: Any, config: ReaderConfig,
                                                     length: int) -> None:
    """At most one request in flight per task, never a read of an ended or backing-off task,
    never more held than the window, warnings and a skip or failure exactly when a worker
    stays unreachable, done exactly when the dispatcher said finished (or a task was
    skipped) and every task ended with nothing in flight, and one end of the results at
    most."""
    state, model = ReaderState(config), Model(config)
    for _ in range(length):
        step(state, model, draw_event(data.draw, model))
        assert state.done == model.done
        assert {t.task_id for t in state.tasks.values() if t.in_flight} == set(model.asked)
        assert state.held == model.held
        assert config.window is None or state.held <= config.window
    # once nothing new happens, answering every read ends the iteration
    step(state, model, view(finished=True))
    for task_id in sorted(model.asked):
        step(state, model, ev.EndOfSequence(task_id))
    assert state.over
    assert state.apply(ev.NextRead(model.now)) == (ev.StopReading(),)


def test_a_dispatcher_restarted_without_a_later_run_is_followed_and_reported_again(
        state: ReaderState) -> None:
    """A run made while the dispatcher's journal failed is lost when it dies: the restarted
    dispatcher lists the earlier run, and when it makes the later one anew, the reader reports
    what it received again (else that run would wait for it forever)."""
    state.apply(ev.HeartbeatView((ev.ListedTask(1, "w1:1", 2, held=True),), False))
    assert state.reports()[0] == ((1, 2),)
    # the restarted dispatcher (at run 1) takes the report, and lists its run 1
    state.apply(ev.HeartbeatView((ev.ListedTask(1, "w0:1", 1),), False, settled=((1, 2),)))
    assert state.tasks[1].incarnation == 1 and state.tasks[1].worker_address == "w0:1"
    state.apply(ev.HeartbeatView((ev.ListedTask(1, "w2:1", 2, held=True),), False))
    assert state.reports()[0] == ((1, 2),)  # reported again, for the run made anew
