"""``DynamicTable``: embedding rows by int64 id, made on first lookup, on the parameter
servers (inside ``strategy.scope()``) or in this process.

A table made in a strategy's scope has one shard on every parameter server; an id's row lives
on shard ``hash(id) % num_ps``, so a lookup is one message per parameter server. Each shard
holds its rows in a :class:`~convoy.distribute._dynamic_rows.DynamicRows`. An optimizer of
``cv.optimizers`` applies an ``IndexedSlices`` whose indices are ids (the pairs
``gradients()`` of the torch modules return) to the rows and their slots on the shards.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Any, NamedTuple

import numpy as np

from convoy._values.slices import IndexedSlices, put_rows, take_rows
from convoy.distribute import _scope
from convoy.distribute._dynamic_rows import RowInitializer, checked_bound, checked_ids, mix64
from convoy.distribute._operations import (
    TableCreate,
    TableExport,
    TableImport,
    TableKeys,
    TableLookup,
    TableStats,
)
from convoy.distribute._store_clients import LocalStore, execute_all
from convoy.errors import InvalidArgumentError

_SHARD_SALT = np.uint64(0x5EED5EED5EED5EED)  # not the in-shard index's hash: both stay even
_FEW_SHARDS = 8
_names = itertools.count()
_names_lock = threading.Lock()


class _Shard(NamedTuple):
    """One store's part of a table: what an optimizer's update names."""

    store: Any
    key: str

    @property
    def handle(self) -> _Shard:
        """Its (store, key), as a variable's handle."""
        return self


class DynamicTable:
    """Rows of ``dim`` values by id (0 to 2**63 - 1), each made on its first lookup by
    ``initializer`` (None: N(0, 1) as ``nn.Embedding``'s, seeded by ``seed`` and the id).

    ``max_rows`` bounds the rows held (split evenly among the parameter servers); at the
    bound a lookup of new ids evicts the least recently (``eviction="lru"``) or least
    frequently (``"lfu"``) looked-up rows with their optimizer slots, or fails without an
    ``eviction``.
    """

    def __init__(self, dim: int, *, dtype: Any = np.float32,
                 initializer: Any = None, max_rows: int | None = None,
                 eviction: str | None = None, seed: int | None = None,
                 name: str | None = None) -> None:
        if type(dim) is not int or dim < 1:
            raise InvalidArgumentError(f"dim must be a positive int, got {dim!r}")
        max_rows, eviction = checked_bound(max_rows, eviction)
        self.dim, self.dtype = dim, np.dtype(dtype)
        if self.dtype.kind != "f":
            raise InvalidArgumentError(f"dtype must be a float dtype, got {self.dtype}")
        self.name = name or "dynamic_table"
        self.max_rows, self.eviction = max_rows, eviction
        self.initializer = _initializer(initializer, seed)
        strategy = _scope.current()
        if strategy is None:
            stores: list[Any] = [LocalStore()]
        else:
            stores = list(strategy._stores)
        with _names_lock:
            key = f"{self.name}:{next(_names)}"
        if strategy is not None:
            key = f"{strategy._unique(self.name)}@{strategy._token}"
        per_shard = None if max_rows is None else -(-max_rows // len(stores))
        self.shard_config = {"dim": dim, "dtype": self.dtype.str, "initializer": self.initializer,
                             "max_rows": per_shard, "eviction": eviction}
        execute_all([(store, [TableCreate(key, self.shard_config)]) for store in stores])
        self.shards = [_Shard(store, key) for store in stores]
        if strategy is not None:  # strategy.recover makes it again on a lost ps
            strategy._tables.add(self)
        self._remembered: tuple[weakref.ref[np.ndarray], list[tuple[int, np.ndarray]]] | None \
            = None

    def __getstate__(self) -> dict[str, Any]:
        if isinstance(self.shards[0].store, LocalStore):
            raise InvalidArgumentError(
                f"dynamic table {self.name!r} was made outside strategy.scope(): it lives in "
                f"this process only and cannot be sent to workers; make it inside "
                f"strategy.scope()")
        return {**self.__dict__, "_remembered": None}

    def route(self, ids: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """(shard, positions in ``ids``) for each shard some of the flat int64 ``ids`` go to.
        The routes of a read-only ``ids`` are kept for the next call with that same array
        (a lookup's ids, routed again when their gradients are applied)."""
        remembered = self._remembered
        if remembered is not None and remembered[0]() is ids:
            return remembered[1]
        shards = len(self.shards)
        if shards == 1:
            routes = [(0, np.arange(ids.size))]
        else:
            hashed = mix64(ids.astype(np.uint64) ^ _SHARD_SALT)
            shard = (hashed % np.uint64(shards)).astype(np.int64)
            if shards <= _FEW_SHARDS:  # a pass per shard costs less than a sort
                routes = [(s, at) for s in range(shards) if (at := np.flatnonzero(shard == s)).size]
            else:
                order = np.argsort(shard, kind="stable")
                bounds = np.searchsorted(shard[order], np.arange(shards + 1))
                routes = [(s, order[bounds[s]:bounds[s + 1]]) for s in range(shards)
                          if bounds[s + 1] > bounds[s]]
        if not ids.flags.writeable:
            self._remembered = (weakref.ref(ids), routes)
        return routes

    def lookup(self, ids: Any) -> np.ndarray:
        """The rows of ``ids`` (non-negative integers, any shape), made where missing: shape
        ``ids.shape + (dim,)``; one message per parameter server."""
        shape = np.shape(ids)
        unique, inverse = np.unique(checked_ids(ids), return_inverse=True)
        rows = self.lookup_distinct(unique)
        return take_rows(rows, inverse).reshape((*shape, self.dim))

    def lookup_distinct(self, unique: np.ndarray) -> np.ndarray:
        """The rows of ``unique`` (checked int64 ids, sorted, distinct), made where missing:
        shape ``(len(unique), dim)``."""
        routes = self.route(unique)
        answers = execute_all([(self.shards[s].store,
                                [TableLookup(self.shards[s].key, take_rows(unique, at))])
                               for s, at in routes])
        if len(routes) == 1:
            rows: np.ndarray = answers[0][0]
            return rows if rows.flags.writeable else rows.copy()  # the caller's to change
        rows = np.empty((unique.size, self.dim), self.dtype)
        for (_, at), (values,) in zip(routes, answers, strict=True):
            put_rows(rows, at, values)
        return rows

    def updates(self, gradient: IndexedSlices) -> list[tuple[IndexedSlices, _Shard]]:
        """``gradient`` (rows for ids) as one gradient per shard, every shard included (an
        empty one where no id goes, so per-table optimizer state advances on each)."""
        ids = gradient.indices
        remembered = self._remembered
        if remembered is None or remembered[0]() is not ids:  # else checked and routed
            ids = checked_ids(ids, "gradient ids")
        values = np.asarray(gradient.values, self.dtype)
        if values.shape != (ids.size, self.dim):
            values = values.reshape(ids.size, self.dim)
        routed = dict(self.route(ids))
        nothing = np.zeros(0, np.int64)
        return [(IndexedSlices(take_rows(values, routed.get(s, nothing)),
                               take_rows(ids, routed.get(s, nothing))), shard)
                for s, shard in enumerate(self.shards)]

    def _on_every_shard(self, operation: type) -> list[Any]:
        calls = [(shard.store, [operation(shard.key)]) for shard in self.shards]
        return [answer for answer, in execute_all(calls)]

    def size(self) -> int:
        """How many rows the table holds."""
        return sum(stats["rows"] for stats in self._on_every_shard(TableStats))

    def stats(self) -> list[dict[str, int]]:
        """Each shard's rows held, evictions so far and bytes of ids, rows and slots."""
        return self._on_every_shard(TableStats)

    def keys(self) -> np.ndarray:
        """The ids of the rows held, sorted."""
        return np.sort(np.concatenate(self._on_every_shard(TableKeys)))

    def export(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids, rows) of every row held, sorted by id."""
        state = self.state()
        return state["ids"], state["rows"]

    def state(self) -> dict[str, Any]:
        """The ids, rows and optimizer slots held (sorted by id), and the per-table optimizer
        state (the largest of the shards')."""
        parts = self._on_every_shard(TableExport)
        ids = np.concatenate([p["ids"] for p in parts])
        order = np.argsort(ids, kind="stable")
        names = sorted({name for p in parts for name in p["slots"]})
        slots = {name: take_rows(np.concatenate([
            p["slots"][name] if name in p["slots"] else  # a shard never updated
            np.full((p["ids"].size, self.dim), _initial(parts, name), self.dtype)
            for p in parts]), order) for name in names}
        scalars: dict[str, np.ndarray] = {}
        for part in parts:
            for name, value in part["scalars"].items():
                scalars[name] = value if name not in scalars else np.maximum(scalars[name],
                                                                              value)
        return {"ids": take_rows(ids, order),
                "rows": take_rows(np.concatenate([p["rows"] for p in parts]), order),
                "slots": slots, "slot_initial": {name: _initial(parts, name) for name in names},
                "scalars": scalars}

    def load(self, state: dict[str, Any], replace: bool = False) -> None:
        """Set the rows (and slots, and per-table optimizer state) of ``state``'s ids, made
        where missing, each on the shard its id now hashes to; with ``replace``, the table
        then holds those rows alone."""
        ids = checked_ids(state["ids"], "state['ids']")
        rows = np.asarray(state["rows"], self.dtype).reshape(ids.size, self.dim)
        slots = {name: np.asarray(value, self.dtype).reshape(ids.size, self.dim)
                 for name, value in (state.get("slots") or {}).items()}
        routed = dict(self.route(ids))
        nothing = np.zeros(0, np.int64)
        calls = []
        for s, shard in enumerate(self.shards):
            at = routed.get(s, nothing)
            part = {"ids": take_rows(ids, at), "rows": take_rows(rows, at),
                    "slots": {name: take_rows(v, at) for name, v in slots.items()},
                    "slot_initial": dict(state.get("slot_initial") or {}),
                    "scalars": dict(state.get("scalars") or {})}
            calls.append((shard.store, [TableImport(shard.key, part, replace)]))
        execute_all(calls)

    def __repr__(self) -> str:
        return (f"<cv.DynamicTable '{self.name}' dim={self.dim} dtype={self.dtype.name} "
                f"shards={len(self.shards)}>")


def _initial(parts: list[dict[str, Any]], name: str) -> float:
    return float(next(p["slot_initial"][name] for p in parts if name in p["slot_initial"]))


def _initializer(initializer: Any, seed: int | None) -> Any:
    """What makes a new row: a RowInitializer seeded by ``seed`` for None or a number, a
    RowInitializer given (with its own seed), else the callable given (``f(ids, dim) ->
    [len(ids), dim]``, which must depend on the ids alone)."""
    if seed is None:
        seed = int(np.random.SeedSequence().generate_state(1, np.uint64)[0] >> np.uint64(1))
    elif type(seed) is not int or seed < 0:
        raise InvalidArgumentError(f"seed must be a non-negative int or None, got {seed!r}")
    if initializer is None:
        return RowInitializer("normal", 0.0, 1.0, seed)
    if isinstance(initializer, RowInitializer):
        return initializer
    if isinstance(initializer, int | float) and not isinstance(initializer, bool):
        return RowInitializer("constant", float(initializer), 0.0, seed)
    if callable(initializer):
        return initializer
    raise InvalidArgumentError(f"initializer must be None, a number or a callable of (ids, "
                               f"dim), got {type(initializer).__name__}")
