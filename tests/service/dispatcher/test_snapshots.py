"""distributed_save's bookkeeping in the dispatcher (pure state): streams, replayed splits,
streams taken over when their worker is lost, when a save is done, and all of it through the
journal (a restarted dispatcher goes on with the saves in progress)."""

from __future__ import annotations

import pytest

from convoy.data.service._dispatcher import events as ev
from convoy.data.service._dispatcher.journal_format import decode_snapshot, encode_snapshot
from convoy.data.service._dispatcher.snapshots import Snapshots
from convoy.data.service._dispatcher.state import DispatcherState
from convoy.errors import AlreadyExistsError, InvalidArgumentError

A, B = ("a:1", "uid-a"), ("b:1", "uid-b")


def started(units: int = 3) -> Snapshots:
    snapshots = Snapshots()
    snapshots.start("/save", "7", "SNAPPY", units, seed=5)
    return snapshots


def stream_for(snapshots: Snapshots, address: str, uid: str,
               live: set[tuple[str, str]]) -> int | None:
    """The index of the stream picked for the worker, assigned to it; None if none."""
    found = snapshots.pick_stream(address, uid, live)
    if found is None:
        return None
    snapshots.assign(*found, address, uid)
    return found[1]


def test_a_path_is_saved_once() -> None:
    snapshots = started()
    with pytest.raises(AlreadyExistsError, match="already started or completed"):
        snapshots.start("/save", "7", "", 3, seed=6)


def test_one_stream_per_worker_and_splits_replayed_by_number() -> None:
    snapshots = started(units=3)
    assert stream_for(snapshots, *A, live={A, B}) == 0
    assert stream_for(snapshots, *B, live={A, B}) == 1
    # A asks again (the answer was lost): its own stream, not another
    assert stream_for(snapshots, *A, live={A, B}) == 0
    assert snapshots.split("/save", 0, A[0], 0, 1) == ((0, 1), False)
    assert snapshots.split("/save", 1, B[0], 0, 1) == ((1, 2), False)
    assert snapshots.split("/save", 0, A[0], 0, 1) == ((0, 1), False)  # asked again
    assert snapshots.split("/save", 0, A[0], 0, 2) == ((2, 3), False)
    assert snapshots.split("/save", 0, A[0], 0, 3) == (None, True)
    with pytest.raises(InvalidArgumentError, match="skips a number"):
        snapshots.split("/save", 1, B[0], 0, 3)
    with pytest.raises(InvalidArgumentError, match="written by a:1"):
        snapshots.split("/save", 0, B[0], 0, 4)
    assert snapshots.saves["/save"].units == 3


def test_a_lost_workers_stream_is_taken_over_with_its_splits() -> None:
    snapshots = started(units=3)
    stream_for(snapshots, *A, live={A, B})
    assert snapshots.split("/save", 0, A[0], 0, 1) == ((0, 1), False)
    # A is gone: B takes its stream over (not a new one) and replays its first split.
    assert stream_for(snapshots, *B, live={B}) == 0
    assert snapshots.split("/save", 0, B[0], 0, 1) == ((0, 1), False)


def test_done_when_every_stream_is_done_and_no_new_stream_after_one_is() -> None:
    snapshots = started()
    stream_for(snapshots, *A, live={A, B})
    stream_for(snapshots, *B, live={A, B})
    assert snapshots.stream_done("/save", 0, A[0], "") is False
    assert stream_for(snapshots, "c:1", "uid-c", live={A, B, ("c:1", "uid-c")}) is None
    assert snapshots.stream_done("/save", 1, B[0], "") is True


def test_saves_in_progress_survive_the_journal() -> None:
    """A save's streams and answered splits go through the journal's snapshot of the state:
    a restarted dispatcher answers the same requests alike and goes on from the cursor."""
    state = DispatcherState()
    dataset_id = state.apply(ev.RegisterDataset("f", b"payload", "", b"", 4, 4))
    state.apply(ev.StartSave("/save", dataset_id, "SNAPPY", seed=5))
    state.apply(ev.AssignSaveStream("/save", 0, *A))
    first = state.apply(ev.GetSaveSplit("/save", 0, A[0], 0, 1))
    assert not state.is_durable(ev.GetSaveSplit("/save", 0, A[0], 0, 1))  # answered already
    assert state.is_durable(ev.GetSaveSplit("/save", 0, A[0], 0, 2))
    restored, _ = decode_snapshot(encode_snapshot(state, 0))
    assert restored.snapshots.saves == state.snapshots.saves
    assert restored.apply(ev.GetSaveSplit("/save", 0, A[0], 0, 1)) == first
    assert restored.apply(ev.GetSaveSplit("/save", 0, A[0], 0, 2)) == \
        state.apply(ev.GetSaveSplit("/save", 0, A[0], 0, 2))
    assert restored.apply(ev.SaveStreamDone("/save", 0, A[0])) is True
