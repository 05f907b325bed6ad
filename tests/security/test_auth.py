"""The shared secret against real server processes: a caller without it, or with a wrong one,
is refused by every method of every service (enumerated from the method tables) before
anything it sent is decoded, and a payload that would run code if unpickled runs nothing;
callers with it work end to end, on the data service and in training."""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import cloudpickle
import numpy as np
import pytest

import convoy as cv
from convoy._transport import rpc as _rpc
from convoy._transport.security import TOKEN_ENV, Security
from convoy.data.service import service_pb2 as pb
from convoy.data.service._common import wire as data_protocol
from convoy.distribute import _wire as training_protocol
from convoy.errors import (
    ConvoyError,
    NotFoundError,
    UnauthenticatedError,
    UnimplementedError,
)
from convoy.testing import ProcessCluster, TrainingCluster

# Functions defined here run on worker processes, which cannot import this module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.slow

#: (role, service, method table) of every server.
SERVICES = [
    ("dispatcher", data_protocol.DISPATCHER, data_protocol.DISPATCHER_METHODS),
    ("data worker", data_protocol.WORKER, data_protocol.WORKER_METHODS),
    ("ps", training_protocol.PS_SERVICE, training_protocol.PS_METHODS),
    ("training worker", training_protocol.WORKER_SERVICE, training_protocol.WORKER_METHODS),
]
#: Every method of every service.
METHODS = [(role, service, method) for role, service, table in SERVICES for method in table]
METHOD_IDS = [f"{role}.{method.name}" for role, _, method in METHODS]
WRONG = "a-wrong-secret-of-enough-characters"


@dataclass
class Servers:
    data: ProcessCluster
    training: TrainingCluster

    def address(self, role: str) -> str:
        return {"dispatcher": self.data.dispatcher.address,
                "data worker": self.data.workers[0].address,
                "ps": self.training.servers[("ps", 0)].address,
                "training worker": self.training.servers[("worker", 0)].address}[role]


@pytest.fixture(scope="module")
def servers(secret: str, token_file: pathlib.Path) -> Iterator[Servers]:
    """A data service and a training cluster whose processes read the secret from a file
    only; this process's clients read it from the environment."""
    from_file = ["--auth-token-file", str(token_file)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(TOKEN_ENV, secret)
        with ProcessCluster(num_workers=1, dispatcher_args=from_file, worker_args=from_file,
                            env={TOKEN_ENV: None}) as data, TrainingCluster(
                num_workers=1, num_ps=1, server_args=from_file,
                env={TOKEN_ENV: None}) as training:
            yield Servers(data, training)


def call(address: str, service: str, method: _rpc.Method, payload: bytes,
         security: Security) -> bytes:
    """Send ``payload`` as is (raw bytes) to ``method``, streamed or not."""
    raw = _rpc.Method(method.name, None, None, method.streamed)
    client = _rpc.Client(address, service, [raw], security=security)
    try:
        if method.streamed:
            return client.stream(method.name).call(payload, timeout=30)
        return client.call(method.name, payload, timeout=30)
    finally:
        client.close()


CALLERS = {"no secret": Security(), "a wrong secret": Security(token=WRONG)}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize(("role", "service", "method"), METHODS, ids=METHOD_IDS)
def test_every_method_refuses_a_caller_without_the_secret(servers, role, service, method,
                                                          caller):
    with pytest.raises(UnauthenticatedError, match="call not signed|wrong call signature"):
        call(servers.address(role), service, method, b"", CALLERS[caller])


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("role", "service", "method"), METHODS, ids=METHOD_IDS)
def test_every_method_lets_a_caller_with_the_secret_through(servers, secret, role, service,
                                                            method):
    # The counterpart of the refusals: the tables name methods the servers really serve.
    try:
        call(servers.address(role), service, method, b"", Security(token=secret))
    except ConvoyError as error:  # an empty request may well be refused, by the method
        assert not isinstance(error, UnauthenticatedError | UnimplementedError), error


class Touch:
    """Pickles into a call that creates ``path`` when unpickled."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path

    def __reduce__(self) -> object:
        return (pathlib.Path.touch, (self.path,))


def payloads(path: pathlib.Path) -> list[bytes]:
    """Requests that create ``path`` if decoded: a codec message (the training services' wire
    format) and a dataset registration whose dataset does (the data service's)."""
    touch = cloudpickle.dumps(Touch(path))
    register = pb.RegisterDatasetRequest(dataset=touch, fingerprint="f", dataset_id="touched")
    return [training_protocol.encode(Touch(path)), register.SerializeToString()]


def test_the_payloads_are_live(tmp_path):
    # What the refusals below keep from happening does happen once a payload is decoded.
    codec_message, registration = payloads(tmp_path / "touched")
    training_protocol.decode_one(codec_message)
    assert (tmp_path / "touched").exists()
    (tmp_path / "touched").unlink()
    cloudpickle.loads(pb.RegisterDatasetRequest.FromString(registration).dataset)
    assert (tmp_path / "touched").exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize(("role", "service", "method"), METHODS, ids=METHOD_IDS)
def test_a_payload_sent_without_the_secret_is_never_unpickled(servers, secret, tmp_path,
                                                              role, service, method, caller):
    path = tmp_path / "touched"
    for payload in payloads(path):
        with pytest.raises(UnauthenticatedError):
            call(servers.address(role), service, method, payload, CALLERS[caller])
    assert not path.exists()
    dispatcher = _rpc.Client(servers.address("dispatcher"), data_protocol.DISPATCHER,
                             data_protocol.DISPATCHER_METHODS, Security(token=secret))
    with pytest.raises(NotFoundError):  # nor was the dataset registered
        dispatcher.call("GetDatasetInfo", pb.GetDatasetInfoRequest(dataset_id="touched"))
    dispatcher.close()


@pytest.mark.timeout(120)
def test_the_data_service_works_end_to_end_with_the_secret(servers):
    target = servers.data.target
    dataset = cv.data.Dataset.range(20).map(lambda x: x * 2)
    distributed = dataset.apply(cv.data.service.distribute("parallel_epochs", target))
    assert sorted(int(x) for x in distributed) == [2 * x for x in range(20)]
    dataset_id = cv.data.service.register_dataset(target, cv.data.Dataset.range(5))
    read = cv.data.service.from_dataset_id("distributed_epoch", target, dataset_id)
    assert sorted(int(x) for x in read) == [0, 1, 2, 3, 4]


@pytest.mark.timeout(120)
def test_a_data_workers_own_reads_from_the_service_carry_the_secret_of_its_file(servers):
    inner = cv.data.Dataset.range(10).apply(
        cv.data.service.distribute("parallel_epochs", servers.data.target))
    outer = inner.apply(cv.data.service.distribute("parallel_epochs", servers.data.target))
    assert sorted(int(x) for x in outer) == list(range(10))


@pytest.mark.timeout(120)
def test_a_trainer_without_the_secret_is_refused_by_the_data_service(servers):
    dataset = cv.data.Dataset.range(3).apply(
        cv.data.service.distribute("parallel_epochs", servers.data.target))
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(TOKEN_ENV)
        with pytest.raises(UnauthenticatedError, match="RegisterDataset"):
            list(dataset)


def add_to(total: cv.Variable, amount: float) -> float:
    total.assign_add(amount)  # the training worker reaches the ps with the secret of its file
    return amount


@pytest.mark.timeout(120)
def test_a_training_step_works_end_to_end_with_the_secret(servers):
    strategy = cv.distribute.ParameterServerStrategy(servers.training.resolver())
    coordinator = cv.distribute.ClusterCoordinator(strategy)
    try:
        with strategy.scope():
            total = cv.Variable(np.zeros(()), name="total")
        results = [coordinator.schedule(add_to, args=(total, float(x))) for x in range(1, 5)]
        coordinator.join()
        assert coordinator.fetch(results) == [1.0, 2.0, 3.0, 4.0]
        assert float(total.numpy()) == 10.0
    finally:
        coordinator.shutdown()
