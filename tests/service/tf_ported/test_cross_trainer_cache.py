"""Scenarios of TensorFlow's ``cross_trainer_cache_test.py`` and ``cross_trainer_cache_ft_test.py``
(tensorflow/python/data/experimental/kernel_tests/service/), ported to convoy. Every test
names the TensorFlow test it comes from.

Sizes: convoy counts a scalar element as 32 bytes, so the tests with a small cache give it a
bound in those units (TensorFlow's tests pick theirs from its own element sizes).

Left out, and why:
- testMultipleIterationsForOneDatasetGraphMode: convoy has no graph mode; each iterator is a
  new repetition (refused with the cache, as in eager mode).

Where convoy differs on purpose:
- TensorFlow lets the second iterator over one distributed dataset through and refuses the
  third; convoy refuses the second, the first that would read a cache no other trainer reads
  (testMultipleIterationsForOneDatasetEagerMode asserts within its three reads, so it holds
  either way).
- testCompressionMismatch: in TensorFlow a reader that asks for another compression than the
  job's misreads the cached, compressed elements ("Data type mismatch"). A convoy worker
  caches decoded elements and every answer says how it is compressed, so such a reader reads
  on; the test asserts that.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import convoy as cv
from convoy.data.service import WorkerConfig, WorkerServer
from convoy.errors import InvalidArgumentError
from convoy.testing import InProcessCluster

Dataset = cv.data.Dataset
service = cv.data.service
CrossTrainerCache = service.CrossTrainerCache

pytestmark = pytest.mark.timeout(120)

ENDLESS = Dataset.range(10_000_000).repeat()


def ints(elements: Any) -> list[int]:
    return [int(x) for x in elements]


def distributed(dataset: Dataset, cluster: Any, job_name: str | None, trainer: str | None,
                mode: Any = service.ShardingPolicy.OFF, **kwargs: Any) -> Dataset:
    cache = CrossTrainerCache(trainer) if trainer is not None else None
    return dataset.apply(service.distribute(mode, cluster.target, job_name=job_name,
                                            cross_trainer_cache=cache, **kwargs))


@pytest.fixture
def cache_cluster() -> Iterator[Callable[..., InProcessCluster]]:
    """``cache_cluster(num_workers, cache_bytes=None)``: a fresh cluster whose workers bound
    their caches at ``cache_bytes`` (None: the default, 10 GiB)."""
    clusters: list[InProcessCluster] = []

    def make(num_workers: int = 1, cache_bytes: int | None = None) -> InProcessCluster:
        cluster = InProcessCluster(0)
        clusters.append(cluster)
        for _ in range(num_workers):
            cluster.workers.append(WorkerServer(WorkerConfig(
                dispatcher_address=cluster.address, heartbeat_interval_ms=100,
                cross_trainer_cache_size_bytes=cache_bytes)))
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop()


# ----- cross_trainer_cache_test.py ---------------------------------------------------------------


def test_enable_cross_trainer_cache(cluster1, name, read_within):
    """testEnableCrossTrainerCache: a second trainer reads the first one's elements again."""
    first = distributed(ENDLESS, cluster1, name, "Trainer 1")
    assert ints(read_within(first.take(10), 60)) == list(range(10))
    second = distributed(ENDLESS, cluster1, name, "Trainer 2")
    assert ints(read_within(second.take(10), 60)) == list(range(10))


def test_from_dataset_id(cluster1, name, read_within):
    """testFromDatasetId: the same through register_dataset and from_dataset_id."""
    results = []
    for trainer in ("Trainer 1", "Trainer 2"):
        dataset_id = service.register_dataset(cluster1.target, ENDLESS,
                                              dataset_id=f"{name}-dataset_id")
        dataset = service.from_dataset_id(
            service.ShardingPolicy.OFF, cluster1.target, dataset_id,
            element_spec=ENDLESS.element_spec, job_name="job",
            cross_trainer_cache=CrossTrainerCache(trainer))
        results.append(ints(read_within(dataset.take(10), 60)))
    assert results == [list(range(10))] * 2


def test_disable_cross_trainer_cache_by_default(cluster1, name, read_within):
    """testDisableCrossTrainerCacheByDefault: without the cache, a second reader of the job
    gets only what the first has not taken."""
    first = distributed(ENDLESS, cluster1, name, None)
    assert ints(read_within(first.take(10), 60)) == list(range(10))
    second = distributed(ENDLESS, cluster1, name, None)
    assert ints(read_within(second.take(10), 60))[0] >= 10


def test_concurrent_readers(cache_cluster):
    """testConcurrentReaders: 20 trainers reading one element each in turn all see the same
    sequence through a small cache. TensorFlow sizes it by its workers' prefetching; here
    what matters is a reader's: it holds up to 64 elements beyond those it has returned, so
    the cache holds four times that."""
    cluster = cache_cluster(1, cache_bytes=4 * 64 * 32)
    num_readers = 20
    iterators = [iter(distributed(ENDLESS, cluster, "job", f"Trainer {i}",
                                  max_outstanding_requests=1))
                 for i in range(num_readers)]
    for expected in range(50):
        for iterator in iterators:
            assert int(next(iterator)) == expected


def test_slow_client_skips_data(cache_cluster, read_within):
    """testSlowClientSkipsData: with a small cache, a trainer that comes late misses the start
    but still reads as many elements as it asks for (the input is endless)."""
    cluster = cache_cluster(1, cache_bytes=500)
    first = distributed(ENDLESS, cluster, "job", "Trainer 1")
    assert ints(read_within(first.take(200), 60)) == list(range(200))
    second = ints(read_within(distributed(ENDLESS, cluster, "job", "Trainer 2").take(200), 60))
    assert second[0] > 0
    assert len(second) == 200


def test_small_cache(cache_cluster, read_within):
    """testSmallCache: 20 trainers one after the other each read 200 elements through a
    500-byte cache."""
    cluster = cache_cluster(1, cache_bytes=500)
    for i in range(20):
        dataset = distributed(ENDLESS, cluster, "job", f"Trainer {i}")
        assert len(read_within(dataset.take(200), 60)) == 200


def test_shuffle_dataset(cluster1, name, read_within):
    """testShuffleDataset: trainers read the same shuffled order (one pipeline runs)."""
    dataset = Dataset.range(10_000_000).repeat().shuffle(buffer_size=100)
    first = ints(read_within(distributed(dataset, cluster1, name, "Trainer 1").take(10), 60))
    second = ints(read_within(distributed(dataset, cluster1, name, "Trainer 2").take(10), 60))
    assert first == second


def test_same_trainer_id(cluster1, name, read_within):
    """testSameTrainerID: readers with the same trainer id share one position: the second
    never gets what the first did."""
    first = distributed(ENDLESS, cluster1, name, "Trainer ID")
    assert ints(read_within(first.take(10), 60)) == list(range(10))
    second = distributed(ENDLESS, cluster1, name, "Trainer ID")
    assert ints(read_within(second.take(10), 60))[0] >= 10


def test_different_job_names(cluster1, name, read_within):
    """testDifferentJobNames: each job has caches of its own."""
    for job in ("job1", "job2"):
        dataset = distributed(ENDLESS, cluster1, f"{name}-{job}", f"Trainer {job}")
        assert ints(read_within(dataset.take(10), 60)) == list(range(10))


def test_dynamic_sharding(cluster2, name, read_within):
    """testDynamicSharding: under DYNAMIC the two trainers' elements overlap."""
    outputs = [set(ints(read_within(distributed(
        ENDLESS, cluster2, name, trainer, mode=service.ShardingPolicy.DYNAMIC).take(100), 60)))
        for trainer in ("Trainer 1", "Trainer 2")]
    assert outputs[0] & outputs[1]


def test_no_compression(cluster1, name, read_within):
    """testNoCompression: the cache works with compression off."""
    for trainer in ("Trainer 1", "Trainer 2"):
        dataset = distributed(ENDLESS, cluster1, name, trainer, compression=None)
        assert ints(read_within(dataset.take(10), 60)) == list(range(10))


def test_compression_mismatch(cluster1, name, read_within):
    """testCompressionMismatch, where convoy differs: the same trainer coming back without
    compression reads on after what it read before."""
    first = distributed(ENDLESS, cluster1, name, "Trainer 1")
    assert ints(read_within(first.take(10), 60)) == list(range(10))
    again = ints(read_within(distributed(ENDLESS, cluster1, name, "Trainer 1",
                                         compression=None).take(10), 60))
    assert again[0] >= 10 and again == list(range(again[0], again[0] + 10))


def test_requires_job_name(cluster1):
    """testRequiresJobName."""
    with pytest.raises(InvalidArgumentError,
                       match="Cross-trainer caching requires named jobs. Got empty `job_name`."):
        distributed(ENDLESS, cluster1, None, "Trainer 1")


@pytest.mark.parametrize("range_", [0, 10])
def test_requires_infinite_dataset(cluster1, name, range_):
    """testRequiresInfiniteDataset: a dataset of known, finite length is refused."""
    dataset = Dataset.range(range_).map(lambda x: x + 1)
    with pytest.raises(InvalidArgumentError,
                       match="Cross-trainer caching requires the input dataset to be infinite"):
        distributed(dataset, cluster1, name, "Trainer ID")


def test_multiple_iterations_for_one_dataset_eager_mode(cluster1, name, read_within):
    """testMultipleIterationsForOneDatasetEagerMode: iterating one distributed dataset again
    is refused."""
    dataset = distributed(ENDLESS, cluster1, name, "Trainer 1")
    with pytest.raises(InvalidArgumentError,
                       match="Cross-trainer caching requires infinite datasets and disallows "
                             "multiple repetitions of the same dataset."):
        for _ in range(3):
            read_within(dataset.take(10), 60)


def test_disallow_coordinated_read(cluster1, name):
    """testDisallowCoordinatedRead."""
    with pytest.raises(InvalidArgumentError,
                       match="Cross-trainer caching does not support coordinated reads."):
        distributed(ENDLESS, cluster1, name, "Trainer 1", num_consumers=1, consumer_index=0)


def test_named_job_mismatch(cluster1, name, read_within):
    """testNamedJobMismatch: a job read through the cache cannot be read without it."""
    first = distributed(ENDLESS, cluster1, name, "Trainer 1")
    assert ints(read_within(first.take(10), 60)) == list(range(10))
    with pytest.raises(InvalidArgumentError,
                       match="found an existing job with different parameters: existing .*"
                             "cross-trainer cache on; got .*cross-trainer cache off"):
        read_within(distributed(ENDLESS, cluster1, name, None), 60)


def test_requires_non_empty_trainer_id():
    """testRequiresNonEmptyTrainerID (a ValueError, as in TensorFlow)."""
    with pytest.raises(ValueError, match="cross-trainer cache requires a non-empty trainer ID"):
        CrossTrainerCache(trainer_id=None)  # type: ignore[arg-type]


# ----- cross_trainer_cache_ft_test.py ------------------------------------------------------------


def test_worker_restart(make_cluster):
    """testWorkerRestart: a restarted worker runs the job's pipeline again from its start; the
    trainer reads on through the new cache."""
    cluster = make_cluster(1)
    iterator = iter(distributed(ENDLESS, cluster, "job", "Trainer 1"))
    assert [int(next(iterator)) for _ in range(100)] == list(range(100))
    cluster.restart_worker(0)
    while int(next(iterator)) != 0:  # what the old worker's reader had buffered comes first
        pass
    assert [int(next(iterator)) for _ in range(100)] == list(range(1, 101))


def test_dispatcher_restart(make_cluster):
    """testDispatcherRestart: a journaled dispatcher's restart leaves the workers' caches and
    the trainer's reading untouched."""
    cluster = make_cluster(1, work_dir=True, fault_tolerant_mode=True)
    iterator = iter(distributed(ENDLESS, cluster, "job", "Trainer 1"))
    assert [int(next(iterator)) for _ in range(100)] == list(range(100))
    cluster.restart_dispatcher()
    assert [int(next(iterator)) for _ in range(100)] == list(range(100, 200))
