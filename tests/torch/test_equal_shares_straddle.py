"""Readers of one epoch saved on both sides of the settlement of its equal shares resume
together, as torchdata's StatefulDataLoader's loader workers do (it saves each when it hands
over a batch): 2 ranks x 2 loader workers (threads here, each saving its state after every
element), one rank slow so that the other hands elements over at the end; in each rank one
reader resumes from its last state before the settlement and one from a state after it,
having handed out elements it received. Each element is trained once ("drop": but one left
out; "pad": but one copy), each rank as many, on a real dispatcher and workers."""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import convoy as cv
from convoy.data.service._dispatcher.shares import digest
from convoy.testing import ProcessCluster

N = 203  # not a multiple of the 2 ranks: "drop" leaves one out, "pad" adds one copy
RANKS, WORKERS = 2, 2
SLOW_S = 0.004  # rank 1's pause after each element: rank 0 takes more of the job
ATTEMPTS = 3  # runs made at most to find a hand-over of the kind a case wants

_local = threading.local()


@pytest.fixture(scope="module")
def cluster() -> Iterator[ProcessCluster]:
    with ProcessCluster(num_workers=2) as cluster:
        yield cluster


@pytest.fixture(autouse=True)
def loader_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each thread reads as the loader worker it names."""
    monkeypatch.setattr(torch.utils.data, "get_worker_info",
                        lambda: getattr(_local, "info", None))


def _read(face: cv.torch.IterableDataset, worker: int, pause: float, log: list[Any],
          errors: list[BaseException]) -> None:
    """Read ``face``'s pass as loader worker ``worker``, logging after each element the
    element, the face's state, whether the shares were settled and how many of its own
    elements the reader handed out (the rest it received)."""
    _local.info = SimpleNamespace(id=worker, num_workers=WORKERS)
    try:
        for element in face:
            share = face._pass[1]
            log.append((int(element), face.state_dict(), share.settled is not None,
                        getattr(share, "yielded", 0)))
            time.sleep(pause)
    except BaseException as error:  # reported by the test
        errors.append(error)


def _run(faces: dict[tuple[int, int], Any], pause: dict[int, float]
         ) -> dict[tuple[int, int], list[Any]]:
    logs: dict[tuple[int, int], list[Any]] = {slot: [] for slot in faces}
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_read, args=(face, slot[1], pause[slot[0]],
                                                    logs[slot], errors))
               for slot, face in faces.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert not any(thread.is_alive() for thread in threads), "a reader hung"
    assert not errors, errors
    return logs


def _upto(log: list[Any], after: bool) -> int:
    """How many of its elements a reader had handed out at the state it resumes from: its
    last before the settlement, or its first after it that follows an element received."""
    if not after:
        return max(i + 1 for i, entry in enumerate(log) if not entry[2])
    settled = [i for i, entry in enumerate(log) if entry[2]]
    received = [i for i in settled if log[i][3] < i + 1]
    return (received or settled)[0] + 1


def _flows(first: dict[tuple[int, int], list[Any]], after: dict[tuple[int, int], bool]
           ) -> dict[str, int]:
    """The elements handed over at the settlement between readers resumed from after it and
    readers resumed from before it, either way, as the dispatcher reckons them."""
    received: collections.Counter[bytes] = collections.Counter()
    gifts: list[bytes] = []
    for slot, log in first.items():
        settlement = log[_upto(log, after[slot]) - 1][1]["share"].get("settlement")
        if after[slot]:
            received.update(settlement["claims"])
            gifts += settlement["gifts"]
    orphans = 0
    for gift in gifts:
        if received[digest(gift)]:
            received[digest(gift)] -= 1
        else:
            orphans += 1
    return {"claims": received.total(), "orphans": orphans}


def _choices(first: dict[tuple[int, int], list[Any]]) -> Iterator[dict[tuple[int, int], bool]]:
    """Each way to resume some readers from before the settlement and some from after."""
    slots = list(first)
    for sides in itertools.product((False, True), repeat=len(slots)):
        if len(set(sides)) == 2 and all(any(entry[2] == side for entry in first[slot])
                                        for slot, side in zip(slots, sides)):
            yield dict(zip(slots, sides))


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["drop", "pad"])
@pytest.mark.parametrize("flow", ["claims", "orphans"])
def test_readers_saved_before_and_after_the_settlement_resume_together(
        cluster: ProcessCluster, mode: str, flow: str) -> None:
    """``flow``: the readers resumed are chosen so that some elements were handed over from
    readers resumed from before the settlement to readers resumed from after it ("claims":
    the givers have them still, or take them from the job again) or the other way round
    ("orphans": the receivers never had them)."""
    def faces(ds: Any) -> dict[tuple[int, int], Any]:
        return {(rank, worker): cv.torch.IterableDataset(ds, rank=rank, world_size=RANKS,
                                                         equal_shares=mode)
                for rank in range(RANKS) for worker in range(WORKERS)}

    # Which elements cross the settlement, and which way, depends on the threads' timing:
    # a run with no hand-over of the kind wanted is made again (a new job).
    for attempt in range(ATTEMPTS):
        ds = cv.data.Dataset.range(N).apply(cv.data.service.distribute(
            "distributed_epoch", cluster.target, job_name=f"straddle-{mode}-{flow}-{attempt}"))
        first = _run(faces(ds), {0: 0.0, 1: SLOW_S})
        after = max(_choices(first), key=lambda choice: _flows(first, choice)[flow])
        if _flows(first, after)[flow] > 0:
            break
    else:
        raise AssertionError(f"no hand-over of the kind {flow!r} in {ATTEMPTS} runs")
    upto = {slot: _upto(log, after[slot]) for slot, log in first.items()}
    trained = {slot: [entry[0] for entry in log[:upto[slot]]] for slot, log in first.items()}

    resumed = faces(ds)
    for slot, face in resumed.items():
        face.load_state_dict(first[slot][upto[slot] - 1][1])
    second = _run(resumed, {0: 0.0, 1: 0.0})

    per_rank = [sum(len(trained[rank, w]) + len(second[rank, w]) for w in range(WORKERS))
                for rank in range(RANKS)]
    assert per_rank[0] == per_rank[1], per_rank
    counts = collections.Counter(element for slot in first for element in
                                 trained[slot] + [entry[0] for entry in second[slot]])
    if mode == "drop":
        assert max(counts.values()) == 1 and len(counts) == N - 1, counts
    else:
        assert set(counts) == set(range(N)) and sum(counts.values()) == N + 1, counts
