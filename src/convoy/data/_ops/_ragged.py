"""ragged_batch and sparse_batch: batches of elements whose shapes differ."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from typing import Any

import numpy as np

from convoy._values import nest
from convoy._values.tensors import RaggedTensor, SparseTensor
from convoy.data._core._composite import batched_spec, stack_ragged
from convoy.data._core._op import Node, Op, PassNode
from convoy.data._ops._batch import BatchOp, stack
from convoy.errors import InvalidArgumentError


def ragged_stack(elements: list[Any]) -> Any:
    """A batch where every component of rank >= 1 becomes a ragged tensor (scalars stack)."""
    first = elements[0]
    columns = list(zip(*map(nest.flatten, elements), strict=True))
    out = []
    for i, column in enumerate(columns):
        leaf = column[0]
        if isinstance(leaf, RaggedTensor) or np.ndim(leaf) >= 1:
            out.append(stack_ragged(list(column), i))
        else:
            out.append(stack(list(column)))
    return out[0] if not nest.is_nested(first) else nest.pack_sequence_as(first, out)


class RaggedBatchOp(BatchOp):
    """``ragged_batch``: dense components of rank >= 1 become ragged, their row splits of
    ``row_splits_dtype``."""

    row_splits_dtype = np.dtype(np.int64)

    def iterator(self, state: Any, key: int) -> Node:
        input = self.input.iterator(state, key)
        return PassNode(input, self._run(input.gen))

    def _run(self, upstream: Iterator[Any]) -> Iterator[Any]:
        while True:
            chunk = list(islice(upstream, self.batch_size))
            if len(chunk) < self.batch_size and (self.drop_remainder or not chunk):
                return
            batch = ragged_stack(chunk)
            if self.row_splits_dtype != np.int64:
                batch = _with_splits_dtype(chunk[0], batch, self.row_splits_dtype)
            yield batch

    def static_spec(self) -> Any:
        spec = self.input.static_spec()
        if spec is None or any(s.rank is None for s in nest.flatten(spec)):
            return None
        size = self.batch_size if self.drop_remainder else None
        return nest.map_structure(
            lambda s: _ragged_batch_spec(s, size, self.row_splits_dtype), spec)


def _with_splits_dtype(first: Any, batch: Any, dtype: np.dtype) -> Any:
    """``batch`` with the row splits of the components that were dense made ``dtype``."""
    leaves = [b.with_row_splits_dtype(dtype)
              if isinstance(b, RaggedTensor) and not isinstance(f, RaggedTensor) else b
              for f, b in zip(nest.flatten(first), nest.flatten(batch))]
    return nest.pack_sequence_as(batch, leaves)


def _ragged_batch_spec(spec: Any, size: int | None, dtype: Any = np.int64) -> Any:
    """A component of rank >= 1 batches into a ragged tensor whose rows are its elements."""
    if isinstance(spec, nest.TensorSpec) and spec.shape:
        return nest.RaggedTensorSpec((size, None, *spec.shape[1:]), spec.dtype, 1, dtype)
    return batched_spec(spec, size)


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
        spec = self.input.static_spec()
        if not isinstance(spec, nest.TensorSpec):
            return None
        return nest.SparseTensorSpec(
            (None, *(d if d >= 0 else None for d in self.row_shape)), spec.dtype)
