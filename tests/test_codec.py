"""Tests for convoy.codec: round trips, zero-copy decoding, compression, corruption."""

from __future__ import annotations

import collections
import math
import os
import pickle
import struct
import zlib
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from convoy.codec import Encoder, decode, validate_compression
from convoy.errors import DataLossError, InvalidArgumentError

COMPRESSIONS = [None, "AUTO", "LZ4"]
MIB = 1 << 20

Point = collections.namedtuple("Point", ["x", "y"])

# --- the wire format, pinned independently of the codec --------------------------------------

FIXED = struct.Struct("<3sBBIQQ")
ENTRY = struct.Struct("<BQQ")


def parse(payload: bytes) -> dict[str, Any]:
    """The header fields of a message, read by the documented layout."""
    magic, version, flags, count, inband_len, inband_raw = FIXED.unpack_from(payload)
    entries = [ENTRY.unpack_from(payload, FIXED.size + i * ENTRY.size) for i in range(count)]
    head_end = FIXED.size + count * ENTRY.size
    (crc,) = struct.unpack_from("<I", payload, head_end)
    inband_start = head_end + 4
    return {
        "magic": magic,
        "version": version,
        "flags": flags,
        "count": count,
        "inband_len": inband_len,
        "inband_raw": inband_raw,
        "entries": entries,
        "head_end": head_end,
        "crc": crc,
        "inband_start": inband_start,
        "inband_end": inband_start + inband_len,
    }


def build(fields: tuple[Any, ...], entries: list[tuple[int, int, int]], inband: bytes,
          rest: bytes = b"") -> bytes:
    """A message with a correct checksum over a (possibly lying) header."""
    head = FIXED.pack(*fields) + b"".join(ENTRY.pack(*e) for e in entries)
    return head + struct.pack("<I", zlib.crc32(inband, zlib.crc32(head))) + inband + rest


def reseal(payload: bytes, **changes: Any) -> bytes:
    """``payload`` with some fixed-header fields or entries replaced and the checksum redone."""
    info = parse(payload)
    fields = [b"CVC", info["version"], info["flags"], info["count"], info["inband_len"],
              info["inband_raw"]]
    for i, name in enumerate(["magic", "version", "flags", "count", "inband_len", "inband_raw"]):
        if name in changes:
            fields[i] = changes[name]
    entries = changes.get("entries", info["entries"])
    inband = payload[info["inband_start"]:info["inband_end"]]
    return build(tuple(fields), entries, inband, payload[info["inband_end"]:])


# --- exact comparison -----------------------------------------------------------------------


def assert_same(got: Any, want: Any, path: str = "elements") -> None:
    assert type(got) is type(want), f"{path}: {type(got)} != {type(want)}"
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype, path
        assert got.shape == want.shape, path
        assert got.tobytes() == want.tobytes(), path  # bit-exact, NaN payloads and -0.0 too
    elif isinstance(want, np.generic):
        assert got.dtype == want.dtype, path
        assert got.tobytes() == want.tobytes(), path
    elif isinstance(want, float):
        assert (math.isnan(got) and math.isnan(want)) or (
            got == want and math.copysign(1, got) == math.copysign(1, want)
        ), path
    elif isinstance(want, dict):
        assert list(got) == list(want), path
        for key in want:
            assert_same(got[key], want[key], f"{path}[{key!r}]")
    elif isinstance(want, list | tuple):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{path}[{i}]")
    else:
        assert got == want, path


# --- strategies -----------------------------------------------------------------------------

DTYPES = ["uint8", "int8", "int16", "uint32", "int64", "float16", "float32", "float64",
          "complex64", "bool"]


@st.composite
def big_arrays(draw: st.DrawFn) -> np.ndarray:
    """Arrays from empty to ~200 KB, random or compressible, contiguous or strided views."""
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    cols = draw(st.sampled_from([1, 3, 8, 64]))
    rows = draw(st.integers(0, 200_000 // (cols * dtype.itemsize) + 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    content = draw(st.sampled_from(["random", "zeros", "rows"]))
    if dtype == np.bool_:
        data = rng.integers(0, 2, rows * cols).astype(bool)
    elif content == "random":
        data = rng.integers(0, 256, rows * cols * dtype.itemsize, dtype=np.uint8).view(dtype)
    elif content == "zeros":
        data = np.zeros(rows * cols, dtype)
    else:
        data = np.tile(np.arange(cols).astype(dtype), rows)
    array = data.reshape(draw(st.sampled_from([(rows * cols,), (rows, cols), (rows, 1, cols)])))
    view = draw(st.sampled_from(["whole", "step", "transpose", "reverse"]))
    if view == "step":
        array = array[::2]
    elif view == "transpose":
        array = array.T
    elif view == "reverse":
        array = array[::-1]
    return array


small_arrays = hnp.arrays(
    dtype=st.sampled_from(["int32", "float64", "float32", "uint8", "<U3", "S2", "bool"]),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
)

numpy_scalars = st.one_of(
    st.floats(width=32).map(np.float32),
    st.floats().map(np.float64),
    st.integers(-(2**63), 2**63 - 1).map(np.int64),
    st.integers(0, 255).map(np.uint8),
    st.booleans().map(np.bool_),
)

leaves = st.one_of(
    st.integers(),
    st.floats(),
    st.booleans(),
    st.none(),
    st.binary(max_size=2000),
    st.text(max_size=20),
    numpy_scalars,
    small_arrays,
    big_arrays(),
)

structures = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children, children),
        st.dictionaries(st.text(max_size=5), children, max_size=4),
        st.builds(Point, children, children),
    ),
    max_leaves=10,
)

element_lists = st.lists(structures, max_size=6)


# --- round trips ----------------------------------------------------------------------------


@pytest.mark.parametrize("compression", COMPRESSIONS)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(elements=element_lists)
def test_round_trip(compression: str | None, elements: list[Any]) -> None:
    payload = Encoder(compression).encode(elements)
    assert type(payload) is bytes
    assert_same(decode(payload), elements)
    assert_same(decode(memoryview(payload)), elements)
    assert_same(decode(bytearray(payload)), elements)


@pytest.mark.parametrize("compression", COMPRESSIONS)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=st.lists(element_lists, min_size=1, max_size=8))
def test_one_encoder_many_messages(compression: str | None, batches: list[list[Any]]) -> None:
    encoder = Encoder(compression)
    payloads = [encoder.encode(batch) for batch in batches]
    for payload, batch in zip(payloads, batches, strict=True):
        assert_same(decode(payload), batch)


@pytest.mark.parametrize("compression", COMPRESSIONS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrays=st.lists(big_arrays(), min_size=1, max_size=4))
def test_round_trip_large_arrays(compression: str | None, arrays: list[np.ndarray]) -> None:
    elements = [tuple(arrays), {"first": arrays[0]}]
    assert_same(decode(Encoder(compression).encode(elements)), elements)


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_empty_list_and_tuple(compression: str | None) -> None:
    encoder = Encoder(compression)
    assert decode(encoder.encode([])) == []
    assert_same(decode(encoder.encode((1, (2, 3)))), [1, (2, 3)])


def test_decodes_a_slice_of_a_larger_buffer() -> None:
    elements = [np.arange(100_000, dtype=np.int32), {"a": b"xyz"}]
    payload = Encoder(None).encode(elements)
    framed = bytearray(b"\x01" * 7 + payload + b"\x02" * 5)
    assert_same(decode(memoryview(framed)[7:-5]), elements)


def test_multi_byte_memoryview_payload() -> None:
    elements = [np.arange(1000.0)]
    payload = Encoder(None).encode(elements)
    pad = -len(payload) % 4
    view = memoryview(payload + b"\0" * pad).cast("I")
    if pad:  # the trailing padding is not part of the message
        with pytest.raises(DataLossError):
            decode(view)
    else:
        assert_same(decode(view), elements)
    assert_same(decode(memoryview(payload + b"\0" * pad)[: len(payload)]), elements)


# --- zero copy ------------------------------------------------------------------------------


@pytest.mark.parametrize("wrap", [bytes, memoryview])
def test_large_arrays_are_read_only_views_of_the_payload(wrap: Any) -> None:
    rng = np.random.default_rng(0)
    image = rng.random((1024, 1024), dtype=np.float32)
    fortran = np.asfortranarray(rng.integers(0, 1000, (300, 200)))
    payload = Encoder(None).encode([{"image": image, "label": 3}, fortran])
    message = wrap(payload)
    [got, got_fortran] = decode(message)
    whole = np.frombuffer(payload, np.uint8)
    for array, want in ((got["image"], image), (got_fortran, fortran)):
        assert_same(array, want)
        assert np.shares_memory(array, whole)
        assert array.flags.writeable is False
        assert array.flags.aligned
        assert (array.ctypes.data - whole.ctypes.data) % 64 == 0
        base = array
        while isinstance(base, np.ndarray):
            base = base.base
        assert isinstance(base, memoryview)
        assert base.obj is payload
    assert got_fortran.flags.f_contiguous
    assert got["label"] == 3


def test_small_arrays_stay_in_band() -> None:
    small = np.arange(10, dtype=np.int64)
    payload = Encoder(None).encode([small, np.arange(1000, dtype=np.uint8)])
    assert parse(payload)["count"] == 0
    got = decode(payload)
    assert_same(got[0], small)


@pytest.mark.parametrize("array", [
    np.arange(10), np.arange(1000, dtype=np.float32).reshape(10, 100), np.zeros((), np.float32),
    np.zeros((3, 0)), np.array([1, 2], dtype=">i4"), np.array([1 + 2j]), np.array([True]),
    np.arange(6).reshape(2, 3).T, np.array(["ab", "c"]), np.array([b"x", b"yy"], dtype=object),
    np.array(["2020-01-01"], dtype="M8[D]"), np.zeros(2, dtype=[("a", "i4"), ("b", "f8")]),
    np.ma.masked_array([1, 2], [0, 1]), np.float32(3),
], ids=lambda array: f"{type(array).__name__}-{array.dtype}-{array.shape}")
def test_every_kind_of_array_keeps_its_type_dtype_shape_and_values(array: Any) -> None:
    # plain numbers travel as buffer, dtype string and shape; the rest as numpy pickles them
    [got] = decode(Encoder(None).encode([array]))
    assert type(got) is type(array) and got.dtype == array.dtype and got.shape == array.shape
    np.testing.assert_array_equal(np.asarray(got), np.asarray(array))
    if isinstance(array, np.ndarray) and array.nbytes < 1024:
        assert got.flags.writeable  # an ordinary copy, in band


def test_writable_payload_gives_writable_views() -> None:
    payload = bytearray(Encoder(None).encode([np.zeros(4096, np.uint8)]))
    [array] = decode(payload)
    assert array.flags.writeable
    assert np.shares_memory(array, np.frombuffer(payload, np.uint8))


# --- compression ----------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["AUTO", "LZ4"])
def test_compresses_zeros(compression: str) -> None:
    zeros = np.zeros(MIB, np.float32)  # 4 MiB
    payload = Encoder(compression).encode([zeros])
    assert len(payload) < zeros.nbytes // 20
    [got] = decode(payload)
    assert_same(got, zeros)
    assert got.flags.writeable is False


def test_none_never_compresses() -> None:
    zeros = np.zeros(MIB, np.float32)
    payload = Encoder(None).encode([zeros, zeros[::2]])  # out of band and in band
    assert len(payload) >= zeros.nbytes * 3 // 2
    info = parse(payload)
    assert info["flags"] == 0
    assert all(flags == 0 for flags, _, _ in info["entries"])


def test_auto_does_not_compress_random_data() -> None:
    noise = np.frombuffer(os.urandom(4 * MIB), np.uint8)
    payload = Encoder("AUTO").encode([noise])
    assert len(payload) >= noise.nbytes
    [got] = decode(payload)
    assert_same(got, noise)
    assert np.shares_memory(got, np.frombuffer(payload, np.uint8))


def test_lz4_keeps_incompressible_buffers_raw() -> None:
    noise = np.frombuffer(os.urandom(4 * MIB), np.uint8)
    payload = Encoder("LZ4").encode([noise])
    assert noise.nbytes <= len(payload) < noise.nbytes + 1024
    [got] = decode(payload)
    assert np.shares_memory(got, np.frombuffer(payload, np.uint8))


def test_auto_backs_off_after_incompressible_data_then_samples_again() -> None:
    encoder = Encoder("AUTO")
    noise = np.frombuffer(os.urandom(MIB), np.uint8)
    zeros = np.zeros(MIB, np.uint8)
    assert len(encoder.encode([noise])) >= MIB
    small = encoder.encode([np.zeros(100)])  # nothing large: does not count
    assert_same(decode(small), [np.zeros(100)])
    sizes = [len(encoder.encode([zeros])) for _ in range(65)]
    assert all(size >= MIB for size in sizes[:64])
    assert sizes[64] < MIB // 20
    assert len(encoder.encode([zeros])) < MIB // 20  # keeps compressing what pays


def test_auto_mixes_compressed_and_raw_buffers() -> None:
    zeros = np.zeros((512, 1024), np.float32)  # 2 MiB
    noise = np.frombuffer(os.urandom(2 * MIB), np.uint8).reshape(2048, 1024)
    elements = [(zeros, noise, "label", np.arange(3)), {"rows": np.tile(np.arange(256.0), 512)}]
    payload = Encoder("AUTO").encode(elements)
    assert noise.nbytes <= len(payload) < noise.nbytes + 64 * 1024
    flags = [f for f, _, _ in parse(payload)["entries"]]
    assert sorted(flags) == [0, 1, 1]
    got = decode(payload)
    assert_same(got, elements)
    whole = np.frombuffer(payload, np.uint8)
    assert np.shares_memory(got[0][1], whole)
    assert not np.shares_memory(got[0][0], whole)


@pytest.mark.parametrize("compression", ["AUTO", "LZ4"])
def test_compresses_large_in_band_part(compression: str) -> None:
    strided = np.zeros((1024, 512), np.float64)[::2]  # not contiguous: pickled in band
    elements = [strided, b"\0" * 200_000]
    payload = Encoder(compression).encode(elements)
    info = parse(payload)
    assert info["flags"] == 1
    assert info["count"] == 0
    assert len(payload) < 100_000
    assert_same(decode(payload), elements)


# --- malformed messages ---------------------------------------------------------------------


def sample_payloads() -> dict[str, bytes]:
    rng = np.random.default_rng(7)
    elements = [
        {"image": rng.integers(0, 256, (256, 256), dtype=np.uint8), "mask": np.zeros(70_000)},
        Point(np.arange(300, dtype=np.int16), "text"),
        (1, 2.5, b"bytes", np.float32(1.5)),
    ]
    return {str(c): Encoder(c).encode(elements) for c in COMPRESSIONS}


PAYLOADS = sample_payloads()


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_truncation_is_data_loss(name: str) -> None:
    payload = PAYLOADS[name]
    info = parse(payload)
    cuts = set(range(min(len(payload), 4096)))
    cuts.update(range(0, len(payload), 997))
    position = info["inband_end"]
    for _, stored, _ in info["entries"]:
        position += -position % 64
        cuts.update(range(max(position - 3, 0), position + 4))
        position += stored
    cuts.update(range(len(payload) - 70, len(payload)))
    for cut in sorted(cuts):
        if cut < len(payload):
            with pytest.raises(DataLossError):
                decode(payload[:cut])
    for extra in (b"\0", b"\0" * 64, b"x" * 1000):
        with pytest.raises(DataLossError):
            decode(payload + extra)


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_every_flip_in_header_and_pickle_stream_is_data_loss(name: str) -> None:
    payload = PAYLOADS[name]
    end = parse(payload)["inband_end"]
    corrupt = bytearray(payload)
    for position in range(end):
        for mask in (0x01, 0x80, 0xFF):
            corrupt[position] ^= mask
            with pytest.raises(DataLossError):
                decode(bytes(corrupt))
            corrupt[position] ^= mask


@pytest.mark.parametrize("name", sorted(PAYLOADS))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_flip_is_data_loss_or_decodes(name: str, data: st.DataObject) -> None:
    payload = bytearray(PAYLOADS[name])
    for _ in range(data.draw(st.integers(1, 3))):
        position = data.draw(st.integers(0, len(payload) - 1))
        payload[position] ^= data.draw(st.integers(1, 255))
    try:
        result = decode(bytes(payload))
    except DataLossError:
        return
    assert type(result) is list


@settings(max_examples=300, deadline=None)
@given(garbage=st.binary(max_size=300))
def test_garbage_is_data_loss(garbage: bytes) -> None:
    with pytest.raises(DataLossError):
        decode(garbage)


@pytest.mark.parametrize("prefix", [b"", b"CV", b"CVC", b"CVC\x01", b"XYZ" + bytes(40)])
def test_short_or_foreign_prefix_is_data_loss(prefix: bytes) -> None:
    with pytest.raises(DataLossError):
        decode(prefix)


def lz4_payload() -> bytes:
    payload = Encoder("LZ4").encode([np.zeros(100_000), np.arange(50_000, dtype=np.int64)])
    assert [f for f, _, _ in parse(payload)["entries"]] == [1, 1]
    return payload


def test_lying_buffer_count_with_valid_checksum() -> None:
    payload = Encoder(None).encode([np.zeros(10_000)])
    for count in (2, 1000, 2**32 - 1):
        with pytest.raises(DataLossError):
            decode(reseal(payload, count=count))


def test_lying_lengths_with_valid_checksum() -> None:
    payload = Encoder(None).encode([np.zeros(10_000), np.ones(10_000)])
    (f0, s0, r0), (f1, s1, r1) = parse(payload)["entries"]
    lies = [
        [(f0, 2**63, 2**63), (f1, s1, r1)],
        [(f0, s0 + 1, r0 + 1), (f1, s1, r1)],
        [(f0, s0 - 8, r0 - 8), (f1, s1, r1)],
        [(f0, s0, r0 + 1), (f1, s1, r1)],
        [(2, s0, r0), (f1, s1, r1)],
        [(f0, s0, r0), (f1, 2**64 - 1, 2**64 - 1)],
    ]
    for entries in lies:
        with pytest.raises(DataLossError):
            decode(reseal(payload, entries=entries))
    with pytest.raises(DataLossError):
        decode(reseal(payload, inband_len=2**64 - 1))
    with pytest.raises(DataLossError):
        decode(reseal(payload, inband_raw=parse(payload)["inband_raw"] + 1))


def test_lying_decompressed_sizes_allocate_nothing_absurd() -> None:
    payload = lz4_payload()
    entries = parse(payload)["entries"]
    (f0, s0, r0), second = entries
    for raw in (2**62, 2**40, 257 * s0 + 4096, r0 + 1, r0 - 1, 0):
        with pytest.raises(DataLossError):
            decode(reseal(payload, entries=[(f0, s0, raw), second]))
    with pytest.raises(DataLossError):  # marked compressed but is not an LZ4 frame
        raw_payload = Encoder(None).encode([np.zeros(100_000)])
        [(_, stored, raw)] = parse(raw_payload)["entries"]
        decode(reseal(raw_payload, entries=[(1, stored, raw)]))


def test_corrupt_lz4_frame_is_data_loss_or_decodes() -> None:
    payload = lz4_payload()
    info = parse(payload)
    start = info["inband_end"] + (-info["inband_end"] % 64)
    for offset in range(0, 40):  # frame header and first block header of the first buffer
        corrupt = bytearray(payload)
        corrupt[start + offset] ^= 0xFF
        try:
            decode(bytes(corrupt))
        except DataLossError:
            continue


def test_unknown_version_and_flags() -> None:
    payload = Encoder(None).encode([1, 2, 3])
    with pytest.raises(DataLossError, match="version 2"):
        decode(reseal(payload, version=2))
    with pytest.raises(DataLossError, match="flags"):
        decode(reseal(payload, flags=0x02))
    with pytest.raises(DataLossError):
        decode(reseal(payload, magic=b"XYZ"))


def test_valid_checksum_over_bad_pickle_is_data_loss() -> None:
    fields = (b"CVC", 1, 0)
    for inband in (b"", b"\x80\x05garbage", pickle.dumps({"not": "a list"}, protocol=5),
                   b"\x80\x05\x8e" + struct.pack("<Q", 2**40)):  # BINBYTES8 of a lying size
        with pytest.raises(DataLossError):
            decode(build(fields + (0, len(inband), len(inband)), [], inband))
    # a stream that wants an out-of-band buffer the header does not carry
    payload = Encoder(None).encode([np.zeros(10_000)])
    info = parse(payload)
    inband = payload[info["inband_start"]:info["inband_end"]]
    with pytest.raises(DataLossError, match="unpickled"):
        decode(build(fields + (0, len(inband), len(inband)), [], inband))


def test_truncated_message_says_so() -> None:
    payload = PAYLOADS["None"]
    with pytest.raises(DataLossError, match="truncated"):
        decode(payload[:-1])
    with pytest.raises(DataLossError, match="truncated"):
        decode(payload[:10])


# --- arguments ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "want"),
    [(None, None), ("AUTO", "AUTO"), ("auto", "AUTO"), ("Auto", "AUTO"), ("LZ4", "LZ4"),
     ("lz4", "LZ4")],
)
def test_validate_compression_canonical(value: str | None, want: str | None) -> None:
    assert validate_compression(value) == want
    assert Encoder(value).compression == want


@pytest.mark.parametrize("value", ["zstd", "", "GZIP", "lz4 ", b"LZ4", 1, True, ["LZ4"]])
def test_validate_compression_rejects(value: Any) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        validate_compression(value)
    message = str(info.value)
    assert "compression" in message
    assert "AUTO" in message and "LZ4" in message and "None" in message
    assert repr(value) in message
    with pytest.raises(InvalidArgumentError):
        Encoder(value)


def test_default_compression_is_auto() -> None:
    assert Encoder().compression == "AUTO"


@pytest.mark.parametrize("elements", ["abc", np.arange(3), {"a": 1}, None, 5])
def test_encode_rejects_non_lists(elements: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="list"):
        Encoder().encode(elements)


def test_encode_rejects_unpicklable_elements() -> None:
    with pytest.raises(InvalidArgumentError, match="picklable"):
        Encoder().encode([lambda: 0])


@pytest.mark.parametrize("payload", ["text", 12, None, [1, 2]])
def test_decode_rejects_non_bytes(payload: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="bytes-like"):
        decode(payload)
