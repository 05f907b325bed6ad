"""The operations a variable store runs: one typed constructor for each kind.

Every read and update of a variable, on a parameter server or in this process, is a list of
these, run atomically by :meth:`convoy.distribute._store.VariableStore.execute`. They are
NamedTuples: they pickle small and build fast, as a training step sends several per call.
``key`` is the variable's name in its store.

To add an operation, define its NamedTuple under :func:`_operation` (its kind names it in
metrics and errors; ``read_only`` if it changes nothing, so reads ahead may pass it), then give
it a handler in ``convoy.distribute._store._HANDLERS``, called with the store and the
operation's fields; a store refuses an operation it has no handler for, and a test checks
that every registered kind has one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import numpy as np

#: An instance of a class registered with :func:`_operation` (they are NamedTuples).
Operation = tuple[Any, ...]

#: Each operation class's kind (its name in metrics and errors).
KINDS: dict[type, str] = {}
#: The operation classes that change nothing in a store.
READ_ONLY: set[type] = set()

_T = TypeVar("_T", bound=type)


def _operation(kind: str, read_only: bool = False) -> Callable[[_T], _T]:
    def register(cls: _T) -> _T:
        KINDS[cls] = kind
        if read_only:
            READ_ONLY.add(cls)
        return cls

    return register


def kind_of(operation: Any) -> str:
    """The kind of ``operation`` (``"read"``, ``"scatter_add"``...), or its type's name if it
    is no operation."""
    return KINDS.get(type(operation)) or type(operation).__name__


@_operation("create")
class Create(NamedTuple):
    """Make variable ``key`` with ``value``; with ``exist_ok``, a variable of that shape and
    dtype already there is kept (a coordinator making its variables again)."""

    key: str
    value: np.ndarray
    exist_ok: bool = False


@_operation("read", read_only=True)
class Read(NamedTuple):
    """A copy of the whole value of ``key``."""

    key: str


@_operation("gather", read_only=True)
class Gather(NamedTuple):
    """Rows ``indices`` (integers, any shape) of ``key``."""

    key: str
    indices: np.ndarray


@_operation("assign")
class Assign(NamedTuple):
    """Set ``key`` to ``value`` (of its shape)."""

    key: str
    value: Any


@_operation("assign_add")
class AssignAdd(NamedTuple):
    """Add ``delta`` (of the variable's shape) to ``key``."""

    key: str
    delta: Any


@_operation("assign_sub")
class AssignSub(NamedTuple):
    """Subtract ``delta`` (of the variable's shape) from ``key``."""

    key: str
    delta: Any


@_operation("scatter_add")
class ScatterAdd(NamedTuple):
    """Add ``values`` to rows ``indices`` of ``key`` (a row named twice gets both)."""

    key: str
    indices: np.ndarray
    values: np.ndarray


@_operation("scatter_sub")
class ScatterSub(NamedTuple):
    """Subtract ``values`` from rows ``indices`` of ``key``."""

    key: str
    indices: np.ndarray
    values: np.ndarray


@_operation("scatter_update")
class ScatterUpdate(NamedTuple):
    """Set rows ``indices`` of ``key`` to ``values``."""

    key: str
    indices: np.ndarray
    values: np.ndarray


@_operation("scatter_mul")
class ScatterMul(NamedTuple):
    """Multiply rows ``indices`` of ``key`` by ``values``."""

    key: str
    indices: np.ndarray
    values: np.ndarray


@_operation("scatter_div")
class ScatterDiv(NamedTuple):
    """Divide rows ``indices`` of ``key`` by ``values`` (integers truncate toward zero)."""

    key: str
    indices: np.ndarray
    values: np.ndarray


@_operation("scatter_min")
class ScatterMin(NamedTuple):
    """Rows ``indices`` of ``key`` become their minimum with ``values``."""

    key: str
    indices: np.ndarray
    values: np.ndarray


@_operation("scatter_max")
class ScatterMax(NamedTuple):
    """Rows ``indices`` of ``key`` become their maximum with ``values``."""

    key: str
    indices: np.ndarray
    values: np.ndarray


@_operation("apply")
class Apply(NamedTuple):
    """Apply gradients with an optimizer: ``updates`` holds ``(key, gradient)`` pairs, a
    gradient a dense array or an IndexedSlices; ``optimizer`` is ``Optimizer.config``."""

    optimizer: dict[str, Any]
    updates: list[tuple[str, Any]]


@_operation("slots", read_only=True)
class Slots(NamedTuple):
    """Copies of the optimizer slots of ``key``, by slot name."""

    key: str


@_operation("set_slot")
class SetSlot(NamedTuple):
    """Set optimizer slot ``slot`` of ``key`` to ``value`` (a checkpoint's)."""

    key: str
    slot: str
    value: np.ndarray


# ----- dynamic embedding tables (rows by int64 id, made on first lookup) --------------

@_operation("table_create")
class TableCreate(NamedTuple):
    """Make table ``key`` (``config``: DynamicRows's arguments); with ``exist_ok``, one of the
    same ``dim`` and dtype already there is kept."""

    key: str
    config: dict[str, Any]
    exist_ok: bool = False


@_operation("table_lookup", read_only=True)
class TableLookup(NamedTuple):
    """The rows of ``ids`` (int64, flat) of dynamic table ``key``, made where missing. It
    changes no variable a whole read sees, so reads ahead may pass it."""

    key: str
    ids: np.ndarray


@_operation("table_stats", read_only=True)
class TableStats(NamedTuple):
    """Table ``key``'s rows held, evictions so far and bytes of ids, rows and slots."""

    key: str


@_operation("table_keys", read_only=True)
class TableKeys(NamedTuple):
    """The ids of the rows table ``key`` holds."""

    key: str


@_operation("table_export", read_only=True)
class TableExport(NamedTuple):
    """Copies of table ``key``'s ids, rows, slots and per-table optimizer state."""

    key: str


@_operation("table_import")
class TableImport(NamedTuple):
    """Set the rows and slots of ``state``'s ids in table ``key`` (an export's dict, perhaps
    a part of one), and its per-table optimizer state; with ``replace``, the table holds
    nothing else after (a checkpoint restored)."""

    key: str
    state: dict[str, Any]
    replace: bool = False


#: The update kinds a variable offers as ``assign*`` (a whole new value or delta).
WholeUpdate = type[Assign] | type[AssignAdd] | type[AssignSub]
#: The update kinds a variable offers as ``scatter_*`` (rows by index).
RowUpdate = (type[ScatterAdd] | type[ScatterSub] | type[ScatterUpdate] | type[ScatterMul]
             | type[ScatterDiv] | type[ScatterMin] | type[ScatterMax])
