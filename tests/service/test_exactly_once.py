"""DYNAMIC's exactly-once pieces, without a network: sequence-number ranges, the dispatcher's
runs of a task (held until every client reports, splits replayed by request number), the
reader's reports, a task's numbered answers, and seeds drawn from the task.

The same promise with real processes killed at random is in ``tests/chaos``.
"""

from __future__ import annotations

import pickle
from typing import Any

import cloudpickle
import pytest
from hypothesis import given
from hypothesis import strategies as hs

from convoy._transport import rpc as _rpc
from convoy.codec import decode
from convoy.data import Dataset
from convoy.data._core._op import seeded
from convoy.data.service import service_pb2 as pb
from convoy.data.service._client import reader_events as rev
from convoy.data.service._client.reader_state import ReaderConfig, ReaderState
from convoy.data.service._common import ranges as _ranges
from convoy.data.service._common.config import ShardingPolicy
from convoy.data.service._common.wire import DISPATCHER, DISPATCHER_METHODS, NUMBERED, read_numbers
from convoy.data.service._dispatcher import events as ev
from convoy.data.service._dispatcher import state as st
from convoy.data.service._worker.task import Task
from convoy.errors import DataLossError, FailedPreconditionError, InvalidArgumentError
from convoy.testing import InProcessCluster

# ----- ranges ------------------------------------------------------------------------------------


@given(hs.lists(hs.tuples(hs.integers(0, 60), hs.integers(0, 12))))
def test_ranges_hold_exactly_the_numbers_added(spans: list[tuple[int, int]]) -> None:
    ranges: list[tuple[int, int]] = []
    model: set[int] = set()
    for start, length in spans:
        _ranges.add(ranges, start, start + length)
        model |= set(range(start, start + length))
        assert {n for a, b in ranges for n in range(a, b)} == model
        assert all(a < b for a, b in ranges)  # none empty ...
        assert all(b < c for (_, b), (c, _) in zip(ranges, ranges[1:]))  # ... sorted, apart
    assert _ranges.count(ranges) == len(model)
    for start, length in spans[::2]:  # and removing takes out exactly those numbers
        _ranges.remove(ranges, start, start + length)
        model -= set(range(start, start + length))
        assert {n for a, b in ranges for n in range(a, b)} == model
        assert all(a < b for a, b in ranges)
    skipper = _ranges.Skipper(ranges)
    assert bool(skipper) == bool(model)
    assert [n for n in range(80) if n in skipper] == sorted(model)
    assert _ranges.runs(sorted(model)) == ranges
    assert _ranges.union([], ranges) == ranges


# ----- the dispatcher ----------------------------------------------------------------------------


def dynamic_iteration(state: st.DispatcherState, clients: int = 2) -> tuple[int, list[int], int]:
    """A DYNAMIC iteration read by ``clients`` clients on worker w1; returns the iteration,
    the clients and w1's task."""
    state.apply(ev.WorkerHeartbeat("w1:1", "old", (), 0.0))
    dataset = state.apply(ev.RegisterDataset("fp", b"ds", "", b"", 100, 100))
    job_id = state.apply(ev.GetOrCreateJob(dataset, "shared",
                                           ev.JobOptions(ShardingPolicy.DYNAMIC)))
    ids = [state.apply(ev.GetOrCreateIteration(job_id, 0, 0.0)) for _ in range(clients)]
    iteration_id = ids[0][0]
    return iteration_id, [client for _, client in ids], state.iterations[iteration_id].tasks["w1:1"]


def restart(state: st.DispatcherState, now: float = 1.0) -> ev.WorkerInstructions:
    return state.apply(ev.WorkerHeartbeat("w1:1", "new", (), now))


def test_a_replaced_run_waits_for_every_client_then_skips_what_they_received() -> None:
    state = st.DispatcherState()
    iteration_id, (a, b), task = dynamic_iteration(state)
    assert state.tasks[task].incarnation == 1
    assert restart(state).new_tasks == []
    assert state.tasks[task].awaiting == [a, b]
    view = state.apply(ev.ClientHeartbeat(a, 1.0))
    assert view.tasks == [ev.TaskView(task, "w1:1", 2, True)]
    # a report for the earlier run does not count; ranges of another iteration's task neither
    state.apply(ev.ClientHeartbeat(a, 1.0, ((task, 1),), ((task, 0, 5),)))
    assert state.tasks[task].awaiting == [a, b]
    state.apply(ev.ClientHeartbeat(a, 1.0, ((task, 2),), ((task, 5, 9), (task, 12, 14))))
    assert restart(state).new_tasks == []  # b has not reported
    state.apply(ev.ReleaseClient(b, ((task, 9, 12), (task, 20, 21))))  # b leaves: it counts
    (run,) = restart(state).new_tasks
    assert (run.task_id, run.incarnation, run.skip) == (task, 2, ((0, 14), (20, 21)))
    assert state.apply(ev.ClientHeartbeat(a, 2.0)).tasks == [ev.TaskView(task, "w1:1", 2)]


def test_a_silent_client_does_not_hold_a_run_forever() -> None:
    state = st.DispatcherState()
    _, (a, b), task = dynamic_iteration(state)
    restart(state)
    state.apply(ev.ClientHeartbeat(a, 1.0, ((task, 2),)))
    state.apply(ev.CollectGarbage(100.0, 10.0, 1000.0, clients=(b,), workers=()))
    assert [t.task_id for t in restart(state, 100.0).new_tasks] == [task]


def test_a_run_with_no_clients_waits_for_none_but_starts_with_a_consumer() -> None:
    state = st.DispatcherState()
    _, (a,), task = dynamic_iteration(state, clients=1)
    state.apply(ev.ReleaseClient(a))
    assert restart(state).new_tasks == []  # no consumer: nothing to produce for
    assert not state.runs.held(state.tasks[task])  # no client's report to wait for
    state.apply(ev.GetOrCreateIteration(state.named_jobs["shared"], 0, 2.0))
    assert [t.incarnation for t in restart(state, 2.0).new_tasks] == [2]


def lose(state: st.DispatcherState, *workers: str, now: float = 100.0) -> list[str]:
    return state.apply(ev.CollectGarbage(now, 500.0, 30.0, workers=workers, adopt=True))


def test_a_lost_workers_task_is_adopted_and_run_again_once_its_clients_report() -> None:
    state = st.DispatcherState()
    iteration_id, (a,), task = dynamic_iteration(state, clients=1)
    state.apply(ev.WorkerHeartbeat("w2:2", "u2", (), 0.0))
    own = state.iterations[iteration_id].tasks["w2:2"]
    assert lose(state, "w1:1") == ["w1:1"]
    assert state.tasks[task].runner == "w2:2" and not state.tasks[task].finished
    view = state.apply(ev.ClientHeartbeat(a, 100.0))
    assert view.tasks == [ev.TaskView(task, "w2:2", 2, True), ev.TaskView(own, "w2:2", 1)]
    assert new_ids(state.apply(ev.WorkerHeartbeat("w2:2", "u2", (own,), 100.0))) == []
    state.apply(ev.ClientHeartbeat(a, 100.0, ((task, 2),), ((task, 0, 30),)))
    (run,) = state.apply(ev.WorkerHeartbeat("w2:2", "u2", (own,), 100.0)).new_tasks
    assert (run.task_id, run.incarnation, run.skip) == (task, 2, ((0, 30),))
    # the adopter reports its end; the iteration ends with both tasks
    state.apply(ev.WorkerHeartbeat("w2:2", "u2", (own, task), 101.0, (own, task)))
    assert state.apply(ev.ClientHeartbeat(a, 101.0)) == ev.ClientView([], True)
    # its iteration forgotten, nothing of the adopted task is left
    state.apply(ev.ReleaseClient(a))
    state.apply(ev.CollectGarbage(1000.0, 500.0, 5000.0, iteration_timeout=0.0, adopt=True))
    assert task not in state.tasks and not state.snapshot()["worker_tasks"]


def test_a_task_whose_workers_are_all_lost_waits_for_the_next_to_register() -> None:
    state = st.DispatcherState()
    iteration_id, (a,), task = dynamic_iteration(state, clients=1)
    lose(state, "w1:1")
    assert state.apply(ev.ClientHeartbeat(a, 100.0)).tasks == [
        ev.TaskView(task, "w1:1", 2, True)]
    state.apply(ev.ClientHeartbeat(a, 100.0, ((task, 2),)))
    orders = state.apply(ev.WorkerHeartbeat("w3:3", "u3", (), 101.0))
    assert sorted(new_ids(orders)) == sorted([task, state.iterations[iteration_id].tasks["w3:3"]])
    # and when the adopter is lost in turn, both its tasks wait (the adopted one's third run)
    own = state.iterations[iteration_id].tasks["w3:3"]
    lose(state, "w3:3", now=200.0)
    assert state.tasks[task].incarnation == 3
    assert state.snapshot()["waiting"] == sorted([task, own])


def new_ids(orders: ev.WorkerInstructions) -> list[int]:
    return [t.task_id for t in orders.new_tasks]


def test_every_run_of_a_task_gets_request_n_answered_alike() -> None:
    state = st.DispatcherState()
    iteration_id, (a,), task = dynamic_iteration(state, clients=1)

    def ask(number: int, incarnation: int, uid: str = "old", repetition: int = 0) -> Any:
        return state.apply(ev.GetSplits(iteration_id, repetition, 2, task, uid, number,
                                        incarnation))

    first, second = ask(1, 1), ask(2, 1)
    assert first != second and ask(1, 1) == first
    with pytest.raises(InvalidArgumentError, match="skips a number"):
        ask(4, 1)
    restart(state)
    with pytest.raises(FailedPreconditionError, match="waiting for its clients"):
        ask(1, 2, "new")
    state.apply(ev.ClientHeartbeat(a, 1.0, ((task, 2),)))
    with pytest.raises(FailedPreconditionError, match="run 2"):
        ask(3, 1)  # the replaced run, still asking (a process that was not dead after all)
    assert (ask(1, 2, "new"), ask(2, 2, "new")) == (first, second)
    with pytest.raises(InvalidArgumentError, match="repetition"):
        ask(1, 2, "new", repetition=1)
    third = ask(3, 2, "new")
    assert third[0] and not set(third[0]) & set(first[0] + second[0])
    # replaying changes nothing a journal would keep
    event = ev.GetSplits(iteration_id, 0, 2, task, "new", 2, 2)
    assert not state.is_durable(event)


# ----- the reader --------------------------------------------------------------------------------


def test_the_reader_reports_a_held_run_once_nothing_is_in_flight_to_the_earlier_one() -> None:
    state = ReaderState(ReaderConfig())
    state.apply(rev.HeartbeatView((rev.ListedTask(7, "w:1", 1),), False))
    (read,) = state.apply(rev.NextRead(0.0))
    assert (read.task_id, read.incarnation) == (7, 1)
    state.apply(rev.ElementsArrived(7, 5, ((0, 5),)))
    state.apply(rev.NextRead(0.0))  # in flight to run 1 ...
    state.apply(rev.HeartbeatView((rev.ListedTask(7, "w:1", 2, held=True),), False))
    assert state.reports() == ((), ())  # ... so not yet
    assert state.apply(rev.NextRead(0.0)) == (rev.Wait(None),)  # a held run is not read
    state.apply(rev.ElementsArrived(7, 3, ((5, 8),)))  # the reply that was in flight
    assert state.reports() == (((7, 2),), ((7, 0, 8),))
    # reported: the dispatcher has it; the run starts
    state.apply(rev.HeartbeatView((rev.ListedTask(7, "w:1", 2, held=True),), False, ((7, 2),)))
    assert state.reports() == ((), ())
    state.apply(rev.HeartbeatView((rev.ListedTask(7, "w:1", 2),), False))
    (read,) = state.apply(rev.NextRead(0.0))
    assert read.incarnation == 2
    state.apply(rev.ElementsArrived(7, 2, ((10, 12),)))
    assert state.all_received() == ((7, 0, 8), (7, 10, 12))


def test_a_reader_sharing_a_job_reports_its_ranges_once_they_pile_up() -> None:
    """Consumers sharing a job hold one range per read (the others read in between): past
    ``max_ranges`` they go to the dispatcher with the next heartbeat and are forgotten."""
    state = ReaderState(ReaderConfig(max_ranges=4))
    state.apply(rev.HeartbeatView((rev.ListedTask(7, "w:1", 1),), False))
    for start in range(0, 40, 10):  # 4 ranges: kept
        state.apply(rev.NextRead(0.0))
        state.apply(rev.ElementsArrived(7, 5, ((start, start + 5),)))
    assert state.reports() == ((), ())
    state.apply(rev.NextRead(0.0))
    state.apply(rev.ElementsArrived(7, 5, ((40, 45),)))
    settled, received = state.reports()
    assert settled == () and len(received) == 5
    state.apply(rev.NextRead(0.0))
    state.apply(rev.ElementsArrived(7, 5, ((45, 50),)))  # arrives while the report travels
    state.apply(rev.HeartbeatView((rev.ListedTask(7, "w:1", 1),), False, (), received))
    assert state.all_received() == ((7, 45, 50),)


def test_a_run_held_past_the_timeout_is_given_up_on_naming_it() -> None:
    """A held run waits for its consumers' reports or a worker to adopt it: bounded by the
    consumer's timeout, then failed, even when other workers were reached (skipping it would
    lose its elements)."""
    def held(task_id: int, run: int, now: float) -> rev.HeartbeatView:
        listed = (rev.ListedTask(task_id, "w:1", run, held=True), rev.ListedTask(8, "w:2", 1))
        return rev.HeartbeatView(listed, False, now=now)

    alone = ReaderState(ReaderConfig(unreachable_timeout_s=10.0))
    assert alone.apply(held(7, 2, 0.0)) == ()
    assert alone.apply(held(7, 2, 9.0)) == ()
    (failed,) = alone.apply(held(7, 2, 10.5))
    assert isinstance(failed, rev.FailResults)
    assert "task 7, whose run 2 waited 10.5 s for its consumers' reports" in str(failed.error)

    others = ReaderState(ReaderConfig(unreachable_timeout_s=10.0))
    others.apply(held(7, 2, 0.0))
    (read,) = others.apply(rev.NextRead(0.0))
    assert read.task_id == 8  # the held run is not read; the other worker is reached
    others.apply(rev.ElementsArrived(8, 1, ((0, 1),)))
    (failed,) = others.apply(held(7, 2, 11.0))
    assert isinstance(failed, rev.FailResults) and "task 7" in str(failed.error)
    assert not others.tasks[7].skipped


# ----- a task's numbered answers ------------------------------------------------------------------


def taken(task: Task) -> tuple[list[tuple[int, int]], list[Any]]:
    items = task.take(100, 1 << 20, 5.0)
    assert items
    prefix, elements = task.numbered(items)
    assert prefix[:1] == NUMBERED
    numbers, rest = read_numbers(memoryview(prefix)[1:])
    assert not rest  # the elements follow in an answer of their own
    return numbers, decode(task.encoder.encode(elements))


def test_a_numbered_task_skips_what_its_consumers_have() -> None:
    dataset = cloudpickle.dumps(Dataset.range(10)._op)
    task = Task(1, dataset, None, None, incarnation=2, skip=[(0, 3), (5, 6)])
    task.start()
    numbers, elements = taken(task)
    assert numbers == [(3, 5), (6, 10)]
    assert [int(x) for x in elements] == [3, 4, 6, 7, 8, 9]
    assert task.take(100, 1 << 20, 5.0) is None
    # a first run skips nothing: its answers carry one run of numbers each
    task = Task(2, dataset, None, None, incarnation=1)
    task.start()
    numbers, elements = taken(task)
    assert (numbers, [int(x) for x in elements]) == ([(0, 10)], list(range(10)))


def test_a_cut_short_numbered_answer_is_data_loss() -> None:
    with pytest.raises(DataLossError, match="cut short"):
        read_numbers(memoryview(b"\x05\x00\x00\x00\x01"))


def test_unseeded_shuffles_draw_their_seed_from_the_task() -> None:
    payload = cloudpickle.dumps(Dataset.range(50).shuffle(50)._op)

    def order(seed: int | None) -> list[int]:
        if seed is None:
            op = pickle.loads(payload)
        else:
            with seeded(seed):
                op = pickle.loads(payload)
        return [int(x) for x in op.iterator(None, 0).gen]

    assert order(7) == order(7) != order(8)
    assert sorted(order(None)) == list(range(50))


# ----- hostile reports ---------------------------------------------------------------------------


def test_a_server_refuses_malformed_reports_and_goes_on() -> None:
    """Reports are checked before they reach the state: a bad range is refused with a clear
    error, and the dispatcher serves the next call as before."""
    with InProcessCluster(num_workers=1) as cluster:
        dispatcher = _rpc.Client(cluster.address, DISPATCHER, DISPATCHER_METHODS)
        try:
            dataset_id = dispatcher.call("RegisterDataset", pb.RegisterDatasetRequest(
                dataset=b"x", fingerprint="fp", num_split_units=10)).dataset_id
            job = dispatcher.call("GetOrCreateJob", pb.GetOrCreateJobRequest(
                dataset_id=dataset_id, options=pb.JobOptions(processing_mode="DYNAMIC")))
            client = dispatcher.call("GetOrCreateIteration", pb.GetOrCreateIterationRequest(
                job_id=job.job_id)).client_id
            for bad in (pb.TaskRange(task_id=1, start=-1, stop=3),
                        pb.TaskRange(task_id=1, start=5, stop=2)):
                with pytest.raises(InvalidArgumentError, match="0 <= start <= stop"):
                    dispatcher.call("ClientHeartbeat", pb.ClientHeartbeatRequest(
                        client_id=client, received=[bad]))
                with pytest.raises(InvalidArgumentError, match="0 <= start <= stop"):
                    dispatcher.call("ReleaseClient", pb.ReleaseClientRequest(
                        client_id=client, received=[bad]))
            # reports of unknown tasks and runs change nothing; the client reads on
            view = dispatcher.call("ClientHeartbeat", pb.ClientHeartbeatRequest(
                client_id=client, received=[pb.TaskRange(task_id=424242, start=0, stop=9)],
                settled=[pb.TaskRun(task_id=424242, incarnation=99)]))
            (task,) = view.tasks
            assert (task.incarnation, task.held) == (1, False)
        finally:
            dispatcher.close()
