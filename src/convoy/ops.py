"""Tensor ops that input pipelines' map functions call, as TensorFlow names them, on numpy.

Each takes what TensorFlow's op takes and gives what it gives: Python ints become int32 and
Python floats float32 (as ``tf.constant`` makes them), byte strings are ``bytes`` in object
arrays, and indices come out int32 or int64 as TensorFlow's do. They are re-exported as
``convoy.cast``, ``convoy.reshape`` and so on.
"""

from convoy._ops.array import (
    cast,
    clip_by_value,
    concat,
    convert_to_tensor,
    gather,
    one_hot,
    pad,
    reshape,
    sequence_mask,
    stack,
    unique,
    where,
)

__all__ = [
    "cast",
    "clip_by_value",
    "concat",
    "convert_to_tensor",
    "gather",
    "one_hot",
    "pad",
    "reshape",
    "sequence_mask",
    "stack",
    "unique",
    "where",
]
