"""distributed_save's bookkeeping: which worker writes which stream, and the splits of each.

Pure state, beside :class:`~.state.DispatcherState` (the dispatch server holds it under the
same lock). A save has streams, one per worker that asks while the save is young; each stream
gets its splits from the save's cursor, and every answer is kept with its stream by request
number, so a stream taken over by another worker (its own was lost) replays the same splits
and its pipeline makes the same elements. Workers do all the writing; this only hands out
streams and splits and notes which streams are done.

Saves in progress are not journaled: a dispatcher that restarts forgets them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container

from convoy.data.service._dispatcher.splits import MAX_SPLIT_SIZE, SPLITS_PER_PASS
from convoy.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError


@dataclasses.dataclass
class Stream:
    index: int
    owner: str  # worker address; "" when its worker was lost
    owner_uid: str
    answers: list[tuple[int, tuple[int, int] | None]] = dataclasses.field(default_factory=list)
    done: bool = False


@dataclasses.dataclass
class Save:
    path: str
    dataset_id: str
    compression: str
    units: int
    seed: int
    split_size: int
    streams: list[Stream] = dataclasses.field(default_factory=list)
    repetition: int = 0
    cursor: int = 0
    error: str = ""

    @property
    def done(self) -> bool:
        return bool(self.streams) and all(s.done for s in self.streams)


class Snapshots:
    """The saves of ``distributed_save`` the dispatcher knows, by path."""

    def __init__(self) -> None:
        self.saves: dict[str, Save] = {}

    def start(self, path: str, dataset_id: str, compression: str, units: int,
              seed: int) -> None:
        if path in self.saves:
            raise AlreadyExistsError(
                f"Failed to snapshot: the distributed save at {path} has already started or "
                "completed")
        if units < 0:
            raise InvalidArgumentError(
                f"Failed to snapshot: dataset {dataset_id} cannot be split into units")
        size = max(1, min(MAX_SPLIT_SIZE, units // SPLITS_PER_PASS))
        self.saves[path] = Save(path, dataset_id, compression, units, seed, size)

    def stream_for(self, address: str, uid: str, live: Container[tuple[str, str]]
                   ) -> tuple[Save, Stream] | None:
        """A stream for the worker ``(address, uid)`` to write: one whose worker is no longer
        ``live``, else a new one while the save has no finished stream; None if none."""
        for save in self.saves.values():
            if save.done or save.error:
                continue
            for stream in save.streams:
                if not stream.done and (stream.owner, stream.owner_uid) not in live:
                    stream.owner, stream.owner_uid = address, uid
                    return save, stream
            if any(s.owner == address and s.owner_uid == uid and not s.done
                   for s in save.streams) or any(s.done for s in save.streams):
                continue
            stream = Stream(len(save.streams), address, uid)
            save.streams.append(stream)
            return save, stream
        return None

    def split(self, path: str, index: int, address: str, repetition: int, number: int
              ) -> tuple[tuple[int, int] | None, bool]:
        """The answer to request ``number`` of stream ``index``: a split, or the end of the
        pass (``(None, True)``)."""
        stream = self._stream(path, index, address)
        save = self.saves[path]
        if number <= len(stream.answers):
            asked, given = stream.answers[number - 1]
            if asked != repetition:
                raise InvalidArgumentError(
                    f"split request {number} of stream {index} was for repetition {asked}, "
                    f"not {repetition}")
            return given, given is None
        if number != len(stream.answers) + 1:
            raise InvalidArgumentError(
                f"split request {number} of stream {index} skips a number: "
                f"{len(stream.answers)} were answered")
        split: tuple[int, int] | None = None
        if repetition > save.repetition:
            save.repetition, save.cursor = repetition, 0
        if repetition == save.repetition and save.cursor < save.units:
            start = save.cursor
            save.cursor = min(save.units, start + save.split_size)
            split = (start, save.cursor)
        stream.answers.append((repetition, split))
        return split, split is None

    def stream_done(self, path: str, index: int, address: str, error: str) -> bool:
        """Stream ``index`` wrote all its elements (or failed); whether the save is done."""
        stream = self._stream(path, index, address)
        save = self.saves[path]
        stream.done = True
        if error and not save.error:
            save.error = error
        return save.done and not save.error

    def _stream(self, path: str, index: int, address: str) -> Stream:
        save = self.saves.get(path)
        if save is None:
            raise NotFoundError(f"no distributed save in progress at {path}")
        if not 0 <= index < len(save.streams):
            raise InvalidArgumentError(f"the save at {path} has no stream {index}")
        stream = save.streams[index]
        if stream.owner != address:
            raise InvalidArgumentError(
                f"stream {index} of the save at {path} is written by {stream.owner or 'nobody'}"
                f", not {address}")
        return stream
