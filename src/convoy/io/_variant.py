"""Sparse and ragged values as TensorFlow's DT_VARIANT tensors: how a saved dataset holds them.

A sparse component is a variant vector of three ``tensorflow::Tensor`` values (indices,
values, dense shape); a ragged one a variant scalar of one ``RaggedTensorVariant`` (each
ragged dimension's row splits, outermost first, then the flat values; none but the values for
a row of ``ragged_rank`` 0). A variant tensor's ``tensor_content`` is the serialized
``VariantTensorDataProto`` of each value, in the encoding of a string tensor's content.

A batch is held as TensorFlow's ``batch`` leaves it: one value per batch row, a sparse
component a variant ``[batch, 3]`` (each row's indices, values and dense shape) and a ragged
one a variant ``[batch]`` (each row's own row splits and values). Both forms are read; convoy
writes the batched form for the elements of a batch op, as TensorFlow does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from convoy._values import nest
from convoy._values.tensors import RaggedTensor, SparseTensor
from convoy.errors import DataLossError, InvalidArgumentError
from convoy.io import tensor_pb2
from convoy.io._tensor import decode_strings, dtype_enum, encode_strings, from_proto, to_proto

_TENSOR = "tensorflow::Tensor"
_RAGGED = "RaggedTensorVariant"
COMPOSITE_SPECS = (nest.SparseTensorSpec, nest.RaggedTensorSpec)


def component_dtype_enum(spec: Any) -> Any:
    """The DataType a saved dataset records for a component of leaf spec ``spec``."""
    if isinstance(spec, COMPOSITE_SPECS):
        return tensor_pb2.DT_VARIANT
    return dtype_enum(spec.dtype)


def encode_component(value: Any, spec: Any = None,
                     batched: bool = False) -> tensor_pb2.TensorProto:
    """The TensorProto of one component: a variant for a sparse or ragged value (or an array
    whose ``spec`` is a ragged row's), else the tensor itself. A ``batched`` sparse or ragged
    value (what a batch op made) is written one value per batch row, as TensorFlow does."""
    if isinstance(value, SparseTensor):
        if batched and value.rank and value.dense_shape[0] > 0:
            rows = _sparse_rows(value)
            return _variant([part for row in rows for part in _sparse_value(row)],
                            (len(rows), 3))
        return _variant(_sparse_value(value), (3,))
    if isinstance(value, RaggedTensor):
        if batched and value.nrows():
            return _variant([_row_value(row) for row in value], (value.nrows(),))
        return _variant([_ragged_value(value.nested_row_splits, value.flat_values)], ())
    if isinstance(spec, nest.RaggedTensorSpec):
        return _variant([_ragged_value((), np.asarray(value))], ())
    return to_proto(value)


def decode_component(proto: tensor_pb2.TensorProto, spec: Any) -> Any:
    """The value of one component of leaf spec ``spec`` (the inverse of
    :func:`encode_component`); a plain tensor is returned as an array."""
    if isinstance(spec, nest.SparseTensorSpec):
        try:
            return _decode_sparse(proto, spec)
        except (IndexError, ValueError, InvalidArgumentError) as error:
            raise DataLossError(f"a saved sparse component is malformed: {error}") from None
    if isinstance(spec, nest.RaggedTensorSpec):
        try:
            value = _decode_ragged(proto, spec)
            if isinstance(value, RaggedTensor) and value.row_splits_dtype != spec.row_splits_dtype:
                value = value.with_row_splits_dtype(spec.row_splits_dtype)
            return value
        except (IndexError, ValueError, InvalidArgumentError) as error:
            raise DataLossError(f"a saved ragged component is malformed: {error}") from None
    return from_proto(proto)


def _shape(proto: tensor_pb2.TensorProto) -> list[int]:
    return [d.size for d in proto.tensor_shape.dim]


def _decode_sparse(proto: tensor_pb2.TensorProto, spec: Any) -> SparseTensor:
    """A sparse component: ``[3]`` (one value) or ``[*batch, 3]`` (one value per batch row,
    combined as TensorFlow's ``deserialize_sparse`` does)."""
    shape = _shape(proto)
    if not shape or shape[-1] != 3:
        raise DataLossError(f"a saved sparse component must be a variant tensor of shape "
                            f"[..., 3], found shape {shape}")
    count = int(np.prod(shape, dtype=np.int64))
    parts = [from_proto(part.tensors[0]) for part in _values(proto, _TENSOR, count, "sparse")]
    rows = [SparseTensor(*parts[i:i + 3]) for i in range(0, count, 3)]
    if len(shape) == 1:
        return rows[0]
    outer = shape[:-1]
    inner = max((r.rank for r in rows), default=(spec.rank or len(outer)) - len(outer))
    if any(r.rank != inner for r in rows):
        raise DataLossError("the rows of a saved sparse batch differ in rank")
    sizes = np.max([r.dense_shape for r in rows], axis=0) if rows and inner else \
        np.zeros(inner, np.int64)
    positions = np.array(list(np.ndindex(*outer)), np.int64).reshape(-1, len(outer))
    indices = [np.hstack([np.repeat(positions[i:i + 1], len(r.values), axis=0), r.indices])
               for i, r in enumerate(rows)]
    dtype = rows[0].values.dtype if rows else spec.dtype
    return SparseTensor(
        np.concatenate(indices) if indices else np.zeros((0, len(outer) + inner), np.int64),
        np.concatenate([r.values for r in rows]) if rows else np.zeros(0, dtype),
        np.concatenate([np.array(outer, np.int64), sizes]))


def _decode_ragged(proto: tensor_pb2.TensorProto, spec: Any) -> Any:
    """A ragged component: a scalar (one value holding every ragged dimension) or
    ``[*batch]`` (one value per batch row, the batch dimensions outermost)."""
    shape = _shape(proto)
    count = int(np.prod(shape, dtype=np.int64))
    parts = _values(proto, _RAGGED, count, "ragged")
    rows = [[from_proto(t) for t in part.tensors] for part in parts]
    inner = {len(tensors) - 1 for tensors in rows}
    if len(inner) > 1 or len(shape) + min(inner, default=spec.ragged_rank - len(shape)) \
            != spec.ragged_rank:
        raise DataLossError(
            f"a saved ragged component of shape {shape} holds values of ragged rank "
            f"{sorted(inner)}; its spec (ragged_rank {spec.ragged_rank}) needs "
            f"{spec.ragged_rank - len(shape)}")
    if not shape:
        tensors = rows[0]
        return tensors[0] if len(tensors) == 1 else \
            RaggedTensor.from_nested_row_splits(tensors[-1], tensors[:-1])
    result = _stack_rows(rows, spec)
    for size in reversed(shape[1:]):  # uniform batch dimensions, innermost first
        result = RaggedTensor.from_row_splits(
            result, np.arange(0, result.nrows() + 1, size or 1, dtype=np.int64))
    return result


def _stack_rows(rows: list[list[np.ndarray]], spec: Any) -> RaggedTensor:
    """The rows (each its row splits then its values) as one RaggedTensor of ``len(rows)``
    rows."""
    depth = len(rows[0]) - 1 if rows else spec.ragged_rank - 1
    lengths = [len(r[0]) - 1 if depth else len(r[0]) for r in rows]
    splits = [np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])]
    for level in range(depth):
        offsets = np.cumsum([0] + [int(r[level][-1]) for r in rows[:-1]], dtype=np.int64)
        tails = [r[level][1:].astype(np.int64) + offset for r, offset in zip(rows, offsets)]
        splits.append(np.concatenate([np.zeros(1, np.int64), *tails]))
    inner_shape = () if spec.shape is None else tuple(
        s or 0 for s in spec.shape[spec.ragged_rank + 1:])
    values = np.concatenate([r[-1] for r in rows]) if rows else \
        np.zeros((0, *inner_shape), spec.dtype)
    return RaggedTensor.from_nested_row_splits(values, splits)


def _sparse_rows(value: SparseTensor) -> list[SparseTensor]:
    """Each row ``value[i]`` of a sparse value of rank >= 1, of dense shape
    ``dense_shape[1:]``."""
    first = value.indices[:, 0]
    bounds = np.searchsorted(first, np.arange(value.dense_shape[0] + 1), side="left") \
        if np.all(first[1:] >= first[:-1]) else None
    rows = []
    for i in range(int(value.dense_shape[0])):
        chosen = slice(bounds[i], bounds[i + 1]) if bounds is not None else first == i
        rows.append(SparseTensor(value.indices[chosen, 1:], value.values[chosen],
                                 value.dense_shape[1:]))
    return rows


def _sparse_value(value: SparseTensor) -> list[tensor_pb2.VariantTensorDataProto]:
    return [_tensor_value(value.indices), _tensor_value(value.values),
            _tensor_value(value.dense_shape)]


def _row_value(row: Any) -> tensor_pb2.VariantTensorDataProto:
    """One row of a ragged value (an array, or a RaggedTensor of the inner ragged
    dimensions)."""
    if isinstance(row, RaggedTensor):
        return _ragged_value(row.nested_row_splits, row.flat_values)
    return _ragged_value((), np.asarray(row))


def _tensor_value(array: np.ndarray) -> tensor_pb2.VariantTensorDataProto:
    return tensor_pb2.VariantTensorDataProto(type_name=_TENSOR,
                                             tensors=[to_proto(array, value_fields=True)])


def _ragged_value(splits: tuple[np.ndarray, ...],
                  flat_values: np.ndarray) -> tensor_pb2.VariantTensorDataProto:
    return tensor_pb2.VariantTensorDataProto(
        type_name=_RAGGED, tensors=[to_proto(t, value_fields=True)
                                    for t in (*splits, flat_values)])


def _variant(values: list[tensor_pb2.VariantTensorDataProto],
             shape: tuple[int, ...]) -> tensor_pb2.TensorProto:
    proto = tensor_pb2.TensorProto(dtype=tensor_pb2.DT_VARIANT)
    proto.tensor_shape.SetInParent()
    for size in shape:
        proto.tensor_shape.dim.add(size=size)
    proto.tensor_content = encode_strings([v.SerializeToString() for v in values])
    return proto


def _values(proto: tensor_pb2.TensorProto, type_name: str, count: int,
            what: str) -> list[tensor_pb2.VariantTensorDataProto]:
    """The ``count`` values of variant tensor ``proto``, each checked to be ``type_name``."""
    shape = [d.size for d in proto.tensor_shape.dim]
    if proto.dtype != tensor_pb2.DT_VARIANT or int(np.prod(shape, dtype=np.int64)) != count:
        raise DataLossError(
            f"a saved {what} component must be a variant tensor of {count} value(s), found a "
            f"tensor of DataType {proto.dtype} and shape {shape}")
    if proto.tensor_content:
        try:
            values = [tensor_pb2.VariantTensorDataProto.FromString(item)
                      for item in decode_strings(proto.tensor_content, count)]
        except DecodeError:
            raise DataLossError("a saved variant value is not a VariantTensorDataProto") \
                from None
    else:
        values = list(proto.variant_val)
    if len(values) != count or any(v.type_name != type_name for v in values):
        raise DataLossError(
            f"a saved {what} component holds {[v.type_name for v in values]}, not {count} "
            f"{type_name}")
    return values
