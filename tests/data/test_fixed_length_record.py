"""FixedLengthRecordDataset: scenarios ported from TensorFlow's
tensorflow/python/data/kernel_tests/fixed_length_record_dataset_test.py (files of records
between a header and a footer, uncompressed, GZIP and ZLIB, several files, a wrong body
length), plus a checkpoint and an object-store URL."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import pytest

from convoy.data import Dataset, FixedLengthRecordDataset
from convoy.errors import DataLossError, InvalidArgumentError

HEADER, RECORD, FOOTER, NUM_RECORDS = 5, 3, 2, 7


def record(f: int, r: int) -> bytes:
    return f"{r}".encode() * RECORD if f == 0 else bytes([97 + f]) + f"{r}".encode() * 2


def create_files(directory: Path, num_files: int, compression: str | None) -> list[str]:
    names = []
    for f in range(num_files):
        content = b"H" * HEADER + b"".join(record(f, r) for r in range(NUM_RECORDS)) + \
            b"F" * FOOTER
        if compression == "GZIP":
            content = gzip.compress(content)
        elif compression == "ZLIB":
            content = zlib.compress(content)
        path = directory / f"fixed_length.{f}.txt"
        path.write_bytes(content)
        names.append(str(path))
    return names


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_fixed_length_record_dataset(tmp_path: Path, compression: str | None) -> None:
    files = create_files(tmp_path, 2, compression)

    def read(names: list[str], **kwargs: int) -> list[bytes]:
        return list(FixedLengthRecordDataset(names, RECORD, HEADER, FOOTER,
                                             compression_type=compression, **kwargs))

    assert read(files[:1]) == [record(0, r) for r in range(NUM_RECORDS)]
    assert read(files[1:]) == [record(1, r) for r in range(NUM_RECORDS)]
    both = [record(f, r) for f in range(2) for r in range(NUM_RECORDS)]
    assert read(files) == both
    assert read(files, buffer_size=10) == both
    assert read(files, num_parallel_reads=2) == [x for pair in zip(both[:7], both[7:])
                                                 for x in pair]
    assert list(FixedLengthRecordDataset(Dataset.from_tensor_slices(files), RECORD, HEADER,
                                         FOOTER, compression_type=compression)) == both
    assert read([]) == []
    assert FixedLengthRecordDataset(files, RECORD).element_spec.dtype.kind in "OS"


def test_no_header_or_footer(tmp_path: Path) -> None:
    path = tmp_path / "plain"
    path.write_bytes(b"abcdef")
    assert list(FixedLengthRecordDataset(str(path), 2)) == [b"ab", b"cd", b"ef"]


def test_wrong_body_length(tmp_path: Path) -> None:
    """TensorFlow: InvalidArgumentError for an uncompressed file (before any record),
    DataLossError at the end of a compressed one."""
    path = tmp_path / "bad"
    path.write_bytes(b"HH" + b"abcdefg" + b"FFF")
    with pytest.raises(InvalidArgumentError, match="body length 7 bytes, which is not an "
                       "exact multiple of the record length \\(3 bytes\\)"):
        list(FixedLengthRecordDataset(str(path), 3, 2, 3))
    (tmp_path / "bad.gz").write_bytes(gzip.compress(path.read_bytes()))
    with pytest.raises(DataLossError, match="body length 7 bytes"):
        list(FixedLengthRecordDataset(str(tmp_path / "bad.gz"), 3, 2, 3,
                                      compression_type="GZIP"))


def test_bad_arguments_are_named(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="record_bytes"):
        FixedLengthRecordDataset("x", 0)
    with pytest.raises(InvalidArgumentError, match="header_bytes"):
        FixedLengthRecordDataset("x", 2, header_bytes=-1)
    with pytest.raises(InvalidArgumentError, match="buffer_size"):
        FixedLengthRecordDataset("x", 2, buffer_size=-1)
    with pytest.raises(InvalidArgumentError, match="compression_type"):
        FixedLengthRecordDataset("x", 2, compression_type="LZMA")


@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_resumes_from_a_checkpoint(tmp_path: Path, compression: str | None) -> None:
    files = create_files(tmp_path, 2, compression)
    dataset = FixedLengthRecordDataset(files, RECORD, HEADER, FOOTER,
                                       compression_type=compression)
    iterator = iter(dataset)
    first = [next(iterator) for _ in range(9)]
    state = iterator.state_dict()
    rest = list(iterator)
    restored = iter(dataset)
    restored.load_state_dict(state)
    assert list(restored) == rest
    assert first + rest == list(dataset)


def test_reads_a_url() -> None:
    """Through convoy's file layer: an fsspec memory URL reads as a path does."""
    pytest.importorskip("fsspec")
    import fsspec

    with fsspec.open("memory://fixed/records.bin", "wb") as file:
        file.write(b"HH" + b"abcdef" + b"F")
    assert list(FixedLengthRecordDataset("memory://fixed/records.bin", 3, 2, 1)) == \
        [b"abc", b"def"]
