"""Coordinated reads checkpoint: every consumer saves the round it returns next, and the
consumers, each restoring its own state into a new job, read on in step from that round, with
the turns of the workers where they were. Under OFF, a deterministic pipeline continues with the
very elements the saved reading would have read next; under DYNAMIC the workers start a fresh
pass. Consumers that restore different rounds fail, naming both."""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest

import convoy as cv
from convoy.data.service._client.resume import resume_point
from convoy.data.service._common.coordinated import ROUNDS_PER_TURN, rounds_served, turn_of
from convoy.errors import FailedPreconditionError, InvalidArgumentError
from convoy.testing import ProcessCluster

# The pipeline's functions run on the workers, which cannot import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(180)

#: Where the consumers stop: inside the second worker's first turn.
SAVED_ROUND = ROUNDS_PER_TURN + 44


def tag(x: Any) -> tuple[int, int]:
    """The element with the pid of the worker process that produced it."""
    return os.getpid(), int(x)


def consumers(target: str, mode: str, job_name: str) -> list[cv.data.Dataset]:
    """The two consumers' datasets, built anew (as a restarted trainer builds them)."""
    return [cv.data.Dataset.range(10**6).repeat().map(tag).apply(cv.data.service.distribute(
        mode, target, job_name=job_name, consumer_index=index, num_consumers=2))
        for index in range(2)]


def read_rounds(iterators: list[Iterator[Any]], rounds: int) -> list[list[Any]]:
    return [[next(iterator) for iterator in iterators] for _ in range(rounds)]


def restore(datasets: list[cv.data.Dataset], states: list[Any]) -> list[Any]:
    iterators = [iter(ds) for ds in datasets]
    for iterator, state in zip(iterators, states, strict=True):
        iterator.load_state_dict(state)
    return iterators


@pytest.fixture(scope="module")
def cluster2() -> Iterator[ProcessCluster]:
    with ProcessCluster(num_workers=2) as cluster:
        yield cluster


@pytest.mark.parametrize("mode", ["off", "dynamic"])
def test_restored_consumers_read_on_in_step_from_the_saved_round(cluster2, mode):
    originals = [iter(ds) for ds in consumers(cluster2.target, mode, f"saved-{mode}")]
    before = read_rounds(originals, SAVED_ROUND)
    states = [pickle.loads(pickle.dumps(it.state_dict())) for it in originals]  # plain data
    assert [state["root"]["round"] for state in states] == [SAVED_ROUND, SAVED_ROUND]
    # what the saved reading reads next, to compare the restored reading with
    expected = read_rounds(originals, 2 * ROUNDS_PER_TURN)
    for iterator in originals:
        iterator.close()

    restored = restore(consumers(cluster2.target, mode, f"saved-{mode}"), states)
    got = read_rounds(restored, 2 * ROUNDS_PER_TURN)
    for iterator in restored:
        iterator.close()

    # each round from one worker: the one whose turn it is, counting rounds from the start
    turns = {turn_of(r, 2): before[r][0][0] for r in (0, ROUNDS_PER_TURN)}
    assert len(set(turns.values())) == 2
    for offset, round_ in enumerate(got):
        assert {pid for pid, _ in round_} == {turns[turn_of(SAVED_ROUND + offset, 2)]}, offset
    if mode == "off":  # a deterministic pipeline: each worker skipped what its rounds dealt out
        assert got == expected
        assert got[0] == [(turns[1], 2 * 44), (turns[1], 2 * 44 + 1)]
    else:  # a fresh pass of the splits, in the same turns
        assert [[pid for pid, _ in r] for r in got] == [[pid for pid, _ in r] for r in expected]


def test_a_restored_reading_saves_and_restores_again(cluster2):
    datasets = consumers(cluster2.target, "off", "twice")
    iterators = [iter(ds) for ds in datasets]
    read_rounds(iterators, 100)
    states = [it.state_dict() for it in iterators]
    for iterator in iterators:
        iterator.close()
    iterators = restore(consumers(cluster2.target, "off", "twice"), states)
    read_rounds(iterators, SAVED_ROUND - 100)
    states = [it.state_dict() for it in iterators]
    expected = read_rounds(iterators, 50)
    for iterator in iterators:
        iterator.close()
    assert [state["root"]["round"] for state in states] == [SAVED_ROUND, SAVED_ROUND]
    iterators = restore(consumers(cluster2.target, "off", "twice"), states)
    assert read_rounds(iterators, 50) == expected
    for iterator in iterators:
        iterator.close()
    # the same states again, while the job of their first restore lives: its rounds are served
    iterators = restore(consumers(cluster2.target, "off", "twice"), states)
    with pytest.raises(FailedPreconditionError, match="current round has already reached"):
        read_rounds(iterators, 1)
    for iterator in iterators:
        iterator.close()
    # under another job_name they restore into a job of their own
    iterators = restore(consumers(cluster2.target, "off", "twice-again"), states)
    assert read_rounds(iterators, 50) == expected
    for iterator in iterators:
        iterator.close()


def test_consumers_restoring_different_rounds_fail_naming_both(cluster2):
    iterators = [iter(ds) for ds in consumers(cluster2.target, "off", "apart")]
    read_rounds(iterators, 10)
    behind = iterators[1].state_dict()
    next(iterators[0])  # consumer 0 one round further (from what its reader fetched ahead)
    ahead = iterators[0].state_dict()
    for iterator in iterators:
        iterator.close()
    assert (ahead["root"]["round"], behind["root"]["round"]) == (11, 10)

    first, second = (iter(ds) for ds in consumers(cluster2.target, "off", "apart"))
    first.load_state_dict(ahead)
    with pytest.raises(FailedPreconditionError, match="different rounds: 11 and 10"):
        second.load_state_dict(behind)
    with pytest.raises(FailedPreconditionError, match="different rounds: 11 and 10"):
        next(first)  # the consumer already reading fails too
    first.close()
    second.close()


# ----- without a cluster -------------------------------------------------------------------------


def test_rounds_served_counts_each_tasks_turns():
    for num_tasks in (1, 2, 3):
        for stop in (0, 1, ROUNDS_PER_TURN, 5 * ROUNDS_PER_TURN + 7):
            counts = [rounds_served(p, num_tasks, stop) for p in range(num_tasks)]
            assert counts == [sum(turn_of(r, num_tasks) == p for r in range(stop))
                              for p in range(num_tasks)]


def test_a_state_restored_by_another_consumer_or_read_is_refused():
    state = {"version": 1, "fingerprint": "f", "mode": "OFF", "tasks": [], "iteration": 1,
             "consumers": 2, "round": 5, "consumer_index": 0}
    with pytest.raises(InvalidArgumentError, match="consumer_index 0, not 1"):
        resume_point(state, "f", "OFF", True, consumer=(1, 2))
    with pytest.raises(InvalidArgumentError, match="num_consumers=2, not 3"):
        resume_point(state, "f", "OFF", True, consumer=(0, 3))
    with pytest.raises(InvalidArgumentError, match="saved by a coordinated read"):
        resume_point(state, "f", "OFF", True)
    assert resume_point(state, "f", "OFF", True, consumer=(0, 2)).round_index == 5
