"""A worker's account of its shared-memory segments, as a state machine.

A segment is either *handed* to a reader (an answer named it, and the reader may map it) or
*free*: the reader that held it reported that its mapping is gone, so the next answer to that
reader may be written into it. A free segment goes back only to the reader that released it,
so a reading that is over may unlink what it released, knowing nobody else will be handed
it. Each handout has a random number, which only the answer carries; a release
frees a segment only if it names the reader and the number of its current handout, so a
repeated, late or forged release does nothing. Only a free segment is ever taken for an
answer, so no reader's mapping is ever written over.

The worker unlinks a segment's name (the memory goes once no mapping is left):

- handed, once its consumer's process has gone, or ``timeout_s`` after it was handed out (a
  reader that gave up on an answer, or keeps its arrays that long: its mapping keeps the
  memory, the segment is only not reused);
- free, once the consumer that released it has gone, beyond ``max_free_bytes`` (the oldest
  first), or when unused for ``free_timeout_s``;
- every one, when the worker stops.

Pure: no clocks, files or processes; time comes in as ``now``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from convoy.data.service._shm.segments import Process

#: A free segment is taken for an answer only if it is at most this many times the answer's size.
MAX_SLACK = 4


@dataclass(frozen=True)
class Segment:
    """A segment of the worker's and how many bytes it holds."""

    name: str
    capacity: int


@dataclass(frozen=True)
class Handed:
    """A segment handed out and not yet released."""

    segment: Segment
    reader: str
    handout: int
    consumer: Process
    since: float


@dataclass(frozen=True)
class Free:
    """A segment released by ``reader`` of process ``consumer``, unused since ``since``."""

    segment: Segment
    reader: str
    consumer: Process
    since: float


class SegmentLedger:
    """The worker's segments, handed out or free. Methods that return names return those to
    unlink now."""

    def __init__(self, timeout_s: float, free_timeout_s: float, max_free_bytes: int) -> None:
        self.timeout_s = timeout_s
        self.free_timeout_s = free_timeout_s
        self.max_free_bytes = max_free_bytes
        self.handed: dict[str, Handed] = {}
        self.free: dict[str, Free] = {}  # the oldest first

    def take(self, size: int, reader: str) -> Segment | None:
        """The smallest segment ``reader`` released that holds ``size`` bytes (and not over
        ``MAX_SLACK`` times that: a handed segment's whole capacity stays in use), no longer
        free; None if there is none."""
        fits = [free.segment for free in self.free.values()
                if free.reader == reader and size <= free.segment.capacity <= MAX_SLACK * size]
        if not fits:
            return None
        segment = min(fits, key=lambda segment: segment.capacity)
        del self.free[segment.name]
        return segment

    def sent(self, segment: Segment, reader: str, handout: int, consumer: Process,
             now: float) -> None:
        """``segment`` went to ``reader``, of process ``consumer``, as handout ``handout``."""
        self.handed[segment.name] = Handed(segment, reader, handout, consumer, now)

    def released(self, reader: str, releases: Iterable[tuple[str, int]], now: float
                 ) -> tuple[str, ...]:
        """``reader`` no longer maps the segments of ``releases`` (name, handout): those of
        its current handouts become free, the others are ignored. Free segments beyond the
        byte bound are then let go of, the oldest first."""
        for name, handout in releases:
            handed = self.handed.get(name)
            if handed is not None and (handed.reader, handed.handout) == (reader, handout):
                del self.handed[name]
                self.free[name] = Free(handed.segment, reader, handed.consumer, now)
        return self._trim()

    def _trim(self) -> tuple[str, ...]:
        """Forget free segments beyond ``max_free_bytes``, the oldest first."""
        excess = sum(free.segment.capacity for free in self.free.values()) - self.max_free_bytes
        trimmed = []
        for name, free in list(self.free.items()):
            if excess <= 0:
                break
            del self.free[name]
            excess -= free.segment.capacity
            trimmed.append(name)
        return tuple(trimmed)

    def consumers(self) -> frozenset[Process]:
        """The processes holding segments handed out, or that released free ones."""
        return frozenset([*(handed.consumer for handed in self.handed.values()),
                          *(free.consumer for free in self.free.values())])

    def sweep(self, now: float, gone: Iterable[Process]) -> tuple[str, ...]:
        """Forget the segments of consumers that are ``gone``, those handed out more than
        ``timeout_s`` ago, and those free and unused for ``free_timeout_s``."""
        gone = frozenset(gone)
        handed = [name for name, handed in self.handed.items()
                  if handed.consumer in gone or now - handed.since > self.timeout_s]
        free = [name for name, free in self.free.items()
                if free.consumer in gone or now - free.since > self.free_timeout_s]
        for name in handed:
            del self.handed[name]
        for name in free:
            del self.free[name]
        return (*handed, *free)

    def close(self) -> tuple[str, ...]:
        """The worker stops: every segment."""
        names = (*self.handed, *self.free)
        self.handed.clear()
        self.free.clear()
        return names
