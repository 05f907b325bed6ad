"""A task this worker serves: its running pipeline (:class:`~.task.Task`) and the way its
consumers read it, one of three: first come, first served (from the task itself); through the
cross-trainer cache (:class:`~.trainer_cache.TrainerCache`, by trainer id); or in coordinated
rounds (:class:`~.round_robin.RoundRobinTask`, by consumer index). A request that does not fit
the way is refused, naming both.
"""

from __future__ import annotations

from typing import Any

from convoy.data._sharding._split import SplitSupplier
from convoy.data.service._common.static_policy import task_shard
from convoy.data.service._worker.round_robin import RoundRobinTask
from convoy.data.service._worker.state import TaskDefinition
from convoy.data.service._worker.task import MAX_BUFFERED_ELEMENTS, BufferBudget, Task
from convoy.data.service._worker.trainer_cache import READ_AHEAD_ELEMENTS, TrainerCache
from convoy.data.service._worker.trainer_window import WindowStats
from convoy.errors import InvalidArgumentError


class ServedTask:
    """One task of this worker and how it is read. Thread-safe as its parts are."""

    def __init__(self, task: Task, cache: TrainerCache | None = None,
                 rounds: RoundRobinTask | None = None) -> None:
        self.task = task
        self._cache = cache
        self._rounds = rounds

    @classmethod
    def of(cls, definition: TaskDefinition, splits: SplitSupplier | None, cache_bytes: int,
           worker_address: str, budget: BufferBudget | None = None) -> ServedTask:
        """The task ``definition`` describes (a DYNAMIC one reads ``splits``), not started; a
        task read through the cross-trainer cache keeps a window of ``cache_bytes``."""
        cached = definition.cross_trainer_cache
        task = Task(definition.task_id, definition.dataset, definition.compression, splits,
                    task_shard(definition.processing_mode, definition.num_workers,
                               definition.worker_index),
                    READ_AHEAD_ELEMENTS if cached else MAX_BUFFERED_ELEMENTS,
                    definition.incarnation, definition.skip, budget, seed=definition.seed,
                    skip_count=definition.skip_count)
        return cls(task, TrainerCache(task, cache_bytes, worker_address) if cached else None,
                   RoundRobinTask(task, definition.num_consumers)
                   if definition.num_consumers else None)

    def start(self) -> None:
        """Start the task's pipeline on its thread."""
        self.task.start()

    @property
    def task_id(self) -> int:
        return self.task.task_id

    @property
    def cached(self) -> TrainerCache | None:
        """The cross-trainer cache it is read through, if any."""
        return self._cache

    @property
    def coordinated(self) -> bool:
        """Whether the task is read in coordinated rounds."""
        return self._rounds is not None

    def take(self, trainer_id: str, max_elements: int, max_bytes: int, wait_s: float
             ) -> list[Any] | None:
        """Elements for a consumer (as :meth:`Task.take`), through the cross-trainer cache if
        the task has one, for ``trainer_id`` (which the request has exactly then)."""
        if (self._cache is None) != (not trainer_id):
            raise InvalidArgumentError(
                f"task {self.task_id} is read "
                f"{'without' if self._cache is None else 'through'} the cross-trainer cache, "
                f"but the request has trainer_id {trainer_id!r}")
        if self._cache is None:
            return self.task.take(max_elements, max_bytes, wait_s)
        return self._cache.take(trainer_id, max_elements, max_bytes, wait_s)

    def rounds(self, consumer_index: int, round_index: int, count: int, timeout_s: float,
               deadline: float, reader: int = 0) -> list[Any]:
        """A coordinated consumer's elements of up to ``count`` rounds (as
        :meth:`RoundRobinTask.rounds`)."""
        if self._rounds is None or consumer_index < 0:
            raise InvalidArgumentError(
                f"task {self.task_id} is {'not ' if self._rounds is None else ''}a coordinated "
                f"read, but the request has consumer_index {consumer_index}")
        return self._rounds.rounds(consumer_index, round_index, count, timeout_s, deadline,
                                   reader)

    def cache_stats(self) -> WindowStats | None:
        """What its cross-trainer cache holds and has done (None: it has none)."""
        return None if self._cache is None else self._cache.stats()

    def drain(self) -> None:
        """Stop producing, leaving what is buffered to the consumers: a DYNAMIC task (whose
        elements are numbered) waits there for its next run elsewhere; any other ends where
        it stopped."""
        self.task.drain(end=not self.task.incarnation)

    def stop(self) -> None:
        self.task.stop()
