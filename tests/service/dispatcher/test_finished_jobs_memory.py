"""What a dispatcher keeps of finished jobs: a named job's finished iteration stays as a small
record (a tombstone), an anonymous job's goes; its tasks and split answers are dropped once
its consumers have left. Measured on the pure state with tracemalloc (before, each job kept
about 0.3 MB)."""

from __future__ import annotations

import tracemalloc

import pytest

from convoy.data.service._common import invariants
from convoy.data.service._common.config import ShardingPolicy
from convoy.data.service._common.server_config import DispatcherConfig
from convoy.data.service._dispatcher import events as ev
from convoy.data.service._dispatcher import state as st
from convoy.data.service._dispatcher.limits import admit
from convoy.errors import ResourceExhaustedError

WORKERS = ("w1:1", "w2:2")


def run_job(state: st.DispatcherState, dataset_id: str, name: str, now: float) -> None:
    """One job read to its end by one consumer on two workers, its splits all handed out in
    requests of up to 1024, then released."""
    job_id = state.apply(ev.GetOrCreateJob(dataset_id, name, ev.JobOptions(ShardingPolicy.DYNAMIC)))
    iteration_id, client_id = state.apply(ev.GetOrCreateIteration(job_id, 0, now))
    tasks: list[int] = []
    for address in WORKERS:
        orders = state.apply(ev.WorkerHeartbeat(address, f"uid-{address}", (), now))
        tasks += [t.task_id for t in orders.new_tasks]
    for task_id in tasks:
        number, end = 0, False
        while not end:
            number += 1
            _, end = state.apply(ev.GetSplits(iteration_id, 0, 1024, task_id, "uid", number, 1))
        state.apply(ev.ClientHeartbeat(client_id, now, received=((task_id, 0, 100),)))
    for address, task_id in zip(WORKERS, tasks, strict=True):
        state.apply(ev.WorkerHeartbeat(address, f"uid-{address}", (task_id,), now, (task_id,)))
    state.apply(ev.ReleaseClient(client_id))  # buried once its consumer has left
    assert state.iterations.get(iteration_id) is None or state.iterations[iteration_id].finished


def test_a_thousand_finished_jobs_cost_under_5_mb(monkeypatch: pytest.MonkeyPatch) -> None:
    # validating the whole state after each of 20,000 events under tracemalloc takes minutes
    monkeypatch.setattr(invariants, "ENABLED", False)
    state = st.DispatcherState()
    dataset_id = state.apply(ev.RegisterDataset("fp", b"x" * 10_000, "", b"", 200, 200))
    for i in range(20):  # warm up: the dicts' first growth
        run_job(state, dataset_id, f"warm-{i}", 0.0)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(1000):
            run_job(state, dataset_id, f"job-{i}" if i % 2 else "", float(i))
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    print(f"1,000 finished jobs kept {grown / 2**20:.2f} MB")
    assert grown < 5 << 20, f"1,000 finished jobs kept {grown / 2**20:.1f} MB"
    assert state.tasks == {} and not state.records.worker_tasks
    assert len(state.iterations) == 20 + 500  # the named jobs' tombstones
    assert all(iteration.finished and not iteration.tasks
               for iteration in state.iterations.values())
    # a tombstone is what a reopening consumer finds: it reads nothing
    iteration_id, _ = state.apply(ev.GetOrCreateIteration(state.named_jobs["job-1"], 0, 0.0))
    assert state.iterations[iteration_id].finished


# ----- tombstones are bounded ----------------------------------------------------------------


def test_tombstones_beyond_the_cap_are_forgotten_oldest_first() -> None:
    state = st.DispatcherState()
    state.gc.max_tombstones = 3
    dataset_id = state.apply(ev.RegisterDataset("fp", b"x", "", b"", 200, 200))
    for i in range(5):
        run_job(state, dataset_id, f"job-{i}", float(i))
    assert sorted(state.named_jobs) == ["job-2", "job-3", "job-4"]
    assert len(state.jobs) == len(state.records.tombstones) == len(state.iterations) == 3
    assert state.records.job_iterations.keys() == state.jobs.keys()
    # a forgotten job reopened is a new job: its iteration reads afresh
    job_id = state.apply(ev.GetOrCreateJob(dataset_id, "job-0",
                                           ev.JobOptions(ShardingPolicy.DYNAMIC)))
    assert job_id not in state.records.tombstones
    iteration_id, _ = state.apply(ev.GetOrCreateIteration(job_id, 0, 9.0))
    assert not state.iterations[iteration_id].finished
    # a remembered one still reads nothing
    remembered = state.named_jobs["job-4"]
    iteration_id, _ = state.apply(ev.GetOrCreateIteration(remembered, 0, 9.0))
    assert state.iterations[iteration_id].finished
    # restoring rebuilds the same tombstones
    assert st.DispatcherState.restore(state.saved()).snapshot() == state.snapshot()


def test_a_tombstone_a_consumer_has_opened_is_kept_until_it_leaves() -> None:
    state = st.DispatcherState()
    state.gc.max_tombstones = 1
    dataset_id = state.apply(ev.RegisterDataset("fp", b"x", "", b"", 200, 200))
    run_job(state, dataset_id, "opened", 0.0)
    _, reader = state.apply(ev.GetOrCreateIteration(state.named_jobs["opened"], 0, 1.0))
    run_job(state, dataset_id, "later", 2.0)  # the cap holds: the one nobody reads goes
    assert sorted(state.named_jobs) == ["opened"]
    state.apply(ev.ClientHeartbeat(reader, 3.0))  # its reader's heartbeats go on
    state.apply(ev.ReleaseClient(reader))
    run_job(state, dataset_id, "last", 4.0)
    assert sorted(state.named_jobs) == ["last"]


def test_tombstones_do_not_count_towards_max_jobs() -> None:
    state = st.DispatcherState()
    dataset_id = state.apply(ev.RegisterDataset("fp", b"x", "", b"", 200, 200))
    for i in range(3):
        run_job(state, dataset_id, f"done-{i}", float(i))
    config = DispatcherConfig(max_jobs=1)

    def new_job(name: str) -> ev.GetOrCreateJob:
        return ev.GetOrCreateJob(dataset_id, name, ev.JobOptions(ShardingPolicy.OFF))

    admit(config, state, new_job("new"))  # no job has not finished
    state.apply(new_job("new"))
    with pytest.raises(ResourceExhaustedError, match="1 jobs, its max_jobs"):
        admit(config, state, new_job("newer"))
