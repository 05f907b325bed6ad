"""Same-host transfer through shared memory, the worker's end (the consumer's is
:mod:`.consumer_end`).

A consumer that may read through shared memory describes itself in
``GetElementsRequest.shared_memory``. A worker with the same host identity answers with
``SHARED_MEMORY``, the length of the codec message of the elements (uncompressed) and the
name of the segment (:mod:`.segments`) it wrote that message into: each array is copied once,
into the segment. The consumer maps the message and decodes it in place, so its arrays are
read-only views on the shared memory. Once none is left, the consumer reports the segment
released with its next request to that worker, which may then write another answer into it
(a copy into pages that exist, several times faster than a new segment's). What the worker
unlinks, and when, is :mod:`.ledger`'s to decide.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Sequence
from typing import Any

from convoy import monitoring
from convoy._base import threads as _threads
from convoy._values.codec import Encoder
from convoy.data.service import service_pb2 as pb
from convoy.data.service._common.host import host_identity
from convoy.data.service._common.wire import ELEMENTS, SHARED_MEMORY, SHARED_MEMORY_HEADER
from convoy.data.service._shm.ledger import Segment, SegmentLedger
from convoy.data.service._shm.segments import (
    Process,
    SegmentNames,
    rewrite_segment,
    shm_capacity,
    sweep_orphans,
    unlink_all,
    write_segment,
)
from convoy.errors import UnavailableError

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
            unlink_all(names)

    def answer(self, request: pb.GetElementsRequest, elements: list[Any], prefix: bytes = b""
               ) -> bytes:
        """The answer to a request this worker :meth:`serves`, after ``prefix``: a segment
        holding ``elements``, or the elements themselves if they are small or no segment can
        be written (say ``/dev/shm`` is full)."""
        message = _ENCODER.encode_parts(elements)
        size = sum(memoryview(part).nbytes for part in message)
        monitoring.BYTES_SERVED.inc(size)
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
                    self._sweeper = _threads.start("convoy-worker-shm-sweeper",
                                                   self._sweep_loop, restart=True)
        if closed:
            unlink_all([segment.name])
            raise UnavailableError("the worker is stopping")
        return b"".join([prefix, SHARED_MEMORY, SHARED_MEMORY_HEADER.pack(size, handout),
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
                unlink_all([segment.name])
            except BaseException:
                unlink_all([segment.name])
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
            unlink_all(names)

    def close(self) -> None:
        """Free every segment; answer no more."""
        with self._lock:
            self._closed.set()
            names = self._ledger.close()
        unlink_all(names)
