"""Optimizers whose updates run on the parameter servers, next to variables and slots, with
Keras 3's names, defaults and arithmetic (checked against Keras's numbers).

``apply_gradients(grads_and_vars)`` sends, per store (parameter server), one call holding all
of that store's updates; dense gradients are arrays, sparse ones :class:`IndexedSlices`.
Each call also adds one to the optimizer's ``iterations`` counter, in the same call when the
counter's parameter server has updates anyway.

Every optimizer takes Keras 3's ``weight_decay``, ``clipnorm``, ``clipvalue`` and
``global_clipnorm``, and a ``learning_rate`` that is a number, a schedule of
:mod:`convoy.train.schedules` (``cv.optimizers.schedules``) or a callable of the step.

Sparse gradients update only their rows ("lazy"): the rows' values and slots change and
every other row stays as it is, for every rule and for weight decay; repeated rows are
summed first. Keras 3 instead densifies a sparse gradient for SGD with momentum, Adam(W),
RMSprop and Ftrl, and applies weight decay to every row, so there the rows a gradient does
not name keep moving (momentum, decaying moments, Ftrl's first-step projection); the rows it
names get the same numbers in both.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from convoy._base import check
from convoy._values.slices import IndexedSlices, owned, take_rows
from convoy.distribute import _operations as ops
from convoy.distribute._dynamic_table import DynamicTable
from convoy.distribute._store_clients import LocalStore, Store, send_updates
from convoy.distribute.variables import ShardedVariable, Variable
from convoy.errors import InvalidArgumentError
from convoy.train import schedules
from convoy.train.schedules import number

__all__ = ["SGD", "Adagrad", "Adam", "AdamW", "Ftrl", "Optimizer", "RMSprop", "schedules"]

log = logging.getLogger(__name__)
_ONE = np.int64(1)


def _split_sharded(gradient: Any, variable: ShardedVariable) -> list[tuple[Any, Variable]]:
    """A gradient for a sharded variable as gradients for its shards (arrays of its own,
    checked)."""
    shards = variable.variables
    if isinstance(gradient, IndexedSlices):
        delta = gradient.checked("gradient", variable.shape[1:])
        # a pull's gradient has the pull's own flat ids, whose routes the variable remembers
        flat = delta.indices if delta.indices.ndim == 1 else delta.indices.reshape(-1)
        values = delta.values.reshape((flat.size, *variable.shape[1:]))
        routed = {s: (positions, rows) for s, positions, rows in variable.route(flat)}
        # Shards without rows get an empty update: per-variable optimizer state (Adam's step
        # count) then advances on every shard, as it would on an unsharded variable.
        nothing = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        pairs = []
        for s, shard in enumerate(shards):
            positions, rows = routed.get(s, nothing)
            pairs.append((IndexedSlices(take_rows(values, positions), rows), shard))
        return pairs
    parts = [np.array(part) for part in variable._split(gradient)]  # _split checks dtype, shape
    return list(zip(parts, shards))


class Optimizer:
    """Base of the optimizers: ``apply_gradients`` sends each gradient to its variable's
    parameter server, which applies the rule of ``config`` (plain data) there.

    ``iterations`` counts ``apply_gradients`` calls. Made in a strategy's scope (as
    TensorFlow requires of optimizers), it is a variable on a parameter server that every
    worker's steps count on, saved and restored with a Checkpoint holding the optimizer.
    Made outside any scope it lives in this process and counts only this process's calls.
    A call is counted when its updates are sent (in the same message as those for the
    counter's parameter server): one refused by another parameter server still counts.

    ``learning_rate``, as in Keras, is the rate of the update after ``iterations`` earlier
    ones. A number costs nothing. A schedule of :mod:`convoy.train.schedules` travels inside
    ``config`` and is evaluated on the parameter server at that variable's own count of
    updates (kept beside its slots, saved with them): without a round trip to the counter's
    server, and the same as ``iterations`` when every call updates every variable (the
    usual loop; a sharded variable counts on every shard). A variable left out of some calls
    (a ``None`` gradient) counts only its own updates. Any other callable (a user's own
    schedule too) is called here, with ``int(iterations)`` (Keras 3 calls a plain callable
    without arguments): one read of the counter per call when it lives on a parameter
    server.

    ``clipnorm`` (each gradient's norm), ``global_clipnorm`` (the norm of all of a call's
    gradients together) and ``clipvalue`` (each element) clip gradients in this process
    before they are sent, at most one of them, as Keras's; a sparse gradient's norm is that
    of its values as given. ``weight_decay`` makes each update first do
    ``variable -= variable * weight_decay * learning_rate`` (Keras's decoupled decay), on the
    parameter server.
    """

    config: dict[str, Any]

    def __init__(self, name: str, learning_rate: Any, weight_decay: float | None,
                 clipnorm: float | None, clipvalue: float | None,
                 global_clipnorm: float | None, **numbers: Any) -> None:
        clips = {"clipnorm": clipnorm, "clipvalue": clipvalue,
                 "global_clipnorm": global_clipnorm}
        given = [k for k, v in clips.items() if v is not None]
        if len(given) > 1:
            raise InvalidArgumentError(f"only one of clipnorm, clipvalue and global_clipnorm "
                                       f"can be set, got {given}")
        self.clipnorm, self.clipvalue, self.global_clipnorm = (
            None if v is None else number(k, v, 0, above=True) for k, v in clips.items())
        self.weight_decay = None if weight_decay is None else \
            number("weight_decay", weight_decay, 0)
        rate, self._rate_function = _learning_rate(learning_rate)
        self.config = {"name": name, "learning_rate": rate,
                       "weight_decay": self.weight_decay, **numbers}
        self.iterations: Variable | None = Variable(np.int64(0), name="iterations",
                                                    trainable=False)
        self._warned = False

    @property
    def learning_rate(self) -> float:
        """The learning rate of the next update (a schedule's at ``iterations``)."""
        rate = self._rate_function or self.config["learning_rate"]
        return float(rate(self._step())) if callable(rate) else rate

    def _step(self) -> int:
        if self.iterations is None:
            raise InvalidArgumentError(
                "this optimizer's learning_rate is a function of iterations, which this "
                "process does not have: create the optimizer inside strategy.scope()")
        return int(self.iterations)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self.iterations is not None and isinstance(self.iterations.handle.store, LocalStore):
            if not self._warned:
                self._warned = True
                log.warning("an optimizer made outside strategy.scope() is used on workers: "
                            "its iterations counter lives in this process and does not count "
                            "their steps; create the optimizer inside strategy.scope()")
            state["iterations"] = None
        return state

    def _current_config(self) -> dict[str, Any]:
        """``config`` with a callable learning rate evaluated at ``iterations``."""
        if self._rate_function is None:
            return self.config
        rate = self._rate_function(self._step())
        if isinstance(rate, bool) or not isinstance(rate, int | float | np.floating) \
                or not math.isfinite(rate):
            raise InvalidArgumentError(f"learning_rate {self._rate_function!r:.100} gave "
                                       f"{rate!r}, not a finite number")
        return {**self.config, "learning_rate": float(rate)}

    def apply_gradients(self, grads_and_vars: Iterable[tuple[Any, Any]]) -> None:
        """Apply each gradient to its variable and count one iteration; one call per
        parameter server touched.

        In a scheduled function the calls are sent without waiting for them: the function
        counts as done once they are applied, and fails with their error if one fails.
        """
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        for _, variable in pairs:
            if not isinstance(variable, Variable | ShardedVariable | DynamicTable):
                raise InvalidArgumentError(
                    f"apply_gradients takes (gradient, variable) pairs, got a "
                    f"{type(variable).__name__} as a variable"
                )
        if self.clipnorm or self.clipvalue or self.global_clipnorm:
            pairs = list(zip(self._clipped([g for g, _ in pairs]), [v for _, v in pairs]))
        by_store: dict[int, list[tuple[str, Any]]] = defaultdict(list)
        stores: dict[int, Store] = {}
        for gradient, variable in pairs:
            for grad, var in _routed(gradient, variable):
                store, key = var.handle
                stores[id(store)] = store
                by_store[id(store)].append((key, grad))
        config = self._current_config() if by_store else self.config
        operations: dict[int, list[ops.Operation]] = {
            k: [ops.Apply(config, updates)] for k, updates in by_store.items()}
        if operations and self.iterations is not None:
            store, key = self.iterations.handle
            stores.setdefault(id(store), store)
            operations.setdefault(id(store), []).append(ops.AssignAdd(key, _ONE))
        send_updates([(stores[k], batch) for k, batch in operations.items()])

    def _clipped(self, gradients: list[Any]) -> list[Any]:
        """The gradients clipped as ``clipnorm``, ``clipvalue`` or ``global_clipnorm`` say."""
        values = [_values(g) for g in gradients]
        if self.clipvalue:
            return [_with_values(g, np.clip(v, -self.clipvalue, self.clipvalue))
                    for g, v in zip(gradients, values)]
        if self.clipnorm:
            return [_with_values(g, _scaled(v, self.clipnorm / max(_norm(v), self.clipnorm)))
                    for g, v in zip(gradients, values)]
        assert self.global_clipnorm
        total = math.sqrt(sum(_norm(v) ** 2 for v in values))
        scale = self.global_clipnorm / max(total, self.global_clipnorm) if math.isfinite(
            total) else math.nan
        return [_with_values(g, _scaled(v, scale)) for g, v in zip(gradients, values)]


def _values(gradient: Any) -> np.ndarray:
    values = gradient.values if isinstance(gradient, IndexedSlices) else gradient
    values = np.asarray(values)
    return values if values.dtype.kind == "f" else values.astype(np.float32)


def _with_values(gradient: Any, values: np.ndarray) -> Any:
    if isinstance(gradient, IndexedSlices):
        return IndexedSlices(values, gradient.indices, gradient.dense_shape)
    return values


def _norm(values: np.ndarray) -> float:
    return math.sqrt(float(np.sum(np.square(values, dtype=np.float64))))


def _scaled(values: np.ndarray, scale: float) -> np.ndarray:
    return (values * scale).astype(values.dtype, copy=False)


def _routed(gradient: Any, variable: Any) -> list[tuple[Any, Variable]]:
    """(gradient, variable) as the gradients of the variables (shards) it updates, each an
    array or IndexedSlices of its own, checked."""
    if isinstance(variable, ShardedVariable):
        return _split_sharded(gradient, variable)
    if isinstance(variable, DynamicTable):  # rows by id, on the shards the ids hash to
        if not isinstance(gradient, IndexedSlices):
            raise InvalidArgumentError(f"a dynamic table's gradient must be an IndexedSlices "
                                       f"of rows by id, got {type(gradient).__name__}")
        return variable.updates(gradient)  # type: ignore[return-value]
    if isinstance(gradient, IndexedSlices):
        return [(owned(gradient).checked("gradient", variable.shape[1:]), variable)]
    return [(np.asarray(owned(gradient), dtype=variable.dtype), variable)]


def _learning_rate(value: Any) -> tuple[Any, Callable[[int], Any] | None]:
    """(what config holds, the callable this process evaluates, or None) for a
    ``learning_rate`` argument."""
    if type(value) in _SCHEDULES:  # plain data: evaluated on the parameter servers
        return value, None
    if callable(value):
        return None, value
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not math.isfinite(value) or value <= 0:
        raise InvalidArgumentError(f"learning_rate must be a positive number, a schedule of "
                                   f"cv.optimizers.schedules or a callable of the step, got "
                                   f"{value!r}")
    return float(value), None


#: Schedules the parameter servers evaluate (they can unpickle them).
_SCHEDULES = frozenset({schedules.ExponentialDecay, schedules.PiecewiseConstantDecay,
                        schedules.CosineDecay, schedules.InverseTimeDecay,
                        schedules.PolynomialDecay})


def _fraction(name: str, value: Any) -> float:
    """``value`` as a float in [0, 1)."""
    value = number(name, value, 0)
    if value >= 1:
        raise InvalidArgumentError(f"{name} must be in [0, 1), got {value!r}")
    return value


class SGD(Optimizer):
    """Gradient descent, with optional (Nesterov) momentum."""

    def __init__(self, learning_rate: Any = 0.01, momentum: float = 0.0,
                 nesterov: bool = False, weight_decay: float | None = None,
                 clipnorm: float | None = None, clipvalue: float | None = None,
                 global_clipnorm: float | None = None) -> None:
        super().__init__("SGD", learning_rate, weight_decay, clipnorm, clipvalue,
                         global_clipnorm, momentum=_fraction("momentum", momentum),
                         nesterov=check.boolean("nesterov", nesterov))


class Adagrad(Optimizer):
    """Adagrad: per-coordinate rates from the sum of squared gradients."""

    def __init__(self, learning_rate: Any = 0.001, initial_accumulator_value: float = 0.1,
                 epsilon: float = 1e-7, weight_decay: float | None = None,
                 clipnorm: float | None = None, clipvalue: float | None = None,
                 global_clipnorm: float | None = None) -> None:
        super().__init__("Adagrad", learning_rate, weight_decay, clipnorm, clipvalue,
                         global_clipnorm,
                         initial_accumulator_value=number(
                             "initial_accumulator_value", initial_accumulator_value, 0),
                         epsilon=number("epsilon", epsilon, 0))


class Adam(Optimizer):
    """Adam, with AMSGrad's running maximum of ``v`` if ``amsgrad``."""

    def __init__(self, learning_rate: Any = 0.001, beta_1: float = 0.9,
                 beta_2: float = 0.999, epsilon: float = 1e-7, amsgrad: bool = False,
                 weight_decay: float | None = None, clipnorm: float | None = None,
                 clipvalue: float | None = None, global_clipnorm: float | None = None) -> None:
        super().__init__("Adam", learning_rate, weight_decay, clipnorm, clipvalue, global_clipnorm,
                         beta_1=_fraction("beta_1", beta_1),
                         beta_2=_fraction("beta_2", beta_2),
                         epsilon=number("epsilon", epsilon, 0),
                         amsgrad=check.boolean("amsgrad", amsgrad))


class AdamW(Adam):
    """Adam with decoupled weight decay (``weight_decay`` required, 0.004 by default)."""

    def __init__(self, learning_rate: Any = 0.001, weight_decay: float = 0.004,
                 beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-7,
                 amsgrad: bool = False, clipnorm: float | None = None,
                 clipvalue: float | None = None, global_clipnorm: float | None = None) -> None:
        if weight_decay is None:
            raise InvalidArgumentError("AdamW's weight_decay must be a number, got None")
        super().__init__(learning_rate, beta_1, beta_2, epsilon, amsgrad, weight_decay,
                         clipnorm, clipvalue, global_clipnorm)


class RMSprop(Optimizer):
    """RMSprop: gradients divided by the root of their moving mean square (less the square
    of their moving mean if ``centered``), accumulated with ``momentum``."""

    def __init__(self, learning_rate: Any = 0.001, rho: float = 0.9, momentum: float = 0.0,
                 epsilon: float = 1e-7, centered: bool = False,
                 weight_decay: float | None = None, clipnorm: float | None = None,
                 clipvalue: float | None = None, global_clipnorm: float | None = None) -> None:
        super().__init__("RMSprop", learning_rate, weight_decay, clipnorm, clipvalue,
                         global_clipnorm, rho=_fraction("rho", rho),
                         momentum=_fraction("momentum", momentum),
                         epsilon=number("epsilon", epsilon, 0),
                         centered=check.boolean("centered", centered))


class Ftrl(Optimizer):
    """Follow The Regularized Leader (McMahan et al., 2013), with L1, L2 and L2-shrinkage
    regularization: the recommender classic for wide, sparse models."""

    def __init__(self, learning_rate: Any = 0.001, learning_rate_power: float = -0.5,
                 initial_accumulator_value: float = 0.1,
                 l1_regularization_strength: float = 0.0,
                 l2_regularization_strength: float = 0.0,
                 l2_shrinkage_regularization_strength: float = 0.0, beta: float = 0.0,
                 weight_decay: float | None = None, clipnorm: float | None = None,
                 clipvalue: float | None = None, global_clipnorm: float | None = None) -> None:
        power = number("learning_rate_power", learning_rate_power)
        if power > 0:
            raise InvalidArgumentError(f"learning_rate_power must be <= 0, got {power!r}")
        super().__init__(
            "Ftrl", learning_rate, weight_decay, clipnorm, clipvalue, global_clipnorm,
            learning_rate_power=power,
            initial_accumulator_value=number("initial_accumulator_value",
                                             initial_accumulator_value, 0),
            l1_regularization_strength=number("l1_regularization_strength",
                                              l1_regularization_strength, 0),
            l2_regularization_strength=number("l2_regularization_strength",
                                              l2_regularization_strength, 0),
            l2_shrinkage_regularization_strength=number(
                "l2_shrinkage_regularization_strength", l2_shrinkage_regularization_strength, 0),
            beta=number("beta", beta, 0))
