"""The on-disk layout of ``distributed_save`` (TensorFlow's distributed snapshot), and reading it.

A distributed save is a directory::

    snapshot.metadata       a DistributedSnapshotMetadata in text format (spec, compression)
    dataset_spec.pb         the element spec as a StructuredValue
    chunks/chunk_<stream>_<chunk>_<num_elements>
                            committed chunks: files in the format of
                            :mod:`convoy.data._persistence._save` (TFRecord framing, one
                            TensorProto record per component)
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
from typing import Any

from google.protobuf import text_format

from convoy._base import fs as _fs
from convoy.data._persistence import _save
from convoy.errors import (
    NotFoundError,
)
from convoy.io import snapshot_pb2

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
