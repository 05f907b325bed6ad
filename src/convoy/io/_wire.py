"""The protobuf wire format, read for many messages at once with numpy.

A batch of serialized records is joined into one byte array; the parser then steps through
all messages of one nesting level together ("lockstep"): each step reads the next field of
every message still unfinished, so the number of numpy calls grows with the number of fields
per message, not with the number of records. No message object is built.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from convoy.errors import DataLossError

_PAD = 16  # zero bytes after the data, so reading up to 10 bytes of a varint stays in bounds
_PAD_BYTES = bytes(_PAD)
_U7 = np.uint64(0x7F)


class Buffer(NamedTuple):
    """Records joined: ``raw`` (bytes, padded), ``data`` (its uint8 view), ``starts`` and
    ``ends`` of each record."""

    raw: bytes
    data: np.ndarray
    starts: np.ndarray
    ends: np.ndarray


def join(records: list[bytes]) -> Buffer:
    """The records as one padded buffer."""
    lengths = np.fromiter(map(len, records), dtype=np.int64, count=len(records))
    ends = np.cumsum(lengths)
    raw = b"".join([*records, _PAD_BYTES])
    data = np.frombuffer(raw, dtype=np.uint8)
    return Buffer(raw, data, ends - lengths, ends)


class Fields(NamedTuple):
    """Fields of several messages in document order: the message each belongs to
    (``owner``), its field ``number`` and ``wire_type``, where its payload starts and ends
    and, for a varint, its ``value``."""

    owner: np.ndarray
    number: np.ndarray
    wire_type: np.ndarray
    start: np.ndarray
    end: np.ndarray
    value: np.ndarray

    def take(self, keep: np.ndarray) -> Fields:
        return Fields(*(part[keep] for part in self))


class Scan:
    """The fields found by :func:`scan`, as read step by step (each step in owner order)."""

    def __init__(self, parts: list[Fields]) -> None:
        self.parts = parts

    def __len__(self) -> int:
        return sum(len(part.owner) for part in self.parts)

    def select(self, number: int, wire_type: int) -> Fields:
        """The fields of ``number`` and ``wire_type``, in document order."""
        return self._select(lambda part: (part.number == number) &
                            (part.wire_type == wire_type))

    def select_any(self, number: int, wire_types: tuple[int, int]) -> Fields:
        return self._select(lambda part: (part.number == number) & (
            (part.wire_type == wire_types[0]) | (part.wire_type == wire_types[1])))

    def others(self, numbers: tuple[int, int], wire_type: int) -> Fields:
        """The fields of either of ``numbers`` with ``wire_type``."""
        return self._select(lambda part: (part.wire_type == wire_type) & (
            (part.number == numbers[0]) | (part.number == numbers[1])))

    def _select(self, condition: Any) -> Fields:
        chosen = []
        for part in self.parts:
            keep = condition(part)
            if keep.all():
                chosen.append(part)
            elif keep.any():
                chosen.append(part.take(np.flatnonzero(keep)))
        if not chosen:
            empty = np.zeros(0, np.int64)
            return Fields(empty, empty, empty, empty, empty, np.zeros(0, np.uint64))
        if len(chosen) == 1:
            return chosen[0]
        joined = [np.concatenate(column) for column in zip(*chosen)]
        order = np.argsort(joined[3], kind="stable")
        return Fields(*(column[order] for column in joined))


def read_varints(data: np.ndarray, position: np.ndarray,
                 limit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The varints starting at ``position`` (uint64) and the positions after them."""
    first = data[position]
    if not len(first) or first.max() < 0x80:  # all one byte: the usual tags and lengths
        after = position + 1
        if (after > limit).any():
            raise DataLossError("malformed record: truncated varint")
        return first.astype(np.uint64), after
    value = (first & 0x7F).astype(np.uint64)
    length = np.ones(len(position), np.int64)
    more = np.flatnonzero(first >= 0x80)
    shift = np.uint64(7)
    for _ in range(9):
        if not more.size:
            break
        byte = data[position[more] + length[more]]
        value[more] |= (byte & _U7) << shift
        length[more] += 1
        more = more[byte >= 0x80]
        shift += np.uint64(7)
    if more.size:
        raise DataLossError("malformed record: a varint longer than 10 bytes")
    after = position + length
    if (after > limit).any():
        raise DataLossError("malformed record: truncated varint")
    return value, after


def scan(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Scan:
    """All fields of the messages ``data[starts[i]:ends[i]]``, in document order."""
    owner = np.flatnonzero(starts < ends)
    cursor, limit = starts[owner], ends[owner]
    parts: list[Fields] = []
    while owner.size:
        first = data[cursor]
        if first.max() < 0x80 and ((first & 7) == 2).all():
            # The usual case: one-byte tags of length-delimited fields.
            number, wire_type = first >> 3, np.full(len(first), 2, np.uint8)
            value = np.zeros(len(first), np.uint64)
            length_byte = data[cursor + 1]
            if length_byte.max() < 0x80:
                start = cursor + 2
                end = start + length_byte
            else:
                length, start = read_varints(data, cursor + 1, limit)
                end = start + _as_length(length)
        else:
            tag, after = read_varints(data, cursor, limit)
            wire_type = (tag & np.uint64(7)).astype(np.int64)
            number = (tag >> np.uint64(3)).astype(np.int64)
            start, end = after.copy(), after.copy()
            value = np.zeros(len(owner), np.uint64)
            _read_payloads(data, wire_type, after, limit, start, end, value)
        if (end > limit).any():
            raise DataLossError("malformed record: a field runs past the end of its message")
        parts.append(Fields(owner, number, wire_type, start, end, value))
        going = end < limit
        if going.all():
            cursor = end
        else:
            owner, cursor, limit = owner[going], end[going], limit[going]
    return Scan(parts)


def single_fields(data: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                  tag: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Where the payloads start and end if every message ``data[starts[i]:ends[i]]`` is
    exactly one length-delimited field with the one-byte ``tag`` (the usual case, read with a
    few numpy calls); None otherwise."""
    if not len(starts):
        return starts, ends
    if not (starts < ends).all() or not (data[starts] == tag).all():
        return None
    length, begin = read_varints(data, starts + 1, ends)
    end = begin + _as_length(length)
    if not (end == ends).all():
        return None
    return begin, end


def uniform_fields(data: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                   tag: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Where the payloads start and end (arrays ``[fields, messages]``) if every message
    ``data[starts[i]:ends[i]]`` is the same number of length-delimited fields, all with the
    one-byte ``tag`` (a map of a batch of records written alike); None otherwise (the caller
    falls back to :func:`scan`, which also finds any malformation)."""
    if not len(starts):
        empty = np.zeros((0, 0), np.int64)
        return empty, empty
    count = _count_fields(data[starts[0]:ends[0]].tobytes(), tag)
    if count is None:
        return None
    if not count:
        return (None if (starts < ends).any() else
                (np.zeros((0, len(starts)), np.int64), np.zeros((0, len(starts)), np.int64)))
    # Fields of one-byte lengths first, in a few numpy calls per field; checked at the end.
    tags = np.empty((count, len(starts)), np.int64)
    begins = np.empty_like(tags)
    stops = np.empty_like(tags)
    position = starts
    try:
        for field in range(count):
            tags[field] = position
            begins[field] = begin = position + 2
            stops[field] = position = begin + data[begin - 1]
        long = bool((data[begins - 1] >= 0x80).any())
    except IndexError:  # positions past the data: a length byte >= 0x80, or records unlike
        long = True
    if long:
        return _uniform_long_fields(data, starts, ends, count, tag)
    if not (position == ends).all() or not (data[tags] == tag).all():
        return None
    return begins, stops


def _count_fields(message: bytes, tag: int) -> int | None:
    """How many fields ``message`` holds if all are length-delimited with the one-byte
    ``tag``; None otherwise."""
    count = position = 0
    while position < len(message):
        if message[position] != tag:
            return None
        length = shift = 0
        position += 1
        while position < len(message) and message[position] & 0x80 and shift < 63:
            length |= (message[position] & 0x7F) << shift
            shift += 7
            position += 1
        if position >= len(message):
            return None
        length |= message[position] << shift
        position += 1 + length
        count += 1
    return count if position == len(message) else None


def _uniform_long_fields(data: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                         count: int, tag: int) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`uniform_fields` where some field's length takes several bytes."""
    begins, stops, tags = [], [], []
    position = starts
    for _ in range(count):
        if not (position < ends).all():
            return None
        tags.append(position)
        length, begin = read_varints(data, position + 1, ends)
        stop = begin + _as_length(length)
        begins.append(begin)
        stops.append(stop)
        position = stop
    if not (position == ends).all() or not (data[np.stack(tags)] == tag).all():
        return None
    return np.stack(begins), np.stack(stops)


def _as_length(length: np.ndarray) -> np.ndarray:
    if (length > np.uint64(1 << 40)).any():
        raise DataLossError("malformed record: a field length is impossibly large")
    return length.astype(np.int64)


def _read_payloads(data: np.ndarray, wire_type: np.ndarray, after: np.ndarray,
                   limit: np.ndarray, start: np.ndarray, end: np.ndarray,
                   value: np.ndarray) -> None:
    varint = np.flatnonzero(wire_type == 0)
    if varint.size:
        value[varint], end[varint] = read_varints(data, after[varint], limit[varint])
    delimited = np.flatnonzero(wire_type == 2)
    if delimited.size:
        length, begin = read_varints(data, after[delimited], limit[delimited])
        start[delimited] = begin
        end[delimited] = begin + _as_length(length)
    end[wire_type == 1] += 8
    end[wire_type == 5] += 4
    if not np.isin(wire_type, (0, 1, 2, 5)).all():
        raise DataLossError("malformed record: unknown or group wire type")


def words(data: np.ndarray) -> np.ndarray:
    """The little-endian 64-bit word starting at each byte of ``data`` (a view)."""
    return np.ndarray((max(len(data) - 7, 0),), "<u8", buffer=data, strides=(1,))


def ranges(starts: np.ndarray, lengths: np.ndarray, step: int = 1) -> np.ndarray:
    """The positions ``starts[i] + step * (0 .. lengths[i] - 1)`` for all i, concatenated."""
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, np.int64)
    offsets = np.cumsum(lengths) - lengths
    if step == 1:
        return np.repeat(starts - offsets, lengths) + np.arange(total, dtype=np.int64)
    return np.repeat(starts - step * offsets, lengths) + np.arange(0, step * total, step,
                                                                   dtype=np.int64)


def little_floats(data: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The ``counts[i]`` little-endian float32 values from each ``starts[i]``, concatenated."""
    if len(counts) and counts[0] > 0 and (counts == counts[0]).all():
        # lists of one length (a FixedLenFeature's): each gathered as one row of that many
        width = int(counts[0])
        rows = np.ndarray((max(len(data) - 4 * width + 1, 0), width), "<f4", buffer=data,
                          strides=(1, 4))
        return rows[starts].reshape(-1).astype(np.float32, copy=False)
    view = np.ndarray((max(len(data) - 3, 0),), "<f4", buffer=data, strides=(1,))
    return view[ranges(starts, counts, 4)].astype(np.float32, copy=False)


_U64 = np.uint64
# Masks gathering the 7-bit groups of up to 8 varint bytes in a word into one number.
_GATHER = [(_U64(0x007F007F007F007F), _U64(0x7F007F007F007F00), _U64(1)),
           (_U64(0x00003FFF00003FFF), _U64(0x3FFF00003FFF0000), _U64(2)),
           (_U64(0x000000000FFFFFFF), _U64(0x0FFFFFFF00000000), _U64(4))]
LOW_BYTES = np.array([(1 << (8 * n)) - 1 for n in range(9)], np.uint64)


# Of the first n (0 to 8) bytes of a word: their high bits; and those set when the bytes of a
# range of n (0 to 10) are exactly one varint (every byte's but the last's).
_HIGH_BITS = np.array([sum(0x80 << (8 * i) for i in range(n)) for n in range(9)], np.uint64)
_ONE_VARINT = np.array([sum(0x80 << (8 * i) for i in range(min(n - 1, 8))) for n in range(11)],
                       np.uint64)


def _gather_groups(value: np.ndarray) -> np.ndarray:
    """The 7-bit groups of the (up to 8) varint bytes of each word, as one number."""
    for low, high, shift in _GATHER:
        value = (value & low) | ((value & high) >> shift)
    return value


def _high_groups(data: np.ndarray, at: np.ndarray, width: np.ndarray) -> np.ndarray:
    """Bits 56 to 63 of varints of 9 or 10 bytes, from their ninth and tenth byte."""
    ninth = data[at + 8].astype(np.uint64) & _U7
    tenth = np.where(width > 9, data[at + 9], 0).astype(np.uint64) & _U7
    return (ninth << _U64(56)) | (tenth << _U64(63))


def varints_at(data: np.ndarray, at: np.ndarray, width: np.ndarray) -> np.ndarray:
    """The varints of ``width[i]`` (1 to 10) bytes at ``at[i]``, read 8 bytes at a time."""
    value = _gather_groups(words(data)[at] & LOW_BYTES[np.minimum(width, 8)])
    long = np.flatnonzero(width > 8)
    if long.size:
        value[long] |= _high_groups(data, at[long], width[long])
    return value


def decode_packed_varints(data: np.ndarray, starts: np.ndarray,
                          ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The varints packed in each ``data[starts[i]:ends[i]]`` (uint64, concatenated) and how
    many each range holds."""
    lengths = ends - starts
    if not len(starts) or lengths.max() > 10:  # some range holds several varints
        return _bytewise_varints(data, starts, ends)
    # Ranges each holding one varint (int64 scalars') are read as words, and two more bytes
    # for a varint of 9 or 10 bytes (a negative number's).
    width = np.minimum(lengths, 8)
    word = words(data)[starts] & LOW_BYTES[width]
    single = (word & _HIGH_BITS[width]) == _ONE_VARINT[lengths]
    long = np.flatnonzero(lengths > 8)
    if long.size:
        at, size = starts[long], lengths[long]
        ninth, tenth = data[at + 8], data[at + 9]
        single[long] &= np.where(size == 10, (ninth >= 0x80) & (tenth < 0x80), ninth < 0x80)
    if not single.all():  # lists of several short varints
        return _bytewise_varints(data, starts, ends)
    value = _gather_groups(word)
    if long.size:
        value[long] |= _high_groups(data, at, size)
    counts = (lengths > 0).astype(np.int64)
    return (value if counts.all() else value[counts > 0]), counts


def _bytewise_varints(data: np.ndarray, starts: np.ndarray,
                      ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`decode_packed_varints` of any ranges, byte by byte."""
    lengths = ends - starts
    where = ranges(starts, lengths)
    if not len(where):
        return np.zeros(0, np.uint64), np.zeros(len(starts), np.int64)
    raw = data[where]
    last = raw < 0x80
    bounds = np.cumsum(lengths)
    if not last[bounds[lengths > 0] - 1].all():
        raise DataLossError("malformed record: truncated packed varint")
    ends_at = np.flatnonzero(last)
    if len(ends_at) == len(raw):  # every varint is one byte
        return raw.astype(np.uint64), lengths
    begins = np.empty(len(ends_at), np.int64)
    begins[0] = 0
    begins[1:] = ends_at[:-1] + 1
    width = ends_at - begins + 1
    if (width > 10).any():
        raise DataLossError("malformed record: a varint longer than 10 bytes")
    values = varints_at(data, where[begins], width)
    # The varints ending in each range.
    counts = np.searchsorted(ends_at, bounds)
    counts[1:] -= counts[:-1].copy()
    return values, counts


def as_int(values: Any) -> np.ndarray:
    """uint64 varints as int64 (two's complement, as protobuf encodes negative int64)."""
    return values.view(np.int64)
