"""A distributed pipeline that itself reads from the service (TensorFlow's
data_service_ops_test.testDoubleDistribute): under OFF it returns the inner elements; under
DYNAMIC the inner read cannot be split and distribute refuses it, naming the op."""

from __future__ import annotations

import pytest

import convoy as cv
from convoy.errors import InvalidArgumentError
from convoy.testing import InProcessCluster

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def cluster():
    with InProcessCluster(num_workers=1) as cluster:
        yield cluster


def test_double_distribute_under_off_returns_the_inner_elements(cluster) -> None:
    inner = cv.data.Dataset.range(10).apply(
        cv.data.service.distribute("parallel_epochs", cluster.target,
                                   dispatcher_timeout_ms=20_000))
    outer = inner.apply(cv.data.service.distribute("parallel_epochs", cluster.target,
                                                   dispatcher_timeout_ms=20_000))
    assert sorted(int(x) for x in outer) == list(range(10))


def test_double_distribute_under_dynamic_is_refused_at_distribute(cluster) -> None:
    inner = cv.data.Dataset.range(10).apply(
        cv.data.service.distribute("parallel_epochs", cluster.target))
    with pytest.raises(InvalidArgumentError, match="distribute"):
        inner.apply(cv.data.service.distribute("distributed_epoch", cluster.target))
