"""A worker writes one stream of a distributed save: its pipeline over the splits the
dispatcher gives the stream, in chunks committed by renaming them into ``chunks/``.

A stream taken over after its worker was lost starts again from the first split (the dispatcher
replays the stream's splits; seeded alike, the pipeline makes the same elements in the same
order) and skips the elements of the chunks already committed: each element is written once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import cloudpickle

from convoy._base import fs as _fs
from convoy._values import nest
from convoy.data._core._op import Op, seeded
from convoy.data._persistence import _distributed_snapshot as layout
from convoy.data._persistence import _save
from convoy.data._sharding._split import SplitSupplier, read_splits
from convoy.data.tfrecord import TFRecordWriter
from convoy.errors import NotFoundError
from convoy.io import struct_pb2
from convoy.io._variant import encode_component

#: A chunk is committed once it holds this many elements, this many bytes, or is this old.
CHUNK_MAX_ELEMENTS = 4096
CHUNK_MAX_BYTES = 64 << 20
CHUNK_MAX_AGE_S = 1.0


def _component_specs(path: str) -> list[Any] | None:
    """The save's element spec, flattened, as its client wrote it into the metadata: a
    ragged row (an array) is written as a ragged value where its spec says so."""
    metadata = layout.read_metadata(path)
    if metadata is None:
        return None
    return nest.flatten(_save.decode_spec(struct_pb2.StructuredValue.FromString(
        metadata.element_spec)))


class StreamStopped(Exception):
    """The worker stops: the stream is left for another worker to take over."""


def write_stream(path: str, stream: int, dataset: bytes, compression: str, seed: int,
                 splits: SplitSupplier, stopped: Callable[[], bool], uid: str) -> None:
    """Writes stream ``stream`` of the save at ``path``; raises StreamStopped if
    ``stopped()`` turns true first."""
    committed = [(chunk, count) for s, chunk, count, _ in layout.committed_chunks(path)
                 if s == stream]
    next_chunk = max((chunk for chunk, _ in committed), default=-1) + 1
    skip = sum(count for _, count in committed)
    with seeded(seed):
        op: Op = cloudpickle.loads(dataset)
    op = read_splits(op, splits)
    scratch = os.path.join(layout.stream_directory(path, stream), "uncommitted_chunks")
    _fs.makedirs(scratch)
    _fs.makedirs(os.path.join(path, layout.CHUNKS_DIR))
    specs = _component_specs(path)
    chunk = _Chunk(scratch, next_chunk, compression or None, uid, specs)
    node = op.iterator(None, 0)
    try:
        for element in node.gen:
            if stopped():
                raise StreamStopped()
            if skip:
                skip -= 1
                continue
            chunk.write(element)
            if chunk.full():
                chunk.commit(path, stream)
                chunk = _Chunk(scratch, chunk.index + 1, compression or None, uid, specs)
        if chunk.count:
            chunk.commit(path, stream)
        else:
            chunk.discard()
    except BaseException:
        chunk.discard()
        raise
    finally:
        node.close()
    layout.mark(layout.stream_directory(path, stream), layout.DONE_FILE)


class _Chunk:
    def __init__(self, scratch: str, index: int, compression: str | None, uid: str,
                 specs: list[Any] | None) -> None:
        self.index = index
        self.specs = specs
        self.file = os.path.join(scratch, f"chunk_{index}.{uid}.tmp")
        self.writer = TFRecordWriter(self.file, compression)
        self.count = 0
        self.bytes = 0
        self.started = time.monotonic()

    def write(self, element: Any) -> None:
        components = nest.flatten(element)
        for component, spec in zip(components, self.specs or [None] * len(components)):
            record = encode_component(component, spec).SerializeToString()
            self.bytes += len(record)
            self.writer.write(record)
        self.count += 1

    def full(self) -> bool:
        return (self.count >= CHUNK_MAX_ELEMENTS or self.bytes >= CHUNK_MAX_BYTES
                or time.monotonic() - self.started >= CHUNK_MAX_AGE_S)

    def commit(self, path: str, stream: int) -> None:
        self.writer.close()
        _fs.rename(self.file, layout.chunk_path(path, stream, self.index, self.count))

    def discard(self) -> None:
        self.writer.close()
        try:
            _fs.remove(self.file)
        except (FileNotFoundError, NotFoundError):
            pass

