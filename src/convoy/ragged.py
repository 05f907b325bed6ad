"""Ragged values from Python lists, as ``tf.ragged`` makes them."""

from convoy._ops.ragged import (
    constant,
)

__all__ = [
    "constant",
]
