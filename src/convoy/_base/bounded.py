"""A dict that keeps only its newest entries: the bounded caches of ids and unpickled values."""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

from convoy.errors import InvalidArgumentError

K = TypeVar("K")
V = TypeVar("V")


class BoundedDict(OrderedDict[K, V]):
    """A dict of at most ``capacity`` entries: a key set becomes the newest, and past
    ``capacity`` the oldest entries go. Its owner does the locking."""

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise InvalidArgumentError(f"`capacity` must be an int >= 1, got {capacity!r}")
        super().__init__()
        self.capacity = capacity

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.capacity:
            self.popitem(last=False)
