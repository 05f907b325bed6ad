"""Sparse values to and from dense arrays, as ``tf.sparse`` names the conversions."""

from convoy._ops.sparse import (
    from_dense,
    to_dense,
)

__all__ = [
    "from_dense",
    "to_dense",
]
