"""``Options`` as TensorFlow's ``tf.data.Options``: groups of settings for a whole pipeline.

Each option is None until set; ``merge`` (and ``Dataset.options()``, which merges every
``with_options`` of a pipeline) lets a later setting win. Setting a name an options object
does not have raises AttributeError, as TensorFlow's do. Options that convoy has nothing to
act on are accepted so that ported code runs; their docstrings say why they have no effect.
"""

from __future__ import annotations

import contextvars
import enum
from collections.abc import Callable
from typing import Any

from convoy.errors import InvalidArgumentError


class AutoShardPolicy(enum.IntEnum):
    """How a distributed input is sharded: TensorFlow's ``tf.data.experimental.AutoShardPolicy``
    (the same values)."""

    OFF = -1
    AUTO = 0
    FILE = 1
    DATA = 2
    HINT = 3


def _boolean(name: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {value!r}")
        return value
    return check


def _integer(name: str, minimum: int) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r}")
        if value < minimum:
            raise InvalidArgumentError(f"{name} must be >= {minimum}, got {value}")
        return value
    return check


def _policy(value: Any) -> AutoShardPolicy:
    if isinstance(value, str) and value.upper() in AutoShardPolicy.__members__:
        return AutoShardPolicy[value.upper()]
    try:
        return AutoShardPolicy(value)
    except ValueError:
        raise InvalidArgumentError(
            f"auto_shard_policy must be an AutoShardPolicy (OFF, AUTO, FILE, DATA, HINT), got "
            f"{value!r}") from None


class OptionsBase:
    """Settings named in ``_checks`` (each a validator), None until set."""

    _checks: dict[str, Callable[[Any], Any]] = {}
    _groups: dict[str, type[OptionsBase]] = {}

    def __init__(self, **kwargs: Any) -> None:
        object.__setattr__(self, "_values", {name: group() for name, group in
                                             self._groups.items()})
        for name, value in kwargs.items():
            if not self._known(name):
                raise TypeError(f"{type(self).__name__}() got an unexpected keyword argument "
                                f"{name!r}")
            setattr(self, name, value)

    def _known(self, name: str) -> bool:
        return name in self._checks or name in self._groups or \
            isinstance(getattr(type(self), name, None), property)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or not (name in self._checks or name in self._groups):
            raise AttributeError(f"{type(self).__name__} has no option {name!r}")
        return self._values.get(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_frozen"):
            raise ValueError(f"{type(self).__name__} returned by Dataset.options() cannot be "
                             f"changed: set options on a new Options and pass it to "
                             f"with_options")
        if isinstance(getattr(type(self), name, None), property):
            object.__setattr__(self, name, value)
        elif name in self._groups:
            if not isinstance(value, self._groups[name]):
                raise TypeError(f"{name} must be a {self._groups[name].__name__}, got "
                                f"{value!r}")
            self._values[name] = value
        elif name in self._checks:
            self._values[name] = None if value is None else self._checks[name](value)
        else:
            raise AttributeError(f"Cannot set the property {name} on {type(self).__name__}.")

    def frozen(self) -> Any:
        """This object, made immutable (as ``Dataset.options()`` returns it, as TensorFlow
        does): setting an option raises ValueError."""
        for group in self._groups:
            self._values[group].frozen()
        object.__setattr__(self, "_frozen", True)
        return self

    def merge(self, other: Any) -> Any:
        """A new options object: ``other``'s settings over this one's."""
        if not isinstance(other, type(self)):
            raise TypeError(f"{type(self).__name__}.merge takes a {type(self).__name__}, "
                            f"got {type(other).__name__}")
        result = type(self)()
        for name in self._groups:
            result._values[name] = self._values[name].merge(other._values[name])
        for name in self._checks:
            mine, theirs = self._values.get(name), other._values.get(name)
            result._values[name] = mine if theirs is None else theirs
        return result

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._set() == other._set()

    def _set(self) -> dict[str, Any]:
        return {k: v for k, v in self._values.items() if v is not None}

    def __hash__(self) -> int:
        return hash((type(self).__name__, repr(self)))

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in sorted(self._values.items())
                          if v is not None and not (isinstance(v, OptionsBase)
                                                    and v == type(v)()))
        return f"{type(self).__name__}({shown})"


class ThreadingOptions(OptionsBase):
    """``max_intra_op_parallelism`` and ``private_threadpool_size``: accepted, no effect.
    TensorFlow sizes its op kernels' thread pools with them; convoy's ops are numpy calls on
    the calling thread, and its parallel ``map``/``interleave`` share one process-wide pool,
    whose size ``num_parallel_calls`` bounds per op."""

    _checks = {"max_intra_op_parallelism": _integer("max_intra_op_parallelism", 1),
               "private_threadpool_size": _integer("private_threadpool_size", 0)}


class DistributeOptions(OptionsBase):
    """``auto_shard_policy`` (an :class:`AutoShardPolicy`) and ``num_devices``: recorded, no
    effect. TensorFlow applies them when a ``tf.distribute`` strategy shards the input;
    convoy's data service shards by the ``processing_mode`` its ``distribute`` takes
    (``ShardingPolicy``), and its ``shard`` by the arguments given."""

    _checks = {"auto_shard_policy": _policy, "num_devices": _integer("num_devices", 1)}


class OptimizationOptions(OptionsBase):
    """TensorFlow's graph rewrites (fusions, parallelization, prefetch injection ...):
    accepted, no effect. convoy runs the pipeline as written; it has no graph rewriter."""

    _checks = {name: _boolean(name) for name in (
        "apply_default_optimizations", "filter_fusion", "filter_parallelization",
        "inject_prefetch", "map_and_batch_fusion", "map_and_filter_fusion", "map_fusion",
        "map_parallelization", "noop_elimination", "parallel_batch", "seq_interleave_prefetch",
        "shuffle_and_repeat_fusion", "warm_start")}


class AutotuneOptions(OptionsBase):
    """``enabled``, ``cpu_budget``, ``ram_budget`` and ``autotune_algorithm``: accepted, no
    effect. convoy has no autotuner: ``AUTOTUNE`` stands for the number of CPUs wherever it is
    accepted."""

    _checks = {"enabled": _boolean("enabled"), "cpu_budget": _integer("cpu_budget", 0),
               "ram_budget": _integer("ram_budget", 0),
               "autotune_algorithm": lambda value: value}


class Options(OptionsBase):
    """Settings that apply to a whole pipeline, as ``tf.data.Options`` (``with_options``
    merges them along it, later ones win).

    ``deterministic`` (alias ``experimental_deterministic``): the default of the ``map``
    calls below ``with_options`` that leave theirs None; False lets a parallel map yield
    results as they finish. ``interleave`` always keeps its order (which ``False`` permits,
    not requires). ``threading`` (alias ``experimental_threading``), ``experimental_distribute``,
    ``experimental_optimization`` and ``autotune``: see their classes. ``auto_shard_policy``:
    convoy's older spelling of ``experimental_distribute.auto_shard_policy`` (a name).
    ``experimental_slack``, ``experimental_external_state_policy``,
    ``experimental_symbolic_checkpoint`` and ``experimental_warm_start``: accepted, no
    effect (TensorFlow's runtime settings; convoy's checkpoints always hold the elements
    they need).
    """

    _checks = {"deterministic": _boolean("deterministic"),
               "experimental_slack": _boolean("experimental_slack"),
               "experimental_external_state_policy": lambda value: value,
               "experimental_symbolic_checkpoint": _boolean("experimental_symbolic_checkpoint"),
               "experimental_warm_start": _boolean("experimental_warm_start")}
    _groups = {"threading": ThreadingOptions, "experimental_distribute": DistributeOptions,
               "experimental_optimization": OptimizationOptions, "autotune": AutotuneOptions}

    @property
    def experimental_deterministic(self) -> bool | None:
        """The same setting as ``deterministic``."""
        return self._values.get("deterministic")

    @experimental_deterministic.setter
    def experimental_deterministic(self, value: bool | None) -> None:
        self.deterministic = value

    @property
    def experimental_threading(self) -> ThreadingOptions:
        """The same object as ``threading``."""
        return self._values["threading"]

    @experimental_threading.setter
    def experimental_threading(self, value: ThreadingOptions) -> None:
        self.threading = value

    @property
    def auto_shard_policy(self) -> str | None:
        """``experimental_distribute.auto_shard_policy``'s name (convoy's older spelling)."""
        policy = self.experimental_distribute.auto_shard_policy
        return None if policy is None else policy.name

    @auto_shard_policy.setter
    def auto_shard_policy(self, value: Any) -> None:
        self.experimental_distribute.auto_shard_policy = value


#: The ``deterministic`` option of the pipeline whose iterator is being built (None: unset).
PIPELINE_DETERMINISTIC: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
    "convoy_pipeline_deterministic", default=None)
