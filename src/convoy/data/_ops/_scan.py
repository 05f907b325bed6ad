"""scan: a map that carries a state from one element to the next."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from convoy._values import nest
from convoy.data._core._op import Node, Op, first_element_spec
from convoy.errors import InvalidArgumentError


class ScanOp(Op):
    """``scan_func(state, element) -> (new_state, output)``, from ``initial_state`` on."""

    def __init__(self, input: Op, initial_state: Any,
                 scan_func: Callable[[Any, Any], Any]) -> None:
        self.inputs = (input,)
        self.initial_state = initial_state
        self.scan_func = scan_func

    def cardinality(self) -> int:
        return self.input.cardinality()

    def iterator(self, state: Any, key: int) -> Node:
        if state is None:
            return _ScanNode(self, self.input.iterator(None, key), self.initial_state)
        return _ScanNode(self, self.input.iterator(state["input"], key), state["state"])

    def static_spec(self) -> Any:
        return first_element_spec(self)

    def step(self, state: Any, element: Any) -> tuple[Any, Any]:
        result = self.scan_func(state, element)
        if not isinstance(result, tuple) or len(result) != 2:
            raise InvalidArgumentError(
                "The scan function must return a pair comprising the new state and the "
                f"output value, got {type(result).__name__}")
        new_state, output = result
        try:
            nest.assert_same_structure(self.initial_state, new_state, check_types=False)
        except InvalidArgumentError as error:
            raise InvalidArgumentError(
                f"The element structure for the new state must match the initial state: "
                f"{error}") from None
        return new_state, output


class _ScanNode(Node):
    __slots__ = ("input", "state")

    def __init__(self, op: ScanOp, input: Node, state: Any) -> None:
        self.input = input
        self.state = state
        self.gen = self._run(op)

    def _run(self, op: ScanOp) -> Iterator[Any]:
        for element in self.input.gen:
            self.state, output = op.step(self.state, element)
            yield output

    def state_dict(self) -> Any:
        return {"input": self.input.state_dict(), "state": self.state}

    def close(self) -> None:
        self.input.close()
