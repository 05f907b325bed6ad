"""Tensor ops that input pipelines' map functions call, as TensorFlow names them, on numpy.

The docs are in :mod:`convoy.ops`, the public face.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from convoy._values.tensors import RaggedTensor, SparseTensor
from convoy.errors import InvalidArgumentError

__all__ = ["cast", "clip_by_value", "concat", "convert_to_tensor", "gather", "one_hot", "pad",
           "reshape", "sequence_mask", "stack", "unique", "where"]

_STRING = np.dtype(object)
_INT32 = np.iinfo(np.int32)


def _python_values(value: Any) -> bool:
    """Whether ``value`` is a Python number, string or nest of lists of them (no numpy)."""
    return not isinstance(value, (np.ndarray, np.generic))


def _strings(array: np.ndarray) -> np.ndarray:
    """An object array of ``bytes`` from an array of str or bytes (``|U``, ``|S`` or object)."""
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    for i, item in enumerate(array.reshape(-1).tolist()):
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, bytes):
            raise InvalidArgumentError(f"expected str or bytes, got {type(item).__name__}")
        flat[i] = item
    return out


def convert_to_tensor(value: Any, dtype: Any = None, name: str = "value") -> np.ndarray:
    """``value`` as a numpy array with TensorFlow's dtype: Python ints int32 (int64 if they do
    not fit), Python floats float32, str and bytes ``bytes`` in an object array."""
    if isinstance(value, (SparseTensor, RaggedTensor)):
        raise InvalidArgumentError(f"{name} must be a dense array, got {type(value).__name__}")
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as error:
        raise InvalidArgumentError(f"{name} must be array-like: {error}") from None
    if array.dtype.kind in "SUO":
        array = _strings(array) if array.dtype.kind in "SU" or array.size else \
            array.astype(object)
    elif _python_values(value):
        if array.dtype == np.int64 and (array.size == 0 or (
                _INT32.min <= array.min() and array.max() <= _INT32.max)):
            array = array.astype(np.int32)
        elif array.dtype == np.float64:
            array = array.astype(np.float32)
    if dtype is not None:
        array = array.astype(_dtype(dtype, "dtype"), copy=False)
    return array


def _dtype(dtype: Any, argument: str) -> np.dtype:
    """A numpy dtype from a numpy dtype, a type or a name (``bytes``/``string`` for strings)."""
    if dtype in (bytes, str, "string"):
        return _STRING
    try:
        return np.dtype(dtype)
    except TypeError:
        raise InvalidArgumentError(f"{argument} must be a dtype, got {dtype!r}") from None


def cast(x: Any, dtype: Any) -> Any:
    """``x`` as ``dtype`` (floats to integers truncate toward zero); sparse and ragged values
    keep their structure."""
    target = _dtype(dtype, "dtype")
    if isinstance(x, SparseTensor):
        return SparseTensor(x.indices, cast(x.values, target), x.dense_shape)
    if isinstance(x, RaggedTensor):
        return x.with_flat_values(cast(x.flat_values, target))
    array = convert_to_tensor(x, name="x")
    if (array.dtype == _STRING) != (target == _STRING):
        raise InvalidArgumentError(f"cast from {array.dtype} to {target} is not supported "
                                   "(use convoy._ops.strings.to_number or as_string)")
    return array.astype(target)


def reshape(tensor: Any, shape: Any) -> np.ndarray:
    """``tensor``'s values in row-major order with ``shape`` (one dimension may be -1)."""
    array = convert_to_tensor(tensor, name="tensor")
    dims = [int(d) for d in np.asarray(shape).reshape(-1)]
    try:
        return array.reshape(dims)
    except ValueError:
        raise InvalidArgumentError(f"cannot reshape a tensor of {array.size} elements to "
                                   f"shape {dims}") from None


def one_hot(indices: Any, depth: int, on_value: Any = None, off_value: Any = None,
            axis: int | None = None, dtype: Any = None) -> np.ndarray:
    """A new axis of ``depth`` entries: ``on_value`` (1) at each index, ``off_value`` (0)
    elsewhere; indices outside ``[0, depth)`` give a row of ``off_value``. float32 by
    default, or the dtype of ``on_value``/``off_value``."""
    ids = convert_to_tensor(indices, name="indices")
    if ids.dtype.kind not in "iu":
        raise InvalidArgumentError(f"indices must hold integers, got dtype {ids.dtype}")
    if int(depth) < 0:
        raise InvalidArgumentError(f"depth must be >= 0, got {depth}")
    given = [convert_to_tensor(v) for v in (on_value, off_value) if v is not None]
    out_dtype = _dtype(dtype, "dtype") if dtype is not None else \
        (given[0].dtype if given else np.dtype(np.float32))
    on = np.asarray(1 if on_value is None else on_value).astype(out_dtype)
    off = np.asarray(0 if off_value is None else off_value).astype(out_dtype)
    hot = ids[..., None] == np.arange(int(depth))
    out = np.where(hot, on, off).astype(out_dtype)
    if axis is not None and axis != -1:
        if not 0 <= axis <= ids.ndim:
            raise InvalidArgumentError(f"axis must be -1 or in [0, {ids.ndim}], got {axis}")
        out = np.moveaxis(out, -1, axis)
    return out


class UniqueResult(NamedTuple):
    """``tf.unique``'s result: the distinct values in first-seen order, and for each input
    value the index of its value in ``y``."""

    y: np.ndarray
    idx: np.ndarray


def unique(x: Any, out_idx: Any = np.int32) -> UniqueResult:
    """The distinct values of 1-D ``x`` in the order they first appear (not sorted, unlike
    ``np.unique``), and ``idx`` (int32 by default) mapping each value to its place in ``y``."""
    array = convert_to_tensor(x, name="x")
    if array.ndim != 1:
        raise InvalidArgumentError(f"x must be 1-D, got shape {list(array.shape)}")
    index_dtype = _dtype(out_idx, "out_idx")
    if index_dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise InvalidArgumentError(f"out_idx must be int32 or int64, got {index_dtype}")
    seen: dict[Any, int] = {}
    firsts: list[int] = []
    idx = np.empty(len(array), index_dtype)
    for i, item in enumerate(array.tolist()):
        idx[i] = seen.setdefault(item, len(seen))
        if len(seen) > len(firsts):
            firsts.append(i)
    return UniqueResult(array[np.array(firsts, dtype=np.int64)], idx)


def pad(tensor: Any, paddings: Any, mode: str = "CONSTANT", constant_values: Any = 0) -> np.ndarray:
    """``tensor`` with ``paddings[d] = [before, after]`` entries added on dimension ``d``:
    ``constant_values`` (CONSTANT), or mirrored without (REFLECT) or with (SYMMETRIC) the
    edge."""
    array = convert_to_tensor(tensor, name="tensor")
    widths = np.asarray(paddings)
    if widths.shape != (array.ndim, 2) or widths.dtype.kind not in "iu" or (widths < 0).any():
        raise InvalidArgumentError(f"paddings must be non-negative integers of shape "
                                   f"[{array.ndim}, 2], got {widths.tolist()}")
    pairs = [tuple(int(v) for v in row) for row in widths]
    kind = str(mode).upper()
    if kind == "CONSTANT":
        return np.pad(array, pairs, constant_values=constant_values)
    if kind not in ("REFLECT", "SYMMETRIC"):
        raise InvalidArgumentError(f"mode must be CONSTANT, REFLECT or SYMMETRIC, got {mode!r}")
    limit = 1 if kind == "REFLECT" else 0
    for size, (before, after) in zip(array.shape, pairs):
        if max(before, after) > size - limit:
            raise InvalidArgumentError(f"paddings must be at most {size - limit} on a "
                                       f"dimension of {size} in {kind} mode, got {pairs}")
    return np.pad(array, pairs, mode=kind.lower())  # type: ignore[call-overload]


def _arrays(values: Sequence[Any], argument: str) -> list[np.ndarray]:
    if isinstance(values, (np.ndarray, np.generic)) or not isinstance(values, (list, tuple)):
        return list(convert_to_tensor(values, name=argument))
    if not values:
        raise InvalidArgumentError(f"{argument} must hold at least one tensor")
    return [convert_to_tensor(v, name=argument) for v in values]


def concat(values: Sequence[Any], axis: int) -> np.ndarray:
    """The tensors of ``values`` joined along the existing dimension ``axis``."""
    arrays = _arrays(values, "values")
    try:
        return np.concatenate(arrays, axis=axis)
    except (ValueError, np.exceptions.AxisError) as error:
        raise InvalidArgumentError(f"concat: {error}") from None


def stack(values: Sequence[Any], axis: int = 0) -> np.ndarray:
    """The tensors of ``values`` (all one shape) joined along a new dimension ``axis``."""
    arrays = _arrays(values, "values")
    try:
        return np.stack(arrays, axis=axis)
    except (ValueError, np.exceptions.AxisError) as error:
        raise InvalidArgumentError(f"stack: {error}") from None


def gather(params: Any, indices: Any, axis: int | None = None, batch_dims: int = 0) -> Any:
    """The slices of ``params`` along ``axis`` (default ``batch_dims``) at ``indices``; the
    first ``batch_dims`` dimensions of both are batch dimensions. An index out of range is an
    error. A RaggedTensor's rows gather along axis 0."""
    ids = convert_to_tensor(indices, name="indices")
    if ids.dtype.kind not in "iu":
        raise InvalidArgumentError(f"indices must hold integers, got dtype {ids.dtype}")
    if isinstance(params, RaggedTensor):
        if axis not in (None, 0) or batch_dims or ids.ndim != 1:
            raise InvalidArgumentError("gather on a RaggedTensor takes 1-D indices on axis 0")
        return _stack_rows([params[int(i)] for i in _checked(ids, params.nrows())],
                           params)
    array = convert_to_tensor(params, name="params")
    axis = batch_dims if axis is None else axis
    if axis < 0:
        axis += array.ndim
    if not batch_dims <= axis < array.ndim:
        raise InvalidArgumentError(f"axis must be in [{batch_dims}, {array.ndim}), got {axis}")
    _checked(ids, array.shape[axis])
    return _gather_batched(array, ids, axis, batch_dims)


def _checked(ids: np.ndarray, size: int) -> np.ndarray:
    bad = (ids < 0) | (ids >= size)
    if bad.any():
        raise InvalidArgumentError(f"indices[{np.argwhere(bad)[0].tolist()}] = "
                                   f"{ids[bad][0]} is not in [0, {size})")
    return ids


def _gather_batched(array: np.ndarray, ids: np.ndarray, axis: int,
                    batch_dims: int) -> np.ndarray:
    if batch_dims == 0:
        return np.take(array, ids, axis=axis)
    if len(array) != len(ids):
        raise InvalidArgumentError(f"params and indices must agree on batch dimensions, got "
                                   f"{len(array)} and {len(ids)}")
    rows = [_gather_batched(a, i, axis - 1, batch_dims - 1) for a, i in zip(array, ids)]
    return np.stack(rows) if rows else np.take(array, ids, axis=axis)


def where(condition: Any, x: Any = None, y: Any = None) -> np.ndarray:
    """With ``condition`` alone: the int64 coordinates ``[N, rank]`` of its true entries, in
    row-major order. With ``x`` and ``y``: ``x`` where ``condition`` holds, else ``y``
    (broadcast)."""
    cond = convert_to_tensor(condition, name="condition")
    if (x is None) != (y is None):
        raise InvalidArgumentError("where takes both x and y, or neither")
    if x is None:
        return np.argwhere(cond.astype(bool)).astype(np.int64)
    if cond.dtype != np.bool_:
        raise InvalidArgumentError(f"condition must be bool, got dtype {cond.dtype}")
    a, b = convert_to_tensor(x, name="x"), convert_to_tensor(y, name="y")
    if a.dtype != b.dtype:
        raise InvalidArgumentError(f"x and y must have one dtype, got {a.dtype} and {b.dtype}")
    try:
        return np.where(cond, a, b)
    except ValueError as error:
        raise InvalidArgumentError(f"where: {error}") from None


def clip_by_value(t: Any, clip_value_min: Any, clip_value_max: Any) -> np.ndarray:
    """``t`` with values below ``clip_value_min`` raised to it and above ``clip_value_max``
    lowered to it, in ``t``'s dtype."""
    array = convert_to_tensor(t, name="t")
    return np.clip(array, clip_value_min, clip_value_max).astype(array.dtype)


def sequence_mask(lengths: Any, maxlen: int | None = None, dtype: Any = np.bool_) -> np.ndarray:
    """``mask[..., j] = j < lengths[...]``, with ``maxlen`` (default ``max(lengths)``)
    columns."""
    sizes = convert_to_tensor(lengths, name="lengths")
    if sizes.dtype.kind not in "iu":
        raise InvalidArgumentError(f"lengths must hold integers, got dtype {sizes.dtype}")
    width = (int(sizes.max()) if sizes.size else 0) if maxlen is None else int(maxlen)
    if width < 0:
        raise InvalidArgumentError(f"maxlen must be >= 0, got {maxlen}")
    return (np.arange(width) < sizes[..., None]).astype(_dtype(dtype, "dtype"))


def _stack_rows(rows: list[Any], like: RaggedTensor) -> RaggedTensor:
    """A RaggedTensor whose rows are ``rows`` (rows of ``like``, for their dtype)."""
    if not rows:
        return like[0:0]
    if isinstance(rows[0], RaggedTensor):
        inner = _stack_rows([r for row in rows for r in row], like.values)  # type: ignore[arg-type]
        return RaggedTensor.from_row_lengths(inner, [len(row) for row in rows])
    return RaggedTensor.from_row_lengths(np.concatenate(rows), [len(row) for row in rows])
