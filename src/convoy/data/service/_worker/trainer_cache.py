"""The cross-trainer cache of one task: trainers with different ids read the same elements,
each computed once by the task.

:class:`TrainerCache` is the thread-safe face of a :class:`~.trainer_window.TrainerWindow`
that the worker serves GetElements calls from: a trainer with cached elements ahead of it
reads them; one at the head pulls the next elements from the task (one trainer at a time) and
appends them for the others.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from convoy.data.service._worker.task import Task, element_size
from convoy.data.service._worker.trainer_window import TrainerWindow, WindowStats
from convoy.errors import InvalidArgumentError

log = logging.getLogger(__name__)

#: Default bound of a task's window, as TensorFlow's (WorkerConfig.cross_trainer_cache_size_bytes).
DEFAULT_CACHE_BYTES = 10 << 30
#: A task serving through the cache buffers this many elements ahead of the window at most:
#: the window is its buffer.
READ_AHEAD_ELEMENTS = 64
#: A trainer that keeps falling behind is warned about this often at most.
WARN_EVERY_S = 10.0


class TrainerCache:
    """Serves ``task``'s elements to trainers through a window of ``max_bytes``."""

    def __init__(self, task: Task, max_bytes: int, worker_address: str) -> None:
        self._task = task
        self._worker_address = worker_address
        self._window = TrainerWindow(max_bytes, element_size)
        self._lock = threading.Lock()  # guards the window and the warnings
        self._pulling = threading.Lock()  # one trainer pulls from the task at a time
        self._warned: dict[str, float] = {}  # trainer id -> when it was last warned about

    def take(self, trainer_id: str, max_elements: int, max_bytes: int, wait_s: float
             ) -> list[Any] | None:
        """The next elements for ``trainer_id`` (up to ``max_elements``, about ``max_bytes``):
        ``[]`` if none came within ``wait_s``, None once the task was stopped. Raises
        InvalidArgumentError if the task's dataset ended: the cache serves endless ones only."""
        deadline = time.monotonic() + wait_s
        with self._lock:
            cached = self._read(trainer_id, max_elements, max_bytes)
        if cached:
            return cached
        if not self._pulling.acquire(timeout=wait_s):
            return []  # another trainer is pulling; what it pulls is read next time
        try:
            with self._lock:  # it may have pulled while this one waited
                cached = self._read(trainer_id, max_elements, max_bytes)
            if cached:
                return cached
            pulled = self._task.take(max_elements, min(max_bytes, self._window.max_bytes),
                                     max(0.0, deadline - time.monotonic()))
            if pulled is None:
                if self._task.stopped:
                    return None
                raise InvalidArgumentError(
                    "Cross-trainer caching requires the input dataset to be infinite. However, "
                    f"task {self._task.task_id} reached the end of its dataset.")
            if pulled:
                with self._lock:
                    self._window.append(trainer_id, pulled)
            return pulled
        finally:
            self._pulling.release()

    def _read(self, trainer_id: str, max_elements: int, max_bytes: int) -> list[Any]:
        """Cached elements for ``trainer_id``, warning (holding ``_lock``) if it skipped."""
        before = self._window.skipped(trainer_id)
        elements = self._window.read(trainer_id, max_elements, max_bytes)
        skipped = self._window.skipped(trainer_id)
        if skipped > before:
            now = time.monotonic()
            if now - self._warned.get(trainer_id, float("-inf")) >= WARN_EVERY_S:
                self._warned[trainer_id] = now
                log.warning(
                    "trainer %r fell behind the cross-trainer cache of task %d on worker %s "
                    "and skipped %d elements (%d in all for this trainer); a larger "
                    "cross_trainer_cache_size_bytes keeps more", trainer_id,
                    self._task.task_id, self._worker_address, skipped - before, skipped)
        return elements

    def stats(self) -> WindowStats:
        with self._lock:
            return self._window.stats()
