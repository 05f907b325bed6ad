"""``strategy.recover(manager)`` on real processes: a parameter server is SIGKILLed mid-training,
``join`` raises, the ps comes back (at its address, or at a new one the cluster resolver gives)
and recover restores every variable, slot and the optimizer's iterations from the latest
checkpoint; the same coordinator, variables and optimizer train on."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

import convoy as cv
from convoy.errors import FailedPreconditionError, UnavailableError
from convoy.testing import TrainingCluster, free_port


class _Run:
    """A strategy, coordinator, two variables (one on each ps), a placed torch module, a
    dynamic embedding (rows on both ps), an Adagrad optimizer and a checkpoint manager."""

    def __init__(self, resolver, directory):
        self.strategy = cv.distribute.ParameterServerStrategy(resolver)
        self.coordinator = cv.distribute.ClusterCoordinator(self.strategy)
        with self.strategy.scope():
            self.weights = cv.Variable(np.zeros(4, np.float32), name="weights")
            self.bias = cv.Variable(np.float32(0), name="bias")
            torch.manual_seed(0)
            self.model = cv.torch.place(torch.nn.Linear(4, 1))
            self.embedding = cv.torch.place(cv.torch.DynamicEmbedding(3, seed=1))
            self.optimizer = cv.optimizers.Adagrad(0.1)
        self.steps = 0  # each step makes rows of new ids
        self.checkpoint = cv.train.Checkpoint(weights=self.weights, bias=self.bias,
                                              model=self.model, embedding=self.embedding,
                                              optimizer=self.optimizer)
        self.manager = cv.train.CheckpointManager(self.checkpoint, directory)

    def train(self, steps):
        weights, bias, model, optimizer = self.weights, self.bias, self.model, self.optimizer
        embedding = self.embedding

        def step(i):
            model(torch.full((2, 4), float(i))).sum().backward()
            embedding(torch.tensor([i, i + 1000, i + 2000])).sum().backward()
            optimizer.apply_gradients([(np.full(4, i % 3 + 1, np.float32), weights),
                                       (np.float32(-1), bias), *model.gradients(),
                                       *embedding.gradients()])

        first, self.steps = self.steps, self.steps + steps
        for i in range(first, first + steps):
            self.coordinator.schedule(step, args=(i,))
        self.coordinator.join()

    def state(self, path):
        """Every tensor a checkpoint written now holds (variables, slots, iterations)."""
        return load_file(self.checkpoint.write(path))


def assert_same(actual, expected):
    assert sorted(actual) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(actual[name], value, err_msg=name)


def lose_ps(run, cluster):
    """Kill ps 1 and see the coordinator fail."""
    cluster.kill_task("ps", 1)
    with pytest.raises(UnavailableError):
        run.train(5)


def check_recovery(run, tmp_path, saved):
    """After recover: the checkpoint's values (the dynamic table holds the checkpoint's rows
    alone, on both ps), and training goes on with the same objects."""
    assert_same(run.state(tmp_path / "after"), saved)
    [ids] = [value for name, value in saved.items() if name.endswith("table.ids")]
    assert ids.size and run.embedding.size() == ids.size
    iterations = int(run.optimizer.iterations.numpy())
    run.train(4)
    assert int(run.optimizer.iterations.numpy()) == iterations + 4
    assert float(run.bias.numpy()) > float(saved["bias"])


@pytest.mark.timeout(180)
def test_recover_a_ps_restarted_at_its_address(tmp_path):
    with TrainingCluster(num_workers=2, num_ps=2) as cluster:
        run = _Run(cluster.resolver(), tmp_path / "ckpt")
        try:
            assert run.bias.device.endswith("task:1/device:CPU:0")
            with pytest.raises(FailedPreconditionError, match="has none yet"):
                run.strategy.recover(run.manager)
            run.train(6)
            path = run.manager.save()
            saved = run.state(tmp_path / "saved")
            assert int(saved["optimizer/iterations"]) == 6 and any(".slots/" in k for k in saved)
            run.train(3)  # updates after the checkpoint: lost with the ps
            lose_ps(run, cluster)
            cluster.start_task("ps", 1)
            assert run.strategy.recover(run.manager, timeout_s=60) == path
            check_recovery(run, tmp_path, saved)
        finally:
            run.coordinator.shutdown()


@pytest.mark.timeout(180)
def test_recover_a_ps_at_a_new_address_from_the_resolver(tmp_path, monkeypatch):
    with TrainingCluster(num_workers=2, num_ps=2) as cluster:
        def tf_config():
            monkeypatch.setenv("TF_CONFIG", json.dumps(
                {"cluster": cluster.cluster, "task": {"type": "chief", "index": 0}}))

        tf_config()
        run = _Run(cv.distribute.cluster_resolver.TFConfigClusterResolver(), tmp_path / "ckpt")
        try:
            run.train(6)
            run.manager.save()
            saved = run.state(tmp_path / "saved")
            lose_ps(run, cluster)
            with pytest.raises(UnavailableError, match="ps:1 at"):  # not back yet
                run.strategy.recover(run.manager, timeout_s=1)
            cluster.cluster["ps"][1] = f"localhost:{free_port()}"
            cluster.start_task("ps", 1)
            tf_config()
            run.strategy.recover(run.manager, timeout_s=60)
            assert run.strategy.cluster_spec.task_address("ps", 1) == cluster.cluster["ps"][1]
            check_recovery(run, tmp_path, saved)
        finally:
            run.coordinator.shutdown()
