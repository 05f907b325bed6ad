"""cv.torch.place on real ``convoy server`` processes (2 ps, 2 workers): a placed module
trains in scheduled functions, each step pulls once and pushes once per parameter server,
and a checkpoint restores into a cluster with another number of parameter servers."""

from __future__ import annotations

import json
import sys

import cloudpickle
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import convoy as cv
from convoy.distribute.partitioners import FixedShardsPartitioner
from convoy.testing import TrainingCluster

# Functions defined here run on the workers, which cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROWS, DIM = 1000, 8


class Recommender(nn.Module):
    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(ROWS, DIM, mode="mean")
        self.head = nn.Linear(DIM, 1)

    def forward(self, ids):
        return self.head(self.bag(ids)).squeeze(-1)


def make_batch(step):
    """Bags of 4 ids; the label is 1 when their hidden preferences add up above 0."""
    preference = np.random.default_rng(7).standard_normal(ROWS)
    rng = np.random.default_rng(step)
    ids = rng.integers(0, ROWS, (64, 4))
    return ids, (preference[ids].sum(1) > 0).astype(np.float32)


@pytest.fixture
def make(training_cluster):
    coordinators = []

    def build(shards=2, on=training_cluster):
        strategy = cv.distribute.ParameterServerStrategy(on.resolver(),
                                                         FixedShardsPartitioner(shards))
        with strategy.scope():
            torch.manual_seed(0)
            model = cv.torch.place(Recommender())
            optimizer = cv.optimizers.Adam(0.05)
        coordinator = cv.distribute.ClusterCoordinator(strategy)
        coordinators.append(coordinator)
        return coordinator, model, optimizer

    yield build
    for coordinator in coordinators:
        coordinator.shutdown()


@pytest.mark.timeout(120)
def test_a_placed_module_trains_in_scheduled_functions(make):
    coordinator, model, optimizer = make()
    assert isinstance(model.bag.weight, torch.Tensor)  # read from the ps, on the chief
    table = model.variables[0]
    assert isinstance(table, cv.distribute.ShardedVariable) and len(table.variables) == 2
    assert {v.device for v in table.variables} == {
        f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in (0, 1)}

    def step(ids, labels):
        loss = F.binary_cross_entropy_with_logits(model(torch.from_numpy(ids)),
                                                  torch.from_numpy(labels))
        loss.backward()
        optimizer.apply_gradients(model.gradients())
        return loss.item()

    losses = [coordinator.schedule(step, args=make_batch(i)) for i in range(200)]
    coordinator.join()
    losses = [r.fetch() for r in losses]
    assert np.mean(losses[-20:]) < np.mean(losses[:20]) * 0.7
    assert int(optimizer.iterations.numpy()) == 200
    ids, labels = make_batch(10_000)  # held out, predicted on the chief
    with torch.no_grad():
        accuracy = ((model(torch.from_numpy(ids)) > 0).float().numpy() == labels).mean()
    assert accuracy > 0.75


@pytest.mark.timeout(60)
def test_a_placed_module_is_pickled_again_only_once_it_changed(make):
    _, model, _ = make()
    first = cloudpickle.loads(cloudpickle.dumps(model))
    assert cloudpickle.loads(cloudpickle.dumps(model)) is first  # what a worker reuses
    assert type(first) is type(model) and first.training
    model.eval()
    evaluating = cloudpickle.loads(cloudpickle.dumps(model))
    assert evaluating is not first and not evaluating.training
    model.temperature = 2.0
    assert cloudpickle.loads(cloudpickle.dumps(model)).temperature == 2.0
    ids = torch.from_numpy(make_batch(0)[0])
    with torch.no_grad():
        torch.testing.assert_close(evaluating(ids), model(ids))


def count_messages(step, ps, ids, labels):
    """Runs ``step`` on a worker, counting the operation lists this process sends to each
    parameter server during the forward and after it: {"pull ps0": n, "push ps1": n, ...}."""
    from convoy.distribute._store_clients import remote_store

    stores = [remote_store(address, i) for i, address in enumerate(ps)]
    before = [store.lists_sent for store in stores]
    forwarded = []
    step(ids, labels, lambda: forwarded.extend(store.lists_sent for store in stores))
    after = [store.lists_sent for store in stores]
    counts = {}
    for i in range(len(stores)):
        counts[f"pull ps{i}"] = forwarded[i] - before[i]
        counts[f"push ps{i}"] = after[i] - forwarded[i]
    return counts


@pytest.mark.timeout(120)
def test_one_pull_and_one_push_per_parameter_server_per_step(make, training_cluster):
    coordinator, model, optimizer = make()

    def step(ids, labels, forward_done):
        loss = F.binary_cross_entropy_with_logits(model(torch.from_numpy(ids)),
                                                  torch.from_numpy(labels))
        forward_done()
        loss.backward()
        optimizer.apply_gradients(model.gradients())

    ps = training_cluster.cluster["ps"]
    for i in range(6):  # one at a time: nothing else on the worker sends meanwhile
        counts = coordinator.schedule(count_messages, args=(step, ps, *make_batch(i))).fetch()
        assert counts == {"pull ps0": 1, "pull ps1": 1, "push ps0": 1, "push ps1": 1}


@pytest.mark.timeout(120)
def test_gradients_not_taken_are_released_when_the_scheduled_function_ends(make, tmp_path):
    coordinator, model, _ = make()
    report = str(tmp_path / "report.json")

    def forget(ids):
        import json

        import convoy.torch._step as stepping
        from convoy.distribute._worker_calls import current_call

        state = stepping.local.state
        model(torch.from_numpy(ids)).sum().backward()  # and no gradients()
        held = sum(len(grads) for grads in state.grads.values())

        def after_place_released():  # added after the module's own: runs after it
            with open(report, "w") as file:
                json.dump([held, len(state.grads), state.call is None], file)

        current_call().on_finish(after_place_released)

    coordinator.schedule(forget, args=(make_batch(0)[0],)).fetch()
    with open(report) as file:
        assert json.load(file) == [3, 0, True]  # the rows, the head's weight and bias: freed


@pytest.mark.timeout(180)
def test_checkpoint_restores_into_another_number_of_parameter_servers(make, tmp_path):
    coordinator, model, optimizer = make()

    def step(ids, labels):
        F.binary_cross_entropy_with_logits(model(torch.from_numpy(ids)),
                                           torch.from_numpy(labels)).backward()
        optimizer.apply_gradients(model.gradients())

    for i in range(20):
        coordinator.schedule(step, args=make_batch(i))
    coordinator.join()
    path = cv.train.Checkpoint(model=model, optimizer=optimizer).save(tmp_path / "ckpt")
    ids = torch.from_numpy(make_batch(999)[0])
    with torch.no_grad():
        expected = model(ids)
    with TrainingCluster(num_workers=1, num_ps=3) as three:
        _, restored, again = make(shards=3, on=three)
        table = restored.variables[0]
        assert len(table.variables) == 3
        assert len({v.device for v in table.variables}) == 3
        cv.train.Checkpoint(model=restored, optimizer=again).restore(path).assert_consumed()
        with torch.no_grad():
            torch.testing.assert_close(restored(ids), expected)
        assert int(again.iterations.numpy()) == 20


@pytest.mark.timeout(120)
def test_a_placed_module_checkpoint_restores_into_the_module_unplaced(make, tmp_path):
    _, model, optimizer = make()
    path = cv.train.Checkpoint(model=model, optimizer=optimizer).save(tmp_path / "ckpt")
    serving = Recommender()  # made outside any scope: for serving in one process
    cv.train.Checkpoint(model=serving).restore(path).expect_partial()  # slots unused
    ids = torch.from_numpy(make_batch(3)[0])
    with torch.no_grad():
        torch.testing.assert_close(serving(ids), model(ids))
    torch.testing.assert_close(serving.bag.weight.detach(), model.bag.weight)
