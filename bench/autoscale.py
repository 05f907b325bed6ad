"""The ``autoscale`` workload: a trainer whose demand changes, read through a LocalCluster that
follows the dispatcher's worker estimate (``adapt(minimum=1, maximum=8)`` from 1 worker).

Each element waits 5 ms in a sequential ``map`` (as reading remote storage does), so a worker
gives about 200 elements/s and the least workers that meet a demand of 600/s is 3, of 100/s 1.
The trainer takes 600 elements/s (a paced loop), then 100/s, then the rest of the epoch as fast
as it comes so that every id can be checked: DYNAMIC sharding delivers each exactly once.
Convoy only: TensorFlow has no local cluster that scales itself.

``CONVOY_BENCH_AUTOSCALE_POLICY=cachew`` runs it with Cachew's throughput hill climb
(``ThroughputPolicy``) in place of ``adapt``'s policy, which follows the dispatcher's estimate.
"""

from __future__ import annotations

import bisect
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import numpy as np

import convoy as cv

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ELEMENT_WAIT_S = 0.005
HIGH_RATE, LOW_RATE = 600.0, 100.0
LEAST_HIGH, LEAST_LOW = 3, 1  # the least workers that meet each demand
ELEMENTS = 48_000  # about what the two paced phases take; the rest is read unpaced
MET_SHARE = 0.9  # the demand counts as met at 90% of it
WINDOW_S = 2.0  # the trainer's rate is measured over this window
SETTLE_S = 10.0  # after the demand is met, before its steady state is measured
STEADY_HIGH_S, STEADY_LOW_S = 40.0, 20.0
MET_TIMEOUT_S, SHRINK_TIMEOUT_S, TAIL_TIMEOUT_S = 60.0, 90.0, 90.0
MAX_DEBT_S = 0.05  # a paced trainer that fell behind catches up at most this much


def _slow(x: Any) -> Any:
    time.sleep(ELEMENT_WAIT_S)  # waiting, not computing: two cores run many workers
    return x


@dataclass
class _Trainer:
    """Takes elements at ``rate`` per second (None: as fast as they come) on a thread of its
    own, counting each id and noting each arrival's time."""

    rate: float | None = HIGH_RATE
    counts: np.ndarray = field(default_factory=lambda: np.zeros(ELEMENTS, np.int32))
    arrivals: list[float] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)

    def read(self, target: str) -> None:
        try:
            ds = cv.data.Dataset.range(ELEMENTS).map(_slow).apply(
                cv.data.service.distribute("distributed_epoch", target))
            due = time.monotonic()
            for x in ds:
                now = time.monotonic()
                self.counts[int(x)] += 1
                self.arrivals.append(now)
                rate = self.rate
                if rate is not None:
                    due = max(due + 1 / rate, now - MAX_DEBT_S)
                    time.sleep(max(0.0, due - now))
        except BaseException as error:  # noqa: BLE001  # reported by the workload
            self.errors.append(error)

    def recent_rate(self) -> float:
        """Elements per second over the last ``WINDOW_S``."""
        now = time.monotonic()
        return (len(self.arrivals) - bisect.bisect_left(self.arrivals, now - WINDOW_S)) / WINDOW_S


def _workers(cluster: Any) -> int:
    """The fleet's size after its last completed change (a drain holds the cluster's lock)."""
    return cluster.events[-1][2] if cluster.events else 1


def _until(condition: Any, timeout_s: float, trainer: _Trainer) -> float | None:
    """Seconds until ``condition()`` holds (polled), None after ``timeout_s`` or if the trainer
    stopped."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if condition():
            return time.monotonic() - started
        if trainer.errors:
            return None
        time.sleep(0.1)
    return None


def _hold(seconds: float, cluster: Any) -> tuple[int, int]:
    """(the most workers, scale events) over the next ``seconds``."""
    events, most = len(cluster.events), _workers(cluster)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        most = max(most, _workers(cluster))
        time.sleep(0.2)
    return most, len(cluster.events) - events


def policy_name() -> str:
    """The policy asked for: ``estimate`` (adapt's, the default) or ``cachew``."""
    name = os.environ.get("CONVOY_BENCH_AUTOSCALE_POLICY", "estimate")
    if name not in ("estimate", "cachew"):
        raise ValueError(f"CONVOY_BENCH_AUTOSCALE_POLICY must be 'estimate' or 'cachew', got "
                         f"{name!r}")
    return name


def run_autoscale() -> dict[str, float | None]:
    """One run: the figures of the workload (see :func:`report`)."""
    from convoy.data.service._local_cluster import ThroughputPolicy

    trainer = _Trainer()
    with cv.data.service.LocalCluster(1) as cluster:
        if policy_name() == "cachew":
            interval_s = 5.0  # adapt's default
            cluster._follow(ThroughputPolicy(1, 8, cooldown_s=4 * interval_s,
                                             settle_s=2 * interval_s), interval_s)
        else:
            cluster.adapt(minimum=1, maximum=8)
        reader = threading.Thread(target=trainer.read, args=(cluster.target,), daemon=True)
        reader.start()
        met = _until(lambda: trainer.recent_rate() >= MET_SHARE * HIGH_RATE, MET_TIMEOUT_S,
                     trainer)
        time.sleep(SETTLE_S)
        high_workers, high_events = _hold(STEADY_HIGH_S, cluster)
        trainer.rate = LOW_RATE
        shrunk = _until(lambda: _workers(cluster) <= LEAST_LOW, SHRINK_TIMEOUT_S, trainer)
        low_workers, low_events = _hold(STEADY_LOW_S, cluster)
        trainer.rate = None
        reader.join(TAIL_TIMEOUT_S)
        if reader.is_alive() or trainer.errors:
            raise RuntimeError(f"autoscale: the trainer did not finish its epoch: "
                               f"{trainer.errors or 'still reading'}")
        log = [f"{at - cluster.events[0][0]:.1f}s {before}->{after}"
               for at, before, after, _ in cluster.events]
    counts = trainer.counts
    return {"met_s": met, "high_workers": high_workers, "low_workers": low_workers,
            "shrink_s": shrunk,
            "events_per_min": (high_events + low_events) / ((STEADY_HIGH_S + STEADY_LOW_S) / 60),
            "lost": int((counts == 0).sum()), "repeated": int((counts - 1).clip(0).sum()),
            "events": " ".join(log), "policy": policy_name()}  # type: ignore[dict-item]


def report(figures: dict[str, Any]) -> list[str]:
    """The workload's figures against its targets, a line each."""
    def seconds(value: float | None) -> str:
        return "never" if value is None else f"{value:.1f} s"

    return [
        f"autoscale: policy {figures['policy']}",
        f"autoscale: demand {HIGH_RATE:.0f}/s met (90%) after {seconds(figures['met_s'])} "
        "(target <= 30 s)",
        f"autoscale: workers at steady state {figures['high_workers']} at {HIGH_RATE:.0f}/s "
        f"(least {LEAST_HIGH}), {figures['low_workers']} at {LOW_RATE:.0f}/s (least "
        f"{LEAST_LOW}) (target: at most one over)",
        f"autoscale: shrunk to {LEAST_LOW} after {seconds(figures['shrink_s'])} "
        "(target <= 60 s)",
        f"autoscale: {figures['events_per_min']:.1f} scale events a minute at steady state "
        "(target <= 2)",
        f"autoscale: {figures['lost']} lost, {figures['repeated']} repeated of {ELEMENTS} "
        "(target 0, 0)",
        f"autoscale: events {figures['events']}",
    ]
