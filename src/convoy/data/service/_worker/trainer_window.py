"""The cross-trainer cache's sliding window: the latest elements of one task, bounded in bytes,
read by several trainers, each at its own position.

Elements are numbered from 0 in the order the task produced them. A trainer at the head of the
window (it has read everything cached) gets new elements by pulling them from the task and
appending them (:meth:`TrainerWindow.append`); the others read what is cached
(:meth:`TrainerWindow.read`). Appending evicts the oldest elements once the window holds more
than its byte bound. A trainer whose next element was evicted skips ahead to the oldest
element still cached, and the elements it missed are counted.

Pure: no threads, locks or clocks; the caller serializes the calls.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from convoy.errors import InvalidArgumentError


@dataclass(frozen=True)
class WindowStats:
    """What a window has done: elements appended (pulled from the task), elements and bytes
    it holds now, and the elements each trainer skipped by falling out of it."""

    produced: int
    cached_elements: int
    cached_bytes: int
    max_bytes: int
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def total_skipped(self) -> int:
        return sum(self.skipped.values())


class TrainerWindow:
    """The latest elements of one task, at most ``max_bytes`` of them as ``size`` counts."""

    def __init__(self, max_bytes: int, size: Callable[[Any], int]) -> None:
        if max_bytes < 1:
            raise InvalidArgumentError(f"max_bytes must be >= 1, got {max_bytes}")
        self.max_bytes = max_bytes
        self._size = size
        self._elements: deque[tuple[Any, int]] = deque()  # (element, size), oldest first
        self._first = 0  # the number of the oldest cached element
        self._bytes = 0
        self._positions: dict[str, int] = {}  # trainer id -> number of its next element
        self._skipped: dict[str, int] = {}

    @property
    def end(self) -> int:
        """The number the next appended element gets."""
        return self._first + len(self._elements)

    def at_head(self, trainer_id: str) -> bool:
        """Whether ``trainer_id`` has read every cached element (it must pull new ones)."""
        return self._positions.get(trainer_id, 0) >= self.end

    def read(self, trainer_id: str, max_elements: int, max_bytes: int) -> list[Any]:
        """Up to ``max_elements`` cached elements (about ``max_bytes``; at least one if any)
        from ``trainer_id``'s position on, which moves past them. A trainer behind the window
        skips to its oldest element first; a new trainer starts at element 0."""
        position = self._catch_up(trainer_id)
        taken: list[Any] = []
        size = 0
        # one pass from the position (indexing a deque's middle walks it every time)
        for element, element_size in itertools.islice(self._elements, position - self._first,
                                                      None):
            if len(taken) >= max_elements or (taken and size >= max_bytes):
                break
            taken.append(element)
            size += element_size
        self._positions[trainer_id] = position + len(taken)
        return taken

    def append(self, trainer_id: str, elements: list[Any]) -> None:
        """Cache ``elements``, just pulled from the task by ``trainer_id`` (at the head), which
        has them: its position moves past them. Evicts the oldest elements beyond the bound.
        Raises InvalidArgumentError for an element larger than the whole window."""
        sizes = [self._size(element) for element in elements]
        for size in sizes:
            if size > self.max_bytes:
                raise InvalidArgumentError(
                    "convoy data service element size is larger than the cross-trainer cache "
                    f"size in bytes. Got element size: {size} and cache size: {self.max_bytes}"
                    " (raise the worker's cross_trainer_cache_size_bytes)")
        position = self._catch_up(trainer_id)
        if position < self.end:
            raise InvalidArgumentError(
                f"trainer {trainer_id!r} appended to the cross-trainer cache before reading "
                f"its cached elements (at {position}, end {self.end})")
        for element, size in zip(elements, sizes, strict=True):
            self._elements.append((element, size))
            self._bytes += size
        while self._bytes > self.max_bytes:
            _, size = self._elements.popleft()
            self._bytes -= size
            self._first += 1
        self._positions[trainer_id] = self.end

    def _catch_up(self, trainer_id: str) -> int:
        """``trainer_id``'s position, moved to the oldest cached element if it fell behind
        (the elements it missed are counted)."""
        position = self._positions.get(trainer_id, 0)
        if position < self._first:
            self._skipped[trainer_id] = (self._skipped.get(trainer_id, 0)
                                         + self._first - position)
            position = self._positions[trainer_id] = self._first
        return position

    def skipped(self, trainer_id: str) -> int:
        """How many elements ``trainer_id`` has skipped by falling behind the window."""
        return self._skipped.get(trainer_id, 0)

    def stats(self) -> WindowStats:
        return WindowStats(self.end, len(self._elements), self._bytes, self.max_bytes,
                           dict(self._skipped))
