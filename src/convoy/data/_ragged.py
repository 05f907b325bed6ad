"""ragged_batch and sparse_batch: batches of elements whose shapes differ."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any

import numpy as np

from convoy import nest
from convoy._tensors import RaggedTensor, SparseTensor
from convoy.data._batch import BatchOp, stack
from convoy.data._op import Node, Op, PassNode
from convoy.errors import InvalidArgumentError


def _ragged_rows(rows: list[Any]) -> RaggedTensor:
    """Rows (arrays of rank >= 1, or ragged tensors) as one ragged tensor, a row each."""
    if isinstance(rows[0], RaggedTensor):
        flat = np.concatenate([r.flat_values for r in rows])
        levels = []
        for level in range(rows[0].ragged_rank):
            parts, offset = [np.zeros(1, np.int64)], 0
            for r in rows:
                splits = r.nested_row_splits[level]
                parts.append(splits[1:] + offset)
                offset += int(splits[-1])
            levels.append(np.concatenate(parts))
        lengths = [r.nrows() for r in rows]
        return RaggedTensor.from_row_lengths(
            RaggedTensor.from_nested_row_splits(flat, levels), lengths)
    arrays = [np.asarray(r) for r in rows]
    inner = {a.shape[1:] for a in arrays}
    if len(inner) > 1:
        raise InvalidArgumentError(
            f"ragged_batch: the elements' dimensions after the first must agree, got shapes "
            f"{[list(a.shape) for a in arrays]}")
    values = np.concatenate(arrays) if arrays else np.empty((0,))
    return RaggedTensor.from_row_lengths(values, [len(a) for a in arrays])


def ragged_stack(elements: list[Any]) -> Any:
    """A batch where every component of rank >= 1 becomes a ragged tensor (scalars stack)."""
    first = elements[0]
    columns = list(zip(*map(nest.flatten, elements), strict=True))
    out = []
    for column in columns:
        leaf = column[0]
        if isinstance(leaf, RaggedTensor) or np.ndim(leaf) >= 1:
            out.append(_ragged_rows(list(column)))
        else:
            out.append(stack(list(column)))
    return out[0] if not nest.is_nested(first) else nest.pack_sequence_as(first, out)


class RaggedBatchOp(BatchOp):
    def iterator(self, state: Any, key: int) -> Node:
        input = self.input.iterator(state, key)
        return PassNode(input, self._run(input.gen))

    def _run(self, upstream: Iterator[Any]) -> Iterator[Any]:
        while True:
            chunk = list(islice(upstream, self.batch_size))
            if len(chunk) < self.batch_size and (self.drop_remainder or not chunk):
                return
            yield ragged_stack(chunk)

    def static_spec(self) -> Any:
        return None


class SparseBatchOp(BatchOp):
    """Batches as sparse tensors of dense shape ``[batch, *row_shape]`` (a -1 in
    ``row_shape``: the largest size in the batch); every entry of an element is a value."""

    def __init__(self, input: Op, batch_size: int, row_shape: tuple[int, ...]) -> None:
        super().__init__(input, batch_size, False)
        self.row_shape = row_shape

    def iterator(self, state: Any, key: int) -> Node:
        input = self.input.iterator(state, key)
        return PassNode(input, self._run(input.gen))

    def _run(self, upstream: Iterator[Any]) -> Iterator[Any]:
        while True:
            chunk = list(islice(upstream, self.batch_size))
            if not chunk:
                return
            yield self.sparse(chunk)

    def sparse(self, elements: list[Any]) -> SparseTensor:
        arrays = []
        for element in elements:
            if nest.is_nested(element):
                raise InvalidArgumentError(
                    "sparse_batch only supports inputs with a single component, got "
                    f"{type(element).__name__}")
            array = np.asarray(element)
            if array.ndim != len(self.row_shape) or any(
                    want >= 0 and have > want for have, want in zip(array.shape, self.row_shape)):
                raise InvalidArgumentError(
                    f"Input element had shape ({', '.join(map(str, array.shape))}) that is "
                    f"incompatible with the row shape "
                    f"({', '.join(map(str, self.row_shape))}).")
            arrays.append(array)
        shape = [want if want >= 0 else max(a.shape[d] for a in arrays)
                 for d, want in enumerate(self.row_shape)]
        indices = [np.column_stack([np.full(a.size, i, np.int64),
                                    *[ix.ravel() for ix in np.indices(a.shape, np.int64)]])
                   for i, a in enumerate(arrays)]
        values = np.concatenate([a.ravel() for a in arrays])
        return SparseTensor(np.concatenate(indices).reshape(-1, 1 + len(shape)), values,
                            [len(arrays), *shape])

    def static_spec(self) -> Any:
        return None
