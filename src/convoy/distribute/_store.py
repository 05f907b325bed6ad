"""The variable store: named numpy arrays, their optimizer slots, and the operations on them.

A parameter server hosts one store behind gRPC (:func:`serve_operations` answers its
``Execute``); a variable created outside a strategy's scope lives in an in-process store.
Either way every access is a list of operations (:mod:`convoy.distribute._operations`) run by
:meth:`VariableStore.execute` atomically (under one lock), so one RPC per store carries all of
a training step's reads, or all of its updates. ``_HANDLERS`` maps each operation class to the
method that runs it.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from convoy import monitoring
from convoy._transport.rpc import Outcome
from convoy._values.slices import combine_rows, put_rows, take_rows
from convoy.distribute import _operations as ops
from convoy.distribute import _wire
from convoy.distribute._dynamic_rows import DynamicRows
from convoy.distribute._sparse_rows import gather
from convoy.distribute._table_operations import HANDLERS as TABLE_HANDLERS
from convoy.distribute._updates import add_rows, apply_rule, checked_rule
from convoy.errors import (
    AlreadyExistsError,
    ConvoyError,
    InvalidArgumentError,
    NotFoundError,
    UnknownError,
)

log = logging.getLogger(__name__)


class VariableStore:
    """Named arrays and slots, changed only through :meth:`execute`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.values: dict[str, np.ndarray] = {}
        self.slots: dict[tuple[str, str], np.ndarray] = {}
        self.tables: dict[str, DynamicRows] = {}  # dynamic embedding tables

    def execute(self, operations: Sequence[ops.Operation]) -> list[Any]:
        """Run ``operations`` in order, atomically; returns one result per operation.

        If one fails, the ones before it have been applied and its error is raised.
        """
        with self._lock:
            return [self._run(operation) for operation in operations]

    def sizes(self) -> list[dict[str, Any]]:
        """Each variable's name, shape, dtype and bytes (its slots' bytes included)."""
        with self._lock:
            slot_bytes: dict[str, int] = {}
            for (name, _), slot in self.slots.items():
                slot_bytes[name] = slot_bytes.get(name, 0) + slot.nbytes
            return [{"name": name, "shape": list(value.shape), "dtype": str(value.dtype),
                     "bytes": value.nbytes, "slot_bytes": slot_bytes.get(name, 0)}
                    for name, value in sorted(self.values.items())]

    def table_sizes(self) -> list[dict[str, Any]]:
        """Each dynamic table's name, row width, dtype, rows held, evictions and bytes of
        ids, rows and slots."""
        with self._lock:
            return [{"name": name, "dim": rows.dim, "dtype": str(rows.dtype),
                     "rows": rows.size(), "evictions": rows.evictions, "bytes": rows.nbytes()}
                    for name, rows in sorted(self.tables.items())]

    def _run(self, operation: ops.Operation) -> Any:
        handler = _HANDLERS.get(type(operation))
        if handler is None:
            raise InvalidArgumentError(
                f"unknown variable operation {operation!r:.100}; known: "
                f"{sorted(ops.KINDS.values())}")
        key = getattr(operation, "key", "")  # an Apply names its variables in its updates
        if type(key) is not str:
            raise InvalidArgumentError(f"variable operation {ops.kind_of(operation)!r} names a "
                                       f"variable with a str, got {type(key).__name__}")
        try:
            return handler(self, *operation)
        except (TypeError, ValueError) as error:  # arrays numpy cannot use as asked
            if isinstance(error, InvalidArgumentError):
                raise
            raise InvalidArgumentError(f"variable operation {ops.kind_of(operation)!r} on "
                                       f"{operation[0]!r:.100}: {type(error).__name__}: "
                                       f"{error}") from error

    def value(self, name: str) -> np.ndarray:
        array = self.values.get(name)
        if array is None:
            raise NotFoundError(f"variable {name!r} does not exist on this store")
        return array

    def _create(self, name: str, value: np.ndarray, exist_ok: bool = False) -> None:
        if name in self.values:
            existing = self.values[name]
            if exist_ok and existing.shape == value.shape and existing.dtype == value.dtype:
                return  # a coordinator re-creating its variables after a restart
            raise AlreadyExistsError(f"variable {name!r} exists already")
        self.values[name] = _numeric(f"the value of {name!r}", value)

    def _read(self, name: str) -> np.ndarray:
        return self.value(name).copy()

    def _same_shape(self, kind: str, name: str, value: Any) -> tuple[np.ndarray, np.ndarray]:
        """The variable and ``value`` as an array of its dtype, which must have its shape."""
        target = self.value(name)
        value = np.asarray(value, dtype=target.dtype)
        if value.shape != target.shape:  # no broadcasting, as an assign_add in TensorFlow
            raise InvalidArgumentError(
                f"{kind} to {name!r}: shape {list(value.shape)} does not match the variable's "
                f"{list(target.shape)}"
            )
        return target, value

    def _assign(self, name: str, value: Any) -> None:
        target, value = self._same_shape("assign", name, value)
        target[...] = value

    def _assign_add(self, name: str, delta: Any) -> None:
        target, delta = self._same_shape("assign_add", name, delta)
        target += delta

    def _assign_sub(self, name: str, delta: Any) -> None:
        target, delta = self._same_shape("assign_sub", name, delta)
        target -= delta

    def _rows(self, name: str, indices: Any) -> tuple[np.ndarray, np.ndarray]:
        target = self.value(name)
        indices = np.asarray(indices)
        if indices.dtype.kind not in "iu":
            raise InvalidArgumentError(f"indices for {name!r} must be integers, got "
                                       f"{indices.dtype}")
        if indices.size and (indices.min() < 0 or indices.max() >= target.shape[0]):
            raise InvalidArgumentError(
                f"indices for {name!r} must be in [0, {target.shape[0]}), got values from "
                f"{indices.min()} to {indices.max()}"
            )
        return target, indices

    def _gather(self, name: str, indices: Any) -> np.ndarray:
        target, indices = self._rows(name, indices)
        return gather_rows(target, indices)

    def _scatter(self, name: str, indices: Any, values: Any,
                 combine: Callable[[np.ndarray, np.ndarray, np.ndarray], None],
                 scale: float | None = None) -> None:
        """``combine`` the rows into the variable; one that adds ``scale`` times each row
        may give that instead (a compiled loop where the dtype allows)."""
        target, indices = self._rows(name, indices)
        values = np.asarray(values, dtype=target.dtype)
        expected = indices.shape + target.shape[1:]
        if values.shape != expected:
            raise InvalidArgumentError(
                f"scatter into {name!r}: values of shape {list(values.shape)} do not match "
                f"indices of shape {list(indices.shape)} (expected {list(expected)})"
            )
        if scale is None or not add_rows(target, indices, values, scale):
            combine(target, indices, values)

    def _scatter_add(self, name: str, indices: Any, values: Any) -> None:
        self._scatter(name, indices, values, _ADD_AT, 1.0)

    def _scatter_sub(self, name: str, indices: Any, values: Any) -> None:
        self._scatter(name, indices, values, _SUBTRACT_AT, -1.0)

    def _scatter_update(self, name: str, indices: Any, values: Any) -> None:
        self._scatter(name, indices, values, put_rows)

    def _scatter_mul(self, name: str, indices: Any, values: Any) -> None:
        self._scatter(name, indices, values, _MULTIPLY_AT)

    def _scatter_div(self, name: str, indices: Any, values: Any) -> None:
        self._scatter(name, indices, values, _divide_at)

    def _scatter_min(self, name: str, indices: Any, values: Any) -> None:
        self._scatter(name, indices, values, _MINIMUM_AT)

    def _scatter_max(self, name: str, indices: Any, values: Any) -> None:
        self._scatter(name, indices, values, _MAXIMUM_AT)

    def _apply(self, optimizer: dict[str, Any], updates: list[tuple[str, Any]]) -> None:
        if type(optimizer) is not dict:
            raise InvalidArgumentError(f"apply takes an optimizer config dict, got "
                                       f"{type(optimizer).__name__}")
        rule = checked_rule(optimizer)
        for name, gradient in updates:
            table = self.tables.get(name)
            if table is not None:
                table.apply(functools.partial(apply_rule, rule, optimizer), gradient)
                continue
            apply_rule(rule, optimizer, self.value(name), gradient,
                       functools.partial(self._slot, name))

    def _slot(self, name: str, slot: str, like: np.ndarray, initial: float) -> np.ndarray:
        key = (name, slot)
        if key not in self.slots:
            self.slots[key] = np.full_like(like, initial)
        return self.slots[key]

    def _slots_of(self, name: str) -> dict[str, np.ndarray]:
        """The optimizer slots of variable ``name``, by slot name."""
        self.value(name)
        return {slot: value.copy() for (v, slot), value in self.slots.items() if v == name}

    def _set_slot(self, name: str, slot: str, value: Any) -> None:
        self.value(name)
        self.slots[(name, slot)] = _numeric(f"slot {slot!r} of {name!r}", value)


#: ``ufunc.at`` as whole rows where it can (see :func:`combine_rows`), built once.
_ADD_AT = functools.partial(combine_rows, np.add)
_SUBTRACT_AT = functools.partial(combine_rows, np.subtract)
_MULTIPLY_AT = functools.partial(combine_rows, np.multiply)
_MINIMUM_AT = functools.partial(combine_rows, np.minimum)
_MAXIMUM_AT = functools.partial(combine_rows, np.maximum)


def _divide_at(target: np.ndarray, indices: np.ndarray, values: np.ndarray) -> None:
    """``target[i] /= v`` for each index and value in turn; integers divide truncating
    toward zero, as TensorFlow's ScatterDiv does (dividing by a product of divisors once
    equals dividing by each in turn)."""
    if target.dtype.kind not in "iu":
        combine_rows(np.divide, target, indices, values)
        return
    rows, position = np.unique(indices.reshape(-1), return_inverse=True)
    divisors = np.ones((rows.size, *target.shape[1:]), target.dtype)
    np.multiply.at(divisors, position, values.reshape((position.size, *target.shape[1:])))
    if not divisors.all():
        raise InvalidArgumentError("scatter_div: integer division by zero")
    dividends = take_rows(target, rows)
    quotients = np.abs(dividends) // np.abs(divisors)
    put_rows(target, rows, np.where((dividends < 0) != (divisors < 0), -quotients, quotients))


def gather_rows(source: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``source[rows]`` for integer ``rows`` within bounds; compiled for a contiguous array of
    numbers (a training step's rows, scattered over a table larger than the caches, are
    fetched ahead)."""
    if not source.flags.c_contiguous or source.ndim < 1 or source.dtype.hasobject:
        return take_rows(source, rows)
    out = np.empty((*rows.shape, *source.shape[1:]), source.dtype)
    gather(source, np.ascontiguousarray(rows, dtype=np.int64).reshape(-1), out)
    return out


def _numeric(what: str, value: Any) -> np.ndarray:
    array = np.array(value, copy=True)
    if array.dtype.kind not in "biufc":
        raise InvalidArgumentError(f"{what} must be a numeric or boolean array, got dtype "
                                   f"{array.dtype}")
    return array


#: The method that runs each operation, called with the operation's fields.
_HANDLERS: dict[type, Callable[..., Any]] = {
    ops.Create: VariableStore._create,
    ops.Read: VariableStore._read,
    ops.Assign: VariableStore._assign,
    ops.AssignAdd: VariableStore._assign_add,
    ops.AssignSub: VariableStore._assign_sub,
    ops.Gather: VariableStore._gather,
    ops.ScatterAdd: VariableStore._scatter_add,
    ops.ScatterSub: VariableStore._scatter_sub,
    ops.ScatterUpdate: VariableStore._scatter_update,
    ops.ScatterMul: VariableStore._scatter_mul,
    ops.ScatterDiv: VariableStore._scatter_div,
    ops.ScatterMin: VariableStore._scatter_min,
    ops.ScatterMax: VariableStore._scatter_max,
    ops.Apply: VariableStore._apply,
    ops.Slots: VariableStore._slots_of,
    ops.SetSlot: VariableStore._set_slot,
    **TABLE_HANDLERS,
}


def serve_operations(store: VariableStore, request: bytes | memoryview) -> bytes:
    """A parameter server's ``Execute``: run each operation list of the request atomically,
    in order, and answer each one's :class:`Outcome` (its results, or its error)."""
    lists = _wire.load_operation_lists(request)
    answer = _wire.encode([_execute(store, operations) for operations in lists])
    _count(lists, len(request), len(answer))
    return answer


#: The metric of each operation kind (labels resolved once: a lookup per operation).
_COUNTERS = {cls: monitoring.PS_OPERATIONS.labels(kind) for cls, kind in ops.KINDS.items()}
_RECEIVED, _SENT = monitoring.PS_BYTES.labels("received"), monitoring.PS_BYTES.labels("sent")


def _count(lists: list[Any], received: int, sent: int) -> None:
    """Add an ``Execute``'s operations and bytes to the metrics."""
    kinds = collections.Counter(type(operation) for operations in lists
                                if type(operations) is list for operation in operations)
    for cls, count in kinds.items():
        counter = _COUNTERS.get(cls)
        if counter is not None:
            counter.inc(count)
    _RECEIVED.inc(received)
    _SENT.inc(sent)


def _execute(store: VariableStore, operations: Any) -> Outcome:
    try:
        if type(operations) is not list:
            raise InvalidArgumentError(f"operations must be a list, got "
                                       f"{type(operations).__name__}")
        return Outcome(store.execute(operations))
    except ConvoyError as error:
        return Outcome(error=error)
    except Exception as error:
        log.exception("a variable operation failed")
        return Outcome(error=UnknownError(f"{type(error).__name__}: {error}"))
