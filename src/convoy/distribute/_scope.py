"""Which strategy's scope is active (the innermost ``with strategy.scope():``), and whether
this process is a cluster's chief (a strategy was made here)."""

from __future__ import annotations

import threading
from typing import Any

_local = threading.local()
_chief = False


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


def become_chief() -> None:
    global _chief
    _chief = True


def is_chief() -> bool:
    return _chief
