"""Nested structures of arrays: flatten, pack, map, compare, and describe them with specs.

The docs are in :mod:`convoy.nest`, the public face.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from convoy._values.tensors import RaggedTensor, SparseTensor
from convoy.errors import InvalidArgumentError


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def is_nested(value: Any) -> bool:
    """True for tuples, lists, dicts and namedtuples; leaves are everything else."""
    return isinstance(value, (tuple, list, dict))


def _children(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [value[k] for k in sorted(value)]
    return list(value)


def flatten(structure: Any) -> list[Any]:
    """The leaves of ``structure`` in a fixed order (a leaf flattens to ``[leaf]``)."""
    if not isinstance(structure, (tuple, list, dict)):
        return [structure]
    leaves: list[Any] = []
    _flatten_into(structure, leaves)
    return leaves


def _flatten_into(structure: Any, leaves: list[Any]) -> None:
    for child in _children(structure):
        if isinstance(child, (tuple, list, dict)):
            _flatten_into(child, leaves)
        else:
            leaves.append(child)


def flatten_up_to(shallow: Any, structure: Any) -> list[Any]:
    """The parts of ``structure`` at the leaves of ``shallow``, in ``flatten(shallow)`` order.

    ``structure`` must have ``shallow``'s nesting down to ``shallow``'s leaves; below them it
    may hold anything (e.g. a list that becomes one array, or a shape given as a tuple).
    """
    parts: list[Any] = []
    _flatten_up_to(shallow, structure, "", parts)
    return parts


def _flatten_up_to(shallow: Any, value: Any, path: str, parts: list[Any]) -> None:
    if not is_nested(shallow):
        parts.append(value)
        return
    where = path or "the top level"
    if (not is_nested(value) or isinstance(shallow, dict) != isinstance(value, dict)
            or len(shallow) != len(value)):
        raise InvalidArgumentError(
            f"structures differ at {where}: {_describe(shallow)} vs {_describe(value)}"
        )
    if isinstance(shallow, dict) and sorted(shallow) != sorted(value):
        raise InvalidArgumentError(
            f"structures differ at {where}: dict keys {sorted(shallow)} vs {sorted(value)}"
        )
    keys = sorted(shallow) if isinstance(shallow, dict) else range(len(shallow))
    for key in keys:
        _flatten_up_to(shallow[key], value[key], f"{path}[{key!r}]", parts)


def _rebuild(template: Any, children: list[Any]) -> Any:
    if isinstance(template, dict):
        keys = sorted(template)
        return type(template)((k, v) for k, v in zip(keys, children, strict=True))
    if _is_namedtuple(template):
        return type(template)(*children)
    return type(template)(children)


def pack_sequence_as(structure: Any, flat: Sequence[Any]) -> Any:
    """Rebuild ``structure``'s shape with the leaves taken in order from ``flat``."""
    flat = list(flat)
    packed, used = _pack(structure, flat, 0)
    if used != len(flat):
        raise InvalidArgumentError(
            f"pack_sequence_as: structure has {used} leaves but flat has {len(flat)} values"
        )
    return packed


def _pack(structure: Any, flat: list[Any], index: int) -> tuple[Any, int]:
    if not is_nested(structure):
        if index >= len(flat):
            raise InvalidArgumentError(
                f"pack_sequence_as: flat has {len(flat)} values, too few for the structure"
            )
        return flat[index], index + 1
    children = []
    for child in _children(structure):
        packed, index = _pack(child, flat, index)
        children.append(packed)
    return _rebuild(structure, children), index


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return f"dict with keys {sorted(value)}"
    if is_nested(value):
        return f"{type(value).__name__} of length {len(value)}"
    return "a leaf"


def assert_same_structure(first: Any, second: Any, check_types: bool = True) -> None:
    """Raise :class:`InvalidArgumentError` saying where ``first`` and ``second`` differ."""
    _compare(first, second, check_types, path="")


def _compare(a: Any, b: Any, check_types: bool, path: str) -> None:
    where = path or "the top level"
    if is_nested(a) != is_nested(b):
        raise InvalidArgumentError(
            f"structures differ at {where}: {_describe(a)} vs {_describe(b)}"
        )
    if not is_nested(a):
        return
    if check_types and type(a) is not type(b):
        raise InvalidArgumentError(
            f"structures differ at {where}: {type(a).__name__} vs {type(b).__name__}"
        )
    if isinstance(a, dict) and sorted(a) != sorted(b):
        raise InvalidArgumentError(
            f"structures differ at {where}: dict keys {sorted(a)} vs {sorted(b)}"
        )
    if len(a) != len(b):
        raise InvalidArgumentError(
            f"structures differ at {where}: {_describe(a)} vs {_describe(b)}"
        )
    keys = sorted(a) if isinstance(a, dict) else range(len(a))
    for key in keys:
        _compare(a[key], b[key], check_types, f"{path}[{key!r}]")


def map_structure(fn: Callable[..., Any], *structures: Any) -> Any:
    """Apply ``fn`` leaf-wise over structures of the same shape; return the same shape."""
    if not structures:
        raise InvalidArgumentError("map_structure needs at least one structure")
    for other in structures[1:]:
        assert_same_structure(structures[0], other)
    flats = [flatten(s) for s in structures]
    return pack_sequence_as(structures[0], [fn(*leaves) for leaves in zip(*flats)])


_STRING = np.dtype(object)


def _dtype_of(value: Any) -> np.dtype:
    if isinstance(value, np.ndarray | np.generic):
        return value.dtype
    if isinstance(value, bool):
        return np.dtype(np.bool_)
    if isinstance(value, int):
        return np.dtype(np.int64)
    if isinstance(value, float):
        return np.dtype(np.float64)
    if isinstance(value, (bytes, str)):
        return _STRING
    return np.asarray(value).dtype


def _spec_shape(shape: Any, kind: str) -> tuple[int | None, ...] | None:
    if shape is None:
        return None
    try:
        dims = tuple(None if d is None else int(d) for d in shape)
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"{kind} shape must be a sequence of sizes (int or None) or None, got {shape!r}"
        ) from None
    if any(d is not None and d < 0 for d in dims):
        raise InvalidArgumentError(f"{kind} shape must hold sizes >= 0 or None, got {dims}")
    return dims


def _spec_dtype(dtype: Any, kind: str) -> np.dtype:
    try:
        return _STRING if dtype in (str, bytes, "string") else np.dtype(dtype)
    except TypeError:
        raise InvalidArgumentError(
            f"{kind} dtype must be a numpy dtype, str or bytes, got {dtype!r}"
        ) from None


def _shapes_compatible(a: tuple[int | None, ...] | None,
                       b: tuple[int | None, ...] | None) -> bool:
    if a is None or b is None:
        return True
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


def _common_shape(a: tuple[int | None, ...] | None,
                  b: tuple[int | None, ...] | None) -> tuple[int | None, ...] | None:
    if a is None or b is None or len(a) != len(b):
        return None
    return tuple(x if x == y else None for x, y in zip(a, b))


def _shape_repr(shape: tuple[int | None, ...] | None) -> str:
    return "<unknown>" if shape is None else str(list(shape))


def _dtype_name(dtype: np.dtype) -> str:
    return "string" if dtype == _STRING else dtype.name


class TensorSpec:
    """The shape and dtype of one component of an element; ``None`` marks an unknown size."""

    __slots__ = ("shape", "dtype", "name")

    def __init__(self, shape: Sequence[int | None] | None, dtype: Any = np.float32,
                 name: str | None = None) -> None:
        self.shape: tuple[int | None, ...] | None = _spec_shape(shape, "TensorSpec")
        self.dtype = _spec_dtype(dtype, "TensorSpec")
        self.name = name

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    def is_compatible_with(self, value: Any) -> bool:
        """Whether ``value`` (a spec or a leaf) fits this spec."""
        other = value if isinstance(value, TensorSpec) else spec_from_value(value)
        return (isinstance(other, TensorSpec) and other.dtype == self.dtype
                and _shapes_compatible(self.shape, other.shape))

    def most_specific_common(self, other: TensorSpec) -> TensorSpec:
        """The tightest spec that both ``self`` and ``other`` fit (sizes that differ -> None)."""
        return TensorSpec(_common_shape(self.shape, other.shape),
                          self.dtype if self.dtype == other.dtype else _STRING)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TensorSpec)
            and self.shape == other.shape
            and self.dtype == other.dtype
        )

    def __hash__(self) -> int:
        return hash((self.shape, self.dtype))

    def __repr__(self) -> str:
        return f"TensorSpec(shape={_shape_repr(self.shape)}, dtype={_dtype_name(self.dtype)})"


class SparseTensorSpec:
    """The dense shape and dtype of a :class:`~convoy.SparseTensor` component, as TensorFlow's
    ``tf.SparseTensorSpec``; ``None`` marks an unknown size."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape: Sequence[int | None] | None = None,
                 dtype: Any = np.float32) -> None:
        self.shape: tuple[int | None, ...] | None = _spec_shape(shape, "SparseTensorSpec")
        self.dtype = _spec_dtype(dtype, "SparseTensorSpec")

    @classmethod
    def from_value(cls, value: SparseTensor) -> SparseTensorSpec:
        return cls(value.shape, value.dtype)

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    def is_compatible_with(self, value: Any) -> bool:
        """Whether ``value`` (a spec or a SparseTensor) fits this spec."""
        other = value if isinstance(value, SparseTensorSpec) else spec_from_value(value)
        return (isinstance(other, SparseTensorSpec) and other.dtype == self.dtype
                and _shapes_compatible(self.shape, other.shape))

    def most_specific_common(self, other: SparseTensorSpec) -> SparseTensorSpec:
        """The tightest spec that both ``self`` and ``other`` fit (sizes that differ -> None)."""
        return SparseTensorSpec(_common_shape(self.shape, other.shape),
                                self.dtype if self.dtype == other.dtype else _STRING)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, SparseTensorSpec) and self.shape == other.shape
                and self.dtype == other.dtype)

    def __hash__(self) -> int:
        return hash(("sparse", self.shape, self.dtype))

    def __repr__(self) -> str:
        return (f"SparseTensorSpec(shape={_shape_repr(self.shape)}, "
                f"dtype={_dtype_name(self.dtype)})")


class RaggedTensorSpec:
    """The shape, dtype and ragged rank of a :class:`~convoy.RaggedTensor` component, as
    TensorFlow's ``tf.RaggedTensorSpec``: ``shape`` is ``[nrows, None, ..., *uniform inner
    sizes]``; ``ragged_rank`` (how many dimensions after the first are ragged) defaults to
    ``rank - 1``."""

    __slots__ = ("shape", "dtype", "ragged_rank", "row_splits_dtype")

    def __init__(self, shape: Sequence[int | None] | None = None, dtype: Any = np.float32,
                 ragged_rank: int | None = None, row_splits_dtype: Any = np.int64) -> None:
        self.shape: tuple[int | None, ...] | None = _spec_shape(shape, "RaggedTensorSpec")
        self.dtype = _spec_dtype(dtype, "RaggedTensorSpec")
        rank = None if self.shape is None else len(self.shape)
        if ragged_rank is None:
            if rank is None:
                raise InvalidArgumentError(
                    "RaggedTensorSpec needs ragged_rank when the shape's rank is unknown")
            ragged_rank = rank - 1
        if ragged_rank < 0 or (rank is not None and ragged_rank >= max(rank, 1)):
            raise InvalidArgumentError(
                f"RaggedTensorSpec ragged_rank must be >= 0 and < rank {rank}, got "
                f"{ragged_rank}")
        self.ragged_rank = int(ragged_rank)
        self.row_splits_dtype = np.dtype(row_splits_dtype)
        if self.row_splits_dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise InvalidArgumentError(
                f"RaggedTensorSpec row_splits_dtype must be int32 or int64, got "
                f"{self.row_splits_dtype}")

    @classmethod
    def from_value(cls, value: RaggedTensor) -> RaggedTensorSpec:
        return cls(value.shape, value.dtype, value.ragged_rank, value.row_splits.dtype)

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    def is_compatible_with(self, value: Any) -> bool:
        """Whether ``value`` (a spec or a RaggedTensor) fits this spec."""
        other = value if isinstance(value, RaggedTensorSpec) else spec_from_value(value)
        return (isinstance(other, RaggedTensorSpec) and other.dtype == self.dtype
                and other.ragged_rank == self.ragged_rank
                and _shapes_compatible(self.shape, other.shape))

    def most_specific_common(self, other: RaggedTensorSpec) -> RaggedTensorSpec:
        """The tightest spec that both ``self`` and ``other`` fit (sizes that differ -> None)."""
        if other.ragged_rank != self.ragged_rank:
            raise InvalidArgumentError(
                f"RaggedTensorSpecs of ragged_rank {self.ragged_rank} and "
                f"{other.ragged_rank} have no common spec")
        return RaggedTensorSpec(_common_shape(self.shape, other.shape),
                                self.dtype if self.dtype == other.dtype else _STRING,
                                self.ragged_rank, self.row_splits_dtype)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, RaggedTensorSpec) and self.shape == other.shape
                and self.dtype == other.dtype and self.ragged_rank == other.ragged_rank
                and self.row_splits_dtype == other.row_splits_dtype)

    def __hash__(self) -> int:
        return hash(("ragged", self.shape, self.dtype, self.ragged_rank))

    def __repr__(self) -> str:
        return (f"RaggedTensorSpec(shape={_shape_repr(self.shape)}, "
                f"dtype={_dtype_name(self.dtype)}, ragged_rank={self.ragged_rank}, "
                f"row_splits_dtype={self.row_splits_dtype.name})")


def spec_from_value(value: Any) -> Any:
    """The structure of specs that describes ``value``: :class:`TensorSpec` for arrays and
    scalars, :class:`SparseTensorSpec` and :class:`RaggedTensorSpec` for sparse and ragged
    values."""
    if is_nested(value):
        return map_structure(spec_from_value, value)
    if isinstance(value, SparseTensor):
        return SparseTensorSpec.from_value(value)
    if isinstance(value, RaggedTensor):
        return RaggedTensorSpec.from_value(value)
    shape = value.shape if isinstance(value, np.ndarray | np.generic) else ()
    return TensorSpec(shape, _dtype_of(value))
