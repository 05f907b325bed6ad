"""tfrecord.find_record: where the next whole, valid record of a damaged file begins."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convoy.data.tfrecord import TFRecordWriter, find_record, read_records


def framed(tmp_path: Path, records: list[bytes]) -> tuple[bytes, list[int]]:
    """The bytes of a file of ``records`` and the offset where each begins."""
    path = tmp_path / "records"
    with TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    ends = [end for _, end in read_records(path)]
    return path.read_bytes(), [0, *ends[:-1]]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=8))
def test_it_finds_the_first_record_at_or_after_an_offset(
        tmp_path_factory: pytest.TempPathFactory, records: list[bytes]) -> None:
    data, starts = framed(tmp_path_factory.mktemp("find"), records)
    for offset in range(len(data) + 1):
        assert find_record(data, offset) == next((s for s in starts if s >= offset), -1)


def test_it_looks_past_damage_and_zeros(tmp_path: Path) -> None:
    data, starts = framed(tmp_path, [b"first", b"second record", b"third"])
    damaged = bytearray(data)
    damaged[starts[1] + 14] ^= 0xFF  # the second record's data
    assert find_record(bytes(damaged), starts[1] + 1) == starts[2]
    for zeros in (1, 11, 12, 13, 4096):
        padded = data[:starts[2]] + bytes(zeros) + data[starts[2]:]
        assert find_record(padded, starts[1] + 1) == starts[2] + zeros
    assert find_record(data[:starts[2]] + bytes(1 << 20), starts[1] + 1) == -1
    assert find_record(data[:-1], starts[2]) == -1  # a torn last record is no record
    assert find_record(b"", 0) == -1
