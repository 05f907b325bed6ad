"""interleave (and flat_map, its one-slot case): round-robin over datasets made per element."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from convoy.data._core._op import Node, Op, derive_key, first_element_spec
from convoy.data._ops._grouping import element_from_plain, plain_element
from convoy.data._ops._prefetch import PrefetchNode

_END = object()


class InterleaveOp(Op):
    """``make_op(element)`` gives the op of the dataset each input element expands to.

    Up to ``cycle_length`` of them are open at once; ``block_length`` elements are taken from
    each in turn; an exhausted one is replaced by the next input element's dataset. With
    ``parallel`` each open dataset is read ahead on its own thread (the order is unchanged).
    """

    def __init__(self, input: Op, make_op: Callable[[Any], Op], cycle_length: int,
                 block_length: int, parallel: bool) -> None:
        self.inputs = (input,)
        self.make_op = make_op
        self.cycle_length = cycle_length
        self.block_length = block_length
        self.parallel = parallel

    def iterator(self, state: Any, key: int) -> Node:
        return _InterleaveNode(self, state, key)

    def static_spec(self) -> Any:
        return first_element_spec(self)


class _Slot:
    __slots__ = ("element", "index", "node")

    def __init__(self, element: Any, index: int, node: Node) -> None:
        self.element = element
        self.index = index
        self.node = node


class _InterleaveNode(Node):
    __slots__ = ("op", "key", "input", "slots", "cycle", "block", "end", "opened")

    def __init__(self, op: InterleaveOp, state: Any, key: int) -> None:
        self.op = op
        self.key = key
        if state is None:
            state = {"input": None, "slots": [None] * op.cycle_length, "cycle": 0,
                     "block": 0, "end": False, "opened": 0}
        self.input = op.input.iterator(state["input"], key)
        self.slots: list[_Slot | None] = [
            None if s is None else self._open(element_from_plain(s["element"]), s["index"],
                                              s["state"])
            for s in state["slots"]
        ]
        self.cycle, self.block = state["cycle"], state["block"]
        self.end, self.opened = state["end"], state["opened"]
        self.gen = self._run()

    def _open(self, element: Any, index: int, state: Any) -> _Slot:
        op = self.op.make_op(element)
        key = derive_key(self.key, index)
        if self.op.parallel:
            node: Node = PrefetchNode.restore(lambda s: op.iterator(s, key), state,
                                              max(2, self.op.block_length))
        else:
            node = op.iterator(state, key)
        return _Slot(element, index, node)

    def _advance(self) -> None:
        self.cycle = (self.cycle + 1) % len(self.slots)
        self.block = 0

    def _run(self) -> Iterator[Any]:
        slots, block_length = self.slots, self.op.block_length
        upstream = self.input.gen
        while True:
            slot = slots[self.cycle]
            if slot is None:
                if not self.end:
                    element = next(upstream, _END)
                    if element is not _END:
                        slots[self.cycle] = self._open(element, self.opened, None)
                        self.opened += 1
                        continue
                    self.end = True
                if all(s is None for s in slots):
                    return
                self._advance()
                continue
            element = next(slot.node.gen, _END)
            if element is _END:
                slot.node.close()
                slots[self.cycle] = None
                self._advance()
                continue
            self.block += 1
            if self.block >= block_length:
                self._advance()
            yield element

    def state_dict(self) -> Any:
        slots = [None if s is None else
                 {"element": plain_element(s.element), "index": s.index,
                  "state": s.node.state_dict()}
                 for s in self.slots]
        return {"input": self.input.state_dict(), "slots": slots, "cycle": self.cycle,
                "block": self.block, "end": self.end, "opened": self.opened}

    def close(self) -> None:
        for slot in self.slots:
            if slot is not None:
                slot.node.close()
        self.input.close()
