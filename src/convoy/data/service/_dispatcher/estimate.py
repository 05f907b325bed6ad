"""How many workers the jobs need: TensorFlow's auto-scaler estimate (``auto_scaler.cc``).

Consumers report their *target processing time* (the time they spend per element when they
do not wait for one: the inverse of how fast they would take elements) and how long they
waited; workers report, per task, their pipeline's time per element while it is not blocked
on a full buffer. A job needs ``ceil(sum of its consumers' rates / mean throughput of its
tasks)`` workers (at least 1); each sum and mean first replaces the reports more than one
standard deviation from their mean by their median, as TensorFlow does, so one odd report
cannot make the estimate infeasible. The fleet needs the largest of its jobs' estimates (every
worker runs a task of every job), bounded in growth as TensorFlow bounds it: at most
``min(4 * workers, workers + 500)`` for ``workers`` registered, and within [1, 100000].

Pure: no clock and no I/O; every report carries its ``now``, and reports older than
:data:`REPORT_TTL_S` at the time asked are ignored (a consumer or task that went away stops
counting). Not journaled: a restarted dispatcher estimates afresh from new reports.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

#: Reports older than this (seconds) no longer count.
REPORT_TTL_S = 10.0
#: A report this many standard deviations from the mean is replaced by the median.
OUTLIER_SIGMAS = 1.0
MAX_WORKERS = 100_000


@dataclass
class _Report:
    value: float  # a rate (elements per second)
    at: float


@dataclass
class _Job:
    consumers: dict[int, _Report] = field(default_factory=dict)  # client id: its rate
    tasks: dict[int, _Report] = field(default_factory=dict)  # task id: its throughput
    waited: dict[int, tuple[float, float]] = field(default_factory=dict)  # client: wait share


def without_outliers(values: list[float], sigmas: float = OUTLIER_SIGMAS) -> list[float]:
    """``values`` with those farther than ``sigmas`` sample standard deviations from their
    mean replaced by their (upper) median, as TensorFlow's ``ReplaceOutliers``."""
    if len(values) <= 1:
        return list(values)
    mean = statistics.fmean(values)
    deviation = statistics.stdev(values)
    median = sorted(values)[len(values) // 2]
    low, high = mean - deviation * sigmas, mean + deviation * sigmas
    return [v if low <= v <= high else median for v in values]


def workers_needed(consumption_rates: list[float], throughputs: list[float]) -> int | None:
    """``ceil(sum(rates) / mean(throughputs))``, at least 1, outliers replaced; None without
    a report of either kind."""
    if not consumption_rates or not throughputs:
        return None
    demand = sum(without_outliers(consumption_rates))
    supply = sum(without_outliers(throughputs)) / len(throughputs)
    return max(1, math.ceil(demand / supply - 1e-9))


def bounded(optimal: int, workers: int) -> int:
    """``optimal`` with its growth over ``workers`` bounded as TensorFlow's metric is."""
    workers = max(1, workers)
    return max(1, min(optimal, min(4 * workers, workers + 500), MAX_WORKERS))


class WorkerEstimate:
    """The reports of consumers and workers, per job, and the estimate they give."""

    def __init__(self, ttl_s: float = REPORT_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._jobs: dict[int, _Job] = {}

    def report_consumer(self, job_id: int, client_id: int, target_time_s: float,
                        waited_s: float, elapsed_s: float, now: float) -> None:
        """Consumer ``client_id`` of ``job_id`` took ``target_time_s`` per element when not
        waiting, and waited ``waited_s`` of the last ``elapsed_s`` seconds."""
        job = self._jobs.setdefault(job_id, _Job())
        if target_time_s > 0:
            job.consumers[client_id] = _Report(1.0 / target_time_s, now)
        if elapsed_s > 0:
            job.waited[client_id] = (min(1.0, max(0.0, waited_s / elapsed_s)), now)

    def report_task(self, job_id: int, task_id: int, processing_time_s: float,
                    now: float) -> None:
        """Task ``task_id`` of ``job_id`` took ``processing_time_s`` per element."""
        if processing_time_s > 0:
            self._jobs.setdefault(job_id, _Job()).tasks[task_id] = _Report(
                1.0 / processing_time_s, now)

    def forget_job(self, job_id: int) -> None:
        self._jobs.pop(job_id, None)

    def job_estimate(self, job_id: int, now: float) -> int | None:
        """The workers ``job_id`` needs (unbounded); None while unknown."""
        job = self._jobs.get(job_id)
        if job is None:
            return None
        return workers_needed(self._fresh(job.consumers, now), self._fresh(job.tasks, now))

    def fleet_estimate(self, workers: int, now: float) -> int | None:
        """The workers all jobs need (the largest job's need), growth bounded over
        ``workers``; None while no job's is known."""
        known = [n for job_id in self._jobs if (n := self.job_estimate(job_id, now)) is not None]
        return bounded(max(known), workers) if known else None

    def wait_fraction(self, now: float, job_id: int | None = None) -> float | None:
        """The largest share of time a consumer (of ``job_id``, or of any job) waited
        lately; None without a report."""
        jobs = [self._jobs[job_id]] if job_id in self._jobs else (
            [] if job_id is not None else list(self._jobs.values()))
        shares = [share for job in jobs for share, at in job.waited.values()
                  if now - at <= self.ttl_s]
        return max(shares) if shares else None

    def _fresh(self, reports: dict[int, _Report], now: float) -> list[float]:
        for key in [k for k, r in reports.items() if now - r.at > self.ttl_s]:
            del reports[key]
        return [r.value for r in reports.values()]
