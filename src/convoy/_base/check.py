"""Argument checks shared by the public API: each names the argument, the expectation, the value."""

from __future__ import annotations

import numbers
from typing import Any

from convoy.errors import InvalidArgumentError


def _got(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def integer(name: str, value: Any, minimum: int | None = None,
            allowed: tuple[int, ...] = ()) -> int:
    """``value`` as an int, at least ``minimum`` unless it is one of ``allowed``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgumentError(f"{name} must be an integer, got {_got(value)}")
    value = int(value)
    if value in allowed:
        return value
    if minimum is not None and value < minimum:
        extra = f" (or one of {list(allowed)})" if allowed else ""
        raise InvalidArgumentError(f"{name} must be >= {minimum}{extra}, got {value}")
    return value


def optional_integer(name: str, value: Any, minimum: int | None = None,
                     allowed: tuple[int, ...] = ()) -> int | None:
    return None if value is None else integer(name, value, minimum, allowed)


def boolean(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be True or False, got {_got(value)}")
    return value


def optional_boolean(name: str, value: Any) -> bool | None:
    return None if value is None else boolean(name, value)


def function(name: str, value: Any) -> Any:
    if not callable(value):
        raise InvalidArgumentError(f"{name} must be callable, got {_got(value)}")
    return value


def string(name: str, value: Any, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{name} must be a string, got {_got(value)}")
    if not allow_empty and not value:
        raise InvalidArgumentError(f"{name} must be a non-empty string, got ''")
    return value
