"""Sparse values to and from dense arrays, as ``tf.sparse`` names the conversions.

The docs are in :mod:`convoy.sparse`, the public face.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from convoy._ops.array import convert_to_tensor
from convoy._values.tensors import SparseTensor
from convoy.errors import InvalidArgumentError

__all__ = ["from_dense", "to_dense"]


def from_dense(tensor: Any) -> SparseTensor:
    """The entries of ``tensor`` that are not zero (``b""`` for byte strings), indices in
    row-major order."""
    return SparseTensor.from_dense(convert_to_tensor(tensor, name="tensor"))


def to_dense(sp_input: SparseTensor, default_value: Any = None,
             validate_indices: bool = True) -> np.ndarray:
    """The dense array of ``sp_input``, ``default_value`` (zero or ``b""``) where nothing is
    set; with ``validate_indices``, indices must be in bounds, sorted and distinct."""
    if not isinstance(sp_input, SparseTensor):
        raise InvalidArgumentError(f"sp_input must be a SparseTensor, got "
                                   f"{type(sp_input).__name__}")
    indices, shape = sp_input.indices, sp_input.dense_shape
    if len(indices) and ((indices < 0) | (indices >= shape)).any():
        raise InvalidArgumentError(f"sp_input has an index out of bounds of dense_shape "
                                   f"{shape.tolist()}")
    if validate_indices and len(indices) > 1:
        flat = np.ravel_multi_index(tuple(indices.T), tuple(int(d) for d in shape))
        if (np.diff(flat) <= 0).any():
            raise InvalidArgumentError("sp_input's indices must be sorted in row-major order "
                                       "and distinct")
    return sp_input.to_dense(default_value)
