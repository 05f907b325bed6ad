"""``LocalCluster``: a dispatcher and workers as processes on this machine, scaled by hand
(:meth:`LocalCluster.scale`) or by the dispatcher's worker estimate (:meth:`LocalCluster.adapt`).

The adaptive policy (:class:`AdaptPolicy`) is pure, its clock passed in: it grows the fleet to
the estimate at once when consumers wait, and shrinks it only once the estimate has stayed lower
for a cool-down, never past its bounds. A worker scaled down gets SIGTERM and drains (its
unfinished DYNAMIC tasks go to the others), so no element is lost or repeated.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

from convoy._base import threads as _threads
from convoy.data.service._common.server_config import DispatcherConfig, WorkerConfig
from convoy.errors import InvalidArgumentError

log = logging.getLogger("convoy.data.service.autoscale")

#: Consumers waiting more than this share of their time want more workers.
WAIT_THRESHOLD = 0.05
#: A worker leaving gets this long to drain before it is killed.
DRAIN_TIMEOUT_S = 30.0

_DISPATCHER_FLAGS = {"work_dir": "--work-dir", "worker_timeout_ms": "--worker-timeout-ms",
                     "client_timeout_ms": "--client-timeout-ms",
                     "job_gc_timeout_ms": "--job-gc-timeout-ms",
                     "job_gc_check_interval_ms": "--job-gc-check-interval-ms",
                     "metrics_port": "--metrics-port", "max_datasets": "--max-datasets",
                     "max_jobs": "--max-jobs", "max_dataset_bytes": "--max-dataset-bytes"}
_WORKER_FLAGS = {"heartbeat_interval_ms": "--heartbeat-ms",
                 "dispatcher_timeout_ms": "--dispatcher-timeout-ms",
                 "cross_trainer_cache_size_bytes": "--cross-trainer-cache-size-bytes",
                 "max_buffered_bytes": "--max-buffered-bytes"}


def config_args(config: Any, flags: dict[str, str]) -> list[str]:
    """Command-line flags for the fields of ``config`` that differ from their defaults;
    InvalidArgumentError for a field a process cannot be given on its command line."""
    if config is None:
        return []
    args: list[str] = []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if value == field.default or field.name in ("port", "dispatcher_address"):
            continue
        if field.name == "fault_tolerant_mode":
            args.append("--fault-tolerant")
        elif field.name in flags:
            args += [flags[field.name], str(value)]
        else:
            raise InvalidArgumentError(
                f"LocalCluster cannot pass {type(config).__name__}.{field.name} to its "
                f"processes; supported: {sorted(flags)}")
    return args


@dataclass
class AdaptPolicy:
    """When to scale, from the dispatcher's estimate: up at once while consumers wait, down
    once the estimate has stayed lower for ``cooldown_s``; within [minimum, maximum]."""

    minimum: int = 1
    maximum: int | None = None
    cooldown_s: float = 20.0
    wait_threshold: float = WAIT_THRESHOLD
    _lower_since: float | None = None
    _lower_peak: int = 0  # the highest estimate during the cool-down: what it shrinks to

    def decide(self, now: float, workers: int, optimal: int | None,
               waited: float | None) -> tuple[int, str] | None:
        """``(workers wanted, why)``, or None to stay at ``workers``."""
        if workers < self.minimum:
            return self.minimum, f"below the minimum {self.minimum}"
        if self.maximum is not None and workers > self.maximum:
            return self.maximum, f"above the maximum {self.maximum}"
        if optimal is None:
            self._lower_since = None
            return None
        target = self._bounded(optimal)
        numbers = f"estimate {optimal}, consumers waited {_share(waited)}"
        if target > workers:
            self._lower_since = None
            if waited is None or waited > self.wait_threshold:
                return target, f"scale up: {numbers}"
            return None
        if target == workers:
            self._lower_since = None
            return None
        if self._lower_since is None:
            self._lower_since, self._lower_peak = now, target
            return None
        self._lower_peak = max(self._lower_peak, target)
        if now - self._lower_since < self.cooldown_s:
            return None
        self._lower_since = None
        return self._lower_peak, (f"scale down: {numbers}; lower than {workers} for "
                                  f"{self.cooldown_s:g} s")

    def _bounded(self, n: int) -> int:
        n = max(self.minimum, n)
        return n if self.maximum is None else min(self.maximum, n)


def _drain(workers: list[Any]) -> None:
    """SIGTERM every worker at once, so that they drain side by side (one after the other, a
    shrink by three took up to three drains), then wait for each; kill any still running
    ``DRAIN_TIMEOUT_S`` after the signal."""
    for worker in workers:
        if worker.process.poll() is None:
            worker.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    for worker in workers:
        try:
            worker.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.kill()


def _share(waited: float | None) -> str:
    return "unknown" if waited is None else f"{waited:.0%} of the time"


class LocalCluster:
    """A dispatcher and ``num_workers`` workers, each a ``python -m convoy`` process on this
    machine; ``dispatcher_config`` and ``worker_config`` set their flags (their ports are
    chosen free, and the workers' ``dispatcher_address`` is this cluster's). Use it as a
    context manager, or call :meth:`close`."""

    def __init__(self, num_workers: int = 1, *,
                 dispatcher_config: DispatcherConfig | None = None,
                 worker_config: WorkerConfig | None = None) -> None:
        from convoy.testing import ProcessCluster

        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._adapting: threading.Thread | None = None
        #: (time, workers before, workers after, why) of every change of size
        self.events: list[tuple[float, int, int, str]] = []
        worker_args = config_args(worker_config, _WORKER_FLAGS)
        self._cluster = ProcessCluster(
            num_workers, heartbeat_interval_ms=None,
            dispatcher_args=config_args(dispatcher_config, _DISPATCHER_FLAGS),
            worker_args=worker_args)

    @property
    def target(self) -> str:
        """The dispatcher's address for ``distribute(service=...)``: ``grpc://HOST:PORT``."""
        return self._cluster.target

    @property
    def worker_addresses(self) -> list[str]:
        with self._lock:
            return [worker.address for worker in self._cluster.workers]

    def scale(self, n: int, why: str = "asked") -> None:
        """Run ``n`` workers: start new ones, or drain the newest (SIGTERM) until ``n``."""
        if n < 0:
            raise InvalidArgumentError(f"scale needs a number of workers >= 0, got {n}")
        with self._lock:
            before = len(self._cluster.workers)
            while len(self._cluster.workers) < n:
                self._cluster.add_worker()
            _drain([self._cluster.workers.pop()
                    for _ in range(len(self._cluster.workers) - n)])
            if n != before:
                self.events.append((time.monotonic(), before, n, why))
                log.info("workers %d -> %d (%s)", before, n, why)

    def adapt(self, minimum: int = 1, maximum: int | None = None,
              interval_s: float = 5.0) -> None:
        """Follow the dispatcher's estimate every ``interval_s`` within [minimum, maximum]
        (see :class:`AdaptPolicy`; its cool-down is four intervals)."""
        if minimum < 0 or (maximum is not None and maximum < max(1, minimum)):
            raise InvalidArgumentError(f"adapt needs 0 <= minimum <= maximum, got {minimum}, "
                                       f"{maximum}")
        self._stop_adapting()
        policy = AdaptPolicy(minimum, maximum, cooldown_s=4 * interval_s)
        self._stop.clear()
        self._adapting = _threads.start("convoy-local-cluster-adapt", self._adapt_loop,
                                        policy, interval_s)

    def _adapt_loop(self, policy: AdaptPolicy, interval_s: float) -> None:
        from convoy.cluster_status import dispatcher_status

        while not self._stop.wait(interval_s):
            try:
                status = dispatcher_status(self.target, timeout_s=max(1.0, interval_s))
            except Exception as error:  # the dispatcher busy or restarting: next interval
                log.warning("adapt: no status from the dispatcher: %s", error)
                continue
            with self._lock:
                workers = len(self._cluster.workers)
            decision = policy.decide(time.monotonic(), workers, status["optimal_workers"],
                                     status["consumer_wait_fraction"])
            if decision is not None and not self._stop.is_set():
                self.scale(*decision)

    def _stop_adapting(self) -> None:
        self._stop.set()
        if self._adapting is not None:
            self._adapting.join(60.0)
            if self._adapting.is_alive():
                raise TimeoutError("the adaptive scaling thread did not stop within 60 s")
            self._adapting = None

    def close(self) -> None:
        """Stop adapting, then kill every process."""
        self._stop_adapting()
        self._cluster.stop()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
