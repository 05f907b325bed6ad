"""Scenarios of TensorFlow's ``data_service_ops_test.py`` (tensorflow/python/data/experimental/
kernel_tests/service/) about distributing and reading pipelines, ported to convoy. The job,
registration and garbage-collection scenarios of the same file are in
``test_data_service_ops_jobs.py``.

Every test names the TensorFlow test it comes from. Elements are numpy values (``range``
yields Python ints) instead of tensors.

Not ported (the feature does not exist in convoy):

- ``testInsideFunction``: there is no ``tf.function`` / graph mode; every read is eager.
- ``testApplyDeterminismOption``: convoy's ``interleave`` yields in order even with
  ``deterministic=False`` (also locally), so there is no non-determinism to carry over.
- ``testStatefulError``: there is no ``experimental_external_state_policy``; stateful Python
  functions always travel with the pipeline (``testStatefulNoError`` is ported).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import cloudpickle
import numpy as np
import pytest

import convoy as cv
from convoy.errors import InvalidArgumentError, NotFoundError

# The pipelines' functions are unpickled by the workers; keep them independent of this module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

Dataset = cv.data.Dataset
service = cv.data.service
OFF = service.ShardingPolicy.OFF
DYNAMIC = service.ShardingPolicy.DYNAMIC

pytestmark = pytest.mark.timeout(60)


def ints(elements: Any) -> list[int]:
    return [int(x) for x in elements]


def distributed(dataset: Dataset, cluster: Any, mode: Any = "parallel_epochs",
                **kwargs: Any) -> Dataset:
    return dataset.apply(service.distribute(mode, cluster.target, **kwargs))


@pytest.mark.parametrize("work_dir, fault_tolerant_mode", [
    (False, False), (True, False), (True, True)],
    ids=["no_work_dir", "work_dir", "work_dir_fault_tolerant"])
def test_distribute_basic(make_cluster, work_dir, fault_tolerant_mode):
    """testDistributeBasic, over TensorFlow's all_cluster_configurations()."""
    cluster = make_cluster(1, work_dir=work_dir, fault_tolerant_mode=fault_tolerant_mode)
    assert ints(distributed(Dataset.range(10), cluster)) == list(range(10))


def test_distribute_invalid_compression(cluster1):
    """testDistributeInvalidCompression."""
    with pytest.raises(InvalidArgumentError, match="compression"):
        distributed(Dataset.range(10), cluster1, compression="foo")


def test_distribute_ragged(cluster1):
    """testDistributeRagged: ragged batches (dense_to_ragged_batch) cross the service; read
    with ``to_tensor()``, rows of different lengths padded with zeros."""
    dataset = Dataset.from_tensor_slices([1, 5, 3, 2, 8]).map(np.arange).apply(
        cv.data.experimental.dense_to_ragged_batch(2))
    results = list(distributed(dataset, cluster1))
    assert all(isinstance(r, cv.RaggedTensor) for r in results)
    assert [r.to_tensor().tolist() for r in results] == [[[0, 0, 0, 0, 0], [0, 1, 2, 3, 4]],
                                                         [[0, 1, 2], [0, 1, 0]],
                                                         [[0, 1, 2, 3, 4, 5, 6, 7]]]


@pytest.mark.parametrize("init_source", ["textfile", "keyvaluetensor", "dataset"])
def test_distribute_lookup_table(cluster1, tmp_path, init_source):
    """testDistributeLookupTable. A table is a Python dict captured by the map function; it is
    built from the same three sources as TensorFlow's initializers."""
    values = [10, 11]
    if init_source == "textfile":
        path = tmp_path / "table.txt"
        path.write_text("".join(f"{v}\n" for v in values))
        table = {i: int(line) for i, line in enumerate(path.read_text().splitlines())}
    elif init_source == "keyvaluetensor":
        table = dict(zip(np.arange(len(values)).tolist(), values))
    else:
        pairs = Dataset.zip(Dataset.range(len(values)), Dataset.from_tensor_slices(values))
        table = {int(k): int(v) for k, v in pairs}
    dataset = Dataset.range(3).map(lambda x: table.get(int(x), -1))
    assert ints(distributed(dataset, cluster1)) == [10, 11, -1]


@pytest.mark.parametrize("value_rank", [0, 1])
def test_distribute_mutable_hash_table(cluster1, value_rank):
    """testDistributeMutableHashTable: entries inserted before distribute reach the workers."""
    def value(v: int) -> Any:
        for _ in range(value_rank):
            v = [v, v]
        return v

    table: dict[int, Any] = {}
    table.update({0: value(10), 1: value(11)})
    default = value(-1)
    dataset = Dataset.range(3).map(lambda x: np.asarray(table.get(int(x), default)))
    results = [r.tolist() for r in distributed(dataset, cluster1)]
    assert results == [value(10), value(11), default]


@pytest.mark.parametrize("shuffle_seed", [None, 10])
def test_shuffle_order(cluster2, shuffle_seed):
    """testShuffleOrder: with two workers the output is two shuffled copies of the range,
    interleaved; without a seed the two orders differ, with a seed they are equal."""
    dataset = Dataset.range(100).shuffle(100, seed=shuffle_seed)
    first_order: dict[int, int] = {}
    second_order: dict[int, int] = {}
    for element in ints(distributed(dataset, cluster2)):
        order = second_order if element in first_order else first_order
        order[element] = len(order)
    assert len(first_order) == len(second_order) == 100
    if shuffle_seed is None:
        assert first_order != second_order
    else:
        assert first_order == second_order


def test_multiple_epochs(cluster1):
    """testMultipleEpochs."""
    dataset = distributed(Dataset.range(3), cluster1)
    for _ in range(10):
        assert ints(dataset) == [0, 1, 2]


def test_repeated_dataset(cluster1):
    """testRepeatedDataset."""
    dataset = distributed(Dataset.range(10), cluster1).repeat(5)
    assert ints(dataset) == list(range(10)) * 5


def test_concurrent_epoch(cluster1):
    """testConcurrentEpoch: three anonymous jobs read in lockstep, each gets the range."""
    iterators = [iter(distributed(Dataset.range(10), cluster1)) for _ in range(3)]
    results: list[list[int]] = [[], [], []]
    for _ in range(10):
        for index, iterator in enumerate(iterators):
            results[index].append(int(next(iterator)))
    assert results == [list(range(10))] * 3


def test_multi_worker(cluster3):
    """testMultiWorker: OFF, every worker produces the whole range."""
    assert sorted(ints(distributed(Dataset.range(10), cluster3))) == sorted(list(range(10)) * 3)


def test_from_generator(cluster1):
    """testFromGenerator."""
    def generator():
        yield from range(10)

    dataset = Dataset.from_generator(generator,
                                     output_signature=cv.data.TensorSpec((), np.int64))
    assert ints(distributed(dataset, cluster1, OFF)) == list(range(10))


def test_max_outstanding_requests(cluster3):
    """testMaxOutstandingRequests."""
    dataset = distributed(Dataset.range(10), cluster3, max_outstanding_requests=1)
    assert sorted(ints(dataset)) == sorted(list(range(10)) * 3)


def test_stateful_no_error(cluster3):
    """testStatefulNoError: a map drawing random numbers runs on the workers."""
    dataset = Dataset.range(10).map(lambda _: np.random.uniform())
    results = [float(x) for x in distributed(dataset, cluster3)]
    assert len(results) == 30 and all(0.0 <= x < 1.0 for x in results)


def test_distribute_from_interleave(cluster1):
    """testDistributeFromInterleave: each interleaved input is its own distributed dataset."""
    def interleave_fn(x: int) -> Dataset:
        return distributed(Dataset.range(10 * x, 10 * x + 2), cluster1)

    dataset = Dataset.range(2).interleave(interleave_fn, cycle_length=2)
    assert ints(dataset) == [0, 10, 1, 11]


def test_distribute_non_string_addresses():
    """testDistributeNonStringAddresses."""
    with pytest.raises(InvalidArgumentError, match="`service` must be a string"):
        Dataset.range(10).apply(service.distribute("parallel_epochs", 1))


def test_distribute_empty_address():
    """testDistributeEmptyAddress."""
    with pytest.raises(InvalidArgumentError, match="^`service` must not be empty$"):
        Dataset.range(10).apply(service.distribute("parallel_epochs", ""))


def test_distribute_invalid_protocol(cluster1):
    """testDistributeInvalidProtocol: TensorFlow fails on the read with NotFound naming the
    protocol; convoy already refuses it in distribute, with the same error class."""
    with pytest.raises(NotFoundError, match="'grp'"):
        dataset = Dataset.range(10).apply(service.distribute(
            "parallel_epochs", "grp://" + cluster1.address))
        list(dataset)


def test_distribute_invalid_processing_mode():
    """testDistributeInvalidProcessingMode."""
    with pytest.raises(InvalidArgumentError, match="should be a convoy.data.service.Sharding"
                                                   "Policy, \"parallel_epochs\" or "
                                                   "\"distributed_epoch\". Got 'invalid'."):
        Dataset.range(10).apply(service.distribute("invalid", "grpc://localhost:5000"))


def test_zip_different_processing_modes_datasets(cluster1):
    """testZipDifferentProcessingModesDatasets."""
    first = distributed(Dataset.range(100), cluster1, "distributed_epoch")
    second = distributed(Dataset.range(100), cluster1, "parallel_epochs")
    pairs = sorted((int(a), int(b)) for a, b in Dataset.zip(first, second))
    assert pairs == [(i, i) for i in range(100)]


def test_zip_different_processing_modes_datasets_shared_job_name(cluster1, name):
    """testZipDifferentProcessingModesDatasetsSharedJobName."""
    first = distributed(Dataset.range(100), cluster1, "distributed_epoch", job_name=name)
    second = distributed(Dataset.range(100), cluster1, "parallel_epochs", job_name=name)
    with pytest.raises(InvalidArgumentError, match="but found an existing job with diff"):
        list(Dataset.zip(first, second))


def test_cancellation(cluster1):
    """testCancellation (skipped in TensorFlow, b/162521601): the first element comes at
    once, the second only after a long sleep; dropping the iterator after the first element
    must not wait for the second."""
    def slow(x: int) -> int:
        time.sleep(5)
        return x

    dataset = Dataset.range(1).concatenate(Dataset.range(1).map(slow))
    iterator = iter(distributed(dataset, cluster1).prefetch(1))
    assert int(next(iterator)) == 0
    start = time.monotonic()
    iterator.close()
    del iterator
    assert time.monotonic() - start < 2


@pytest.mark.timeout(30)
def test_double_distribute(make_cluster, read_within):
    """testDoubleDistribute: a worker's pipeline reads another job of the same service. Ten
    elements take well under a second when this works; 5 s is a hang."""
    cluster = make_cluster(1)
    dataset = distributed(distributed(Dataset.range(10), cluster), cluster)
    assert ints(read_within(dataset, 5.0)) == list(range(10))


def test_two_level_distribute(make_cluster):
    """testTwoLevelDistribute: a group_by_window between two distributes, on two clusters.
    The first cluster's three workers each produce every string (OFF); the windows are large
    enough to gather all strings of one length, so each batch comes out three times."""
    first, second = make_cluster(3), make_cluster(1)
    num_sizes, size_repeats = 10, 5
    strings = np.array([b"a" * i for i in range(num_sizes)] * size_repeats, dtype=object)
    dataset = distributed(Dataset.from_tensor_slices(strings).shuffle(len(strings)), first)
    dataset = dataset.group_by_window(key_func=lambda x: np.int64(len(x)),
                                      reduce_func=lambda _, x: x.batch(size_repeats),
                                      window_size=3 * size_repeats)
    results = [b.tolist() for b in distributed(dataset, second)]
    assert len(results) == 3 * num_sizes
    for i in range(0, len(results), 3):
        assert results[i] == results[i + 1] == results[i + 2]
        assert len(set(results[i])) == 1 and len(results[i]) == size_repeats
    assert sorted(len(b[0]) for b in results[::3]) == list(range(num_sizes))


def test_distribute_sparse(cluster1):
    """testDistributeSparse: a SparseTensor element crosses the service intact."""
    element = cv.SparseTensor(indices=[[0]], values=np.array([0], dtype=np.int32),
                              dense_shape=[1])
    (result,) = list(distributed(Dataset.from_tensors(element), cluster1))
    assert isinstance(result, cv.SparseTensor)
    assert result.indices.tolist() == [[0]]
    assert result.values.tolist() == [0] and result.values.dtype == np.int32
    assert result.dense_shape.tolist() == [1]


def test_distribute_refuses_nested_datasets(cluster1):
    """Our addition: window's datasets cannot be sent; flattened ones can."""
    with pytest.raises(InvalidArgumentError, match="nested datasets `window` makes"):
        distributed(Dataset.range(6).window(2), cluster1)
    flat = distributed(Dataset.range(6).window(2).flat_map(lambda w: w.batch(2)), cluster1)
    assert [b.tolist() for b in flat] == [[0, 1], [2, 3], [4, 5]]


def test_distribute_large_graph(cluster1):
    """testDistributeLargeGraph: an 8 MB element, more than gRPC's default 4 MB message."""
    tensor = np.ones((2, 1000, 1000), dtype=np.float32)
    results = list(distributed(Dataset.from_tensors(tensor), cluster1))
    assert len(results) == 1 and np.array_equal(results[0], tensor)


def test_batch_drops_all_elements(cluster2):
    """testBatchDropsAllElements."""
    dataset = Dataset.range(10).batch(1000, drop_remainder=True)
    assert list(distributed(dataset, cluster2, OFF)) == []


def test_batch_does_not_drop_remainder(cluster2):
    """testBatchDoesNotDropRemainder: one short batch from each of the two workers."""
    dataset = Dataset.range(10).batch(1000, drop_remainder=False)
    results = [batch.tolist() for batch in distributed(dataset, cluster2, OFF)]
    assert results == [list(range(10))] * 2


def test_variables(cluster1):
    """testVariables. convoy has no variables in pipelines: the map function captures a numpy
    value, which travels with the pipeline to the worker."""
    v = np.int64(10)
    dataset = Dataset.range(3).map(lambda x: x + v)
    assert ints(distributed(dataset, cluster1)) == [10, 11, 12]


def test_no_sharding_policy(cluster1):
    """testNoShardingPolicy."""
    assert ints(distributed(Dataset.range(20), cluster1, OFF)) == list(range(20))


# ----- DataServiceOpsGrpcDataTransferTest ---------------------------------------------------

def test_explicit_protocol_from_dataset_id(cluster1):
    """testExplicitProtocolFromDatasetId."""
    dataset = Dataset.range(10)
    dataset_id = service.register_dataset(cluster1.target, dataset)
    read = service.from_dataset_id("parallel_epochs", cluster1.target, dataset_id,
                                   element_spec=dataset.element_spec,
                                   data_transfer_protocol="grpc")
    assert ints(read) == list(range(10))


def test_distribute_explicit_protocol(cluster1):
    """testDistributeExplicitProtocol."""
    dataset = Dataset.range(10).apply(service.distribute(
        "parallel_epochs", "grpc://" + cluster1.address))
    assert ints(dataset) == list(range(10))


@pytest.mark.parametrize("compression", [None, "AUTO"])
def test_distribute_compression(cluster1, compression):
    """testDistributeCompression."""
    dataset = distributed(Dataset.range(10), cluster1, compression=compression)
    assert ints(dataset) == list(range(10))
