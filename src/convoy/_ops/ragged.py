"""Ragged values from Python lists, as ``tf.ragged`` makes them.

The docs are in :mod:`convoy.ragged`, the public face.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from convoy._ops.array import convert_to_tensor
from convoy._values.tensors import RaggedTensor
from convoy.errors import InvalidArgumentError

__all__ = ["constant"]


def _depth(value: Any) -> int:
    """How deep ``value``'s lists nest (0 for a scalar), following the first non-empty list."""
    if isinstance(value, (list, tuple)):
        inner = [_depth(v) for v in value]
        return 1 + (max(inner) if inner else 0)
    if isinstance(value, np.ndarray):
        return value.ndim
    return 0


def constant(pylist: Any, dtype: Any = None, ragged_rank: int | None = None,
             inner_shape: tuple[int, ...] | None = None,
             row_splits_dtype: Any = np.int64) -> Any:
    """A RaggedTensor of the nested lists ``pylist``: Python ints become int32, floats
    float32, strings ``bytes``; every list dimension but the outermost is ragged unless
    ``ragged_rank`` (or ``inner_shape``) says fewer. A scalar gives a numpy value.
    ``row_splits_dtype`` is checked (int32 or int64); the row splits are those
    :class:`~convoy.RaggedTensor` keeps."""
    if np.dtype(row_splits_dtype) not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise InvalidArgumentError(f"row_splits_dtype must be int32 or int64, got "
                                   f"{row_splits_dtype}")
    depth = _depth(pylist)
    if inner_shape is not None and ragged_rank is None:
        ragged_rank = depth - 1 - len(inner_shape)
    if ragged_rank is None:
        ragged_rank = depth - 1
    if depth == 0 or ragged_rank == 0:
        return convert_to_tensor(pylist, dtype=dtype, name="pylist")
    if not 0 < ragged_rank < depth:
        raise InvalidArgumentError(f"ragged_rank must be in [0, {depth - 1}] for lists "
                                   f"{depth} deep, got {ragged_rank}")
    nested_lengths: list[list[int]] = []
    level: list[Any] = list(pylist)
    for _ in range(ragged_rank):
        nested_lengths.append([len(row) for row in level])
        level = [item for row in level for item in row]
    if level:
        flat = convert_to_tensor(level, dtype=dtype, name="pylist")
    else:
        flat = np.zeros((0, *(inner_shape or ())), dtype=np.float32 if dtype is None else dtype)
    return RaggedTensor.from_nested_row_lengths(flat, nested_lengths)
