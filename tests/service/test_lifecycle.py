"""Jobs' lifecycle on a real cluster: an abandoned read costs nothing, a named iteration
without consumers produces nothing new and is collected after ``job_gc_timeout_ms``, and a
finished one is remembered (reopening it reads nothing, with one warning)."""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import cloudpickle
import numpy as np
import pytest

import convoy as cv
from convoy.data.service import DispatcherConfig
from convoy.data.service._client.status import dispatcher_status
from convoy.data.service._worker.task import MAX_BUFFERED_BYTES
from convoy.testing import InProcessCluster, ProcessCluster

# Pipelines defined here run on worker processes, which cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

service = cv.data.service
DYNAMIC = service.ShardingPolicy.DYNAMIC
OFF = service.ShardingPolicy.OFF


def wait_for(condition: Callable[[], bool], timeout_s: float,
             what: str | Callable[[], str]) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` (said when it fails, if a
    function) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            said = what if isinstance(what, str) else what()
            raise AssertionError(f"timed out after {timeout_s} s waiting for {said}")
        time.sleep(0.05)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for process {pid}")


def big_rows(target: str, mode: Any = DYNAMIC, **kwargs: Any) -> cv.data.Dataset:
    """The measured trainer's pipeline: 16 KiB rows, 16 to a batch."""
    return (cv.data.Dataset.range(100_000)
            .map(lambda _: np.zeros(4096, np.float32)).batch(16)
            .apply(service.distribute(mode, target, **kwargs)))


def read_and_abandon(dataset: cv.data.Dataset, batches: int = 5) -> None:
    iterator = iter(dataset)
    for _ in range(batches):
        next(iterator)
    iterator.close()


def state_of(cluster: InProcessCluster) -> Any:
    return cluster.dispatcher._handlers.state


# ----- an abandoned read costs nothing -----------------------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", [DYNAMIC, OFF])
def test_abandoned_reads_give_the_workers_memory_back(mode: Any) -> None:
    """Four reads of 5 batches each, closed: the workers stop their tasks and drop their
    buffers (before, each read left 64 MiB buffered on every worker for 5 minutes).

    What the workers buffer is measured by their own accounting, as ``convoy status`` shows
    it. Their RSS is only bounded loosely: the allocator may keep the pages of the largest
    read's buffers, but not those of every abandoned read."""
    with ProcessCluster(num_workers=2) as cluster:
        pids = [worker.process.pid for worker in cluster.workers if worker.process]
        read_and_abandon(big_rows(cluster.target, mode))  # warms up: numpy, the pipeline
        time.sleep(0.5)
        baseline = [rss_mb(pid) for pid in pids]
        for _ in range(4):
            read_and_abandon(big_rows(cluster.target, mode))

        def status() -> dict[str, Any]:
            return dispatcher_status(cluster.dispatcher.address)

        def nothing_buffered() -> bool:
            now = status()
            return not now["jobs"] and all(
                not w["tasks"] and w["buffered_elements"] == w["buffered_bytes"] == 0
                for w in now["workers"])

        wait_for(nothing_buffered, 60, "every worker to report no task and nothing buffered "
                                       "(abandoned iterations stopped)")
        time.sleep(0.5)  # five heartbeats: a task still running would have buffered again
        assert nothing_buffered(), status()
        bound = 2 * MAX_BUFFERED_BYTES / 2**20  # left running, four reads hold 4 x 64 MiB
        wait_for(lambda: all(rss_mb(pid) - base < bound for pid, base in zip(pids, baseline)),
                 30, lambda: f"worker RSS within {bound:.0f} MB of {baseline} MB (now "
                             f"{[rss_mb(pid) for pid in pids]})")


@pytest.mark.timeout(60)
def test_an_abandoned_anonymous_iteration_leaves_no_task_anywhere() -> None:
    with InProcessCluster(num_workers=2) as cluster:
        for _ in range(3):
            read_and_abandon(big_rows(cluster.target))
        state = state_of(cluster)
        wait_for(lambda: not state.iterations, 10, "the released iterations to go")
        assert state.tasks == {} and state.jobs == {}
        wait_for(lambda: all(not w._running for w in cluster.workers), 10,
                 "the workers to drop their tasks")
        late = cluster.add_worker()  # joins afterwards: it is given nothing to fill
        time.sleep(0.5)
        assert not late._running and late._budget.used == 0


# ----- named iterations without consumers --------------------------------------------------------


@pytest.mark.timeout(60)
def test_a_named_iteration_without_consumers_pauses_and_resumes() -> None:
    with InProcessCluster(num_workers=1) as cluster:
        (worker,) = cluster.workers

        def named() -> cv.data.Dataset:
            return cv.data.Dataset.range(2000).apply(
                service.distribute(DYNAMIC, cluster.target, job_name="paused"))

        iterator = iter(named())
        first = [int(next(iterator)) for _ in range(3)]
        iterator.close()
        wait_for(lambda: all(s.task.paused for s in worker._running.values()), 10,
                 "the task to pause")
        late = cluster.add_worker()
        time.sleep(0.5)
        assert not late._running  # started only once the iteration has a consumer
        rest = [int(x) for x in named()]  # joins the same iteration: it goes on
        assert not any(s.task.paused for s in worker._running.values())
        assert len(first + rest) == len(set(first + rest)) and set(first) <= set(range(2000))


@pytest.mark.timeout(60)
def test_an_unfinished_named_iteration_is_collected_and_reopening_starts_afresh() -> None:
    """TensorFlow's rule (the iteration is collected after job_gc_timeout_ms without
    clients)."""
    config = DispatcherConfig(job_gc_timeout_ms=300, job_gc_check_interval_ms=100)
    with InProcessCluster(num_workers=1, dispatcher_config=config) as cluster:
        def named() -> cv.data.Dataset:
            return cv.data.Dataset.range(1000).apply(
                service.distribute(DYNAMIC, cluster.target, job_name="collected"))

        iterator = iter(named())
        assert [int(next(iterator)) for _ in range(3)] == [0, 1, 2]
        iterator.close()
        state = state_of(cluster)
        wait_for(lambda: not state.iterations, 10, "the idle iteration to be collected")
        assert "collected" in state.named_jobs  # the job stays, its iteration goes
        assert sorted(int(x) for x in named()) == list(range(1000))


# ----- finished iterations -----------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_reopening_a_finished_named_iteration_reads_nothing_and_warns_once() -> None:
    """TensorFlow keeps finished iterations: a consumer that opens one again reads nothing
    (its repetition is over); convoy says so once per job and repetition."""
    with InProcessCluster(num_workers=2) as cluster:
        def named(name: str) -> cv.data.Dataset:
            return cv.data.Dataset.range(50).apply(
                service.distribute(DYNAMIC, cluster.target, job_name=name))

        assert sorted(int(x) for x in named("once")) == list(range(50))
        state = state_of(cluster)
        (iteration,) = state.iterations.values()
        wait_for(lambda: iteration.finished, 10, "the iteration to finish")
        assert state.tasks == {}  # its tasks and splits are dropped at once
        with pytest.warns(RuntimeWarning, match=r"job 'once'.*set_epoch\(n\)"):
            assert list(named("once")) == []
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert list(named("once")) == []  # warned once
        # the next repetition (a persistent dataset's next iterator) reads it all again
        dataset = named("once")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert list(dataset) == []  # repetition 0, over
        assert sorted(int(x) for x in dataset) == list(range(50))
