"""prefetch: a background thread that keeps a bounded buffer of elements ready."""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from convoy.data._op import Node, Op, PassNode


class _Buffer:
    """Elements handed from the producer thread to the consumer.

    ``cond`` guards ``items``, ``finished``, ``error`` and ``stopped``.
    """

    __slots__ = ("cond", "items", "size", "finished", "error", "stopped")

    def __init__(self, size: int, items: list[Any]) -> None:
        self.cond = threading.Condition()
        self.items: deque[Any] = deque(items)
        self.size = size
        self.finished = False
        self.error: BaseException | None = None
        self.stopped = False

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()


def _produce(upstream: Iterator[Any], buffer: _Buffer, step: threading.Lock) -> None:
    cond, items = buffer.cond, buffer.items
    try:
        while True:
            with cond:
                while len(items) >= buffer.size and not buffer.stopped:
                    cond.wait()
                if buffer.stopped:
                    return
            # `step` makes "take one element upstream and buffer it" atomic for state_dict().
            with step:
                element = next(upstream)
                with cond:
                    items.append(element)
                    cond.notify_all()
    except StopIteration:
        with cond:
            buffer.finished = True
            cond.notify_all()
    except BaseException as error:  # handed to the consumer, raised there
        with cond:
            buffer.error = error
            cond.notify_all()


def _consume(buffer: _Buffer) -> Iterator[Any]:
    cond, items = buffer.cond, buffer.items
    while True:
        with cond:
            while not items and not buffer.finished and buffer.error is None:
                cond.wait()
            if items:
                element = items.popleft()
                cond.notify_all()
            elif buffer.error is not None:
                raise buffer.error
            else:
                return
        yield element


class PrefetchNode(Node):
    """Runs its input on a daemon thread; stops it when closed, or once its ``gen`` is
    garbage-collected."""

    __slots__ = ("input", "_buffer", "_step", "__weakref__")

    def __init__(self, input: Node, size: int, buffered: list[Any]) -> None:
        self.input = input
        self._buffer = _Buffer(size, buffered)
        self._step = threading.Lock()
        self.gen = _consume(self._buffer)
        thread = threading.Thread(target=_produce, args=(input.gen, self._buffer, self._step),
                                  name="convoy-prefetch", daemon=True)
        # Stopped once nobody can read on: whoever holds `gen` (a task may hold it alone).
        weakref.finalize(self.gen, self._buffer.stop)
        thread.start()

    @classmethod
    def restore(cls, make_input: Callable[[Any], Node], state: Any, size: int) -> PrefetchNode:
        """A prefetching node over ``make_input(inner state)`` from a saved ``state``."""
        if state is None:
            return cls(make_input(None), size, [])
        return cls(make_input(state["input"]), size, state["buffer"])

    def state_dict(self) -> Any:
        with self._step, self._buffer.cond:
            return {"input": self.input.state_dict(), "buffer": list(self._buffer.items)}

    def close(self) -> None:
        self._buffer.stop()
        with self._step:
            self.input.close()


class PrefetchOp(Op):
    def __init__(self, input: Op, buffer_size: int) -> None:
        self.inputs = (input,)
        self.buffer_size = buffer_size

    def cardinality(self) -> int:
        return self.input.cardinality()

    def iterator(self, state: Any, key: int) -> Node:
        if self.buffer_size == 0:
            input = self.input.iterator(state, key)
            return PassNode(input, input.gen)
        return PrefetchNode.restore(lambda s: self.input.iterator(s, key), state,
                                    self.buffer_size)

    def static_spec(self) -> Any:
        return self.input.static_spec()
