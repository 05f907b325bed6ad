"""Variables in expressions: ``v + 1``, ``v1 / v2``, ``-v``, ``v > 0``, ``float(v)`` read the
variable's value and compute with numpy, as TensorFlow's variables read as tensors.

Each use is one read; ``==`` and ``!=`` compare element-wise (as TensorFlow 2 does), while
hashing stays by identity so variables remain usable as dictionary keys.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np


def _value(operand: Any) -> Any:
    return operand.read_value() if isinstance(operand, ReadsAsArray) else operand


def _forward(function: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def forward(self: ReadsAsArray, other: Any) -> Any:
        return function(self.read_value(), _value(other))

    return forward


def _reverse(function: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def reverse(self: ReadsAsArray, other: Any) -> Any:
        return function(_value(other), self.read_value())

    return reverse


def _unary(function: Callable[[Any], Any]) -> Callable[..., Any]:
    def apply(self: ReadsAsArray) -> Any:
        return function(self.read_value())

    return apply


class ReadsAsArray:
    """Operators of a numpy array, on the value ``read_value()`` returns at each use."""

    shape: tuple[int, ...]

    def read_value(self) -> np.ndarray:
        raise NotImplementedError

    __add__, __radd__ = _forward(operator.add), _reverse(operator.add)
    __sub__, __rsub__ = _forward(operator.sub), _reverse(operator.sub)
    __mul__, __rmul__ = _forward(operator.mul), _reverse(operator.mul)
    __truediv__, __rtruediv__ = _forward(operator.truediv), _reverse(operator.truediv)
    __floordiv__, __rfloordiv__ = _forward(operator.floordiv), _reverse(operator.floordiv)
    __mod__, __rmod__ = _forward(operator.mod), _reverse(operator.mod)
    __pow__, __rpow__ = _forward(operator.pow), _reverse(operator.pow)
    __matmul__, __rmatmul__ = _forward(operator.matmul), _reverse(operator.matmul)
    __and__, __rand__ = _forward(operator.and_), _reverse(operator.and_)
    __or__, __ror__ = _forward(operator.or_), _reverse(operator.or_)
    __xor__, __rxor__ = _forward(operator.xor), _reverse(operator.xor)
    __lt__ = _forward(operator.lt)
    __le__ = _forward(operator.le)
    __gt__ = _forward(operator.gt)
    __ge__ = _forward(operator.ge)
    __eq__ = _forward(operator.eq)
    __ne__ = _forward(operator.ne)
    __hash__ = object.__hash__
    __neg__ = _unary(operator.neg)
    __pos__ = _unary(operator.pos)
    __abs__ = _unary(operator.abs)
    __invert__ = _unary(operator.invert)
    __float__ = _unary(float)
    __int__ = _unary(int)
    __complex__ = _unary(complex)
    __bool__ = _unary(bool)
    __index__ = _unary(operator.index)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a scalar variable")
        return self.shape[0]

    def __iter__(self) -> Iterator[Any]:
        """The rows of the value, read once (not one read per row)."""
        if not self.shape:
            raise TypeError("iteration over a scalar variable")
        return iter(self.read_value())
