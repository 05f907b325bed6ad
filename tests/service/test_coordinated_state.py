"""The decisions of coordinated reads without a network: the worker's rounds
(:mod:`convoy.data.service._worker.round_robin`), the consumer's reading
(:mod:`convoy.data.service._client.coordinated_reader_state`) and the dispatcher's rules."""

from __future__ import annotations

from typing import Any

import pytest

from convoy.data.service._client import reader_events as rev
from convoy.data.service._client.coordinated_reader_state import (
    CoordinatedReaderState,
    ReadRounds,
    coordinated_config,
)
from convoy.data.service._common.config import ShardingPolicy
from convoy.data.service._common.coordinated import ROUNDS_PER_TURN, turn_of
from convoy.data.service._dispatcher import events as dev
from convoy.data.service._dispatcher.state import DispatcherState
from convoy.data.service._worker.round_robin import (
    Ask,
    Failed,
    Fill,
    Filled,
    Refuse,
    RoundRobinState,
    Rounds,
    Wait,
)
from convoy.errors import FailedPreconditionError, InvalidArgumentError, UnavailableError

# ----- the worker's rounds -------------------------------------------------------------------


def ask(state: RoundRobinState, consumer: int, start: int, count: int = 10, now: float = 0.0,
        timeout_s: float = 5.0, reader: int = 0) -> Any:
    return state.apply(Ask(consumer, start, count, timeout_s, now, reader))


def test_a_round_forms_only_once_every_consumer_asked_for_it():
    state = RoundRobinState(7, 3)
    assert ask(state, 0, 0) == Wait()
    assert ask(state, 2, 0) == Wait()
    assert ask(state, 1, 0, count=2) == Fill(6)  # the smallest count asked: 2 rounds of 3
    state.apply(Filled(list(range(6))))
    assert ask(state, 1, 0, count=2) == Rounds([1, 4])
    assert ask(state, 0, 0) == Rounds([0, 3])  # the same rounds for every consumer
    assert ask(state, 2, 0) == Rounds([2, 5])
    assert state.next_round == 2


def test_rounds_form_from_what_is_at_hand_and_the_rest_carries_over():
    state = RoundRobinState(7, 2)
    ask(state, 0, 0)
    assert ask(state, 1, 0) == Fill(20)
    state.apply(Filled([10, 11, 12]))  # one round and a half
    assert ask(state, 1, 0) == Rounds([11])
    assert ask(state, 0, 0) == Rounds([10])
    ask(state, 0, 1)
    assert ask(state, 1, 1) == Fill(19)  # 12 is already at hand
    state.apply(Filled([13]))
    assert ask(state, 0, 1) == Rounds([12])


def test_a_request_sent_again_gets_the_same_elements():
    state = RoundRobinState(7, 2)
    ask(state, 0, 0)
    ask(state, 1, 0)
    state.apply(Filled([0, 1, 2, 3]))
    assert ask(state, 0, 0) == Rounds([0, 2])
    assert ask(state, 0, 0) == Rounds([0, 2])  # its answer was lost
    assert ask(state, 1, 0) == Rounds([1, 3])


def test_rounds_may_jump_ahead_to_where_all_consumers_ask():
    # The worker serves the rounds of its turns only: the ones between went to others.
    state = RoundRobinState(7, 2)
    ask(state, 0, ROUNDS_PER_TURN)
    ask(state, 1, ROUNDS_PER_TURN)
    state.apply(Filled([0, 1]))
    assert ask(state, 0, ROUNDS_PER_TURN) == Rounds([0])
    assert state.next_round == ROUNDS_PER_TURN + 1


def test_before_its_first_round_a_new_process_lets_a_consumer_behind_catch_up():
    # the process before died while answering rounds 0-31: consumer 0 got them, 1 did not
    state = RoundRobinState(7, 2)
    assert ask(state, 0, 32) == Wait()
    assert ask(state, 1, 0, count=32) == Fill(32)
    state.apply(Filled(list(range(20))))
    assert ask(state, 1, 0, count=32) == Rounds(list(range(20)))  # its own rounds 0-19
    assert ask(state, 1, 0, count=32) == Rounds(list(range(20)))  # asked again: the same
    assert ask(state, 1, 20, count=32) == Fill(12)
    state.apply(Filled([20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33]))
    assert ask(state, 1, 20, count=32) == Rounds(list(range(20, 32)))  # up to round 31
    assert ask(state, 1, 32) == Rounds([33])  # in step from round 32
    assert ask(state, 0, 32) == Rounds([32])


def test_a_consumer_asking_for_a_round_already_formed_is_refused():
    state = RoundRobinState(7, 2)
    ask(state, 0, 0)
    ask(state, 1, 0)
    state.apply(Filled([0, 1, 2, 3]))
    ask(state, 0, 0)
    ask(state, 0, 2)
    answer = ask(state, 1, 1)  # never received round 1 alone: a restarted consumer
    assert isinstance(answer, Refuse)
    assert isinstance(answer.error, FailedPreconditionError)
    assert "current round has already reached 2" in str(answer.error)


def test_a_consumer_restarted_under_the_job_name_is_refused_its_old_share():
    # testConsumerRestart's race: the first readers' only answers covered every round they
    # read, so their shares still start at round 0; new readers asking for round 0 are not
    # those readers asking again, and must not get the same elements.
    state = RoundRobinState(7, 2)
    ask(state, 0, 0, reader=11)
    ask(state, 1, 0, reader=12)
    state.apply(Filled([0, 1, 2, 3]))
    assert ask(state, 0, 0, reader=11) == Rounds([0, 2])
    assert ask(state, 1, 0, reader=12) == Rounds([1, 3])
    assert ask(state, 0, 0, reader=11) == Rounds([0, 2])  # the same reader, asking again
    answer = ask(state, 0, 0, reader=21)  # a new reader of consumer 0
    assert isinstance(answer, Refuse)
    assert "current round has already reached 2" in str(answer.error)


def test_a_consumer_left_waiting_fails_naming_the_consumers_that_did_not_ask():
    state = RoundRobinState(7, 4)
    assert ask(state, 0, 0, now=0.0, timeout_s=2.0) == Wait()
    ask(state, 2, 0, now=0.5)
    assert ask(state, 0, 0, now=1.9, timeout_s=2.0) == Wait()
    answer = ask(state, 0, 0, now=2.1, timeout_s=2.0)
    assert isinstance(answer, Refuse)
    assert isinstance(answer.error, FailedPreconditionError)
    assert "consumer_index 1, 3 of num_consumers=4 did not ask" in str(answer.error)


def test_a_consumer_index_out_of_range_is_refused():
    answer = ask(RoundRobinState(7, 2), 2, 0)
    assert isinstance(answer, Refuse)
    assert isinstance(answer.error, InvalidArgumentError)
    assert "consumer_index 2" in str(answer.error)


def test_after_the_task_fails_every_request_fails():
    state = RoundRobinState(7, 2)
    ask(state, 0, 0)
    assert isinstance(ask(state, 1, 0), Fill)
    state.apply(Failed(FailedPreconditionError("end of sequence")))
    for consumer in (0, 1):
        answer = ask(state, consumer, 0)
        assert isinstance(answer, Refuse) and "end of sequence" in str(answer.error)


def test_one_fill_at_a_time():
    state = RoundRobinState(7, 2)
    ask(state, 0, 0)
    assert isinstance(ask(state, 1, 0), Fill)
    assert ask(state, 0, 0) == Wait()  # the other call waits for that fill
    state.apply(Filled([]))
    assert isinstance(ask(state, 0, 0), Fill)


# ----- the consumer's reading ----------------------------------------------------------------


def reader(window: int | None = 64, timeout_s: float = 10.0) -> CoordinatedReaderState:
    state = CoordinatedReaderState(coordinated_config(window, timeout_s))
    state.apply(rev.HeartbeatView((rev.ListedTask(12, "w2"), rev.ListedTask(11, "w1")), False))
    return state


def next_read(state: CoordinatedReaderState, now: float = 0.0) -> Any:
    (step,) = state.apply(rev.NextRead(now))
    return step


def test_rounds_are_read_in_order_in_turns_over_the_tasks_in_id_order():
    state = reader(window=None)
    seen = []
    while len(seen) < 4:
        read = next_read(state)
        assert isinstance(read, ReadRounds)
        assert next_read(state) == rev.Wait(None)  # one request in flight
        seen.append((read.task_id, read.round_index, read.max_elements))
        state.apply(rev.ElementsArrived(read.task_id, read.max_elements))
    assert seen == [(11, 0, ROUNDS_PER_TURN), (12, ROUNDS_PER_TURN, ROUNDS_PER_TURN),
                    (11, 2 * ROUNDS_PER_TURN, ROUNDS_PER_TURN),
                    (12, 3 * ROUNDS_PER_TURN, ROUNDS_PER_TURN)]
    assert [turn_of(r, 2) for r in (0, ROUNDS_PER_TURN - 1, ROUNDS_PER_TURN)] == [0, 0, 1]


def test_reads_hold_at_most_the_window():
    state = reader(window=64)
    read = next_read(state)
    assert read.max_elements == 32  # half the window: the next one can fly meanwhile
    state.apply(rev.ElementsArrived(read.task_id, 32))
    read = next_read(state)
    assert (read.round_index, read.max_elements) == (32, 32)
    state.apply(rev.ElementsArrived(read.task_id, 32))
    assert next_read(state) == rev.Wait(None)  # 64 held
    state.apply(rev.ElementsReturned(10))
    assert next_read(state).max_elements == 10


def test_a_not_ready_answer_asks_for_the_same_rounds_again():
    state = reader()
    read = next_read(state)
    state.apply(rev.ElementsArrived(read.task_id, 0))
    assert next_read(state) == read


def test_the_task_list_is_fixed_by_the_first_view():
    state = reader(window=None)
    listed = (rev.ListedTask(11, "w1"), rev.ListedTask(12, "w2"), rev.ListedTask(13, "w3"))
    state.apply(rev.HeartbeatView(listed, False))
    assert [t.task_id for t in state.order] == [11, 12]
    (failed,) = state.apply(rev.HeartbeatView((rev.ListedTask(11, "w1"),), False))
    assert isinstance(failed, rev.FailResults)
    assert isinstance(failed.error, UnavailableError)
    assert "worker w2 (task 12) has left the coordinated read" in str(failed.error)


def test_a_worker_unreachable_past_the_timeout_fails_the_read_naming_it():
    state = reader(timeout_s=10.0)
    read = next_read(state)
    (warning,) = state.apply(rev.WorkerUnreachable(read.task_id, UnavailableError("x"), 0.0))
    assert isinstance(warning, rev.Warn)
    assert next_read(state, now=0.05) == rev.Wait(0.1)  # backing off
    assert next_read(state, now=0.2) == read
    outcome = state.apply(rev.WorkerUnreachable(read.task_id, UnavailableError("x"), 11.0))
    assert isinstance(outcome[-1], rev.FailResults)
    assert "w1" in str(outcome[-1].error)


def test_an_end_of_sequence_fails_the_read():
    state = reader()
    read = next_read(state)
    (failed,) = state.apply(rev.EndOfSequence(read.task_id))
    assert isinstance(failed, rev.FailResults)
    assert "end of sequence on a round-robin read" in str(failed.error)


# ----- the dispatcher ------------------------------------------------------------------------


def dispatcher_with_dataset(cardinality: int) -> tuple[DispatcherState, str]:
    state = DispatcherState()
    dataset_id = state.apply(dev.RegisterDataset("f", b"p", "", b"", cardinality, -1))
    return state, dataset_id


def job_event(dataset_id: str, name: str, num_consumers: int) -> dev.GetOrCreateJob:
    """A job request as this version's dispatcher makes it."""
    return dev.GetOrCreateJob(dataset_id, name, dev.JobOptions(ShardingPolicy.OFF, num_consumers),
                              coordinated_rules=True)


def test_the_dispatcher_refuses_a_coordinated_job_on_a_finite_dataset():
    state, dataset_id = dispatcher_with_dataset(100)
    with pytest.raises(FailedPreconditionError,
                       match="Round robin reads require that the input dataset has infinite "
                             "cardinality, but the dataset has cardinality 100"):
        state.apply(job_event(dataset_id, "j", 2))
    assert state.apply(job_event(dataset_id, "k", 0))


@pytest.mark.parametrize("cardinality", [-1, -2])
def test_a_coordinated_iteration_keeps_the_tasks_it_started_with(cardinality: int):
    state, dataset_id = dispatcher_with_dataset(cardinality)
    job = state.apply(job_event(dataset_id, "j", 2))
    iteration, _ = state.apply(dev.GetOrCreateIteration(job, 0, 0.0))
    state.apply(dev.WorkerHeartbeat("w1", "u1", (), 0.0))  # the first tasks
    state.apply(dev.WorkerHeartbeat("w2", "u2", (), 0.0))  # too late: not added
    assert list(state.iterations[iteration].tasks) == ["w1"]
    orders = state.apply(dev.WorkerHeartbeat("w1", "u3", (), 1.0))  # w1 restarted
    assert [t.num_consumers for t in orders.new_tasks] == [2]


def test_journals_of_older_versions_replay_coordinated_jobs_as_they_did():
    # their dispatcher took a coordinated job on a finite dataset, and gave its iterations
    # tasks on every worker (its consumers refused to read it)
    state, dataset_id = dispatcher_with_dataset(5)
    job = state.apply(dev.GetOrCreateJob(dataset_id, "j", dev.JobOptions(ShardingPolicy.OFF, 2)))
    iteration, _ = state.apply(dev.GetOrCreateIteration(job, 0, 0.0))
    state.apply(dev.WorkerHeartbeat("w1", "u1", (), 0.0))
    state.apply(dev.WorkerHeartbeat("w2", "u2", (), 0.0))
    assert list(state.iterations[iteration].tasks) == ["w1", "w2"]


def test_a_named_job_refuses_another_num_consumers():
    state, dataset_id = dispatcher_with_dataset(-1)
    state.apply(job_event(dataset_id, "j", 2))
    with pytest.raises(InvalidArgumentError,
                       match="but found an existing job with different parameters"):
        state.apply(job_event(dataset_id, "j", 3))
