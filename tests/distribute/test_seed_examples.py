"""The code examples of TensorFlow's ClusterCoordinator API page and ParameterServerStrategyV2
docstrings, ported to convoy (``tf`` -> ``cv``, ``@tf.function`` dropped), with their
assertions.

Where an example uses something convoy does not offer (``tf.Module``, ``tf.GradientTape``),
the closest equivalent is written and a comment says so; the training-loop example runs
twice, with plain variables and as written, with a PyTorch module placed by
``cv.torch.place`` and ``cv.metrics``. All tests share one cluster of 3 ps and 2
workers (the placement example needs 3 ps).
"""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import cloudpickle
import numpy as np
import pytest
import torch

import convoy as cv
from convoy.distribute.cluster_resolver import TFConfigClusterResolver
from convoy.errors import FailedPreconditionError, InvalidArgumentError
from convoy.testing import TrainingCluster, free_port

# Functions defined here run on the workers, which cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

NUM_PS = 3


@pytest.fixture(scope="module")
def cluster():
    with TrainingCluster(num_workers=2, num_ps=NUM_PS) as training_cluster:
        yield training_cluster


@pytest.fixture
def make():
    """``make(partitioner=None)`` -> (strategy, coordinator); coordinators are shut down after."""
    coordinators = []

    def build(cluster, variable_partitioner=None):
        strategy = cv.distribute.experimental.ParameterServerStrategy(
            cluster_resolver=cluster.resolver(), variable_partitioner=variable_partitioner)
        coordinator = cv.distribute.experimental.coordinator.ClusterCoordinator(
            strategy=strategy)
        coordinators.append(coordinator)
        return strategy, coordinator

    build.adopt = lambda coordinator: coordinators.append(coordinator) or coordinator
    yield build
    for coordinator in coordinators:
        coordinator.shutdown()


def ps_device(task):
    return f"/job:ps/replica:0/task:{task}/device:CPU:0"


# ===== ClusterCoordinator API page (seed 002) ==================================================

@pytest.mark.timeout(120)
def test_create_per_worker_dataset_example(cluster, make):
    strategy, coordinator = make(cluster)

    def worker_fn(iterator):
        return next(iterator)

    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(
            lambda x: cv.data.Dataset.from_tensor_slices([3] * 3))

    per_worker_dataset = coordinator.create_per_worker_dataset(per_worker_dataset_fn)
    per_worker_iter = iter(per_worker_dataset)
    remote_value = coordinator.schedule(worker_fn, args=(per_worker_iter,))
    assert remote_value.fetch() == 3

    # "Calling next on a PerWorkerValues of iterator is unsupported."
    with pytest.raises(InvalidArgumentError, match="inside scheduled functions"):
        next(per_worker_iter)


@pytest.mark.timeout(120)
def test_fetch_example(cluster, make):
    strategy, coordinator = make(cluster)

    def dataset_fn():
        return cv.data.Dataset.from_tensor_slices([1, 1, 1])

    with strategy.scope():
        v = cv.Variable(initial_value=0)

    def worker_fn(iterator):
        def replica_fn(x):
            v.assign_add(x)
            return v.read_value()
        return strategy.run(replica_fn, args=(next(iterator),))

    distributed_dataset = coordinator.create_per_worker_dataset(dataset_fn)
    distributed_iterator = iter(distributed_dataset)
    result = coordinator.schedule(worker_fn, args=(distributed_iterator,))
    assert coordinator.fetch(result) == 1

    # "If val is other types, return it as-is"; structures of RemoteValues keep their shape.
    more = coordinator.schedule(lambda: ("a", [2, {"b": 3}]))
    assert coordinator.fetch({"x": more, "y": 7, "z": [result]}) == {
        "x": ("a", [2, {"b": 3}]), "y": 7, "z": [1]}


# ===== ParameterServerStrategyV2 docstrings (seed 003) =========================================

def _regression_data(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    true_w = np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)
    x = rng.standard_normal((64, 4)).astype(np.float32)
    return x, x @ true_w, true_w


@pytest.mark.timeout(120)
def test_coordinator_training_loop_example(cluster, make, tmp_path):
    # The Keras model, optimizer and metrics become plain variables, cv.optimizers.SGD and
    # two metric variables on the ps; gradients come from PyTorch through convoy.torch.
    # A `steps` variable counts the steps for `load_checkpoint`, as `optimizer.iterations`
    # does in the example (tested on its own in tests/train/test_optimizer_iterations.py).
    # 40 steps an epoch: up to 8 steps at once read stale weights (2 workers, pipelining 4),
    # and 20 left w short of the tolerance about one run in five.
    num_epoch, steps_per_epoch, checkpoint_dir = 3, 40, tmp_path / "ckpt"
    x, y, true_w = _regression_data()

    def dataset_fn():
        return cv.data.Dataset.from_tensor_slices((x, y)).shuffle(64).repeat().batch(8)

    def load_checkpoint(manager):
        if manager.restore_or_initialize() is None:
            return None
        return int(steps.numpy()) // steps_per_epoch

    def build(strategy):
        with strategy.scope():
            model = SimpleNamespace(w=cv.Variable(np.zeros((4, 1), np.float32), name="w"))
            optimizer = cv.optimizers.SGD(learning_rate=0.05, momentum=0.5)
            metrics = SimpleNamespace(loss_sum=cv.Variable(0.0, name="loss_sum"),
                                      batches=cv.Variable(0, name="batches"))
            steps = cv.Variable(0, name="steps")
        checkpoint = cv.train.Checkpoint(model=model, optimizer=optimizer, steps=steps)
        manager = cv.train.CheckpointManager(checkpoint, checkpoint_dir, max_to_keep=2)
        return model, optimizer, metrics, steps, manager

    strategy, coordinator = make(cluster, cv.distribute.experimental.partitioners
                                 .FixedShardsPartitioner(num_shards=2))
    distributed_dataset = coordinator.create_per_worker_dataset(dataset_fn=dataset_fn)
    model, optimizer, metrics, steps, checkpoint_manager = build(strategy)
    assert isinstance(model.w, cv.distribute.ShardedVariable)
    initial_epoch = load_checkpoint(checkpoint_manager) or 0
    assert initial_epoch == 0

    def worker_fn(iterator):
        def replica_fn(inputs):
            batch_data, labels = inputs
            with cv.torch.pull(dense=[model.w]) as pulled:
                error = torch.from_numpy(batch_data) @ pulled[0] - torch.from_numpy(labels)
                loss = (error ** 2).mean()
                loss.backward()
            optimizer.apply_gradients(pulled.gradients())
            metrics.loss_sum.assign_add(loss.item())
            metrics.batches.assign_add(1)
            steps.assign_add(1)

        strategy.run(replica_fn, args=(next(iterator),))

    epoch_losses = []
    for _epoch in range(initial_epoch, num_epoch):
        distributed_iterator = iter(distributed_dataset)  # Reset iterator state.
        for _step in range(steps_per_epoch):
            coordinator.schedule(worker_fn, args=(distributed_iterator,))
        coordinator.join()
        epoch_losses.append(float(metrics.loss_sum.numpy()) / int(metrics.batches.numpy()))
        metrics.loss_sum.assign(0.0)
        metrics.batches.assign(0)
        checkpoint_manager.save()

    assert int(steps.numpy()) == num_epoch * steps_per_epoch
    assert epoch_losses[-1] < epoch_losses[0] / 10
    np.testing.assert_allclose(model.w.numpy(), true_w, atol=0.2)
    assert [os.path.basename(p) for p in checkpoint_manager.checkpoints] == [
        "ckpt-2.safetensors", "ckpt-3.safetensors"]  # max_to_keep=2

    # A restarted coordinator re-creates the variables, restores the latest checkpoint and
    # infers that no epoch is left.
    trained = model.w.numpy()
    strategy, coordinator = make(cluster, cv.distribute.experimental.partitioners
                                 .FixedShardsPartitioner(num_shards=2))
    model, optimizer, metrics, steps, checkpoint_manager = build(strategy)
    assert float(np.abs(model.w.numpy()).sum()) == 0.0  # fresh initial value before restore
    assert load_checkpoint(checkpoint_manager) == num_epoch
    np.testing.assert_array_equal(model.w.numpy(), trained)


class Regression(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 1, bias=False)
        torch.nn.init.zeros_(self.linear.weight)

    def forward(self, x):
        return self.linear(x)


@pytest.mark.timeout(120)
def test_coordinator_training_loop_example_with_a_module_and_metrics(cluster, make, tmp_path):
    # The same example as written, with its placeholders filled the PyTorch way: `model` an
    # nn.Module placed on the ps with cv.torch.place, `optimizer, metrics` a cv optimizer and
    # a cv.metrics.Mean, gradients from loss.backward(). Keras 3 names `reset_states`
    # `reset_state`; `load_checkpoint` infers the epoch from `optimizer.iterations`.
    num_epoch, steps_per_epoch, checkpoint_dir = 3, 40, tmp_path / "ckpt"
    x, y, true_w = _regression_data(1)

    def dataset_fn():
        return cv.data.Dataset.from_tensor_slices((x, y)).shuffle(64).repeat().batch(8)

    def load_checkpoint(manager):
        if manager.restore_or_initialize() is None:
            return None
        return int(optimizer.iterations.numpy()) // steps_per_epoch

    strategy = cv.distribute.experimental.ParameterServerStrategy(
        cluster_resolver=cluster.resolver(),
        variable_partitioner=cv.distribute.experimental.partitioners.FixedShardsPartitioner(2))
    coordinator = make.adopt(cv.distribute.experimental.coordinator.ClusterCoordinator(
        strategy=strategy))
    distributed_dataset = coordinator.create_per_worker_dataset(dataset_fn=dataset_fn)

    with strategy.scope():
        model = cv.torch.place(Regression())
        optimizer, metrics = cv.optimizers.SGD(learning_rate=0.05, momentum=0.5), \
            cv.metrics.Mean(name="loss")
        checkpoint = cv.train.Checkpoint(model=model, optimizer=optimizer)
        checkpoint_manager = cv.train.CheckpointManager(
            checkpoint, checkpoint_dir, max_to_keep=2)
        initial_epoch = load_checkpoint(checkpoint_manager) or 0

    def worker_fn(iterator):

        def replica_fn(inputs):
            batch_data, labels = inputs
            loss = torch.nn.functional.mse_loss(model(torch.from_numpy(batch_data)),
                                                torch.from_numpy(labels))
            loss.backward()
            optimizer.apply_gradients(model.gradients())
            metrics.update_state(loss.item())

        strategy.run(replica_fn, args=(next(iterator),))

    results = []
    for _epoch in range(initial_epoch, num_epoch):
        distributed_iterator = iter(distributed_dataset)  # Reset iterator state.
        for _step in range(steps_per_epoch):
            coordinator.schedule(worker_fn, args=(distributed_iterator,))
        coordinator.join()
        results.append(float(metrics.result()))
        metrics.reset_state()
        checkpoint_manager.save()

    assert initial_epoch == 0 and int(optimizer.iterations.numpy()) == 120
    assert results[-1] < results[0] / 10
    np.testing.assert_allclose(model.linear.weight.numpy().T, true_w, atol=0.2)

    # A restarted coordinator builds the same model, restores the latest checkpoint into it
    # (variables, momentum slots, iterations) and infers that no epoch is left.
    trained = model.linear.weight.numpy()
    strategy = cv.distribute.experimental.ParameterServerStrategy(
        cluster_resolver=cluster.resolver())
    with strategy.scope():
        model = cv.torch.place(Regression())
        optimizer = cv.optimizers.SGD(learning_rate=0.05, momentum=0.5)
        checkpoint_manager = cv.train.CheckpointManager(
            cv.train.Checkpoint(model=model, optimizer=optimizer), checkpoint_dir, max_to_keep=2)
        assert float(np.abs(model.linear.weight.numpy()).sum()) == 0.0
        assert load_checkpoint(checkpoint_manager) == num_epoch
    np.testing.assert_array_equal(model.linear.weight.numpy(), trained)


SERVER_PROGRAM = """
import convoy as cv

# "If you prefer to run the same binary for all tasks, you will need to let the binary branch
# into different roles at the beginning of the program" (the TF example also sets
# GRPC_FAIL_FAST, which convoy does not need).
cluster_resolver = cv.distribute.cluster_resolver.TFConfigClusterResolver()
if cluster_resolver.task_type == "chief":
    raise SystemExit("the chief runs in the test process")
elif cluster_resolver.task_type in ("worker", "ps"):
    server = cv.distribute.Server(
        cluster_resolver.cluster_spec(),
        job_name=cluster_resolver.task_type,
        task_index=cluster_resolver.task_id,
        protocol="grpc")
    print("serving", flush=True)
    # Blocking the process that starts a server from exiting.
    server.join()
"""


def _tf_config(cluster_dict, task_type, index):
    import json

    return json.dumps({"cluster": cluster_dict, "task": {"type": task_type, "index": index}})


@pytest.mark.timeout(120)
def test_worker_and_ps_server_example_and_same_binary_branching(monkeypatch):
    # The "Example code for worker and parameter servers" and the same-binary example: each
    # task reads TF_CONFIG, branches on its task type and runs a cv.distribute.Server.
    spec = {"chief": [f"localhost:{free_port()}"], "ps": [f"localhost:{free_port()}"],
            "worker": [f"localhost:{free_port()}"]}
    processes = []
    try:
        for task_type in ("ps", "worker"):
            processes.append(subprocess.Popen(
                [sys.executable, "-c", SERVER_PROGRAM], stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True,
                env={**os.environ, "TF_CONFIG": _tf_config(spec, task_type, 0)}))
        for process in processes:
            output = []
            while not output or output[-1] not in ("serving", ""):
                output.append(process.stdout.readline().strip())
            assert output[-1] == "serving", "\n".join(output)

        monkeypatch.setenv("TF_CONFIG", _tf_config(spec, "chief", 0))
        cluster_resolver = TFConfigClusterResolver()
        assert cluster_resolver.task_type == "chief"
        strategy = cv.distribute.experimental.ParameterServerStrategy(cluster_resolver)
        coordinator = cv.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        try:
            with strategy.scope():
                v = cv.Variable(10.0)
            assert v.device == ps_device(0)
            result = coordinator.schedule(lambda: (v.assign_add(5.0), v.numpy())[1])
            assert coordinator.fetch(result) == 15.0
            assert v.numpy() == 15.0
        finally:
            coordinator.shutdown()
    finally:
        for process in processes:
            process.kill()
            process.wait(10)


def test_tf_config_cluster_setup_example(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", """
{
    "cluster": {
        "chief": ["chief.example.com:2222"],
        "ps": ["ps0.example.com:2222", "ps1.example.com:2222"],
        "worker": ["worker0.example.com:2222", "worker1.example.com:2222",
                   "worker2.example.com:2222"]
    },
    "task": {
        "type": "ps",
        "index": 1
    }
}
""")
    cluster_resolver = cv.distribute.cluster_resolver.TFConfigClusterResolver()
    assert cluster_resolver.task_type == "ps"
    assert cluster_resolver.task_id == 1
    spec = cluster_resolver.cluster_spec()
    assert spec.num_tasks("chief") == 1
    assert spec.task_address("ps", 1) == "ps1.example.com:2222"
    assert spec.num_tasks("worker") == 3
    # That task is a ps: it serves, it cannot be the coordinator.
    with pytest.raises(InvalidArgumentError, match="'ps'"):
        cv.distribute.experimental.ParameterServerStrategy(cluster_resolver)


@pytest.mark.timeout(120)
def test_variable_creation_round_robin_example(cluster, make):
    # In this example, we're assuming having 3 ps.
    strategy, coordinator = make(cluster)

    # Created outside the scope: on the coordinator (this process), not on a ps.
    v1 = cv.Variable(initial_value=0.0)

    with strategy.scope():
        v2 = cv.Variable(initial_value=1.0)
        v3 = cv.Variable(initial_value=2.0)
        v4 = cv.Variable(initial_value=3.0)
        v5 = cv.Variable(initial_value=4.0)

    assert not v1.device.startswith("/job:ps")
    assert v2.device == "/job:ps/replica:0/task:0/device:CPU:0"
    assert v3.device == "/job:ps/replica:0/task:1/device:CPU:0"
    assert v4.device == "/job:ps/replica:0/task:2/device:CPU:0"
    assert v5.device == "/job:ps/replica:0/task:0/device:CPU:0"
    assert [float(v.numpy()) for v in (v1, v2, v3, v4, v5)] == [0.0, 1.0, 2.0, 3.0, 4.0]


class Dense:
    # tf.Module has no convoy counterpart: a plain class whose `variables` lists the shard
    # components, as tf.Module collects them.
    def __init__(self, name=None):
        self.name = name
        self.w = cv.Variable(np.random.default_rng(0).standard_normal([100, 10]), name="w")

    @property
    def variables(self):
        w = self.w
        return w.variables if isinstance(w, cv.distribute.ShardedVariable) else [w]

    def __call__(self, x):
        return x * np.asarray(self.w)  # the container converts to an array


@pytest.mark.timeout(120)
def test_variable_partitioning_example(cluster, make):
    # Partition the dense layer into 2 shards.
    variable_partitioner = (
        cv.distribute.experimental.partitioners.FixedShardsPartitioner(num_shards=2))
    strategy, _ = make(cluster, variable_partitioner)
    with strategy.scope():
        dense = Dense()
    assert len(dense.variables) == 2
    assert isinstance(dense.variables[0], cv.Variable)
    assert isinstance(dense.variables[1], cv.Variable)
    assert dense.variables[0].shape == (50, 10)
    assert dense.variables[1].shape == (50, 10)
    # shards are placed round-robin on the ps
    assert [v.device for v in dense.variables] == [ps_device(0), ps_device(1)]
    assert [v.name for v in dense.variables] == ["w/part_0", "w/part_1"]

    expected = np.random.default_rng(0).standard_normal([100, 10])
    np.testing.assert_array_equal(dense(np.ones(10)), expected)
    # embedding_lookup gathers from the components in parallel, no conversion needed
    ids = np.array([[0, 49], [50, 99]])
    np.testing.assert_array_equal(cv.nn.embedding_lookup(dense.w, ids), expected[ids])


@pytest.mark.timeout(120)
def test_min_size_partitioner_recommended_setting(cluster, make):
    # "MinSizePartitioner(min_shard_bytes = 256 << 10, max_shards = num_ps) allocates at least
    # 256K per shard, and each ps gets at most one shard."
    strategy, _ = make(cluster, cv.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=256 << 10, max_shards=NUM_PS))
    with strategy.scope():
        big = cv.Variable(np.zeros((1024, 1024), np.float32), name="big")      # 4 MiB
        mid = cv.Variable(np.zeros((128, 1024), np.float32), name="mid")       # 512 KiB
        small = cv.Variable(np.zeros((64, 1024), np.float32), name="small")    # 256 KiB
        scalar = cv.Variable(1.0, name="scalar")                               # rank 0
    assert [v.shape for v in big.variables] == [(342, 1024), (341, 1024), (341, 1024)]
    assert sorted(v.device for v in big.variables) == [ps_device(i) for i in range(NUM_PS)]
    assert [v.shape for v in mid.variables] == [(64, 1024), (64, 1024)]
    # "Variables that have only one partition ... will be created as a normal Variable."
    assert isinstance(small, cv.Variable) and small.shape == (64, 1024)
    assert isinstance(scalar, cv.Variable) and scalar.shape == ()


@pytest.mark.timeout(120)
def test_div_partition_strategy_example(cluster, make):
    # "a variable whose first dimension is 13 has 13 ids, and they are split across 5 shards
    # as: [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10], [11, 12]]"
    strategy, _ = make(cluster, cv.distribute.experimental.partitioners
                       .FixedShardsPartitioner(5))
    with strategy.scope():
        v = cv.Variable(np.arange(13), name="ids")
    assert [v_.numpy().tolist() for v_ in v.variables] == [
        [0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10], [11, 12]]
    assert [s.device for s in v.variables] == [ps_device(i % NUM_PS) for i in range(5)]


@pytest.mark.timeout(120)
def test_partition_aware_initial_values(cluster, make):
    # _create_variable: a callable initial value with shape and dtype is called per shard,
    # with shard_info, or with partition_shape/partition_offset; one that ignores them and
    # returns the full value is sliced.
    strategy, _ = make(cluster, cv.distribute.experimental.partitioners
                       .FixedShardsPartitioner(2))
    full = np.arange(10 * 3, dtype=np.float32).reshape(10, 3)
    infos, partitions = [], []

    def with_shard_info(shard_info):
        infos.append(shard_info)
        return full[shard_info.offset[0]:shard_info.offset[0] + shard_info.shape[0]]

    def with_partition(partition_shape=None, partition_offset=None):
        partitions.append((partition_shape, partition_offset))
        return full[partition_offset[0]:partition_offset[0] + partition_shape[0]]

    with strategy.scope():
        a = cv.Variable(with_shard_info, shape=(10, 3), dtype=np.float32, name="a")
        b = cv.Variable(with_partition, shape=(10, 3), dtype=np.float32, name="b")
        c = cv.Variable(lambda: full, shape=(10, 3), dtype=np.float32, name="c")
        with pytest.raises(InvalidArgumentError, match="initial_value"):
            cv.Variable(None, name="d")
    assert infos == [cv.distribute.ShardInfo((5, 3), (0, 0)),
                     cv.distribute.ShardInfo((5, 3), (5, 0))]
    assert partitions == [((5, 3), (0, 0)), ((5, 3), (5, 0))]
    for v in (a, b, c):
        assert [s.shape for s in v.variables] == [(5, 3), (5, 3)]
        np.testing.assert_array_equal(v.numpy(), full)


def test_strategy_cluster_checks():
    # _verify_args_and_config / _connect_to_cluster: a non-empty spec, at least one ps and one
    # worker, and the coordinator is not a worker or ps task.
    resolver = cv.distribute.cluster_resolver.SimpleClusterResolver
    spec = cv.distribute.ClusterSpec
    with pytest.raises(InvalidArgumentError, match="empty"):
        cv.distribute.ParameterServerStrategy(resolver(spec({})))
    with pytest.raises(InvalidArgumentError, match="at least one 'ps'"):
        cv.distribute.ParameterServerStrategy(resolver(spec({"worker": ["h:1"]})))
    with pytest.raises(InvalidArgumentError, match="at least one 'worker'"):
        cv.distribute.ParameterServerStrategy(resolver(spec({"ps": ["h:1"]})))
    with pytest.raises(InvalidArgumentError, match="'worker'"):
        cv.distribute.ParameterServerStrategy(resolver(
            spec({"ps": ["h:1"], "worker": ["h:2"]}), task_type="worker", task_id=0))


@pytest.mark.timeout(120)
def test_dataset_preparation_example(cluster, make):
    strategy, coordinator = make(cluster)
    filenames = [f"file-{i}.csv" for i in range(10)]
    batch_size = 4

    def dataset_fn():
        dataset = cv.data.Dataset.from_tensor_slices(filenames)
        # Dataset is recommended to be shuffled, and repeated.
        return dataset.shuffle(buffer_size=10).repeat().batch(batch_size=batch_size)

    distributed_dataset = coordinator.create_per_worker_dataset(dataset_fn)
    iterator = iter(distributed_dataset)
    results = [coordinator.schedule(lambda it: next(it), args=(iterator,)) for _ in range(10)]
    coordinator.join()
    batches = [coordinator.fetch(r) for r in results]
    assert all(len(batch) == batch_size for batch in batches)
    seen = {name.decode() if isinstance(name, bytes) else str(name)
            for batch in batches for name in batch}
    assert seen <= set(filenames) and len(seen) > batch_size

    # experimental_distribute_dataset / distribute_datasets_from_function belong inside the
    # function given to create_per_worker_dataset.
    with pytest.raises(FailedPreconditionError, match="create_per_worker_dataset"):
        strategy.experimental_distribute_dataset(dataset_fn())
    with pytest.raises(FailedPreconditionError, match="create_per_worker_dataset"):
        strategy.distribute_datasets_from_function(lambda context: dataset_fn())


@pytest.mark.timeout(120)
def test_run_and_reduce_inside_scheduled_functions(cluster, make):
    # _call_for_each_replica runs fn once (one replica per worker); _reduce returns the value.
    strategy, coordinator = make(cluster)

    def worker_fn(x):
        value = strategy.run(lambda a, b: a * b, args=(x,), kwargs={"b": 3})
        return strategy.reduce(cv.distribute.ReduceOp.SUM, value, axis=None)

    result = coordinator.schedule(worker_fn, args=(np.arange(3),))
    assert coordinator.fetch(result).tolist() == [0, 3, 6]
    assert strategy.num_replicas_in_sync == 1
