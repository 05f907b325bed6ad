"""The datasets that read files, as the public sees them: ``TextLineDataset``,
``TFRecordDataset`` and ``FixedLengthRecordDataset`` (their ops are in
:mod:`convoy.data._sources`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from convoy._base import check
from convoy.data._core._op import AUTOTUNE, Op
from convoy.data._dataset import Dataset
from convoy.data._sources._file_reader_ops import FileReaderOp, TextLineOp, TFRecordOp
from convoy.data._sources._fixed_length import FixedLengthRecordOp
from convoy.errors import InvalidArgumentError


def _file_list(filenames: Any, argument: str) -> list[str] | Dataset:
    if isinstance(filenames, Dataset):
        return filenames
    if isinstance(filenames, (str, bytes, os.PathLike)):
        filenames = [filenames]
    if isinstance(filenames, np.ndarray):
        filenames = filenames.tolist()
    if not isinstance(filenames, (list, tuple)) or not all(
            isinstance(f, (str, bytes, os.PathLike)) for f in filenames):
        raise InvalidArgumentError(
            f"{argument} must be a file name, a list of file names or a Dataset of them, "
            f"got {filenames!r}"
        )
    return [os.fsdecode(f) for f in filenames]


def _reader_dataset(op_type: type[FileReaderOp], filenames: Any, compression_type: Any,
                    num_parallel_reads: Any) -> Op:
    if compression_type not in (None, "", "GZIP", "ZLIB"):
        raise InvalidArgumentError(
            f"compression_type must be one of None, '', 'GZIP', 'ZLIB', got {compression_type!r}"
        )
    parallel = check.optional_integer("num_parallel_reads", num_parallel_reads, 1,
                                      allowed=(AUTOTUNE,))
    files = _file_list(filenames, "filenames")
    if isinstance(files, list) and parallel is None:
        return op_type(files, compression_type)

    def read_one(filename: Any) -> Dataset:
        return Dataset(op_type([filename], compression_type))

    source = files if isinstance(files, Dataset) else Dataset.from_tensor_slices(
        np.array(files, dtype=object))
    if parallel is None:
        return source.flat_map(read_one)._op
    return source.interleave(read_one, cycle_length=parallel, block_length=1,
                             num_parallel_calls=parallel)._op


class TextLineDataset(Dataset):
    """The lines (as bytes, without line endings) of one or more text files."""

    def __init__(self, filenames: Any, compression_type: str | None = None,
                 buffer_size: int | None = None, num_parallel_reads: int | None = None,
                 name: str | None = None) -> None:
        super().__init__(_reader_dataset(TextLineOp, filenames, compression_type,
                                         num_parallel_reads))


class TFRecordDataset(Dataset):
    """The records (as bytes) of one or more TFRecord files."""

    def __init__(self, filenames: Any, compression_type: str | None = None,
                 buffer_size: int | None = None, num_parallel_reads: int | None = None,
                 name: str | None = None) -> None:
        super().__init__(_reader_dataset(TFRecordOp, filenames, compression_type,
                                         num_parallel_reads))


class FixedLengthRecordDataset(Dataset):
    """The ``record_bytes``-long records (as bytes) of one or more files, after each file's
    ``header_bytes`` and before its ``footer_bytes``. ``buffer_size`` (TensorFlow's read
    buffer) is accepted and has no effect: convoy reads in blocks of its own size."""

    def __init__(self, filenames: Any, record_bytes: int, header_bytes: int | None = None,
                 footer_bytes: int | None = None, buffer_size: int | None = None,
                 compression_type: str | None = None, num_parallel_reads: int | None = None,
                 name: str | None = None) -> None:
        record = check.integer("record_bytes", record_bytes, 1)
        header = check.optional_integer("header_bytes", header_bytes, 0) or 0
        footer = check.optional_integer("footer_bytes", footer_bytes, 0) or 0
        check.optional_integer("buffer_size", buffer_size, 0)

        def make(files: Sequence[bytes | str], compression: str | None) -> FixedLengthRecordOp:
            return FixedLengthRecordOp(files, compression, record, header, footer)

        super().__init__(_reader_dataset(make, filenames, compression_type,  # type: ignore[arg-type]
                                         num_parallel_reads))
