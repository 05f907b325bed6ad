"""Dynamic embedding tables on real ``convoy server`` processes (2 ps, 2 workers): rows made
on first lookup on the ps their id hashes to, the same row whoever makes it and however
often, training in scheduled functions, eviction, checkpoints across ps counts and into an
unplaced model, a worker killed mid-step, bad ids, and the tables in ``convoy status``."""

from __future__ import annotations

import sys
import time

import cloudpickle
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import convoy as cv
from convoy.cli._status import render_cluster, training_status
from convoy.distribute._dynamic_rows import RowInitializer
from convoy.testing import TrainingCluster

cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.slow

DIM, SEED = 8, 1234


class Recommender(nn.Module):
    def __init__(self, **table):
        super().__init__()
        self.bag = cv.torch.DynamicEmbeddingBag(DIM, mode="mean", seed=SEED, **table)
        self.head = nn.Linear(DIM, 1)

    def forward(self, ids):
        return self.head(self.bag(ids)).squeeze(-1)


def make_batch(step, rows=1000):
    """Bags of 4 hashed ids; the label is 1 when their hidden preferences add up above 0."""
    preference = np.random.default_rng(7).standard_normal(rows)
    rng = np.random.default_rng(step)
    index = rng.integers(0, rows, (64, 4))
    ids = (index.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) >> np.uint64(1))
    return ids.astype(np.int64), (preference[index].sum(1) > 0).astype(np.float32)


@pytest.fixture(scope="module")
def cluster():
    with TrainingCluster(num_workers=2, num_ps=2) as training_cluster:
        yield training_cluster


@pytest.fixture
def make(cluster):
    coordinators = []

    def build(on=cluster, optimizer=lambda: cv.optimizers.Adam(0.05), **table):
        strategy = cv.distribute.ParameterServerStrategy(on.resolver())
        with strategy.scope():
            torch.manual_seed(0)
            model = cv.torch.place(Recommender(**table))
            made = optimizer()
        coordinator = cv.distribute.ClusterCoordinator(strategy)
        coordinators.append(coordinator)
        return coordinator, model, made

    yield build
    for coordinator in coordinators:
        coordinator.shutdown()


def initial_rows(ids):
    return RowInitializer(seed=SEED)(np.asarray(ids, np.int64), DIM).astype(np.float32)


@pytest.mark.timeout(180)
def test_a_placed_dynamic_table_trains_in_scheduled_functions(make):
    coordinator, model, optimizer = make()
    table = model.bag.table
    assert {shard.store.device for shard in table.shards} == {
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
    seen = np.unique(np.concatenate([make_batch(i)[0].reshape(-1) for i in range(200)]))
    np.testing.assert_array_equal(table.keys(), seen)  # each made once, where first looked up
    assert all(stats["rows"] > 0.3 * seen.size for stats in table.stats())  # on both ps
    ids, labels = make_batch(10_000)  # held out, predicted on the chief
    with torch.no_grad():
        accuracy = ((model(torch.from_numpy(ids)) > 0).float().numpy() == labels).mean()
    assert accuracy > 0.75


@pytest.mark.timeout(120)
def test_rows_are_the_same_whoever_makes_them_and_however_often(make):
    coordinator, model, _ = make()
    table = model.bag.table
    ids = np.array([3, 1 << 40, 2**63 - 1, 77, 78, 79])

    def look_up(ids):
        return table.lookup(ids)

    on_workers = [coordinator.schedule(look_up, args=(ids,)) for _ in range(8)]  # concurrent
    coordinator.join()
    for result in on_workers:
        np.testing.assert_array_equal(result.fetch(), initial_rows(ids))
    np.testing.assert_array_equal(table.lookup(ids[::-1]), initial_rows(ids[::-1]))
    assert table.size() == ids.size


@pytest.mark.timeout(120)
def test_two_workers_making_the_same_ids_at_once_agree_on_one_row_each(make, cluster):
    coordinator, model, _ = make()
    table = model.bag.table
    fresh = np.arange(10_000, 30_000)

    def look_up(part):
        rows = []
        for chunk in np.array_split(fresh[part::2], 20) + np.array_split(fresh, 20):
            rows.append(table.lookup(chunk))
        return len(rows)

    results = [coordinator.schedule(look_up, args=(part,)) for part in (0, 1, 0, 1)]
    coordinator.join()
    assert [r.fetch() for r in results] == [40] * 4
    np.testing.assert_array_equal(table.keys(), fresh)
    np.testing.assert_array_equal(table.export()[1], initial_rows(fresh))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("eviction", ["lru", "lfu"])
def test_eviction_at_max_rows_on_the_parameter_servers(make, cluster, eviction):
    _, model, _ = make(max_rows=1000, eviction=eviction)  # 500 on each ps
    table = model.bag.table
    table.lookup(np.arange(400))
    for _ in range(3):
        table.lookup(np.arange(50))  # used recently and often
    for first in (1000, 1100, 1200, 1300, 2000, 2100, 2200, 2300):
        table.lookup(np.arange(first, first + 100))
    assert 800 <= table.size() <= 1000
    kept = set(table.keys().tolist())
    assert set(range(50)) <= kept and set(range(2000, 2400)) <= kept
    assert sum(stats["evictions"] for stats in table.stats()) == 1200 - table.size()
    gone = sorted(set(range(400)) - kept)
    assert gone
    np.testing.assert_array_equal(table.lookup(np.array(gone[:1])), initial_rows(gone[:1]))
    status = training_status(cluster.cluster)
    text = render_cluster(status)
    assert "DYNAMIC TABLE" in text and "dynamic tables" in text
    tables = [t for task in status["tasks"] for t in task.get("tables", ())
              if t["name"] == table.shards[0].key]
    assert sum(t["rows"] for t in tables) == table.size()


@pytest.mark.timeout(240)
def test_checkpoints_restore_across_ps_counts_and_into_an_unplaced_model(make, tmp_path):
    coordinator, model, optimizer = make(optimizer=lambda: cv.optimizers.Adagrad(0.1))

    def step(ids, labels):
        F.binary_cross_entropy_with_logits(model(torch.from_numpy(ids)),
                                           torch.from_numpy(labels)).backward()
        optimizer.apply_gradients(model.gradients())

    for i in range(20):
        coordinator.schedule(step, args=make_batch(i))
    coordinator.join()
    path = cv.train.Checkpoint(model=model, optimizer=optimizer).save(tmp_path / "ckpt")
    saved = model.bag.table.state()
    assert set(saved["slots"]) == {"accumulator"}
    ids = torch.from_numpy(make_batch(999)[0])
    with torch.no_grad():
        expected = model(ids)
    with TrainingCluster(num_workers=1, num_ps=3) as three:
        _, restored, again = make(on=three, optimizer=lambda: cv.optimizers.Adagrad(0.1))
        assert len(restored.bag.table.shards) == 3
        cv.train.Checkpoint(model=restored, optimizer=again).restore(path)
        state = restored.bag.table.state()
        np.testing.assert_array_equal(state["ids"], saved["ids"])
        np.testing.assert_array_equal(state["rows"], saved["rows"])
        np.testing.assert_array_equal(state["slots"]["accumulator"],
                                      saved["slots"]["accumulator"])
        with torch.no_grad():
            torch.testing.assert_close(restored(ids[:5]), expected[:5])
    serving = Recommender()  # unplaced, for serving
    cv.train.Checkpoint(model=serving).restore(path)
    np.testing.assert_array_equal(serving.bag.export()[1], saved["rows"])
    with torch.no_grad():
        torch.testing.assert_close(serving(ids), expected)


@pytest.mark.timeout(180)
def test_a_worker_killed_mid_step_leaves_each_row_once_or_not_at_all(make, cluster):
    coordinator, model, _ = make()
    table = model.bag.table
    start = 5_000_000

    def make_rows(first):
        for i in range(200):
            table.lookup(np.arange(first + i * 500, first + (i + 1) * 500))
            time.sleep(0.01)

    coordinator.schedule(make_rows, args=(start,))
    deadline = time.monotonic() + 60
    while table.size() < 1000:
        assert time.monotonic() < deadline, "rows made by the scheduled function"
        time.sleep(0.05)
    cluster.kill_task("worker", 0)
    cluster.kill_task("worker", 1)
    try:
        keys = table.keys()
        assert np.unique(keys).size == keys.size
        np.testing.assert_array_equal(table.export()[1], initial_rows(keys))
    finally:
        cluster.start_task("worker", 0)
        cluster.start_task("worker", 1)


@pytest.mark.timeout(120)
def test_bad_ids_from_a_worker_get_a_clear_error(make):
    coordinator, model, _ = make()

    def look_up(ids):
        return model(torch.from_numpy(ids))

    with pytest.raises(cv.errors.InvalidArgumentError, match="ids must be non-negative"):
        coordinator.schedule(look_up, args=(np.array([[1, -2]]),)).fetch()
    with pytest.raises(cv.errors.InvalidArgumentError, match="must be integers"):
        model.bag.table.lookup(np.array([0.5]))


@pytest.mark.timeout(120)
def test_place_moves_a_table_made_outside_the_scope_with_its_rows(cluster):
    model = Recommender()
    ids = np.array([5, 1 << 45])
    before = model.bag.table.lookup(ids)
    strategy = cv.distribute.ParameterServerStrategy(cluster.resolver())
    with strategy.scope():
        cv.torch.place(model)
    assert {shard.store.device for shard in model.bag.table.shards} == {
        f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in (0, 1)}
    np.testing.assert_array_equal(model.bag.table.lookup(ids), before)
    assert model.bag.size() == 2


@pytest.mark.timeout(300)
def test_the_dlrm_example_trains_to_a_held_out_auc_well_above_chance():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "dynamic_embeddings.py"
    spec = importlib.util.spec_from_file_location("dynamic_embeddings_example", path)
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example  # its step functions go to the workers by value
    spec.loader.exec_module(example)
    cloudpickle.register_pickle_by_value(example)
    assert example.train() > 0.65
