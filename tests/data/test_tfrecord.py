"""Tests for convoy.data.tfrecord: the TFRecord format, pinned independently of the writer."""

from __future__ import annotations

import array
import gzip
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convoy.data.tfrecord import TFRecordWriter, masked_crc32c, read_records
from convoy.errors import (
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)

COMPRESSION_TYPES = [None, "", "GZIP", "ZLIB"]

# --- a reference CRC32C (Castagnoli, reflected polynomial 0x82F63B78), table driven ---------

_POLY = 0x82F63B78


def _make_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _POLY if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _make_table()


def ref_crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def ref_masked(data: bytes) -> int:
    crc = ref_crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) % 2**32


def ref_record(data: bytes) -> bytes:
    """One record, assembled by hand from the format description."""
    length = struct.pack("<Q", len(data))
    return (
        length + struct.pack("<I", ref_masked(length)) + data + struct.pack("<I", ref_masked(data))
    )


def ref_file(records: list[bytes]) -> bytes:
    return b"".join(ref_record(r) for r in records)


def compress(raw: bytes, compression_type: str | None) -> bytes:
    if compression_type == "GZIP":
        return gzip.compress(raw)
    if compression_type == "ZLIB":
        return zlib.compress(raw)
    return raw


def write_all(path: Path, records: list[bytes], compression_type: str | None) -> None:
    with TFRecordWriter(path, compression_type) as writer:
        for record in records:
            writer.write(record)


SAMPLE = [b"", b"a", b"hello world", bytes(range(256)), b"\x00" * 40]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory hypothesis examples may reuse (function-scoped tmp_path may not be)."""
    return tmp_path_factory.mktemp("tfrecord")


# --- CRC ------------------------------------------------------------------------------------


def test_reference_crc_check_value() -> None:
    assert ref_crc32c(b"123456789") == 0xE3069283
    assert masked_crc32c(b"123456789") == ref_masked(b"123456789")


def test_masked_crc_of_empty() -> None:
    assert masked_crc32c(b"") == ref_masked(b"") == 0xA282EAD8


@given(st.binary(max_size=300))
def test_masked_crc_matches_reference(data: bytes) -> None:
    assert masked_crc32c(data) == ref_masked(data)


# --- the format, pinned by hand-built files --------------------------------------------------


@pytest.mark.parametrize("compression_type", COMPRESSION_TYPES)
def test_reads_hand_built_file(tmp_path: Path, compression_type: str | None) -> None:
    path = tmp_path / "hand.tfrecord"
    path.write_bytes(compress(ref_file(SAMPLE), compression_type))
    got = list(read_records(path, compression_type))
    assert [r for r, _ in got] == SAMPLE
    ends, end = [], 0
    for r in SAMPLE:
        end += 16 + len(r)
        ends.append(end)
    assert [o for _, o in got] == ends


def test_writer_output_is_byte_exact(tmp_path: Path) -> None:
    path = tmp_path / "w.tfrecord"
    write_all(path, SAMPLE, None)
    assert path.read_bytes() == ref_file(SAMPLE)


@pytest.mark.parametrize("compression_type", ["GZIP", "ZLIB"])
def test_compressed_writer_output_decompresses_to_format(
    tmp_path: Path, compression_type: str
) -> None:
    path = tmp_path / "w.tfrecord"
    write_all(path, SAMPLE, compression_type)
    blob = path.read_bytes()
    raw = gzip.decompress(blob) if compression_type == "GZIP" else zlib.decompress(blob)
    assert raw == ref_file(SAMPLE)
    if compression_type == "GZIP":
        assert blob[:2] == b"\x1f\x8b"


def test_reads_multi_member_gzip(tmp_path: Path) -> None:
    path = tmp_path / "multi.tfrecord.gz"
    path.write_bytes(gzip.compress(ref_file(SAMPLE[:2])) + gzip.compress(ref_file(SAMPLE[2:])))
    assert [r for r, _ in read_records(path, "GZIP")] == SAMPLE


# --- round trips and resuming ----------------------------------------------------------------

record_lists = st.lists(st.binary(max_size=64), max_size=8)


@settings(max_examples=40, deadline=None)
@given(records=record_lists, compression_type=st.sampled_from(COMPRESSION_TYPES))
def test_round_trip_and_resume(
    scratch: Path, records: list[bytes], compression_type: str | None
) -> None:
    path = scratch / "round_trip.tfrecord"
    write_all(path, records, compression_type)
    got = list(read_records(path, compression_type))
    assert [r for r, _ in got] == records
    offsets = [0] + [o for _, o in got]
    assert offsets[-1] == len(ref_file(records))
    for i, offset in enumerate(offsets):
        assert [r for r, _ in read_records(path, compression_type, offset)] == records[i:]
        assert [o for _, o in read_records(path, compression_type, offset)] == offsets[i + 1 :]


@pytest.mark.parametrize("compression_type", COMPRESSION_TYPES)
def test_records_across_chunk_boundaries(tmp_path: Path, compression_type: str | None,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Records are cut from chunks: ones straddling a chunk's end, longer than a chunk, and
    empty all read back, with offsets that resume at the next record."""
    from convoy.data import tfrecord

    monkeypatch.setattr(tfrecord, "_CHUNK_SIZE", 23)
    records = [bytes([i]) * size for i, size in enumerate([0, 5, 7, 40, 0, 1, 100, 3, 22, 6])]
    path = tmp_path / "chunks.tfrecord"
    with TFRecordWriter(path, compression_type) as writer:
        for record in records:
            writer.write(record)
    got = list(read_records(path, compression_type))
    assert [r for r, _ in got] == records
    for index, (_, offset) in enumerate(got):
        assert [r for r, _ in read_records(path, compression_type, offset)] == \
            records[index + 1:]


@pytest.mark.parametrize("compression_type", COMPRESSION_TYPES)
def test_empty_file_yields_nothing(tmp_path: Path, compression_type: str | None) -> None:
    path = tmp_path / "empty.tfrecord"
    path.write_bytes(b"")
    assert list(read_records(path, compression_type)) == []
    assert list(read_records(path, compression_type, 0)) == []


@pytest.mark.parametrize("compression_type", COMPRESSION_TYPES)
def test_writer_with_no_records(tmp_path: Path, compression_type: str | None) -> None:
    path = tmp_path / "none.tfrecord"
    TFRecordWriter(str(path), compression_type).close()
    assert list(read_records(str(path), compression_type)) == []


def test_write_accepts_bytes_like(tmp_path: Path) -> None:
    path = tmp_path / "like.tfrecord"
    ints = array.array("i", [1, 2, 3])
    with TFRecordWriter(path) as writer:
        writer.write(bytearray(b"ba"))
        writer.write(memoryview(b"xmvx")[1:3])
        writer.write(memoryview(ints))
    assert [r for r, _ in read_records(path)] == [b"ba", b"mv", ints.tobytes()]


def test_flush_makes_records_readable(tmp_path: Path) -> None:
    path = tmp_path / "flush.tfrecord"
    with TFRecordWriter(path) as writer:
        writer.write(b"one")
        writer.flush()
        assert [r for r, _ in read_records(path)] == [b"one"]


def test_flush_compressed_makes_records_readable(tmp_path: Path) -> None:
    path = tmp_path / "flush.tfrecord.gz"
    with TFRecordWriter(path, "GZIP") as writer:
        writer.write(b"one")
        writer.flush()
        got = []
        with pytest.raises(DataLossError, match="ends early"):
            for record, _ in read_records(path, "GZIP"):
                got.append(record)
        assert got == [b"one"]
    assert [r for r, _ in read_records(path, "GZIP")] == [b"one"]


# --- corruption ------------------------------------------------------------------------------


def _record_starts(records: list[bytes]) -> list[int]:
    starts, pos = [], 0
    for r in records:
        starts.append(pos)
        pos += 16 + len(r)
    return starts


def test_any_single_byte_flip_is_data_loss(tmp_path: Path) -> None:
    records = [b"", b"ab", b"hello world"]
    good = ref_file(records)
    starts = _record_starts(records)
    path = tmp_path / "flip.tfrecord"
    for i in range(len(good)):
        start = max(s for s in starts if s <= i)
        for mask in (0x01, 0x80, 0xFF):
            bad = bytearray(good)
            bad[i] ^= mask
            path.write_bytes(bytes(bad))
            with pytest.raises(DataLossError) as info:
                list(read_records(path))
            assert str(path) in str(info.value)
            assert f"offset {start} " in str(info.value)


def test_flip_messages_name_the_check(tmp_path: Path) -> None:
    good = ref_file([b"abc"])
    path = tmp_path / "x.tfrecord"
    for index, reason in [(0, "length CRC"), (9, "length CRC"), (12, "data CRC"), (16, "data CRC")]:
        bad = bytearray(good)
        bad[index] ^= 0x10
        path.write_bytes(bytes(bad))
        with pytest.raises(DataLossError, match=reason):
            list(read_records(path))


def test_truncation_inside_last_record(tmp_path: Path) -> None:
    records = [b"first", b"", b"the last record"]
    good = ref_file(records)
    last = _record_starts(records)[-1]
    path = tmp_path / "cut.tfrecord"
    for cut in range(last + 1, len(good)):
        path.write_bytes(good[:cut])
        got = []
        with pytest.raises(DataLossError) as info:
            for record, _ in read_records(path):
                got.append(record)
        assert got == records[:-1]
        message = str(info.value)
        assert f"offset {last} " in message and str(path) in message
        assert "truncated" in message


def test_truncation_at_record_boundaries_is_clean(tmp_path: Path) -> None:
    records = [b"first", b"", b"third"]
    good = ref_file(records)
    path = tmp_path / "cut.tfrecord"
    for i, start in enumerate(_record_starts(records)):
        path.write_bytes(good[:start])
        assert [r for r, _ in read_records(path)] == records[:i]


@pytest.mark.parametrize("compression_type", ["GZIP", "ZLIB"])
def test_truncated_compressed_stream_is_data_loss(tmp_path: Path, compression_type: str) -> None:
    blob = compress(ref_file(SAMPLE), compression_type)
    path = tmp_path / "cut.tfrecord.z"
    for cut in range(1, len(blob)):
        path.write_bytes(blob[:cut])
        with pytest.raises(DataLossError, match="offset"):
            list(read_records(path, compression_type))


@pytest.mark.parametrize("compression_type", ["GZIP", "ZLIB"])
def test_corrupt_compressed_stream_is_data_loss(tmp_path: Path, compression_type: str) -> None:
    blob = bytearray(compress(ref_file(SAMPLE), compression_type))
    blob[len(blob) // 2] ^= 0xFF
    path = tmp_path / "bad.tfrecord.z"
    path.write_bytes(bytes(blob))
    with pytest.raises(DataLossError) as info:
        list(read_records(path, compression_type))
    assert str(path) in str(info.value)


def test_wrong_compression_type_is_data_loss(tmp_path: Path) -> None:
    path = tmp_path / "plain.tfrecord"
    path.write_bytes(ref_file(SAMPLE))
    for compression_type in ("GZIP", "ZLIB"):
        with pytest.raises(DataLossError):
            list(read_records(path, compression_type))


def test_trailing_data_after_zlib_stream(tmp_path: Path) -> None:
    path = tmp_path / "trail.tfrecord.z"
    path.write_bytes(zlib.compress(ref_file(SAMPLE)) + b"junk")
    with pytest.raises(DataLossError, match="after the end"):
        list(read_records(path, "ZLIB"))


def test_huge_length_with_valid_crc_is_truncation(tmp_path: Path) -> None:
    length = struct.pack("<Q", 2**62)
    path = tmp_path / "huge.tfrecord"
    path.write_bytes(length + struct.pack("<I", ref_masked(length)) + b"some data")
    with pytest.raises(DataLossError, match="offset 0 .*truncated"):
        list(read_records(path))


def test_resume_mid_record_is_data_loss(tmp_path: Path) -> None:
    path = tmp_path / "mid.tfrecord"
    path.write_bytes(ref_file([b"0123456789abcdef", b"x"]))
    with pytest.raises(DataLossError, match="offset 3 "):
        list(read_records(path, None, 3))


# --- bad arguments and missing files ---------------------------------------------------------


def test_unknown_compression_type(tmp_path: Path) -> None:
    path = tmp_path / "f.tfrecord"
    path.write_bytes(b"")
    for bad in ("gzip", "BZIP2", 3):
        with pytest.raises(InvalidArgumentError, match="compression_type") as info:
            read_records(path, bad)  # type: ignore[arg-type]
        assert repr(bad) in str(info.value)
        with pytest.raises(InvalidArgumentError, match="options"):
            TFRecordWriter(tmp_path / "w.tfrecord", bad)  # type: ignore[arg-type]


def test_write_rejects_non_bytes(tmp_path: Path) -> None:
    with TFRecordWriter(tmp_path / "w.tfrecord") as writer:
        for bad, name in (("text", "str"), (5, "int"), (None, "NoneType"), ([1, 2], "list")):
            with pytest.raises(InvalidArgumentError, match=f"record: expected .*got {name}"):
                writer.write(bad)  # type: ignore[arg-type]
        writer.write(b"ok")
    assert [r for r, _ in read_records(tmp_path / "w.tfrecord")] == [b"ok"]


def test_bad_offsets(tmp_path: Path) -> None:
    path = tmp_path / "f.tfrecord"
    path.write_bytes(ref_file([b"abc"]))
    with pytest.raises(InvalidArgumentError, match="offset: .*non-negative.*got -1"):
        read_records(path, None, -1)
    with pytest.raises(InvalidArgumentError, match="offset: .*int.*got str"):
        read_records(path, None, "3")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="offset: .*got 20"):
        read_records(path, None, 20)
    assert list(read_records(path, None, 19)) == []


@pytest.mark.parametrize("compression_type", ["GZIP", "ZLIB"])
def test_compressed_offset_past_end(tmp_path: Path, compression_type: str) -> None:
    path = tmp_path / "f.tfrecord.z"
    write_all(path, [b"abc"], compression_type)
    assert list(read_records(path, compression_type, 19)) == []
    with pytest.raises(InvalidArgumentError, match="offset: .*got 20"):
        list(read_records(path, compression_type, 20))


def test_bad_path_type() -> None:
    with pytest.raises(InvalidArgumentError, match="path"):
        read_records(3)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="path"):
        TFRecordWriter(None)  # type: ignore[arg-type]


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.tfrecord"
    with pytest.raises(NotFoundError, match="nope.tfrecord"):
        read_records(path)
    with pytest.raises(NotFoundError, match="missing_dir"):
        TFRecordWriter(tmp_path / "missing_dir" / "x.tfrecord")


@pytest.mark.parametrize("compression_type", COMPRESSION_TYPES)
def test_write_after_close(tmp_path: Path, compression_type: str | None) -> None:
    writer = TFRecordWriter(tmp_path / "w.tfrecord", compression_type)
    writer.write(b"a")
    writer.close()
    writer.close()
    with pytest.raises(FailedPreconditionError, match="closed"):
        writer.write(b"b")
    with pytest.raises(FailedPreconditionError, match="closed"):
        writer.flush()
    assert [r for r, _ in read_records(tmp_path / "w.tfrecord", compression_type)] == [b"a"]


@pytest.mark.parametrize("size", [1, 3, 8, 40])
@pytest.mark.parametrize("drop_remainder", [False, True])
def test_dataset_batches_are_the_records_in_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int,
        drop_remainder: bool) -> None:
    """TFRecordDataset(files).batch(n) (cut from runs of records) holds the records in
    order, across chunk and file boundaries, as batching them one by one does."""
    from convoy.data import TFRecordDataset, tfrecord

    monkeypatch.setattr(tfrecord, "_CHUNK_SIZE", 50)
    files, records = [], []
    for index, count in enumerate([5, 0, 12, 1]):
        path = tmp_path / f"part-{index}.tfrecord"
        written = [b"%d:%d" % (index, j) * (j % 4) for j in range(count)]
        write_all(path, written, None)
        files.append(str(path))
        records += written
    got = [batch.tolist() for batch in TFRecordDataset(files).batch(size, drop_remainder)]
    one_by_one = [batch.tolist() for batch in TFRecordDataset(files).map(lambda r: r).batch(
        size, drop_remainder)]
    assert got == one_by_one
    whole = len(records) // size * size
    assert sum(got, []) == (records[:whole] if drop_remainder else records)
    batches = TFRecordDataset(files).batch(size, drop_remainder)
    assert all(batch.dtype == object for batch in batches)
