"""``parse_example`` and friends: serialized Examples and SequenceExamples to arrays.

Records are read a whole batch at a time by compiled code (``convoy.io._native``), which
releases the GIL and splits the batch over :func:`set_parse_threads` threads. Each requested
key becomes a *column*: the records it appears in, and for each of them its values (Example
features), or its steps and each step's values (SequenceExample feature lists). The outputs
(dense arrays, :class:`~convoy.SparseTensor`, :class:`~convoy.RaggedTensor`) are cut from
the columns.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from convoy._values.tensors import RaggedTensor, SparseTensor
from convoy.errors import DataLossError, InvalidArgumentError
from convoy.io import _native
from convoy.io._features import (
    INT64,
    KIND_NAMES,
    FixedLenFeature,
    FixedLenSequenceFeature,
    RaggedFeature,
    SparseFeature,
    VarLenFeature,
    dense_shape,
    dtype_name,
    kind_of,
    normalize_dtype,
)

_OBJECT = np.dtype(object)


class _Column(NamedTuple):
    """One key's values: ``records`` (sorted) holding it, ``counts`` of values per slot, the
    flat ``values``; for a feature list, ``steps`` per record (slots are steps)."""

    records: np.ndarray
    counts: np.ndarray
    values: np.ndarray
    steps: np.ndarray | None = None
    uniform: int = -1  # the count of every record when all hold the key with one count
    indices: np.ndarray | None = None  # a VarLenFeature's [record, position] of each value
    widest: int = 0  # the largest count


class _Context(NamedTuple):
    records: list[bytes]
    batch: int
    names: list[str] | None

    def name(self, record: int) -> str:
        return self.names[record] if self.names else "<unknown>"


# --- reading the records -----------------------------------------------------------------------

_threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
    (os.cpu_count() or 1)


def set_parse_threads(threads: int) -> None:
    """Sets how many threads each ``parse_example`` (and ``parse_sequence_example``) call
    splits its batch over; by default the number of CPUs the process may use. 1 parses on the
    calling thread alone (the GIL is released either way)."""
    global _threads
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise InvalidArgumentError(f"threads must be an int >= 1, got {threads!r}")
    _threads = threads


def get_parse_threads() -> int:
    """How many threads a ``parse_example`` call splits its batch over."""
    return _threads


def _records(serialized: Any) -> list[bytes]:
    if isinstance(serialized, (bytes, bytearray, memoryview, str)):
        raise InvalidArgumentError(
            "serialized must be a 1-D list or array of serialized records, got a single "
            "record (use parse_single_example)"
        )
    if isinstance(serialized, np.ndarray):
        if serialized.ndim != 1:
            raise InvalidArgumentError(
                f"serialized must be 1-D, got shape {list(serialized.shape)}"
            )
        serialized = serialized.tolist()
    records = list(serialized)
    if set(map(type, records)) <= {bytes}:
        return records
    for index, record in enumerate(records):
        if not isinstance(record, bytes):
            if isinstance(record, (bytearray, memoryview, np.bytes_)):
                records[index] = bytes(record)
            else:
                raise InvalidArgumentError(
                    f"serialized[{index}] must be bytes, got {type(record).__name__}"
                )
    return records


def _names(example_names: Any, batch: int) -> list[str] | None:
    if example_names is None:
        return None
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in np.asarray(
        example_names, dtype=object).reshape(-1).tolist()]
    if not names:
        return None
    if len(names) != batch:
        raise InvalidArgumentError(
            f"example_names has {len(names)} names for {batch} serialized records"
        )
    return names


def _read_columns(context: _Context, kinds: Mapping[str, int], field: int,
                  sparse: frozenset[str] = frozenset()) -> dict[str, _Column]:
    """The column of each key of the map at ``field`` of every record: Example features or
    SequenceExample context (1), or SequenceExample feature lists (2: slots are steps). Keys
    in ``sparse`` come with their values' sparse indices."""
    keys = list(kinds)
    columns, error = _native.parse_columns(context.records, [key.encode() for key in keys],
                                           list(kinds.values()), field, field == 2, _threads,
                                           [key in sparse for key in keys])
    if error is not None:
        if error[0] == "data_loss":
            raise DataLossError(error[2])
        record, key = error[1], keys[error[2]]
        raise InvalidArgumentError(
            f"Name: {context.name(record)}, Key: {key}, Index: {record}.  "
            f"Data types don't match. Data type: {KIND_NAMES[error[3]]} "
            f"Expected type: {KIND_NAMES[kinds[key]]}"
        )
    assert columns is not None
    return {key: _Column(*column) for key, column in zip(keys, columns)}


# --- building the outputs ----------------------------------------------------------------------

def _fill(shape: tuple[int, ...], dtype: np.dtype, value: Any) -> np.ndarray:
    out = np.empty(shape, dtype)
    out[...] = value
    return out


def _default(value: Any, dtype: np.dtype, shape: tuple[int, ...] | None, key: str) -> Any:
    if value is None:
        return b"" if dtype == _OBJECT else dtype.type(0)
    array = np.asarray(value, dtype=dtype) if dtype != _OBJECT else \
        np.asarray(_as_bytes(value), dtype=object)
    if shape is not None:
        try:
            array = array.reshape(shape) if array.size == int(np.prod(shape)) else \
                np.broadcast_to(array, shape)
        except ValueError:
            raise InvalidArgumentError(
                f"feature {key!r}: default_value of shape {list(array.shape)} does not fit "
                f"shape {list(shape)}"
            ) from None
    return array


def _as_bytes(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, np.bytes_)):
        return bytes(value)
    if isinstance(value, np.ndarray):
        return np.array([_as_bytes(v) for v in value.reshape(-1).tolist()],
                        dtype=object).reshape(value.shape)
    if isinstance(value, (list, tuple)):
        out = np.empty(len(value), object)
        out[:] = [_as_bytes(v) for v in value]
        return out if not out.size or not isinstance(out[0], np.ndarray) else \
            np.stack(list(out))
    return value


def _dense(context: _Context, key: str, config: FixedLenFeature, column: _Column) -> np.ndarray:
    dtype = normalize_dtype(config.dtype, key)
    shape = dense_shape(config.shape, key)
    size = math.prod(shape)
    records, counts = column.records, column.counts
    batch = context.batch
    if size and column.uniform == size:  # the usual case
        return column.values.reshape((batch, *shape))
    # A Feature with no kind (nothing in it) counts as missing.
    present = counts != 0 if size else np.ones(len(counts), bool)
    bad = np.flatnonzero(present & (counts != size))
    if bad.size:
        record = int(records[bad[0]])
        raise InvalidArgumentError(
            f"Name: {context.name(record)}, Key: {key}, Index: {record}.  Number of "
            f"{dtype_name(dtype)} values != expected.  Values size: {int(counts[bad[0]])} but "
            f"output shape: {list(shape)}"
        )
    if len(records) == batch and present.all():
        return column.values.reshape((batch, *shape))
    if config.default_value is None and not (size == 0 and len(records) == batch):
        have = np.zeros(batch, bool)
        have[records[present]] = True
        missing = int(np.argmin(have))
        raise InvalidArgumentError(
            f"Name: {context.name(missing)}, Feature: {key} (data type: {dtype_name(dtype)}) "
            f"is required but could not be found."
        )
    out = _fill((batch, *shape), dtype, _default(config.default_value, dtype, shape, key))
    out[records[present]] = column.values.reshape((-1, *shape))
    return out


def _sparse(column: _Column, batch: int) -> SparseTensor:
    if column.indices is not None:
        return SparseTensor._unchecked(column.indices, column.values,
                                       np.array([batch, column.widest], np.int64))
    counts = column.counts
    total = len(column.values)
    rows = np.repeat(column.records, counts)
    columns = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    width = int(counts.max()) if len(counts) else 0
    return SparseTensor._unchecked(np.stack([rows, columns], axis=1), column.values,
                                   np.array([batch, width], np.int64))


def _lengths_by_record(column: _Column, batch: int) -> np.ndarray:
    lengths = np.zeros(batch, np.int64)
    lengths[column.records] = column.counts
    return lengths


def _padded_rows(context: _Context, key: str, config: FixedLenSequenceFeature,
                 column: _Column) -> np.ndarray:
    """FixedLenSequenceFeature in parse_example: each record's values as rows of shape,
    padded to the longest."""
    dtype = normalize_dtype(config.dtype, key)
    shape = dense_shape(config.shape, key)
    if not config.allow_missing:
        raise InvalidArgumentError(
            f"Unsupported: FixedLenSequenceFeature requires allow_missing to be True "
            f"(feature {key!r})"
        )
    size = int(np.prod(shape))
    counts = column.counts
    if size == 0:
        rows = np.zeros(len(counts), np.int64)
    else:
        bad = np.flatnonzero(counts % size)
        if bad.size:
            record = int(column.records[bad[0]])
            raise InvalidArgumentError(
                f"Name: {context.name(record)}, Key: {key}, Index: {record}.  Number of "
                f"{dtype_name(dtype)} values is not a multiple of stride length. Saw "
                f"{int(counts[bad[0]])} values but output shape is: {list(shape)}"
            )
        rows = counts // size
    longest = int(rows.max()) if len(rows) else 0
    fill = _default(config.default_value, dtype, None, key)
    out = _fill((context.batch, longest, *shape), dtype, fill)
    if len(column.values) and size:
        row_ids = np.repeat(column.records, rows)
        position = np.arange(len(row_ids), dtype=np.int64) - np.repeat(np.cumsum(rows) - rows,
                                                                      rows)
        out[row_ids, position] = column.values.reshape((-1, *shape))
    return out


def _ragged(context: _Context, key: str, config: RaggedFeature,
            columns: Mapping[str, _Column]) -> RaggedTensor:
    value_key = config.value_key or key
    column = columns[value_key]
    lengths = _lengths_by_record(column, context.batch)
    values: Any = column.values
    if config.partitions:
        values, lengths = _partitioned(context, key, config, columns, column)
    result = RaggedTensor.from_row_lengths(values, lengths, validate=False)
    dtype = _splits_dtype(config, key)
    return result if dtype == np.int64 else result.with_row_splits_dtype(dtype)


def _splits_dtype(config: RaggedFeature, key: str) -> np.dtype:
    """The feature's ``row_splits_dtype``: int32 or int64."""
    try:
        dtype = np.dtype(config.row_splits_dtype)
    except TypeError:
        dtype = None
    if dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise InvalidArgumentError(f"feature {key!r}: row_splits_dtype must be int32 or "
                                   f"int64, got {config.row_splits_dtype!r}")
    return dtype


def _partitioned(context: _Context, key: str, config: RaggedFeature,
                 columns: Mapping[str, _Column], column: _Column) -> tuple[Any, np.ndarray]:
    """The values of each record cut by the partitions, innermost first; and the number of
    outermost rows of each record."""
    batch = context.batch
    values: Any = column.values
    counts = _lengths_by_record(column, batch)  # items per record at the current level
    for partition in reversed(config.partitions):
        if isinstance(partition, RaggedFeature.UniformRowLength):
            length = int(partition.length)
            if length <= 0 or (counts % length).any():
                raise InvalidArgumentError(
                    f"feature {key!r}: UniformRowLength({length}) does not divide the "
                    f"{counts.tolist()} values of each example"
                )
            if isinstance(values, np.ndarray):  # innermost: a uniform dimension
                values = values.reshape((-1, length, *values.shape[1:]))
            else:
                values = RaggedTensor.from_row_lengths(
                    values, np.full(int(counts.sum()) // length, length), validate=False)
            counts = counts // length
            continue
        part = columns[partition.key]
        given = _lengths_by_record(part, batch)
        lengths, counts = _row_lengths(key, partition, part.values, given, counts)
        values = RaggedTensor.from_row_lengths(values, lengths, validate=False)
    return values, counts


def _row_lengths(key: str, partition: Any, numbers: np.ndarray, given: np.ndarray,
                 counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The row lengths of all records from one partition feature (``given[b]`` of its
    ``numbers`` for record b, over ``counts[b]`` items), and the rows of each record."""
    out: list[np.ndarray] = []
    rows = np.zeros(len(counts), np.int64)
    position = 0
    for record, (number, count) in enumerate(zip(given.tolist(), counts.tolist())):
        part = numbers[position:position + number]
        position += number
        lengths = _one_record(partition, part, count)
        if lengths is None or int(lengths.sum()) != count or (lengths < 0).any():
            raise InvalidArgumentError(
                f"feature {key!r}: partition {type(partition).__name__.lstrip('_')}"
                f"({partition.key!r}) of example {record} does not fit its {count} values"
            )
        out.append(lengths)
        rows[record] = len(lengths)
    return (np.concatenate(out) if out else np.zeros(0, np.int64)), rows


def _one_record(partition: Any, part: np.ndarray, count: int) -> np.ndarray | None:
    if isinstance(partition, RaggedFeature.RowLengths):
        return part
    if isinstance(partition, RaggedFeature.RowSplits):
        if not len(part) or part[0] != 0:
            return None if count or len(part) else np.zeros(0, np.int64)
        return np.diff(part)
    if isinstance(partition, RaggedFeature.RowStarts):
        if len(part) and part[0] != 0:
            return None
        return np.diff(np.append(part, count))
    if isinstance(partition, RaggedFeature.RowLimits):
        return np.diff(np.insert(part, 0, 0))
    if isinstance(partition, RaggedFeature.ValueRowIds):
        if len(part) != count or (len(part) and (part[0] < 0 or (np.diff(part) < 0).any())):
            return None
        return np.bincount(part, minlength=0).astype(np.int64) if len(part) else \
            np.zeros(0, np.int64)
    raise InvalidArgumentError(f"unknown RaggedFeature partition {partition!r}")


def _sparse_feature(context: _Context, key: str, config: SparseFeature,
                    columns: Mapping[str, _Column]) -> SparseTensor:
    index_keys = [config.index_key] if isinstance(config.index_key, str) else \
        list(config.index_key)
    sizes = [config.size] if np.ndim(config.size) == 0 else list(config.size)
    if len(sizes) != len(index_keys):
        raise InvalidArgumentError(
            f"feature {key!r}: size has {len(sizes)} entries for {len(index_keys)} index keys"
        )
    batch = context.batch
    values = columns[config.value_key]
    counts = _lengths_by_record(values, batch)
    parts = []
    for index_key in index_keys:
        index = columns[index_key]
        if not np.array_equal(_lengths_by_record(index, batch), counts):
            record = int(np.argmax(_lengths_by_record(index, batch) != counts))
            raise InvalidArgumentError(
                f"Name: {context.name(record)}, Key: {key}, Index: {record}.  SparseFeature "
                f"index key {index_key!r} and value key {config.value_key!r} have different "
                f"numbers of values"
            )
        parts.append(index.values)
    rows = np.repeat(np.arange(batch, dtype=np.int64), counts)
    indices = np.stack([rows, *parts], axis=1) if parts else rows[:, None]
    flat = values.values
    if not config.already_sorted and len(rows):
        order = np.lexsort(tuple(indices[:, i] for i in reversed(range(indices.shape[1]))))
        indices, flat = indices[order], flat[order]
    shape = np.array([batch, *[int(s) for s in sizes]], np.int64)
    return SparseTensor._unchecked(indices, flat, shape)


# --- requests: which keys to read as which kind -------------------------------------------------

_CONFIGS = (FixedLenFeature, FixedLenSequenceFeature, VarLenFeature, SparseFeature,
            RaggedFeature)


def _requests(features: Mapping[str, Any] | None, what: str) -> dict[str, int]:
    """The kind to read each underlying key as (a SparseFeature or RaggedFeature reads
    several)."""
    kinds: dict[str, int] = {}

    def want(name: str, kind: int) -> None:
        if kinds.setdefault(name, kind) != kind:
            raise InvalidArgumentError(
                f"{what}: key {name!r} is requested as both {KIND_NAMES[kinds[name]]} and "
                f"{KIND_NAMES[kind]}"
            )

    for key, config in (features or {}).items():
        if not isinstance(config, _CONFIGS):
            raise InvalidArgumentError(
                f"{what}[{key!r}] must be a FixedLenFeature, FixedLenSequenceFeature, "
                f"VarLenFeature, SparseFeature or RaggedFeature, got {type(config).__name__}"
            )
        kind = kind_of(normalize_dtype(config.dtype, key))
        if isinstance(config, SparseFeature):
            index_keys = [config.index_key] if isinstance(config.index_key, str) else \
                config.index_key
            for index_key in index_keys:
                want(index_key, INT64)
            want(config.value_key, kind)
        elif isinstance(config, RaggedFeature):
            _splits_dtype(config, key)
            want(config.value_key or key, kind)
            for partition in config.partitions:
                if not isinstance(partition, RaggedFeature.UniformRowLength):
                    want(partition.key, INT64)
        else:
            want(key, kind)
    return kinds


def _context(serialized: Any, example_names: Any) -> _Context:
    records = _records(serialized)
    return _Context(records, len(records), _names(example_names, len(records)))


def _outputs(context: _Context, features: Mapping[str, Any],
             columns: Mapping[str, _Column]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, config in features.items():
        if isinstance(config, FixedLenFeature):
            out[key] = _dense(context, key, config, columns[key])
        elif isinstance(config, FixedLenSequenceFeature):
            out[key] = _padded_rows(context, key, config, columns[key])
        elif isinstance(config, VarLenFeature):
            out[key] = _sparse(columns[key], context.batch)
        elif isinstance(config, SparseFeature):
            out[key] = _sparse_feature(context, key, config, columns)
        else:
            out[key] = _ragged(context, key, config, columns)
    return out


class _Checked(NamedTuple):
    """The checked ``features`` of a parse: the kind to read each key as, the keys read as
    VarLenFeature; and the configs they were checked from (the check is reused while the same
    dict holds the same configs)."""

    kinds: dict[str, int]
    sparse: frozenset[str]
    keys: tuple[str, ...]
    configs: tuple[Any, ...]
    ids: tuple[int, ...]


_CHECKED: dict[int, tuple[Mapping[str, Any], _Checked]] = {}


def _checked(features: Mapping[str, Any], what: str) -> _Checked:
    """:func:`_requests` of ``features``, remembered for the dict (most pipelines parse every
    batch with one dict)."""
    seen = _CHECKED.get(id(features))
    if seen is not None and seen[0] is features and seen[1].keys == tuple(features) and \
            seen[1].ids == tuple(map(id, features.values())):
        return seen[1]
    kinds = _requests(features, what)
    configs = tuple(features.values())
    checked = _Checked(kinds, frozenset(key for key, config in features.items()
                                        if isinstance(config, VarLenFeature)),
                       tuple(features), configs, tuple(map(id, configs)))
    if len(_CHECKED) >= 64:
        _CHECKED.clear()
    _CHECKED[id(features)] = (features, checked)
    return checked


# --- the public functions ----------------------------------------------------------------------

def check_features(features: Any) -> dict[str, int]:
    """Checks the ``features`` of :func:`parse_example`; the kind to read each key as."""
    if not isinstance(features, Mapping) or not features:
        raise InvalidArgumentError("features must be a non-empty dict of feature configs")
    return _checked(features, "features").kinds


def parse_example(serialized: Any, features: Mapping[str, Any], example_names: Any = None,
                  name: str | None = None) -> dict[str, Any]:
    """Parse a batch of serialized ``Example`` records into a dict of arrays.

    ``features`` maps each key to a :class:`FixedLenFeature` (an array ``[batch] + shape``),
    :class:`VarLenFeature` or :class:`SparseFeature` (a :class:`~convoy.SparseTensor`),
    :class:`RaggedFeature` (a :class:`~convoy.RaggedTensor`) or
    :class:`FixedLenSequenceFeature` with ``allow_missing=True`` (``[batch, rows] + shape``,
    padded). ``serialized`` is a 1-D list or array of ``bytes``; ``example_names`` (one per
    record) name records in errors.
    """
    check_features(features)
    checked = _checked(features, "features")
    context = _context(serialized, example_names)
    return _outputs(context, features, _read_columns(context, checked.kinds, 1, checked.sparse))


def parse_single_example(serialized: Any, features: Mapping[str, Any],
                         example_names: Any = None, name: str | None = None) -> dict[str, Any]:
    """Parse one serialized ``Example`` (``bytes``); as :func:`parse_example` without the
    batch dimension."""
    if not isinstance(serialized, (bytes, bytearray, memoryview, np.bytes_)):
        raise InvalidArgumentError(
            f"serialized must be one serialized record (bytes), got {type(serialized).__name__}"
        )
    names = None if example_names is None else [example_names]
    parsed = parse_example([bytes(serialized)], features, names)
    return {key: _unbatch(value) for key, value in parsed.items()}


def _unbatch(value: Any) -> Any:
    if isinstance(value, SparseTensor):
        return SparseTensor._unchecked(np.ascontiguousarray(value.indices[:, 1:]), value.values,
                                       value.dense_shape[1:])
    return value[0]


def parse_sequence_example(serialized: Any, context_features: Mapping[str, Any] | None = None,
                           sequence_features: Mapping[str, Any] | None = None,
                           example_names: Any = None, name: str | None = None
                           ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Parse a batch of serialized ``SequenceExample`` records.

    Returns ``(context, feature_lists, lengths)``: ``context`` as :func:`parse_example` for
    ``context_features``; ``feature_lists`` for ``sequence_features`` with one row per step:
    :class:`FixedLenSequenceFeature` gives ``[batch, steps] + shape`` (padded; ``lengths``
    holds each record's number of steps), :class:`VarLenFeature` a 3-D
    :class:`~convoy.SparseTensor`, :class:`RaggedFeature` a :class:`~convoy.RaggedTensor`
    ``[batch, steps, values]``.
    """
    if not context_features and not sequence_features:
        raise InvalidArgumentError(
            "Missing features: give context_features, sequence_features or both"
        )
    context_kinds = _requests(context_features, "context_features")
    sequence_kinds = _requests(sequence_features, "sequence_features")
    for key, config in (sequence_features or {}).items():
        if not isinstance(config, (FixedLenSequenceFeature, VarLenFeature, RaggedFeature)):
            raise InvalidArgumentError(
                f"sequence_features[{key!r}] must be a FixedLenSequenceFeature, VarLenFeature "
                f"or RaggedFeature, got {type(config).__name__}"
            )
        if isinstance(config, RaggedFeature) and config.partitions:
            raise InvalidArgumentError(
                f"sequence_features[{key!r}]: RaggedFeature partitions are not supported in "
                f"feature lists"
            )
    for key, config in (context_features or {}).items():
        if isinstance(config, FixedLenSequenceFeature):
            raise InvalidArgumentError(
                f"context_features[{key!r}]: a FixedLenSequenceFeature belongs in "
                f"sequence_features"
            )
    context = _context(serialized, example_names)
    parsed_context = {}
    if context_features:
        parsed_context = _outputs(context, context_features,
                                  _read_columns(context, context_kinds, 1))
    parsed_lists: dict[str, Any] = {}
    lengths: dict[str, Any] = {}
    if sequence_features:
        columns = _read_columns(context, sequence_kinds, 2)
        for key, config in sequence_features.items():
            parsed_lists[key], step_counts = _sequence_output(context, key, config,
                                                              columns[config.value_key or key]
                                                              if isinstance(config,
                                                                            RaggedFeature)
                                                              else columns[key])
            if isinstance(config, FixedLenSequenceFeature):
                lengths[key] = step_counts
    return parsed_context, parsed_lists, lengths


def _sequence_output(context: _Context, key: str, config: Any,
                     column: _Column) -> tuple[Any, np.ndarray]:
    batch = context.batch
    assert column.steps is not None
    steps = np.zeros(batch, np.int64)
    steps[column.records] = column.steps
    dtype = normalize_dtype(config.dtype, key)
    step_record = np.repeat(column.records, column.steps)
    counts = column.counts
    if isinstance(config, FixedLenSequenceFeature):
        if not config.allow_missing and len(column.records) != batch:
            have = np.zeros(batch, bool)
            have[column.records] = True
            missing = int(np.argmin(have))
            raise InvalidArgumentError(
                f"Name: {context.name(missing)}, Feature list '{key}' is required but could "
                f"not be found.  Did you mean to include it in feature_list_dense_missing_"
                f"assumed_empty or feature_list_dense_defaults?"
            )
        shape = dense_shape(config.shape, key)
        size = int(np.prod(shape))
        bad = np.flatnonzero(counts != size)
        if bad.size:
            record = int(step_record[bad[0]])
            raise InvalidArgumentError(
                f"Name: {context.name(record)}, Key: {key}, Index: {record}.  Number of "
                f"{dtype_name(dtype)} values != expected.  values size: {int(counts[bad[0]])} "
                f"but output shape: {list(shape)}"
            )
        longest = int(steps.max()) if batch else 0
        out = _fill((batch, longest, *shape), dtype,
                    _default(config.default_value, dtype, None, key))
        position = np.arange(len(step_record), dtype=np.int64) - np.repeat(
            np.cumsum(column.steps) - column.steps, column.steps)
        out[step_record, position] = column.values.reshape((-1, *shape))
        return out, steps
    if isinstance(config, VarLenFeature):
        step_index = np.arange(len(step_record), dtype=np.int64) - np.repeat(
            np.cumsum(column.steps) - column.steps, column.steps)
        item = np.arange(len(column.values), dtype=np.int64) - np.repeat(
            np.cumsum(counts) - counts, counts)
        indices = np.stack([np.repeat(step_record, counts), np.repeat(step_index, counts),
                            item], axis=1)
        dense = np.array([batch, int(steps.max()) if batch else 0,
                          int(counts.max()) if len(counts) else 0], np.int64)
        return SparseTensor._unchecked(indices, column.values, dense), steps
    inner = RaggedTensor.from_row_lengths(column.values, counts, validate=False)
    return RaggedTensor.from_row_lengths(inner, steps, validate=False), steps


def parse_single_sequence_example(serialized: Any,
                                  context_features: Mapping[str, Any] | None = None,
                                  sequence_features: Mapping[str, Any] | None = None,
                                  example_name: Any = None, name: str | None = None
                                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Parse one serialized ``SequenceExample``: ``(context, feature_lists)`` as
    :func:`parse_sequence_example` without the batch dimension."""
    if not isinstance(serialized, (bytes, bytearray, memoryview, np.bytes_)):
        raise InvalidArgumentError(
            f"serialized must be one serialized record (bytes), got {type(serialized).__name__}"
        )
    names = None if example_name is None else [example_name]
    context, lists, _ = parse_sequence_example([bytes(serialized)], context_features,
                                               sequence_features, names)
    return ({key: _unbatch(value) for key, value in context.items()},
            {key: _unbatch(value) for key, value in lists.items()})
