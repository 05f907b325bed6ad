"""Pull variables into torch tensors for one step; their gradients go back as a push.

:func:`pull` reads every dense variable and every gathered row block in one call per
parameter server; :meth:`Pulled.gradients` turns gathered rows' gradients into
:class:`IndexedSlices`, so the push (``apply_gradients``) is one sparse update per server.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from convoy._values.slices import IndexedSlices, put_rows
from convoy.distribute import _operations as ops
from convoy.distribute._store_clients import Store, execute_all
from convoy.distribute.variables import ShardedVariable, Variable
from convoy.errors import InvalidArgumentError


class Pulled:
    """The tensors a step works on and, after ``backward()``, their gradients."""

    def __init__(self) -> None:
        self.dense: list[tuple[torch.Tensor, Any]] = []
        self.rows: dict[Any, torch.Tensor] = {}
        self._row_sources: list[tuple[torch.Tensor, Any, np.ndarray]] = []

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
        for tensor, variable, flat in self._row_sources:
            if tensor.grad is not None:
                grad = tensor.grad.numpy().reshape((flat.size, *variable.shape[1:]))
                pairs.append((IndexedSlices(grad, flat), variable))
        return pairs


def _targets(variable: Any) -> list[Variable]:
    return variable.variables if isinstance(variable, ShardedVariable) else [variable]


@contextlib.contextmanager
def pull(dense: Sequence[Variable | ShardedVariable] = (),
         rows: dict[Any, Any] | None = None) -> Iterator[Pulled]:
    """Read ``dense`` variables whole and ``rows`` (variable -> ids) as gathered rows, as
    torch tensors with ``requires_grad``; one call per parameter server touched."""
    calls: dict[int, tuple[Store, list[ops.Operation]]] = {}
    # where each operation's result goes: (store key, index in its call)
    dense_at: list[list[tuple[int, int]]] = []
    rows_at: list[tuple[Any, np.ndarray, tuple[int, ...], list[tuple[int, int, Any]]]] = []

    def request(store: Store, operation: ops.Operation) -> tuple[int, int]:
        key = id(store)
        call = calls.get(key)
        if call is None:
            call = calls[key] = (store, [])
        call[1].append(operation)
        return key, len(call[1]) - 1

    for variable in dense:
        if not isinstance(variable, (Variable, ShardedVariable)):
            raise InvalidArgumentError(f"dense must hold variables, got {type(variable).__name__}")
        dense_at.append([request(shard.handle.store, ops.Read(shard.handle.key))
                         for shard in _targets(variable)])
    for variable, ids in (rows or {}).items():
        shape = np.shape(ids)
        flat = np.array(ids).reshape(-1)  # ours: the gradients' indices, never changed
        flat.flags.writeable = False
        if isinstance(variable, ShardedVariable):
            handles = [shard.handle for shard in variable.variables]
            gathers: list[tuple[int, int, Any]] = [
                (*request(handles[s].store, ops.Gather(handles[s].key, local)), positions)
                for s, positions, local in variable.route(flat, remember=True)]
        else:
            store, key = variable.handle
            gathers = [(*request(store, ops.Gather(key, flat)), None)]
        rows_at.append((variable, flat, shape, gathers))
    results = dict(zip(calls, execute_all(list(calls.values()))))

    pulled = Pulled()
    for variable, places in zip(dense, dense_at):
        parts = [results[key][index] for key, index in places]
        value = np.concatenate(parts) if len(parts) > 1 else np.array(parts[0])
        pulled.dense.append((torch.from_numpy(value).requires_grad_(), variable))
    for variable, flat, shape, gathered in rows_at:
        if len(gathered) == 1 and gathered[0][2] is None:
            block = results[gathered[0][0]][gathered[0][1]]  # the store's answer: ours
            if not block.flags.writeable:
                block = block.copy()
        else:
            block = np.empty((flat.size, *variable.shape[1:]), variable.dtype)
            for key, index, positions in gathered:
                put_rows(block, positions, results[key][index])
        # the block is ours: share, not copy
        tensor = torch.from_numpy(block.reshape((*shape, *variable.shape[1:]))).requires_grad_()
        pulled.rows[variable] = tensor
        pulled._row_sources.append((tensor, variable, flat))
    yield pulled
