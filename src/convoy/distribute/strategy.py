"""ParameterServerStrategy: variables on ``ps`` tasks, functions on ``worker`` tasks.

Variables created in ``strategy.scope()`` are placed round-robin on the parameter servers, or,
with a ``variable_partitioner``, split by rows into shards ("div" layout) that are placed
round-robin in turn. Functions run on workers through a :class:`ClusterCoordinator`.
"""

from __future__ import annotations

import contextlib
import enum
import inspect
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from convoy.distribute import _scope
from convoy.distribute._protocol import RemoteStore
from convoy.distribute.cluster import ClusterSpec, validate_cluster_for_ps
from convoy.distribute.partitioners import partition_count, shard_offsets, shard_sizes
from convoy.distribute.server import worker_context
from convoy.distribute.variables import ShardedVariable, Variable, initial_array
from convoy.errors import FailedPreconditionError, InvalidArgumentError


class ReduceOp(enum.Enum):
    SUM = "SUM"
    MEAN = "MEAN"


@dataclass(frozen=True)
class ShardInfo:
    """The shape and row offset of one shard, passed to partition-aware initial values."""

    shape: tuple[int, ...]
    offset: tuple[int, ...]


@dataclass(frozen=True)
class InputContext:
    """Which input pipeline a per-worker dataset function is building."""

    num_input_pipelines: int = 1
    input_pipeline_id: int = 0
    num_replicas_in_sync: int = 1

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        if global_batch_size % self.num_replicas_in_sync:
            raise InvalidArgumentError(
                f"global_batch_size {global_batch_size} is not divisible by "
                f"num_replicas_in_sync {self.num_replicas_in_sync}"
            )
        return global_batch_size // self.num_replicas_in_sync


def _accepts(function: Callable[..., Any], name: str) -> bool:
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return name in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


class ParameterServerStrategy:
    """Places variables on the cluster's ``ps`` tasks and runs functions on its workers."""

    def __init__(self, cluster_resolver: Any, variable_partitioner: Any = None) -> None:
        spec = cluster_resolver.cluster_spec()
        validate_cluster_for_ps(spec, getattr(cluster_resolver, "task_type", None))
        self.cluster_resolver = cluster_resolver
        self.cluster_spec = ClusterSpec(spec)
        if variable_partitioner is not None and not callable(variable_partitioner):
            raise InvalidArgumentError(
                f"variable_partitioner must be callable, got {type(variable_partitioner).__name__}"
            )
        self._partitioner = variable_partitioner
        self._stores = [RemoteStore.get(self.cluster_spec.task_address("ps", i), i)
                        for i in range(self.cluster_spec.num_tasks("ps"))]
        self._next_store = 0
        self._names: dict[str, int] = {}
        self._token = uuid.uuid4().hex[:8]  # keeps two strategies' variables apart on a ps
        self._lock = threading.Lock()

    def __reduce__(self) -> Any:
        # Functions sent to workers capture the strategy; there it is rebuilt from the
        # cluster (variable placement state stays with the coordinator).
        return (_rebuild, (self.cluster_spec, self._partitioner))

    @property
    def num_workers(self) -> int:
        return self.cluster_spec.num_tasks("worker")

    @property
    def num_ps(self) -> int:
        return len(self._stores)

    @property
    def num_replicas_in_sync(self) -> int:
        return 1

    @contextlib.contextmanager
    def scope(self) -> Iterator[ParameterServerStrategy]:
        """Inside it, ``cv.Variable(...)`` creates parameter-server variables."""
        _scope.push(self)
        try:
            yield self
        finally:
            _scope.pop()

    # ----- variable creation ------------------------------------------------------------------
    def _unique(self, name: str) -> str:
        with self._lock:
            count = self._names.get(name, 0)
            self._names[name] = count + 1
        return name if count == 0 else f"{name}_{count}"

    def _place(self, key: str, value: np.ndarray, trainable: bool, name: str) -> Variable:
        with self._lock:
            store = self._stores[self._next_store % len(self._stores)]
            self._next_store += 1
        key = f"{key}@{self._token}"
        store.execute([("create", key, value)])
        return Variable._in_store(store, key, name, value.shape, value.dtype, trainable)

    def _create_variable(self, initial_value: Any = None, name: str | None = None,
                         dtype: Any = None, shape: Any = None, trainable: bool = True,
                         **_: Any) -> Variable | ShardedVariable:
        name = self._unique(name or "Variable")
        if self._partitioner is None:
            return self._place(name, initial_array(initial_value, dtype, shape), trainable,
                               name)
        if initial_value is None:
            raise InvalidArgumentError(
                "a variable_partitioner needs an initial_value to create a variable; got None"
            )
        lazy = callable(initial_value) and shape is not None and dtype is not None
        full = None if lazy else initial_array(initial_value, dtype, shape)
        full_shape = tuple(shape) if lazy else full.shape
        full_dtype = np.dtype(dtype) if lazy else full.dtype
        count = 1 if not full_shape else partition_count(self._partitioner, full_shape,
                                                         full_dtype)
        if count <= 1:
            value = full if full is not None else initial_array(initial_value, dtype, shape)
            return self._place(name, value, trainable, name)
        shards = []
        offsets = shard_offsets(full_shape[0], count)
        for i, rows in enumerate(shard_sizes(full_shape[0], count)):
            shard_shape = (rows, *full_shape[1:])
            if full is not None:
                value = full[offsets[i]:offsets[i] + rows]
            else:
                value = _shard_value(initial_value, shard_shape, offsets[i], full_shape,
                                     full_dtype)
            key = f"{name}/part_{i}"
            shards.append(self._place(key, value, trainable, key))
        return ShardedVariable(shards, name=name)

    # ----- running functions ---------------------------------------------------------------------
    def run(self, fn: Callable[..., Any], args: tuple = (), kwargs: dict | None = None) -> Any:
        """Run ``fn`` as the one replica of this worker (call it inside a scheduled function)."""
        return fn(*args, **(kwargs or {}))

    def reduce(self, reduce_op: ReduceOp | str, value: Any, axis: int | None) -> Any:
        """Reduce ``value`` across replicas (one per worker function) and along ``axis``."""
        op = ReduceOp(reduce_op.value if isinstance(reduce_op, ReduceOp) else reduce_op.upper())
        if axis is None:
            return value
        array = np.asarray(value)
        return array.sum(axis=axis) if op is ReduceOp.SUM else array.mean(axis=axis)

    def distribute_datasets_from_function(self, dataset_fn: Callable[[InputContext], Any],
                                          options: Any = None) -> Any:
        """``dataset_fn(input_context)``: call inside a per-worker dataset function."""
        context = _dataset_context("distribute_datasets_from_function")
        return dataset_fn(InputContext(context.num_workers, context.task_index, 1))

    def experimental_distribute_dataset(self, dataset: Any, options: Any = None) -> Any:
        """``dataset`` itself: call inside a per-worker dataset function."""
        _dataset_context("experimental_distribute_dataset")
        return dataset


def _rebuild(cluster_spec: ClusterSpec, partitioner: Any) -> ParameterServerStrategy:
    from convoy.distribute.cluster_resolver import SimpleClusterResolver

    return ParameterServerStrategy(SimpleClusterResolver(cluster_spec), partitioner)


def _dataset_context(method: str) -> Any:
    context = worker_context()
    if context is None or not context.creating_dataset:
        raise FailedPreconditionError(
            f"ParameterServerStrategy.{method} must be called inside the function passed to "
            f"ClusterCoordinator.create_per_worker_dataset"
        )
    return context


def _shard_value(initial_value: Callable[..., Any], shape: tuple[int, ...], offset: int,
                 full_shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """One shard's initial value, without building the whole tensor when the initializer can
    make a part of it."""
    info = ShardInfo(shape, (offset, *([0] * (len(shape) - 1))))
    if _accepts(initial_value, "shard_info"):
        value = initial_value(shard_info=info)
    elif _accepts(initial_value, "partition_shape"):
        value = initial_value(partition_shape=shape, partition_offset=info.offset)
    else:
        value = initial_value()
    array = np.asarray(value, dtype=dtype)
    if array.shape == full_shape and full_shape != shape:
        array = array[offset:offset + shape[0]]
    if array.shape != shape:
        raise InvalidArgumentError(
            f"the initializer returned shape {list(array.shape)} for a shard of shape "
            f"{list(shape)}"
        )
    return array
