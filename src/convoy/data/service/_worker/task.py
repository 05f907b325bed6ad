"""A worker's task: one iteration's pipeline running on a thread into a bounded channel.

Consumers take elements from the channel in batches (:meth:`Task.take`); each element goes to
exactly one consumer, first come first served.

Under DYNAMIC a task's elements are numbered from 0 and each answer says which numbers it
carries: a task run again on a new worker process
(:mod:`convoy.data.service._dispatcher.state`) replays its
splits, makes the same elements in the same order (its ops draw their seeds from the task id),
and skips the numbers its consumers already have.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import cloudpickle
import numpy as np

from convoy import nest
from convoy._channel import Channel, Closed
from convoy.codec import Encoder
from convoy.data._op import Op, seeded
from convoy.data._split import SplitSupplier, read_splits
from convoy.data.service._common.ranges import Skipper, runs
from convoy.data.service._common.wire import NUMBERED, pack_numbers
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


def _pair_size(pair: tuple[int, Any]) -> int:
    return element_size(pair[1])


class Task:
    """Runs ``dataset`` (a pickled op) for one task on its own thread (from :meth:`start`);
    DYNAMIC tasks read their source's splits from ``splits``; statically sharded ones run
    ``shard(op)``, their shard. It buffers ``max_buffered_elements`` at most."""

    def __init__(self, task_id: int, dataset: bytes, compression: str | None,
                 splits: SplitSupplier | None,
                 shard: Callable[[Op], Op] | None = None,
                 max_buffered_elements: int = MAX_BUFFERED_ELEMENTS, incarnation: int = 0,
                 skip: Iterable[tuple[int, int]] = (), *, seed: int = 0,
                 skip_count: int = 0) -> None:
        self.task_id = task_id
        self.seed = seed or task_id  # a resumed task draws the seed of the task it continues
        self.skip_count = skip_count
        self.incarnation = incarnation  # from 1 when numbered: (number, element) pairs
        self.encoder = Encoder(compression or None)
        self._dataset = dataset
        self._splits = splits
        self._shard = shard
        self._skip = Skipper(skip)
        size = _pair_size if incarnation else element_size
        self._elements: Channel[Any] = Channel(
            f"elements of task {task_id}", max_buffered_elements, MAX_BUFFERED_BYTES, size)

    def start(self) -> None:
        threading.Thread(target=self._produce, name=f"convoy-task-{self.task_id}",
                         daemon=True).start()

    def _produce(self) -> None:
        try:
            node = self._load().iterator(None, 0)
            try:  # the node owns what runs beside it (prefetch threads, service readers)
                elements = (self._numbered(node.gen) if self.incarnation
                            else itertools.islice(node.gen, self.skip_count, None))
                for element in elements:
                    if not self._elements.put(element):
                        return  # stopped
            finally:
                node.close()
        except BaseException as error:  # handed to the consumer, raised in its call
            self._elements.fail(error)
            return
        self._elements.close()

    def _numbered(self, elements: Iterator[Any]) -> Iterator[tuple[int, Any]]:
        if not self._skip:
            return enumerate(elements)  # a first run: nothing to skip
        skip = self._skip
        return ((number, element) for number, element in enumerate(elements)
                if number not in skip)

    def _load(self) -> Op:
        """The task's pipeline. Loading runs on the task's thread, so a dataset that cannot be
        loaded (garbage, a module missing on this worker) fails this task alone."""
        try:
            with seeded(self.seed):
                op: Op = cloudpickle.loads(self._dataset)
            if self._splits is not None:
                op = read_splits(op, self._splits)
            if self._shard is not None:
                op = self._shard(op)
        except ConvoyError:
            raise
        except Exception as error:
            raise InvalidArgumentError(
                f"task {self.task_id} cannot load its dataset: {type(error).__name__}: {error}"
            ) from error
        return op

    def take(self, max_elements: int, max_bytes: int, wait_s: float) -> list[Any] | None:
        """Up to ``max_elements`` elements (about ``max_bytes``), ``(number, element)`` pairs
        if numbered: ``[]`` if none came within ``wait_s``, None once the task has ended or
        was stopped. Raises the pipeline's error."""
        try:
            return self._elements.get_many(max_elements, max_bytes, timeout=wait_s)
        except Closed:
            return None

    def numbered(self, taken: list[Any]) -> tuple[bytes, list[Any]]:
        """What :meth:`take` took, as the prefix of its GetElements answer (``NUMBERED`` and
        the elements' numbers, or nothing if not numbered) and the elements."""
        if not self.incarnation:
            return b"", taken
        first, last = taken[0][0], taken[-1][0]
        numbers = pack_numbers([(first, last + 1)] if last - first == len(taken) - 1
                               else runs(number for number, _ in taken))
        return NUMBERED + numbers, [element for _, element in taken]

    def give_back(self, elements: list[Any], numbers: list[int]) -> bool:
        """Put elements a consumer fetched but did not return back in front of the buffer
        (with their ``numbers`` when numbered); False once the task has ended."""
        if self.incarnation:
            if len(numbers) != len(elements):
                raise InvalidArgumentError(
                    f"task {self.task_id}: {len(elements)} elements given back with "
                    f"{len(numbers)} numbers")
            return self._elements.put_back(list(zip(numbers, elements)))
        return self._elements.put_back(elements)

    def stop(self) -> None:
        """Drop the buffered elements and end the producer thread (at its next element)."""
        self._elements.cancel()

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called (an ended task is not stopped)."""
        return self._elements.cancelled
