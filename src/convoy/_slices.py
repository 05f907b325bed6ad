"""IndexedSlices: a sparse update to some rows of a tensor (as TensorFlow names it); and the
row gather and scatter that sparse reads and updates use."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from convoy.errors import InvalidArgumentError


class IndexedSlices(NamedTuple):
    """Rows ``values[i]`` meant for rows ``indices[i]`` of a tensor of ``dense_shape``."""

    values: Any
    indices: Any
    dense_shape: Any = None

    def checked(self, argument: str = "sparse_delta",
                row_shape: tuple[int, ...] | None = None) -> IndexedSlices:
        """A copy with numpy values and integer indices whose shapes agree (and, given the
        ``row_shape`` of the target, values of shape ``indices.shape + row_shape``)."""
        values, indices = np.asarray(self.values), np.asarray(self.indices)
        if indices.dtype.kind not in "iu":
            raise InvalidArgumentError(f"{argument}.indices must be integers, got {indices.dtype}")
        if values.shape[:indices.ndim] != indices.shape:
            raise InvalidArgumentError(
                f"{argument}: values of shape {list(values.shape)} do not start with the "
                f"indices' shape {list(indices.shape)}"
            )
        if row_shape is not None and values.shape != indices.shape + tuple(row_shape):
            raise InvalidArgumentError(
                f"{argument}: values of shape {list(values.shape)} do not match indices of "
                f"shape {list(indices.shape)} for rows of shape {list(row_shape)} (expected "
                f"{list(indices.shape + tuple(row_shape))})"
            )
        return IndexedSlices(values, indices, self.dense_shape)


def take_rows(array: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``array[rows]``: np.take copies rows about twice as fast as fancy indexing."""
    return np.take(array, rows, axis=0)


def put_rows(array: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
    """``array[rows] = values`` (a repeated row gets its last value). Whole rows are put as
    single items of a C-contiguous array, about twice as fast as fancy indexing."""
    values = np.asarray(values, dtype=array.dtype)
    row_bytes = array.strides[0] if array.ndim else 0
    if array.ndim < 2 or not array.flags.c_contiguous or row_bytes == 0 or not len(rows):
        array[rows] = values
        return
    item = np.dtype((np.void, row_bytes))
    flat_values = np.ascontiguousarray(values).reshape(len(rows), -1)
    np.put(array.reshape(len(array), -1).view(item).reshape(-1), rows,
           flat_values.view(item).reshape(-1))
