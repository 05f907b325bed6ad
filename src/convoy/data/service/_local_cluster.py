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
from convoy.data.service._client.status import dispatcher_status
from convoy.data.service._common.server_config import DispatcherConfig, WorkerConfig
from convoy.data.service._processes import ProcessCluster
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
    once the estimate has stayed lower for ``cooldown_s`` (an unknown estimate neither starts
    nor stops that wait); within [minimum, maximum]."""

    minimum: int = 1
    maximum: int | None = None
    cooldown_s: float = 20.0
    wait_threshold: float = WAIT_THRESHOLD
    _lower_since: float | None = None
    _lower_peak: int = 0  # the highest estimate during the cool-down: what it shrinks to

    def decide(self, now: float, workers: int, optimal: int | None, waited: float | None,
               throughput: float | None = None) -> tuple[int, str] | None:
        """``(workers wanted, why)``, or None to stay at ``workers`` (``throughput`` is not
        used: see :class:`ThroughputPolicy`)."""
        out_of_bounds = _outside(workers, self.minimum, self.maximum)
        if out_of_bounds is not None:
            return out_of_bounds
        if optimal is None:  # no evidence either way: a cool-down under way goes on
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


@dataclass
class ThroughputPolicy:
    """Cachew's policy (ATC '22), a hill climb on the consumers' throughput (elements per
    second), kept to compare with :class:`AdaptPolicy`: from a wait of consumers it adds a
    worker at a time while each step raises the throughput by more than ``grow_gain``; once
    steady for ``cooldown_s`` it removes one at a time while each step loses less than
    ``shrink_loss``, and steps back up after one that loses more (the next try then waits
    twice as long). A change counts once ``settle_s`` has passed after it."""

    minimum: int = 1
    maximum: int | None = None
    cooldown_s: float = 20.0
    settle_s: float = 10.0
    grow_gain: float = 0.07
    shrink_loss: float = 0.03
    wait_threshold: float = WAIT_THRESHOLD
    _changed_at: float = float("-inf")
    _direction: int = 0  # +1 growing, -1 shrinking, 0 steady
    _before: float = 0.0  # the throughput before the last step
    _backoff: float = 1.0

    def decide(self, now: float, workers: int, optimal: int | None, waited: float | None,
               throughput: float | None = None) -> tuple[int, str] | None:
        """``(workers wanted, why)``, or None to stay at ``workers`` (``optimal`` is not
        used)."""
        out_of_bounds = _outside(workers, self.minimum, self.maximum)
        if out_of_bounds is not None:
            return out_of_bounds
        if throughput is None or now - self._changed_at < self.settle_s:
            return None
        numbers = f"throughput {throughput:.0f}/s, {self._before:.0f}/s before"
        at_most = self.maximum is not None and workers >= self.maximum
        if self._direction > 0:
            if throughput > (1 + self.grow_gain) * self._before and not at_most:
                return self._step(now, +1, workers, throughput, f"grow on: {numbers}")
            self._direction, self._changed_at = 0, now  # steady from here
            return None
        if self._direction < 0:
            if throughput >= (1 - self.shrink_loss) * self._before:
                if workers > self.minimum:
                    return self._step(now, -1, workers, throughput, f"shrink on: {numbers}")
                self._direction, self._changed_at = 0, now
                return None
            self._direction, self._backoff = 0, self._backoff * 2
            self._changed_at = now
            return workers + 1, f"step back up: {numbers}"
        if waited is not None and waited > self.wait_threshold and not at_most:
            self._backoff = 1.0
            return self._step(now, +1, workers, throughput,
                              f"grow: consumers waited {_share(waited)}")
        if now - self._changed_at >= self.cooldown_s * self._backoff and workers > self.minimum:
            return self._step(now, -1, workers, throughput,
                              f"try shrinking: throughput {throughput:.0f}/s")
        return None

    def _step(self, now: float, direction: int, workers: int, throughput: float,
              why: str) -> tuple[int, str]:
        self._direction, self._before, self._changed_at = direction, throughput, now
        return workers + direction, why


Policy = AdaptPolicy | ThroughputPolicy


def _outside(workers: int, minimum: int, maximum: int | None) -> tuple[int, str] | None:
    if workers < minimum:
        return minimum, f"below the minimum {minimum}"
    if maximum is not None and workers > maximum:
        return maximum, f"above the maximum {maximum}"
    return None


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


def _served(status: dict[str, Any]) -> int | None:
    """The elements all iterations have served their consumers; None unless every one
    counts them (DYNAMIC sharding with exactly-once delivery)."""
    counts = [iteration["elements_served"] for job in status["jobs"]
              for iteration in job["iterations"]]
    return None if not counts or None in counts else sum(counts)


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
        self._follow(AdaptPolicy(minimum, maximum, cooldown_s=4 * interval_s), interval_s)

    def _follow(self, policy: Policy, interval_s: float) -> None:
        """Scale as ``policy`` decides from the dispatcher's status every ``interval_s``
        (what :meth:`adapt` does with an :class:`AdaptPolicy`)."""
        self._stop_adapting()
        self._stop.clear()
        self._adapting = _threads.start("convoy-local-cluster-adapt", self._adapt_loop,
                                        policy, interval_s)

    def _adapt_loop(self, policy: Policy, interval_s: float) -> None:
        served: tuple[float, int] | None = None  # (when, elements served by then)
        while not self._stop.wait(interval_s):
            try:
                status = dispatcher_status(self.target, timeout_s=max(1.0, interval_s))
            except Exception as error:  # the dispatcher busy or restarting: next interval
                log.warning("adapt: no status from the dispatcher: %s", error)
                continue
            now = time.monotonic()
            with self._lock:
                workers = len(self._cluster.workers)
            optimal, waited = status["optimal_workers"], status["consumer_wait_fraction"]
            throughput = None
            total = _served(status)
            if total is not None and served is not None and now > served[0]:
                throughput = (total - served[1]) / (now - served[0])
            served = None if total is None else (now, total)
            decision = policy.decide(now, workers, optimal, waited, throughput)
            log.debug("adapt: %d workers, estimate %s, consumers waited %s, throughput %s: %s",
                      workers, optimal, _share(waited),
                      "unknown" if throughput is None else f"{throughput:.0f}/s",
                      "stay" if decision is None else decision[1])
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
