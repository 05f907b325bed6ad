"""The ops that read files, behind TextLineDataset and TFRecordDataset (see
:mod:`convoy.data._file_datasets`).

Each reader's position is (file index, byte offset in the uncompressed stream), so it resumes
without re-reading, and a list of files is a splittable source (one split per file).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from convoy._values import nest
from convoy.data._core._op import Node, Op
from convoy.data.tfrecord import open_stream, read_record_runs, read_records


class FileReaderOp(Op):
    """Reads every file of ``files`` in order; subclasses say how to read one file."""

    def __init__(self, files: Sequence[bytes | str], compression_type: str | None) -> None:
        self.files = [os.fsdecode(f) for f in files]
        self.compression_type = compression_type or None

    def read(self, path: str, offset: int) -> Iterator[tuple[Any, int]]:
        """Yield ``(element, offset after it)`` from ``offset`` on."""
        raise NotImplementedError

    def iterator(self, state: Any, key: int) -> Node:
        file, offset = state if state is not None else (0, 0)
        return _FileReaderNode(self, file, offset)

    def static_spec(self) -> Any:
        return nest.TensorSpec((), bytes)


class _FileReaderNode(Node):
    __slots__ = ("file", "offset")

    def __init__(self, op: FileReaderOp, file: int, offset: int) -> None:
        self.file = file
        self.offset = offset
        self.gen = self._run(op)

    def _run(self, op: FileReaderOp) -> Iterator[Any]:
        files = op.files
        while self.file < len(files):
            for element, offset in op.read(files[self.file], self.offset):
                self.offset = offset
                yield element
            self.file += 1
            self.offset = 0

    def state_dict(self) -> Any:
        return (self.file, self.offset)


class TextLineOp(FileReaderOp):
    def read(self, path: str, offset: int) -> Iterator[tuple[bytes, int]]:
        with open_stream(path, self.compression_type, offset) as stream:
            for line in stream:
                offset += len(line)
                yield _strip_newline(line), offset


def _strip_newline(line: bytes) -> bytes:
    if line.endswith(b"\r\n"):
        return line[:-2]
    return line[:-1] if line.endswith(b"\n") else line


class TFRecordOp(FileReaderOp):
    def read(self, path: str, offset: int) -> Iterator[tuple[bytes, int]]:
        return read_records(path, self.compression_type, offset)

    def batches(self, state: Any, size: int, drop_remainder: bool) -> Node:
        """``batch(size, drop_remainder)`` of the records, cut from the runs of records the
        files are read in; its state is this op's, after a batch's last record."""
        file, offset = state if state is not None else (0, 0)
        return _RecordBatchNode(self, file, offset, size, drop_remainder)


class _RecordBatchNode(_FileReaderNode):
    __slots__ = ()

    def __init__(self, op: TFRecordOp, file: int, offset: int, size: int,
                 drop_remainder: bool) -> None:
        self.file = file
        self.offset = offset
        self.gen = self._batches(op, size, drop_remainder)

    def _batches(self, op: TFRecordOp, size: int, drop_remainder: bool) -> Iterator[Any]:
        files = op.files
        batch: list[bytes] = []
        while self.file < len(files):
            read = self.offset  # the offset after the records read so far
            for run in read_record_runs(files[self.file], op.compression_type, read):
                start = 0
                while len(run) - start >= size - len(batch):
                    take = run[start:start + size - len(batch)]
                    start += len(take)
                    read += _FRAMING * len(take) + sum(map(len, take))
                    batch += take
                    self.offset = read
                    yield _records_array(batch)
                    batch = []
                rest = run[start:]
                read += _FRAMING * len(rest) + sum(map(len, rest))
                batch += rest
            self.file += 1
            self.offset = 0
        if batch and not drop_remainder:
            yield _records_array(batch)


_FRAMING = 16  # bytes around each record in a TFRecord file


def _records_array(records: list[bytes]) -> np.ndarray:
    array = np.empty(len(records), object)
    array[:] = records
    return array
