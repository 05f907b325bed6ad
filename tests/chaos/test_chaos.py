"""Chaos: real dispatcher and worker processes killed with SIGKILL at random points under load.

A consumer thread reads ``range(N)`` through the data service (a tiny sleep per element on the
workers makes an epoch last a few seconds) while the test kills and restarts servers when the
consumer has received a random number of elements. Every random choice comes from
``random.Random(seed)``; the seed is printed at the start of each test (pytest shows it with a
failure, ``-s`` always) and ``CONVOY_CHAOS_SEED=<seed>`` replays it.
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
import numpy as np
import pytest

from convoy.data import Dataset, TFRecordDataset, TFRecordWriter
from convoy.data.service import DispatcherConfig, distribute
from convoy.errors import NotFoundError, UnavailableError
from convoy.testing import InProcessCluster, ProcessCluster, ServerProcess, in_shared_memory

# The pipeline's functions run on the workers, which cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

N = 20_000
#: A consumer that has not finished this long after the last kill is hung.
HANG_S = 60.0
WORKERS = 2


def chaos_seed() -> int:
    seed = int(os.environ.get("CONVOY_CHAOS_SEED", random.randrange(2**32)))
    print(f"chaos seed: {seed} (replay with CONVOY_CHAOS_SEED={seed})", flush=True)
    return seed


def slow(x: Any) -> Any:
    time.sleep(0.0001)
    return x


def pipeline(mode: str, service: str, **options: Any) -> Dataset:
    return Dataset.range(N).map(slow).apply(distribute(mode, service, **options))


class Consumer(threading.Thread):
    """Reads ``dataset`` once, counting every element received."""

    def __init__(self, dataset: Dataset) -> None:
        super().__init__(daemon=True, name="chaos-consumer")
        self.dataset = dataset
        self.counts: collections.Counter[int] = collections.Counter()
        self.received = 0
        self.error: BaseException | None = None
        self.started_at = self.ended_at = 0.0
        self.longest_wait_s = 0.0  # between two elements (or the start and the first)

    def run(self) -> None:
        self.started_at = last = time.monotonic()
        try:
            for element in self.dataset:
                now = time.monotonic()
                self.longest_wait_s = max(self.longest_wait_s, now - last)
                last = now
                for x in self.numbers(element):
                    self.counts[x] += 1
                    self.received += 1
        except BaseException as error:
            self.error = error
        finally:
            self.ended_at = time.monotonic()

    @staticmethod
    def numbers(element: Any) -> list[int]:
        """What ``element`` counts as (a subclass reads batches)."""
        return [int(element)]

    def reach(self, received: int) -> None:
        """Wait until ``received`` elements have arrived."""
        self.wait_until(lambda: self.received >= received, f"{received} elements")

    def wait_until(self, condition: Any, what: str, timeout_s: float = HANG_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert self.is_alive(), (f"the consumer stopped after {self.received} elements, "
                                     f"before {what}: {self.error!r}")
            assert time.monotonic() < deadline, f"no {what} after {self.received} elements"
            time.sleep(0.005)

    def finish(self, servers: list[ServerProcess], timeout_s: float = HANG_S) -> None:
        self.join(timeout_s)
        if self.is_alive():
            logs = "\n".join(f"--- {s.role} {s.address}\n{''.join(s.log[-30:])}"
                             for s in servers)
            pytest.fail(f"the consumer hung: {self.received} elements after {timeout_s} s\n"
                        f"{logs}")


def fewer_kills(count: int) -> Any:
    """A cell with fewer kills than another of its test, which makes the same kills and more:
    ``CONVOY_STRESS`` runs it (``make stress``)."""
    return pytest.param(count, marks=pytest.mark.skipif(
        not os.environ.get("CONVOY_STRESS"),
        reason="the cell with more kills makes these too: CONVOY_STRESS=1 runs it"))


def kill_points(rng: random.Random, count: int, total: int) -> list[int]:
    """``count`` increasing element counts spread over the middle of an epoch of ``total``."""
    return sorted(rng.sample(range(int(0.05 * total), int(0.85 * total)), count))


def restart_dispatcher(cluster: ProcessCluster, rng: random.Random, args: list[str]) -> float:
    """SIGKILL the dispatcher, wait a random moment, start it again on the same port; returns
    how long it was down."""
    port = cluster.dispatcher.address.rsplit(":", 1)[1]
    killed = time.monotonic()
    cluster.dispatcher.kill()
    time.sleep(rng.uniform(0.0, 0.5))
    cluster.dispatcher = ServerProcess("dispatcher", ["--port", port, *args]).start()
    return time.monotonic() - killed


def report(name: str, consumer: Consumer, **facts: Any) -> None:
    counts = consumer.counts
    multiplicity = collections.Counter(counts.values())
    print(f"{name}: {consumer.received} elements in {consumer.ended_at - consumer.started_at:.1f}"
          f" s; distinct {len(counts)}, lost {N - len(counts)}, received k times: "
          f"{dict(sorted(multiplicity.items()))}; "
          + ", ".join(f"{k} {v}" for k, v in facts.items()), flush=True)


# ----- the dispatcher ----------------------------------------------------------------------------


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kills", [fewer_kills(1), 2])
def test_dispatcher_killed_mid_epoch_under_dynamic(tmp_path: Path, kills: int) -> None:
    """Workers and the consumer ride through dispatcher restarts: the epoch completes, and
    nothing is lost or delivered twice (a GetSplits answer that was journaled but never
    arrived is asked for again with its request number, and given again)."""
    rng = random.Random(chaos_seed())
    args = ["--work-dir", str(tmp_path), "--fault-tolerant"]
    with ProcessCluster(num_workers=WORKERS, dispatcher_args=args) as cluster:
        consumer = Consumer(pipeline("distributed_epoch", cluster.target))
        consumer.start()
        downtimes = []
        for point in kill_points(rng, kills, N):
            consumer.reach(point)
            downtimes.append(round(restart_dispatcher(cluster, rng, args), 1))
        consumer.finish([cluster.dispatcher, *cluster.workers])
    assert consumer.error is None, consumer.error
    assert set(consumer.counts) <= set(range(N))
    duplicated = {x: n for x, n in consumer.counts.items() if n > 1}
    assert not duplicated, f"delivered twice: {sorted(duplicated)[:20]}"
    report(f"dispatcher killed {kills}x", consumer, down_s=downtimes)
    assert len(consumer.counts) == N, f"lost {N - len(consumer.counts)}"


@pytest.mark.timeout(150)
def test_an_unreachable_dispatcher_is_a_clear_error() -> None:
    """A dispatcher gone for longer than dispatcher_timeout_ms: UnavailableError, soon."""
    rng = random.Random(chaos_seed())
    with ProcessCluster(num_workers=1) as cluster:
        consumer = Consumer(pipeline("distributed_epoch", cluster.target,
                                     dispatcher_timeout_ms=2000))
        consumer.start()
        consumer.reach(kill_points(rng, 1, N)[0])
        cluster.dispatcher.kill()
        killed = time.monotonic()
        consumer.finish(cluster.workers, timeout_s=30)
        waited = consumer.ended_at - killed
        print(f"unreachable dispatcher: {type(consumer.error).__name__} after {waited:.1f} s "
              f"and {consumer.received} elements: {consumer.error}")
        assert isinstance(consumer.error, UnavailableError), repr(consumer.error)
        assert "gave up after 2.0 s" in str(consumer.error)
        assert waited < 15
        # a new reader cannot even start
        started = time.monotonic()
        with pytest.raises(UnavailableError, match="gave up after 2.0 s"):
            list(pipeline("parallel_epochs", cluster.target, dispatcher_timeout_ms=2000))
        assert time.monotonic() - started < 15


@pytest.mark.timeout(150)
def test_a_dispatcher_restarted_without_fault_tolerance_is_a_clear_error() -> None:
    """A fresh dispatcher knows nothing of the consumer's iteration: NotFoundError saying the
    dispatcher may have restarted, not silently wrong data."""
    rng = random.Random(chaos_seed())
    with ProcessCluster(num_workers=WORKERS) as cluster:
        consumer = Consumer(pipeline("distributed_epoch", cluster.target))
        consumer.start()
        consumer.reach(kill_points(rng, 1, N)[0])
        restart_dispatcher(cluster, rng, [])
        consumer.finish([cluster.dispatcher, *cluster.workers], timeout_s=30)
    print(f"restart without fault tolerance: {consumer.error!r} after {consumer.received} "
          "elements")
    assert isinstance(consumer.error, NotFoundError), repr(consumer.error)
    assert "restarted without fault_tolerant_mode" in str(consumer.error)


# ----- workers -----------------------------------------------------------------------------------


@pytest.mark.timeout(150)
@pytest.mark.parametrize("restarts", [fewer_kills(1), 2])
@pytest.mark.parametrize("mode", ["parallel_epochs", "distributed_epoch"])
def test_a_worker_killed_and_restarted(mode: str, restarts: int) -> None:
    """Worker 0 is SIGKILLed and restarted on its port. The consumer finishes. DYNAMIC:
    every element exactly once (the new process runs the dead one's task again, skipping what
    the consumer has). OFF: each worker process streams its own copy, a new process from the
    start, so every element arrives at least once (worker 1's copy) and at most once per
    process."""
    rng = random.Random(chaos_seed())
    total = N if mode == "distributed_epoch" else WORKERS * N
    with ProcessCluster(num_workers=WORKERS) as cluster:
        consumer = Consumer(pipeline(mode, cluster.target))
        consumer.start()
        for point in kill_points(rng, restarts, total):
            consumer.reach(point)
            cluster.workers[0].kill()
            time.sleep(rng.uniform(0.0, 0.5))
            cluster.restart_worker(0)
        consumer.finish([cluster.dispatcher, *cluster.workers])
    assert consumer.error is None, consumer.error
    assert set(consumer.counts) <= set(range(N))
    report(f"{mode}, worker restarted {restarts}x", consumer)
    if mode == "distributed_epoch":
        assert consumer.counts == {x: 1 for x in range(N)}
    else:
        assert len(consumer.counts) == N
        assert max(consumer.counts.values()) <= 1 + (1 + restarts)


@pytest.mark.timeout(150)
def test_a_worker_restarted_after_finishing_its_task_is_not_waited_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """OFF, a fast and a slow worker: the fast one streams its whole copy, finishes its task
    and is then restarted while the slow one still streams. Its finished task is not run
    again, and the epoch ends with exactly one copy from each."""
    seed = chaos_seed()
    with ProcessCluster(num_workers=1) as cluster:
        monkeypatch.setenv("CONVOY_CHAOS_SLOW", "1")
        cluster.add_worker()
        monkeypatch.delenv("CONVOY_CHAOS_SLOW")
        count = 2000
        consumer = Consumer(Dataset.range(count).map(slow_on_marked_worker).apply(
            distribute("parallel_epochs", cluster.target)))
        consumer.start()
        # the fast worker's copy has arrived (its last element), then its end of sequence
        consumer.wait_until(lambda: consumer.counts[count - 1] > 0, "the fast copy")
        time.sleep(0.5 + random.Random(seed).uniform(0.0, 0.5))
        assert consumer.is_alive(), "the slow worker finished too soon for this test"
        cluster.restart_worker(0)
        consumer.finish([cluster.dispatcher, *cluster.workers])
    assert consumer.error is None, consumer.error
    assert consumer.counts == {x: 2 for x in range(count)}


def slow_on_marked_worker(x: Any) -> Any:
    time.sleep(0.003 if os.environ.get("CONVOY_CHAOS_SLOW") else 0.0)
    return x


@pytest.mark.timeout(150)
def test_a_worker_that_never_returns_does_not_hang_the_epoch() -> None:
    """DYNAMIC, 2 workers, one SIGKILLed for good: once the dispatcher declares it lost, the
    other worker adopts its task and runs it again, so the epoch ends with every element
    exactly once."""
    rng = random.Random(chaos_seed())
    config = DispatcherConfig(worker_timeout_ms=1500, job_gc_check_interval_ms=250)
    with InProcessCluster(num_workers=0, dispatcher_config=config) as cluster:
        workers = [ServerProcess("worker", ["--dispatcher", cluster.address, "--port", "0",
                                            "--heartbeat-ms", "100"]).start()
                   for _ in range(WORKERS)]
        try:
            consumer = Consumer(pipeline("distributed_epoch", cluster.target))
            consumer.start()
            consumer.reach(kill_points(rng, 1, N)[0])
            workers[0].kill()
            consumer.finish(workers)
        finally:
            for worker in workers:
                worker.kill()
    assert consumer.error is None, consumer.error
    report("a worker lost for good", consumer)
    assert consumer.counts == {x: 1 for x in range(N)}


#: The longest a consumer may wait between two elements when a worker is lost for good, with
#: default settings (the consumer reports it, the dispatcher checks and has its task adopted).
LOST_WORKER_WAIT_S = 10.0


@pytest.mark.timeout(200)
@pytest.mark.parametrize("replaced", [False, True], ids=["gone-for-good", "new-address"])
def test_a_worker_lost_costs_nothing_and_no_long_stall(replaced: bool) -> None:
    """DYNAMIC, 3 workers, default timeouts: worker 0 is SIGKILLed mid-epoch and never comes
    back at its address (or, as Kubernetes replaces a pod, a new worker joins at another
    address). The consumer finds it refusing connections and tells the dispatcher, which
    checks, declares it lost at once and has its task adopted: every element exactly once,
    and no wait near worker_timeout_ms (60 s)."""
    rng = random.Random(chaos_seed())
    with ProcessCluster(num_workers=3, heartbeat_interval_ms=None) as cluster:
        consumer = Consumer(pipeline("distributed_epoch", cluster.target))
        consumer.start()
        consumer.reach(kill_points(rng, 1, N)[0])
        cluster.workers[0].kill()
        killed = time.monotonic()
        if replaced:
            cluster.add_worker()
        consumer.finish([cluster.dispatcher, *cluster.workers])
    assert consumer.error is None, consumer.error
    report(f"a worker lost ({'replaced at a new address' if replaced else 'for good'}), "
           "default settings", consumer, longest_wait_s=round(consumer.longest_wait_s, 2),
           end_after_kill_s=round(consumer.ended_at - killed, 2))
    check_exactly_once(consumer.counts, N, "a worker lost")
    assert consumer.longest_wait_s < LOST_WORKER_WAIT_S


@pytest.mark.timeout(200)
@pytest.mark.parametrize("mode", ["distributed_epoch", "parallel_epochs"])
def test_a_worker_sigtermed_mid_epoch_drains_and_exits_0(mode: str) -> None:
    """SIGTERM makes a worker leave gracefully: it stops producing, its consumers take what it
    buffered, it deregisters and exits 0. DYNAMIC: its unfinished splits run elsewhere, so
    every element arrives exactly once. OFF: its copy ends where it stopped; the other two
    workers' copies are whole."""
    rng = random.Random(chaos_seed())
    total = N if mode == "distributed_epoch" else 3 * N
    with ProcessCluster(num_workers=3, heartbeat_interval_ms=None) as cluster:
        consumer = Consumer(pipeline(mode, cluster.target))
        consumer.start()
        consumer.reach(kill_points(rng, 1, total)[0])
        signalled = time.monotonic()
        status = cluster.workers[0].terminate(timeout_s=30)
        exited_s = time.monotonic() - signalled
        consumer.finish([cluster.dispatcher, *cluster.workers])
    assert consumer.error is None, consumer.error
    report(f"{mode}, a worker SIGTERMed", consumer, exit_status=status,
           exited_after_s=round(exited_s, 2), longest_wait_s=round(consumer.longest_wait_s, 2))
    assert status == 0, "".join(cluster.workers[0].log[-30:])
    if mode == "distributed_epoch":
        check_exactly_once(consumer.counts, N, "a worker SIGTERMed")
    else:
        assert set(consumer.counts) == set(range(N))
        assert min(consumer.counts.values()) >= 2 and max(consumer.counts.values()) <= 3


# ----- DYNAMIC, exactly once through kills of workers and the dispatcher -------------------------
# A worker's replacement runs its task again (same splits, same seeds, so the same elements in
# the same order) and skips what the job's consumers received. The pipelines below mix elements
# of several splits after the source (shuffle, batch), read files, and are shared by two
# consumers.


class FlatConsumer(Consumer):
    """Counts the numbers inside each element (a batch or one record)."""

    @staticmethod
    def numbers(element: Any) -> list[int]:
        return [int(x) for x in np.asarray(element).reshape(-1).tolist()]


def check_exactly_once(counts: collections.Counter[int], total: int, what: str) -> None:
    lost = total - len(counts)
    repeated = sorted(x for x, n in counts.items() if n > 1)
    print(f"{what}: lost {lost}, repeated {len(repeated)}", flush=True)
    assert set(counts) <= set(range(total))
    assert (lost, repeated[:20]) == (0, []), f"{what}: lost {lost}, repeated {repeated[:20]}"


def restart_workers_mid_epoch(cluster: ProcessCluster, consumer: Consumer, rng: random.Random,
                              total: int, restarts: int) -> None:
    """SIGKILL a random worker ``restarts`` times while ``consumer`` reads an epoch of
    ``total`` elements, restarting it on its port after a random moment. A later kill is
    given up if the epoch ended first (once a lost task is adopted, the other workers may
    have buffered the rest of the epoch: it arrives at once)."""
    for kill, point in enumerate(kill_points(rng, restarts, total)):
        consumer.reach(point)
        if kill and not consumer.is_alive() and consumer.error is None:
            print(f"the epoch ended before kill {kill + 1}", flush=True)
            return
        assert consumer.is_alive(), f"the epoch ended before the kill: {consumer.error!r}"
        victim = rng.randrange(len(cluster.workers))
        cluster.workers[victim].kill()
        time.sleep(rng.uniform(0.0, 0.5))
        cluster.restart_worker(victim)


def kill_workers_and_dispatcher(cluster: ProcessCluster, consumers: list[Consumer],
                                rng: random.Random, total: int, kills: int,
                                dispatcher_args: list[str]) -> list[str]:
    """At ``kills`` random points of the epoch, SIGKILL a random worker (restarted on its
    port after a random moment) or the dispatcher; returns what was killed, in order."""
    killed = []
    for point in kill_points(rng, kills, total):
        while sum(c.received for c in consumers) < point:
            assert any(c.is_alive() for c in consumers), "the consumers stopped early"
            time.sleep(0.005)
        victim = rng.randrange(len(cluster.workers) + 1)
        if victim == len(cluster.workers):
            restart_dispatcher(cluster, rng, dispatcher_args)
            killed.append("dispatcher")
        else:
            cluster.workers[victim].kill()
            time.sleep(rng.uniform(0.0, 0.5))
            cluster.restart_worker(victim)
            killed.append(f"worker {victim}")
    return killed


@pytest.mark.timeout(200)
@pytest.mark.parametrize("kills", [3])
def test_shuffled_batches_exactly_once_through_worker_and_dispatcher_kills(
        tmp_path: Path, kills: int) -> None:
    """shuffle(seed=None) and batch mix several splits into each element: a replacement must
    shuffle the same way (its seed comes from the task) to know what it may skip."""
    rng = random.Random(chaos_seed())
    args = ["--work-dir", str(tmp_path), "--fault-tolerant"]
    with ProcessCluster(num_workers=2, dispatcher_args=args) as cluster:
        dataset = (Dataset.range(N).map(slow).shuffle(500).batch(7)
                   .apply(distribute("distributed_epoch", cluster.target)))
        consumer = FlatConsumer(dataset)
        consumer.start()
        killed = kill_workers_and_dispatcher(cluster, [consumer], rng, N, kills, args)
        consumer.finish([cluster.dispatcher, *cluster.workers])
    assert consumer.error is None, consumer.error
    check_exactly_once(consumer.counts, N, f"shuffled batches, killed {killed}")


@pytest.mark.timeout(200)
def test_tfrecord_files_exactly_once_through_worker_kills(tmp_path: Path) -> None:
    """The issue's case: a worker reading TFRecord files (one file a split, handed out
    several at a time) SIGKILLed mid-epoch used to lose whole files."""
    rng = random.Random(chaos_seed())
    files, per_file = 20, 1000
    names = []
    for f in range(files):
        name = str(tmp_path / f"part-{f:02d}.tfrecord")
        with TFRecordWriter(name) as writer:
            for r in range(per_file):
                writer.write(str(f * per_file + r).encode())
        names.append(name)
    total = files * per_file
    with ProcessCluster(num_workers=2) as cluster:
        dataset = (TFRecordDataset(names).map(lambda record: int(slow(record)))
                   .apply(distribute("distributed_epoch", cluster.target)))
        consumer = FlatConsumer(dataset)
        consumer.start()
        restart_workers_mid_epoch(cluster, consumer, rng, total, restarts=2)
        consumer.finish([cluster.dispatcher, *cluster.workers])
    assert consumer.error is None, consumer.error
    check_exactly_once(consumer.counts, total, "TFRecord files")


@pytest.mark.timeout(200)
def test_a_shared_job_gets_each_element_once_through_worker_kills(tmp_path: Path) -> None:
    """Two consumers of one named job: between them, every element exactly once, though the
    replacement's skipped numbers come from both (each reports what it got)."""
    rng = random.Random(chaos_seed())
    args = ["--work-dir", str(tmp_path), "--fault-tolerant"]
    with ProcessCluster(num_workers=2, dispatcher_args=args) as cluster:
        consumers = [FlatConsumer(Dataset.range(N).map(slow).batch(3).apply(distribute(
            "distributed_epoch", cluster.target, job_name="shared"))) for _ in range(2)]
        for consumer in consumers:
            consumer.start()
        killed = kill_workers_and_dispatcher(cluster, consumers, rng, N, 3, args)
        for consumer in consumers:
            consumer.finish([cluster.dispatcher, *cluster.workers])
    for consumer in consumers:
        assert consumer.error is None, consumer.error
    both = consumers[0].counts + consumers[1].counts
    assert all(c.received for c in consumers), "one consumer got nothing: nothing was shared"
    check_exactly_once(both, N, f"shared job, killed {killed}")


class HoldingConsumer(Consumer):
    """Reads arrays filled with their element's number through shared memory, and keeps one
    in ten of them to check at the end: a segment written over while held would show."""

    def __init__(self, dataset: Dataset) -> None:
        super().__init__(dataset)
        self.held: list[np.ndarray] = []

    def numbers(self, element: Any) -> list[int]:  # type: ignore[override]
        number = int(element[0])
        if number % 10 == 0:
            self.held.append(element)
        return [number]


@pytest.mark.timeout(200)
def test_shared_memory_exactly_once_and_intact_through_worker_kills() -> None:
    """DYNAMIC through shared memory (64 KiB elements, so every answer is a segment, written
    again once released) while workers are SIGKILLed and restarted: every element exactly
    once, and the arrays the consumer kept still hold their numbers at the end."""
    rng = random.Random(chaos_seed())
    total = 10_000
    with ProcessCluster(num_workers=2) as cluster:
        dataset = (Dataset.range(total).map(lambda x: np.full(1 << 14, slow(x), np.int32))
                   .apply(distribute("distributed_epoch", cluster.target,
                                     target_workers="LOCAL")))
        consumer = HoldingConsumer(dataset)
        consumer.start()
        restart_workers_mid_epoch(cluster, consumer, rng, total, restarts=2)
        consumer.finish([cluster.dispatcher, *cluster.workers])
    assert consumer.error is None, consumer.error
    check_exactly_once(consumer.counts, total, "shared memory")
    assert len(consumer.held) == total // 10
    assert sum(in_shared_memory(array) for array in consumer.held) > len(consumer.held) // 2
    for array in consumer.held:
        assert (array == array[0]).all(), f"element {array[0]} was written over"
