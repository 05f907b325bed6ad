"""What consumers and workers measure for the dispatcher's worker estimate (see
``_dispatcher/estimate.py``): a consumer's time per element when it does not wait, and a task's
pipeline time per element when it is not blocked. Each report covers the time since the
previous one."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class ConsumerPace:
    """A consumer's elements taken and time waited since its last report."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._since = clock()
        self._taken = 0
        self._waited = 0.0
        self._waiting_since: float | None = None

    def wait_started(self) -> None:
        with self._lock:
            self._waiting_since = self._clock()

    def wait_ended(self, taken: int = 0) -> None:
        """The wait ended (with ``taken`` elements for the consumer)."""
        with self._lock:
            now = self._clock()
            if self._waiting_since is not None:
                self._waited += now - max(self._waiting_since, self._since)
            self._waiting_since = None
            self._taken += taken

    def took(self) -> None:
        """The consumer took one element: counted as it takes each, not when a batch of them
        arrives, or a report would see a whole batch at once and the next none."""
        with self._lock:
            self._taken += 1

    def report(self) -> tuple[float, float, float]:
        """``(target time per element (0: unknown), waited, elapsed)`` since the last report;
        a wait in progress counts up to now."""
        with self._lock:
            now = self._clock()
            waited = self._waited
            if self._waiting_since is not None:
                waited += now - max(self._waiting_since, self._since)
            elapsed = now - self._since
            busy = elapsed - waited
            target = busy / self._taken if self._taken and busy > 0 else 0.0
            self._since, self._taken, self._waited = now, 0, 0.0
            return target, waited, elapsed


class ProcessingPace:
    """A task pipeline's time spent making elements (not blocked) since its last report."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds = 0.0
        self._count = 0

    def add(self, seconds: float) -> None:
        with self._lock:
            self._seconds += seconds
            self._count += 1

    def report(self) -> float:
        """Seconds per element since the last report (0: none made)."""
        with self._lock:
            per = self._seconds / self._count if self._count else 0.0
            self._seconds, self._count = 0.0, 0
            return per
