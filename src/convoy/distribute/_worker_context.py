"""The worker task a process serves: its :class:`WorkerContext` and per-worker resources.

A worker :class:`~convoy.distribute.server.Server` makes its process that worker
(:func:`become_worker`); functions it runs find their context with :func:`worker_context`.
Per-worker resources (datasets, iterators) are built there by :func:`build_resource`, named
in pickles by :class:`ResourceRef`, and deleted by the worker's ``Free``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from convoy.distribute import _wire
from convoy.errors import FailedPreconditionError, InvalidArgumentError

log = logging.getLogger(__name__)


class WorkerContext:
    """What a function running on a worker can know about where it runs."""

    def __init__(self, task_index: int, num_workers: int) -> None:
        self.task_index = task_index
        self.num_workers = num_workers
        self.resources: dict[int, Any] = {}
        self.creating_dataset = False

    def free(self, request: bytes) -> bytes:
        """A worker's ``Free``: delete these per-worker resources, closing those that can be
        (an iterator's background threads); answers how many resources this worker still
        holds."""
        for resource_id in _wire.load_ids(request, "Free", "resource"):
            close = getattr(self.resources.pop(resource_id, None), "close", None)
            if callable(close):
                try:
                    close()
                except Exception:
                    log.exception("closing per-worker resource %d failed", resource_id)
        return _wire.encode(len(self.resources))


class _ThisProcess:
    """The worker task this process serves, if any (one per process, as in TensorFlow)."""

    context: WorkerContext | None = None


def become_worker(context: WorkerContext) -> None:
    """Make this process the worker task ``context`` describes (a worker server does, before
    it serves its first call)."""
    _ThisProcess.context = context


def worker_context() -> WorkerContext | None:
    """The context of this worker process, or None outside worker tasks."""
    return _ThisProcess.context


def resolve_resource(resource_id: int) -> Any:
    """The worker-local object a :class:`ResourceRef` names (called when one is unpickled)."""
    context = _ThisProcess.context
    if context is None or resource_id not in context.resources:
        raise InvalidArgumentError(
            f"resource {resource_id} does not exist on this worker (was it created with "
            f"ClusterCoordinator.create_per_worker_dataset?)"
        )
    return context.resources[resource_id]


class ResourceRef:
    """Names a per-worker resource; unpickled on the worker, it becomes the resource."""

    def __init__(self, resource_id: int) -> None:
        self.resource_id = resource_id

    def __reduce__(self) -> tuple[Callable[[int], Any], tuple[int]]:
        return (resolve_resource, (self.resource_id,))


def build_resource(resource_id: int, make: Callable[[], Any], for_dataset: bool) -> None:
    """Run on each worker (a scheduled call): build ``make()`` as resource ``resource_id``."""
    context = worker_context()
    if context is None:
        raise FailedPreconditionError("per-worker resources can only be created on workers")
    context.creating_dataset = for_dataset
    try:
        context.resources[resource_id] = make()
    finally:
        context.creating_dataset = False
