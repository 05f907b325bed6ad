"""Scenarios of TensorFlow's ``shared_dataset_test.py`` (tensorflow/python/data/experimental/
kernel_tests/service/), ported to convoy. Every test names the TensorFlow test it comes from.

TensorFlow's test registers datasets under a ``dataset_name``, an argument later TensorFlow
renamed ``dataset_id``; convoy has the ``dataset_id`` form, so the names are passed as ids.
Named jobs are scoped to the dataset id, so two readers share a job only when both the dataset
name and the job name match. Names carry the test's own name (the ``name`` fixture), so no two
tests meet in one job on the shared cluster.
"""

from __future__ import annotations

from typing import Any

import pytest

import convoy as cv
from convoy.errors import InvalidArgumentError

Dataset = cv.data.Dataset
service = cv.data.service
OFF = service.ShardingPolicy.OFF

pytestmark = pytest.mark.timeout(60)


def ints(elements: Any) -> list[int]:
    return [int(x) for x in elements]


def shared_read(dataset: Dataset, cluster: Any, job_name: str | None = None,
                dataset_name: str | None = None) -> Dataset:
    """Register ``dataset`` (under ``dataset_name``) and read it under ``job_name``, OFF."""
    dataset_id = service.register_dataset(cluster.target, dataset, dataset_id=dataset_name)
    return service.from_dataset_id(OFF, cluster.target, dataset_id,
                                   element_spec=dataset.element_spec, job_name=job_name)


def test_shared_dataset(cluster1, name):
    """testSharedDataset: the second reader of a shared job finds it read to the end."""
    first = shared_read(Dataset.range(10), cluster1, "vizier_job", f"{name}-vizier_dataset")
    assert ints(first) == list(range(10))
    second = shared_read(Dataset.range(10), cluster1, "vizier_job", f"{name}-vizier_dataset")
    assert ints(second) == []


def test_repeated_dataset(cluster1, name):
    """testRepeatedDataset: as above, with the repetition inside the shared dataset."""
    dataset = Dataset.range(10).repeat(5)
    first = shared_read(dataset, cluster1, "vizier_job", f"{name}-vizier_dataset")
    second = shared_read(dataset, cluster1, "vizier_job", f"{name}-vizier_dataset")
    assert ints(first) == list(range(10)) * 5
    assert ints(second) == []


def test_infinite_dataset(cluster1, name):
    """testInfiniteDataset: two readers of one endless shared job never see the same
    element."""
    dataset = Dataset.range(1_000_000).repeat()
    first = iter(shared_read(dataset, cluster1, "vizier_job", f"{name}-vizier_dataset"))
    second = iter(shared_read(dataset, cluster1, "vizier_job", f"{name}-vizier_dataset"))
    result1 = {int(next(first)) for _ in range(10)}
    result2 = {int(next(second)) for _ in range(10)}
    first.close()
    second.close()
    assert len(result1) == len(result2) == 10
    assert not result1 & result2


def test_different_dataset_names(cluster1, name):
    """testDifferentDatasetNames: not shared; both read everything."""
    for dataset_name in ("vizier_dataset1", "vizier_dataset2"):
        read = shared_read(Dataset.range(10), cluster1, "vizier_job", f"{name}-{dataset_name}")
        assert ints(read) == list(range(10))


def test_different_job_names(cluster1, name):
    """testDifferentJobNames: not shared; both read everything."""
    for job_name in ("vizier_job1", "vizier_job2"):
        read = shared_read(Dataset.range(10), cluster1, job_name, f"{name}-vizier_dataset")
        assert ints(read) == list(range(10))


def test_named_and_unnamed_datasets(cluster1, name):
    """testNamedAndUnnamedDatasets: an unnamed and a named registration are different
    datasets, so one job name does not make them share."""
    unnamed = shared_read(Dataset.range(10), cluster1, f"{name}-vizier_job")
    assert ints(unnamed) == list(range(10))
    named = shared_read(Dataset.range(10), cluster1, f"{name}-vizier_job",
                        f"{name}-vizier_dataset")
    assert ints(named) == list(range(10))


def test_invalid_named_dataset(cluster1, name):
    """testInvalidNamedDataset: one name cannot be given to two different datasets."""
    with pytest.raises(InvalidArgumentError, match="Datasets with the same (name|ID) should "
                                                   "have the same structure"):
        first = shared_read(Dataset.range(10), cluster1, "vizier_job", f"{name}-vizier_dataset")
        second = shared_read(Dataset.range(20), cluster1, "vizier_job", f"{name}-vizier_dataset")
        list(first)
        list(second)
