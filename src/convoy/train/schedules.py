"""Learning rates that change with the step, as Keras 3's ``keras.optimizers.schedules``.

A schedule is called with the optimizer's step (its ``iterations`` before the update) and
returns the learning rate of that update. Schedules are plain data (their ``get_config()``),
so an optimizer sends them to the parameter servers, which evaluate them there: see
:class:`convoy.train.optimizers.Optimizer` for which step they see.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from convoy.errors import InvalidArgumentError

__all__ = ["CosineDecay", "ExponentialDecay", "InverseTimeDecay", "LearningRateSchedule",
           "PiecewiseConstantDecay", "PolynomialDecay"]


def number(name: str, value: Any, minimum: float | None = None, above: bool = False) -> float:
    """``value`` as a float (not a bool), at least (or, ``above``, more than) ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value):
        raise InvalidArgumentError(f"{name} must be a finite number, got {value!r} "
                                   f"({type(value).__name__})")
    if minimum is not None and (value <= minimum if above else value < minimum):
        raise InvalidArgumentError(f"{name} must be {'>' if above else '>='} {minimum}, got "
                                   f"{value!r}")
    return float(value)


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be True or False, got {value!r}")
    return value


class LearningRateSchedule:
    """Base of the schedules: ``schedule(step)`` is the learning rate at ``step``."""

    def __call__(self, step: int) -> float:
        raise NotImplementedError(f"{type(self).__name__} does not define __call__")

    def get_config(self) -> dict[str, Any]:
        """The constructor's arguments, as plain data."""
        raise NotImplementedError(f"{type(self).__name__} does not define get_config")

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LearningRateSchedule:
        """The schedule ``get_config()`` described."""
        return cls(**config)

    def __repr__(self) -> str:
        arguments = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({arguments})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LearningRateSchedule) and type(other) is type(self) and \
            other.get_config() == self.get_config()

    def __hash__(self) -> int:
        return hash((type(self).__name__, repr(self.get_config())))


class ExponentialDecay(LearningRateSchedule):
    """``initial_learning_rate * decay_rate ** (step / decay_steps)``, the exponent an
    integer if ``staircase``."""

    def __init__(self, initial_learning_rate: float, decay_steps: float, decay_rate: float,
                 staircase: bool = False, name: str = "ExponentialDecay") -> None:
        self.initial_learning_rate = number("initial_learning_rate", initial_learning_rate)
        self.decay_steps = number("decay_steps", decay_steps, 0, above=True)
        self.decay_rate = number("decay_rate", decay_rate)
        self.staircase = _flag("staircase", staircase)
        self.name = name

    def __call__(self, step: int) -> float:
        p = step / self.decay_steps
        return self.initial_learning_rate * self.decay_rate ** (
            math.floor(p) if self.staircase else p)

    def get_config(self) -> dict[str, Any]:
        return {"initial_learning_rate": self.initial_learning_rate,
                "decay_steps": self.decay_steps, "decay_rate": self.decay_rate,
                "staircase": self.staircase, "name": self.name}


class PiecewiseConstantDecay(LearningRateSchedule):
    """``values[0]`` up to step ``boundaries[0]`` (included), ``values[1]`` up to
    ``boundaries[1]``, ..., ``values[-1]`` after the last boundary."""

    def __init__(self, boundaries: list[float], values: list[float],
                 name: str = "PiecewiseConstant") -> None:
        if not isinstance(boundaries, list | tuple) or not isinstance(values, list | tuple):
            raise InvalidArgumentError(f"boundaries and values must be lists, got "
                                       f"{boundaries!r} and {values!r}")
        if len(boundaries) != len(values) - 1:
            raise InvalidArgumentError(
                f"values must have one more element than boundaries, got {len(values)} "
                f"values and {len(boundaries)} boundaries")
        self.boundaries = [number("boundaries", b) for b in boundaries]
        if any(b > a for b, a in zip(self.boundaries, self.boundaries[1:])):
            raise InvalidArgumentError(f"boundaries must be increasing, got {boundaries!r}")
        self.values = [number("values", v) for v in values]
        self.name = name

    def __call__(self, step: int) -> float:
        for boundary, value in zip(self.boundaries, self.values):
            if step <= boundary:
                return value
        return self.values[-1]

    def get_config(self) -> dict[str, Any]:
        return {"boundaries": list(self.boundaries), "values": list(self.values),
                "name": self.name}


class CosineDecay(LearningRateSchedule):
    """A linear warm-up from ``initial_learning_rate`` to ``warmup_target`` over
    ``warmup_steps`` (if ``warmup_target`` is given), then a cosine decay over
    ``decay_steps`` from there down to ``alpha`` times it."""

    def __init__(self, initial_learning_rate: float, decay_steps: float, alpha: float = 0.0,
                 name: str = "CosineDecay", warmup_target: float | None = None,
                 warmup_steps: float = 0) -> None:
        self.initial_learning_rate = number("initial_learning_rate", initial_learning_rate)
        self.decay_steps = number("decay_steps", decay_steps, 0, above=True)
        self.alpha = number("alpha", alpha)
        self.name = name
        self.warmup_target = None if warmup_target is None else \
            number("warmup_target", warmup_target)
        self.warmup_steps = number("warmup_steps", warmup_steps, 0)

    def _decayed(self, step: float, start: float) -> float:
        cosine = 0.5 * (1.0 + math.cos(math.pi * step / self.decay_steps))
        return start * ((1 - self.alpha) * cosine + self.alpha)

    def __call__(self, step: int) -> float:
        if self.warmup_target is None:
            return self._decayed(min(step, self.decay_steps), self.initial_learning_rate)
        at = min(step, self.decay_steps + self.warmup_steps)
        if at < self.warmup_steps:
            return self.initial_learning_rate + (
                self.warmup_target - self.initial_learning_rate) * at / self.warmup_steps
        return self._decayed(at - self.warmup_steps, self.warmup_target)

    def get_config(self) -> dict[str, Any]:
        return {"initial_learning_rate": self.initial_learning_rate,
                "decay_steps": self.decay_steps, "alpha": self.alpha, "name": self.name,
                "warmup_target": self.warmup_target, "warmup_steps": self.warmup_steps}


class InverseTimeDecay(LearningRateSchedule):
    """``initial_learning_rate / (1 + decay_rate * step / decay_steps)``, the quotient an
    integer if ``staircase``."""

    def __init__(self, initial_learning_rate: float, decay_steps: float, decay_rate: float,
                 staircase: bool = False, name: str = "InverseTimeDecay") -> None:
        self.initial_learning_rate = number("initial_learning_rate", initial_learning_rate)
        self.decay_steps = number("decay_steps", decay_steps, 0, above=True)
        self.decay_rate = number("decay_rate", decay_rate)
        self.staircase = _flag("staircase", staircase)
        self.name = name

    def __call__(self, step: int) -> float:
        p = step / self.decay_steps
        return self.initial_learning_rate / (
            1 + self.decay_rate * (math.floor(p) if self.staircase else p))

    def get_config(self) -> dict[str, Any]:
        return {"initial_learning_rate": self.initial_learning_rate,
                "decay_steps": self.decay_steps, "decay_rate": self.decay_rate,
                "staircase": self.staircase, "name": self.name}


class PolynomialDecay(LearningRateSchedule):
    """From ``initial_learning_rate`` to ``end_learning_rate`` over ``decay_steps`` along
    ``(1 - step / decay_steps) ** power``; then ``end_learning_rate``, or, with ``cycle``,
    again over the next multiple of ``decay_steps``."""

    def __init__(self, initial_learning_rate: float, decay_steps: float,
                 end_learning_rate: float = 0.0001, power: float = 1.0, cycle: bool = False,
                 name: str = "PolynomialDecay") -> None:
        self.initial_learning_rate = number("initial_learning_rate", initial_learning_rate)
        self.decay_steps = number("decay_steps", decay_steps, 0, above=True)
        self.end_learning_rate = number("end_learning_rate", end_learning_rate)
        self.power = number("power", power)
        self.cycle = _flag("cycle", cycle)
        self.name = name

    def __call__(self, step: int) -> float:
        decay_steps, at = self.decay_steps, float(step)
        if self.cycle:
            decay_steps *= 1.0 if step == 0 else math.ceil(step / self.decay_steps)
        else:
            at = min(at, decay_steps)
        fraction = (1 - at / decay_steps) ** self.power
        return (self.initial_learning_rate - self.end_learning_rate) * fraction \
            + self.end_learning_rate

    def get_config(self) -> dict[str, Any]:
        return {"initial_learning_rate": self.initial_learning_rate,
                "decay_steps": self.decay_steps, "end_learning_rate": self.end_learning_rate,
                "power": self.power, "cycle": self.cycle, "name": self.name}
