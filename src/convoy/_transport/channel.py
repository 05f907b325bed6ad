"""The one hand-off between threads: a bounded, closable, error-carrying channel.

A producer ``put``\\s items and ends the stream with ``close()`` (a normal end) or
``fail(error)`` (the error reaches the consumer once the items before it are taken). A
consumer ``get``\\s them one at a time or many at once and may ``cancel()``: the items are
dropped and a blocked producer wakes up to find its ``put`` refused. Every wait takes a
timeout; a wait that runs out raises :class:`TimeoutError` naming what the channel carries.

Capacity is counted in items and, optionally, in a size of each item (bytes, say): a channel
is full when either bound is reached. A single item larger than ``max_size`` is still
accepted into an empty channel, so nothing is ever stuck behind its own size.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Closed(Exception):
    """The channel has ended: closed by its producer and drained, or cancelled."""


class Channel(Generic[T]):
    """A FIFO of ``T`` between threads; ``name`` says what it carries, for error messages."""

    def __init__(self, name: str, max_items: int | None = None, max_size: int | None = None,
                 size_of: Callable[[T], int] | None = None, items: Iterable[T] = ()) -> None:
        if max_size is not None and size_of is None:
            raise ValueError("a channel bounded by size needs size_of")
        self.name = name
        # Bounds as numbers, None as unbounded: the per-item check is two comparisons.
        self._max_items = sys.maxsize if max_items is None else max_items
        self._max_size = sys.maxsize if max_size is None else max_size
        self._size_of = size_of
        self._cond = threading.Condition()
        self._items: deque[tuple[T, int]] = deque()
        self._size = 0
        self._closed = False  # the producer will put no more
        self._error: BaseException | None = None
        self._cancelled = False
        for item in items:
            self._append(item)

    # ----- the producer's side ------------------------------------------------------------------
    def put(self, item: T, timeout: float | None = None) -> bool:
        """Append ``item``, waiting while the channel is full; False if the consumer cancelled
        (the item is dropped). Raises :class:`TimeoutError` if still full after ``timeout``."""
        size = self._size_of(item) if self._size_of is not None else 0  # outside the lock
        with self._cond:  # the common case (room, not cancelled) waits for nothing: per element
            items = self._items
            full = items and (len(items) >= self._max_items or self._size >= self._max_size)
            if full and not self._wait(lambda: not self._full() or self._cancelled, timeout):
                raise TimeoutError(f"{self.name}: still full after {timeout} s "
                                   f"({len(self._items)} items waiting to be taken)")
            if self._cancelled:
                return False
            items.append((item, size))
            self._size += size
            self._cond.notify_all()
            return True

    def wait_for_room(self, timeout: float | None = None) -> bool:
        """Wait until a ``put`` would not block; False if the consumer cancelled. Raises
        :class:`TimeoutError` if still full after ``timeout``. (For a single producer that
        must make an item only once there is room for it.)"""
        with self._cond:
            if not self._wait(lambda: not self._full() or self._cancelled, timeout):
                raise TimeoutError(f"{self.name}: still full after {timeout} s")
            return not self._cancelled

    def close(self) -> None:
        """No more items: consumers get :class:`Closed` once they have taken the rest."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def fail(self, error: BaseException) -> None:
        """End with ``error``, raised to consumers once they have taken the items before it."""
        with self._cond:
            if not self._closed:
                self._error, self._closed = error, True
            self._cond.notify_all()

    # ----- the consumer's side ------------------------------------------------------------------
    def get(self, timeout: float | None = None) -> T:
        """The next item, waiting up to ``timeout`` seconds (then :class:`TimeoutError`).
        Raises :class:`Closed` at the end, or the producer's error."""
        batch = self.get_many(1, timeout=timeout)
        if not batch:
            raise TimeoutError(f"{self.name}: nothing arrived within {timeout} s")
        return batch[0]

    def get_many(self, max_items: int, max_size: int | None = None,
                 timeout: float | None = None) -> list[T]:
        """Up to ``max_items`` items (and about ``max_size`` in size; always at least one if
        any is there), waiting up to ``timeout`` for the first: ``[]`` if none came in time.
        Raises :class:`Closed` at the end, or the producer's error."""
        with self._cond:
            if not self._items:
                self._wait(lambda: bool(self._items) or self._closed or self._cancelled,
                           timeout)
            if self._cancelled:
                raise Closed(f"{self.name}: cancelled")
            taken: list[T] = []
            size = 0
            items = self._items
            while items and len(taken) < max_items and (
                    max_size is None or not taken or size < max_size):
                item, item_size = items.popleft()
                taken.append(item)
                size += item_size
            if taken:
                self._size -= size
                self._cond.notify_all()
                return taken
            if self._closed:
                if self._error is not None:
                    raise self._error
                raise Closed(f"{self.name}: closed")
            return []

    def wait_for_items(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` until an item is there to take, or the channel has ended
        (True: the next ``get`` says which); False if neither happened in time."""
        with self._cond:
            return self._wait(lambda: bool(self._items) or self._closed or self._cancelled,
                              timeout)

    def put_back(self, items: list[T]) -> bool:
        """Put ``items`` back at the front, in their order, without waiting (they count
        towards the bounds from then on); False if nothing more will be taken (cancelled, or
        closed with every item taken)."""
        with self._cond:
            if self._cancelled or (self._closed and not self._items):
                return False
            for item in reversed(items):
                size = self._size_of(item) if self._size_of is not None else 0
                self._items.appendleft((item, size))
                self._size += size
            self._cond.notify_all()
            return True

    def drain(self) -> list[T]:
        """Cancel (as :meth:`cancel`) and return the items dropped, oldest first."""
        with self._cond:
            items = [item for item, _ in self._items]
            self.cancel()
            return items

    def cancel(self) -> None:
        """Drop every item and refuse new ones; wakes a blocked producer and consumers."""
        with self._cond:
            self._cancelled = True
            self._items.clear()
            self._size = 0
            self._cond.notify_all()

    def __iter__(self) -> Iterator[T]:
        """Items until the end (the producer's error is raised); waits without a bound, for
        consumers whose producer is bounded by its own timeouts."""
        while True:
            try:
                yield self.get(timeout=None)
            except Closed:
                return

    # ----- state --------------------------------------------------------------------------------
    @property
    def ended(self) -> bool:
        """Nothing more will come: cancelled, or closed with every item taken."""
        with self._cond:
            return self._cancelled or (self._closed and not self._items)

    @property
    def cancelled(self) -> bool:
        with self._cond:
            return self._cancelled

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    @property
    def size(self) -> int:
        """The total ``size_of`` the items waiting (0 without ``size_of``), e.g. for a gauge
        of buffered bytes."""
        return self._size  # one int read: no lock needed

    def snapshot(self) -> list[T]:
        """The items waiting to be taken, oldest first (a copy)."""
        with self._cond:
            return [item for item, _ in self._items]

    # ----- internals ----------------------------------------------------------------------------
    def _append(self, item: T) -> None:
        size = self._size_of(item) if self._size_of is not None else 0
        self._items.append((item, size))
        self._size += size

    def _full(self) -> bool:
        items = self._items
        return bool(items) and (len(items) >= self._max_items or self._size >= self._max_size)

    def _wait(self, ready: Callable[[], bool], timeout: float | None) -> bool:
        """Wait (holding ``_cond``) until ``ready()``; False if ``timeout`` ran out first."""
        if timeout is None:
            while not ready():
                self._cond.wait()
            return True
        deadline = time.monotonic() + timeout
        while not ready():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._cond.wait(remaining)
        return True
