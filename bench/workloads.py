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


ALL = [
    Workload("local_batch256", "batches/s", local_batch256, tf_local_batch256),
    Workload("local_map_numpy_seq", "elements/s", local_sequential_map),
    Workload("local_map_numpy_par", "elements/s", local_parallel_map),
]
