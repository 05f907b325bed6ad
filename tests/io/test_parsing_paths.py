"""parse_example reads batches of records written alike (same keys in the same order) on a
fast path and any other batch field by field; both must give what protobuf reads. Each test
checks convoy against protobuf's own parse of the same bytes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from convoy import io

KINDS = {np.int64: "int64_list", np.float32: "float_list", bytes: "bytes_list"}


def feature(dtype: Any, values: Any) -> io.Feature:
    field = KINDS[dtype]
    message = {"int64_list": io.Int64List, "float_list": io.FloatList,
               "bytes_list": io.BytesList}[field](value=values)
    return io.Feature(**{field: message})


def example(features: dict[str, io.Feature]) -> bytes:
    return io.Example(features=io.Features(feature=features)).SerializeToString()


def expected_values(record: bytes, key: str, dtype: Any) -> list[Any]:
    """protobuf's reading: the values of ``key`` in ``record`` (none if absent)."""
    parsed = io.Example.FromString(record).features.feature
    if key not in parsed:
        return []
    return list(getattr(parsed[key], KINDS[dtype]).value)


def check(records: list[bytes], dtypes: dict[str, Any]) -> None:
    """Every key read as a VarLenFeature gives protobuf's values, record by record."""
    out = io.parse_example(records, {key: io.VarLenFeature(dtype)
                                     for key, dtype in dtypes.items()})
    for key, dtype in dtypes.items():
        sparse = out[key]
        for index, record in enumerate(records):
            got = sparse.values[sparse.indices[:, 0] == index].tolist()
            want = expected_values(record, key, dtype)
            if dtype is np.float32:
                want = np.array(want, np.float32).tolist()
            assert got == want, (key, index)


def random_values(rng: np.random.Generator, dtype: Any, count: int) -> list[Any]:
    if dtype is np.int64:
        edges = [0, 1, -1, 127, 128, 2**63 - 1, -(2**63), 2**31, -(2**31)]
        return [int(rng.choice(edges)) if rng.random() < 0.3 else
                int(rng.integers(-(2**62), 2**62)) >> int(rng.integers(0, 62))
                for _ in range(count)]
    if dtype is np.float32:
        return rng.standard_normal(count).astype(np.float32).tolist()
    return [bytes(rng.integers(0, 256, size=int(rng.choice([0, 3, 200] if count > 2 else
                                                           [0, 3, 20])), dtype=np.uint8))
            for _ in range(count)]


# keys around the 8-byte words keys are compared in, one that is not ASCII, and two that
# differ only after their first 8 bytes
KEYS = {"a": np.int64, "long_key": np.float32, "nine_char": bytes, "x" * 17: np.int64,
        "schlüssel": bytes, "feature/name_1": np.int64, "feature/name_2": np.float32}


@pytest.mark.parametrize("seed", range(8))
def test_records_written_alike(seed: int) -> None:
    """Same keys in the same order in every record: values of every size (multi-byte
    lengths, 10-byte varints, empty lists and strings); or only short lists, read from each
    Feature's first 8 bytes."""
    rng = np.random.default_rng(seed)
    sizes = [0, 1, 4, 40] if seed < 6 else [0, 1, 2]
    records = [example({key: feature(dtype, random_values(rng, dtype, int(rng.choice(sizes))))
                        for key, dtype in KEYS.items()}) for _ in range(int(rng.integers(1, 40)))]
    check(records, KEYS)
    check(records, {"a": np.int64, "feature/name_2": np.float32, "absent": bytes})


def test_records_not_alike() -> None:
    """A record missing a key, one with its keys in another order, one with a key the others
    lack: each batch parses as protobuf reads it."""
    rng = np.random.default_rng(7)

    def record(keys: list[str]) -> bytes:
        return example({key: feature(KEYS[key], random_values(rng, KEYS[key], 3))
                        for key in keys})

    keys = list(KEYS)
    alike = [record(keys) for _ in range(5)]
    check(alike + [record(keys[1:])], KEYS)
    check(alike + [record(keys[::-1])], KEYS)
    check([record(keys[:3]), record(keys[:3]), record(keys[:4])], KEYS)
    check([record(["feature/name_1"]), record(["feature/name_2"])],
          {"feature/name_1": np.int64, "feature/name_2": np.float32})


def _entry(key: bytes, value: bytes) -> bytes:
    entry = b"\x0a" + bytes([len(key)]) + key + b"\x12" + bytes([len(value)]) + value
    return b"\x0a" + bytes([len(entry)]) + entry


def _record(*entries: bytes, extra: bytes = b"") -> bytes:
    features = b"".join(entries)
    return b"\x0a" + bytes([len(features)]) + features + extra


def test_key_twice_in_every_record() -> None:
    """A key appearing twice in each record (records alike): the last entry wins, as when
    protobuf parses a map."""
    first = bytes(feature(np.int64, [1, 2]).SerializeToString())
    second = bytes(feature(np.int64, [3]).SerializeToString())
    other = bytes(feature(bytes, [b"z"]).SerializeToString())
    record = _record(_entry(b"k", first), _entry(b"o", other), _entry(b"k", second))
    check([record] * 3, {"k": np.int64, "o": bytes})
    out = io.parse_example([record] * 3, {"k": io.FixedLenFeature([], np.int64)})
    assert out["k"].tolist() == [3, 3, 3]


def test_unpacked_lists_and_unknown_fields() -> None:
    """Int64List and FloatList written unpacked (one field per value), unknown fields in
    the Example and in a Feature, and packed and unpacked values mixed in one list."""
    unpacked_ints = b"\x1a\x06" + b"\x08\x05\x08\x06\x08\x7f"  # int64_list: 5, 6, 127
    unpacked_floats = b"\x12\x0a" + b"\x0d" + np.float32(1.5).tobytes() + b"\x0d" + \
        np.float32(-2).tobytes()
    mixed = b"\x1a\x06" + b"\x0a\x02\x01\x02" + b"\x08\x03"  # packed [1, 2] then 3
    unknown_in_feature = b"\x1a\x03\x0a\x01\x09" + b"\x28\x01"  # [9], then field 5 = 1
    records = [
        _record(_entry(b"i", unpacked_ints), _entry(b"f", unpacked_floats)),
        _record(_entry(b"i", mixed), _entry(b"f", unpacked_floats), extra=b"\x10\x07"),
        _record(_entry(b"i", unknown_in_feature), _entry(b"f", unpacked_floats)),
    ]
    check(records, {"i": np.int64, "f": np.float32})
    check(records[:1] * 4, {"i": np.int64, "f": np.float32})


def test_empty_records_and_empty_features() -> None:
    """Records with no features at all (alike, and mixed with others) take defaults."""
    empty = example({})
    out = io.parse_example([empty, b"", empty], {
        "a": io.FixedLenFeature([2], np.float32, default_value=[1, 2]),
        "b": io.VarLenFeature(bytes)})
    assert out["a"].tolist() == [[1, 2]] * 3
    assert out["b"].dense_shape.tolist() == [3, 0]
    check([empty, example({"a": feature(np.int64, [4])}), empty], {"a": np.int64})


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


@pytest.mark.parametrize("seed", range(3))
def test_one_value_per_list(seed: int) -> None:
    """Int64Lists of one value each (of every varint width, 1 to 10 bytes), read a word at a
    time, and FloatLists of one length, read as rows."""
    rng = np.random.default_rng(seed)
    # the largest and smallest value of each width (1 to 9 bytes), and negative ones (10)
    edges = [(1 << (7 * w)) - d for w in range(1, 10) for d in (1, (1 << (7 * w - 7)) - 1)]
    records = [example({"i": feature(np.int64, [int(rng.choice(edges + [-1, -5]))]),
                        "f": feature(np.float32, rng.standard_normal(3).tolist())})
               for _ in range(int(rng.integers(1, 30)))]
    check(records, {"i": np.int64, "f": np.float32})
    out = io.parse_example(records, {"i": io.FixedLenFeature([], np.int64),
                                     "f": io.FixedLenFeature([3], np.float32)})
    assert out["i"].tolist() == [expected_values(r, "i", np.int64)[0] for r in records]


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _packed_ints_record(payload: bytes) -> bytes:
    """An Example whose feature "i" is an Int64List of the packed varints ``payload``."""
    entry = _field(1, b"i") + _field(2, _field(3, _field(1, payload)))
    return _field(1, _field(1, entry))


def test_packed_varints_every_way() -> None:
    """Packed varints of every width, one or several per list (and empty lists), read as a
    plain decoder reads them; a varint cut short or longer than 10 bytes is an error."""
    from convoy.errors import DataLossError

    rng = np.random.default_rng(5)
    values = [0, 1, 127, 128, 2**56 - 1, 2**56, 2**63 - 1, -1, -(2**63), 300]
    for lists in ([[v] for v in values], [[v] for v in values] + [[], [1, 2, 3]],
                  [[int(v) for v in rng.choice(values, int(rng.integers(0, 4)))]
                   for _ in range(20)]):
        records = [_packed_ints_record(b"".join(_varint(v) for v in vs)) for vs in lists]
        got = io.parse_example(records, {"i": io.RaggedFeature(np.int64)})["i"]
        assert got.to_list() == lists
    for bad in (b"\x81", b"\x01\x80\x80", b"\xff" * 11):
        with pytest.raises(DataLossError, match="varint"):
            io.parse_example([_packed_ints_record(bad)], {"i": io.VarLenFeature(np.int64)})


def test_records_alike_but_for_a_key() -> None:
    """Records whose entries have the same layout but a different key at one position (a
    short key, checked within the entry's first 8 bytes; a long one, after them) are read
    as they are."""
    for first, second in (("ab", "cd"), ("key_abcd_1", "key_abcd_2"), ("abcdef", "abcdeg")):
        records = [example({first: feature(np.int64, [1]), "z": feature(bytes, [b"x"])}),
                   example({second: feature(np.int64, [2]), "z": feature(bytes, [b"y"])})]
        check(records, {first: np.int64, second: np.int64, "z": bytes})


def test_threads_split_a_batch_alike() -> None:
    """A batch split over threads parses to what one thread gives (the split falls inside
    runs of records of different layouts); the thread count is checked."""
    from convoy.errors import InvalidArgumentError

    rng = np.random.default_rng(11)
    records = [example({key: feature(dtype, random_values(rng, dtype, int(rng.integers(0, 5))))
                        for key, dtype in KEYS.items() if rng.random() < 0.7})
               for _ in range(300)]
    features = {key: io.VarLenFeature(dtype) for key, dtype in KEYS.items()}
    before = io.get_parse_threads()
    try:
        io.set_parse_threads(1)
        alone = io.parse_example(records, features)
        io.set_parse_threads(3)
        split = io.parse_example(records, features)
    finally:
        io.set_parse_threads(before)
    for key in KEYS:
        assert alone[key].indices.tolist() == split[key].indices.tolist()
        assert alone[key].values.tolist() == split[key].values.tolist()
    check(records, KEYS)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidArgumentError, match="threads must be an int >= 1"):
            io.set_parse_threads(bad)
