"""What the root of a placed module offers besides its forward (see :func:`convoy.torch.place`):
``gradients()`` for ``optimizer.apply_gradients``, ``parameters()`` and ``named_parameters()``
of the tensors pulled, ``zero_grad``, its variables, and its variables and buffers as a
checkpoint finds them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from convoy._values.slices import IndexedSlices
from convoy.errors import InvalidArgumentError
from convoy.torch._dynamic import _DynamicBase
from convoy.torch._step import Slot, local


def gradients(self: nn.Module) -> list[tuple[Any, Any]]:
    """The ``(gradient, variable)`` pairs of this thread's pulls for this module that
    received gradients since the last call, for ``optimizer.apply_gradients``: arrays for
    parameters read whole, :class:`~convoy.IndexedSlices` of the rows looked up for
    embeddings. Releases those tensors."""
    taken = local.state.grads.pop(self.__dict__["_convoy_token"], [])
    # (the tables' own method: a placed root that is one has this function as its gradients)
    pairs: list[tuple[Any, Any]] = [pair for module in self.modules()
                                    if isinstance(module, _DynamicBase)
                                    for pair in _DynamicBase.gradients(module)]
    for tensor, (slot, ids, keep) in taken:
        grad = tensor.grad
        if grad is None:
            continue
        grad = grad.numpy()
        if ids is None:
            pairs.append((grad, slot.variable))
            continue
        if grad.ndim != 2:
            grad = grad.reshape((ids.size, *slot.shape[1:]))
        if keep is not None:
            grad, ids = grad[keep], ids[keep]
        pairs.append((IndexedSlices(grad, ids), slot.variable))
    if len(pairs) > 1 and len({id(v) for _, v in pairs}) < len(pairs):
        return _merged(pairs)
    return pairs


def _merged(pairs: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """One pair per variable (several pulls of it since the last ``gradients()``): dense
    gradients added up, rows' gradients concatenated."""
    dense: dict[int, tuple[np.ndarray, Any]] = {}
    sparse: dict[int, tuple[list[IndexedSlices], Any]] = {}
    for grad, variable in pairs:
        if isinstance(grad, IndexedSlices):
            sparse.setdefault(id(variable), ([], variable))[0].append(grad)
        elif id(variable) in dense:
            dense[id(variable)] = (dense[id(variable)][0] + grad, variable)
        else:
            dense[id(variable)] = (grad, variable)
    merged: list[tuple[Any, Any]] = list(dense.values())
    for parts, variable in sparse.values():
        merged.append((parts[0] if len(parts) == 1 else IndexedSlices(
            np.concatenate([p.values for p in parts]),
            np.concatenate([p.indices for p in parts])), variable))
    return merged


def _waiting(module: nn.Module, recurse: bool) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) for this thread's pulled tensors of ``module``'s parameters (its own
    only, unless ``recurse``) that received gradients not yet taken by ``gradients()``.

    Rows' gradients are first made those of the table, as a plain module's: the rows of one
    id added up, those of padding ids left out (the tensor pulled is replaced by a leaf
    holding that gradient, which ``gradients()`` then returns), so norms and clipped values
    are PyTorch's."""
    slots = module.__dict__["_convoy_slotset"] if recurse else \
        set(module.__dict__["_convoy_slots"].values())
    taken = local.state.grads.get(module.__dict__["_convoy_token"], [])
    found = []
    for index, (tensor, (slot, ids, keep)) in enumerate(taken):
        if slot not in slots or tensor.grad is None:
            continue
        if ids is not None:
            tensor, ids = _coalesced(tensor.grad, slot, ids, keep)
            taken[index] = (tensor, (slot, ids, None))
        found.append((slot.variable.name, tensor))
    return found


def _coalesced(grad: torch.Tensor, slot: Slot, ids: np.ndarray, keep: np.ndarray | None
               ) -> tuple[torch.Tensor, np.ndarray]:
    """A leaf whose gradient is ``grad`` (rows of ``ids``) with the rows of one id added up
    and those not kept left out, and its ids."""
    rows = grad.reshape(ids.size, *slot.shape[1:])
    if keep is not None:
        rows, ids = rows[torch.from_numpy(keep)], ids[keep]
    unique, inverse = np.unique(ids, return_inverse=True)
    if unique.size < ids.size:
        rows = rows.new_zeros((unique.size, *slot.shape[1:])).index_add_(
            0, torch.from_numpy(inverse.reshape(-1)), rows)
        ids = unique
    leaf = torch.zeros((), dtype=rows.dtype).expand(rows.shape)
    leaf.grad = rows.contiguous()
    return leaf, ids


def named_parameters(self: nn.Module, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors pulled for this thread's step that received gradients waiting for
    ``gradients()``, named by their variables (``prefix`` before each name)."""
    _refuse_torch_optimizer(sys._getframe(1))
    found = _waiting(self, recurse)
    if not found:
        raise InvalidArgumentError(
            f"a placed module's parameters are variables on the parameter servers "
            f"(model.variables lists them): {type(self).__name__}.parameters() yields only "
            f"the tensors pulled for this thread's step that hold gradients, between "
            f"loss.backward() and model.gradients() (so torch.nn.utils.clip_grad_norm_ and "
            f"clip_grad_value_ clip what gradients() returns), and none are waiting now. "
            f"To clip in the optimizer instead, give it global_clipnorm, clipnorm or clipvalue")
    for name, tensor in found:
        yield (f"{prefix}.{name}" if prefix else name), tensor


def parameters(self: nn.Module, recurse: bool = True) -> Iterator[torch.Tensor]:
    """The tensors pulled for this thread's step that received gradients waiting for
    ``gradients()``: ``clip_grad_norm_(model.parameters(), ...)`` between ``backward()`` and
    ``gradients()`` clips the gradients it returns. Raises when there are none, and when a
    ``torch.optim`` optimizer asks (use a ``cv.optimizers`` one)."""
    _refuse_torch_optimizer(sys._getframe(1))
    for _, tensor in named_parameters(self, recurse=recurse):
        yield tensor


def zero_grad(self: nn.Module, set_to_none: bool = True) -> None:
    """Drop the gradients of this module's parameters waiting for ``gradients()`` in this
    thread."""
    grads, token = local.state.grads, self.__dict__["_convoy_token"]
    slots = self.__dict__["_convoy_slotset"]
    kept = [entry for entry in grads.get(token, []) if entry[1][0] not in slots]
    if kept:
        grads[token] = kept
    else:
        grads.pop(token, None)


def _refuse_torch_optimizer(frame: Any) -> None:
    """Raise if a ``torch.optim`` optimizer (one of the few frames from ``frame`` up) is
    taking a placed module's parameters, naming the ``cv.optimizers`` one to use."""
    for _ in range(4):
        if frame is None:
            return
        optimizer = frame.f_locals.get("self")
        if isinstance(optimizer, torch.optim.Optimizer):
            break
        frame = frame.f_back
    else:
        return
    from convoy.train import optimizers

    name = type(optimizer).__name__
    ours = sorted(n for n, c in vars(optimizers).items() if isinstance(c, type)
                  and issubclass(c, optimizers.Optimizer) and c is not optimizers.Optimizer)
    instead = f"cv.optimizers.{name}" if name in ours else \
        f"one of cv.optimizers ({', '.join(ours)})"
    raise InvalidArgumentError(
        f"torch.optim.{name} cannot train a placed module: its parameters are variables on "
        f"the parameter servers, updated there. Use {instead} and, after loss.backward(), "
        f"optimizer.apply_gradients(model.gradients())")


def variables(self: nn.Module) -> list[Any]:
    return [slot.variable for slot in self.__dict__["_convoy_tree"]]


def trainable_variables(self: nn.Module) -> list[Any]:
    return [v for v in variables(self) if v.trainable]


class _Buffers:
    """A placed module's persistent buffers (they stay in the module), for checkpoints."""

    def __init__(self, module: nn.Module) -> None:
        self._module = module

    def _named(self) -> Iterator[tuple[str, torch.Tensor]]:
        for prefix, module in self._module.named_modules():
            for name, buffer in module._buffers.items():
                if buffer is not None and name not in module._non_persistent_buffers_set:
                    yield (f"{prefix}.{name}" if prefix else name), buffer

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: buffer.detach().clone() for name, buffer in self._named()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        with torch.no_grad():
            for name, buffer in self._named():
                if name in state_dict:
                    buffer.copy_(torch.as_tensor(state_dict[name]))


class _OwnTable:
    """A placed root that is a dynamic embedding itself, as a checkpoint holds its table: by
    its ``state_dict`` (the root itself the checkpoint walks through, not by state)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def state_dict(self) -> dict[str, Any]:
        return self.module.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any:
        return self.module.load_state_dict(state_dict)


def checkpoint_children(self: nn.Module) -> dict[str, Any]:
    """What a Checkpoint saves of the module: each variable under its ``state_dict`` key (a
    tied parameter under its first), and the persistent buffers, if any."""
    children: dict[str, Any] = {}
    seen: set[int] = set()
    for prefix, module in self.named_modules():
        if isinstance(module, _DynamicBase):  # saved through its state_dict
            children[prefix or "table"] = module if prefix else _OwnTable(module)
        for name, slot in module.__dict__.get("_convoy_slots", {}).items():
            if id(slot) not in seen:
                seen.add(id(slot))
                children[f"{prefix}.{name}" if prefix else name] = slot.variable
    buffers = _Buffers(self)
    if any(True for _ in buffers._named()):
        children["buffers"] = buffers
    return children
