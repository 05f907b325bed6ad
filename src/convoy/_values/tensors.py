"""Sparse and ragged values, as TensorFlow names them: numpy arrays inside, immutable.

A :class:`SparseTensor` holds the non-default entries of a dense array (``indices``,
``values``, ``dense_shape``); a :class:`RaggedTensor` holds rows of different lengths
(``values`` cut by ``row_splits``, nested for several ragged dimensions). Both are leaves of
:mod:`convoy._values.nest` structures and pickle as their arrays (so the codec sends those out of
band). They compare by identity: compare their arrays, or use
:func:`convoy.testing.assert_equal`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from convoy.errors import InvalidArgumentError

__all__ = ["RaggedTensor", "SparseTensor"]

_STRING = np.dtype(object)


def _frozen(array: np.ndarray) -> np.ndarray:
    """A read-only view of ``array`` (the caller's array itself stays writable)."""
    view = array.view()
    view.flags.writeable = False
    return view


def _as_values(values: Any, argument: str) -> np.ndarray:
    if isinstance(values, np.ndarray):
        return values
    if isinstance(values, (list, tuple)) and any(isinstance(v, (bytes, str)) for v in values):
        return np.array(values, dtype=object)
    try:
        return np.asarray(values)
    except (TypeError, ValueError) as error:
        raise InvalidArgumentError(f"{argument} must be array-like: {error}") from None


def _as_int64(value: Any, argument: str, ndim: int) -> np.ndarray:
    array = np.asarray(value)
    if array.size == 0 and array.dtype.kind not in "iu":
        array = array.astype(np.int64)
    if array.dtype.kind not in "iu":
        raise InvalidArgumentError(f"{argument} must hold integers, got dtype {array.dtype}")
    if array.ndim != ndim:
        raise InvalidArgumentError(
            f"{argument} must be {ndim}-D, got shape {list(array.shape)}"
        )
    return array if array.dtype == np.int64 else array.astype(np.int64)


def _zero(dtype: np.dtype) -> Any:
    return b"" if dtype == _STRING else dtype.type(0)


def _filled(shape: tuple[int, ...], value: Any, dtype: np.dtype) -> np.ndarray:
    out = np.empty(shape, dtype)
    out.fill(value)
    return out


class SparseTensor:
    """A sparse array: ``values[i]`` sits at ``indices[i]`` in an array of ``dense_shape``.

    ``indices`` is int64 ``[N, rank]``, ``values`` 1-D ``[N]``, ``dense_shape`` int64
    ``[rank]``. Entries not listed hold the default value (zero, or ``b""`` for byte strings).
    """

    __slots__ = ("_indices", "_values", "_dense_shape")

    def __init__(self, indices: Any, values: Any, dense_shape: Any) -> None:
        dense_shape = _as_int64(dense_shape, "dense_shape", 1)
        indices = np.asarray(indices)
        if indices.size == 0:
            indices = indices.reshape(0, len(dense_shape))
        indices = _as_int64(indices, "indices", 2)
        values = _as_values(values, "values")
        if values.ndim != 1:
            raise InvalidArgumentError(f"values must be 1-D, got shape {list(values.shape)}")
        if len(values) != len(indices):
            raise InvalidArgumentError(
                f"values has {len(values)} entries but indices has {len(indices)} rows"
            )
        if indices.shape[1] != len(dense_shape):
            raise InvalidArgumentError(
                f"indices has {indices.shape[1]} columns but dense_shape has rank "
                f"{len(dense_shape)}"
            )
        if (dense_shape < 0).any():
            raise InvalidArgumentError(f"dense_shape must be >= 0, got {dense_shape.tolist()}")
        self._indices = _frozen(indices)
        self._values = _frozen(values)
        self._dense_shape = _frozen(dense_shape)

    @classmethod
    def _unchecked(cls, indices: np.ndarray, values: np.ndarray,
                   dense_shape: np.ndarray) -> SparseTensor:
        """From arrays already of the right types and shapes, which the caller gives up."""
        self = cls.__new__(cls)
        self._indices = _frozen(indices)
        self._values = _frozen(values)
        self._dense_shape = _frozen(dense_shape)
        return self

    @classmethod
    def from_dense(cls, tensor: Any) -> SparseTensor:
        """The entries of ``tensor`` that differ from zero (``b""`` for byte strings)."""
        dense = _as_values(tensor, "tensor")
        mask = dense != _zero(dense.dtype)
        indices = np.argwhere(mask).astype(np.int64)
        return cls._unchecked(indices, dense[mask],
                              np.array(dense.shape, dtype=np.int64))

    @property
    def indices(self) -> np.ndarray:
        """int64 ``[N, rank]``: the position of each value."""
        return self._indices

    @property
    def values(self) -> np.ndarray:
        """1-D ``[N]``: the values at ``indices``."""
        return self._values

    @property
    def dense_shape(self) -> np.ndarray:
        """int64 ``[rank]``: the shape of the dense array."""
        return self._dense_shape

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self._dense_shape)

    @property
    def dtype(self) -> np.dtype:
        return self._values.dtype

    @property
    def rank(self) -> int:
        return len(self._dense_shape)

    def to_dense(self, default_value: Any = None) -> np.ndarray:
        """The dense array, ``default_value`` (zero or ``b""`` if None) where nothing is set."""
        dtype = self.dtype
        fill = _zero(dtype) if default_value is None else default_value
        out = _filled(self.shape, fill, dtype)
        if len(self._values):
            out[tuple(self._indices.T)] = self._values
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        return (SparseTensor._unchecked, (self._indices, self._values, self._dense_shape))

    def __repr__(self) -> str:
        return (f"SparseTensor(indices={self._indices.tolist()}, "
                f"values={self._values.tolist()}, dense_shape={self._dense_shape.tolist()})")


class RaggedTensor:
    """Rows of different lengths: row ``i`` is ``values[row_splits[i]:row_splits[i + 1]]``.

    ``values`` is a numpy array (its first dimension cut into rows, the others uniform) or
    another RaggedTensor (several ragged dimensions). Build one with :meth:`from_row_splits`,
    :meth:`from_row_lengths`, :meth:`from_value_rowids` or :meth:`from_nested_row_splits`.
    """

    __slots__ = ("_values", "_row_splits")

    _values: np.ndarray | RaggedTensor
    _row_splits: np.ndarray

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(
            "build a RaggedTensor with RaggedTensor.from_row_splits, from_row_lengths, "
            "from_value_rowids or from_nested_row_splits"
        )

    @classmethod
    def _unchecked(cls, values: np.ndarray | RaggedTensor,
                   row_splits: np.ndarray) -> RaggedTensor:
        self = cls.__new__(cls)
        self._values = values if isinstance(values, RaggedTensor) else _frozen(values)
        self._row_splits = _frozen(row_splits)
        return self

    @classmethod
    def from_row_splits(cls, values: Any, row_splits: Any,
                        validate: bool = True) -> RaggedTensor:
        """Rows ``values[row_splits[i]:row_splits[i + 1]]``; ``row_splits`` starts at 0, never
        decreases and ends at ``len(values)``."""
        if not isinstance(values, RaggedTensor):
            values = _as_values(values, "values")
            if values.ndim < 1:
                raise InvalidArgumentError("values must have at least one dimension, got a "
                                           "scalar")
        splits = _as_int64(row_splits, "row_splits", 1)
        if np.asarray(row_splits).dtype == np.int32:  # TensorFlow's other row_splits_dtype
            splits = splits.astype(np.int32)
        if validate:
            if len(splits) == 0 or splits[0] != 0:
                raise InvalidArgumentError(
                    f"row_splits must start with 0, got {splits[:5].tolist()}"
                )
            if (np.diff(splits) < 0).any():
                raise InvalidArgumentError("row_splits must not decrease")
            if splits[-1] != len(values):
                raise InvalidArgumentError(
                    f"row_splits must end at len(values) = {len(values)}, got {splits[-1]}"
                )
        return cls._unchecked(values, splits)

    @classmethod
    def from_row_lengths(cls, values: Any, row_lengths: Any,
                         validate: bool = True) -> RaggedTensor:
        """Rows of ``row_lengths[i]`` consecutive values each."""
        lengths = _as_int64(row_lengths, "row_lengths", 1)
        if validate and (lengths < 0).any():
            raise InvalidArgumentError("row_lengths must be >= 0")
        splits = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=splits[1:])
        return cls.from_row_splits(values, splits, validate=validate)

    @classmethod
    def from_value_rowids(cls, values: Any, value_rowids: Any, nrows: int | None = None,
                          validate: bool = True) -> RaggedTensor:
        """Rows where ``values[i]`` belongs to row ``value_rowids[i]`` (sorted ids; ``nrows``
        defaults to the last id + 1)."""
        rowids = _as_int64(value_rowids, "value_rowids", 1)
        if validate and len(rowids) and ((np.diff(rowids) < 0).any() or rowids[0] < 0):
            raise InvalidArgumentError("value_rowids must be >= 0 and sorted")
        if nrows is None:
            nrows = int(rowids[-1]) + 1 if len(rowids) else 0
        elif validate and len(rowids) and rowids[-1] >= nrows:
            raise InvalidArgumentError(f"value_rowids must be < nrows = {nrows}")
        return cls.from_row_lengths(values, np.bincount(rowids, minlength=nrows),
                                    validate=validate)

    @classmethod
    def from_nested_row_splits(cls, flat_values: Any, nested_row_splits: Sequence[Any],
                               validate: bool = True) -> RaggedTensor:
        """Several ragged dimensions: ``nested_row_splits[0]`` cuts the outermost."""
        if len(nested_row_splits) == 0:
            raise InvalidArgumentError("nested_row_splits must hold at least one row_splits")
        result: Any = flat_values
        for splits in reversed(nested_row_splits):
            result = cls.from_row_splits(result, splits, validate=validate)
        return result

    @classmethod
    def from_nested_row_lengths(cls, flat_values: Any, nested_row_lengths: Sequence[Any],
                                validate: bool = True) -> RaggedTensor:
        """Several ragged dimensions: ``nested_row_lengths[0]`` cuts the outermost."""
        if len(nested_row_lengths) == 0:
            raise InvalidArgumentError("nested_row_lengths must hold at least one row_lengths")
        result: Any = flat_values
        for lengths in reversed(nested_row_lengths):
            result = cls.from_row_lengths(result, lengths, validate=validate)
        return result

    @property
    def values(self) -> np.ndarray | RaggedTensor:
        """The rows' contents concatenated (a RaggedTensor if ``ragged_rank`` > 1)."""
        return self._values

    @property
    def row_splits(self) -> np.ndarray:
        """int64 ``[nrows + 1]``: where each row starts (and the last ends) in ``values``."""
        return self._row_splits

    @property
    def row_splits_dtype(self) -> np.dtype:
        """The dtype of the row splits: int64, or int32 where asked for."""
        return self._row_splits.dtype

    def with_row_splits_dtype(self, dtype: Any) -> RaggedTensor:
        """The same rows with every ragged dimension's row splits of ``dtype`` (int32 or
        int64)."""
        dtype = np.dtype(dtype)
        if dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise InvalidArgumentError(f"dtype must be int32 or int64, got {dtype}")
        values = self._values
        if isinstance(values, RaggedTensor):
            values = values.with_row_splits_dtype(dtype)
        return RaggedTensor._unchecked(values, self._row_splits.astype(dtype, copy=False))

    @property
    def nested_row_splits(self) -> tuple[np.ndarray, ...]:
        """The ``row_splits`` of each ragged dimension, outermost first."""
        splits = [self._row_splits]
        inner = self._values
        while isinstance(inner, RaggedTensor):
            splits.append(inner._row_splits)
            inner = inner._values
        return tuple(splits)

    @property
    def flat_values(self) -> np.ndarray:
        """The innermost values, a numpy array."""
        inner = self._values
        while isinstance(inner, RaggedTensor):
            inner = inner._values
        return inner

    @property
    def ragged_rank(self) -> int:
        """How many dimensions are ragged."""
        return len(self.nested_row_splits)

    @property
    def shape(self) -> tuple[int | None, ...]:
        """``(nrows, None, ..., *uniform inner dimensions)``: None for a ragged dimension."""
        return (self.nrows(),) + (None,) * self.ragged_rank + self.flat_values.shape[1:]

    @property
    def dtype(self) -> np.dtype:
        return self.flat_values.dtype

    @property
    def rank(self) -> int:
        return len(self.shape)

    def nrows(self) -> int:
        return len(self._row_splits) - 1

    def row_lengths(self) -> np.ndarray:
        """int64 ``[nrows]``: the length of each row."""
        return np.diff(self._row_splits)

    def value_rowids(self) -> np.ndarray:
        """int64 ``[len(values)]``: the row each value belongs to."""
        return np.repeat(np.arange(self.nrows(), dtype=np.int64), self.row_lengths())

    def row_starts(self) -> np.ndarray:
        """int64 ``[nrows]``: where each row starts in ``values`` (``row_splits[:-1]``)."""
        return self._row_splits[:-1]

    def row_limits(self) -> np.ndarray:
        """int64 ``[nrows]``: where each row ends in ``values`` (``row_splits[1:]``)."""
        return self._row_splits[1:]

    def with_values(self, new_values: Any) -> RaggedTensor:
        """The same rows over ``new_values`` (as many as ``values``, in their place)."""
        if not isinstance(new_values, RaggedTensor):
            new_values = _as_values(new_values, "new_values")
            if new_values.ndim < 1:
                raise InvalidArgumentError("new_values must have at least one dimension")
        if len(new_values) != len(self._values):
            raise InvalidArgumentError(f"new_values must have {len(self._values)} rows, got "
                                       f"{len(new_values)}")
        return RaggedTensor._unchecked(new_values, self._row_splits)

    def with_flat_values(self, new_values: Any) -> RaggedTensor:
        """The same ragged dimensions over ``new_values`` in place of ``flat_values``."""
        values = self._values
        if isinstance(values, RaggedTensor):
            return RaggedTensor._unchecked(values.with_flat_values(new_values), self._row_splits)
        return self.with_values(new_values)

    def to_list(self) -> list[Any]:
        """Nested Python lists (of Python scalars or ``bytes``)."""
        inner: list[Any] = self.flat_values.tolist()
        for splits in reversed(self.nested_row_splits):
            bounds = splits.tolist()
            inner = [inner[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        return inner

    def to_tensor(self, default_value: Any = None) -> np.ndarray:
        """A dense array padded with ``default_value`` (zero or ``b""`` if None), each ragged
        dimension as long as its longest row."""
        values = self._values
        dense = values.to_tensor(default_value) if isinstance(values, RaggedTensor) else values
        fill = _zero(dense.dtype) if default_value is None else default_value
        lengths = self.row_lengths()
        width = int(lengths.max()) if len(lengths) else 0
        out = _filled((self.nrows(), width, *dense.shape[1:]), fill, dense.dtype)
        rows = self.value_rowids()
        columns = np.arange(len(rows), dtype=np.int64) - self._row_splits[rows]
        out[rows, columns] = dense
        return out

    def _rows(self, start: int, stop: int) -> RaggedTensor:
        splits = self._row_splits[start:stop + 1]
        first, last = int(splits[0]), int(splits[-1])
        values = self._values
        part = values._rows(first, last) if isinstance(values, RaggedTensor) else \
            values[first:last]
        return RaggedTensor._unchecked(part, splits - first)

    def __len__(self) -> int:
        return self.nrows()

    def __getitem__(self, key: int | slice) -> Any:
        """Row ``key`` (a numpy array, or a RaggedTensor if ``ragged_rank`` > 1), or the
        rows of a slice (step 1) as a RaggedTensor."""
        nrows = self.nrows()
        if isinstance(key, slice):
            start, stop, step = key.indices(nrows)
            if step != 1:
                raise InvalidArgumentError(f"RaggedTensor slices take step 1, got {key.step}")
            return self._rows(start, max(start, stop))
        try:
            index = int(key)
        except TypeError:
            raise InvalidArgumentError(
                f"RaggedTensor index must be an int or a slice, got {type(key).__name__}"
            ) from None
        if not -nrows <= index < nrows:
            raise IndexError(f"row {index} out of range for a RaggedTensor of {nrows} rows")
        index %= nrows
        first, last = int(self._row_splits[index]), int(self._row_splits[index + 1])
        values = self._values
        return values._rows(first, last) if isinstance(values, RaggedTensor) else \
            values[first:last]

    def __iter__(self) -> Iterator[Any]:
        for index in range(self.nrows()):
            yield self[index]

    def __reduce__(self) -> tuple[Any, ...]:
        return (_ragged_from_parts, (self.flat_values, self.nested_row_splits))

    def __repr__(self) -> str:
        return f"<RaggedTensor {self.to_list()!r}>"


def _ragged_from_parts(flat_values: np.ndarray,
                       nested_row_splits: tuple[np.ndarray, ...]) -> RaggedTensor:
    result: Any = flat_values
    for splits in reversed(nested_row_splits):
        result = RaggedTensor._unchecked(result, splits)
    return result
