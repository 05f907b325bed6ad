"""Coordinated reads (``consumer_index``, ``num_consumers``) with real worker processes: the
consumers read in lock-step (each round's elements from one worker, tagged by its pid), a
consumer that stops reading fails the others with an error naming it, every refusal, and a
fault-tolerant dispatcher restarted under the reading consumers."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

import convoy as cv
from convoy.data.service._common.coordinated import ROUNDS_PER_TURN
from convoy.errors import FailedPreconditionError, InvalidArgumentError
from convoy.testing import ProcessCluster, ServerProcess

# The pipeline's functions run on the workers, which cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

service = cv.data.service

pytestmark = pytest.mark.timeout(180)


def tag(x: Any) -> tuple[int, int]:
    """The element with the pid of the worker process that produced it."""
    return os.getpid(), int(x)


def tagged() -> cv.data.Dataset:
    return cv.data.Dataset.range(10**6).repeat().map(tag)


def consumers(target: str, num_consumers: int, job_name: str,
              dataset: cv.data.Dataset | None = None, mode: str = "parallel_epochs",
              **kwargs: Any) -> list[cv.data.Dataset]:
    source = tagged() if dataset is None else dataset
    return [source.apply(service.distribute(mode, target, job_name=job_name,
                                            consumer_index=index, num_consumers=num_consumers,
                                            **kwargs))
            for index in range(num_consumers)]


def read_rounds(iterators: list[Iterator[Any]], rounds: int) -> list[list[Any]]:
    """``rounds`` rounds: the next element of every consumer, consumer by consumer (each
    consumer's reader fetches ahead on its own threads, so one thread can read them all)."""
    return [[next(iterator) for iterator in iterators] for _ in range(rounds)]


def check_lock_step(rounds: list[list[tuple[int, int]]]) -> None:
    """Each round: one worker, and the consecutive elements it dealt out."""
    for index, elements in enumerate(rounds):
        pids = {pid for pid, _ in elements}
        values = [value for _, value in elements]
        assert len(pids) == 1, f"round {index} came from several workers: {elements}"
        assert values == list(range(values[0], values[0] + len(values))), (index, elements)


@pytest.fixture(scope="module")
def cluster2() -> Iterator[ProcessCluster]:
    """Two worker processes, shared by the tests that leave them as they were (each reads a
    job of its own)."""
    with ProcessCluster(num_workers=2) as cluster:
        yield cluster


@pytest.mark.parametrize("mode", ["parallel_epochs", "distributed_epoch"])
def test_consumers_read_in_lock_step_rounds_rotating_over_workers(cluster2, mode):
    iterators = [iter(ds) for ds in consumers(cluster2.target, 3, f"lock-step-{mode}",
                                              mode=mode)]
    rounds = read_rounds(iterators, 3 * ROUNDS_PER_TURN)
    check_lock_step(rounds)
    turns = [rounds[start][0][0] for start in range(0, len(rounds), ROUNDS_PER_TURN)]
    workers = {rounds[0][0][0], rounds[ROUNDS_PER_TURN][0][0]}
    assert len(workers) == 2, "both workers serve turns"
    assert turns == [turns[0], turns[1], turns[0]], "turns rotate over the workers"
    assert all(round_[0][0] == turns[r // ROUNDS_PER_TURN] for r, round_ in enumerate(rounds))


def test_consumers_in_their_own_threads_stay_in_step(cluster2):
    datasets = consumers(cluster2.target, 4, "threads")
    received: list[list[Any]] = [[] for _ in datasets]

    def run(index: int) -> None:
        iterator = iter(datasets[index])
        received[index] = [next(iterator) for _ in range(600)]

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert all(len(r) == 600 for r in received)
    check_lock_step([list(step) for step in zip(*received, strict=True)])


def test_a_consumer_that_stops_reading_fails_the_others_naming_it(cluster2):
    ds0, ds1 = consumers(cluster2.target, 2, "stalled", dispatcher_timeout_ms=3000)
    first, second = iter(ds0), iter(ds1)
    read_rounds([first, second], 10)
    # consumer 1 reads no more: its reader fetches up to its window ahead, then stops asking
    with pytest.raises(FailedPreconditionError) as raised:
        for _ in range(10 * ROUNDS_PER_TURN):
            next(first)
    message = str(raised.value)
    assert "Coordinated read stalled" in message
    assert "consumer_index 1 of num_consumers=2 did not ask" in message
    del second


def test_a_finite_dataset_is_refused(cluster2):
    (dataset,) = consumers(cluster2.target, 1, "finite", dataset=cv.data.Dataset.range(100))
    with pytest.raises(FailedPreconditionError,
                       match="Round robin reads require that the input dataset has infinite "
                             "cardinality, but the dataset has cardinality 100"):
        next(iter(dataset))


def test_a_dataset_that_turns_out_finite_fails_its_consumers(cluster2):
    ends = cv.data.Dataset.range(5).repeat().take_while(lambda x: x < 4)  # cardinality unknown
    iterators = [iter(ds) for ds in consumers(cluster2.target, 2, "ends", dataset=ends)]
    with pytest.raises(FailedPreconditionError,
                       match="end of sequence on a round-robin read"):
        read_rounds(iterators, 10)


def test_another_num_consumers_on_the_same_job_is_refused(cluster2):
    iterators = [iter(ds) for ds in consumers(cluster2.target, 2, "mismatch")]
    read_rounds(iterators, 2)
    (other,) = consumers(cluster2.target, 1, "mismatch")
    with pytest.raises(InvalidArgumentError,
                       match="found an existing job with different parameters: existing "
                             ".*num_consumers 2.*got .*num_consumers 1"):
        next(iter(other))


def test_a_consumer_restarted_under_the_same_job_name_is_refused(cluster2):
    iterators = [iter(ds) for ds in consumers(cluster2.target, 3, "restart")]
    read_rounds(iterators, 100)
    again = [iter(ds) for ds in consumers(cluster2.target, 3, "restart")]
    with pytest.raises(FailedPreconditionError, match="current round has already reached"):
        read_rounds(again, 1)


@pytest.mark.parametrize("kwargs, message", [
    ({"consumer_index": 2, "num_consumers": 2},
     r"consumer_index must be in \[0, num_consumers=2\), got 2"),
    ({"consumer_index": 0, "num_consumers": 2, "target_workers": "LOCAL"},
     "Coordinated reads require non-local workers"),
    ({"consumer_index": 0, "num_consumers": 2,
      "cross_trainer_cache": service.CrossTrainerCache("t")},
     "Cross-trainer caching does not support coordinated reads"),
    ({"consumer_index": 0, "num_consumers": 2, "processing_mode": service.ShardingPolicy.FILE},
     "Coordinated reads work with OFF and DYNAMIC sharding, not FILE"),
])
def test_options_a_coordinated_read_cannot_go_with_are_refused(kwargs, message):
    arguments = {"processing_mode": "parallel_epochs", **kwargs}
    with pytest.raises(InvalidArgumentError, match=message):
        service.distribute(service="grpc://localhost:5050", job_name="j", **arguments)


def test_consumers_of_a_registered_dataset_read_in_lock_step(cluster2):
    dataset_id = service.register_dataset(cluster2.target, tagged())
    iterators = [iter(service.from_dataset_id(
        "parallel_epochs", cluster2.target, dataset_id, job_name="by-id",
        consumer_index=index, num_consumers=2)) for index in range(2)]
    check_lock_step(read_rounds(iterators, ROUNDS_PER_TURN + 10))


def test_a_worker_killed_and_restarted_at_its_address_keeps_the_consumers_in_step():
    """SIGKILL lands anywhere, also between two consumers' answers of the same rounds: the
    consumer left without them catches up on the new process, and the rounds go on in step."""
    with ProcessCluster(num_workers=1) as cluster:
        iterators = [iter(ds) for ds in consumers(cluster.target, 3, "killed")]
        rounds = read_rounds(iterators, 50)
        kills = 3
        for _ in range(kills):
            # the process started last serves before it is killed: on a loaded machine a pass
            # may be read before its timer fires, and the next timer could kill a process
            # still starting, which would never serve a round
            rounds += read_rounds(iterators, 10)
            killer = threading.Timer(0.3, cluster.restart_worker, args=(0,))
            killer.start()
            rounds += read_rounds(iterators, 2000)
            killer.join()
        rounds += read_rounds(iterators, 200)
    mixed = [index for index, round_ in enumerate(rounds) if len({p for p, _ in round_}) > 1]
    assert len(mixed) <= kills * 32, mixed  # at most a request's rounds per kill
    check_lock_step([round_ for index, round_ in enumerate(rounds) if index not in mixed])
    assert len({pid for round_ in rounds for pid, _ in round_}) == 1 + kills


def test_a_fault_tolerant_dispatcher_restarted_under_coordinated_reads(tmp_path: Path):
    args = ["--work-dir", str(tmp_path), "--fault-tolerant"]
    with ProcessCluster(num_workers=2, dispatcher_args=args) as cluster:
        iterators = [iter(ds) for ds in consumers(cluster.target, 2, "ft")]
        rounds = read_rounds(iterators, 300)
        port = cluster.dispatcher.address.rsplit(":", 1)[1]
        cluster.dispatcher.kill()
        rounds += read_rounds(iterators, 100)  # from what the workers hold
        cluster.dispatcher = ServerProcess("dispatcher", ["--port", port, *args]).start()
        rounds += read_rounds(iterators, 2 * ROUNDS_PER_TURN)
        # a new consumer of the job after the restart finds it, with its num_consumers
        other = consumers(cluster.target, 3, "ft")[0]
        with pytest.raises(InvalidArgumentError, match="existing job with different"):
            next(iter(other))
    check_lock_step(rounds)
    assert len({pid for round_ in rounds for pid, _ in round_}) == 2
