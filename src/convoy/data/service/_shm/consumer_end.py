"""Same-host transfer through shared memory, the consumer's end (the worker's is
:mod:`.worker_end`): it maps the segments a worker's answers name, decodes their messages in
place (arrays are read-only views on the shared memory) and reports each segment released, with
its next request to that worker, once no view of it is left.
"""

from __future__ import annotations

import collections
import os
import threading
import uuid
import weakref
from typing import Any

from convoy._values.codec import decode
from convoy.data.service import service_pb2 as pb
from convoy.data.service._common.host import host_identity
from convoy.data.service._common.wire import SHARED_MEMORY_HEADER as _HEADER
from convoy.data.service._shm.segments import Process, map_segment, sweep_orphans, unlink_all
from convoy.errors import DataLossError, InvalidArgumentError

#: How many segments a consumer remembers reporting released to one worker, to unlink them
#: once its reading is over (older ones are left to the worker's timeout).
MAX_TRACKED = 1024


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
                unlink_all([name])
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
            unlink_all([*names, *reported])


def free_orphans() -> None:
    """Unlink the segments of workers of this host that died, leaving theirs behind."""
    sweep_orphans()
