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
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import cloudpickle
import numpy as np

from convoy import monitoring
from convoy._base import threads as _threads
from convoy._transport.channel import Channel, Closed
from convoy._values import nest
from convoy._values.codec import Encoder
from convoy.data._core._op import Op, seeded
from convoy.data._sharding._split import SplitSupplier, read_splits
from convoy.data.service._common.pace import ProcessingPace
from convoy.data.service._common.ranges import Skipper, runs
from convoy.data.service._common.wire import NUMBERED, pack_numbers
from convoy.errors import ConvoyError, InvalidArgumentError

#: A task stops producing while its buffer holds this many elements ...
MAX_BUFFERED_ELEMENTS = 16_384
#: ... or this many bytes of arrays.
MAX_BUFFERED_BYTES = 64 << 20
#: A paused producer, or one over its worker's bound, looks again this often (and at once
#: when stopped).
_RECHECK_S = 0.02

#: Elements produced are added to the metrics this many at a time.
_COUNT_EVERY = 256

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


class BufferBudget:
    """The bytes one worker buffers across all its tasks, bounded by ``max_bytes``: a task's
    producer waits while the tasks' buffers together hold that many (or while its task is
    paused). A task with nothing buffered may always produce one element, so no task starves
    behind others' buffers."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._channels: set[Channel[Any]] = set()

    def add(self, channel: Channel[Any]) -> None:
        self._channels.add(channel)

    def remove(self, channel: Channel[Any]) -> None:
        self._channels.discard(channel)

    @property
    def used(self) -> int:
        """The bytes buffered by all tasks now."""
        return sum(channel.size for channel in list(self._channels))


class Task:
    """Runs ``dataset`` (a pickled op) for one task on its own thread (from :meth:`start`);
    DYNAMIC tasks read their source's splits from ``splits``; statically sharded ones run
    ``shard(op)``, their shard. It buffers ``max_buffered_elements`` at most."""

    def __init__(self, task_id: int, dataset: bytes, compression: str | None,
                 splits: SplitSupplier | None,
                 shard: Callable[[Op], Op] | None = None,
                 max_buffered_elements: int = MAX_BUFFERED_ELEMENTS, incarnation: int = 0,
                 skip: Iterable[tuple[int, int]] = (),
                 budget: BufferBudget | None = None, *, seed: int = 0,
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
        self._produced_bytes = 0  # of the elements put into the channel (their size)

        def counted(element: Any) -> int:
            n = size(element)
            self._produced_bytes += n  # only the producer thread puts
            return n

        self._elements: Channel[Any] = Channel(
            f"elements of task {task_id}", max_buffered_elements, MAX_BUFFERED_BYTES, counted)
        self._draining = False
        self._drain_ends = False
        self._produced = threading.Event()  # the producer thread is done
        self._budget = budget
        #: Its iteration has no consumer: it produces nothing new, keeping what it buffered.
        self.paused = False
        self._stopped = threading.Event()
        self.pace = ProcessingPace()  # its pipeline's time per element, for the estimate

    def start(self) -> None:
        if self._budget is not None:
            self._budget.add(self._elements)
        _threads.start(f"convoy-task-{self.task_id}", self._produce, on_error=self._failed)

    def _failed(self, error: BaseException) -> None:
        """The producer failed: its consumers get ``error``."""
        self._elements.fail(error)
        self._produced.set()

    def _may_produce(self) -> bool:
        """Wait while paused or while the worker's buffers are full; False once stopped.

        Backpressure, and bounded as the iteration is (so is the ``put`` into a full buffer
        after it): a paused task's iteration has no consumer, and is collected after
        ``job_gc_timeout_ms`` (anonymous ones at once), which stops the task; full buffers
        empty as their consumers read, and a consumer that leaves or goes silent
        (``client_timeout_ms``) leaves its iteration to that collection; a worker whose
        dispatcher stays away past its ``dispatcher_timeout_ms`` stops every task. A timeout
        here would fail a task that only waits for a slow consumer (``--job-gc-timeout-ms
        -1`` keeps a named iteration, and so its paused tasks, as asked)."""
        budget = self._budget
        while self.paused or (budget is not None and self._elements.size
                              and budget.used >= budget.max_bytes):
            if self._stopped.wait(_RECHECK_S):
                return False
        return not self._stopped.is_set()

    def _produce(self) -> None:
        try:
            node = self._load().iterator(None, 0)
            produced = counted_bytes = 0
            try:  # the node owns what runs beside it (prefetch threads, service readers)
                elements = (self._numbered(node.gen) if self.incarnation
                            else itertools.islice(node.gen, self.skip_count, None))
                ready = time.perf_counter()
                for element in elements:
                    self.pace.add(time.perf_counter() - ready)  # made, not blocked
                    if not self._may_produce() or not self._elements.put(element):
                        self._produced.set()
                        return  # stopped
                    ready = time.perf_counter()
                    produced += 1
                    if produced == _COUNT_EVERY:  # metrics in bulk: a lock each
                        counted_bytes = self._count(produced, counted_bytes)
                        produced = 0
                    if self._draining:
                        break
            finally:
                self._count(produced, counted_bytes)
                node.close()
        except BaseException as error:  # handed to the consumer, raised in its call
            if not self._draining:  # a draining task's splits are refused: no failure
                self._failed(error)
                return
        self._produced.set()
        if not self._draining or self._drain_ends:
            self._elements.close()

    def drain(self, end: bool) -> None:
        """Stop producing (after the element being made); what is buffered stays for the
        consumers. With ``end`` the task then ends where it stopped (OFF: the copy is cut
        short); without, it never ends here (DYNAMIC: its next run, elsewhere, makes the
        rest)."""
        self._drain_ends = end
        self._draining = True

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def drained(self) -> bool:
        """Draining, its producer done, and every buffered element taken."""
        return self._draining and self._produced.is_set() and not len(self._elements)

    def _count(self, produced: int, counted_bytes: int) -> int:
        """Add ``produced`` elements and the bytes put since ``counted_bytes`` to the
        metrics; returns the bytes put so far."""
        total = self._produced_bytes
        monitoring.ELEMENTS_PRODUCED.inc(produced)
        monitoring.BYTES_PRODUCED.inc(total - counted_bytes)
        return total

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

    @property
    def buffered(self) -> tuple[int, int]:
        """The elements waiting in its buffer, and their bytes (of arrays)."""
        return len(self._elements), self._elements.size

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
        self._stopped.set()
        self._elements.cancel()
        if self._budget is not None:
            self._budget.remove(self._elements)

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called (an ended task is not stopped)."""
        return self._elements.cancelled
