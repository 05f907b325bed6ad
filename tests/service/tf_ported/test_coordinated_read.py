"""Scenarios of TensorFlow's ``coordinated_read_test.py`` and ``coordinated_read_ft_test.py``
(tensorflow/python/data/experimental/kernel_tests/service/), ported to convoy. Every test
names the TensorFlow test it comes from.

As TensorFlow's ``make_coordinated_read_dataset`` does, :class:`coordinated_read` simulates
``num_consumers`` consumers in one iterable that reads one element of each consumer in turn,
and the workers' dataset produces groups of ``num_consumers`` consecutive numbers (starting
with the group of 0), so every group of ``num_consumers`` results must be consecutive
(:func:`check_groups`).

Ported with a different outcome (convoy keeps a coordinated iteration's workers fixed: the
consumers agree on them without TensorFlow's round-blocking handshake with the dispatcher):

- ``testAddWorkers``: workers added mid-read take no part in the iteration (TensorFlow adds
  them at a round all consumers agree on); the reading goes on in step.
- ``testRestartWorker``, ``testMultiStartStop``: while a worker is stopped, the consumers
  wait for it when its turn comes (TensorFlow's skip the rounds it would serve) and read on
  once it is back at its address, in step. So the reads go on while the workers restart
  rather than between a stop and a restart. ``testMultiStartStop``'s last step (all workers
  stopped, then 20 more elements read) is left out: no worker is left to serve them.

Ported as its TensorFlow 2 equivalent: ``testFiniteV1`` (graph mode) checks the runtime end of
a dataset whose cardinality is not known in advance, which a finite dataset of known
cardinality never reaches (``testFiniteV2`` refuses it when the job is created).
``testBucketizing`` uses a pipeline of convoy's own ops for the same buckets (convoy has no
``bucket_by_sequence_length`` or ``group_by_window``): the workers emit rounds of
``num_consumers`` batches of one bucket, as TensorFlow's grouping does.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import cloudpickle
import numpy as np
import pytest

import convoy as cv
from convoy.data.service._common.coordinated import ROUNDS_PER_TURN
from convoy.errors import FailedPreconditionError

cloudpickle.register_pickle_by_value(sys.modules[__name__])

Dataset = cv.data.Dataset
service = cv.data.service

pytestmark = pytest.mark.timeout(120)


def groups_of(num_consumers: int) -> Dataset:
    """0, 1, ..., n - 1, then groups of n consecutive numbers from random starting points."""

    def group(x: Any) -> Dataset:
        x = int(x) % (2**32)
        return Dataset.range(x * num_consumers, (x + 1) * num_consumers)

    starts = Dataset.range(1, 2**40).map(lambda i: (i * 2654435761) % (2**40))
    return Dataset.from_tensors(np.int64(0)).concatenate(starts).flat_map(group).repeat()


def consumers(cluster: Any, dataset: Dataset, num_consumers: int, job_name: str,
              mode: Any = "parallel_epochs") -> list[Dataset]:
    return [dataset.apply(service.distribute(mode, cluster.target, job_name=job_name,
                                             consumer_index=index,
                                             num_consumers=num_consumers))
            for index in range(num_consumers)]


class coordinated_read:  # noqa: N801  (read as TensorFlow's dataset-making helper)
    """All consumers as one iterable: element k comes from consumer k % num_consumers. (Each
    iteration opens every consumer first, as TensorFlow's parallel interleave opens its
    cycle; convoy's interleave opens its inputs one by one, as it reaches them, and a
    coordinated consumer waits for the others.)"""

    def __init__(self, cluster: Any, num_consumers: int, job_name: str,
                 mode: Any = "parallel_epochs") -> None:
        self.readers = consumers(cluster, groups_of(num_consumers), num_consumers, job_name,
                                 mode)

    def __iter__(self) -> Iterator[int]:
        iterators = [iter(reader) for reader in self.readers]
        while True:
            for iterator in iterators:
                yield int(next(iterator))


def check_groups(results: list[int], num_consumers: int) -> None:
    groups = [results[start:start + num_consumers]
              for start in range(0, len(results), num_consumers)]
    wrong = [g for g in groups if g != list(range(g[0], g[0] + len(g)))]
    assert not wrong, f"groups not from one worker: {wrong[:5]}"


def read(iterator: Any, results: list[int], count: int) -> None:
    results.extend(int(next(iterator)) for _ in range(count))


def in_background(action: Callable[[], Any]) -> threading.Thread:
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    return thread


# ----- coordinated_read_test -------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [1, 3])
@pytest.mark.parametrize("num_consumers", [1, 2, 5])
def test_basic(make_cluster, read_within, num_workers, num_consumers):
    """testBasic"""
    cluster = make_cluster(num_workers)
    results = read_within(coordinated_read(cluster, num_consumers, "test"), 60, 100)
    check_groups(results, num_consumers)


def test_consumer_restart(make_cluster, read_within):
    """testConsumerRestart"""
    cluster = make_cluster(1)
    read_within(coordinated_read(cluster, 3, "test"), 60, 20)
    with pytest.raises(FailedPreconditionError, match="current round has already reached"):
        read_within(coordinated_read(cluster, 3, "test"), 60, 20)


def test_bucketizing(make_cluster):
    """testBucketizing: at each step, all 15 consumers (3 hosts of 5 replicas) get batches of
    the same bucket."""
    cluster = make_cluster(4)
    bucket_boundaries = [30, 60]
    batch_size = 10
    num_consumers = 15

    def bucket_batches(seed: Any) -> Dataset:
        rng = np.random.default_rng(int(seed))
        low, high = [(0, 30), (30, 60), (60, 100)][rng.integers(3)]
        batches = rng.integers(low, high, size=(num_consumers, batch_size))
        return Dataset.from_tensor_slices(batches)

    dataset = Dataset.range(10**9).repeat().flat_map(bucket_batches)
    replicas = [iter(ds) for ds in consumers(cluster, dataset, num_consumers, "test")]

    def bucket(batch: Any) -> int:
        return sum(int(batch[0]) >= boundary for boundary in bucket_boundaries)

    for _ in range(4):
        step = [bucket(next(replica)) for replica in replicas]
        assert len(set(step)) == 1, step


def test_finite_v1(make_cluster, read_within):
    """testFiniteV1, as a dataset of unknown cardinality that ends."""
    cluster = make_cluster(1)
    dataset = Dataset.range(100).repeat().take_while(lambda x: x < 99)
    (reader,) = consumers(cluster, dataset, 1, "test")
    with pytest.raises(FailedPreconditionError,
                       match="Encountered end of sequence on a round-robin read iterator"):
        read_within(reader, 60)


def test_finite_v2(make_cluster, read_within):
    """testFiniteV2"""
    cluster = make_cluster(1)
    (reader,) = consumers(cluster, Dataset.range(100), 1, "test")
    with pytest.raises(FailedPreconditionError,
                       match="Round robin reads require that the input dataset has infinite "
                             "cardinality, but the dataset has cardinality 100"):
        read_within(reader, 60)


# ----- coordinated_read_ft_test ----------------------------------------------------------------


@pytest.mark.parametrize("workers_to_add", [1, 3])
def test_add_workers(make_cluster, workers_to_add):
    """testAddWorkers (different outcome: the added workers take no part)."""
    starting_workers = 3
    cluster = make_cluster(starting_workers)
    num_consumers = 7
    iterator = iter(coordinated_read(cluster, num_consumers, "test"))
    results: list[int] = []
    read(iterator, results, 25)
    for _ in range(workers_to_add):
        cluster.add_worker()
    read(iterator, results, 25 + 3 * ROUNDS_PER_TURN * num_consumers)  # every worker's turn
    check_groups(results, num_consumers)
    assert results.count(0) == starting_workers  # each serving worker's first group
    assert [worker._num_tasks() for worker in cluster.workers[starting_workers:]] == [
        0] * workers_to_add


def test_restart_worker(make_cluster):
    """testRestartWorker (different outcome: the consumers wait for the stopped worker)."""
    num_workers = 3
    cluster = make_cluster(num_workers)
    num_consumers = 5
    iterator = iter(coordinated_read(cluster, num_consumers, "test"))
    results: list[int] = []
    read(iterator, results, ROUNDS_PER_TURN * num_consumers + 20)  # into worker 1's turn
    assert results.count(0) == 2  # the first groups of workers 0 and 1
    restart = in_background(lambda: cluster.restart_worker(1))
    read(iterator, results, 20)
    restart.join(30)
    # Read until the restarted worker's first group (it streams its copy afresh), then more.
    while results.count(0) < 3:
        assert len(results) < 3 * ROUNDS_PER_TURN * num_consumers, "no group from the new one"
        read(iterator, results, num_consumers)
    read(iterator, results, 20)
    check_groups(results, num_consumers)


@pytest.mark.parametrize("mode", ["parallel_epochs", "distributed_epoch"])
def test_multi_start_stop(make_cluster, mode):
    """testMultiStartStop (different outcome: the reads go on while each worker restarts)."""
    num_workers = 3
    cluster = make_cluster(num_workers, work_dir=True, fault_tolerant_mode=True)
    num_consumers = 5
    iterator = iter(coordinated_read(cluster, num_consumers, "test", mode))
    results: list[int] = []
    read(iterator, results, 20)
    for index in range(num_workers):
        restart = in_background(lambda index=index: cluster.restart_worker(index))
        read(iterator, results, 20)
        restart.join(30)
        read(iterator, results, 20)
    cluster.add_worker()
    cluster.restart_dispatcher()
    read(iterator, results, 20 + ROUNDS_PER_TURN * num_consumers)
    check_groups(results, num_consumers)
