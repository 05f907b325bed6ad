"""Reading datasets on disk: what ``save`` wrote (:mod:`convoy.data._persistence._save`) and
what ``distributed_save`` wrote (:mod:`convoy.data._persistence._distributed_snapshot`), as
ops; ``load`` tells the two apart by the metadata file."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from convoy._base import fs as _fs
from convoy._values import nest
from convoy.data._core._op import AUTOTUNE, UNKNOWN_CARDINALITY, Node, Op, as_dataset, face
from convoy.data._persistence import _distributed_snapshot as layout
from convoy.data._persistence._save import (
    _GZIP_MAGIC,
    FILE_FORMAT_VERSION,
    check_compression,
    checkpoint_file,
    decode_spec,
    parse_metadata,
    read_metadata_bytes,
    read_spec,
)
from convoy.data._sources._basic import IndexSource
from convoy.data.tfrecord import read_records
from convoy.errors import (
    DataLossError,
    DeadlineExceededError,
    InvalidArgumentError,
    NotFoundError,
    UnimplementedError,
)
from convoy.io import snapshot_pb2, struct_pb2, tensor_pb2
from convoy.io._tensor import STRING, dtype_name, enum_dtype, from_proto
from convoy.io._variant import COMPOSITE_SPECS, component_dtype_enum, decode_component


# ----- reading ---------------------------------------------------------------------------------
def _leaf(array: np.ndarray) -> Any:
    """A component as convoy's elements hold it: scalars as numpy scalars (bytes for
    strings), everything else as an array."""
    if array.ndim:
        return array
    return array.item() if array.dtype == STRING else array[()]


class ShardReaderOp(Op):
    """The elements in one shard directory: its checkpoint files in order, each element
    ``n`` consecutive records (one per component) packed into ``structure``."""

    def __init__(self, shard_dir: str, compression: str | None, structure: Any) -> None:
        self.shard_dir = shard_dir
        self.compression = compression
        self.structure = structure

    def static_spec(self) -> Any:
        return self.structure

    def iterator(self, state: Any, key: int) -> Node:
        return _ShardReaderNode(self, *(state or (0, 0)))


class _ShardReaderNode(Node):
    __slots__ = ("checkpoint", "offset")

    def __init__(self, op: ShardReaderOp, checkpoint: int, offset: int) -> None:
        self.checkpoint = checkpoint
        self.offset = offset
        self.gen = self._run(op)

    def _run(self, op: ShardReaderOp) -> Iterator[Any]:
        while _fs.exists(path := checkpoint_file(op.shard_dir, self.checkpoint)):
            for element, offset in read_elements(path, op.compression, op.structure,
                                                 self.offset):
                self.offset = offset
                yield element
            self.checkpoint += 1
            self.offset = 0

    def state_dict(self) -> Any:
        return (self.checkpoint, self.offset)


def read_elements(path: str, compression: str | None, structure: Any,
                  offset: int = 0) -> Iterator[tuple[Any, int]]:
    """``(element, offset after it)`` for each element of one file: ``n`` consecutive
    TensorProto records (one per component) packed into ``structure``."""
    _check_not_gzip(path, compression)
    specs = nest.flatten(structure)
    width = len(specs)
    parse = tensor_pb2.TensorProto.FromString
    components: list[Any] = []
    for record, after in read_records(path, compression, offset):
        try:
            spec = specs[len(components)]
            components.append(decode_component(parse(record), spec)
                              if isinstance(spec, COMPOSITE_SPECS)
                              else _leaf(from_proto(parse(record))))
        except DecodeError:
            raise DataLossError(f"a record of {path} is not a TensorProto") from None
        if len(components) == width:
            yield nest.pack_sequence_as(structure, components), after
            components = []
    if components:
        raise DataLossError(
            f"{path} ends inside an element ({len(components)} of {width} components)")


def _check_not_gzip(path: str, compression: str | None) -> None:
    if compression is None:
        with _fs.open_file(path, "rb") as file:
            if file.read(2) == _GZIP_MAGIC:
                raise InvalidArgumentError(
                    f"{path} is GZIP-compressed: pass compression='GZIP' to read it")


class ShardsOp(IndexSource):
    """A dataset of datasets: one reading each shard directory, in name order."""

    def __init__(self, shard_dirs: list[str], compression: str | None, structure: Any) -> None:
        self.shard_dirs = shard_dirs
        self.compression = compression
        self.structure = structure

    def num_elements(self) -> int:
        return len(self.shard_dirs)

    def element_at(self, index: int) -> Any:
        return as_dataset(ShardReaderOp(self.shard_dirs[index], self.compression, self.structure))


def default_reader_func(datasets: Any) -> Any:
    """TensorFlow's default: the shards interleaved, one element from each in turn."""
    return datasets.interleave(lambda shard: shard, cycle_length=os.cpu_count() or 1,
                               num_parallel_calls=AUTOTUNE)


def reader_op(run_dir: str, compression: str | None, structure: Any,
              reader_func: Callable[[Any], Any] | None) -> Op:
    """The op of ``reader_func`` applied to the dataset of the run's shard datasets."""
    shard_dirs = _fs.glob_below(run_dir, "*.shard")
    result = (reader_func or default_reader_func)(
        as_dataset(ShardsOp(shard_dirs, compression, structure)))
    if not isinstance(result, face()):
        raise InvalidArgumentError(
            f"reader_func must return a Dataset, got {type(result).__name__}")
    return result._op


class LoadOp(Op):
    """A saved dataset: ``reader_func`` over its shards; known spec and cardinality."""

    def __init__(self, path: str, spec: Any, compression: str | None,
                 reader_func: Callable[[Any], Any] | None,
                 metadata: snapshot_pb2.SnapshotMetadataRecord) -> None:
        self.path = path
        self.spec = spec
        self.num_elements = metadata.num_elements if metadata.finalized else UNKNOWN_CARDINALITY
        self.reader = reader_op(os.path.join(path, metadata.run_id), compression, spec,
                                reader_func)

    def cardinality(self) -> int:
        return self.num_elements

    def static_spec(self) -> Any:
        return self.spec

    def iterator(self, state: Any, key: int) -> Node:
        return self.reader.iterator(state, key)


def load(path: Any, element_spec: Any = None, compression: Any = None,
         reader_func: Callable[[Any], Any] | None = None, wait: bool = False) -> Op:
    """The op reading the dataset saved under ``path``."""
    directory = os.fspath(path)
    if reader_func is not None and not callable(reader_func):
        raise InvalidArgumentError(f"reader_func must be callable, got {reader_func!r}")
    # The file is read once and its kind decided from those bytes: a save may write it
    # between two reads.
    started = time.monotonic()
    while (data := read_metadata_bytes(directory)) is None and wait:
        if time.monotonic() - started > layout.STALL_TIMEOUT_S:
            raise DeadlineExceededError(
                f"load(wait=True) waited {layout.STALL_TIMEOUT_S:.0f} s for a save to "
                f"write its metadata to {directory}: was the save started at this path?")
        time.sleep(layout.POLL_INTERVAL_S)
    metadata = None
    if data is not None:
        written = layout.parse_metadata(data)
        if written is not None:  # what distributed_save writes
            return load_distributed(directory, written, element_spec, compression,
                                    reader_func)
        metadata = parse_metadata(data, directory)
    compression = check_compression(compression)
    if metadata is None:
        raise NotFoundError(f"Could not find metadata file [{directory}]")
    if metadata.version != FILE_FORMAT_VERSION:
        raise UnimplementedError(
            f"{directory} holds snapshot file format version {metadata.version}; only "
            f"version {FILE_FORMAT_VERSION} (what Dataset.save writes) is supported")
    spec = read_spec(directory) if element_spec is None else element_spec
    _check_spec(spec, metadata, directory)
    return LoadOp(directory, spec, compression, reader_func, metadata)


def _check_spec(spec: Any, metadata: snapshot_pb2.SnapshotMetadataRecord, path: str) -> None:
    leaves = nest.flatten(spec)
    for leaf in leaves:
        if not isinstance(leaf, (nest.TensorSpec, *COMPOSITE_SPECS)):
            raise InvalidArgumentError(
                f"element_spec must be a structure of TensorSpec, SparseTensorSpec and "
                f"RaggedTensorSpec, found {leaf!r}")
    saved = list(metadata.dtype)
    given = [component_dtype_enum(leaf) for leaf in leaves]
    if metadata.dtype and saved != given:
        raise InvalidArgumentError(
            f"element_spec has dtypes {[_enum_name(d) for d in given]} but the dataset saved "
            f"at {path} has {[_enum_name(d) for d in saved]}")


def _enum_name(value: int) -> str:
    """A component's DataType as named in errors (variant: a sparse or ragged component)."""
    return "variant" if value == tensor_pb2.DT_VARIANT else dtype_name(enum_dtype(value))


# ----- reading a distributed save -----------------------------------------------------------
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
        for element, offset in read_elements(op.file, op.compression, op.structure,
                                                   self.offset):
            self.offset = offset
            yield element

    def state_dict(self) -> Any:
        return self.offset


def _chunk_dataset(file: str, compression: str | None, structure: Any) -> Any:
    return as_dataset(_ChunkOp(file, compression, structure))


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
            done = layout.is_done(op.path)  # before listing: chunks listed after it are all there
            reason = layout.error(op.path)
            if reason is not None:
                raise DataLossError(f"the distributed save at {op.path} failed: the save job "
                                    f"failed to write it ({reason})")
            for _, _, _, file in layout.committed_chunks(op.path):
                name = os.path.basename(file)
                if name not in seen:
                    seen.add(name)
                    self.read.append(name)
                    progressed = time.monotonic()
                    yield _chunk_dataset(file, op.compression, op.structure)
            if done:
                return
            if time.monotonic() - progressed > layout.STALL_TIMEOUT_S:
                raise DeadlineExceededError(
                    f"waited {layout.STALL_TIMEOUT_S:.0f} s for the distributed save at "
                    f"{op.path} to commit a chunk or to be marked {layout.DONE_FILE} "
                    f"({len(seen)} chunks read): "
                    "is a data service worker writing it? A dispatcher restarted without "
                    "fault_tolerant_mode forgets the saves it had in progress")
            time.sleep(layout.POLL_INTERVAL_S)

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


def load_distributed(path: str, metadata: snapshot_pb2.DistributedSnapshotMetadata,
                     element_spec: Any, compression: Any,
                     reader_func: Callable[[Any], Any] | None) -> Op:
    """The op reading the distributed save under ``path`` (one in progress: its chunks as
    they are committed, until it is done)."""
    saved = struct_pb2.StructuredValue.FromString(metadata.element_spec)
    spec = decode_spec(saved)
    if element_spec is not None and element_spec != spec:
        raise InvalidArgumentError(
            f"User specified element_spec {element_spec}, but the actual element_spec is "
            f"{spec!r}")
    if compression is not None and (compression or None) != (metadata.compression or None):
        raise InvalidArgumentError(
            f"User specified compression {compression}, but the actual compression is "
            f"{metadata.compression or None}.")
    reason = layout.error(path)
    if reason is not None:
        raise InvalidArgumentError(f"the distributed save at {path} failed: the save job "
                                   f"failed to write it ({reason})")
    used = check_compression(metadata.compression)
    structure = spec
    if layout.is_done(path):
        chunks = layout.committed_chunks(path)
        source: Op = _DoneChunksOp([file for *_, file in chunks], used, structure)
        cardinality = sum(count for _, _, count, _ in chunks)
    else:
        source, cardinality = GrowingChunksOp(path, used, structure), UNKNOWN_CARDINALITY
    result = (reader_func or default_reader_func)(as_dataset(source))
    if not isinstance(result, face()):
        raise InvalidArgumentError(
            f"reader_func must return a Dataset, got {type(result).__name__}")
    return _LoadOp(spec, cardinality, result._op)
