"""Sources: ops with no input (range, tensor slices, tensors, generators, file lists).

The index-based sources (range, tensor slices, file lists) are *splittable*: their elements
are numbered, so the data service can hand ranges of numbers to different workers
(see :class:`IndexSource`).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from convoy._base import fs as _fs
from convoy._values import nest
from convoy._values.tensors import RaggedTensor, SparseTensor
from convoy.data._core._composite import SparseRows, unbatched_spec
from convoy.data._core._op import Node, Op, draw_seed
from convoy.data._core._rows import RowNode, RowSource, SliceRows
from convoy.errors import InvalidArgumentError, NotFoundError


class RangeIterNode(Node):
    """Walks a Python ``range`` with the C iterator, reading its position back on demand."""

    __slots__ = ("_range",)

    def __init__(self, indices: range, position: int = 0) -> None:
        self._range = indices
        self.gen = iter(indices)
        if position:
            self.gen.__setstate__(position)  # type: ignore[attr-defined]

    def state_dict(self) -> int:
        return int(self.gen.__reduce__()[2])


class IndexSource(Op):
    """A source whose elements are ``element_at(i)`` for ``i`` in ``range(num_elements())``."""

    def num_elements(self) -> int:
        raise NotImplementedError

    def element_at(self, index: int) -> Any:
        raise NotImplementedError

    def cardinality(self) -> int:
        return self.num_elements()

    def iterator(self, state: Any, key: int) -> Node:
        indices = RangeIterNode(range(self.num_elements()), state or 0)
        return _IndexedNode(indices, map(self.element_at, indices.gen))


class _IndexedNode(Node):
    __slots__ = ("_indices",)

    def __init__(self, indices: RangeIterNode, gen: Iterator[Any]) -> None:
        self._indices = indices
        self.gen = gen

    def state_dict(self) -> int:
        return self._indices.state_dict()


class RangeOp(IndexSource):
    def __init__(self, start: int, stop: int, step: int) -> None:
        self.range = range(start, stop, step)

    def num_elements(self) -> int:
        return len(self.range)

    def element_at(self, index: int) -> int:
        return self.range[index]

    def iterator(self, state: Any, key: int) -> Node:
        return RangeIterNode(self.range, state or 0)

    def static_spec(self) -> Any:
        return nest.TensorSpec((), np.int64)


def to_tensor_structure(value: Any, argument: str) -> Any:
    """Turn lists into arrays (as tf.data does) everywhere in a structure of tensors, and
    strings (``str`` UTF-8 encoded) into ``bytes``, in object arrays where they are arrays:
    what TensorFlow's ``.numpy()`` gives for a ``tf.string`` tensor."""
    if isinstance(value, (str, bytes, np.ndarray)):
        return _bytes_strings(value)
    if isinstance(value, list):
        try:
            return _bytes_strings(np.asarray(value))
        except ValueError as error:
            raise InvalidArgumentError(
                f"{argument}: could not convert a list to one array ({error}); "
                f"use a tuple for a structure of several components"
            ) from None
    if isinstance(value, dict):
        return type(value)((k, to_tensor_structure(v, argument)) for k, v in value.items())
    if isinstance(value, tuple):  # each child converts on its own: lists inside become arrays
        children = [to_tensor_structure(v, argument) for v in value]
        return type(value)(*children) if hasattr(type(value), "_fields") \
            else type(value)(children)
    if value is None:
        raise InvalidArgumentError(f"{argument} must not contain None")
    return value


def _bytes_strings(value: Any) -> Any:
    """``value`` with strings as ``bytes`` (an object array of them for an array)."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes):
        return bytes(value)  # np.bytes_ too
    if value.dtype.kind in "SU":
        from convoy._ops.array import _strings

        value = _strings(value)
    return value


def _as_sliceable(value: Any) -> Any:
    """A component of ``from_tensor_slices``: an array, or a sparse or ragged tensor."""
    if isinstance(value, (np.ndarray, SparseTensor, RaggedTensor)):
        return value
    return np.asarray(value)


def _rows_of(leaf: Any) -> int:
    if isinstance(leaf, SparseTensor):
        return leaf.shape[0]
    if isinstance(leaf, RaggedTensor):
        return leaf.nrows()
    return leaf.shape[0]


def _row_getter(leaf: Any) -> Callable[[int], Any]:
    """Row ``i`` of a component: a sparse tensor's row is a sparse tensor of one rank less, a
    ragged tensor's an array (``ragged_rank`` 1) or a ragged tensor."""
    if isinstance(leaf, SparseTensor):
        # TensorFlow slices sparse tensors of rank >= 2 only
        return SparseRows(leaf, "from_tensor_slices", least_rank=2).__getitem__
    return leaf.__getitem__


def _row_spec(leaf: Any) -> Any:
    if isinstance(leaf, (SparseTensor, RaggedTensor)):
        return unbatched_spec(nest.spec_from_value(leaf))
    return nest.TensorSpec(leaf.shape[1:], leaf.dtype)


class TensorSlicesOp(IndexSource):
    def __init__(self, tensors: Any) -> None:
        tensors = to_tensor_structure(tensors, "tensors")
        leaves = [_as_sliceable(x) for x in nest.flatten(tensors)]
        if not leaves:
            raise InvalidArgumentError(
                f"from_tensor_slices: tensors must hold at least one component, got {tensors!r}"
            )
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, np.ndarray) and leaf.ndim == 0:
                raise InvalidArgumentError(
                    f"from_tensor_slices: component {i} of tensors is a scalar; every "
                    f"component needs at least one dimension to slice along"
                )
        sizes = {_rows_of(leaf) for leaf in leaves}
        if len(sizes) > 1:
            shapes = [[_rows_of(leaf), *(_row_spec(leaf).shape or ())] for leaf in leaves]
            raise InvalidArgumentError(
                f"from_tensor_slices: all components of tensors must have the same size in "
                f"their first dimension, got shapes {shapes}"
            )
        self.structure = tensors
        self.leaves = leaves
        self.composite = not all(isinstance(leaf, np.ndarray) for leaf in leaves)
        self.getters = [_row_getter(leaf) for leaf in leaves]
        self.single = not nest.is_nested(tensors)
        self.flat_tuple = type(tensors) is tuple and not any(map(nest.is_nested, tensors))

    def num_elements(self) -> int:
        return _rows_of(self.leaves[0])

    def element_at(self, index: int) -> Any:
        if self.single:
            return self.getters[0](index)
        if self.flat_tuple:  # the common (features, label) case, without the generic packing
            return tuple([get(index) for get in self.getters])
        return nest.pack_sequence_as(self.structure, [get(index) for get in self.getters])

    def row_source(self) -> RowSource | None:
        return None if self.composite else RowSource(self.structure, self.leaves)

    def row_iterator(self, state: Any, key: int) -> RowNode:
        return SliceRows(self.num_elements(), state or 0)

    def iterator(self, state: Any, key: int) -> Node:
        indices = RangeIterNode(range(self.num_elements()), state or 0)
        if self.single:  # a numpy array indexed straight from C
            return _IndexedNode(indices, map(self.getters[0], indices.gen))
        return _IndexedNode(indices, map(self.element_at, indices.gen))

    def static_spec(self) -> Any:
        return nest.pack_sequence_as(self.structure, [_row_spec(leaf) for leaf in self.leaves])


class TensorsOp(IndexSource):
    def __init__(self, tensors: Any) -> None:
        self.tensors = to_tensor_structure(tensors, "tensors")

    def num_elements(self) -> int:
        return 1

    def element_at(self, index: int) -> Any:
        return self.tensors

    def static_spec(self) -> Any:
        return nest.spec_from_value(self.tensors)


class ListFilesOp(IndexSource):
    """File names matching glob patterns, sorted, optionally shuffled per iteration."""

    def __init__(self, patterns: list[str], shuffle: bool, seed: int | None) -> None:
        names = sorted({name for pattern in patterns for name in _fs.glob(pattern)})
        if not names:
            raise NotFoundError(f"list_files: no files matched pattern(s) {patterns}")
        self.files = [os.fsencode(name) for name in names]
        self.shuffle = shuffle
        self.seed_given = seed is not None  # else drawn: another in every process
        self.seed = seed if seed is not None else draw_seed()

    def num_elements(self) -> int:
        return len(self.files)

    def iterator(self, state: Any, key: int) -> Node:
        files = self.files
        if self.shuffle:
            files = list(files)
            random.Random(self.seed ^ key).shuffle(files)
        indices = RangeIterNode(range(len(files)), state or 0)
        return _IndexedNode(indices, map(files.__getitem__, indices.gen))

    def element_at(self, index: int) -> bytes:
        return self.files[index]

    def static_spec(self) -> Any:
        return nest.TensorSpec((), bytes)


class GeneratorOp(Op):
    """Elements from a Python generator, checked against (and cast to) ``output_signature``.

    A generator cannot report its position, so a restored iterator calls it again and skips
    the elements already produced.
    """

    def __init__(self, generator: Callable[..., Any], signature: Any, args: tuple) -> None:
        self.generator = generator
        self.signature = signature
        self.args = args
        self.flat_specs = nest.flatten(signature)

    def iterator(self, state: Any, key: int) -> Node:
        return _GeneratorNode(self, state or 0)

    def static_spec(self) -> Any:
        return self.signature

    def conform(self, value: Any, index: int) -> Any:
        try:  # flattened only down to the signature's leaves: a list there is one value
            values = nest.flatten_up_to(self.signature, value)
        except InvalidArgumentError as error:
            raise InvalidArgumentError(
                f"from_generator: element {index} does not match output_signature "
                f"{self.signature}: {error}"
            ) from None
        leaves = [self._cast(spec, leaf, index)
                  for spec, leaf in zip(self.flat_specs, values, strict=True)]
        if not nest.is_nested(self.signature):
            return leaves[0]
        return nest.pack_sequence_as(self.signature, leaves)

    def _cast(self, spec: nest.TensorSpec, leaf: Any, index: int) -> Any:
        try:
            array = np.asarray(leaf, dtype=spec.dtype)
        except (TypeError, ValueError) as error:
            raise InvalidArgumentError(
                f"from_generator: element {index} value {leaf!r} cannot be converted to "
                f"{spec}: {error}"
            ) from None
        if not spec.is_compatible_with(nest.TensorSpec(array.shape, array.dtype)):
            raise InvalidArgumentError(
                f"from_generator: element {index} has shape {list(array.shape)}, which does "
                f"not match {spec} from output_signature"
            )
        return array[()] if array.ndim == 0 and spec.dtype != np.dtype(object) else array


class _GeneratorNode(Node):
    __slots__ = ("count",)

    def __init__(self, op: GeneratorOp, skip: int) -> None:
        self.count = skip
        self.gen = self._run(op, skip)

    def _run(self, op: GeneratorOp, skip: int) -> Iterator[Any]:
        source = iter(op.generator(*op.args))
        try:
            for _ in range(skip):
                next(source, None)
            conform = op.conform
            for value in source:
                index = self.count
                self.count = index + 1
                yield conform(value, index)
        finally:  # the user's generator runs its `finally` now, not when it is collected
            close = getattr(source, "close", None)
            if callable(close):
                close()

    def state_dict(self) -> int:
        return self.count

    def close(self) -> None:
        # The node and its generator refer to each other: without this the generator would
        # close only when the cyclic garbage collector runs.
        try:
            self.gen.close()  # type: ignore[attr-defined]
        except ValueError:  # running in another thread: it closes when collected
            pass


class ElementsOp(IndexSource):
    """The elements of a Python list, each as it is (the windows of ``window`` and
    ``group_by_window``, and ``from_list``); ``spec`` is their spec when known."""

    def __init__(self, elements: list[Any], spec: Any = None) -> None:
        self.elements = elements
        self.spec = spec

    def num_elements(self) -> int:
        return len(self.elements)

    def element_at(self, index: int) -> Any:
        return self.elements[index]

    def iterator(self, state: Any, key: int) -> Node:
        indices = RangeIterNode(range(len(self.elements)), state or 0)
        return _IndexedNode(indices, map(self.elements.__getitem__, indices.gen))

    def static_spec(self) -> Any:
        if self.spec is None and self.elements:
            return nest.spec_from_value(self.elements[0])
        return self.spec
