"""ParameterServerStrategy: variables on ``ps`` tasks, functions on ``worker`` tasks.

Variables created in ``strategy.scope()`` are placed round-robin on the parameter servers, or,
with a ``variable_partitioner``, split by rows into shards ("div" layout) that are placed
round-robin in turn. Functions run on workers through a :class:`ClusterCoordinator`.
"""

from __future__ import annotations

import contextlib
import enum
import inspect
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from convoy._values import pickling as _pickling
from convoy.distribute import _operations as ops
from convoy.distribute import _scope
from convoy.distribute._cluster_wait import start_timeout, wait_for_cluster
from convoy.distribute._store_clients import RemoteStore
from convoy.distribute._worker_context import worker_context
from convoy.distribute.cluster import ClusterSpec, validate_cluster_for_ps
from convoy.distribute.partitioners import partition_count, shard_offsets, shard_sizes
from convoy.distribute.variables import ShardedVariable, Variable, initial_array
from convoy.errors import (
    ConvoyError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    UnavailableError,
)

log = logging.getLogger(__name__)


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


def _parameters(function: Callable[..., Any]) -> dict[str, inspect.Parameter] | None:
    """``function``'s parameters, or None if its signature cannot be read."""
    try:
        return dict(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return None


class ParameterServerStrategy:
    """Places variables on the cluster's ``ps`` tasks and runs functions on its workers.

    Made on the chief, it first waits until every ps and worker of the cluster answers (they
    may start in any order), for ``cluster_start_timeout_s`` at most (default:
    ``$CONVOY_CLUSTER_START_TIMEOUT_S``, else 300 s), then fails naming the tasks missing.
    """

    def __init__(self, cluster_resolver: Any, variable_partitioner: Any = None, *,
                 cluster_start_timeout_s: float | None = None) -> None:
        spec = cluster_resolver.cluster_spec()
        validate_cluster_for_ps(spec, getattr(cluster_resolver, "task_type", None),
                                getattr(cluster_resolver, "task_id", None))
        self.cluster_resolver = cluster_resolver
        self.cluster_spec = ClusterSpec(spec)
        if variable_partitioner is not None and not callable(variable_partitioner):
            raise InvalidArgumentError(
                f"variable_partitioner must be callable, got {type(variable_partitioner).__name__}"
            )
        self._partitioner = variable_partitioner
        if worker_context() is None:  # the chief: its cluster may still be starting
            wait_for_cluster(self.cluster_spec, start_timeout(cluster_start_timeout_s))
        self._stores = [RemoteStore.get(self.cluster_spec.task_address("ps", i), i)
                        for i in range(self.cluster_spec.num_tasks("ps"))]
        self._next_store = 0
        self._names: dict[str, int] = {}
        self._token = uuid.uuid4().hex[:8]  # keeps two strategies' variables apart on a ps
        #: The variables placed on the ps (shards one by one), by key: what recover() remakes.
        self._placed: weakref.WeakValueDictionary[str, Variable] = \
            weakref.WeakValueDictionary()
        self._tables: weakref.WeakSet[Any] = weakref.WeakSet()  # its DynamicTables
        self._lock = threading.Lock()
        self._colocation = threading.local()  # .variable: where colocate_vars_with places
        self.extended = StrategyExtended(self)
        self._cluster_coordinator: Any = None  # its one ClusterCoordinator, once made
        if worker_context() is None:
            _scope.become_chief()

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

    def _owns(self, variable: Any) -> bool:
        return isinstance(variable, Variable) and variable.handle.key.endswith(
            f"@{self._token}")

    def _colocated(self) -> Variable | None:
        """The variable new ones go next to (``extended.colocate_vars_with``), or None."""
        return getattr(self._colocation, "variable", None)

    def _place(self, key: str, value: np.ndarray, trainable: bool, name: str) -> Variable:
        colocated = self._colocated()
        if colocated is not None:
            store = colocated.handle.store
        else:
            with self._lock:
                store = self._stores[self._next_store % len(self._stores)]
                self._next_store += 1
        key = f"{key}@{self._token}"
        store.execute([ops.Create(key, value)])
        return self._track(Variable._in_store(store, key, name, value.shape, value.dtype,
                                              trainable))

    def _track(self, variable: Variable) -> Variable:
        self._placed[variable.handle.key] = variable
        return variable

    def _create_variable(self, initial_value: Any = None, name: str | None = None,
                         dtype: Any = None, shape: Any = None, trainable: bool = True,
                         **_: Any) -> Variable | ShardedVariable:
        name = self._unique(name or "Variable")
        if self._partitioner is None or self._colocated() is not None:
            return self._place(name, initial_array(initial_value, dtype, shape), trainable,
                               name)
        if initial_value is None:
            raise InvalidArgumentError(
                "a variable_partitioner needs an initial_value to create a variable; got None"
            )
        full: np.ndarray | None = None
        if callable(initial_value) and shape is not None and dtype is not None:  # lazy
            full_shape, full_dtype = tuple(shape), np.dtype(dtype)
        else:
            full = initial_array(initial_value, dtype, shape)
            full_shape, full_dtype = full.shape, full.dtype
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

    def _create_together(self, initial_values: Sequence[tuple[str, np.ndarray]],
                         trainable: bool = False) -> list[Variable]:
        """Variables ``(name, initial value)`` placed together on one parameter server and
        never partitioned, so one call updates or reads them all atomically (a metric's
        state)."""
        variables: list[Variable] = []
        for name, value in initial_values:
            name, value = self._unique(name), np.asarray(value)
            if not variables:
                variables.append(self._place(name, value, trainable, name))
                continue
            store, key = variables[0].handle.store, f"{name}@{self._token}"
            store.execute([ops.Create(key, value)])
            variables.append(self._track(Variable._in_store(store, key, name, value.shape,
                                                            value.dtype, trainable)))
        return variables

    # ----- recovering a lost parameter server ----------------------------------------------------
    def recover(self, checkpoint_manager: Any, timeout_s: float = 300.0) -> str:
        """After a parameter server was lost (``join``/``fetch`` raised ``UnavailableError``),
        wait for it to answer again, at its address or the one the cluster resolver now
        gives, make this strategy's variables and dynamic tables again on it and restore every
        variable and table (on all parameter servers) and everything else
        ``checkpoint_manager``'s checkpoint holds
        from its latest checkpoint; returns that checkpoint's path. The same coordinator,
        variables, models and optimizers then go on; the updates made since the checkpoint
        are lost. Raises UnavailableError naming the parameter servers that did not answer
        within ``timeout_s`` seconds."""
        latest = _latest_checkpoint(checkpoint_manager)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or \
                timeout_s < 0:
            raise InvalidArgumentError(f"timeout_s must be a number of seconds >= 0, got "
                                       f"{timeout_s!r}")
        deadline = time.monotonic() + timeout_s
        spec = self._resolved_ps_spec()
        self._wait_for_ps(spec, timeout_s, deadline)
        coordinator = self._cluster_coordinator
        if coordinator is not None and not coordinator._scheduler.closed:
            try:  # functions scheduled before: they end (failing) before anything is restored
                coordinator.join()
            except ConvoyError as error:
                log.info("recover: a function scheduled before failed: %s", error)
        lost = [i for i in range(self.num_ps) if self._remake(i, spec)]
        log.warning("recover: restoring %s after losing ps %s", latest,
                    ", ".join(str(i) for i in lost) or "(none)")
        checkpoint_manager.checkpoint.read(latest)
        if lost:
            self._reconnect_workers([self._stores[i] for i in lost],
                                    max(_REACH_AT_LEAST_S, deadline - time.monotonic()))
        return latest

    def _resolved_ps_spec(self) -> ClusterSpec:
        """The cluster as the resolver gives it now; its ps addresses replace ours."""
        spec = ClusterSpec(self.cluster_resolver.cluster_spec())
        count = spec.num_tasks("ps") if "ps" in spec.jobs else 0
        if count != self.num_ps:
            raise InvalidArgumentError(
                f"recover: the cluster resolver now gives {count} ps tasks, the strategy has "
                f"{self.num_ps}; a strategy keeps its number of parameter servers")
        return spec

    def _wait_for_ps(self, spec: ClusterSpec, timeout_s: float, deadline: float) -> None:
        """Return once every ps answers this process's ``Execute``; UnavailableError naming
        those that did not by ``deadline``."""
        addresses = [spec.task_address("ps", i) for i in range(self.num_ps)]
        try:
            wait_for_cluster(ClusterSpec({"ps": addresses}), timeout_s)
        except UnavailableError as error:
            raise UnavailableError(f"strategy.recover waited {timeout_s:g} s for the parameter "
                                   f"servers: {error}") from None
        for index, address in enumerate(addresses):
            store = RemoteStore.get(address, index)
            while True:  # a ps restarted at an address fails the first call of a connection
                try:
                    store.execute([])
                    break
                except UnavailableError as error:
                    if time.monotonic() >= deadline:
                        raise UnavailableError(
                            f"strategy.recover waited {timeout_s:g} s for ps:{index} at "
                            f"{address}: {error}") from None
                    time.sleep(0.2)

    def _remake(self, index: int, spec: ClusterSpec) -> bool:
        """Point ps ``index``'s variables and dynamic-table shards at its address in ``spec``
        and make them there again (zeros and empty tables, until restored) if that ps lost
        them; whether it did."""
        old = self._stores[index]
        store = RemoteStore.get(spec.task_address("ps", index), index)
        variables = [v for v in list(self._placed.values()) if v.handle.store is old]
        tables = [t for t in list(self._tables) if t.shards[index].store is old]
        moved = store is not old
        if moved:
            self._stores[index] = store
            self.cluster_spec = _with_ps(self.cluster_spec, index, store.address)
            for variable in variables:
                variable._move(store)
            for table in tables:
                table.shards[index] = table.shards[index]._replace(store=store)
            _forget_pickles()
        if not variables and not tables:
            return moved
        if not moved and not _lost(store, variables, [t.shards[index].key for t in tables]):
            return False
        store.execute([ops.Create(v.handle.key, np.zeros(v.shape, v.dtype), True)
                       for v in variables] +
                      [ops.TableCreate(t.shards[index].key, t.shard_config, True) for t in tables])
        return True

    def _reconnect_workers(self, stores: list[RemoteStore], timeout_s: float) -> None:
        """Have every worker reach ``stores`` once, so its first call to a restarted ps (which
        fails, unsent) is not a training function's."""
        from convoy.distribute._coordinator_calls import call_message

        coordinator = self._cluster_coordinator
        if coordinator is None or coordinator._scheduler.closed:
            return
        call = call_message(_reach, ([(s.address, s.task_index) for s in stores], timeout_s),
                            {})
        for worker in coordinator._scheduler._workers:
            try:
                outcome = worker.run(call)
            except UnavailableError:  # a worker that is down starts with new connections
                continue
            if outcome.error is not None:
                raise outcome.error

    # ----- running functions ---------------------------------------------------------------------
    def run(self, fn: Callable[..., Any], args: tuple[Any, ...] = (),
            kwargs: dict[str, Any] | None = None) -> Any:
        """Run ``fn`` as the one replica of this worker (call it inside a scheduled function)."""
        _warn_unless_on_worker()
        return fn(*args, **(kwargs or {}))

    def reduce(self, reduce_op: ReduceOp | str, value: Any, axis: int | None) -> Any:
        """Reduce ``value`` across replicas (one per worker function) and along ``axis``."""
        _warn_unless_on_worker()
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


def _latest_checkpoint(checkpoint_manager: Any) -> str:
    if not hasattr(checkpoint_manager, "checkpoint") or \
            not hasattr(checkpoint_manager, "latest_checkpoint"):
        raise InvalidArgumentError(f"recover takes a cv.train.CheckpointManager, got "
                                   f"{type(checkpoint_manager).__name__}")
    latest = checkpoint_manager.latest_checkpoint
    if latest is None:
        raise FailedPreconditionError(
            f"recover restores the latest checkpoint of the manager, and "
            f"{checkpoint_manager.directory} has none yet: save one with manager.save()")
    return str(latest)


def _with_ps(spec: ClusterSpec, index: int, address: str) -> ClusterSpec:
    jobs = {job: {i: spec.task_address(job, i) for i in spec.task_indices(job)}
            for job in spec.jobs}
    jobs["ps"][index] = address
    return ClusterSpec(jobs)


def _lost(store: RemoteStore, variables: list[Variable], tables: list[str]) -> bool:
    """Whether ``store`` lost what it held: one of ``variables`` (the smallest) or of the
    dynamic ``tables`` (keys) is missing there."""
    if variables:
        probe = min(variables, key=lambda v: int(np.prod(v.shape)))
        operation: Any = ops.Read(probe.handle.key)
    else:
        operation = ops.TableStats(tables[0])
    try:
        store.execute([operation])
        return False
    except NotFoundError:
        return True


def _forget_pickles() -> None:
    """Drop the pickles this process keeps of scheduled functions and placed modules: they
    name a parameter server's old address."""
    _pickling.forget_sent_pickles()


#: The least time a worker is given to reach a recovered ps (its connection may be waiting
#: out a reconnection backoff, and its first call of a connection fails, unsent).
_REACH_AT_LEAST_S = 10.0


def _reach(stores: list[tuple[str, int]], timeout_s: float) -> None:
    """On a worker: call each ``(address, task index)`` ps once, retrying unavailable ones
    for ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    for address, index in stores:
        store = RemoteStore.get(address, index)
        while True:
            try:
                store.execute([])
                break
            except UnavailableError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)


def _warn_unless_on_worker() -> None:
    if worker_context() is None:
        log.warning("a ParameterServerStrategy method (run or reduce) is called outside a "
                    "scheduled function, so it runs here on the coordinator; to run on the "
                    "workers, call it inside a function passed to ClusterCoordinator.schedule")


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
    make a part of it: as TensorFlow does, ``shard_info`` goes to an initializer that names
    that parameter, ``partition_shape``/``partition_offset`` to one that takes them (named, or
    through ``**kwargs``, falling back to a plain call if it refuses them with TypeError or
    ValueError, as Keras initializers that cannot partition do); any other initializer is
    called plainly and its full value sliced."""
    offsets = (offset, *([0] * (len(shape) - 1)))
    parameters = _parameters(initial_value)
    if parameters is not None and "shard_info" in parameters:
        value = initial_value(shard_info=ShardInfo(shape, offsets))
    elif parameters is not None and {"partition_shape", "partition_offset"} <= set(parameters):
        value = initial_value(partition_shape=shape, partition_offset=offsets)
    elif parameters is None or any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        try:
            value = initial_value(partition_shape=shape, partition_offset=offsets)
        except (TypeError, ValueError):
            value = initial_value()
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


class StrategyExtended:
    """``strategy.extended``: placement controls beyond ``scope()``."""

    def __init__(self, strategy: ParameterServerStrategy) -> None:
        self._strategy = strategy

    def variable_created_in_scope(self, v: Any) -> bool:
        """Whether ``v`` was created in this strategy's scope."""
        shards = v.variables if isinstance(v, ShardedVariable) else [v]
        return all(self._strategy._owns(shard) for shard in shards)

    @contextlib.contextmanager
    def colocate_vars_with(self, colocate_with_variable: Variable) -> Iterator[None]:
        """Inside it (and inside ``strategy.scope()``), new variables are placed on the
        parameter server of ``colocate_with_variable`` and never partitioned."""
        strategy = self._strategy
        if _scope.current() is not strategy:
            raise FailedPreconditionError(
                "colocate_vars_with must be used inside this strategy's scope(): "
                "with strategy.scope(): with strategy.extended.colocate_vars_with(v): ..."
            )
        if not strategy._owns(colocate_with_variable):
            raise InvalidArgumentError(
                f"colocate_vars_with takes a variable created in this strategy's scope "
                f"(one shard of a ShardedVariable), got {colocate_with_variable!r:.200}"
            )
        previous = strategy._colocated()
        strategy._colocation.variable = colocate_with_variable
        try:
            yield
        finally:
            strategy._colocation.variable = previous
