"""Convoy servers as child processes on this machine: one ``python -m convoy ROLE`` process
(:class:`ServerProcess`) and a data service of them (:class:`ProcessCluster`), which
:class:`~convoy.data.service.LocalCluster` runs and tests kill and restart."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from convoy._base import threads as _threads
from convoy.errors import UnavailableError

_LISTENING = re.compile(r"^convoy .* listening on (\S+)")


@dataclass
class ServerProcess:
    """One ``python -m convoy ROLE`` child process and the address it printed (the one it
    bound). ``env``: changes to this process's environment for the child (None removes a
    variable), e.g. ``{"CONVOY_AUTH_TOKEN": secret}``."""

    role: str
    args: list[str]
    process: subprocess.Popen[str] | None = None
    address: str = ""
    log: list[str] = field(default_factory=list)
    env: Mapping[str, str | None] = field(default_factory=dict)
    #: A command the child runs under (it ends by running its arguments), e.g. ``unshare``.
    wrapper: list[str] = field(default_factory=list)

    def start(self, timeout_s: float = 30.0) -> ServerProcess:
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1",
               # the server exits when this process does: a crashed test leaves none behind
               "CONVOY_PARENT_PID": str(os.getpid())}
        self.process = subprocess.Popen(
            [*self.wrapper, sys.executable, "-m", "convoy", self.role, *self.args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={name: value for name, value in env.items() if value is not None},
        )
        # Read its output from the first line on a thread of its own: the wait below keeps its
        # deadline even if the child hangs mid-line, and a chatty server never blocks on a
        # full pipe.
        self.address = ""
        listening = threading.Event()
        _threads.start(f"convoy-testing-{self.role}-output", self._drain, listening,
                       on_error=lambda _: listening.set())
        listening.wait(timeout_s)
        if self.address:
            return self
        self.kill()
        raise UnavailableError(f"convoy {self.role} did not start within {timeout_s:.0f} s: "
                               f"{''.join(self.log)[-2000:]}")

    def _drain(self, listening: threading.Event) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.log.append(line)
            del self.log[:-200]
            if not self.address:
                match = _LISTENING.search(line)
                if match:
                    self.address = match[1]
                    listening.set()
        listening.set()  # its output ended: it exited

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
    """A dispatcher process and worker processes on this machine; ``worker_args`` and ``env``
    (see :class:`ServerProcess`) go to every worker, ``env`` to the dispatcher too;
    ``heartbeat_interval_ms=None`` leaves the workers' default."""

    def __init__(self, num_workers: int = 1, heartbeat_interval_ms: int | None = 100,
                 dispatcher_args: list[str] | None = None,
                 worker_args: list[str] | None = None,
                 env: Mapping[str, str | None] | None = None) -> None:
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.worker_args = list(worker_args or [])
        self.env = dict(env or {})
        self.dispatcher = ServerProcess("dispatcher", ["--port", "0", *(dispatcher_args or [])],
                                        env=self.env)
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

    def _worker(self, port: int) -> ServerProcess:
        heartbeat = ([] if self.heartbeat_interval_ms is None
                     else ["--heartbeat-ms", str(self.heartbeat_interval_ms)])
        return ServerProcess("worker", ["--dispatcher", self.dispatcher.address,
                                        "--port", str(port), *heartbeat,
                                        *self.worker_args], env=self.env)

    def add_worker(self, port: int = 0) -> ServerProcess:
        worker = self._worker(port)
        self.workers.append(worker.start())
        return worker

    def restart_worker(self, index: int) -> ServerProcess:
        """Kill worker ``index`` and start a new process on the same port."""
        old = self.workers[index]
        old.kill()
        new = self._worker(int(old.address.rsplit(":", 1)[1]))
        self.workers[index] = new.start()
        return new

    def stop(self) -> None:
        for server in [*self.workers, self.dispatcher]:
            server.kill()

    def __enter__(self) -> ProcessCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
