"""Row streams: elements that are rows of one source's arrays, handed on as row numbers.

Between ``from_tensor_slices`` and a ``batch`` (or ``padded_batch``), ops that only choose,
reorder or regroup rows (repeat, take, skip, shuffle, unbatch) can pass on which rows come
next instead of the rows themselves; the batch then cuts or gathers its rows from the arrays
at once, with no Python work per element. Such an op returns the arrays (a
:class:`RowSource`) from ``row_source()`` and builds a :class:`RowNode` with
``row_iterator(state, key)``; any other op returns None and its consumers take elements one
by one. A row stream gives exactly the elements, in the order, that the ops' element
iterators give (shuffle draws the same random numbers), and a row node's state is its op's
element state wherever that state holds no elements (slices, repeat, take, skip).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from convoy._values import nest

#: Rows ``start:stop`` as a slice, or any rows as an array of row numbers.
Chunk = slice | np.ndarray

# element-wise batching of a 1-D text column makes an object array (see _batch._stack_leaves)
_TEXT = "SU"
# batched by numpy alone, whatever the values; object columns depend on what they hold
_BATCHABLE = "biufcmMSU"
# the Python values an object column's rows may hold and still batch by gathering rows (what
# from_tensor_slices makes of strings); other objects batch element by element
_GATHERABLE_OBJECTS = (bytes,)
_PADDABLE = "biufc"


class RowSource:
    """The arrays whose rows are a row stream's elements, structured as ``structure``."""

    __slots__ = ("structure", "leaves", "single", "flat_tuple", "_text")

    def __init__(self, structure: Any, leaves: list[np.ndarray]) -> None:
        self.structure = structure
        self.leaves = leaves
        self.single = not nest.is_nested(structure)
        self.flat_tuple = type(structure) is tuple and not any(map(nest.is_nested, structure))
        self._text = [leaf.ndim == 1 and leaf.dtype.kind in _TEXT for leaf in leaves]

    def num_rows(self) -> int:
        return self.leaves[0].shape[0]

    def batchable(self) -> bool:
        """Whether a batch of rows gathered from the arrays equals one stacked from elements
        (stacking scalars makes native byte order)."""
        return all(_batchable(leaf) for leaf in self.leaves)

    def paddable(self) -> bool:
        return all(leaf.dtype.kind in _PADDABLE and leaf.dtype.isnative for leaf in self.leaves)

    def element_at(self, index: int) -> Any:
        return self.pack([leaf[index] for leaf in self.leaves])

    def pack(self, leaves: list[Any]) -> Any:
        if self.single:
            return leaves[0]
        if self.flat_tuple:
            return tuple(leaves)
        return nest.pack_sequence_as(self.structure, leaves)

    def gather(self, chunks: list[Chunk]) -> list[np.ndarray]:
        """Each array's rows ``chunks``, stacked as ``batch`` stacks elements (new arrays)."""
        return [_text_column(column) if text else column
                for column, text in zip(map(_taker(chunks), self.leaves), self._text)]

    def unbatched(self) -> RowSource | None:
        """The source of ``unbatch`` over these rows (row ``i`` becomes rows ``i*m`` to
        ``i*m + m - 1``), or None where unbatch would fail (a scalar component, or
        components of different lengths)."""
        if any(leaf.ndim < 2 for leaf in self.leaves):
            return None
        if len({leaf.shape[1] for leaf in self.leaves}) != 1:
            return None
        return RowSource(self.structure, [leaf.reshape(-1, *leaf.shape[2:])
                                          for leaf in self.leaves])


def _batchable(leaf: np.ndarray) -> bool:
    if leaf.dtype.kind == "O":
        return all(type(value) in _GATHERABLE_OBJECTS for value in leaf.flat)
    return leaf.dtype.kind in _BATCHABLE and leaf.dtype.isnative


def _taker(chunks: list[Chunk]) -> Any:
    if len(chunks) == 1:
        chunk = chunks[0]
        if type(chunk) is slice:
            return lambda leaf: leaf[chunk].copy()
        return lambda leaf: leaf.take(chunk, axis=0)
    return lambda leaf: np.concatenate([leaf[chunk] for chunk in chunks])


def _text_column(column: np.ndarray) -> np.ndarray:
    array = np.empty(len(column), dtype=object)
    array[:] = list(column)
    return array


def chunk_rows(chunks: list[Chunk]) -> int:
    return sum(c.stop - c.start if type(c) is slice else len(c) for c in chunks)


def row_numbers(chunks: list[Chunk]) -> np.ndarray:
    """The row numbers of ``chunks`` as one array."""
    parts = [np.arange(c.start, c.stop) if type(c) is slice else c for c in chunks]
    if not parts:
        return np.empty(0, dtype=np.intp)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


class RowNode:
    """A live row stream: ``pull(n)`` hands on its next ``n`` rows (fewer only at its end)."""

    __slots__ = ()

    def pull(self, n: int) -> tuple[int, list[Chunk]]:
        """How many rows, and which: up to ``n``, fewer only when the stream has ended."""
        raise NotImplementedError(f"{type(self).__name__} must implement pull()")

    def state_dict(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement state_dict()")

    def close(self) -> None:
        """Release what the stream holds; the default holds nothing."""


class SliceRows(RowNode):
    """The rows of a source in order, from ``position``; its state is that position."""

    __slots__ = ("position", "total")

    def __init__(self, total: int, position: int) -> None:
        self.total = total
        self.position = position

    def pull(self, n: int) -> tuple[int, list[Chunk]]:
        start = self.position
        stop = min(start + n, self.total)
        if stop <= start:
            return 0, []
        self.position = stop
        return stop - start, [slice(start, stop)]

    def state_dict(self) -> int:
        return self.position


def split_rows(chunks: list[Chunk], k: int) -> tuple[list[Chunk], list[Chunk]]:
    """The first ``k`` rows of ``chunks``, and the rest."""
    head: list[Chunk] = []
    for i, chunk in enumerate(chunks):
        n = chunk.stop - chunk.start if type(chunk) is slice else len(chunk)
        if k >= n:
            head.append(chunk)
            k -= n
            continue
        first: Chunk
        rest: Chunk
        if type(chunk) is slice:
            first, rest = slice(chunk.start, chunk.start + k), slice(chunk.start + k, chunk.stop)
        else:
            first, rest = chunk[:k], chunk[k:]
        if k:
            head.append(first)
        return head, [rest, *chunks[i + 1:]]
    return head, []


def widen(chunks: list[Chunk], width: int) -> list[Chunk]:
    """Row ``i`` of ``chunks`` as rows ``i * width`` to ``i * width + width - 1``."""
    out: list[Chunk] = []
    for chunk in chunks:
        if type(chunk) is slice:
            out.append(slice(chunk.start * width, chunk.stop * width))
        else:
            out.append((chunk[:, None] * width + np.arange(width)).ravel())
    return out
