"""unique: each distinct element once, in order of first appearance."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from convoy._values import nest
from convoy.data._core._op import Node, Op, SameSpecOp
from convoy.errors import InvalidArgumentError

_SUPPORTED = (np.dtype(np.int32), np.dtype(np.int64), np.dtype(object))


def check_unique_spec(spec: Any) -> None:
    """tf.data's rule: one component of int32, int64 or string (scalar or vector)."""
    if spec is None:
        return
    for leaf in nest.flatten(spec):
        if not isinstance(leaf, nest.TensorSpec) or leaf.dtype not in _SUPPORTED:
            dtype = getattr(leaf, "dtype", None)
            name = leaf if dtype is None else "string" if dtype.kind in "OSU" else dtype.name
            raise InvalidArgumentError(
                f"`tf.data.Dataset.unique` does not support type {name} -- only "
                f"`int32`, `int64`, and `string` are supported.")
    if nest.is_nested(spec):
        raise InvalidArgumentError(
            "`tf.data.Dataset.unique` does not support datasets whose elements have more "
            f"than one component, got {spec}")


def _hashable(element: Any) -> Any:
    if isinstance(element, np.ndarray):
        if element.ndim > 1:
            raise InvalidArgumentError(
                f"unique: elements must be scalars or vectors, got shape {list(element.shape)}")
        return ("vector", tuple(element.tolist()))
    if isinstance(element, np.generic):
        return element.item()
    if isinstance(element, str):
        return element.encode()
    return element


class UniqueOp(SameSpecOp):
    passes_elements = True

    def __init__(self, input: Op) -> None:
        self.inputs = (input,)

    def iterator(self, state: Any, key: int) -> Node:
        state = state or {"input": None, "seen": []}
        return _UniqueNode(self.input.iterator(state["input"], key), state["seen"])


class _UniqueNode(Node):
    """Its state lists the distinct elements seen so far, in order."""

    __slots__ = ("input", "seen", "keys")

    def __init__(self, input: Node, seen: list[Any]) -> None:
        self.input = input
        self.seen = list(seen)
        self.keys = {_hashable(x) for x in seen}
        self.gen = self._run()

    def _run(self) -> Iterator[Any]:
        keys, seen = self.keys, self.seen
        for element in self.input.gen:
            if nest.is_nested(element):
                raise InvalidArgumentError(
                    "`tf.data.Dataset.unique` does not support datasets whose elements have "
                    "more than one component")
            key = _hashable(element)
            if key in keys:
                continue
            keys.add(key)
            seen.append(element)
            yield element

    def state_dict(self) -> Any:
        return {"input": self.input.state_dict(), "seen": list(self.seen)}

    def close(self) -> None:
        self.input.close()
