"""save and load: datasets on disk in TensorFlow's format, readable by either side.

A saved dataset is a directory::

    snapshot.metadata                       a SnapshotMetadataRecord (run id, dtypes, count)
    dataset_spec.pb                         the element spec as a StructuredValue
    <run_id>/<shard:08d>.shard/<checkpoint:08d>.snapshot
                                            TFRecord files (GZIP: the whole file), one record
                                            per component of each element, each a TensorProto

which is what ``tf.data.Dataset.save`` (file format version 2) writes and ``load`` reads.
"""

from __future__ import annotations

import collections
import os
import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from convoy._base import fs as _fs
from convoy._values import nest
from convoy._values.tensors import RaggedTensor
from convoy.data._core._op import (
    Op,
    derived_spec,
    element_caller,
    through_passing,
)
from convoy.data._ops._batch import BatchOp
from convoy.data.tfrecord import TFRecordWriter
from convoy.errors import (
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    UnimplementedError,
)
from convoy.io import snapshot_pb2, struct_pb2, tensor_pb2
from convoy.io._tensor import dtype_enum, enum_dtype
from convoy.io._variant import (
    COMPOSITE_SPECS,
    component_dtype_enum,
    encode_component,
)

METADATA_FILE = "snapshot.metadata"
SPEC_FILE = "dataset_spec.pb"
FILE_FORMAT_VERSION = 2
_GZIP_MAGIC = b"\x1f\x8b"


# ----- arguments -------------------------------------------------------------------------------
def check_compression(compression: Any, argument: str = "compression") -> str | None:
    """``compression`` as the TFRecord reader/writer takes it: None (none), ``"GZIP"`` or
    ``"SNAPPY"`` (TensorFlow's snappy block framing)."""
    if compression in (None, ""):
        return None
    if compression in ("GZIP", "SNAPPY"):
        return str(compression)
    raise InvalidArgumentError(
        f"{argument} must be None, '', 'GZIP' or 'SNAPPY', got {compression!r}")


def shard_index(shard_func: Callable[..., Any], element: Any) -> int:
    """The shard ``shard_func`` gives ``element``: a scalar integer."""
    value = element_caller(shard_func)(element)
    array = np.asarray(value)
    if array.shape != () or array.dtype.kind not in "iu":
        raise InvalidArgumentError(
            f"`shard_func` must return a scalar int64, got {value!r}")
    return int(array) & 0xFFFFFFFFFFFFFFFF  # TensorFlow prints the index as unsigned


# ----- element spec <-> StructuredValue -----------------------------------------------------
def encode_spec(spec: Any) -> struct_pb2.StructuredValue:
    """The StructuredValue of a structure of :class:`TensorSpec`, :class:`SparseTensorSpec`
    and :class:`RaggedTensorSpec` (TensorFlow's encoding)."""
    value = struct_pb2.StructuredValue()
    if isinstance(spec, nest.TensorSpec):
        proto = value.tensor_spec_value
        proto.name = spec.name or ""
        proto.dtype = dtype_enum(spec.dtype)
        _encode_shape(proto.shape, spec.shape)
    elif isinstance(spec, COMPOSITE_SPECS):
        _encode_type_spec(value.type_spec_value, spec)
    elif isinstance(spec, dict):
        value.dict_value.SetInParent()
        for key, child in spec.items():
            value.dict_value.fields[str(key)].CopyFrom(encode_spec(child))
    elif isinstance(spec, tuple) and hasattr(type(spec), "_fields"):
        value.named_tuple_value.name = type(spec).__name__
        for key in spec._fields:  # type: ignore[attr-defined]
            value.named_tuple_value.values.add(key=key, value=encode_spec(getattr(spec, key)))
    elif isinstance(spec, (tuple, list)):
        holder = value.tuple_value if isinstance(spec, tuple) else value.list_value
        holder.SetInParent()
        for child in spec:
            holder.values.add().CopyFrom(encode_spec(child))
    else:
        raise InvalidArgumentError(f"element_spec must be a structure of TensorSpec, "
                                   f"SparseTensorSpec and RaggedTensorSpec, found {spec!r}")
    return value


# TensorFlow's TypeSpecProto.TypeSpecClass of the composites convoy carries
_SPARSE_TENSOR_SPEC, _RAGGED_TENSOR_SPEC = 1, 3


def _encode_shape(proto: tensor_pb2.TensorShapeProto, shape: Any) -> None:
    proto.SetInParent()
    if shape is None:
        proto.unknown_rank = True
    else:
        for size in shape:
            proto.dim.add(size=-1 if size is None else size)


def _decode_shape(proto: tensor_pb2.TensorShapeProto) -> list[int | None] | None:
    return None if proto.unknown_rank else [None if d.size < 0 else d.size for d in proto.dim]


def _encode_type_spec(proto: struct_pb2.TypeSpecProto, spec: Any) -> None:
    """A SparseTensorSpec or RaggedTensorSpec as TensorFlow writes it: its class, and its
    arguments as a tuple (shape, dtype[, ragged_rank, row_splits_dtype])."""
    state = proto.type_state.tuple_value
    _encode_shape(state.values.add().tensor_shape_value, spec.shape)
    state.values.add().tensor_dtype_value = dtype_enum(spec.dtype)
    if isinstance(spec, nest.SparseTensorSpec):
        proto.type_spec_class, proto.type_spec_class_name = _SPARSE_TENSOR_SPEC, "SparseTensorSpec"
        proto.num_flat_components = 3
    else:
        state.values.add().int64_value = spec.ragged_rank
        state.values.add().tensor_dtype_value = dtype_enum(spec.row_splits_dtype)
        proto.type_spec_class, proto.type_spec_class_name = _RAGGED_TENSOR_SPEC, "RaggedTensorSpec"
        proto.num_flat_components = spec.ragged_rank + 1


def _decode_type_spec(proto: struct_pb2.TypeSpecProto) -> Any:
    state = list(proto.type_state.tuple_value.values)
    try:
        if proto.type_spec_class == _SPARSE_TENSOR_SPEC:
            return nest.SparseTensorSpec(_decode_shape(state[0].tensor_shape_value),
                                         enum_dtype(state[1].tensor_dtype_value))
        if proto.type_spec_class == _RAGGED_TENSOR_SPEC:
            if len(state) > 4 and state[4].WhichOneof("kind") != "none_value":
                raise UnimplementedError(
                    "element spec: a RaggedTensorSpec with a flat_values_spec is not supported")
            return nest.RaggedTensorSpec(_decode_shape(state[0].tensor_shape_value),
                                         enum_dtype(state[1].tensor_dtype_value),
                                         state[2].int64_value,
                                         enum_dtype(state[3].tensor_dtype_value))
    except IndexError:
        raise DataLossError(f"element spec: a {proto.type_spec_class_name} without its "
                            f"arguments") from None
    raise UnimplementedError(
        f"element spec: {proto.type_spec_class_name or 'a TypeSpec'} components (nested "
        "datasets, optionals ...) are not supported")


def decode_spec(value: struct_pb2.StructuredValue) -> Any:
    """The structure of specs a StructuredValue describes."""
    kind = value.WhichOneof("kind")
    if kind == "tensor_spec_value":
        proto = value.tensor_spec_value
        return nest.TensorSpec(_decode_shape(proto.shape), enum_dtype(proto.dtype),
                               proto.name or None)
    if kind == "dict_value":
        return {key: decode_spec(child)
                for key, child in sorted(value.dict_value.fields.items())}
    if kind == "tuple_value":
        return tuple(decode_spec(child) for child in value.tuple_value.values)
    if kind == "list_value":
        return [decode_spec(child) for child in value.list_value.values]
    if kind == "named_tuple_value":
        pairs = value.named_tuple_value.values
        cls = collections.namedtuple(value.named_tuple_value.name,  # type: ignore[misc]
                                     [p.key for p in pairs])
        return cls(*(decode_spec(p.value) for p in pairs))
    if kind == "type_spec_value":
        return _decode_type_spec(value.type_spec_value)
    raise UnimplementedError(f"element spec: a {kind} is not a structure of TensorSpec")


def write_spec(directory: str, spec: Any) -> None:
    _write_atomically(os.path.join(directory, SPEC_FILE), encode_spec(spec).SerializeToString())


def read_spec(directory: str) -> Any:
    path = os.path.join(directory, SPEC_FILE)
    try:
        data = _fs.read_bytes(path)
    except (FileNotFoundError, NotFoundError):
        raise NotFoundError(f"element_spec file not found: {path}") from None
    value = struct_pb2.StructuredValue()
    try:
        value.ParseFromString(data)
    except DecodeError:
        raise DataLossError(f"element_spec file is not a StructuredValue: {path}") from None
    return decode_spec(value)


# ----- snapshot.metadata -------------------------------------------------------------------------
def write_metadata(directory: str, run_id: str, spec: Any, num_elements: int,
                   finalized: bool, graph_hash: str = "") -> None:
    record = snapshot_pb2.SnapshotMetadataRecord(
        graph_hash=graph_hash, run_id=run_id, creation_timestamp=time.time_ns() // 1000,
        version=FILE_FORMAT_VERSION, num_elements=num_elements, finalized=finalized,
        dtype=[component_dtype_enum(s) for s in nest.flatten(spec)])
    _write_atomically(os.path.join(directory, METADATA_FILE), record.SerializeToString())


def read_metadata(directory: str) -> snapshot_pb2.SnapshotMetadataRecord | None:
    """The metadata record in ``directory``, or None when there is none."""
    data = read_metadata_bytes(directory)
    return None if data is None else parse_metadata(data, directory)


def read_metadata_bytes(directory: str) -> bytes | None:
    """The bytes of ``directory``'s metadata file (either kind), or None when there is none."""
    try:
        return _fs.read_bytes(os.path.join(directory, METADATA_FILE))
    except (FileNotFoundError, NotFoundError):
        return None


def parse_metadata(data: bytes, directory: str) -> snapshot_pb2.SnapshotMetadataRecord:
    record = snapshot_pb2.SnapshotMetadataRecord()
    try:
        record.ParseFromString(data)
    except DecodeError:
        path = os.path.join(directory, METADATA_FILE)
        raise DataLossError(f"not a snapshot metadata file: {path}") from None
    return record


def _write_atomically(path: str, data: bytes) -> None:
    _fs.atomic_write(path, data)


def new_run_id() -> str:
    return str(random.SystemRandom().getrandbits(64))


# ----- writing ---------------------------------------------------------------------------------
def shard_directory(run_dir: str, shard: int) -> str:
    return os.path.join(run_dir, f"{shard:08d}.shard")


def checkpoint_file(shard_dir: str, checkpoint: int) -> str:
    return os.path.join(shard_dir, f"{checkpoint:08d}.snapshot")


class ShardWriters:
    """One TFRecord file per shard for checkpoint ``checkpoint``, opened on first use."""

    def __init__(self, run_dir: str, checkpoint: int, compression: str | None,
                 spec: Any = None, batched: bool = False) -> None:
        self.run_dir = run_dir
        self.batched = batched
        self.checkpoint = checkpoint
        self.compression = compression
        # each component's spec, where a ragged row (an array) must be written as ragged
        self._specs = None if spec is None else nest.flatten(spec)
        self._writers: dict[int, TFRecordWriter] = {}

    def write(self, shard: int, element: Any) -> None:
        writer = self._writers.get(shard)
        if writer is None:
            directory = shard_directory(self.run_dir, shard)
            _fs.makedirs(directory)
            # Readers (TensorFlow's too) stop at the first missing checkpoint file: a shard
            # first written after a checkpoint gets empty files before its first one.
            for earlier in range(self.checkpoint):
                if not _fs.exists(checkpoint_file(directory, earlier)):
                    TFRecordWriter(checkpoint_file(directory, earlier), self.compression).close()
            writer = self._writers[shard] = TFRecordWriter(
                checkpoint_file(directory, self.checkpoint), self.compression)
        components = nest.flatten(element)
        specs = self._specs or [None] * len(components)
        for component, spec in zip(components, specs):
            writer.write(encode_component(component, spec, self.batched).SerializeToString())

    def close(self) -> None:
        writers, self._writers = self._writers, {}
        for writer in writers.values():
            writer.close()


def save(dataset: Any, path: Any, compression: Any = None,
         shard_func: Callable[..., Any] | None = None, checkpoint_args: Any = None) -> None:
    """Writes every element of ``dataset`` under ``path`` (see the module docstring)."""
    if checkpoint_args is not None:
        raise UnimplementedError(
            "save: checkpoint_args (TensorFlow checkpoints of a save in progress) is not "
            "supported; save writes the whole dataset in one pass")
    compression = check_compression(compression)
    if shard_func is not None and not callable(shard_func):
        raise InvalidArgumentError(f"shard_func must be callable, got {shard_func!r}")
    directory = os.fspath(path)
    try:
        spec = dataset.element_spec
    except FailedPreconditionError:  # empty, and its spec is only known from an element
        spec = ()
    _fs.makedirs(directory)
    write_spec(directory, spec)
    run_id = new_run_id()
    run_dir = os.path.join(directory, run_id)
    _fs.makedirs(run_dir)
    write_metadata(directory, run_id, spec, 0, finalized=False)
    writers = ShardWriters(run_dir, 0, compression, spec, makes_batches(dataset._op))
    count = 0
    written = spec
    try:
        for element in dataset:
            writers.write(0 if shard_func is None else shard_index(shard_func, element),
                          element)
            written = relax_spec(written, element)
            count += 1
    finally:
        writers.close()
    if written != spec:  # an element contradicted the spec read off the first one
        spec = written
        write_spec(directory, spec)
    write_metadata(directory, run_id, spec, count, finalized=True)


def makes_batches(op: Op) -> bool:
    """Whether the elements of ``op`` are what a batch op made (ops that pass elements on
    unchanged looked through): their sparse and ragged components are written one value per
    batch row, as TensorFlow's batch leaves them."""
    return isinstance(through_passing(op), BatchOp)


def promised_spec(dataset: Any) -> Any:
    """What every element of ``dataset`` is known to fit before any is written: its
    ``element_spec``, with every size unknown where that spec was read off its first element
    (a Python function's output), since later elements may differ."""
    spec = dataset.element_spec
    if derived_spec(dataset._op) is not None:
        return spec
    return nest.map_structure(_unknown_sizes, spec)


def _unknown_sizes(spec: Any) -> Any:
    if not isinstance(spec, (nest.TensorSpec, *COMPOSITE_SPECS)) or spec.shape is None:
        return spec
    shape = [None] * len(spec.shape)
    if isinstance(spec, nest.TensorSpec):
        return nest.TensorSpec(shape, spec.dtype, spec.name)
    if isinstance(spec, nest.SparseTensorSpec):
        return nest.SparseTensorSpec(shape, spec.dtype)
    return nest.RaggedTensorSpec(shape, spec.dtype, spec.ragged_rank, spec.row_splits_dtype)


def relax_spec(spec: Any, element: Any) -> Any:
    """``spec``, relaxed where ``element`` does not fit it: each contradicted leaf becomes
    the most specific spec that both it and the element's component fit (sizes that differ
    unknown)."""
    specs = nest.flatten(spec)
    leaves = nest.flatten(element)
    if len(specs) != len(leaves):
        return spec
    relaxed = [_relax_leaf(s, v) for s, v in zip(specs, leaves)]
    if all(a is b for a, b in zip(relaxed, specs)):
        return spec
    return nest.pack_sequence_as(spec, relaxed)


def _relax_leaf(spec: Any, value: Any) -> Any:
    if isinstance(spec, nest.RaggedTensorSpec) and not spec.ragged_rank \
            and not isinstance(value, RaggedTensor):
        array = np.asarray(value)
        seen: Any = nest.RaggedTensorSpec(array.shape, array.dtype, 0, spec.row_splits_dtype)
    else:
        seen = nest.spec_from_value(value)
    if type(seen) is not type(spec) or nest._shapes_compatible(spec.shape, seen.shape):
        return spec  # only sizes are relaxed: the dtypes are the spec's, as written
    shape = nest._common_shape(spec.shape, seen.shape)
    if isinstance(spec, nest.TensorSpec):
        return nest.TensorSpec(shape, spec.dtype, spec.name)
    if isinstance(spec, nest.SparseTensorSpec):
        return nest.SparseTensorSpec(shape, spec.dtype)
    return nest.RaggedTensorSpec(shape, spec.dtype, spec.ragged_rank, spec.row_splits_dtype)
