"""Limits against hostile or careless input: each is refused with a clear status, naming the
limit, while the server keeps serving the others."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import cloudpickle
import numpy as np
import pytest

import convoy as cv
from convoy.data.service import DispatcherConfig, DispatchServer
from convoy.data.service import service_pb2 as pb
from convoy.data.service._common import wire as data_protocol
from convoy.errors import ResourceExhaustedError
from convoy.testing import ProcessCluster, TrainingCluster

# Functions defined here run on worker processes, which cannot import this module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

service = cv.data.service
MIB = 2**20


@pytest.fixture(scope="module")
def data() -> Iterator[ProcessCluster]:
    limits = ["--max-request-bytes", str(MIB), "--max-dataset-bytes", str(MIB // 4)]
    with ProcessCluster(num_workers=1, dispatcher_args=limits) as cluster:
        yield cluster


def read(dataset: cv.data.Dataset, target: str) -> list[float]:
    return sorted(float(x) for x in dataset.apply(service.distribute("parallel_epochs", target)))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_oversize_request_is_refused_and_the_server_keeps_serving(data):
    huge = cv.data.Dataset.from_tensor_slices(np.zeros(2 * MIB // 8))  # 2 MiB of data
    with pytest.raises(ResourceExhaustedError, match="larger than max"):
        service.register_dataset(data.target, huge)
    assert read(cv.data.Dataset.range(4), data.target) == [0, 1, 2, 3]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_oversize_dataset_is_refused_and_the_server_keeps_serving(data):
    large = cv.data.Dataset.from_tensor_slices(np.zeros(MIB // 8 // 2))  # half a MiB
    with pytest.raises(ResourceExhaustedError, match=r"max_dataset_bytes \(262,144\)"):
        service.register_dataset(data.target, large)
    assert read(cv.data.Dataset.range(3), data.target) == [0, 1, 2]


def job(dispatcher: DispatchServer, dataset_id: str, name: str) -> int:
    from convoy._transport import rpc as _rpc

    client = _rpc.Client(dispatcher._address, data_protocol.DISPATCHER,
                         data_protocol.DISPATCHER_METHODS)
    try:
        return client.call("GetOrCreateJob", pb.GetOrCreateJobRequest(
            dataset_id=dataset_id, job_name=name,
            options=pb.JobOptions(processing_mode="OFF"))).job_id
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_datasets_and_jobs_beyond_the_dispatchers_limits_are_refused():
    with DispatchServer(DispatcherConfig(max_datasets=2, max_jobs=2)) as dispatcher:
        first, second = (service.register_dataset(dispatcher.target, cv.data.Dataset.range(n))
                         for n in (1, 2))
        with pytest.raises(ResourceExhaustedError, match="2 datasets, its max_datasets"):
            service.register_dataset(dispatcher.target, cv.data.Dataset.range(3))
        # what is registered already is still answered, and still usable
        assert service.register_dataset(dispatcher.target, cv.data.Dataset.range(1)) == first
        one, two = job(dispatcher, first, "one"), job(dispatcher, second, "two")
        with pytest.raises(ResourceExhaustedError, match="2 jobs, its max_jobs"):
            job(dispatcher, first, "three")
        assert job(dispatcher, first, "one") == one and two != one


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", ["max_datasets", "max_jobs", "max_dataset_bytes",
                                  "max_request_bytes"])
def test_limits_must_be_positive(name):
    with pytest.raises(cv.errors.InvalidArgumentError, match=name):
        DispatcherConfig(**{name: 0})


BIG = np.arange(MIB // 8, dtype=np.float64)  # a MiB captured by the function below


def sum_of_big() -> float:
    return float(BIG.sum())


def small() -> int:
    return 42


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_an_oversize_function_is_refused_and_the_worker_keeps_serving():
    with TrainingCluster(num_workers=1, num_ps=1,
                         server_args=["--max-function-bytes", str(MIB // 2)]) as cluster:
        strategy = cv.distribute.ParameterServerStrategy(cluster.resolver())
        coordinator = cv.distribute.ClusterCoordinator(strategy)
        try:
            big = coordinator.schedule(sum_of_big)
            with pytest.raises(ResourceExhaustedError, match=r"max_function_bytes \(524,288\)"):
                coordinator.join()  # as in TensorFlow, a function's error surfaces here once
            with pytest.raises(ResourceExhaustedError):
                big.fetch()
            assert coordinator.schedule(small).fetch() == 42
        finally:
            coordinator.shutdown()
