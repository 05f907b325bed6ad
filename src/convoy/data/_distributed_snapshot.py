"""The on-disk layout of ``distributed_save`` (TensorFlow's distributed snapshot), and reading it.

A distributed save is a directory::

    snapshot.metadata       a DistributedSnapshotMetadata in text format (spec, compression)
    dataset_spec.pb         the element spec as a StructuredValue
    chunks/chunk_<stream>_<chunk>_<num_elements>
                            committed chunks: files in the format of :mod:`convoy.data._save`
                            (TFRecord framing, one TensorProto record per component)
    streams/stream_<stream>/uncommitted_chunks/   chunks being written
    streams/stream_<stream>/DONE                  the stream has written all its elements
    DONE                    every stream is done: the save is complete
    ERROR                   the save failed (the text says why)

which is what ``tf.data.experimental.distributed_save`` writes and ``tf.data.Dataset.load``
reads. A chunk is committed by renaming it into ``chunks/``: its name says how many elements
it holds, so a stream taken over after its worker was lost knows how far it got.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

from google.protobuf import text_format

from convoy._base import fs as _fs
from convoy.data import _save
from convoy.data._op import UNKNOWN_CARDINALITY, Node, Op
from convoy.data._sources import IndexSource
from convoy.errors import (
    DataLossError,
    DeadlineExceededError,
    InvalidArgumentError,
    NotFoundError,
)
from convoy.io import snapshot_pb2, struct_pb2

CHUNKS_DIR = "chunks"
STREAMS_DIR = "streams"
DONE_FILE = "DONE"
ERROR_FILE = "ERROR"
_CHUNK = re.compile(r"chunk_(\d+)_(\d+)_(\d+)")
#: How often a reading of a save in progress looks for new chunks.
POLL_INTERVAL_S = 0.2
#: How long ``load(wait=True)`` waits for a save in progress to commit its next chunk or finish.
#: Workers commit a chunk each second while they write, so a longer silence means no one is
#: writing (no worker, or a dispatcher restarted without a journal, which forgot the save).
STALL_TIMEOUT_S = 600.0


# ----- layout ------------------------------------------------------------------------------------
def stream_directory(path: str, stream: int) -> str:
    return os.path.join(path, STREAMS_DIR, f"stream_{stream}")


def chunk_path(path: str, stream: int, chunk: int, num_elements: int) -> str:
    return os.path.join(path, CHUNKS_DIR, f"chunk_{stream}_{chunk}_{num_elements}")


def committed_chunks(path: str) -> list[tuple[int, int, int, str]]:
    """``(stream, chunk, num_elements, file)`` of every committed chunk, in stream and chunk
    order."""
    try:
        names = _fs.listdir(os.path.join(path, CHUNKS_DIR))
    except (FileNotFoundError, NotFoundError):
        return []
    found = []
    for name in names:
        match = _CHUNK.fullmatch(name)
        if match is not None:
            stream, chunk, count = map(int, match.groups())
            found.append((stream, chunk, count, os.path.join(path, CHUNKS_DIR, name)))
    return sorted(found)


def is_done(path: str) -> bool:
    return _fs.exists(os.path.join(path, DONE_FILE))


def error(path: str) -> str | None:
    """Why the save failed, or None."""
    try:
        data = _fs.read_bytes(os.path.join(path, ERROR_FILE))
    except (FileNotFoundError, NotFoundError):
        return None
    return data.decode("utf-8", errors="replace") or "unknown error"


def mark(path: str, name: str, text: str = "") -> None:
    """Writes the marker file ``name`` (DONE, ERROR) under ``path``, atomically."""
    _fs.makedirs(path)
    _save._write_atomically(os.path.join(path, name), text.encode())


# ----- metadata ----------------------------------------------------------------------------------
def write_metadata(path: str, spec: Any, compression: str | None) -> None:
    """``snapshot.metadata`` (text format, as TensorFlow writes it) and ``dataset_spec.pb``."""
    record = snapshot_pb2.DistributedSnapshotMetadata(
        element_spec=_save.encode_spec(spec).SerializeToString(), compression=compression or "")
    _save._write_atomically(os.path.join(path, _save.METADATA_FILE),
                            text_format.MessageToString(record).encode())
    _save.write_spec(path, spec)


def read_metadata(path: str) -> snapshot_pb2.DistributedSnapshotMetadata | None:
    """The metadata of a distributed save under ``path``; None if there is none (or the
    metadata is ``save``'s binary record)."""
    data = _save.read_metadata_bytes(path)
    return None if data is None else parse_metadata(data)


def parse_metadata(data: bytes) -> snapshot_pb2.DistributedSnapshotMetadata | None:
    """``data`` as a distributed save's metadata; None if it is not one."""
    try:
        return text_format.Parse(data.decode(), snapshot_pb2.DistributedSnapshotMetadata())
    except (UnicodeDecodeError, text_format.ParseError):
        return None


# ----- reading -----------------------------------------------------------------------------------
class _ChunkOp(Op):
    """The elements of one chunk file."""

    def __init__(self, file: str, compression: str | None, structure: Any) -> None:
        self.file = file
        self.compression = compression
        self.structure = structure

    def static_spec(self) -> Any:
        return self.structure

    def iterator(self, state: Any, key: int) -> Node:
        return _ChunkNode(self, state or 0)


class _ChunkNode(Node):
    __slots__ = ("offset",)

    def __init__(self, op: _ChunkOp, offset: int) -> None:
        self.offset = offset
        self.gen = self._run(op)

    def _run(self, op: _ChunkOp) -> Iterator[Any]:
        for element, offset in _save.read_elements(op.file, op.compression, op.structure,
                                                   self.offset):
            self.offset = offset
            yield element

    def state_dict(self) -> Any:
        return self.offset


def _chunk_dataset(file: str, compression: str | None, structure: Any) -> Any:
    from convoy.data._dataset import Dataset

    return Dataset(_ChunkOp(file, compression, structure))


class _DoneChunksOp(IndexSource):
    """A dataset of datasets: one reading each chunk of a complete save."""

    def __init__(self, files: list[str], compression: str | None, structure: Any) -> None:
        self.files = files
        self.compression = compression
        self.structure = structure

    def num_elements(self) -> int:
        return len(self.files)

    def element_at(self, index: int) -> Any:
        return _chunk_dataset(self.files[index], self.compression, self.structure)


class GrowingChunksOp(Op):
    """A dataset of datasets over a save in progress: each chunk as it is committed, until
    the save is done."""

    def __init__(self, path: str, compression: str | None, structure: Any) -> None:
        self.path = path
        self.compression = compression
        self.structure = structure

    def cardinality(self) -> int:
        return UNKNOWN_CARDINALITY

    def iterator(self, state: Any, key: int) -> Node:
        return _GrowingChunksNode(self, list(state or ()))


class _GrowingChunksNode(Node):
    __slots__ = ("read",)

    def __init__(self, op: GrowingChunksOp, read: list[str]) -> None:
        self.read = read
        self.gen = self._run(op)

    def _run(self, op: GrowingChunksOp) -> Iterator[Any]:
        seen = set(self.read)
        progressed = time.monotonic()
        while True:
            done = is_done(op.path)  # before listing: chunks listed after it are all there
            reason = error(op.path)
            if reason is not None:
                raise DataLossError(f"the distributed save at {op.path} failed: the save job "
                                    f"failed to write it ({reason})")
            for _, _, _, file in committed_chunks(op.path):
                name = os.path.basename(file)
                if name not in seen:
                    seen.add(name)
                    self.read.append(name)
                    progressed = time.monotonic()
                    yield _chunk_dataset(file, op.compression, op.structure)
            if done:
                return
            if time.monotonic() - progressed > STALL_TIMEOUT_S:
                raise DeadlineExceededError(
                    f"waited {STALL_TIMEOUT_S:.0f} s for the distributed save at {op.path} to "
                    f"commit a chunk or to be marked {DONE_FILE} ({len(seen)} chunks read): "
                    "is a data service worker writing it? A dispatcher restarted without "
                    "fault_tolerant_mode forgets the saves it had in progress")
            time.sleep(POLL_INTERVAL_S)

    def state_dict(self) -> Any:
        return list(self.read)


class _LoadOp(Op):
    """The reader over the save's chunks, with the save's spec and cardinality. The reader is
    its input, so DYNAMIC sharding hands out the chunks of a complete save (as TensorFlow's
    split provider does)."""

    def __init__(self, spec: Any, cardinality: int, reader: Op) -> None:
        self.spec = spec
        self.num_elements = cardinality
        self.inputs = (reader,)

    def cardinality(self) -> int:
        return self.num_elements

    def static_spec(self) -> Any:
        return self.spec

    def iterator(self, state: Any, key: int) -> Node:
        return self.input.iterator(state, key)


def load(path: str, metadata: snapshot_pb2.DistributedSnapshotMetadata, element_spec: Any,
         compression: Any, reader_func: Callable[[Any], Any] | None) -> Op:
    """The op reading the distributed save under ``path`` (one in progress: its chunks as
    they are committed, until it is done)."""
    from convoy.data._dataset import Dataset

    saved = struct_pb2.StructuredValue.FromString(metadata.element_spec)
    spec = _save.decode_spec(saved)
    if element_spec is not None and element_spec != spec:
        raise InvalidArgumentError(
            f"User specified element_spec {element_spec}, but the actual element_spec is "
            f"{spec!r}")
    if compression is not None and (compression or None) != (metadata.compression or None):
        raise InvalidArgumentError(
            f"User specified compression {compression}, but the actual compression is "
            f"{metadata.compression or None}.")
    reason = error(path)
    if reason is not None:
        raise InvalidArgumentError(f"the distributed save at {path} failed: the save job "
                                   f"failed to write it ({reason})")
    used = _save.check_compression(metadata.compression)
    structure = spec
    if is_done(path):
        chunks = committed_chunks(path)
        source: Op = _DoneChunksOp([file for *_, file in chunks], used, structure)
        cardinality = sum(count for _, _, count, _ in chunks)
    else:
        source, cardinality = GrowingChunksOp(path, used, structure), UNKNOWN_CARDINALITY
    result = (reader_func or _save.default_reader_func)(Dataset(source))
    if not isinstance(result, Dataset):
        raise InvalidArgumentError(
            f"reader_func must return a Dataset, got {type(result).__name__}")
    return _LoadOp(spec, cardinality, result._op)
