"""shuffle: a uniformly random pick from a sliding buffer (of elements, or of row numbers in
a row stream)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np

from convoy.data._core._op import Node, Op, SameSpecOp, draw_seed
from convoy.data._core._rows import Chunk, RowNode, RowSource, row_numbers


class ShuffleOp(SameSpecOp):
    """Seeded per iteration: with ``reshuffle_each_iteration`` every iteration key gets its own
    order, otherwise every iteration repeats the first one's order.

    Without a seed, one is drawn when the pipeline is instantiated: built here, or unpickled
    (so each data service worker draws its own and shuffles its own way, as in TensorFlow).
    The shuffle's iterators save their random state, so a restored iterator goes on as the
    saved one would have.
    """

    passes_elements = True

    def __init__(self, input: Op, buffer_size: int, seed: int | None,
                 reshuffle_each_iteration: bool) -> None:
        self.inputs = (input,)
        self.buffer_size = buffer_size
        self.fixed_seed = seed is not None
        self.seed = seed if seed is not None else draw_seed()
        self.reshuffle = reshuffle_each_iteration

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if not self.fixed_seed:
            self.seed = draw_seed()

    def cardinality(self) -> int:
        return self.input.cardinality()

    def _rng(self, key: int) -> random.Random:
        return random.Random(hash((self.seed, key if self.reshuffle else 0)))

    def iterator(self, state: Any, key: int) -> Node:
        if state is None:
            rng = self._rng(key)
            return _ShuffleNode(self.input.iterator(None, key), self.buffer_size, rng, [])
        rng = random.Random()
        rng.setstate(state["rng"])
        return _ShuffleNode(self.input.iterator(state["input"], key), self.buffer_size, rng,
                            state["buffer"])

    def row_source(self) -> RowSource | None:
        return self.input.row_source()

    def row_iterator(self, state: Any, key: int) -> RowNode:
        if state is None:
            return _ShuffleRows(self.input.row_iterator(None, key), self.buffer_size,
                                self._rng(key).getstate(), [])
        return _ShuffleRows(self.input.row_iterator(state["input"], key), self.buffer_size,
                            state["rng"], state["rows"])


class _ShuffleNode(Node):
    __slots__ = ("input", "rng", "buffer")

    def __init__(self, input: Node, size: int, rng: random.Random, buffer: list[Any]) -> None:
        self.input = input
        self.rng = rng
        self.buffer = list(buffer)
        self.gen = self._run(size)

    def _run(self, size: int) -> Iterator[Any]:
        buffer = self.buffer
        draw = self.rng.random
        for element in self.input.gen:
            if len(buffer) < size:
                buffer.append(element)
                continue
            i = int(draw() * size)
            chosen = buffer[i]
            buffer[i] = element
            yield chosen
        while buffer:
            i = int(draw() * len(buffer))
            buffer[i], buffer[-1] = buffer[-1], buffer[i]
            yield buffer.pop()

    def state_dict(self) -> Any:
        return {"input": self.input.state_dict(), "buffer": list(self.buffer),
                "rng": self.rng.getstate()}

    def close(self) -> None:
        self.input.close()


class _ShuffleRows(RowNode):
    """The shuffle of a row stream: the same picks as :class:`_ShuffleNode` over a buffer of
    row numbers, from the same random numbers drawn by numpy's Mersenne Twister (the one
    ``random`` uses, which makes its doubles the same way).

    Its state holds the buffer's row numbers (``rows``) where the element path's holds
    elements (``buffer``), and the random state as ``random`` writes it.
    """

    __slots__ = ("input", "size", "rng", "gauss", "buffer")

    def __init__(self, input: RowNode, size: int, rng_state: Any, rows: list[int]) -> None:
        self.input = input
        self.size = size
        version, internal, self.gauss = rng_state
        self.rng = np.random.RandomState()
        self.rng.set_state(("MT19937", np.array(internal[:-1], dtype=np.uint32), internal[-1],
                            0, 0.0))
        self.buffer = np.array(rows, dtype=np.intp)

    def pull(self, n: int) -> tuple[int, list[Chunk]]:
        size = self.size
        if len(self.buffer) < size:  # filling (or the input is over: then it stays short)
            got, chunks = self.input.pull(size - len(self.buffer))
            if got:
                self.buffer = np.concatenate([self.buffer, row_numbers(chunks)])
        out: list[np.ndarray] = []
        got = 0
        if len(self.buffer) == size:  # each new row replaces a random pick
            got, chunks = self.input.pull(n)
            if got:
                slots = (self.rng.random_sample(got) * size).astype(np.intp)
                out.append(_replace(self.buffer, slots, row_numbers(chunks)))
        if got < n and len(self.buffer):  # the input is over: drain the buffer
            out.append(self._drain(n - got))
        rows: list[Chunk] = [chunk for chunk in out if len(chunk)]
        return sum(map(len, out)), rows

    def _drain(self, n: int) -> np.ndarray:
        buffer = self.buffer.tolist()
        picked = []
        for draw in self.rng.random_sample(min(n, len(buffer))).tolist():
            i = int(draw * len(buffer))
            buffer[i], buffer[-1] = buffer[-1], buffer[i]
            picked.append(buffer.pop())
        self.buffer = np.array(buffer, dtype=np.intp)
        return np.array(picked, dtype=np.intp)

    def state_dict(self) -> Any:
        mt = self.rng.get_state(legacy=False)["state"]
        return {"input": self.input.state_dict(), "rows": self.buffer.tolist(),
                "rng": (3, (*mt["key"].tolist(), int(mt["pos"])), self.gauss)}

    def close(self) -> None:
        self.input.close()


def _replace(buffer: np.ndarray, slots: np.ndarray, incoming: np.ndarray) -> np.ndarray:
    """What ``for s, e in zip(slots, incoming): yield buffer[s]; buffer[s] = e`` yields,
    without the loop; ``buffer`` ends as the loop leaves it."""
    order = np.argsort(slots, kind="stable")
    slot, row = slots[order], incoming[order]
    # in slot order, a pick from a slot written before in this pull takes the row written
    again = np.zeros(len(slot), dtype=bool)
    again[1:] = slot[1:] == slot[:-1]
    earlier = np.empty_like(row)
    earlier[0] = 0
    earlier[1:] = row[:-1]
    picked = np.empty_like(row)
    picked[order] = np.where(again, earlier, buffer[slot])
    last = np.ones(len(slot), dtype=bool)
    last[:-1] = ~again[1:]
    buffer[slot[last]] = row[last]
    return picked
