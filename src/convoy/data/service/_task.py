"""A worker's task: one iteration's pipeline running on a thread into a bounded buffer.

Consumers take elements from the buffer in batches (:meth:`Task.take`); each element goes to
exactly one consumer, first come first served.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

import cloudpickle
import numpy as np

from convoy import nest
from convoy.codec import Encoder
from convoy.data._op import Op
from convoy.data._split import SplitSupplier, read_splits
from convoy.errors import ConvoyError, InvalidArgumentError

#: A task stops producing while its buffer holds this many elements ...
MAX_BUFFERED_ELEMENTS = 16_384
#: ... or this many bytes of arrays.
MAX_BUFFERED_BYTES = 64 << 20

_OTHER_SIZE = 32  # a rough size for a leaf that is not an array


def element_size(element: Any) -> int:
    """The approximate size in bytes of an element (its arrays' sizes, others counted small)."""
    if isinstance(element, np.ndarray):
        return element.nbytes
    if isinstance(element, (tuple, list, dict)):
        return sum(leaf.nbytes if isinstance(leaf, np.ndarray) else _OTHER_SIZE
                   for leaf in nest.flatten(element))
    return len(element) if isinstance(element, bytes) else _OTHER_SIZE


class Task:
    """Runs ``dataset`` (a pickled op) for one task; DYNAMIC tasks read their source's splits
    from ``splits``."""

    def __init__(self, task_id: int, dataset: bytes, compression: str | None,
                 splits: SplitSupplier | None) -> None:
        self.task_id = task_id
        self.encoder = Encoder(compression or None)
        self._dataset = dataset
        self._splits = splits
        self._cond = threading.Condition()  # guards everything below
        self._items: deque[tuple[Any, int]] = deque()
        self._bytes = 0
        self._finished = False
        self._error: BaseException | None = None
        self._stopped = False
        threading.Thread(target=self._produce, name=f"convoy-task-{task_id}",
                         daemon=True).start()

    def _produce(self) -> None:
        try:
            elements: Iterator[Any] = self._load().iterator(None, 0).gen
            for element in elements:
                size = element_size(element)
                with self._cond:
                    while self._full() and not self._stopped:
                        self._cond.wait()
                    if self._stopped:
                        return
                    self._items.append((element, size))
                    self._bytes += size
                    self._cond.notify_all()
        except BaseException as error:  # handed to the consumer, raised in its call
            with self._cond:
                self._error = error
                self._cond.notify_all()
            return
        with self._cond:
            self._finished = True
            self._cond.notify_all()

    def _load(self) -> Op:
        """The task's pipeline. Loading runs on the task's thread, so a dataset that cannot be
        loaded (garbage, a module missing on this worker) fails this task alone."""
        try:
            op: Op = cloudpickle.loads(self._dataset)
            if self._splits is not None:
                op = read_splits(op, self._splits)
        except ConvoyError:
            raise
        except Exception as error:
            raise InvalidArgumentError(
                f"task {self.task_id} cannot load its dataset: {type(error).__name__}: {error}"
            ) from error
        return op

    def _full(self) -> bool:
        return len(self._items) >= MAX_BUFFERED_ELEMENTS or self._bytes >= MAX_BUFFERED_BYTES

    def take(self, max_elements: int, max_bytes: int, wait_s: float) -> tuple[list[Any], bool]:
        """Up to ``max_elements`` elements (at least one, unless at the end or none came
        within ``wait_s``) and whether the task has ended. Raises the pipeline's error."""
        with self._cond:
            if not self._items and not self._finished and self._error is None:
                self._cond.wait(wait_s)
            taken: list[Any] = []
            size = 0
            items = self._items
            while items and len(taken) < max_elements and (not taken or size < max_bytes):
                element, element_bytes = items.popleft()
                taken.append(element)
                size += element_bytes
            self._bytes -= size
            if taken:
                self._cond.notify_all()
            elif self._error is not None:
                raise self._error
            return taken, self._finished and not items

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._items.clear()
            self._cond.notify_all()
