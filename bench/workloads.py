"""The benchmark workloads; each function runs one workload once and returns its throughput.

TensorFlow's side of each workload is in tf_workloads.py, under the same name."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import cloudpickle
import numpy as np

import convoy as cv

# Workers cannot import this module (bench/ is not installed): send its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@dataclass
class Workload:
    name: str
    unit: str
    convoy: Callable[[], float]


def _rate(iterable: object, measure: Callable[[object], float] = lambda _: 1.0) -> float:
    started = time.perf_counter()
    total = 0.0
    for element in iterable:  # type: ignore[attr-defined]
        total += measure(element)
    return total / (time.perf_counter() - started)


def local_batch256() -> float:
    ds = cv.data.Dataset.range(2_000_000).map(lambda x: x * 2).batch(256)
    return _rate(ds)


def _numpy_work(x: np.ndarray) -> np.ndarray:
    return np.sort(np.fft.rfft(x).real)


def _parallel_map(parallel: int | None) -> float:
    rows = np.random.default_rng(0).standard_normal((64, 65_536)).astype(np.float32)
    ds = cv.data.Dataset.from_tensor_slices(rows).repeat(4).map(_numpy_work,
                                                                num_parallel_calls=parallel)
    return _rate(ds)


def local_parallel_map() -> float:
    return _parallel_map(cv.data.AUTOTUNE)


def local_sequential_map() -> float:
    return _parallel_map(None)


# ----- data service: servers in their own processes, the consumer here -----------------------
_clusters: dict[int, object] = {}


def _cluster(num_workers: int) -> str:
    """The target of a cluster with ``num_workers`` worker processes (started once)."""
    from convoy.testing import ProcessCluster

    if num_workers not in _clusters:
        _clusters[num_workers] = ProcessCluster(num_workers)
    return _clusters[num_workers].target  # type: ignore[attr-defined]


def stop_clusters() -> None:
    for cluster in _clusters.values():
        cluster.stop()  # type: ignore[attr-defined]
    _clusters.clear()


def _through_service(ds: cv.data.Dataset, mode: str, num_workers: int = 1,
                     compression: str | None = "AUTO") -> cv.data.Dataset:
    return ds.apply(cv.data.service.distribute(mode, _cluster(num_workers),
                                               compression=compression))


def _megabytes(element: np.ndarray) -> float:
    return element.nbytes / 1e6


def scalar_map() -> float:
    ds = cv.data.Dataset.range(200_000).map(lambda x: x * 2)
    return _rate(_through_service(ds, "parallel_epochs"))


def batch256() -> float:
    ds = cv.data.Dataset.range(2_000_000).map(lambda x: x * 2).batch(256)
    return _rate(_through_service(ds, "parallel_epochs"))


def tensor4mib() -> float:
    ds = cv.data.Dataset.from_tensors(np.ones((1024, 1024), np.float32)).repeat(500)
    return _rate(_through_service(ds, "parallel_epochs", compression=None), _megabytes)


def images_auto() -> float:
    images = np.random.default_rng(0).integers(0, 256, (32, 224, 224, 3), dtype=np.uint8)
    ds = cv.data.Dataset.from_tensors(images).repeat(300)
    return _rate(_through_service(ds, "parallel_epochs", compression="AUTO"), _megabytes)


def dynamic_batch256() -> float:
    ds = cv.data.Dataset.range(2_000_000).map(lambda x: x * 2).batch(256)
    return _rate(_through_service(ds, "distributed_epoch"))


def two_workers() -> float:
    ds = cv.data.Dataset.range(2_000_000).map(lambda x: x * 2).batch(256)
    seen = np.zeros(2_000_000, np.int64)
    started = time.perf_counter()
    batches = 0
    for batch in _through_service(ds, "distributed_epoch", num_workers=2):
        np.add.at(seen, batch // 2, 1)
        batches += 1
    rate = batches / (time.perf_counter() - started)
    if not (seen == 1).all():
        raise AssertionError("two_workers: some element did not arrive exactly once")
    return rate


# ----- parameter-server training: chief here, 2 ps + 2 workers as processes --------------------
LEARNING_RATE = 0.1


def _embedding_step(iterator, table, weights, bias, optimizer):  # runs on a worker
    import torch

    ids, labels = next(iterator)
    with cv.torch.pull(dense=[weights, bias], rows={table: ids}) as pulled:
        bags = pulled[table].mean(dim=1)
        logits = bags @ pulled[0] + pulled[1]
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            logits, torch.from_numpy(np.array(labels)))
        loss.backward()
    optimizer.apply_gradients(pulled.gradients())


def _embedding_step_tfstyle(iterator, table, weights, bias):  # runs on a worker
    """The same step as a TensorFlow program ports it: a read per variable, gradients by hand,
    then a sparse update of the table and dense updates of the head."""
    ids, labels = next(iterator)
    rows = table.sparse_read(ids)
    w, b = weights.read_value(), bias.read_value()
    bags = rows.mean(axis=1)
    logits = bags @ w + b
    dlogits = (1 / (1 + np.exp(-logits)) - labels) / len(labels)
    row_grads = np.broadcast_to((dlogits[:, None] * w)[:, None, :] / ids.shape[1], rows.shape)
    table.scatter_sub(cv.IndexedSlices(LEARNING_RATE * row_grads, ids))
    weights.assign_sub(LEARNING_RATE * (bags.T @ dlogits))
    bias.assign_sub(LEARNING_RATE * dlogits.sum())


def _embedding_dataset():
    data = np.random.default_rng(1)
    ids = data.integers(0, 100_000, (64 * 256, 8))
    labels = (data.random(64 * 256) < 0.5).astype(np.float32)
    return cv.data.Dataset.from_tensor_slices((ids, labels)).batch(256).repeat()


def _embedding_rate(step: Callable[..., None], with_optimizer: bool, steps: int) -> float:
    """Steps/s of ``step`` scheduled ``steps`` times on 2 workers, with the embedding model
    sharded over 2 ps."""
    from convoy.testing import TrainingCluster

    with TrainingCluster(num_workers=2, num_ps=2) as cluster:
        strategy = cv.distribute.ParameterServerStrategy(
            cluster.resolver(),
            variable_partitioner=cv.distribute.partitioners.FixedShardsPartitioner(2))
        rng = np.random.default_rng(0)
        with strategy.scope():
            table = cv.Variable(rng.normal(0, 0.05, (100_000, 64)).astype(np.float32),
                                name="table")
            weights = cv.Variable(np.zeros(64, np.float32), name="weights")
            bias = cv.Variable(np.zeros((), np.float32), name="bias")
            optimizer = cv.optimizers.SGD(LEARNING_RATE) if with_optimizer else None
        coordinator = cv.distribute.ClusterCoordinator(strategy)
        try:
            iterator = iter(coordinator.create_per_worker_dataset(_embedding_dataset))
            args = (iterator, table, weights, bias)
            if optimizer is not None:
                args += (optimizer,)
            for _ in range(20):  # warm up: imports and connections on the workers
                coordinator.schedule(step, args)
            coordinator.join()
            started = time.perf_counter()
            for _ in range(steps):
                coordinator.schedule(step, args)
            coordinator.join()
            return steps / (time.perf_counter() - started)
        finally:
            coordinator.shutdown()


def ps_embedding(steps: int = 2000) -> float:
    return _embedding_rate(_embedding_step, with_optimizer=True, steps=steps)


def ps_embedding_tfstyle(steps: int = 2000) -> float:
    return _embedding_rate(_embedding_step_tfstyle, with_optimizer=False, steps=steps)


ALL = [
    Workload("local_batch256", "batches/s", local_batch256),
    Workload("local_map_numpy_seq", "elements/s", local_sequential_map),
    Workload("local_map_numpy_par", "elements/s", local_parallel_map),
    Workload("scalar_map", "elements/s", scalar_map),
    Workload("batch256", "batches/s", batch256),
    Workload("tensor4MiB", "MB/s", tensor4mib),
    Workload("images_auto", "MB/s", images_auto),
    Workload("dynamic_batch256", "batches/s", dynamic_batch256),
    Workload("two_workers", "batches/s", two_workers),
    Workload("ps_embedding", "steps/s", ps_embedding),
    Workload("ps_embedding_tfstyle", "steps/s", ps_embedding_tfstyle),
]
