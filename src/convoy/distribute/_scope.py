"""Which strategy's scope is active (the innermost ``with strategy.scope():``)."""

from __future__ import annotations

import threading
from typing import Any

_local = threading.local()


def current() -> Any:
    """The strategy whose scope this thread is in, or None."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def push(strategy: Any) -> None:
    if not hasattr(_local, "stack"):
        _local.stack = []
    _local.stack.append(strategy)


def pop() -> None:
    _local.stack.pop()
