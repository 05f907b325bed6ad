"""Elements as PyTorch takes them: numpy leaves become torch tensors, writable, dtypes kept.

An array is shared with its tensor (no copy) when numpy lets it be written; a read-only one
(the data service hands out views on gRPC messages and on shared memory) is copied, so every
tensor can be changed in place and ``torch.from_numpy`` never warns. Byte-string arrays become
(nested) lists of ``bytes``; numpy and Python numbers become 0-d tensors.

A :class:`~convoy.SparseTensor` becomes a sparse COO tensor. A :class:`~convoy.RaggedTensor` of
``ragged_rank`` 1 becomes a nested tensor of the jagged layout (PyTorch's nested tensors have one
ragged dimension), its rows; a deeper one a list of its rows, each converted so. Sparse and ragged
byte strings become what ``to_list()`` gives (ragged) or stay as they are (sparse).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from convoy._values import nest
from convoy._values.tensors import RaggedTensor, SparseTensor
from convoy.errors import InvalidArgumentError

#: numpy dtypes and the torch dtypes they become, one to one. torch 2.13 stores uint16,
#: uint32 and uint64 but has few operations for them (no ``add``): convert those with
#: ``.to(torch.int64)`` before arithmetic.
TORCH_DTYPES: dict[np.dtype, torch.dtype] = {
    np.dtype(np.bool_): torch.bool,
    np.dtype(np.int8): torch.int8,
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.int16): torch.int16,
    np.dtype(np.uint16): torch.uint16,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.uint32): torch.uint32,
    np.dtype(np.int64): torch.int64,
    np.dtype(np.uint64): torch.uint64,
    np.dtype(np.float16): torch.float16,
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float64): torch.float64,
    np.dtype(np.complex64): torch.complex64,
    np.dtype(np.complex128): torch.complex128,
}

#: Python numbers as convoy's specs type them (a float is float64, as in numpy).
_PYTHON_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float64,
                  complex: torch.complex128}


def to_torch(element: Any) -> Any:
    """``element`` (a structure) with each numpy leaf as a torch tensor or list of bytes."""
    return nest.map_structure(_leaf, element)


def _leaf(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return _array(value)
    if isinstance(value, np.generic):
        if isinstance(value, (np.bytes_, np.str_)):
            return value.item()
        return _array(np.asarray(value))
    if isinstance(value, SparseTensor):
        return _sparse(value)
    if isinstance(value, RaggedTensor):
        return _ragged(value)
    dtype = _PYTHON_DTYPES.get(type(value))
    if dtype is not None:
        return torch.tensor(value, dtype=dtype)
    return value  # torch tensors, bytes, str and what torch has no form for


def _sparse(value: SparseTensor) -> Any:
    if value.dtype.kind in "OSU":
        return value  # torch has no sparse tensors of strings
    return torch.sparse_coo_tensor(_array(value.indices.T), _array(value.values),
                                   value.shape, check_invariants=True,
                                   is_coalesced=_in_order(value))


def _in_order(value: SparseTensor) -> bool:
    """Whether the entries are in row-major order without repeats (as TensorFlow's ops make
    them): torch calls that coalesced, and lets ``values()`` and ``indices()`` be read."""
    if len(value.values) < 2:
        return True
    try:
        flat = np.ravel_multi_index(tuple(value.indices.T), value.shape)
    except ValueError:  # an index out of bounds (torch names it) or a shape beyond int64
        return False
    return bool((np.diff(flat) > 0).all())


def _ragged(value: RaggedTensor) -> Any:
    if value.dtype.kind in "OSU":
        return value.to_list()
    if value.ragged_rank > 1:
        return [_ragged(row) for row in value]
    values = value.values
    assert isinstance(values, np.ndarray)  # ragged_rank 1
    return torch.nested.nested_tensor_from_jagged(_array(values), _array(value.row_splits))


def _array(array: np.ndarray) -> Any:
    if array.dtype.kind in "OSU":
        return array.tolist()  # strings: nested lists of bytes (or str)
    native = array.dtype.newbyteorder("=")
    if native not in TORCH_DTYPES:
        raise InvalidArgumentError(
            f"an element holds an array of dtype {array.dtype}, which has no torch dtype; "
            f"map it to one of {sorted(str(d) for d in TORCH_DTYPES)} first")
    if array.dtype != native:
        array = array.astype(native)  # a copy, writable
    if array.flags.writeable and all(stride >= 0 for stride in array.strides):
        try:
            return torch.from_numpy(array)
        except (TypeError, ValueError, RuntimeError):  # memory torch cannot view: copy it
            pass
    return torch.from_numpy(array.copy())
