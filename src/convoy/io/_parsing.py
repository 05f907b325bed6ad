"""``parse_example`` and friends: serialized Examples and SequenceExamples to arrays.

Records are read by :mod:`convoy.io._wire` a whole batch at a time. Each requested key
becomes a *column*: the records it appears in, and for each of them its values (Example
features), or its steps and each step's values (SequenceExample feature lists). The outputs
(dense arrays, :class:`~convoy.SparseTensor`, :class:`~convoy.RaggedTensor`) are cut from
the columns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from itertools import accumulate
from typing import Any, NamedTuple

import numpy as np

from convoy._values.tensors import RaggedTensor, SparseTensor
from convoy.errors import DataLossError, InvalidArgumentError
from convoy.io import _wire
from convoy.io._features import (
    BYTES,
    FLOAT,
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


class _Context(NamedTuple):
    buffer: _wire.Buffer
    batch: int
    names: list[str] | None

    def name(self, record: int) -> str:
        return self.names[record] if self.names else "<unknown>"


# --- reading the wire format -------------------------------------------------------------------

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


def _messages(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, owners: np.ndarray,
              number: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The occurrences of message field ``number`` in the given messages: their starts, ends
    and the owners of the messages holding them (repeated occurrences merge, as in
    protobuf)."""
    single = _wire.single_fields(data, starts, ends, number << 3 | 2)
    if single is not None:  # the usual case: each message is that one field
        return single[0], single[1], owners
    fields = _wire.scan(data, starts, ends).select(number, 2)
    return fields.start, fields.end, owners[fields.owner]


def _lookup(context: _Context, starts: np.ndarray, ends: np.ndarray, owners: np.ndarray,
            keys: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """For each key of the maps (string key -> message) in the given map-holding messages:
    the records where it appears (sorted, the last entry of a key winning) and the starts and
    ends of its value messages."""
    data = context.buffer.data
    if len(owners) == context.batch and (len(owners) < 2 or (owners[1:] > owners[:-1]).all()):
        found = _lookup_alike(context, starts, ends, keys)
        if found is not None:
            return found
    entries = _wire.scan(data, starts, ends).select(1, 2)
    entry_record = owners[entries.owner]
    key_start, key_end, value_start, value_end = _entries(data, entries.start, entries.end)
    name_of = _match_keys(data, key_start, key_end - key_start, keys)
    # Entries of wanted keys, grouped by key, records ascending; a key's last entry in a
    # record wins (as when protobuf parses a map).
    wanted = np.flatnonzero(name_of >= 0)
    wanted = wanted[np.argsort(name_of[wanted], kind="stable")]
    names, records = name_of[wanted], entry_record[wanted]
    if len(wanted) > 1:
        last = np.ones(len(wanted), bool)
        last[:-1] = (names[1:] != names[:-1]) | (records[1:] != records[:-1])
        if not last.all():
            wanted, names, records = wanted[last], names[last], records[last]
    bounds = np.searchsorted(names, np.arange(len(keys) + 1))
    found = {}
    for index, name in enumerate(keys):
        part = wanted[bounds[index]:bounds[index + 1]]
        found[name] = (records[bounds[index]:bounds[index + 1]], value_start[part],
                       value_end[part])
    return found


def _lookup_alike(context: _Context, starts: np.ndarray, ends: np.ndarray,
                  keys: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
    """:func:`_lookup` for one map per record where every record holds the same keys in the
    same order (records written alike): the keys are compared across records one entry
    position at a time. None when the records differ (or look malformed)."""
    data, raw = context.buffer.data, context.buffer.raw
    fields = _wire.uniform_fields(data, starts, ends, 0x0A)
    if fields is None:
        return None
    begins, stops = fields
    if begins.size:
        # Each entry is the key field (tag, length, key), then the value field. The first
        # record's entries give each position's key length; the first 8 bytes of every entry
        # (tag, length and up to 6 bytes of key) must be those of the first record's.
        key_length = data[begins[:, 0] + 1].astype(np.int64)
        if key_length.max() >= 0x80 or (data[begins[:, 0]] != 0x0A).any():
            return None
        words = _wire.words(data)
        keep = _wire.LOW_BYTES[np.minimum(key_length + 2, 8)][:, None]
        head = words[begins] & keep
        key_end = begins + (key_length + 2)[:, None]
        if not (head == head[:, :1]).all() or (
                key_length.max() > 6 and not _same_keys(data, begins + 2, key_length)):
            return None
        value_head = words[key_end]
        value_length = ((value_head >> _8) & _LOW8).astype(np.int64)
        if not ((value_head & _LOW8) == 0x12).all():
            return None
        value_start = key_end + 2
        if value_length.max() >= 0x80:
            length, after = _wire.read_varints(data, (key_end + 1).ravel(), stops.ravel())
            value_start = after.reshape(stops.shape)
            value_length = length.astype(np.int64).reshape(stops.shape)
        if not (value_start + value_length == stops).all():
            return None
        key_start, key_length = begins + 2, key_length[:, None]
    wanted = {key.encode(): key for key in keys}
    found: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    every = np.arange(context.batch, dtype=np.int64)
    for position in range(len(begins)):  # a key's last entry wins, as in protobuf's maps
        first = int(key_start[position, 0])
        name = wanted.get(raw[first:first + int(key_length[position, 0])])
        if name is not None:
            found[name] = (every, value_start[position], stops[position])
    nowhere = np.zeros(0, np.int64)
    for key in keys:
        found.setdefault(key, (nowhere, nowhere, nowhere))
    return found


def _same_keys(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> bool:
    """Whether each row of keys ``data[starts[i, j]:starts[i, j] + lengths[i]]`` is one key,
    compared 8 bytes at a time."""
    words = _wire.words(data)
    for offset in range(0, int(lengths.max(initial=0)), 8):
        if int(starts.max()) + offset >= len(words):
            return False
        keep = _wire.LOW_BYTES[np.clip(lengths - offset, 0, 8)][:, None]
        chunk = words[starts + offset] & keep
        if not (chunk == chunk[:, :1]).all():
            return False
    return True


def _entries(data: np.ndarray, starts: np.ndarray,
             ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Where the key and the value of each map entry start and end (an entry without a key
    has the empty key; without a value, an empty message)."""
    count = len(starts)
    if count and (starts + 2 < ends).all() and (data[starts] == 0x0A).all():
        # The usual layout, key then value, each with a one-byte tag and length.
        key_start = starts + 2
        key_end = key_start + data[starts + 1]
        if (data[starts + 1] < 0x80).all() and (key_end + 2 <= ends).all() and \
                (data[key_end] == 0x12).all() and (data[key_end + 1] < 0x80).all():
            value_start = key_end + 2
            value_end = value_start + data[key_end + 1]
            if (value_end == ends).all():
                return key_start, key_end, value_start, value_end
    parts = _wire.scan(data, starts, ends)
    key_start = np.zeros(count, np.int64)
    key_end = np.zeros(count, np.int64)
    value_start = np.zeros(count, np.int64)
    value_end = np.zeros(count, np.int64)
    key = parts.select(1, 2)
    key_start[key.owner], key_end[key.owner] = key.start, key.end
    value = parts.select(2, 2)
    value_start[value.owner], value_end[value.owner] = value.start, value.end
    return key_start, key_end, value_start, value_end


def _match_keys(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                keys: list[str]) -> np.ndarray:
    """For each map key ``data[starts[i]:starts[i] + lengths[i]]``, its index in ``keys``, or
    -1. Keys are compared as zero-padded rows of 64-bit words (a number mixing the words finds
    the candidate, the words confirm it)."""
    encoded = [key.encode() for key in keys]
    result = np.full(len(starts), -1, np.int64)
    if not encoded or not len(starts):
        return result
    words = max(1, -(-max(map(len, encoded)) // 8))
    width = 8 * words
    table = np.zeros((len(keys), width), np.uint8)
    for index, key in enumerate(encoded):
        table[index, :len(key)] = np.frombuffer(key, np.uint8)
    table_words = table.view("<u8")
    table_lengths = np.array([len(key) for key in encoded], np.int64)
    padded = data if int(starts.max()) + width <= len(data) else \
        np.concatenate([data, np.zeros(width, np.uint8)])
    rows = np.lib.stride_tricks.sliding_window_view(padded, width)[starts].view("<u8")
    for word in range(words):  # zero the bytes after each key
        keep = np.clip(lengths - 8 * word, 0, 8)
        rows[:, word] &= _wire.LOW_BYTES[keep]
    if words == 1:
        codes, table_codes = rows[:, 0], table_words[:, 0]
    else:
        codes = (rows * _MIX[:words]).sum(axis=1, dtype=np.uint64)
        table_codes = (table_words * _MIX[:words]).sum(axis=1, dtype=np.uint64)
    order = np.argsort(table_codes)
    position = np.minimum(np.searchsorted(table_codes[order], codes), len(keys) - 1)
    index = order[position]
    same = table_lengths[index] == lengths
    if words == 1:
        same &= table_codes[index] == codes
    else:
        same &= (table_words[index] == rows).all(axis=1)
    result[same] = index[same]
    return result


_MIX = np.array([(0x9E3779B97F4A7C15 * (i + 1)) & 0xFFFFFFFFFFFFFFFF for i in range(64)],
                np.uint64)


def _feature_values(context: _Context, keys: list[str], slot_key: np.ndarray, kind: int,
                    starts: np.ndarray, ends: np.ndarray,
                    records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The values of the Feature messages ``data[starts[i]:ends[i]]`` (of key
    ``keys[slot_key[i]]`` in record ``records[i]``), all of ``kind``: how many each holds,
    and all of them. A Feature of no kind is empty."""
    data = context.buffer.data
    slots = len(starts)
    short = _short_lists(data, starts, ends, kind << 3 | 2)
    if short is not None:
        begin, end, slot = short
        one = np.arange(len(begin), dtype=np.int64)
        items = _wire.Fields(one, one, np.full(len(one), 2), begin, end, one)
        if kind == BYTES:
            return _strings(context, items, slot, slots)
        return _numbers(data, kind, items, slot, slots)
    single = _wire.single_fields(data, starts, ends, kind << 3 | 2)
    if single is not None:  # each Feature holds one list of the expected kind
        return _list_values(context, kind, single[0], single[1],
                            np.arange(slots, dtype=np.int64), slots)
    fields = _wire.scan(data, starts, ends)
    lists = fields.select(kind, 2)
    if len(lists.owner) != len(fields):
        rest = [k for k in (BYTES, FLOAT, INT64) if k != kind]
        other = fields.others((rest[0], rest[1]), 2)
        if len(other.owner):
            slot = other.owner[0]
            record = int(records[slot])
            raise InvalidArgumentError(
                f"Name: {context.name(record)}, Key: {keys[slot_key[slot]]}, Index: {record}.  "
                f"Data types don't match. Data type: {KIND_NAMES[int(other.number[0])]} "
                f"Expected type: {KIND_NAMES[kind]}"
            )
    return _list_values(context, kind, lists.start, lists.end, lists.owner, slots)


def _short_lists(data: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                 tag: int | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The usual Feature, read from the 8 bytes it starts with: the list field ``tag`` (one
    for all, or each Feature's), then
    (unless the list is empty) one packed field or byte string, both under 128 bytes long.
    Where each such field's payload starts and ends, and which Feature holds it; None when
    some Feature is otherwise."""
    if not len(starts):
        return None
    head = _wire.words(data)[starts]
    outer = ((head >> _8) & _LOW7).astype(np.int64)  # the list's length, if under 128
    empty = outer == 0
    if empty.any():
        if not (np.where(empty, head & _TAG_MASK[0], head & _TAG_MASK[1])
                == np.where(empty, tag, _INNER_TAG | tag)).all():
            return None
        slot = np.flatnonzero(~empty)
        if not (starts[empty] + 2 == ends[empty]).all():
            return None
        starts, ends, head, outer = starts[slot], ends[slot], head[slot], outer[slot]
    else:
        if not ((head & _TAG_MASK[1]) == (_INNER_TAG | tag)).all():
            return None
        slot = np.arange(len(starts), dtype=np.int64)
    inner = ((head >> _24) & _LOW7).astype(np.int64)
    if not ((starts + 2 + outer == ends) & (inner + 2 == outer)).all():
        return None
    return starts + 4, ends, slot


_8, _24 = np.uint64(8), np.uint64(24)
_LOW7, _LOW8 = np.uint64(0x7F), np.uint64(0xFF)
# Of a Feature's first bytes (tag, length, 0x0A, length): the bits to compare when its list is
# empty, and when not; and the tag of the list's field.
_TAG_MASK = (np.uint64(0x80FF), np.uint64(0x80FF80FF))
_INNER_TAG = np.uint64(0x0A << 16)


def _list_values(context: _Context, kind: int, starts: np.ndarray, ends: np.ndarray,
                 list_slot: np.ndarray, slots: int) -> tuple[np.ndarray, np.ndarray]:
    """The values in the BytesList, FloatList or Int64List messages at ``starts``/``ends``
    (each of slot ``list_slot[i]``): how many each slot holds, and all of them."""
    data = context.buffer.data
    wire_type = 0 if kind == INT64 else 2
    nonempty = starts < ends
    if not nonempty.all():  # empty lists hold no values
        keep = np.flatnonzero(nonempty)
        starts, ends, list_slot = starts[keep], ends[keep], list_slot[keep]
    single = _wire.single_fields(data, starts, ends, 0x0A)
    if single is not None:  # one field each: a packed list, or one byte string
        one = np.arange(len(starts), dtype=np.int64)
        items = _wire.Fields(one, one, np.full(len(one), 2), single[0], single[1], one)
        if kind == BYTES:
            return _strings(context, items, list_slot, slots)
        return _numbers(data, kind, items, list_slot, slots)
    found = _wire.scan(data, starts, ends)
    items = found.select(1, 2) if kind == BYTES else \
        found.select_any(1, (2, 5 if kind == FLOAT else wire_type))
    slot = list_slot[items.owner]
    if len(slot) > 1 and (slot[1:] < slot[:-1]).any():
        # Values in slot order: the Features of different keys interleave in a record.
        order = np.argsort(slot, kind="stable")
        items = items.take(order)
        list_slot = list_slot[items.owner]
        items = items._replace(owner=np.arange(len(order), dtype=np.int64))
    if kind == BYTES:
        return _strings(context, items, list_slot, slots)
    return _numbers(data, kind, items, list_slot, slots)


def _strings(context: _Context, items: _wire.Fields, list_slot: np.ndarray,
             slots: int) -> tuple[np.ndarray, np.ndarray]:
    raw = context.buffer.raw
    values = np.empty(len(items.owner), object)
    values[:] = [raw[a:b] for a, b in zip(items.start.tolist(), items.end.tolist())]
    return _per_slot(list_slot[items.owner], slots), values


def _numbers(data: np.ndarray, kind: int, items: _wire.Fields, list_slot: np.ndarray,
             slots: int) -> tuple[np.ndarray, np.ndarray]:
    if kind == FLOAT:
        return _floats(data, items, list_slot, slots)
    return _ints(data, items, list_slot, slots)


def _per_slot(owner: np.ndarray, slots: int, weights: np.ndarray | None = None) -> np.ndarray:
    if weights is None:
        return np.bincount(owner, minlength=slots).astype(np.int64)
    return np.bincount(owner, weights=weights, minlength=slots).astype(np.int64)


def _floats(data: np.ndarray, items: _wire.Fields, list_slot: np.ndarray,
            slots: int) -> tuple[np.ndarray, np.ndarray]:
    size = items.end - items.start
    if (size % 4).any():
        raise DataLossError("malformed record: a packed float list of a length not a "
                            "multiple of 4")
    values = _wire.little_floats(data, items.start, size // 4)
    return _per_slot(list_slot[items.owner], slots, size // 4), values


def _ints(data: np.ndarray, items: _wire.Fields, list_slot: np.ndarray,
          slots: int) -> tuple[np.ndarray, np.ndarray]:
    slot = list_slot[items.owner]
    packed = items.wire_type == 2
    if packed.all():
        values, counts = _wire.decode_packed_varints(data, items.start, items.end)
        return _per_slot(slot, slots, counts), _wire.as_int(values)
    # Packed and unpacked pieces, merged in document order.
    piece_counts = np.ones(len(slot), np.int64)
    packed_values, piece_counts[packed] = _wire.decode_packed_varints(
        data, items.start[packed], items.end[packed])
    offsets = np.cumsum(piece_counts) - piece_counts
    values = np.empty(int(piece_counts.sum()), np.uint64)
    values[_wire.ranges(offsets[packed], piece_counts[packed])] = packed_values
    values[offsets[~packed]] = items.value[~packed]
    return _per_slot(slot, slots, piece_counts), _wire.as_int(values)


def _columns(context: _Context, found: Mapping[str, tuple[np.ndarray, ...]],
             kinds: Mapping[str, int], sequence: bool) -> dict[str, _Column]:
    """The column of each key: the Features of all keys of one kind are decoded together (for
    feature lists, the Features of their steps)."""
    columns = {}
    groups = [(kind, keys) for kind in (BYTES, FLOAT, INT64)
              if (keys := [key for key, wanted in kinds.items() if wanted == kind])]
    decoded = None if sequence else _usual_features(context, found, groups)
    for kind, keys in groups:
        per_key = np.array([len(found[key][0]) for key in keys], np.int64)
        steps, per_slot_key = None, per_key
        if decoded:
            counts, values = decoded[kind]
        else:
            counts, values, steps, per_slot_key = _kind_values(context, found, keys, kind,
                                                               per_key, sequence)
        # Each key's slots, values and lists, as bounds into the arrays of all keys.
        slot_bounds = [0, *accumulate(per_slot_key.tolist())]
        value_bounds = np.concatenate(([0], np.cumsum(counts)))[slot_bounds].tolist()
        list_bounds = [0, *accumulate(per_key.tolist())]
        for index, key in enumerate(keys):
            key_steps = None if steps is None else \
                steps[list_bounds[index]:list_bounds[index + 1]]
            columns[key] = _Column(found[key][0],
                                   counts[slot_bounds[index]:slot_bounds[index + 1]],
                                   values[value_bounds[index]:value_bounds[index + 1]],
                                   key_steps)
    return columns


def _kind_values(context: _Context, found: Mapping[str, tuple[np.ndarray, ...]],
                 keys: list[str], kind: int, per_key: np.ndarray, sequence: bool
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
    """The values of the Features of ``keys`` (all of ``kind``): how many each slot holds and
    all of them; and for feature lists, the steps of each and the slots of each key."""
    records, starts, ends = (np.concatenate([found[key][i] for key in keys]) for i in range(3))
    slot_key = np.repeat(np.arange(len(keys)), per_key)
    steps, per_slot_key = None, per_key
    if sequence:  # slots are the steps of the feature lists
        lists = np.arange(len(records))
        starts, ends, owner = _messages(context.buffer.data, starts, ends, lists, 1)
        steps = np.bincount(owner, minlength=len(records)).astype(np.int64)
        slot_key, records = slot_key[owner], records[owner]
        per_slot_key = np.bincount(slot_key, minlength=len(keys))
    counts, values = _feature_values(context, keys, slot_key, kind, starts, ends, records)
    return counts, values, steps, per_slot_key


def _usual_features(context: _Context, found: Mapping[str, tuple[np.ndarray, ...]],
                    groups: list[tuple[int, list[str]]]
                    ) -> dict[int, tuple[np.ndarray, np.ndarray]] | None:
    """:func:`_feature_values` of each kind's keys where every Feature of every kind has the
    usual layout (see :func:`_short_lists`), which is checked for all of them at once; None
    otherwise."""
    starts, ends = (np.concatenate([found[key][i] for _, keys in groups for key in keys])
                    for i in (1, 2))
    per_kind = [sum(len(found[key][0]) for key in keys) for _, keys in groups]
    tags = np.repeat(np.array([kind << 3 | 2 for kind, _ in groups], np.uint64), per_kind)
    short = _short_lists(context.buffer.data, starts, ends, tags)
    if short is None:
        return None
    begin, end, slot = short
    first_slots = np.cumsum([0, *per_kind])
    cuts = np.searchsorted(slot, first_slots).tolist()
    decoded = {}
    for index, (kind, _) in enumerate(groups):
        a, b = cuts[index], cuts[index + 1]
        one = np.arange(b - a, dtype=np.int64)
        items = _wire.Fields(one, one, np.full(len(one), 2), begin[a:b], end[a:b], one)
        kind_slot, slots = slot[a:b] - first_slots[index], per_kind[index]
        decoded[kind] = _strings(context, items, kind_slot, slots) if kind == BYTES else \
            _numbers(context.buffer.data, kind, items, kind_slot, slots)
    return decoded


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
    if size and len(records) == batch and (counts == size).all():  # the usual case
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
    return _Context(_wire.join(records), len(records), _names(example_names, len(records)))


def _example_columns(context: _Context, kinds: Mapping[str, int],
                     field: int = 1) -> dict[str, _Column]:
    """The columns of Example features (field 1) or SequenceExample context (field 1) or
    feature lists (field 2, then read with :func:`_sequence_columns`)."""
    buffer = context.buffer
    records = np.arange(context.batch, dtype=np.int64)
    starts, ends, owners = _messages(buffer.data, buffer.starts, buffer.ends, records, field)
    found = _lookup(context, starts, ends, owners, list(kinds))
    return _columns(context, found, kinds, sequence=field == 2)


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


# --- the public functions ----------------------------------------------------------------------

def check_features(features: Any) -> dict[str, int]:
    """Checks the ``features`` of :func:`parse_example`; the kind to read each key as."""
    if not isinstance(features, Mapping) or not features:
        raise InvalidArgumentError("features must be a non-empty dict of feature configs")
    return _requests(features, "features")


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
    kinds = check_features(features)
    context = _context(serialized, example_names)
    return _outputs(context, features, _example_columns(context, kinds))


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
                                  _example_columns(context, context_kinds, 1))
    parsed_lists: dict[str, Any] = {}
    lengths: dict[str, Any] = {}
    if sequence_features:
        columns = _example_columns(context, sequence_kinds, 2)
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
