"""One call of a placed module in one thread (:class:`Step`): what it pulls from the parameter
servers, served to the parameters and embedding calls of the modules under it, and the
gradients it leaves for ``gradients()`` (:class:`ThreadState`).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from convoy.distribute._worker_calls import current_call
from convoy.distribute.variables import ShardedVariable, Variable
from convoy.torch._pull import pull


@dataclass(eq=False)
class Slot:
    """One placed parameter: its variable, and how a step reads it."""

    variable: Variable | ShardedVariable
    shape: tuple[int, ...]
    dtype: torch.dtype
    rows: bool  # read by rows (an embedding's weight)

    def zeros(self) -> torch.Tensor:
        """A zero tensor of the parameter's shape that allocates no memory (the forward
        that only looks for ids computes with it)."""
        return torch.zeros((), dtype=self.dtype).expand(self.shape)


@dataclass(eq=False)
class Call:
    """An embedding call a step serves: the ids, and where their rows are in a pulled
    block (``whole``: the block holds this call's rows alone, shaped as its ids)."""

    slot: Slot
    ids: np.ndarray
    padding_idx: int | None
    block: torch.Tensor | None = None
    start: int = 0
    whole: bool = False


#: What a pulled tensor's gradient is for: its slot, and for rows the ids looked up and which
#: of them get gradients (None: all).
Tracked = tuple[Slot, np.ndarray | None, np.ndarray | None]


class Enough(BaseException):  # not an Exception: a forward's own handlers let it pass
    """Ends a forward that looks for ids once it has seen as many embedding calls as the
    previous call of the module made."""


@dataclass(eq=False)
class Recording:
    limit: int
    calls: list[Call] = field(default_factory=list)


class ThreadState:
    """A thread's steps in progress, its gradients waiting for ``gradients()``, and which
    scheduled function they belong to."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.recording: Recording | None = None
        self.grads: dict[str, list[tuple[torch.Tensor, Tracked]]] = {}
        self.call: Any = None

    def new_step(self) -> None:
        """Gradients nobody asked for in a scheduled function are released when it ends (and
        any left by code outside scheduled functions when one starts): they must not be
        applied by a later one."""
        call = current_call()
        if call is not self.call:
            self.call = call
            self.grads.clear()
            if call is not None:
                call.on_finish(self._call_ended)

    def _call_ended(self) -> None:
        self.grads.clear()
        self.call = None


class Step:
    """One call of a placed module (the entry: the outermost placed module called) in one
    thread: the tensors pulled for it, served to the parameters and embedding calls of the
    modules under it.

    Pulls are lazy: the first use of a parameter pulls every dense parameter, together with
    the rows of the embedding call that caused it, if one did. That is one pull per parameter
    server when the forward calls one embedding before using other parameters. Otherwise (the
    previous call says so) the ids are found first: the forward runs without gradients on
    zeros until it has made as many embedding calls as last time, and everything is pulled at
    once before the real forward; a call whose ids differ from those found pulls on its own.
    """

    def __init__(self, module: nn.Module, state: ThreadState) -> None:
        self.tree: tuple[Slot, ...] = module.__dict__["_convoy_tree"]
        self.slots: frozenset[Slot] = module.__dict__["_convoy_slotset"]
        self.dense_slots: tuple[Slot, ...] = module.__dict__["_convoy_dense"]
        self.token: str = module.__dict__["_convoy_token"]
        self.state = state
        self.dense: dict[Slot, torch.Tensor] | None = None
        self.whole: dict[Slot, torch.Tensor] = {}
        self.ready: dict[Slot, deque[Call]] = {}
        self.first: str | None = None  # "dense" or "rows": what the forward used first
        self.embedding_calls = 0

    def plan(self) -> tuple[int, bool]:
        lazy_is_one_pull = self.embedding_calls == 0 or (
            self.embedding_calls == 1 and self.first == "rows")
        return self.embedding_calls, not lazy_is_one_pull

    def fetch(self, dense: bool, calls: list[Call]) -> None:
        """Pull (one call per parameter server) every dense parameter if ``dense``, and the
        rows of ``calls``, placing each call's rows in a block of its table's."""
        dense_slots = self.dense_slots if dense else ()
        by_slot: dict[Slot, list[Call]] = {}
        for call in calls:
            by_slot.setdefault(call.slot, []).append(call)
        # A call alone on its table gets its rows shaped as its ids: no view to take of them.
        rows = {slot: np.concatenate([c.ids.reshape(-1) for c in slot_calls])
                if len(slot_calls) > 1 else slot_calls[0].ids
                for slot, slot_calls in by_slot.items()}
        with pull(dense=[s.variable for s in dense_slots],
                  rows={s.variable: ids for s, ids in rows.items()}) as pulled:
            pass
        tracked: list[tuple[torch.Tensor, Tracked]] = []
        if dense:
            self.dense = {}
            for slot, (tensor, _) in zip(dense_slots, pulled.dense, strict=True):
                self.dense[slot] = tensor
                tracked.append((tensor, (slot, None, None)))
        for slot, slot_calls in by_slot.items():
            block = pulled.rows[slot.variable]
            start = 0
            for call in slot_calls:
                call.block, call.start = block, start
                start += call.ids.size
            slot_calls[0].whole = len(slot_calls) == 1
            tracked.append((block, (slot, rows[slot].reshape(-1), _kept(slot_calls))))
        if torch.is_grad_enabled():
            self._track(tracked)

    def _track(self, tracked: list[tuple[torch.Tensor, Tracked]]) -> None:
        """Once a backward reaches one of the tensors, hold it for ``gradients()``. The hook
        holds no reference to them: until then only the autograd graph does."""
        grads, token = self.state.grads, self.token
        waiting = {id(tensor): what for tensor, what in tracked}

        def reached(leaf: torch.Tensor) -> None:
            what = waiting.pop(id(leaf), None)
            if what is not None:
                grads.setdefault(token, []).append((leaf, what))

        for tensor, _ in tracked:
            _on_accumulated(tensor, reached)

    def prefetch(self, calls: list[Call]) -> None:
        calls = [c for c in calls if c.slot in self.slots]  # not another placed module's
        self.fetch(True, calls)
        for call in calls:
            self.ready.setdefault(call.slot, deque()).append(call)

    def dense_value(self, slot: Slot) -> torch.Tensor:
        self.first = self.first or "dense"
        if slot.rows:  # an embedding's table used whole (e.g. tied to an output layer)
            if slot not in self.whole:
                with pull(dense=[slot.variable]) as pulled:
                    pass
                self.whole[slot] = pulled.dense[0][0]
                if torch.is_grad_enabled():
                    self._track([(self.whole[slot], (slot, None, None))])
            return self.whole[slot]
        if self.dense is None:
            self.fetch(True, [])
        assert self.dense is not None
        return self.dense[slot]

    def rows(self, slot: Slot, ids: np.ndarray, padding_idx: int | None) -> Call:
        self.first = self.first or "rows"
        self.embedding_calls += 1
        ready = self.ready.get(slot)
        if ready and ready[0].ids.shape == ids.shape and np.array_equal(ready[0].ids, ids):
            return ready.popleft()
        call = Call(slot, ids, padding_idx)
        self.fetch(self.dense is None, [call])
        return call


def _on_accumulated(leaf: torch.Tensor, hook: Any) -> None:
    """``leaf.register_post_accumulate_grad_hook(hook)`` for a leaf just pulled (a plain
    tensor with no hooks yet), as that method sets it, without the removable handle nobody
    uses: that is most of a step's cost of hooks."""
    if _HOOKS_ATTRIBUTE:
        leaf._post_accumulate_grad_hooks = {0: hook}
    else:
        leaf.register_post_accumulate_grad_hook(hook)


#: Whether tensors keep their post-accumulate-grad hooks in the dict this attribute sets.
_HOOKS_ATTRIBUTE = hasattr(torch.Tensor, "_post_accumulate_grad_hooks")


def _kept(calls: list[Call]) -> np.ndarray | None:
    """Which rows of a block get gradients: all but those of padding ids."""
    if len(calls) == 1 and calls[0].padding_idx is None or \
            all(c.padding_idx is None for c in calls):
        return None
    return np.concatenate([(c.ids != c.padding_idx).reshape(-1) if c.padding_idx is not None
                           else np.ones(c.ids.size, bool) for c in calls])


class _Local(threading.local):
    def __init__(self) -> None:
        self.state = ThreadState()


#: This thread's steps and gradients.
local = _Local()
