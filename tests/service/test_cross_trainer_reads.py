"""The cross-trainer cache with real worker processes (``python -m convoy worker``): trainers
with different ids read elements computed once, the cache stays within its byte bound, a slow
trainer skips ahead and the worker counts it, and every refusal reaches the trainer."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest

import convoy as cv
from convoy.data.service import WorkerConfig, WorkerServer
from convoy.errors import InvalidArgumentError
from convoy.testing import InProcessCluster, ProcessCluster

# Pipelines defined here run on worker processes, which cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

service = cv.data.service
Dataset = cv.data.Dataset

pytestmark = pytest.mark.timeout(240)

#: Elements a worker may produce beyond those trainers asked for: its task's read-ahead (64),
#: each trainer's reader holding up to 64 beyond what it returned, a call in flight each.
SLACK = 64 + 2 * (64 + 16)


def counting(path: str) -> Callable[[Any], Any]:
    """A map function that appends a line to ``path`` for each element it passes (on the
    worker): the count of elements the worker produced."""
    def count(x: Any) -> Any:
        with open(path, "a") as file:
            file.write(".\n")
        return x
    return count


def produced(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def read(dataset: Dataset, target: str, trainer: str, count: int, job_name: str = "job",
         **kwargs: Any) -> list[int]:
    """The first ``count`` elements trainer ``trainer`` reads of ``job_name``."""
    distributed = dataset.apply(service.distribute(
        service.ShardingPolicy.OFF, target, job_name=job_name,
        cross_trainer_cache=service.CrossTrainerCache(trainer), **kwargs))
    return [int(x) for x in distributed.take(count)]


def wait_for_line(lines: list[str], needle: str, timeout_s: float = 30.0) -> str:
    """The first of ``lines`` (a server's output, still growing) containing ``needle``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in list(lines):
            if needle in line:
                return line
        time.sleep(0.05)
    raise AssertionError(f"no line with {needle!r} within {timeout_s} s: {lines[-10:]}")


def test_trainer_b_reads_what_trainer_a_caused_to_be_produced(tmp_path):
    count_file = tmp_path / "produced"
    dataset = Dataset.range(10**9).repeat().map(counting(str(count_file)))
    with ProcessCluster(num_workers=1) as cluster:
        first = read(dataset, cluster.target, "A", 500)
        second = read(dataset, cluster.target, "B", 500)
        total = produced(count_file)
    assert first == second == list(range(500))
    consumed = len(first) + len(second)
    assert 500 <= total <= 500 + SLACK < consumed  # each element computed once for both


def test_trainers_reading_at_once_each_get_the_whole_sequence(tmp_path):
    count_file = tmp_path / "produced"
    dataset = Dataset.range(10**9).repeat().map(counting(str(count_file)))
    results: dict[str, list[int]] = {}
    with ProcessCluster(num_workers=1) as cluster:
        threads = [threading.Thread(target=lambda t=t: results.__setitem__(
            t, read(dataset, cluster.target, t, 2000))) for t in ("A", "B")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        total = produced(count_file)
    assert results == {"A": list(range(2000)), "B": list(range(2000))}
    assert 2000 <= total <= 2000 + SLACK


def test_a_dead_trainer_leaves_its_elements_to_the_others(tmp_path):
    """Trainer A is a process that reads 300 elements and dies without a goodbye; trainer B
    then reads those 300 from the cache, and A restarted reads on where it was."""
    count_file = tmp_path / "produced"
    dataset = Dataset.range(10**9).repeat().map(counting(str(count_file)))
    with ProcessCluster(num_workers=1) as cluster:
        dataset_id = service.register_dataset(cluster.target, dataset)
        trainer = textwrap.dedent(f"""
            import os
            import convoy as cv
            service = cv.data.service
            dataset = service.from_dataset_id(
                "parallel_epochs", {cluster.target!r}, {dataset_id!r}, job_name="job",
                cross_trainer_cache=service.CrossTrainerCache("A"))
            print([int(x) for x in dataset.take(300)] == list(range(300)), flush=True)
            os._exit(0)
        """)
        done = subprocess.run([sys.executable, "-c", trainer], capture_output=True, text=True,
                              timeout=120, env=os.environ)
        assert done.stdout.strip() == "True", done.stderr[-2000:]
        second = service.from_dataset_id(
            "parallel_epochs", cluster.target, dataset_id, job_name="job",
            cross_trainer_cache=service.CrossTrainerCache("B"))
        assert [int(x) for x in second.take(300)] == list(range(300))
        assert produced(count_file) <= 300 + SLACK
        # A again, restarted: it reads on after what its dead reader took, repeating nothing
        again = service.from_dataset_id(
            "parallel_epochs", cluster.target, dataset_id, job_name="job",
            cross_trainer_cache=service.CrossTrainerCache("A"))
        resumed = [int(x) for x in again.take(10)]
        assert resumed[0] >= 300 and resumed == list(range(resumed[0], resumed[0] + 10))


def test_a_slow_trainer_skips_ahead_and_the_worker_says_how_many():
    with ProcessCluster(num_workers=1,
                        worker_args=["--cross-trainer-cache-size-bytes", "3200"]) as cluster:
        dataset = Dataset.range(10**9).repeat()
        assert read(dataset, cluster.target, "A", 1000) == list(range(1000))
        late = read(dataset, cluster.target, "B", 100)
        assert late[0] > 0  # the window (100 scalars) had moved on
        assert late == list(range(late[0], late[0] + 100))  # no gap, no repeat after that
        line = wait_for_line(cluster.workers[0].log, "trainer 'B' fell behind")
    assert f"skipped {late[0]} elements ({late[0]} in all for this trainer)" in line


def test_a_restarted_worker_serves_a_new_cache_from_the_start():
    """A worker killed with SIGKILL loses its cache; restarted, it runs the pipeline from its
    start again (under OFF), and the trainer reads on from there."""
    with ProcessCluster(num_workers=1) as cluster:
        dataset = Dataset.range(10**9).repeat().apply(service.distribute(
            service.ShardingPolicy.OFF, cluster.target, job_name="job",
            cross_trainer_cache=service.CrossTrainerCache("A")))
        iterator = iter(dataset)
        assert [int(next(iterator)) for _ in range(100)] == list(range(100))
        cluster.restart_worker(0)
        while int(next(iterator)) != 0:  # what the reader had before the restart comes first
            pass
        assert [int(next(iterator)) for _ in range(100)] == list(range(1, 101))


def test_an_element_larger_than_the_cache_fails_the_read():
    with ProcessCluster(num_workers=1,
                        worker_args=["--cross-trainer-cache-size-bytes", "3200"]) as cluster:
        dataset = Dataset.from_tensors(np.zeros(1000)).repeat()
        with pytest.raises(InvalidArgumentError,
                           match="element size is larger than the cross-trainer cache size "
                                 "in bytes. Got element size: 8000 and cache size: 3200"):
            read(dataset, cluster.target, "A", 1)


def test_a_dataset_of_unknown_length_that_ends_fails_the_read():
    dataset = Dataset.range(5).filter(lambda x: True)  # length unknown: accepted at first
    ends = pytest.raises(InvalidArgumentError,
                         match="Cross-trainer caching requires the input dataset to be "
                               "infinite. However, task .* reached the end of its dataset")
    with ProcessCluster(num_workers=1) as cluster, ends:
        read(dataset, cluster.target, "A", 10)


def test_a_finite_registered_dataset_is_refused():
    with ProcessCluster(num_workers=1) as cluster:
        dataset_id = service.register_dataset(cluster.target, Dataset.range(10))
        with pytest.raises(InvalidArgumentError,
                           match="requires the input dataset to be infinite. Got input with "
                                 "cardinality 10"):
            service.from_dataset_id("parallel_epochs", cluster.target, dataset_id,
                                    job_name="job",
                                    cross_trainer_cache=service.CrossTrainerCache("A"))


def test_the_cache_stays_within_its_bytes_and_counts_what_a_slow_trainer_missed():
    """In-process worker, so its statistics can be read while two trainers read at different
    speeds: the cache never holds more than its bound, and the elements the slow trainer
    missed are the ones counted as skipped."""
    bound = 40 * 800  # forty elements of 800 bytes
    with InProcessCluster(0) as cluster:
        worker = WorkerServer(WorkerConfig(dispatcher_address=cluster.address,
                                           heartbeat_interval_ms=100,
                                           cross_trainer_cache_size_bytes=bound))
        cluster.workers.append(worker)
        dataset = Dataset.range(10**9).repeat().map(lambda x: np.full(100, x))
        fast, slow = (iter(dataset.apply(service.distribute(
            service.ShardingPolicy.OFF, cluster.target, job_name="job",
            cross_trainer_cache=service.CrossTrainerCache(t)))) for t in ("fast", "slow"))
        slow_got: list[int] = []
        for step in range(600):
            int(next(fast)[0])
            if step % 5 == 0:
                slow_got.append(int(next(slow)[0]))
            (stats,) = worker.cross_trainer_cache_stats().values()
            assert stats.cached_bytes <= bound
        assert slow_got == sorted(set(slow_got))  # never the same element twice
        (stats,) = worker.cross_trainer_cache_stats().values()
        assert stats.max_bytes == bound and stats.cached_bytes <= bound
        assert stats.skipped.get("fast", 0) == 0
        # the slow trainer missed whatever lies between what it got (its reader's buffer
        # holds some it has not returned yet, so at least the gaps in what it returned)
        gaps = slow_got[-1] + 1 - len(slow_got)
        assert stats.skipped["slow"] >= gaps > 0
