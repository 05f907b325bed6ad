"""The coordinator's scheduling state machine, driven without a network: closures through
lanes, the first error and its cancellations (grace periods, abandoned Runs), lost workers,
probes, resource rebuilds and frees, and a hypothesis property over any interleaving of them."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from convoy._transport.rpc import Outcome
from convoy.distribute._schedule_messages import (
    Abandon,
    Build,
    Built,
    CancelRunning,
    Closed,
    ErrorTaken,
    Finished,
    Free,
    GraceOver,
    Probe,
    RaiseError,
    Rebuild,
    RebuildFailed,
    Rebuilt,
    Resolve,
    ResourceAdded,
    ResourceDropped,
    Run,
    Scheduled,
    Start,
    Take,
    Wake,
    Withdraw,
    WorkerBack,
    WorkerLost,
)
from convoy.distribute._schedule_state import DOWN, FAILED, REBUILDING, UP, ScheduleState
from convoy.distribute._wire import WithdrawnError
from convoy.errors import (
    CancelledError,
    FailedPreconditionError,
    InvalidArgumentError,
    UnavailableError,
)


def of(kind, instructions):
    return [i for i in instructions if type(i) is kind]


def resolved(instructions):
    return {i.closure_id: i.outcome for i in of(Resolve, instructions)}


def started(num_workers=2, batch=2, incarnations=None, send_ahead=False):
    state = ScheduleState(num_workers, batch, send_ahead)
    state.apply(Start(tuple(incarnations or (f"p{w}" for w in range(num_workers)))))
    return state


def schedule(state, *ids):
    return [i for closure_id in ids for i in state.apply(Scheduled(closure_id))]


def test_closures_run_in_batches_and_resolve():
    state = started(batch=2)
    assert state.settled
    schedule(state, 1, 2, 3, 4, 5, 6)
    assert not state.settled
    # Plenty queued for two workers up: a lane takes its batch of two (more follow).
    assert state.apply(Take(0, 0)) == [Run(0, 0, (1, 2), followed=True)]
    assert state.apply(Take(1, 0)) == [Run(1, 0, (3, 4), followed=True)]
    # Two left for two workers: a lane takes its share, one; the last Run is not followed.
    assert state.apply(Take(0, 1)) == [Run(0, 1, (5,), followed=True)]
    assert state.apply(Take(1, 1)) == [Run(1, 1, (6,))]
    assert state.in_flight == 6
    assert resolved(state.apply(Finished(0, 0, (Outcome("a"), Outcome("b"))))) == {
        1: Outcome("a"), 2: Outcome("b")}
    for lane, ids in [((1, 0), (3, 4)), ((0, 1), (5,)), ((1, 1), (6,))]:
        state.apply(Finished(*lane, tuple(map(Outcome, ids))))
    assert state.settled and state.apply(ErrorTaken()) == []


def test_a_short_queue_is_shared_between_workers():
    state = started(num_workers=3, batch=4)
    schedule(state, 1, 2, 3)
    assert state.apply(Take(0, 0)) == [Run(0, 0, (1,), followed=True)]
    schedule(state, 4, 5, 6, 7, 8, 9, 10, 11)
    assert state.apply(Take(1, 0)) == [Run(1, 0, (2, 3, 4), True)]  # 9 queued // 3 up


def test_idle_lanes_are_woken_one_per_queued_closure():
    state = started(num_workers=2)
    for lane in [(0, 0), (0, 1), (1, 0)]:
        assert state.apply(Take(*lane)) == []
    assert state.apply(Scheduled(1)) == [Wake(0, 0)]
    assert state.apply(Scheduled(2)) == [Wake(0, 1)]  # (0, 0) is woken for the first
    assert state.apply(Take(0, 1)) == [Run(0, 1, (1,), followed=True)]
    assert state.apply(Take(0, 0)) == [Run(0, 0, (2,))]
    assert state.apply(Scheduled(3)) == [Wake(1, 0)]
    assert state.apply(Scheduled(4)) == []  # nobody left waiting


def test_first_error_cancels_the_queue_and_asks_to_cancel_what_runs():
    state = started(batch=1)
    schedule(state, 1, 2, 3, 4)
    state.apply(Take(0, 0))
    state.apply(Take(1, 0))
    instructions = state.apply(Finished(0, 0, (Outcome(error=ValueError("boom")),)))
    outcomes = resolved(instructions)
    assert isinstance(outcomes.pop(1).error, ValueError)
    assert set(outcomes) == {3, 4}
    assert all(isinstance(o.error, CancelledError) and "boom" in str(o.error)
               for o in outcomes.values())
    assert of(CancelRunning, instructions) == [CancelRunning(1, 0, (2,))]
    # join waits for the running closure (or its grace period); the error is not taken before.
    assert state.error is not None and not state.settled
    with pytest.raises(FailedPreconditionError):
        state.apply(ErrorTaken())
    with pytest.raises(FailedPreconditionError, match="pending"):
        state.apply(Scheduled(5))
    # A running closure that finishes keeps its own result; a second error is not kept.
    assert resolved(state.apply(Finished(1, 0, (Outcome("kept"),)))) == {2: Outcome("kept")}
    assert state.settled
    [raised] = state.apply(ErrorTaken())
    assert isinstance(raised, RaiseError) and isinstance(raised.error, ValueError)
    assert state.apply(ErrorTaken()) == []  # raised once, then cleared
    schedule(state, 5)
    assert state.apply(Take(0, 0)) == [Run(0, 0, (5,))]


def test_the_error_kept_is_the_failure_not_the_cancellations_it_caused():
    # A failing call cancels the other calls of its Run on the worker: the Run answers their
    # CancelledErrors too, maybe first.
    state = started(num_workers=1, batch=3)
    schedule(state, 1, 2, 3)
    state.apply(Take(0, 0))
    state.apply(Finished(0, 0, (Outcome(error=CancelledError("mate")),
                                Outcome(error=ValueError("boom")), Outcome(3))))
    [raised] = state.apply(ErrorTaken())
    assert isinstance(raised.error, ValueError)
    # a function that raises CancelledError itself is an error like another
    schedule(state, 4)
    state.apply(Take(0, 0))
    state.apply(Finished(0, 0, (Outcome(error=CancelledError("its own")),)))
    assert isinstance(state.apply(ErrorTaken())[0].error, CancelledError)


def test_a_lost_worker_gives_its_closures_back_and_is_probed_once():
    state = started(batch=2)
    schedule(state, *range(1, 9))
    assert state.apply(Take(0, 0)) == [Run(0, 0, (1, 2), followed=True)]
    assert state.apply(Take(0, 1)) == [Run(0, 1, (3, 4), followed=True)]
    assert state.apply(WorkerLost(0, 0)) == [Probe(0)]
    assert state.workers[0].status == DOWN
    assert list(state.queue) == [1, 2, 5, 6, 7, 8]  # back at the head, in order
    assert state.apply(WorkerLost(0, 1)) == []  # probed already
    assert list(state.queue) == [3, 4, 1, 2, 5, 6, 7, 8]
    assert state.apply(Take(1, 0)) == [Run(1, 0, (3, 4), True)]  # the only worker up: a full batch
    assert state.apply(Take(0, 0)) == []  # a down worker takes nothing
    # Back as the same process: no resources to rebuild, it takes work again.
    assert state.apply(WorkerBack(0, "p0")) == [Wake(0, 0)]
    assert state.workers[0].status == UP
    assert state.apply(Take(0, 0)) == [Run(0, 0, (1, 2), True)]


def test_closures_given_back_wake_a_waiting_lane_of_another_worker():
    state = started(batch=2)
    state.apply(Take(1, 0))
    assert state.apply(Scheduled(1)) == [Wake(1, 0)]
    state.apply(Take(0, 0))
    assert state.apply(Take(1, 0)) == []  # woken, but worker 0 took it first
    assert state.apply(WorkerLost(0, 0)) == [Probe(0), Wake(1, 0)]
    assert state.apply(Take(1, 0)) == [Run(1, 0, (1,))]


def test_a_closure_lost_after_an_error_is_cancelled_not_run_again():
    state = started(batch=1)
    schedule(state, 1, 2)
    state.apply(Take(0, 0))
    state.apply(Take(1, 0))
    state.apply(Finished(0, 0, (Outcome(error=ValueError("boom")),)))
    outcomes = resolved(state.apply(WorkerLost(1, 0)))
    assert isinstance(outcomes[2].error, CancelledError)
    assert not state.queue and state.settled


def test_a_new_process_rebuilds_its_resources_before_taking_work():
    state = started(num_workers=2, batch=1)
    assert state.apply(ResourceAdded(7, "per-worker dataset")) == [Build(0, 7), Build(1, 7)]
    state.apply(Built(0, 7))
    state.apply(Built(1, 7))
    schedule(state, 1)
    state.apply(Take(0, 0))
    state.apply(WorkerLost(0, 0))
    # The same process answers: it still holds resource 7.
    assert state.apply(WorkerBack(0, "p0")) == []
    assert state.workers[0].status == UP
    state.apply(WorkerLost(0))
    # A new process: resource 7 is built again, and one added meanwhile too.
    assert state.apply(WorkerBack(0, "p0-again")) == [Rebuild(0, (7,))]
    assert state.workers[0].status == REBUILDING
    assert state.apply(ResourceAdded(8, "per-worker iterator")) == [Build(1, 8)]
    assert state.apply(Take(0, 0)) == []
    assert state.apply(Rebuilt(0, (7,))) == [Rebuild(0, (8,))]
    assert state.apply(Rebuilt(0, (8,))) == [Wake(0, 0)]
    assert state.workers[0].status == UP


def test_a_failed_rebuild_is_raised_naming_the_worker_and_the_resource():
    state = started(num_workers=2, batch=1)
    state.apply(ResourceAdded(3, "per-worker dataset"))
    schedule(state, 1, 2)
    state.apply(Take(0, 0))
    state.apply(WorkerLost(0, 0))
    assert state.apply(WorkerBack(0, "new")) == [Rebuild(0, (3,))]
    instructions = state.apply(RebuildFailed(0, 3, ValueError("no such file")))
    assert state.workers[0].status == FAILED
    assert of(Probe, instructions) == [Probe(0, unless="new")]
    # queued closures are cancelled; join's condition holds at once
    assert set(resolved(instructions)) == {1, 2} and state.settled
    [raised] = state.apply(ErrorTaken())
    message = str(raised.error)
    assert isinstance(raised.error, FailedPreconditionError)
    assert "worker 0" in message and "per-worker dataset" in message
    assert "no such file" in message and isinstance(raised.error.__cause__, ValueError)
    # A failed worker takes nothing until it answers as another process; then it rebuilds.
    schedule(state, 4)
    assert state.apply(Take(0, 0)) == []
    assert state.apply(WorkerBack(0, "new")) == [Probe(0, unless="new")]
    assert state.apply(WorkerBack(0, "newer")) == [Rebuild(0, (3,))]


def test_a_rebuild_that_finds_the_worker_gone_probes_it_again():
    state = started(num_workers=1)
    state.apply(ResourceAdded(1, "per-worker dataset"))
    state.apply(WorkerLost(0))
    state.apply(WorkerBack(0, "new"))
    assert state.apply(RebuildFailed(0, 1, UnavailableError("gone"), unreachable=True)) == [
        Probe(0)]
    assert state.workers[0].status == DOWN and state.error is None


def test_a_dropped_resource_is_not_rebuilt():
    state = started(num_workers=1)
    state.apply(ResourceAdded(1, "per-worker dataset"))
    state.apply(ResourceDropped(1))
    state.apply(WorkerLost(0))
    assert state.apply(WorkerBack(0, "new")) == []
    assert state.workers[0].status == UP


def test_a_worker_silent_at_start_is_probed():
    state = ScheduleState(2, 1)
    assert state.apply(Start(("p0", None))) == [Probe(1)]
    assert [w.status for w in state.workers] == [UP, DOWN]


def test_closing_cancels_the_queue_and_what_runs_and_wakes_waiting_lanes():
    state = started(num_workers=2, batch=1)
    state.apply(Take(1, 0))
    schedule(state, 1, 2, 3)
    state.apply(Take(0, 0))
    instructions = state.apply(Closed())
    outcomes = resolved(instructions)
    assert set(outcomes) == {1, 2, 3}  # the running one too: it is abandoned
    assert all(isinstance(o.error, CancelledError) and "shut down" in str(o.error)
               for o in outcomes.values())
    assert of(Abandon, instructions) == [Abandon(0, 0, (1,))]
    assert of(Wake, instructions) == [] and state.closed and state.settled
    assert state.apply(Take(1, 0)) == [] and not state.idle
    with pytest.raises(FailedPreconditionError, match="shut down"):
        state.apply(Scheduled(4))
    with pytest.raises(FailedPreconditionError, match="shut down"):
        state.apply(ResourceAdded(9, "per-worker dataset"))
    assert state.apply(WorkerLost(0, 0)) == []  # the abandoned Run's end: dropped
    assert state.workers[0].status == UP  # nobody probes after shutdown
    assert state.apply(Take(0, 0)) == []


def test_closing_frees_every_resource_and_wakes_idle_lanes():
    state = started(num_workers=2, batch=1)
    state.apply(ResourceAdded(5, "per-worker dataset"))
    state.apply(Built(0, 5))
    state.apply(Built(1, 5))
    state.apply(ResourceAdded(6, "per-worker iterator"))
    state.apply(Built(1, 6))
    state.apply(Take(0, 0))
    instructions = state.apply(Closed())
    assert of(Wake, instructions) == [Wake(0, 0)]
    assert of(Free, instructions) == [Free(0, (5,)), Free(1, (5, 6))]
    assert state.apply(Closed()) == []  # twice: nothing more
    # a build that lands after the shutdown is freed at once
    assert state.apply(Built(0, 6)) == [Free(0, (6,))]


def test_a_cancelled_run_that_outlives_its_grace_period_is_abandoned():
    state = started(num_workers=2, batch=2)
    schedule(state, 1, 2, 3, 4, 5, 6)
    state.apply(Take(0, 0))  # runs 1, 2
    state.apply(Take(1, 0))  # runs 3, 4
    instructions = state.apply(Finished(0, 0, (Outcome(error=ValueError("boom")), Outcome(2))))
    assert of(CancelRunning, instructions) == [CancelRunning(1, 0, (3, 4))]
    assert not state.settled
    instructions = state.apply(GraceOver(1, 0, (3, 4)))
    outcomes = resolved(instructions)
    assert set(outcomes) == {3, 4}
    assert all(isinstance(o.error, CancelledError) and "boom" in str(o.error)
               for o in outcomes.values())
    assert of(Abandon, instructions) == [Abandon(1, 0, (3, 4))]
    assert state.settled and state.abandoned == {(1, 0)}  # join raises now
    [raised] = state.apply(ErrorTaken())
    assert isinstance(raised.error, ValueError)
    schedule(state, 7)
    with pytest.raises(InvalidArgumentError):
        state.apply(Take(1, 0))  # its call is still on the wire
    # The abandoned Run answers after all: dropped; the lane takes work again.
    assert state.apply(Finished(1, 0, (Outcome(3), Outcome(4)))) == []
    assert not state.abandoned
    assert state.apply(Take(1, 0)) == [Run(1, 0, (7,))]


def test_a_grace_period_over_after_the_run_answered_changes_nothing():
    state = started(num_workers=2, batch=1)
    schedule(state, 1, 2)
    state.apply(Take(0, 0))
    state.apply(Take(1, 0))
    state.apply(Finished(0, 0, (Outcome(error=ValueError("boom")),)))
    # the cancelled function stopped at its next variable operation
    outcomes = resolved(state.apply(Finished(1, 0, (Outcome(error=CancelledError("c")),))))
    assert isinstance(outcomes[2].error, CancelledError) and state.settled
    assert state.apply(GraceOver(1, 0, (2,))) == []
    assert isinstance(state.apply(ErrorTaken())[0].error, ValueError)  # the first error
    schedule(state, 3)
    assert state.apply(Take(1, 0)) == [Run(1, 0, (3,))]
    assert state.apply(GraceOver(1, 0, (2,))) == []  # a late one: the lane runs another Run
    assert state.running == {(1, 0): (3,)}


def test_an_abandoned_run_whose_worker_is_lost_is_not_run_again():
    state = started(num_workers=2, batch=1)
    schedule(state, 1, 2)
    state.apply(Take(0, 0))
    state.apply(Take(1, 0))
    state.apply(Finished(0, 0, (Outcome(error=ValueError("boom")),)))
    state.apply(GraceOver(1, 0, (2,)))
    assert state.apply(WorkerLost(1, 0)) == [Probe(1)]
    assert not state.queue and not state.abandoned and state.workers[1].status == DOWN


def test_a_dropped_resource_is_freed_where_it_was_built():
    state = started(num_workers=3)
    state.apply(ResourceAdded(4, "per-worker iterator"))
    state.apply(Built(0, 4))
    state.apply(Built(2, 4))
    assert state.apply(ResourceDropped(4)) == [Free(0, (4,)), Free(2, (4,))]
    assert state.apply(ResourceDropped(4)) == []  # once
    # a build or rebuild that lands after the drop is freed where it landed
    assert state.apply(Built(1, 4)) == [Free(1, (4,))]
    state.apply(ResourceAdded(5, "per-worker dataset"))
    state.apply(Built(0, 5))
    state.apply(WorkerLost(0))
    assert state.apply(WorkerBack(0, "new")) == [Rebuild(0, (5,))]
    state.apply(ResourceDropped(5))
    assert state.apply(Rebuilt(0, (5,))) == [Free(0, (5,))]
    assert state.workers[0].status == UP and not state.workers[0].built


def test_events_that_do_not_fit_are_refused():
    state = started(num_workers=1)
    schedule(state, 1)
    state.apply(Take(0, 0))
    with pytest.raises(InvalidArgumentError):
        state.apply(Take(0, 0))  # already running
    with pytest.raises(InvalidArgumentError):
        state.apply(Finished(0, 1, (Outcome(),)))  # not running
    with pytest.raises(InvalidArgumentError):
        state.apply(Finished(0, 0, (Outcome(), Outcome())))  # wrong count
    with pytest.raises(InvalidArgumentError):
        state.apply(WorkerBack(0, "p0"))  # not being probed
    with pytest.raises(InvalidArgumentError):
        state.apply(Rebuilt(0, ()))
    with pytest.raises(TypeError, match="no handler for object"):  # a bug, not user input
        state.apply(object())
    assert state.running == {(0, 0): (1,)} and state.in_flight == 1


def test_one_at_a_time_sends_ahead_only_while_every_worker_is_busy():
    state = started(batch=1, send_ahead=True)
    schedule(state, 1, 2, 3, 4)
    assert state.apply(Take(0, 0)) == [Run(0, 0, (1,), followed=True)]
    # worker 1 runs nothing yet: worker 0's second lane leaves the queue to it
    assert state.apply(Take(0, 1)) == []
    assert of(Run, state.apply(Take(1, 0))) == [Run(1, 0, (2,), followed=True)]
    assert state.apply(Take(1, 1)) == [Run(1, 1, (3,), followed=True)]
    assert 1 in state.ahead
    # worker 0's waiting lane is woken once both run something (or takes after its timeout)
    assert state.apply(Take(0, 1)) == [Run(0, 1, (4,))]


def one_sent_ahead():
    """Two workers, one function at a time: closures 1 and 2 run on workers 0 and 1, and 3 is
    sent ahead to worker 0, behind 1."""
    state = started(batch=1, send_ahead=True)
    schedule(state, 1, 2, 3)
    state.apply(Take(0, 0))
    state.apply(Take(1, 0))
    assert state.apply(Take(0, 1)) == [Run(0, 1, (3,))]
    return state


def test_a_run_sent_ahead_is_withdrawn_for_a_worker_that_runs_nothing():
    state = one_sent_ahead()
    state.apply(Finished(1, 0, (Outcome(2),)))
    # worker 1 finds nothing queued: worker 0's Run sent ahead is asked back
    assert state.apply(Take(1, 0)) == [Withdraw(0, 1, (3,))]
    assert state.apply(Take(1, 1)) == []  # asked once
    instructions = state.apply(Finished(0, 1, (Outcome(error=WithdrawnError("back")),)))
    assert not resolved(instructions) and list(state.queue) == [3]
    assert of(Wake, instructions)
    assert state.apply(Take(1, 0)) == [Run(1, 0, (3,))]
    state.apply(Finished(1, 0, (Outcome(3),)))
    # one that started meanwhile answers as it ran
    assert resolved(state.apply(Finished(0, 0, (Outcome(1),)))) == {1: Outcome(1)}
    assert state.settled and state.error is None


def test_a_withdrawn_run_is_cancelled_once_an_error_is_pending():
    state = one_sent_ahead()
    state.apply(Finished(1, 0, (Outcome(error=ValueError("boom")),)))
    outcomes = resolved(state.apply(Finished(0, 1, (Outcome(error=WithdrawnError("x")),))))
    assert type(outcomes[3].error) is CancelledError and "boom" in str(outcomes[3].error)
    assert not state.queue


# ----- any interleaving ------------------------------------------------------------------------
class Interleavings(RuleBasedStateMachine):
    """Plays the coordinator's threads and the workers in any order: schedules, takes,
    finishes (with errors), lost Runs and workers, probes answered by the same or a new
    process, rebuilds that succeed, fail or find the worker gone, resources added and
    dropped, grace periods over (also late ones), errors taken, shutdown. Each instruction is
    checked against what the shell may be asked."""

    def __init__(self) -> None:
        super().__init__()
        self.state: ScheduleState | None = None

    @rule(workers=st.integers(1, 3), lanes=st.integers(1, 2), batch=st.integers(1, 3),
          answered=st.lists(st.booleans(), min_size=3, max_size=3), send_ahead=st.booleans())
    @precondition(lambda self: self.state is None)
    def start(self, workers, lanes, batch, answered, send_ahead):
        if send_ahead:  # as the scheduler runs it: two lanes of one closure per Run
            lanes, batch = 2, 1
        self.state = ScheduleState(workers, batch, send_ahead)
        self.lanes = [(w, lane) for w in range(workers) for lane in range(lanes)]
        self.incarnation = {w: f"p{w}" for w in range(workers)}
        self.held: dict[str, set[int]] = {}  # the resources each process holds
        self.runs: dict[tuple[int, int], tuple[int, ...]] = {}  # Runs on the wire
        self.abandoned: set[tuple[int, int]] = set()  # ... given up by the state
        self.cancels: set[tuple[tuple[int, int], tuple[int, ...]]] = set()  # grace periods
        self.withdraws: set[tuple[tuple[int, int], tuple[int, ...]]] = set()  # asked back
        self.waiting: set[tuple[int, int]] = set()  # lanes that took nothing, not woken
        self.ready = set(self.lanes)  # lanes that take next (started, woken or done)
        self.probes: dict[int, str | None] = {}
        self.rebuilds: dict[int, tuple[int, ...]] = {}
        self.scheduled: list[int] = []
        self.outcomes: dict[int, list[Outcome]] = {}
        self.lost: set[int] = set()  # given back by a lost Run, not run again yet
        self.next_id = 0
        self.carry_out(self.state.apply(Start(tuple(
            self.incarnation[w] if answered[w] else None for w in range(workers)))))

    def carry_out(self, instructions):
        for instruction in instructions:
            kind = type(instruction)
            if kind is Resolve:
                self.outcomes.setdefault(instruction.closure_id, []).append(
                    instruction.outcome)
                self.lost.discard(instruction.closure_id)
            elif kind is Wake:
                lane = (instruction.worker, instruction.lane)
                assert lane in self.waiting, f"woke {lane}, which was not waiting"
                self.waiting.discard(lane)
                self.ready.add(lane)
            elif kind is Run:
                lane = (instruction.worker, instruction.lane)
                assert lane not in self.runs
                if self.state.send_ahead and self.busy(instruction.worker):
                    # sent ahead only while every worker that is up runs something
                    assert all(self.busy(w) for w, record in enumerate(self.state.workers)
                               if record.status == UP)
                self.runs[lane] = instruction.closure_ids
                self.lost -= set(instruction.closure_ids)
            elif kind is Probe:
                assert instruction.worker not in self.probes | self.rebuilds
                self.probes[instruction.worker] = instruction.unless
            elif kind is Rebuild:
                assert instruction.worker not in self.probes | self.rebuilds
                assert instruction.resource_ids
                self.rebuilds[instruction.worker] = instruction.resource_ids
            elif kind is CancelRunning:
                lane = (instruction.worker, instruction.lane)
                assert self.runs.get(lane) == instruction.closure_ids
                assert lane not in self.abandoned
                self.cancels.add((lane, instruction.closure_ids))
            elif kind is Abandon:
                lane = (instruction.worker, instruction.lane)
                assert self.runs.get(lane) == instruction.closure_ids
                assert lane not in self.abandoned
                self.abandoned.add(lane)
            elif kind is Withdraw:
                lane = (instruction.worker, instruction.lane)
                assert self.state.send_ahead
                assert self.runs.get(lane) == instruction.closure_ids
                assert lane not in self.abandoned
                assert (lane, instruction.closure_ids) not in self.withdraws
                self.withdraws.add((lane, instruction.closure_ids))
            elif kind is Free:
                assert not set(instruction.resource_ids) & set(self.state.resources)
                self.held.get(self.incarnation[instruction.worker], set()).difference_update(
                    instruction.resource_ids)
            else:
                assert kind in (RaiseError, Build), instruction

    def busy(self, worker):
        return any(lane[0] == worker and lane not in self.abandoned for lane in self.runs)

    def holds(self, worker, resource_ids):
        self.held.setdefault(self.incarnation[worker], set()).update(resource_ids)

    def started(self):
        return self.state is not None

    def free_lanes(self):
        return [lane for lane in self.lanes if lane not in self.runs]

    # ----- the shell's side -------------------------------------------------------------------
    @rule()
    @precondition(started)
    def schedule(self):
        if self.state.error is not None:
            if self.state.in_flight:
                return  # schedule waits for the running closures first
            self.carry_out(self.state.apply(ErrorTaken()))
        self.next_id += 1
        if self.state.closed:
            with pytest.raises(FailedPreconditionError):
                self.state.apply(Scheduled(self.next_id))
            return
        self.carry_out(self.state.apply(Scheduled(self.next_id)))
        self.scheduled.append(self.next_id)

    @rule(data=st.data())
    @precondition(lambda self: self.started() and self.free_lanes())
    def take(self, data):
        # any free lane: ready, or waiting and looking again after its timeout
        self.take_on(data.draw(st.sampled_from(self.free_lanes())))

    def take_on(self, lane):
        instructions = self.state.apply(Take(*lane))
        self.ready.discard(lane)
        if instructions:
            self.waiting.discard(lane)
        elif not self.state.closed:
            self.waiting.add(lane)
        self.carry_out(instructions)

    @rule()
    @precondition(lambda self: self.started() and not self.state.in_flight)
    def take_error(self):
        self.carry_out(self.state.apply(ErrorTaken()))
        assert self.state.error is None

    @rule(data=st.data())
    @precondition(started)
    def add_resource(self, data):
        resource_id = self.next_id = self.next_id + 1
        if self.state.closed:
            with pytest.raises(FailedPreconditionError):
                self.state.apply(ResourceAdded(resource_id, "per-worker dataset"))
            return
        builds = self.state.apply(ResourceAdded(resource_id, "per-worker dataset"))
        failed = False
        for build in builds:
            result = data.draw(st.sampled_from(["built", "lost", "error"]))
            if result == "built":
                self.holds(build.worker, (resource_id,))
                self.carry_out(self.state.apply(Built(build.worker, resource_id)))
            elif result == "lost":
                self.carry_out(self.state.apply(WorkerLost(build.worker)))
            failed |= result == "error"
        if failed:
            self.carry_out(self.state.apply(ResourceDropped(resource_id)))

    @rule(data=st.data())
    @precondition(lambda self: self.started() and self.state.resources)
    def drop_resource(self, data):
        resource_id = data.draw(st.sampled_from(sorted(self.state.resources)))
        self.carry_out(self.state.apply(ResourceDropped(resource_id)))

    @rule(data=st.data())
    @precondition(lambda self: self.started() and self.cancels)
    def grace_over(self, data):
        # any grace period, also of a Run that answered since
        lane, ids = data.draw(st.sampled_from(sorted(self.cancels)))
        self.cancels.discard((lane, ids))
        self.carry_out(self.state.apply(GraceOver(*lane, ids)))

    @rule()
    @precondition(lambda self: self.started() and not self.state.closed)
    def close(self):
        self.carry_out(self.state.apply(Closed()))
        self.waiting.clear()
        self.probes.clear()  # probing ends with the coordinator

    # ----- the workers' side ------------------------------------------------------------------
    @rule(data=st.data())
    @precondition(lambda self: self.started() and self.runs)
    def finish(self, data):
        lane = data.draw(st.sampled_from(sorted(self.runs)))
        ids = self.runs.pop(lane)
        self.ready.add(lane)
        fails = data.draw(st.lists(st.booleans(), min_size=len(ids), max_size=len(ids)))
        first = self.state.error is None and any(fails) and lane not in self.abandoned
        self.abandoned.discard(lane)
        self.carry_out(self.state.apply(Finished(*lane, tuple(
            Outcome(error=ValueError(i)) if fail else Outcome(i)
            for i, fail in zip(ids, fails, strict=True)))))
        if first:  # the first error is kept, and cancels the queue
            assert isinstance(self.state.error, ValueError) and not self.state.queue

    @rule(data=st.data())
    @precondition(lambda self: self.started() and self.withdraws)
    def answer_withdraw(self, data):
        # given back if it had not started (and is still on the wire), else it runs on
        lane, ids = data.draw(st.sampled_from(sorted(self.withdraws)))
        self.withdraws.discard((lane, ids))
        if self.runs.get(lane) != ids or lane in self.abandoned:
            return
        del self.runs[lane]
        self.ready.add(lane)
        self.carry_out(self.state.apply(Finished(*lane, tuple(
            Outcome(error=WithdrawnError("withdrawn")) for _ in ids))))
        if self.state.error is None and not self.state.closed:
            assert set(ids) <= set(self.state.queue)

    @rule(data=st.data())
    @precondition(lambda self: self.started() and self.runs)
    def lose_run(self, data):
        lane = data.draw(st.sampled_from(sorted(self.runs)))
        ids = self.runs.pop(lane)
        self.ready.add(lane)
        if lane in self.abandoned:  # resolved already
            self.abandoned.discard(lane)
        else:
            self.lost |= set(ids)
        self.carry_out(self.state.apply(WorkerLost(*lane)))

    @rule(data=st.data())
    @precondition(lambda self: self.started())
    def restart_process(self, data):
        worker = data.draw(st.sampled_from(sorted(self.incarnation)))
        self.incarnation[worker] += "+"

    @rule(data=st.data())
    @precondition(lambda self: self.started() and self.probes)
    def answer_probe(self, data):
        worker = data.draw(st.sampled_from(sorted(self.probes)))
        if self.incarnation[worker] == self.probes[worker]:
            return  # the shell keeps probing
        del self.probes[worker]
        self.carry_out(self.state.apply(WorkerBack(worker, self.incarnation[worker])))

    @rule(data=st.data(), result=st.sampled_from(["ok", "error", "unreachable"]))
    @precondition(lambda self: self.started() and self.rebuilds)
    def finish_rebuild(self, data, result):
        worker = data.draw(st.sampled_from(sorted(self.rebuilds)))
        ids = self.rebuilds.pop(worker)
        if result == "ok":
            self.holds(worker, ids)
            event = Rebuilt(worker, ids)
        else:
            event = RebuildFailed(worker, ids[0], ValueError("bad dataset_fn"),
                                  unreachable=result == "unreachable")
        self.carry_out(self.state.apply(event))

    # ----- what must always hold --------------------------------------------------------------
    @invariant()
    def consistent(self):
        if self.state is None:
            return
        state = self.state
        assert state.running == {lane: ids for lane, ids in self.runs.items()
                                 if lane not in self.abandoned}
        assert state.abandoned == self.abandoned
        assert state.in_flight == sum(len(ids) for ids in state.running.values())
        # join's condition: nothing queued and nothing running; an error empties the queue
        assert state.settled == (not state.queue and not state.in_flight)
        if state.error is not None or state.closed:
            assert not state.queue
        # every closure is resolved at most once, and is in exactly one place until it is
        assert all(len(outcomes) == 1 for outcomes in self.outcomes.values())
        places = Counter([*state.queue, *(i for ids in state.running.values() for i in ids),
                          *self.outcomes])
        assert places == Counter(self.scheduled)
        # no lost wakeup: while a lane of a worker that is up waits, lanes are woken (or
        # about to take) for every queued closure
        assert set(state.idle) == self.waiting
        if state.queue and any(state._may_take(w) for w, _ in self.waiting):
            ready_up = sum(state.workers[w].status == UP for w, _ in self.ready)
            up = [w for w, record in enumerate(state.workers) if record.status == UP]
            # With send-ahead, a second closure goes to a worker only once every worker that
            # is up runs one: until then it is enough that each that runs none has a lane
            # about to take (its waiting lanes are woken once all are busy).
            assert ready_up >= len(state.queue) or state.send_ahead and not all(
                self.busy(w) for w in up) and all(any(lane[0] == w for lane in self.ready)
                                                  for w in up if not self.busy(w))
        if state.send_ahead:
            assert set(state.ahead) <= {w for w, runs in enumerate(state.runs_of) if runs == 2}
        # a worker up as the process that runs holds every resource
        for w, record in enumerate(state.workers):
            if (record.status == UP and record.incarnation == self.incarnation[w]
                    and not state.closed):
                assert set(state.resources) <= self.held.get(record.incarnation, set())
        # each worker that is not up has exactly one recovery under way
        for w, record in enumerate(state.workers):
            expected = {UP: set(), DOWN: {"probe"}, FAILED: {"probe"},
                        REBUILDING: {"rebuild"}}[record.status]
            actual = ({"probe"} if w in self.probes else set()) | (
                {"rebuild"} if w in self.rebuilds else set())
            if state.closed:
                assert actual <= expected
            else:
                assert actual == expected, (w, record.status)

    def teardown(self):
        if self.state is None:
            return
        # Finish everything: runs succeed, workers come back, and only lanes that were woken
        # or are done take (no timeouts), so a lost wakeup leaves closures queued.
        for _ in range(1000):
            if self.ready:
                self.take_on(min(self.ready))
            elif self.runs:
                lane, ids = next(iter(self.runs.items()))
                del self.runs[lane]
                self.abandoned.discard(lane)
                self.ready.add(lane)
                self.carry_out(self.state.apply(Finished(*lane, tuple(map(Outcome, ids)))))
            elif self.rebuilds:
                worker, ids = self.rebuilds.popitem()
                self.holds(worker, ids)
                self.carry_out(self.state.apply(Rebuilt(worker, ids)))
            elif self.probes:
                worker, unless = self.probes.popitem()
                if self.incarnation[worker] == unless:
                    self.incarnation[worker] += "+"
                self.carry_out(self.state.apply(WorkerBack(worker, self.incarnation[worker])))
            else:
                break
        assert self.state.settled, "closures stay queued: a lane was not woken"
        assert sorted(self.outcomes) == sorted(self.scheduled), "a closure was never resolved"
        # a closure a lost worker took ran again, unless an error or shutdown cancelled it
        assert all(isinstance(self.outcomes[i][0].error, CancelledError) for i in self.lost)


TestInterleavings = Interleavings.TestCase
TestInterleavings.settings = settings(max_examples=300, stateful_step_count=60, deadline=None,
                                      suppress_health_check=[HealthCheck.too_slow])
