"""group_by_window and window: elements gathered into datasets of their own."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from convoy._values import nest
from convoy.data._core._op import (
    INFINITE_CARDINALITY,
    UNKNOWN_CARDINALITY,
    Node,
    Op,
    as_dataset,
    derive_key,
    element_caller,
    face,
    first_element_spec,
    through_passing,
)
from convoy.data._sources._basic import ElementsOp
from convoy.errors import InvalidArgumentError

_END = object()


def scalar_int64(value: Any, what: str) -> int:
    """``value`` as an int when it is a scalar integer, else tf.data's error for ``what``."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iu":
        return int(value)
    raise InvalidArgumentError(f"`{what}` must return a scalar int64.")


class GroupByWindowOp(Op):
    """Elements grouped by ``key_func``; a group of ``window_size_func(key)`` elements becomes
    the dataset ``reduce_op(key, elements)`` (an op), whose elements are yielded.

    At the end of the input, the groups left are flushed in increasing order of their keys
    (TensorFlow keeps them in an ordered map).
    """

    def __init__(self, input: Op, key_func: Callable[..., Any],
                 reduce_op: Callable[[int, list[Any]], Op],
                 window_size_func: Callable[[Any], Any]) -> None:
        self.inputs = (input,)
        self.key_func = key_func
        self.reduce_op = reduce_op
        self.window_size_func = window_size_func

    def cardinality(self) -> int:
        n = self.input.cardinality()
        return n if n == INFINITE_CARDINALITY else UNKNOWN_CARDINALITY

    def iterator(self, state: Any, key: int) -> Node:
        return _GroupByWindowNode(self, state, key)

    def static_spec(self) -> Any:
        return first_element_spec(self)


class _Flush:
    """The group being yielded: its key and elements (to rebuild it) and its iterator."""

    __slots__ = ("key", "elements", "index", "node")

    def __init__(self, key: int, elements: list[Any], index: int, node: Node) -> None:
        self.key = key
        self.elements = elements
        self.index = index
        self.node = node


class _GroupByWindowNode(Node):
    __slots__ = ("op", "key", "input", "ended", "groups", "sizes", "current", "flushed")

    def __init__(self, op: GroupByWindowOp, state: Any, key: int) -> None:
        self.op = op
        self.key = key
        state = state or {"input": None, "ended": False, "groups": [], "sizes": [],
                          "current": None, "flushed": 0}
        self.ended: bool = state["ended"]
        self.input = None if self.ended else op.input.iterator(state["input"], key)
        self.groups: dict[int, list[Any]] = {k: list(v) for k, v in state["groups"]}
        self.sizes: dict[int, int] = dict(state["sizes"])
        self.flushed: int = state["flushed"]
        self.current: _Flush | None = None
        if state["current"] is not None:
            c = state["current"]
            self.current = self._start(c["key"], list(c["elements"]), c["index"], c["state"])
        self.gen = self._run()

    def _start(self, group_key: int, elements: list[Any], index: int, state: Any) -> _Flush:
        op = self.op.reduce_op(group_key, elements)
        return _Flush(group_key, elements, index,
                      op.iterator(state, derive_key(self.key, index)))

    def _flush(self, group_key: int) -> None:
        self.current = self._start(group_key, self.groups.pop(group_key), self.flushed, None)
        self.flushed += 1

    def _window_size(self, group_key: int) -> int:
        size = self.sizes.get(group_key)
        if size is None:
            size = scalar_int64(self.op.window_size_func(np.int64(group_key)),
                                "window_size_func")
            if size <= 0:
                raise InvalidArgumentError(
                    f"Window size must be greater than zero, but got {size}.")
            self.sizes[group_key] = size
        return size

    def _run(self) -> Iterator[Any]:
        key_of = element_caller(self.op.key_func)
        while True:
            if self.current is not None:
                yield from self.current.node.gen
                self.current.node.close()
                self.current = None
            while not self.ended:
                assert self.input is not None
                element = next(self.input.gen, _END)
                if element is _END:
                    self.input.close()
                    self.input, self.ended = None, True
                    break
                group_key = scalar_int64(key_of(element), "key_func")
                size = self._window_size(group_key)
                group = self.groups.setdefault(group_key, [])
                group.append(element)
                if len(group) == size:
                    self._flush(group_key)
                    break
            if self.current is None:
                if not self.groups:
                    return
                self._flush(min(self.groups))

    def state_dict(self) -> Any:
        current = None
        if self.current is not None:
            current = {"key": self.current.key, "elements": list(self.current.elements),
                       "index": self.current.index, "state": self.current.node.state_dict()}
        return {"input": None if self.input is None else self.input.state_dict(),
                "ended": self.ended,
                "groups": [[k, list(v)] for k, v in self.groups.items()],
                "sizes": [[k, v] for k, v in self.sizes.items()],
                "current": current, "flushed": self.flushed}

    def close(self) -> None:
        if self.current is not None:
            self.current.node.close()
        if self.input is not None:
            self.input.close()


class DatasetSpec:
    """The spec of an element that is itself a dataset (``window`` makes them)."""

    __slots__ = ("element_spec",)

    def __init__(self, element_spec: Any) -> None:
        self.element_spec = element_spec

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DatasetSpec) and self.element_spec == other.element_spec

    def __hash__(self) -> int:
        return hash(repr(self.element_spec))

    def __repr__(self) -> str:
        return f"DatasetSpec({self.element_spec!r})"


class WindowOp(Op):
    """Windows of ``size`` elements, ``stride`` apart, a new one every ``shift`` elements;
    each is the element structure with a dataset of that component's values at each leaf."""

    def __init__(self, input: Op, size: int, shift: int, stride: int,
                 drop_remainder: bool) -> None:
        self.inputs = (input,)
        self.size = size
        self.shift = shift
        self.stride = stride
        self.drop_remainder = drop_remainder
        self.span = (size - 1) * stride + 1  # the input elements one window covers

    def cardinality(self) -> int:
        n = self.input.cardinality()
        if n < 0:
            return n
        if self.drop_remainder:
            rest = n - self.span
            return 0 if rest < 0 else rest // self.shift + 1
        return -(-n // self.shift)

    def iterator(self, state: Any, key: int) -> Node:
        return _WindowNode(self, state, key)

    def static_spec(self) -> Any:
        spec = self.input.static_spec()
        if spec is None:
            return None
        return nest.map_structure(DatasetSpec, spec)


class _WindowNode(Node):
    __slots__ = ("op", "input", "buffer", "spec")

    def __init__(self, op: WindowOp, state: Any, key: int) -> None:
        self.op = op
        state = state or {"input": None, "ended": False, "buffer": []}
        self.input = None if state["ended"] else op.input.iterator(state["input"], key)
        self.buffer: list[Any] = list(state["buffer"])
        self.spec = op.input.static_spec()
        self.gen = self._run()

    def _run(self) -> Iterator[Any]:
        op = self.op
        while True:
            while self.input is not None and len(self.buffer) < op.span:
                element = next(self.input.gen, _END)
                if element is _END:
                    self._end_input()
                else:
                    self.buffer.append(element)
            if not self.buffer or (op.drop_remainder and len(self.buffer) < op.span):
                return
            window = self.buffer[::op.stride]
            if op.shift >= len(self.buffer):
                for _ in range(op.shift - len(self.buffer)):
                    if self.input is None or next(self.input.gen, _END) is _END:
                        self._end_input()
                        break
                self.buffer = []
            else:
                del self.buffer[:op.shift]
            yield self._datasets(window)

    def _end_input(self) -> None:
        if self.input is not None:
            self.input.close()
        self.input = None

    def _datasets(self, window: list[Any]) -> Any:
        first = window[0]
        if not nest.is_nested(first):
            return as_dataset(ElementsOp(window, self.spec))
        columns = zip(*map(nest.flatten, window), strict=True)
        specs = (nest.flatten(self.spec) if self.spec is not None
                 else [None] * len(nest.flatten(first)))
        return nest.pack_sequence_as(first, [as_dataset(ElementsOp(list(c), s))
                                             for c, s in zip(columns, specs)])

    def state_dict(self) -> Any:
        return {"input": None if self.input is None else self.input.state_dict(),
                "ended": self.input is None, "buffer": list(self.buffer)}

    def close(self) -> None:
        self._end_input()


def refuse_nested_datasets(op: Op) -> None:
    """Raise InvalidArgumentError when the elements of ``op`` are the datasets of a
    ``window``: the data service sends tensors, so windows must be flattened first."""
    if _window_upstream(op) is not None:
        raise InvalidArgumentError(
            "the data service cannot send the nested datasets `window` makes; flatten "
            "them first, e.g. .flat_map(lambda w: w.batch(size)) (for a structure of "
            "windows, zip the batched components inside flat_map)")


def _window_upstream(op: Op) -> Op | None:
    """The ``window`` whose datasets reach the output of ``op`` unflattened, if any.

    Only ops that pass elements through unchanged are looked through: a function (``map``,
    ``flat_map`` ...) may turn the datasets into tensors.
    """
    op = through_passing(op)
    return op if isinstance(op, WindowOp) else None


_WINDOW_TAG = "__convoy_window__"


def plain_element(element: Any) -> Any:
    """``element`` with each window dataset in it replaced by the plain list of its elements
    (so an iterator's state holding an element is plain data)."""
    Dataset = face()

    def plain(leaf: Any) -> Any:
        if isinstance(leaf, Dataset) and isinstance(leaf._op, ElementsOp):
            return {_WINDOW_TAG: list(leaf._op.elements)}
        return leaf

    if isinstance(element, Dataset):
        return plain(element)
    if not nest.is_nested(element) or not any(isinstance(x, Dataset)
                                              for x in nest.flatten(element)):
        return element
    return nest.map_structure(plain, element)


def element_from_plain(state: Any) -> Any:
    """The inverse of :func:`plain_element`."""
    if isinstance(state, dict) and _WINDOW_TAG in state:
        return as_dataset(ElementsOp(list(state[_WINDOW_TAG])))
    if isinstance(state, (tuple, list, dict)):
        children = state.values() if isinstance(state, dict) else state
        if any(isinstance(c, (tuple, list, dict)) for c in children):
            if isinstance(state, dict):
                return type(state)((k, element_from_plain(v)) for k, v in state.items())
            rebuilt = [element_from_plain(v) for v in state]
            return type(state)(*rebuilt) if hasattr(type(state), "_fields") \
                else type(state)(rebuilt)
    return state


def bucket_by_sequence_length(dataset: Any, element_length_func: Callable[..., Any],
                               boundaries: list[int], batch_sizes: list[int],
                               padded_shapes: Any, padding_values: Any,
                               pad_to_bucket_boundary: bool, no_padding: bool,
                               drop_remainder: bool) -> Any:
    """``dataset.bucket_by_sequence_length(...)``: ``group_by_window`` on the bucket of each
    element, each group padded-batched (composed from the dataset's own methods)."""
    if len(batch_sizes) != len(boundaries) + 1:
        raise InvalidArgumentError(
            f"`len(bucket_batch_sizes)` must equal `len(bucket_boundaries) + 1` but "
            f"`len(bucket_batch_sizes)={len(batch_sizes)}` and "
            f"`len(bucket_boundaries)={len(boundaries)}`.")
    lows = [np.iinfo(np.int32).min, *boundaries]
    highs = [*boundaries, np.iinfo(np.int32).max]

    def bucket_id(*element: Any) -> np.int64:
        length = element_length_func(*element)
        for i, (low, high) in enumerate(zip(lows, highs)):
            if low <= length < high:
                return np.int64(i)
        raise InvalidArgumentError(
            f"bucket_by_sequence_length: element length {length} is in no bucket")

    def batching(key: np.int64, group: Any) -> Any:
        size = batch_sizes[int(key)]
        if no_padding:
            return group.batch(size, drop_remainder=drop_remainder)
        filler = None
        if pad_to_bucket_boundary:
            if int(key) >= len(batch_sizes) - 1:
                raise InvalidArgumentError(
                    "When pad_to_bucket_boundary=True, elements must have length < "
                    "bucket_boundaries[-1].")
            filler = boundaries[int(key)] - 1
        shapes = padded_shapes
        if shapes is None:
            shapes = nest.map_structure(lambda s: None if s.shape is None else [None] * len(
                s.shape), group.element_spec)
        if filler is not None:
            shapes = _boundary_shapes(group, shapes, filler)
        return group.padded_batch(size, shapes, padding_values,
                                  drop_remainder=drop_remainder)

    return dataset.group_by_window(bucket_id, batching,
                                   window_size_func=lambda key: batch_sizes[int(key)])


def _boundary_shapes(group: Any, shapes: Any, filler: int) -> Any:
    """``shapes`` with their unknown sizes set to ``filler``. A size is unknown where the
    spec (or the given shape) says None, or where the group's elements differ from the
    spec: a spec read off a first element knows sizes that vary."""
    spec = group.element_spec
    specs = nest.flatten(spec)
    given = nest.flatten_up_to(spec, shapes) if nest.is_nested(spec) else [shapes]
    columns = list(zip(*(nest.flatten(e) for e in group)))
    out: list[Any] = []
    for s, shape, column in zip(specs, given, columns):
        if shape is None:
            out.append(None)
            continue
        known = s.shape or (None,) * len(shape)
        dims = []
        for axis, (wanted, d) in enumerate(zip(shape, known)):
            varies = d is None or any(np.shape(v)[axis] != d for v in column)
            dims.append(filler if (wanted is None or wanted == -1) and varies
                        else (d if wanted is None or wanted == -1 else wanted))
        out.append(dims)
    return out[0] if not nest.is_nested(spec) else nest.pack_sequence_as(spec, out)
