"""Unit tests of the dispatcher's state machine: events in, results out, no network."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from convoy.data.service._common.config import ShardingPolicy, policy_from_name
from convoy.data.service._dispatcher import events as ev
from convoy.data.service._dispatcher import state as st
from convoy.errors import (
    ConvoyError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    UnimplementedError,
)

# ----- helpers -----------------------------------------------------------------------------------


def register(state: st.DispatcherState, fingerprint: str = "fp", units: int = 100,
             requested: str = "") -> str:
    return state.apply(ev.RegisterDataset(fingerprint, b"payload:" + fingerprint.encode(),
                                          "AUTO", b"", 100, units, requested))


def job(state: st.DispatcherState, dataset_id: str, name: str = "", mode: str = "DYNAMIC",
        **options: Any) -> int:
    return state.apply(ev.GetOrCreateJob(dataset_id, name,
                                        ev.JobOptions(ShardingPolicy[mode], **options)))


def iteration(state: st.DispatcherState, job_id: int, repetition: int = 0,
              now: float = 0.0) -> tuple[int, int]:
    return state.apply(ev.GetOrCreateIteration(job_id, repetition, now))


def heartbeat(state: st.DispatcherState, address: str, uid: str | None = None,
              current: tuple[int, ...] = (), now: float = 0.0) -> ev.WorkerInstructions:
    return state.apply(ev.WorkerHeartbeat(address, uid or f"uid-{address}", current, now))


def splits(state: st.DispatcherState, iteration_id: int, repetition: int = 0,
           max_splits: int = 1) -> tuple[list[tuple[int, int]], bool]:
    return state.apply(ev.GetSplits(iteration_id, repetition, max_splits))


def new_task_ids(instructions: ev.WorkerInstructions) -> list[int]:
    return sorted(t.task_id for t in instructions.new_tasks)


@pytest.fixture
def state() -> st.DispatcherState:
    return st.DispatcherState()


def assert_unchanged(state: st.DispatcherState, event: Any, error: type[Exception],
                     match: str) -> None:
    before = state.snapshot()
    with pytest.raises(error, match=match):
        state.apply(event)
    assert state.snapshot() == before


# ----- datasets ----------------------------------------------------------------------------------


def test_same_fingerprint_gets_the_same_dataset_id(state: st.DispatcherState) -> None:
    first = register(state, "a")
    assert register(state, "a") == first
    second = register(state, "b")
    assert second != first
    assert first.isdigit() and second.isdigit()
    assert len(state.datasets) == 2


def test_requested_dataset_id_is_honoured(state: st.DispatcherState) -> None:
    assert register(state, "a", requested="my-dataset") == "my-dataset"
    assert register(state, "a", requested="my-dataset") == "my-dataset"
    assert state.dataset("my-dataset").fingerprint == "a"
    # an anonymous registration of the same graph finds the named one
    assert register(state, "a") == "my-dataset"


def test_requested_id_with_another_fingerprint_is_refused(state: st.DispatcherState) -> None:
    register(state, "a", requested="shared")
    event = ev.RegisterDataset("b", b"other", "AUTO", b"", 1, 1, "shared")
    assert_unchanged(state, event, InvalidArgumentError, "same ID should have the same structure")
    assert state.dataset("shared").fingerprint == "a"


def test_generated_ids_skip_requested_ones(state: st.DispatcherState) -> None:
    taken = str(state.next_dataset_id)
    assert register(state, "a", requested=taken) == taken
    generated = register(state, "b")
    assert generated != taken
    assert register(state, "c") not in (taken, generated)


def test_unknown_dataset_is_not_found(state: st.DispatcherState) -> None:
    with pytest.raises(NotFoundError, match="Dataset id 'nope' not found"):
        state.dataset("nope")
    event = ev.GetOrCreateJob("nope", "", ev.JobOptions(ShardingPolicy.OFF))
    assert_unchanged(state, event, NotFoundError, "'nope' not found")


# ----- jobs --------------------------------------------------------------------------------------


def test_anonymous_jobs_are_never_shared(state: st.DispatcherState) -> None:
    dataset_id = register(state)
    assert job(state, dataset_id) != job(state, dataset_id)
    assert state.named_jobs == {}


def test_named_jobs_are_shared(state: st.DispatcherState) -> None:
    dataset_id = register(state)
    shared = job(state, dataset_id, "train")
    assert job(state, dataset_id, "train") == shared
    assert job(state, dataset_id, "eval") != shared
    assert state.named_jobs == {"train": shared, "eval": shared + 1}


@pytest.mark.parametrize("existing, other, expected", [
    ({"mode": "DYNAMIC"}, {"mode": "OFF"}, ("processing mode DYNAMIC", "processing mode OFF")),
    ({"target_workers": "AUTO"}, {"target_workers": "ANY"},
     ("target_workers AUTO", "target_workers ANY")),
    ({}, {"cross_trainer_cache": "trainer"}, ("cross-trainer cache off", "cross-trainer cache on")),
])
def test_named_job_with_other_options_is_refused(state: st.DispatcherState,
                                                 existing: dict[str, Any],
                                                 other: dict[str, Any],
                                                 expected: tuple[str, str]) -> None:
    dataset_id = register(state)
    job(state, dataset_id, "train", **existing)
    options = ev.JobOptions(ShardingPolicy[other.pop("mode", "DYNAMIC")], **other)
    before = state.snapshot()
    with pytest.raises(InvalidArgumentError,
                       match="but found an existing job with different parameters") as error:
        state.apply(ev.GetOrCreateJob(dataset_id, "train", options))
    message = str(error.value)
    assert "'train'" in message
    existing_part, got_part = message.split("got ")
    assert expected[0] in existing_part and expected[1] in got_part
    assert state.snapshot() == before


def test_unsplittable_dynamic_jobs_are_refused(state: st.DispatcherState) -> None:
    unsplittable = register(state, "b", units=-1)
    assert_unchanged(state, ev.GetOrCreateJob(unsplittable, "",
                                              ev.JobOptions(ShardingPolicy.DYNAMIC)),
                     UnimplementedError, "DYNAMIC sharding needs")
    assert job(state, unsplittable, mode="OFF") in state.jobs


# ----- static sharding ---------------------------------------------------------------------------

LISTED = ("w1:1", "w2:2", "w3:3")


def static_job(state: st.DispatcherState, mode: str = "DATA", listed: tuple[str, ...] = LISTED,
               **options: Any) -> int:
    options_ = ev.JobOptions(ShardingPolicy[mode], **options)
    return state.apply(ev.GetOrCreateJob(register(state), "", options_, listed))


@pytest.mark.parametrize("mode", ["FILE", "DATA", "FILE_OR_DATA", "HINT"])
def test_static_jobs_need_a_worker_list(state: st.DispatcherState, mode: str) -> None:
    dataset_id = register(state)
    assert_unchanged(state, ev.GetOrCreateJob(dataset_id, "", ev.JobOptions(ShardingPolicy[mode])),
                     InvalidArgumentError,
                     f"sharding policy {mode} needs a fixed list of workers: .*worker_addresses")
    any_worker = ev.JobOptions(ShardingPolicy[mode], 0, "ANY")
    assert_unchanged(state, ev.GetOrCreateJob(dataset_id, "", any_worker, LISTED),
                     InvalidArgumentError, "Static sharding requires reading from local workers")
    job_id = static_job(state, mode)
    assert state.jobs[job_id].worker_addresses == LISTED


def test_only_static_jobs_keep_the_worker_list(state: st.DispatcherState) -> None:
    for mode in ("OFF", "DYNAMIC"):
        assert state.jobs[static_job(state, mode)].worker_addresses == ()


def test_static_tasks_run_on_listed_workers_at_their_index(state: st.DispatcherState) -> None:
    heartbeat(state, "w3:3")
    heartbeat(state, "other:9")  # a dispatcher without a list (or an older one) let it in
    job_id = static_job(state, listed=("w2:2", "w1:1", "w3:3"))
    iteration_id, client_id = iteration(state, job_id)
    assert sorted(state.iterations[iteration_id].tasks) == ["w3:3"]
    assert heartbeat(state, "other:9").new_tasks == []
    (task,) = heartbeat(state, "w3:3").new_tasks
    assert task.processing_mode is ShardingPolicy.DATA
    assert (task.worker_index, task.num_workers) == (2, 3)
    # listed workers that come later get their shard, at their own index
    (late,) = heartbeat(state, "w1:1").new_tasks
    assert (late.worker_index, late.num_workers) == (1, 3)
    assert state.task_definition(late.task_id) == late
    view = state.apply(ev.ClientHeartbeat(client_id, 1.0))
    assert [t.worker_address for t in view.tasks] == ["w3:3", "w1:1"]


def test_a_restarted_static_worker_gets_its_shard_again(state: st.DispatcherState) -> None:
    heartbeat(state, "w1:1", uid="old")
    heartbeat(state, "w2:2")
    iteration_id, _ = iteration(state, static_job(state, "FILE"))
    (task,) = heartbeat(state, "w2:2").new_tasks
    (again,) = heartbeat(state, "w2:2", uid="new").new_tasks
    assert again == task  # the same task at the same index: it runs its shard from the start
    assert state.iterations[iteration_id].tasks["w2:2"] == task.task_id


def test_unknown_processing_mode_is_invalid_argument() -> None:
    """A mode is checked where it comes off the wire (or out of the journal), once."""
    with pytest.raises(InvalidArgumentError, match="unknown processing mode 'BOGUS'"):
        policy_from_name("BOGUS")


def test_an_unknown_event_is_a_programming_error(state: st.DispatcherState) -> None:
    assert_unchanged(state, object(), TypeError, "DispatcherState has no handler for object")


# ----- iterations and tasks ----------------------------------------------------------------------


def test_iterations_are_keyed_by_job_and_repetition(state: st.DispatcherState) -> None:
    job_id = job(state, register(state))
    first, client_a = iteration(state, job_id, 0)
    again, client_b = iteration(state, job_id, 0)
    assert again == first and client_a != client_b
    second, _ = iteration(state, job_id, 1)
    assert second != first
    other_job = job(state, register(state, "other"))
    assert iteration(state, other_job, 0)[0] not in (first, second)
    assert state.iteration_keys[(job_id, 0)] == first
    assert state.iteration_keys[(job_id, 1)] == second
    assert_unchanged(state, ev.GetOrCreateIteration(9999, 0, 0.0), NotFoundError,
                     "Job id 9999 not found")


def test_tasks_are_created_for_registered_workers(state: st.DispatcherState) -> None:
    heartbeat(state, "w1:1")
    heartbeat(state, "w2:2")
    iteration_id, client_id = iteration(state, job(state, register(state)))
    tasks = state.iterations[iteration_id].tasks
    assert sorted(tasks) == ["w1:1", "w2:2"]
    view = state.apply(ev.ClientHeartbeat(client_id, 1.0))
    assert [(t.task_id, t.worker_address) for t in view.tasks] == sorted(
        (t, a) for a, t in tasks.items())
    assert not view.iteration_finished
    orders = heartbeat(state, "w1:1")
    assert new_task_ids(orders) == [tasks["w1:1"]]
    (assignment,) = orders.new_tasks
    assert assignment.iteration_id == iteration_id
    assert assignment.processing_mode is ShardingPolicy.DYNAMIC
    assert (assignment.worker_index, assignment.num_workers) == (0, 2)
    assert assignment.dataset.payload == b"payload:fp"
    # a task the worker already runs is not sent again
    assert heartbeat(state, "w1:1", current=(tasks["w1:1"],)).new_tasks == []


def test_a_late_worker_joins_unfinished_iterations(state: st.DispatcherState) -> None:
    heartbeat(state, "w1:1")
    dataset_id = register(state)
    finished_iteration, _ = iteration(state, job(state, dataset_id, mode="OFF"))
    (done,) = state.iterations[finished_iteration].tasks.values()
    state.apply(ev.TaskFinished("w1:1", done))
    running, _ = iteration(state, job(state, dataset_id))
    orders = heartbeat(state, "w2:2")
    late_task = state.iterations[running].tasks["w2:2"]
    assert new_task_ids(orders) == [late_task]
    assert "w2:2" not in state.iterations[finished_iteration].tasks
    assert state.task_definition(late_task).num_workers == 2


def test_an_iteration_created_before_any_worker_gets_tasks_later(
        state: st.DispatcherState) -> None:
    iteration_id, client_id = iteration(state, job(state, register(state)))
    assert state.iterations[iteration_id].tasks == {}
    assert state.apply(ev.ClientHeartbeat(client_id, 0.0)) == ev.ClientView([], False)
    orders = heartbeat(state, "w1:1")
    assert new_task_ids(orders) == [state.iterations[iteration_id].tasks["w1:1"]]


def test_a_restarted_worker_gets_its_unfinished_tasks_again(state: st.DispatcherState) -> None:
    heartbeat(state, "w1:1", uid="old")
    heartbeat(state, "w2:2")
    dataset_id = register(state)
    running, reader = iteration(state, job(state, dataset_id))
    done, client_id = iteration(state, job(state, dataset_id, mode="OFF"))
    mine = state.iterations[running].tasks["w1:1"]
    finished = state.iterations[done].tasks["w1:1"]
    assert new_task_ids(heartbeat(state, "w1:1", uid="old")) == sorted([mine, finished])
    state.apply(ev.TaskFinished("w1:1", finished))  # finished; its iteration still runs
    assert heartbeat(state, "w1:1", uid="old", current=(mine,)).new_tasks == []
    # a new process at the same address: the old one's unfinished DYNAMIC task runs again,
    # once its iteration's client has reported what it received of the first run
    assert heartbeat(state, "w1:1", uid="new").new_tasks == []
    (listed,) = [t for t in state.apply(ev.ClientHeartbeat(reader, 1.0)).tasks
                 if t.task_id == mine]
    assert (listed.incarnation, listed.held) == (2, True)
    state.apply(ev.ClientHeartbeat(reader, 1.0, ((mine, 2),), ((mine, 0, 7),)))
    orders = heartbeat(state, "w1:1", uid="new")
    assert new_task_ids(orders) == [mine]
    assert (orders.new_tasks[0].incarnation, orders.new_tasks[0].skip) == (2, ((0, 7),))
    assert state.workers["w1:1"].uid == "new"
    assert len(state.iterations[running].tasks) == 2  # no second task for the address
    # but a finished task stays finished: its elements were all handed out and its readers
    # have stopped reading it (run again, nobody would read it and its iteration never ended)
    assert state.tasks[finished].finished
    view = state.apply(ev.ClientHeartbeat(client_id, 1.0))
    assert view.tasks == [ev.TaskView(state.iterations[done].tasks["w2:2"], "w2:2")]
    assert not view.iteration_finished


def test_a_restarted_worker_does_not_rerun_finished_iterations(
        state: st.DispatcherState) -> None:
    heartbeat(state, "w1:1", uid="old")
    iteration_id, client_id = iteration(state, job(state, register(state)))
    (task_id,) = state.iterations[iteration_id].tasks.values()
    state.apply(ev.TaskFinished("w1:1", task_id))
    assert heartbeat(state, "w1:1", uid="new").new_tasks == []
    # its consumer may still save its position, which names the task: kept until it leaves
    assert task_id in state.tasks
    state.apply(ev.ReleaseClient(client_id))
    assert heartbeat(state, "w1:1", uid="new").new_tasks == []
    assert task_id not in state.tasks


def test_unknown_tasks_are_deleted(state: st.DispatcherState) -> None:
    heartbeat(state, "w1:1")
    heartbeat(state, "w2:2")
    iteration_id, _ = iteration(state, job(state, register(state)))
    tasks = state.iterations[iteration_id].tasks
    orders = heartbeat(state, "w1:1", current=(tasks["w1:1"], 777, -3, tasks["w2:2"]))
    assert orders.tasks_to_delete == sorted([777, -3, tasks["w2:2"]])
    assert orders.new_tasks == []


def test_task_finished_and_iteration_finished(state: st.DispatcherState) -> None:
    heartbeat(state, "w1:1")
    heartbeat(state, "w2:2")
    iteration_id, client_id = iteration(state, job(state, register(state), mode="OFF"))
    tasks = state.iterations[iteration_id].tasks
    assert_unchanged(state, ev.TaskFinished("w1:1", 424242), NotFoundError, "Task 424242")
    assert_unchanged(state, ev.TaskFinished("w1:1", tasks["w2:2"]), FailedPreconditionError,
                     "belongs to worker w2:2, not w1:1")
    state.apply(ev.TaskFinished("w1:1", tasks["w1:1"]))
    assert not state.apply(ev.ClientHeartbeat(client_id, 1.0)).iteration_finished
    last = tasks["w2:2"]
    state.apply(ev.TaskFinished("w2:2", last))
    assert state.apply(ev.ClientHeartbeat(client_id, 2.0)).iteration_finished
    assert state.iteration_finished(state.iterations[iteration_id])
    # a finished iteration keeps its tasks while its consumer reads (the consumer may save
    # its position, which names them); a worker still reporting one is told to delete it
    # (the acknowledgement), and nothing is sent again
    assert last in state.tasks
    orders = heartbeat(state, "w1:1", current=(last,))
    assert orders.new_tasks == [] and orders.tasks_to_delete == [last]
    state.apply(ev.ReleaseClient(client_id))  # the consumer left: the tasks go
    assert last not in state.tasks


def test_ends_reported_in_heartbeats_finish_tasks_and_are_acknowledged(
        state: st.DispatcherState) -> None:
    heartbeat(state, "w1:1")
    heartbeat(state, "w2:2")
    iteration_id, client_id = iteration(state, job(state, register(state), mode="OFF"))
    tasks = state.iterations[iteration_id].tasks
    mine, theirs = tasks["w1:1"], tasks["w2:2"]
    report = ev.WorkerHeartbeat("w1:1", "uid-w1:1", (mine,), 1.0, (mine,))
    assert state.is_durable(report)
    # acknowledged: the task is deleted from the worker, which then forgets it
    assert state.apply(report).tasks_to_delete == [mine]
    assert state.tasks[mine].finished and not state.is_durable(report)  # reported twice
    assert state.apply(report).tasks_to_delete == [mine]
    assert not state.apply(ev.ClientHeartbeat(client_id, 1.0)).iteration_finished
    # reports of tasks the worker does not hold (another's, unknown ones) change nothing
    stray = ev.WorkerHeartbeat("w1:1", "uid-w1:1", (theirs, 999), 2.0, (theirs, 999))
    assert not state.is_durable(stray)
    assert state.apply(stray).tasks_to_delete == sorted([theirs, 999])
    assert not state.tasks[theirs].finished
    state.apply(ev.WorkerHeartbeat("w2:2", "uid-w2:2", (theirs,), 3.0, (theirs,)))
    assert state.apply(ev.ClientHeartbeat(client_id, 3.0)).iteration_finished


def test_clients_heartbeat_and_release(state: st.DispatcherState) -> None:
    _, client_id = iteration(state, job(state, register(state)))
    state.apply(ev.ClientHeartbeat(client_id, 5.0))
    assert state.clients[client_id].last_seen == 5.0
    state.apply(ev.ReleaseClient(client_id))
    state.apply(ev.ReleaseClient(client_id))  # releasing twice is harmless
    assert_unchanged(state, ev.ClientHeartbeat(client_id, 6.0), NotFoundError,
                     f"Unknown iteration client id {client_id}")


# ----- splits ------------------------------------------------------------------------------------


@pytest.mark.parametrize("units", [1, 7, 100, 1023, 10_000, 5_000_003])
def test_dynamic_splits_cover_the_source_exactly_once(state: st.DispatcherState,
                                                      units: int) -> None:
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    rng = random.Random(seed)
    iteration_id, _ = iteration(state, job(state, register(state, units=units)))
    callers = 8
    ranges: list[tuple[int, int]] = []
    ended = [False] * callers
    for _ in range(100_000):
        if all(ended):
            break
        caller = rng.randrange(callers)
        got, end = splits(state, iteration_id, 0, rng.randint(1, 16))
        assert len(got) <= 16
        ranges.extend(got)
        ended[caller] = ended[caller] or end
    else:
        pytest.fail(f"splits never ended (seed={seed})")
    ranges.sort()
    assert ranges[0][0] == 0 and ranges[-1][1] == units
    for (_, stop), (start, _) in zip(ranges, ranges[1:]):
        assert stop == start, f"gap or overlap at {stop}/{start} (seed={seed})"
    assert all(0 < b - a <= st.MAX_SPLIT_SIZE for a, b in ranges)
    assert splits(state, iteration_id, 0, 16) == ([], True)


def test_zero_units_end_at_once(state: st.DispatcherState) -> None:
    iteration_id, _ = iteration(state, job(state, register(state, units=0)))
    assert splits(state, iteration_id, 0, 4) == ([], True)


def test_repetitions_of_splits(state: st.DispatcherState) -> None:
    iteration_id, _ = iteration(state, job(state, register(state, units=10)))
    assert splits(state, iteration_id, 0, 3) == ([(0, 1), (1, 2), (2, 3)], False)
    # a newer repetition (a repeat() in the pipeline) starts the source again
    assert splits(state, iteration_id, 1, 2) == ([(0, 1), (1, 2)], False)
    # an older one has ended
    assert splits(state, iteration_id, 0, 3) == ([], True)
    rest, end = [], False
    while not end:
        got, end = splits(state, iteration_id, 1, 100)
        rest += got
    assert rest == [(i, i + 1) for i in range(2, 10)]
    assert state.iterations[iteration_id].split_repetition == 1


def test_few_remaining_splits_are_shared_fairly(state: st.DispatcherState) -> None:
    for address in ("w1:1", "w2:1"):
        heartbeat(state, address)
    iteration_id, _ = iteration(state, job(state, register(state, units=8)))
    # 8 files, 2 workers: nobody gets more than a quarter of what is left at a time
    sizes = []
    end = False
    while not end:
        got, end = splits(state, iteration_id, 0, 8)
        sizes.append(len(got))
    assert sizes == [2, 2, 1, 1, 1, 1]


def ask(state: st.DispatcherState, iteration_id: int, task_id: int, number: int,
        repetition: int = 0, uid: str = "u1", max_splits: int = 2
        ) -> tuple[list[tuple[int, int]], bool]:
    return state.apply(ev.GetSplits(iteration_id, repetition, max_splits, task_id, uid,
                                    number))


def test_a_split_request_sent_again_gets_the_same_answer(state: st.DispatcherState) -> None:
    for address in ("w1:1", "w2:2"):
        heartbeat(state, address)
    iteration_id, _ = iteration(state, job(state, register(state, units=10)))
    first, second = state.iterations[iteration_id].tasks.values()
    answer = ask(state, iteration_id, first, 1)
    assert answer == ([(0, 1), (1, 2)], False)
    # the answer was lost; others go on; the request comes again, even after a restart
    assert ask(state, iteration_id, second, 1) == ([(2, 3), (3, 4)], False)
    again = ev.GetSplits(iteration_id, 0, 2, first, "u1", 1)
    assert not state.is_durable(again)
    assert state.apply(again) == answer
    restarted = st.DispatcherState.restore(state.saved())
    assert restarted.apply(again) == answer
    # the next request gets new splits; the old number no longer names an answer
    assert ask(state, iteration_id, first, 2) == ([(4, 5), (5, 6)], False)
    assert ask(state, iteration_id, first, 1) == ([(6, 7)], False)


def test_a_new_worker_process_numbers_its_requests_afresh(state: st.DispatcherState) -> None:
    heartbeat(state, "w1:1", uid="old")
    iteration_id, _ = iteration(state, job(state, register(state, units=10)))
    (task_id,) = state.iterations[iteration_id].tasks.values()
    assert ask(state, iteration_id, task_id, 1, uid="old") == ([(0, 1), (1, 2)], False)
    heartbeat(state, "w1:1", uid="new")  # restarted: it reads on from the cursor
    assert ask(state, iteration_id, task_id, 1, uid="new") == ([(2, 3), (3, 4)], False)


def test_answers_that_cannot_change_are_not_journaled(state: st.DispatcherState) -> None:
    heartbeat(state, "w1:1")
    iteration_id, _ = iteration(state, job(state, register(state, units=1)))
    (task_id,) = state.iterations[iteration_id].tasks.values()

    def request(number: int, repetition: int) -> ev.GetSplits:
        return ev.GetSplits(iteration_id, repetition, 8, task_id, "u1", number)

    assert state.is_durable(request(1, 0))
    assert state.apply(request(1, 0)) == ([(0, 1)], True)
    assert not state.is_durable(request(2, 0))  # repetition 0 has no split left
    assert state.apply(request(2, 0)) == ([], True)
    assert state.is_durable(request(3, 1))  # a new repetition begins
    assert state.apply(request(3, 1)) == ([(0, 1)], True)
    assert not state.is_durable(request(4, 0))  # an old repetition is over
    assert state.apply(request(4, 0)) == ([], True)


def test_split_requests_that_name_a_wrong_task_are_refused(state: st.DispatcherState) -> None:
    heartbeat(state, "w1:1")
    dataset_id = register(state, units=10)
    iteration_id, client_id = iteration(state, job(state, dataset_id))
    other, _ = iteration(state, job(state, dataset_id))
    (task_id,) = state.iterations[iteration_id].tasks.values()
    for event, error, match in [
        (ev.GetSplits(iteration_id, 0, 1, 424242, "u1", 1), NotFoundError, "Task 424242"),
        (ev.GetSplits(other, 0, 1, task_id, "u1", 1), InvalidArgumentError,
         f"belongs to iteration {iteration_id}, not {other}")]:
        assert not state.is_durable(event)
        assert_unchanged(state, event, error, match)
    ask(state, iteration_id, task_id, 1)
    assert_unchanged(state, ev.GetSplits(iteration_id, 1, 2, task_id, "u1", 1),
                     InvalidArgumentError, "was for repetition 0, not 1")
    state.apply(ev.WorkerHeartbeat("w1:1", "uid-w1:1", (task_id,), 1.0, (task_id,)))
    state.apply(ev.ReleaseClient(client_id))
    # its iteration has finished and its consumer left: its tasks are dropped
    assert_unchanged(state, ev.GetSplits(iteration_id, 0, 1, task_id, "u1", 2),
                     NotFoundError, "not found")


def test_splits_of_an_off_job_are_refused(state: st.DispatcherState) -> None:
    iteration_id, _ = iteration(state, job(state, register(state), mode="OFF"))
    assert_unchanged(state, ev.GetSplits(iteration_id, 0, 1), FailedPreconditionError,
                     "uses OFF, not DYNAMIC")
    assert_unchanged(state, ev.GetSplits(31337, 0, 1), NotFoundError, "Iteration 31337")


# ----- garbage collection ------------------------------------------------------------------------


def test_collect_garbage_drops_silent_clients_and_workers(state: st.DispatcherState) -> None:
    heartbeat(state, "quiet:1", now=0.0)
    heartbeat(state, "busy:2", now=0.0)
    job_id = job(state, register(state))
    _, silent = iteration(state, job_id, now=0.0)
    _, alive = iteration(state, job_id, now=0.0)
    state.apply(ev.ClientHeartbeat(alive, 90.0))
    heartbeat(state, "busy:2", now=90.0)
    lost = state.apply(ev.CollectGarbage(now=100.0, client_timeout=50.0, worker_timeout=30.0))
    assert lost == ["quiet:1"]
    assert set(state.workers) == {"busy:2"}
    assert set(state.clients) == {alive}
    assert_unchanged(state, ev.ClientHeartbeat(silent, 101.0), NotFoundError, "Unknown")
    # nothing else is silent yet
    assert state.apply(ev.CollectGarbage(now=101.0, client_timeout=50.0,
                                         worker_timeout=30.0)) == []


def test_a_lost_worker_leaves_its_unfinished_iterations(state: st.DispatcherState) -> None:
    """A worker that dies for good must not keep its iterations from ending."""
    heartbeat(state, "gone:1", now=0.0)
    heartbeat(state, "busy:2", now=0.0)
    dataset_id = register(state, units=10)
    done, _ = iteration(state, job(state, dataset_id, mode="OFF"), now=0.0)
    for address, task_id in state.iterations[done].tasks.items():
        state.apply(ev.TaskFinished(address, task_id))
    running, client_id = iteration(state, job(state, dataset_id), now=0.0)
    gone = state.iterations[running].tasks["gone:1"]
    busy = state.iterations[running].tasks["busy:2"]
    heartbeat(state, "busy:2", current=(busy,), now=90.0)
    assert state.apply(ev.CollectGarbage(100.0, 500.0, 30.0)) == ["gone:1"]
    assert state.tasks[gone].finished
    assert state.iterations[running].tasks == {"busy:2": busy}
    # finished iterations are left alone (kept whole while their consumer may still read)
    assert state.records.iteration_finished(state.iterations[done])
    view = state.apply(ev.ClientHeartbeat(client_id, 100.0))
    assert view == ev.ClientView([ev.TaskView(busy, "busy:2", 1)], False)
    state.apply(ev.TaskFinished("busy:2", busy))
    assert state.apply(ev.ClientHeartbeat(client_id, 101.0)) == ev.ClientView([], True)


def test_a_lost_worker_that_comes_back_is_a_new_worker(state: st.DispatcherState) -> None:
    heartbeat(state, "w1:1", uid="u", now=0.0)
    heartbeat(state, "w2:2", now=0.0)
    running, _ = iteration(state, job(state, register(state, units=10)), now=0.0)
    old = state.iterations[running].tasks["w1:1"]
    heartbeat(state, "w2:2", now=90.0)
    assert state.apply(ev.CollectGarbage(100.0, 500.0, 30.0)) == ["w1:1"]
    # the same process comes back: its old task is deleted, a new one takes its place
    orders = heartbeat(state, "w1:1", uid="u", current=(old,), now=101.0)
    new = state.iterations[running].tasks["w1:1"]
    assert new != old and new_task_ids(orders) == [new]
    assert orders.tasks_to_delete == [old]
    state.apply(ev.TaskFinished("w1:1", old))  # a late report of the old task is harmless


def test_a_worker_found_gone_is_declared_lost_at_once_and_fenced(
        state: st.DispatcherState) -> None:
    """WorkerLost (a consumer reported it, the dispatcher's ping was refused): no wait for
    worker_timeout; its DYNAMIC task is adopted in its next run; back again, the old process
    is told to drop the task and registers anew. A report naming another process (the
    address was restarted meanwhile) changes nothing."""
    heartbeat(state, "w1:1", uid="old", now=0.0)
    heartbeat(state, "w2:2", now=0.0)
    running, client_id = iteration(state, job(state, register(state, units=10)), now=0.0)
    task = state.iterations[running].tasks["w1:1"]
    before = state.snapshot()
    assert state.apply(ev.WorkerLost("w1:1", "another")) is False
    assert state.snapshot() == before
    assert state.apply(ev.WorkerLost("w1:1", "old")) is True
    assert "w1:1" not in state.workers
    assert state.tasks[task].incarnation == 2 and state.tasks[task].runner == "w2:2"
    view = state.apply(ev.ClientHeartbeat(client_id, 1.0))
    (held,) = [t for t in view.tasks if t.task_id == task]
    assert (held.worker_address, held.incarnation, held.held) == ("w2:2", 2, True)
    assert held.held_for == f"the reports of the iteration's clients {client_id} (what they " \
                           "received of its run 1)"
    state.apply(ev.ClientHeartbeat(client_id, 1.2, settled=((task, 2),)))
    assert task in new_task_ids(heartbeat(state, "w2:2", now=1.5))
    # the fenced process heartbeats again: it drops the task, and is a worker again
    orders = heartbeat(state, "w1:1", uid="old", current=(task,), now=2.0)
    assert orders.tasks_to_delete == [task] and task not in new_task_ids(orders)
    assert state.workers["w1:1"].uid == "old"
    assert state.apply(ev.WorkerLost("w2:2", "nobody-else")) is False


def test_an_iteration_whose_workers_are_all_lost_waits_for_new_ones(
        state: st.DispatcherState) -> None:
    heartbeat(state, "w1:1", now=0.0)
    running, client_id = iteration(state, job(state, register(state, units=10)), now=0.0)
    assert state.apply(ev.CollectGarbage(100.0, 500.0, 30.0)) == ["w1:1"]
    assert state.apply(ev.ClientHeartbeat(client_id, 100.0)) == ev.ClientView([], False)
    orders = heartbeat(state, "w2:2", now=101.0)
    assert new_task_ids(orders) == [state.iterations[running].tasks["w2:2"]]


def test_collect_garbage_can_name_whom_it_forgets(state: st.DispatcherState) -> None:
    """The form the dispatcher journals: replaying it does not depend on client heartbeats,
    which are not journaled."""
    heartbeat(state, "w1:1", now=0.0)
    heartbeat(state, "w2:2", now=0.0)
    job_id = job(state, register(state))
    _, first = iteration(state, job_id, now=0.0)
    _, second = iteration(state, job_id, now=0.0)
    assert state.silent_clients(100.0, 50.0) == (first, second)
    assert state.silent_clients(100.0, 50.0, since=60.0) == ()
    assert state.silent_workers(100.0, 50.0) == ("w1:1", "w2:2")
    assert state.silent_workers(100.0, 50.0, since=60.0) == ()
    lost = state.apply(ev.CollectGarbage(100.0, 50.0, 50.0, (second, 424242),
                                         ("w2:2", "nobody:1")))
    assert lost == ["w2:2"]
    assert set(state.clients) == {first} and set(state.workers) == {"w1:1"}


def test_snapshot_is_a_copy(state: st.DispatcherState) -> None:
    before = state.snapshot()
    dataset_id = register(state)
    job_id = job(state, dataset_id, "named")
    iteration(state, job_id)
    assert before == st.DispatcherState().snapshot()
    assert before["named_jobs"] == {} and before["iteration_keys"] == {}


# ----- properties: failed events change nothing; replay is deterministic -------------------------

ADDRESSES = ("w1:1", "w2:2", "w3:3")
_now = hs.floats(min_value=0, max_value=1000, allow_nan=False)


def _known_or_not(known: Any, unknown: list[Any]) -> hs.SearchStrategy[Any]:
    """Mostly ids the state knows (so events succeed), sometimes ones it does not."""
    known = sorted(known)
    if not known:
        return hs.sampled_from(unknown)
    return hs.one_of(*[hs.sampled_from(known)] * 4, hs.sampled_from(unknown))


def draw_event(draw: Any, state: st.DispatcherState) -> Any:
    """One valid or invalid event, with ids drawn from what ``state`` holds now."""
    kind = draw(hs.sampled_from([
        "register", "job", "job", "iteration", "iteration", "iteration", "client", "release",
        "worker", "worker", "finished", "finished", "splits", "splits", "splits", "gc",
        "lost"]))
    if not state.datasets or not state.jobs:  # build something to work on first
        kind = draw(hs.sampled_from(["register", "job", "worker"]))
    if kind == "register":
        return ev.RegisterDataset(
            draw(hs.sampled_from("abc")), b"p", draw(hs.sampled_from(["", "AUTO"])), b"",
            draw(hs.integers(-2, 10)), draw(hs.sampled_from([-1, 0, 3, 50, 50])),
            draw(hs.sampled_from(["", "", "mine", "1001"])))
    if kind == "job":
        options = ev.JobOptions(
            ShardingPolicy[draw(hs.sampled_from(["OFF", "OFF", "DYNAMIC", "DYNAMIC", "DYNAMIC",
                                                 "DATA", "FILE"]))],
            draw(hs.sampled_from([0, 0, 2])), draw(hs.sampled_from(["AUTO", "AUTO", "ANY"])),
            draw(hs.sampled_from(["", "", "t"])))
        return ev.GetOrCreateJob(draw(_known_or_not(state.datasets, ["nope", ""])),
                                 draw(hs.sampled_from(["", "", "j1", "j2"])), options,
                                 draw(hs.sampled_from([(), ADDRESSES[1:], ADDRESSES[::-1]])))
    if kind == "iteration":
        return ev.GetOrCreateIteration(draw(_known_or_not(state.jobs, [-1, 9999])),
                                       draw(hs.integers(0, 2)), draw(_now))
    if kind == "client":
        return ev.ClientHeartbeat(draw(_known_or_not(state.clients, [0, 9999])), draw(_now),
                                  draw(_settled(state)), draw(_received(state)))
    if kind == "release":
        return ev.ReleaseClient(draw(_known_or_not(state.clients, [0, 9999])),
                                draw(_received(state)))
    if kind == "worker":
        current = draw(hs.lists(_known_or_not(state.tasks, [-7, 9999]), max_size=3))
        finished = draw(hs.lists(hs.sampled_from(current), max_size=2)) if current else []
        return ev.WorkerHeartbeat(draw(hs.sampled_from(ADDRESSES)),
                                  draw(hs.sampled_from(["u1", "u1", "u2"])), tuple(current),
                                  draw(_now), tuple(finished))
    if kind == "finished":
        return ev.TaskFinished(draw(hs.sampled_from(ADDRESSES)),
                               draw(_known_or_not(state.tasks, [-7, 9999])))
    if kind == "splits":
        task_id = draw(hs.one_of(hs.just(0), _known_or_not(state.tasks, [-7, 9999])))
        iteration_id = draw(hs.one_of(
            _known_or_not(state.iterations, [-1, 9999]),
            hs.just(state.tasks[task_id].iteration_id if task_id in state.tasks else -1)))
        run = state.tasks[task_id].incarnation if task_id in state.tasks else 0
        return ev.GetSplits(iteration_id, draw(hs.integers(0, 2)), draw(hs.integers(-1, 8)),
                            task_id, draw(hs.sampled_from(["u1", "u2"])),
                            draw(hs.integers(1, 3)), draw(hs.sampled_from([0, run, run, 7])))
    if kind == "lost":
        return ev.WorkerLost(draw(hs.sampled_from(ADDRESSES)), draw(hs.sampled_from(["u1", "u2"])))
    return ev.CollectGarbage(draw(_now), draw(hs.sampled_from([10.0, 500.0])),
                             draw(hs.sampled_from([10.0, 500.0])),
                             iteration_timeout=draw(hs.sampled_from([None, 0.0, 100.0])),
                             keep_dynamic=draw(hs.booleans()), adopt=draw(hs.booleans()))


def _settled(state: st.DispatcherState) -> Any:
    """Reports of runs, of known tasks mostly (exactly-once's settling)."""
    runs = [(t, r.incarnation) for t, r in state.tasks.items()] or [(9999, 1)]
    return hs.lists(hs.sampled_from(runs), max_size=2).map(tuple)


def _received(state: st.DispatcherState) -> Any:
    task_ids = list(state.tasks) or [9999]
    return hs.lists(hs.tuples(hs.sampled_from(task_ids), hs.integers(0, 20),
                              hs.integers(0, 5)).map(lambda r: (r[0], r[1], r[1] + r[2])),
                    max_size=3).map(tuple)


def as_journaled(state: st.DispatcherState, event: Any) -> Any:
    """``event`` as the dispatcher journals it (None: not at all): garbage collection names
    whom it forgets, so that replay does not depend on last-seen times."""
    if not state.is_durable(event):
        return None
    if isinstance(event, ev.CollectGarbage) and event.clients is None:
        return dataclasses.replace(
            event, clients=state.silent_clients(event.now, event.client_timeout),
            workers=state.silent_workers(event.now, event.worker_timeout))
    return event


def without_last_seen(snapshot: dict[str, Any]) -> dict[str, Any]:
    return {**snapshot, **{name: {key: {**record, "last_seen": None}
                                  for key, record in snapshot[name].items()}
                           for name in ("workers", "clients")}}


def apply_checked(state: st.DispatcherState, event: Any) -> Any:
    """Apply ``event``; a failure must be a convoy error that left the state as it was, and
    an event that is not durable may change last-seen times only."""
    before = state.snapshot()
    durable = state.is_durable(event)
    try:
        outcome = state.apply(event)
    except ConvoyError as error:
        assert state.snapshot() == before, f"{event} raised {error!r} but changed the state"
        outcome = Failed(type(error), str(error))
    if not durable:
        assert without_last_seen(state.snapshot()) == without_last_seen(before), event
    check_consistent(state)
    return outcome


@dataclasses.dataclass(frozen=True)
class Failed:
    error: type[Exception]
    message: str


def check_consistent(state: st.DispatcherState) -> None:
    for name, job_id in state.named_jobs.items():
        assert state.jobs[job_id].name == name
    for job_record in state.jobs.values():
        assert job_record.dataset_id in state.datasets
    for (job_id, repetition), iteration_id in state.iteration_keys.items():
        record = state.iterations[iteration_id]
        assert (record.job_id, record.repetition) == (job_id, repetition)
    for iteration_id, record in state.iterations.items():
        for address, task_id in record.tasks.items():
            task = state.tasks[task_id]
            assert (task.iteration_id, task.worker_address) == (iteration_id, address)
    for client in state.clients.values():
        assert client.iteration_id in state.iterations
    for task in state.tasks.values():  # a static job's tasks: on its workers, at their index
        listed = state.jobs[state.iterations[task.iteration_id].job_id].worker_addresses
        if listed:
            assignment = state.task_definition(task.task_id)
            assert listed[assignment.worker_index] == task.worker_address
            assert assignment.num_workers == len(listed)
    # the indexes are those the records imply
    assert st.DispatcherState.restore(state.saved()).snapshot() == state.snapshot()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hs.data(), hs.integers(min_value=0, max_value=50))
def test_failed_events_change_nothing_and_replay_is_deterministic(data: Any,
                                                                  length: int) -> None:
    """And replaying only the journaled events restores all but last-seen times."""
    state = st.DispatcherState()
    events, outcomes, journal = [], [], []
    for _ in range(length):
        event = draw_event(data.draw, state)
        events.append(event)
        journaled = as_journaled(state, event)
        outcomes.append(apply_checked(state, event))
        if journaled is not None and not isinstance(outcomes[-1], Failed):
            journal.append(journaled)
    replayed = st.DispatcherState()
    assert [apply_checked(replayed, event) for event in events] == outcomes
    assert replayed.snapshot() == state.snapshot()
    # what a restart replays: all but last-seen times
    restarted = st.DispatcherState()
    for event in journal:
        restarted.apply(event)
    assert without_last_seen(restarted.snapshot()) == without_last_seen(state.snapshot())


def test_iterations_without_clients_are_forgotten_after_the_timeout(
        state: st.DispatcherState) -> None:
    dataset_id = register(state)
    job_id = job(state, dataset_id, name="named", mode="OFF")
    heartbeat(state, "w1:1")
    kept_id, kept_client = state.apply(ev.GetOrCreateIteration(job_id, 0, 0.0))
    idle_id, idle_client = state.apply(ev.GetOrCreateIteration(job_id, 1, 0.0))
    state.apply(ev.ReleaseClient(idle_client))
    idle_task = state.iterations[idle_id].tasks["w1:1"]

    def collect(now: float) -> None:
        state.apply(ev.CollectGarbage(now, 1e9, 1e9, (), (), iteration_timeout=10.0))

    collect(100.0)  # first seen idle now
    collect(105.0)
    assert idle_id in state.iterations
    collect(110.0)
    assert idle_id not in state.iterations and idle_task not in state.tasks
    assert kept_id in state.iterations and kept_client in state.clients
    # its worker is told to drop the task; asking again makes a new iteration
    assert idle_task in state.apply(ev.WorkerHeartbeat("w1:1", "uid-w1:1", (idle_task,),
                                                       111.0)).tasks_to_delete
    again, _ = state.apply(ev.GetOrCreateIteration(job_id, 1, 112.0))
    assert again != idle_id


def test_idle_iterations_are_collected_and_finished_ones_kept(state: st.DispatcherState) -> None:
    """TensorFlow's rules: an unfinished iteration without clients is collected after the
    timeout (a named DYNAMIC one too, unless an event asks to keep it); a finished named one
    stays as a tombstone; an anonymous one goes with its last client."""
    dataset_id = register(state)
    heartbeat(state, "w1:1")
    named = iteration(state, job(state, dataset_id, name="named"))
    anonymous = iteration(state, job(state, dataset_id))
    finished = iteration(state, job(state, dataset_id, name="done"))
    off = iteration(state, job(state, dataset_id, name="off", mode="OFF"))
    (done_task,) = state.iterations[finished[0]].tasks.values()
    state.apply(ev.TaskFinished("w1:1", done_task))
    for _, client_id in (named, anonymous, finished, off):
        state.apply(ev.ReleaseClient(client_id))
    assert anonymous[0] not in state.iterations  # at once: no one can join it again
    for now in (100.0, 200.0):
        state.apply(ev.CollectGarbage(now, 1e9, 1e9, (), (), 10.0, keep_dynamic=True))
    assert list(state.iterations) == [named[0], finished[0]]
    assert state.iterations[named[0]].idle_since is None
    state.apply(ev.CollectGarbage(300.0, 1e9, 1e9, (), (), 10.0))
    state.apply(ev.CollectGarbage(400.0, 1e9, 1e9, (), (), 10.0))
    assert list(state.iterations) == [finished[0]] and state.iterations[finished[0]].finished
    # reopening the collected one starts afresh; the finished one reads nothing
    again, _ = iteration(state, state.named_jobs["named"])
    assert again != named[0] and not state.iterations[again].finished
    assert iteration(state, state.named_jobs["done"])[0] == finished[0]


def test_iterations_are_kept_without_an_iteration_timeout(state: st.DispatcherState) -> None:
    job_id = job(state, register(state), name="named")
    iteration_id, client_id = state.apply(ev.GetOrCreateIteration(job_id, 0, 0.0))
    state.apply(ev.ReleaseClient(client_id))
    state.apply(ev.CollectGarbage(1e9, 1e9, 1e9, (), ()))
    assert iteration_id in state.iterations


# ----- property: split answers lost in flight, dispatcher restarts: every split exactly once ----


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(units=hs.integers(0, 40), workers=hs.integers(1, 3), repetitions=hs.integers(1, 3),
       steps=hs.lists(hs.tuples(hs.integers(0, 2), hs.sampled_from(
           ["answered", "answered", "lost", "restart"]), hs.integers(1, 8)), max_size=150))
def test_lost_answers_and_restarts_lose_and_repeat_no_split(
        units: int, workers: int, repetitions: int,
        steps: list[tuple[int, str, int]]) -> None:
    """Workers read ``repetitions`` passes of a DYNAMIC iteration. An answer may be lost (the
    dispatcher journaled it, then died before it arrived): the worker sends the request
    again, with its number. The dispatcher may restart from its journal between any two
    requests. Each pass's splits still arrive exactly once over all workers."""
    state = st.DispatcherState()
    journal: list[Any] = []

    def apply(event: Any) -> Any:
        journaled = as_journaled(state, event)
        result = state.apply(event)
        if journaled is not None:
            journal.append(journaled)
        return result

    addresses = [f"w{i}:1" for i in range(workers)]
    for address in addresses:
        apply(ev.WorkerHeartbeat(address, f"uid-{address}", (), 0.0))
    iteration_id, _ = apply(ev.GetOrCreateIteration(
        apply(ev.GetOrCreateJob(apply(ev.RegisterDataset("fp", b"p", "", b"", units, units)),
                                "", ev.JobOptions(ShardingPolicy.DYNAMIC))), 0, 0.0))
    tasks = [state.iterations[iteration_id].tasks[address] for address in addresses]
    number, repetition = [1] * workers, [0] * workers
    received: list[list[tuple[int, int]]] = [[] for _ in range(repetitions)]
    for worker, outcome, max_splits in [*steps, *[(w, "answered", 8) for w in
                                                  range(workers)] * (units + 2) * repetitions]:
        worker %= workers
        if outcome == "restart":
            state = st.DispatcherState()
            for event in journal:
                state.apply(event)
            continue
        if repetition[worker] >= repetitions:
            continue
        got, end = apply(ev.GetSplits(iteration_id, repetition[worker], max_splits,
                                      tasks[worker], "uid-" + addresses[worker],
                                      number[worker]))
        if outcome == "lost":
            continue  # the same request goes again
        number[worker] += 1
        received[repetition[worker]] += got
        repetition[worker] += end
    for passes in received:
        assert sorted(passes) == [(u, u + 1) for u in range(units)]


def test_validate_names_a_broken_invariant() -> None:
    state = st.DispatcherState()
    state.validate()
    state.records.named_jobs["gone"] = 12345
    with pytest.raises(AssertionError, match="job name 'gone' -> 12345"):
        state.validate()
