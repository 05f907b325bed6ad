"""Scenarios of TensorFlow's ``dynamic_sharding_test.py`` and ``distributed_epoch_test.py``
(tensorflow/python/data/experimental/kernel_tests/service/), ported to convoy.

``distributed_epoch_test.py`` is the older form of the same suite: it reads with the string
``"distributed_epoch"`` and no job name where ``dynamic_sharding_test.py`` uses
``ShardingPolicy.DYNAMIC`` with ``job_name="job_name"``. A scenario in both files is one test
here, run once per file (the parameter ids name the file).

Not ported (the feature does not exist in convoy):

- ``testZipReplicateOnSplit``: convoy has no ``replicate_on_split`` rewrite.
- ``testGcDynamicShardingJobIfRequested``: convoy's DispatcherConfig has no
  ``gc_dynamic_sharding_jobs`` (see ``test_dont_gc_jobs_with_visitation_guarantees``).
"""

from __future__ import annotations

import collections
import sys
import time
from collections.abc import Callable
from typing import Any

import cloudpickle
import numpy as np
import pytest

import convoy as cv
from convoy.errors import InvalidArgumentError

cloudpickle.register_pickle_by_value(sys.modules[__name__])

Dataset = cv.data.Dataset
service = cv.data.service
OFF = service.ShardingPolicy.OFF
DYNAMIC = service.ShardingPolicy.DYNAMIC

pytestmark = pytest.mark.timeout(60)

Distribute = Callable[[Dataset, Any], Dataset]


def ints(elements: Any) -> list[int]:
    return [int(x) for x in elements]


def pairs(elements: Any) -> list[tuple[int, ...]]:
    return [tuple(int(x) for x in element) for element in elements]


def slow(x: Any) -> Any:
    time.sleep(0.005)
    return x


def dynamic_job(dataset: Dataset, cluster: Any, job_name: str | None) -> Dataset:
    """How dynamic_sharding_test.py distributes: DYNAMIC, under a job name."""
    return dataset.apply(service.distribute(DYNAMIC, cluster.target, job_name=job_name))


@pytest.fixture(params=["dynamic_sharding_test", "distributed_epoch_test"])
def dynamic(request: pytest.FixtureRequest, name: str) -> Distribute:
    """Distribute as the TensorFlow file named by the parameter does."""
    if request.param == "dynamic_sharding_test":
        return lambda dataset, cluster: dynamic_job(dataset, cluster, name)
    return lambda dataset, cluster: dataset.apply(
        service.distribute("distributed_epoch", cluster.target))


# ----- scenarios of both files ----------------------------------------------------------------

def test_basic(cluster2, dynamic):
    """testBasic."""
    assert sorted(ints(dynamic(Dataset.range(100), cluster2))) == list(range(100))


def test_tensor_slices(cluster2, dynamic):
    """testTensorSlices."""
    values = [5, 1, 2, 4]
    dataset = dynamic(Dataset.from_tensor_slices(values), cluster2)
    assert sorted(ints(dataset)) == sorted(values)


def test_interleave(cluster2, dynamic):
    """testInterleave."""
    elements = [1, 5, 0]
    dataset = Dataset.from_tensor_slices(elements).interleave(
        lambda x: Dataset.from_tensor_slices([x]))
    assert sorted(ints(dynamic(dataset, cluster2))) == sorted(elements)


def test_parallel_interleave(cluster2, dynamic):
    """testParallelInterleave."""
    elements = [1, 5, 0]
    dataset = Dataset.from_tensor_slices(elements).interleave(
        lambda x: Dataset.from_tensor_slices([x]), num_parallel_calls=cv.data.AUTOTUNE)
    assert sorted(ints(dynamic(dataset, cluster2))) == sorted(elements)


def test_flat_map(cluster2, dynamic):
    """testFlatMap."""
    elements = [1, 5, 0]
    dataset = Dataset.from_tensor_slices(elements).flat_map(
        lambda x: Dataset.from_tensor_slices([x]))
    assert sorted(ints(dynamic(dataset, cluster2))) == sorted(elements)


def test_group_by_window(cluster2, dynamic):
    """testGroupByWindow: the datasets reduce_func makes are read whole on the worker (the
    splits feed only the pipeline's source), so a zip with a range inside works."""
    elements = [1, 5, 0]

    def reduce_fn(_, window):
        return Dataset.zip((window, Dataset.range(100)))

    dataset = Dataset.from_tensor_slices(elements).group_by_window(
        lambda x: 0, reduce_fn, window_size=3)
    results = pairs(dynamic(dataset, cluster2))
    assert sorted(x for x, _ in results) == sorted(elements)
    assert all(x in elements for x, _ in results)


def test_repeat_before_distribution(cluster2, dynamic):
    """testRepeatBeforeDistribution (distributed_epoch_test.py: testRepeat)."""
    dataset = dynamic(Dataset.range(20).repeat(5), cluster2)
    assert sorted(ints(dataset)) == sorted(list(range(20)) * 5)


def test_forever_repeat(cluster2, dynamic):
    """testForeverRepeat: every element comes round often in an endless epoch."""
    iterator = iter(dynamic(Dataset.range(20).repeat(), cluster2))
    counts = collections.Counter(int(next(iterator)) for _ in range(1000))
    iterator.close()
    assert all(counts[i] > 1000 / 20 / 2 for i in range(20)), counts


@pytest.mark.timeout(40)
@pytest.mark.parametrize("source, worker_timeout_ms", [
    ("dynamic_sharding_test", 200),
    ("distributed_epoch_test", 200),
    pytest.param("dynamic_sharding_test", None, id="dynamic_sharding_test-default_timeout"),
])
def test_forever_repeat_few_elements(make_cluster, read_within, source, worker_timeout_ms):
    """testForeverRepeatFewElements: fewer elements than workers, so some workers get none in
    a repetition; with all but one worker stopped, reading goes on.

    TensorFlow's test cluster declares a silent worker lost after 200 ms; its reader skips a
    failing worker at once, so the promise does not depend on that timeout. The last case
    keeps convoy's default timeout."""
    cluster = make_cluster(5, worker_timeout_ms=worker_timeout_ms,
                           job_gc_check_interval_ms=1000)
    dataset = Dataset.range(1).repeat()
    if source == "dynamic_sharding_test":
        dataset = dynamic_job(dataset, cluster, "job_name")
    else:
        dataset = dataset.apply(service.distribute("distributed_epoch", cluster.target))
    iterator = iter(dataset)
    assert ints(read_within(iterator, 10.0, 20)) == [0] * 20
    cluster.stop_workers([0, 1, 2, 3])
    assert ints(read_within(iterator, 10.0, 20)) == [0] * 20
    iterator.close()


def test_shuffle_and_repeat(cluster2, dynamic):
    """testShuffleAndRepeat."""
    dataset = dynamic(Dataset.range(20).shuffle(20).repeat(5), cluster2)
    assert sorted(ints(dataset)) == sorted(list(range(20)) * 5)


def test_zip(cluster1, dynamic):
    """testZip."""
    numbers = Dataset.range(10)
    dataset = dynamic(Dataset.zip(numbers, numbers), cluster1)
    assert pairs(dataset) == [(i, i) for i in range(10)]


def test_nested_zip(cluster1, dynamic):
    """testNestedZip."""
    a = Dataset.range(10)
    dataset = dynamic(Dataset.zip((a, a, Dataset.zip((a, a)), a)), cluster1)
    results = [(int(w), int(x), (int(y[0]), int(y[1])), int(z)) for w, x, y, z in dataset]
    assert results == [(i, i, (i, i), i) for i in range(10)]


def test_imbalanced_zip(cluster1, dynamic):
    """testImbalancedZip: zip ends with its shorter input."""
    dataset = dynamic(Dataset.zip(Dataset.range(200), Dataset.range(1000)), cluster1)
    assert pairs(dataset) == [(i, i) for i in range(200)]


def test_imbalanced_zip_multi_worker(cluster3, dynamic):
    """testImbalancedZipMultiWorker: the pairs may not line up, but there are 200 of them."""
    dataset = dynamic(Dataset.zip(Dataset.range(200), Dataset.range(1000)), cluster3)
    assert len(list(dataset)) == 200


def test_zip_different_rates(cluster3, dynamic):
    """testZipDifferentRates: the filtered input has 10 elements, so 10 pairs in all. (A slow
    map keeps one worker from taking every split before the others start.)"""
    filtered = Dataset.range(100).filter(lambda x: x % 10 == 0)
    dataset = dynamic(Dataset.zip(Dataset.range(100).map(slow), filtered), cluster3)
    assert len(list(dataset)) == 10


def test_zip_different_repeats(cluster3, dynamic):
    """testZipDifferentRepeats."""
    dataset = dynamic(Dataset.zip(Dataset.range(50), Dataset.range(10).repeat(10)), cluster3)
    assert len(list(dataset)) == 50


def test_sample_from_datasets(cluster3, dynamic, request):
    """testSampleFromDatasets. dynamic_sharding_test.py checks that the frequencies follow the
    order of the weights in 200 samples; distributed_epoch_test.py checks them with a
    chi-squared bound over 5000 samples for three sets of weights."""
    if request.node.callspec.params["dynamic"] == "dynamic_sharding_test":
        checks = [([0.6, 0.3, 0.1], 200)]
    else:
        random_weights = np.random.default_rng(1619).random(5)
        checks = [([0.85, 0.05, 0.1], 5000), (list(random_weights / random_weights.sum()), 5000),
                  ([1.0], 5000)]
    for weights, num_samples in checks:
        dataset = Dataset.sample_from_datasets(
            [Dataset.from_tensors(i).repeat() for i in range(len(weights))], weights)
        freqs = np.zeros(len(weights))
        for value in dynamic(dataset, cluster3).take(num_samples):
            freqs[int(value)] += 1
        if num_samples == 200:
            assert freqs[0] > freqs[1] > freqs[2], freqs
        else:
            expected = np.asarray(weights)
            chi2 = np.sum((freqs / num_samples - expected) ** 2 / expected)
            assert chi2 < 1e-2, (weights, freqs)


@pytest.mark.parametrize("num_workers", [1, 3])
def test_choose_from_datasets(make_cluster, dynamic, num_workers):
    """testChooseFromDatasets: every worker reads the whole choice dataset and has its own
    share of each endless input, so each worker gives every choice once."""
    cluster = make_cluster(num_workers)
    words = [b"foo", b"bar", b"baz"]
    choices = np.random.randint(3, size=(15,), dtype=np.int64)
    dataset = Dataset.choose_from_datasets(
        [Dataset.from_tensors(w).repeat() for w in words], Dataset.from_tensor_slices(choices))
    results = [bytes(x) for x in dynamic(dataset, cluster)]
    expected = [words[i] for i in choices] * num_workers
    if num_workers == 1:
        assert results == expected
    else:
        assert sorted(results) == sorted(expected)


def test_distributed_dataset(cluster1, make_cluster, dynamic):
    """testDistributedDataset: a pipeline that reads from the service has no splits to hand
    out, so DYNAMIC refuses it (TensorFlow on the read; convoy may refuse in distribute)."""
    numbers = list(range(10)) * 5
    inner = Dataset.from_tensor_slices(numbers).apply(
        service.distribute("parallel_epochs", cluster1.target)).map(lambda x: x + 1)
    other = make_cluster(1)
    with pytest.raises(InvalidArgumentError, match="cannot split `distribute`"):
        list(dynamic(inner, other))


# ----- scenarios of dynamic_sharding_test.py only ---------------------------------------------

def test_no_job_name(cluster2):
    """testNoJobName."""
    assert sorted(ints(dynamic_job(Dataset.range(100), cluster2, None))) == list(range(100))


def test_repeat_after_distribution(cluster2, name):
    """testRepeatAfterDistribution."""
    dataset = dynamic_job(Dataset.range(20), cluster2, name).repeat(5)
    assert sorted(ints(dataset)) == sorted(list(range(20)) * 5)


def test_imbalanced_zip_and_repeat(cluster1, name):
    """testImbalancedZipAndRepeat."""
    dataset = Dataset.zip(Dataset.range(200), Dataset.range(1000)).repeat(3)
    assert pairs(dynamic_job(dataset, cluster1, name)) == [(i, i) for i in range(200)] * 3


def test_enumerate_replicate_on_split(cluster3, name, read_within):
    """testEnumerateReplicateOnSplit: enumerate counts on each worker, so every index comes
    once per worker; read until all three workers have reached index 10."""
    dataset = Dataset.from_tensor_slices(["a", "b", "c"]).repeat().enumerate()
    iterator = iter(dynamic_job(dataset, cluster3, name))
    counts: collections.Counter[int] = collections.Counter()

    def until_all_reach_ten() -> Any:
        for index, _ in iterator:
            counts[int(index)] += 1
            if counts[10] == 3:
                return
            yield

    try:
        read_within(until_all_reach_ten(), 5.0)
    finally:
        iterator.close()
    assert all(counts[i] == 3 for i in range(10)), counts


@pytest.mark.parametrize("num_workers", [
    1, 3])
def test_concatenate(make_cluster, num_workers):
    """testConcatenate."""
    cluster = make_cluster(num_workers)
    dataset = Dataset.range(100).concatenate(Dataset.range(100, 200))
    results = ints(dynamic_job(dataset, cluster, "job_name"))
    if num_workers > 1:
        results = sorted(results)
    assert results == list(range(200))


@pytest.mark.parametrize("already_written", [True, False])
def test_snapshot(cluster3, name, tmp_path, already_written):
    """testSnapshot: a ``snapshot``ed dataset cannot be split under DYNAMIC (each worker would
    write and read the whole snapshot directory), refused before any job runs. TensorFlow
    raises UnimplementedError ("Splitting is not implemented for snapshot datasets"); convoy
    refuses unsplittable pipelines with InvalidArgumentError naming the op. Under OFF each of
    the 3 workers reads (or writes, then reads) the whole snapshot."""
    dataset = Dataset.range(100).snapshot(str(tmp_path))
    if already_written:
        assert ints(dataset) == list(range(100))
    with pytest.raises(InvalidArgumentError, match="cannot split `snapshot`"):
        ints(dynamic_job(dataset, cluster3, name))
    if already_written:
        off = dataset.apply(service.distribute(OFF, cluster3.target))
        assert sorted(ints(off)) == sorted(list(range(100)) * 3)


def test_distributed_epoch(cluster2):
    """testDistributedEpoch: the string "distributed_epoch" is DYNAMIC."""
    dataset = Dataset.range(100).apply(service.distribute("distributed_epoch", cluster2.target))
    assert sorted(ints(dataset)) == list(range(100))


def test_flat_map_with_repeat(cluster3, name):
    """testFlatMapWithRepeat."""
    dataset = Dataset.range(5).flat_map(
        lambda _: Dataset.from_tensor_slices(["a", "b", "c"]).repeat(10))
    results = sorted(dynamic_job(dataset, cluster3, name))
    assert results == sorted([b"a", b"b", b"c"] * 50)


def test_multiple_registration(cluster2, name):
    """testMultipleRegistration: two distribute calls with one job name share the job."""
    dataset = Dataset.range(100)
    first = iter(dynamic_job(dataset, cluster2, name))
    second = iter(dynamic_job(dataset, cluster2, name))
    assert sorted(ints(list(first) + list(second))) == list(range(100))


def test_different_dataset_ids_for_same_job(cluster2, name):
    """testDifferentDatasetIdsForSameJob: from_dataset_id scopes job names by dataset id, so
    the same name on two ids is two jobs: two copies."""
    dataset = Dataset.range(100)
    readers = []
    for suffix in ("dataset_id1", "dataset_id2"):
        dataset_id = service.register_dataset(cluster2.address, dataset,
                                              dataset_id=f"{name}-{suffix}")
        readers.append(iter(service.from_dataset_id(DYNAMIC, cluster2.address, dataset_id,
                                                    element_spec=dataset.element_spec,
                                                    job_name="shared_job")))
    output = []
    for _ in range(5):
        output += [next(readers[0]), next(readers[1])]
    output += list(readers[0]) + list(readers[1])
    assert sorted(ints(output)) == sorted(list(range(100)) * 2)


def test_shuffle_files(cluster3, tmp_path):
    """DynamicShardingFilesTest.testShuffleFiles: the dispatcher hands out the (shuffled) file
    names; every record is read once."""
    filenames = []
    for file in range(5):
        path = str(tmp_path / f"tf_record.{file}.txt")
        with cv.data.TFRecordWriter(path) as writer:
            for record in range(5):
                writer.write(b"Record %d of file %d" % (record, file))
        filenames.append(path)
    shuffled = list(np.random.permutation(filenames))
    dataset = Dataset.from_tensor_slices(shuffled).interleave(cv.data.TFRecordDataset)
    dataset = dataset.apply(service.distribute(DYNAMIC, cluster3.target))
    expected = [b"Record %d of file %d" % (r, f) for f in range(5) for r in range(5)]
    assert sorted(bytes(x) for x in dataset) == sorted(expected)
