"""TensorFlow's TFRecord file format: write and read files of length-delimited, checksummed records.

A file is a sequence of records, each laid out as::

    uint64 length          (little-endian)
    uint32 masked CRC32C   of the 8 length bytes
    bytes  data[length]
    uint32 masked CRC32C   of the data

optionally compressed as a whole with gzip (``"GZIP"``) or zlib (``"ZLIB"``), or in snappy
blocks (``"SNAPPY"``: each block a 4-byte big-endian length and raw snappy data, as
TensorFlow's snappy record writer frames them). Files are byte-compatible with
``tf.io.TFRecordWriter`` and ``tf.data.TFRecordDataset``.
"""

from __future__ import annotations

import io
import os
import re
import struct
import zlib
from collections.abc import Iterator
from types import TracebackType
from typing import IO, Any, cast

import cramjam
import google_crc32c

from convoy._base import fs as _fs
from convoy.errors import (
    DataLossError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
)

__all__ = ["TFRecordOptions", "TFRecordWriter", "find_record", "masked_crc32c", "open_stream",
           "read_record_runs", "read_records"]

_MASK_DELTA = 0xA282EAD8
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HEADER = struct.Struct("<QI")  # length, masked CRC32C of the length bytes
_HEADER_SIZE = _HEADER.size  # 12
_FOOTER_SIZE = _U32.size  # 4

_BUFFER_SIZE = 256 * 1024
_CHUNK_SIZE = 1024 * 1024  # records are read this many bytes at a time
_NONZERO = re.compile(rb"[^\0]")
# Reads larger than this are done in pieces, so a corrupt (but CRC-valid) huge length cannot
# make us allocate its full size before finding out the file is shorter.
_MAX_SINGLE_READ = 16 * 1024 * 1024

# compression type -> zlib wbits (None: uncompressed); the same window TensorFlow uses.
_WBITS: dict[str, int | None] = {"": None, "ZLIB": zlib.MAX_WBITS, "GZIP": zlib.MAX_WBITS | 16}
#: Snappy is not zlib: it has this stand-in for its wbits.
_SNAPPY = -1
_CODECS: dict[str, int | None] = {**_WBITS, "SNAPPY": _SNAPPY}
_SNAPPY_LENGTH = struct.Struct(">I")
# Uncompressed bytes per snappy block: its compressed size stays well within the input buffer
# TensorFlow's snappy reader has for one block.
_SNAPPY_BLOCK = 64 * 1024


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """The masked CRC32C of ``data``, as stored in TFRecord files."""
    return _masked(google_crc32c.value(data))


class TFRecordOptions:
    """Options for :class:`TFRecordWriter` (and readers), as ``tf.io.TFRecordOptions``.

    ``compression_type`` (``""``/None, ``"GZIP"``, ``"ZLIB"``, ``"SNAPPY"``) acts. The zlib
    tuning arguments (``flush_mode``, buffer sizes, ``window_bits``, ``compression_level``,
    ``compression_method``, ``mem_level``, ``compression_strategy``) are accepted and have no
    effect: they change how TensorFlow compresses, not what a reader gets back, and convoy
    writes with zlib's defaults.
    """

    compression_type_map = {"ZLIB": "ZLIB", "GZIP": "GZIP", "SNAPPY": "SNAPPY", "": ""}

    def __init__(self, compression_type: str | None = None, flush_mode: Any = None,
                 input_buffer_size: int | None = None, output_buffer_size: int | None = None,
                 window_bits: int | None = None, compression_level: int | None = None,
                 compression_method: Any = None, mem_level: int | None = None,
                 compression_strategy: Any = None) -> None:
        _wbits_for(compression_type, "compression_type")
        self.compression_type = compression_type or ""
        self.flush_mode = flush_mode
        self.input_buffer_size = input_buffer_size
        self.output_buffer_size = output_buffer_size
        self.window_bits = window_bits
        self.compression_level = compression_level
        self.compression_method = compression_method
        self.mem_level = mem_level
        self.compression_strategy = compression_strategy

    @classmethod
    def get_compression_type_string(cls, options: Any) -> str:
        """The compression type ``options`` (a TFRecordOptions, a string or None) names."""
        if isinstance(options, TFRecordOptions):
            return options.compression_type
        _wbits_for(options, "options")
        return options or ""


def _wbits_for(compression_type: Any, argument: str) -> int | None:
    if isinstance(compression_type, TFRecordOptions):
        compression_type = compression_type.compression_type
    if compression_type is None:
        return None
    if isinstance(compression_type, str) and compression_type in _CODECS:
        return _CODECS[compression_type]
    raise InvalidArgumentError(
        f"{argument}: expected a compression type, one of '', 'GZIP', 'ZLIB', 'SNAPPY' or "
        "None; "
        f"got {compression_type!r}"
    )


def _check_path(path: Any) -> str:
    """``path`` as a str for messages; raises if it is not a path at all."""
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError(
            f"path: expected a str or os.PathLike, got {type(path).__name__}"
        )
    return os.fsdecode(os.fspath(path))


def _open(path: str | os.PathLike[Any], mode: str, shown: str) -> IO[bytes]:
    try:
        return _fs.open_file(path, mode, buffering=_BUFFER_SIZE)
    except FileNotFoundError as e:
        raise NotFoundError(f"no such file or directory: {shown}") from e
    except PermissionError as e:
        raise PermissionDeniedError(f"permission denied: {shown}") from e


class _DeflateSink:
    """Writes bytes through a zlib/gzip compressor into a file."""

    def __init__(self, file: IO[bytes], wbits: int) -> None:
        self._file = file
        self._compressor = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, wbits)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        out = self._compressor.compress(data)
        if out:
            self._file.write(out)

    def flush(self) -> None:
        self._file.write(self._compressor.flush(zlib.Z_SYNC_FLUSH))
        self._file.flush()

    def close(self) -> None:
        try:
            self._file.write(self._compressor.flush(zlib.Z_FINISH))
        finally:
            self._file.close()


class _SnappySink:
    """Writes bytes into a file as snappy blocks (length-prefixed, as TensorFlow frames them)."""

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file
        self._pending = bytearray()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._pending += data
        while len(self._pending) >= _SNAPPY_BLOCK:
            self._emit(_SNAPPY_BLOCK)

    def _emit(self, size: int) -> None:
        block = bytes(cramjam.snappy.compress_raw(bytes(self._pending[:size])))
        del self._pending[:size]
        self._file.write(_SNAPPY_LENGTH.pack(len(block)) + block)

    def flush(self) -> None:
        if self._pending:
            self._emit(len(self._pending))
        self._file.flush()

    def close(self) -> None:
        try:
            if self._pending:
                self._emit(len(self._pending))
        finally:
            self._file.close()


class TFRecordWriter:
    """Writes records to a TFRecord file, like ``tf.io.TFRecordWriter``.

    ``options`` is the compression type: ``""`` or ``None`` (none), ``"GZIP"``, ``"ZLIB"`` or
    ``"SNAPPY"``, or a :class:`TFRecordOptions`.
    An existing file is overwritten, or with ``append=True`` (uncompressed only) extended.
    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, path: str | os.PathLike[Any], options: str | TFRecordOptions | None = None,
                 append: bool = False) -> None:
        wbits = _wbits_for(options, "options")
        self._path = _check_path(path)
        if append and wbits is not None:
            raise InvalidArgumentError("append: only uncompressed files can be appended to")
        file = self._file = _open(path, "ab" if append else "wb", self._path)
        self._sink: IO[bytes] | _DeflateSink | _SnappySink | None = (
            file if wbits is None
            else _SnappySink(file) if wbits == _SNAPPY else _DeflateSink(file, wbits)
        )

    @property
    def path(self) -> str:
        """The path of the file being written."""
        return self._path

    def _open_sink(self, operation: str) -> IO[bytes] | _DeflateSink | _SnappySink:
        if self._sink is None:
            raise FailedPreconditionError(
                f"TFRecordWriter.{operation}: the writer for {self._path} is closed"
            )
        return self._sink

    def write(self, record: bytes | bytearray | memoryview) -> None:
        """Appends one record (any bytes-like object)."""
        sink = self._open_sink("write")
        if type(record) is not bytes:
            if isinstance(record, str):
                got = "str"
            else:
                try:
                    record = memoryview(record).tobytes()
                    got = ""
                except TypeError:
                    got = type(record).__name__
            if got:
                raise InvalidArgumentError(
                    "record: expected a bytes-like object (bytes, bytearray, memoryview), "
                    f"got {got}"
                )
        length = _U64.pack(len(record))
        sink.write(length + _U32.pack(masked_crc32c(length)))
        sink.write(record)
        sink.write(_U32.pack(masked_crc32c(record)))

    def flush(self) -> None:
        """Pushes buffered records to the file (compressed files: up to a sync point)."""
        self._open_sink("flush").flush()

    def sync(self) -> None:
        """Flushes and makes the records written so far durable (``fsync``); an object on a
        store is written whole at :meth:`close`."""
        sink = self._open_sink("sync")
        sink.flush()
        if not isinstance(sink, (_DeflateSink, _SnappySink)) and not _fs.is_url(self._path):
            os.fsync(sink.fileno())

    def close(self) -> None:
        """Finishes the file; closing twice is harmless, writing afterwards is an error."""
        sink, self._sink = self._sink, None
        if sink is not None:
            sink.close()

    def __enter__(self) -> TFRecordWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        discard = getattr(self._file, "discard", None)
        if exc_type is not None and discard is not None and self._sink is not None:
            self._sink = None
            discard()  # an object being written is dropped whole: no partial file appears
            return
        self.close()


class _StreamError(Exception):
    """The compressed stream itself is corrupt or cut short."""


class _InflateReader(io.RawIOBase):
    """Decompresses a zlib or (possibly multi-member) gzip stream from a file."""

    def __init__(self, file: IO[bytes], wbits: int) -> None:
        super().__init__()
        self._file = file
        self._wbits = wbits
        self._decompressor = zlib.decompressobj(wbits)
        self._input = b""
        self._started = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        size = len(buffer)
        if size == 0:
            return 0
        while True:
            d = self._decompressor
            if d.eof:
                rest = d.unused_data or self._file.read(_BUFFER_SIZE)
                if not rest:
                    return 0
                if self._wbits != _WBITS["GZIP"]:
                    raise _StreamError("unexpected data after the end of the zlib stream")
                # Another gzip member follows, as in `cat a.gz b.gz`.
                self._decompressor = zlib.decompressobj(self._wbits)
                self._input = rest
                continue
            if not self._input:
                self._input = self._file.read(_BUFFER_SIZE)
                if not self._input:
                    if not self._started:
                        return 0  # an empty file is an empty stream
                    raise _StreamError("the compressed stream ends early")
                self._started = True
            try:
                out = d.decompress(self._input, size)
            except zlib.error as e:
                raise _StreamError(f"the compressed stream is corrupt ({e})") from e
            self._input = d.unconsumed_tail
            if out:
                n = len(out)
                buffer[:n] = out
                return n

    def close(self) -> None:
        try:
            self._file.close()
        finally:
            super().close()


class _SnappyReader(io.RawIOBase):
    """Decompresses a file of length-prefixed snappy blocks."""

    def __init__(self, file: IO[bytes]) -> None:
        super().__init__()
        self._file = file
        self._block = b""
        self._at = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._at >= len(self._block):
            header = self._file.read(_SNAPPY_LENGTH.size)
            if not header:
                return 0
            if len(header) < _SNAPPY_LENGTH.size:
                raise _StreamError("the snappy stream ends inside a block length")
            length = _SNAPPY_LENGTH.unpack(header)[0]
            data = _read_exact(self._file, length)
            if len(data) < length:
                raise _StreamError("the snappy stream ends inside a block")
            try:
                self._block = bytes(cramjam.snappy.decompress_raw(data))
            except cramjam.DecompressionError as e:
                raise _StreamError(f"a snappy block is corrupt ({e})") from e
            self._at = 0
        n = min(len(buffer), len(self._block) - self._at)
        buffer[:n] = self._block[self._at:self._at + n]
        self._at += n
        return n

    def close(self) -> None:
        try:
            self._file.close()
        finally:
            super().close()


def _read_exact(stream: IO[bytes], size: int) -> bytes:
    """Up to ``size`` bytes; fewer only at the end of the stream."""
    if size <= _MAX_SINGLE_READ:
        return stream.read(size)
    pieces = []
    remaining = size
    while remaining:
        piece = stream.read(min(remaining, _MAX_SINGLE_READ))
        if not piece:
            break
        pieces.append(piece)
        remaining -= len(piece)
    return b"".join(pieces)


def read_records(
    path: str | os.PathLike[Any], compression_type: str | None = None, offset: int = 0
) -> Iterator[tuple[bytes, int]]:
    """Yields ``(record, offset_after_record)`` for each record of a TFRecord file.

    Offsets count bytes of the uncompressed record stream; passing a yielded offset as
    ``offset`` resumes reading with the record after it. Corrupt or truncated records raise
    :class:`~convoy.errors.DataLossError`, a missing file :class:`~convoy.errors.NotFoundError`.
    """
    shown, wbits = _checked(path, compression_type, offset)
    return _iter_records(_iter_runs(path, shown, wbits, offset), offset)


def read_record_runs(
    path: str | os.PathLike[Any], compression_type: str | None = None, offset: int = 0
) -> Iterator[list[bytes]]:
    """The records of :func:`read_records` in runs (lists of consecutive records, as they are
    cut from the file a chunk at a time); the offset after a record is the offset before it
    plus ``16 + len(record)``."""
    shown, wbits = _checked(path, compression_type, offset)
    return _iter_runs(path, shown, wbits, offset)


def _checked(path: str | os.PathLike[Any], compression_type: str | None,
             offset: int) -> tuple[str, int | None]:
    """The path as shown in messages and the zlib window of ``compression_type``."""
    wbits = _wbits_for(compression_type, "compression_type")
    shown = _check_path(path)
    if not isinstance(offset, int) or isinstance(offset, bool):
        raise InvalidArgumentError(f"offset: expected an int, got {type(offset).__name__}")
    if offset < 0:
        raise InvalidArgumentError(f"offset: expected a non-negative int, got {offset}")
    try:
        size = _fs.stat(path)["size"]
    except FileNotFoundError as e:
        raise NotFoundError(f"no such file or directory: {shown}") from e
    if wbits is None and offset > size:
        raise InvalidArgumentError(
            f"offset: expected at most the length of {shown} ({size} bytes), got {offset}"
        )
    return shown, wbits


def open_stream(path: str | os.PathLike[Any], compression_type: str | None = None,
                offset: int = 0) -> IO[bytes]:
    """A binary stream of a file's uncompressed content, positioned at ``offset``."""
    wbits = _wbits_for(compression_type, "compression_type")
    return _open_at(path, _check_path(path), wbits, offset)


def _open_at(path: str | os.PathLike[Any], shown: str, wbits: int | None,
             offset: int) -> IO[bytes]:
    file = _open(path, "rb", shown)
    if wbits is None:
        if offset:
            file.seek(offset)
        return file
    raw = _SnappyReader(file) if wbits == _SNAPPY else _InflateReader(file, wbits)
    stream = io.BufferedReader(raw, _BUFFER_SIZE)
    skipped = 0
    try:
        while skipped < offset:
            chunk = stream.read(min(offset - skipped, _MAX_SINGLE_READ))
            if not chunk:
                raise InvalidArgumentError(
                    f"offset: expected at most the uncompressed length of {shown} "
                    f"({skipped} bytes), got {offset}"
                )
            skipped += len(chunk)
    except BaseException:
        stream.close()
        raise
    return stream


def _iter_records(runs: Iterator[list[bytes]], offset: int) -> Iterator[tuple[bytes, int]]:
    for run in runs:
        for data in run:
            offset += _HEADER_SIZE + len(data) + _FOOTER_SIZE
            yield data, offset


def _iter_runs(
    path: str | os.PathLike[Any], shown: str, wbits: int | None, offset: int
) -> Iterator[list[bytes]]:
    # Records are cut from chunks of _CHUNK_SIZE bytes (one read per chunk, not three per
    # record); a record longer than what is left of a chunk is completed by reading on.
    pos = offset  # where the next record starts in the stream

    def lost(reason: str) -> DataLossError:
        return DataLossError(f"corrupted record at offset {pos} in {shown}: {reason}")

    try:
        stream = _open_at(path, shown, wbits, offset)
    except _StreamError as e:
        raise lost(str(e)) from None
    with stream:
        try:
            read_some = cast(io.BufferedReader, stream).read1
            # convoy.io imports this module: its compiled part is imported once both exist.
            from convoy.io._native import split_records  # framing and CRCs, compiled

            chunk = b""
            at = 0  # where the next record starts in chunk
            while True:
                run, at, error = split_records(chunk, at)
                if run:  # the good records before any damage are delivered
                    pos += (_HEADER_SIZE + _FOOTER_SIZE) * len(run) + sum(map(len, run))
                    yield run
                if error:
                    raise lost(error)
                rest = chunk[at:]
                if len(rest) >= _HEADER_SIZE:  # the rest of a record longer than a chunk
                    more = _read_exact(stream, _HEADER.unpack_from(rest)[0] + _HEADER_SIZE
                                       + _FOOTER_SIZE - len(rest))
                else:  # what is there (records before a damaged stream are delivered)
                    more = read_some(_CHUNK_SIZE)
                if not more:
                    _check_end(rest, lost)
                    return
                chunk, at = rest + more, 0
        except _StreamError as e:
            raise lost(str(e)) from None


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _check_end(rest: bytes, lost: Any) -> None:
    """Raises if the stream ends inside a record (``rest`` is what is left of it)."""
    if not rest:
        return
    if len(rest) < _HEADER_SIZE:
        raise lost(f"truncated header ({len(rest)} of {_HEADER_SIZE} bytes)")
    length = _U64.unpack_from(rest)[0]
    data = len(rest) - _HEADER_SIZE
    if data < length:
        raise lost(f"truncated data ({data} of {length} bytes)")
    raise lost(f"truncated data CRC ({data - length} of {_FOOTER_SIZE} bytes)")


def find_record(data: bytes, start: int = 0) -> int:
    """The offset of the first whole, valid record in uncompressed ``data`` that begins at or
    after ``start``; -1 if there is none. (Tells a damaged record followed by good ones from
    a torn end of file.)"""
    # A length below 2**40 has three zero high bytes: only those places need a CRC check; an
    # all-zero header is never valid (the CRC of eight zero bytes is not zero), so a run of
    # zeros (a file extended but never written) is skipped whole.
    search = start + 5
    while (hit := data.find(b"\0\0\0", search)) != -1:
        at, search = hit - 5, hit + 1
        if at + _HEADER_SIZE + _FOOTER_SIZE > len(data):
            return -1
        if not any(data[at:at + _HEADER_SIZE]):
            nonzero = _NONZERO.search(data, at)
            if nonzero is None:
                return -1
            search = max(search, nonzero.start() - _HEADER_SIZE + 6)
            continue
        length, length_crc = _HEADER.unpack_from(data, at)
        end = at + _HEADER_SIZE + length
        if (end + _FOOTER_SIZE <= len(data) and masked_crc32c(data[at:at + 8]) == length_crc
                and masked_crc32c(data[at + _HEADER_SIZE:end]) == _U32.unpack_from(data, end)[0]):
            return at
    return -1
