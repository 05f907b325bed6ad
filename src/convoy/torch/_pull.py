"""Pull variables into torch tensors for one step; their gradients go back as a push.

:func:`pull` reads every dense variable and every gathered row block in one call per
parameter server; :meth:`Pulled.gradients` turns gathered rows' gradients into
:class:`IndexedSlices`, so the push (``apply_gradients``) is one sparse update per server.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from convoy._slices import IndexedSlices, put_rows
from convoy.distribute._protocol import execute_all
from convoy.distribute.variables import ShardedVariable, Variable
from convoy.errors import InvalidArgumentError


class Pulled:
    """The tensors a step works on and, after ``backward()``, their gradients."""

    def __init__(self) -> None:
        self.dense: list[tuple[torch.Tensor, Any]] = []
        self.rows: dict[Any, torch.Tensor] = {}
        self._row_sources: list[tuple[torch.Tensor, Any, np.ndarray, tuple[int, ...]]] = []

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter([t for t, _ in self.dense])

    def __getitem__(self, key: Any) -> torch.Tensor:
        return self.rows[key] if not isinstance(key, int) else self.dense[key][0]

    def gradients(self) -> list[tuple[Any, Any]]:
        """(gradient, variable) pairs for ``apply_gradients``: arrays for dense variables,
        IndexedSlices (one row per id looked up) for gathered rows."""
        pairs: list[tuple[Any, Any]] = []
        for tensor, variable in self.dense:
            if tensor.grad is not None:
                pairs.append((tensor.grad.numpy(), variable))
        for tensor, variable, ids, _ in self._row_sources:
            if tensor.grad is not None:
                grad = tensor.grad.numpy().reshape((ids.size, *variable.shape[1:]))
                pairs.append((IndexedSlices(grad, ids.reshape(-1)), variable))
        return pairs


def _targets(variable: Any) -> list[Variable]:
    return variable.variables if isinstance(variable, ShardedVariable) else [variable]


@contextlib.contextmanager
def pull(dense: Sequence[Variable | ShardedVariable] = (),
         rows: dict[Any, Any] | None = None) -> Iterator[Pulled]:
    """Read ``dense`` variables whole and ``rows`` (variable -> ids) as gathered rows, as
    torch tensors with ``requires_grad``; one call per parameter server touched."""
    pulled = Pulled()
    operations: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    stores: dict[int, Any] = {}
    placements: list[tuple[str, Any, int, int, Any]] = []

    def request(store: Any, operation: tuple[Any, ...]) -> tuple[int, int]:
        stores[id(store)] = store
        operations[id(store)].append(operation)
        return id(store), len(operations[id(store)]) - 1

    for variable in dense:
        if not isinstance(variable, (Variable, ShardedVariable)):
            raise InvalidArgumentError(f"dense must hold variables, got {type(variable).__name__}")
        for shard in _targets(variable):
            placements.append(("dense", variable, *request(shard._store, ("read", shard._key)),
                               None))
    routes_of: dict[int, Any] = {}
    for variable, ids in (rows or {}).items():
        flat = np.asarray(ids).reshape(-1)
        if isinstance(variable, ShardedVariable):
            routes = variable.route(flat)
            routes_of[id(variable)] = routes
            for shard_index, positions, local in routes:
                shard = variable.variables[shard_index]
                placements.append(("rows", variable,
                                   *request(shard._store, ("gather", shard._key, local)),
                                   positions))
        else:
            placements.append(("rows", variable,
                               *request(variable._store, ("gather", variable._key, flat)),
                               None))
    keys = list(operations)
    results = dict(zip(keys, execute_all([(stores[k], operations[k]) for k in keys])))

    dense_parts: dict[int, list[np.ndarray]] = defaultdict(list)
    row_blocks: dict[int, np.ndarray] = {}
    for kind, variable, store_key, index, positions in placements:
        value = results[store_key][index]
        if kind == "dense":
            dense_parts[id(variable)].append(value)
            continue
        ids = np.asarray(rows[variable]).reshape(-1)  # type: ignore[index]
        block = row_blocks.setdefault(id(variable), np.empty((ids.size, *variable.shape[1:]),
                                                             variable.dtype))
        if positions is None:
            block[...] = value
        else:
            put_rows(block, positions, value)
    for variable in dense:
        parts = dense_parts[id(variable)]
        value = np.concatenate(parts) if len(parts) > 1 else np.array(parts[0])
        pulled.dense.append((torch.from_numpy(value).requires_grad_(), variable))
    for variable, ids in (rows or {}).items():
        shape = np.shape(ids)
        block = row_blocks[id(variable)].reshape((*shape, *variable.shape[1:]))
        tensor = torch.from_numpy(block).requires_grad_()  # block is ours: share, not copy
        pulled.rows[variable] = tensor
        pulled._row_sources.append((tensor, variable, np.asarray(ids), shape))
    yield pulled
