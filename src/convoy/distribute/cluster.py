"""Cluster descriptions: which jobs exist and where each of their tasks listens.

A :class:`ClusterSpec` maps a job name (``"chief"``, ``"worker"``, ``"ps"``, ...) to its tasks,
each task being a ``"host:port"`` address identified by an integer index. Jobs may be *dense*
(a list, indices ``0..n-1``) or *sparse* (a dict ``{index: address}`` with gaps).

:func:`validate_cluster_for_ps` checks that a spec describes a cluster parameter-server training
can run on.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from convoy.errors import InvalidArgumentError, NotFoundError

__all__ = ["ClusterSpec", "PS_TASK_TYPES", "validate_cluster_for_ps", "validate_task"]

#: The job names parameter-server training knows about.
PS_TASK_TYPES: tuple[str, ...] = ("chief", "worker", "ps", "evaluator")


def _task_index(job: str, index: Any) -> int:
    # JSON objects (e.g. TF_CONFIG) can only have string keys, so decimal strings are accepted.
    if isinstance(index, str) and index.strip().isdecimal():
        index = int(index)
    if isinstance(index, bool) or not isinstance(index, int):
        raise InvalidArgumentError(
            f"task indices of job {job!r} must be integers, got {index!r} "
            f"({type(index).__name__})"
        )
    if index < 0:
        raise InvalidArgumentError(f"task indices of job {job!r} must be >= 0, got {index}")
    return index


def _address(job: str, index: int, address: Any) -> str:
    if isinstance(address, bytes):
        address = address.decode("utf-8")
    if not isinstance(address, str) or not address:
        raise InvalidArgumentError(
            f"the address of task {index} of job {job!r} must be a non-empty 'host:port' "
            f"string, got {address!r}"
        )
    return address


def _normalize(cluster: Any) -> dict[str, dict[int, str]]:
    if isinstance(cluster, ClusterSpec):
        return {job: dict(tasks) for job, tasks in cluster._tasks.items()}
    if not isinstance(cluster, Mapping):
        raise InvalidArgumentError(
            "a cluster must be a dict of job name -> list of 'host:port' addresses (or "
            f"-> dict of task index -> address) or a ClusterSpec, got {type(cluster).__name__}"
        )
    result: dict[str, dict[int, str]] = {}
    for job, tasks in cluster.items():
        if isinstance(job, bytes):
            name = job.decode("utf-8")
        elif isinstance(job, str):
            name = job
        else:
            raise InvalidArgumentError(
                f"job names must be strings, got {job!r} ({type(job).__name__})"
            )
        if not name:
            raise InvalidArgumentError("job names must be non-empty strings, got ''")
        if name in result:
            raise InvalidArgumentError(f"job {name!r} appears more than once")
        if isinstance(tasks, Mapping):
            entries: dict[int, str] = {}
            for raw_index, address in tasks.items():
                index = _task_index(name, raw_index)
                if index in entries:
                    raise InvalidArgumentError(
                        f"job {name!r} lists task index {index} more than once"
                    )
                entries[index] = _address(name, index, address)
            result[name] = dict(sorted(entries.items()))
        elif isinstance(tasks, Sequence) and not isinstance(tasks, (str, bytes)):
            result[name] = {i: _address(name, i, a) for i, a in enumerate(tasks)}
        else:
            raise InvalidArgumentError(
                f"the tasks of job {name!r} must be a list of 'host:port' addresses or a dict "
                f"of task index -> address, got {tasks!r} ({type(tasks).__name__})"
            )
    return dict(sorted(result.items()))


class ClusterSpec:
    """An immutable description of a cluster: job name -> task index -> ``"host:port"``.

    ``cluster`` is a dict mapping each job name to a list of addresses (task ``i`` is the
    ``i``-th entry) or to a dict ``{task_index: address}``, or another :class:`ClusterSpec`.
    An empty dict gives an empty spec, which is falsy.
    """

    __slots__ = ("_tasks",)

    def __init__(self, cluster: Mapping[str, Any] | ClusterSpec | None = None) -> None:
        self._tasks: dict[str, dict[int, str]] = _normalize({} if cluster is None else cluster)

    # --- queries ----------------------------------------------------------------------------

    @property
    def jobs(self) -> list[str]:
        """The job names, sorted."""
        return list(self._tasks)

    def _job(self, job: str) -> dict[int, str]:
        try:
            return self._tasks[job]
        except (KeyError, TypeError):
            raise NotFoundError(
                f"the cluster has no job named {job!r}; its jobs are {self.jobs}"
            ) from None

    def num_tasks(self, job: str) -> int:
        """How many tasks ``job`` has (raises NotFoundError for an unknown job)."""
        return len(self._job(job))

    def task_indices(self, job: str) -> list[int]:
        """The task indices defined for ``job``, ascending."""
        return list(self._job(job))

    def task_address(self, job: str, index: int) -> str:
        """The ``"host:port"`` address of task ``index`` of ``job``."""
        tasks = self._job(job)
        try:
            return tasks[index]
        except (KeyError, TypeError):
            raise NotFoundError(
                f"job {job!r} has no task with index {index!r}; its task indices are "
                f"{list(tasks)}"
            ) from None

    def job_tasks(self, job: str) -> list[str | None]:
        """The addresses of ``job`` by index; ``None`` fills the gaps of a sparse job."""
        tasks = self._job(job)
        if not tasks:
            return []
        addresses: list[str | None] = [None] * (max(tasks) + 1)
        for index, address in tasks.items():
            addresses[index] = address
        return addresses

    def as_dict(self) -> dict[str, list[str] | dict[int, str]]:
        """A plain dict: a list for jobs whose indices are ``0..n-1``, else a dict of index."""
        result: dict[str, list[str] | dict[int, str]] = {}
        for job, tasks in self._tasks.items():
            if not tasks or max(tasks) + 1 == len(tasks):
                result[job] = list(tasks.values())
            else:
                result[job] = dict(tasks)
        return result

    def tasks(self) -> Iterator[tuple[str, int, str]]:
        """Every task as ``(job, index, address)``, jobs sorted, indices ascending."""
        for job, tasks in self._tasks.items():
            for index, address in tasks.items():
                yield job, index, address

    # --- protocol ---------------------------------------------------------------------------

    def __bool__(self) -> bool:
        return bool(self._tasks)

    def __contains__(self, job: object) -> bool:
        return job in self._tasks

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ClusterSpec):
            return self._tasks == other._tasks
        if isinstance(other, Mapping):
            try:
                return self._tasks == _normalize(other)
            except InvalidArgumentError:
                return False
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple((job, tuple(tasks.items())) for job, tasks in self._tasks.items()))

    def __repr__(self) -> str:
        return f"ClusterSpec({self.as_dict()!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (ClusterSpec, (self.as_dict(),))


def _count(spec: ClusterSpec, job: str) -> int:
    return spec.num_tasks(job) if job in spec else 0


def validate_cluster_for_ps(cluster_spec: ClusterSpec | Mapping[str, Any],
                            task_type: str | None = None,
                            task_id: int | None = None) -> ClusterSpec:
    """Check that ``cluster_spec`` suits parameter-server training; return it as a ClusterSpec.

    ``task_type``/``task_id`` describe the task doing the check (the coordinator): it may be
    ``None`` or ``"chief"`` (or ``"evaluator"``), never a ``"worker"`` or ``"ps"`` task, which
    serve the cluster instead of driving it. Raises InvalidArgumentError naming the problem.
    """
    spec = cluster_spec if isinstance(cluster_spec, ClusterSpec) else ClusterSpec(cluster_spec)
    if not spec:
        raise InvalidArgumentError(
            "the cluster spec is empty; parameter-server training needs at least one 'worker' "
            "and one 'ps' task"
        )
    unknown = [job for job in spec.jobs if job not in PS_TASK_TYPES]
    if unknown:
        raise InvalidArgumentError(
            f"the cluster spec has job(s) {unknown} that parameter-server training does not "
            f"know; allowed job names are {list(PS_TASK_TYPES)} (cluster spec: {spec!r})"
        )
    if task_type is not None and task_type not in PS_TASK_TYPES:
        raise InvalidArgumentError(
            f"unknown task_type {task_type!r}; it must be one of {list(PS_TASK_TYPES)} or None"
        )
    if task_type in ("worker", "ps"):
        raise InvalidArgumentError(
            f"the coordinator cannot run as a {task_type!r} task: 'worker' and 'ps' tasks only "
            "run servers; create the strategy on the 'chief' task (or with task_type None)"
        )
    if task_type is not None and task_type not in spec and task_type != "evaluator":
        raise InvalidArgumentError(
            f"task_type {task_type!r} is not a job of the cluster spec {spec!r}"
        )
    for job in ("chief", "evaluator"):
        if _count(spec, job) > 1:
            raise InvalidArgumentError(
                f"there can be at most one {job!r} task, the cluster spec has "
                f"{_count(spec, job)}: {spec!r}"
            )
    if task_type is not None and task_id is not None and task_type in spec:
        validate_task(spec, task_type, task_id)
    for job in ("ps", "worker"):
        if _count(spec, job) < 1:
            raise InvalidArgumentError(
                f"parameter-server training needs at least one {job!r} task, the cluster spec "
                f"has none: {spec!r}"
            )
    return spec


def validate_task(cluster_spec: ClusterSpec | Mapping[str, Any], task_type: str,
                  task_id: int) -> None:
    """Check that ``task_id`` is a task of job ``task_type`` in ``cluster_spec``, with
    TensorFlow's messages (``multi_worker_util``): for a strategy's own task, and for a
    server's task at start-up. Raises InvalidArgumentError (a ValueError)."""
    spec = cluster_spec if isinstance(cluster_spec, ClusterSpec) else ClusterSpec(cluster_spec)
    if task_type not in spec:
        raise InvalidArgumentError(f"`task_type` {task_type!r} not found in cluster_spec.")
    if isinstance(task_id, bool) or not isinstance(task_id, int) or task_id < 0:
        raise InvalidArgumentError(f"task_id must be an integer >= 0, got {task_id!r}")
    indices = spec.task_indices(task_type)
    if task_id > max(indices, default=-1):
        raise InvalidArgumentError(
            f"The `task_id` {task_id} exceeds the maximum id of {task_type}.")
    if task_id not in indices:  # a gap of a sparse job
        raise InvalidArgumentError(
            f"task_id {task_id} is not a task of job {task_type!r}, whose task indices are "
            f"{indices}"
        )
