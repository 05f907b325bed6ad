"""The ``convoy`` command speaks to people, on real processes: a failure is one line saying
what is wrong and what to do, exit status 2 for a command line that cannot work and 1 for a
failure while running, a traceback only with --debug; every command takes --version and
--log-level."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

import convoy
from convoy._security import TOKEN_ENV
from convoy.cli import build_parser
from convoy.data.service import DispatcherConfig
from convoy.testing import ServerProcess, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

COMMANDS = ["dispatcher", "worker", "server", "version"]
#: A log line: UTC time with milliseconds, level, the command and its process id.
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR) "
                      r"convoy-(dispatcher|worker|server)\[\d+\] \S+: ")


def convoy_command(*args: str, env: dict[str, str] | None = None
                   ) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    return subprocess.run([sys.executable, "-m", "convoy", *args], capture_output=True,
                          text=True, timeout=60, env={**environ, **(env or {})})


def assert_one_line(done: subprocess.CompletedProcess[str], status: int, command: str,
                    *phrases: str) -> None:
    """``done`` failed with ``status``, saying so in one line naming ``phrases``."""
    assert done.returncode == status, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    said = [line for line in done.stderr.splitlines() if line.startswith(f"convoy {command}:")]
    assert len(said) == 1, done.stderr
    others = [line for line in done.stderr.splitlines()
              if line not in said and not LOG_LINE.match(line)]
    assert not others, done.stderr  # nothing but log lines besides it (no gRPC noise)
    for phrase in phrases:
        assert phrase in said[0], said[0]


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_tells_its_version(command):
    done = convoy_command(command, "--version")
    assert (done.returncode, done.stdout.strip()) == (0, f"convoy {convoy.__version__}")


def test_the_command_itself_tells_its_version():
    assert convoy_command("--version").stdout.strip() == f"convoy {convoy.__version__}"


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_the_output_options(command):
    parser = build_parser()
    help_text = parser._subparsers._group_actions[0].choices[command].format_help()  # type: ignore
    for option in ("--log-level", "--debug", "--version"):
        assert option in help_text


@pytest.mark.parametrize("command", ["dispatcher", "worker"])
def test_a_port_in_use_is_a_runtime_failure_in_one_line(command, taken_port):
    extra = ["--dispatcher", "127.0.0.1:1"] if command == "worker" else []
    done = convoy_command(command, *extra, "--port", str(taken_port))
    assert_one_line(done, 1, command, f"127.0.0.1:{taken_port}", "the port is in use",
                    "choose another port")


def test_a_metrics_port_in_use_is_a_runtime_failure_in_one_line(taken_port):
    done = convoy_command("dispatcher", "--metrics-port", str(taken_port))
    assert_one_line(done, 1, "dispatcher", f"could not serve metrics on 127.0.0.1:{taken_port}",
                    "the port is in use")


@pytest.mark.parametrize("cluster, phrase", [
    ('{"ps": ["localhost:1"', "--cluster is not JSON"),
    ('["localhost:1"]', "--cluster must map each job"),
    ('{"ps": "localhost:1"}', "--cluster must map each job"),
    ('{"ps": ["nowhere"]}', "must name a host and a port"),
])
def test_a_malformed_cluster_is_a_usage_error_in_one_line(cluster, phrase):
    done = convoy_command("server", "--job", "ps", "--index", "0", "--cluster", cluster)
    assert_one_line(done, 2, "server", phrase, '{"ps": ["ps0:2222"]')


def test_a_work_dir_that_is_a_file_is_a_runtime_failure_in_one_line(tmp_path):
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    done = convoy_command("dispatcher", "--work-dir", str(not_a_directory), "--fault-tolerant")
    assert_one_line(done, 1, "dispatcher", "--work-dir", "is not a directory")


def test_a_corrupt_journal_is_a_runtime_failure_in_one_line_and_debug_shows_where(tmp_path):
    (tmp_path / "journal").mkdir()
    (tmp_path / "journal" / "meta").write_bytes(os.urandom(64))
    done = convoy_command("dispatcher", "--work-dir", str(tmp_path), "--fault-tolerant")
    assert_one_line(done, 1, "dispatcher", str(tmp_path / "journal" / "meta"),
                    "restore the journal from a backup")
    debug = convoy_command("dispatcher", "--work-dir", str(tmp_path), "--fault-tolerant",
                           "--debug")
    assert debug.returncode == 1
    assert "Traceback" in debug.stderr and "DataLossError" in debug.stderr


def test_an_unreachable_dispatcher_is_a_runtime_failure_in_one_line():
    port = free_port()
    done = convoy_command("worker", "--dispatcher", f"127.0.0.1:{port}",
                          "--dispatcher-timeout-ms", "1000")
    assert_one_line(done, 1, "worker", f"127.0.0.1:{port}",
                    f"check that a dispatcher runs at 127.0.0.1:{port}")


@pytest.mark.parametrize("flag, field", [("--worker-timeout-ms", "worker_timeout_ms"),
                                         ("--client-timeout-ms", "client_timeout_ms"),
                                         ("--job-gc-timeout-ms", "job_gc_timeout_ms")])
def test_the_dispatcher_timeouts_reach_its_config(flag, field):
    done = convoy_command("dispatcher", flag, "-5")  # refused by the config, by name
    assert_one_line(done, 2, "dispatcher", field)


def test_the_dispatcher_timeouts_help_tells_the_config_defaults():
    parser = build_parser()
    help_text = " ".join(parser._subparsers._group_actions[0].choices[  # type: ignore
        "dispatcher"].format_help().split())
    config = DispatcherConfig()
    for flag, seconds in (("--worker-timeout-ms", config.worker_timeout_s),
                          ("--client-timeout-ms", config.client_timeout_s),
                          ("--job-gc-timeout-ms", config.iteration_timeout_s)):
        described = help_text.rsplit(flag + " MS", 1)[1].split(" --", 1)[0]
        assert f"(default {round(seconds * 1000)})" in described, (flag, described)


def test_logs_carry_time_level_and_process_and_a_work_dir_alone_is_warned(tmp_path):
    server = ServerProcess("dispatcher", ["--work-dir", str(tmp_path)]).start()
    try:
        logged = [line for line in server.log if not line.startswith("convoy dispatcher ")]
        assert logged and all(LOG_LINE.match(line) for line in logged), logged
        warning = next(line for line in logged if " WARNING " in line)
        assert "--work-dir" in warning and "--fault-tolerant" in warning
        assert f"[{server.process.pid}]" in warning
    finally:
        server.kill()
    quiet = ServerProcess("dispatcher", ["--log-level", "warning"]).start()
    try:
        assert not any(" INFO " in line for line in quiet.log), quiet.log
    finally:
        quiet.kill()


def test_a_missing_task_is_a_usage_error_in_one_line():
    cluster = json.dumps({"ps": [f"localhost:{free_port()}"]})
    done = convoy_command("server", "--cluster", cluster, env={"TF_CONFIG": ""})
    assert_one_line(done, 2, "server", "give --job and --index")


def test_a_task_index_beyond_the_cluster_is_a_usage_error_in_one_line():
    # TensorFlow's task-id check (multi_worker_util._validate_cluster_spec), at start-up
    cluster = json.dumps({"ps": [f"localhost:{free_port()}"]})
    done = convoy_command("server", "--cluster", cluster, "--job", "ps", "--index", "3",
                          env={"TF_CONFIG": ""})
    assert_one_line(done, 2, "server", "The `task_id` 3 exceeds the maximum id of ps.")
