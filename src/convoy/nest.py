"""Nested structures of arrays: flatten, pack, map, compare, and describe them with specs.

A structure is a tuple, list, dict or namedtuple whose leaves are numpy arrays, numpy or
Python scalars, ``bytes`` or ``str``. Dicts flatten in sorted key order, as in TensorFlow.

Specs describe values as numpy stores them: a Python ``int`` is int64 and a Python ``float``
is float64 (TensorFlow would make it float32), so a spec matches what batching produces.
"""

from convoy._values.nest import (
    RaggedTensorSpec,
    SparseTensorSpec,
    TensorSpec,
    assert_same_structure,
    flatten,
    flatten_up_to,
    is_nested,
    map_structure,
    pack_sequence_as,
    spec_from_value,
)

__all__ = [
    "RaggedTensorSpec",
    "SparseTensorSpec",
    "TensorSpec",
    "assert_same_structure",
    "flatten",
    "flatten_up_to",
    "is_nested",
    "map_structure",
    "pack_sequence_as",
    "spec_from_value",
]
