"""prefetch: a background thread that keeps a bounded buffer of elements ready."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from convoy._base import threads as _threads
from convoy._transport.channel import Channel
from convoy.data._core._op import Node, Op, PassNode, SameSpecOp


def _produce(upstream: Iterator[Any], channel: Channel[Any], step: threading.Lock) -> None:
    try:
        while channel.wait_for_room():
            # `step` makes "take one element upstream and buffer it" atomic for state_dict().
            with step:
                if not channel.put(next(upstream)):
                    return
    except StopIteration:
        channel.close()
    except BaseException as error:  # handed to the consumer, raised there
        channel.fail(error)


class PrefetchNode(Node):
    """Runs its input on a daemon thread; stops it when closed, or once its ``gen`` is
    garbage-collected."""

    __slots__ = ("input", "_channel", "_step", "__weakref__")

    def __init__(self, input: Node, size: int, buffered: list[Any]) -> None:
        self.input = input
        self._channel: Channel[Any] = Channel("prefetched elements", max_items=size,
                                              items=buffered)
        self._step = threading.Lock()
        self.gen = iter(self._channel)
        # Stopped once nobody can read on: whoever holds `gen` (a task may hold it alone).
        weakref.finalize(self.gen, self._channel.cancel)
        _threads.start("convoy-prefetch", _produce, input.gen, self._channel, self._step,
                       on_error=self._channel.fail)

    @classmethod
    def restore(cls, make_input: Callable[[Any], Node], state: Any, size: int) -> PrefetchNode:
        """A prefetching node over ``make_input(inner state)`` from a saved ``state``."""
        if state is None:
            return cls(make_input(None), size, [])
        return cls(make_input(state["input"]), size, state["buffer"])

    def state_dict(self) -> Any:
        with self._step:
            return {"input": self.input.state_dict(), "buffer": self._channel.snapshot()}

    def close(self) -> None:
        self._channel.cancel()
        with self._step:
            self.input.close()


class PrefetchOp(SameSpecOp):
    passes_elements = True

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
