"""The ClusterCoordinator's cancellation, resource release and lifetime, on real ``convoy
server`` processes: a failure cancels the functions still running (cooperatively at their next
variable operation, or by abandoning them after a grace period), dropped per-worker iterators
are freed on the workers and not rebuilt, there is one coordinator per strategy, and its
threads end when it is collected or shut down.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import uuid
import weakref

import cloudpickle
import numpy as np
import pytest

import convoy as cv
from convoy.distribute import _schedule_messages, _scheduler
from convoy.distribute._worker_context import worker_context
from convoy.distribute.coordinator import (
    DEFAULT_PIPELINING,
    experimental_get_current_worker_index,
)
from convoy.errors import CancelledError, InvalidArgumentError
from convoy.testing import TrainingCluster

# Functions defined here run on the workers, which cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster():
    with TrainingCluster(num_workers=2, num_ps=1) as training_cluster:
        yield training_cluster


@pytest.fixture
def make():
    """``make(cluster)`` -> (strategy, coordinator), shut down afterwards."""
    coordinators = []

    def build(cluster):
        strategy = cv.distribute.ParameterServerStrategy(cluster.resolver())
        coordinator = cv.distribute.ClusterCoordinator(strategy)
        coordinators.append(coordinator)
        return strategy, coordinator

    yield build
    for coordinator in coordinators:
        coordinator.shutdown()


def wait_until(condition, timeout_s=30.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def fail_soon():
    time.sleep(0.1)
    raise ValueError("boom from a scheduled function")


def where():
    time.sleep(0.05)  # long enough that both workers take functions
    return worker_context().task_index


def coordinator_threads(coordinator):
    prefix = coordinator._scheduler._name + "-"
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


# ===== cancellation ============================================================================

@pytest.mark.timeout(120)
def test_a_failure_cancels_a_function_running_at_its_next_variable_operation(cluster, make):
    strategy, coordinator = make(cluster)
    with strategy.scope():
        beats = cv.Variable(0, name="beats")

    def sleeper():
        while True:
            beats.read_value()  # a variable operation: where a cancelled function stops
            beats.assign_add(1)
            time.sleep(0.05)

    sleeping = coordinator.schedule(sleeper)
    wait_until(lambda: int(beats.numpy()) > 0, what="the sleeper")
    failed = coordinator.schedule(fail_soon)  # on another lane: the sleeper's Run is out
    started = time.monotonic()
    with pytest.raises(ValueError, match="boom"):
        coordinator.join()
    assert time.monotonic() - started < 10
    with pytest.raises(ValueError, match="boom"):
        failed.fetch()
    # stopped on its worker, which said so (not abandoned by the coordinator)
    with pytest.raises(CancelledError, match="scheduled function was cancelled"):
        sleeping.fetch()
    stopped_at = int(beats.numpy())
    time.sleep(0.3)
    assert int(beats.numpy()) == stopped_at
    # both workers take work again
    ran_on = coordinator.fetch([coordinator.schedule(where) for _ in range(16)])
    assert set(ran_on) == {0, 1}
    coordinator.join()


@pytest.mark.timeout(120)
def test_a_function_that_never_checks_is_abandoned_after_the_grace_period(
        cluster, make, monkeypatch):
    monkeypatch.setattr(_scheduler, "CANCEL_GRACE_S", 1.0)
    strategy, coordinator = make(cluster)
    with strategy.scope():
        started = cv.Variable(0, name="started")

    def forever():
        started.assign(1)
        threading.Event().wait()  # no variable operation: never sees its cancellation

    stuck = coordinator.schedule(forever)
    wait_until(lambda: int(started.numpy()) == 1, what="the stuck function")
    coordinator.schedule(fail_soon)
    began = time.monotonic()
    with pytest.raises(ValueError, match="boom"):
        coordinator.join()
    assert 1.0 <= time.monotonic() - began < 10
    with pytest.raises(CancelledError, match="earlier function failed"):
        stuck.fetch()
    # schedule, done and join do not wait for it; both workers take work again
    assert coordinator.done()
    ran_on = coordinator.fetch([coordinator.schedule(where) for _ in range(16)])
    assert set(ran_on) == {0, 1}
    coordinator.join()


@pytest.mark.timeout(120)
def test_shutdown_cancels_running_functions_and_ends_the_threads(cluster, make):
    strategy, coordinator = make(cluster)
    with strategy.scope():
        started = cv.Variable(0, name="started")

    def forever():
        started.assign(1)
        threading.Event().wait()

    stuck = coordinator.schedule(forever)
    wait_until(lambda: int(started.numpy()) == 1, what="the stuck function")
    queued = [coordinator.schedule(where) for _ in range(3)]
    assert coordinator_threads(coordinator)
    coordinator.shutdown()
    for result in [stuck, *queued]:
        try:
            result.fetch()  # one that ran before the shutdown keeps its result
        except CancelledError as error:
            assert "shut down" in str(error)
    with pytest.raises(CancelledError, match="shut down"):
        stuck.fetch()
    wait_until(lambda: not coordinator_threads(coordinator), what="the threads to end")
    with pytest.raises(cv.errors.FailedPreconditionError, match="shut down"):
        coordinator.schedule(where)
    # a new coordinator for the strategy works
    again = cv.distribute.ClusterCoordinator(strategy)
    assert again is not coordinator
    assert again.schedule(lambda: 7).fetch() == 7
    again.shutdown()


# ===== one function per worker at a time, the next sent ahead =================================

def worker_and_span(seconds):
    began = time.monotonic()
    time.sleep(seconds)
    return worker_context().task_index, began, time.monotonic()


@pytest.mark.timeout(120)
def test_one_function_runs_per_worker_and_none_waits_behind_a_long_one(cluster, make):
    strategy, coordinator = make(cluster)
    long = coordinator.schedule(worker_and_span, (4.0,))
    time.sleep(0.3)  # it runs
    started = time.monotonic()
    short = [coordinator.schedule(worker_and_span, (0.05,)) for _ in range(8)]
    ran = coordinator.fetch(short)
    # sent ahead behind the long one, a function is withdrawn for the free worker
    assert time.monotonic() - started < 3.0
    assert not long.done()
    long_worker = coordinator.fetch(long)[0]
    assert {worker for worker, _, _ in ran} == {1 - long_worker}
    # never two at once on a worker
    spans = sorted((began, ended) for _, began, ended in ran)
    assert all(began >= ended for (_, ended), (began, _) in zip(spans, spans[1:]))
    coordinator.join()


# ===== per-worker resources ====================================================================

def resource_counts(coordinator, num_workers=2):
    """{worker index: how many per-worker resources it holds}."""
    def count():
        time.sleep(0.05)
        return worker_context().task_index, len(worker_context().resources)

    counts = {}
    deadline = time.monotonic() + 30
    while len(counts) < num_workers:
        assert time.monotonic() < deadline, "a worker took no work"
        counts.update(coordinator.fetch([coordinator.schedule(count) for _ in range(8)]))
    return counts


@pytest.mark.timeout(120)
def test_dropped_iterators_are_freed_on_the_workers(cluster, make):
    _, coordinator = make(cluster)
    dataset = coordinator.create_per_worker_dataset(
        lambda: cv.data.Dataset.range(1_000_000).batch(1000).prefetch(4))
    before = resource_counts(coordinator)
    iterators = [iter(dataset) for _ in range(20)]
    for iterator in iterators:
        coordinator.schedule(lambda it: next(it), args=(iterator,))
    coordinator.join()
    assert resource_counts(coordinator) == {w: count + 20 for w, count in before.items()}
    del iterator, iterators
    gc.collect()
    wait_until(lambda: resource_counts(coordinator) == before, what="the iterators freed")
    # an iterator in use is kept; the dataset is kept while an iterator of it lives
    kept = iter(dataset)
    del dataset
    gc.collect()
    assert coordinator.schedule(lambda it: next(it).tolist()[:2], args=(kept,)).fetch() == [0, 1]
    assert resource_counts(coordinator) == {w: count + 1 for w, count in before.items()}


def _recording_generator(directory):
    """A generator that leaves a file in ``directory`` when it starts and another when it is
    closed, named by its worker, so the chief can see which generators are still open."""
    def generate():
        token = f"{experimental_get_current_worker_index()}-{uuid.uuid4().hex}"
        open(os.path.join(directory, f"open-{token}"), "w").close()
        try:
            yield from range(1_000_000)
        finally:
            open(os.path.join(directory, f"closed-{token}"), "w").close()
    return generate


def _generators(directory, state):
    """{worker index: how many generators are in ``state`` ("open" or "closed")}."""
    counts = {}
    for name in os.listdir(directory):
        if name.startswith(state + "-"):
            worker = int(name.split("-")[1])
            counts[worker] = counts.get(worker, 0) + 1
    return counts


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pipeline", ["plain", "map_prefetch"])
def test_dropped_iterators_close_their_generators_on_every_worker(cluster, make, tmp_path,
                                                                   pipeline):
    _, coordinator = make(cluster)
    directory = str(tmp_path)
    generate = _recording_generator(directory)

    def dataset_fn():
        dataset = cv.data.Dataset.from_generator(
            generate, output_signature=cv.data.TensorSpec((), np.int64))
        if pipeline == "map_prefetch":
            dataset = dataset.map(lambda x: x + 1).prefetch(2)
        return dataset

    dataset = coordinator.create_per_worker_dataset(dataset_fn)
    iterators = [iter(dataset) for _ in range(20)]

    def advance(*its):
        for it in its:
            next(it)
        time.sleep(0.05)  # long enough that both workers take functions
        return experimental_get_current_worker_index()

    ran_on = set()
    deadline = time.monotonic() + 30
    while ran_on != {0, 1}:
        assert time.monotonic() < deadline, "a worker took no work"
        ran_on.update(coordinator.fetch(
            [coordinator.schedule(advance, args=tuple(iterators)) for _ in range(8)]))
    assert _generators(directory, "open") == {0: 20, 1: 20}
    assert _generators(directory, "closed") == {}

    del iterators
    gc.collect()
    # the workers run anything: within a second every generator is closed on both
    assert set(coordinator.fetch([coordinator.schedule(where) for _ in range(16)])) == {0, 1}
    wait_until(lambda: _generators(directory, "closed") == {0: 20, 1: 20}, timeout_s=1.0,
               what=f"the generators closed (closed: {_generators(directory, 'closed')})")


class Payload:
    """An argument the chief can watch being collected."""


@pytest.mark.timeout(120)
def test_the_chief_keeps_no_argument_of_a_finished_function(cluster, make):
    # A lane waiting for work once held its last closures, and with them their arguments
    # (per-worker iterators the chief dropped stayed open until that lane ran again).
    _, coordinator = make(cluster)
    payloads = [Payload() for _ in range(8)]
    watched = [weakref.ref(payload) for payload in payloads]
    coordinator.fetch([coordinator.schedule(lambda p: 1, args=(p,)) for p in payloads])
    del payloads
    gc.collect()
    assert [ref() for ref in watched] == [None] * 8


@pytest.mark.timeout(120)
def test_a_restarted_worker_rebuilds_only_what_is_still_held(make):
    with TrainingCluster(num_workers=1, num_ps=1) as small:
        _, coordinator = make(small)
        dataset = coordinator.create_per_worker_dataset(lambda: cv.data.Dataset.range(100))
        kept = iter(dataset)
        dropped = [iter(dataset) for _ in range(5)]
        assert resource_counts(coordinator, 1) == {0: 7}
        del dropped
        gc.collect()
        wait_until(lambda: resource_counts(coordinator, 1) == {0: 2}, what="the frees")
        small.kill_task("worker", 0)
        small.start_task("worker", 0)
        # the new process gets the dataset and the iterator still held, nothing more
        assert resource_counts(coordinator, 1) == {0: 2}
        assert coordinator.schedule(lambda it: int(next(it)), args=(kept,)).fetch() == 0


# ===== one coordinator per strategy, living as long as it is used ===============================

@pytest.mark.timeout(120)
def test_one_coordinator_per_strategy_whose_threads_end_when_it_is_collected(cluster):
    strategy = cv.distribute.ParameterServerStrategy(cluster.resolver())
    coordinator = cv.distribute.ClusterCoordinator(strategy)
    assert cv.distribute.ClusterCoordinator(strategy) is coordinator
    assert cv.distribute.ClusterCoordinator(strategy=strategy,
                                            pipelining=DEFAULT_PIPELINING) is coordinator
    with pytest.raises(InvalidArgumentError, match="one coordinator per strategy"):
        cv.distribute.ClusterCoordinator(strategy, pipelining=DEFAULT_PIPELINING + 1)
    other = cv.distribute.ClusterCoordinator(cv.distribute.ParameterServerStrategy(
        cluster.resolver()))
    assert other is not coordinator
    iterator = iter(coordinator.create_per_worker_dataset(lambda: cv.data.Dataset.range(9)))
    assert coordinator.schedule(lambda it: int(next(it)), args=(iterator,)).fetch() == 0
    threads = coordinator_threads(coordinator)
    assert len(threads) >= 2  # a lane for each of two workers (one function at a time)
    result = coordinator.schedule(lambda: "kept")
    del coordinator, strategy, iterator
    gc.collect()
    wait_until(lambda: not any(t.is_alive() for t in threads), 10, "the threads to end")
    try:  # resolved either way: never left waiting
        assert result.fetch() == "kept"
    except CancelledError:
        pass
    assert other.schedule(lambda: 1).fetch() == 1
    other.shutdown()


@pytest.mark.timeout(60)
def test_bad_arguments_are_refused_at_once(cluster, make):
    strategy, coordinator = make(cluster)
    with pytest.raises(InvalidArgumentError, match="ParameterServerStrategy"):
        cv.distribute.ClusterCoordinator(object())
    ready = coordinator.schedule(lambda: 1)
    with pytest.raises(InvalidArgumentError, match=r"args\[1\].*RemoteValue"):
        coordinator.schedule(lambda a, b: a, args=(1, [ready]))
    with pytest.raises(InvalidArgumentError, match=r"kwargs\['x'\].*RemoteValue"):
        coordinator.schedule(lambda x: x, kwargs={"x": {"nested": ready}})
    with pytest.raises(TypeError, match="args must be a tuple"):
        coordinator.schedule(lambda x: x, args=5)
    with pytest.raises(TypeError, match="kwargs must be a dict"):
        coordinator.schedule(lambda x: x, kwargs=[("x", 1)])
    with pytest.raises(TypeError, match="dataset_fn"):
        coordinator.create_per_worker_dataset(42)
    assert coordinator.schedule(lambda a, b: a + b, args=[1, 2]).fetch() == 3
    assert ready.fetch() == 1
    with pytest.raises(cv.errors.FailedPreconditionError, match="on a worker"):
        cv.distribute.coordinator.experimental_get_current_worker_index()


# ===== RemoteValue.done() ======================================================================

def wait_for_file(path):
    deadline = time.monotonic() + 60
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return "released"


@pytest.mark.timeout(120)
def test_remote_value_done_once_the_function_finished(cluster, make, tmp_path):
    # as concurrent.futures.Future.done(): True once there is a value or an error
    _, coordinator = make(cluster)
    gate = tmp_path / "gate"
    waiting = coordinator.schedule(wait_for_file, args=(gate,))
    time.sleep(0.3)
    assert not waiting.done()
    gate.touch()
    wait_until(waiting.done, what="the released function to be done")
    assert waiting.fetch() == "released"
    failing = coordinator.schedule(fail_soon)
    with pytest.raises(ValueError, match="boom"):
        coordinator.join()
    assert failing.done()
    with pytest.raises(ValueError, match="boom"):
        failing.fetch()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("locked", [True, False], ids=["applied-locked", "applied"])
def test_an_instruction_the_scheduler_does_not_know_is_an_error(monkeypatch, locked):
    scheduler = _scheduler.Scheduler([], 1, "test-unknown-instruction")  # no worker: no lane
    try:
        if locked:  # an instruction no branch of the locked ladder names
            monkeypatch.setattr(scheduler._state, "apply", lambda event: ["not an instruction"])
        else:  # one the locked ladder passes on, but that the caller's ladder does not name
            monkeypatch.setattr(scheduler, "_apply_locked", lambda event: ["not an instruction"])
        with pytest.raises(TypeError, match="not an instruction"):
            scheduler._apply(_schedule_messages.Closed())
    finally:
        monkeypatch.undo()
        scheduler.close()
