"""A dynamic embedding table's rows on one store: rows made on first lookup of their id.

:class:`DynamicRows` maps int64 ids (0 to 2**63 - 1) to rows of preallocated numpy storage
through an open-addressing hash index (linear probing, at most half full; searched and filled
by compiled code, ``_row_index.cpp``), so a row costs its id, its values and its optimizer
slots plus 8 to 16 bytes of index, not a Python object.
Storage grows by doubling into uninitialised memory: pages never written take no memory.
With ``max_rows``, a lookup that would exceed it first evicts the least recently (``"lru"``)
or least frequently (``"lfu"``) looked-up rows, with their slots.

A new row's values come from its initializer, a function of the id and the table's seed
alone (:class:`RowInitializer`), so a retried lookup, or one on another store after a
restore, makes the same row.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from convoy._values.slices import IndexedSlices, put_rows, take_rows
from convoy.distribute._row_index import insert as _index_insert
from convoy.distribute._row_index import probe as _index_probe
from convoy.errors import InvalidArgumentError

_EMPTY, _TOMBSTONE = -1, -2
_LOW = (1 << 32) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
EVICTION_POLICIES = ("lru", "lfu")


def mix64(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser of each uint64: a bijection whose bits all depend on all bits."""
    z = values.astype(np.uint64, copy=True)
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


def checked_ids(ids: Any, argument: str = "ids") -> np.ndarray:
    """``ids`` as a flat int64 array, each in [0, 2**63 - 1]."""
    array = np.asarray(ids)
    if array.dtype.kind not in "iu" or array.dtype == np.uint64 and array.size and \
            int(array.max()) > np.iinfo(np.int64).max:
        raise InvalidArgumentError(f"{argument} must be integers in [0, 2**63 - 1], got dtype "
                                   f"{array.dtype}")
    array = array.reshape(-1).astype(np.int64, copy=False)
    if array.size and int(array.min()) < 0:
        raise InvalidArgumentError(f"{argument} must be non-negative, got {int(array.min())}")
    return array


@dataclass(frozen=True)
class RowInitializer:
    """The first values of a row: ``"normal"`` (mean ``a``, standard deviation ``b``),
    ``"uniform"`` (in [``a``, ``b``)) or ``"constant"`` (``a``), drawn from a counter-based
    generator keyed by ``seed`` and the id (the same row for the same id and seed)."""

    kind: str = "normal"
    a: float = 0.0
    b: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("normal", "uniform", "constant"):
            raise InvalidArgumentError(f"initializer kind must be 'normal', 'uniform' or "
                                       f"'constant', got {self.kind!r}")

    def __call__(self, ids: np.ndarray, dim: int) -> np.ndarray:
        """Rows for ``ids`` (int64, shape [n]), shape [n, dim]."""
        if self.kind == "constant":
            return np.full((ids.size, dim), self.a, np.float32)
        # one 64-bit hash per pair of values: two 24-bit uniforms, (u1, u2)
        pairs = (dim + 1) // 2
        key = mix64(ids.astype(np.uint64) ^ mix64(np.array([self.seed], np.uint64)))
        counters = (np.arange(1, pairs + 1, dtype=np.uint64) * _GOLDEN)[None, :]
        bits = mix64(key[:, None] + counters)
        scale = np.float32(1.0 / (1 << 24))
        u1 = (bits >> np.uint64(40)).astype(np.float32) * scale
        u2 = (bits & np.uint64(0xFFFFFF)).astype(np.float32) * scale
        if self.kind == "uniform":
            values = np.concatenate([u1, u2], axis=1)
            return self.a + (self.b - self.a) * values[:, :dim]
        # Box-Muller: two normals per pair of uniforms
        radius = np.sqrt(np.float32(-2.0) * np.log(np.float32(1.0) - u1))  # 1 - u1 in (0, 1]
        angle = np.float32(2.0 * math.pi) * u2
        values = np.concatenate([radius * np.cos(angle), radius * np.sin(angle)], axis=1)
        return self.a + self.b * values[:, :dim]


Initializer = Callable[[np.ndarray, int], Any]


class DynamicRows:
    """Rows of width ``dim`` by int64 id, created on first lookup; their optimizer slots.

    Not thread-safe: the store runs every operation under its lock.
    """

    def __init__(self, dim: int, dtype: Any = np.float32, *,
                 initializer: Initializer | None = None, max_rows: int | None = None,
                 eviction: str | None = None, capacity: int = 1024) -> None:
        if type(dim) is not int or dim < 1:
            raise InvalidArgumentError(f"dim must be a positive int, got {dim!r}")
        self.dim = dim
        self.dtype = np.dtype(dtype)
        if self.dtype.kind != "f":
            raise InvalidArgumentError(f"dtype must be a float dtype, got {self.dtype}")
        self.max_rows, self.eviction = checked_bound(max_rows, eviction)
        self.initializer: Initializer = initializer or RowInitializer()
        capacity = max(16, capacity if self.max_rows is None else min(capacity, self.max_rows))
        self.ids = np.empty(capacity, np.int64)  # a row's id, or -1 when free
        self.rows = np.empty((capacity, dim), self.dtype)
        self.slots: dict[str, np.ndarray] = {}  # per-row optimizer state, shaped as rows
        self.slot_initial: dict[str, float] = {}
        self.scalars: dict[str, np.ndarray] = {}  # per-table optimizer state (a step count)
        self._high = 0  # rows [0, _high) have been handed out at least once
        self._free = np.empty(0, np.int64)  # freed rows below _high, reused first
        self._count = 0
        self._index: np.ndarray = np.full(_index_size(capacity), _EMPTY,
                                          np.int32 if capacity < 2**31 else np.int64)
        self._used = 0  # index positions not empty (rows and tombstones)
        self._tick = 0
        self._seen = np.empty(capacity, np.int64) if self.eviction else None  # last tick / hits
        self.evictions = 0

    def emptied(self) -> DynamicRows:
        """A table of the same configuration holding no rows (nor optimizer state)."""
        return DynamicRows(self.dim, self.dtype, initializer=self.initializer,
                           max_rows=self.max_rows, eviction=self.eviction)

    # Lookup and creation.

    def size(self) -> int:
        """How many rows the table holds."""
        return self._count

    def keys(self) -> np.ndarray:
        """The ids of the rows held, in no particular order."""
        live = self.ids[:self._high]
        return live[live >= 0].copy()

    def find(self, ids: np.ndarray) -> np.ndarray:
        """The row index of each id (int64 array), -1 where the table has none."""
        return self._probe(ids)[0]

    def lookup(self, ids: Any) -> np.ndarray:
        """The rows of ``ids`` (any shape), created where missing; shape ``ids.shape +
        (dim,)``."""
        shape = np.shape(ids)
        flat = checked_ids(ids)
        if _increasing(flat):  # distinct already (a client's lookups are)
            rows = self.rows_of(flat)  # first: it may grow the storage
            return take_rows(self.rows, rows).reshape((*shape, self.dim))
        unique, inverse = np.unique(flat, return_inverse=True)
        rows = self.rows_of(unique)
        return take_rows(self.rows, rows[inverse]).reshape((*shape, self.dim))

    def rows_of(self, unique: np.ndarray) -> np.ndarray:
        """The row indices of the distinct ids ``unique``, rows created where missing (after
        evicting others if ``max_rows`` requires it); the rows count as used now."""
        found, _ = self._probe(unique)
        missing = found < 0
        self._tick += 1
        if self._seen is not None:
            self._touch(found[~missing])
        if missing.any():
            new_ids = unique[missing]
            found[missing] = self._insert(new_ids, protect=found[~missing])
        return found

    def _touch(self, rows: np.ndarray) -> None:
        assert self._seen is not None
        if self.eviction == "lru":
            self._seen[rows] = self._tick
        else:  # lookups counted in the high bits, the last one's tick in the low: ties go LRU
            self._seen[rows] = (((self._seen[rows] >> 32) + 1) << 32) | (self._tick & _LOW)

    def _probe(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row of each id or -1, the index position where its search ended)."""
        found = np.empty(ids.size, np.int64)
        position = np.empty(ids.size, np.int64)
        _index_probe(self._index, self.ids, np.ascontiguousarray(ids, np.int64), found, position)
        return found, position

    def _insert(self, ids: np.ndarray, protect: np.ndarray) -> np.ndarray:
        """Rows for the distinct ids ``ids`` (none in the table), initialised, slots reset."""
        if self.max_rows is not None:
            if ids.size > self.max_rows:
                raise InvalidArgumentError(
                    f"one lookup needs {ids.size} new rows, more than the table's max_rows "
                    f"{self.max_rows}")
            excess = self._count + ids.size - self.max_rows
            if excess > 0:
                self._evict(excess, protect)
        if 2 * (self._used + ids.size) > self._index.size:
            self._rebuild(2 * (self._count + ids.size))
        rows = self._allocate(ids.size)
        self.ids[rows] = ids
        put_rows(self.rows, rows, np.asarray(self.initializer(ids, self.dim), self.dtype)
                 .reshape(ids.size, self.dim))
        for name, slot in self.slots.items():
            put_rows(slot, rows, np.full((rows.size, self.dim), self.slot_initial[name],
                                         slot.dtype))
        if self._seen is not None:
            self._seen[rows] = self._tick if self.eviction == "lru" else \
                (1 << 32) | (self._tick & _LOW)
        self._count += ids.size
        self._index_rows(ids, rows)
        return rows

    def _allocate(self, n: int) -> np.ndarray:
        reused = self._free[-n:] if n else self._free[:0]
        self._free = self._free[:self._free.size - reused.size]
        fresh = n - reused.size
        if self._high + fresh > self.ids.size:
            self._grow(max(self.ids.size * 2, self._high + fresh))
        rows = np.concatenate([reused, np.arange(self._high, self._high + fresh)])
        self._high += fresh
        return rows

    def _grow(self, capacity: int) -> None:
        if self.max_rows is not None:
            capacity = min(capacity, self.max_rows)
        self.ids = _grown(self.ids, capacity, self._high)
        self.rows = _grown(self.rows, capacity, self._high)
        self.slots = {name: _grown(slot, capacity, self._high)
                      for name, slot in self.slots.items()}
        if self._seen is not None:
            self._seen = _grown(self._seen, capacity, self._high)

    def _index_rows(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Put ``rows`` (of the distinct ``ids``, absent from the index) into the index, which
        has room for them."""
        self._used += _index_insert(self._index, np.ascontiguousarray(ids, np.int64),
                                    np.ascontiguousarray(rows, np.int64))

    def _rebuild(self, at_least: int) -> None:
        """A new index of the rows held, with room for ``at_least`` // 2 entries at half load."""
        live = np.flatnonzero(self.ids[:self._high] >= 0)
        self._index = np.full(_index_size(max(at_least, 16) // 2), _EMPTY,
                              np.int32 if self.ids.size < 2**31 else np.int64)
        self._used = 0
        self._index_rows(self.ids[live], live)

    def _evict(self, n: int, protect: np.ndarray) -> None:
        """Remove the ``n`` least recently / frequently used rows not in ``protect``."""
        if self._seen is None:
            raise InvalidArgumentError(f"the table holds its max_rows {self.max_rows} rows and "
                                       f"has no eviction policy to make room")
        live = np.flatnonzero(self.ids[:self._high] >= 0)
        score = self._seen[live].copy()
        score[np.isin(live, protect)] = np.iinfo(np.int64).max
        victims = live[np.argpartition(score, n - 1)[:n]] if n < live.size else live
        self.remove(victims)
        self.evictions += victims.size

    def remove(self, rows: np.ndarray) -> None:
        """Free the rows ``rows`` (indices of rows held) and their slots."""
        _, position = self._probe(self.ids[rows])
        self._index[position] = _TOMBSTONE
        self.ids[rows] = -1
        self._free = np.concatenate([self._free, rows])
        self._count -= rows.size

    # Optimizer updates, export and import.

    def slot(self, name: str, like: np.ndarray, initial: float) -> np.ndarray:
        """Optimizer state ``name``: per row when ``like`` is the rows, else one per table."""
        if like is self.rows:
            if name not in self.slots:
                self.slot_initial[name] = initial
                self.slots[name] = array = np.empty_like(self.rows)
                array[:self._high] = initial
            return self.slots[name]
        if name not in self.scalars:
            self.scalars[name] = np.full_like(like, initial)
        return self.scalars[name]

    def apply(self, update: Callable[..., None], gradient: IndexedSlices) -> None:
        """Apply ``update(variable, gradient, slot)`` (an optimizer's sparse rule) to the rows
        of ``gradient.indices`` (ids), creating missing ones."""
        ids = checked_ids(gradient.indices, "gradient ids")
        values = np.asarray(gradient.values, dtype=self.dtype).reshape(ids.size, self.dim)
        if _increasing(ids):  # distinct already (a module's gradients are, one per id)
            rows = self.rows_of(ids)
        else:
            unique, inverse = np.unique(ids, return_inverse=True)
            rows = self.rows_of(unique)[inverse]
        update(self.rows, IndexedSlices(values, rows), self.slot)

    def export(self) -> dict[str, Any]:
        """The ids, rows and slots held (copies), and the per-table state."""
        live = np.flatnonzero(self.ids[:self._high] >= 0)
        return {"ids": take_rows(self.ids, live), "rows": take_rows(self.rows, live),
                "slots": {name: take_rows(slot, live) for name, slot in self.slots.items()},
                "slot_initial": dict(self.slot_initial),
                "scalars": {name: value.copy() for name, value in self.scalars.items()}}

    def load(self, ids: Any, rows: Any, slots: dict[str, Any] | None = None,
             slot_initial: dict[str, float] | None = None) -> None:
        """Set the rows (and slots) of ``ids``, creating them where missing."""
        ids = checked_ids(ids)
        unique, first = np.unique(ids, return_index=True)
        if unique.size != ids.size:
            raise InvalidArgumentError("ids to load must be distinct")
        rows = np.asarray(rows, self.dtype).reshape(ids.size, self.dim)
        for name, initial in (slot_initial or {}).items():
            self.slot(name, self.rows, initial)
        at = self.rows_of(ids)
        put_rows(self.rows, at, rows)
        for name, values in (slots or {}).items():
            if name not in self.slots:
                raise InvalidArgumentError(f"slot {name!r} has no initial value to load with")
            put_rows(self.slots[name], at, np.asarray(values, self.dtype).reshape(
                ids.size, self.dim))

    def nbytes(self) -> int:
        """Bytes of the ids, rows and slots held (what the table must store, at least)."""
        return self._count * (8 + self.rows.itemsize * self.dim * (1 + len(self.slots)))


def _increasing(ids: np.ndarray) -> bool:
    return bool(np.all(ids[1:] > ids[:-1]))


def checked_bound(max_rows: Any, eviction: Any) -> tuple[int | None, str | None]:
    """``max_rows`` (a positive int or None) and ``eviction`` (None, "lru" or "lfu")."""
    if max_rows is not None and (type(max_rows) is not int or max_rows < 1):
        raise InvalidArgumentError(f"max_rows must be a positive int or None, got {max_rows!r}")
    if eviction is not None and eviction not in EVICTION_POLICIES:
        raise InvalidArgumentError(f"eviction must be None, 'lru' or 'lfu', got {eviction!r}")
    if eviction is not None and max_rows is None:
        raise InvalidArgumentError(f"eviction={eviction!r} needs max_rows")
    return max_rows, eviction


def _index_size(entries: int) -> int:
    """The power of two at least twice ``entries``."""
    return 1 << max(4, (2 * entries - 1).bit_length())


def _grown(array: np.ndarray, capacity: int, used: int) -> np.ndarray:
    grown = np.empty((capacity, *array.shape[1:]), array.dtype)
    grown[:used] = array[:used]
    return grown
