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


def owned(value: Any) -> Any:
    """A copy of ``value`` (an array or IndexedSlices): an update sent after its call returns
    (as a scheduled function's are) must not see the caller reuse its buffers."""
    if isinstance(value, IndexedSlices):
        return IndexedSlices(np.array(value.values), np.array(value.indices), value.dense_shape)
    return np.array(value)


def take_rows(array: np.ndarray, rows: Any) -> np.ndarray:
    """``array[rows]`` for integer ``rows`` within bounds: np.take copies rows about twice as
    fast as fancy indexing."""
    return np.take(array, _positions(rows), axis=0)


def put_rows(array: np.ndarray, rows: Any, values: Any) -> None:
    """``array[rows] = values`` for integer ``rows`` within bounds (a repeated row gets its last
    value). Whole rows of a C-contiguous array are put as single items, about twice as fast as
    fancy indexing."""
    rows = _positions(rows)
    values = np.asarray(values, dtype=array.dtype)
    row_bytes = array.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))
    if array.ndim < 2 or not array.flags.c_contiguous or not row_bytes or rows.ndim != 1:
        array[rows] = values
        return
    if rows.size:
        width = row_bytes // array.itemsize
        item = np.dtype((np.void, row_bytes))
        flat_values = np.ascontiguousarray(values).reshape(rows.size, width)
        np.put(array.reshape(len(array), width).view(item).reshape(-1), rows,
               flat_values.view(item).reshape(-1))


def _positions(rows: Any) -> np.ndarray:
    rows = np.asarray(rows)
    return rows if rows.dtype == np.intp else rows.astype(np.intp)  # np.put takes no uint64


def combine_rows(combine: np.ufunc, array: np.ndarray, rows: Any, values: Any) -> None:
    """``combine.at(array, rows, values)`` (rows within bounds, ``values`` shaped
    ``rows.shape + array.shape[1:]``) with the same result: a repeated row is combined with
    its values one by one, in their order. ``ufunc.at`` takes one element at a time; this
    combines each row's first value as whole rows and only the repeats element-wise."""
    rows = _positions(rows).reshape(-1)
    values = np.asarray(values, dtype=array.dtype).reshape((rows.size, *array.shape[1:]))
    if rows.size < 2:
        combine.at(array, rows, values)
        return
    order = np.argsort(rows, kind="stable")  # stable: a row's repeats keep their order
    ordered = rows[order]
    first = np.empty(rows.size, bool)
    first[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    unique = ordered[first]
    part = take_rows(array, unique)
    combine(part, take_rows(values, order[first]), out=part)
    if unique.size < rows.size:
        later = ~first
        combine.at(part, np.cumsum(first)[later] - 1, take_rows(values, order[later]))
    put_rows(array, unique, part)
