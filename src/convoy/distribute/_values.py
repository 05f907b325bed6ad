"""The values a ClusterCoordinator hands out and takes: RemoteValue (a scheduled function's
future result) and per-worker values (one per worker: datasets, iterators)."""

from __future__ import annotations

import threading
from typing import Any

from convoy._transport.rpc import Outcome
from convoy.distribute._worker_calls import raise_if_cancelled
from convoy.errors import InvalidArgumentError


class RemoteValue:
    """The future result of a scheduled function."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._outcome: Outcome | None = None

    def _set(self, outcome: Outcome) -> None:
        self._outcome = outcome
        self._done.set()

    def done(self) -> bool:
        """Whether the function has finished (with a value or an error, or was cancelled),
        so ``fetch()`` returns or raises at once; as ``concurrent.futures.Future.done()``."""
        return self._done.is_set()

    def fetch(self) -> Any:
        """Wait for the function and return its result; raise its error if it failed (or a
        CancelledError if an earlier failure cancelled it)."""
        self._done.wait()  # for as long as the function runs, as TensorFlow's does
        assert self._outcome is not None
        return self._outcome.unwrap()

    def get(self) -> Any:
        return self.fetch()


class PerWorkerValues:
    """One value per worker; passed to ``schedule``, the function sees its worker's value."""

    def __init__(self, values: tuple[Any, ...]) -> None:
        self._values = values


class PerWorkerIterator(PerWorkerValues):
    """Per-worker iterators: pass to ``schedule``; the function calls ``next`` on its own."""

    def __init__(self, values: tuple[Any, ...], datasets: PerWorkerValues) -> None:
        super().__init__(values)
        self._datasets = datasets  # the iterators are rebuilt from them: keep them

    def __iter__(self) -> PerWorkerIterator:
        return self

    def __next__(self) -> Any:
        raise InvalidArgumentError(
            "a per-worker iterator is read inside scheduled functions: pass it to "
            "coordinator.schedule(fn, args=(iterator,)) and call next() in fn"
        )


class SharedIterator:
    """An iterator that several functions running at once on one worker can share."""

    def __init__(self, iterator: Any) -> None:
        self._iterator = iterator
        self._lock = threading.Lock()

    def __iter__(self) -> SharedIterator:
        return self

    def __next__(self) -> Any:
        raise_if_cancelled()
        with self._lock:
            return next(self._iterator)

    def get_next(self) -> Any:
        raise_if_cancelled()
        with self._lock:
            return self._iterator.get_next()

    def close(self) -> None:
        """Stop the iterator's background work now (when the chief drops it)."""
        close = getattr(self._iterator, "close", None)
        if callable(close):
            close()
