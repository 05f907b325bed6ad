"""Scenarios of TensorFlow's ``tensorflow/python/distribute/coordinator/fault_tolerance_test.py``
(``fault_tolerance_test_base.py``), ported: workers and parameter servers killed (SIGKILL) and
restarted while a model trains.

Each test names the TensorFlow test it comes from. They share one cluster of their own (2
workers and 2 parameter servers, as ``MultiWorkerFaultToleranceTest``); every task killed is
started again before the next test. Each test makes its own strategy and coordinator, as
TensorFlow's ``setUp`` does. Downtimes are shorter than TensorFlow's, to keep the tests fast.

Scenarios that cannot apply, and why:

- ``testWorkerPreemptionErrorType``, ``testWorkerPreemptionErrorTypeWithPythonFunction``,
  ``testPSPreemptionErrorType``, ``testWorkerExecutionAfterPsFailureRaisesExpectedError`` and
  ``testClusterStateNotDisrupted``: they run functions on a remote device directly
  (``with ops.device("/job:worker/...")``); convoy runs functions on workers only through the
  coordinator (its worker and ps failures are the other tests).
- ``testAsyncWaitIsNoOp``: there is no eager executor to wait on.
- ``testTensorGotAfterWorkerFailure``'s remote tensors (``remote_value._values``): a
  RemoteValue holds its value in the coordinator, so only the ``get()`` half applies.
- ``SingleWorkerFaultToleranceTest`` and the coordination-service variants: the same
  scenarios on other cluster shapes or TensorFlow's coordination service.
"""

from __future__ import annotations

import gc
import sys
import threading
import time

import cloudpickle
import numpy as np
import pytest

import convoy as cv
from convoy.distribute import ParameterServerStrategy, _scheduler
from convoy.distribute._operations import Read
from convoy.distribute._store_clients import remote_store
from convoy.distribute.coordinator import ClusterCoordinator
from convoy.errors import (
    CancelledError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)
from convoy.testing import TrainingCluster

# Functions defined here run on the workers, which cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(180)

NUM_WORKERS, NUM_PS = 2, 2


@pytest.fixture(scope="module")
def cluster():
    with TrainingCluster(num_workers=NUM_WORKERS, num_ps=NUM_PS) as training_cluster:
        yield training_cluster


@pytest.fixture
def coordinator(cluster):
    """BaseFaultToleranceTest.setUp: a strategy and its coordinator; tearDown restarts what a
    test killed."""
    ps_processes = [cluster.servers[("ps", i)].process for i in range(NUM_PS)]
    coordinator = ClusterCoordinator(ParameterServerStrategy(cluster.resolver()))
    yield coordinator
    coordinator.shutdown()
    for (job, index), server in list(cluster.servers.items()):
        if server.process is None or server.process.poll() is not None:
            cluster.start_task(job, index)
    if ps_processes != [cluster.servers[("ps", i)].process for i in range(NUM_PS)]:
        reconnect_to_restarted_ps(cluster)


def ps_answers(address, index):
    """Whether the ps answers; its first call after it restarts fails (the stream to the
    old process is gone), so call until it answers."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            remote_store(address, index).execute([Read("no such variable")])
        except NotFoundError:
            return True
        except UnavailableError:
            time.sleep(0.05)
    return False


def reconnect_to_restarted_ps(cluster):
    """Make the first calls to the restarted ps of this process and of every worker, so that
    the next test starts on a cluster that answers."""
    addresses = list(enumerate(cluster.cluster["ps"]))
    assert all(ps_answers(address, index) for index, address in addresses)

    def on_worker():
        time.sleep(0.05)
        assert all(ps_answers(address, index) for index, address in addresses)
        return cv.distribute.coordinator.experimental_get_current_worker_index()

    coordinator = ClusterCoordinator(ParameterServerStrategy(cluster.resolver()))
    try:
        seen = set()
        while len(seen) < NUM_WORKERS:
            seen.update(coordinator.fetch([coordinator.schedule(on_worker) for _ in range(8)]))
    finally:
        coordinator.shutdown()


def restart(cluster, downtime_s, job):
    """BaseFaultToleranceTest._restart: kill task 0 of ``job``, start it after a while."""
    cluster.kill_task(job, 0)
    time.sleep(downtime_s)
    cluster.start_task(job, 0)


def restart_in_thread(cluster, downtime_s, job):
    failures = []

    def run():
        try:
            restart(cluster, downtime_s, job)
        except Exception as error:  # reported by the test, not lost in the thread
            failures.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, failures


def in_flight(coordinator):
    return coordinator._scheduler._state.in_flight


def wait_until(condition, timeout_s=60.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


# ----- the model ---------------------------------------------------------------------------------

def train_step(w, iterator, iterator2):
    x = np.squeeze(next(iterator)) @ w.read_value()
    x = np.squeeze(next(iterator2)) @ x
    x = np.random.uniform(size=(10, 10)).astype(np.float32) @ x
    w.assign_add(x / 1000)


def train_fn(w, iterations, do_infinite_step, iterator, iterator2):
    train_step(w, iterator, iterator2)
    while do_infinite_step.read_value():
        train_step(w, iterator, iterator2)
        time.sleep(0.01)
    iterations.assign_add(1)


class Model:
    """fault_tolerance_test_base.Model: a weight, a step counter and a switch that makes
    ``train_fn`` loop until it is turned off."""

    def __init__(self, coordinator):
        self.coordinator = coordinator
        self.strategy = coordinator.strategy
        with self.strategy.scope():
            self.w = cv.Variable(np.random.uniform(size=(10, 10)).astype(np.float32))
            self.iterations = cv.Variable(initial_value=0, dtype=np.int32)
            self.do_infinite_step = cv.Variable(False)
        self.rebuild_iterators()

    def rebuild_iterators(self, use_dataset_fn=True):
        strategy = self.strategy
        if use_dataset_fn:
            def dataset_fn():
                data = np.random.uniform(size=(10, 10)).astype(np.float32)
                return cv.data.Dataset.from_tensors([data]).repeat()

            def distribute_dataset_fn():
                return strategy.distribute_datasets_from_function(lambda _: dataset_fn())

            source = distribute_dataset_fn
        else:
            data = np.random.uniform(size=(10, 10)).astype(np.float32)
            source = cv.data.Dataset.from_tensors([data]).repeat()
        self.iterator = iter(self.coordinator.create_per_worker_dataset(source))
        self.iterator2 = iter(self.coordinator.create_per_worker_dataset(source))

    def schedule_training_functions(self, num_steps):
        with self.strategy.scope():
            for _ in range(num_steps):
                self.coordinator.schedule(train_fn, args=(
                    self.w, self.iterations, self.do_infinite_step, self.iterator,
                    self.iterator2))

    def join_training_functions(self):
        self.do_infinite_step.assign(False)
        self.coordinator.join()


def create_model_and_run_indefinitely(coordinator):
    model = Model(coordinator)
    model.do_infinite_step.assign(True)
    model.schedule_training_functions(10)
    # the workers run endless steps: at least one in flight on each, the rest queued
    wait_until(lambda: in_flight(coordinator) >= NUM_WORKERS, what="steps in flight")
    return model


# ----- the tests ---------------------------------------------------------------------------------

def test_cluster_coordinator_destroyed(cluster):
    # BaseFaultToleranceTest.testClusterCoordinatorDestroyed (_ensure_threads_closed)
    strategy = ParameterServerStrategy(cluster.resolver())
    coordinator = ClusterCoordinator(strategy)
    prefix = coordinator._scheduler._name + "-"
    assert coordinator.schedule(lambda: 1).fetch() == 1
    assert any(t.name.startswith(prefix) for t in threading.enumerate())
    coordinator = strategy = None
    gc.collect()
    wait_until(lambda: not any(t.name.startswith(prefix) for t in threading.enumerate()), 10,
               "the coordinator's threads to stop")


def test_worker_preemption_between_functions(cluster, coordinator):
    # BaseFaultToleranceTest.testWorkerPreemptionBetweenFunctions
    model = Model(coordinator)
    model.schedule_training_functions(2)
    model.join_training_functions()
    assert model.iterations.numpy() == 2
    restart(cluster, 1, "worker")
    model.schedule_training_functions(2)
    model.join_training_functions()
    assert model.iterations.numpy() == 4


def test_worker_replaced_at_its_address_between_functions(cluster, coordinator):
    # As testWorkerPreemptionBetweenFunctions, with no downtime to notice: the first Run
    # reaches the new process, which refuses it (it is not the process the coordinator saw)
    # rather than run a function whose per-worker iterators it lacks.
    model = Model(coordinator)
    model.schedule_training_functions(2)
    model.join_training_functions()
    restart(cluster, 0, "worker")
    model.schedule_training_functions(4)
    model.join_training_functions()
    assert model.iterations.numpy() == 6


def test_worker_preemption_midst_function(cluster, coordinator):
    # BaseFaultToleranceTest.testWorkerPreemptionMidstFunction
    model = Model(coordinator)
    model.do_infinite_step.assign(True)
    model.schedule_training_functions(4)
    wait_until(lambda: in_flight(coordinator) >= NUM_WORKERS, what="steps in flight")
    assert not coordinator.done()
    restart(cluster, 1, "worker")
    model.join_training_functions()
    assert model.iterations.numpy() >= 4


def normal_function():
    x = np.random.uniform(size=(2, 10))
    y = np.random.uniform(size=(10, 2))
    return float((x @ y).mean())


def error_function():
    x = np.random.uniform(size=(2, 10))
    y = np.random.uniform(size=(10, 2))
    if (x @ y).sum() > 0:  # tf.debugging.assert_non_positive
        raise InvalidArgumentError("assert_non_positive: the sum is positive")
    return x


def long_function():
    """Computes for a long while without touching a variable (and stops by itself after
    20 s, so that an abandoned one does not keep a worker busy)."""
    x = np.random.uniform(size=(100, 100))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        x = x @ np.random.uniform(size=(100, 100)) / 100
        time.sleep(0.01)
    return x


def test_one_worker_preemption_with_cancellation(cluster, coordinator, monkeypatch):
    # BaseFaultToleranceTest.testOneWorkerPreemptionWithCancellation
    monkeypatch.setattr(_scheduler, "CANCEL_GRACE_S", 0.5)
    for _ in range(3):
        coordinator.schedule(normal_function)
    long_function_result = coordinator.schedule(long_function)
    coordinator.schedule(error_function)
    time.sleep(1)  # let it run a couple of steps
    restart(cluster, 1, "worker")
    with pytest.raises(InvalidArgumentError):  # from error_function
        coordinator.join()
    with pytest.raises(CancelledError):  # cancelled after the user's error
        long_function_result.fetch()
    for _ in range(3):
        coordinator.schedule(normal_function)
    coordinator.join()


@pytest.mark.parametrize("use_dataset_fn", [True, False])
def test_handle_dataset_creation_failure(cluster, coordinator, use_dataset_fn):
    # BaseFaultToleranceTest.testHandleDatasetCreationFailureWithDatasetFn and
    # testHandleDatasetCreationFailureWithDataset
    model = Model(coordinator)
    thread, failures = restart_in_thread(cluster, 2, "worker")
    model.schedule_training_functions(3)
    model.rebuild_iterators(use_dataset_fn)
    model.schedule_training_functions(3)
    model.rebuild_iterators(use_dataset_fn)
    model.schedule_training_functions(3)
    model.join_training_functions()
    thread.join()
    assert not failures
    assert model.iterations.numpy() >= 3


def test_two_workers_preempted(cluster, coordinator):
    # BaseFaultToleranceTest.testTwoWorkersPreempted
    model = create_model_and_run_indefinitely(coordinator)
    assert not coordinator.done()
    cluster.kill_task("worker", 0)
    cluster.kill_task("worker", 1)
    time.sleep(1)
    cluster.start_task("worker", 0)
    cluster.start_task("worker", 1)
    model.join_training_functions()
    assert model.iterations.numpy() >= 10


def test_worker_continuous_failure(cluster, coordinator):
    # BaseFaultToleranceTest.testWorkerContinuousFailure
    model = create_model_and_run_indefinitely(coordinator)
    assert not coordinator.done()
    for _ in range(2):
        cluster.kill_task("worker", 0)
        time.sleep(1)
        cluster.start_task("worker", 0)
        time.sleep(1)
    model.join_training_functions()
    assert model.iterations.numpy() >= 10


def test_ps_failure_while_recovery_from_worker_failure(cluster, coordinator):
    # BaseFaultToleranceTest.testPSFailureWhileRecoveryFromWokerFailure
    model = create_model_and_run_indefinitely(coordinator)
    time.sleep(1)
    assert not coordinator.done()

    def kill(job):
        cluster.kill_task(job, 0)
        time.sleep(1)
        cluster.start_task(job, 0)

    killers = [threading.Thread(target=kill, args=(job,)) for job in ("worker", "ps")]
    for killer in killers:
        killer.start()
    for killer in killers:
        killer.join()
    # the restarted ps has lost its variables: NotFoundError where TensorFlow's is
    # InvalidArgumentError (an uninitialized variable)
    with pytest.raises((UnavailableError, InvalidArgumentError, NotFoundError)):
        model.join_training_functions()


def test_numpy_fetched_after_worker_failure(cluster, coordinator):
    # BaseFaultToleranceTest.testNumpyFetchedAfterWorkerFailure
    with coordinator.strategy.scope():
        v = cv.Variable(initial_value=0, dtype=np.int32)

    def worker_fn():
        return int(v.read_value()) + 1, int(v.read_value()) - 1

    remote_value = coordinator.schedule(worker_fn)
    assert remote_value.fetch() == (1, -1)  # before the worker is killed
    cluster.kill_task("worker", 0)
    assert remote_value.fetch() == (1, -1)  # and after


def test_value_got_after_worker_failure(cluster, coordinator):
    # BaseFaultToleranceTest.testTensorGotAfterWorkerFailure, its get() half
    with coordinator.strategy.scope():
        v = cv.Variable(initial_value=0, dtype=np.int32)

    def worker_fn():
        return int(v.read_value()) + 1, int(v.read_value()) - 1

    remote_value = coordinator.schedule(worker_fn)
    assert remote_value.get() == (1, -1)
    for i in range(NUM_WORKERS):
        cluster.kill_task("worker", i)
    assert remote_value.get() == (1, -1)  # after the workers are gone too


def test_fetch_from_ps_after_worker_failure(cluster, coordinator):
    # BaseFaultToleranceTest.testFetchFromPSAfterWorkerFailure: variables read while a worker
    # is up, down and restarting
    model = Model(coordinator)
    thread, failures = restart_in_thread(cluster, 1, "worker")

    def worker_up():
        process = cluster.servers[("worker", 0)].process
        return process is not None and process.poll() is None

    model.do_infinite_step.assign(True)
    model.schedule_training_functions(1)
    num_reads = num_reads_after_restart = 0
    worker_has_stopped = False
    # until a few reads after the worker is back, or a fixed number of reads
    while num_reads_after_restart <= 5 and num_reads < 200:
        up = worker_up()
        worker_has_stopped |= not up
        if up and worker_has_stopped:
            num_reads_after_restart += 1
        model.join_training_functions()
        started = time.monotonic()
        while time.monotonic() < started + 0.1:
            model.iterations.read_value()
        num_reads += 1
        model.do_infinite_step.assign(True)  # another epoch
        model.schedule_training_functions(1)
    model.join_training_functions()
    thread.join()
    assert not failures and worker_has_stopped


def run_and_kill_ps_task(cluster, coordinator):
    create_model_and_run_indefinitely(coordinator)
    cluster.kill_task("ps", 0)
    wait_until(lambda: coordinator._scheduler._state.error is not None, 60,
               "the ps failure to be seen")


def test_join_raises_unavailable_error_at_ps_failure(cluster, coordinator):
    # BaseFaultToleranceTest.testJoinRaisesUnavailableErrorAtPsFailure
    run_and_kill_ps_task(cluster, coordinator)
    with pytest.raises((UnavailableError, NotFoundError, FailedPreconditionError)):
        coordinator.join()


def test_schedule_raises_unavailable_error_at_ps_failure(cluster, coordinator):
    # BaseFaultToleranceTest.testScheduleRaisesUnavailableErrorAtPsFailure
    run_and_kill_ps_task(cluster, coordinator)
    with pytest.raises((UnavailableError, NotFoundError, FailedPreconditionError)):
        coordinator.schedule(lambda: None)
