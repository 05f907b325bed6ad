"""The security options of the ``convoy`` command, on real processes: a public address is not
bound without a secret (unless --insecure), the secret comes from a file and never from the
command line, and every server prints the address it bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from convoy._transport import rpc as _rpc
from convoy._transport.security import TOKEN_ENV, Security
from convoy.cli import build_parser
from convoy.data.service import service_pb2 as pb
from convoy.data.service._common import wire as data_protocol
from convoy.errors import NotFoundError
from convoy.testing import ServerProcess, free_port

pytestmark = pytest.mark.slow

NO_SECRET = {TOKEN_ENV: None}


def cluster_json(host: str = "localhost") -> str:
    return json.dumps({"ps": [f"{host}:{free_port()}"], "worker": [f"localhost:{free_port()}"]})


#: Each server command, its required arguments, with --host 0.0.0.0.
PUBLIC = {
    "dispatcher": ["--host", "0.0.0.0"],
    "worker": ["--dispatcher", "127.0.0.1:1", "--host", "0.0.0.0"],
    "server": ["--job", "ps", "--index", "0", "--cluster", "{cluster}", "--host", "0.0.0.0"],
}


def run(role: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    return subprocess.run([sys.executable, "-m", "convoy", role, *args], env=env,
                          capture_output=True, text=True, timeout=60)


def public_args(role: str) -> list[str]:
    return [cluster_json() if a == "{cluster}" else a for a in PUBLIC[role]]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("role", list(PUBLIC))
def test_a_public_address_is_not_bound_without_a_secret(role):
    done = run(role, *public_args(role))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "listening" not in done.stdout
    message = " ".join(done.stderr.split())
    assert f"convoy {role}: refusing to serve" in message
    for hint in ("--auth-token-file PATH", "$CONVOY_AUTH_TOKEN", "--insecure"):
        assert hint in message


@pytest.mark.timeout(90)
def test_a_training_server_binds_the_host_of_its_address_in_the_cluster():
    cluster = cluster_json(host="0.0.0.0")
    done = run("server", "--job", "ps", "--index", "0", "--cluster", cluster)
    assert done.returncode == 2 and "on '0.0.0.0'" in done.stderr
    port = json.loads(cluster)["ps"][0].rsplit(":", 1)[1]
    server = ServerProcess("server", ["--job", "ps", "--index", "0", "--cluster", cluster,
                                      "--insecure"], env=NO_SECRET).start()
    try:
        assert server.address == f"0.0.0.0:{port}"
    finally:
        server.kill()


@pytest.mark.timeout(90)
def test_insecure_binds_a_public_address_without_a_secret():
    server = ServerProcess("dispatcher", ["--host", "0.0.0.0", "--insecure"],
                           env=NO_SECRET).start()
    try:
        assert server.address.startswith("0.0.0.0:")
        assert_answers(server.address.replace("0.0.0.0", "127.0.0.1"), Security())
    finally:
        server.kill()


@pytest.mark.timeout(90)
def test_a_secret_from_a_file_lets_a_server_bind_a_public_address(token_file, secret):
    server = ServerProcess("dispatcher", ["--host", "0.0.0.0", "--auth-token-file",
                                          str(token_file)], env=NO_SECRET).start()
    try:
        assert server.address.startswith("0.0.0.0:")
        assert_answers(server.address.replace("0.0.0.0", "127.0.0.1"), Security(token=secret))
    finally:
        server.kill()


def assert_answers(address: str, security: Security) -> None:
    client = _rpc.Client(address, data_protocol.DISPATCHER, data_protocol.DISPATCHER_METHODS,
                         security)
    with pytest.raises(NotFoundError):  # answered: no such dataset
        client.call("GetDatasetInfo", pb.GetDatasetInfoRequest(dataset_id="none"), timeout=20)
    client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("role", list(PUBLIC))
def test_the_secret_is_never_taken_on_the_command_line(role):
    secret = "a-secret-that-must-not-be-echoed"
    done = run(role, *public_args(role), "--auth-token", secret)
    assert done.returncode == 2
    assert "--auth-token-file PATH" in done.stderr and secret not in done.stderr


@pytest.mark.timeout(90)
def test_a_worker_advertises_its_address_and_binds_its_host():
    dispatcher = ServerProcess("dispatcher", [], env=NO_SECRET).start()
    worker = ServerProcess("worker", ["--dispatcher", dispatcher.address,
                                      "--address", "gateway.example:%port%"],
                           env=NO_SECRET).start()
    try:
        port = worker.address.rsplit(":", 1)[1]
        assert dispatcher.address.startswith("127.0.0.1:")
        assert worker.address == f"127.0.0.1:{port}"
        assert f"(advertised as gateway.example:{port})" in "".join(worker.log)
    finally:
        worker.kill(), dispatcher.kill()


@pytest.mark.parametrize("role", list(PUBLIC))
def test_every_server_command_has_the_security_options(role):
    parser = build_parser()
    help_text = parser._subparsers._group_actions[0].choices[role].format_help()  # type: ignore
    for option in ("--host", "--auth-token-file", "--certificate", "--key", "--ca",
                   "--insecure", "--max-request-bytes"):
        assert option in help_text
