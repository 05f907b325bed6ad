"""Variables: arrays that live in a store (a parameter server, or this process), and
ShardedVariable, one logical variable split by rows over several of them.

``cv.Variable(...)`` under ``strategy.scope()`` is created by the strategy (placed on a
parameter server, or sharded); elsewhere it lives in this process. Every operation is one
call to its store, atomic there. Variables pickle as handles, so functions sent to workers
use the same parameter-server variables.

In a scheduled function, updates (``assign*``, ``scatter_*``) do not wait, as
``apply_gradients`` does not: the function counts as done once they have landed and fails if
one fails, and the process's later operations on the same store see them. So they send
arrays of their own, never the caller's, which the caller may change once the call returns.
"""

from __future__ import annotations

import itertools
import numbers
import threading
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from convoy._values.slices import IndexedSlices, owned, put_rows, take_rows
from convoy.distribute import _operations as ops
from convoy.distribute import _scope
from convoy.distribute._arithmetic import ReadsAsArray
from convoy.distribute._store_clients import LocalStore, Store, execute_all, send_updates
from convoy.distribute._worker_context import worker_context
from convoy.errors import InvalidArgumentError

_local_names = itertools.count()
_local_lock = threading.Lock()


def initial_array(initial_value: Any, dtype: Any, shape: Any) -> np.ndarray:
    """The initial value as an array of ``dtype`` (calling it first if it is callable)."""
    if callable(initial_value):
        initial_value = initial_value()
    try:
        array = np.array(initial_value, dtype=dtype)
    except (TypeError, ValueError) as error:
        raise InvalidArgumentError(
            f"initial_value cannot become an array of dtype {dtype}: {error}"
        ) from None
    if shape is not None and tuple(shape) != array.shape:
        raise InvalidArgumentError(
            f"initial_value has shape {list(array.shape)}, but shape={list(shape)} was given"
        )
    return array


class Handle(NamedTuple):
    """Where a variable lives: its store (a parameter server's, or one in this process) and
    its key there. Operations on it (:mod:`convoy.distribute._operations`) name ``key`` and go
    to ``store.execute``."""

    store: Store
    key: str


class _Ops(ReadsAsArray):
    """What Variable and ShardedVariable offer alike, on top of their ``read_value``,
    ``sparse_read``, ``_update(kind, value)`` and ``_scatter(kind, delta)`` (``kind`` an
    operation class). Updates return
    the variable, as TensorFlow's do; their ``use_locking``, ``name`` and ``read_value``
    arguments are accepted for TensorFlow's sake and change nothing (every operation is
    atomic where the variable lives)."""

    name: str
    shape: tuple[int, ...]

    def read_value(self) -> np.ndarray:
        raise NotImplementedError

    def sparse_read(self, indices: Any) -> np.ndarray:
        raise NotImplementedError

    def _update(self, kind: ops.WholeUpdate, value: Any) -> None:
        raise NotImplementedError

    def _scatter(self, kind: ops.RowUpdate, sparse_delta: IndexedSlices) -> None:
        raise NotImplementedError

    def numpy(self) -> np.ndarray:
        return self.read_value()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        value = self.read_value()
        return value if dtype is None else value.astype(dtype)

    def __getitem__(self, key: Any) -> Any:
        """``v[2:5]``, ``v[3]``, ``v[1:, 0]``...: an integer or a slice first reads only
        those rows (from the shards that hold them); any other key reads the whole value."""
        parts = key if isinstance(key, tuple) else (key,)
        first, rest = (parts[0], parts[1:]) if parts else (Ellipsis, ())
        if not self.shape or not isinstance(first, (slice, numbers.Integral)) or \
                isinstance(first, bool):
            return self.read_value()[key]
        rows = self.shape[0]
        if isinstance(first, slice):
            return self.sparse_read(np.arange(*first.indices(rows)))[(slice(None), *rest)]
        first = int(first)
        if not -rows <= first < rows:
            raise IndexError(f"index {first} is out of bounds for axis 0 of {self.name!r} "
                             f"with size {rows}")
        return self.sparse_read(np.array([first % rows]))[(0, *rest)]

    def assign(self, value: Any, use_locking: bool = False, name: str | None = None,
               read_value: bool = True) -> Any:
        self._update(ops.Assign, value)
        return self

    def assign_add(self, delta: Any, use_locking: bool = False, name: str | None = None,
               read_value: bool = True) -> Any:
        self._update(ops.AssignAdd, delta)
        return self

    def assign_sub(self, delta: Any, use_locking: bool = False, name: str | None = None,
               read_value: bool = True) -> Any:
        self._update(ops.AssignSub, delta)
        return self

    def scatter_add(self, sparse_delta: IndexedSlices, use_locking: bool = False,
                    name: str | None = None) -> Any:
        return self._scattered(ops.ScatterAdd, sparse_delta)

    def scatter_sub(self, sparse_delta: IndexedSlices, use_locking: bool = False,
                    name: str | None = None) -> Any:
        return self._scattered(ops.ScatterSub, sparse_delta)

    def scatter_update(self, sparse_delta: IndexedSlices, use_locking: bool = False,
                       name: str | None = None) -> Any:
        return self._scattered(ops.ScatterUpdate, sparse_delta)

    def scatter_mul(self, sparse_delta: IndexedSlices, use_locking: bool = False,
                    name: str | None = None) -> Any:
        return self._scattered(ops.ScatterMul, sparse_delta)

    def scatter_div(self, sparse_delta: IndexedSlices, use_locking: bool = False,
                    name: str | None = None) -> Any:
        return self._scattered(ops.ScatterDiv, sparse_delta)

    def scatter_min(self, sparse_delta: IndexedSlices, use_locking: bool = False,
                    name: str | None = None) -> Any:
        return self._scattered(ops.ScatterMin, sparse_delta)

    def scatter_max(self, sparse_delta: IndexedSlices, use_locking: bool = False,
                    name: str | None = None) -> Any:
        return self._scattered(ops.ScatterMax, sparse_delta)

    def batch_scatter_update(self, sparse_delta: IndexedSlices, use_locking: bool = False,
                             name: str | None = None) -> Any:
        """``scatter_update`` for rows named by a vector of indices (TensorFlow's batched
        form, with indices of higher rank, is not supported)."""
        if isinstance(sparse_delta, IndexedSlices) and np.ndim(sparse_delta.indices) != 1:
            raise InvalidArgumentError(
                f"batch_scatter_update takes a vector of indices, got indices of shape "
                f"{list(np.shape(sparse_delta.indices))}"
            )
        return self._scattered(ops.ScatterUpdate, sparse_delta)

    def _scattered(self, kind: ops.RowUpdate, sparse_delta: IndexedSlices) -> Any:
        self._scatter(kind, sparse_delta)
        return self


class _VariableMeta(type):
    """Inside a strategy's scope, ``Variable(...)`` is made by the strategy."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        strategy = _scope.current()
        if strategy is not None and cls is Variable:
            return strategy._create_variable(*args, **kwargs)
        return super().__call__(*args, **kwargs)


class Variable(_Ops, metaclass=_VariableMeta):
    """A named array in a store; reads and updates are single atomic store operations.

    :attr:`handle` says where it lives, for code that sends several variables' operations
    in one call per store (optimizers, checkpoints, ``cv.torch.pull``)."""

    def __init__(self, initial_value: Any, name: str | None = None, dtype: Any = None,
                 shape: Sequence[int] | None = None, trainable: bool = True) -> None:
        value = initial_array(initial_value, dtype, shape)
        with _local_lock:
            unique = f"{name or 'Variable'}:{next(_local_names)}"
        self._bind(LocalStore(), unique, name or "Variable", value.shape, value.dtype,
                   trainable)
        self._device = _local_device()
        self._handle.store.execute([ops.Create(unique, value)])

    @classmethod
    def _in_store(cls, store: Any, key: str, name: str, shape: Sequence[int], dtype: Any,
                  trainable: bool) -> Variable:
        """A handle on the variable ``key`` that already exists in ``store``."""
        variable = object.__new__(cls)
        variable._bind(store, key, name, tuple(shape), np.dtype(dtype), trainable)
        return variable

    def _bind(self, store: Any, key: str, name: str, shape: tuple[int, ...], dtype: np.dtype,
              trainable: bool) -> None:
        self._handle, self._device = Handle(store, key), store.device
        self.name, self.shape, self.dtype, self.trainable = name, shape, dtype, trainable

    def _move(self, store: Store) -> None:
        """Point this handle at ``store`` (its parameter server's new address), same key."""
        self._handle = Handle(store, self._handle.key)

    @property
    def handle(self) -> Handle:
        """Where the variable lives: ``(store, key)``."""
        return self._handle

    def __reduce__(self) -> Any:
        if isinstance(self._handle.store, LocalStore):
            raise InvalidArgumentError(
                f"variable {self.name!r} was created outside strategy.scope(): it lives in "
                f"this process only and cannot be used by functions sent to workers; create "
                f"it inside strategy.scope()"
            )
        return (_variable_in_store, (*self._handle, self.name, self.shape, self.dtype.str,
                                     self.trainable))

    @property
    def device(self) -> str:
        """Where the variable lives, as a TensorFlow device string."""
        return self._device

    def read_value(self) -> np.ndarray:
        """A copy of the current value."""
        store, key = self._handle
        value: np.ndarray = store.execute([ops.Read(key)])[0]
        return value

    def _update(self, kind: ops.WholeUpdate, value: Any) -> None:
        store, key = self._handle
        send_updates([(store, [kind(key, np.array(value, dtype=self.dtype))])])

    def sparse_read(self, indices: Any) -> np.ndarray:
        """The rows ``indices`` (any shape) of the variable."""
        store, key = self._handle
        rows: np.ndarray = store.execute([ops.Gather(key, np.asarray(indices))])[0]
        return rows

    def _scatter(self, kind: ops.RowUpdate, sparse_delta: IndexedSlices) -> None:
        delta = owned(_checked_delta(sparse_delta, self.shape[1:]))
        store, key = self._handle
        send_updates([(store, [kind(key, delta.indices, delta.values)])])

    def __repr__(self) -> str:
        return (f"<cv.Variable '{self.name}' shape={list(self.shape)} dtype={self.dtype.name} "
                f"device={self.device}>")


def _local_device() -> str:
    """Where a variable made outside any strategy's scope lives, as TensorFlow names it: on
    a worker task in a scheduled function; on the chief once a strategy has connected this
    process to its cluster; else on the local host."""
    context = worker_context()
    if context is not None:
        return f"/job:worker/replica:0/task:{context.task_index}/device:CPU:0"
    job = "chief" if _scope.is_chief() else "localhost"
    return f"/job:{job}/replica:0/task:0/device:CPU:0"


def _variable_in_store(*arguments: Any) -> Variable:
    # module level, so a pickled handle names this function instead of carrying its code
    return Variable._in_store(*arguments)


def _checked_delta(sparse_delta: Any, row_shape: tuple[int, ...]) -> IndexedSlices:
    if not isinstance(sparse_delta, IndexedSlices):
        raise InvalidArgumentError(
            f"sparse_delta must be a convoy.IndexedSlices, got {type(sparse_delta).__name__}"
        )
    return sparse_delta.checked("sparse_delta", row_shape)


class ShardedVariable(_Ops):
    """One logical variable stored as row blocks (shards) on several stores."""

    def __init__(self, variables: Sequence[Variable], name: str | None = None) -> None:
        if not isinstance(variables, Sequence) or not variables or \
                not all(isinstance(v, Variable) for v in variables):
            raise TypeError(f"variables should be a non-empty list of cv.Variable, got "
                            f"{variables!r:.200}")
        variables = list(variables)
        first = variables[0]
        if any(v.dtype != first.dtype for v in variables):
            raise InvalidArgumentError(f"all shards must have the same dtype, got "
                                       f"{[v.dtype.name for v in variables]}")
        if any(v.shape[1:] != first.shape[1:] or not v.shape for v in variables):
            raise InvalidArgumentError(f"all shards must have the same shapes except on the "
                                       f"first axis, got {[list(v.shape) for v in variables]}")
        self._variables = variables
        self.name = name or first.name.rsplit("/part_", 1)[0]
        rows = [v.shape[0] for v in variables]
        self._offsets = np.cumsum([0, *rows])
        self.shape = (int(self._offsets[-1]), *first.shape[1:])
        self.dtype = first.dtype
        self.trainable = first.trainable
        self._remembered: tuple[weakref.ref[np.ndarray], list[Any]] | None = None

    def __reduce__(self) -> Any:  # just the shards: a handle pickles small and fast
        return (ShardedVariable, (self._variables, self.name))

    @property
    def variables(self) -> list[Variable]:
        return list(self._variables)

    def read_value(self) -> np.ndarray:
        """The whole value (shards concatenated), read from all shards in parallel."""
        results = execute_all([(v.handle.store, [ops.Read(v.handle.key)])
                               for v in self._variables])
        return np.concatenate([r[0] for r in results])

    def _split(self, value: Any) -> list[np.ndarray]:
        value = np.asarray(value, dtype=self.dtype)
        if value.shape != self.shape:
            raise InvalidArgumentError(
                f"value of shape {list(value.shape)} does not match {self.name!r}'s "
                f"{list(self.shape)}"
            )
        return np.split(value, self._offsets[1:-1])

    def _update(self, kind: ops.WholeUpdate, value: Any) -> None:
        parts = self._split(value)
        send_updates([(v.handle.store, [kind(v.handle.key, p.copy())])
                      for v, p in zip(self._variables, parts)])

    def route(self, ids: np.ndarray,
              remember: bool = False) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """For each shard that owns some of ``ids`` (flat): (shard, positions, local rows).

        With ``remember``, the routes of a read-only ``ids`` are kept for the next call with
        that same array (a pull's ids, routed again when their gradients are applied)."""
        remembered = self._remembered
        if remembered is not None and remembered[0]() is ids:
            return remembered[1]
        if ids.dtype.kind not in "iu":
            raise InvalidArgumentError(f"ids for {self.name!r} must be integers, got {ids.dtype}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.shape[0]):
            raise InvalidArgumentError(
                f"ids must be in [0, {self.shape[0]}) for {self.name!r}, got values from "
                f"{ids.min()} to {ids.max()}"
            )
        shard_of = np.searchsorted(self._offsets[1:-1], ids, side="right")
        routes = []
        for shard in np.flatnonzero(np.bincount(shard_of, minlength=len(self._variables))):
            positions = np.flatnonzero(shard_of == shard)
            routes.append((int(shard), positions, ids[positions] - self._offsets[shard]))
        if remember and not ids.flags.writeable:
            self._remembered = (weakref.ref(ids), routes)
        return routes

    def sparse_read(self, indices: Any) -> np.ndarray:
        """Rows ``indices`` (any shape), each fetched from the shard that owns it, in parallel."""
        ids = np.asarray(indices)
        flat = ids.reshape(-1)
        out = np.empty((flat.size, *self.shape[1:]), self.dtype)
        routes = self.route(flat)
        handles = [self._variables[s].handle for s, _, _ in routes]
        results = execute_all([(store, [ops.Gather(key, rows)])
                               for (store, key), (_, _, rows) in zip(handles, routes)])
        for (_, positions, _), result in zip(routes, results):
            put_rows(out, positions, result[0])
        return out.reshape((*ids.shape, *self.shape[1:]))

    def _scatter(self, kind: ops.RowUpdate, sparse_delta: IndexedSlices) -> None:
        delta = _checked_delta(sparse_delta, self.shape[1:])
        flat = delta.indices.reshape(-1)
        values = delta.values.reshape((flat.size, *self.shape[1:]))
        # route's rows and take_rows's values are new arrays
        send_updates([(self._variables[s].handle.store,
                       [kind(self._variables[s].handle.key, rows, take_rows(values, positions))])
                      for s, positions, rows in self.route(flat)])

    def __repr__(self) -> str:
        return (f"<cv.distribute.ShardedVariable '{self.name}' shape={list(self.shape)} "
                f"shards={[list(v.shape) for v in self._variables]}>")


def embedding_lookup(params: Variable | ShardedVariable | Sequence[Variable],
                     ids: Any) -> np.ndarray:
    """The rows ``ids`` (any shape) of ``params``; a sharded table is read from all its
    shards in parallel, each shard sent only the ids it owns."""
    if isinstance(params, (list, tuple)):
        params = ShardedVariable(params)
    if not isinstance(params, (Variable, ShardedVariable)):
        raise InvalidArgumentError(
            f"params must be a Variable, a ShardedVariable or a list of Variables, got "
            f"{type(params).__name__}"
        )
    return params.sparse_read(ids)




def read_together(variables: Sequence[Variable]) -> list[np.ndarray]:
    """The values of ``variables``; those in one store are read in one atomic call, so
    variables placed together (a metric's state) are read as one consistent snapshot."""
    calls: dict[int, tuple[Store, list[ops.Operation]]] = {}
    for variable in variables:
        store, key = variable.handle
        calls.setdefault(id(store), (store, []))[1].append(ops.Read(key))
    results = dict(zip(calls, execute_all(list(calls.values()))))
    taken = {key: iter(values) for key, values in results.items()}
    return [next(taken[id(variable.handle.store)]) for variable in variables]


def update_together(updates: Sequence[tuple[Variable, ops.WholeUpdate, Any]]) -> None:
    """Apply ``(variable, kind, value)`` updates (``kind`` :class:`~._operations.Assign`,
    ``AssignAdd`` or ``AssignSub``); those in one store go in one call, applied there
    atomically. In a scheduled function they do not wait, as every variable update."""
    calls: dict[int, tuple[Store, list[ops.Operation]]] = {}
    for variable, kind, value in updates:
        store, key = variable.handle
        calls.setdefault(id(store), (store, []))[1].append(
            kind(key, np.array(value, dtype=variable.dtype)))
    send_updates(list(calls.values()))
