"""The dispatcher's journal on an object store (``work_dir`` a ``s3://``, ``gs://``... URL).

Objects cannot be appended to, and two dispatchers may be given one ``work_dir`` by mistake
(a pod rescheduled while the old one still runs). So the journal is a sequence of immutable
objects under ``<work_dir>/journal/``, each created only if its name is free (S3's
``If-None-Match: *``)::

    meta                  as on a local disk (the format and the id base)
    000000000007.log      one segment: the records of one append
    000000000012.snapshot the whole state, after which earlier objects are deleted

Replay is the latest snapshot and the segments numbered after it. Every write takes the next
number: a dispatcher that finds its number taken lost the race to another dispatcher on the
same ``work_dir`` and stops writing with :class:`~convoy.errors.AbortedError` (fencing).
Transient store errors reach the journal as :class:`OSError` (``UnavailableError`` is one),
so the dispatcher treats them as a full disk: it refuses new work until a write succeeds.
"""

from __future__ import annotations

import contextlib
import logging
import re
import struct
from collections.abc import Iterator

from convoy._base import fs as _fs
from convoy.data.tfrecord import masked_crc32c, read_records
from convoy.errors import AbortedError, NotFoundError

log = logging.getLogger(__name__)

#: Records per log generation before a snapshot: each record is one object here, and a
#: restart reads them one by one, so compact sooner than on a local disk.
COMPACT_EVERY = 500
_OBJECT = re.compile(r"(\d{12})\.(log|snapshot)")


def frame(records: list[bytes]) -> bytes:
    """``records`` framed as a TFRecord file."""
    parts = []
    for record in records:
        length = struct.pack("<Q", len(record))
        parts += [length, struct.pack("<I", masked_crc32c(length)), record,
                  struct.pack("<I", masked_crc32c(record))]
    return b"".join(parts)


class ObjectStorage:
    """Journal files as immutable, conditionally created objects under a URL (see the
    module docstring); the :class:`~.journal.Storage` a URL ``work_dir`` gets."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self._objects: dict[int, str] = {}  # number -> "log" | "snapshot"
        self._attempt: tuple[int, str, bytes] | None = None  # a create that may have landed
        self._fenced: str | None = None
        try:
            names = _fs.listdir(self.url)
        except NotFoundError:
            names = []  # nothing under the prefix yet (a missing bucket fails at write)
        for name in names:
            if match := _OBJECT.fullmatch(name):
                self._objects[int(match[1])] = match[2]
        self.next = max(self._objects, default=-1) + 1

    def _key(self, number: int) -> str:
        return f"{self.url}/{number:012d}.{self._objects[number]}"

    def where(self, name: str) -> str:
        return f"{self.url}/{name}"

    def _snapshot(self) -> int | None:
        return max((n for n, kind in self._objects.items() if kind == "snapshot"),
                   default=None)

    def _segments(self) -> list[int]:
        after = self._snapshot()
        return sorted(n for n, kind in self._objects.items()
                      if kind == "log" and (after is None or n > after))

    def exists(self, name: str) -> bool:
        if name == "snapshot":
            return self._snapshot() is not None
        if name.startswith("log-"):
            return bool(self._segments())
        return _fs.exists(self.where(name))

    def records(self, name: str) -> Iterator[tuple[bytes, int]]:
        if name == "snapshot":
            snapshot = self._snapshot()
            if snapshot is not None:
                yield from read_records(self._key(snapshot))
            return
        if not name.startswith("log-"):
            yield from read_records(self.where(name))
            return
        base = 0
        for number in self._segments():
            after = 0
            for record, after in read_records(self._key(number)):
                yield record, base + after
            base += _fs.stat(self._key(number))["size"]

    def read(self, name: str) -> bytes | None:
        if not self.exists(name):
            return None
        if name == "snapshot":
            return _fs.read_bytes(self._key(self._snapshot() or 0))
        if name.startswith("log-"):
            return b"".join(_fs.read_bytes(self._key(n)) for n in self._segments())
        return _fs.read_bytes(self.where(name))

    def truncate(self, name: str, size: int) -> None:
        """Cuts a log's damaged tail: later segments deleted, the one holding ``size``
        written again up to it."""
        base = 0
        for number in self._segments():
            data = _fs.read_bytes(self._key(number))
            if base >= size:
                self._delete(number)
            elif base + len(data) > size:
                _fs.atomic_write(self._key(number), data[:size - base])
            base += len(data)

    def appender(self, name: str) -> _Segments:
        return _Segments(self)

    def replace(self, name: str, records: list[bytes]) -> None:
        data = frame(records)
        if name == "snapshot":
            self.create("snapshot", data)
        elif name == "meta":
            if not _fs.write_if_absent(self.where(name), data):
                self._fence(self.where(name))
        else:
            _fs.atomic_write(self.where(name), data)

    def remove(self, name: str) -> None:
        """Removing a log deletes every object the latest snapshot replaces."""
        if not name.startswith("log-"):
            with contextlib.suppress(NotFoundError):
                _fs.remove(self.where(name))
            return
        snapshot = self._snapshot()
        if snapshot is None:
            return
        for number in sorted(n for n in self._objects if n < snapshot):
            with contextlib.suppress(NotFoundError, OSError):  # left over: deleted next time
                self._delete(number)

    def _delete(self, number: int) -> None:
        _fs.remove(self._key(number))
        del self._objects[number]

    def create(self, kind: str, data: bytes) -> None:
        """Creates the next numbered object; another dispatcher having taken its number
        fences this one."""
        if self._fenced is not None:
            raise AbortedError(self._fenced)
        number = self.next
        if self._attempt is not None and self._attempt[0] == number:
            if self._landed(*self._attempt):  # the last try failed in transit, yet landed
                self._objects[number] = self._attempt[1]
                number = self.next = number + 1
            self._attempt = None
        key = f"{self.url}/{number:012d}.{kind}"
        self._attempt = (number, kind, data)
        if not _fs.write_if_absent(key, data):
            self._fence(key)
        self._attempt = None
        self._objects[number] = kind
        self.next = number + 1

    def _landed(self, number: int, kind: str, data: bytes) -> bool:
        try:
            return _fs.read_bytes(f"{self.url}/{number:012d}.{kind}") == data
        except NotFoundError:
            return False

    def _fence(self, key: str) -> None:
        self._fenced = (f"the journal object {key} was written by another dispatcher: two "
                        f"dispatchers were given one work_dir; this one writes no more")
        log.error("%s", self._fenced)
        raise AbortedError(self._fenced)


class _Segments:
    """The log's appender: each ``sync`` writes the records since the last as one object."""

    def __init__(self, storage: ObjectStorage) -> None:
        self._storage = storage
        self._pending: list[bytes] = []

    def write(self, record: bytes) -> None:
        self._pending.append(record)

    def sync(self) -> None:
        if self._pending:
            self._storage.create("log", frame(self._pending))
            self._pending = []

    def close(self) -> None:
        self._pending = []  # never synced: not durable, as a torn tail
