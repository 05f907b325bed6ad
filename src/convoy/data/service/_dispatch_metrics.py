"""What a dispatcher's metrics say (:class:`convoy.monitoring.DispatcherStats`), read from its
state and its journal's directory at each scrape."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Protocol

from convoy import monitoring
from convoy.data.service._dispatcher.journal import Journal
from convoy.data.service._dispatcher.state import DispatcherState


class Dispatcher(Protocol):
    """What the stats are read from: the dispatcher's handlers."""

    lock: threading.RLock
    state: DispatcherState
    journal: Journal | None


def dispatcher_stats(dispatcher: Dispatcher) -> monitoring.DispatcherStats:
    """The counts of the dispatcher's state (read under its lock) and the size of its
    journal. Split and lost-worker counts are the state's, so a restart replays them."""
    segments, size = journal_usage(dispatcher.journal)
    with dispatcher.lock:
        stats = _counted(dispatcher.state, segments, size)
        stats.optimal_workers = dispatcher.state.optimal_workers(time.time()) or 0
        return stats


def _counted(state: DispatcherState, segments: int, size: int) -> monitoring.DispatcherStats:
    records = state.records
    counts = records.counts
    return monitoring.DispatcherStats(
        workers=len(records.workers),
        jobs=len(records.jobs) - len(records.tombstones),
        iterations=sum(not iteration.finished for iteration in records.iterations.values()),
        clients=len(records.clients),
        workers_lost=counts.get("workers_lost", 0),
        splits={event: counts.get(event, 0) for event in monitoring.SPLIT_EVENTS},
        journal_bytes=size, journal_segments=segments)


def journal_usage(journal: Journal | None) -> tuple[int, int]:
    """(files, bytes) of ``journal``'s directory: (0, 0) without a journal or a local one."""
    directory = getattr(journal.storage, "directory", None) if journal is not None else None
    if not isinstance(directory, Path):
        return 0, 0
    files = size = 0
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_file() and entry.name != "meta":
                    files += 1
                    size += entry.stat().st_size
    except OSError:  # gone, or unreadable: nothing to count
        pass
    return files, size
