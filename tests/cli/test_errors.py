"""The ``convoy`` command speaks to people, on real processes: a failure is one line saying
what is wrong and what to do, exit status 2 for a command line that cannot work and 1 for a
failure while running, a traceback only with --debug; every command takes --version and
--log-level."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import convoy
from convoy._transport.security import TOKEN_ENV
from convoy.cli import build_parser
from convoy.data import Dataset
from convoy.data.service import DispatcherConfig, distribute
from convoy.data.service._common.wire import DISPATCHER, WORKER
from convoy.data.service._dispatcher.journal import FULL_DISK_FLAG
from convoy.testing import ProcessCluster, ServerProcess, free_port

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


#: Runs command lines one after another in one process, each with its own environment and
#: its output (file descriptors 1 and 2, so gRPC's own lines too) caught apart.
BATCH = """
import json, os, sys, tempfile
from convoy.cli import main

answers = []
for argv, env in json.load(sys.stdin):
    saved_env = dict(os.environ)
    os.environ.update(env)
    caught = [tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")]
    saved_fds = [os.dup(1), os.dup(2)]
    sys.stdout.flush(); sys.stderr.flush()
    os.dup2(caught[0].fileno(), 1); os.dup2(caught[1].fileno(), 2)
    try:
        status = main(argv)
    except SystemExit as stop:  # argparse: a usage error, --version
        status = stop.code or 0
    sys.stdout.flush(); sys.stderr.flush()
    os.dup2(saved_fds[0], 1); os.dup2(saved_fds[1], 2)
    os.environ.clear(); os.environ.update(saved_env)
    out, err = ((f.seek(0), f.read())[1] for f in caught)
    answers.append([status, out, err])
print(json.dumps(answers))
"""


def convoy_commands(cases: list[tuple[list[str], dict[str, str]]]
                    ) -> list[subprocess.CompletedProcess[str]]:
    """Each ``(argv, env)`` of ``cases`` run by the ``convoy`` command's ``main`` in one
    process (one start-up for all): what each said and its exit status."""
    environ = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    done = subprocess.run([sys.executable, "-c", BATCH], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=120, env=environ)
    assert done.returncode == 0, done.stderr
    return [subprocess.CompletedProcess(["convoy", *argv], status, out, err)
            for (argv, _), (status, out, err) in zip(cases, json.loads(done.stdout))]


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


MALFORMED_CLUSTERS = [
    ('{"ps": ["localhost:1"', "--cluster is not JSON"),
    ('["localhost:1"]', "--cluster must map each job"),
    ('{"ps": "localhost:1"}', "--cluster must map each job"),
    ('{"ps": ["nowhere"]}', "must name a host and a port"),
]
DISPATCHER_TIMEOUTS = [("--worker-timeout-ms", "worker_timeout_ms"),
                       ("--client-timeout-ms", "client_timeout_ms"),
                       ("--job-gc-timeout-ms", "job_gc_timeout_ms")]


@pytest.fixture(scope="module")
def answers_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("answers")


@pytest.fixture(scope="module")
def answers(answers_dir: Path) -> dict[Any, subprocess.CompletedProcess[str]]:
    """What the command said to each command line below that fails (or ends) before it
    serves, by a name for it: all run in one process (``convoy_commands``)."""
    tmp = answers_dir
    (tmp / "file").write_text("")
    (tmp / "corrupt" / "journal").mkdir(parents=True)
    (tmp / "corrupt" / "journal" / "meta").write_bytes(os.urandom(64))
    (tmp / "full").touch()
    one_ps = json.dumps({"ps": [f"localhost:{free_port()}"]})
    corrupt = ["dispatcher", "--work-dir", str(tmp / "corrupt"), "--fault-tolerant"]
    cases: dict[Any, tuple[list[str], dict[str, str]]] = {
        ("version", None): (["--version"], {}),
        **{("version", command): ([command, "--version"], {}) for command in COMMANDS},
        **{("cluster", cluster): (["server", "--job", "ps", "--index", "0", "--cluster",
                                   cluster], {}) for cluster, _ in MALFORMED_CLUSTERS},
        **{("timeout", flag): (["dispatcher", flag, "-5"], {})
           for flag, _ in DISPATCHER_TIMEOUTS},
        "refused setting": (["worker", "--dispatcher", "localhost:1", "--heartbeat-ms", "-1"],
                            {}),
        "work dir is a file": (["dispatcher", "--work-dir", str(tmp / "file"),
                                "--fault-tolerant"], {}),
        "corrupt journal": (corrupt, {}),
        "corrupt journal, debug": ([*corrupt, "--debug"], {}),
        "missing task": (["server", "--cluster", one_ps], {"TF_CONFIG": ""}),
        "task beyond the cluster": (["server", "--cluster", one_ps, "--job", "ps", "--index",
                                     "3"], {"TF_CONFIG": ""}),
        "full disk": (["dispatcher", "--work-dir", str(tmp / "work"), "--fault-tolerant"],
                      {FULL_DISK_FLAG: str(tmp / "full")}),
    }
    return dict(zip(cases, convoy_commands(list(cases.values()))))


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_tells_its_version(command, answers):
    done = answers["version", command]
    assert (done.returncode, done.stdout.strip()) == (0, f"convoy {convoy.__version__}")


def test_the_command_itself_tells_its_version(answers):
    assert answers["version", None].stdout.strip() == f"convoy {convoy.__version__}"
    # and on its own, as a process
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


@pytest.mark.parametrize("cluster, phrase", MALFORMED_CLUSTERS)
def test_a_malformed_cluster_is_a_usage_error_in_one_line(cluster, phrase, answers):
    assert_one_line(answers["cluster", cluster], 2, "server", phrase, '{"ps": ["ps0:2222"]')


def test_a_work_dir_that_is_a_file_is_a_runtime_failure_in_one_line(answers):
    assert_one_line(answers["work dir is a file"], 1, "dispatcher", "--work-dir",
                    "is not a directory")


def test_a_corrupt_journal_is_a_runtime_failure_in_one_line_and_debug_shows_where(
        answers, answers_dir):
    assert_one_line(answers["corrupt journal"], 1, "dispatcher",
                    str(answers_dir / "corrupt" / "journal" / "meta"),
                    "restore the journal from a backup")
    debug = answers["corrupt journal, debug"]
    assert debug.returncode == 1
    assert "Traceback" in debug.stderr and "DataLossError" in debug.stderr


def test_an_unreachable_dispatcher_is_a_runtime_failure_in_one_line():
    port = free_port()
    done = convoy_command("worker", "--dispatcher", f"127.0.0.1:{port}",
                          "--dispatcher-timeout-ms", "1000")
    assert_one_line(done, 1, "worker", f"127.0.0.1:{port}",
                    f"check that a dispatcher runs at 127.0.0.1:{port}")


@pytest.mark.parametrize("flag, field", DISPATCHER_TIMEOUTS)
def test_the_dispatcher_timeouts_reach_its_config(flag, field, answers):
    done = answers["timeout", flag]  # -5: refused by the config, named by its flag
    assert_one_line(done, 2, "dispatcher", f"{flag} must be >= ")
    assert field not in done.stderr


def test_a_refused_setting_is_named_by_its_flag_even_when_the_names_differ(answers):
    assert_one_line(answers["refused setting"], 2, "worker", "--heartbeat-ms must be >= 1")


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


def test_a_missing_task_is_a_usage_error_in_one_line(answers):
    assert_one_line(answers["missing task"], 2, "server", "give --job and --index")


def test_a_task_index_beyond_the_cluster_is_a_usage_error_in_one_line(answers):
    # TensorFlow's task-id check (multi_worker_util._validate_cluster_spec), at start-up
    assert_one_line(answers["task beyond the cluster"], 2, "server",
                    "The `task_id` 3 exceeds the maximum id of ps.")


def test_a_dispatcher_started_on_a_full_disk_names_the_journal(answers, answers_dir):
    assert_one_line(answers["full disk"], 1, "dispatcher",
                    str(answers_dir / "work" / "journal"), "No space left on device")


@pytest.fixture(scope="module")
def worker() -> Iterator[ServerProcess]:
    """A data-service worker, only asked what it is: one for the module."""
    cluster = ProcessCluster(num_workers=1)
    try:
        yield cluster.workers[0]
    finally:
        cluster.stop()


@pytest.mark.parametrize("command", ["worker", "status"])
def test_a_command_pointed_at_another_kind_of_server_says_what_answered(command, worker):
    done = convoy_command(command, "--dispatcher", worker.address,
                          *(["--dispatcher-timeout-ms", "5000"] if command == "worker" else []))
    assert_one_line(done, 1, command, f"a {DISPATCHER} server was expected",
                    f"answered there is a {WORKER}", worker.address)
    assert "Method not found" not in done.stderr


def grpc_verbosity(argv: str, **env: str) -> str:
    """GRPC_VERBOSITY once convoy is imported by a process whose arguments are ``argv``."""
    script = (f"import sys; sys.argv, sys.orig_argv = {argv}\n"
              "import os, convoy; print(os.environ.get('GRPC_VERBOSITY'))")
    clean = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**clean, **env}, timeout=60, check=True)
    return done.stdout.strip()


def test_grpc_logs_its_own_lines_only_with_the_commands_debug():
    command = "['/usr/bin/convoy', 'worker', '--debug'], ['python', '/usr/bin/convoy']"
    module = "['-m', 'worker', '--debug'], ['python', '-m', 'convoy', 'worker', '--debug']"
    script = "['train.py', '--debug'], ['python', 'train.py', '--debug']"
    assert grpc_verbosity(command) == "None"
    assert grpc_verbosity(module) == "None"
    assert grpc_verbosity(script) == "ERROR"  # a script's own --debug is its own
    assert grpc_verbosity(script.replace(", '--debug'", "")) == "ERROR"
    assert grpc_verbosity(script, GRPC_VERBOSITY="INFO") == "INFO"  # the user's choice holds


def test_a_worker_says_at_once_it_lost_its_dispatcher_and_when_it_is_back(tmp_path):
    port = free_port()
    args = ["--port", str(port), "--fault-tolerant", "--work-dir", str(tmp_path)]
    dispatcher = ServerProcess("dispatcher", args).start()
    worker = ServerProcess("worker", ["--dispatcher", f"127.0.0.1:{port}",
                                      "--heartbeat-ms", "100"]).start()
    try:
        dispatcher.kill()
        lost = wait_for_line(worker, "cannot reach its dispatcher", 5.0)
        dispatcher = ServerProcess("dispatcher", args).start()
        assert wait_for_line(worker, "reaches its dispatcher again", 10.0)
        # the restarted dispatcher said what it replayed: the worker's registration
        replayed = wait_for_line(dispatcher, "replayed", 5.0)
        assert "1 workers" in replayed, replayed
        assert " WARNING " in lost and "dispatcher_timeout_ms" in lost, lost
    finally:
        worker.kill()
        dispatcher.kill()


def wait_for_line(server: ServerProcess, text: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [line for line in list(server.log) if text in line]
        if found:
            return found[0]
        time.sleep(0.05)
    raise TimeoutError(f"no line with {text!r} from {server.role} in {timeout_s:.0f} s: "
                       f"{''.join(server.log[-20:])}")


def slow(x: Any) -> Any:
    time.sleep(0.0005)
    return x


def test_a_worker_draining_on_sigterm_is_no_failure_for_its_consumers(caplog):
    caplog.set_level(logging.INFO)
    cluster = ProcessCluster(num_workers=2)
    try:
        dataset = Dataset.range(4000).map(slow).apply(distribute("dynamic", cluster.target))
        received = []
        for element in dataset:
            received.append(int(element))
            if len(received) == 500:
                # drains for up to 10 s; more time to exit than that on a busy machine
                assert cluster.workers[0].terminate(timeout_s=60) == 0
        assert sorted(received) == list(range(4000))
    finally:
        cluster.stop()
    port = cluster.workers[0].address.rsplit(":", 1)[1]
    warned = [r.getMessage() for r in caplog.records
              if r.levelno >= logging.WARNING and f":{port}" in r.getMessage()]
    assert not warned, warned
    assert any("leaves" in r.getMessage() for r in caplog.records), caplog.records
