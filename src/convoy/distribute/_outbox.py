"""The operation lists a process has queued for one parameter server, in the order they leave,
each with the time it is due.

A list put in the ordinary way is due at once, and wakes the sender thread waiting in
:meth:`Outbox.wait_until_due`. A list put ``later`` (a scheduled function's updates) is due
:data:`CARRY_S` after it was put: until then it waits for the process's next message to that
ps, which takes every list queued before its own (:meth:`Outbox.take`). So one step's updates
travel with the next step's reads, in one message, and the sender thread sends only what
nothing carried in time.

While lists keep being put ``later``, the sender thread looks every :data:`CARRY_S` on its own,
so putting one wakes no other thread.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")

#: How long a list put ``later`` waits for another message to carry it.
CARRY_S = 0.02
#: How long after the last list put ``later`` the sender thread goes on looking on its own.
_LOOKING_S = 1.0


class Outbox(Generic[T]):
    """Lists queued for one ps, oldest first; safe to use from any thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._lists: deque[tuple[T, float]] = deque()  # (list, when it is due)
        self._looks_at = 0.0  # when the waiting sender looks next unwoken (0.0: not waiting)
        self._looking_until = 0.0  # the sender looks every CARRY_S on its own until then

    def __len__(self) -> int:
        with self._cond:
            return len(self._lists)

    def put(self, items: list[T], later: bool = False) -> None:
        """Queue ``items``: due now, or ``later`` (in :data:`CARRY_S`)."""
        now = time.monotonic()
        due = now + CARRY_S if later else now
        with self._cond:
            self._lists.extend((item, due) for item in items)
            if later:
                self._looking_until = now + _LOOKING_S
            if due < self._looks_at:
                self._cond.notify()

    def take(self, max_items: int) -> list[T] | None:
        """Every list queued, oldest first; None (taking nothing) if there are more than
        ``max_items``."""
        with self._cond:
            if len(self._lists) > max_items:
                return None
            taken = [item for item, _ in self._lists]
            self._lists.clear()
            return taken

    def take_first(self, max_items: int) -> list[T]:
        """The oldest ``max_items`` lists at most."""
        with self._cond:
            count = min(max_items, len(self._lists))
            return [self._lists.popleft()[0] for _ in range(count)]

    def wait_until_due(self, timeout: float) -> bool:
        """Wait until a queued list is due (True), or ``timeout`` seconds (False)."""
        with self._cond:
            end = time.monotonic() + timeout
            try:
                while True:
                    now = time.monotonic()
                    due = min((due for _, due in self._lists), default=math.inf)
                    if due <= now:
                        return True
                    if now >= end:
                        return False
                    looks_at = min(end, due)
                    if now < self._looking_until:
                        looks_at = min(looks_at, now + CARRY_S)
                    self._looks_at = looks_at
                    self._cond.wait(looks_at - now)
            finally:
                self._looks_at = 0.0
