"""ignore_errors and assert_cardinality: ops about how an input fails or ends."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Iterator
from typing import Any

from convoy.data._core._op import INFINITE_CARDINALITY, Node, Op, SameSpecOp
from convoy.data._ops._map import MapOp
from convoy.errors import FailedPreconditionError, UnimplementedError

_log = logging.getLogger("convoy.data")
_END = object()


class IgnoreErrorsOp(SameSpecOp):
    """The input's elements, skipping those whose computation raised.

    A sequential ``map`` right below reads on after its function raised. Any other error
    can end the input's Python generators, so the input is rebuilt from its state right
    after the error: the element that failed is consumed, as in tf.data. An input that fails
    again from the same state, with no element in between, ends the dataset.
    """

    passes_elements = True

    def __init__(self, input: Op, log_warning: bool) -> None:
        self.inputs = (input,)
        self.log_warning = log_warning

    def iterator(self, state: Any, key: int) -> Node:
        return _IgnoreErrorsNode(self, self._input_iterator(state, key), key)

    def _input_iterator(self, state: Any, key: int) -> Node:
        if isinstance(self.input, MapOp):
            return self.input.recoverable_iterator(state, key)
        return self.input.iterator(state, key)


class _IgnoreErrorsNode(Node):
    __slots__ = ("op", "input", "key")

    def __init__(self, op: IgnoreErrorsOp, input: Node, key: int) -> None:
        self.op = op
        self.input = input
        self.key = key
        self.gen = self._run()

    def _run(self) -> Iterator[Any]:
        stuck_at: bytes | None = None  # the state an error left, until an element passes
        while True:
            try:
                for element in self.input.gen:
                    stuck_at = None
                    yield element
                return
            except Exception as error:
                if self.op.log_warning:
                    _log.warning("Ignoring error: %s", error)
                if getattr(self.input.gen, "upstream_failed", True) is False:
                    continue  # the map's function failed: its iterator reads on
                try:
                    after = self.input.state_dict()
                except UnimplementedError:  # an input that cannot resume (DYNAMIC splits)
                    raise error from None
                position = pickle.dumps(after)
                if position == stuck_at:
                    return  # the same error again from the same place: it would never end
                stuck_at = position
                self.input.close()
                self.input = self.op._input_iterator(after, self.key)

    def state_dict(self) -> Any:
        return self.input.state_dict()

    def close(self) -> None:
        self.input.close()


def _elements(n: int) -> str:
    return f"{n} element" if n == 1 else f"{n} elements"


class AssertCardinalityOp(SameSpecOp):
    """The input, with cardinality ``expected``; FailedPreconditionError when it has fewer
    or more elements."""

    passes_elements = True

    def __init__(self, input: Op, expected: int) -> None:
        self.inputs = (input,)
        self.expected = expected

    def cardinality(self) -> int:
        return self.expected

    def iterator(self, state: Any, key: int) -> Node:
        state = state or {"input": None, "count": 0}
        return _CountNode(self, self.input.iterator(state["input"], key), state["count"])

    def _expected(self) -> str:
        if self.expected == INFINITE_CARDINALITY:
            return "an infinite number of elements"
        return _elements(self.expected)


class _CountNode(Node):
    __slots__ = ("input", "count")

    def __init__(self, op: AssertCardinalityOp, input: Node, count: int) -> None:
        self.input = input
        self.count = count
        self.gen = self._run(op)

    def _run(self, op: AssertCardinalityOp) -> Iterator[Any]:
        for element in self.input.gen:
            self.count += 1
            if op.expected != INFINITE_CARDINALITY and self.count > op.expected:
                raise FailedPreconditionError(
                    f"Input dataset was expected to contain {op._expected()} but contained "
                    f"at least {_elements(self.count)}.")
            yield element
        if self.count != op.expected:
            raise FailedPreconditionError(
                f"Input dataset was expected to contain {op._expected()} but contained only "
                f"{_elements(self.count)}.")

    def state_dict(self) -> Any:
        return {"input": self.input.state_dict(), "count": self.count}

    def close(self) -> None:
        self.input.close()
