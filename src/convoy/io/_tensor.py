"""Tensors as TensorFlow's ``TensorProto``: numpy arrays to and from its bytes.

Two encodings, both TensorFlow's: ``tensor_content`` (the raw little-endian values; a string
tensor as every length as a varint, then every string) is what snapshots and saved datasets
hold and what ``tf.io.serialize_tensor`` writes for numbers; ``string_val`` is what it writes
for strings. Reading accepts every representation TensorFlow writes (``*_val`` fields
included, where a single value fills the whole shape).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from convoy._values import nest
from convoy.errors import DataLossError, InvalidArgumentError, UnimplementedError
from convoy.io import tensor_pb2

__all__ = ["parse_tensor", "serialize_tensor"]

STRING = np.dtype(object)

# numpy dtype -> TensorFlow DataType (the enum values of types.proto).
_TO_ENUM: dict[np.dtype, Any] = {
    np.dtype(np.float32): tensor_pb2.DT_FLOAT,
    np.dtype(np.float64): tensor_pb2.DT_DOUBLE,
    np.dtype(np.int32): tensor_pb2.DT_INT32,
    np.dtype(np.uint8): tensor_pb2.DT_UINT8,
    np.dtype(np.int16): tensor_pb2.DT_INT16,
    np.dtype(np.int8): tensor_pb2.DT_INT8,
    STRING: tensor_pb2.DT_STRING,
    np.dtype(np.complex64): tensor_pb2.DT_COMPLEX64,
    np.dtype(np.int64): tensor_pb2.DT_INT64,
    np.dtype(np.bool_): tensor_pb2.DT_BOOL,
    np.dtype(np.uint16): tensor_pb2.DT_UINT16,
    np.dtype(np.complex128): tensor_pb2.DT_COMPLEX128,
    np.dtype(np.float16): tensor_pb2.DT_HALF,
    np.dtype(np.uint32): tensor_pb2.DT_UINT32,
    np.dtype(np.uint64): tensor_pb2.DT_UINT64,
}
_FROM_ENUM: dict[int, np.dtype] = {v: k for k, v in _TO_ENUM.items()}

# DataType -> the repeated field that holds its values outside tensor_content.
_VAL_FIELD = {
    tensor_pb2.DT_FLOAT: "float_val", tensor_pb2.DT_DOUBLE: "double_val",
    tensor_pb2.DT_INT32: "int_val", tensor_pb2.DT_UINT8: "int_val",
    tensor_pb2.DT_INT16: "int_val", tensor_pb2.DT_INT8: "int_val",
    tensor_pb2.DT_UINT16: "int_val", tensor_pb2.DT_INT64: "int64_val",
    tensor_pb2.DT_BOOL: "bool_val", tensor_pb2.DT_HALF: "half_val",
    tensor_pb2.DT_COMPLEX64: "scomplex_val", tensor_pb2.DT_COMPLEX128: "dcomplex_val",
    tensor_pb2.DT_UINT32: "uint32_val", tensor_pb2.DT_UINT64: "uint64_val",
}


def as_dtype(dtype: Any, argument: str = "dtype") -> np.dtype:
    """``dtype`` as numpy stores it (``bytes``, ``str``, ``"string"``, ``object``: strings)."""
    try:
        return nest.TensorSpec(None, dtype).dtype
    except InvalidArgumentError:
        raise InvalidArgumentError(
            f"{argument} must be a numpy dtype, or bytes/str/'string' for strings, "
            f"got {dtype!r}") from None


def dtype_enum(dtype: np.dtype) -> Any:
    """The TensorFlow ``DataType`` number of a numpy dtype (numpy's fixed-width ``str`` and
    ``bytes`` dtypes are strings, as :func:`as_array` writes them)."""
    if dtype.kind in "US":
        return tensor_pb2.DT_STRING
    try:
        return _TO_ENUM[dtype]
    except KeyError:
        raise UnimplementedError(f"dtype {dtype} has no TensorFlow equivalent") from None


def enum_dtype(value: int) -> np.dtype:
    """The numpy dtype of a TensorFlow ``DataType`` number."""
    try:
        return _FROM_ENUM[value]
    except KeyError:
        name = tensor_pb2.DataType.Name(value) if value in tensor_pb2.DataType.values() \
            else str(value)
        raise UnimplementedError(f"TensorFlow dtype {name} is not supported") from None


def dtype_name(dtype: np.dtype) -> str:
    """TensorFlow's name of a dtype (``string`` for strings), for messages."""
    return "string" if dtype == STRING else dtype.name


def as_array(value: Any) -> np.ndarray:
    """``value`` (a scalar, array, bytes or str) as an array; strings as an object array of
    bytes."""
    if isinstance(value, (bytes, str)):
        value = np.array(_as_bytes(value), dtype=object)
    array = np.asarray(value)
    if array.dtype.kind in "USO":
        array = np.vectorize(_as_bytes, otypes=[object])(array) if array.size else \
            np.empty(array.shape, dtype=object)
    return array


def _as_bytes(item: Any) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode()
    if isinstance(item, np.bytes_):
        return bytes(item)
    raise InvalidArgumentError(
        f"a string tensor must hold bytes or str, found {type(item).__name__}")


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_strings(items: list[bytes]) -> bytes:
    """Byte strings as a string tensor's (or a variant tensor's) tensor_content: each
    length as a varint, then the strings."""
    return b"".join([_varint(len(s)) for s in items] + items)


def decode_strings(content: bytes, count: int) -> list[bytes]:
    lengths, pos = [], 0
    try:
        for _ in range(count):
            n = shift = 0
            while True:
                byte = content[pos]
                pos += 1
                n |= (byte & 0x7F) << shift
                shift += 7
                if byte < 0x80:
                    break
            lengths.append(n)
    except IndexError:
        raise DataLossError("a string tensor's content ends inside its lengths") from None
    items = []
    for n in lengths:
        items.append(content[pos:pos + n])
        pos += n
    if pos != len(content):
        raise DataLossError(
            f"a string tensor's content holds {len(content)} bytes, its lengths say {pos}")
    return items


def to_proto(value: Any, string_val: bool = False,
             value_fields: bool = False) -> tensor_pb2.TensorProto:
    """A ``TensorProto`` of ``value``; strings go to ``string_val`` when asked, else (like
    every other dtype) to ``tensor_content``; with ``value_fields``, every dtype goes to its
    typed field (as TensorFlow writes the tensors inside a variant)."""
    array = as_array(value)
    proto = tensor_pb2.TensorProto(dtype=dtype_enum(array.dtype))
    proto.tensor_shape.SetInParent()
    for size in array.shape:
        proto.tensor_shape.dim.add(size=size)
    field = _VAL_FIELD.get(proto.dtype) if value_fields and array.dtype.kind in "biuf" else None
    if array.dtype == STRING:
        items = array.ravel().tolist()
        if string_val or value_fields:
            proto.string_val.extend(items)
        else:
            proto.tensor_content = encode_strings(items)
    elif field is not None and proto.dtype != tensor_pb2.DT_HALF:
        getattr(proto, field).extend(array.ravel().tolist())
    else:
        proto.tensor_content = np.ascontiguousarray(
            array, dtype=array.dtype.newbyteorder("<")).tobytes()
    return proto


def from_proto(proto: tensor_pb2.TensorProto) -> np.ndarray:
    """The array a ``TensorProto`` holds."""
    dtype = enum_dtype(proto.dtype)
    if proto.tensor_shape.unknown_rank or any(d.size < 0 for d in proto.tensor_shape.dim):
        raise DataLossError("a serialized tensor must have a fully known shape")
    shape = tuple(d.size for d in proto.tensor_shape.dim)
    count = int(np.prod(shape, dtype=np.int64))
    if dtype == STRING:
        if proto.tensor_content:
            items = decode_strings(proto.tensor_content, count)
        else:
            items = _fill(list(proto.string_val), count, b"")
        array = np.empty(count, dtype=object)
        array[:] = items
        return array.reshape(shape)
    if proto.tensor_content:
        wire = dtype.newbyteorder("<")
        if len(proto.tensor_content) != count * wire.itemsize:
            raise DataLossError(
                f"a {dtype_name(dtype)} tensor of shape {list(shape)} needs "
                f"{count * wire.itemsize} bytes of content, found {len(proto.tensor_content)}")
        return np.frombuffer(proto.tensor_content, dtype=wire).astype(dtype).reshape(shape)
    values: Any = list(getattr(proto, _VAL_FIELD[proto.dtype]))
    if proto.dtype == tensor_pb2.DT_HALF:
        values = np.array(values, dtype=np.uint16).view(np.float16).tolist()
    elif dtype.kind == "c":
        values = [complex(re, im) for re, im in zip(values[0::2], values[1::2])]
    return np.array(_fill(values, count, 0), dtype=dtype).reshape(shape)


def _fill(values: list[Any], count: int, zero: Any) -> list[Any]:
    """TensorFlow's rule: fewer values than elements repeat the last one (none: zeros)."""
    if len(values) >= count:
        return values[:count]
    return values + [values[-1] if values else zero] * (count - len(values))


def serialize_tensor(tensor: Any, name: str | None = None) -> bytes:
    """``tensor`` as the bytes of a ``TensorProto``, as ``tf.io.serialize_tensor`` writes them."""
    array = as_array(tensor)
    return to_proto(array, string_val=array.dtype == STRING).SerializeToString()


def parse_tensor(serialized: Any, out_type: Any, name: str | None = None) -> np.ndarray:
    """The array in ``serialized`` (the bytes of a ``TensorProto``), which must hold
    ``out_type``; strings come out as an object array of bytes."""
    dtype = as_dtype(out_type, "out_type")
    if isinstance(serialized, np.ndarray) and serialized.shape == () or \
            isinstance(serialized, np.bytes_):
        serialized = serialized.item() if isinstance(serialized, np.ndarray) else serialized
    if not isinstance(serialized, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(
            f"serialized must be the bytes of a TensorProto, got {type(serialized).__name__}")
    proto = tensor_pb2.TensorProto()
    try:
        proto.ParseFromString(bytes(serialized))
    except DecodeError:
        raise InvalidArgumentError("serialized: could not parse a TensorProto") from None
    array = from_proto(proto)
    if array.dtype != dtype:
        raise InvalidArgumentError(
            f"Type mismatch between parsed tensor ({dtype_name(array.dtype)}) and out_type "
            f"({dtype_name(dtype)})")
    return array
