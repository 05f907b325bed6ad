"""Batching sparse and ragged values, as TensorFlow batches them.

A batch of :class:`~convoy.SparseTensor` is one sparse tensor with a leading batch dimension
(its dense shape the largest of each dimension); a batch of :class:`~convoy.RaggedTensor` is
one ragged tensor with one more ragged dimension. Unbatching is the inverse: the rows of a
ragged tensor of ``ragged_rank`` 1 are numpy arrays, whose spec (a ``RaggedTensorSpec`` of
``ragged_rank`` 0, as TensorFlow's) makes ``batch`` stack them into a ragged tensor again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from convoy._values import nest
from convoy._values.tensors import RaggedTensor, SparseTensor
from convoy.errors import InvalidArgumentError

COMPOSITE = (SparseTensor, RaggedTensor)


def stack_sparse(values: list[Any], component: int) -> SparseTensor:
    """Sparse tensors of one rank as one sparse tensor of ``[len(values), *largest shape]``."""
    _same_kind(values, SparseTensor, component)
    ranks = {v.rank for v in values}
    if len(ranks) > 1:
        raise InvalidArgumentError(
            f"Cannot batch sparse tensors of different ranks {sorted(ranks)} in component "
            f"{component}")
    rank = ranks.pop()
    counts = [len(v.values) for v in values]
    rows = np.repeat(np.arange(len(values), dtype=np.int64), counts)
    indices = np.concatenate([v.indices for v in values]).reshape(-1, rank)
    shape = np.max([v.dense_shape for v in values], axis=0) if rank else np.zeros(0, np.int64)
    return SparseTensor._unchecked(
        np.column_stack([rows, indices]), np.concatenate([v.values for v in values]),
        np.concatenate([[len(values)], shape]).astype(np.int64))


def stack_ragged(values: list[Any], component: int) -> RaggedTensor:
    """Ragged tensors (or arrays of rank >= 1) as one ragged tensor, one row each, so with
    one more ragged dimension."""
    if isinstance(values[0], RaggedTensor):
        _same_kind(values, RaggedTensor, component)
        ranks = {v.ragged_rank for v in values}
        inner = {v.flat_values.shape[1:] for v in values}
        if len(ranks) > 1 or len(inner) > 1:
            raise InvalidArgumentError(
                f"Cannot batch ragged tensors of different ragged ranks or inner shapes in "
                f"component {component}")
        flat = np.concatenate([v.flat_values for v in values])
        levels = []
        for level in range(values[0].ragged_rank):
            parts, offset = [np.zeros(1, np.int64)], 0
            for v in values:
                splits = v.nested_row_splits[level]
                parts.append(splits[1:] + offset)
                offset += int(splits[-1])
            levels.append(np.concatenate(parts))
        return RaggedTensor.from_row_lengths(
            RaggedTensor.from_nested_row_splits(flat, levels, validate=False),
            [v.nrows() for v in values], validate=False)
    arrays = [np.asarray(v) for v in values]
    inner = {a.shape[1:] for a in arrays}
    if len(inner) > 1 or any(a.ndim == 0 for a in arrays):
        raise InvalidArgumentError(
            f"ragged_batch: the elements' dimensions after the first must agree, got shapes "
            f"{[list(a.shape) for a in arrays]}")
    return RaggedTensor.from_row_lengths(np.concatenate(arrays), [len(a) for a in arrays],
                                         validate=False)


def stack_composite(values: list[Any], component: int) -> SparseTensor | RaggedTensor:
    if isinstance(values[0], SparseTensor):
        return stack_sparse(values, component)
    return stack_ragged(values, component)


def unstack_composite(value: SparseTensor | RaggedTensor) -> list[Any]:
    """The rows of a batched sparse or ragged value (the inverse of :func:`stack_composite`)."""
    if isinstance(value, RaggedTensor):
        return list(value)
    return list(SparseRows(value, "unbatch"))


class SparseRows:
    """The rows of a sparse tensor along its first dimension, each a sparse tensor of one
    rank less (the dense shape's other sizes), cut on demand."""

    __slots__ = ("_indices", "_values", "_bounds", "_inner")

    def __init__(self, value: SparseTensor, what: str, least_rank: int = 1) -> None:
        if value.rank < least_rank:
            raise InvalidArgumentError(
                f"{what}: a sparse tensor of rank {value.rank} cannot be cut into rows; it "
                f"needs rank >= {least_rank}")
        rows = value.indices[:, 0]
        indices, values = value.indices[:, 1:], value.values
        if len(rows) > 1 and (rows[1:] < rows[:-1]).any():
            order = np.argsort(rows, kind="stable")  # entries of a row together, in order
            rows, indices, values = rows[order], indices[order], values[order]
        self._bounds = np.searchsorted(rows, np.arange(value.shape[0] + 1)).tolist()
        self._indices, self._values = indices, values
        self._inner = value.dense_shape[1:]

    def __len__(self) -> int:
        return len(self._bounds) - 1

    def __getitem__(self, row: int) -> SparseTensor:
        a, b = self._bounds[row], self._bounds[row + 1]
        return SparseTensor._unchecked(self._indices[a:b], self._values[a:b], self._inner)

    def __iter__(self) -> Iterator[SparseTensor]:
        return map(self.__getitem__, range(len(self)))


def ragged_row_components(spec: Any) -> list[int] | None:
    """The components of elements of ``spec`` that are rows of a ragged tensor (arrays whose
    spec is a ``RaggedTensorSpec`` of ``ragged_rank`` 0), or None if there are none."""
    if spec is None:
        return None
    rows = [i for i, leaf in enumerate(nest.flatten(spec))
            if isinstance(leaf, nest.RaggedTensorSpec) and leaf.ragged_rank == 0]
    return rows or None


def batched_spec(spec: Any, size: int | None) -> Any:
    """The spec of a batch of ``size`` (None: unknown) elements of leaf spec ``spec``."""
    shape = None if spec.shape is None else (size, *spec.shape)
    if isinstance(spec, nest.SparseTensorSpec):
        return nest.SparseTensorSpec(shape, spec.dtype)
    if isinstance(spec, nest.RaggedTensorSpec):
        return nest.RaggedTensorSpec(shape, spec.dtype, spec.ragged_rank + 1,
                                     spec.row_splits_dtype)
    return nest.TensorSpec(shape, spec.dtype)


def unbatched_spec(spec: Any) -> Any:
    """The spec of a row of a batch of leaf spec ``spec``."""
    shape = None if spec.shape is None else spec.shape[1:]
    if isinstance(spec, nest.SparseTensorSpec):
        return nest.SparseTensorSpec(shape, spec.dtype)
    if isinstance(spec, nest.RaggedTensorSpec) and spec.ragged_rank > 0:
        # a row of ragged_rank 1 is an array, whose spec says it batches as a ragged row
        return nest.RaggedTensorSpec(shape, spec.dtype, spec.ragged_rank - 1,
                                     spec.row_splits_dtype)
    return nest.TensorSpec(shape, spec.dtype)


def _same_kind(values: list[Any], kind: type, component: int) -> None:
    for i, value in enumerate(values):
        if not isinstance(value, kind):
            raise InvalidArgumentError(
                f"Cannot batch a {kind.__name__} with a {type(value).__name__} in component "
                f"{component}: element {i} differs from element 0")
