"""The benchmark workloads; each function runs one workload once and returns its throughput."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import convoy as cv


@dataclass
class Workload:
    name: str
    unit: str
    convoy: Callable[[], float]
    tensorflow: Callable[[], float] | None = None


def _rate(iterable: object, measure: Callable[[object], float] = lambda _: 1.0) -> float:
    started = time.perf_counter()
    total = 0.0
    for element in iterable:  # type: ignore[attr-defined]
        total += measure(element)
    return total / (time.perf_counter() - started)


def local_batch256() -> float:
    ds = cv.data.Dataset.range(2_000_000).map(lambda x: x * 2).batch(256)
    return _rate(ds)


def tf_local_batch256() -> float:
    import tensorflow as tf

    ds = tf.data.Dataset.range(2_000_000).map(lambda x: x * 2).batch(256)
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


ALL = [
    Workload("local_batch256", "batches/s", local_batch256, tf_local_batch256),
    Workload("local_map_numpy_seq", "elements/s", local_sequential_map),
    Workload("local_map_numpy_par", "elements/s", local_parallel_map),
    Workload("scalar_map", "elements/s", scalar_map),
    Workload("batch256", "batches/s", batch256),
    Workload("tensor4MiB", "MB/s", tensor4mib),
    Workload("images_auto", "MB/s", images_auto),
    Workload("dynamic_batch256", "batches/s", dynamic_batch256),
    Workload("two_workers", "batches/s", two_workers),
]
