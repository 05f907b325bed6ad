"""batch, padded_batch and unbatch: stacking elements into arrays and back."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from itertools import islice
from typing import Any

import numpy as np

from convoy._values import nest
from convoy.data._core._composite import (
    COMPOSITE,
    batched_spec,
    ragged_row_components,
    stack_composite,
    stack_ragged,
    unbatched_spec,
    unstack_composite,
)
from convoy.data._core._op import Node, Op, PassNode, derived_spec
from convoy.data._core._rows import (
    Chunk,
    RowNode,
    RowSource,
    chunk_rows,
    row_numbers,
    split_rows,
    widen,
)
from convoy.data._sources._file_reader_ops import TFRecordOp
from convoy.errors import InvalidArgumentError

_SCALARS = (int, float, bool, np.generic)


def _stack_leaves(values: list[Any], component: int) -> Any:
    first = values[0]
    if isinstance(first, COMPOSITE):  # a sparse or ragged batch, as TensorFlow makes
        return stack_composite(values, component)
    if isinstance(first, (bytes, str)):
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array
    if isinstance(first, _SCALARS):
        return np.array(values)
    try:
        return np.stack(values)
    except ValueError:
        shape = np.shape(first)
        for i, value in enumerate(values):
            if np.shape(value) != shape:
                raise InvalidArgumentError(
                    f"Cannot batch tensors with different shapes in component {component}. "
                    f"First element had shape {list(shape)} and element {i} had shape "
                    f"{list(np.shape(value))}."
                ) from None
        raise


def stack(elements: list[Any], ragged: list[int] | None = None) -> Any:
    """Stack a list of same-structured elements into one element with a leading batch axis;
    components ``ragged`` (rows of ragged tensors) into ragged tensors."""
    first = elements[0]
    if ragged is not None:
        return _stack_with_ragged(elements, ragged)
    if not isinstance(first, (tuple, list, dict)):
        return _stack_leaves(elements, 0)
    if type(first) is tuple and not any(map(nest.is_nested, first)):  # fast path: flat tuples
        return tuple([_stack_leaves(list(c), i) for i, c in enumerate(zip(*elements))])
    columns = zip(*map(nest.flatten, elements), strict=True)
    return nest.pack_sequence_as(first, [_stack_leaves(list(c), i)
                                         for i, c in enumerate(columns)])


def _stack_with_ragged(elements: list[Any], ragged: list[int]) -> Any:
    columns = zip(*map(nest.flatten, elements), strict=True)
    out = [stack_ragged(list(column), i) if i in ragged else _stack_leaves(list(column), i)
           for i, column in enumerate(columns)]
    return nest.pack_sequence_as(elements[0], out)


def _batches(upstream: Iterator[Any], size: int, drop_remainder: bool,
             ragged: list[int] | None = None) -> Iterator[Any]:
    while True:
        chunk = list(islice(upstream, size))
        if len(chunk) < size and (drop_remainder or not chunk):
            return
        yield stack(chunk, ragged)


def _batched_spec(spec: Any, size: int | None) -> Any:
    if spec is None:
        return None
    return nest.map_structure(lambda s: batched_spec(s, size), spec)


class BatchOp(Op):
    def __init__(self, input: Op, batch_size: int, drop_remainder: bool) -> None:
        self.inputs = (input,)
        self.batch_size = batch_size
        self.drop_remainder = drop_remainder

    def cardinality(self) -> int:
        n = self.input.cardinality()
        if n < 0:
            return n
        return n // self.batch_size if self.drop_remainder else -(-n // self.batch_size)

    def iterator(self, state: Any, key: int) -> Node:
        source = self.input.row_source()
        if source is not None and source.batchable():
            rows = self.input.row_iterator(state, key)
            return _RowBatchNode(rows, self._row_batches(source, rows))
        if type(self.input) is TFRecordOp:  # batches cut from runs of records, not one by one
            return self.input.batches(state, self.batch_size, self.drop_remainder)
        input = self.input.iterator(state, key)
        ragged = ragged_row_components(derived_spec(self.input))
        return PassNode(input, _batches(input.gen, self.batch_size, self.drop_remainder,
                                        ragged))

    def _row_batches(self, source: RowSource, rows: RowNode) -> Iterator[Any]:
        pull, size = rows.pull, self.batch_size
        while True:
            got, chunks = pull(size)
            if got < size and (self.drop_remainder or not got):
                return
            yield source.pack(source.gather(chunks))

    def static_spec(self) -> Any:
        size = self.batch_size if self.drop_remainder else None
        spec = self.input.static_spec()
        if spec is not None and derived_spec(self.input) is None:
            # read off the first element: a batch of sparse rows is as large as its largest
            spec = nest.map_structure(_unknown_if_sparse, spec)
        return _batched_spec(spec, size)


def _unknown_if_sparse(spec: Any) -> Any:
    if isinstance(spec, nest.SparseTensorSpec) and spec.shape is not None:
        return nest.SparseTensorSpec((None,) * len(spec.shape), spec.dtype)
    return spec


class _RowBatchNode(Node):
    """Batches cut or gathered from a row stream's arrays (no per-element work); it buffers
    nothing between batches, so its state is the row stream's, as for the element path."""

    __slots__ = ("rows",)

    def __init__(self, rows: RowNode, gen: Iterator[Any]) -> None:
        self.rows = rows
        self.gen = gen

    def state_dict(self) -> Any:
        return self.rows.state_dict()

    def close(self) -> None:
        self.rows.close()


def _pad_to(value: Any, shape: tuple[int, ...], fill: Any, component: int) -> np.ndarray:
    array = np.asarray(value)
    if array.ndim != len(shape) or any(a > b for a, b in zip(array.shape, shape)):
        raise InvalidArgumentError(
            f"padded_batch: component {component} has shape {list(array.shape)}, which does "
            f"not fit padded shape {list(shape)}"
        )
    out = np.full(shape, fill, dtype=array.dtype)
    out[tuple(slice(0, n) for n in array.shape)] = array
    return out


def _default_padding(value: Any) -> Any:
    array = np.asarray(value)
    return b"" if array.dtype == object else array.dtype.type(0)


class PaddedBatchOp(BatchOp):
    def __init__(self, input: Op, batch_size: int, drop_remainder: bool,
                 padded_shapes: Any, padding_values: Any) -> None:
        super().__init__(input, batch_size, drop_remainder)
        self.padded_shapes = padded_shapes
        self.padding_values = padding_values

    def iterator(self, state: Any, key: int) -> Node:
        source = self.input.row_source()
        if source is not None and source.paddable():
            rows = self.input.row_iterator(state, key)
            return _RowBatchNode(rows, self._row_padded_batches(source, rows))
        input = self.input.iterator(state, key)
        return PassNode(input, _padded_batches(self, input.gen))

    def _row_padded_batches(self, source: RowSource, rows: RowNode) -> Iterator[Any]:
        pull, size = rows.pull, self.batch_size
        padders = None
        while True:
            got, chunks = pull(size)
            if got < size and (self.drop_remainder or not got):
                return
            columns = source.gather(chunks)
            if padders is None:  # every row has the same shapes: padded as the first is
                padders = self._padders(source, columns)
            yield source.pack([pad(column) for pad, column in zip(padders, columns)])

    def _padders(self, source: RowSource, columns: list[np.ndarray]) -> list[Any]:
        first = source.pack([column[0] for column in columns])
        padded = nest.flatten(pad_and_stack([first], self.padded_shapes, self.padding_values))
        fills = _per_component(first, self.padding_values, "padding_values")
        return [_padder(column.shape[1:], one.shape[1:],
                        _default_padding(column[0]) if fill is None else fill)
                for column, one, fill in zip(columns, padded, fills)]

    def static_spec(self) -> Any:
        spec = self.input.static_spec()
        if spec is None:
            return None
        specs = nest.flatten(spec)
        shapes = _per_component(spec, self.padded_shapes, "padded_shapes")
        # A spec read off the first element promises no size: the batch's maximum varies.
        observed = derived_spec(self.input) is None
        out = []
        for s, wanted in zip(specs, shapes):
            if s.shape is None:
                dims = s.shape
            elif wanted is None or len(wanted) != len(s.shape):
                dims = (None,) * len(s.shape) if observed else s.shape
            else:  # a given size wins; an unspecified one stays what the input says
                dims = tuple((None if observed else d) if w is None or w == -1 else int(w)
                             for d, w in zip(s.shape, wanted))
            out.append(s if dims is None else nest.TensorSpec(dims, s.dtype))
        return _batched_spec(nest.pack_sequence_as(spec, out),
                             self.batch_size if self.drop_remainder else None)


def _padder(shape: tuple[int, ...], target: tuple[int, ...], fill: Any) -> Any:
    """A function padding a batch of rows of ``shape`` to rows of ``target``."""
    if shape == target:
        return lambda column: column
    inside = (slice(None), *(slice(0, n) for n in shape))

    def pad(column: np.ndarray) -> np.ndarray:
        out = np.full((len(column), *target), fill, dtype=column.dtype)
        out[inside] = column
        return out

    return pad


def _per_component(structure: Any, value: Any, argument: str) -> list[Any]:
    """``value`` given for each component of ``structure``: one for all when it is not
    nested like ``structure`` (a shape is a list, so only ``structure``'s nesting counts)."""
    n = len(nest.flatten(structure))
    if value is None:
        return [None] * n
    if not nest.is_nested(structure):
        return [value]
    if argument == "padding_values" and not nest.is_nested(value):
        return [value] * n
    try:
        return nest.flatten_up_to(structure, value)
    except InvalidArgumentError as error:
        raise InvalidArgumentError(
            f"padded_batch: {argument} must have the structure of the elements: {error}"
        ) from None


def _padded_batches(op: PaddedBatchOp, upstream: Iterator[Any]) -> Iterator[Any]:
    while True:
        chunk = list(islice(upstream, op.batch_size))
        if len(chunk) < op.batch_size and (op.drop_remainder or not chunk):
            return
        yield pad_and_stack(chunk, op.padded_shapes, op.padding_values)


def pad_and_stack(elements: list[Any], padded_shapes: Any, padding_values: Any) -> Any:
    """Pad every component to a common shape (the batch maximum where unspecified), then stack."""
    first = elements[0]
    columns = list(zip(*map(nest.flatten, elements), strict=True))
    for column in columns:
        refuse_composite(column[0])
    shapes = _per_component(first, padded_shapes, "padded_shapes")
    fills = _per_component(first, padding_values, "padding_values")
    out = []
    for i, column in enumerate(columns):
        rank = np.ndim(column[0])
        biggest = [max(np.shape(v)[d] if np.ndim(v) == rank else 0 for v in column)
                   for d in range(rank)]
        wanted = [None] * rank if shapes[i] is None else list(shapes[i])
        if len(wanted) != rank:
            raise InvalidArgumentError(
                f"padded_batch: padded shape {wanted} of component {i} has rank "
                f"{len(wanted)}, but the component has rank {rank}"
            )
        target = tuple(b if w is None or w == -1 else int(w) for b, w in zip(biggest, wanted))
        fill = fills[i] if fills[i] is not None else _default_padding(column[0])
        out.append(np.stack([_pad_to(v, target, fill, i) for v in column]))
    return out[0] if not nest.is_nested(first) else nest.pack_sequence_as(first, out)


def refuse_composite(component: Any) -> None:
    """TypeError (TensorFlow's) when a component (or a component's spec) is sparse or
    ragged: padded_batch pads dense arrays only."""
    if isinstance(component, COMPOSITE):
        shown = type(component).__name__
    elif isinstance(component, (nest.SparseTensorSpec, nest.RaggedTensorSpec)):
        shown = str(component)
    else:
        return
    raise TypeError(
        "`padded_batch` is only supported for datasets that produce tensor elements but type "
        f"spec of elements in the input dataset is not a subclass of TensorSpec: `{shown}`. "
        "Use ragged_batch or sparse_batch, or make it dense first (to_dense or to_tensor)")


class UnbatchOp(Op):
    def __init__(self, input: Op) -> None:
        self.inputs = (input,)

    def iterator(self, state: Any, key: int) -> Node:
        state = state or {"input": None, "rows": []}
        return _UnbatchNode(self.input.iterator(state["input"], key), state["rows"])

    def row_source(self) -> RowSource | None:
        source = self.input.row_source()
        return None if source is None else source.unbatched()

    def row_iterator(self, state: Any, key: int) -> RowNode:
        state = state or {"input": None, "pending_rows": []}
        source = self.input.row_source()
        assert source is not None
        return _UnbatchRows(self.input.row_iterator(state["input"], key),
                            source.leaves[0].shape[1], state["pending_rows"])

    def static_spec(self) -> Any:
        spec = self.input.static_spec()
        if spec is None:
            return None
        return nest.map_structure(unbatched_spec, spec)


def unstack(batch: Any) -> list[Any]:
    """The rows of a batched element (the inverse of :func:`stack`)."""
    if not isinstance(batch, (tuple, list, dict)):
        return list(_rows(batch, 0))
    columns = [_rows(leaf, i) for i, leaf in enumerate(nest.flatten(batch))]
    sizes = {len(c) for c in columns}
    if len(sizes) > 1:
        raise InvalidArgumentError(
            f"unbatch: components have different batch sizes {sorted(sizes)}"
        )
    return [nest.pack_sequence_as(batch, list(row)) for row in zip(*columns)]


def _rows(value: Any, component: int) -> Any:
    if isinstance(value, COMPOSITE):
        return unstack_composite(value)
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    if array.ndim == 0:
        raise InvalidArgumentError(
            f"unbatch: component {component} is a scalar; every component needs a batch axis"
        )
    return array


class _UnbatchNode(Node):
    __slots__ = ("input", "rows")

    def __init__(self, input: Node, rows: list[Any]) -> None:
        self.input = input
        self.rows: deque[Any] = deque(rows)
        self.gen = self._run()

    def _run(self) -> Iterator[Any]:
        rows = self.rows
        while rows:
            yield rows.popleft()
        for batch in self.input.gen:
            rows.extend(unstack(batch))
            while rows:
                yield rows.popleft()

    def state_dict(self) -> Any:
        return {"input": self.input.state_dict(), "rows": list(self.rows)}

    def close(self) -> None:
        self.input.close()


class _UnbatchRows(RowNode):
    """The row stream of unbatch: each input row becomes ``width`` rows of the unbatched
    source. Its state holds the row numbers left of the last input row (``pending_rows``)
    where the element path's holds those elements (``rows``)."""

    __slots__ = ("input", "width", "pending")

    def __init__(self, input: RowNode, width: int, pending: list[int]) -> None:
        self.input = input
        self.width = width
        self.pending: list[Chunk] = [np.array(pending, dtype=np.intp)] if pending else []

    def pull(self, n: int) -> tuple[int, list[Chunk]]:
        chunks, self.pending = split_rows(self.pending, n)
        total = chunk_rows(chunks)
        width = self.width
        while total < n:
            need = n - total
            got, more = self.input.pull(-(-need // width) if width else need)
            if not got:
                break
            taken, self.pending = split_rows(widen(more, width), need)
            chunks += taken
            total += chunk_rows(taken)
        return total, chunks

    def state_dict(self) -> Any:
        return {"input": self.input.state_dict(),
                "pending_rows": row_numbers(self.pending).tolist()}

    def close(self) -> None:
        self.input.close()
