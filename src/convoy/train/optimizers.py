"""Optimizers whose updates run on the parameter servers, next to variables and slots.

``apply_gradients(grads_and_vars)`` sends, per store (parameter server), one call holding all
of that store's updates; dense gradients are arrays, sparse ones :class:`IndexedSlices`.
Each call also adds one to the optimizer's ``iterations`` counter, in the same call when the
counter's parameter server has updates anyway.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

from convoy import _check as check
from convoy._slices import IndexedSlices, owned, take_rows
from convoy.distribute._store_clients import LocalStore, send_updates
from convoy.distribute.variables import ShardedVariable, Variable
from convoy.errors import InvalidArgumentError

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
    """Base: subclasses set ``config``, the plain-data description the servers apply, then
    call ``super().__init__()``.

    ``iterations`` counts ``apply_gradients`` calls. Made in a strategy's scope (as
    TensorFlow requires of optimizers), it is a variable on a parameter server that every
    worker's steps count on, saved and restored with a Checkpoint holding the optimizer.
    Made outside any scope it lives in this process and counts only this process's calls.
    A call is counted when its updates are sent (in the same message as those for the
    counter's parameter server): one refused by another parameter server still counts.
    """

    config: dict[str, Any]

    def __init__(self) -> None:
        self.iterations: Variable | None = Variable(np.int64(0), name="iterations",
                                                    trainable=False)
        self._warned = False

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self.iterations is not None and isinstance(self.iterations._store, LocalStore):
            if not self._warned:
                self._warned = True
                log.warning("an optimizer made outside strategy.scope() is used on workers: "
                            "its iterations counter lives in this process and does not count "
                            "their steps; create the optimizer inside strategy.scope()")
            state["iterations"] = None
        return state

    def apply_gradients(self, grads_and_vars: Iterable[tuple[Any, Any]]) -> None:
        """Apply each gradient to its variable and count one iteration; one call per
        parameter server touched.

        In a scheduled function the calls are sent without waiting for them: the function
        counts as done once they are applied, and fails with their error if one fails.
        """
        by_store: dict[int, list[tuple[str, Any]]] = defaultdict(list)
        stores: dict[int, Any] = {}
        for gradient, variable in grads_and_vars:
            if gradient is None:
                continue
            if isinstance(variable, ShardedVariable):
                pairs = _split_sharded(gradient, variable)
            elif not isinstance(variable, Variable):
                raise InvalidArgumentError(
                    f"apply_gradients takes (gradient, variable) pairs, got a "
                    f"{type(variable).__name__} as a variable"
                )
            elif isinstance(gradient, IndexedSlices):
                pairs = [(owned(gradient).checked("gradient", variable.shape[1:]), variable)]
            else:
                pairs = [(np.asarray(owned(gradient), dtype=variable.dtype), variable)]
            for grad, var in pairs:
                stores[id(var._store)] = var._store
                by_store[id(var._store)].append((var._key, grad))
        operations: dict[int, list[tuple[Any, ...]]] = {
            k: [("apply", self.config, updates)] for k, updates in by_store.items()}
        counter = self.iterations
        if operations and counter is not None:
            stores.setdefault(id(counter._store), counter._store)
            operations.setdefault(id(counter._store), []).append(
                ("assign_add", counter._key, _ONE))
        send_updates([(stores[k], ops) for k, ops in operations.items()])


def _rate(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise InvalidArgumentError(f"learning_rate must be a positive number, got {value!r}")
    return float(value)


class SGD(Optimizer):
    """Gradient descent, with optional (Nesterov) momentum."""

    def __init__(self, learning_rate: float = 0.01, momentum: float = 0.0,
                 nesterov: bool = False) -> None:
        if not 0 <= momentum < 1:
            raise InvalidArgumentError(f"momentum must be in [0, 1), got {momentum!r}")
        self.config = {"name": "SGD", "learning_rate": _rate(learning_rate),
                       "momentum": float(momentum),
                       "nesterov": check.boolean("nesterov", nesterov)}
        super().__init__()


class Adagrad(Optimizer):
    """Adagrad: per-coordinate rates from the sum of squared gradients."""

    def __init__(self, learning_rate: float = 0.001, initial_accumulator_value: float = 0.1,
                 epsilon: float = 1e-7) -> None:
        if initial_accumulator_value < 0:
            raise InvalidArgumentError("initial_accumulator_value must be >= 0, got "
                                       f"{initial_accumulator_value!r}")
        self.config = {"name": "Adagrad", "learning_rate": _rate(learning_rate),
                       "initial_accumulator_value": float(initial_accumulator_value),
                       "epsilon": float(epsilon)}
        super().__init__()


class Adam(Optimizer):
    """Adam; sparse gradients update only their rows' moments ("lazy" Adam)."""

    def __init__(self, learning_rate: float = 0.001, beta_1: float = 0.9,
                 beta_2: float = 0.999, epsilon: float = 1e-7) -> None:
        for name, value in (("beta_1", beta_1), ("beta_2", beta_2)):
            if not 0 <= value < 1:
                raise InvalidArgumentError(f"{name} must be in [0, 1), got {value!r}")
        self.config = {"name": "Adam", "learning_rate": _rate(learning_rate),
                       "beta_1": float(beta_1), "beta_2": float(beta_2),
                       "epsilon": float(epsilon)}
        super().__init__()
