"""Clusters for tests and demos: real servers, in this process or as child processes.

``InProcessCluster`` runs a data-service dispatcher and workers as in-process servers (fast to
start); ``ProcessCluster`` runs each as its own ``python -m convoy`` process, which can be
killed with SIGKILL and restarted, as in production. ``TrainingCluster`` runs the ``ps`` and
``worker`` tasks of a parameter-server training cluster as ``convoy server`` processes.
"""

from __future__ import annotations

import json
import mmap
import os
import random
import signal
import socket
import time
from collections.abc import Mapping
from typing import Any

from convoy.data.service import DispatcherConfig, DispatchServer, WorkerConfig, WorkerServer
from convoy.data.service._processes import ProcessCluster, ServerProcess

__all__ = ["InProcessCluster", "ProcessCluster", "ServerProcess", "TrainingCluster",
           "assert_equal", "free_port", "free_ports", "in_shared_memory", "stop_process"]



class InProcessCluster:
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

    def add_worker(self, port: int = 0) -> WorkerServer:
        """Start a worker on ``port`` (0: any free port); it registers before this returns."""
        worker = WorkerServer(WorkerConfig(dispatcher_address=self.address, port=port,
                                           heartbeat_interval_ms=self.heartbeat_interval_ms))
        self.workers.append(worker)
        return worker

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.dispatcher.stop()

    def __enter__(self) -> InProcessCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_process(pid: int, timeout_s: float = 10.0) -> None:
    """SIGSTOP process ``pid`` and wait until every thread of it has stopped (the signal is
    delivered asynchronously: a thread running meanwhile may still answer a call)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while True:
        states = []
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as file:
                    states.append(file.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                continue  # a thread that ended
        if all(state in "Tt" for state in states):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} did not stop within {timeout_s:g} s after "
                               f"SIGSTOP (its threads' states: {''.join(states)})")
        time.sleep(0.001)


def in_shared_memory(array: Any) -> bool:
    """Whether ``array`` is a view on a shared-memory segment (its bases end in an mmap), as
    the elements a same-host worker sends are."""
    base = array
    while base is not None:
        if isinstance(base, mmap.mmap):
            return True
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return False


def free_port() -> int:
    """A TCP port that was free a moment ago (for cluster specs that need fixed ports)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports that were free a moment ago.

    They are drawn at random from below the kernel's ephemeral range: a port the kernel hands
    out (to a server on port 0, or to an outgoing connection) never is one of them, so it
    stays free until its server binds it, even while other processes start servers. A process
    is not given a port again before a quarter of the range has been given out after it."""
    probes: list[socket.socket] = []
    try:
        for port in _below_ephemeral(count):
            if port in _handed_out:
                continue
            probe = socket.socket()
            try:
                probe.bind(("localhost", port))
            except OSError:  # taken: another draw
                probe.close()
                continue
            probes.append(probe)  # held open until all are drawn, so none is drawn twice
            if len(probes) == count:
                break
        while len(probes) < count:  # no room below the ephemeral range: the kernel's pick
            probes.append(socket.socket())
            probes[-1].bind(("localhost", 0))
        ports = [probe.getsockname()[1] for probe in probes]
        _handed_out.update(dict.fromkeys(ports))
        return ports
    finally:
        for probe in probes:
            probe.close()


#: The ports this process was given, oldest first (see free_ports): none is given again soon,
#: so a server is not at the address of a recent one, which the handles this process keeps
#: per address (a ps's store, a worker's link) would take for the old server restarted.
_handed_out: dict[int, None] = {}


def _below_ephemeral(count: int) -> list[int]:
    """Random ports between 10000 and the start of the kernel's ephemeral range; under
    pytest-xdist, from this test process's own slice of it, so that no two test processes
    draw the same port (a port is released between its draw and its server's bind)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as file:
            end = int(file.read().split()[0])
    except (OSError, ValueError, IndexError):
        end = 32768  # Linux's default
    start = 10_000
    worker, workers = _xdist_worker()
    if workers > 1:
        width = (end - start) // workers
        start, end = start + worker * width, start + (worker + 1) * width
    if end - start < 1_000:
        return []
    if len(_handed_out) > (end - start) // 2:  # half given out: the oldest may come again
        for port in list(_handed_out)[:len(_handed_out) // 2]:
            del _handed_out[port]
    return random.SystemRandom().sample(range(start, end), min(end - start, 20 + 4 * count))


def _xdist_worker() -> tuple[int, int]:
    """(index, count) of this pytest-xdist test process; (0, 1) outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    try:
        return int(name.removeprefix("gw")), int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    except (KeyError, ValueError):
        return 0, 1


class TrainingCluster:
    """``num_ps`` parameter servers and ``num_workers`` workers as processes, plus a chief
    address for the coordinator in this process; ``server_args`` and ``env`` (see
    :class:`ServerProcess`) go to every task."""

    def __init__(self, num_workers: int = 2, num_ps: int = 2,
                 server_args: list[str] | None = None,
                 env: Mapping[str, str | None] | None = None) -> None:
        self.server_args = list(server_args or [])
        self.env = dict(env or {})
        self.cluster = {
            "chief": [f"localhost:{free_port()}"],
            "ps": [f"localhost:{free_port()}" for _ in range(num_ps)],
            "worker": [f"localhost:{free_port()}" for _ in range(num_workers)],
        }
        self.servers: dict[tuple[str, int], ServerProcess] = {}
        try:
            for job in ("ps", "worker"):
                for index in range(len(self.cluster[job])):
                    self.start_task(job, index)
        except BaseException:
            self.stop()
            raise

    def _task(self, job: str, index: int) -> ServerProcess:
        return ServerProcess("server", ["--job", job, "--index", str(index),
                                        "--cluster", json.dumps(self.cluster),
                                        *self.server_args], env=self.env)

    def start_task(self, job: str, index: int) -> ServerProcess:
        """Start (or restart, on the same port) task ``index`` of ``job``."""
        server = self._task(job, index).start()
        self.servers[(job, index)] = server
        return server

    def kill_task(self, job: str, index: int) -> None:
        """SIGKILL the task's process."""
        self.servers[(job, index)].kill()

    def resolver(self) -> object:
        """A cluster resolver for the coordinator (the chief) in this process."""
        from convoy.distribute.cluster import ClusterSpec
        from convoy.distribute.cluster_resolver import SimpleClusterResolver

        return SimpleClusterResolver(ClusterSpec(self.cluster), task_type="chief", task_id=0)

    def tf_config(self, job: str, index: int) -> str:
        """The TF_CONFIG JSON for one task of this cluster."""
        return json.dumps({"cluster": self.cluster, "task": {"type": job, "index": index}})

    def stop(self) -> None:
        for server in self.servers.values():
            server.kill()

    def __enter__(self) -> TrainingCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def assert_equal(actual: Any, expected: Any, path: str = "") -> None:
    """Assert that two values are equal: nested structures of arrays, scalars, ``bytes``,
    :class:`~convoy.SparseTensor` and :class:`~convoy.RaggedTensor` (same dtypes and shapes,
    same entries; NaN equals NaN). The message names where they differ."""
    import numpy as np

    from convoy._values.tensors import RaggedTensor, SparseTensor

    where = path or "the top level"
    if isinstance(expected, SparseTensor):
        assert isinstance(actual, SparseTensor), f"at {where}: {actual!r} is not a SparseTensor"
        for part in ("indices", "values", "dense_shape"):
            assert_equal(getattr(actual, part), getattr(expected, part), f"{path}.{part}")
    elif isinstance(expected, RaggedTensor):
        assert isinstance(actual, RaggedTensor), f"at {where}: {actual!r} is not a RaggedTensor"
        assert actual.ragged_rank == expected.ragged_rank, (
            f"at {where}: ragged_rank {actual.ragged_rank} != {expected.ragged_rank}")
        for level, (a, e) in enumerate(zip(actual.nested_row_splits,
                                           expected.nested_row_splits)):
            assert_equal(a, e, f"{path}.nested_row_splits[{level}]")
        assert_equal(actual.flat_values, expected.flat_values, f"{path}.flat_values")
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and sorted(actual) == sorted(expected), (
            f"at {where}: {actual!r} vs {expected!r}")
        for key in expected:
            assert_equal(actual[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert type(actual) is type(expected) and len(actual) == len(expected), (
            f"at {where}: {actual!r} vs {expected!r}")
        for index, (a, e) in enumerate(zip(actual, expected)):
            assert_equal(a, e, f"{path}[{index}]")
    else:
        a, e = np.asarray(actual), np.asarray(expected)
        assert a.dtype == e.dtype, f"at {where}: dtype {a.dtype} != {e.dtype}"
        assert a.shape == e.shape, f"at {where}: shape {a.shape} != {e.shape}"
        if a.dtype.kind in "fc":
            np.testing.assert_array_equal(a, e, err_msg=f"at {where}")
        else:
            assert (a == e).all(), f"at {where}: {a!r} != {e!r}"
