"""Shared-memory segments (convoy.data.service._shm.segments), the worker's ledger of its segments
(_shm_ledger), both sides of the transfer (_shm_transfer), and how a consumer reads an
answer's status, without a network."""

from __future__ import annotations

import gc
import os
import stat
import subprocess
import sys
import threading
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from convoy.codec import Encoder, decode
from convoy.data.service import service_pb2 as pb
from convoy.data.service._client_reader import answer_elements
from convoy.data.service._common.host import SHM_DIR, host_identity
from convoy.data.service._common.wire import ELEMENTS, NOT_READY, SHARED_MEMORY
from convoy.data.service._shm import consumer_end
from convoy.data.service._shm import segments as _shm
from convoy.data.service._shm.consumer_end import SegmentReader, reader_identity
from convoy.data.service._shm.ledger import Segment, SegmentLedger
from convoy.data.service._shm.segments import Process, SegmentNames
from convoy.data.service._shm.worker_end import SegmentServer
from convoy.errors import DataLossError, InvalidArgumentError

pytestmark = pytest.mark.skipif(not host_identity(), reason="no POSIX shared memory")


@pytest.fixture
def names() -> SegmentNames:
    return SegmentNames()


def path(name: str) -> str:
    return os.path.join(SHM_DIR, name)


@pytest.fixture(autouse=True)
def no_segments_left_behind():
    before = set(_shm.segments(os.getuid()))
    yield
    left = [name for name in _shm.segments(os.getuid())
            if name not in before and _shm.writer_of(name).pid == os.getpid()]
    for name in left:
        _shm.unlink_segment(name)
    assert not left


# ----- segments ----------------------------------------------------------------------------------
def test_a_segment_is_private_to_its_user_and_names_its_writer(names: SegmentNames) -> None:
    old_umask = os.umask(0)  # the mode must not depend on the umask
    try:
        name = names.new()
        _shm.write_segment(name, [b"abc"])
    finally:
        os.umask(old_umask)
    info = os.stat(path(name))
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert info.st_uid == os.getuid()
    assert name.startswith(f"convoy-shm.u{os.getuid()}.")
    assert _shm.writer_of(name) == Process.this()
    _shm.unlink_segment(name)


def test_names_never_repeat_within_or_between_writers() -> None:
    first, second = SegmentNames(), SegmentNames()  # say two workers, or two jobs' tasks
    drawn = [first.new() for _ in range(100)] + [second.new() for _ in range(100)]
    assert len(set(drawn)) == 200


def test_an_existing_file_is_never_created_over(names: SegmentNames) -> None:
    name = names.new()
    _shm.write_segment(name, [b"held by a consumer"])
    with pytest.raises(FileExistsError):
        _shm.write_segment(name, [b"new"])
    assert bytes(_shm.map_segment(name, 18)) == b"held by a consumer"
    _shm.unlink_segment(name)


def test_mapping_is_read_only_and_keeps_the_memory_past_the_name(names: SegmentNames) -> None:
    name = names.new()
    _shm.write_segment(name, [b"head", memoryview(np.arange(3, dtype=np.int64))])
    segment = _shm.map_segment(name, 28)
    assert os.path.exists(path(name))  # a reader leaves the name to its writer
    _shm.unlink_segment(name)
    view = memoryview(segment)
    assert view.readonly
    assert bytes(view[:4]) == b"head"
    assert np.frombuffer(view[4:], np.int64).tolist() == [0, 1, 2]


def test_rewriting_writes_over_the_start(names: SegmentNames) -> None:
    name = names.new()
    _shm.write_segment(name, [b"x" * 100])
    _shm.rewrite_segment(name, [b"new", memoryview(b"er")])
    assert bytes(_shm.map_segment(name, 7)) == b"newerxx"
    assert os.stat(path(name)).st_size == 100
    _shm.unlink_segment(name)
    with pytest.raises(FileNotFoundError):
        _shm.rewrite_segment(name, [b"gone"])


def test_more_pieces_than_one_writev_takes(names: SegmentNames) -> None:
    pieces = [bytes([i % 256]) * (i % 7 + 1) for i in range(1500)]
    whole = b"".join(pieces)
    name = names.new()
    _shm.write_segment(name, pieces)
    assert bytes(_shm.map_segment(name, len(whole))) == whole
    _shm.rewrite_segment(name, pieces[::-1])
    assert bytes(_shm.map_segment(name, len(whole))) == b"".join(pieces[::-1])
    _shm.unlink_segment(name)


def test_mapping_a_segment_that_is_gone(names: SegmentNames) -> None:
    with pytest.raises(DataLossError, match="is gone: its worker freed it"):
        _shm.map_segment(names.new(), 10)


@pytest.mark.parametrize("length", [0, -1, 4])
def test_mapping_more_than_a_segment_holds(names: SegmentNames, length: int) -> None:
    name = names.new()
    _shm.write_segment(name, [b"abc"])
    with pytest.raises(DataLossError, match=f"holds 3 bytes, not the {length}"):
        _shm.map_segment(name, length)
    _shm.unlink_segment(name)


def test_mapping_refuses_a_segment_others_could_read(names: SegmentNames) -> None:
    name = names.new()
    os.close(os.open(path(name), os.O_CREAT | os.O_WRONLY, 0o644))
    os.chmod(path(name), 0o644)
    with pytest.raises(DataLossError, match="not private to this user"):
        _shm.map_segment(name, 1)
    _shm.unlink_segment(name)


@pytest.mark.parametrize("name", ["../../etc/passwd", "convoy-shm.x", "", "a/b"])
def test_names_not_of_convoy_are_refused(name: str) -> None:
    with pytest.raises(InvalidArgumentError, match="not a convoy shared-memory segment name"):
        _shm.map_segment(name, 1)


def orphan() -> str:
    """A segment whose writer, another process, has exited."""
    writer = ("from convoy.data.service._shm import segments as _shm\n"
              "name = _shm.SegmentNames().new()\n"
              "_shm.write_segment(name, [b'orphan'])\n"
              "print(name)\n")
    done = subprocess.run([sys.executable, "-c", writer], capture_output=True, text=True,
                          check=True, timeout=60)
    name = done.stdout.strip()
    assert os.path.exists(path(name))
    return name


def test_sweeping_unlinks_the_segments_of_dead_writers_only(names: SegmentNames) -> None:
    left = orphan()
    mine = names.new()
    _shm.write_segment(mine, [b"alive"])
    swept = _shm.sweep_orphans()
    assert left in swept and not os.path.exists(path(left))
    assert os.path.exists(path(mine))
    _shm.unlink_segment(mine)


def test_a_process_is_named_by_pid_and_start_time() -> None:
    me = Process.this()
    assert me.alive()
    assert not Process(me.pid, me.start + 1).alive()  # a reused pid is another process
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True, timeout=60)
    assert _shm.process_start(int(done.stdout)) is None


# ----- the ledger --------------------------------------------------------------------------------
CONSUMER = Process(10, 100)
OTHER = Process(11, 100)


def segment(name: str, capacity: int = 100) -> Segment:
    return Segment(name, capacity)


def test_a_released_segment_is_taken_again_the_smallest_that_fits() -> None:
    ledger = SegmentLedger(60.0, 5.0, 1000)
    ledger.sent(segment("a", 100), "r", 1, CONSUMER, 0.0)
    ledger.sent(segment("b", 300), "r", 2, CONSUMER, 0.0)
    assert ledger.take(50, "r") is None  # nothing released yet
    assert ledger.released("r", [("a", 1), ("b", 2)], 1.0) == ()
    assert ledger.take(200, "another reader") is None  # only for the reader that released it
    assert ledger.take(200, "r") == segment("b", 300)
    assert ledger.take(200, "r") is None
    assert ledger.take(10, "r") is None  # 100 bytes for 10: too much of it would lie idle
    assert ledger.take(50, "r") == segment("a", 100)
    assert ledger.close() == ()


def test_only_the_current_handout_of_a_segment_is_released() -> None:
    ledger = SegmentLedger(60.0, 5.0, 1000)
    ledger.sent(segment("a"), "r", 1, CONSUMER, 0.0)
    assert ledger.released("someone else", [("a", 1), ("never handed", 1)], 1.0) == ()
    assert ledger.released("r", [("a", 2)], 1.0) == ()  # not this handout
    assert ledger.take(100, "r") is None
    ledger.released("r", [("a", 1)], 1.0)
    assert ledger.take(100, "r") == segment("a")
    ledger.sent(segment("a"), "r", 3, CONSUMER, 2.0)  # handed out again, and held
    ledger.released("r", [("a", 1)], 3.0)  # the first release, repeated: nothing
    assert ledger.take(100, "r") is None


def test_free_segments_beyond_the_bound_are_unlinked_oldest_first() -> None:
    ledger = SegmentLedger(60.0, 5.0, 250)
    for name in "abc":
        ledger.sent(segment(name), "r", 0, CONSUMER, 0.0)
    assert ledger.released("r", [("a", 0), ("b", 0)], 1.0) == ()
    assert ledger.released("r", [("c", 0)], 2.0) == ("a",)
    assert set(ledger.close()) == {"b", "c"}


def test_segments_of_gone_consumers_and_old_ones_are_unlinked() -> None:
    ledger = SegmentLedger(60.0, 5.0, 1000)
    ledger.sent(segment("a"), "r", 0, CONSUMER, 0.0)
    ledger.sent(segment("b"), "s", 0, OTHER, 30.0)
    ledger.sent(segment("c"), "s", 0, OTHER, 30.0)
    ledger.released("s", [("c", 0)], 40.0)
    assert ledger.consumers() == {CONSUMER, OTHER}
    assert ledger.sweep(31.0, []) == ()
    assert ledger.sweep(31.0, [CONSUMER]) == ("a",)
    assert ledger.consumers() == {OTHER}
    assert ledger.sweep(45.0, []) == ()
    assert ledger.sweep(45.5, []) == ("c",)  # free and unused for 5 s
    assert ledger.sweep(90.5, []) == ("b",)  # handed out 60 s ago, never released
    assert ledger.close() == ()


def test_free_segments_go_with_the_consumer_that_released_them() -> None:
    ledger = SegmentLedger(60.0, 5.0, 1000)
    ledger.sent(segment("a"), "r", 0, CONSUMER, 0.0)
    ledger.sent(segment("b"), "s", 0, OTHER, 0.0)
    ledger.released("r", [("a", 0)], 1.0)
    ledger.released("s", [("b", 0)], 1.0)
    assert ledger.consumers() == {CONSUMER, OTHER}
    assert ledger.sweep(2.0, [CONSUMER]) == ("a",)
    assert ledger.consumers() == {OTHER}
    assert ledger.close() == ("b",)


@settings(max_examples=300, deadline=None)
@given(hs.lists(hs.tuples(hs.sampled_from(["send", "release", "replay", "sweep"]),
                          hs.sampled_from(["r", "s"]), hs.integers(1, 300),
                          hs.sampled_from([CONSUMER, OTHER]), hs.floats(0, 10))))
def test_no_segment_is_written_while_held_and_each_is_unlinked_once(
        steps: list[tuple[Any, ...]]) -> None:
    """Whatever happens (releases repeated, late, or naming others' segments), a segment
    taken for an answer is one no reader holds, released by the reader it now goes to, and
    each segment made is given back for unlinking exactly once (at the latest when the
    worker stops); only segments made are."""
    ledger = SegmentLedger(20.0, 5.0, 400)
    made: list[str] = []
    holder: dict[str, tuple[str, int]] = {}  # segment -> (reader, handout), while held
    released_by: dict[str, str] = {}  # segment -> the reader that released it last
    reported: list[tuple[str, tuple[str, int]]] = []  # every release sent: (reader, release)
    unlinked: list[str] = []
    now = 0.0
    for handouts, (kind, reader, size, consumer, step) in enumerate(steps):
        now += step
        if kind == "send":
            taken = ledger.take(size, reader)
            if taken is None:
                taken = segment(f"segment-{len(made)}", size)
                made.append(taken.name)
            else:
                assert released_by[taken.name] == reader
            assert size <= taken.capacity <= 4 * size
            assert taken.name not in holder and taken.name not in unlinked
            ledger.sent(taken, reader, handouts, consumer, now)
            holder[taken.name] = (reader, handouts)
        elif kind == "release":  # everything it holds, and others' with their handouts
            mine = [(name, handout) for name, (held_by, handout) in holder.items()
                    if held_by == reader]
            others = [(name, handout) for name, (_, handout) in holder.items()]
            unlinked += ledger.released(reader, [*mine, *others], now)
            reported += [(reader, release) for release in mine]
            for name, _ in mine:
                del holder[name]
                released_by[name] = reader
        elif kind == "replay" and reported:  # a release sent again, maybe long after
            replayed, release = reported[size % len(reported)]
            unlinked += ledger.released(replayed, [release], now)
        else:
            unlinked += ledger.sweep(now, [consumer] if step > 5 else [])
            for name in set(holder) - set(ledger.handed):
                del holder[name]
        assert set(holder) == set(ledger.handed)  # nothing held was freed
        assert set(ledger.handed).isdisjoint(ledger.free)
        assert set(ledger.handed).isdisjoint(unlinked) and set(ledger.free).isdisjoint(unlinked)
        assert sum(free.segment.capacity for free in ledger.free.values()) <= 400
    unlinked += ledger.close()
    assert sorted(unlinked) == sorted(made)


# ----- the worker's side -------------------------------------------------------------------------
def request(task_id: int = 1, host: str | None = None) -> pb.GetElementsRequest:
    identity = reader_identity()
    assert identity is not None
    if host is not None:
        identity.host = host
    return pb.GetElementsRequest(task_id=task_id, max_elements=10, max_bytes=1 << 20,
                                 shared_memory=identity)


def test_a_worker_answers_in_shared_memory_only_a_consumer_of_its_host() -> None:
    server = SegmentServer()
    try:
        assert server.serves(request())
        assert not server.serves(request(host="another host"))
        assert not server.serves(pb.GetElementsRequest(task_id=1))
        assert not SegmentServer(enabled=False).serves(request())
    finally:
        server.close()


def test_a_starting_worker_sweeps_what_dead_workers_left() -> None:
    left = orphan()
    SegmentServer().close()
    assert not os.path.exists(path(left))


def segment_of(answer: bytes) -> str:
    """The name of the segment a SHARED_MEMORY answer names (after its length and handout)."""
    assert answer[:1] == SHARED_MEMORY
    return answer[17:].decode()


def test_answer_map_release_and_reuse() -> None:
    server, reader = SegmentServer(), SegmentReader()
    asking = request()
    elements = [np.arange(1 << 15, dtype=np.float64), {"x": np.ones((4, 256), np.int32)}]
    answer = server.answer(asking, elements)
    got = reader.elements("w", memoryview(answer)[1:])
    np.testing.assert_array_equal(got[0], elements[0])
    np.testing.assert_array_equal(got[1]["x"], elements[1]["x"])
    assert not got[0].flags.writeable
    held = server.answer(asking, elements)  # while the reader holds the first: a new one
    assert segment_of(held) != segment_of(answer)
    assert reader.released("w") == []
    del got
    gc.collect()
    releases = reader.released("w")  # let go of: reported once
    assert [release.name for release in releases] == [segment_of(answer)]
    assert reader.released("w") == []
    asking.released_segments.extend(releases)
    server.requested(asking)
    smaller = [np.full(1 << 15, 7.0)]
    reused = server.answer(asking, smaller)
    assert segment_of(reused) == segment_of(answer)  # written over, not made anew
    np.testing.assert_array_equal(reader.elements("w", memoryview(reused)[1:])[0], smaller[0])
    server.close()  # a stopping worker unlinks every segment
    for name in (segment_of(answer), segment_of(held)):
        assert not os.path.exists(path(name))


def test_a_closed_reading_unlinks_what_it_lets_go_of() -> None:
    server, reader = SegmentServer(), SegmentReader()
    try:
        asking = request()
        first, second = (server.answer(asking, [np.zeros(1 << 15)]) for _ in range(2))
        dropped = reader.elements("w", memoryview(first)[1:])
        held = reader.elements("w", memoryview(second)[1:])
        del dropped
        gc.collect()  # let go of, not reported yet
        reader.close()  # no request will report it: unlinked now
        assert not os.path.exists(path(segment_of(first)))
        assert os.path.exists(path(segment_of(second)))
        assert held[0].sum() == 0  # the memory stays while mapped
        del held
        gc.collect()  # let go of after the close: unlinked at once
        assert not os.path.exists(path(segment_of(second)))
        assert reader.released("w") == []
    finally:
        server.close()


def released_at_the_worker(server: SegmentServer, reader: SegmentReader,
                           asking: pb.GetElementsRequest) -> tuple[bytes, list[Any]]:
    """An answer to ``asking``, mapped by ``reader`` and let go of, and the releases it then
    reported to ``server`` (the segment is free there, for this reading)."""
    answer = server.answer(asking, [np.zeros(1 << 15)])
    got = reader.elements("w", memoryview(answer)[1:])
    del got
    gc.collect()
    releases = reader.released("w")
    asking.released_segments.extend(releases)
    server.requested(asking)
    return answer, releases


def test_a_segment_goes_back_only_to_the_reader_that_released_it() -> None:
    server, reader = SegmentServer(), SegmentReader()
    try:
        asking = request()
        answer, _ = released_at_the_worker(server, reader, asking)
        other = server.answer(request(), [np.ones(1 << 15)])  # another reading: a new one
        assert segment_of(other) != segment_of(answer)
        assert segment_of(server.answer(asking, [np.ones(1 << 15)])) == segment_of(answer)
    finally:
        server.close()


def test_a_closed_reading_unlinks_what_it_reported_released() -> None:
    server, reader = SegmentServer(), SegmentReader()
    try:
        answer, releases = released_at_the_worker(server, reader, request())
        reader.unreported("w", releases)  # as after a failed call: it may have arrived
        reader.close()
        assert not os.path.exists(path(segment_of(answer)))
        assert reader.released("w") == []
    finally:
        server.close()


def test_a_release_from_another_reader_is_ignored() -> None:
    server = SegmentServer()
    try:
        asking = request()
        answer = server.answer(asking, [np.zeros(1 << 15)])
        handout = int.from_bytes(answer[9:17], "little")
        intruder = request()  # another reading, naming a segment it was not handed
        intruder.released_segments.add(name=segment_of(answer), handout=handout)
        server.requested(intruder)
        guess = pb.GetElementsRequest(shared_memory=asking.shared_memory)  # a wrong handout
        guess.released_segments.add(name=segment_of(answer), handout=handout + 1)
        server.requested(guess)
        assert segment_of(server.answer(intruder, [np.zeros(1 << 15)])) != segment_of(answer)
    finally:
        server.close()


@pytest.mark.parametrize("answer", [b"", b"\x05" + bytes(15), bytes(16) + b"../etc/passwd"])
def test_a_malformed_shared_memory_answer(answer: bytes) -> None:
    with pytest.raises(DataLossError, match="worker w sent a malformed shared-memory answer"):
        SegmentReader().elements("w", memoryview(answer))


FORKING_READER = """
import gc, os, numpy as np
from convoy.data.service import service_pb2 as pb
from convoy.data.service._shm.consumer_end import SegmentReader, reader_identity
from convoy.data.service._shm.worker_end import SegmentServer
server, reader = SegmentServer(), SegmentReader()
asking = pb.GetElementsRequest(task_id=1, max_elements=1, max_bytes=1 << 20,
                               shared_memory=reader_identity())
got = reader.elements("w", memoryview(server.answer(asking, [np.ones(1 << 15)]))[1:])
child = os.fork()
if child == 0:  # the child keeps the arrays, mapped
    os._exit(0 if got[0][0] == 1 else 1)
del got
gc.collect()
os.waitpid(child, 0)
print(len(reader.released("w")))
server.close()
"""


def test_what_a_forked_child_may_still_map_is_never_released() -> None:
    done = subprocess.run([sys.executable, "-c", FORKING_READER], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "0"


def test_an_answer_after_the_close_is_not_mapped_and_its_segment_is_unlinked() -> None:
    server, reader = SegmentServer(), SegmentReader()
    try:
        answer = server.answer(request(), [np.zeros(1 << 15)])
        reader.close()
        assert reader.elements("w", memoryview(answer)[1:]) == []
        assert not os.path.exists(path(segment_of(answer)))
    finally:
        server.close()


def test_reader_threads_report_at_once_within_the_bound(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """Many reader threads report releases at once; what a reading remembers stays within
    MAX_TRACKED and no thread fails (the oldest names are left to the worker)."""
    monkeypatch.setattr(consumer_end, "MAX_TRACKED", 8)
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    reader, errors = SegmentReader(), []

    def report(thread: int) -> None:
        try:
            for i in range(2000):
                reader.unreported("w", [pb.ReleasedSegment(name=f"n{thread}-{i}")])
                reader.released("w")
        except Exception as error:
            errors.append(error)

    try:
        threads = [threading.Thread(target=report, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        sys.setswitchinterval(old_interval)
    assert errors == []
    assert len(reader._reported["w"]) <= 8


def test_a_release_reported_again_after_the_close_is_unlinked() -> None:
    server, reader = SegmentServer(), SegmentReader()
    try:
        answer = server.answer(request(), [np.zeros(1 << 15)])
        reader.close()
        reader.unreported("w", [pb.ReleasedSegment(name=segment_of(answer), handout=1)])
        assert not os.path.exists(path(segment_of(answer)))
        assert reader.released("w") == []
    finally:
        server.close()


def test_a_segment_let_go_of_while_the_reading_closes_is_unlinked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The close comes between a finalizer's look at the reading and its queueing: the
    release must not be left in a queue nobody sends or empties."""
    server, reader = SegmentServer(), SegmentReader()
    try:
        answer = server.answer(request(), [np.zeros(1 << 15)])
        got = reader.elements("w", memoryview(answer)[1:])
        pending = reader._pending

        def close_first(worker: str) -> Any:
            reader.close()
            return pending(worker)

        monkeypatch.setattr(reader, "_pending", close_first)
        del got
        gc.collect()
        assert not os.path.exists(path(segment_of(answer)))
    finally:
        server.close()


FORKED_CLOSE = """
import gc, os, numpy as np
from convoy.data.service._common.host import SHM_DIR
from convoy.data.service._shm import segments as _shm
from convoy.data.service import service_pb2 as pb
from convoy.data.service._shm.consumer_end import SegmentReader, reader_identity
from convoy.data.service._shm.worker_end import SegmentServer
server, reader = SegmentServer(), SegmentReader()
asking = pb.GetElementsRequest(task_id=1, max_elements=1, max_bytes=1 << 20,
                               shared_memory=reader_identity())
answer = server.answer(asking, [np.ones(1 << 15)])
got = reader.elements("w", memoryview(answer)[1:])
del got
gc.collect()  # a release queued, not sent
child = os.fork()
if child == 0:  # the child's copy of the reading closes: the parent's queue is not its own
    reader.close()
    os._exit(0)
os.waitpid(child, 0)
print(os.path.exists(os.path.join(SHM_DIR, answer[17:].decode())),
      len(reader.released("w")))
server.close()
"""


def test_a_forked_child_closing_its_copy_of_a_reading_unlinks_nothing() -> None:
    done = subprocess.run([sys.executable, "-c", FORKED_CLOSE], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "1"]


def test_small_answers_stay_in_the_reply() -> None:
    server = SegmentServer()
    try:
        elements = [np.arange(1000), b"small"]
        answer = server.answer(request(), elements)
        assert answer[:1] == ELEMENTS
        assert decode(memoryview(answer)[1:])[1] == b"small"
    finally:
        server.close()


def test_encode_parts_is_the_message_in_pieces() -> None:
    encoder = Encoder(None)
    elements = [np.arange(5000), b"bytes", 3]
    parts = encoder.encode_parts(elements)
    message = b"".join(parts)
    assert message == encoder.encode(elements)
    assert decode(message)[1:] == [b"bytes", 3]


# ----- the consumer's reading of answers ---------------------------------------------------------
@pytest.mark.parametrize("status", [b"", b"X", b"e"])
def test_an_answer_of_unknown_status_is_an_error_not_an_empty_answer(status: bytes) -> None:
    with pytest.raises(DataLossError, match="worker w answered GetElements with status"):
        answer_elements(SegmentReader(), "w", status, memoryview(b"anything"))


def test_answers_of_known_status() -> None:
    reader, server = SegmentReader(), SegmentServer()
    try:
        assert answer_elements(reader, "w", NOT_READY, memoryview(b"")) == []
        message = Encoder(None).encode([1, b"two"])
        assert answer_elements(reader, "w", ELEMENTS, memoryview(message)) == [1, b"two"]
        shared = server.answer(request(), [np.arange(1 << 15)])
        (array,) = answer_elements(reader, "w", SHARED_MEMORY, memoryview(shared)[1:])
        assert array[-1] == (1 << 15) - 1
    finally:
        server.close()
