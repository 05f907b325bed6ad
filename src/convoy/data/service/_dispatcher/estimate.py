"""How many workers the jobs need: TensorFlow's auto-scaler estimate (``auto_scaler.cc``).

Consumers report their *target processing time* (the time they spend per element when they
do not wait for one: the inverse of how fast they would take elements) and how long they
waited; workers report, per task, their pipeline's time per element while it is not blocked
on a full buffer. As in TensorFlow, each iteration has its own estimate: ``ceil(sum of its
consumers' rates / mean throughput of its tasks)`` workers (at least 1), where the sum and the
mean first replace the reports more than one sample standard deviation from their mean by
their (upper) median, so one odd report cannot make the estimate infeasible. A job needs the
largest of its iterations' estimates and the fleet the largest of all (every worker runs a
task of every iteration), bounded in growth as TensorFlow bounds its metric: at most
``min(4 * workers, workers + 500)`` for ``workers`` registered, and within [1, 100000].

A report stands until its consumer or task reports again, as in TensorFlow: a task whose
producer is blocked (its buffer full, or its input done) measures nothing new, yet its last
time per element is still what it can do. A heartbeat without a measurement keeps the last
one alive; a report whose source has not been heard from for :data:`REPORT_TTL_S` no longer
counts (the consumer or worker went away), and a released consumer's at once.

Pure: no clock and no I/O; every report carries its ``now``. Not journaled: a restarted
dispatcher estimates afresh from new reports.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

#: A report whose consumer or task went silent this long (seconds) no longer counts.
REPORT_TTL_S = 10.0
#: A report this many standard deviations from the mean is replaced by the median.
OUTLIER_SIGMAS = 1.0
MAX_WORKERS = 100_000


@dataclass
class _Report:
    value: float  # a rate (elements per second)
    at: float


@dataclass
class _Iteration:
    job_id: int
    consumers: dict[int, _Report] = field(default_factory=dict)  # client id: its rate
    tasks: dict[int, _Report] = field(default_factory=dict)  # task id: its throughput
    waited: dict[int, _Report] = field(default_factory=dict)  # client id: its wait share


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
    # 1e-9: rates are inverses of times, so an exact ratio may come out a hair above
    return max(1, math.ceil(demand / supply - 1e-9))


def bounded(optimal: int, workers: int) -> int:
    """``optimal`` with its growth over ``workers`` bounded as TensorFlow's metric is."""
    workers = max(1, workers)
    return max(1, min(optimal, min(4 * workers, workers + 500), MAX_WORKERS))


class WorkerEstimate:
    """The reports of consumers and workers, per iteration, and the estimate they give."""

    def __init__(self, ttl_s: float = REPORT_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._iterations: dict[int, _Iteration] = {}

    def report_consumer(self, job_id: int, iteration_id: int, client_id: int,
                        target_time_s: float, waited_s: float, elapsed_s: float,
                        now: float) -> None:
        """Consumer ``client_id`` of ``iteration_id`` (of ``job_id``) took ``target_time_s``
        per element when not waiting (0: took none; its last report stands), and waited
        ``waited_s`` of the last ``elapsed_s`` seconds."""
        iteration = self._iteration(job_id, iteration_id)
        _update(iteration.consumers, client_id, target_time_s, now)
        if elapsed_s > 0:
            iteration.waited[client_id] = _Report(min(1.0, max(0.0, waited_s / elapsed_s)), now)

    def report_task(self, job_id: int, iteration_id: int, task_id: int,
                    processing_time_s: float, now: float) -> None:
        """Task ``task_id`` of ``iteration_id`` took ``processing_time_s`` per element (0:
        made none since its last report, which stands)."""
        _update(self._iteration(job_id, iteration_id).tasks, task_id, processing_time_s, now)

    def forget_consumer(self, client_id: int) -> None:
        """Consumer ``client_id`` left (released its iteration)."""
        for iteration in self._iterations.values():
            iteration.consumers.pop(client_id, None)
            iteration.waited.pop(client_id, None)

    def iteration_estimate(self, iteration_id: int, now: float) -> int | None:
        """The workers ``iteration_id`` needs (unbounded); None while unknown."""
        iteration = self._iterations.get(iteration_id)
        if iteration is None:
            return None
        return workers_needed(self._fresh(iteration.consumers, now),
                              self._fresh(iteration.tasks, now))

    def job_estimate(self, job_id: int, now: float) -> int | None:
        """The workers ``job_id`` needs: its largest iteration's need; None while unknown."""
        return _largest(self.iteration_estimate(i, now) for i, iteration
                        in list(self._iterations.items()) if iteration.job_id == job_id)

    def fleet_estimate(self, workers: int, now: float) -> int | None:
        """The workers all iterations need (the largest one's need), growth bounded over
        ``workers``; None while no iteration's is known."""
        self._prune(now)
        largest = _largest(self.iteration_estimate(i, now) for i in list(self._iterations))
        return None if largest is None else bounded(largest, workers)

    def wait_fraction(self, now: float, job_id: int | None = None) -> float | None:
        """The largest share of time a consumer (of ``job_id``, or of any job) waited
        lately; None without a report."""
        shares = [share for iteration in self._iterations.values()
                  if job_id is None or iteration.job_id == job_id
                  for share in self._fresh(iteration.waited, now)]
        return max(shares) if shares else None

    def _iteration(self, job_id: int, iteration_id: int) -> _Iteration:
        iteration = self._iterations.get(iteration_id)
        if iteration is None:
            iteration = self._iterations[iteration_id] = _Iteration(job_id)
        return iteration

    def _fresh(self, reports: dict[int, _Report], now: float) -> list[float]:
        for key in [k for k, r in reports.items() if now - r.at > self.ttl_s]:
            del reports[key]
        return [r.value for r in reports.values()]

    def _prune(self, now: float) -> None:
        """Forget the iterations no one has reported on lately."""
        for iteration_id, iteration in list(self._iterations.items()):
            if not any(self._fresh(reports, now) for reports
                       in (iteration.consumers, iteration.tasks, iteration.waited)):
                del self._iterations[iteration_id]


def _update(reports: dict[int, _Report], key: int, seconds: float, now: float) -> None:
    """Record a time per element as a rate, or (0) keep the last one alive."""
    if seconds > 0:
        reports[key] = _Report(1.0 / seconds, now)
    elif key in reports:
        reports[key].at = now


def _largest(estimates: Iterable[int | None]) -> int | None:
    known = [n for n in estimates if n is not None]
    return max(known) if known else None
