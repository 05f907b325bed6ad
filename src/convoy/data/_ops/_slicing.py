"""Ops that choose which elements pass, or how often: take, skip, take_while, shard,
enumerate, repeat. take, skip and repeat also pass on row streams (see _rows)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

from convoy._values import nest
from convoy.data._core._op import (
    INFINITE_CARDINALITY,
    SHARD_HINT,
    UNKNOWN_CARDINALITY,
    Node,
    Op,
    SameSpecOp,
    derive_key,
    element_caller,
)
from convoy.data._core._rows import Chunk, RowNode, RowSource
from convoy.errors import InvalidArgumentError


class _CountingNode(Node):
    """A node whose state is its input's state plus one integer the op interprets."""

    __slots__ = ("input", "count")

    def __init__(self, input: Node, count: int, run: Callable[[Any], Iterator[Any]]) -> None:
        self.input = input
        self.count = count
        self.gen = run(self)

    def state_dict(self) -> Any:
        return {"input": self.input.state_dict(), "count": self.count}

    def close(self) -> None:
        self.input.close()


def _counting(op: Op, state: Any, key: int, start: int,
              run: Callable[[Any], Iterator[Any]]) -> Node:
    if state is None:
        return _CountingNode(op.input.iterator(None, key), start, run)
    return _CountingNode(op.input.iterator(state["input"], key), state["count"], run)


class TakeOp(SameSpecOp):
    passes_elements = True

    def __init__(self, input: Op, count: int) -> None:
        self.inputs = (input,)
        self.count = count

    def cardinality(self) -> int:
        n = self.input.cardinality()
        if self.count < 0:
            return n
        if n == UNKNOWN_CARDINALITY:
            return UNKNOWN_CARDINALITY if self.count > 0 else 0
        return self.count if n == INFINITE_CARDINALITY else min(n, self.count)

    def iterator(self, state: Any, key: int) -> Node:
        return _counting(self, state, key, self.count, _take)

    def row_source(self) -> RowSource | None:
        return self.input.row_source()

    def row_iterator(self, state: Any, key: int) -> RowNode:
        return _counting_rows(self, state, key, self.count, _TakeRows)


class _CountingRows(RowNode):
    """The row stream of take or skip: its state is that of their element nodes."""

    __slots__ = ("input", "count")

    def __init__(self, input: RowNode, count: int) -> None:
        self.input = input
        self.count = count

    def state_dict(self) -> Any:
        return {"input": self.input.state_dict(), "count": self.count}

    def close(self) -> None:
        self.input.close()


def _counting_rows(op: Op, state: Any, key: int, start: int,
                   kind: type[_CountingRows]) -> RowNode:
    if state is None:
        return kind(op.input.row_iterator(None, key), start)
    return kind(op.input.row_iterator(state["input"], key), state["count"])


class _TakeRows(_CountingRows):
    __slots__ = ()

    def pull(self, n: int) -> tuple[int, list[Chunk]]:
        if self.count < 0:
            return self.input.pull(n)
        if self.count == 0:
            return 0, []
        got, chunks = self.input.pull(min(n, self.count))
        self.count -= got
        return got, chunks


# rows skipped per pull, so skipping many epochs of a repeat holds few chunks at a time
_SKIP_STEP = 1 << 16


class _SkipRows(_CountingRows):
    __slots__ = ()

    def pull(self, n: int) -> tuple[int, list[Chunk]]:
        if self.count < 0:  # skip(-1) skips everything
            while self.input.pull(_SKIP_STEP)[0]:
                pass
            return 0, []
        left = self.count
        while left > 0:
            got = self.input.pull(min(left, _SKIP_STEP))[0]
            if not got:
                break
            left -= got
        self.count = 0
        return self.input.pull(n)


def _take(node: _CountingNode) -> Iterator[Any]:
    upstream = node.input.gen
    if node.count < 0:
        yield from upstream
        return
    while node.count > 0:
        for element in upstream:
            node.count -= 1
            yield element
            break
        else:
            return


class SkipOp(SameSpecOp):
    passes_elements = True

    def __init__(self, input: Op, count: int) -> None:
        self.inputs = (input,)
        self.count = count

    def cardinality(self) -> int:
        n = self.input.cardinality()
        if n < 0:
            return n
        return 0 if self.count < 0 else max(0, n - self.count)

    def iterator(self, state: Any, key: int) -> Node:
        return _counting(self, state, key, self.count, _skip)

    def row_source(self) -> RowSource | None:
        return self.input.row_source()

    def row_iterator(self, state: Any, key: int) -> RowNode:
        return _counting_rows(self, state, key, self.count, _SkipRows)


def _skip(node: _CountingNode) -> Iterator[Any]:
    upstream = node.input.gen
    if node.count < 0:
        for _ in upstream:
            pass
        return
    if node.count:
        for _ in islice(upstream, node.count):
            pass
        node.count = 0
    yield from upstream


class TakeWhileOp(SameSpecOp):
    passes_elements = True

    def __init__(self, input: Op, predicate: Callable[..., Any]) -> None:
        self.inputs = (input,)
        self.predicate = predicate

    def iterator(self, state: Any, key: int) -> Node:
        return _counting(self, state, key, 0, self._run)

    def _run(self, node: _CountingNode) -> Iterator[Any]:
        if node.count:  # the predicate failed before: the dataset has ended
            return
        predicate = element_caller(self.predicate)
        for element in node.input.gen:
            if not predicate(element):
                node.count = 1
                return
            yield element


class ShardOp(SameSpecOp):
    """Every ``num_shards``-th element, starting at ``index``; with both SHARD_HINT, a
    placeholder that only the data service's HINT policy can run (it fills them in)."""

    passes_elements = True

    def __init__(self, input: Op, num_shards: int, index: int) -> None:
        self.inputs = (input,)
        self.num_shards = num_shards
        self.index = index

    @property
    def is_hint(self) -> bool:
        return self.num_shards == SHARD_HINT

    def cardinality(self) -> int:
        if self.is_hint:
            return UNKNOWN_CARDINALITY
        n = self.input.cardinality()
        if n < 0:
            return n
        return max(0, -(-(n - self.index) // self.num_shards))

    def iterator(self, state: Any, key: int) -> Node:
        if self.is_hint:
            raise InvalidArgumentError(
                "shard(SHARD_HINT, SHARD_HINT) is a placeholder: only the data service's "
                "HINT sharding policy runs it, as shard(number of workers, worker index); "
                "distribute the pipeline with ShardingPolicy.HINT, or give shard numbers"
            )
        return _counting(self, state, key, 0, self._run)

    def _run(self, node: _CountingNode) -> Iterator[Any]:
        upstream = node.input.gen
        if not node.count:  # count = 1 once the first element of this shard has passed
            for element in islice(upstream, self.index, self.index + 1):
                node.count = 1
                yield element
            if not node.count:
                return
        yield from islice(upstream, self.num_shards - 1, None, self.num_shards)


class EnumerateOp(Op):
    def __init__(self, input: Op, start: int) -> None:
        self.inputs = (input,)
        self.start = start

    def cardinality(self) -> int:
        return self.input.cardinality()

    def iterator(self, state: Any, key: int) -> Node:
        return _counting(self, state, key, self.start, _enumerate)

    def static_spec(self) -> Any:
        spec = self.input.static_spec()
        return None if spec is None else (nest.TensorSpec((), "int64"), spec)


def _enumerate(node: _CountingNode) -> Iterator[Any]:
    for element in node.input.gen:
        index = node.count
        node.count = index + 1
        yield (index, element)


class RepeatOp(SameSpecOp):
    """The input again and again; every epoch is a new iteration with its own key."""

    passes_elements = True

    def __init__(self, input: Op, count: int) -> None:
        self.inputs = (input,)
        self.count = count

    def cardinality(self) -> int:
        n = self.input.cardinality()
        if n == 0 or self.count == 0:
            return 0
        if self.count < 0:
            return INFINITE_CARDINALITY if n != UNKNOWN_CARDINALITY else UNKNOWN_CARDINALITY
        return n if n < 0 else n * self.count

    def iterator(self, state: Any, key: int) -> Node:
        return _RepeatNode(self, state or {"epoch": 0, "input": None}, key)

    def row_source(self) -> RowSource | None:
        return self.input.row_source()

    def row_iterator(self, state: Any, key: int) -> RowNode:
        return _RepeatRows(self, state or {"epoch": 0, "input": None}, key)


class _RepeatNode(Node):
    __slots__ = ("op", "key", "epoch", "input")

    def __init__(self, op: RepeatOp, state: Any, key: int) -> None:
        self.op = op
        self.key = key
        self.epoch = state["epoch"]
        self.input: Node | None = None
        if state["input"] is not None:
            self.input = op.input.iterator(state["input"], derive_key(key, self.epoch))
        self.gen = self._run()

    def _run(self) -> Iterator[Any]:
        count = self.op.count
        while count < 0 or self.epoch < count:
            fresh = self.input is None
            if self.input is None:
                self.input = self.op.input.iterator(None, derive_key(self.key, self.epoch))
            produced = False
            for element in self.input.gen:
                produced = True
                yield element
            self.input.close()
            self.input = None
            self.epoch += 1
            if fresh and not produced and count < 0 and not self.op.input.reads_remote():
                return  # an empty input repeated forever is still empty

    def state_dict(self) -> Any:
        position = None if self.input is None else self.input.state_dict()
        return {"epoch": self.epoch, "input": position}

    def close(self) -> None:
        if self.input is not None:
            self.input.close()


class _RepeatRows(RowNode):
    """The row stream of repeat: a pull runs on into the next epoch; the same state as
    :class:`_RepeatNode`."""

    __slots__ = ("op", "key", "epoch", "input")

    def __init__(self, op: RepeatOp, state: Any, key: int) -> None:
        self.op = op
        self.key = key
        self.epoch = state["epoch"]
        self.input: RowNode | None = None
        if state["input"] is not None:
            self.input = op.input.row_iterator(state["input"], derive_key(key, self.epoch))

    def pull(self, n: int) -> tuple[int, list[Chunk]]:
        count = self.op.count
        total, chunks = 0, []
        while total < n and (count < 0 or self.epoch < count):
            fresh = self.input is None
            if self.input is None:
                self.input = self.op.input.row_iterator(None, derive_key(self.key, self.epoch))
            got, more = self.input.pull(n - total)
            total += got
            chunks += more
            if total < n:  # this epoch is over
                self.input.close()
                self.input = None
                self.epoch += 1
                if fresh and not got and count < 0 and not self.op.input.reads_remote():
                    break  # an empty input repeated forever is still empty
        return total, chunks

    def state_dict(self) -> Any:
        position = None if self.input is None else self.input.state_dict()
        return {"epoch": self.epoch, "input": position}

    def close(self) -> None:
        if self.input is not None:
            self.input.close()
