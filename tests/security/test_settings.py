"""The security settings of the configs and the training Server, in this process: where the
secret comes from, what repr shows, what each server binds, what its clients use."""

from __future__ import annotations

import pytest

from convoy._transport import security as _security
from convoy._transport.security import CA_ENV, CERTIFICATE_ENV, KEY_ENV, TOKEN_ENV, Security
from convoy.data.service import DispatcherConfig, DispatchServer, WorkerConfig, WorkerServer
from convoy.distribute import Server
from convoy.errors import FailedPreconditionError, InvalidArgumentError
from convoy.testing import free_port

CONFIG = "correct-horse-battery-staple"
FILE = "the-secret-in-the-token-file"
ENV = "the-secret-in-the-environment"


def configs(**settings: object) -> list[object]:
    return [DispatcherConfig(**settings),
            WorkerConfig(dispatcher_address="localhost:1", **settings)]


def test_the_secret_comes_from_the_config_then_the_file_then_the_environment(tmp_path,
                                                                             monkeypatch):
    token_file = tmp_path / "token"
    token_file.write_text(FILE + "\n")
    monkeypatch.setenv(TOKEN_ENV, ENV)
    for config in configs(auth_token=CONFIG, auth_token_file=str(token_file)):
        assert config.security().token == CONFIG
    for config in configs(auth_token_file=str(token_file)):
        assert config.security().token == FILE
    for config in configs():
        assert config.security().token == ENV
    monkeypatch.delenv(TOKEN_ENV)
    for config in configs():
        assert config.security().token is None


def test_repr_hides_the_secret():
    for config in configs(auth_token=CONFIG):
        assert CONFIG not in repr(config) and CONFIG not in str(config)
    assert CONFIG not in repr(Security(token=CONFIG))


def test_a_bad_secret_is_refused_without_showing_it(monkeypatch):
    with pytest.raises(InvalidArgumentError) as short:
        DispatcherConfig(auth_token="hunter2")
    assert "hunter2" not in str(short.value)
    monkeypatch.setenv(TOKEN_ENV, "hunter2")
    with pytest.raises(InvalidArgumentError, match=r"\$CONVOY_AUTH_TOKEN") as from_env:
        WorkerConfig(dispatcher_address="localhost:1")
    assert "hunter2" not in str(from_env.value)


@pytest.mark.parametrize(("settings", "match"), [
    ({"auth_token_file": "/no/such/token"}, "could not read the auth token file"),
    ({"certificate": "/no/such.pem", "key": "/no/such.key"}, "`certificate`: no such file"),
    ({"insecure": "yes"}, "insecure must be True or False"),
    ({"max_request_bytes": 0}, "max_request_bytes must be >= 1"),
])
def test_bad_settings_are_named_when_the_config_is_made(settings, match):
    for make in (DispatcherConfig, lambda **s: WorkerConfig(dispatcher_address="h:1", **s)):
        with pytest.raises(InvalidArgumentError, match=match):
            make(**settings)


def test_tls_paths_come_from_the_environment_when_not_given(tmp_path):
    pem = tmp_path / "a.pem"
    pem.write_text("not read until a channel is made")
    environ = {CERTIFICATE_ENV: str(pem), KEY_ENV: str(pem), CA_ENV: str(pem)}
    loaded = Security.load(environ=environ)
    assert (loaded.certificate, loaded.key, loaded.ca) == (str(pem), str(pem), str(pem))
    with pytest.raises(InvalidArgumentError, match="go together"):  # a pair or nothing
        Security.load(environ={KEY_ENV: str(pem)})
    other = tmp_path / "b.pem"
    other.write_text("")
    given = Security.load(certificate=str(other), key=str(other), environ=environ)
    assert (given.certificate, given.key, given.ca) == (str(other), str(other), str(pem))


@pytest.mark.timeout(60)
def test_data_servers_bind_and_advertise_their_host(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with DispatchServer(DispatcherConfig(host="localhost")) as dispatcher:
        assert dispatcher.target.startswith("grpc://localhost:")
        worker = WorkerServer(WorkerConfig(dispatcher_address=dispatcher.target))
        named = WorkerServer(WorkerConfig(dispatcher_address=dispatcher.target,
                                          worker_address="gateway:%port%"))
        try:
            # bound to the default loopback, it advertises TensorFlow's default address
            assert worker.bound_address == f"127.0.0.1:{worker.port}"
            assert worker._address == f"localhost:{worker.port}"
            assert named._address == f"gateway:{named.port}"
            assert named.bound_address == f"127.0.0.1:{named.port}"
        finally:
            worker.stop(), named.stop()
    with pytest.raises(FailedPreconditionError, match="refusing to serve"):
        DispatchServer(DispatcherConfig(host="0.0.0.0"))


@pytest.mark.timeout(60)
def test_a_training_server_binds_its_address_in_the_cluster_or_its_host(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    spec = {"ps": [f"localhost:{free_port()}"], "worker": [f"0.0.0.0:{free_port()}"]}
    ps = Server(spec, "ps", 0, start=False)
    assert ps.bound_address == spec["ps"][0]
    assert Server(spec, "ps", 0, host="::1", start=False).bound_address.startswith("[::1]:")
    worker = Server(spec, "worker", 0, start=False)
    with pytest.raises(FailedPreconditionError, match="'0.0.0.0'"):
        worker.start()
    # the failed start left this process's clients as they were
    assert _security.for_clients() is not worker._security


@pytest.mark.timeout(60)
def test_a_training_workers_settings_are_its_process_clients(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    spec = {"ps": [f"localhost:{free_port()}"], "worker": [f"localhost:{free_port()}"]}
    with Server(spec, "worker", 0, auth_token=CONFIG) as worker:
        assert _security.for_clients() is worker._security
        assert _security.for_clients().token == CONFIG
    assert _security.for_clients().token is None


@pytest.mark.parametrize("mode, warned", [(0o644, True), (0o604, True), (0o640, False),
                                          (0o600, False), (0o400, False)])
def test_a_token_file_readable_by_every_user_is_warned_about_once(tmp_path, caplog, mode,
                                                                  warned):
    token_file = tmp_path / "token"
    token_file.write_text(FILE + "\n")
    token_file.chmod(mode)
    with caplog.at_level("WARNING", logger="convoy._transport.security"):
        for _ in range(2):
            assert Security.load(token_file=token_file).token == FILE
    warnings = [r.getMessage() for r in caplog.records if r.name == "convoy._transport.security"]
    assert len(warnings) == int(warned), warnings
    if warned:
        assert str(token_file) in warnings[0] and "chmod" in warnings[0]
        assert FILE not in warnings[0]
