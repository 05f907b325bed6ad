"""distributed_save's bookkeeping in the dispatcher (pure state): streams, replayed splits,
streams taken over when their worker is lost, and when a save is done."""

from __future__ import annotations

import pytest

from convoy.data.service._dispatcher.snapshots import Snapshots
from convoy.errors import AlreadyExistsError, InvalidArgumentError

A, B = ("a:1", "uid-a"), ("b:1", "uid-b")


def started(units: int = 3) -> Snapshots:
    snapshots = Snapshots()
    snapshots.start("/save", "7", "SNAPPY", units, seed=5)
    return snapshots


def test_a_path_is_saved_once() -> None:
    snapshots = started()
    with pytest.raises(AlreadyExistsError, match="already started or completed"):
        snapshots.start("/save", "7", "", 3, seed=6)


def test_one_stream_per_worker_and_splits_replayed_by_number() -> None:
    snapshots = started(units=3)
    save, first = snapshots.stream_for(*A, live={A, B}) or pytest.fail("no stream")
    _, second = snapshots.stream_for(*B, live={A, B}) or pytest.fail("no stream")
    assert (first.index, second.index) == (0, 1)
    assert snapshots.stream_for(*A, live={A, B}) is None  # it writes one already
    assert snapshots.split("/save", 0, A[0], 0, 1) == ((0, 1), False)
    assert snapshots.split("/save", 1, B[0], 0, 1) == ((1, 2), False)
    assert snapshots.split("/save", 0, A[0], 0, 1) == ((0, 1), False)  # asked again
    assert snapshots.split("/save", 0, A[0], 0, 2) == ((2, 3), False)
    assert snapshots.split("/save", 0, A[0], 0, 3) == (None, True)
    with pytest.raises(InvalidArgumentError, match="skips a number"):
        snapshots.split("/save", 1, B[0], 0, 3)
    with pytest.raises(InvalidArgumentError, match="written by a:1"):
        snapshots.split("/save", 0, B[0], 0, 4)
    assert save.units == 3


def test_a_lost_workers_stream_is_taken_over_with_its_splits() -> None:
    snapshots = started(units=3)
    snapshots.stream_for(*A, live={A, B})
    assert snapshots.split("/save", 0, A[0], 0, 1) == ((0, 1), False)
    # A is gone: B takes its stream over (not a new one) and replays its first split.
    _, stream = snapshots.stream_for(*B, live={B}) or pytest.fail("no stream")
    assert stream.index == 0
    assert snapshots.split("/save", 0, B[0], 0, 1) == ((0, 1), False)


def test_done_when_every_stream_is_done_and_no_new_stream_after_one_is() -> None:
    snapshots = started()
    snapshots.stream_for(*A, live={A, B})
    snapshots.stream_for(*B, live={A, B})
    assert snapshots.stream_done("/save", 0, A[0], "") is False
    assert snapshots.stream_for("c:1", "uid-c", live={A, B, ("c:1", "uid-c")}) is None
    assert snapshots.stream_done("/save", 1, B[0], "") is True
