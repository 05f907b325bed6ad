"""Sparse and ragged values as TensorFlow's DT_VARIANT tensors: how a saved dataset holds them.

A sparse component is a variant vector of three ``tensorflow::Tensor`` values (indices,
values, dense shape); a ragged one a variant scalar of one ``RaggedTensorVariant`` (each
ragged dimension's row splits, outermost first, then the flat values; none but the values for
a row of ``ragged_rank`` 0). A variant tensor's ``tensor_content`` is the serialized
``VariantTensorDataProto`` of each value, in the encoding of a string tensor's content.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from convoy import nest
from convoy._tensors import RaggedTensor, SparseTensor
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


def encode_component(value: Any, spec: Any = None) -> tensor_pb2.TensorProto:
    """The TensorProto of one component: a variant for a sparse or ragged value (or an array
    whose ``spec`` is a ragged row's), else the tensor itself."""
    if isinstance(value, SparseTensor):
        return _variant([_tensor_value(value.indices), _tensor_value(value.values),
                         _tensor_value(value.dense_shape)], (3,))
    if isinstance(value, RaggedTensor):
        return _variant([_ragged_value(value.nested_row_splits, value.flat_values)], ())
    if isinstance(spec, nest.RaggedTensorSpec):
        return _variant([_ragged_value((), np.asarray(value))], ())
    return to_proto(value)


def decode_component(proto: tensor_pb2.TensorProto, spec: Any) -> Any:
    """The value of one component of leaf spec ``spec`` (the inverse of
    :func:`encode_component`); a plain tensor is returned as an array."""
    if isinstance(spec, nest.SparseTensorSpec):
        parts = _values(proto, _TENSOR, 3, "sparse")
        try:
            return SparseTensor(*(from_proto(part.tensors[0]) for part in parts))
        except (IndexError, InvalidArgumentError) as error:
            raise DataLossError(f"a saved sparse component is malformed: {error}") from None
    if isinstance(spec, nest.RaggedTensorSpec):
        (part,) = _values(proto, _RAGGED, 1, "ragged")
        tensors = [from_proto(t) for t in part.tensors]
        if len(tensors) != spec.ragged_rank + 1:
            raise DataLossError(
                f"a saved ragged component has {len(tensors)} tensors, its spec "
                f"(ragged_rank {spec.ragged_rank}) needs {spec.ragged_rank + 1}")
        if not spec.ragged_rank:
            return tensors[0]
        try:
            return RaggedTensor.from_nested_row_splits(tensors[-1], tensors[:-1])
        except InvalidArgumentError as error:
            raise DataLossError(f"a saved ragged component is malformed: {error}") from None
    return from_proto(proto)


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
