"""distributed_save's bookkeeping: which worker writes which stream, and the splits of each.

Pure state, part of :class:`~.state.DispatcherState` (changed by its save events, journaled
with it). A save has streams, one per worker that asks while the save is young; each stream
gets its splits from the save's cursor, and every answer is kept with its stream by request
number, so a stream taken over by another worker (its own was lost), or asked again after the
dispatcher restarted, replays the same splits and its pipeline makes the same elements. Workers
do all the writing; this only hands out streams and splits and notes which streams are done.
"""

from __future__ import annotations

from collections.abc import Container

from convoy.data.service._dispatcher.events import SaveAnswer, SaveRecord, SaveStream
from convoy.data.service._dispatcher.splits import MAX_SPLIT_SIZE, SPLITS_PER_PASS
from convoy.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError


class Snapshots:
    """The saves of ``distributed_save`` the dispatcher knows, by path."""

    def __init__(self) -> None:
        self.saves: dict[str, SaveRecord] = {}

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
        self.saves[path] = SaveRecord(path, dataset_id, compression, units, seed, size)

    def pick_stream(self, address: str, uid: str, live: Container[tuple[str, str]]
                    ) -> tuple[str, int] | None:
        """``(path, index)`` of a stream for the worker ``(address, uid)`` to write: its own
        unfinished one (a worker asks when it writes none: the answer that gave it was lost),
        else one whose worker is no longer ``live``, else a new one (``index`` is the save's
        stream count) while the save has no finished stream; None if none. Changes nothing."""
        saves = [save for save in self.saves.values() if not (save.done or save.error)]
        for save in saves:
            for stream in save.streams:
                if not stream.done and (stream.owner, stream.owner_uid) == (address, uid):
                    return save.path, stream.index
        for save in saves:
            for stream in save.streams:
                if not stream.done and (stream.owner, stream.owner_uid) not in live:
                    return save.path, stream.index
            if not any(s.done for s in save.streams):
                return save.path, len(save.streams)
        return None

    def assign(self, path: str, index: int, address: str, uid: str) -> SaveRecord:
        save = self._save(path)
        if index == len(save.streams):
            save.streams.append(SaveStream(index, address, uid))
        elif 0 <= index < len(save.streams):
            save.streams[index].owner, save.streams[index].owner_uid = address, uid
        else:
            raise InvalidArgumentError(f"the save at {path} has no stream {index}")
        return save

    def answered(self, path: str, index: int, number: int) -> bool:
        """Whether request ``number`` of stream ``index`` has its answer already."""
        save = self.saves.get(path)
        return (save is not None and 0 <= index < len(save.streams)
                and number <= len(save.streams[index].answers))

    def split(self, path: str, index: int, address: str, repetition: int, number: int
              ) -> tuple[tuple[int, int] | None, bool]:
        """The answer to request ``number`` of stream ``index``: a split, or the end of the
        pass (``(None, True)``)."""
        stream = self._stream(path, index, address)
        save = self.saves[path]
        if number <= len(stream.answers):
            answer = stream.answers[number - 1]
            if answer.repetition != repetition:
                raise InvalidArgumentError(
                    f"split request {number} of stream {index} was for repetition "
                    f"{answer.repetition}, not {repetition}")
        elif number != len(stream.answers) + 1:
            raise InvalidArgumentError(
                f"split request {number} of stream {index} skips a number: "
                f"{len(stream.answers)} were answered")
        else:
            if repetition > save.repetition:
                save.repetition, save.cursor = repetition, 0
            answer = SaveAnswer(repetition, end_of_splits=True)
            if repetition == save.repetition and save.cursor < save.units:
                start = save.cursor
                save.cursor = min(save.units, start + save.split_size)
                answer = SaveAnswer(repetition, start, save.cursor)
            stream.answers.append(answer)
        if answer.end_of_splits:
            return None, True
        return (answer.start, answer.stop), False

    def stream_done(self, path: str, index: int, address: str, error: str) -> bool:
        """Stream ``index`` wrote all its elements (or failed); whether the save is done."""
        stream = self._stream(path, index, address)
        save = self.saves[path]
        stream.done = True
        if error and not save.error:
            save.error = error
        return save.done and not save.error

    def _save(self, path: str) -> SaveRecord:
        save = self.saves.get(path)
        if save is None:
            raise NotFoundError(f"no distributed save in progress at {path}")
        return save

    def _stream(self, path: str, index: int, address: str) -> SaveStream:
        save = self._save(path)
        if not 0 <= index < len(save.streams):
            raise InvalidArgumentError(f"the save at {path} has no stream {index}")
        stream = save.streams[index]
        if stream.owner != address:
            raise InvalidArgumentError(
                f"stream {index} of the save at {path} is written by {stream.owner or 'nobody'}"
                f", not {address}")
        return stream
