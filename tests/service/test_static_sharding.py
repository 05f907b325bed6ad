"""Static sharding (FILE, DATA, FILE_OR_DATA, HINT) with real worker servers on a fixed list.

Every element is tagged on the worker with the task that produced it (its thread's name), so
the tests see which worker read what: the dispatcher knows each task's worker, and the
worker's index is its position in ``DispatcherConfig.worker_addresses``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import convoy as cv
from convoy.data._core._op import Op
from convoy.data.service import (
    DispatcherConfig,
    ShardingPolicy,
    WorkerConfig,
    WorkerServer,
    distribute,
)
from convoy.data.service._client.local_tasks import LocalTasks, is_local_address
from convoy.data.service._common.static_policy import task_shard
from convoy.errors import FailedPreconditionError, InvalidArgumentError
from convoy.testing import InProcessCluster, ProcessCluster, free_port, free_ports

NUM_WORKERS = 3


class Listed(InProcessCluster):
    """A dispatcher with a fixed list of workers at ``addresses``, all of them running."""

    def __init__(self, num_workers: int) -> None:
        self.ports = free_ports(num_workers)
        self.addresses = [f"localhost:{port}" for port in self.ports]
        super().__init__(0, dispatcher_config=DispatcherConfig(worker_addresses=self.addresses))
        for port in self.ports:
            self.add_worker(port)

    def worker_index(self, task_id: int) -> int:
        """The list position of the worker that ran ``task_id``."""
        with self.dispatcher._handlers.lock:
            address = self.dispatcher._handlers.state.tasks[task_id].worker_address
        return self.addresses.index(address)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Listed]:
    with Listed(NUM_WORKERS) as listed:
        yield listed


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Seven TFRecord files of four records ``b"<file>/<record>"``."""
    directory = tmp_path_factory.mktemp("records")
    names = []
    for f in range(7):
        names.append(str(directory / f"file-{f}.tfrecord"))
        with cv.data.TFRecordWriter(names[-1]) as writer:
            for r in range(4):
                writer.write(f"{f}/{r}".encode())
    return names


def _tag(element: Any) -> tuple[Any, int]:
    """The element and the id of the task producing it (the worker's task thread is named
    ``convoy-task-<id>``)."""
    return element, int(threading.current_thread().name.rsplit("-", 1)[1])


def read_by_worker(cluster: Listed, dataset: cv.data.Dataset, policy: ShardingPolicy,
                   decode: Callable[[Any], Any] = int) -> dict[int, list[Any]]:
    """The distributed dataset's elements, by the list index of the worker that made them."""
    by_worker: dict[int, list[Any]] = {}
    for element, task_id in dataset.map(_tag).apply(
            distribute(processing_mode=policy, service=cluster.target)).as_numpy_iterator():
        by_worker.setdefault(cluster.worker_index(int(task_id)), []).append(decode(element))
    return by_worker


def shard(op: Op, policy: ShardingPolicy, num_workers: int, worker_index: int) -> Op:
    """``op`` as the worker ``worker_index`` of ``num_workers`` runs it under ``policy``."""
    rewrite = task_shard(policy, num_workers, worker_index)
    assert rewrite is not None, f"{policy.name} is not static"
    return rewrite(op)


def record(raw: bytes) -> tuple[int, int]:
    file, number = raw.decode().split("/")
    return int(file), int(number)


# ----- each policy -------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", [ShardingPolicy.FILE, ShardingPolicy.FILE_OR_DATA])
@pytest.mark.parametrize("make", [
    pytest.param(lambda names: cv.data.TFRecordDataset(names), id="reader"),
    pytest.param(lambda names: cv.data.Dataset.list_files(names, shuffle=True).interleave(
        cv.data.TFRecordDataset, cycle_length=2), id="list_files"),
    pytest.param(lambda names: cv.data.TFRecordDataset(names, num_parallel_reads=2),
                 id="parallel_reads"),
])
def test_file_sharding_gives_each_file_to_one_worker(cluster: Listed, files: list[str],
                                                     policy: ShardingPolicy,
                                                     make: Callable[[list[str]], Any]) -> None:
    by_worker = read_by_worker(cluster, make(files), policy, record)
    every = sorted(r for records in by_worker.values() for r in records)
    assert every == [(f, r) for f in range(7) for r in range(4)]  # each record once
    for index, records in by_worker.items():  # file i, whole, on worker i % NUM_WORKERS
        assert {f for f, _ in records} == set(range(index, 7, NUM_WORKERS))


def test_data_sharding_shards_the_output(cluster: Listed) -> None:
    by_worker = read_by_worker(cluster, cv.data.Dataset.range(50).batch(4),
                               ShardingPolicy.DATA, lambda batch: int(batch[0]) // 4)
    assert by_worker == {i: list(range(i, 13, NUM_WORKERS)) for i in range(NUM_WORKERS)}


def test_file_or_data_falls_back_to_data_without_files(cluster: Listed) -> None:
    by_worker = read_by_worker(cluster, cv.data.Dataset.range(30), ShardingPolicy.FILE_OR_DATA)
    assert by_worker == {i: list(range(i, 30, NUM_WORKERS)) for i in range(NUM_WORKERS)}


def test_hint_fills_in_shard_placeholders(cluster: Listed) -> None:
    hinted = cv.data.Dataset.range(30).shard(cv.data.SHARD_HINT, cv.data.SHARD_HINT)
    by_worker = read_by_worker(cluster, hinted.map(lambda x: x * 10), ShardingPolicy.HINT)
    assert by_worker == {i: list(range(10 * i, 300, 10 * NUM_WORKERS))
                         for i in range(NUM_WORKERS)}
    # an explicit shard is left alone: every worker runs it as written
    explicit = read_by_worker(cluster, cv.data.Dataset.range(6).shard(2, 1), ShardingPolicy.HINT)
    assert explicit == {i: [1, 3, 5] for i in range(NUM_WORKERS)}


def test_off_runs_the_whole_dataset_on_every_listed_worker(cluster: Listed) -> None:
    off = read_by_worker(cluster, cv.data.Dataset.range(3), ShardingPolicy.OFF)
    assert off == {i: [0, 1, 2] for i in range(NUM_WORKERS)}


# ----- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["FILE", "DATA", "FILE_OR_DATA", "HINT"])
def test_static_policies_need_worker_addresses(files: list[str], policy: str) -> None:
    with InProcessCluster(num_workers=1) as unlisted:
        dataset = cv.data.TFRecordDataset(files).apply(
            distribute(processing_mode=policy, service=unlisted.target))
        with pytest.raises(InvalidArgumentError,
                           match=f"sharding policy {policy} needs a fixed list of workers: "
                                 f"start the dispatcher with "
                                 f"DispatcherConfig.worker_addresses"):
            list(dataset)


def test_a_worker_not_on_the_list_is_refused(cluster: Listed) -> None:
    stranger = free_port()
    with pytest.raises(FailedPreconditionError,
                       match=rf"worker localhost:{stranger} is not in the dispatcher's "
                             rf"worker_addresses \['localhost:{cluster.ports[0]}', "):
        WorkerServer(WorkerConfig(dispatcher_address=cluster.address, port=stranger))


def test_fewer_files_than_workers_is_an_error(cluster: Listed, files: list[str]) -> None:
    for policy in ("FILE", "FILE_OR_DATA"):
        dataset = cv.data.TFRecordDataset(files[:2]).apply(
            distribute(processing_mode=policy, service=cluster.target))
        with pytest.raises(InvalidArgumentError,
                           match="FILE sharding needs at least as many files as workers: "
                                 "`TFRecordDataset` has 2 files, not enough for the required "
                                 "3 shards/workers"):
            list(dataset)


def test_file_sharding_without_files_is_refused_at_distribute(cluster: Listed) -> None:
    with pytest.raises(InvalidArgumentError, match="`range` is not a source of files"):
        cv.data.Dataset.range(5).apply(distribute(processing_mode="FILE",
                                                  service=cluster.target))


def test_static_sharding_reads_local_workers_only(cluster: Listed) -> None:
    dataset = cv.data.Dataset.range(5).apply(distribute(
        processing_mode="DATA", service=cluster.target, target_workers="ANY"))
    with pytest.raises(InvalidArgumentError,
                       match="Static sharding requires reading from local workers"):
        list(dataset)


# ----- a restarted worker ------------------------------------------------------------------------


def test_a_restarted_worker_replays_its_shard_from_the_start() -> None:
    size = 200_000
    with Listed(2) as listed:
        dataset = cv.data.Dataset.range(size).apply(distribute(
            processing_mode="DATA", service=listed.target, max_outstanding_requests=1))
        iterator = iter(dataset)
        seen = [int(next(iterator))]
        while seen[-1] % 2:  # until worker 0 (the even numbers) has delivered
            seen.append(int(next(iterator)))
        time.sleep(0.5)  # the consumer's buffer fills: no call in flight when the worker stops
        old = listed.workers[0]
        old.stop()
        listed.workers[0] = WorkerServer(WorkerConfig(
            dispatcher_address=listed.address, port=listed.ports[0],
            heartbeat_interval_ms=listed.heartbeat_interval_ms))
        seen += [int(x) for x in iterator]
    counts = Counter(seen)
    assert set(counts) == set(range(size))
    assert all(counts[odd] == 1 for odd in range(1, size, 2))  # the other shard, once
    assert counts[0] == 2  # delivered before the restart, and again by the new process


def test_a_killed_worker_process_replays_its_shard_from_the_start() -> None:
    """The same with worker processes (on the CLI's --worker-addresses), one SIGKILLed."""
    size = 200_000
    ports = free_ports(2)
    listed = ",".join(f"localhost:{port}" for port in ports)
    with ProcessCluster(0, dispatcher_args=["--worker-addresses", listed]) as processes:
        for port in ports:
            processes.add_worker(port)
        dataset = cv.data.Dataset.range(size).apply(distribute(
            processing_mode="DATA", service=processes.target))
        iterator = iter(dataset)
        seen = [int(next(iterator))]
        while seen[-1] % 2:
            seen.append(int(next(iterator)))
        processes.restart_worker(0)
        seen += [int(x) for x in iterator]
    counts = Counter(seen)
    assert set(counts) == set(range(size))
    assert all(counts[odd] == 1 for odd in range(1, size, 2))
    assert counts[0] == 2


def test_a_restarted_worker_keeps_its_index() -> None:
    with Listed(2) as listed:
        first = read_by_worker(listed, cv.data.Dataset.range(8), ShardingPolicy.DATA)
        listed.workers[1].stop()
        listed.workers[1] = WorkerServer(WorkerConfig(
            dispatcher_address=listed.address, port=listed.ports[1],
            heartbeat_interval_ms=listed.heartbeat_interval_ms))
        assert read_by_worker(listed, cv.data.Dataset.range(8), ShardingPolicy.DATA) == first


# ----- the pieces, without a network -------------------------------------------------------------


def test_the_rewrite_checks_its_arguments() -> None:
    op = cv.data.Dataset.range(4)._op
    assert task_shard(ShardingPolicy.OFF, 2, 0) is None
    assert task_shard(ShardingPolicy.DYNAMIC, 2, 0) is None
    with pytest.raises(InvalidArgumentError, match=r"worker_index must be in \[0, "
                                                   r"num_workers=2\), got 2"):
        shard(op, ShardingPolicy.DATA, 2, 2)
    assert list(cv.data.Dataset(shard(op, ShardingPolicy.DATA, 2, 1))) == [1, 3]


def test_file_sharding_shards_every_input_of_a_combining_op(files: list[str]) -> None:
    readers = [cv.data.TFRecordDataset(files[:4]), cv.data.TFRecordDataset(files[4:])]
    sharded = shard(readers[0].concatenate(readers[1])._op, ShardingPolicy.FILE, 2, 1)
    assert [record(r)[0] for r in cv.data.Dataset(sharded)][::4] == [1, 3, 5]
    # one input without files: FILE refuses it, FILE_OR_DATA shards the output instead
    mixed = readers[0].concatenate(cv.data.Dataset.from_tensors(b"9/9"))._op
    with pytest.raises(InvalidArgumentError, match="`from_tensors` is not a source of files"):
        shard(mixed, ShardingPolicy.FILE, 2, 1)
    assert len(list(cv.data.Dataset(shard(mixed, ShardingPolicy.FILE_OR_DATA, 2, 1)))) == 8


def test_a_file_cache_above_the_shard_is_refused(files: list[str], tmp_path: Any) -> None:
    cache = str(tmp_path / "cache")
    cached_files = cv.data.TFRecordDataset(files).cache(cache)._op
    with pytest.raises(InvalidArgumentError, match="FILE sharding cannot shard the input of "
                                                   "`cache` to a file"):
        shard(cached_files, ShardingPolicy.FILE, 2, 0)
    # FILE_OR_DATA shards the output instead, which every worker caches whole
    assert len(list(cv.data.Dataset(shard(cached_files, ShardingPolicy.FILE_OR_DATA, 2, 0)))) == 14
    hinted = cv.data.Dataset.range(4).shard(cv.data.SHARD_HINT, cv.data.SHARD_HINT)
    with pytest.raises(InvalidArgumentError, match="HINT sharding cannot shard the input of "
                                                   "`cache` to a file"):
        shard(hinted.cache(cache)._op, ShardingPolicy.HINT, 2, 0)
    assert list(cv.data.Dataset(shard(hinted.cache("")._op, ShardingPolicy.HINT, 2, 1))) == [1, 3]


@pytest.mark.parametrize("address, local", [
    ("localhost:5050", True), ("127.0.0.1:1", True), ("[::1]:2", True),
    (f"{socket.gethostname()}:3", True), ("worker.example.invalid:5050", False),
])
def test_which_workers_are_local(address: str, local: bool) -> None:
    assert is_local_address(address) is local


def test_a_consumer_reads_the_tasks_on_its_host_until_they_finish() -> None:
    view = LocalTasks()
    here, there = (1, "localhost:1"), (2, "worker.example.invalid:2")
    assert view.view((), False) == ((), False)  # no worker yet: wait
    assert view.view((here, there), False) == ((here,), False)
    assert view.view((there,), False) == ((), True)  # this host's shard is done
    assert LocalTasks().view((there,), True) == ((), True)  # so is the whole iteration
    with pytest.raises(FailedPreconditionError,
                       match=r"the job's workers are all elsewhere: "
                             r"\['worker.example.invalid:2'\]"):
        LocalTasks().view((there,), False)
