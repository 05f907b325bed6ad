"""The dispatcher's journal: its state changes, durable in ``work_dir``, replayed on restart.

Each state change is an event (:mod:`.events`); the journal appends it as one
TFRecord-framed record (length, CRC, data, CRC) of plain data (:mod:`.journal_format`) and
fsyncs before the dispatcher answers. Heartbeats that only move a last-seen time are not
journaled (:meth:`DispatcherState.is_durable`).

On restart the latest snapshot is loaded and the records after it are applied again. A damaged
record with no whole record after it is a torn tail (the dispatcher died writing it, before it
answered): it is cut off with a warning. Anything else that cannot be read back -- a damaged
record followed by good ones, an unknown record, an event whose replay fails, a damaged
snapshot -- stops the restart with :class:`~convoy.errors.DataLossError` naming the file and
offset: carrying on would serve a state that never was.

Compaction keeps restart time flat: after ``compact_every`` records the whole state is written
as a snapshot (atomically: temporary file, fsync, rename) naming the next log generation, and
a fresh log starts. Files in the journal directory, each of TFRecord-framed records::

    meta            the format and where this dispatcher's ids start (drawn at random when
                    the journal is new, so a dispatcher started afresh never reuses old ids)
    snapshot        the format, the generation g and the state
    log-<g>         the events applied after that snapshot

All file access goes through :class:`Storage`, the seam where an object store could be added.
A write that fails (a full disk, say) raises :class:`OSError` naming the file; the journal is
then written again only by :meth:`Journal.compact` (a torn record may end the log).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from convoy.data.service._dispatcher import events as ev
from convoy.data.service._dispatcher.journal_format import (
    decode_event,
    decode_meta,
    decode_snapshot,
    encode_event,
    encode_meta,
    encode_snapshot,
)
from convoy.data.service._dispatcher.state import DispatcherState, fresh_id_base
from convoy.data.tfrecord import TFRecordWriter, find_record, read_records
from convoy.errors import DataLossError

log = logging.getLogger(__name__)

#: Records per log generation before the state is snapshotted and a new log started.
COMPACT_EVERY = 10_000
#: Tests: while the file this variable names exists, every journal write fails as on a full
#: disk (ENOSPC), for machines where a small file system cannot be mounted.
FULL_DISK_FLAG = "CONVOY_TEST_JOURNAL_FULL_FLAG"


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """Writes to ``path`` inside: an OSError names it; the test flag fails them."""
    flag = os.environ.get(FULL_DISK_FLAG)
    try:
        if flag and os.path.exists(flag):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        yield
    except OSError as error:
        if error.filename is None:
            raise OSError(error.errno, error.strerror or str(error), str(path)) from error
        raise


class _Appender:
    """Appends records to one file; its write errors name the file."""

    def __init__(self, path: Path) -> None:
        self._path = path
        with _writing(path):
            self._writer = TFRecordWriter(path, append=True)

    def write(self, record: bytes) -> None:
        with _writing(self._path):
            self._writer.write(record)

    def sync(self) -> None:
        with _writing(self._path):
            self._writer.sync()

    def close(self) -> None:
        with _writing(self._path):
            self._writer.close()


class Storage(Protocol):
    """Where journal files live (a local directory here; an object store could implement it)."""

    def where(self, name: str) -> str:
        """File ``name`` as error messages show it."""

    def exists(self, name: str) -> bool: ...

    def records(self, name: str) -> Iterator[tuple[bytes, int]]:
        """The records of file ``name`` with the offset after each; raises
        :class:`DataLossError` at the first damaged one."""

    def read(self, name: str) -> bytes | None: ...

    def truncate(self, name: str, size: int) -> None: ...

    def appender(self, name: str) -> Any:
        """An object with ``write(bytes)``, ``sync()`` and ``close()``, appending records."""

    def replace(self, name: str, records: list[bytes]) -> None:
        """Make ``name`` a file of ``records``, atomically and durably."""

    def remove(self, name: str) -> None: ...


class LocalStorage:
    """Journal files in a local directory."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, name: str) -> Path:
        return self.directory / name

    def where(self, name: str) -> str:
        return str(self._path(name))

    def exists(self, name: str) -> bool:
        return self._path(name).exists()

    def records(self, name: str) -> Iterator[tuple[bytes, int]]:
        return read_records(self._path(name))

    def read(self, name: str) -> bytes | None:
        path = self._path(name)
        return path.read_bytes() if path.exists() else None

    def truncate(self, name: str, size: int) -> None:
        path = self._path(name)
        if path.exists() and path.stat().st_size > size:
            with open(path, "r+b") as file:
                file.truncate(size)
                os.fsync(file.fileno())

    def appender(self, name: str) -> _Appender:
        return _Appender(self._path(name))

    def replace(self, name: str, records: list[bytes]) -> None:
        temporary = self._path(name + ".tmp")
        try:
            with _writing(temporary), TFRecordWriter(temporary) as writer:
                for record in records:
                    writer.write(record)
                writer.sync()
        except OSError:
            temporary.unlink(missing_ok=True)  # give the space back
            raise
        os.replace(temporary, self._path(name))
        directory = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def remove(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)


class Journal:
    """Appends events durably and rebuilds a :class:`DispatcherState` from them."""

    def __init__(self, storage: Storage, compact_every: int = COMPACT_EVERY,
                 id_base: int | None = None) -> None:
        self.storage = storage
        self.new_id_base = id_base  # for a new journal; None: a random one
        self.compact_every = compact_every
        self.generation = 0
        self.records = 0
        self._log: Any = None

    def recover(self) -> DispatcherState:
        """The state as of the last durable event; the journal is then ready to append.
        Raises :class:`DataLossError` if the journal cannot be read back as it was written."""
        state = DispatcherState(self._id_base())
        if self.storage.exists("snapshot"):
            state, self.generation = self._decode("snapshot", 0, decode_snapshot,
                                                  self._only_record("snapshot"))
            # a crash in compact() may have left the previous log, all in the snapshot
            self.storage.remove(f"log-{self.generation - 1}")
        name = f"log-{self.generation}"
        self.storage.truncate(name, self._replay(name, state))
        self._log = self.storage.appender(name)
        return state

    def _id_base(self) -> int:
        """The id base of this journal's dispatcher, drawn once when the journal is new."""
        if self.storage.exists("meta"):
            base: int = self._decode("meta", 0, decode_meta, self._only_record("meta"))
            return base
        others = [name for name in ("snapshot", "log-0", "id_base") if self.storage.exists(name)]
        if others:
            raise DataLossError(
                f"{self.storage.where('meta')} is missing beside {others}: the journal was "
                f"written by an older version of convoy, or damaged; the dispatcher cannot "
                f"restore its state from it")
        base = self.new_id_base if self.new_id_base is not None else fresh_id_base()
        self.storage.replace("meta", [encode_meta(base)])
        return base

    def _replay(self, name: str, state: DispatcherState) -> int:
        """Apply the events of log ``name`` to ``state``; returns where its whole records end
        (a torn tail is cut there)."""
        end = 0
        records = self.storage.records(name) if self.storage.exists(name) else iter(())
        while (found := self._next_record(name, records, end)) is not None:
            record, after = found
            event = self._decode(name, end, decode_event, record)
            try:
                state.apply(event)
            except Exception as error:  # it succeeded when it was journaled
                raise self._lost(name, end, f"replaying {type(event).__name__} failed: "
                                            f"{type(error).__name__}: {error}") from None
            end = after
            self.records += 1
        return end

    def _next_record(self, name: str, records: Iterator[tuple[bytes, int]],
                     end: int) -> tuple[bytes, int] | None:
        """The next record and the offset after it; None at the end or at a torn tail."""
        try:
            return next(records, None)
        except DataLossError as damage:
            if find_record(self.storage.read(name) or b"", end + 1) != -1:
                raise self._lost(name, end, f"damaged, with whole records after it ({damage})"
                                 ) from None
            log.warning("journal %s: cutting off a torn tail at offset %d: %s",
                        self.storage.where(name), end, damage)
            return None

    def _only_record(self, name: str) -> bytes:
        try:
            records = list(self.storage.records(name))
        except DataLossError as damage:
            raise self._lost(name, 0, str(damage)) from None
        if len(records) != 1:
            raise self._lost(name, 0, f"expected one record, found {len(records)}")
        return records[0][0]

    def _decode(self, name: str, offset: int, decode: Callable[[bytes], Any],
                record: bytes) -> Any:
        try:
            return decode(record)
        except ValueError as error:
            raise self._lost(name, offset, str(error)) from None

    def _lost(self, name: str, offset: int, reason: str) -> DataLossError:
        return DataLossError(
            f"journal file {self.storage.where(name)}, record at offset {offset}: {reason}; "
            f"the dispatcher cannot restore its state from it")

    def append(self, event: ev.Event, state: DispatcherState) -> None:
        """Make ``event`` (already applied to ``state``) durable; compact when due."""
        log_file = self._appender()
        log_file.write(encode_event(event))
        log_file.sync()
        self.records += 1
        if self.records >= self.compact_every:
            self.compact(state)

    def compact(self, state: DispatcherState) -> None:
        """Snapshot ``state`` and start an empty log. After an OSError the journal is as
        before, or already holds the snapshot (a later compaction starts from it)."""
        generation = self.generation + 1
        self.storage.replace("snapshot", [encode_snapshot(state, generation)])
        old, self.generation, self.records = f"log-{self.generation}", generation, 0
        with contextlib.suppress(OSError):  # what it did not write is in the snapshot
            self._log.close()
        self._log = None
        self.storage.remove(old)
        self._log = self.storage.appender(f"log-{generation}")

    def _appender(self) -> Any:
        """The log to append to (opened again if a compaction could not open it)."""
        if self._log is None:
            self._log = self.storage.appender(f"log-{self.generation}")
        return self._log

    def close(self) -> None:
        if self._log is not None:
            with contextlib.suppress(OSError):  # a full disk: the tail is torn, cut on replay
                self._log.close()
