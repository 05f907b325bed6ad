"""TensorFlow servers for the benchmarks, each in its own process of TensorFlow's Python.

``python tf_servers.py dispatcher``, ``worker DISPATCHER_ADDRESS`` or ``task`` (a
``tf.distribute.Server`` for the task named by TF_CONFIG) prints ``listening on ADDRESS`` once
it serves, then serves until its parent process is gone. ``Servers`` starts such processes and
kills them all when it closes.
"""

from __future__ import annotations

import json
import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

_LISTENING = re.compile(r"listening on (\S+)")
HEARTBEAT_MS = 100  # as the convoy side's clusters


def free_port() -> int:
    """A TCP port that was free a moment ago (for cluster specs that need fixed ports)."""
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


class Servers:
    """Server processes started by this one; ``close()`` (or leaving the ``with``) kills them."""

    def __init__(self) -> None:
        self._processes: list[subprocess.Popen[str]] = []

    def start(self, *args: str, env: dict[str, str] | None = None,
              timeout_s: float = 120.0) -> str:
        """Start ``tf_servers.py ARGS`` and return the address it listens on."""
        process = subprocess.Popen(
            [sys.executable, str(Path(__file__)), *args], stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, env={**os.environ, **(env or {})})
        self._processes.append(process)
        lines: queue.Queue[str | None] = queue.Queue()
        # read its output in a thread: the wait below can time out, and a chatty server
        # never blocks on a full pipe
        threading.Thread(target=_forward, args=(process.stdout, lines), daemon=True).start()
        deadline = time.monotonic() + timeout_s
        while (line := _next_line(lines, deadline)) is not None:
            match = _LISTENING.search(line)
            if match:
                return match[1]
        raise RuntimeError(f"TensorFlow server {' '.join(args)} did not start within "
                           f"{timeout_s:.0f} s (exit code {process.poll()})")

    def close(self) -> None:
        for process in self._processes:
            if process.poll() is None:
                process.kill()
            process.wait(30)
        self._processes.clear()

    def __enter__(self) -> Servers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _forward(stream: Any, lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def _next_line(lines: queue.Queue[str | None], deadline: float) -> str | None:
    """The next line, or None at the end of the output or at the deadline."""
    try:
        return lines.get(timeout=max(0.0, deadline - time.monotonic()))
    except queue.Empty:
        return None


def data_service(num_workers: int, servers: Servers) -> str:
    """The target of a tf.data service dispatcher and ``num_workers`` workers, as processes."""
    address = servers.start("dispatcher")
    for _ in range(num_workers):
        servers.start("worker", address)
    return f"grpc://{address}"


def training_cluster(num_workers: int, num_ps: int, servers: Servers) -> dict[str, list[str]]:
    """A cluster spec whose ps and worker tasks run as processes; its chief is the caller."""
    cluster = {"chief": [f"localhost:{free_port()}"],
               "ps": [f"localhost:{free_port()}" for _ in range(num_ps)],
               "worker": [f"localhost:{free_port()}" for _ in range(num_workers)]}
    for job in ("ps", "worker"):
        for index in range(len(cluster[job])):
            config = {"cluster": cluster, "task": {"type": job, "index": index}}
            servers.start("task", env={"TF_CONFIG": json.dumps(config)})
    return cluster


def _serve(role: str, args: list[str]) -> object:
    """Start the server ``role`` and print its address; the caller keeps it alive."""
    import tensorflow as tf

    service = tf.data.experimental.service
    if role == "dispatcher":
        server = service.DispatchServer(service.DispatcherConfig(port=0))
        address = server.target.split("://", 1)[1]
    elif role == "worker":
        server = service.WorkerServer(service.WorkerConfig(
            dispatcher_address=args[0], heartbeat_interval_ms=HEARTBEAT_MS))
        address = server._address
    elif role == "task":
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                      task_index=resolver.task_id, protocol="grpc",
                                      start=True)
        address = resolver.cluster_spec().task_address(resolver.task_type, resolver.task_id)
    else:
        raise SystemExit(f"unknown role {role!r}: expected dispatcher, worker or task")
    print(f"listening on {address}", flush=True)
    return server


def exit_with_parent() -> None:
    """End this process (at once, whatever it is doing) when its parent process is gone."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def main() -> None:
    exit_with_parent()
    _server = _serve(sys.argv[1], sys.argv[2:])  # referenced, so it keeps serving
    threading.Event().wait()  # serve until the parent is gone


if __name__ == "__main__":
    main()
