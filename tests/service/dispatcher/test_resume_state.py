"""The dispatcher's side of resuming a saved reading: a new iteration that starts at the saved
cursor and runs the saved tasks again (their seeds, split answers and skips), merges the
states of a shared job's consumers before it starts, and journals its event."""

from __future__ import annotations

from convoy.data.service._common.config import ShardingPolicy
from convoy.data.service._dispatcher import events as ev
from convoy.data.service._dispatcher import state as st
from convoy.data.service._dispatcher.journal_format import decode_event, encode_event

OPTIONS = ev.JobOptions(ShardingPolicy.DYNAMIC)


def _state() -> tuple[st.DispatcherState, int]:
    state = st.DispatcherState()
    dataset = state.apply(ev.RegisterDataset("fp", b"x", "", b"", 100, 100))
    state.apply(ev.WorkerHeartbeat("w1", "uid-1", (), 0.0))
    job = state.apply(ev.GetOrCreateJob(dataset, "resumed", OPTIONS))
    return state, job


def _saved(seed: int, answers: int, skip: tuple[tuple[int, int], ...], cursor: int,
           consumers: int = 1) -> ev.ResumePoint:
    splits = tuple(ev.SplitsAnswer("", 0, 0, [(i, i + 1)], False) for i in range(answers))
    return ev.ResumePoint(0, cursor, 1, (ev.ResumeTask(seed, "", splits, skip),), consumers)


def test_a_resumed_iteration_starts_at_the_cursor_and_replays_the_saved_task() -> None:
    state, job = _state()
    event = ev.GetOrCreateIteration(job, 0, 0.0, _saved(77, 3, ((0, 5),), cursor=40))
    assert decode_event(encode_event(event)) == event  # journaled as it is
    iteration_id, _ = state.apply(event)
    iteration = state.iterations[iteration_id]
    assert iteration.split_cursor == 40
    (resumed,) = [state.tasks[t] for a, t in iteration.tasks.items() if a != "w1"]
    assert resumed.seed == 77 and resumed.delivered == [(0, 5)]
    assert [a.splits for a in resumed.split_log] == [[(0, 1)], [(1, 2)], [(2, 3)]]
    assignment = state.task_definition(resumed.task_id)
    assert assignment.seed == 77 and assignment.skip == ((0, 5),)
    # its answers come from the log, then from the cursor
    ask = ev.GetSplits(iteration_id, 0, 1, resumed.task_id, "uid-1", 1, resumed.incarnation)
    assert state.apply(ask) == ([(0, 1)], False)


def test_a_shared_jobs_consumers_are_merged_before_the_iteration_starts() -> None:
    state, job = _state()
    iteration_id, _ = state.apply(ev.GetOrCreateIteration(
        job, 0, 0.0, _saved(77, 2, ((0, 3),), cursor=30, consumers=2)))
    iteration = state.iterations[iteration_id]
    tasks = [state.tasks[t] for t in iteration.tasks.values()]
    assert all(state.runs.held(t) for t in tasks)  # waits for the other consumer
    state.apply(ev.GetOrCreateIteration(job, 0, 1.0, _saved(77, 4, ((5, 7),), cursor=50,
                                                            consumers=2)))
    assert iteration.split_cursor == 50  # the later save's
    (resumed,) = [state.tasks[t] for a, t in iteration.tasks.items() if a != "w1"]
    assert len(resumed.split_log) == 4 and resumed.delivered == [(0, 3), (5, 7)]
    assert not any(state.runs.held(state.tasks[t]) for t in iteration.tasks.values())


def test_off_positions_go_to_the_workers_at_their_addresses() -> None:
    state = st.DispatcherState()
    dataset = state.apply(ev.RegisterDataset("fp", b"x", "", b"", 100, -1))
    state.apply(ev.WorkerHeartbeat("w1", "uid-1", (), 0.0))
    job = state.apply(ev.GetOrCreateJob(dataset, "", ev.JobOptions(ShardingPolicy.OFF)))
    saved = ev.ResumePoint(tasks=(ev.ResumeTask(5, "w1", skip_count=12),
                                  ev.ResumeTask(6, "gone", skip_count=3)))
    iteration_id, _ = state.apply(ev.GetOrCreateIteration(job, 0, 0.0, saved))
    (task_id,) = state.iterations[iteration_id].tasks.values()
    assignment = state.task_definition(task_id)
    assert (assignment.seed, assignment.skip_count) == (5, 12)
    state.apply(ev.WorkerHeartbeat("w2", "uid-2", (), 0.0))  # a new worker: from the start
    task = state.tasks[state.iterations[iteration_id].tasks["w2"]]
    assert (task.seed, task.skip_count) == (0, 0)


def test_a_resumed_shared_iteration_says_which_consumers_it_waits_for() -> None:
    state, job = _state()
    saved = _saved(77, 2, ((0, 3),), cursor=30, consumers=3)
    _, client = state.apply(ev.GetOrCreateIteration(job, 0, 0.0, saved))
    view = state.apply(ev.ClientHeartbeat(client, 0.5))
    assert view.tasks and all(t.held for t in view.tasks)
    assert {t.held_for for t in view.tasks} == {
        "2 more of the 3 consumers that saved the shared job (resumed by 1 so far): each "
        "must resume with its own saved state"}
    state.apply(ev.GetOrCreateIteration(job, 0, 1.0, saved))
    (waiting,) = {t.held_for for t in state.apply(ev.ClientHeartbeat(client, 1.5)).tasks}
    assert waiting.startswith("1 more of the 3 consumers")
    state.apply(ev.GetOrCreateIteration(job, 0, 2.0, saved))
    assert not any(t.held or t.held_for for t in state.apply(ev.ClientHeartbeat(client, 2.5)).tasks)


def test_coordinated_consumers_restoring_different_rounds_fail_the_iteration() -> None:
    state = st.DispatcherState()
    dataset = state.apply(ev.RegisterDataset("fp", b"x", "", b"", -1, -1))  # infinite
    state.apply(ev.WorkerHeartbeat("w1", "uid-1", (), 0.0))
    job = state.apply(ev.GetOrCreateJob(
        dataset, "c", ev.JobOptions(ShardingPolicy.OFF, num_consumers=2),
        coordinated_rules=True))
    saved = ev.ResumePoint(tasks=(ev.ResumeTask(5, "w1", skip_count=12),), round_index=300)
    iteration_id, first = state.apply(ev.GetOrCreateIteration(job, 0, 0.0, saved))
    _, same = state.apply(ev.GetOrCreateIteration(job, 0, 0.0, saved))
    assert same and not state.iterations[iteration_id].failure
    other = ev.ResumePoint(tasks=saved.tasks, round_index=200)
    assert decode_event(encode_event(ev.GetOrCreateIteration(job, 0, 0.0, other))).resume == other
    _, refused = state.apply(ev.GetOrCreateIteration(job, 0, 0.0, other))
    assert refused == 0  # no client: the dispatcher refuses the call
    view = state.apply(ev.ClientHeartbeat(first, 0.5))
    assert "different rounds: 300 and 200" in view.failure  # the first consumer fails too
