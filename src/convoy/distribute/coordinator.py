"""ClusterCoordinator: schedules Python functions on the workers of a ParameterServerStrategy.

``schedule`` queues a function and returns a :class:`RemoteValue` at once. Each worker runs up
to ``pipelining`` functions at once, taken from the shared queue a few per call, so many small
steps flow without waiting for each other. At the default, one, a busy worker is sent its next
function while the current one runs, and starts it once that one's updates have landed (still
one at a time, as TensorFlow, without the coordinator's round trip in between); a function sent
ahead that has not started is taken back for a worker that runs nothing. A worker that cannot
be reached has its functions put back at the head of the queue for another worker (so a
function runs at least once); the worker is probed until it answers again, its per-worker
resources (datasets, iterators) are rebuilt if it is a new process, and it takes work again. A
worker whose resources cannot be rebuilt takes no work until it restarts again, and its error
is raised like a function's.

The first error a function raises is raised by the next ``schedule``, ``join`` or ``done``
(then cleared). The functions queued behind it are cancelled, and so are those still running,
as TensorFlow does: each stops at its next variable operation (or ``next`` of a per-worker
iterator) with CancelledError; one that does not stop within a grace period (a couple of
seconds) is abandoned: the coordinator stops waiting for it. Their ``fetch`` raises
CancelledError.

There is one coordinator per strategy: ``ClusterCoordinator(strategy)`` returns the same
object each time. Its threads end when it is garbage-collected (or at ``shutdown()``).
Every decision is made by a state machine (:mod:`convoy.distribute._schedule_state`) whose
instructions threads carry out (:mod:`convoy.distribute._scheduler`).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable
from typing import Any

from convoy._values import nest
from convoy.data import Dataset
from convoy.distribute._scheduler import Closure, Scheduler
from convoy.distribute._values import (
    PerWorkerIterator,
    PerWorkerValues,
    RemoteValue,
    SharedIterator,
)
from convoy.distribute._worker_context import ResourceRef, worker_context
from convoy.distribute.strategy import ParameterServerStrategy
from convoy.errors import FailedPreconditionError, InvalidArgumentError

__all__ = ["ClusterCoordinator", "PerWorkerDataset", "PerWorkerValues", "RemoteValue",
           "experimental_get_current_worker_index"]

#: Functions in flight per worker: one, as TensorFlow. With more, a step may read parameters
#: up to ``workers * pipelining - 1`` updates old, and ordinary learning rates can diverge
#: (tests/distribute/test_convergence.py).
DEFAULT_PIPELINING = 1

_creating = threading.Lock()  # one coordinator per strategy, even for threads racing
_numbers = itertools.count()  # names the threads of each coordinator apart


class ClusterCoordinator:
    """Runs functions on the workers of ``strategy``'s cluster, asynchronously; one per
    strategy."""

    strategy: ParameterServerStrategy
    _pipelining: int
    _scheduler: Scheduler

    def __new__(cls, strategy: ParameterServerStrategy,
                pipelining: int | None = None) -> ClusterCoordinator:
        if not isinstance(strategy, ParameterServerStrategy):
            raise InvalidArgumentError(f"ClusterCoordinator works with a "
                                       f"ParameterServerStrategy, got {type(strategy).__name__}")
        if pipelining is not None and (isinstance(pipelining, bool)
                                       or not isinstance(pipelining, int) or pipelining < 1):
            raise InvalidArgumentError(f"pipelining must be an int >= 1 (functions in flight "
                                       f"per worker), got {pipelining!r}")
        with _creating:
            existing: ClusterCoordinator | None = strategy._cluster_coordinator
            if existing is not None and not existing._scheduler.closed:
                if pipelining not in (None, existing._pipelining):
                    raise InvalidArgumentError(
                        f"this strategy's coordinator runs pipelining={existing._pipelining}, "
                        f"not {pipelining}: there is one coordinator per strategy")
                return existing
            self = super().__new__(cls)
            self.strategy = strategy
            self._pipelining = pipelining or DEFAULT_PIPELINING
            spec = strategy.cluster_spec
            self._scheduler = Scheduler(
                [spec.task_address("worker", i) for i in range(spec.num_tasks("worker"))],
                self._pipelining, f"convoy-coordinator{next(_numbers)}")
            # The threads hold the scheduler, never this object: once it is collected (or at
            # exit) the scheduler closes, and they end.
            weakref.finalize(self, self._scheduler.close_soon)
            strategy._cluster_coordinator = self
            return self

    # ----- scheduling -----------------------------------------------------------------------
    def schedule(self, fn: Callable[..., Any], args: tuple[Any, ...] | list[Any] | None = None,
                 kwargs: dict[str, Any] | None = None) -> RemoteValue:
        """Queue ``fn(*args, **kwargs)`` to run on some worker; returns its RemoteValue at
        once. Per-worker values among the arguments become the running worker's own; a
        RemoteValue cannot be an argument (fetch it first). Raises the first error of a
        function scheduled before, if any."""
        if not callable(fn):
            raise InvalidArgumentError(f"fn must be callable, got {type(fn).__name__}")
        args = () if args is None else args
        kwargs = {} if kwargs is None else kwargs
        if not isinstance(args, (tuple, list)):
            raise TypeError(f"args must be a tuple or list of arguments, got "
                            f"{type(args).__name__}")
        if not isinstance(kwargs, dict):
            raise TypeError(f"kwargs must be a dict of keyword arguments, got "
                            f"{type(kwargs).__name__}")
        closure = Closure(fn, tuple(args), dict(kwargs), _per_worker_arguments(args, kwargs))
        self._scheduler.schedule(closure)
        return closure.result

    def join(self) -> None:
        """Wait until every scheduled function has finished; raise the first error."""
        self._scheduler.join()

    def done(self) -> bool:
        """Whether every scheduled function has finished; raises the first error."""
        return self._scheduler.done()

    def fetch(self, val: Any) -> Any:
        """The results of a structure of RemoteValues (other leaves pass through)."""
        return nest.map_structure(
            lambda v: v.fetch() if isinstance(v, RemoteValue) else v, val)

    def shutdown(self) -> None:
        """Stop now: queued and running functions are cancelled, per-worker resources freed,
        threads ended. (They also end when the coordinator is garbage-collected.)"""
        self._scheduler.close()

    # ----- per-worker resources -------------------------------------------------------------
    def create_per_worker_dataset(self, dataset_fn: Callable[[], Any] | Dataset
                                  ) -> PerWorkerDataset:
        """A dataset on every worker: built there by ``dataset_fn`` (or ``dataset`` itself,
        sent to each), and rebuilt on a worker that restarts."""
        if isinstance(dataset_fn, Dataset):
            dataset = dataset_fn
            dataset_fn = lambda: dataset
        if not callable(dataset_fn):
            raise TypeError(f"dataset_fn must be a function that returns a dataset, or a "
                            f"cv.data.Dataset; got {type(dataset_fn).__name__}")
        resource_id = self._scheduler.create_resource(dataset_fn, "per-worker dataset",
                                                      for_dataset=True)
        return PerWorkerDataset(self, self._per_worker(resource_id, PerWorkerValues))

    def _per_worker(self, resource_id: int,
                    kind: Callable[[tuple[Any, ...]], PerWorkerValues]) -> PerWorkerValues:
        """The per-worker values of a resource, freed on the workers when they are dropped."""
        refs = tuple(ResourceRef(resource_id)
                     for _ in range(self.strategy.cluster_spec.num_tasks("worker")))
        values = kind(refs)
        weakref.finalize(values, self._scheduler.drop_resource, resource_id)
        return values


class PerWorkerDataset:
    """A dataset created on every worker; ``iter()`` gives per-worker iterators."""

    def __init__(self, coordinator: ClusterCoordinator, datasets: PerWorkerValues) -> None:
        self._coordinator = coordinator
        self._datasets = datasets

    def __iter__(self) -> PerWorkerIterator:
        # Every worker has its dataset under the same id; unpickled there, the reference
        # becomes that worker's dataset.
        dataset = self._datasets._values[0]
        coordinator = self._coordinator
        resource_id = coordinator._scheduler.create_resource(
            lambda: SharedIterator(iter(dataset)), "per-worker iterator", for_dataset=False)
        iterators = coordinator._per_worker(
            resource_id, lambda refs: PerWorkerIterator(refs, self._datasets))
        assert isinstance(iterators, PerWorkerIterator)
        return iterators

    def build(self) -> PerWorkerValues:
        """The per-worker datasets themselves: passed to ``schedule``, the function gets its
        worker's dataset."""
        return self._datasets


def experimental_get_current_worker_index() -> int:
    """The index of the worker running this code: call it in a scheduled function or a
    per-worker dataset function. Raises FailedPreconditionError (a RuntimeError) elsewhere."""
    context = worker_context()
    if context is None:
        raise FailedPreconditionError(
            "experimental_get_current_worker_index() must be called on a worker: inside a "
            "function passed to ClusterCoordinator.schedule or create_per_worker_dataset")
    return context.task_index


def _per_worker_arguments(args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> bool:
    """Whether an argument holds per-worker values; refuses RemoteValues, naming the
    argument."""
    if not args and not kwargs:
        return False
    leaves = nest.flatten((list(args), kwargs))
    if any(isinstance(leaf, RemoteValue) for leaf in leaves):
        named = [*((f"args[{i}]", arg) for i, arg in enumerate(args)),
                 *((f"kwargs[{key!r}]", value) for key, value in kwargs.items())]
        name = next(name for name, value in named
                    if any(isinstance(leaf, RemoteValue) for leaf in nest.flatten(value)))
        raise InvalidArgumentError(
            f"{name} is or holds a RemoteValue: the result of a scheduled function cannot be "
            f"an argument of another (as in TensorFlow); fetch() it and pass its value")
    return any(isinstance(leaf, PerWorkerValues) for leaf in leaves)
