"""Optimizer arithmetic on numpy arrays, run where the variables live (the parameter servers).

``apply_update(config, variable, gradient, slot)`` changes ``variable`` in place. ``config``
is an optimizer's plain-data description (``Optimizer.config``); ``gradient`` is a dense
array or an :class:`IndexedSlices` of rows; ``slot(name, like, initial)`` returns the
optimizer's state array ``name`` for this variable, creating it filled with ``initial``.
Sparse updates touch only the rows they name (for Adam, "lazy" Adam): weight decay and the
dense rule run on copies of those rows, which are then written back.

The arithmetic is Keras 3's. ``config["learning_rate"]`` is a number or a schedule (sent as
data); a schedule, like Adam's bias correction, reads the variable's own count of updates,
the scalar slot ``iterations``, kept only by the configs that read it. ``weight_decay``
(optional) makes an update first do ``variable -= variable * weight_decay * learning_rate``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from convoy._values.slices import IndexedSlices, put_rows, take_rows
from convoy.distribute._sparse_rows import scatter_add
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


def add_rows(target: np.ndarray, rows: Any, values: Any, scale: float) -> bool:
    """``target[rows[i]] += scale * values[i]`` for each i in turn, compiled, for a contiguous
    float32 or float64 ``target`` (rows within its first dimension: else IndexError, nothing
    changed; ``values`` as many rows: else ValueError); False, and nothing done, for any
    other target or non-integer rows."""
    rows = np.asarray(rows)
    if target.dtype not in _SCATTERED or not target.flags.c_contiguous or \
            not target.flags.writeable or target.ndim < 1 or rows.dtype.kind not in "iu":
        return False
    scatter_add(target, np.ascontiguousarray(rows, dtype=np.int64).reshape(-1),
                np.ascontiguousarray(values, dtype=target.dtype), scale)
    return True


_SCATTERED = (np.dtype(np.float32), np.dtype(np.float64))


def _sgd_rows(variable: np.ndarray, gradient: IndexedSlices, lr: float) -> None:
    """Plain SGD on the rows ``gradient`` names: each of its rows, scaled, taken from its
    variable row in turn (as TensorFlow's scatter_sub of them)."""
    indices = np.asarray(gradient.indices).reshape(-1)
    values = np.asarray(gradient.values, dtype=variable.dtype).reshape(
        (indices.size, *variable.shape[1:]))
    try:
        if add_rows(variable, indices, values, -lr):
            return
    except IndexError:
        pass  # _unique_rows names the rows out of range
    rows, g = _unique_rows(variable, IndexedSlices(values, indices))
    part = take_rows(variable, rows)
    part -= g * lr
    put_rows(variable, rows, part)


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


def _sgd(config: dict[str, Any], variable: np.ndarray, g: np.ndarray, slot: Slot, lr: float,
         step: int) -> None:
    momentum = config.get("momentum", 0.0)
    if momentum:
        velocity = slot("momentum", variable, 0.0)
        velocity *= momentum
        velocity -= lr * g
        variable += momentum * velocity - lr * g if config.get("nesterov") else velocity
    else:
        variable -= lr * g


def _adagrad(config: dict[str, Any], variable: np.ndarray, g: np.ndarray, slot: Slot,
             lr: float, step: int) -> None:
    accumulator = slot("accumulator", variable, config["initial_accumulator_value"])
    accumulator += g * g
    variable -= lr * g / np.sqrt(accumulator + config["epsilon"])  # Keras 3's, not TF 2's


def _adam(config: dict[str, Any], variable: np.ndarray, g: np.ndarray, slot: Slot, lr: float,
          step: int) -> None:
    beta_1, beta_2, eps = config["beta_1"], config["beta_2"], config["epsilon"]
    m, v = slot("m", variable, 0.0), slot("v", variable, 0.0)
    t = step + 1
    lr_t = lr * math.sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t)
    m *= beta_1
    m += (1 - beta_1) * g
    v *= beta_2
    v += (1 - beta_2) * g * g
    if config.get("amsgrad"):
        v_hat = slot("v_hat", variable, 0.0)
        np.maximum(v_hat, v, out=v_hat)
        v = v_hat
    variable -= lr_t * m / (np.sqrt(v) + eps)


def _rmsprop(config: dict[str, Any], variable: np.ndarray, g: np.ndarray, slot: Slot,
             lr: float, step: int) -> None:
    rho, momentum, eps = config["rho"], config["momentum"], config["epsilon"]
    velocity = slot("velocity", variable, 0.0)
    velocity *= rho
    velocity += (1 - rho) * g * g
    if config.get("centered"):
        average = slot("average_gradient", variable, 0.0)
        average *= rho
        average += (1 - rho) * g
        denominator = velocity - average * average + eps
    else:
        denominator = velocity + eps
    increment = lr * g / np.sqrt(denominator)
    if momentum > 0:
        accumulated = slot("rms_momentum", variable, 0.0)  # not SGD's "momentum": another sum
        accumulated *= momentum
        accumulated += increment
        variable -= accumulated
    else:
        variable -= increment


def _ftrl(config: dict[str, Any], variable: np.ndarray, g: np.ndarray, slot: Slot, lr: float,
          step: int) -> None:
    if lr <= 0:  # it divides by the rate
        raise InvalidArgumentError(f"Ftrl needs a positive learning rate, got {lr} at step "
                                   f"{step}")
    power = -config["learning_rate_power"]
    l1 = config["l1_regularization_strength"]
    l2 = config["l2_regularization_strength"] + config["beta"] / (2.0 * lr)
    accumulator = slot("accumulator", variable, config["initial_accumulator_value"])
    linear = slot("linear", variable, 0.0)
    shrunk = g + 2 * config["l2_shrinkage_regularization_strength"] * variable
    new_accumulator = accumulator + g * g
    new_power = np.power(new_accumulator, power)
    linear += shrunk - (new_power - np.power(accumulator, power)) / lr * variable
    quadratic = new_power / lr + 2 * l2
    variable[...] = (np.clip(linear, -l1, l1) - linear) / quadratic
    accumulator[...] = new_accumulator


Rule = Callable[[dict[str, Any], np.ndarray, np.ndarray, Slot, float, int], None]

_RULES: dict[str, Rule] = {"SGD": _sgd, "Adagrad": _adagrad, "Adam": _adam,
                           "RMSprop": _rmsprop, "Ftrl": _ftrl}

#: The numbers each optimizer's config must hold (besides its learning rate).
_NUMBERS = {"SGD": (),
            "Adagrad": ("initial_accumulator_value", "epsilon"),
            "Adam": ("beta_1", "beta_2", "epsilon"),
            "RMSprop": ("rho", "momentum", "epsilon"),
            "Ftrl": ("learning_rate_power", "initial_accumulator_value",
                     "l1_regularization_strength", "l2_regularization_strength",
                     "l2_shrinkage_regularization_strength", "beta")}

#: Rules that read the step (Adam's bias correction) whatever their learning rate.
_COUNTED = frozenset({"Adam"})


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float)


def checked_rule(config: dict[str, Any]) -> Rule:
    """The update rule ``config`` names, once its numbers are checked."""
    rule = _RULES.get(config.get("name", ""))
    if rule is None:
        raise InvalidArgumentError(
            f"unknown optimizer {config.get('name')!r}; known: {sorted(_RULES)}"
        )
    bad = [key for key in _NUMBERS[config["name"]] if not _is_number(config.get(key))]
    rate, decay = config.get("learning_rate"), config.get("weight_decay")
    if not (_is_number(rate) or callable(rate)):
        bad.append("learning_rate")
    if not (decay is None or _is_number(decay)):
        bad.append("weight_decay")
    if bad:
        raise InvalidArgumentError(f"optimizer config {config!r:.200} needs numbers for {bad}")
    return rule


def _learning_rate(config: dict[str, Any], step: int) -> float:
    """The learning rate of the update after ``step`` earlier ones."""
    rate = config["learning_rate"]
    if _is_number(rate):
        return float(rate)
    value = rate(step)  # a schedule, sent as data
    if not isinstance(value, int | float | np.floating) or not math.isfinite(value):
        raise InvalidArgumentError(f"learning rate schedule {rate!r:.200} gave {value!r} at "
                                   f"step {step}, not a finite number")
    return float(value)


def _step(config: dict[str, Any], slot: Slot) -> int:
    """The number of earlier updates of this variable (counted here when something reads
    it: a schedule, or Adam's bias correction), 0 when nothing does."""
    if config["name"] not in _COUNTED and _is_number(config["learning_rate"]):
        return 0
    count = slot("iterations", np.zeros((), np.int64), 0)
    step = int(count)
    count += 1
    return step


def apply_update(config: dict[str, Any], variable: np.ndarray, gradient: Any,
                 slot: Slot) -> None:
    """Apply one gradient to ``variable`` in place with the optimizer ``config`` names."""
    apply_rule(checked_rule(config), config, variable, gradient, slot)


def apply_rule(rule: Rule, config: dict[str, Any], variable: np.ndarray, gradient: Any,
               slot: Slot) -> None:
    """Apply one gradient to ``variable`` in place with ``rule`` (from :func:`checked_rule`)."""
    step = _step(config, slot)
    lr = _learning_rate(config, step)
    decay = config.get("weight_decay")
    if not isinstance(gradient, IndexedSlices):
        g = _dense_gradient(variable, gradient)
        if decay:
            variable -= variable * (decay * lr)
        rule(config, variable, g, slot, lr, step)
        return
    if rule is _sgd and not config.get("momentum") and not decay:  # in place, no slots
        _sgd_rows(variable, gradient, lr)
        return
    rows, g = _unique_rows(variable, gradient)
    # Sparse ("lazy"): weight decay and the dense rule on copies of the touched rows of the
    # variable and of its slots shaped like it, written back after.
    part = take_rows(variable, rows)
    touched: list[tuple[np.ndarray, np.ndarray]] = [(variable, part)]

    def slot_rows(name: str, like: np.ndarray, initial: float) -> np.ndarray:
        if like is not part:  # a slot of its own shape
            return slot(name, like, initial)
        whole = slot(name, variable, initial)
        touched.append((whole, take_rows(whole, rows)))
        return touched[-1][1]

    if decay:
        part -= part * (decay * lr)
    rule(config, part, g, slot_rows, lr, step)
    for whole, rows_of_whole in touched:
        put_rows(whole, rows, rows_of_whole)
