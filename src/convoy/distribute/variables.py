"""Variables: arrays that live in a store (a parameter server, or this process), and
ShardedVariable, one logical variable split by rows over several of them.

``cv.Variable(...)`` under ``strategy.scope()`` is created by the strategy (placed on a
parameter server, or sharded); elsewhere it lives in this process. Every operation is one
call to its store, atomic there. Variables pickle as handles, so functions sent to workers
use the same parameter-server variables.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from convoy._slices import IndexedSlices, put_rows, take_rows
from convoy.distribute import _scope
from convoy.distribute._protocol import LocalStore, execute_all
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


class _Ops:
    """What Variable and ShardedVariable offer alike, on top of their ``read_value``,
    ``_update(kind, value)`` and ``_scatter(kind, delta)``."""

    def read_value(self) -> np.ndarray:
        raise NotImplementedError

    def _update(self, kind: str, value: Any) -> None:
        raise NotImplementedError

    def _scatter(self, kind: str, sparse_delta: IndexedSlices) -> None:
        raise NotImplementedError

    def numpy(self) -> np.ndarray:
        return self.read_value()

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        value = self.read_value()
        return value if dtype is None else value.astype(dtype)

    def assign(self, value: Any) -> None:
        self._update("assign", value)

    def assign_add(self, delta: Any) -> None:
        self._update("assign_add", delta)

    def assign_sub(self, delta: Any) -> None:
        self._update("assign_sub", delta)

    def scatter_add(self, sparse_delta: IndexedSlices) -> None:
        self._scatter("scatter_add", sparse_delta)

    def scatter_sub(self, sparse_delta: IndexedSlices) -> None:
        self._scatter("scatter_sub", sparse_delta)

    def scatter_update(self, sparse_delta: IndexedSlices) -> None:
        self._scatter("scatter_update", sparse_delta)


class _VariableMeta(type):
    """Inside a strategy's scope, ``Variable(...)`` is made by the strategy."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        strategy = _scope.current()
        if strategy is not None and cls is Variable:
            return strategy._create_variable(*args, **kwargs)
        return super().__call__(*args, **kwargs)


class Variable(_Ops, metaclass=_VariableMeta):
    """A named array in a store; reads and updates are single atomic store operations."""

    def __init__(self, initial_value: Any, name: str | None = None, dtype: Any = None,
                 shape: Sequence[int] | None = None, trainable: bool = True) -> None:
        value = initial_array(initial_value, dtype, shape)
        with _local_lock:
            unique = f"{name or 'Variable'}:{next(_local_names)}"
        self._bind(LocalStore(), unique, name or "Variable", value.shape, value.dtype,
                   trainable)
        self._store.execute([("create", unique, value)])

    @classmethod
    def _in_store(cls, store: Any, key: str, name: str, shape: Sequence[int], dtype: Any,
                  trainable: bool) -> Variable:
        """A handle on the variable ``key`` that already exists in ``store``."""
        variable = object.__new__(cls)
        variable._bind(store, key, name, tuple(shape), np.dtype(dtype), trainable)
        return variable

    def _bind(self, store: Any, key: str, name: str, shape: tuple[int, ...], dtype: np.dtype,
              trainable: bool) -> None:
        self._store, self._key = store, key
        self.name, self.shape, self.dtype, self.trainable = name, shape, dtype, trainable

    def __reduce__(self) -> Any:
        if isinstance(self._store, LocalStore):
            raise InvalidArgumentError(
                f"variable {self.name!r} was created outside strategy.scope(): it lives in "
                f"this process only and cannot be used by functions sent to workers; create "
                f"it inside strategy.scope()"
            )
        return (_variable_in_store, (self._store, self._key, self.name, self.shape,
                                     self.dtype.str, self.trainable))

    @property
    def device(self) -> str:
        """Where the variable lives, as a TensorFlow device string."""
        return self._store.device

    def _call(self, kind: str, *arguments: Any) -> Any:
        return self._store.execute([(kind, self._key, *arguments)])[0]

    def read_value(self) -> np.ndarray:
        """A copy of the current value."""
        return self._call("read")

    def _update(self, kind: str, value: Any) -> None:
        self._call(kind, np.asarray(value, dtype=self.dtype))

    def sparse_read(self, indices: Any) -> np.ndarray:
        """The rows ``indices`` (any shape) of the variable."""
        return self._call("gather", np.asarray(indices))

    def _scatter(self, kind: str, sparse_delta: IndexedSlices) -> None:
        delta = _checked_delta(sparse_delta, self.shape[1:])
        self._call(kind, delta.indices, delta.values)

    def __repr__(self) -> str:
        return (f"<cv.Variable '{self.name}' shape={list(self.shape)} dtype={self.dtype.name} "
                f"device={self.device}>")


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
        variables = list(variables)
        if not variables:
            raise InvalidArgumentError("ShardedVariable needs at least one variable")
        first = variables[0]
        for v in variables[1:]:
            if v.shape[1:] != first.shape[1:] or v.dtype != first.dtype:
                raise InvalidArgumentError(
                    "all shards must have the same dtype and the same shape after the first "
                    f"axis, got {[list(s.shape) for s in variables]}"
                )
        self._variables = variables
        self.name = name or first.name.rsplit("/part_", 1)[0]
        rows = [v.shape[0] for v in variables]
        self._offsets = np.cumsum([0, *rows])
        self.shape = (int(self._offsets[-1]), *first.shape[1:])
        self.dtype = first.dtype
        self.trainable = first.trainable

    def __reduce__(self) -> Any:  # just the shards: a handle pickles small and fast
        return (ShardedVariable, (self._variables, self.name))

    @property
    def variables(self) -> list[Variable]:
        return list(self._variables)

    def read_value(self) -> np.ndarray:
        """The whole value (shards concatenated), read from all shards in parallel."""
        results = execute_all([(v._store, [("read", v._key)]) for v in self._variables])
        return np.concatenate([r[0] for r in results])

    def _split(self, value: Any) -> list[np.ndarray]:
        value = np.asarray(value, dtype=self.dtype)
        if value.shape != self.shape:
            raise InvalidArgumentError(
                f"value of shape {list(value.shape)} does not match {self.name!r}'s "
                f"{list(self.shape)}"
            )
        return np.split(value, self._offsets[1:-1])

    def _update(self, kind: str, value: Any) -> None:
        parts = self._split(value)
        execute_all([(v._store, [(kind, v._key, p)]) for v, p in zip(self._variables, parts)])

    def route(self, ids: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """For each shard that owns some of ``ids`` (flat): (shard, positions, local rows)."""
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
        return routes

    def sparse_read(self, indices: Any) -> np.ndarray:
        """Rows ``indices`` (any shape), each fetched from the shard that owns it, in parallel."""
        ids = np.asarray(indices)
        flat = ids.reshape(-1)
        out = np.empty((flat.size, *self.shape[1:]), self.dtype)
        routes = self.route(flat)
        results = execute_all([(self._variables[s]._store,
                                [("gather", self._variables[s]._key, rows)])
                               for s, _, rows in routes])
        for (_, positions, _), result in zip(routes, results):
            put_rows(out, positions, result[0])
        return out.reshape((*ids.shape, *self.shape[1:]))

    def _scatter(self, kind: str, sparse_delta: IndexedSlices) -> None:
        delta = _checked_delta(sparse_delta, self.shape[1:])
        flat = delta.indices.reshape(-1)
        values = delta.values.reshape((flat.size, *self.shape[1:]))
        execute_all([(self._variables[s]._store,
                      [(kind, self._variables[s]._key, rows, take_rows(values, positions))])
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


