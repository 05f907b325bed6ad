"""Variable partitioners and the "div" layout that turns a partition count into shards.

A partitioner is called as ``partitioner(shape, dtype, axis=0)`` and answers with one integer
per axis of ``shape``: how many pieces to cut that axis into (``1`` = not cut). Parameter-server
training only cuts the first axis; :func:`partition_count` enforces that and turns the answer into
a shard count, and :func:`shard_sizes`/:func:`shard_offsets` give the rows of each shard.

String variables (numpy ``object``, ``str`` or ``bytes`` dtypes, or ``"string"``) have no fixed
element size, so the size-based partitioners assume ``bytes_per_string`` bytes per element.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from convoy._base import check as _check
from convoy.errors import InvalidArgumentError

__all__ = [
    "Partitioner",
    "FixedShardsPartitioner",
    "MinSizePartitioner",
    "MaxSizePartitioner",
    "shard_sizes",
    "shard_offsets",
    "partition_count",
]


# --- helpers ------------------------------------------------------------------------------------


def _shape(shape: Any) -> tuple[int, ...]:
    """``shape`` as a tuple of sizes >= 0; raises if it is not fully known."""
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise InvalidArgumentError(
            f"shape must be a sequence of sizes, got {shape!r} ({type(shape).__name__})"
        ) from None
    result = []
    for dim in dims:
        if dim is None:
            raise InvalidArgumentError(
                f"shape must be fully defined to be partitioned, got {list(dims)}"
            )
        if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or dim < 0:
            raise InvalidArgumentError(
                f"shape must hold integer sizes >= 0, got {list(dims)}"
            )
        result.append(int(dim))
    return tuple(result)


def _is_string_dtype(dtype: Any) -> bool:
    if dtype in (str, bytes, "string", object):
        return True
    return isinstance(dtype, np.dtype) and dtype.kind in "OUS"


def _element_size(dtype: Any, bytes_per_string: int) -> int:
    """Bytes per element of ``dtype``; ``bytes_per_string`` for string dtypes."""
    if _is_string_dtype(dtype):
        return bytes_per_string
    try:
        np_dtype: np.dtype[Any] = np.dtype(dtype)
    except TypeError:
        raise InvalidArgumentError(
            f"dtype must be a numpy dtype (or str/bytes/'string'), got {dtype!r}"
        ) from None
    if np_dtype.kind in "OUS":
        return bytes_per_string
    return np_dtype.itemsize


def _axis(axis: Any, shape: tuple[int, ...]) -> int:
    index = _check.integer("axis", axis)
    if not -len(shape) <= index < len(shape):
        raise InvalidArgumentError(
            f"cannot partition along axis {index} of a variable of shape {list(shape)}"
        )
    return index % len(shape)


def _num_elements(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


# --- partitioners -------------------------------------------------------------------------------


class Partitioner:
    """Base class: decides how many pieces each axis of a variable is cut into."""

    def __call__(self, shape: Sequence[int], dtype: Any, axis: int = 0) -> list[int]:
        """One count per axis of ``shape``: 1 everywhere except (possibly) ``axis``."""
        raise NotImplementedError

    def _arguments(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._arguments().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._arguments() == other._arguments()

    def __hash__(self) -> int:
        return hash((type(self), tuple(self._arguments().items())))


class FixedShardsPartitioner(Partitioner):
    """Cut ``axis`` into ``num_shards`` pieces (fewer if the axis is shorter)."""

    def __init__(self, num_shards: int) -> None:
        self._num_shards = _check.integer("num_shards", num_shards, minimum=1)

    @property
    def num_shards(self) -> int:
        return self._num_shards

    def _arguments(self) -> dict[str, Any]:
        return {"num_shards": self._num_shards}

    def __call__(self, shape: Sequence[int], dtype: Any = None, axis: int = 0) -> list[int]:
        dims = _shape(shape)
        axis = _axis(axis, dims)
        result = [1] * len(dims)
        result[axis] = min(self._num_shards, dims[axis])
        return result


class MinSizePartitioner(Partitioner):
    """As many pieces as keep each at least ``min_shard_bytes``, at most ``max_shards``.

    The default ``max_shards=1`` never cuts; pass e.g. the number of ps tasks to shard.
    """

    def __init__(self, min_shard_bytes: int = 256 << 10, max_shards: int = 1,
                 bytes_per_string: int = 16) -> None:
        self._min_shard_bytes = _check.integer("min_shard_bytes", min_shard_bytes, minimum=1)
        self._max_shards = _check.integer("max_shards", max_shards, minimum=1)
        self._bytes_per_string = _check.integer("bytes_per_string", bytes_per_string, minimum=1)

    @property
    def min_shard_bytes(self) -> int:
        return self._min_shard_bytes

    @property
    def max_shards(self) -> int:
        return self._max_shards

    @property
    def bytes_per_string(self) -> int:
        return self._bytes_per_string

    def _arguments(self) -> dict[str, Any]:
        return {"min_shard_bytes": self._min_shard_bytes, "max_shards": self._max_shards,
                "bytes_per_string": self._bytes_per_string}

    def __call__(self, shape: Sequence[int], dtype: Any, axis: int = 0) -> list[int]:
        dims = _shape(shape)
        axis = _axis(axis, dims)
        total_bytes = _num_elements(dims) * _element_size(dtype, self._bytes_per_string)
        # TensorFlow divides in floating point and rounds up; keep the same arithmetic.
        wanted = math.ceil(total_bytes / self._min_shard_bytes)
        result = [1] * len(dims)
        result[axis] = max(1, min(dims[axis], self._max_shards, wanted))
        return result


class MaxSizePartitioner(Partitioner):
    """As few pieces as keep each at most ``max_shard_bytes`` (capped by ``max_shards``).

    A piece holds whole slices along ``axis``; a single slice larger than ``max_shard_bytes``
    still gets a piece of its own. ``max_shards=None`` means no cap.
    """

    def __init__(self, max_shard_bytes: int, max_shards: int | None = None,
                 bytes_per_string: int = 16) -> None:
        self._max_shard_bytes = _check.integer("max_shard_bytes", max_shard_bytes, minimum=1)
        self._max_shards = _check.optional_integer("max_shards", max_shards, minimum=1)
        self._bytes_per_string = _check.integer("bytes_per_string", bytes_per_string, minimum=1)

    @property
    def max_shard_bytes(self) -> int:
        return self._max_shard_bytes

    @property
    def max_shards(self) -> int | None:
        return self._max_shards

    @property
    def bytes_per_string(self) -> int:
        return self._bytes_per_string

    def _arguments(self) -> dict[str, Any]:
        return {"max_shard_bytes": self._max_shard_bytes, "max_shards": self._max_shards,
                "bytes_per_string": self._bytes_per_string}

    def __call__(self, shape: Sequence[int], dtype: Any, axis: int = 0) -> list[int]:
        dims = _shape(shape)
        axis = _axis(axis, dims)
        element_size = _element_size(dtype, self._bytes_per_string)
        result = [1] * len(dims)
        rows = dims[axis]
        # Same floating-point steps as TensorFlow: bytes of one slice along `axis`, whole
        # slices per shard (at least one), then shards needed to hold every slice.
        slice_bytes = (_num_elements(dims) / rows) * element_size if rows else 0.0
        if slice_bytes == 0:
            shards = 1  # empty variable: one (empty) piece
        else:
            slices_per_shard = max(1, math.floor(self._max_shard_bytes / slice_bytes))
            shards = math.ceil(rows / slices_per_shard)
        if self._max_shards is not None:
            shards = min(self._max_shards, shards)
        result[axis] = shards
        return result


# --- shard layout -------------------------------------------------------------------------------


def shard_sizes(num_rows: int, num_shards: int) -> list[int]:
    """Rows per shard under the "div" rule: near-equal sizes, the first ones one row larger.

    Never makes more shards than rows (``shard_sizes(3, 5) == [1, 1, 1]``); zero rows make one
    empty shard.
    """
    num_rows = _check.integer("num_rows", num_rows, minimum=0)
    num_shards = _check.integer("num_shards", num_shards, minimum=1)
    num_shards = max(1, min(num_shards, num_rows))
    base, extra = divmod(num_rows, num_shards)
    return [base + 1 if i < extra else base for i in range(num_shards)]


def shard_offsets(num_rows: int, num_shards: int) -> list[int]:
    """Row where each "div" shard starts, followed by ``num_rows`` (one more entry than shards).

    Shard ``i`` holds rows ``offsets[i]:offsets[i + 1]``.
    """
    offsets = [0]
    for size in shard_sizes(num_rows, num_shards):
        offsets.append(offsets[-1] + size)
    return offsets


def _describe(partitioner: Any) -> str:
    if isinstance(partitioner, Partitioner):
        return repr(partitioner)
    name = getattr(partitioner, "__qualname__", None) or getattr(partitioner, "__name__", None)
    return name if isinstance(name, str) else repr(partitioner)


def partition_count(partitioner: Callable[..., Sequence[int]], shape: Sequence[int],
                    dtype: Any) -> int:
    """The number of first-axis shards ``partitioner`` gives a variable of ``shape``/``dtype``.

    Rank-0 and zero-row variables are never partitioned (the partitioner is not called). The
    answer must have one positive integer per axis, all 1 except the first, else
    InvalidArgumentError; the count is capped at the number of rows.
    """
    if not callable(partitioner):
        raise InvalidArgumentError(
            f"variable_partitioner must be callable, got {partitioner!r} "
            f"({type(partitioner).__name__})"
        )
    dims = _shape(shape)
    if not dims or dims[0] == 0:
        return 1
    answer = partitioner(shape=dims, dtype=dtype)
    counts: list[Any] = list(answer) if isinstance(answer, (list, tuple, np.ndarray)) else []
    problem = None
    if not counts:
        problem = "a non-empty list with one count per axis"
    elif len(counts) != len(dims):
        problem = f"one count per axis of the shape {list(dims)} ({len(dims)} entries)"
    elif any(isinstance(c, bool) or not isinstance(c, numbers.Integral) for c in counts):
        problem = "integer counts"
    elif counts[0] < 1:
        problem = "a first-axis count >= 1"
    elif any(c != 1 for c in counts[1:]):
        problem = "1 for every axis but the first (only the first axis can be partitioned)"
    if problem is not None or counts is None:
        raise InvalidArgumentError(
            f"variable_partitioner {_describe(partitioner)} returned {answer!r} for shape "
            f"{list(dims)} and dtype {dtype!r}; it must return {problem}"
        )
    return min(int(counts[0]), dims[0])
