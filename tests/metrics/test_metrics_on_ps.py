"""cv.metrics under strategy.scope() on real ``convoy server`` processes: the state lives on
one ps, scheduled functions on the workers update it at once without losing an update, the
chief reads the result, and a metric made inside a scheduled function lives on its worker."""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pytest

import convoy as cv
from convoy.distribute.partitioners import FixedShardsPartitioner

# Functions defined here run on the workers, which cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def make(training_cluster):
    coordinators = []

    def build(partitioner=None):
        strategy = cv.distribute.ParameterServerStrategy(training_cluster.resolver(), partitioner)
        coordinator = cv.distribute.ClusterCoordinator(strategy)
        coordinators.append(coordinator)
        return strategy, coordinator

    yield build
    for coordinator in coordinators:
        coordinator.shutdown()


def batch(step):
    rng = np.random.default_rng(step)
    y_true = rng.integers(0, 2, 32).astype(np.float32)
    y_pred = np.clip(y_true * 0.3 + rng.random(32).astype(np.float32) * 0.7, 0, 1)
    return y_true, y_pred, rng.random(32).astype(np.float32)


@pytest.mark.timeout(120)
def test_metrics_updated_on_workers_are_read_on_the_chief(make, tmp_path):
    # A partitioner that would split every variable: a metric's state is never split.
    strategy, coordinator = make(FixedShardsPartitioner(2))
    with strategy.scope():
        auc = cv.metrics.AUC(num_thresholds=50)
        accuracy = cv.metrics.BinaryAccuracy()
        loss = cv.metrics.Mean(name="loss")
        seen = cv.metrics.Sum(name="seen")
    for metric in (auc, accuracy, loss, seen):
        devices = {v.device for v in metric.variables}
        assert len(devices) == 1 and devices.pop().startswith("/job:ps/"), metric
        assert all(isinstance(v, cv.Variable) for v in metric.variables)

    def step(index):
        y_true, y_pred, weight = batch(index)
        auc.update_state(y_true, y_pred, sample_weight=weight)
        accuracy.update_state(y_true, y_pred)
        loss.update_state(np.abs(y_true - y_pred), sample_weight=weight)
        seen.update_state(np.ones(32, np.float32))
        return index

    steps = 60
    values = [coordinator.schedule(step, args=(i,)) for i in range(steps)]
    coordinator.join()
    assert sorted(v.fetch() for v in values) == list(range(steps))

    local = [cv.metrics.AUC(num_thresholds=50), cv.metrics.BinaryAccuracy(), cv.metrics.Mean()]
    for i in range(steps):
        y_true, y_pred, weight = batch(i)
        local[0].update_state(y_true, y_pred, sample_weight=weight)
        local[1].update_state(y_true, y_pred)
        local[2].update_state(np.abs(y_true - y_pred), sample_weight=weight)
    assert seen.result() == steps * 32  # exact: no update lost between the workers
    # the weighted positives, summed in another order
    np.testing.assert_allclose(auc.true_positives.numpy() + auc.false_negatives.numpy(),
                               local[0].true_positives.numpy()
                               + local[0].false_negatives.numpy(), rtol=1e-6)
    for remote, here in zip((auc, accuracy, loss), local):
        np.testing.assert_allclose(remote.result(), here.result(), rtol=1e-5)

    path = cv.train.Checkpoint(metrics=[auc, loss]).save(tmp_path / "ckpt")
    expected = auc.result(), loss.result()
    auc.reset_state()
    assert auc.result() == 0.0 and not auc.true_positives.numpy().any()
    loss.reset_state()
    cv.train.Checkpoint(metrics=[auc, loss]).restore(path).assert_consumed()
    assert (auc.result(), loss.result()) == expected


@pytest.mark.timeout(120)
def test_a_metric_made_in_a_scheduled_function_lives_on_its_worker(make):
    _, coordinator = make()

    def evaluate(index):
        metric = cv.metrics.AUC(num_thresholds=20)
        y_true, y_pred, _ = batch(index)
        metric.update_state(y_true, y_pred)
        return metric.variables[0].device, metric.result()

    device, result = coordinator.schedule(evaluate, args=(3,)).fetch()
    assert device.startswith("/job:worker/")
    here = cv.metrics.AUC(num_thresholds=20)
    y_true, y_pred, _ = batch(3)
    here.update_state(y_true, y_pred)
    assert result == here.result()
