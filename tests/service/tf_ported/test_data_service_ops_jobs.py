"""Scenarios of TensorFlow's ``data_service_ops_test.py`` (tensorflow/python/data/experimental/
kernel_tests/service/) about job names, dataset ids, registration and garbage collection,
ported to convoy. Every test names the TensorFlow test it comes from.

On the shared clusters, job names and explicit dataset ids carry the test's own name (the
``name`` fixture) so that no two tests meet in one job.

Where convoy's reader differs by design: a convoy consumer asks a worker for many elements per
call (TensorFlow's asks for one), so on a small finite dataset it may have read the whole task
(and the worker finished it) by the time the first ``next()`` returns. The garbage-collection
scenarios, which count the tasks still running on a worker, read infinite datasets instead,
which keeps the tasks running as in TensorFlow's tests.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import cloudpickle
import numpy as np
import pytest

import convoy as cv
from convoy.errors import InvalidArgumentError, NotFoundError

cloudpickle.register_pickle_by_value(sys.modules[__name__])

Dataset = cv.data.Dataset
service = cv.data.service
OFF = service.ShardingPolicy.OFF

pytestmark = pytest.mark.timeout(60)


def ints(elements: Any) -> list[int]:
    return [int(x) for x in elements]


def distributed(dataset: Dataset, cluster: Any, mode: Any = "parallel_epochs",
                **kwargs: Any) -> Dataset:
    return dataset.apply(service.distribute(mode, cluster.target, **kwargs))


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {timeout_s} s"
        time.sleep(0.02)


# ----- job names ------------------------------------------------------------------------------

def test_empty_job_name_distribute(cluster1):
    """testEmptyJobNameDistribute."""
    with pytest.raises(InvalidArgumentError, match="`job_name` must not be empty"):
        distributed(Dataset.range(10), cluster1, job_name="")


def test_empty_job_name_from_dataset_id(cluster1):
    """testEmptyJobNameFromDatasetId."""
    dataset_id = service.register_dataset(cluster1.target, Dataset.range(10))
    with pytest.raises(InvalidArgumentError, match="`job_name` must not be empty"):
        service.from_dataset_id("parallel_epochs", cluster1.target, dataset_id, job_name="")


def test_non_string_job_name_distribute(cluster1):
    """testNonStringJobNameDistribute (TensorFlow passes a string tensor; here bytes)."""
    with pytest.raises(InvalidArgumentError, match="`job_name` must be a string"):
        distributed(Dataset.range(10), cluster1, job_name=b"foo")


def test_non_string_job_name_from_dataset_id(cluster1):
    """testNonStringJobNameFromDatasetId."""
    dataset_id = service.register_dataset(cluster1.target, Dataset.range(10))
    with pytest.raises(InvalidArgumentError, match="`job_name` must be a string"):
        service.from_dataset_id("parallel_epochs", cluster1.target, dataset_id,
                                job_name=b"foo")


def test_shared_job_name(make_cluster):
    """testSharedJobName: two consumers of one named job read alternately; both get elements
    and together every element once.

    A convoy reader fetches ahead as soon as its iterator exists, so how much the first
    consumer holds when the second arrives is a matter of timing. The first consumer here
    gets a moment to read ahead (until the worker's task is drained, at most 2 s) before the
    second starts: TensorFlow's promise does not depend on that moment."""
    cluster = make_cluster(1)

    def make() -> Dataset:
        return distributed(Dataset.range(1000).shuffle(1000), cluster, job_name="job_name")

    first = iter(make())
    deadline = time.monotonic() + 2
    while cluster.workers[0]._num_tasks() and time.monotonic() < deadline:
        time.sleep(0.02)
    second = iter(make())
    results = []
    for _ in range(1000 // 5):
        results.append(next(first))
        results.append(next(second))
    results += list(first) + list(second)
    assert sorted(ints(results)) == list(range(1000))


def test_different_job_names(cluster1, name):
    """testDifferentJobNames."""
    first = distributed(Dataset.range(10), cluster1, job_name=f"{name}1")
    second = distributed(Dataset.range(10), cluster1, job_name=f"{name}2")
    assert ints(first) == list(range(10))
    assert ints(second) == list(range(10))


def test_shared_job_name_multi_iteration(cluster1, name):
    """testSharedJobNameMultiIteration: the n-th iterators of both datasets share the n-th
    iteration of the job, so whoever comes second finds it finished."""
    first = distributed(Dataset.range(10), cluster1, job_name=name)
    second = distributed(Dataset.range(10), cluster1, job_name=name)
    assert ints(first) == list(range(10))
    assert ints(second) == []
    assert ints(second) == list(range(10))
    assert ints(first) == []


def test_shared_job_name_repeat(cluster1, name):
    """testSharedJobNameRepeat."""
    first = iter(distributed(Dataset.range(100), cluster1, job_name=name).repeat(3))
    second = iter(distributed(Dataset.range(100), cluster1, job_name=name).repeat(3))
    results = [next(first) for _ in range(60)] + [next(second) for _ in range(60)]
    results += list(first) + list(second)
    assert sorted(ints(results)) == sorted(list(range(100)) * 3)


def test_shared_job_name_repeat_empty_job(cluster1, name):
    """testSharedJobNameRepeatEmptyJob: the second consumer's first repetitions are empty (the
    first consumer read them), and repeat() goes on to one that is not."""
    dataset = Dataset.range(10)
    first = iter(distributed(dataset, cluster1, OFF, job_name=name).repeat())
    second = iter(distributed(dataset, cluster1, OFF, job_name=name).repeat())
    try:
        assert ints(next(first) for _ in range(30)) == list(range(10)) * 3
        assert len([next(second) for _ in range(30)]) == 30
    finally:
        first.close()
        second.close()


def test_shared_job_name_multiple_epochs(cluster1, name):
    """testSharedJobNameMultipleEpochs: each new iterator of one dataset is a new iteration."""
    dataset = distributed(Dataset.range(10), cluster1, job_name=name)
    for _ in range(5):
        assert ints(dataset) == list(range(10))


# ----- dataset ids and registration ------------------------------------------------------------

def test_string_dataset_id(cluster1, name):
    """testStringDatasetId: dataset ids are strings; from_dataset_id with an element_spec."""
    dataset = Dataset.range(10)
    dataset_id = service.register_dataset(cluster1.target, dataset)
    assert isinstance(dataset_id, str)
    read = service.from_dataset_id(OFF, cluster1.target, dataset_id,
                                   element_spec=dataset.element_spec, job_name=name)
    assert ints(read) == list(range(10))


def test_py_string_dataset_id(cluster1, name):
    """testPyStringDatasetId: the id as a plain Python string, without an element_spec."""
    dataset_id = service.register_dataset(cluster1.target, Dataset.range(10))
    read = service.from_dataset_id(OFF, cluster1.target, str(dataset_id), job_name=name)
    assert ints(read) == list(range(10))


def test_from_dataset_id(cluster1):
    """testFromDatasetId."""
    dataset = Dataset.range(10)
    dataset_id = service.register_dataset(cluster1.address, dataset)
    read = service.from_dataset_id("parallel_epochs", cluster1.target, dataset_id,
                                   dataset.element_spec)
    assert ints(read) == list(range(10))


def test_from_dataset_id_shared_jobs(cluster2, name):
    """testFromDatasetIdSharedJobs: two registered datasets, two consumers of each under one
    job name (scoped to the dataset id), all four read together: every element once."""
    datasets = [Dataset.range(20).map(np.int32), Dataset.from_tensor_slices(list(range(20, 40)))]
    dataset_ids = [f"{name}-dataset_1", f"{name}-dataset_2"]
    for dataset, dataset_id in zip(datasets, dataset_ids):
        service.register_dataset(cluster2.address, dataset, dataset_id=dataset_id)
    readers = [service.from_dataset_id("distributed_epoch", cluster2.target, dataset_id,
                                       dataset.element_spec, job_name="shared_job")
               for _ in range(2) for dataset, dataset_id in zip(datasets, dataset_ids)]
    # TensorFlow interleaves a from_tensor_slices of the datasets; here an index picks each.
    together = Dataset.range(len(readers)).interleave(lambda i: readers[int(i)],
                                                      cycle_length=len(readers))
    assert sorted(ints(together)) == list(range(40))


def test_registering_dataset_as_tf_function(cluster1):
    """testRegisteringDatasetAsTfFunction. There is no tf.function; what carries over is the
    service given as a (protocol, address) pair."""
    dataset = Dataset.range(10)
    dataset_id = service.register_dataset(("grpc", cluster1.address), dataset)
    read = service.from_dataset_id("parallel_epochs", cluster1.target, dataset_id,
                                   dataset.element_spec)
    assert ints(read) == list(range(10))


def test_from_dataset_id_multiple_components(cluster1):
    """testFromDatasetIdMultipleComponents."""
    numbers = Dataset.range(10)
    dataset = Dataset.zip({"a": (numbers, numbers), "b": numbers})
    dataset_id = service.register_dataset(cluster1.address, dataset)
    output = list(service.from_dataset_id("parallel_epochs", cluster1.target, dataset_id,
                                          dataset.element_spec))
    assert [(int(e["a"][0]), int(e["a"][1]), int(e["b"])) for e in output] == [
        (i, i, i) for i in range(10)]


def test_from_dataset_id_wrong_element_spec(cluster1):
    """testFromDatasetIdWrongElementSpec. TensorFlow decodes elements by the given spec and
    fails on a wrong one. convoy's elements carry their own dtype and shape, and the spec is
    only what the dataset reports: reading still gives the registered elements, intact."""
    dataset_id = service.register_dataset(cluster1.address, Dataset.range(10))
    wrong_spec = cv.data.TensorSpec((), np.float32)
    read = service.from_dataset_id("parallel_epochs", cluster1.target, dataset_id, wrong_spec)
    assert read.element_spec == wrong_spec
    elements = list(read)
    assert [np.asarray(e).dtype for e in elements] == [np.int64] * 10
    assert ints(elements) == list(range(10))


def test_from_dataset_id_not_registered(cluster1):
    """testFromDatasetIdNotRegistered."""
    with pytest.raises(NotFoundError, match="Dataset id '?UnregisteredID'? not found"):
        dataset = service.from_dataset_id(OFF, cluster1.target, "UnregisteredID",
                                          cv.data.TensorSpec((), np.int64))
        next(iter(dataset))


def test_register_different_datasets(cluster1):
    """testRegisterDifferentDatasets."""
    id_1 = service.register_dataset(cluster1.address, Dataset.range(10))
    id_2 = service.register_dataset(cluster1.address, Dataset.range(20))
    assert id_1 != id_2


def test_register_with_explicit_dataset_id(cluster1, name):
    """testRegisterWithExplicitDatasetId."""
    dataset = Dataset.range(10)
    dataset_id = service.register_dataset(cluster1.target, dataset, dataset_id=name)
    assert dataset_id == name
    for which in (dataset_id, name):
        read = service.from_dataset_id(OFF, cluster1.target, which, dataset.element_spec)
        assert ints(read) == list(range(10))


def test_from_registered_string_dataset_id(cluster1, name):
    """testFromRegisteredStringDatasetId."""
    dataset = Dataset.range(10)
    service.register_dataset(cluster1.target, dataset, dataset_id=name)
    read = service.from_dataset_id(OFF, cluster1.target, name, dataset.element_spec)
    assert ints(read) == list(range(10))


def test_register_same_dataset_ids(cluster1, name):
    """testRegisterSameDatasetIds: one id, so one job: the second reader finds it finished."""
    dataset_id1 = service.register_dataset(cluster1.target, Dataset.range(10), dataset_id=name)
    dataset_id2 = service.register_dataset(cluster1.target, Dataset.range(10), dataset_id=name)
    first = service.from_dataset_id(OFF, cluster1.target, dataset_id1, job_name="job_name")
    second = service.from_dataset_id(OFF, cluster1.target, dataset_id2, job_name="job_name")
    assert ints(first) == list(range(10))
    assert ints(second) == []


@pytest.mark.parametrize("different_dataset_id", [None, "another_dataset_id"])
def test_register_different_dataset_ids(cluster1, name, different_dataset_id):
    """testRegisterDifferentDatasetIds: different ids, so different jobs despite one name."""
    dataset_id1 = service.register_dataset(cluster1.target, Dataset.range(10),
                                           dataset_id=f"{name}-dataset_id")
    dataset_id2 = service.register_dataset(
        cluster1.target, Dataset.range(10),
        dataset_id=different_dataset_id and f"{name}-{different_dataset_id}")
    assert dataset_id1 != dataset_id2
    for dataset_id in (dataset_id1, dataset_id2):
        read = service.from_dataset_id(OFF, cluster1.target, dataset_id, job_name="job_name")
        assert ints(read) == list(range(10))


def test_datasets_do_not_match(cluster1, name):
    """testDatasetsDoNotMatch."""
    service.register_dataset(cluster1.target, Dataset.range(10), compression=None,
                             dataset_id=name)
    with pytest.raises(InvalidArgumentError,
                       match="Datasets with the same ID should have the same structure"):
        service.register_dataset(cluster1.target,
                                 Dataset.from_tensor_slices(list("Test dataset.")),
                                 compression=None, dataset_id=name)


# ----- garbage collection ----------------------------------------------------------------------

GC_FAST = {"job_gc_check_interval_ms": 50, "job_gc_timeout_ms": 20}


@pytest.mark.parametrize("job_name", [None, "test"])
def test_gc_unused_job(make_cluster, job_name):
    """testGcUnusedJob: a job whose only iterator is dropped is collected; its task goes."""
    cluster = make_cluster(1, **GC_FAST)
    iterator = iter(distributed(Dataset.range(100).repeat(), cluster, job_name=job_name))
    assert int(next(iterator)) == 0
    wait_for(lambda: cluster.workers[0]._num_tasks() == 1, "task on the worker")
    del iterator
    wait_for(lambda: cluster.workers[0]._num_tasks() == 0, "garbage collection")


def _infinite_job(cluster: Any, job_name: str, mode: str = "parallel_epochs") -> Any:
    return iter(distributed(Dataset.range(1000).repeat(), cluster, mode, job_name=job_name))


def _tasks(cluster: Any) -> int:
    return cluster.workers[0]._num_tasks()


def test_dont_gc_used_job(make_cluster):
    """testDontGcUsedJob: of two jobs whose iterators are dropped, the one that still has
    another iterator is kept."""
    cluster = make_cluster(1, **GC_FAST)
    it1, it2 = _infinite_job(cluster, "test1"), _infinite_job(cluster, "test2")
    it3 = _infinite_job(cluster, "test2")  # keeps job test2 alive
    wait_for(lambda: _tasks(cluster) == 2, "two tasks on the worker")
    del it1, it2
    wait_for(lambda: _tasks(cluster) <= 1, "garbage collection")
    time.sleep(0.5)  # ten collection periods
    assert _tasks(cluster) == 1
    it3.close()


def test_jobs_with_visitation_guarantees_are_collected_too(make_cluster):
    """From testDontGcJobsWithVisitationGuarantees, where convoy differs on purpose:
    TensorFlow keeps a DYNAMIC job without iterators forever (starting it over would visit
    elements again); convoy collects it after job_gc_timeout_ms like any other unfinished
    iteration (its split log would otherwise grow the dispatcher for good), and reopening it
    starts afresh (docs/data-service.md, jobs' lifecycle)."""
    cluster = make_cluster(1, **GC_FAST)
    it1 = _infinite_job(cluster, "test1")
    it2 = _infinite_job(cluster, "test2", "distributed_epoch")
    wait_for(lambda: _tasks(cluster) == 2, "two tasks on the worker")
    del it1, it2
    wait_for(lambda: _tasks(cluster) == 0, "garbage collection of both")


def test_gc_and_recreate(make_cluster):
    """testGcAndRecreate: the same named job, created and collected three times."""
    cluster = make_cluster(3, **GC_FAST)
    for _ in range(3):
        iterator = iter(distributed(Dataset.range(1000).repeat(), cluster, job_name="test"))
        for _ in range(50):
            next(iterator)
        del iterator
        wait_for(lambda: cluster.num_tasks_on_workers() == 0, "garbage collection")


def test_gc_client(make_cluster):
    """testGcClient: a client silent for longer than client_timeout_ms is forgotten and its
    next read fails. TensorFlow makes its client silent with a 10 s task-refresh hint; a convoy
    client heartbeats every 0.2 s, which is already silent for a 50 ms timeout."""
    cluster = make_cluster(1, client_timeout_ms=50, **GC_FAST)
    iterator = iter(distributed(Dataset.range(1000).repeat(), cluster, OFF))
    with pytest.raises(NotFoundError, match="Unknown iteration client id"):
        next(iterator)
        time.sleep(3)
        for _ in iterator:
            pass


def test_keep_client_alive_before_reading(make_cluster):
    """testKeepClientAliveBeforeReading: an iterator that heartbeats is kept while unread."""
    cluster = make_cluster(1, client_timeout_ms=1000, **GC_FAST)
    iterator = iter(distributed(Dataset.range(1000), cluster, OFF))
    time.sleep(3)
    assert ints(iterator) == list(range(1000))
