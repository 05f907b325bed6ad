"""The reader of ``FixedLengthRecordDataset``: the records of files cut into pieces of one
size, as TensorFlow's ``tf.data.FixedLengthRecordDataset`` (header and footer skipped, GZIP or
ZLIB compressed or not), read through convoy's file layer so URLs work as paths do."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import IO

from convoy._base import fs as _fs
from convoy.data._sources._file_reader_ops import FileReaderOp
from convoy.data.tfrecord import open_stream
from convoy.errors import DataLossError, InvalidArgumentError

_READ_SIZE = 256 * 1024


class FixedLengthRecordOp(FileReaderOp):
    """Reads the records of each file; the position is the offset in the uncompressed
    stream (the header included)."""

    def __init__(self, files: Sequence[bytes | str], compression_type: str | None,
                 record_bytes: int, header_bytes: int, footer_bytes: int) -> None:
        super().__init__(files, compression_type)
        self.record_bytes = record_bytes
        self.header_bytes = header_bytes
        self.footer_bytes = footer_bytes

    def read(self, path: str, offset: int) -> Iterator[tuple[bytes, int]]:
        if self.compression_type is None:
            self._check_body(path)
        lookahead = self.record_bytes + self.footer_bytes
        with self._open_after_header(path, offset) as stream:
            offset = max(offset, self.header_bytes)
            pending = b""
            while True:
                chunk = stream.read(max(_READ_SIZE, lookahead))
                pending += chunk
                start = 0
                while len(pending) - start >= lookahead:
                    offset += self.record_bytes
                    yield pending[start:start + self.record_bytes], offset
                    start += self.record_bytes
                pending = pending[start:]
                if not chunk:
                    break
        if len(pending) != self.footer_bytes:
            raise self._body_error(path, offset - self.header_bytes + len(pending)
                                   - self.footer_bytes)

    def _open_after_header(self, path: str, offset: int) -> IO[bytes]:
        """The file's uncompressed stream at ``offset``, or after the header."""
        if offset >= self.header_bytes:
            return open_stream(path, self.compression_type, offset)
        stream = open_stream(path, self.compression_type, 0)
        if len(stream.read(self.header_bytes)) < self.header_bytes:
            stream.close()
            raise self._body_error(path, -1)
        return stream

    def _check_body(self, path: str) -> None:
        """TensorFlow's check of an uncompressed file, before its first record."""
        body = int(_fs.stat(path)["size"]) - self.header_bytes - self.footer_bytes
        if body < 0 or body % self.record_bytes:
            raise InvalidArgumentError(str(self._body_error(path, body)))

    def _body_error(self, path: str, body: int) -> DataLossError:
        return DataLossError(
            f"Excluding the header ({self.header_bytes} bytes) and footer "
            f"({self.footer_bytes} bytes), input file \"{path}\" has body length {body} "
            f"bytes, which is not an exact multiple of the record length "
            f"({self.record_bytes} bytes).")
