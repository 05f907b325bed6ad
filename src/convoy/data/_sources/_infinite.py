"""Infinite sources: counter and random."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from convoy._values import nest
from convoy.data._core._op import INFINITE_CARDINALITY, Node, Op, draw_seed

_CHUNK = 1024


class _CountNode(Node):
    """A node whose state is how many elements it has yielded."""

    __slots__ = ("count",)

    def __init__(self, count: int, gen: Any) -> None:
        self.count = count
        self.gen = gen

    def state_dict(self) -> int:
        return self.count


class CounterOp(Op):
    """``start``, ``start + step``, ... for ever, as ``dtype`` scalars."""

    def __init__(self, start: int, step: int, dtype: np.dtype) -> None:
        self.start = start
        self.step = step
        self.dtype = dtype

    def cardinality(self) -> int:
        return INFINITE_CARDINALITY

    def iterator(self, state: Any, key: int) -> Node:
        node = _CountNode(state or 0, None)
        node.gen = self._run(node)
        return node

    def _run(self, node: _CountNode) -> Iterator[Any]:
        make = self.dtype.type
        while True:
            value = make(self.start + node.count * self.step)
            node.count += 1
            yield value

    def static_spec(self) -> Any:
        return nest.TensorSpec((), self.dtype)


class RandomOp(Op):
    """Uniform int64 values in [0, 2**32) for ever (TensorFlow's range and dtype).

    The sequence is a function of the seed (and, with ``rerandomize_each_iteration``, of the
    iteration), drawn in chunks from numpy seeded by (seed, iteration, chunk), so a restored
    iterator needs only its position. Without a seed, one is drawn when the pipeline is
    instantiated (built, or unpickled on a data service worker).
    """

    def __init__(self, seed: int | None, rerandomize_each_iteration: bool) -> None:
        self.fixed_seed = seed is not None
        self.seed = seed if seed is not None else draw_seed()
        self.rerandomize = rerandomize_each_iteration

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if not self.fixed_seed:
            self.seed = draw_seed()

    def cardinality(self) -> int:
        return INFINITE_CARDINALITY

    def iterator(self, state: Any, key: int) -> Node:
        node = _CountNode(state or 0, None)
        node.gen = self._run(node, key if self.rerandomize else 0)
        return node

    def _run(self, node: _CountNode, iteration: int) -> Iterator[Any]:
        seed = self.seed % (1 << 63)
        while True:
            chunk, offset = divmod(node.count, _CHUNK)
            rng = np.random.default_rng([seed, iteration, chunk])
            values = rng.integers(0, 1 << 32, size=_CHUNK, dtype=np.int64)
            for value in values[offset:]:
                node.count += 1
                yield value

    def static_spec(self) -> Any:
        return nest.TensorSpec((), np.int64)
