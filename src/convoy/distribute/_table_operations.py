"""The store's handlers of the dynamic-table operations (``ops.TableCreate``...): they run
under the store's lock with its ``tables`` (key -> :class:`DynamicRows`)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from convoy import monitoring
from convoy.distribute import _operations as ops
from convoy.distribute._dynamic_rows import DynamicRows
from convoy.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
_MMAP_AT = 1 << 20


@functools.cache
def _return_large_blocks() -> None:
    """Fix glibc's mmap threshold at 1 MiB, once per process that holds tables.

    glibc raises the threshold past any mmap'd block freed (up to 32 MiB), after which a
    lookup's multi-megabyte temporaries (answers, new rows) come from the heap and its
    freed space is rarely returned: a store making a million rows then held ~1.8x their
    bytes. With the threshold fixed, blocks of 1 MiB and more go back to the OS when freed.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_AT)
    except (OSError, AttributeError):  # not glibc: its allocator has its own policy
        pass


def table(store: Any, key: str) -> DynamicRows:
    """Table ``key`` of ``store``."""
    rows = store.tables.get(key)
    if rows is None:
        raise NotFoundError(f"dynamic table {key!r} does not exist on this store")
    return cast(DynamicRows, rows)


def _create(store: Any, key: str, config: dict[str, Any], exist_ok: bool = False) -> None:
    if type(config) is not dict:
        raise InvalidArgumentError(f"table_create takes a config dict, got "
                                   f"{type(config).__name__}")
    existing = store.tables.get(key)
    if existing is not None:
        if exist_ok and existing.dim == config.get("dim") and \
                existing.dtype == np.dtype(config.get("dtype", np.float32)):
            return
        raise AlreadyExistsError(f"dynamic table {key!r} exists already")
    if key in store.values:
        raise AlreadyExistsError(f"{key!r} names a variable already")
    _return_large_blocks()
    store.tables[key] = DynamicRows(**config)


def _lookup(store: Any, key: str, ids: Any) -> np.ndarray:
    rows = table(store, key)
    before = rows.evictions
    values = rows.lookup(ids)
    _count(key, rows, before)
    return values


def _count(key: str, rows: DynamicRows, evictions_before: int) -> None:
    """Update the metrics of table ``key`` after a change."""
    if rows.evictions != evictions_before:
        monitoring.PS_EMBEDDING_EVICTIONS.labels(key).inc(rows.evictions - evictions_before)
    monitoring.PS_EMBEDDING_ROWS.labels(key).set(rows.size())


def _stats(store: Any, key: str) -> dict[str, int]:
    rows = table(store, key)
    return {"rows": rows.size(), "evictions": rows.evictions, "bytes": rows.nbytes()}


def _keys(store: Any, key: str) -> np.ndarray:
    return table(store, key).keys()


def _export(store: Any, key: str) -> dict[str, Any]:
    return table(store, key).export()


def _import(store: Any, key: str, state: dict[str, Any], replace: bool = False) -> None:
    rows = table(store, key)
    if type(state) is not dict or "ids" not in state or "rows" not in state:
        raise InvalidArgumentError("table_import takes a dict with 'ids' and 'rows'")
    if replace:
        rows = store.tables[key] = rows.emptied()
    before = rows.evictions
    rows.load(state["ids"], state["rows"], state.get("slots"), state.get("slot_initial"))
    _count(key, rows, before)
    for name, value in (state.get("scalars") or {}).items():
        rows.scalars[name] = np.array(value, copy=True)


HANDLERS: dict[type, Callable[..., Any]] = {
    ops.TableCreate: _create, ops.TableLookup: _lookup, ops.TableStats: _stats,
    ops.TableKeys: _keys, ops.TableExport: _export, ops.TableImport: _import,
}
