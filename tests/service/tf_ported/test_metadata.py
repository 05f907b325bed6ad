"""Scenarios of TensorFlow's ``metadata_test.py`` (tensorflow/python/data/experimental/
kernel_tests/service/): what a distributed dataset knows of its input (cardinality, element
spec, compression) without reading it, ported to convoy. Every test names the TensorFlow test
it comes from.

Not ported: testElementSpecGraphMode and testElementSpecMixedMode (they check the errors of
graph mode and of a dataset id made inside a ``tf.function``, which convoy does not have; an
id is always a plain string and its spec is always fetched from the dispatcher). TensorFlow
runs each case under its V1 and V2 APIs and in eager and graph mode; here each runs once.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import cloudpickle
import pytest

import convoy as cv
from convoy.data import INFINITE_CARDINALITY, SHARD_HINT, UNKNOWN_CARDINALITY
from convoy.data.service import ShardingPolicy

cloudpickle.register_pickle_by_value(sys.modules[__name__])

Dataset = cv.data.Dataset
service = cv.data.service

pytestmark = pytest.mark.timeout(60)

#: TensorFlow's _cardinality_test_combinations(): (name, dataset, policy, cardinality).
CARDINALITY_CASES: list[tuple[str, Callable[[], Dataset], ShardingPolicy, int]] = [
    ("NoShardingInfinite", lambda: Dataset.range(10).repeat(), ShardingPolicy.OFF,
     INFINITE_CARDINALITY),
    ("DynamicShardingInfinite", lambda: Dataset.range(5).repeat(), ShardingPolicy.DYNAMIC,
     INFINITE_CARDINALITY),
    ("DataShardingInfinite", lambda: Dataset.range(10).repeat(), ShardingPolicy.DATA,
     INFINITE_CARDINALITY),
    ("NoShardingZero", lambda: Dataset.range(0), ShardingPolicy.OFF, 0),
    ("DynamicShardingZero", lambda: Dataset.range(0), ShardingPolicy.DYNAMIC, 0),
    ("DataShardingZero", lambda: Dataset.range(0), ShardingPolicy.DATA, 0),
    ("FileOrDataShardingZero", lambda: Dataset.range(0), ShardingPolicy.FILE_OR_DATA, 0),
    ("HintShardingZero", lambda: Dataset.range(0).shard(SHARD_HINT, SHARD_HINT),
     ShardingPolicy.HINT, UNKNOWN_CARDINALITY),
    ("Finite", lambda: Dataset.range(10), ShardingPolicy.OFF, UNKNOWN_CARDINALITY),
    # static sharding may leave an infinite input empty: TensorFlow does not promise infinity
    ("FileOrDataShardingUnknown", lambda: Dataset.range(10).repeat(),
     ShardingPolicy.FILE_OR_DATA, UNKNOWN_CARDINALITY),
    ("HintShardingUnknown", lambda: Dataset.range(10).shard(SHARD_HINT, SHARD_HINT).repeat(),
     ShardingPolicy.HINT, UNKNOWN_CARDINALITY),
]
cardinality_cases = pytest.mark.parametrize(
    "make, policy, expected", [case[1:] for case in CARDINALITY_CASES],
    ids=[case[0] for case in CARDINALITY_CASES])


@cardinality_cases
def test_cardinality(cluster2: Any, make: Callable[[], Dataset], policy: ShardingPolicy,
                     expected: int) -> None:
    """Ported from metadata_test.py: testCardinality."""
    dataset = make().apply(service.distribute(policy, cluster2.target))
    assert dataset.cardinality() == expected


@cardinality_cases
def test_from_dataset_id_cardinality(cluster2: Any, make: Callable[[], Dataset],
                                     policy: ShardingPolicy, expected: int) -> None:
    """Ported from metadata_test.py: testFromDatasetIdCardinality."""
    dataset = make()
    dataset_id = service.register_dataset(cluster2.target, dataset)
    read = service.from_dataset_id(policy, cluster2.target, dataset_id,
                                   element_spec=dataset.element_spec)
    assert read.cardinality() == expected


def test_from_dataset_id_does_not_require_element_spec(cluster1: Any,
                                                       read_within: Any) -> None:
    """Ported from metadata_test.py: testFromDatasetIdDoesntRequireElementSpec."""
    dataset_id = service.register_dataset(cluster1.target, Dataset.range(10))
    read = service.from_dataset_id(ShardingPolicy.OFF, cluster1.target, dataset_id,
                                   data_transfer_protocol="grpc")
    assert read.element_spec == cv.data.TensorSpec([], "int64")
    assert [int(x) for x in read_within(read, 30)] == list(range(10))


def _to_upper(x: Any) -> str:
    return (x.decode() if isinstance(x, bytes) else str(x)).upper()


@pytest.mark.parametrize("compression", [None, "AUTO"])
def test_from_dataset_id_omits_compression(cluster1: Any, read_within: Any,
                                           compression: str | None) -> None:
    """Ported from metadata_test.py: testFromDatasetIdOmitsCompression (the dataset was
    registered compressed or not; the reader is not told which)."""
    dataset = Dataset.from_tensor_slices(list("abcdefghijklmnopqrstuvwxyz")).map(
        _to_upper, num_parallel_calls=cv.data.AUTOTUNE)
    dataset_id = service.register_dataset(cluster1.target, dataset, compression=compression)
    read = service.from_dataset_id(ShardingPolicy.OFF, cluster1.target, dataset_id,
                                   element_spec=dataset.element_spec)
    assert [str(x) for x in read_within(read, 30)] == list("ABCDEFGHIJKLMNOPQRSTUVWXYZ")


@pytest.mark.parametrize("compression", [None, "AUTO"])
def test_from_dataset_id_omits_element_spec_and_compression(
        cluster1: Any, read_within: Any, compression: str | None) -> None:
    """Ported from metadata_test.py: testFromDatasetIdOmitsElementSpecAndCompression."""
    dataset = Dataset.from_tensor_slices(list("ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
    dataset_id = service.register_dataset(cluster1.target, dataset, compression=compression)
    read = service.from_dataset_id(ShardingPolicy.OFF, cluster1.target, dataset_id)
    assert read.element_spec == dataset.element_spec
    assert list(read_within(read, 30)) == [c.encode() for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"]
