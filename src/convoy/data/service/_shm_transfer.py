"""Same-host transfer through shared memory: the worker's side and the consumer's.

A consumer that may read through shared memory describes itself in
``GetElementsRequest.shared_memory``. A worker with the same host identity answers with
``SHARED_MEMORY``, the length of the codec message of the elements (uncompressed) and the
name of the segment (:mod:`._shm`) it wrote that message into: each array is copied once,
into the segment. The consumer maps the message and decodes it in place, so its arrays are
read-only views on the shared memory. Once none is left, the consumer reports the segment
released with its next request to that worker, which may then write another answer into it
(a copy into pages that exist, several times faster than a new segment's). What the worker
unlinks, and when, is :mod:`._shm_ledger`'s to decide.
"""

from __future__ import annotations

import collections
import logging
import os
import secrets
import struct
import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

from convoy.codec import Encoder, decode
from convoy.data.service import service_pb2 as pb
from convoy.data.service._protocol import ELEMENTS, SHARED_MEMORY
from convoy.data.service._shm import (
    Process,
    SegmentNames,
    host_identity,
    map_segment,
    rewrite_segment,
    shm_capacity,
    sweep_orphans,
    unlink_segment,
    write_segment,
)
from convoy.data.service._shm_ledger import Segment, SegmentLedger
from convoy.errors import DataLossError, InvalidArgumentError, UnavailableError

log = logging.getLogger(__name__)

#: A segment handed out this long ago and not released is unlinked (far beyond the consumer's
#: deadline for the call that named it).
SEGMENT_TIMEOUT_S = 60.0
#: A released segment unused this long is unlinked (a reading reuses them within milliseconds).
FREE_TIMEOUT_S = 2.0
#: How many bytes of released segments a worker keeps for its next answers, at most: this, and
#: a sixteenth of the shared-memory file system (a container's may hold only 64 MiB).
MAX_FREE_BYTES = 64 << 20
#: How often a worker checks that the consumers holding its segments still run.
SWEEP_INTERVAL_S = 0.5
#: Smaller answers stay in the gRPC reply: a segment's system calls cost more than the copies
#: it saves.
MIN_SEGMENT_BYTES = 128 << 10
#: How many segments a consumer remembers reporting released to one worker, to unlink them
#: once its reading is over (older ones are left to the worker's timeout).
MAX_TRACKED = 1024
#: What a SHARED_MEMORY answer carries before the segment's name: the message's length and the
#: handout's number.
_HEADER = struct.Struct("<QQ")

# Copying once within a host is cheaper than compressing.
_ENCODER = Encoder(None)


class SegmentServer:
    """A worker's side: answers same-host consumers with segments, reuses those released,
    and frees them. Off (it serves no request) where the host has no shared memory or
    ``enabled`` is False."""

    def __init__(self, enabled: bool = True, timeout_s: float = SEGMENT_TIMEOUT_S,
                 free_timeout_s: float = FREE_TIMEOUT_S,
                 max_free_bytes: int | None = None) -> None:
        self._host = host_identity() if enabled else ""
        self._names = SegmentNames()
        self._lock = threading.Lock()  # guards the ledger and the sweeper
        if max_free_bytes is None:
            max_free_bytes = min(MAX_FREE_BYTES, shm_capacity() // 16)
        self._ledger = SegmentLedger(timeout_s, free_timeout_s, max_free_bytes)
        self._closed = threading.Event()
        self._sweeper: threading.Thread | None = None
        if self._host:
            sweep_orphans()  # what workers that died here before left behind

    def serves(self, request: pb.GetElementsRequest) -> bool:
        """Whether ``request`` comes from a consumer this worker can answer in shared memory."""
        return (bool(self._host) and request.HasField("shared_memory")
                and request.shared_memory.host == self._host)

    def requested(self, request: pb.GetElementsRequest) -> None:
        """A consumer asks: take back the segments it reports released."""
        if request.released_segments and self.serves(request):
            releases = [(release.name, release.handout) for release in request.released_segments]
            with self._lock:
                names = self._ledger.released(request.shared_memory.reader_id, releases,
                                              time.monotonic())
            _unlink(names)

    def answer(self, request: pb.GetElementsRequest, elements: list[Any], prefix: bytes = b""
               ) -> bytes:
        """The answer to a request this worker :meth:`serves`, after ``prefix``: a segment
        holding ``elements``, or the elements themselves if they are small or no segment can
        be written (say ``/dev/shm`` is full)."""
        message = _ENCODER.encode_parts(elements)
        size = sum(memoryview(part).nbytes for part in message)
        reader = request.shared_memory
        segment = (self._write(message, size, reader.reader_id) if size >= MIN_SEGMENT_BYTES
                   else None)
        if segment is None:
            return b"".join([prefix, ELEMENTS, *message])
        handout = secrets.randbits(64)
        with self._lock:
            closed = self._closed.is_set()
            if not closed:
                self._ledger.sent(segment, reader.reader_id, handout,
                                  Process(reader.pid, reader.pid_start), time.monotonic())
                if self._sweeper is None:
                    self._sweeper = threading.Thread(target=self._sweep_loop, daemon=True,
                                                     name="convoy-worker-shm-sweeper")
                    self._sweeper.start()
        if closed:
            _unlink([segment.name])
            raise UnavailableError("the worker is stopping")
        return b"".join([prefix, SHARED_MEMORY, _HEADER.pack(size, handout),
                         segment.name.encode()])

    def _write(self, message: Sequence[Any], size: int, reader: str) -> Segment | None:
        """A segment holding ``message``: one ``reader`` released if one is large enough,
        else a new one; None if none can be written."""
        with self._lock:
            segment = self._ledger.take(size, reader)
        if segment is not None:
            try:
                rewrite_segment(segment.name, message)
                return segment
            except FileNotFoundError:  # its reading is over, and unlinked it
                pass
            except OSError as error:
                log.warning("cannot reuse shared-memory segment %s (%s)", segment.name, error)
                _unlink([segment.name])
            except BaseException:
                _unlink([segment.name])
                raise
        segment = Segment(self._names.new(), size)
        try:
            write_segment(segment.name, message)
        except OSError as error:
            log.warning("cannot write shared-memory segment %s (%s); answering over gRPC",
                        segment.name, error)
            return None
        return segment

    def _sweep_loop(self) -> None:
        while not self._closed.wait(SWEEP_INTERVAL_S):
            with self._lock:
                consumers = self._ledger.consumers()
            gone = [consumer for consumer in consumers if not consumer.alive()]
            with self._lock:
                names = self._ledger.sweep(time.monotonic(), gone)
            _unlink(names)

    def close(self) -> None:
        """Free every segment; answer no more."""
        with self._lock:
            self._closed.set()
            names = self._ledger.close()
        _unlink(names)


def _unlink(names: Iterable[str]) -> None:
    for name in names:
        try:
            unlink_segment(name)
        except OSError as error:  # not ours to remove any more: nothing to free
            log.warning("cannot unlink shared-memory segment %s (%s)", name, error)


# ----- the consumer's side ---------------------------------------------------------------------
def reader_identity() -> pb.SharedMemoryReader | None:
    """What a new reading sends its workers to be answered in shared memory; None where this
    host has none."""
    host = host_identity()
    if not host:
        return None
    me = Process.this()
    return pb.SharedMemoryReader(host=host, pid=me.pid, pid_start=me.start,
                                 reader_id=uuid.uuid4().hex)


#: Mappings made before this process last forked may live on in its child: they are never
#: reported released (they go when the segment's name does), so none is written over.
_forks = [0]
os.register_at_fork(before=lambda: _forks.__setitem__(0, _forks[0] + 1))


class SegmentReader:
    """A consumer's side: maps the segments its answers name, and gathers (per worker) those
    it has let go of, to report with its next request to that worker. Once the reading is
    :meth:`close`-d, it unlinks them itself instead, and those it reported: a worker hands a
    released segment only to the reader that released it."""

    def __init__(self) -> None:
        # Filled by finalizers, which may run in any thread, amid anything: no lock.
        self._released: dict[str, collections.deque[pb.ReleasedSegment]] = {}
        # Segments reported released, by worker (oldest first): free for this reading only.
        # Reader threads share it (finalizers only ever take a worker's whole dict).
        self._reported: dict[str, dict[str, None]] = {}
        self._reported_lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()  # a forked child's copy reports and unlinks nothing

    def elements(self, worker: str, answer: memoryview) -> list[Any]:
        """The elements of a SHARED_MEMORY ``answer`` (past its status byte) from ``worker``:
        arrays are read-only views on the segment."""
        if len(answer) <= _HEADER.size:
            raise DataLossError(f"worker {worker} sent a malformed shared-memory answer "
                                f"({len(answer)} bytes)")
        length, handout = _HEADER.unpack_from(answer)
        name = bytes(answer[_HEADER.size:]).decode("ascii", "replace")
        try:
            if self._closed:  # a late answer, moot: its segment is this reading's to unlink
                _unlink([name])
                return []
            mapping = map_segment(name, length)
        except InvalidArgumentError as error:
            raise DataLossError(f"worker {worker} sent a malformed shared-memory answer: "
                                f"{error}") from None
        with self._reported_lock:  # handed out again: held now
            self._reported.get(worker, {}).pop(name, None)
        weakref.finalize(mapping, self._let_go, worker,
                         pb.ReleasedSegment(name=name, handout=handout), _forks[0])
        return decode(memoryview(mapping))

    def _let_go(self, worker: str, release: pb.ReleasedSegment, forks: int) -> None:
        if forks != _forks[0]:
            return  # a child forked since may still map it
        self._queue(worker, [release])

    def _queue(self, worker: str, releases: list[pb.ReleasedSegment]) -> None:
        self._pending(worker).extend(releases)
        if self._closed:  # now, or since the check a close made: this side empties the queue
            self._unlink_all(worker)

    def _pending(self, worker: str) -> collections.deque[pb.ReleasedSegment]:
        return self._released.setdefault(worker, collections.deque())

    def released(self, worker: str) -> list[pb.ReleasedSegment]:
        """The segments of ``worker`` let go of since the last call, now reported."""
        releases = self._take(worker)
        if not releases:  # the usual case: nothing to remember
            return releases
        with self._reported_lock:
            reported = self._reported.setdefault(worker, {})
            for release in releases:
                reported[release.name] = None
            while len(reported) > MAX_TRACKED:  # the oldest: its worker's timeout unlinks it
                del reported[next(iter(reported))]
        return releases

    def _take(self, worker: str) -> list[pb.ReleasedSegment]:
        pending = self._released.get(worker)
        taken: list[pb.ReleasedSegment] = []
        while pending:
            try:
                taken.append(pending.popleft())
            except IndexError:  # another reader thread took the last one
                break
        return taken

    def unreported(self, worker: str, releases: list[pb.ReleasedSegment]) -> None:
        """``releases`` may not have reached ``worker``: report them again (a release that
        did arrive names a past handout by then, which does nothing)."""
        self._queue(worker, releases)

    def close(self) -> None:
        """The reading is over: unlink the segments let go of, reported or not, and from now
        on each as it is let go of. Safe: a worker writes a segment again only for the
        reader that released it, and never while it is handed out."""
        self._closed = True
        for worker in list(self._released.keys() | self._reported.keys()):
            self._unlink_all(worker)

    def _unlink_all(self, worker: str) -> None:
        """Unlink the segments of ``worker`` this reading let go of. Each is taken once,
        whichever thread empties the queue."""
        names = [release.name for release in self._take(worker)]
        reported = self._reported.pop(worker, {})
        if os.getpid() == self._pid:
            _unlink([*names, *reported])


def free_orphans() -> None:
    """Unlink the segments of workers of this host that died, leaving theirs behind."""
    sweep_orphans()
