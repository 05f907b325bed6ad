"""Servers failing under a reading consumer, as real processes: a fault-tolerant dispatcher
SIGKILLed mid-epoch, a worker SIGKILLed and restarted at its address, a worker stopped.

Random choices come from ``random.Random(seed)``; the seed is printed at the start of each
test (pytest shows it with a failure) and ``CONVOY_TEST_SEED=<seed>`` replays it.
"""

from __future__ import annotations

import collections
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

from convoy.data import Dataset
from convoy.data.service import DispatcherConfig, distribute
from convoy.testing import InProcessCluster, ProcessCluster, ServerProcess

# The pipeline's functions run on the workers, which cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

N = 6000
#: A consumer that has not finished this long after the last failure is hung.
HANG_S = 60.0


def test_seed() -> int:
    seed = int(os.environ.get("CONVOY_TEST_SEED", random.randrange(2**32)))
    print(f"seed: {seed} (replay with CONVOY_TEST_SEED={seed})", flush=True)
    return seed


test_seed.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


def slow(x: Any) -> Any:
    time.sleep(0.0002)  # an epoch lasts a few seconds: failures land in the middle
    return x


def pipeline(mode: str, target: str) -> Dataset:
    return Dataset.range(N).map(slow).apply(distribute(mode, target))


class Consumer(threading.Thread):
    """Reads a dataset once, counting each element and noting when each arrived."""

    def __init__(self, dataset: Dataset) -> None:
        super().__init__(daemon=True, name="test-consumer")
        self.dataset = dataset
        self.counts: collections.Counter[int] = collections.Counter()
        self.arrivals: list[float] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for element in self.dataset:
                self.counts[int(element)] += 1
                self.arrivals.append(time.monotonic())
        except BaseException as error:
            self.error = error

    def reach(self, received: int) -> None:
        deadline = time.monotonic() + HANG_S
        while len(self.arrivals) < received:
            assert self.is_alive(), f"stopped after {len(self.arrivals)}: {self.error!r}"
            assert time.monotonic() < deadline, f"stuck at {len(self.arrivals)} elements"
            time.sleep(0.005)

    def finish(self, servers: list[ServerProcess] = ()) -> None:
        self.join(HANG_S)
        if self.is_alive():
            logs = "\n".join(f"--- {s.role} {s.address}\n{''.join(s.log[-20:])}"
                             for s in servers)
            pytest.fail(f"the consumer hung after {len(self.arrivals)} elements\n{logs}")
        assert self.error is None, repr(self.error)


def kill_points(rng: random.Random, count: int) -> list[int]:
    return sorted(rng.sample(range(N // 10, 9 * N // 10), count))


# ----- the dispatcher ----------------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_a_fault_tolerant_dispatcher_killed_mid_epoch_loses_and_repeats_nothing(
        tmp_path: Path) -> None:
    """SIGKILL lands anywhere, also between journaling a split answer and sending it: the
    worker asks again with the same request number and gets the same splits."""
    rng = random.Random(test_seed())
    args = ["--work-dir", str(tmp_path), "--fault-tolerant"]
    with ProcessCluster(num_workers=2, dispatcher_args=args) as cluster:
        consumer = Consumer(pipeline("distributed_epoch", cluster.target))
        consumer.start()
        for point in kill_points(rng, 3):
            consumer.reach(point)
            port = cluster.dispatcher.address.rsplit(":", 1)[1]
            cluster.dispatcher.kill()
            time.sleep(rng.uniform(0.0, 0.3))
            cluster.dispatcher = ServerProcess("dispatcher", ["--port", port, *args]).start()
        consumer.finish([cluster.dispatcher, *cluster.workers])
    lost = N - len(consumer.counts)
    repeated = sorted(x for x, n in consumer.counts.items() if n > 1)
    assert (lost, repeated[:10]) == (0, [])
    assert set(consumer.counts) == set(range(N))


# ----- workers -----------------------------------------------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["distributed_epoch", "parallel_epochs"])
def test_a_worker_restarted_at_its_address_is_read_again_at_once(mode: str) -> None:
    """The dispatcher knows the new process by its first heartbeat and hands it the old one's
    unfinished task: its consumer reads on within a couple of seconds, not after
    worker_timeout_ms. (DYNAMIC: the splits the dead process held are lost, nothing repeats;
    OFF: the new process streams its copy from the start.)"""
    rng = random.Random(test_seed())
    with ProcessCluster(num_workers=1) as cluster:
        consumer = Consumer(pipeline(mode, cluster.target))
        consumer.start()
        consumer.reach(kill_points(rng, 1)[0])
        cluster.workers[0].kill()
        time.sleep(rng.uniform(0.0, 0.5))
        cluster.restart_worker(0)
        listening = time.monotonic()
        consumer.finish([cluster.dispatcher, *cluster.workers])
    resumed = next(t for t in consumer.arrivals if t > listening) - listening
    print(f"{mode}: the consumer read on {resumed:.2f} s after the new worker listened")
    assert resumed < 3.0
    if mode == "distributed_epoch":
        assert max(consumer.counts.values()) == 1
    else:
        assert set(consumer.counts) == set(range(N))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["distributed_epoch", "parallel_epochs"])
def test_a_stopped_worker_does_not_fail_its_consumers(mode: str) -> None:
    """Two workers; one is stopped mid-epoch, first one in this process (``stop()``), then
    one in its own process (SIGTERM): the calls it is serving are answered, not cancelled,
    so the consumer reads on from the other, and the epoch completes once the stopped one
    is declared lost."""
    rng = random.Random(test_seed())
    config = DispatcherConfig(worker_timeout_ms=1000, job_gc_check_interval_ms=200)
    with InProcessCluster(num_workers=1, dispatcher_config=config) as cluster:
        process = ServerProcess("worker", ["--dispatcher", cluster.address, "--port", "0",
                                           "--heartbeat-ms", "100"]).start()
        try:
            for stop in (cluster.workers[0].stop, lambda: process.terminate() == 0):
                consumer = Consumer(pipeline(mode, cluster.target))
                consumer.start()
                consumer.reach(rng.randrange(N // 10, N // 2))
                assert stop() is not False
                consumer.finish([process])
                if mode == "distributed_epoch":
                    assert max(consumer.counts.values()) == 1
                else:  # the other worker's whole copy
                    assert set(consumer.counts) == set(range(N))
                cluster.add_worker()
        finally:
            process.kill()
