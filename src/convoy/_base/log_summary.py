"""Repeated failures in one log line per period, not one line each.

A worker whose dispatcher is down fails a heartbeat every interval: 25 warnings in 8 s say no
more than one. :class:`RepeatedFailures` logs the first failure at once, then at most one line
per ``period_s`` ("heartbeat to D failed 25 times in the last 10 s: <last error>"), and one
line when the call succeeds again.
"""

from __future__ import annotations

import logging
import threading
import time


class RepeatedFailures:
    """Summarises the failures of ``what`` (say ``"heartbeat to localhost:5050"``) on
    ``logger`` at ``level``."""

    def __init__(self, logger: logging.Logger, what: str, period_s: float = 10.0,
                 level: int = logging.WARNING) -> None:
        self._log = logger
        self.what = what
        self._period_s = period_s
        self._level = level
        self._lock = threading.Lock()
        self._pending = 0  # failures not logged yet
        self._total = 0  # failures since the last success
        self._since = 0.0  # when the pending failures began to count

    def failed(self, error: BaseException | str) -> None:
        """Note one failure; log it now if it is the first, or if a period has passed."""
        now = time.monotonic()
        with self._lock:
            self._total += 1
            self._pending += 1
            if self._total == 1:
                line = f"{self.what} failed: {error}"
            elif now - self._since >= self._period_s:
                line = (f"{self.what} failed {self._pending} times in the last "
                        f"{now - self._since:.0f} s: {error}")
            else:
                return
            self._pending, self._since = 0, now
        self._log.log(self._level, "%s", line)

    def succeeded(self) -> None:
        """Note a success: if failures came before, say it works again."""
        with self._lock:
            total, self._total, self._pending = self._total, 0, 0
        if total:
            self._log.info("%s succeeded again after %d failure%s", self.what, total,
                           "" if total == 1 else "s")
