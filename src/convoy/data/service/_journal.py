"""The dispatcher's journal: its state changes, durable in ``work_dir``, replayed on restart.

Each state change is an event of :mod:`._dispatcher_state`; the journal appends it as one
TFRecord-framed record (length, CRC, data, CRC) and fsyncs before the dispatcher answers. On
restart the latest snapshot is loaded and the records after it are applied again; a torn or
corrupt tail (a crash mid-write) is detected by its CRCs, cut off, and never replayed.

Compaction keeps restart time flat: after ``compact_every`` records the whole state is written
as a snapshot (atomically: temporary file, fsync, rename) naming the next log generation, and
a fresh log starts. Files in the journal directory::

    snapshot        pickle of {"generation": g, "state": DispatcherState}
    log-<g>         the events applied after that snapshot
    id_base         where this dispatcher's ids start (drawn at random when the journal is
                    new, so a dispatcher started afresh never reuses an old one's ids)

All file access goes through :class:`Storage`, the seam where an object store could be added.
"""

from __future__ import annotations

import logging
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from convoy.data.service._dispatcher_state import DispatcherState, fresh_id_base
from convoy.data.tfrecord import TFRecordWriter, read_records
from convoy.errors import DataLossError

log = logging.getLogger(__name__)

#: Records per log generation before the state is snapshotted and a new log started.
COMPACT_EVERY = 10_000


class Storage(Protocol):
    """Where journal files live (a local directory here; an object store could implement it)."""

    def records(self, name: str) -> Iterator[tuple[bytes, int]]:
        """The valid records of file ``name`` with the offset after each; stops at a torn or
        corrupt tail."""

    def truncate(self, name: str, size: int) -> None: ...

    def appender(self, name: str) -> Any:
        """An object with ``write(bytes)``, ``sync()`` and ``close()``."""

    def read(self, name: str) -> bytes | None: ...

    def replace(self, name: str, data: bytes) -> None:
        """Write ``data`` as ``name`` atomically and durably."""

    def remove(self, name: str) -> None: ...


class LocalStorage:
    """Journal files in a local directory."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, name: str) -> Path:
        return self.directory / name

    def records(self, name: str) -> Iterator[tuple[bytes, int]]:
        if not self._path(name).exists():
            return
        try:
            yield from read_records(self._path(name))
        except DataLossError as error:
            log.warning("journal %s: dropping a torn or corrupt tail: %s", name, error)

    def truncate(self, name: str, size: int) -> None:
        path = self._path(name)
        if path.exists() and path.stat().st_size > size:
            with open(path, "r+b") as file:
                file.truncate(size)
                os.fsync(file.fileno())

    def appender(self, name: str) -> TFRecordWriter:
        return TFRecordWriter(self._path(name), append=True)

    def read(self, name: str) -> bytes | None:
        path = self._path(name)
        return path.read_bytes() if path.exists() else None

    def replace(self, name: str, data: bytes) -> None:
        temporary = self._path(name + ".tmp")
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
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
        """The state as of the last durable event; the journal is then ready to append."""
        state = DispatcherState(self._id_base())
        snapshot = self.storage.read("snapshot")
        if snapshot is not None:
            saved = pickle.loads(snapshot)
            state, self.generation = saved["state"], saved["generation"]
            # a crash in compact() may have left the previous log, all in the snapshot
            self.storage.remove(f"log-{self.generation - 1}")
        name = f"log-{self.generation}"
        valid_length = 0
        for record, offset in self.storage.records(name):
            valid_length = offset
            event = pickle.loads(record)
            try:
                state.apply(event)
            except Exception as error:  # it succeeded before; never fail a restart on it
                log.error("journal: replaying %s failed: %s", type(event).__name__, error)
            self.records += 1
        self.storage.truncate(name, valid_length)
        self._log = self.storage.appender(name)
        return state

    def _id_base(self) -> int:
        """The id base of this journal's dispatcher, drawn once when the journal is new."""
        stored = self.storage.read("id_base")
        if stored is not None:
            return int(stored)
        if self.storage.read("snapshot") is not None or next(
                iter(self.storage.records(f"log-{self.generation}")), None) is not None:
            return DispatcherState().next_id  # a journal from before id bases were kept
        base = self.new_id_base if self.new_id_base is not None else fresh_id_base()
        self.storage.replace("id_base", str(base).encode())
        return base

    def append(self, event: Any, state: DispatcherState) -> None:
        """Make ``event`` (already applied to ``state``) durable; compact when due."""
        self._log.write(pickle.dumps(event, protocol=pickle.HIGHEST_PROTOCOL))
        self._log.sync()
        self.records += 1
        if self.records >= self.compact_every:
            self.compact(state)

    def compact(self, state: DispatcherState) -> None:
        """Snapshot ``state`` and start an empty log."""
        old = f"log-{self.generation}"
        self.generation += 1
        self.storage.replace("snapshot", pickle.dumps(
            {"generation": self.generation, "state": state}, protocol=pickle.HIGHEST_PROTOCOL))
        self._log.close()
        self._log = self.storage.appender(f"log-{self.generation}")
        self.storage.remove(old)
        self.records = 0

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
