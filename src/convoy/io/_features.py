"""How to parse each feature of an Example, named as in ``tf.io``."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from convoy.errors import InvalidArgumentError

BYTES, FLOAT, INT64 = 1, 2, 3  # the field numbers of Feature's kinds
KIND_NAMES = {BYTES: "string", FLOAT: "float", INT64: "int64"}
_KINDS = {np.dtype(object): BYTES, np.dtype(np.float32): FLOAT, np.dtype(np.int64): INT64}


def normalize_dtype(dtype: Any, key: str) -> np.dtype:
    """int64, float32, or object for byte strings (``bytes``, ``str``, ``"string"``,
    ``object``, ``np.bytes_``)."""
    try:
        known = _USUAL_DTYPES.get(dtype)
    except TypeError:  # unhashable
        known = None
    if known is not None:
        return known
    if dtype in (bytes, str, object, "string", np.bytes_, np.str_, np.object_):
        return np.dtype(object)
    try:
        result = np.dtype(dtype)
    except TypeError:
        result = None
    if result not in (np.dtype(np.int64), np.dtype(np.float32)):
        raise InvalidArgumentError(
            f"feature {key!r}: dtype must be int64, float32 or bytes, got {dtype!r}"
        )
    return result


_USUAL_DTYPES: dict[Any, np.dtype] = {
    np.int64: np.dtype(np.int64), np.float32: np.dtype(np.float32), bytes: np.dtype(object),
    "string": np.dtype(object)}


def kind_of(dtype: np.dtype) -> int:
    return _KINDS[dtype]


def dtype_name(dtype: np.dtype) -> str:
    return KIND_NAMES[_KINDS[dtype]]


class FixedLenFeature(NamedTuple):
    """A feature with exactly ``prod(shape)`` values, parsed to an array of ``shape``;
    ``default_value`` (if given) stands in for a missing feature."""

    shape: Any
    dtype: Any
    default_value: Any = None


class FixedLenSequenceFeature(NamedTuple):
    """Values in rows of ``shape``: any number of rows, padded with ``default_value`` across a
    batch (in ``parse_example``, which needs ``allow_missing=True``), or one row per step of a
    SequenceExample's feature list."""

    shape: Any
    dtype: Any
    allow_missing: bool = False
    default_value: Any = None


class VarLenFeature(NamedTuple):
    """Any number of values, parsed to a :class:`~convoy.SparseTensor`."""

    dtype: Any


class SparseFeature(NamedTuple):
    """A :class:`~convoy.SparseTensor` of dense shape ``size`` built from index features
    ``index_key`` (one per dimension) and a value feature ``value_key``."""

    index_key: Any
    value_key: str
    dtype: Any
    size: Any
    already_sorted: bool = False


class _RowSplits(NamedTuple):
    key: str


class _RowLengths(NamedTuple):
    key: str


class _RowStarts(NamedTuple):
    key: str


class _RowLimits(NamedTuple):
    key: str


class _ValueRowIds(NamedTuple):
    key: str


class _UniformRowLength(NamedTuple):
    length: int


class _RaggedFeature(NamedTuple):
    dtype: Any
    value_key: str | None = None
    partitions: tuple[Any, ...] = ()
    row_splits_dtype: Any = np.int64
    validate: bool = False


class RaggedFeature(_RaggedFeature):
    """Values parsed to a :class:`~convoy.RaggedTensor`: one row per example, cut further by
    ``partitions`` (outermost first), each ``RaggedFeature.RowSplits(key)``, ``RowLengths``,
    ``RowStarts``, ``RowLimits``, ``ValueRowIds`` (naming an int64 feature) or
    ``UniformRowLength(length)``. ``value_key`` defaults to the feature's own key.
    ``row_splits_dtype`` (int64 or int32) is every ragged dimension's row splits' dtype."""

    __slots__ = ()
    RowSplits = _RowSplits
    RowLengths = _RowLengths
    RowStarts = _RowStarts
    RowLimits = _RowLimits
    ValueRowIds = _ValueRowIds
    UniformRowLength = _UniformRowLength


PARTITIONS = (_RowSplits, _RowLengths, _RowStarts, _RowLimits, _ValueRowIds,
              _UniformRowLength)


def dense_shape(shape: Any, key: str) -> tuple[int, ...]:
    if shape is None:
        raise InvalidArgumentError(f"Missing shape for feature {key}")
    try:
        if isinstance(shape, (list, tuple)):
            dims = tuple(map(int, shape))
        else:
            dims = (int(shape),) if np.ndim(shape) == 0 else tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"feature {key!r}: shape must be a sequence of sizes, got {shape!r}"
        ) from None
    if any(d < 0 for d in dims):
        raise InvalidArgumentError(f"feature {key!r}: shape must hold sizes >= 0, got {dims}")
    return dims
