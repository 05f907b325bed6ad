"""``DynamicEmbedding`` and ``DynamicEmbeddingBag``: ``nn.Embedding`` and ``nn.EmbeddingBag``
over a :class:`~convoy.distribute.DynamicTable`, whose rows are made on first
lookup of their id (any int64 from 0 to 2**63 - 1).

Made inside ``strategy.scope()`` (or placed there by ``cv.torch.place``) the table lives on
the parameter servers; otherwise in this process. A forward looks up the rows of its distinct
ids (one message per parameter server) into a leaf tensor of the calling thread;
``gradients()`` (or a placed model's) returns their gradients as ``(IndexedSlices by id,
table)`` pairs for ``optimizer.apply_gradients``.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from convoy._values.slices import IndexedSlices
from convoy.distribute import DynamicTable, _scope
from convoy.distribute._store_clients import LocalStore
from convoy.distribute._worker_calls import current_call
from convoy.errors import InvalidArgumentError

_PREFIX = "table."


class _Pending(threading.local):
    """A thread's looked-up rows waiting for ``gradients()``, and the scheduled function
    they belong to (those of an ended one are dropped, as a placed module's)."""

    def __init__(self) -> None:
        self.rows: list[tuple[torch.Tensor, np.ndarray]] = []
        self.call: Any = None

    def current(self) -> list[tuple[torch.Tensor, np.ndarray]]:
        call = current_call()
        if call is not self.call:
            self.call = call
            self.rows = []
        return self.rows


class _DynamicBase(nn.Module):
    def __init__(self, embedding_dim: int, *, initializer: Any, max_rows: int | None,
                 eviction: str | None, padding_idx: int | None, seed: int | None,
                 dtype: torch.dtype, name: str | None) -> None:
        super().__init__()
        if padding_idx is not None and (type(padding_idx) is not int or padding_idx < 0):
            raise InvalidArgumentError(f"padding_idx must be a non-negative int or None, got "
                                       f"{padding_idx!r}")
        if dtype not in (torch.float16, torch.float32, torch.float64):
            raise InvalidArgumentError(f"dtype must be torch.float16, float32 or float64, got "
                                       f"{dtype}")
        if seed is None:  # from torch's generator: torch.manual_seed makes tables repeatable
            seed = int(torch.randint(0, 2**62, ()).item())
        self.embedding_dim = embedding_dim
        self.padding_idx = padding_idx
        self.table = DynamicTable(embedding_dim, dtype=torch.empty((), dtype=dtype).numpy().dtype,
                                  initializer=initializer, max_rows=max_rows,
                                  eviction=eviction, seed=seed,
                                  name=name or type(self).__name__)
        self._config = {"initializer": self.table.initializer, "max_rows": max_rows,
                        "eviction": eviction, "seed": seed}
        self._pending = _Pending()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_pending"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pending = _Pending()

    def _rows(self, input: Any) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(position of each id's row, the rows with a zero row last, that row's position,
        which padding ids take)."""
        ids = _ids(input)
        flat = ids.reshape(-1)
        unique, inverse = np.unique(flat, return_inverse=True)
        zero = unique.size
        if self.padding_idx is not None:
            at = int(np.searchsorted(unique, self.padding_idx))
            if at < unique.size and unique[at] == self.padding_idx:  # never made nor trained
                unique = np.delete(unique, at)
                zero = unique.size
                inverse = np.where(inverse == at, zero, inverse - (inverse > at))
        unique.flags.writeable = False  # its routes are kept for its gradients (route())
        looked_up = torch.from_numpy(self.table.lookup_distinct(unique))
        if torch.is_grad_enabled():
            looked_up.requires_grad_(True)
            self._pending.current().append((looked_up, unique))
        rows = torch.cat([looked_up, looked_up.new_zeros((1, self.embedding_dim))])
        return torch.from_numpy(inverse.reshape(ids.shape)), rows, zero

    def gradients(self) -> list[tuple[IndexedSlices, DynamicTable]]:
        """The ``(gradient, table)`` pair of this thread's lookups since the last call that
        received gradients (rows by id), for ``optimizer.apply_gradients``; releases them."""
        pending = self._pending.current()
        taken = [(rows.grad, ids) for rows, ids in pending if rows.grad is not None]
        pending.clear()
        if not taken:
            return []
        if len(taken) == 1:  # the very ids looked up: their routes are known
            values, ids = taken[0][0].numpy(), taken[0][1]
        else:
            values = np.concatenate([grad.numpy() for grad, _ in taken])
            ids = np.concatenate([ids for _, ids in taken])
        return [(IndexedSlices(values, ids), self.table)]

    def size(self) -> int:
        """How many rows the table holds."""
        return self.table.size()

    def keys(self) -> np.ndarray:
        """The ids of the rows held, sorted."""
        return self.table.keys()

    def export(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids, rows) of every row held, sorted by id."""
        return self.table.export()

    def _placed(self) -> None:
        """Move a table made in this process to the parameter servers of the strategy in
        scope, with its rows (``cv.torch.place``)."""
        if _scope.current() is None or not isinstance(self.table.shards[0].store, LocalStore):
            return
        state = self.table.state()
        self.table = DynamicTable(self.embedding_dim, dtype=self.table.dtype,
                                  name=self.table.name, **self._config)
        self.table.load(state)

    def _save_to_state_dict(self, destination: dict[str, Any], prefix: str,
                            keep_vars: bool) -> None:
        state = self.table.state()
        destination[prefix + _PREFIX + "ids"] = torch.from_numpy(state["ids"])
        destination[prefix + _PREFIX + "rows"] = torch.from_numpy(state["rows"])
        for name, value in state["slots"].items():
            destination[f"{prefix}{_PREFIX}slots.{name}"] = torch.from_numpy(value)
            destination[f"{prefix}{_PREFIX}slot_initial.{name}"] = torch.tensor(
                float(state["slot_initial"][name]), dtype=torch.float64)
        for name, value in state["scalars"].items():
            destination[f"{prefix}{_PREFIX}scalars.{name}"] = torch.from_numpy(
                np.array(value))

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str,
                              local_metadata: Any, strict: bool, missing_keys: list[str],
                              unexpected_keys: list[str], error_msgs: list[str]) -> None:
        mine = {key[len(prefix) + len(_PREFIX):]: value for key, value in state_dict.items()
                if key.startswith(prefix + _PREFIX)}
        if "ids" not in mine or "rows" not in mine:
            missing_keys.extend(prefix + _PREFIX + k for k in ("ids", "rows") if k not in mine)
            return
        state: dict[str, Any] = {"ids": _numpy(mine.pop("ids")), "rows": _numpy(mine.pop("rows")),
                                 "slots": {}, "slot_initial": {}, "scalars": {}}
        for key, value in mine.items():
            group, _, name = key.partition(".")
            if group not in ("slots", "slot_initial", "scalars") or not name:
                unexpected_keys.append(prefix + _PREFIX + key)
                continue
            state[group][name] = float(value) if group == "slot_initial" else _numpy(value)
        try:
            self.table.load(state, replace=True)  # as a weight loaded: the saved rows alone
        except InvalidArgumentError as error:
            error_msgs.append(f"{prefix}{_PREFIX}: {error}")

    def extra_repr(self) -> str:
        return f"{self.embedding_dim}, table={self.table!r}"


class DynamicEmbedding(_DynamicBase):
    """``nn.Embedding`` whose rows are made on the first lookup of their id: ids are any
    int64 from 0 to 2**63 - 1 (hashes too), and the table grows with them.

    ``initializer``: None (each value N(0, 1), as ``nn.Embedding``'s), a number (every value
    that), a :class:`~convoy.distribute.RowInitializer` (normal, uniform or constant, with
    its own seed), or ``f(ids, dim) -> [len(ids), dim]`` depending on the ids alone. New rows
    depend only on the id and ``seed`` (None: drawn from torch's generator), so a retried
    lookup makes the same row. ``max_rows`` and ``eviction`` (``"lru"``, ``"lfu"``) bound the table;
    ``padding_idx``'s id is never made: it looks up zeros and gets no gradient.
    """

    def __init__(self, embedding_dim: int, *, initializer: Any = None,
                 max_rows: int | None = None, eviction: str | None = None,
                 padding_idx: int | None = None, seed: int | None = None,
                 dtype: torch.dtype = torch.float32, name: str | None = None) -> None:
        super().__init__(embedding_dim, initializer=initializer, max_rows=max_rows,
                         eviction=eviction, padding_idx=padding_idx, seed=seed, dtype=dtype,
                         name=name)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """The rows of ``input``'s ids: shape ``input.shape + (embedding_dim,)``."""
        index, rows, zero = self._rows(input)
        return F.embedding(index, rows, padding_idx=zero)


class DynamicEmbeddingBag(_DynamicBase):
    """``nn.EmbeddingBag`` (sums, means or maxima of bags of rows) over rows made on first
    lookup of their id; ``forward`` takes ``nn.EmbeddingBag``'s ``offsets`` and
    ``per_sample_weights``. The other arguments are :class:`DynamicEmbedding`'s."""

    def __init__(self, embedding_dim: int, mode: str = "mean", *, initializer: Any = None,
                 max_rows: int | None = None, eviction: str | None = None,
                 padding_idx: int | None = None, include_last_offset: bool = False,
                 seed: int | None = None, dtype: torch.dtype = torch.float32,
                 name: str | None = None) -> None:
        if mode not in ("sum", "mean", "max"):
            raise InvalidArgumentError(f"mode must be 'sum', 'mean' or 'max', got {mode!r}")
        super().__init__(embedding_dim, initializer=initializer, max_rows=max_rows,
                         eviction=eviction, padding_idx=padding_idx, seed=seed, dtype=dtype,
                         name=name)
        self.mode = mode
        self.include_last_offset = include_last_offset

    def forward(self, input: torch.Tensor, offsets: torch.Tensor | None = None,
                per_sample_weights: torch.Tensor | None = None) -> torch.Tensor:
        """One reduced row per bag: bags are ``input``'s rows (2-D) or cut from the 1-D
        ``input`` at ``offsets``."""
        index, rows, zero = self._rows(input)
        return F.embedding_bag(index, rows, offsets, mode=self.mode,
                               per_sample_weights=per_sample_weights,
                               include_last_offset=self.include_last_offset, padding_idx=zero)


def _ids(input: Any) -> np.ndarray:
    if not isinstance(input, torch.Tensor):
        raise InvalidArgumentError(f"ids must be a torch.Tensor of int64 (or int32), got "
                                   f"{type(input).__name__}")
    if input.dtype not in (torch.int64, torch.int32):
        raise InvalidArgumentError(f"ids must be a tensor of dtype torch.int64 (or int32), "
                                   f"got {input.dtype}")
    ids = input.detach().cpu().numpy().astype(np.int64, copy=False)
    if ids.size and int(ids.min()) < 0:
        raise InvalidArgumentError(f"ids must be non-negative (0 to 2**63 - 1), got "
                                   f"{int(ids.min())}")
    return ids


def _numpy(value: Any) -> np.ndarray:
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
