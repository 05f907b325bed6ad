"""TLS and mutual TLS through the data service, with server processes given certificates on
the command line (made by the test with ``openssl``) and a trainer in this process that finds
its own in the environment."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

import convoy as cv
from convoy._transport import rpc as _rpc
from convoy._transport.security import CA_ENV, CERTIFICATE_ENV, KEY_ENV, TOKEN_ENV, Security
from convoy.data.service import service_pb2 as pb
from convoy.data.service._common import wire as data_protocol
from convoy.errors import NotFoundError, UnavailableError
from convoy.testing import ProcessCluster

pytestmark = pytest.mark.slow

NO_SETTINGS = {TOKEN_ENV: None, CERTIFICATE_ENV: None, KEY_ENV: None, CA_ENV: None}


def identity(folder: pathlib.Path, name: str) -> list[str]:
    return ["--certificate", str(folder / f"{name}.pem"), "--key", str(folder / f"{name}.key")]


@pytest.fixture(scope="module")
def tls(certificates: pathlib.Path) -> Iterator[ProcessCluster]:
    """Servers that show certificates of the test CA and ask for none. Their clients trust the
    system's roots, here the test CA (gRPC's GRPC_DEFAULT_SSL_ROOTS_FILE_PATH); this process
    trusts it through CONVOY_TLS_CA."""
    args = identity(certificates, "server")
    env = {**NO_SETTINGS, "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(certificates / "ca.pem")}
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(TOKEN_ENV, raising=False)
        patch.setenv(CA_ENV, str(certificates / "ca.pem"))
        with ProcessCluster(num_workers=1, dispatcher_args=args, worker_args=args,
                            env=env) as cluster:
            yield cluster


@pytest.fixture(scope="module")
def mutual_tls(certificates: pathlib.Path, secret: str) -> Iterator[ProcessCluster]:
    """Servers that ask every caller for a certificate of the test CA (and the secret); this
    process shows the client certificate, found in the environment."""
    args = [*identity(certificates, "server"), "--ca", str(certificates / "ca.pem")]
    with pytest.MonkeyPatch.context() as patch:
        for name, value in ((TOKEN_ENV, secret), (CA_ENV, "ca.pem"),
                            (CERTIFICATE_ENV, "client.pem"), (KEY_ENV, "client.key")):
            patch.setenv(name, value if name == TOKEN_ENV else str(certificates / value))
        with ProcessCluster(num_workers=1, dispatcher_args=args, worker_args=args,
                            env={CERTIFICATE_ENV: None, KEY_ENV: None, CA_ENV: None}) as cluster:
            yield cluster


def round_trip(target: str) -> list[int]:
    dataset = cv.data.Dataset.range(10).apply(
        cv.data.service.distribute("parallel_epochs", target))
    return sorted(int(x) for x in dataset)


def look_up(address: str, security: Security) -> None:
    client = _rpc.Client(address, data_protocol.DISPATCHER, data_protocol.DISPATCHER_METHODS,
                         security)
    try:
        client.call("GetDatasetInfo", pb.GetDatasetInfoRequest(dataset_id="none"), timeout=20)
    finally:
        client.close()


@pytest.mark.timeout(120)
def test_tls_round_trip(tls):
    assert round_trip(tls.target) == list(range(10))


@pytest.mark.timeout(120)
def test_tls_servers_answer_no_plaintext_caller(tls, certificates):
    with pytest.raises(NotFoundError):  # the control: over TLS, the lookup is answered
        look_up(tls.dispatcher.address, Security(ca=str(certificates / "ca.pem")))
    with pytest.raises(UnavailableError):
        look_up(tls.dispatcher.address, Security())


@pytest.mark.timeout(120)
def test_mutual_tls_round_trip(mutual_tls):
    assert round_trip(mutual_tls.target) == list(range(10))


@pytest.mark.timeout(120)
def test_mutual_tls_refuses_callers_without_a_certificate_of_the_ca(mutual_tls, certificates,
                                                                   secret):
    ca = str(certificates / "ca.pem")
    with pytest.raises(NotFoundError):  # the control: with the client certificate, answered
        look_up(mutual_tls.dispatcher.address, Security(
            token=secret, ca=ca, certificate=str(certificates / "client.pem"),
            key=str(certificates / "client.key")))
    for caller in (Security(token=secret, ca=ca),  # no certificate
                   Security(token=secret, ca=ca, certificate=str(certificates / "stranger.pem"),
                            key=str(certificates / "stranger.key"))):  # another CA's
        with pytest.raises(UnavailableError):
            look_up(mutual_tls.dispatcher.address, caller)
