"""Optimizer arithmetic on numpy arrays, run where the variables live (the parameter servers).

``apply_update(config, variable, gradient, slot)`` changes ``variable`` in place. ``config``
is an optimizer's plain-data description (``Optimizer.config``); ``gradient`` is a dense
array or an :class:`IndexedSlices` of rows; ``slot(name, like, initial)`` returns the
optimizer's state array ``name`` for this variable, creating it filled with ``initial``.
Sparse updates touch only the rows they name (for Adam, "lazy" Adam): the dense rule runs on
copies of those rows, which are then written back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from convoy._slices import IndexedSlices, put_rows, take_rows
from convoy.errors import InvalidArgumentError

Slot = Callable[[str, np.ndarray, float], np.ndarray]


def _dense_gradient(variable: np.ndarray, gradient: Any) -> np.ndarray:
    dense = np.asarray(gradient, dtype=variable.dtype)
    if dense.shape != variable.shape:
        raise InvalidArgumentError(
            f"gradient of shape {list(dense.shape)} does not match its variable's "
            f"{list(variable.shape)}"
        )
    return dense


def _unique_rows(variable: np.ndarray, gradient: IndexedSlices) -> tuple[np.ndarray, np.ndarray]:
    """Row indices without repeats and the summed gradient rows for each."""
    indices = np.asarray(gradient.indices).reshape(-1)
    values = np.asarray(gradient.values, dtype=variable.dtype).reshape(
        (indices.size, *variable.shape[1:]))
    if indices.size and (indices.min() < 0 or indices.max() >= variable.shape[0]):
        raise InvalidArgumentError(
            f"gradient rows must be in [0, {variable.shape[0]}), got {indices.min()} to "
            f"{indices.max()}"
        )
    if indices.size < 2:
        return indices, values
    order = np.argsort(indices, kind="stable")
    ordered = indices[order]
    first = np.empty(indices.size, bool)  # where each row's first occurrence is, in order
    first[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    if starts.size == indices.size:  # no repeats: nothing to sum
        return indices, values
    if indices.size - starts.size > _FEW_REPEATS:  # many: one vectorised segment sum
        return ordered[starts], np.add.reduceat(take_rows(values, order), starts, axis=0)
    # Few repeats (ids drawn from a large table): add the later occurrences to the first;
    # a segment sum over every row costs more.
    summed = take_rows(values, order[starts])
    later = ~first
    np.add.at(summed, np.cumsum(first)[later] - 1, take_rows(values, order[later]))
    return ordered[starts], summed


#: Above this many repeated rows, _unique_rows sums segments with np.add.reduceat.
_FEW_REPEATS = 64


def _sgd(config: dict[str, Any], variable: np.ndarray, g: np.ndarray, slot: Slot) -> None:
    lr, momentum = config["learning_rate"], config.get("momentum", 0.0)
    if momentum:
        velocity = slot("momentum", variable, 0.0)
        velocity *= momentum
        velocity -= lr * g
        variable += momentum * velocity - lr * g if config.get("nesterov") else velocity
    else:
        variable -= lr * g


def _adagrad(config: dict[str, Any], variable: np.ndarray, g: np.ndarray, slot: Slot) -> None:
    lr, eps = config["learning_rate"], config["epsilon"]
    accumulator = slot("accumulator", variable, config["initial_accumulator_value"])
    accumulator += g * g
    variable -= lr * g / (np.sqrt(accumulator) + eps)


def _adam(config: dict[str, Any], variable: np.ndarray, g: np.ndarray, slot: Slot) -> None:
    lr, beta_1, beta_2, eps = (config[k] for k in ("learning_rate", "beta_1", "beta_2",
                                                   "epsilon"))
    m, v = slot("m", variable, 0.0), slot("v", variable, 0.0)
    step = slot("iterations", np.zeros((), np.int64), 0)
    step += 1
    t = float(step)
    lr_t = lr * np.sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t)
    m *= beta_1
    m += (1 - beta_1) * g
    v *= beta_2
    v += (1 - beta_2) * g * g
    variable -= (lr_t * m / (np.sqrt(v) + eps)).astype(variable.dtype)


#: The numbers each optimizer's config must hold.
_NUMBERS = {"SGD": ("learning_rate",),
            "Adagrad": ("learning_rate", "initial_accumulator_value", "epsilon"),
            "Adam": ("learning_rate", "beta_1", "beta_2", "epsilon")}

_RULES: dict[str, Callable[[dict[str, Any], np.ndarray, Any, Slot], None]] = {
    "SGD": _sgd, "Adagrad": _adagrad, "Adam": _adam,
}


Rule = Callable[[dict[str, Any], np.ndarray, Any, Slot], None]


def checked_rule(config: dict[str, Any]) -> Rule:
    """The update rule ``config`` names, once its numbers are checked."""
    rule = _RULES.get(config.get("name", ""))
    if rule is None:
        raise InvalidArgumentError(
            f"unknown optimizer {config.get('name')!r}; known: {sorted(_RULES)}"
        )
    bad = [key for key in _NUMBERS[config["name"]]
           if isinstance(config.get(key), bool) or not isinstance(config.get(key), int | float)]
    if bad:
        raise InvalidArgumentError(f"optimizer config {config!r:.200} needs numbers for {bad}")
    return rule


def apply_update(config: dict[str, Any], variable: np.ndarray, gradient: Any,
                 slot: Slot) -> None:
    """Apply one gradient to ``variable`` in place with the optimizer ``config`` names."""
    apply_rule(checked_rule(config), config, variable, gradient, slot)


def apply_rule(rule: Rule, config: dict[str, Any], variable: np.ndarray, gradient: Any,
               slot: Slot) -> None:
    """Apply one gradient to ``variable`` in place with ``rule`` (from :func:`checked_rule`)."""
    if not isinstance(gradient, IndexedSlices):
        rule(config, variable, _dense_gradient(variable, gradient), slot)
        return
    rows, g = _unique_rows(variable, gradient)
    if rule is _sgd and not config.get("momentum"):  # no slots: _sgd's arithmetic, in place
        part = take_rows(variable, rows)
        if np.may_share_memory(g, gradient.values) or not g.flags.writeable:  # the caller's
            g = g * config["learning_rate"]
        else:
            g *= config["learning_rate"]
        part -= g
        put_rows(variable, rows, part)
        return
    # Sparse ("lazy"): the dense rule on copies of the touched rows of the variable and of
    # its slots shaped like it, written back after.
    part = take_rows(variable, rows)
    touched: list[tuple[np.ndarray, np.ndarray]] = [(variable, part)]

    def slot_rows(name: str, like: np.ndarray, initial: float) -> np.ndarray:
        if like is not part:  # a slot of its own shape (Adam's step count)
            return slot(name, like, initial)
        whole = slot(name, variable, initial)
        touched.append((whole, take_rows(whole, rows)))
        return touched[-1][1]

    rule(config, part, g, slot_rows)
    for whole, rows_of_whole in touched:
        put_rows(whole, rows, rows_of_whole)
