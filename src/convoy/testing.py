"""Clusters for tests and demos: real servers, in this process or as child processes.

``LocalCluster`` runs a dispatcher and workers as in-process servers (fast to start);
``ProcessCluster`` runs each as its own ``python -m convoy`` process, which can be killed
with SIGKILL and restarted, as in production.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from convoy.data.service import DispatcherConfig, DispatchServer, WorkerConfig, WorkerServer
from convoy.errors import UnavailableError

_LISTENING = re.compile(r"listening on (\S+)")


class LocalCluster:
    """A dispatcher and ``num_workers`` workers in this process."""

    def __init__(self, num_workers: int = 1, heartbeat_interval_ms: int = 100,
                 dispatcher_config: DispatcherConfig | None = None) -> None:
        self.dispatcher = DispatchServer(dispatcher_config or DispatcherConfig())
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.workers: list[WorkerServer] = []
        for _ in range(num_workers):
            self.add_worker()

    @property
    def target(self) -> str:
        return self.dispatcher.target

    @property
    def address(self) -> str:
        return self.dispatcher._address

    def add_worker(self) -> WorkerServer:
        worker = WorkerServer(WorkerConfig(dispatcher_address=self.address,
                                           heartbeat_interval_ms=self.heartbeat_interval_ms))
        self.workers.append(worker)
        return worker

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.dispatcher.stop()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class ServerProcess:
    """One ``python -m convoy ROLE`` child process and the address it printed."""

    role: str
    args: list[str]
    process: subprocess.Popen[str] | None = None
    address: str = ""
    log: list[str] = field(default_factory=list)

    def start(self, timeout_s: float = 30.0) -> ServerProcess:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "convoy", self.role, *self.args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + timeout_s
        assert self.process.stdout is not None
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                break
            self.log.append(line)
            match = _LISTENING.search(line)
            if match:
                self.address = match[1]
                return self
        self.kill()
        raise UnavailableError(f"convoy {self.role} did not start: {''.join(self.log)[-2000:]}")

    def kill(self) -> None:
        """SIGKILL: the process gets no chance to clean up."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def terminate(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, then wait; returns the exit code."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9


class ProcessCluster:
    """A dispatcher process and worker processes on this machine."""

    def __init__(self, num_workers: int = 1, heartbeat_interval_ms: int = 100,
                 dispatcher_args: list[str] | None = None) -> None:
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.dispatcher = ServerProcess("dispatcher", ["--port", "0", *(dispatcher_args or [])])
        self.dispatcher.start()
        self.workers: list[ServerProcess] = []
        try:
            for _ in range(num_workers):
                self.add_worker()
        except BaseException:
            self.stop()
            raise

    @property
    def target(self) -> str:
        return f"grpc://{self.dispatcher.address}"

    def add_worker(self, port: int = 0) -> ServerProcess:
        worker = ServerProcess("worker", ["--dispatcher", self.dispatcher.address,
                                          "--port", str(port),
                                          "--heartbeat-ms", str(self.heartbeat_interval_ms)])
        self.workers.append(worker.start())
        return worker

    def restart_worker(self, index: int) -> ServerProcess:
        """Kill worker ``index`` and start a new process on the same port."""
        old = self.workers[index]
        old.kill()
        port = int(old.address.rsplit(":", 1)[1])
        new = ServerProcess("worker", ["--dispatcher", self.dispatcher.address,
                                       "--port", str(port),
                                       "--heartbeat-ms", str(self.heartbeat_interval_ms)])
        self.workers[index] = new.start()
        return new

    def stop(self) -> None:
        for server in [*self.workers, self.dispatcher]:
            server.kill()

    def __enter__(self) -> ProcessCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
